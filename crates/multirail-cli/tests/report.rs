//! `multirail report`: the page rendered from a recorded results.json
//! (tests/data/report-results.json, a test fixture: a `--quick --study all`
//! run over loopback with one failed run added), opened in headless
//! Chromium when it is installed, and one short run end to end.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::wait_bounded;
use serde_json::Value;

fn multirail(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_multirail"));
    c.args(args).env_remove("MULTIRAIL_RAILS").env_remove("MULTIRAIL_LAUNCHED").env_remove("MULTIRAIL_RANK");
    c
}

fn run(c: &mut Command, what: &str, limit: Duration) -> Output {
    let child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("it starts");
    wait_bounded(child, limit, what, || {})
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A directory of this test's own under the target directory, kept (screenshots are
/// looked at) but emptied first.
fn scratch(name: &str) -> PathBuf {
    // The binary is TARGET/debug/multirail.
    let target = Path::new(env!("CARGO_BIN_EXE_multirail")).parent().and_then(Path::parent).expect("target dir");
    let d = target.join("report-tests").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/report-results.json")
}

/// Renders the fixture into `dir`; returns the page.
fn render(dir: &Path) -> String {
    let o = run(
        &mut multirail(&["report", "--from", fixture().to_str().unwrap(), "--out", dir.to_str().unwrap()]),
        "report --from",
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    std::fs::read_to_string(dir.join("index.html")).unwrap()
}

/// Every figure of the fixture's plan: (study id, figure number from 1).
fn figures(results: &Value) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for s in results["plan"]["studies"].as_array().unwrap() {
        for (i, _) in s["figures"].as_array().unwrap().iter().enumerate() {
            out.push((s["id"].as_str().unwrap().to_string(), i + 1));
        }
    }
    out
}

fn load_fixture() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture()).unwrap()).unwrap()
}

