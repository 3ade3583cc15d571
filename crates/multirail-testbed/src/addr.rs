//! IPv4 addressing of the rails.
//!
//! Rail `r` is the subnet `A.B.r.0/24` and host `i` is `A.B.r.(i+1)` on it,
//! where `A.B.0.0` is the subnet base (default `10.77.0.0`). So with the
//! defaults host0 is `10.77.0.1` on rail0 and `10.77.1.1` on rail1.
//!
//! The base does not depend on the prefix: every testbed lives in its own
//! network namespaces, which have separate routing tables and neighbour
//! caches, so two testbeds using the same addresses never see each other.
//! Keeping the same addresses for every prefix means a benchmark command line
//! works unchanged on any testbed. A different base is only needed if the
//! root namespace must route to the hosts, which this crate never sets up.

use std::fmt;
use std::net::Ipv4Addr;

use serde::{Serialize, Serializer};

use crate::error::{Error, Result};

/// Default subnet base: rails are `10.77.0.0/24`, `10.77.1.0/24`, ...
pub const DEFAULT_SUBNET_BASE: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 0);

/// Prefix length of every rail subnet.
pub const RAIL_PREFIX_LEN: u8 = 24;

/// Most rails: one third octet each.
pub const MAX_RAILS: usize = 256;

/// Most hosts: `.1` to `.254` on each rail.
pub const MAX_HOSTS: usize = 254;

/// An IPv4 network or interface address with its prefix length, shown and
/// serialized as `10.77.0.0/24`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv4Net {
    /// The address.
    pub addr: Ipv4Addr,
    /// The prefix length.
    pub prefix_len: u8,
}

impl Ipv4Net {
    /// The network this address belongs to (host bits cleared).
    pub fn network(self) -> Ipv4Net {
        let host_bits = 32u32.saturating_sub(u32::from(self.prefix_len));
        let mask = u32::MAX.checked_shl(host_bits).unwrap_or(0);
        Ipv4Net { addr: Ipv4Addr::from(u32::from(self.addr) & mask), prefix_len: self.prefix_len }
    }
}

impl fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

impl Serialize for Ipv4Net {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The address plan of one testbed: a `/16` cut into one `/24` per rail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addressing {
    base: [u8; 2],
}

impl Addressing {
    /// A plan based on `base`, which must end in `.0.0`.
    pub fn new(base: Ipv4Addr) -> Result<Self> {
        let [a, b, c, d] = base.octets();
        if c != 0 || d != 0 {
            return Err(Error::InvalidSpec(format!("subnet base {base} must be a /16 network (end in .0.0)")));
        }
        Ok(Addressing { base: [a, b] })
    }

    /// The subnet base, e.g. `10.77.0.0`.
    pub fn base(self) -> Ipv4Addr {
        let [a, b] = self.base;
        Ipv4Addr::new(a, b, 0, 0)
    }

    /// Subnet of rail `rail`: `A.B.rail.0/24`. Panics if `rail` >= [`MAX_RAILS`].
    pub fn rail_subnet(self, rail: usize) -> Ipv4Net {
        Ipv4Net { addr: self.addr(rail, 0), prefix_len: RAIL_PREFIX_LEN }
    }

    /// Address of host `host` on rail `rail`: `A.B.rail.(host+1)`.
    /// Panics if `rail` >= [`MAX_RAILS`] or `host` >= [`MAX_HOSTS`]; a
    /// validated [`Spec`](crate::Spec) never asks for those.
    pub fn host_addr(self, host: usize, rail: usize) -> Ipv4Addr {
        assert!(host < MAX_HOSTS, "host index {host} out of range");
        self.addr(rail, host + 1)
    }

    /// Addresses of host `host` on rails `0..rails`, in rail order.
    pub fn host_rail_addrs(self, host: usize, rails: usize) -> Vec<Ipv4Addr> {
        (0..rails).map(|rail| self.host_addr(host, rail)).collect()
    }

    fn addr(self, rail: usize, last: usize) -> Ipv4Addr {
        let [a, b] = self.base;
        // The documented panics of `rail_subnet` and `host_addr`: a
        // validated Spec keeps rail < 256 and host + 1 < 255.
        let third = u8::try_from(rail).expect("rail index below MAX_RAILS fits a u8");
        let fourth = u8::try_from(last).expect("host number below 255 fits a u8");
        Ipv4Addr::new(a, b, third, fourth)
    }
}

impl Default for Addressing {
    fn default() -> Self {
        Addressing { base: [10, 77] }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_plan() {
        let plan = Addressing::default();
        assert_eq!(plan.base(), DEFAULT_SUBNET_BASE);
        assert_eq!(plan.host_addr(0, 0), Ipv4Addr::new(10, 77, 0, 1));
        assert_eq!(plan.host_addr(1, 0), Ipv4Addr::new(10, 77, 0, 2));
        assert_eq!(plan.host_addr(0, 1), Ipv4Addr::new(10, 77, 1, 1));
        assert_eq!(plan.host_addr(253, 255), Ipv4Addr::new(10, 77, 255, 254));
        assert_eq!(plan.rail_subnet(1).to_string(), "10.77.1.0/24");
        assert_eq!(plan.host_rail_addrs(0, 2), [Ipv4Addr::new(10, 77, 0, 1), Ipv4Addr::new(10, 77, 1, 1)]);
    }

    #[test]
    fn custom_base() {
        let plan = Addressing::new(Ipv4Addr::new(192, 168, 0, 0)).unwrap();
        assert_eq!(plan.host_addr(2, 3), Ipv4Addr::new(192, 168, 3, 3));
        assert!(Addressing::new(Ipv4Addr::new(10, 77, 1, 0)).is_err());
        assert!(Addressing::new(Ipv4Addr::new(10, 77, 0, 1)).is_err());
    }

    #[test]
    fn network_of_an_interface_address() {
        let ifaddr = Ipv4Net { addr: Ipv4Addr::new(10, 77, 1, 2), prefix_len: 24 };
        assert_eq!(ifaddr.network().to_string(), "10.77.1.0/24");
        let all = Ipv4Net { addr: Ipv4Addr::new(10, 77, 1, 2), prefix_len: 0 };
        assert_eq!(all.network().to_string(), "0.0.0.0/0");
    }

    #[test]
    fn serializes_as_cidr_string() {
        let net = Addressing::default().rail_subnet(0);
        assert_eq!(serde_json::to_string(&net).unwrap(), "\"10.77.0.0/24\"");
    }
}
