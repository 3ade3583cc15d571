//! multirail on the emulated cluster (needs root, iproute2 and tbf; skips
//! with the reason otherwise): validated transfers of assorted sizes with
//! both progress engines, and rails that fail silently (`ip link set
//! down`, which tells TCP nothing) in every way issue 8 lists: for good on
//! either side, for seconds, under lone small messages whose other rail was
//! never opened, before the job starts, two of three one after
//! the other, every rail at once for less than the peer timeout (the job
//! pauses) and for good (the job ends, naming the silent rank), and random
//! losses of random length; and a group of three members that rides out a
//! silent rail of every length; over `ofi:tcp`, a rail failing mid-run and
//! one down before the start (with the provider's connections made at
//! setup and at the first message). Every byte is validated,
//! and every run is bounded in time: a hang fails with a clear message.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn multirail(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_multirail"));
    c.args(args).env_remove("MULTIRAIL_RAILS").env_remove("MULTIRAIL_LAUNCHED").env_remove("MULTIRAIL_RANK");
    c
}

/// A testbed that is removed when dropped.
struct Testbed(String);

impl Testbed {
    fn up(tag: &str, rate: &str) -> Option<Testbed> {
        Testbed::up_rails(tag, rate, 2)
    }

    fn up_rails(tag: &str, rate: &str, rails: usize) -> Option<Testbed> {
        Testbed::up_hosts(tag, rate, rails, 2)
    }

    fn up_hosts(tag: &str, rate: &str, rails: usize, hosts: usize) -> Option<Testbed> {
        let prefix = format!("mrt{}{tag}", std::process::id() % 10000);
        let (n, h) = (rails.to_string(), hosts.to_string());
        let o = multirail(&["testbed", "up", "--prefix", &prefix, "--rate", rate, "--rails", &n, "--hosts", &h])
            .output()
            .ok()?;
        if !o.status.success() {
            eprintln!("skipping: cannot build a testbed here: {}", String::from_utf8_lossy(&o.stderr).trim());
            return None;
        }
        Some(Testbed(prefix))
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        let _ = multirail(&["testbed", "down", "--prefix", &self.0]).output();
    }
}

fn check(o: &Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{what} failed: {err}");
    err
}

#[test]
fn validated_transfers_through_the_testbed_both_engines() {
    let Some(tb) = Testbed::up("v", "1gbit") else { return };
    for progress in ["polled", "threaded"] {
        let o = multirail(&[
            "bench",
            "bw",
            "--testbed",
            "--testbed-prefix",
            &tb.0,
            "--pin",
            "0,1",
            "--progress",
            progress,
            "--validate",
            "--sizes",
            "1,777,65536,1000003,4M",
            "--iterations",
            "3",
            "--warmup",
            "1",
            "--rail-stats",
        ])
        .output()
        .unwrap();
        check(&o, progress);
        let t = String::from_utf8_lossy(&o.stdout);
        assert!(t.contains("tcp:10.77.0.1,tcp:10.77.1.1"), "ranks used the testbed rails: {t}");
        let last = t.lines().last().unwrap();
        // Size, MB/s, Validation (Pass), rail0 MB, rail0 %, rail1 MB, rail1 %.
        let cols: Vec<&str> = last.split_whitespace().collect();
        assert_eq!(cols[2], "Pass", "{last}");
        let share = |i: usize| cols[i].parse::<f64>().unwrap();
        assert!(share(4) > 10.0 && share(6) > 10.0, "4 MiB messages use both rails: {last}");
    }
}

#[test]
fn rail_taken_down_with_ip_link_mid_run() {
    let Some(tb) = Testbed::up("f", "1gbit") else { return };
    let o = multirail(&[
        "bench",
        "bw",
        "--testbed",
        "--testbed-prefix",
        &tb.0,
        "--pin",
        "0,1",
        "--validate",
        "--sizes",
        "1M",
        "--iterations",
        "60",
        "--warmup",
        "1",
        "--fail-rail",
        "1@300ms:for=700ms",
    ])
    .output()
    .unwrap();
    let err = check(&o, "bench with a failing rail");
    assert!(err.contains("rail 1 down at") && err.contains("back up at"), "{err}");
    // The interface is up again afterwards.
    let o = multirail(&["testbed", "exec", "host0", "--prefix", &tb.0, "--", "ip", "-br", "link", "show", "rail1"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("UP"), "rail1 is back up");
}

/// The args of a validated `bench TEST` in testbed `tb`, ranks pinned,
/// then `more`.
/// Ranks on two hosts of the testbed (two network namespaces, one kernel)
/// pinned to one CPU find each other there through the address table's
/// PIDs, as ranks of one host do, and so give the CPU away from the first
/// round of a wait; pinned to two CPUs they do not.
#[test]
fn testbed_ranks_pinned_to_one_cpu_see_each_other_there() {
    let usable = multirail::cpus::usable();
    if usable.len() < 2 || multirail::cpus::host() < 2 {
        eprintln!("skipped: fewer than 2 usable CPUs here (ranks do not spin on one CPU)");
        return;
    }
    let Some(tb) = Testbed::up("c", "1gbit") else { return };
    let log = |pin: String| {
        let o = multirail(&[
            "bench",
            "latency",
            "--testbed",
            "--testbed-prefix",
            &tb.0,
            "--sizes",
            "8",
            "--iterations",
            "200",
            "--warmup",
            "2",
            "--pin",
            &pin,
        ])
        .env("MULTIRAIL_LOG", "warn,multirail::cpus=debug")
        .env_remove("MULTIRAIL_SPIN_US")
        .output()
        .unwrap();
        check(&o, &format!("--pin {pin}"))
    };
    let (a, b) = (usable[0], usable[1]);
    let err = log(format!("{a},{a}"));
    for peer in [0, 1] {
        let said = err.lines().any(|l| {
            l.contains(&format!("rank {peer} (pid "))
                && l.contains(&format!("last ran on this thread's CPU {a}: waits for it yield"))
        });
        assert!(said, "rank {peer} was not found on CPU {a}: {err}");
    }
    let err = log(format!("{a},{b}"));
    assert!(!err.contains("last ran on this thread's CPU"), "ranks on CPUs {a} and {b}: {err}");
}

fn validated_in<'a>(tb: &'a Testbed, test: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["bench", test, "--testbed", "--testbed-prefix", &tb.0, "--pin", "0,1", "--validate"];
    a.extend_from_slice(more);
    a
}

