//! Where a process sits in the job: rank, size and the meeting point,
//! from multirail's own variables or from the launcher that started it
//! (Open MPI, MPICH/PMI, Slurm).

use std::net::{SocketAddr, ToSocketAddrs};

use crate::Error;
use crate::config::env;

/// This process's place in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobInfo {
    pub rank: u32,
    pub size: u32,
    /// Where rank 0 listens for the others (`MULTIRAIL_ROOT`, or the
    /// single-node Open MPI default when PMIx is not there).
    pub root: Option<String>,
    /// No `MULTIRAIL_ROOT`, and a PMIx launcher started us: ranks exchange
    /// addresses through its PMIx server (`root` is then the fallback if
    /// libpmix cannot be loaded).
    pub pmix: bool,
    /// Which variables the rank and size came from.
    pub source: &'static str,
    /// The launcher says the ranks span several hosts (`None`: unknown).
    pub multi_node: Option<bool>,
    /// Ranks of this job on this host, if the launcher says
    /// (`MULTIRAIL_LOCAL_SIZE`, `OMPI_COMM_WORLD_LOCAL_SIZE`).
    pub local_size: Option<u32>,
}

/// (rank variable, size variable, name) in order of preference.
const SOURCES: [(&str, &str, &str); 4] = [
    ("MULTIRAIL_RANK", "MULTIRAIL_SIZE", "MULTIRAIL_RANK/SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"),
    ("PMI_RANK", "PMI_SIZE", "PMI"),
    ("SLURM_PROCID", "SLURM_NTASKS", "Slurm"),
];

impl JobInfo {
    /// Reads the job from the environment; `None` when no launcher set it.
    ///
    /// Meeting point, first that applies: `MULTIRAIL_ROOT`; the launcher's
    /// PMIx server (`PMIX_RANK`/`PMIX_NAMESPACE` set: `mpirun`, `srun
    /// --mpi=pmix`); under Open MPI with every rank on one node, a loopback
    /// port derived from the job id. Else a job of several ranks cannot
    /// start (the error says what to set).
    pub fn from_env() -> Result<Option<JobInfo>, Error> {
        for (rv, sv, name) in SOURCES {
            let (Some(r), Some(s)) = (env(rv), env(sv)) else { continue };
            let rank: u32 = r.trim().parse().map_err(|_| Error::Config(format!("{rv}={r}: not a rank")))?;
            let size: u32 = s.trim().parse().map_err(|_| Error::Config(format!("{sv}={s}: not a size")))?;
            if size == 0 || rank >= size {
                return Err(Error::Config(format!("{rv}={rank} is not below {sv}={size}")));
            }
            let explicit = env("MULTIRAIL_ROOT");
            let pmix = explicit.is_none() && name != "MULTIRAIL_RANK/SIZE" && multirail_pmix::Pmix::detected();
            let root = explicit.or_else(|| single_node_root(name, size));
            let local_size = ["MULTIRAIL_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"]
                .iter()
                .find_map(|v| env(v).and_then(|x| x.trim().parse::<u32>().ok()));
            let multi_node = multi_node(size);
            return Ok(Some(JobInfo { rank, size, root, pmix, source: name, multi_node, local_size }));
        }
        Ok(None)
    }
}

/// Whether the launcher's variables say the ranks span several hosts.
fn multi_node(size: u32) -> Option<bool> {
    if let Some(local) = env("OMPI_COMM_WORLD_LOCAL_SIZE").and_then(|v| v.trim().parse::<u32>().ok()) {
        return Some(local < size);
    }
    env("SLURM_NNODES").and_then(|v| v.trim().parse::<u32>().ok()).map(|n| n > 1)
}

/// Under Open MPI with every rank on one node, a meeting point on
/// loopback derived from the job id, so `mpirun -np 2 prog` needs no
/// MULTIRAIL_ROOT.
fn single_node_root(source: &str, size: u32) -> Option<String> {
    if source != "Open MPI" || env("OMPI_COMM_WORLD_LOCAL_SIZE")?.trim().parse::<u32>().ok()? != size {
        return None;
    }
    let job = env("OMPI_MCA_ess_base_jobid").or_else(|| env("OMPI_MCA_orte_ess_jobid")).unwrap_or_default();
    let h = crate::config::parse_job(&format!("ompi-{job}")).unwrap_or(0);
    Some(format!("127.0.0.1:{}", derived_port(h, ephemeral_low())))
}

