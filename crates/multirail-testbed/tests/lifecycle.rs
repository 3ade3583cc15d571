//! up / status / down / exec against the real kernel. Skipped (with the
//! reason printed) without root, iproute2 or tbf.

mod common;

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use multirail_testbed::{
    Addressing, Error, Shaping, Spec, Topology, down, host_command, host_rail_addr, host_rail_addrs, parse_rates,
    run_in_host, set_rail_up, status, up,
};

fn spec(hosts: usize, rails: usize, rates: &str) -> Spec {
    Spec { hosts, rails, rates: parse_rates(rates).unwrap(), ..Spec::default() }
}

/// The root namespace's congestion control, which new namespaces inherit.
fn root_congestion_control() -> String {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").unwrap().trim().to_owned()
}

#[test]
fn two_hosts_status_matches_spec_and_down_removes_everything() {
    let qdiscs_before = root_qdiscs();
    let Some(tb) = up_or_skip("two_hosts", spec(2, 2, "1gbit,3gbit")) else {
        return;
    };
    let st = status(&tb.prefix).unwrap().expect("testbed exists");
    assert_eq!(st, tb.status, "up returns what status finds");
    assert!(st.problems.is_empty(), "{:?}", st.problems);
    assert_eq!(st.topology, Topology::Direct);
    assert_eq!((st.hosts.len(), st.rails.len()), (2, 2));
    assert!(!netns_names().contains(&format!("{}-sw", tb.prefix)), "no switch for two hosts");
    let plan = Addressing::default();
    for (rail, rate) in ["1gbit", "3gbit"].into_iter().enumerate() {
        let wanted = Shaping::for_rate(rate.parse().unwrap());
        let got = st.rails[rail].shaping.expect("rail is shaped");
        assert_eq!(got.rate, wanted.rate);
        assert!(got.burst_bytes.abs_diff(wanted.burst_bytes) < wanted.burst_bytes / 100, "{got:?}");
        assert!(got.latency_us.abs_diff(wanted.latency_us) <= 50, "{got:?}");
        assert_eq!(st.rails[rail].subnet, Some(plan.rail_subnet(rail)));
        for host in 0..2 {
            let hr = st.hosts[host].rail(rail).unwrap();
            assert_eq!(hr.ifname, format!("rail{rail}"));
            assert_eq!(hr.addr, Some(plan.host_addr(host, rail)));
            assert!(hr.up && hr.carrier, "{hr:?}");
            assert_eq!(hr.shaping.map(|s| s.rate), Some(wanted.rate));
        }
    }
    assert_eq!(st.congestion_control(), Some(root_congestion_control().as_str()));
    let json = serde_json::to_value(&st).unwrap();
    assert_eq!(json["rails"][1]["shaping"]["rate"], "3gbit");
    println!("{st}");

    let prefix = tb.prefix.clone();
    drop(tb);
    assert_gone(&prefix);
    assert_eq!(status(&prefix).unwrap(), None);
    assert_eq!(root_qdiscs(), qdiscs_before, "root qdiscs unchanged");
    let again = down(&prefix).unwrap();
    assert!(again.is_empty(), "second down finds nothing: {again:?}");
}

#[test]
fn three_hosts_share_a_bridge_per_rail() {
    let Some(tb) = up_or_skip("three_hosts", spec(3, 2, "2gbit")) else {
        return;
    };
    let st = &tb.status;
    assert!(st.problems.is_empty(), "{:?}", st.problems);
    assert_eq!(st.topology, Topology::Switched);
    assert_eq!((st.hosts.len(), st.rails.len()), (3, 2));
    let plan = Addressing::default();
    for host in 0..3 {
        let want: Vec<Ipv4Addr> = plan.host_rail_addrs(host, 2);
        assert_eq!(st.rail_addrs(host).unwrap(), want);
        assert_eq!(host_rail_addrs(&tb.prefix, host).unwrap(), want);
    }
    assert_eq!(st.rail_rate(1).unwrap().to_string(), "2gbit");
    // Both ends of every host link are shaped: 3 hosts x 2 rails in the switch.
    let sw = format!("{}-sw", tb.prefix);
    let out = Command::new("tc").args(["-n", &sw, "qdisc", "show"]).output().unwrap();
    let tbf_ports = String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("qdisc tbf")).count();
    assert_eq!(tbf_ports, 6);
    let report = down(&tb.prefix).unwrap();
    assert_eq!(report.netns.len(), 4, "{report:?}");
    assert_gone(&tb.prefix);
}

