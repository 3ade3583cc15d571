//! `up`: builds a testbed from a [`Spec`], all or nothing.
//!
//! Order of work:
//! 1. validate the spec, check privileges and tools, check that no object of
//!    the prefix exists;
//! 2. create `{prefix}-host0`: if that fails because it exists, another `up`
//!    won the race and nothing is touched;
//! 3. create the other namespaces, set up loopback and sysctls, wire and
//!    shape every rail, then read the result back with [`status`].
//!
//! A failure in step 3 removes everything of the prefix with [`down`], so no
//! half-built testbed stays behind.
//!
//! With [`Spec::bus`] (the "multi-port" layout), step 3 ends with
//! [`setup_bus`] in every host; see there for the mechanism and why.
//!
//! No object is ever created in the root namespace: `ip -n NS link add ...
//! peer ... netns OTHER` makes both veth ends directly where they belong.

use crate::cmd;
use crate::down::down;
use crate::error::{Error, Result};
use crate::names::{BUS_IFNAME, Prefix, bridge_ifname, rail_ifname, switch_port_ifname};
use crate::preflight;
use crate::shaping::Shaping;
use crate::spec::{Spec, Topology};
use crate::status::{Status, status};
use crate::system;

/// Builds the testbed described by `spec` and returns its [`Status`].
///
/// Errors: [`Error::InvalidSpec`], the environment errors
/// ([`Error::NotRoot`], [`Error::ToolMissing`], [`Error::TbfUnavailable`]),
/// [`Error::AlreadyExists`], or the failing command. On any error after the
/// first namespace was made, the partial testbed has been removed (if that
/// removal fails too: [`Error::SetupAndCleanup`]).
pub fn up(spec: &Spec) -> Result<Status> {
    spec.validate()?;
    preflight::check()?;
    if let Some(cc) = &spec.congestion_control {
        check_congestion_control(cc)?;
    }
    ensure_absent(&spec.prefix)?;
    claim(&spec.prefix)?;
    build(spec).map_err(|cause| roll_back(&spec.prefix, cause))
}

/// Fails with [`Error::AlreadyExists`] if any namespace or root link of the
/// prefix exists.
fn ensure_absent(prefix: &Prefix) -> Result<()> {
    let netns: Vec<String> = system::testbed_netns(prefix)?.into_iter().map(|(name, _)| name).collect();
    if !netns.is_empty() {
        let found = format!("network namespaces {}", netns.join(", "));
        return Err(Error::AlreadyExists { prefix: prefix.to_string(), found });
    }
    let links: Vec<String> = crate::down::root_leftovers(prefix)?;
    if !links.is_empty() {
        let found = format!("links {} in the root namespace", links.join(", "));
        return Err(Error::AlreadyExists { prefix: prefix.to_string(), found });
    }
    Ok(())
}

/// Outside the root namespace the kernel lets a namespace pick only the
/// congestion controls listed in `net.ipv4.tcp_allowed_congestion_control`
/// (global); anything else fails with EPERM. Check before creating anything.
fn check_congestion_control(cc: &str) -> Result<()> {
    const ALLOWED: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";
    // Unreadable: let the write inside the host decide.
    let Ok(allowed) = std::fs::read_to_string(ALLOWED) else {
        return Ok(());
    };
    if allowed.split_whitespace().any(|name| name == cc) {
        return Ok(());
    }
    Err(Error::InvalidSpec(format!(
        "congestion control `{cc}` cannot be set in a host: net.ipv4.tcp_allowed_congestion_control \
         is `{}`; pick one of those, or add `{cc}` to that list in the root namespace",
        allowed.trim()
    )))
}

/// Creates host0's namespace, which marks the prefix as taken.
fn claim(prefix: &Prefix) -> Result<()> {
    let name = prefix.host_netns(0);
    add_netns(&name).map_err(|e| match e {
        Error::CommandFailed { ref stderr, .. } if stderr.contains("exists") => {
            Error::AlreadyExists { prefix: prefix.to_string(), found: format!("network namespace {name}") }
        }
        other => other,
    })
}