/// The args of a validated `bench bw` in testbed `tb` over `rails`.
fn bw_over<'a>(tb: &'a Testbed, rails: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    let mut a = validated_in(tb, "bw", &["--rails", rails]);
    a.extend_from_slice(more);
    a
}

/// Under `--testbed`, `--rails` names interfaces, which each rank resolves
/// inside its own host: both rails carry validated 4 MiB messages.
#[test]
fn testbed_rails_named_by_interface_resolve_in_each_host() {
    let Some(tb) = Testbed::up("i", "1gbit") else { return };
    let more = ["--sizes", "1,65536,4M", "--iterations", "3", "--warmup", "1", "--rail-stats"];
    let o = multirail(&bw_over(&tb, "tcp:rail0,tcp:rail1", &more)).output().unwrap();
    check(&o, "bench over tcp:rail0,tcp:rail1");
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(t.contains("rails: tcp:rail0,tcp:rail1"), "{t}");
    let cols: Vec<&str> = t.lines().last().unwrap().split_whitespace().collect();
    assert_eq!(cols[2], "Pass", "{t}");
    let share = |i: usize| cols[i].parse::<f64>().unwrap();
    assert!(share(4) > 10.0 && share(6) > 10.0, "4 MiB messages use both rails: {t}");
}

/// Failover over the libfabric rail: `ofi:tcp` on the testbed's two rails,
/// rail 1's link down for 700 ms mid-run, every byte validated.
#[cfg(feature = "ofi")]
#[test]
fn ofi_rail_taken_down_with_ip_link_mid_run() {
    let Some(tb) = Testbed::up("o", "1gbit") else { return };
    ofi_failover(&tb, false);
}

/// The same with RMA (off through `tcp` by default): 1 MiB messages are
/// lent and read with `fi_read` when a rail goes; what was being read on
/// the failed rail is sent again on the other, every byte validated.
#[cfg(feature = "ofi")]
#[test]
fn ofi_rail_with_rma_taken_down_with_ip_link_mid_run() {
    let Some(tb) = Testbed::up("or", "1gbit") else { return };
    ofi_failover(&tb, true);
}

#[cfg(feature = "ofi")]
fn ofi_failover(tb: &Testbed, rma: bool) {
    let run = |more: &[&str], what: &str| {
        let mut cmd = multirail(&bw_over(tb, "ofi:tcp:rail0,ofi:tcp:rail1", more));
        if rma {
            cmd.env("MULTIRAIL_OFI_RMA", "on").env("MULTIRAIL_LOG", "warn,multirail=debug");
        }
        let o = cmd.output().unwrap();
        let err = check(&o, what);
        assert_eq!(err.contains("lends payloads of 65536 bytes"), rma, "RMA {}: {err}", if rma { "on" } else { "off" });
        (String::from_utf8_lossy(&o.stdout).into_owned(), err)
    };
    let more = ["--sizes", "1M", "--iterations", "60", "--warmup", "1", "--fail-rail", "1@300ms:for=700ms"];
    let (t, err) = run(&more, "bench over ofi:tcp with a failing rail");
    assert!(err.contains("rail 1 down at") && err.contains("back up at"), "{err}");
    assert!(t.contains("rails: ofi:tcp:rail0,ofi:tcp:rail1"), "{t}");
    assert_eq!(t.lines().last().unwrap().split_whitespace().nth(2), Some("Pass"), "{t}");
    // Lost for good on the receiving side, 1 s in: the run ends on rail 0,
    // validated (the replaced endpoints are not closed: libfabric 1.17
    // crashed closing them, see OfiStream's Drop).
    let more = ["--sizes", "1M", "--iterations", "20", "--warmup", "1", "--fail-rail", "1@1s:for=forever:side=host1"];
    let (t, err) = run(&more, "bench over ofi:tcp with a rail lost for good");
    assert!(err.contains("down for the rest of the run"), "{err}");
    assert_eq!(t.lines().last().unwrap().split_whitespace().nth(2), Some("Pass"), "{t}");
}

