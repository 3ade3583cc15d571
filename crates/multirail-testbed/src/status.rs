//! `status`: what testbed exists, read from the kernel alone.
//!
//! Nothing is remembered between calls: the hosts come from `ip netns list`,
//! the rails and addresses from `ip -j addr` inside each host, the rates from
//! `tc -j qdisc` on every egress point (host rails and switch ports), the
//! congestion control from each host's `/proc/sys`, the shared bus of the
//! multi-port layout from a host's `bus` device, its `tbf` and the rails'
//! egress filters. So the answer is right
//! after a crash, after someone changed a rate by hand, or after a rail was
//! taken down for a failover test.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde::Serialize;

use crate::addr::Ipv4Net;
use crate::error::Result;
use crate::names::{self, NetnsRole, Prefix};
use crate::preflight;
use crate::rate::Rate;
use crate::shaping::Shaping;
use crate::spec::Topology;
use crate::system;

mod display;

/// A testbed as found on the system. Serializes to the `status --json`
/// document; `Display` is the human table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Status {
    /// The prefix looked for.
    pub prefix: Prefix,
    /// [`Topology::Switched`] if the `{prefix}-sw` namespace exists.
    pub topology: Topology,
    /// Hosts by index.
    pub hosts: Vec<HostStatus>,
    /// Rails by index: `0..` one past the highest `railN` seen on any host.
    pub rails: Vec<RailStatus>,
    /// The shared bus of the multi-port layout (`up --bus`): the shaping of
    /// the first host's `bus`; `None` is the multi-HCA layout (each rail its
    /// own link). Every host has the same bus unless `problems` says
    /// otherwise.
    pub bus: Option<Shaping>,
    /// Inconsistencies found (missing hosts or rails, egress points shaped
    /// differently, ...). Empty for a testbed as `up` built it.
    pub problems: Vec<String>,
}

/// One host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HostStatus {
    /// Host index `i`.
    pub index: usize,
    /// `host{i}`.
    pub name: String,
    /// `{prefix}-host{i}`.
    pub netns: String,
    /// `net.ipv4.tcp_congestion_control` inside the host.
    pub congestion_control: String,
    /// The host's `railN` interfaces, by rail index.
    pub rails: Vec<HostRailStatus>,
    /// The host's shared bus, if it has one (multi-port layout).
    pub bus: Option<HostBusStatus>,
}

/// The `bus` device of a host in the multi-port layout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HostBusStatus {
    /// `bus`.
    pub ifname: String,
    /// Administratively up (a down `ifb` drops everything sent to it).
    pub up: bool,
    /// The root `tbf` on the bus.
    pub shaping: Option<Shaping>,
    /// Rails whose egress is redirected into the bus.
    pub rails: Vec<usize>,
}

/// One `railN` interface of a host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HostRailStatus {
    /// Rail index `r`.
    pub rail: usize,
    /// `rail{r}`.
    pub ifname: String,
    /// The interface's IPv4 address.
    pub addr: Option<Ipv4Addr>,
    /// The subnet that address is on, e.g. `10.77.0.0/24`.
    pub subnet: Option<Ipv4Net>,
    /// Administratively up.
    pub up: bool,
    /// Carrier present (for a veth: the other end is up too).
    pub carrier: bool,
    /// The root `tbf` on this interface (its egress).
    pub shaping: Option<Shaping>,
}

/// One rail across all hosts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RailStatus {
    /// Rail index `r`.
    pub index: usize,
    /// The rail's subnet, from the first host that has an address on it.
    pub subnet: Option<Ipv4Net>,
    /// The shaping of the rail's first egress point; every other egress
    /// point of the rail has the same rate unless `problems` says otherwise.
    pub shaping: Option<Shaping>,
}

impl Status {
    /// Host `host`, if it exists.
    pub fn host(&self, host: usize) -> Option<&HostStatus> {
        self.hosts.iter().find(|h| h.index == host)
    }

