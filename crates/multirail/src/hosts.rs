//! Which peers share our host, and so which rails lead to each peer.
//!
//! Every rank publishes a [`HostId`] in the address table. Two ranks are
//! on the same host when both identities are known and equal; their pair
//! then talks over one `shm` rail that multirail adds by itself, and every
//! other pair over the configured (network) rails: the per-peer rail
//! lists of [`Routes`].
//!
//! The identity is the kernel's boot id together with the network and PID
//! namespaces of the process. Equal boot ids alone would be one kernel;
//! the namespaces make ranks in different containers, or in different
//! hosts of the emulated cluster (`multirail testbed`, one network
//! namespace per host), different hosts, as they must be: the testbed
//! emulates separate machines, and a `shm` rail's hand-over uses an
//! abstract Unix socket, which is per network namespace; the PID
//! namespace keeps ranks that cannot see each other's processes apart (a
//! single-copy path through `process_vm_readv` names the peer by PID).
//!
//! Rail indices: the configured rails keep their indices `0..n`, and the
//! automatic `shm` rail, when any two ranks of the job share a host, is
//! rail `n`. Every rank reads the same table, so every rank agrees on the
//! rail list and on each pair's rails. The protocol core numbers a peer's
//! rails `0..count` ("local" indices); [`Routes`] translates.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;

/// Bytes of a [`HostId`] on the wire.
pub(crate) const HOST_ID_LEN: usize = 32;

/// What makes two ranks "on the same host": boot id (16 bytes), network
/// namespace inode (8), PID namespace inode (8). All zero: unknown, never
/// equal to anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct HostId(pub [u8; HOST_ID_LEN]);

impl HostId {
    /// This process's identity, or unknown if the kernel does not say.
    pub fn local() -> HostId {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok();
        let ns = |n: &str| std::fs::metadata(format!("/proc/self/ns/{n}")).ok().map(|m| m.ino());
        match (boot.as_deref().and_then(parse_uuid), ns("net"), ns("pid")) {
            (Some(b), Some(net), Some(pid)) => HostId::from_parts(b, net, pid),
            _ => HostId::default(),
        }
    }

    pub fn from_parts(boot: [u8; 16], net: u64, pid: u64) -> HostId {
        let mut id = [0u8; HOST_ID_LEN];
        id[..16].copy_from_slice(&boot);
        id[16..24].copy_from_slice(&net.to_le_bytes());
        id[24..].copy_from_slice(&pid.to_le_bytes());
        HostId(id)
    }

    pub fn known(&self) -> bool {
        self.0 != [0; HOST_ID_LEN]
    }

    /// Both known, with one kernel (boot id) and one PID namespace: the
    /// two processes share CPUs and see each other's PIDs, whatever their
    /// network namespaces (the hosts of the emulated cluster).
    pub fn same_kernel_and_pids(&self, other: &HostId) -> bool {
        self.known() && other.known() && self.0[..16] == other.0[..16] && self.0[24..] == other.0[24..]
    }
}

/// `6f1c...-...` (36 characters with dashes) as 16 bytes.
fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = s.trim().bytes().filter(|&b| b != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        out[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

/// Numbers the hosts of a job in order of first appearance: rank `r`
/// runs on host `out[r]`. A rank whose identity is unknown is a host of
/// its own.
pub(crate) fn host_indices(ids: &[HostId]) -> Vec<u32> {
    let mut seen: HashMap<HostId, u32> = HashMap::new();
    let mut out = Vec::with_capacity(ids.len());
    let mut next = 0;
    for id in ids {
        let h = match seen.get(id) {
            Some(&h) if id.known() => h,
            _ => {
                next += 1;
                if id.known() {
                    seen.insert(*id, next - 1);
                }
                next - 1
            }
        };
        out.push(h);
    }
    out
}

/// How same-host pairs talk (MULTIRAIL_SHM).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShmMode {
    /// Ranks on the same host use one `shm` rail, unless the rail list
    /// names `shm` itself (then every pair uses exactly that list).
    #[default]
    Auto,
    /// Every pair uses the configured rails.
    Off,
}

impl std::str::FromStr for ShmMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "on" | "1" | "yes" | "true" => Ok(ShmMode::Auto),
            "off" | "0" | "no" | "false" => Ok(ShmMode::Off),
            _ => Err("choose auto (shared memory between ranks of one host) or off (the configured rails only)".into()),
        }
    }
}