#[test]
fn up_twice_is_refused_and_keeps_the_first() {
    let Some(tb) = up_or_skip("up_twice", Spec::default()) else {
        return;
    };
    let again = Spec { prefix: tb.prefix.clone(), ..Spec::default() };
    let err = up(&again).unwrap_err();
    assert!(matches!(err, Error::AlreadyExists { .. }), "{err}");
    assert!(err.to_string().contains("testbed down"), "{err}");
    assert_eq!(status(&tb.prefix).unwrap().as_ref(), Some(&tb.status), "first testbed untouched");
}

#[test]
fn down_of_unknown_prefix_is_a_no_op() {
    if !env_or_skip("down_unknown") {
        return;
    }
    let prefix = unique_prefix();
    assert!(down(&prefix).unwrap().is_empty());
    assert!(down(&prefix).unwrap().is_empty());
}

/// Set in the child process of `tbf_failure_midway_removes_what_up_made`.
const SHIM_CHILD_ENV: &str = "MULTIRAIL_TESTBED_TC_SHIM_CHILD";

/// A `tc` that fails like a kernel without tbf, but only for rail1, so `up`
/// fails after most of the testbed exists.
const TC_SHIM: &str = r#"#!/bin/sh
case "$*" in
  *"dev rail1 root tbf"*) echo "Error: Specified qdisc kind is unknown." >&2; exit 2 ;;
esac
exec REAL_TC "$@"
"#;

#[test]
fn tbf_failure_midway_removes_what_up_made() {
    if std::env::var_os(SHIM_CHILD_ENV).is_some() {
        let spec = Spec { prefix: unique_prefix(), ..spec(3, 2, "1gbit") };
        let err = up(&spec).unwrap_err();
        assert!(matches!(err, Error::TbfUnavailable { .. }), "{err}");
        assert!(err.to_string().contains("modprobe sch_tbf"), "{err}");
        assert_gone(&spec.prefix);
        println!("shim-child-ok: {err}");
        return;
    }
    if !env_or_skip("tbf_failure_midway") {
        return;
    }
    let real_tc = ["/usr/sbin/tc", "/sbin/tc", "/usr/bin/tc"].into_iter().find(|p| std::path::Path::new(p).is_file());
    let Some(real_tc) = real_tc else {
        eprintln!("skipping tbf_failure_midway: tc is not in an sbin directory");
        return;
    };
    let dir = std::env::temp_dir().join(format!("mrt-tc-shim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let shim = dir.join("tc");
    std::fs::write(&shim, TC_SHIM.replace("REAL_TC", real_tc)).unwrap();
    std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "tbf_failure_midway_removes_what_up_made", "--nocapture", "--test-threads=1"])
        .env(SHIM_CHILD_ENV, "1")
        .env("PATH", path)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("shim-child-ok"), "{stdout}\n{stderr}");
}

#[test]
fn unusable_congestion_control_is_refused_before_anything_is_made() {
    if !env_or_skip("bad_congestion_control") {
        return;
    }
    let bad = Spec { prefix: unique_prefix(), congestion_control: Some("nosuchcc".into()), ..Spec::default() };
    let err = up(&bad).unwrap_err();
    assert!(matches!(err, Error::InvalidSpec(_)), "{err}");
    assert!(err.to_string().contains("tcp_allowed_congestion_control"), "{err}");
    assert_gone(&bad.prefix);
}

#[test]
fn congestion_control_can_be_chosen() {
    // reno is always allowed in a namespace.
    let reno = Spec { congestion_control: Some("reno".into()), ..Spec::default() };
    let Some(tb) = up_or_skip("congestion_control", reno) else {
        return;
    };
    assert_eq!(tb.status.congestion_control(), Some("reno"));
    assert!(tb.status.to_string().contains("congestion control reno"));
}

#[test]
fn down_after_a_crash_finds_objects_by_name() {
    if !env_or_skip("crash") {
        return;
    }
    let prefix = unique_prefix();
    // What a crash midway could leave: one namespace, and a stray veth pair
    // in the root namespace carrying the prefix.
    let (ns, a, b) = (format!("{prefix}-host0"), format!("{prefix}-a"), format!("{prefix}-b"));
    assert!(Command::new("ip").args(["netns", "add", &ns]).status().unwrap().success());
    let veth = ["link", "add", "name", &a, "type", "veth", "peer", "name", &b];
    assert!(Command::new("ip").args(veth).status().unwrap().success());
    let err = up(&Spec { prefix: prefix.clone(), ..Spec::default() }).unwrap_err();
    assert!(matches!(err, Error::AlreadyExists { .. }), "{err}");
    let partial = status(&prefix).unwrap().expect("the namespace is found");
    assert!(!partial.problems.is_empty() || partial.rails.is_empty());
    let report = down(&prefix).unwrap();
    assert_eq!(report.netns, [ns]);
    assert!(report.links.contains(&a), "{report:?}");
    assert_gone(&prefix);
}