/// The single-node meeting port for job hash `h`: below the kernel's
/// ephemeral range (which starts at `low`), where no outgoing connection
/// can hold it when rank 0 binds it ("Address already in use" was seen
/// in a parallel test run when it was drawn from 20000-39999, half of
/// which is in the default range 32768-60999).
fn derived_port(h: u64, low: u16) -> u16 {
    // A range that leaves no room below it: the old fixed span.
    let span = room_below(low).unwrap_or(20_000);
    ROOT_PORT_FLOOR + (h % u64::from(span)) as u16
}

/// Meeting ports ([`free_root_port`], the single-node default) are drawn
/// from here up to the kernel's ephemeral range.
const ROOT_PORT_FLOOR: u16 = 10_000;

/// How many ports lie from [`ROOT_PORT_FLOOR`] up to an ephemeral range
/// that starts at `low`; `None` when that leaves no room (under 1000).
fn room_below(low: u16) -> Option<u16> {
    (low > ROOT_PORT_FLOOR + 1_000).then(|| low - ROOT_PORT_FLOOR)
}

/// Resolves `host:port[,host:port...]` (rank 0 listens on each; the
/// others try each in turn, so the job can meet over any rail).
pub fn resolve(list: &str) -> Result<Vec<SocketAddr>, Error> {
    let mut out = Vec::new();
    for addr in list.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        let a = addr
            .to_socket_addrs()
            .map_err(|e| Error::Config(format!("MULTIRAIL_ROOT={list}: '{addr}': {e}")))?
            .next()
            .ok_or_else(|| Error::Config(format!("MULTIRAIL_ROOT={list}: '{addr}' has no address")))?;
        out.push(a);
    }
    if out.is_empty() {
        return Err(Error::Config("MULTIRAIL_ROOT is empty (expected host:port[,host:port...])".into()));
    }
    Ok(out)
}

/// A TCP port on `ip` for rank 0 to listen on (`MULTIRAIL_ROOT`), free
/// when this returns, for launchers and test harnesses that start ranks.
///
/// The port is released before rank 0 binds it, so another process could
/// take it in between. The usual taker is an outgoing connection, whose
/// port the kernel draws from its ephemeral range
/// (`net.ipv4.ip_local_port_range`, 32768-60999 by default), the same
/// range a bind to port 0 draws from: seen once in a parallel test run
/// ("Address already in use" at rank 0). So the port is drawn at random
/// from 10000 up to that range instead, where only an explicit bind can
/// take it. When the range leaves no room below it, or 32 draws find
/// nothing free, the kernel picks (port 0).
pub fn free_root_port(ip: std::net::IpAddr) -> std::io::Result<u16> {
    use std::hash::{BuildHasher, Hasher};
    if let Some(span) = room_below(ephemeral_low()) {
        let span = u64::from(span);
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let mut x = h.finish();
        for _ in 0..32 {
            let port = ROOT_PORT_FLOOR + (x % span) as u16;
            if std::net::TcpListener::bind((ip, port)).is_ok() {
                return Ok(port);
            }
            x = x.rotate_left(29).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d;
        }
    }
    Ok(std::net::TcpListener::bind((ip, 0))?.local_addr()?.port())
}

/// The first port of the kernel's ephemeral range (Linux's default,
/// 32768, if unreadable).
fn ephemeral_low() -> u16 {
    let read = || -> Option<u16> {
        let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
        s.split_whitespace().next()?.parse().ok()
    };
    read().unwrap_or(32_768)
}

#[cfg(test)]
mod port_tests {
    use super::*;

    #[test]
    fn a_root_port_is_free_and_outside_the_ephemeral_range() {
        let ip = std::net::IpAddr::from([127, 0, 0, 1]);
        let low = ephemeral_low();
        let ports: Vec<u16> = (0..8).map(|_| free_root_port(ip).unwrap()).collect();
        for &p in &ports {
            std::net::TcpListener::bind((ip, p)).unwrap_or_else(|e| panic!("port {p} not free: {e}"));
            if low > 11_000 {
                assert!((10_000..low).contains(&p), "port {p} is not in 10000..{low}");
            }
        }
        // Drawn at random: eight draws from thousands of ports differ.
        assert!(ports.iter().any(|&p| p != ports[0]), "{ports:?}");
    }

    #[test]
    fn the_single_node_port_is_below_the_ephemeral_range() {
        for h in (0..200_000u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)) {
            assert!((10_000..32_768).contains(&derived_port(h, 32_768)));
            assert!((10_000..15_000).contains(&derived_port(h, 15_000)));
            assert!((10_000..30_000).contains(&derived_port(h, 1_024)), "no room below: the old span");
        }
        // The job decides the port: two jobs rarely share one.
        assert_ne!(derived_port(1, 32_768), derived_port(2, 32_768));
    }
}
