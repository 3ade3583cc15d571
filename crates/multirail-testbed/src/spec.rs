//! What the caller asks `up` to build.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::addr::{Addressing, DEFAULT_SUBNET_BASE, MAX_HOSTS, MAX_RAILS};
use crate::error::{Error, Result};
use crate::names::Prefix;
use crate::rate::{Rate, format_rates};
use crate::shaping::Shaping;

/// Default number of hosts.
pub const DEFAULT_HOSTS: usize = 2;

/// Default number of rails.
pub const DEFAULT_RAILS: usize = 2;

/// Default rate of every rail: 2 Gbit/s.
pub const DEFAULT_RATE: Rate = match Rate::from_bits_per_sec(2_000_000_000) {
    Some(rate) => rate,
    None => unreachable!(),
};

/// Slowest supported rail: 1 Mbit/s. The tbf bucket must hold a 64 KiB GSO
/// packet (see [`Shaping`]); much below this rate that bucket is seconds of
/// traffic and overflows the kernel's 32-bit bucket time.
pub const MIN_RATE: Rate = match Rate::from_bits_per_sec(1_000_000) {
    Some(rate) => rate,
    None => unreachable!(),
};

/// How the hosts of a rail are joined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Topology {
    /// Two hosts: one veth pair per rail, host to host.
    Direct,
    /// More hosts: one bridge per rail in the `{prefix}-sw` namespace, one
    /// veth from every host to it.
    Switched,
}

impl Topology {
    /// The topology `up` builds for `hosts` hosts.
    pub fn for_hosts(hosts: usize) -> Topology {
        if hosts <= 2 { Topology::Direct } else { Topology::Switched }
    }
}

/// A testbed to build. Start from [`Spec::default`] (prefix `mr`, 2 hosts,
/// 2 rails at 2gbit, subnets `10.77.r.0/24`) and change fields.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    /// Carried by every namespace of the testbed.
    pub prefix: Prefix,
    /// Number of hosts, 2 to 254.
    pub hosts: usize,
    /// Number of rails, 1 to 256.
    pub rails: usize,
    /// One rate for every rail, or exactly one per rail.
    pub rates: Vec<Rate>,
    /// `A.B.0.0`: rail `r` is `A.B.r.0/24` (see [`Addressing`]).
    pub subnet_base: Ipv4Addr,
    /// TCP congestion control to set in every host (`bbr`, `cubic`, ...);
    /// `None` keeps what the hosts inherit from the root namespace.
    pub congestion_control: Option<String>,
    /// The "multi-port" layout: all rails of a host also share one egress
    /// bus of this rate (one NIC with several ports in one PCIe slot), on
    /// top of each rail's own rate. `None` is the "multi-HCA" layout, each
    /// rail its own link. See `up` for how it is built.
    #[serde(default)]
    pub bus: Option<Rate>,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            prefix: Prefix::default(),
            hosts: DEFAULT_HOSTS,
            rails: DEFAULT_RAILS,
            rates: vec![DEFAULT_RATE],
            subnet_base: DEFAULT_SUBNET_BASE,
            congestion_control: None,
            bus: None,
        }
    }
}

