//! Starting ranks: locally as child processes (optionally pinned to CPUs,
//! optionally inside testbed hosts), and finding our place when a
//! launcher (us, mpirun, srun) started this process.

use std::net::TcpListener;
use std::os::unix::process::ExitStatusExt;
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
    /// Where the rank writes its final error ([`RankErrors::path`]).
    pub error_file: Option<std::path::PathBuf>,
}

impl RankEnv {
    pub fn apply(&self, cmd: &mut Command) {
        cmd.env("MULTIRAIL_RANK", self.rank.to_string())
            .env("MULTIRAIL_SIZE", self.size.to_string())
            .env("MULTIRAIL_ROOT", &self.root)
            .env("MULTIRAIL_KEY", &self.key)
            .env("MULTIRAIL_JOB", &self.job)
            .env(LAUNCHED, "1");
        if let Some(e) = &self.error_file {
            cmd.env(ERROR_FILE, e);
        }
        for (k, v) in &self.extra {
            cmd.env(k, v);
        }
    }
}

/// A free TCP port on `ip` for rank 0 (`multirail::free_root_port`:
/// drawn below the ephemeral range, so that no outgoing connection takes
/// it before rank 0 binds it).
pub fn free_port(ip: &str) -> anyhow::Result<u16> {
    let addr: std::net::IpAddr = ip.parse().with_context(|| format!("not an IP address: {ip}"))?;
    multirail::free_root_port(addr).with_context(|| format!("cannot bind a port on {ip}"))
}

/// Checks, before any rank starts, that every rail can be used on this
/// host: its interface exists and has an address, and this host can
/// listen on that address. `named` is how the user gave the rails
/// (`--rails X`, `MULTIRAIL_RAILS=X`), for the message.
pub fn check_rails(rails: &[multirail_transport::RailSpec], named: &str) -> anyhow::Result<()> {
    for (k, spec) in rails.iter().enumerate() {
        let r = spec.resolve().map_err(|e| anyhow::anyhow!("{named}: rail {k} ({spec}): {e}"))?;
        if let Err(e) = TcpListener::bind((r.ip, 0)) {
            bail!(
                "{named}: rail {k} ({spec}): cannot listen on {}: {e} (not an address of this host? \
                 `multirail info` lists the usable ones)",
                r.ip
            );
        }
    }
    Ok(())
}

/// Where a rank started by a local launch writes its final error instead
/// of stderr (`main` does), so that the launcher prints one error for the
/// job rather than one per rank, interleaved.
pub const ERROR_FILE: &str = "MULTIRAIL_ERROR_FILE";

/// The error files of one local job, in a directory of their own that is
/// removed when this is dropped.
pub struct RankErrors {
    dir: std::path::PathBuf,
}

impl RankErrors {
    pub fn new(job: &str) -> anyhow::Result<RankErrors> {
        let dir = std::env::temp_dir().join(format!("multirail-{job}"));
        std::fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(RankErrors { dir })
    }

    /// The file rank `rank` writes its error to.
    pub fn path(&self, rank: u32) -> std::path::PathBuf {
        self.dir.join(format!("rank-{rank}"))
    }

    /// The error written first, with its rank.
    fn first(&self, ranks: u32) -> Option<(u32, String)> {
        (0..ranks)
            .filter_map(|r| {
                let text = std::fs::read_to_string(self.path(r)).ok()?;
                let (at, msg) = text.split_once('\n')?;
                Some((at.parse::<u128>().ok()?, r, msg.trim_end().to_string()))
            })
            .min()
            .map(|(_, r, msg)| (r, msg))
    }
}

