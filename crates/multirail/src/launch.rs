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
    Some(format!("127.0.0.1:{}", 20000 + h % 20000))
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