/// An `ofi:tcp` rail whose link is down before the job starts, on either
/// side, with the provider's connections made at setup (the exchange of
/// first messages, `MULTIRAIL_OFI_CONNECT=setup`, what a crowded host
/// gets) and at the first message: the job starts on the other rail, and
/// the rail joins once its link comes up 4 s later, every byte validated.
#[cfg(feature = "ofi")]
#[test]
fn ofi_rail_down_before_the_start_joins_when_it_comes_up() {
    let Some(tb) = Testbed::up("ob", "1gbit") else { return };
    for host in ["host0", "host1"] {
        for connect in ["setup", "first"] {
            let back = down_for(format!("{}-{host}", tb.0), "rail1", Duration::from_secs(4));
            let what = format!("rail 1 down on {host} before the start, MULTIRAIL_OFI_CONNECT={connect}");
            // 30 windows of 64 x 1 MiB: about 8 s on one 1 Gbit rail,
            // past the 4 s.
            let more = ["--sizes", "1M", "--iterations", "30", "--warmup", "1", "--rail-stats"];
            let mut cmd = multirail(&bw_over(&tb, "ofi:tcp:rail0,ofi:tcp:rail1", &more));
            cmd.env("MULTIRAIL_OFI_CONNECT", connect);
            let o = bounded(cmd, Duration::from_secs(120), &what);
            back.join().expect("rail1 back up");
            check(&o, &what);
            let out = String::from_utf8_lossy(&o.stdout);
            // Size, MB/s, Validation, rail0 MB, rail0 %, rail1 MB, rail1 %.
            let last: Vec<&str> = out.lines().last().unwrap_or_default().split_whitespace().collect();
            assert_eq!(last.get(2), Some(&"Pass"), "{what}: {out}");
            let rail1: f64 = last.get(5).and_then(|v| v.parse().ok()).unwrap_or(0.0);
            assert!(rail1 > 0.0, "{what}: rail 1 joined once it came up and carried data: {out}");
        }
    }
}

/// Sets link `rail` of namespace `ns` down now and up again after `d`, on
/// a thread whose handle is returned (join it once the run is over).
fn down_for(ns: String, rail: &'static str, d: Duration) -> std::thread::JoinHandle<()> {
    let ip = move |state: &str| {
        let ok = Command::new("ip").args(["-n", &ns, "link", "set", rail, state]).status();
        assert!(ok.is_ok_and(|s| s.success()), "ip -n {ns} link set {rail} {state}");
    };
    ip("down");
    std::thread::spawn(move || {
        std::thread::sleep(d);
        ip("up");
    })
}

/// Runs `cmd` for at most `limit`; a run that does not end in time is
/// killed and fails the test, saying what hung.
fn bounded(mut cmd: Command, limit: Duration, what: &str) -> Output {
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start multirail");
    common::wait_bounded(child, limit, what, || {})
}

/// A validated 1 MiB bw run on testbed `tb` with the given extra flags;
/// returns its stderr (the fail report).
fn bw_with(tb: &Testbed, extra: &[&str], what: &str) -> String {
    bw_out(tb, extra, what).1
}

/// [`bw_with`], returning stdout (the table with per-rail columns) too.
fn bw_out(tb: &Testbed, extra: &[&str], what: &str) -> (String, String) {
    let mut args = vec![
        "bench",
        "bw",
        "--testbed",
        "--testbed-prefix",
        &tb.0,
        "--pin",
        "0,1",
        "--validate",
        "--sizes",
        "1M",
        "--iterations",
        "40",
        "--warmup",
        "1",
        "--rail-stats",
    ];
    args.extend_from_slice(extra);
    let o = bounded(multirail(&args), Duration::from_secs(120), what);
    let err = check(&o, what);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(out.lines().last().is_some_and(|l| l.contains("Pass")), "{what}: every byte validated: {out}");
    (out, err)
}

/// The per-rail lines of the fail report: (MB during run, downs, suspects).
fn rail_lines(err: &str) -> Vec<(f64, u64, u64)> {
    err.lines()
        .filter_map(|l| {
            let c: Vec<&str> = l.trim_start_matches('#').split_whitespace().collect();
            (c.len() == 7 && c[0].parse::<usize>().is_ok())
                .then(|| (c[2].parse().unwrap_or(-1.0), c[5].parse().unwrap_or(0), c[6].parse().unwrap_or(0)))
        })
        .collect()
}

#[test]
fn permanent_silent_loss_on_either_side() {
    let Some(tb) = Testbed::up("p", "1gbit") else { return };
    for side in ["host0", "host1"] {
        // 1 s in: the rails are connected and busy by then (the run lasts
        // ~10 s), so rail 1 goes silent with data in flight.
        let spec = format!("1@1s:for=forever:side={side}");
        let err = bw_with(&tb, &["--fail-rail", &spec], &format!("rail 1 lost for good in {side}"));
        assert!(err.contains("down for the rest of the run"), "{err}");
        let rails = rail_lines(&err);
        assert_eq!(rails.len(), 2, "{err}");
        assert!(rails[0].0 > rails[1].0, "rail 0 carried the run: {err}");
        if rails[1].0 == 0.0 {
            // A machine so loaded that rail 1 was not even connected 1 s in
            // (connections open on first use): nothing was in flight on it
            // to route around. Seen once under a parallel CI run.
            eprintln!("{side}: rail 1 carried nothing before it went silent; no suspect to check: {err}");
        } else {
            assert!(rails[1].2 >= 1, "rail 1 was routed around (suspect): {err}");
        }
        assert_eq!(rails[1].1, 0, "silence is not a connection failure: {err}");
    }
}