fn roll_back(prefix: &Prefix, cause: Error) -> Error {
    match down(prefix) {
        Ok(_) => cause,
        Err(cleanup) => Error::SetupAndCleanup { cause: Box::new(cause), cleanup: Box::new(cleanup) },
    }
}

fn build(spec: &Spec) -> Result<Status> {
    let prefix = &spec.prefix;
    for host in 1..spec.hosts {
        add_netns(&prefix.host_netns(host))?;
    }
    for host in 0..spec.hosts {
        setup_host(spec, host)?;
    }
    if spec.topology() == Topology::Switched {
        setup_switch(&prefix.switch_netns())?;
    }
    for rail in 0..spec.rails {
        match spec.topology() {
            Topology::Direct => wire_direct(spec, rail)?,
            Topology::Switched => wire_switched(spec, rail)?,
        }
    }
    if let Some(bus) = spec.bus_shaping() {
        for host in 0..spec.hosts {
            setup_bus(spec, host, &bus)?;
        }
    }
    status(prefix)?.ok_or_else(|| Error::NotFound { prefix: prefix.to_string() })
}

fn add_netns(name: &str) -> Result<()> {
    cmd::ip(None, &["netns", "add", name]).map(drop)
}

/// Loopback up and the host sysctls.
///
/// * `arp_ignore=1`, `arp_announce=2`: a host answers ARP for an address
///   only on the rail that carries it. Linux's default would let host1
///   answer for its rail1 address on rail0, so a socket bound to rail0
///   could reach rail1 addresses and rails would not be separate links.
/// * IPv6 off: no router solicitations or MLD reports on the rails, whose
///   bytes would otherwise take tokens from the benchmark.
fn setup_host(spec: &Spec, host: usize) -> Result<()> {
    let netns = spec.prefix.host_netns(host);
    cmd::ip(Some(&netns), &["link", "set", "dev", "lo", "up"])?;
    let mut sysctls = vec![("net/ipv4/conf/all/arp_ignore", "1"), ("net/ipv4/conf/all/arp_announce", "2")];
    sysctls.extend(ipv6_off());
    if let Some(cc) = &spec.congestion_control {
        sysctls.push(("net/ipv4/tcp_congestion_control", cc.as_str()));
    }
    system::write_sysctls(&netns, &sysctls)
}

/// Sysctls that disable IPv6, if the kernel has IPv6 at all.
fn ipv6_off() -> Vec<(&'static str, &'static str)> {
    if std::path::Path::new("/proc/sys/net/ipv6").exists() {
        vec![("net/ipv6/conf/all/disable_ipv6", "1"), ("net/ipv6/conf/default/disable_ipv6", "1")]
    } else {
        Vec::new()
    }
}

/// The namespace that holds the rail bridges: loopback up, IPv6 off.
fn setup_switch(sw: &str) -> Result<()> {
    add_netns(sw)?;
    cmd::ip(Some(sw), &["link", "set", "dev", "lo", "up"])?;
    system::write_sysctls(sw, &ipv6_off())
}

/// Two hosts: one veth pair per rail, `rail{r}` at both ends.
fn wire_direct(spec: &Spec, rail: usize) -> Result<()> {
    let ifname = rail_ifname(rail);
    let (a, b) = (spec.prefix.host_netns(0), spec.prefix.host_netns(1));
    let add = ["link", "add", "name", &ifname, "type", "veth", "peer", "name", &ifname, "netns", &b];
    cmd::ip(Some(&a), &add)?;
    configure_host_rail(spec, 0, rail)?;
    configure_host_rail(spec, 1, rail)
}