    /// Address of `host` on `rail`.
    pub fn addr(&self, host: usize, rail: usize) -> Option<Ipv4Addr> {
        self.host(host)?.rail(rail)?.addr
    }

    /// Addresses of `host` on every rail, in rail order; `None` if the host
    /// is missing or any rail of it has no address.
    pub fn rail_addrs(&self, host: usize) -> Option<Vec<Ipv4Addr>> {
        (0..self.rails.len()).map(|rail| self.addr(host, rail)).collect()
    }

    /// Rate of rail `rail`.
    pub fn rail_rate(&self, rail: usize) -> Option<Rate> {
        Some(self.rails.get(rail)?.shaping?.rate)
    }

    /// The congestion control of all hosts, if they agree.
    pub fn congestion_control(&self) -> Option<&str> {
        let first = self.hosts.first()?.congestion_control.as_str();
        self.hosts.iter().all(|h| h.congestion_control == first).then_some(first)
    }
}

impl HostStatus {
    /// The host's interface on rail `rail`.
    pub fn rail(&self, rail: usize) -> Option<&HostRailStatus> {
        self.rails.iter().find(|r| r.rail == rail)
    }
}

/// Discovers testbed `prefix`; `Ok(None)` if none of its namespaces exists.
pub fn status(prefix: &Prefix) -> Result<Option<Status>> {
    preflight::check()?;
    let found = system::testbed_netns(prefix)?;
    if found.is_empty() {
        return Ok(None);
    }
    let mut host_ids: Vec<usize> = found.iter().filter_map(|(_, role)| host_index(*role)).collect();
    host_ids.sort_unstable();
    let switched = found.iter().any(|(_, role)| *role == NetnsRole::Switch);
    let hosts = host_ids.iter().map(|&i| read_host(prefix, i)).collect::<Result<Vec<_>>>()?;
    let ports = if switched { read_switch_ports(prefix)? } else { BTreeMap::new() };
    Ok(Some(assemble(prefix, switched, hosts, &ports)))
}

fn host_index(role: NetnsRole) -> Option<usize> {
    match role {
        NetnsRole::Host(i) => Some(i),
        NetnsRole::Switch => None,
    }
}

/// Reads one host's rails and congestion control.
pub(crate) fn read_host(prefix: &Prefix, index: usize) -> Result<HostStatus> {
    let netns = prefix.host_netns(index);
    let shaping = system::tbf_by_dev(&netns)?;
    let links = system::links(Some(&netns))?;
    let bus_link = links.iter().find(|link| link.ifname == names::BUS_IFNAME).map(|link| link.is_up());
    let mut rails: Vec<HostRailStatus> = links
        .into_iter()
        .filter_map(|link| {
            let rail = names::parse_rail_ifname(&link.ifname)?;
            Some(HostRailStatus {
                rail,
                addr: link.ipv4().map(|net| net.addr),
                subnet: link.ipv4().map(Ipv4Net::network),
                up: link.is_up(),
                carrier: link.has_carrier(),
                shaping: shaping.get(&link.ifname).copied(),
                ifname: link.ifname,
            })
        })
        .collect();
    rails.sort_by_key(|r| r.rail);
    // The egress filters are read only when there is a bus to redirect to,
    // so a multi-HCA testbed costs no extra `tc` run per rail.
    let bus = match bus_link {
        None => None,
        Some(up) => {
            let mut redirected = Vec::new();
            for rail in &rails {
                if system::egress_redirect(&netns, &rail.ifname)?.as_deref() == Some(names::BUS_IFNAME) {
                    redirected.push(rail.rail);
                }
            }
            let shaping = shaping.get(names::BUS_IFNAME).copied();
            Some(HostBusStatus { ifname: names::BUS_IFNAME.to_owned(), up, shaping, rails: redirected })
        }
    };
    let congestion_control = system::congestion_control(&netns)?;
    Ok(HostStatus { index, name: names::host_name(index), netns, congestion_control, rails, bus })
}