/// The median (one round here) value of a configuration at a size.
fn value(results: &Value, study: &str, figure: usize, config: usize, size: u64) -> f64 {
    let run = results["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["study"] == study && r["figure"] == figure && r["config"] == config && r["failed"].is_null())
        .expect("a run of it");
    run["records"].as_array().unwrap().iter().find(|r| r["size"] == size).unwrap()["value"].as_f64().unwrap()
}

#[test]
fn page_from_recorded_results() {
    let dir = scratch("from");
    let page = render(&dir);
    let results = load_fixture();
    let figs = figures(&results);
    assert_eq!(figs.len(), 3 + 1 + 3 + 1);
    // One inline SVG per figure, and each as a file.
    assert_eq!(page.matches("<svg").count(), figs.len(), "one <svg> per figure");
    for (study, n) in &figs {
        let f = dir.join(format!("fig-{study}-{n}.svg"));
        let svg = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(svg.contains("<svg") && svg.contains("</svg>"), "{}", f.display());
    }
    for study in ["dual-rail", "udapl", "fdr-edr", "cbr"] {
        assert!(page.contains(&format!("<section id=\"study-{study}\">")), "section {study}");
    }
    // The commands, escaped ('*' policies quoted as a shell needs).
    assert!(
        page.contains("MULTIRAIL_SHM=off multirail bench bw --json --quiet --rails tcp:127.0.0.1 --sizes 8,64K,1M")
    );
    assert!(page.contains("--policy &#39;16K:single,*:stripe&#39;"), "quoted and escaped");
    // The fixture's failed run: its stderr escaped, never raw markup.
    assert!(page.contains("&lt;nic&gt; &amp; rail1"), "escaped stderr");
    assert!(!page.contains("<nic>"));
    // Self-contained: no scripts, no external URL (the SVG namespace is a
    // name, not a fetch).
    assert!(!page.contains("<script"));
    let without_ns = page.replace("http://www.w3.org/2000/svg", "");
    assert!(!without_ns.contains("http://") && !without_ns.contains("https://"));
    // Readings computed from the fixture's numbers: fdr-edr bandwidth
    // (figure 2), faster against slower at 1M.
    let r = value(&results, "fdr-edr", 1, 1, 1 << 20) / value(&results, "fdr-edr", 1, 0, 1 << 20);
    let want = format!("faster: 2 x 3gbit is {:.2} x at 8 B and {r:.2} x at 1M", {
        value(&results, "fdr-edr", 1, 1, 8) / value(&results, "fdr-edr", 1, 0, 8)
    });
    assert!(page.contains(&want), "{want}");
    // udapl: threaded against polled at 1M.
    let t = value(&results, "udapl", 0, 0, 1 << 20) / value(&results, "udapl", 0, 1, 1 << 20);
    assert!(page.contains(&format!("multi-HCA: threaded progress gives {t:.2} x polled at 1M")));
    // The cbr reading is the library's summary of the fixture's ratios.
    assert!(page.contains("CBR-Latency: "), "cbr summary");
    assert!(page.contains("loopback TCP on this host, unshaped"));
}

/// Runs chromium with `args` for at most 60 s.
fn chromium(args: &[&str]) -> Output {
    let mut c = Command::new("chromium");
    c.args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"])
        .args(args);
    run(&mut c, "chromium", Duration::from_secs(60))
}

#[test]
fn page_opens_in_headless_chromium() {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("chromium").is_file()))
        .unwrap_or(false);
    if !found {
        eprintln!("skipped: chromium is not on PATH (Debian: apt-get install chromium)");
        return;
    }
    let dir = scratch("chromium");
    render(&dir);
    let index = std::fs::canonicalize(dir.join("index.html")).unwrap();
    let url = format!("file://{}", index.display());
    // With the page's console on stderr: the page must log nothing.
    let o = chromium(&["--enable-logging=stderr", "--v=0", "--dump-dom", &url]);
    assert!(o.status.success(), "chromium --dump-dom: {}", text(&o.stderr));
    let console: Vec<String> = text(&o.stderr).lines().filter(|l| l.contains(":CONSOLE")).map(String::from).collect();
    assert!(console.is_empty(), "the page logged: {console:?}");
    let dom = text(&o.stdout);
    let figs = figures(&load_fixture());
    assert_eq!(dom.matches("<svg").count(), figs.len(), "every figure's <svg> in the DOM");
    for (study, _) in &figs {
        assert!(dom.contains(&format!("id=\"study-{study}\"")));
    }
    let shot = dir.join("index.png");
    let o = chromium(&[&format!("--screenshot={}", shot.display()), "--window-size=1200,3000", &url]);
    assert!(o.status.success(), "chromium --screenshot: {}", text(&o.stderr));
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(png.len() > 10_000 && png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG of {} bytes", png.len());
    println!("screenshot: {}", shot.display());
}