/// What one rank published about its host: its identity, and whether it
/// listens for an automatic `shm` rail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostEntry {
    pub id: HostId,
    pub shm: bool,
}

/// The rails to each peer, by global rail index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Routes {
    me: u32,
    /// Configured rails (`0..configured`).
    configured: usize,
    /// The automatic `shm` rail's index (`configured`), if the job has one.
    shm_rail: Option<usize>,
    /// Per rank: it shares our host and the pair uses the `shm` rail.
    same_host: Vec<bool>,
}

impl Routes {
    /// Every peer over every configured rail (also what the bootstrap
    /// connection assumes).
    pub fn uniform(configured: usize, size: u32) -> Routes {
        Routes { me: 0, configured, shm_rail: None, same_host: vec![false; size as usize] }
    }

    /// The rule: with `auto` (the table's `shm` flags are set only then,
    /// see [`HostEntry`]), a pair of ranks with the same known identity,
    /// both listening for `shm`, uses the `shm` rail alone; the job has that
    /// rail if any pair does.
    pub fn plan(me: u32, hosts: &[HostEntry], configured: usize) -> Routes {
        let shares = |a: &HostEntry, b: &HostEntry| a.shm && b.shm && a.id.known() && a.id == b.id;
        let mut per_host: HashMap<HostId, usize> = HashMap::new();
        for h in hosts.iter().filter(|h| h.shm && h.id.known()) {
            *per_host.entry(h.id).or_default() += 1;
        }
        let any_pair = per_host.values().any(|&n| n > 1);
        let mine = hosts[me as usize];
        let same_host =
            hosts.iter().enumerate().map(|(r, h)| r != me as usize && any_pair && shares(&mine, h)).collect();
        Routes { me, configured, shm_rail: any_pair.then_some(configured), same_host }
    }

    /// Rails of the job: the configured ones plus the automatic `shm` one.
    pub fn rail_count(&self) -> usize {
        self.configured + usize::from(self.shm_rail.is_some())
    }

    /// The automatic `shm` rail's index, if the job has one.
    pub fn shm_rail(&self) -> Option<usize> {
        self.shm_rail
    }

    /// True if `peer` shares our host and the pair talks over `shm`.
    pub fn same_host(&self, peer: u32) -> bool {
        self.same_host.get(peer as usize).copied().unwrap_or(false)
    }

    /// The global indices of the rails to `peer`, in local order.
    pub fn rails_to(&self, peer: u32) -> Vec<usize> {
        match self.shm_rail {
            Some(s) if self.same_host(peer) => vec![s],
            _ => (0..self.configured).collect(),
        }
    }

    /// The most rails any peer has (the width of the slot grid).
    pub fn width(&self) -> usize {
        let peers = (0..self.same_host.len() as u32).filter(|&p| p != self.me);
        peers.map(|p| self.rails_to(p).len()).max().unwrap_or(self.configured)
    }

    /// Global index of `peer`'s local rail `local`.
    pub fn global(&self, peer: u32, local: usize) -> Option<usize> {
        self.rails_to(peer).get(local).copied()
    }