/// Shaping of the switch ports, by `(rail, host)`.
fn read_switch_ports(prefix: &Prefix) -> Result<BTreeMap<(usize, usize), Shaping>> {
    let by_dev = system::tbf_by_dev(&prefix.switch_netns())?;
    Ok(by_dev
        .into_iter()
        .filter_map(|(dev, shaping)| Some((names::parse_switch_port_ifname(&dev)?, shaping)))
        .collect())
}

/// Builds the rail view and the list of problems from what was read.
fn assemble(
    prefix: &Prefix,
    switched: bool,
    hosts: Vec<HostStatus>,
    ports: &BTreeMap<(usize, usize), Shaping>,
) -> Status {
    let rail_count = hosts.iter().filter_map(|h| h.rails.last()).map(|r| r.rail + 1).max().unwrap_or(0);
    let topology = if switched { Topology::Switched } else { Topology::Direct };
    let mut problems = host_problems(&hosts, rail_count, topology);
    let rails: Vec<RailStatus> = (0..rail_count)
        .map(|rail| {
            let egress = egress_points(&hosts, ports, rail, switched);
            problems.extend(shaping_problems(rail, &egress));
            RailStatus { index: rail, subnet: rail_subnet(&hosts, rail), shaping: egress.iter().find_map(|(_, s)| *s) }
        })
        .collect();
    problems.extend(subnet_problems(&hosts, &rails));
    problems.extend(bus_problems(&hosts, rail_count));
    let bus = hosts.iter().find_map(|h| h.bus.as_ref()?.shaping);
    Status { prefix: prefix.clone(), topology, hosts, rails, bus, problems }
}

fn host_problems(hosts: &[HostStatus], rail_count: usize, topology: Topology) -> Vec<String> {
    let mut problems = Vec::new();
    let contiguous = hosts.iter().enumerate().all(|(pos, h)| h.index == pos);
    if !contiguous {
        let names: Vec<&str> = hosts.iter().map(|h| h.name.as_str()).collect();
        problems.push(format!("hosts are not numbered from 0 without gaps: {}", names.join(", ")));
    }
    if topology != Topology::for_hosts(hosts.len()) {
        problems.push(format!("{} hosts but topology is {topology:?}", hosts.len()));
    }
    for host in hosts {
        for rail in 0..rail_count {
            match host.rail(rail) {
                None => problems.push(format!("{} has no rail{rail}", host.name)),
                Some(r) if r.addr.is_none() => problems.push(format!("{} rail{rail} has no IPv4 address", host.name)),
                Some(_) => {}
            }
        }
    }
    problems
}

/// Every egress point of `rail` with its shaping: each host's `railN`, and
/// with a switch each switch port. Named for messages.
fn egress_points(
    hosts: &[HostStatus],
    ports: &BTreeMap<(usize, usize), Shaping>,
    rail: usize,
    switched: bool,
) -> Vec<(String, Option<Shaping>)> {
    let mut points = Vec::new();
    for host in hosts {
        let shaping = host.rail(rail).and_then(|r| r.shaping);
        points.push((format!("{} rail{rail}", host.name), shaping));
        if switched {
            let port = names::switch_port_ifname(rail, host.index);
            points.push((format!("switch port {port}"), ports.get(&(rail, host.index)).copied()));
        }
    }
    points
}

fn shaping_problems(rail: usize, egress: &[(String, Option<Shaping>)]) -> Vec<String> {
    let reference = egress.iter().find_map(|(_, s)| *s).map(|s| s.rate);
    egress
        .iter()
        .filter_map(|(name, shaping)| match (shaping, reference) {
            (None, _) => Some(format!("rail{rail}: {name} has no tbf")),
            (Some(s), Some(rate)) if s.rate != rate => {
                Some(format!("rail{rail}: {name} is shaped at {}, other egress points at {rate}", s.rate))
            }
            _ => None,
        })
        .collect()
}