/// Lone small messages use only the pair's preferred rail (rail 1 for
/// ranks 0 and 1), and with connections on demand rail 0 is never opened.
/// That rail goes silent for good on either side, and for seconds: the
/// job must connect rail 0 and go on over it (before 2026-11-28 it waited
/// for the link, and a link lost for good failed the job at the peer
/// timeout). Every message validated.
#[test]
fn small_messages_move_when_their_only_connected_rail_goes_silent() {
    let Some(tb) = Testbed::up("s", "1gbit") else { return };
    // 1 s in, so that rail 1 carries the messages before it goes silent:
    // at 300 ms a loaded debug run (CI, 2026-11-28) had moved nothing yet,
    // rail 1 never carried a message, and there was nothing to route
    // around (a rail down before the start has its own test).
    for spec in ["1@1s:for=forever:side=host0", "1@1s:for=forever:side=host1", "1@1s:for=3s"] {
        let more = ["--sizes", "8", "--iterations", "120000", "--warmup", "10", "--rail-stats", "--fail-rail", spec];
        let o = bounded(multirail(&validated_in(&tb, "latency", &more)), Duration::from_secs(120), spec);
        let err = check(&o, spec);
        let out = String::from_utf8_lossy(&o.stdout);
        let cols: Vec<&str> = out.lines().last().unwrap_or_default().split_whitespace().collect();
        // Size, latency, Validation, rail0 MB, rail0 %, rail1 MB, rail1 %.
        assert_eq!(cols.get(2), Some(&"Pass"), "{spec}: {out}");
        assert!(
            err.contains("# fail-rail: rail 1") && err.contains("down at"),
            "{spec}: the rail went down in the run: {err}"
        );
        let rails = rail_lines(&err);
        assert_eq!(rails.len(), 2, "{err}");
        assert!(rails[0].0 > 0.0, "{spec}: rail 0 was opened and carried the messages: {out}{err}");
        assert!(rails[1].2 >= 1, "{spec}: rail 1 was routed around (suspect): {err}");
        assert_eq!(rails[1].1, 0, "{spec}: silence is not a connection failure: {err}");
    }
}

#[test]
fn a_silent_outage_of_seconds_and_the_rail_rejoins() {
    let Some(tb) = Testbed::up("o", "1gbit") else { return };
    let err = bw_with(&tb, &["--fail-rail", "1@300ms:for=3s", "--iterations", "120"], "rail 1 silent for 3 s");
    assert!(err.contains("back up at"), "{err}");
    assert!(err.contains("rail 1 carried data again"), "rail 1 rejoined and carried data: {err}");
}

#[test]
fn a_rail_down_before_the_start_joins_when_it_comes_up() {
    let Some(tb) = Testbed::up("b", "1gbit") else { return };
    // Rail 0, the rail the job would meet on, is down before the start;
    // it comes up 5 s later, during the run.
    let back = down_for(format!("{}-host0", tb.0), "rail0", Duration::from_secs(5));
    // 100 x 64 MiB: at least 27 s at the two rails' 250 MB/s, well past
    // the 5 s, and inside the 120 s bound in a debug build that shares the
    // CPUs with the other testbed tests (200 took 73 s alone in a release
    // build and passed the bound in CI on 2026-11-26 only until the group
    // tests ran beside it).
    let (out, _) = bw_out(&tb, &["--iterations", "100"], "rail 0 down before the start");
    back.join().expect("rail0 back up");
    // Size, MB/s, Validation, rail0 MB, rail0 %, rail1 MB, rail1 %.
    let last: Vec<&str> = out.lines().last().unwrap_or_default().split_whitespace().collect();
    let rail0: f64 = last.get(3).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    assert!(rail0 > 0.0, "rail 0 joined once it came up and carried data: {out}");
}

/// Small messages of ranks 0 and 1 prefer rail 1. Its link is down on one
/// side before the job starts and stays down: on host0 its connection
/// attempts fail at once (no route), on host1 they go unanswered. The
/// direct path must not wait for it: every message goes over rail 0,
/// validated, well inside the bound.
#[test]
fn small_messages_go_on_when_their_preferred_rail_is_down_before_the_start() {
    let Some(tb) = Testbed::up("q", "1gbit") else { return };
    for host in ["host0", "host1"] {
        let ns = format!("{}-{host}", tb.0);
        let ip = |state: &str| {
            let ok = Command::new("ip").args(["-n", &ns, "link", "set", "rail1", state]).status();
            assert!(ok.is_ok_and(|s| s.success()), "ip -n {ns} link set rail1 {state}");
        };
        ip("down");
        let more = ["--sizes", "8,4K", "--iterations", "20000", "--rail-stats"];
        let what = format!("rail 1 down on {host} before the start");
        let o = bounded(multirail(&validated_in(&tb, "latency", &more)), Duration::from_secs(120), &what);
        ip("up");
        check(&o, &what);
        let out = String::from_utf8_lossy(&o.stdout);
        let rows: Vec<Vec<&str>> = out
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|c| c.len() == 7)
            .collect();
        assert_eq!(rows.len(), 2, "{what}: a row per size: {out}");
        for c in rows {
            // Size, latency, Validation, rail0 MB, rail0 %, rail1 MB, rail1 %.
            assert_eq!(c[2], "Pass", "{what}: {out}");
            assert_eq!(c[4].parse::<f64>().ok(), Some(100.0), "{what}: everything over rail 0: {out}");
        }
    }
}