    /// Local index, for `peer`, of global rail `rail` (None: the pair does
    /// not use that rail).
    pub fn local(&self, peer: u32, rail: usize) -> Option<usize> {
        self.rails_to(peer).iter().position(|&g| g == rail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(boot: u8, net: u64) -> HostEntry {
        HostEntry { id: HostId::from_parts([boot; 16], net, 1), shm: true }
    }

    #[test]
    fn one_kernel_and_pid_namespace_whatever_the_network_namespace() {
        let a = HostId::from_parts([1; 16], 10, 2);
        assert!(a.same_kernel_and_pids(&HostId::from_parts([1; 16], 11, 2)), "another testbed host");
        assert!(!a.same_kernel_and_pids(&HostId::from_parts([1; 16], 10, 3)), "another PID namespace");
        assert!(!a.same_kernel_and_pids(&HostId::from_parts([2; 16], 10, 2)), "another machine");
        assert!(
            !a.same_kernel_and_pids(&HostId::default()) && !HostId::default().same_kernel_and_pids(&HostId::default())
        );
    }

    #[test]
    fn same_host_uses_shm_alone_others_the_network_rails() {
        // Ranks 0 and 1 on one host, 2 on another.
        let hosts = [host(1, 10), host(1, 10), host(2, 10)];
        let r = Routes::plan(0, &hosts, 2);
        assert_eq!(r.rail_count(), 3);
        assert_eq!(r.shm_rail(), Some(2));
        assert_eq!(r.rails_to(1), vec![2]);
        assert_eq!(r.rails_to(2), vec![0, 1]);
        assert_eq!((r.global(1, 0), r.local(1, 2), r.local(1, 0)), (Some(2), Some(0), None));
        assert_eq!((r.global(2, 1), r.local(2, 1), r.local(2, 2)), (Some(1), Some(1), None));
        assert_eq!(r.width(), 2);
        // Rank 2 has no same-host peer but knows the job's rail list.
        let r2 = Routes::plan(2, &hosts, 2);
        assert_eq!((r2.rail_count(), r2.rails_to(0), r2.rails_to(1)), (3, vec![0, 1], vec![0, 1]));
    }

    #[test]
    fn other_network_namespace_is_another_host() {
        // One kernel (boot id), two namespaces: the testbed's two hosts.
        let hosts = [host(1, 10), host(1, 11)];
        let r = Routes::plan(0, &hosts, 2);
        assert_eq!((r.rail_count(), r.shm_rail(), r.rails_to(1)), (2, None, vec![0, 1]));
        let pid_ns = [host(1, 10), HostEntry { id: HostId::from_parts([1; 16], 10, 2), shm: true }];
        assert_eq!(Routes::plan(0, &pid_ns, 2).shm_rail(), None, "another PID namespace");
    }

    #[test]
    fn every_peer_local_gives_one_rail_wide_grid() {
        let hosts = [host(1, 10), host(1, 10), host(1, 10)];
        let r = Routes::plan(1, &hosts, 2);
        assert_eq!((r.rails_to(0), r.rails_to(2), r.width()), (vec![2], vec![2], 1));
    }

    #[test]
    fn off_or_unknown_identity_keeps_the_configured_rails() {
        // A rank with shm off (or an explicit rail list naming shm)
        // publishes no shm listener: its pairs use the configured rails.
        let off = [host(1, 10), HostEntry { shm: false, ..host(1, 10) }];
        let r = Routes::plan(0, &off, 2);
        assert_eq!((r.rail_count(), r.rails_to(1)), (2, vec![0, 1]));
        let unknown = [HostEntry { id: HostId::default(), shm: true }; 2];
        let r = Routes::plan(0, &unknown, 1);
        assert_eq!((r.rail_count(), r.rails_to(1)), (1, vec![0]));
    }

    #[test]
    fn identity_of_this_process() {
        let a = HostId::local();
        // Linux always has a boot id and namespaces; elsewhere unknown.
        assert_eq!(a.known(), std::path::Path::new("/proc/sys/kernel/random/boot_id").exists());
        assert_eq!(a, HostId::local(), "stable");
        assert_eq!(parse_uuid("00112233-4455-6677-8899-aabbccddeeff\n").unwrap()[15], 0xff);
        assert!(parse_uuid("xyz").is_none());
    }

    #[test]
    fn hosts_are_numbered_in_order_of_first_rank() {
        let (a, b) = (host(1, 10).id, host(1, 11).id);
        assert_eq!(host_indices(&[a, b, a, b]), [0, 1, 0, 1]);
        assert_eq!(host_indices(&[b, b, a]), [0, 0, 1]);
        assert_eq!(host_indices(&[a, HostId::default(), HostId::default(), a]), [0, 1, 2, 0], "unknown: alone");
    }

    #[test]
    fn shm_mode_parses() {
        assert_eq!("auto".parse::<ShmMode>(), Ok(ShmMode::Auto));
        assert_eq!(" OFF ".parse::<ShmMode>(), Ok(ShmMode::Off));
        assert!("maybe".parse::<ShmMode>().unwrap_err().contains("auto"));
    }
}