impl Spec {
    /// Checks the limits and that the rates fit the rails.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::InvalidSpec(msg));
        if !(2..=MAX_HOSTS).contains(&self.hosts) {
            return bad(format!("hosts must be 2 to {MAX_HOSTS}, not {}", self.hosts));
        }
        if !(1..=MAX_RAILS).contains(&self.rails) {
            return bad(format!("rails must be 1 to {MAX_RAILS}, not {}", self.rails));
        }
        if self.rates.len() != 1 && self.rates.len() != self.rails {
            return bad(format!(
                "{} rates ({}) for {} rails: give one rate for all rails or one per rail",
                self.rates.len(),
                format_rates(&self.rates),
                self.rails
            ));
        }
        if let Some(slow) = self.rates.iter().find(|r| **r < MIN_RATE) {
            return bad(format!("rate {slow} is below the minimum of {MIN_RATE}"));
        }
        if let Some(bus) = self.bus.filter(|bus| *bus < MIN_RATE) {
            return bad(format!("bus rate {bus} is below the minimum of {MIN_RATE}"));
        }
        Addressing::new(self.subnet_base)?;
        if let Some(cc) = &self.congestion_control {
            let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
            if cc.is_empty() || !cc.chars().all(word) {
                return bad(format!("congestion control `{cc}` is not a plain name like `cubic`"));
            }
        }
        Ok(())
    }

    /// Rate of rail `rail`.
    pub fn rail_rate(&self, rail: usize) -> Rate {
        match self.rates.as_slice() {
            [one] => *one,
            many => many.get(rail).copied().unwrap_or(DEFAULT_RATE),
        }
    }

    /// `tbf` settings of rail `rail`.
    pub fn rail_shaping(&self, rail: usize) -> Shaping {
        Shaping::for_rate(self.rail_rate(rail))
    }

    /// `tbf` settings of the shared bus of every host, if there is one.
    pub fn bus_shaping(&self) -> Option<Shaping> {
        self.bus.map(Shaping::for_rate)
    }

    /// The address plan. Falls back to the default plan for an invalid base,
    /// which [`Spec::validate`] rejects.
    pub fn addressing(&self) -> Addressing {
        Addressing::new(self.subnet_base).unwrap_or_default()
    }

    /// Direct veth pairs for two hosts, bridges for more.
    pub fn topology(&self) -> Topology {
        Topology::for_hosts(self.hosts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::parse_rates;

    #[test]
    fn defaults_are_valid() {
        let spec = Spec::default();
        spec.validate().unwrap();
        assert_eq!(spec.prefix.as_str(), "mr");
        assert_eq!((spec.hosts, spec.rails), (2, 2));
        assert_eq!(spec.rail_rate(1).to_string(), "2gbit");
        assert_eq!(spec.topology(), Topology::Direct);
    }

    #[test]
    fn per_rail_rates() {
        let spec = Spec { rates: parse_rates("1gbit,3gbit").unwrap(), ..Spec::default() };
        spec.validate().unwrap();
        assert_eq!(spec.rail_rate(0).to_string(), "1gbit");
        assert_eq!(spec.rail_rate(1).to_string(), "3gbit");
    }

    #[test]
    fn rejects_wrong_rate_count_and_limits() {
        let three = Spec { rates: parse_rates("1gbit,2gbit,3gbit").unwrap(), ..Spec::default() };
        let err = three.validate().unwrap_err().to_string();
        assert!(err.contains("3 rates (1gbit,2gbit,3gbit) for 2 rails"), "{err}");
        for spec in [
            Spec { hosts: 1, ..Spec::default() },
            Spec { hosts: 255, ..Spec::default() },
            Spec { rails: 0, ..Spec::default() },
            Spec { rails: 257, ..Spec::default() },
            Spec { rates: vec![], ..Spec::default() },
            Spec { rates: parse_rates("999kbit").unwrap(), ..Spec::default() },
            Spec { subnet_base: Ipv4Addr::new(10, 77, 3, 0), ..Spec::default() },
            Spec { congestion_control: Some("bbr; reboot".into()), ..Spec::default() },
            Spec { bus: Some("999kbit".parse().unwrap()), ..Spec::default() },
        ] {
            assert!(spec.validate().is_err(), "{spec:?}");
        }
    }

    #[test]
    fn bus_is_optional_and_kept_in_the_record() {
        let plain = Spec::default();
        assert_eq!(plain.bus_shaping(), None);
        let json = serde_json::to_value(&plain).unwrap();
        let mut old = json.clone();
        old.as_object_mut().unwrap().remove("bus");
        assert_eq!(serde_json::from_value::<Spec>(old).unwrap(), plain, "a record without `bus` still reads");
        let bus = Spec { bus: Some("2gbit".parse().unwrap()), ..Spec::default() };
        bus.validate().unwrap();
        assert_eq!(bus.bus_shaping().unwrap().rate.to_string(), "2gbit");
        let back: Spec = serde_json::from_value(serde_json::to_value(&bus).unwrap()).unwrap();
        assert_eq!(back, bus);
    }

    #[test]
    fn topology_by_host_count() {
        assert_eq!(Topology::for_hosts(2), Topology::Direct);
        assert_eq!(Topology::for_hosts(3), Topology::Switched);
    }
}