impl Drop for RankErrors {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A rank's side of [`RankErrors`]: writes `message` where the launcher
/// looks for it; false if this process was not started by a local launch
/// (or the file cannot be written), and the caller prints it itself.
/// Only the first message is written (later calls return what the first
/// did): see [`reported_before_drop`].
pub fn report_to_launcher(message: &str) -> bool {
    static REPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REPORTED.get_or_init(|| write_for_launcher(message))
}

/// A closed pipe (`| head`) is not an error worth a message.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

/// A rank's error is told to the launcher while its endpoint still
/// exists. Dropping the endpoint closes its listeners, and a peer that
/// then finds it gone fails with "connection refused"; the launcher prints
/// the error written first, which must be the cause, not that consequence.
pub fn reported_before_drop<T>(r: anyhow::Result<T>) -> anyhow::Result<T> {
    if let Err(e) = &r
        && !is_broken_pipe(e)
    {
        report_to_launcher(&format!("{e:#}"));
    }
    r
}

fn write_for_launcher(message: &str) -> bool {
    let Some(path) = std::env::var_os(ERROR_FILE).filter(|_| std::env::var_os(LAUNCHED).is_some()) else {
        return false;
    };
    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    std::fs::write(path, format!("{at}\n{message}\n")).is_ok()
}

/// Parses `--pin`: `none`, `auto` or a CPU list; returns a CPU per rank.
/// Every CPU must be one this process may run on (checked here, before
/// any rank starts, rather than by `taskset` in each rank), and a list
/// may not name more CPUs than there are ranks (the rest would be
/// ignored).
pub fn parse_pin(s: &str, ranks: u32) -> anyhow::Result<Vec<Option<usize>>> {
    pin_on(s, ranks, &multirail::cpus::usable())
}

fn pin_on(s: &str, ranks: u32, usable: &[usize]) -> anyhow::Result<Vec<Option<usize>>> {
    match s.trim() {
        "none" | "" => Ok(vec![None; ranks as usize]),
        "auto" => Ok((0..ranks as usize).map(|r| usable.get(r % usable.len().max(1)).copied()).collect()),
        list => {
            let v: Vec<usize> = list
                .split(',')
                .map(|x| x.trim().parse::<usize>().with_context(|| format!("--pin {s}: '{x}' is not a CPU number")))
                .collect::<anyhow::Result<_>>()?;
            if v.len() > ranks as usize {
                bail!(
                    "--pin {s}: {} CPUs for {ranks} ranks; give at most one per rank (a shorter list is reused in turn)",
                    v.len()
                );
            }
            if let Some(bad) = v.iter().find(|c| !usable.contains(c)) {
                bail!(
                    "--pin {s}: CPU {bad} does not exist or is not usable here (usable: {})",
                    multirail::cpus::format_list(usable)
                );
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

/// Waits for every child; the first failure wins. A rank killed by a
/// signal is named with its signal and makes the exit status 2.
/// A rank that wrote its error to `errors` is not reported again here;
/// the first error written is printed once, naming its rank, at the end.
pub fn wait_all(mut children: Vec<(u32, Child)>, errors: &RankErrors) -> anyhow::Result<i32> {
    let ranks = children.iter().map(|(r, _)| r + 1).max().unwrap_or(0);
    let mut code = 0;
    let mut failed_at: Option<std::time::Instant> = None;
    while !children.is_empty() {
        let mut i = 0;
        while i < children.len() {
            let (rank, c) = &mut children[i];
            match c.try_wait().with_context(|| format!("waiting for rank {rank}"))? {
                Some(st) => {
                    if let Some(sig) = st.signal() {
                        eprintln!("multirail: rank {rank} was killed by signal {sig} ({})", signal_name(sig));
                    }
                    if !st.success() && code == 0 {
                        code = exit_code(st);
                        if st.signal().is_none() && !errors.path(*rank).exists() {
                            eprintln!("multirail: rank {rank} exited with {st}");
                        }
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
    if let Some((rank, msg)) = errors.first(ranks).filter(|_| code != 0) {
        let named = if msg.starts_with("rank ") { msg } else { format!("rank {rank}: {msg}") };
        eprintln!("multirail: error: {named}");
    }
    Ok(code)
}

/// A child's exit status as ours: its code, or 2 (an error) when a
/// signal ended it.
pub fn exit_code(st: std::process::ExitStatus) -> i32 {
    st.code().unwrap_or(2)
}

/// The usual name of a signal number on Linux.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGSYS => "SIGSYS",
        _ => "a signal",
    }
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
        assert_eq!(pin_on("3,5", 3, &[0, 3, 5]).unwrap(), vec![Some(3), Some(5), Some(3)]);
        assert!(parse_pin("a", 1).is_err());
        assert_eq!(parse_pin("auto", 1).unwrap(), vec![Some(multirail::cpus::usable()[0])]);
    }

    #[test]
    fn pin_checks_cpus_and_counts() {
        let usable = [0, 1, 2, 3];
        assert_eq!(pin_on("0,1", 4, &usable).unwrap(), vec![Some(0), Some(1), Some(0), Some(1)]);
        let e = pin_on("99,98", 2, &usable).unwrap_err().to_string();
        assert!(e.contains("--pin 99,98") && e.contains("CPU 99") && e.contains("usable: 0-3"), "{e}");
        let e = pin_on("0,1,2", 2, &usable).unwrap_err().to_string();
        assert!(e.contains("3 CPUs for 2 ranks"), "{e}");
        assert_eq!(pin_on("auto", 3, &[2, 3]).unwrap(), vec![Some(2), Some(3), Some(2)]);
    }

    #[test]
    fn command_lines() {
        let c = rank_command("/bin/x", &["a".into()], Some(1), Some("mr-host0"));
        let args: Vec<_> = c.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(c.get_program(), "ip");
        assert_eq!(args, ["netns", "exec", "mr-host0", "taskset", "-c", "1", "/bin/x", "a"]);
    }
}
