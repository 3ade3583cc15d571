//! Rail specifications as users write them: `tcp:127.0.0.2`, `tcp:eth1`,
//! `tcp:10.10.0.1@2gbit` (an optional bandwidth hint for the `weighted`
//! policy), `shm` (shared memory between ranks of one host),
//! `ofi:PROVIDER[:DOMAIN_OR_INTERFACE]` (a libfabric provider: `ofi:tcp`,
//! `ofi:tcp:127.0.0.2`, `ofi:tcp:eth1`, `ofi:shm`, `ofi:verbs:mlx5_0`), in
//! comma-separated lists.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// The local end of a rail.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Local {
    Addr(IpAddr),
    Iface(String),
    /// Shared memory with a peer on the same host; its connection is set
    /// up (and its peer's death seen) over loopback TCP.
    Shm,
    /// A libfabric provider (`ofi:tcp:eth1`): set up over a TCP side
    /// channel from [`RailSpec::resolve`]'s address, which also carries
    /// the peer's liveness. `target` is an IP address or interface to
    /// bind, or else a libfabric domain name.
    Ofi {
        provider: String,
        target: Option<String>,
    },
}

/// One rail as configured.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RailSpec {
    pub local: Local,
    /// Bandwidth hint in bytes/s.
    pub bandwidth: Option<u64>,
}

/// What an `ofi:` rail asks libfabric for (see [`RailSpec::ofi_target`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfiTarget {
    /// As written: `tcp`, `shm`, `verbs`, `efa`...
    pub provider: String,
    /// The local address to bind (`FI_SOURCE`).
    pub node: Option<IpAddr>,
    /// A domain name (`mlx5_0`).
    pub domain: Option<String>,
}

/// A rail spec resolved to an address on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub ip: IpAddr,
    pub iface: Option<String>,
}

impl RailSpec {
    pub fn is_shm(&self) -> bool {
        self.local == Local::Shm
    }

    /// For an `ofi:` rail: what it asks libfabric for, with `resolved`
    /// (from [`RailSpec::resolve`]) as the address to bind when the target
    /// was an address or an interface. `None` for other rails.
    pub fn ofi_target(&self, resolved: &Resolved) -> Option<OfiTarget> {
        let Local::Ofi { provider, target } = &self.local else { return None };
        let bind = target.is_some()
            && (resolved.iface.is_some() || target.as_deref().is_some_and(|t| t.parse::<IpAddr>().is_ok()));
        Some(OfiTarget {
            provider: provider.clone(),
            node: bind.then_some(resolved.ip),
            domain: if bind { None } else { target.clone() },
        })
    }

    /// Finds the local address (an interface's first IPv4 address).
    pub fn resolve(&self) -> Result<Resolved, String> {
        match &self.local {
            Local::Addr(ip) => Ok(Resolved { ip: *ip, iface: None }),
            Local::Shm => Ok(Resolved { ip: IpAddr::from([127, 0, 0, 1]), iface: None }),
            Local::Ofi { provider, target } => resolve_ofi(provider, target.as_deref()),
            Local::Iface(name) => resolve_iface(name),
        }
    }

    /// Parses a comma-separated list.
    pub fn parse_list(s: &str) -> Result<Vec<RailSpec>, String> {
        let v: Vec<RailSpec> =
            s.split(',').map(str::trim).filter(|x| !x.is_empty()).map(str::parse).collect::<Result<_, _>>()?;
        if v.is_empty() {
            return Err("empty rail list (example: tcp:127.0.0.1,tcp:127.0.0.2)".into());
        }
        if v.len() > u16::MAX as usize {
            return Err("too many rails".into());
        }
        Ok(v)
    }
}

/// An interface's first address (IPv4 first).
fn resolve_iface(name: &str) -> Result<Resolved, String> {
    let addrs = if_addrs::get_if_addrs().map_err(|e| format!("cannot list interfaces: {e}"))?;
    let mut found: Vec<IpAddr> = addrs.iter().filter(|a| a.name == name).map(|a| a.ip()).collect();
    found.sort_by_key(|ip| !ip.is_ipv4());
    match found.first() {
        Some(ip) => Ok(Resolved { ip: *ip, iface: Some(name.to_string()) }),
        None if addrs.iter().any(|a| a.name == name) => Err(format!("interface {name} has no address")),
        None => Err(format!("no interface named '{name}' (see `multirail info` for the usable ones)")),
    }
}