#[test]
fn report_quick_fdr_edr_on_loopback() {
    let dir = scratch("e2e");
    let o = run(
        &mut multirail(&["report", "--quick", "--study", "fdr-edr", "--out", dir.to_str().unwrap()]),
        "report --quick --study fdr-edr",
        Duration::from_secs(240),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let page = std::fs::read_to_string(dir.join("index.html")).unwrap();
    let results: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    assert_eq!(results["complete"], true);
    let runs = results["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6, "3 figures x 2 rail sets, 1 round");
    for r in runs {
        assert!(r["failed"].is_null(), "{r}");
        assert_eq!(r["records"].as_array().unwrap().len(), 3, "sizes 8, 64K, 1M");
    }
    assert_eq!(page.matches("<svg").count(), 3);
    for n in 1..=3 {
        assert!(dir.join(format!("fig-fdr-edr-{n}.svg")).is_file());
    }
    assert!(page.contains("rates cannot be shaped"));
}

/// Renders tests/data/report-results-NAME.json into a scratch directory:
/// the directory, the page and the recorded results.
fn render_recorded(name: &str) -> (PathBuf, String, Value) {
    let dir = scratch(name);
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/report-results-{name}.json"));
    let o = run(
        &mut multirail(&["report", "--from", fixture.to_str().unwrap(), "--out", dir.to_str().unwrap()]),
        &format!("report --from ({name})"),
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let page = std::fs::read_to_string(dir.join("index.html")).unwrap();
    let results: Value = serde_json::from_str(&std::fs::read_to_string(&fixture).unwrap()).unwrap();
    (dir, page, results)
}

/// The peers of a recorded `--testbed --quick --peers` run
/// (tests/data/report-results-testbed.json, a test fixture).
#[test]
fn page_with_testbeds_and_peers() {
    let (dir, page, results) = render_recorded("testbed");
    assert!(page.contains("<h2 id=\"peers\">Peers</h2>"));
    assert!(page.contains("emulated clusters (multirail testbed, prefix rpt)"));
    // The skipped multi-port half says why, in the notes and at its command.
    assert!(page.contains("multi-port half of the udapl study skipped"));
    assert!(page.contains("skipped: `testbed up` has no --bus"));
    // Peers are lines of the bandwidth figures (in the SVG legend).
    let bw = std::fs::read_to_string(dir.join("fig-fdr-edr-2.svg")).unwrap();
    for label in ["iperf3, 2 stream(s) on 2 x 3gbit", "Open MPI on 2 x 3gbit", "ucx_perftest on 2 x 1gbit"] {
        assert!(bw.contains(label), "{label} in the fdr-edr bandwidth figure");
    }
    // The reading: the faster set against iperf3 on its testbed at 1M,
    // from the fixture's numbers.
    let iperf = results["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["tool"] == "iperf3" && p["testbed"]["rate"] == "3gbit")
        .unwrap()["total"]
        .as_f64()
        .unwrap();
    let faster = value(&results, "fdr-edr", 1, 1, 1 << 20);
    let want = format!(
        "iperf3, 2 stream(s) on 2 x 3gbit (flat line, no message size): {iperf:.0} MB/s; against it: faster: 2 x \
         3gbit {:.2} x at 1M.",
        faster / iperf
    );
    assert!(page.contains(&want), "{want}");
    // And against the NPC'09 model of its rates (2 x 3 Gbit/s = 750 MB/s).
    assert!(page.contains(&format!("faster: 2 x 3gbit {:.2} x the model's 750 MB/s", faster / 750.0)));
}

/// The peers study of a recorded `bench/compare.sh --quick` run
/// (tests/data/report-results-peers.json, a test fixture): each peer in
/// the table beside the line over as many rails, with the ratio.
#[test]
fn peers_study_tables_hold_each_peer_against_its_counterpart() {
    let (dir, page, results) = render_recorded("peers");
    assert!(page.contains("id=\"study-peers\""));
    for n in 1..=5 {
        assert!(dir.join(format!("fig-peers-{n}.svg")).is_file(), "figure {n}");
    }
    let peer = |tool: &str, metric: &str, rails: &str, rate: &str| -> Value {
        results["peers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["tool"] == tool && p["metric"] == metric && p["rails"] == rails && p["testbed"]["rate"] == rate)
            .unwrap_or_else(|| panic!("{tool} {metric} {rails} on {rate} in the fixture"))
            .clone()
    };
    let at = |p: &Value, size: u64| -> f64 {
        p["points"].as_array().unwrap().iter().find(|q| q[0] == size).unwrap()[1].as_f64().unwrap()
    };
    // Open MPI on rail0 against multirail on rail0 (line 1), at 1M.
    let ompi1 = at(&peer("Open MPI", "bw", "first", "2gbit"), 1 << 20);
    let mr1 = value(&results, "peers", 0, 0, 1 << 20);
    assert!(
        page.contains("<th>Open MPI, rail0 only on 2 x 2gbit (MB/s; multirail, rail0 only of 2 x 2gbit / it)</th>")
    );
    assert!(page.contains(&format!("<td>{ompi1:.2} ({:.2} x)</td>", mr1 / ompi1)), "{ompi1} {mr1}");
    // Latency: UCX over all rails against multirail over both, at 8 B.
    let ucx = at(&peer("ucx_perftest", "latency", "all", "2gbit"), 8);
    let mr = value(&results, "peers", 2, 1, 8);
    assert!(page.contains(&format!("<td>{ucx:.2} ({:.2} x)</td>", mr / ucx)), "{ucx} {mr}");
    // The unequal rails are named as such; the hints variant is drawn there.
    let unequal = std::fs::read_to_string(dir.join("fig-peers-5.svg")).unwrap();
    assert!(unequal.contains("Open MPI, bandwidth hints on 1gbit + 3gbit"));
}