#[test]
fn two_of_three_rails_lost_one_after_the_other() {
    let Some(tb) = Testbed::up_rails("t", "1gbit", 3) else { return };
    let err = bw_with(
        &tb,
        &["--fail-rail", "0@300ms:for=forever", "--fail-rail", "2@1s:for=forever", "--iterations", "60"],
        "rails 0 and 2 lost",
    );
    let rails = rail_lines(&err);
    assert_eq!(rails.len(), 3, "{err}");
    assert!(rails[1].0 > rails[0].0 && rails[1].0 > rails[2].0, "rail 1 carried the rest: {err}");
    assert!(rails[0].2 >= 1 && rails[2].2 >= 1, "both were routed around: {err}");
}

#[test]
fn every_rail_silent_shorter_than_the_peer_timeout_only_pauses() {
    let Some(tb) = Testbed::up("a", "1gbit") else { return };
    // Both links of host1 go dark for 2 s (a switch reboot): nothing can
    // move, but the job must neither fail nor lose anything.
    let err = bw_with(
        &tb,
        &["--fail-rail", "0@300ms:for=2s:side=host1", "--fail-rail", "1@300ms:for=2s:side=host1", "--iterations", "80"],
        "every rail silent for 2 s",
    );
    assert_eq!(err.matches("back up at").count(), 2, "both rails came back: {err}");
    let rails = rail_lines(&err);
    assert_eq!(rails.len(), 2, "{err}");
    assert!(rails.iter().all(|r| r.1 == 0), "silence is not a connection failure: {err}");
}

#[test]
fn every_rail_silent_past_the_peer_timeout_fails_with_a_clear_error() {
    let Some(tb) = Testbed::up("d", "1gbit") else { return };
    // host1 is cut off for good; with a 2 s peer timeout the job must end
    // (not hang) and say which rank stopped answering.
    let mut cmd = multirail(&[
        "bench",
        "bw",
        "--testbed",
        "--testbed-prefix",
        &tb.0,
        "--validate",
        "--sizes",
        "1M",
        "--iterations",
        "100000",
        "--fail-rail",
        "0@300ms:for=forever:side=host1",
        "--fail-rail",
        "1@300ms:for=forever:side=host1",
    ]);
    cmd.env("MULTIRAIL_PEER_TIMEOUT_MS", "2000");
    let o = bounded(cmd, Duration::from_secs(90), "host1 cut off past the peer timeout");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "the job cannot succeed: {err}");
    assert!(err.contains("peer timeout") && err.contains("rank"), "the error names the silent rank: {err}");
}

#[test]
fn random_silent_losses_of_random_length() {
    let Some(tb) = Testbed::up("r", "1gbit") else { return };
    let prefix = tb.0.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let st = stop.clone();
    // Takes rails down and up at random (seeded), for random lengths,
    // in either host, while validated transfers run.
    let chaos = std::thread::spawn(move || {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut outages = 0;
        while !st.load(std::sync::atomic::Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(200 + rnd(800)));
            let (host, rail) = (rnd(2), rnd(2));
            let ns = format!("{prefix}-host{host}");
            let dev = format!("rail{rail}");
            let _ = Command::new("ip").args(["-n", &ns, "link", "set", &dev, "down"]).status();
            std::thread::sleep(Duration::from_millis(20 + rnd(2500)));
            let _ = Command::new("ip").args(["-n", &ns, "link", "set", &dev, "up"]).status();
            outages += 1;
        }
        outages
    });
    let mut runs = 0;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        let o = bounded(
            multirail(&[
                "bench",
                "bw",
                "--testbed",
                "--testbed-prefix",
                &tb.0,
                "--pin",
                "0,1",
                "--validate",
                "--sizes",
                "1,4K,300K,1M,4M",
                "--iterations",
                "10",
                "--warmup",
                "1",
            ]),
            Duration::from_secs(120),
            "bw under random silent losses",
        );
        check(&o, "bw under random silent losses");
        runs += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    let outages = chaos.join().expect("chaos thread");
    eprintln!("{runs} validated runs through {outages} random outages");
    assert!(outages > 0);
}