/// The side channel's address of an `ofi:` rail: the target's when it is
/// an address or an interface; for `ofi:shm` loopback; otherwise (a
/// domain name, or none) the first non-loopback IPv4 address of this host,
/// else loopback.
fn resolve_ofi(provider: &str, target: Option<&str>) -> Result<Resolved, String> {
    let loopback = Resolved { ip: IpAddr::from([127, 0, 0, 1]), iface: None };
    if provider == "shm" {
        return Ok(loopback);
    }
    if let Some(t) = target {
        if let Ok(ip) = t.parse::<IpAddr>() {
            return Ok(Resolved { ip, iface: None });
        }
        let addrs = if_addrs::get_if_addrs().map_err(|e| format!("cannot list interfaces: {e}"))?;
        if addrs.iter().any(|a| a.name == t) {
            return resolve_iface(t);
        }
    }
    let addrs = if_addrs::get_if_addrs().map_err(|e| format!("cannot list interfaces: {e}"))?;
    let ip = addrs.iter().map(|a| a.ip()).find(|ip| ip.is_ipv4() && !ip.is_loopback());
    Ok(ip.map_or(loopback, |ip| Resolved { ip, iface: None }))
}

/// Parses a rate (`2gbit`, `500MB/s`: [`multirail_proto::units::parse_rate`],
/// multirail's one rate syntax) into whole bytes/s.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    match multirail_proto::units::parse_rate(s).map_err(|why| format!("rate '{s}': {why}"))? / 8 {
        0 => Err(format!("rate '{s}': less than one byte per second")),
        bytes => Ok(bytes),
    }
}

impl FromStr for RailSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if let Some(bw) = t.strip_prefix("shm").filter(|r| r.is_empty() || r.starts_with('@')) {
            let bandwidth = bw.strip_prefix('@').map(parse_rate).transpose()?;
            return Ok(RailSpec { local: Local::Shm, bandwidth });
        }
        if let Some(rest) = t.strip_prefix("ofi:") {
            return parse_ofi(t, rest);
        }
        let rest = t.strip_prefix("tcp:").ok_or_else(|| {
            format!(
                "rail '{t}': expected tcp:ADDRESS, tcp:INTERFACE, shm or ofi:PROVIDER[:DOMAIN_OR_INTERFACE] \
                 (e.g. tcp:127.0.0.2, tcp:eth1, shm, ofi:tcp:eth1, ofi:shm)"
            )
        })?;
        let (target, bw) = match rest.split_once('@') {
            Some((a, b)) => (a, Some(parse_rate(b)?)),
            None => (rest, None),
        };
        if target.is_empty() {
            return Err(format!("rail '{t}': missing address or interface"));
        }
        let local = match target.parse::<IpAddr>() {
            Ok(ip) => Local::Addr(ip),
            // Digits and dots are an address with a typo, not an interface.
            Err(e) if target.contains('.') && target.chars().all(|c| c.is_ascii_digit() || c == '.') => {
                return Err(format!("rail '{t}': '{target}' is not a valid IP address ({e})"));
            }
            Err(_) if target.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c)) && target.len() < 16 => {
                Local::Iface(target.to_string())
            }
            Err(_) => return Err(format!("rail '{t}': '{target}' is neither an IP address nor an interface name")),
        };
        Ok(RailSpec { local, bandwidth: bw })
    }
}