/// The bus is all or nothing: on every host or none, shaped at one rate,
/// up, and every rail of its host redirected into it.
fn bus_problems(hosts: &[HostStatus], rail_count: usize) -> Vec<String> {
    let mut problems = Vec::new();
    let with_bus: Vec<&HostStatus> = hosts.iter().filter(|h| h.bus.is_some()).collect();
    if with_bus.is_empty() {
        return problems;
    }
    for host in hosts.iter().filter(|h| h.bus.is_none()) {
        problems.push(format!("{} has no bus while other hosts have one", host.name));
    }
    let reference = with_bus.iter().find_map(|h| h.bus.as_ref()?.shaping).map(|s| s.rate);
    for host in with_bus {
        let Some(bus) = &host.bus else { continue };
        match (bus.shaping, reference) {
            (None, _) => problems.push(format!("{} bus has no tbf", host.name)),
            (Some(s), Some(rate)) if s.rate != rate => {
                problems.push(format!("{} bus is shaped at {}, other hosts' buses at {rate}", host.name, s.rate))
            }
            _ => {}
        }
        if !bus.up {
            problems.push(format!("{} bus is down (everything its rails send is dropped)", host.name));
        }
        for rail in (0..rail_count).filter(|r| !bus.rails.contains(r)) {
            problems.push(format!("{} rail{rail} does not go through the host's bus", host.name));
        }
    }
    problems
}

fn rail_subnet(hosts: &[HostStatus], rail: usize) -> Option<Ipv4Net> {
    hosts.iter().find_map(|h| h.rail(rail)?.subnet)
}

