//! Reading the kernel's view through `ip -j` and `tc -j`: namespaces,
//! links with their addresses, and root `tbf` qdiscs.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde::Deserialize;

use crate::addr::Ipv4Net;
use crate::cmd;
use crate::error::Result;
use crate::names::{NetnsRole, Prefix};
use crate::rate::Rate;
use crate::shaping::Shaping;

/// One entry of `ip -j netns list`.
#[derive(Debug, Deserialize)]
struct NetnsJson {
    name: String,
}

/// One entry of `ip -d -j addr show`, the fields this crate reads.
#[derive(Debug, Deserialize)]
pub(crate) struct LinkJson {
    pub(crate) ifname: String,
    #[serde(default)]
    flags: Vec<String>,
    #[serde(default)]
    linkinfo: Option<LinkInfoJson>,
    #[serde(default)]
    addr_info: Vec<AddrJson>,
}

#[derive(Debug, Deserialize)]
struct LinkInfoJson {
    #[serde(default)]
    info_kind: Option<String>,
}

#[derive(Debug, Deserialize)]
struct AddrJson {
    #[serde(default)]
    family: String,
    #[serde(default)]
    local: Option<String>,
    #[serde(default)]
    prefixlen: Option<u8>,
}

/// One entry of `tc -j qdisc show`.
#[derive(Debug, Deserialize)]
struct QdiscJson {
    kind: String,
    #[serde(default)]
    dev: Option<String>,
    #[serde(default)]
    root: bool,
    #[serde(default)]
    options: Option<TbfOptionsJson>,
}

#[derive(Debug, Deserialize)]
struct TbfOptionsJson {
    /// Bytes per second.
    #[serde(default)]
    rate: Option<u64>,
    /// Bytes.
    #[serde(default)]
    burst: Option<u64>,
    /// Microseconds.
    #[serde(default)]
    lat: Option<u64>,
}

impl LinkJson {
    /// Administratively up (`ip link set X up`).
    pub(crate) fn is_up(&self) -> bool {
        self.flags.iter().any(|f| f == "UP")
    }

    /// The lower layer reports carrier (for a veth: the peer is up too).
    pub(crate) fn has_carrier(&self) -> bool {
        self.flags.iter().any(|f| f == "LOWER_UP")
    }

    /// `veth`, `bridge`, ... if `ip -d` reported it.
    pub(crate) fn kind(&self) -> Option<&str> {
        self.linkinfo.as_ref()?.info_kind.as_deref()
    }

    /// The first IPv4 address with its prefix length.
    pub(crate) fn ipv4(&self) -> Option<Ipv4Net> {
        self.addr_info.iter().filter(|a| a.family == "inet").find_map(|a| {
            let addr: Ipv4Addr = a.local.as_deref()?.parse().ok()?;
            Some(Ipv4Net { addr, prefix_len: a.prefixlen? })
        })
    }
}

/// Names of all named network namespaces.
pub(crate) fn list_netns() -> Result<Vec<String>> {
    let entries: Vec<NetnsJson> = cmd::ip_json(None, &["netns", "list"])?;
    Ok(entries.into_iter().map(|e| e.name).collect())
}

/// The namespaces of testbed `prefix` with their roles: hosts by index, then
/// the switch.
pub(crate) fn testbed_netns(prefix: &Prefix) -> Result<Vec<(String, NetnsRole)>> {
    let mut found: Vec<_> =
        list_netns()?.into_iter().filter_map(|name| prefix.netns_role(&name).map(|role| (name, role))).collect();
    found.sort_by_key(|(_, role)| *role);
    Ok(found)
}

/// Every link of a namespace (`None`: the root namespace) with details and
/// addresses.
pub(crate) fn links(netns: Option<&str>) -> Result<Vec<LinkJson>> {
    cmd::ip_json(netns, &["-d", "addr", "show"])
}

/// The root `tbf` of every device of a namespace that has one, by device.
pub(crate) fn tbf_by_dev(netns: &str) -> Result<BTreeMap<String, Shaping>> {
    let qdiscs: Vec<QdiscJson> = cmd::tc_json(Some(netns), &["qdisc", "show"])?;
    Ok(qdiscs.into_iter().filter_map(tbf_entry).collect())
}

fn tbf_entry(q: QdiscJson) -> Option<(String, Shaping)> {
    if q.kind != "tbf" || !q.root {
        return None;
    }
    let options = q.options?;
    let shaping = Shaping {
        rate: Rate::from_bytes_per_sec(options.rate?)?,
        burst_bytes: options.burst.unwrap_or(0),
        latency_us: options.lat.unwrap_or(0),
    };
    Some((q.dev?, shaping))
}