/// `ofi:PROVIDER[:DOMAIN_OR_INTERFACE][@RATE]`, `rest` after `ofi:`.
fn parse_ofi(t: &str, rest: &str) -> Result<RailSpec, String> {
    let (rest, bandwidth) = match rest.split_once('@') {
        Some((a, b)) => (a, Some(parse_rate(b)?)),
        None => (rest, None),
    };
    let (provider, target) = match rest.split_once(':') {
        Some((p, d)) => (p, Some(d)),
        None => (rest, None),
    };
    if provider.is_empty() || !provider.chars().all(|c| c.is_ascii_alphanumeric() || "_;-".contains(c)) {
        return Err(format!(
            "rail '{t}': expected ofi:PROVIDER[:DOMAIN_OR_INTERFACE] with a libfabric provider name \
             (e.g. ofi:tcp, ofi:tcp:eth1, ofi:shm, ofi:verbs:mlx5_0; `multirail info` lists them)"
        ));
    }
    if let Some(d) = target
        && (d.is_empty() || d.len() > 64 || !d.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:/".contains(c)))
    {
        return Err(format!("rail '{t}': '{d}' is not a domain, interface or address"));
    }
    let local = Local::Ofi { provider: provider.to_string(), target: target.map(str::to_string) };
    Ok(RailSpec { local, bandwidth })
}

impl fmt::Display for RailSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.local {
            Local::Addr(ip) => write!(f, "tcp:{ip}")?,
            Local::Iface(n) => write!(f, "tcp:{n}")?,
            Local::Shm => write!(f, "shm")?,
            Local::Ofi { provider, target: None } => write!(f, "ofi:{provider}")?,
            Local::Ofi { provider, target: Some(t) } => write!(f, "ofi:{provider}:{t}")?,
        }
        if let Some(b) = self.bandwidth {
            write!(f, "@{}mbit", b * 8 / 1_000_000)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_specs() {
        let v = RailSpec::parse_list("tcp:127.0.0.1, tcp:eth1,tcp:10.10.0.1@2gbit").unwrap();
        assert_eq!(v[0].local, Local::Addr("127.0.0.1".parse().unwrap()));
        assert_eq!(v[1].local, Local::Iface("eth1".into()));
        assert_eq!(v[2].bandwidth, Some(250_000_000));
        assert_eq!(v[2].to_string(), "tcp:10.10.0.1@2000mbit");
        assert!(RailSpec::parse_list("").is_err());
        assert!("udp:1.2.3.4".parse::<RailSpec>().unwrap_err().contains("expected tcp:"));
        assert!("tcp:".parse::<RailSpec>().is_err());
        assert!("tcp:a b".parse::<RailSpec>().is_err());
        let e = "tcp:999.1.1.1".parse::<RailSpec>().unwrap_err();
        assert!(e.contains("'999.1.1.1' is not a valid IP address"), "{e}");
        assert_eq!("tcp:eth0.100".parse::<RailSpec>().unwrap().local, Local::Iface("eth0.100".into()));
        assert!("tcp:1.2.3.4@fast".parse::<RailSpec>().is_err());
        assert_eq!("tcp:::1".parse::<RailSpec>().unwrap().local, Local::Addr("::1".parse().unwrap()));
        let v = RailSpec::parse_list("shm,tcp:127.0.0.1").unwrap();
        assert_eq!(v[0].local, Local::Shm);
        assert_eq!(v[0].to_string(), "shm");
        assert_eq!("shm@8gbit".parse::<RailSpec>().unwrap().bandwidth, Some(1_000_000_000));
        assert!("shmx".parse::<RailSpec>().is_err());
        assert!("shm:foo".parse::<RailSpec>().is_err());
        assert!(RailSpec { local: Local::Shm, bandwidth: None }.resolve().unwrap().ip.is_loopback());
    }

    #[test]
    fn parse_ofi_specs() {
        let v = RailSpec::parse_list("ofi:tcp,ofi:tcp:127.0.0.2,ofi:shm,ofi:verbs:mlx5_0@100gbit,ofi:tcp:lo").unwrap();
        assert_eq!(v[0].local, Local::Ofi { provider: "tcp".into(), target: None });
        assert_eq!(v[1].local, Local::Ofi { provider: "tcp".into(), target: Some("127.0.0.2".into()) });
        assert_eq!(v[3].bandwidth, Some(12_500_000_000));
        for (spec, text) in
            v.iter().zip(["ofi:tcp", "ofi:tcp:127.0.0.2", "ofi:shm", "ofi:verbs:mlx5_0@100000mbit", "ofi:tcp:lo"])
        {
            assert_eq!(spec.to_string(), text);
        }
        assert_eq!(
            "ofi:tcp:::1".parse::<RailSpec>().unwrap().local,
            Local::Ofi { provider: "tcp".into(), target: Some("::1".into()) }
        );
        let e = "ofi:".parse::<RailSpec>().unwrap_err();
        assert!(e.contains("expected ofi:PROVIDER"), "{e}");
        assert!("ofi:t c p".parse::<RailSpec>().is_err());
        assert!("ofi:tcp:".parse::<RailSpec>().unwrap_err().contains("not a domain"));
        assert!("udp:x".parse::<RailSpec>().unwrap_err().contains("ofi:PROVIDER"));
    }

    #[test]
    fn ofi_targets_bind_addresses_and_interfaces_and_name_domains() {
        let target = |s: &str| {
            let spec: RailSpec = s.parse().unwrap();
            let r = spec.resolve().unwrap();
            (r.ip, spec.ofi_target(&r).unwrap())
        };
        let (ip, t) = target("ofi:tcp:127.0.0.2");
        assert_eq!((ip, t.node, t.domain), ("127.0.0.2".parse().unwrap(), Some(ip), None));
        let (ip, t) = target("ofi:tcp:lo");
        assert!(ip.is_loopback());
        assert_eq!((t.node, t.domain), (Some(ip), None));
        let (_, t) = target("ofi:verbs:mlx5_0");
        assert_eq!((t.provider.as_str(), t.node, t.domain.as_deref()), ("verbs", None, Some("mlx5_0")));
        let (ip, t) = target("ofi:shm");
        assert!(ip.is_loopback());
        assert_eq!((t.node, t.domain), (None, None));
        assert!("tcp:127.0.0.1".parse::<RailSpec>().unwrap().ofi_target(&Resolved { ip, iface: None }).is_none());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("2gbit"), Ok(250_000_000));
        assert_eq!(parse_rate("500mbit"), Ok(62_500_000));
        assert_eq!(parse_rate("1.5gbit"), Ok(187_500_000));
        assert!(parse_rate("2gb").is_err());
        assert!(parse_rate("0bit").is_err());
    }

    #[test]
    fn resolve_loopback_interface() {
        let r = RailSpec { local: Local::Iface("lo".into()), bandwidth: None }.resolve().unwrap();
        assert!(r.ip.is_loopback());
        assert!(RailSpec { local: Local::Iface("nosuch0".into()), bandwidth: None }.resolve().is_err());
    }
}