#[test]
fn mpirun_across_testbed_hosts_meets_through_pmix() {
    let have = Command::new("sh").args(["-c", "command -v mpirun"]).output().is_ok_and(|o| o.status.success());
    if !have {
        eprintln!("skipping: mpirun not installed (apt-get install openmpi-bin)");
        return;
    }
    let Some(tb) = Testbed::up("m", "1gbit") else { return };
    // Open MPI starts host1's daemon through the netns agent (an "rsh" that
    // enters the namespace owning the address); each daemon is its host's
    // PMIx server. No MULTIRAIL_ROOT anywhere.
    let agent = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/lib/netns-agent");
    let exe = env!("CARGO_BIN_EXE_multirail");
    let rank = |host: &str| -> Vec<String> {
        ["-np", "1", "-H", host, "env", "MULTIRAIL_RAILS=tcp:rail0,tcp:rail1", "MULTIRAIL_LOG=info", exe]
            .iter()
            .map(|s| s.to_string())
            .chain(
                ["bench", "bw", "--sizes", "1K,1M", "--iterations", "20", "--validate"].iter().map(|s| s.to_string()),
            )
            .collect()
    };
    let st = multirail(&["testbed", "status", "--prefix", &tb.0, "--json"]).output().unwrap();
    let st: serde_json::Value = serde_json::from_slice(&st.stdout).expect("testbed status --json");
    let addr = |h: usize| st["hosts"][h]["rails"][0]["addr"].as_str().expect("rail0 address").to_string();
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &format!("{}-host0", tb.0), "mpirun", "--allow-run-as-root", "--bind-to", "none"])
        .args(["--mca", "plm_rsh_agent", agent, "--mca", "oob_tcp_if_include", "rail0"])
        .args(rank(&addr(0)))
        .arg(":")
        .args(rank(&addr(1)))
        .env("MR_NETNS_PREFIX", &tb.0)
        .env_remove("MULTIRAIL_ROOT")
        .env_remove("MULTIRAIL_RAILS")
        .env_remove("MULTIRAIL_LAUNCHED")
        .env_remove("MULTIRAIL_RANK");
    let o = bounded(cmd, Duration::from_secs(120), "mpirun across testbed hosts");
    let err = check(&o, "mpirun across testbed hosts");
    assert_eq!(err.matches("wire-up through PMIx").count(), 2, "both ranks met through PMIx: {err}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.lines().filter(|l| l.ends_with("Pass")).count(), 2, "{out}");
}

// ----- several ranks per host (issue 10 item 4) -----

/// Set for the ranks [`every_pair_on_two_hosts_block_and_cyclic`] starts.
const ALL_PAIRS: &str = "MULTIRAIL_TEST_ALL_PAIRS";

/// One rank of [`every_pair_on_two_hosts_block_and_cyclic`], started by
/// `multirail run` inside a testbed host (this test binary is the rank's
/// program): sends a 200 kB message to every other rank, validates what
/// every other rank sent, then prints per peer `pair ME PEER MY_HOST
/// PEER_HOST RAILS` with the rails that carried bytes.
#[test]
#[ignore = "a rank of every_pair_on_two_hosts_block_and_cyclic, which starts it"]
fn all_pairs_rank() {
    assert!(std::env::var_os(ALL_PAIRS).is_some(), "started by every_pair_on_two_hosts_block_and_cyclic only");
    let ep = multirail::Endpoint::from_env().expect("endpoint");
    let (me, n) = (ep.rank(), ep.size());
    let peers: Vec<u32> = (0..n).filter(|&p| p != me).collect();
    let len = 200_000;
    let seed = |from: u32, to: u32| u64::from(from * 1000 + to);
    let sends: Vec<multirail::Request> = peers
        .iter()
        .map(|&p| ep.isend(p, 1, multirail_proto::sim::pattern(seed(me, p), len)).expect("isend").into())
        .collect();
    for &p in &peers {
        let mut buf = vec![0u8; len];
        let st = ep.recv(Some(p), Some(1), &mut buf).expect("recv");
        assert!(buf[..st.len as usize] == multirail_proto::sim::pattern(seed(p, me), len)[..], "from rank {p}");
    }
    for r in ep.wait_all(sends) {
        r.expect("send");
    }
    ep.barrier().expect("barrier");
    let names = ep.rail_names();
    for &p in &peers {
        let used: Vec<&str> = ep
            .rails_to(p)
            .iter()
            .zip(ep.rail_stats(p))
            .filter(|(_, s)| s.tx_bytes + s.rx_bytes > 0)
            .map(|(&g, _)| names[g].as_str())
            .collect();
        println!("pair {me} {p} {} {} {}", ep.hosts()[me as usize], ep.hosts()[p as usize], used.join(","));
    }
    ep.close().expect("close");
}

