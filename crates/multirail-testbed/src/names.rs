//! Names of everything the testbed creates, and the way back from a name to
//! its role.
//!
//! Only network namespaces are visible system-wide, and each carries the
//! prefix: `{prefix}-host{i}` for host `i`, `{prefix}-sw` for the switch that
//! holds the rail bridges. Interfaces live inside those namespaces and die
//! with them, so they use fixed short names: `rail{r}` in a host (the name
//! the benchmark sees), `br-rail{r}` for the bridge of rail `r` in the
//! switch, `bus` for a host's shared bus (multi-port layout, `up --bus`),
//! `rail{r}-host{i}` for the switch-side end of host `i`'s veth on
//! rail `r`. With at most 256 rails and 254 hosts the longest,
//! `rail255-host253`, fits the kernel's 15-byte limit.
//!
//! `down` finds a testbed by these names alone, so it needs no state file
//! and works after a crash.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize};

use crate::error::{Error, Result};

/// Prefix used when the caller does not choose one.
pub const DEFAULT_PREFIX: &str = "mr";

/// Longest accepted prefix. Namespace names could be longer; the limit keeps
/// `ip netns list` readable and leaves room in the 15-byte interface names
/// that `down` sweeps from the root namespace (`{prefix}-...`).
pub const MAX_PREFIX_LEN: usize = 12;

/// The validated prefix that every kernel object of one testbed carries.
///
/// One to [`MAX_PREFIX_LEN`] characters of `[a-z0-9_]`, starting with a
/// letter. It cannot contain `-`, the separator, so the namespaces of prefix
/// `mr` (`mr-host0`) can never be mistaken for those of another prefix.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Prefix(String);

/// What a namespace name means for a given prefix. Hosts sort before the
/// switch, by index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NetnsRole {
    /// `{prefix}-host{i}`.
    Host(usize),
    /// `{prefix}-sw`.
    Switch,
}

impl Prefix {
    /// Validates `text` as a prefix.
    pub fn new(text: &str) -> Result<Self> {
        let bad = |reason: &str| Error::InvalidPrefix { input: text.to_owned(), reason: reason.to_owned() };
        if text.is_empty() || text.len() > MAX_PREFIX_LEN {
            return Err(bad(&format!("must be 1 to {MAX_PREFIX_LEN} characters")));
        }
        if !text.starts_with(|c: char| c.is_ascii_lowercase()) {
            return Err(bad("must start with a lowercase letter"));
        }
        let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
        if !text.chars().all(allowed) {
            return Err(bad("may only contain a-z, 0-9 and _"));
        }
        Ok(Prefix(text.to_owned()))
    }

    /// The prefix text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Namespace of host `host`: `{prefix}-host{host}`.
    pub fn host_netns(&self, host: usize) -> String {
        format!("{}-{}", self.0, host_name(host))
    }

    /// Namespace holding the rail bridges: `{prefix}-sw`.
    pub fn switch_netns(&self) -> String {
        format!("{}-sw", self.0)
    }

    /// The role of namespace `name` in this testbed, if it belongs to it.
    pub fn netns_role(&self, name: &str) -> Option<NetnsRole> {
        let rest = name.strip_prefix(self.0.as_str())?.strip_prefix('-')?;
        if rest == "sw" {
            return Some(NetnsRole::Switch);
        }
        parse_host_name(rest).map(NetnsRole::Host)
    }

    /// True if a root-namespace interface called `ifname` carries this
    /// prefix (`{prefix}-...`). `down` removes such leftovers.
    pub fn owns_ifname(&self, ifname: &str) -> bool {
        ifname.strip_prefix(self.0.as_str()).is_some_and(|rest| rest.starts_with('-'))
    }
}

impl Default for Prefix {
    fn default() -> Self {
        Prefix(DEFAULT_PREFIX.to_owned())
    }
}

