//! One convention per kind of thing, whatever the command: rates are read
//! by one parser (`testbed --rate`, `@RATE` in rail specs,
//! `MULTIRAIL_FAULTS`, `model`), and every `--json` prints JSON Lines.

use std::process::{Command, Output};

fn multirail(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_multirail"));
    c.args(args)
        .env_remove("MULTIRAIL_RAILS")
        .env_remove("MULTIRAIL_LAUNCHED")
        .env_remove("MULTIRAIL_RANK")
        .env_remove("MULTIRAIL_FAULTS");
    c
}

fn ok(c: &mut Command) -> Output {
    let o = c.output().expect("multirail runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

const TINY: [&str; 4] = ["-i", "2", "-x", "1"];

#[test]
fn the_same_rates_are_accepted_everywhere() {
    // Bytes and bits in rail specs (hints the weighted policy uses).
    let mut c = multirail(&["bench", "bw", "--sizes", "64K", "--policy", "*:weighted"]);
    c.args(["--rails", "tcp:127.0.0.1@250MB/s,tcp:127.0.0.2@2Gbit/s"]).args(TINY);
    ok(&mut c);
    // In MULTIRAIL_FAULTS.
    let mut c = multirail(&["bench", "bw", "--sizes", "64K"]);
    c.args(TINY).env("MULTIRAIL_FAULTS", "1:rate=125MB/s");
    ok(&mut c);
    // In the model: 250MB/s and 2gbit are one rate.
    let link = |rate: &str| {
        let o = ok(&mut multirail(&["model", "--rails", "1", "--link", rate, "--json"]));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["link"][0].as_f64().unwrap()
    };
    assert_eq!(link("250MB/s"), 250e6);
    assert_eq!(link("2gbit"), 250e6);
}

#[test]
fn the_same_rates_are_refused_everywhere_for_the_same_reason() {
    let why = "'Gbps' is ambiguous";
    let o = multirail(&["testbed", "up", "--rate", "800", "--prefix", "mrconv"]).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("no unit: bits or bytes?"), "a bare number is refused");
    let mut faults = multirail(&["bench", "bw", "--sizes", "8"]);
    faults.env("MULTIRAIL_FAULTS", "0:rate=10Gbps");
    for (mut c, named) in [
        (multirail(&["testbed", "up", "--rate", "10Gbps", "--prefix", "mrconv"]), "--rate 10Gbps"),
        (multirail(&["bench", "bw", "--rails", "tcp:127.0.0.1@10Gbps"]), "--rails tcp:127.0.0.1@10Gbps"),
        (faults, "MULTIRAIL_FAULTS"),
        (multirail(&["model", "--link", "10Gbps"]), "--link"),
    ] {
        let o = c.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(why) && err.contains(named), "{named}: {err}");
    }
}

/// Every line of stdout is one JSON object.
fn json_lines(o: &Output) -> Vec<serde_json::Value> {
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(!text.trim().is_empty(), "no output");
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .inspect(|v| assert!(v.is_object(), "{v}"))
        .collect()
}

#[test]
fn every_json_is_json_lines() {
    let info = json_lines(&ok(&mut multirail(&["info", "--json"])));
    assert!(info.iter().all(|v| v["rail_spec"].is_string()), "the rail spec the table shows: {info:?}");
    let bench = json_lines(&ok(multirail(&["bench", "latency", "--sizes", "1,8", "--json"]).args(TINY)));
    assert_eq!(bench.len(), 2);
    let mut c = multirail(&["bench", "bw", "--sizes", "8", "--json", "--rounds", "1", "--quiet"]);
    c.args(TINY).args(["--compare", "policy=*:single", "policy=*:stripe"]);
    let cmp = json_lines(&ok(&mut c));
    assert_eq!((cmp.len(), cmp[0]["configs"].as_array().map(Vec::len)), (1, Some(2)), "one line per size: {cmp:?}");
    assert_eq!(json_lines(&ok(&mut multirail(&["model", "--link", "1gbit,2gbit", "--json"]))).len(), 1);
}