/// 4 ranks on 2 testbed hosts, block and cyclic: every pair exchanges
/// validated messages, pairs on one host over shared memory alone, the
/// others over the testbed's rails alone.
#[test]
fn every_pair_on_two_hosts_block_and_cyclic() {
    let Some(tb) = Testbed::up("k", "1gbit") else { return };
    let exe = std::env::current_exe().expect("this test binary");
    let exe = exe.to_string_lossy();
    let block = |a: u32, b: u32| a / 2 == b / 2;
    let cyclic = |a: u32, b: u32| a % 2 == b % 2;
    for (mapping, same_host) in [("block", &block as &dyn Fn(u32, u32) -> bool), ("cyclic", &cyclic)] {
        let mut cmd = multirail(&[
            "run",
            "-n",
            "4",
            "--testbed",
            "--testbed-prefix",
            &tb.0,
            "--ranks-per-host",
            "2",
            "--mapping",
            mapping,
            "--",
            &exe,
            "all_pairs_rank",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ]);
        cmd.env(ALL_PAIRS, "1");
        let o = bounded(cmd, Duration::from_secs(120), mapping);
        check(&o, mapping);
        let out = String::from_utf8_lossy(&o.stdout);
        let pairs: Vec<Vec<&str>> =
            // A rank's line may follow the test harness's "test ... " of another.
            out.lines().filter_map(|l| l.split_once("pair ")).map(|(_, l)| l.split(' ').collect()).collect();
        assert_eq!(pairs.len(), 12, "{mapping}: every rank reports every peer: {out}");
        for p in &pairs {
            let (a, b): (u32, u32) = (p[0].parse().unwrap(), p[1].parse().unwrap());
            let rails = p.get(4).copied().unwrap_or("");
            if same_host(a, b) {
                assert_eq!(p[2], p[3], "{mapping}: {a} and {b} on one host: {out}");
                assert_eq!(rails, "shm", "{mapping}: {a}-{b} on one host: shared memory alone: {out}");
            } else {
                assert_ne!(p[2], p[3], "{mapping}: {a} and {b} on two hosts: {out}");
                assert!(rails.starts_with("tcp:10.77.") && !rails.contains("shm"), "{mapping}: {a}-{b}: {out}");
            }
        }
    }
}