/// Every host of a rail on the rail's subnet, and no two rails sharing one.
fn subnet_problems(hosts: &[HostStatus], rails: &[RailStatus]) -> Vec<String> {
    let mut problems = Vec::new();
    for rail in rails {
        for host in hosts {
            let subnet = host.rail(rail.index).and_then(|r| r.subnet);
            if subnet.is_some() && subnet != rail.subnet {
                problems.push(format!("{} rail{} is not on the rail's subnet", host.name, rail.index));
            }
        }
    }
    for (i, a) in rails.iter().enumerate() {
        for b in &rails[i + 1..] {
            if a.subnet.is_some() && a.subnet == b.subnet {
                problems.push(format!("rail{} and rail{} share a subnet", a.index, b.index));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shaping(rate: &str) -> Shaping {
        Shaping::for_rate(rate.parse().unwrap())
    }

    fn host(index: usize, rates: &[&str]) -> HostStatus {
        let rails = rates
            .iter()
            .enumerate()
            .map(|(rail, rate)| HostRailStatus {
                rail,
                ifname: names::rail_ifname(rail),
                addr: Some(crate::Addressing::default().host_addr(index, rail)),
                subnet: Some(crate::Addressing::default().rail_subnet(rail)),
                up: true,
                carrier: true,
                shaping: Some(shaping(rate)),
            })
            .collect();
        HostStatus {
            index,
            name: names::host_name(index),
            netns: Prefix::default().host_netns(index),
            congestion_control: "bbr".into(),
            rails,
            bus: None,
        }
    }

    fn with_bus(mut host: HostStatus, rate: &str) -> HostStatus {
        let rails = host.rails.iter().map(|r| r.rail).collect();
        host.bus = Some(HostBusStatus { ifname: "bus".into(), up: true, shaping: Some(shaping(rate)), rails });
        host
    }

    #[test]
    fn multi_port_testbed_shows_its_bus() {
        let hosts =
            vec![with_bus(host(0, &["2gbit", "2gbit"]), "3gbit"), with_bus(host(1, &["2gbit", "2gbit"]), "3gbit")];
        let status = assemble(&Prefix::default(), false, hosts, &BTreeMap::new());
        assert!(status.problems.is_empty(), "{:?}", status.problems);
        assert_eq!(status.bus.unwrap().rate.to_string(), "3gbit");
        let table = status.to_string();
        assert!(table.contains("multi-port: the rails of each host share a bus of 3gbit"), "{table}");
        assert!(table.contains("bus    -             3gbit"), "{table}");
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["bus"]["rate"], "3gbit");
        assert_eq!(json["hosts"][1]["bus"]["rails"], serde_json::json!([0, 1]));
    }

    #[test]
    fn reports_a_partial_bus() {
        let mut odd = with_bus(host(1, &["2gbit", "2gbit"]), "1gbit");
        odd.bus.as_mut().unwrap().rails = vec![0];
        let hosts = vec![with_bus(host(0, &["2gbit", "2gbit"]), "3gbit"), odd, host(2, &["2gbit", "2gbit"])];
        let status = assemble(&Prefix::default(), false, hosts, &BTreeMap::new());
        let problems = status.problems.join("\n");
        assert!(problems.contains("host2 has no bus while other hosts have one"), "{problems}");
        assert!(problems.contains("host1 bus is shaped at 1gbit, other hosts' buses at 3gbit"), "{problems}");
        assert!(problems.contains("host1 rail1 does not go through the host's bus"), "{problems}");
    }

    #[test]
    fn consistent_direct_testbed_has_no_problems() {
        let hosts = vec![host(0, &["1gbit", "3gbit"]), host(1, &["1gbit", "3gbit"])];
        let status = assemble(&Prefix::default(), false, hosts, &BTreeMap::new());
        assert!(status.problems.is_empty(), "{:?}", status.problems);
        assert_eq!(status.rail_rate(1).unwrap().to_string(), "3gbit");
        assert_eq!(status.rails[1].subnet.unwrap().to_string(), "10.77.1.0/24");
        assert_eq!(status.rail_addrs(1).unwrap(), [Ipv4Addr::new(10, 77, 0, 2), Ipv4Addr::new(10, 77, 1, 2)]);
        assert_eq!(status.congestion_control(), Some("bbr"));
        let table = status.to_string();
        assert!(table.contains("rail1  10.77.1.0/24  3gbit"), "{table}");
        assert!(table.contains("host1  mr-host1  10.77.0.2  10.77.1.2"), "{table}");
    }

    #[test]
    fn reports_mismatched_and_missing_shaping() {
        let hosts = vec![host(0, &["1gbit"]), host(1, &["2gbit"]), host(2, &["1gbit"])];
        let mut ports = BTreeMap::new();
        ports.insert((0, 0), shaping("1gbit"));
        ports.insert((0, 1), shaping("1gbit"));
        let status = assemble(&Prefix::default(), true, hosts, &ports);
        let problems = status.problems.join("\n");
        assert!(problems.contains("host1 rail0 is shaped at 2gbit, other egress points at 1gbit"), "{problems}");
        assert!(problems.contains("switch port rail0-host2 has no tbf"), "{problems}");
    }

    #[test]
    fn reports_gaps_and_missing_rails() {
        let hosts = vec![host(0, &["1gbit", "1gbit"]), host(2, &["1gbit"])];
        let status = assemble(&Prefix::default(), false, hosts, &BTreeMap::new());
        let problems = status.problems.join("\n");
        assert!(problems.contains("not numbered from 0 without gaps: host0, host2"), "{problems}");
        assert!(problems.contains("host2 has no rail1"), "{problems}");
        assert_eq!(status.rail_addrs(2), None);
    }

    #[test]
    fn json_shape() {
        let status =
            assemble(&Prefix::default(), false, vec![host(0, &["2gbit"]), host(1, &["2gbit"])], &BTreeMap::new());
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["topology"], "direct");
        assert_eq!(json["rails"][0]["shaping"]["rate"], "2gbit");
        assert_eq!(json["hosts"][1]["rails"][0]["addr"], "10.77.0.2");
        assert_eq!(json["hosts"][0]["congestion_control"], "bbr");
        assert_eq!(json["bus"], serde_json::Value::Null, "multi-HCA: no bus");
    }
}