/// The device that the egress filters of `dev` redirect to (`mirred egress
/// redirect dev X` under its `clsact` qdisc), if any. A device without a
/// `clsact` qdisc has no egress filters: `None`.
pub(crate) fn egress_redirect(netns: &str, dev: &str) -> Result<Option<String>> {
    match cmd::tc_json::<Vec<serde_json::Value>>(Some(netns), &["filter", "show", "dev", dev, "egress"]) {
        Ok(filters) => Ok(filters.iter().find_map(redirect_target)),
        Err(crate::error::Error::CommandFailed { .. }) => Ok(None),
        Err(other) => Err(other),
    }
}

/// `to_dev` of the first `mirred` egress redirect action of one filter entry
/// of `tc -j filter show`.
fn redirect_target(filter: &serde_json::Value) -> Option<String> {
    filter["options"]["actions"].as_array()?.iter().find_map(|action| {
        let redirect = action["kind"] == "mirred" && action["mirred_action"] == "redirect";
        redirect.then(|| action["to_dev"].as_str().map(str::to_owned)).flatten()
    })
}

/// `net.ipv4.tcp_congestion_control` as seen inside `netns`.
pub(crate) fn congestion_control(netns: &str) -> Result<String> {
    let out = cmd::run_in_netns(netns, &["cat", "/proc/sys/net/ipv4/tcp_congestion_control"])?;
    Ok(out.trim().to_owned())
}

/// Writes sysctls (`net/ipv4/...` keys, relative to `/proc/sys`) inside
/// `netns`, in order, with a single process.
pub(crate) fn write_sysctls(netns: &str, pairs: &[(&str, &str)]) -> Result<()> {
    // The keys and values are passed as arguments, never spliced into the
    // script, so no quoting issue can arise.
    const SCRIPT: &str = r#"while [ $# -gt 1 ]; do echo "$2" > "/proc/sys/$1" || exit 1; shift 2; done"#;
    if pairs.is_empty() {
        return Ok(());
    }
    let mut argv: Vec<&str> = vec!["sh", "-c", SCRIPT, "sh"];
    for (key, value) in pairs {
        argv.extend([*key, *value]);
    }
    cmd::run_in_netns(netns, &argv).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ip_addr_json() {
        let text = r#"[{"ifindex":2,"ifname":"rail0","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"],
            "linkinfo":{"info_kind":"veth"},
            "addr_info":[{"family":"inet6","local":"fe80::1","prefixlen":64},
                         {"family":"inet","local":"10.77.0.1","prefixlen":24}]},
            {"ifindex":1,"ifname":"lo","flags":["LOOPBACK"]}]"#;
        let links: Vec<LinkJson> = serde_json::from_str(text).unwrap();
        assert_eq!(links[0].ipv4().unwrap().to_string(), "10.77.0.1/24");
        assert!(links[0].is_up() && links[0].has_carrier());
        assert_eq!(links[0].kind(), Some("veth"));
        assert_eq!(links[1].ipv4(), None);
        assert!(!links[1].is_up());
    }

    #[test]
    fn parses_tc_qdisc_json() {
        let text = r#"[{"kind":"tbf","handle":"8006:","dev":"rail0","root":true,"refcnt":3,
            "options":{"rate":250000000,"burst":123000,"lat":5000}},
            {"kind":"noqueue","handle":"0:","dev":"lo","root":true,"options":{}}]"#;
        let qdiscs: Vec<QdiscJson> = serde_json::from_str(text).unwrap();
        let tbf: Vec<_> = qdiscs.into_iter().filter_map(tbf_entry).collect();
        assert_eq!(tbf.len(), 1);
        assert_eq!(tbf[0].0, "rail0");
        assert_eq!(tbf[0].1.rate.to_string(), "2gbit");
        assert_eq!((tbf[0].1.burst_bytes, tbf[0].1.latency_us), (123000, 5000));
    }

    #[test]
    fn parses_tc_filter_json() {
        // As printed by iproute2 6.x for the bus filter `up --bus` adds.
        let text = r#"[{"protocol":"all","pref":1,"kind":"u32","chain":0},
            {"protocol":"all","pref":1,"kind":"u32","chain":0,"options":{"fh":"800:","ht_divisor":1}},
            {"protocol":"all","pref":1,"kind":"u32","chain":0,"options":{"fh":"800::800","order":2048,
             "key_ht":"800","bkt":"0","not_in_hw":true,"match":{"value":"0","mask":"0","offmask":"","off":0},
             "actions":[{"order":1,"kind":"mirred","mirred_action":"redirect","direction":"egress",
             "to_dev":"bus","control_action":{"type":"stolen"},"index":1,"ref":1,"bind":1}]}}]"#;
        let filters: Vec<serde_json::Value> = serde_json::from_str(text).unwrap();
        assert_eq!(filters.iter().find_map(redirect_target).as_deref(), Some("bus"));
        assert_eq!(redirect_target(&filters[0]), None);
    }
}
