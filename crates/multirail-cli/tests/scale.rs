//! Many ranks on one machine, and ranks that stop: 64 local ranks of a
//! validated mbw_mr with both engines, with the TCP connections counted
//! (connections open on demand, not a full mesh); a rank stopped with
//! SIGSTOP for 10 s and continued (the job finishes, every byte checked);
//! a rank stopped past the peer timeout (the other gets an error naming
//! it). Every run is bounded in time. This file runs alone (cargo runs test
//! binaries one after another), so the connection count sees only its job.

mod common;

use common::wait_bounded;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The tests of this file run one at a time (each starts a job of its own
/// and the connection count must see only one).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn multirail(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_multirail"));
    c.args(args)
        .env_remove("MULTIRAIL_RAILS")
        .env_remove("MULTIRAIL_LAUNCHED")
        .env_remove("MULTIRAIL_RANK")
        .env_remove("MULTIRAIL_ROOT")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Established TCP connections on this machine (IPv4 and IPv6).
fn established() -> usize {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|t| t.lines().skip(1).map(str::to_string).collect::<Vec<_>>())
        .filter(|l| l.split_whitespace().nth(3) == Some("01"))
        .count()
}

#[test]
fn sixty_four_ranks_both_engines_connect_on_demand() {
    let _serial = serial();
    const RANKS: usize = 64;
    const RAILS: usize = 2;
    let pairs = RANKS / 2;
    for progress in ["polled", "threaded"] {
        let before = established();
        let child = multirail(&[
            "bench",
            "mbw_mr",
            "--pairs",
            &pairs.to_string(),
            "--sizes",
            "8,1K",
            "--iterations",
            "20",
            "--warmup",
            "1",
            "--validate",
            "--progress",
            progress,
        ])
        // The TCP rails' connections are what is counted: the ranks of this
        // host must use them, not the shared memory they would get by
        // themselves.
        .env("MULTIRAIL_SHM", "off")
        .spawn()
        .expect("start the job");
        let mut peak = 0;
        let o = wait_bounded(child, Duration::from_secs(300), progress, || {
            peak = peak.max(established().saturating_sub(before));
        });
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{progress}: {err}");
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(out.lines().filter(|l| l.trim_end().ends_with("Pass")).count(), 2, "{progress}: {out}");
        assert!(!err.contains("rail down"), "{progress}: no rail failed: {err}");
        // A loopback connection is two established sockets. The pairs use
        // every rail; the barrier and the result gathering add at most one
        // connection per rank; bootstrap one per rank while it lasts. A
        // full mesh would be RANKS * (RANKS - 1) * RAILS = 8064 sockets.
        let bound = 2 * (2 * pairs * RAILS + 2 * RANKS);
        eprintln!("{progress}: peak {peak} established sockets during the job (bound {bound})");
        assert!(peak <= bound, "{progress}: {peak} sockets, more than {bound}");
    }
}

/// Pid of the rank of job `launcher` whose MULTIRAIL_RANK is `rank`.
fn rank_pid(launcher: u32, rank: u32) -> Option<u32> {
    let kids = std::fs::read_to_string(format!("/proc/{launcher}/task/{launcher}/children")).ok()?;
    kids.split_whitespace().filter_map(|p| p.parse::<u32>().ok()).find(|p| {
        std::fs::read(format!("/proc/{p}/environ"))
            .is_ok_and(|e| e.split(|&b| b == 0).any(|v| v == format!("MULTIRAIL_RANK={rank}").as_bytes()))
    })
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill").args([sig, &pid.to_string()]).status();
    assert!(ok.is_ok_and(|s| s.success()), "kill {sig} {pid}");
}

/// Starts a long validated bw job and returns it with rank 1's pid once
/// the ranks run.
fn start_job(extra_env: &[(&str, &str)]) -> (Child, u32) {
    let mut c = multirail(&["bench", "bw", "--sizes", "64K", "--iterations", "4000", "--warmup", "1", "--validate"]);
    for (k, v) in extra_env {
        c.env(k, v);
    }
    let child = c.spawn().expect("start the job");
    let end = Instant::now() + Duration::from_secs(30);
    let pid = loop {
        if let Some(p) = rank_pid(child.id(), 1) {
            break p;
        }
        assert!(Instant::now() < end, "rank 1 did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Let the transfer get going.
    std::thread::sleep(Duration::from_millis(1500));
    (child, pid)
}

#[test]
fn a_rank_stopped_for_ten_seconds_then_continued_loses_nothing() {
    let _serial = serial();
    let (child, pid) = start_job(&[]);
    signal(pid, "-STOP");
    std::thread::sleep(Duration::from_secs(10));
    signal(pid, "-CONT");
    let o = wait_bounded(child, Duration::from_secs(300), "job with a stopped rank", || {});
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "the job finishes: {err}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.lines().last().is_some_and(|l| l.trim_end().ends_with("Pass")), "validated: {out}");
}

#[test]
fn a_rank_stopped_past_the_peer_timeout_is_named_in_the_error() {
    let _serial = serial();
    let (child, pid) = start_job(&[("MULTIRAIL_PEER_TIMEOUT_MS", "3000")]);
    signal(pid, "-STOP");
    // Rank 0 fails after the peer timeout; the launcher ends the stopped
    // rank after its grace period.
    let o = wait_bounded(child, Duration::from_secs(120), "job with a rank stopped for good", || {});
    let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).stderr(Stdio::null()).status();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("rank 1") && err.contains("peer timeout"), "the error names the rank: {err}");
}