impl FromStr for Prefix {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self> {
        Prefix::new(text)
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Prefix {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Prefix::new(&text).map_err(serde::de::Error::custom)
    }
}

/// User-facing name of host `host`: `host{host}`.
pub fn host_name(host: usize) -> String {
    format!("host{host}")
}

/// Parses `host3` (or a bare `3`) into a host index.
pub fn parse_host(text: &str) -> Result<usize> {
    parse_host_name(text).or_else(|| parse_index(text)).ok_or_else(|| Error::InvalidHost { input: text.to_owned() })
}

/// Interface name of rail `rail` inside a host: `rail{rail}`.
pub fn rail_ifname(rail: usize) -> String {
    format!("rail{rail}")
}

/// Rail index of a host interface called `rail{r}`.
pub fn parse_rail_ifname(ifname: &str) -> Option<usize> {
    parse_index(ifname.strip_prefix("rail")?)
}

/// The shared bus of a host in the multi-port layout (`up --bus`): an
/// `ifb` device inside the host that every rail's egress is redirected to.
pub const BUS_IFNAME: &str = "bus";

/// Bridge of rail `rail` in the switch namespace: `br-rail{rail}`.
pub fn bridge_ifname(rail: usize) -> String {
    format!("br-{}", rail_ifname(rail))
}

/// Switch-side end of host `host`'s veth on rail `rail`: `rail{r}-host{i}`.
pub fn switch_port_ifname(rail: usize, host: usize) -> String {
    format!("{}-{}", rail_ifname(rail), host_name(host))
}

/// `(rail, host)` of a switch port called `rail{r}-host{i}`.
pub fn parse_switch_port_ifname(ifname: &str) -> Option<(usize, usize)> {
    let (rail, host) = ifname.split_once('-')?;
    Some((parse_rail_ifname(rail)?, parse_host_name(host)?))
}

fn parse_host_name(text: &str) -> Option<usize> {
    parse_index(text.strip_prefix("host")?)
}

/// A decimal index without sign or leading zeros, so that parsing a name and
/// formatting it again gives the same name.
fn parse_index(text: &str) -> Option<usize> {
    let canonical =
        !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) && (text == "0" || !text.starts_with('0'));
    if canonical { text.parse().ok() } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_prefix_names() {
        let p = Prefix::default();
        assert_eq!(p.host_netns(0), "mr-host0");
        assert_eq!(p.host_netns(12), "mr-host12");
        assert_eq!(p.switch_netns(), "mr-sw");
        assert_eq!(rail_ifname(1), "rail1");
        assert_eq!(bridge_ifname(1), "br-rail1");
        assert_eq!(switch_port_ifname(1, 2), "rail1-host2");
    }

    #[test]
    fn longest_interface_name_fits_ifnamsiz() {
        assert!(switch_port_ifname(255, 253).len() <= 15);
        assert!(bridge_ifname(255).len() <= 15);
    }

    #[test]
    fn netns_roles_round_trip() {
        let p = Prefix::new("mr").unwrap();
        assert_eq!(p.netns_role("mr-host0"), Some(NetnsRole::Host(0)));
        assert_eq!(p.netns_role("mr-host17"), Some(NetnsRole::Host(17)));
        assert_eq!(p.netns_role("mr-sw"), Some(NetnsRole::Switch));
        for foreign in ["mrt-host0", "mr-host", "mr-host01", "mr-hostx", "mr", "xmr-sw", "mr-sw2"] {
            assert_eq!(p.netns_role(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn prefixes_do_not_see_each_other() {
        let a = Prefix::new("mr").unwrap();
        let b = Prefix::new("mr2").unwrap();
        assert_eq!(a.netns_role(&b.host_netns(0)), None);
        assert_eq!(b.netns_role(&a.host_netns(0)), None);
        assert!(a.owns_ifname("mr-x"));
        assert!(!a.owns_ifname("mr2-x"));
        assert!(!a.owns_ifname("mr"));
    }

    #[test]
    fn prefix_validation() {
        for good in ["mr", "a", "mrt1234_5", "abcdefghijkl"] {
            assert!(Prefix::new(good).is_ok(), "{good}");
        }
        for bad in ["", "1mr", "Mr", "m-r", "m r", "abcdefghijklm", "mr/x"] {
            assert!(Prefix::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn host_and_rail_parsing() {
        assert_eq!(parse_host("host3").unwrap(), 3);
        assert_eq!(parse_host("3").unwrap(), 3);
        assert!(parse_host("host").is_err());
        assert!(parse_host("h3").is_err());
        assert!(parse_host("-1").is_err());
        assert_eq!(parse_rail_ifname("rail10"), Some(10));
        assert_eq!(parse_rail_ifname("rail01"), None);
        assert_eq!(parse_rail_ifname("eth0"), None);
        assert_eq!(parse_switch_port_ifname("rail2-host5"), Some((2, 5)));
        assert_eq!(parse_switch_port_ifname("br-rail2"), None);
    }
}
