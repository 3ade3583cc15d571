//! `multirail model` and the analysis flags of `bench` (`--plot`,
//! `--model`) end to end: the NPC'09 numbers in text and JSON, plots
//! written over loopback rails with tiny counts (each job bounded in time),
//! and bad names refused before anything runs.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::wait_bounded;

fn multirail(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_multirail"));
    c.args(args).env_remove("MULTIRAIL_RAILS").env_remove("MULTIRAIL_LAUNCHED").env_remove("MULTIRAIL_RANK");
    c
}

/// Runs `c` for at most a minute.
fn run(c: &mut Command, what: &str) -> Output {
    let child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("multirail starts");
    wait_bounded(child, Duration::from_secs(60), what, || {})
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A directory of this test's own, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("multirail-cli-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
    fn file(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const TINY: [&str; 4] = ["--iterations", "2", "--warmup", "1"];

#[test]
fn model_text_gives_npc09s_numbers() {
    let o = run(
        &mut multirail(&["model", "--rails", "2", "--link", "2GB/s", "--nic", "2GB/s", "--host", "4GB/s"]),
        "model",
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let t = text(&o.stdout);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 2, "{t}");
    assert!(lines[0].starts_with("multi-HCA") && lines[0].contains("= 4 GB/s (32 Gbit/s)"), "{t}");
    assert!(lines[1].starts_with("multi-port") && lines[1].contains("= 2 GB/s (16 Gbit/s)"), "{t}");
    assert!(lines[1].contains("NIC bus holds the links back"), "{t}");
}

#[test]
fn model_json_is_bytes_per_second() {
    let o = run(
        &mut multirail(&["model", "--rails", "2", "--link", "16gbit", "--nic", "2GB/s", "--host", "4GB/s", "--json"]),
        "model --json",
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert_eq!(v["multi_hca"], 4e9);
    assert_eq!(v["multi_port"], 2e9);
    assert_eq!(v["rails"], 2);
    assert_eq!(v["link"], serde_json::json!([2e9, 2e9]));
    assert_eq!(v["nic"], 2e9);
    assert_eq!(v["host"], 4e9);
    assert_eq!(v["unit"], "bytes/s");
}

#[test]
fn model_refuses_bad_input_saying_why() {
    for (args, why) in [
        (vec!["model", "--rails", "2", "--link", "10Gbps"], "ambiguous"),
        (vec!["model", "--rails", "2", "--link", "2"], "no unit"),
        (vec!["model", "--link", "2gbit"], "--rails N is needed"),
        (vec!["model", "--rails", "3", "--link", "1gbit,2gbit"], "2 link rates for 3 rails"),
        (vec!["model", "--rails", "2", "--link", "1gbit", "--nic", "4GB"], "--nic"),
        (vec!["bench", "latency", "--model"], "use it with `multirail bench bw`"),
        (vec!["bench", "bw", "--model", "--link", "fast"], "--link"),
    ] {
        let o = run(&mut multirail(&args), "refused input");
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let e = text(&o.stderr);
        assert!(e.contains(why), "{args:?}: {e}");
    }
}

#[test]
fn bad_plot_names_fail_before_measuring() {
    for (file, why) in [("/tmp/plot.jpg", "must end in .svg or .png"), ("/no/such/dir/p.svg", "does not exist")] {
        let o = run(&mut multirail(&["bench", "latency", "--plot", file]), "bad --plot");
        assert_eq!(o.status.code(), Some(2));
        let e = text(&o.stderr);
        assert!(e.contains("--plot") && e.contains(why), "{e}");
        assert!(o.stdout.is_empty(), "nothing measured: {}", text(&o.stdout));
    }
}

#[test]
fn bench_plot_over_loopback_with_json() {
    let d = Scratch::new("plot");
    let svg = d.file("lat.svg");
    let mut c = multirail(&["bench", "latency", "--sizes", "0:1K", "--json", "--quiet", "--plot", &svg]);
    c.args(TINY);
    let o = run(&mut c, "bench latency --plot");
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout).lines().count(), 12, "JSON rows as usual: 0, 1 .. 1K");
    let s = std::fs::read_to_string(&svg).expect("the plot is written");
    assert!(s.starts_with("<svg"), "{}", &s[..40.min(s.len())]);
    assert!(s.contains("multirail bench latency: Latency Test on"), "titled with test and machine");
    assert!(s.contains("rails tcp:127.0.0.1,tcp:127.0.0.2"), "the series is named by its rails");
    // 1 B .. 1 KiB: 11 points (size 0 has no place on a log axis).
    assert_eq!(s.matches("<circle").count(), 11);

    let png = d.file("bw.png");
    let mut c = multirail(&["bench", "bw", "--sizes", "1K,64K", "--csv", "--quiet", "--plot", &png]);
    c.args(TINY);
    let o = run(&mut c, "bench bw --plot png");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let bytes = std::fs::read(&png).expect("the plot is written");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn compare_plot_has_a_line_per_configuration() {
    let d = Scratch::new("compare");
    let svg = d.file("cmp.svg");
    let mut c = multirail(&[
        "bench",
        "bw",
        "--sizes",
        "4K,256K",
        "--rounds",
        "1",
        "--quiet",
        "--plot",
        &svg,
        "--compare",
        "policy=*:single",
        "policy=*:stripe",
    ]);
    c.args(TINY);
    let o = run(&mut c, "bench bw --compare --plot");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let s = std::fs::read_to_string(&svg).expect("the plot is written");
    assert_eq!(s.matches("stroke-width=\"2\"").count(), 2, "one line per configuration");
    for label in ["policy=*:single", "policy=*:stripe", "median of 1 rounds"] {
        assert!(s.contains(label), "{label}");
    }
}

#[test]
fn bw_model_measures_each_rail_then_compares() {
    let mut c = multirail(&["bench", "bw", "--sizes", "64K,1M", "--quiet", "--model"]);
    c.args(TINY);
    let o = run(&mut c, "bench bw --model");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let t = text(&o.stdout);
    assert!(t.contains("# model (NPC'09), MB/s: links [") && t.contains("measured: one bw run per rail at 1M"), "{t}");
    assert!(t.contains("Multi-HCA (MB/s)          Meas/HCA Multi-port (MB/s)         Meas/port"), "{t}");
    let rows: Vec<Vec<f64>> = t
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), 2, "{t}");
    for r in &rows {
        // size, measured, multi-HCA, ratio, multi-port, ratio
        assert_eq!(r.len(), 6, "{t}");
        assert!(r[2] > 0.0 && (r[3] - r[1] / r[2]).abs() < 0.01, "{t}");
    }

    let mut c =
        multirail(&["bench", "bw", "--sizes", "1M", "--json", "--model", "--link", "2gbit", "--nic", "400MB/s"]);
    c.args(TINY);
    let o = run(&mut c, "bench bw --model --link");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_str(text(&o.stdout).trim()).unwrap();
    assert_eq!(v["predicted_multi_hca"], 500.0, "2 × min(250, 400) MB/s");
    assert_eq!(v["predicted_multi_port"], 400.0, "min(2 × 250, 400) MB/s");
    assert!(v["ratio_multi_port"].as_f64().unwrap() > 0.0);
}

#[test]
fn help_teaches_the_model_and_plots() {
    let o = run(&mut multirail(&["model", "--help"]), "model --help");
    let h = text(&o.stdout);
    for t in ["multi-HCA", "multi-port", "NPC", "4GB/s", "2gbit", "Examples", "--json"] {
        assert!(h.contains(t), "model --help mentions {t}");
    }
    let o = run(&mut multirail(&["bench", "--help"]), "bench --help");
    let h = text(&o.stdout);
    for t in ["--plot", "--model", "--link", "--nic", "--host", "measured"] {
        assert!(h.contains(t), "bench --help mentions {t}");
    }
    let o = run(&mut multirail(&["--help"]), "--help");
    assert!(text(&o.stdout).contains("model"));
}