#[test]
fn exec_runs_in_the_host_and_can_be_pinned() {
    let Some(tb) = up_or_skip("exec", Spec::default()) else {
        return;
    };
    let out = output_in(&tb.prefix, 1, &["ip", "-br", "-4", "addr", "show", "dev", "rail0"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("10.77.0.2/24"), "{out:?}");
    assert!(run_in_host(&tb.prefix, 0, &["true"]).unwrap().success());
    assert_eq!(run_in_host(&tb.prefix, 0, &["sh", "-c", "exit 3"]).unwrap().code(), Some(3));
    let pinned = output_in(&tb.prefix, 0, &["taskset", "-c", "0", "grep", "Cpus_allowed_list", "/proc/self/status"]);
    assert!(String::from_utf8_lossy(&pinned.stdout).trim().ends_with("\t0"), "{pinned:?}");
    let missing = host_command(&tb.prefix, 7, &["true"]).unwrap_err();
    assert!(matches!(missing, Error::NoSuchHost { host: 7, .. }), "{missing}");
    let empty: [&str; 0] = [];
    assert!(matches!(host_command(&tb.prefix, 0, &empty).unwrap_err(), Error::EmptyCommand));
}

#[test]
fn down_stops_processes_left_in_hosts() {
    let Some(tb) = up_or_skip("down_stops", Spec::default()) else {
        return;
    };
    let mut command = host_command(&tb.prefix, 1, &["sleep", "60"]).unwrap();
    let mut sleeper = ChildGuard(command.stdin(Stdio::null()).spawn().unwrap());
    let report = down(&tb.prefix).unwrap();
    assert!(report.stopped_pids.contains(&sleeper.0.id()), "{report:?}");
    assert!(wait_with_timeout(&mut sleeper.0, Duration::from_secs(5)).is_some(), "sleep was stopped");
    assert_gone(&tb.prefix);
}

#[test]
fn rail_down_and_up_is_visible_and_restores_shaping() {
    let Some(tb) = up_or_skip("rail_down_up", spec(2, 2, "1gbit")) else {
        return;
    };
    set_rail_up(&tb.prefix, 1, 1, false).unwrap();
    let st = status(&tb.prefix).unwrap().unwrap();
    assert!(!st.hosts[1].rail(1).unwrap().up);
    assert!(!st.hosts[0].rail(1).unwrap().carrier, "peer sees no carrier");
    assert!(st.to_string().contains("10.77.1.2 (down)"), "{st}");
    assert_eq!(host_rail_addr(&tb.prefix, 1, 1).unwrap(), Ipv4Addr::new(10, 77, 1, 2));
    set_rail_up(&tb.prefix, 1, 1, true).unwrap();
    let st = status(&tb.prefix).unwrap().unwrap();
    assert_eq!(st, tb.status, "address, state and shaping restored");
    let err = set_rail_up(&tb.prefix, 1, 5, false).unwrap_err();
    assert!(matches!(err, Error::NoSuchRail { rail: 5, .. }), "{err}");
}

/// Runs as the child of `unprivileged_up_is_refused_clearly` under uid 65534.
const CHILD_ENV: &str = "MULTIRAIL_TESTBED_UNPRIVILEGED_CHILD";

#[test]
fn unprivileged_up_is_refused_clearly() {
    if std::env::var_os(CHILD_ENV).is_some() {
        let err = up(&Spec { prefix: unique_prefix(), ..Spec::default() }).unwrap_err();
        assert!(matches!(err, Error::NotRoot), "{err}");
        assert!(err.to_string().contains("run with sudo"));
        println!("unprivileged-child-ok: {err}");
        return;
    }
    if !env_or_skip("unprivileged") {
        return;
    }
    if !have("setpriv") {
        eprintln!("skipping unprivileged: setpriv not found (util-linux)");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&exe)
        .args(["--exact", "unprivileged_up_is_refused_clearly", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if stderr.contains("Permission denied") && !stdout.contains("running 1 test") {
        eprintln!("skipping unprivileged: uid 65534 cannot execute {}", exe.display());
        return;
    }
    assert!(out.status.success() && stdout.contains("unprivileged-child-ok"), "{stdout}\n{stderr}");
}
