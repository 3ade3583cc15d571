//! Starting ranks: locally as child processes (optionally pinned to CPUs,
//! optionally inside testbed hosts), and finding our place when a
//! launcher (us, mpirun, srun) started this process.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, bail};

/// Set in the environment of every rank we start.
pub const LAUNCHED: &str = "MULTIRAIL_LAUNCHED";

/// Environment of one rank of a job.
#[derive(Debug, Clone)]
pub struct RankEnv {
    pub rank: u32,
    pub size: u32,
    pub root: String,
    pub key: String,
    pub job: String,
    /// Extra variables (MULTIRAIL_RAILS inside a testbed host).
    pub extra: Vec<(String, String)>,
}

impl RankEnv {
    pub fn apply(&self, cmd: &mut Command) {
        cmd.env("MULTIRAIL_RANK", self.rank.to_string())
            .env("MULTIRAIL_SIZE", self.size.to_string())
            .env("MULTIRAIL_ROOT", &self.root)
            .env("MULTIRAIL_KEY", &self.key)
            .env("MULTIRAIL_JOB", &self.job)
            .env(LAUNCHED, "1");
        for (k, v) in &self.extra {
            cmd.env(k, v);
        }
    }
}

/// A free TCP port on `ip` (bound and released: another process may take
/// it in between, which on one machine in practice does not happen).
pub fn free_port(ip: &str) -> anyhow::Result<u16> {
    let l = TcpListener::bind((ip, 0)).with_context(|| format!("cannot bind a port on {ip}"))?;
    Ok(l.local_addr()?.port())
}

/// Parses `--pin`: `none`, `auto` or a CPU list; returns a CPU per rank.
pub fn parse_pin(s: &str, ranks: u32) -> anyhow::Result<Vec<Option<usize>>> {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    match s.trim() {
        "none" | "" => Ok(vec![None; ranks as usize]),
        "auto" => Ok((0..ranks as usize).map(|r| Some(r % cpus)).collect()),
        list => {
            let v: Vec<usize> = list
                .split(',')
                .map(|x| x.trim().parse::<usize>().with_context(|| format!("--pin {s}: '{x}' is not a CPU number")))
                .collect::<anyhow::Result<_>>()?;
            if v.is_empty() {
                bail!("--pin {s}: empty CPU list");
            }
            Ok((0..ranks as usize).map(|r| Some(v[r % v.len()])).collect())
        }
    }
}

/// A command line for one rank: `[ip netns exec NS] [taskset -c CPU] PROGRAM ARGS`.
pub fn rank_command(program: &str, args: &[String], cpu: Option<usize>, netns: Option<&str>) -> Command {
    let mut argv: Vec<String> = Vec::new();
    if let Some(ns) = netns {
        argv.extend(["ip", "netns", "exec", ns].map(String::from));
    }
    if let Some(c) = cpu {
        argv.extend(["taskset".to_string(), "-c".to_string(), c.to_string()]);
    }
    argv.push(program.to_string());
    argv.extend(args.iter().cloned());
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    cmd
}

/// Waits for every child; the first failure wins.
pub fn wait_all(mut children: Vec<(u32, Child)>) -> anyhow::Result<i32> {
    let mut code = 0;
    let mut failed_at: Option<std::time::Instant> = None;
    while !children.is_empty() {
        let mut i = 0;
        while i < children.len() {
            let (rank, c) = &mut children[i];
            match c.try_wait().with_context(|| format!("waiting for rank {rank}"))? {
                Some(st) => {
                    if !st.success() && code == 0 {
                        code = st.code().unwrap_or(1);
                        eprintln!("multirail: rank {rank} exited with {st}");
                        failed_at = Some(std::time::Instant::now());
                    }
                    children.swap_remove(i);
                }
                None => i += 1,
            }
        }
        // A failed rank usually means the job cannot finish: the others
        // get a grace period to report their own errors, then are ended
        // (a stopped or hung rank would keep the launcher waiting forever).
        if failed_at.is_some_and(|t| t.elapsed() >= ABORT_GRACE) && !children.is_empty() {
            let ranks: Vec<u32> = children.iter().map(|(r, _)| *r).collect();
            eprintln!("multirail: ending ranks {ranks:?}, still running {ABORT_GRACE:?} after a rank failed");
            kill_all(&mut children);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(code)
}

/// How long the other ranks may run on after one failed.
pub const ABORT_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

pub fn kill_all(children: &mut [(u32, Child)]) {
    for (_, c) in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Where to send a rank's stdout: rank 0's goes to ours.
pub fn stdout_for(rank: u32) -> Stdio {
    if rank == 0 { Stdio::inherit() } else { Stdio::null() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_lists() {
        assert_eq!(parse_pin("none", 2).unwrap(), vec![None, None]);
        assert_eq!(parse_pin("3,5", 3).unwrap(), vec![Some(3), Some(5), Some(3)]);
        assert!(parse_pin("a", 1).is_err());
        assert_eq!(parse_pin("auto", 1).unwrap(), vec![Some(0)]);
    }

    #[test]
    fn command_lines() {
        let c = rank_command("/bin/x", &["a".into()], Some(1), Some("mr-host0"));
        let args: Vec<_> = c.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(c.get_program(), "ip");
        assert_eq!(args, ["netns", "exec", "mr-host0", "taskset", "-c", "1", "/bin/x", "a"]);
    }
}
