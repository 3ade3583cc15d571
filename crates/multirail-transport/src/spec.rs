//! Rail specifications as users write them: `tcp:127.0.0.2`, `tcp:eth1`,
//! `tcp:10.10.0.1@2gbit` (an optional bandwidth hint for the `weighted`
//! policy), `shm` (shared memory between ranks of one host), in
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
}

/// One rail as configured.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RailSpec {
    pub local: Local,
    /// Bandwidth hint in bytes/s.
    pub bandwidth: Option<u64>,
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

    /// Finds the local address (an interface's first IPv4 address).
    pub fn resolve(&self) -> Result<Resolved, String> {
        match &self.local {
            Local::Addr(ip) => Ok(Resolved { ip: *ip, iface: None }),
            Local::Shm => Ok(Resolved { ip: IpAddr::from([127, 0, 0, 1]), iface: None }),
            Local::Iface(name) => {
                let addrs = if_addrs::get_if_addrs().map_err(|e| format!("cannot list interfaces: {e}"))?;
                let mut found: Vec<IpAddr> = addrs.iter().filter(|a| &a.name == name).map(|a| a.ip()).collect();
                found.sort_by_key(|ip| !ip.is_ipv4());
                match found.first() {
                    Some(ip) => Ok(Resolved { ip: *ip, iface: Some(name.clone()) }),
                    None if addrs.iter().any(|a| &a.name == name) => Err(format!("interface {name} has no address")),
                    None => Err(format!("no interface named '{name}' (see `multirail info` for the usable ones)")),
                }
            }
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
        let rest = t.strip_prefix("tcp:").ok_or_else(|| {
            format!("rail '{t}': expected tcp:ADDRESS, tcp:INTERFACE or shm (e.g. tcp:127.0.0.2, tcp:eth1, shm)")
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

impl fmt::Display for RailSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.local {
            Local::Addr(ip) => write!(f, "tcp:{ip}")?,
            Local::Iface(n) => write!(f, "tcp:{n}")?,
            Local::Shm => write!(f, "shm")?,
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
