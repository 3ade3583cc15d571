//! multirail on the emulated cluster (needs root, iproute2 and tbf; skips
//! with the reason otherwise): validated transfers of assorted sizes with
//! both progress engines, and a rail taken down with `ip link` mid-run.

use std::process::{Command, Output};

fn multirail(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_multirail"));
    c.args(args).env_remove("MULTIRAIL_RAILS").env_remove("MULTIRAIL_LAUNCHED").env_remove("MULTIRAIL_RANK");
    c
}

/// A testbed that is removed when dropped.
struct Testbed(String);

impl Testbed {
    fn up(tag: &str, rate: &str) -> Option<Testbed> {
        let prefix = format!("mrt{}{tag}", std::process::id() % 10000);
        let o = multirail(&["testbed", "up", "--prefix", &prefix, "--rate", rate]).output().ok()?;
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