/// `run --testbed --rails tcp:rail0,tcp:rail1`: each rank resolves the
/// interface names inside its own host, and the pair (on two hosts)
/// exchanges validated messages over the named rails.
#[test]
fn run_on_the_testbed_takes_rails_named_by_interface() {
    let Some(tb) = Testbed::up("n", "1gbit") else { return };
    let exe = std::env::current_exe().expect("this test binary");
    let exe = exe.to_string_lossy();
    let mut cmd = multirail(&[
        "run",
        "-n",
        "2",
        "--testbed",
        "--testbed-prefix",
        &tb.0,
        "--rails",
        "tcp:rail0,tcp:rail1",
        "--",
        &exe,
        "all_pairs_rank",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    cmd.env(ALL_PAIRS, "1");
    let o = bounded(cmd, Duration::from_secs(120), "run --rails tcp:rail0,tcp:rail1");
    check(&o, "run --rails tcp:rail0,tcp:rail1");
    let out = String::from_utf8_lossy(&o.stdout);
    let pairs: Vec<&str> = out.lines().filter_map(|l| l.split_once("pair ")).map(|(_, l)| l).collect();
    assert_eq!(pairs.len(), 2, "both ranks report: {out}");
    for p in pairs {
        let f: Vec<&str> = p.split(' ').collect();
        assert_ne!(f[2], f[3], "two hosts: {out}");
        // 200 kB may go on one rail or both: each one used is a named one.
        let used = f.get(4).copied().unwrap_or("");
        assert!(!used.is_empty() && used.split(',').all(|r| r == "tcp:rail0" || r == "tcp:rail1"), "{out}");
    }
}

/// `bench mbw_mr --pairs 2` and `bench multi_lat --pairs 2` on 4 ranks, 2
/// per host: block pairs 0-2 and 1-3 across hosts, cyclic on one host; the
/// header says which, and rank 0's `--rail-stats` columns show shm for the
/// intra-node pair only.
#[test]
fn mbw_mr_and_multi_lat_pairs_are_placed_block_or_cyclic_and_rail_stats_show_it() {
    let Some(tb) = Testbed::up("m", "1gbit") else { return };
    // The test, and the column of its `Validation` (after the size and
    // the value, and mbw_mr's messages/s); MB and % per rail follow it.
    for (test, validation) in [("mbw_mr", 3), ("multi_lat", 2)] {
        for (mapping, intra) in [("block", false), ("cyclic", true)] {
            let what = format!("{test}, {mapping}");
            let args = [
                "bench",
                test,
                "--pairs",
                "2",
                "--testbed",
                "--testbed-prefix",
                &tb.0,
                "--ranks-per-host",
                "2",
                "--mapping",
                mapping,
                "--validate",
                "--sizes",
                "64K",
                "--iterations",
                "5",
                "--warmup",
                "1",
                "--rail-stats",
            ];
            let o = bounded(multirail(&args), Duration::from_secs(120), &what);
            check(&o, &what);
            let out = String::from_utf8_lossy(&o.stdout);
            let (hosts, kind) =
                if intra { ("host0: 0,2  host1: 1,3", "intra") } else { ("host0: 0,1  host1: 2,3", "inter") };
            assert!(out.contains(&format!("# placement: {hosts}  pairs: 0-2 {kind}-node, 1-3 {kind}-node")), "{out}");
            assert!(out.contains("# rails: tcp:10.77.0.1,tcp:10.77.1.1,shm "), "{what}: the job has a shm rail: {out}");
            // The 4 ranks share this machine's CPUs whatever host they
            // emulate: they spin only if the rule for 4 ranks on its CPUs
            // says so.
            let spin =
                if multirail::cpus::may_spin(Some(4), multirail::cpus::host()) { "spin: 200us" } else { "spin: 0us" };
            assert!(out.contains(spin), "{what}: {spin} expected with {} CPUs: {out}", multirail::cpus::host());
            let last: Vec<&str> = out.lines().last().unwrap().split_whitespace().collect();
            assert_eq!(last[validation], "Pass", "{what}: {out}");
            let share = |rail: usize| last[validation + 2 + 2 * rail].parse::<f64>().unwrap();
            if intra {
                assert_eq!((share(0), share(1), share(2)), (0.0, 0.0, 100.0), "{what}: shm alone: {out}");
            } else {
                assert!(share(2) == 0.0 && share(0) + share(1) == 100.0, "{what}: the rails alone: {out}");
            }
        }
    }
}

#[test]
fn more_ranks_than_the_testbed_holds_is_an_error_saying_what_to_do() {
    let Some(tb) = Testbed::up("e", "1gbit") else { return };
    let o =
        multirail(&["run", "-n", "5", "--testbed", "--testbed-prefix", &tb.0, "--ranks-per-host", "2", "--", "true"])
            .output()
            .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("5 ranks at 2 per host need 3 testbed hosts") && err.contains("--hosts 3"), "{err}");
}

/// A group of 3 members, one per testbed host, every member sending 1 MB
/// messages (relayed along the chain), every payload and the order checked
/// at every member, while rail 1 of host0 or host1 goes silent (`ip link
/// set down`): shorter than a rail's suspicion (tens of ms), longer than
/// that but shorter than the group's failure timeout (1 s), longer than
/// the failure timeout, for good, and from before the group starts. The
/// other rail carries the group: no member is suspected (`bench group`
/// fails the run on a view change), nothing is lost, the run finishes.
/// Every other case sends the messages in relayed chunks of 256 KiB.
#[test]
fn a_group_rides_out_a_silent_rail_of_any_length() {
    let Some(tb) = Testbed::up_hosts("g", "2gbit", 2, 3) else { return };
    let cases = [
        ("1@300ms:for=15ms", "15 ms, host0"),
        ("1@300ms:for=300ms:side=host1", "300 ms, host1"),
        ("1@300ms:for=1500ms", "1.5 s, past the failure timeout, host0"),
        ("1@300ms:for=forever:side=host1", "for good, host1"),
        ("1@0ms:for=600ms", "from before the group starts, host0"),
    ];
    for (i, (spec, what)) in cases.into_iter().enumerate() {
        let chunk = if i % 2 == 0 { "off" } else { "256K" };
        let what = format!("group, rail 1 silent {what}, chunks {chunk}");
        let out = group_run(&tb, &["--count", "400", "--fail-rail", spec, "--relay-chunk", chunk], &what);
        assert!(out.contains("# fail-rail: rail 1"), "{what}: the rail was taken down: {out}");
    }
}

/// A validated all-senders 1 MB `bench group` run on the 3-host testbed
/// `tb` with the extra flags; checks that it succeeded and printed its row
/// and returns stdout and stderr.
fn group_run(tb: &Testbed, extra: &[&str], what: &str) -> String {
    let mut args = vec![
        "bench",
        "group",
        "--testbed",
        "--testbed-prefix",
        &tb.0,
        "--senders",
        "all",
        "--sizes",
        "1M",
        "--validate",
    ];
    args.extend_from_slice(extra);
    let o = bounded(multirail(&args), Duration::from_secs(180), what);
    let err = check(&o, what);
    let both = format!("{}{err}", String::from_utf8_lossy(&o.stdout));
    assert!(both.lines().any(|l| l.starts_with("1048576 ")), "{what}: no result row: {both}");
    both
}

/// A member of a 3-host group fails mid-run, each way a user meets: its
/// process ends (a crash), or every rail of its host goes silent (`ip link
/// set down`) while it runs on, and comes back after it stopped (its late
/// rows, full of suspicions, then reach the others). Rank 0, the lowest
/// member and the one that leads a view change, and another, each at a
/// random time of the run's first second. The survivors
/// install one view without it, deliver identical validated sequences and
/// finish; the silenced member stops by itself (partition safety).
#[test]
fn a_group_loses_a_member_and_goes_on() {
    let Some(tb) = Testbed::up_hosts("m", "2gbit", 2, 3) else { return };
    // At a random point of the run's first second (the run lasts 2-3 s),
    // named in every message so that a failure can be replayed.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let at = |k: u32| 150 + (nanos / 7 + k * 337) % 850;
    let specs = [
        format!("2@{}ms", at(0)),
        format!("0@{}ms", at(1)),
        format!("1@{}ms:silence", at(2)),
        format!("0@{}ms:silence", at(3)),
    ];
    for (i, spec) in specs.iter().enumerate() {
        // Whole messages, and chunks of 256 KiB under way when it fails.
        let chunk = if i % 2 == 0 { "off" } else { "256K" };
        let what = format!("group, --fail-member {spec}, chunks {chunk}");
        let both = group_run(&tb, &["--count", "300", "--fail-member", spec, "--relay-chunk", chunk], &what);
        assert!(both.contains("installed a view without it"), "{what}: {both}");
        if spec.ends_with("silence") {
            assert!(both.contains("partition safety"), "{what}: the silenced member stopped by itself: {both}");
        }
    }
}