/// More hosts: a bridge per rail in `{prefix}-sw`, a shaped veth from every
/// host to it.
fn wire_switched(spec: &Spec, rail: usize) -> Result<()> {
    let sw = spec.prefix.switch_netns();
    let bridge = bridge_ifname(rail);
    cmd::ip(Some(&sw), &["link", "add", "name", &bridge, "type", "bridge"])?;
    cmd::ip(Some(&sw), &["link", "set", "dev", &bridge, "up"])?;
    for host in 0..spec.hosts {
        let (ifname, port) = (rail_ifname(rail), switch_port_ifname(rail, host));
        let host_ns = spec.prefix.host_netns(host);
        let add = ["link", "add", "name", &ifname, "type", "veth", "peer", "name", &port, "netns", &sw];
        cmd::ip(Some(&host_ns), &add)?;
        cmd::ip(Some(&sw), &["link", "set", "dev", &port, "master", &bridge])?;
        add_tbf(&sw, &port, &spec.rail_shaping(rail))?;
        cmd::ip(Some(&sw), &["link", "set", "dev", &port, "up"])?;
        configure_host_rail(spec, host, rail)?;
    }
    Ok(())
}

/// Address, shaping and link up for `rail{rail}` of `host`.
fn configure_host_rail(spec: &Spec, host: usize, rail: usize) -> Result<()> {
    let netns = spec.prefix.host_netns(host);
    let ifname = rail_ifname(rail);
    let plan = spec.addressing();
    let cidr = format!("{}/{}", plan.host_addr(host, rail), plan.rail_subnet(rail).prefix_len);
    cmd::ip(Some(&netns), &["addr", "add", &cidr, "dev", &ifname])?;
    add_tbf(&netns, &ifname, &spec.rail_shaping(rail))?;
    cmd::ip(Some(&netns), &["link", "set", "dev", &ifname, "up"]).map(drop)
}

/// The shared bus of the multi-port layout in `host`: every packet any rail
/// of the host sends first passes one `tbf` at the bus rate, then the
/// rail's own `tbf`.
///
/// Mechanism: an `ifb` device `bus` in the host, shaped with `tbf` at the
/// bus rate; each `rail{r}` gets a `clsact` qdisc whose egress hook holds a
/// catch-all `u32` filter with `mirred egress redirect dev bus`. The `ifb`
/// queues the packets of all rails in one bucket and hands each back to the
/// rail it came from, where it goes through the rail's root `tbf` (the
/// re-injected packet skips the `clsact` filters, so it is not redirected
/// twice).
///
/// Why this and not a veth "bus" with VLAN or macvlan sub-interfaces as the
/// rails: the rails stay the same veth pairs (names, addresses, carrier
/// when a rail is set down at one end, the switched topology with its
/// bridges), so `bench --testbed`, failover tests and `status` work
/// unchanged; the bus is added on top and goes away with the namespace.
/// (VLAN is also missing from some kernels, this one included; `ifb`,
/// `clsact`, `u32` and `mirred` are in every distribution kernel.)
///
/// What it models: the egress side of one NIC's bus (PCIe is full duplex,
/// so each direction has its own budget). A host's incoming traffic is
/// bounded by the sender's bus; with three or more hosts several senders
/// into one host are not limited by the receiver's bus.
fn setup_bus(spec: &Spec, host: usize, bus: &Shaping) -> Result<()> {
    let netns = spec.prefix.host_netns(host);
    let ip = |args: &[&str]| cmd::ip(Some(&netns), args).map(drop).map_err(bus_error);
    let tc = |args: &[&str]| cmd::tc(Some(&netns), args).map(drop).map_err(bus_error);
    ip(&["link", "add", "name", BUS_IFNAME, "type", "ifb"])?;
    add_tbf(&netns, BUS_IFNAME, bus)?;
    ip(&["link", "set", "dev", BUS_IFNAME, "up"])?;
    for rail in 0..spec.rails {
        let ifname = rail_ifname(rail);
        tc(&["qdisc", "add", "dev", &ifname, "clsact"])?;
        tc(&bus_filter_args(&ifname).iter().map(String::as_str).collect::<Vec<_>>())?;
    }
    Ok(())
}

/// `tc filter add ...` that sends all of `ifname`'s egress into the bus.
fn bus_filter_args(ifname: &str) -> Vec<String> {
    let args = "filter add dev IF egress protocol all prio 1 u32 match u32 0 0 action mirred egress redirect dev BUS";
    args.split(' ')
        .map(|word| match word {
            "IF" => ifname.to_owned(),
            "BUS" => BUS_IFNAME.to_owned(),
            other => other.to_owned(),
        })
        .collect()
}

/// A kernel without `ifb`, `clsact`, `u32` or `mirred` makes `--bus`
/// impossible: say so instead of passing `tc`'s message on alone.
fn bus_error(e: Error) -> Error {
    match e {
        Error::CommandFailed { command, stderr, .. } if is_missing_bus_feature(&stderr) => {
            Error::BusUnavailable { command, stderr }
        }
        other => other,
    }
}

/// What `ip`/`tc` print when the kernel lacks a link type, qdisc,
/// classifier or action.
fn is_missing_bus_feature(stderr: &str) -> bool {
    [
        "Unknown device type",
        "not supported",
        "qdisc kind is unknown",
        "Unknown qdisc",
        "classifier not found",
        "Unknown filter",
        "action not found",
        "bad action",
        "Failed to load",
    ]
    .iter()
    .any(|marker| stderr.contains(marker))
}

/// `tc qdisc add dev DEV root tbf ...`; an unknown qdisc kind becomes
/// [`Error::TbfUnavailable`].
fn add_tbf(netns: &str, dev: &str, shaping: &Shaping) -> Result<()> {
    let mut args = vec!["qdisc".to_owned(), "add".into(), "dev".into(), dev.into(), "root".into()];
    args.extend(shaping.tc_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    cmd::tc(Some(netns), &args).map(drop).map_err(tbf_error)
}

fn tbf_error(e: Error) -> Error {
    match e {
        Error::CommandFailed { command, stderr, .. } if is_unknown_qdisc(&stderr) => {
            Error::TbfUnavailable { command, stderr }
        }
        other => other,
    }
}

/// What `tc` prints when the kernel (or `tc` itself) lacks a qdisc kind.
fn is_unknown_qdisc(stderr: &str) -> bool {
    stderr.contains("qdisc kind is unknown") || stderr.contains("Unknown qdisc")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_qdisc_becomes_tbf_unavailable() {
        let failed = Error::CommandFailed {
            command: "tc -n mr-host0 qdisc add dev rail0 root tbf rate 2000000000bit".into(),
            code: Some(2),
            stderr: "Error: Specified qdisc kind is unknown.".into(),
        };
        let err = tbf_error(failed);
        assert!(matches!(err, Error::TbfUnavailable { .. }));
        assert!(err.is_environment());
        assert!(err.to_string().contains("modprobe sch_tbf"), "{err}");
    }

    #[test]
    fn other_tc_failures_pass_through() {
        let failed = Error::CommandFailed {
            command: "tc".into(),
            code: Some(2),
            stderr: "RTNETLINK answers: File exists".into(),
        };
        assert!(matches!(tbf_error(failed), Error::CommandFailed { .. }));
    }

    #[test]
    fn bus_filter_redirects_all_egress_to_the_bus() {
        assert_eq!(
            bus_filter_args("rail1").join(" "),
            "filter add dev rail1 egress protocol all prio 1 u32 match u32 0 0 action mirred egress redirect dev bus"
        );
    }

    #[test]
    fn a_kernel_without_the_bus_pieces_is_an_environment_error() {
        let failed = |stderr: &str| Error::CommandFailed {
            command: "tc -n mr-host0 filter add dev rail0 egress ...".into(),
            code: Some(2),
            stderr: stderr.into(),
        };
        for stderr in [
            "Error: TC classifier not found.",
            "Error: Unknown device type.",
            "Error: Specified qdisc kind is unknown.",
        ] {
            let err = bus_error(failed(stderr));
            assert!(matches!(err, Error::BusUnavailable { .. }), "{stderr}");
            assert!(err.is_environment());
            assert!(err.to_string().contains("CONFIG_IFB"), "{err}");
        }
        assert!(matches!(bus_error(failed("RTNETLINK answers: File exists")), Error::CommandFailed { .. }));
    }
}
