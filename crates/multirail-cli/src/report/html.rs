//! The page of a report: `index.html` (self-contained: inline CSS and SVG,
//! no scripts, no external URL) and each figure as an SVG file, made from
//! [`Results`] alone, so recorded results render again (`--from`). Every
//! reading paragraph is computed from the numbers.

use std::collections::BTreeSet;
use std::fmt::Write;

use multirail_perf::Test;
use multirail_perf::cbr::{self, CbrRecord};
use multirail_perf::model::{ModelInput, parse_rate};
use multirail_perf::report::plot::{self, Chart, CustomAxis, Machine, Series};
use serde::Deserialize;

use super::Results;
use super::peers::{PeerRails, PeerRun};
use super::plan::{Config, Figure, Metric, Study};
use crate::child;

/// The page and its figures (`fig-STUDY-N.svg`, SVG text).
pub struct Page {
    pub html: String,
    pub figures: Vec<(String, String)>,
}

/// A size as the page writes it: `8 B`, `64K`, `1M`.
pub fn format_size(n: u64) -> String {
    let s = multirail_proto::units::format_size(n);
    if s.chars().all(|c| c.is_ascii_digit()) { format!("{s} B") } else { s }
}

/// Text for HTML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The fields of a bench record the page uses.
#[derive(Debug, Deserialize)]
struct Point {
    size: u64,
    value: f64,
    #[serde(default)]
    predicted_multi_hca: Option<f64>,
    #[serde(default)]
    predicted_multi_port: Option<f64>,
}

/// One line of a figure: medians per size over the runs that succeeded.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub label: String,
    pub points: Vec<(u64, f64)>,
    /// The NPC'09 model's prediction per size (bench bw --model), MB/s.
    pub model: Vec<(u64, f64)>,
    pub ok: usize,
    pub failures: Vec<String>,
}

impl Line {
    pub fn at(&self, size: u64) -> Option<f64> {
        self.points.iter().find(|p| p.0 == size).map(|p| p.1)
    }
    fn model_at(&self, size: u64) -> Option<f64> {
        self.model.iter().find(|p| p.0 == size).map(|p| p.1)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// Per size, the median of the values each run gave.
fn medians(per_run: &[Vec<(u64, f64)>]) -> Vec<(u64, f64)> {
    let sizes: BTreeSet<u64> = per_run.iter().flatten().map(|p| p.0).collect();
    sizes
        .into_iter()
        .map(|s| (s, median(per_run.iter().flatten().filter(|p| p.0 == s).map(|p| p.1).collect())))
        .collect()
}

/// The lines of figure `fi` of `study`.
pub fn lines(results: &Results, study: &Study, fi: usize) -> Vec<Line> {
    let fig = &study.figures[fi];
    fig.configs
        .iter()
        .enumerate()
        .map(|(ci, cfg)| {
            let runs: Vec<_> =
                results.runs.iter().filter(|r| r.study == study.id && r.figure == fi && r.config == ci).collect();
            let ok: Vec<Vec<Point>> = runs
                .iter()
                .filter(|r| r.failed.is_none())
                .map(|r| r.records.iter().filter_map(|v| serde_json::from_value::<Point>(v.clone()).ok()).collect())
                .collect();
            let port = cfg.argv.iter().any(|a| a == "--nic");
            let values: Vec<Vec<(u64, f64)>> =
                ok.iter().map(|r| r.iter().map(|p| (p.size, p.value)).collect()).collect();
            let model: Vec<Vec<(u64, f64)>> = ok
                .iter()
                .map(|r| {
                    r.iter()
                        .filter_map(|p| {
                            Some((p.size, if port { p.predicted_multi_port? } else { p.predicted_multi_hca? }))
                        })
                        .collect()
                })
                .collect();
            Line {
                label: cfg.label.clone(),
                points: medians(&values),
                model: medians(&model),
                ok: ok.len(),
                failures: runs.iter().filter_map(|r| r.failed.clone()).collect(),
            }
        })
        .collect()
}

/// The balance ratios of a cbr figure (its first run that succeeded).
pub fn cbr_rows(results: &Results, study: &Study, fi: usize) -> Vec<CbrRecord> {
    results
        .runs
        .iter()
        .filter(|r| r.study == study.id && r.figure == fi && r.failed.is_none())
        .map(|r| r.records.iter().filter_map(|v| serde_json::from_value::<CbrRecord>(v.clone()).ok()).collect())
        .find(|rows: &Vec<CbrRecord>| !rows.is_empty())
        .unwrap_or_default()
}

fn test_of(m: Metric) -> Test {
    match m {
        Metric::Latency => Test::Latency,
        Metric::Bw | Metric::Cbr => Test::Bw,
        Metric::Bibw => Test::Bibw,
        Metric::MbwMr => Test::MbwMr,
    }
}

/// A value in the metric's unit, as the page writes it.
fn show(m: Metric, v: f64) -> String {
    match m {
        Metric::Latency if v < 100.0 => format!("{v:.2} µs"),
        Metric::Latency => format!("{v:.0} µs"),
        Metric::Cbr => format!("{v:.2}"),
        _ if v < 10.0 => format!("{v:.2} MB/s"),
        _ => format!("{v:.0} MB/s"),
    }
}

/// The NPC'09 multi-HCA (or, with a bus, multi-port) prediction of a
/// configuration's testbed, MB/s; `None` without a testbed.
pub fn testbed_model(cfg: &Config) -> Option<f64> {
    let spec = cfg.testbed.as_ref()?;
    // The rails the line uses (`--testbed-rails`): the first of the
    // testbed's, each at its rate (one for all, or one per rail).
    let used = rails_used(cfg).min(spec.rails);
    let mut links = spec.rate.split(',').map(|r| parse_rate(r).ok()).collect::<Option<Vec<f64>>>()?;
    if links.len() > 1 {
        links.truncate(used);
    }
    let bus = spec.bus.as_deref().and_then(|b| parse_rate(b).ok());
    let p = ModelInput::new(used, &links, bus, None).ok()?.predict();
    Some(if spec.bus.is_some() { p.multi_port } else { p.multi_hca } / 1e6)
}

/// The sizes at which `line` falls by more than 10% from the size before:
/// `(size before, value, size, value)`.
pub fn falls(line: &Line) -> Vec<(u64, f64, u64, f64)> {
    line.points.windows(2).filter(|w| w[1].1 < 0.9 * w[0].1).map(|w| (w[0].0, w[0].1, w[1].0, w[1].1)).collect()
}

/// The reading paragraph of a figure, computed from its lines.
pub fn reading(study: &Study, fig: &Figure, lines: &[Line]) -> String {
    let m = fig.metric;
    let with_data: Vec<&Line> = lines.iter().filter(|l| !l.points.is_empty()).collect();
    let Some(first) = with_data.first() else { return "No run of this figure succeeded: nothing to read.".into() };
    let mut out = Vec::new();
    let sizes: BTreeSet<u64> = first.points.iter().map(|p| p.0).filter(|s| *s > 0).collect();
    let (Some(&small), Some(&large)) = (sizes.first(), sizes.last()) else { return "No sizes measured.".into() };
    let at = if m == Metric::Latency { small } else { large };
    let values: Vec<String> =
        with_data.iter().filter_map(|l| Some(format!("{} {}", esc(&l.label), show(m, l.at(at)?)))).collect();
    out.push(format!("At {}: {}.", format_size(at), values.join("; ")));
    if m != Metric::Latency
        && let Some(best) = with_data
            .iter()
            .filter(|l| l.at(large).is_some())
            .max_by(|a, b| a.at(large).unwrap_or(0.0).total_cmp(&b.at(large).unwrap_or(0.0)))
    {
        out.push(format!("Highest at {}: {}.", format_size(large), esc(&best.label)));
    }
    // Each other line against the first, at the smallest and largest size.
    let ratios: Vec<String> = with_data[1..]
        .iter()
        .filter_map(|l| {
            let r = |s: u64| Some(l.at(s)? / first.at(s).filter(|v| *v > 0.0)?);
            Some(format!(
                "{} is {:.2} x at {} and {:.2} x at {}",
                esc(&l.label),
                r(small)?,
                format_size(small),
                r(large)?,
                format_size(large)
            ))
        })
        .collect();
    if !ratios.is_empty() {
        let lower = if m == Metric::Latency { " (latency: below 1 is faster)" } else { "" };
        out.push(format!("Against {}{lower}: {}.", esc(&first.label), ratios.join("; ")));
    }
    // The model of the testbed's rates, when there was a testbed.
    if m == Metric::Bw {
        let vs: Vec<String> = fig
            .configs
            .iter()
            .zip(lines)
            .filter_map(|(c, l)| {
                let p = testbed_model(c)?;
                Some(format!("{} {:.2} x the model's {p:.0} MB/s", esc(&l.label), l.at(large)? / p))
            })
            .collect();
        if !vs.is_empty() {
            out.push(format!(
                "At {} against the NPC'09 model of the rail rates: {}.",
                format_size(large),
                vs.join("; ")
            ));
        }
        let measured_model: Vec<String> = lines
            .iter()
            .filter_map(|l| {
                let p = l.model_at(large)?;
                Some(format!("{} {:.2} x of {p:.0} MB/s", esc(&l.label), l.at(large)? / p))
            })
            .collect();
        if !measured_model.is_empty() {
            out.push(format!(
                "Against the model from the rails' measured single-rail rates (bench bw --model) at {}: {}.",
                format_size(large),
                measured_model.join("; ")
            ));
        }
    }
    if study.id == "udapl" {
        for setup in ["multi-HCA", "multi-port"] {
            let find = |p: &str| lines.iter().find(|l| l.label == format!("{setup}, {p}")).and_then(|l| l.at(large));
            if let (Some(t), Some(p)) = (find("threaded"), find("polled")) {
                out.push(format!(
                    "{setup}: threaded progress gives {:.2} x polled at {} ({} vs {}).",
                    t / p,
                    format_size(large),
                    show(m, t),
                    show(m, p)
                ));
            }
        }
    }
    if study.id == "dual-rail" && m != Metric::Latency {
        let mut fell = Vec::new();
        for l in &with_data {
            for (s0, v0, s1, v1) in falls(l) {
                fell.push(format!(
                    "{} falls from {} at {} to {} at {}",
                    esc(&l.label),
                    show(m, v0),
                    format_size(s0),
                    show(m, v1),
                    format_size(s1)
                ));
            }
        }
        let default = with_data.iter().find(|l| l.label.ends_with("default policy"));
        let default_falls = default.map(|l| !falls(l).is_empty());
        if fell.is_empty() {
            out.push("No line falls by more than 10% from one size to the next: no cusp at these sizes.".into());
        } else {
            out.push(format!("Cusps (a fall of more than 10% from one size to the next): {}.", fell.join("; ")));
            match default_falls {
                Some(false) => out.push("The default policy shows no such fall.".into()),
                Some(true) => out.push("The default policy does not remove it.".into()),
                None => {}
            }
        }
    }
    out.join("<br>\n")
}

/// The peer runs drawn in a figure: those of its metric on a testbed one
/// of its lines used, and (the variants) made for its study.
fn peers_of<'a>(results: &'a Results, study: &Study, fig: &Figure) -> Vec<&'a PeerRun> {
    results
        .peers
        .iter()
        .filter(|p| p.metric == fig.metric && p.study.as_ref().is_none_or(|s| *s == study.id))
        .filter(|p| fig.configs.iter().any(|c| c.testbed.as_ref() == Some(&p.testbed)))
        .collect()
}

fn peer_label(p: &PeerRun) -> String {
    if p.points.is_empty() {
        let bidir = if p.metric == Metric::Bibw { " --bidir" } else { "" };
        format!("{}{bidir}, {} stream(s) on {}", p.tool, p.testbed.rails, p.testbed.describe())
    } else {
        format!("{}{} on {}", p.tool, p.rails.suffix(), p.testbed.describe())
    }
}

/// How many rails a configuration's ranks use: `--testbed-rails N`, else
/// its testbed's, else the entries of `--rails`.
fn rails_used(cfg: &Config) -> usize {
    let after = |flag: &str| cfg.argv.iter().position(|a| a == flag).and_then(|i| cfg.argv.get(i + 1));
    if let Some(n) = after("--testbed-rails").and_then(|n| n.parse().ok()) {
        return n;
    }
    match (&cfg.testbed, after("--rails")) {
        (Some(t), _) => t.rails,
        (None, Some(list)) => list.split(',').count(),
        (None, None) => 1,
    }
}

/// The line a peer is held against in the table: the last one on its
/// testbed over as many rails (a peer on rail0 alone against multirail on
/// one rail).
fn counterpart(fig: &Figure, p: &PeerRun) -> Option<usize> {
    fig.configs.iter().rposition(|c| c.testbed.as_ref() == Some(&p.testbed) && rails_used(c) == peer_rails(p))
}

/// How many rails a peer used.
fn peer_rails(p: &PeerRun) -> usize {
    if p.rails == PeerRails::First { 1 } else { p.testbed.rails }
}

/// A peer's value at `size`: its point, or its flat total (iperf3).
fn peer_at(p: &PeerRun, size: u64) -> Option<f64> {
    if p.points.is_empty() { p.total } else { p.points.iter().find(|q| q.0 == size).map(|q| q.1) }
}

/// The peers beside the lines, sizes down: each peer's value and the
/// ratio of its counterpart line to it (`1.20 x`: multirail gives 1.2
/// times the peer's bandwidth, or takes 1.2 times its latency).
fn peer_table(fig: &Figure, ls: &[Line], peers: &[&PeerRun]) -> String {
    let sizes: BTreeSet<u64> = ls
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .chain(peers.iter().flat_map(|p| p.points.iter().map(|q| q.0)))
        .collect();
    if sizes.is_empty() || peers.is_empty() {
        return String::new();
    }
    let mut t = "<table class=\"data peers\">\n<tr><th>Size</th>".to_string();
    let against: Vec<Option<usize>> = peers.iter().map(|p| counterpart(fig, p)).collect();
    for (p, c) in peers.iter().zip(&against) {
        let vs = c.map_or(String::new(), |c| format!("; {} / it", ls[c].label));
        let _ = write!(t, "<th>{} ({}{})</th>", esc(&peer_label(p)), esc(fig.metric.unit()), esc(&vs));
    }
    t.push_str("</tr>\n");
    for s in sizes {
        let _ = write!(t, "<tr><td>{}</td>", esc(&format_size(s)));
        for (p, c) in peers.iter().zip(&against) {
            // A flat line (iperf3) has no message size: held against the
            // lines from 64 KiB on, where a stream can fill the links.
            let ratio = c.filter(|_| !p.points.is_empty() || s >= 64 << 10);
            let cell = match peer_at(p, s) {
                None => "–".to_string(),
                Some(v) => match ratio.and_then(|c| ls[c].at(s)) {
                    Some(m) if v > 0.0 => format!("{v:.2} ({:.2} x)", m / v),
                    _ => format!("{v:.2}"),
                },
            };
            let _ = write!(t, "<td>{cell}</td>");
        }
        t.push_str("</tr>\n");
    }
    t.push_str("</table>\n");
    t
}

/// Each line against the peer measured on its testbed over as many rails,
/// at the largest size both measured (latency: the smallest above 0);
/// against a flat line (iperf3), at the line's largest size.
fn peer_reading(fig: &Figure, lines: &[Line], peers: &[&PeerRun]) -> String {
    let latency = fig.metric == Metric::Latency;
    let pick = |pts: &[(u64, f64)]| -> Option<(u64, f64)> {
        if latency { pts.iter().copied().find(|p| p.0 > 0) } else { pts.last().copied() }
    };
    let mut out = String::new();
    for p in peers {
        let Some(total) = p.total else { continue };
        // (size, the line's value, the peer's value)
        let at = |l: &Line| -> Option<(u64, f64, f64)> {
            if p.points.is_empty() {
                return pick(&l.points).map(|(s, v)| (s, v, total));
            }
            let both = p
                .points
                .iter()
                .filter(|q| q.0 > 0 || !latency)
                .filter_map(|q| l.points.iter().find(|x| x.0 == q.0).map(|x| (q.0, x.1, q.1)));
            if latency { both.min_by_key(|b| b.0) } else { both.max_by_key(|b| b.0) }
        };
        let vs: Vec<String> = fig
            .configs
            .iter()
            .zip(lines)
            .filter(|(c, _)| c.testbed.as_ref() == Some(&p.testbed) && rails_used(c) == peer_rails(p))
            .filter_map(|(_, l)| {
                let (s, v, theirs) = at(l)?;
                Some(format!("{} {:.2} x at {}", esc(&l.label), v / theirs, format_size(s)))
            })
            .collect();
        let what = match pick(&p.points) {
            None => format!("(flat line, no message size): {}", show(fig.metric, total)),
            Some((s, v)) => format!("{} at {}", show(fig.metric, v), format_size(s)),
        };
        // Nothing measured at a size the peer has: say so, not "against it: .".
        let against = if vs.is_empty() {
            "no line of the figure has its sizes".to_string()
        } else {
            format!("against it: {}", vs.join("; "))
        };
        let _ = write!(out, "<br>\n{} {what}; {against}.", esc(&peer_label(p)));
    }
    out
}

fn chart(results: &Results, fig: &Figure, series: Vec<Series>, custom: Option<CustomAxis>) -> Chart {
    Chart {
        test: test_of(fig.metric),
        config: fig.title.clone(),
        machine: Machine { hostname: results.machine.hostname.clone(), cpus: results.machine.cpus },
        series,
        custom,
    }
}

const CSS: &str = "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;line-height:1.45}\
h1{font-size:1.7em}h2{border-bottom:2px solid #0072b2;padding-bottom:.2em;margin-top:2.2em}\
.meta td{padding:.1em .8em .1em 0;vertical-align:top}.note{background:#fff4e0;border-left:4px solid #e69f00;padding:.4em .8em}\
.question{font-style:italic}.setup{color:#444}figure{margin:1em 0}figure svg{width:100%;height:auto;border:1px solid #ddd}\
.reading{background:#eef6fb;border-left:4px solid #0072b2;padding:.5em .8em}\
table.data{border-collapse:collapse;font-size:.9em;margin:.6em 0}table.data th,table.data td{border:1px solid #ccc;padding:.2em .5em;text-align:right}\
table.data th{background:#f3f3f3}table.data td.l{text-align:left}code,pre{font-size:.85em;background:#f6f6f6}\
pre{padding:.4em;white-space:pre-wrap;word-break:break-all}.failed{color:#a00}";

/// Renders the page.
pub fn render(results: &Results) -> Page {
    let mut h = String::new();
    let mut figures = Vec::new();
    let plan = &results.plan;
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>multirail report: {}</title>\n\
         <style>{CSS}</style>\n</head>\n<body>\n<h1>multirail report</h1>\n",
        esc(&results.machine.hostname)
    );
    let m = &results.machine;
    let rows = [
        ("Date", results.date.clone()),
        ("multirail", results.version.clone()),
        (
            "Machine",
            format!(
                "{} ({} CPUs{}), Linux {}",
                m.hostname,
                m.cpus,
                if m.cpu_model.is_empty() { String::new() } else { format!(", {}", m.cpu_model) },
                m.kernel
            ),
        ),
        ("Command", results.command.clone()),
        (
            "Rails",
            if plan.testbed {
                format!("emulated clusters (multirail testbed, prefix {})", plan.prefix)
            } else {
                "loopback TCP on this host, unshaped (no --testbed)".into()
            },
        ),
        (
            "Loops",
            if plan.quick {
                "--quick: sizes 8, 64K, 1M; 5 iterations, 1 warm-up (latency: 100 and 10); 1 round".into()
            } else {
                "sizes 1 B to 4 MiB, OSU's loop counts; median of 3 rounds per size".into()
            },
        ),
        (
            "Runs",
            format!(
                "{} child runs, {} failed, {:.0} s{}",
                results.runs.len(),
                results.runs.iter().filter(|r| r.failed.is_some()).count(),
                results.duration_s,
                if results.complete { "" } else { "; INCOMPLETE (interrupted, or still running)" }
            ),
        ),
    ];
    h.push_str("<table class=\"meta\">\n");
    for (k, v) in rows {
        let _ = writeln!(h, "<tr><td>{}</td><td>{}</td></tr>", esc(k), esc(&v));
    }
    h.push_str("</table>\n");
    for n in &results.notes {
        let _ = writeln!(h, "<p class=\"note\">{}</p>", esc(n));
    }
    h.push_str("<p>Studies: ");
    let toc: Vec<String> =
        plan.studies.iter().map(|s| format!("<a href=\"#study-{}\">{}</a>", esc(&s.id), esc(&s.title))).collect();
    h.push_str(&toc.join(" · "));
    if !results.peers.is_empty() {
        h.push_str(" · <a href=\"#peers\">Peers: the other tools' commands</a>");
    }
    h.push_str("</p>\n");
    for study in &plan.studies {
        let _ = write!(
            h,
            "<section id=\"study-{id}\">\n<h2>{}</h2>\n<p class=\"question\">{}</p>\n<p class=\"setup\">{}</p>\n",
            esc(&study.title),
            esc(&study.question),
            esc(&study.setup),
            id = esc(&study.id)
        );
        for (fi, fig) in study.figures.iter().enumerate() {
            let name = format!("fig-{}-{}", study.id, fi + 1);
            let _ = writeln!(h, "<h3 id=\"{}\">Figure {}: {}</h3>", esc(&name), fi + 1, esc(&fig.title));
            let (svg, table, read) = if fig.metric == Metric::Cbr {
                let rows = cbr_rows(results, study, fi);
                let series = cbr::Metric::ALL
                    .iter()
                    .map(|&k| Series {
                        label: k.name().into(),
                        points: rows.iter().filter(|r| r.metric == k).map(|r| (r.size, r.cbr)).collect(),
                    })
                    .filter(|s| !s.points.is_empty())
                    .collect();
                let custom = CustomAxis {
                    what: "report cbr: Communication Balance Ratios".into(),
                    y_label: "CBR = intra / inter (1 = balanced)".into(),
                    log_y: true,
                };
                let svg = plot::svg(&chart(results, fig, series, Some(custom))).ok();
                let read = if rows.is_empty() {
                    "No run of this figure succeeded: nothing to read.".to_string()
                } else {
                    cbr::Metric::ALL
                        .iter()
                        .map(|&k| {
                            let mine: Vec<CbrRecord> = rows.iter().filter(|r| r.metric == k).cloned().collect();
                            esc(&cbr::summary(&mine))
                        })
                        .collect::<Vec<_>>()
                        .join(".<br>\n")
                        + "."
                };
                (svg, cbr_table(&rows), read)
            } else {
                let ls = lines(results, study, fi);
                let mut series: Vec<Series> =
                    ls.iter().map(|l| Series { label: l.label.clone(), points: l.points.clone() }).collect();
                series.extend(
                    ls.iter()
                        .filter(|l| !l.model.is_empty())
                        .map(|l| Series { label: format!("model: {}", l.label), points: l.model.clone() }),
                );
                let sizes: BTreeSet<u64> = ls.iter().flat_map(|l| l.points.iter().map(|p| p.0)).collect();
                let mine = peers_of(results, study, fig);
                series.extend(mine.iter().filter_map(|p| {
                    let points = if p.points.is_empty() {
                        let v = p.total?;
                        sizes.iter().map(|s| (*s, v)).collect()
                    } else {
                        p.points.clone()
                    };
                    Some(Series { label: peer_label(p), points })
                }));
                let svg = plot::svg(&chart(results, fig, series, None)).ok();
                let mut read = reading(study, fig, &ls);
                read.push_str(&peer_reading(fig, &ls, &mine));
                (svg, table(fig.metric, &ls) + &peer_table(fig, &ls, &mine), read)
            };
            match svg {
                Some(svg) => {
                    let _ = writeln!(
                        h,
                        "<figure>\n{}\n<figcaption>{}</figcaption>\n</figure>",
                        svg.trim(),
                        esc(&fig.title)
                    );
                    figures.push((format!("{name}.svg"), svg));
                }
                None => h.push_str("<p class=\"failed\">No figure: no run of it gave numbers.</p>\n"),
            }
            let _ = writeln!(h, "<p class=\"reading\">{read}</p>");
            h.push_str(&table);
            h.push_str(&commands(results, study, fi, fig));
        }
        h.push_str("</section>\n");
    }
    if !results.peers.is_empty() {
        h.push_str("<h2 id=\"peers\">Peers</h2>\n<ul>\n");
        for p in &results.peers {
            let result = match (&p.failed, p.total) {
                (Some(f), _) => format!("<span class=\"failed\">failed: {}</span>", esc(f)),
                (None, Some(t)) if p.points.is_empty() => format!(
                    "{t:.0} MB/s in all (per rail: {})",
                    p.per_rail.iter().map(|v| format!("{v:.0}")).collect::<Vec<_>>().join(", ")
                ),
                (None, Some(_)) => p
                    .points
                    .iter()
                    .map(|(s, v)| format!("{} {}", format_size(*s), show(p.metric, *v)))
                    .collect::<Vec<_>>()
                    .join(", "),
                (None, None) => "no result".into(),
            };
            let _ = writeln!(h, "<li>{} on {}: {result}", esc(&p.what), esc(&p.testbed.describe()));
            for c in &p.commands {
                let _ = write!(h, "<br><code>{}</code>", esc(c));
            }
            h.push_str("</li>\n");
        }
        h.push_str("</ul>\n");
    }
    h.push_str("</body>\n</html>\n");
    Page { html: h, figures }
}

/// Sizes down, configurations across (with the model's columns where
/// there is one).
fn table(m: Metric, ls: &[Line]) -> String {
    let sizes: BTreeSet<u64> = ls.iter().flat_map(|l| l.points.iter().map(|p| p.0)).collect();
    if sizes.is_empty() {
        return String::new();
    }
    let mut t = "<table class=\"data\">\n<tr><th>Size</th>".to_string();
    for l in ls {
        let _ = write!(t, "<th>{} ({})</th>", esc(&l.label), esc(m.unit()));
        if !l.model.is_empty() {
            t.push_str("<th>model (MB/s)</th><th>measured / model</th>");
        }
    }
    t.push_str("</tr>\n");
    for s in sizes {
        let _ = write!(t, "<tr><td>{}</td>", esc(&format_size(s)));
        for l in ls {
            let v = l.at(s);
            let _ = write!(t, "<td>{}</td>", v.map_or("–".into(), |v| format!("{v:.2}")));
            if !l.model.is_empty() {
                let p = l.model_at(s);
                let r = v.zip(p).map(|(v, p)| v / p);
                let _ = write!(
                    t,
                    "<td>{}</td><td>{}</td>",
                    p.map_or("–".into(), |p| format!("{p:.0}")),
                    r.map_or("–".into(), |r| format!("{r:.2}"))
                );
            }
        }
        t.push_str("</tr>\n");
    }
    t.push_str("</table>\n");
    t
}

fn cbr_table(rows: &[CbrRecord]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut t = "<table class=\"data\">\n<tr><th>Ratio</th><th>Size</th><th>intra</th><th>inter</th><th>CBR</th><th>Reading</th></tr>\n"
        .to_string();
    for r in rows {
        let unit = if r.test.is_latency() { "µs" } else { "MB/s" };
        let _ = writeln!(
            t,
            "<tr><td class=\"l\">{}</td><td>{}</td><td>{:.2} {unit}</td><td>{:.2} {unit}</td><td>{:.2}</td><td class=\"l\">{}</td></tr>",
            esc(r.metric.name()),
            esc(&format_size(r.size)),
            r.intra,
            r.inter,
            r.cbr,
            esc(&r.reading)
        );
    }
    t.push_str("</table>\n");
    t
}

/// The exact command behind every line of the figure, and its failures.
fn commands(results: &Results, study: &Study, fi: usize, fig: &Figure) -> String {
    let mut out = "<div class=\"commands\"><p>Commands (one line of the figure each):</p>\n<ul>\n".to_string();
    for (ci, cfg) in fig.configs.iter().enumerate() {
        let vars: String = cfg.env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
        let runs: Vec<_> =
            results.runs.iter().filter(|r| r.study == study.id && r.figure == fi && r.config == ci).collect();
        let ok = runs.iter().filter(|r| r.failed.is_none()).count();
        let testbed = cfg
            .testbed
            .as_ref()
            .map(|t| format!(" on <code>{}</code>", esc(&child::shown(&t.up_argv(&results.plan.prefix)))))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "<li>{}: <code>{}{}</code>{testbed}; {ok} of {} round(s) ran ({} planned)",
            esc(&cfg.label),
            esc(&vars),
            esc(&child::shown(&cfg.argv)),
            runs.len(),
            cfg.rounds
        );
        for f in runs.iter().filter_map(|r| r.failed.as_ref()) {
            let _ = writeln!(out, "<pre class=\"failed\">failed: {}</pre>", esc(f));
        }
        out.push_str("</li>\n");
    }
    out.push_str("</ul></div>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::plan::TestbedSpec;

    fn line(label: &str, points: &[(u64, f64)]) -> Line {
        Line { label: label.into(), points: points.to_vec(), model: vec![], ok: 1, failures: vec![] }
    }

    fn config(label: &str, rails: usize, rate: &str) -> Config {
        Config {
            label: label.into(),
            argv: vec!["bench".into(), "bw".into()],
            env: vec![],
            testbed: Some(TestbedSpec { rails, rate: rate.into(), bus: None }),
            rounds: 1,
        }
    }

    fn study(id: &str) -> Study {
        Study { id: id.into(), title: String::new(), question: String::new(), setup: String::new(), figures: vec![] }
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(esc("<a href='x'>&\"</a>"), "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;");
        assert_eq!([format_size(8), format_size(65536)], ["8 B", "64K"]);
    }

    #[test]
    fn dual_rail_reading_finds_the_cusp_and_the_model() {
        let fig = Figure {
            title: "bw".into(),
            metric: Metric::Bw,
            configs: vec![
                config("fast", 1, "3500mbit"),
                config("16K:single,*:stripe", 2, "2gbit"),
                config("default policy", 2, "2gbit"),
            ],
        };
        let lines = [
            line("fast", &[(16384, 300.0), (32768, 380.0), (1 << 20, 420.0)]),
            line("16K:single,*:stripe", &[(16384, 200.0), (32768, 150.0), (1 << 20, 485.0)]),
            line("default policy", &[(16384, 230.0), (32768, 300.0), (1 << 20, 490.0)]),
        ];
        let r = reading(&study("dual-rail"), &fig, &lines);
        assert!(r.contains("16K:single,*:stripe falls from 200 MB/s at 16K to 150 MB/s at 32K"), "{r}");
        assert!(r.contains("The default policy shows no such fall."), "{r}");
        // NPC'09 multi-HCA of the rates: 3.5 Gbit/s = 437.5 MB/s, 2 x 2 Gbit/s = 500 MB/s.
        assert!(r.contains("fast 0.96 x the model's 438 MB/s"), "{r}");
        assert!(r.contains("default policy 0.98 x the model's 500 MB/s"), "{r}");
        assert!(r.contains("default policy is 0.77 x at 16K and 1.17 x at 1M"), "{r}");
        assert!(r.starts_with("At 1M: fast 420 MB/s;"), "{r}");
    }

    #[test]
    fn latency_reads_the_smallest_size_and_nothing_measured_says_so() {
        let fig = Figure { title: "lat".into(), metric: Metric::Latency, configs: vec![] };
        let lines = [line("a", &[(8, 10.0), (1 << 20, 4000.0)]), line("b", &[(8, 5.0), (1 << 20, 2000.0)])];
        let r = reading(&study("fdr-edr"), &fig, &lines);
        assert!(r.starts_with("At 8 B: a 10.00 µs; b 5.00 µs."), "{r}");
        assert!(r.contains("b is 0.50 x at 8 B and 0.50 x at 1M"), "{r}");
        let none = reading(&study("fdr-edr"), &fig, &[line("a", &[])]);
        assert_eq!(none, "No run of this figure succeeded: nothing to read.");
    }

    #[test]
    fn peers_read_against_the_lines_of_their_testbed() {
        let fig = Figure {
            title: "bw".into(),
            metric: Metric::Bw,
            configs: vec![config("fast", 1, "3500mbit"), config("pair", 2, "2gbit")],
        };
        let lines = [line("fast", &[(8, 1.0), (1 << 20, 400.0)]), line("pair", &[(8, 1.0), (1 << 20, 450.0)])];
        let peer = PeerRun {
            tool: "iperf3".into(),
            metric: Metric::Bw,
            testbed: TestbedSpec { rails: 2, rate: "2gbit".into(), bus: None },
            what: String::new(),
            commands: vec![],
            per_rail: vec![240.0, 260.0],
            total: Some(500.0),
            points: vec![],
            failed: None,
            rails: PeerRails::All,
            study: None,
        };
        let r = peer_reading(&fig, &lines, &[&peer]);
        assert_eq!(
            r,
            "<br>\niperf3, 2 stream(s) on 2 x 2gbit (flat line, no message size): 500 MB/s; against it: pair 0.90 x at 1M."
        );
    }

    #[test]
    fn a_latency_peer_is_read_at_the_smallest_size_both_measured() {
        // ucx_perftest's latency is measured at 8 B; the lines start at 1 B
        // (the fdr-edr report said "against it: ." before).
        let fig = Figure { title: "lat".into(), metric: Metric::Latency, configs: vec![config("pair", 2, "1gbit")] };
        let lines = [line("pair", &[(1, 15.9), (8, 15.8), (1 << 20, 4961.0)])];
        let mut peer = PeerRun {
            tool: "ucx_perftest".into(),
            metric: Metric::Latency,
            testbed: TestbedSpec { rails: 2, rate: "1gbit".into(), bus: None },
            what: String::new(),
            commands: vec![],
            per_rail: vec![],
            total: Some(14.35),
            points: vec![(8, 14.35)],
            failed: None,
            rails: PeerRails::All,
            study: None,
        };
        let r = peer_reading(&fig, &lines, &[&peer]);
        assert!(r.ends_with("14.35 µs at 8 B; against it: pair 1.10 x at 8 B."), "{r}");
        peer.points = vec![(3, 14.0)];
        let r = peer_reading(&fig, &lines, &[&peer]);
        assert!(r.ends_with("no line of the figure has its sizes."), "{r}");
    }

    #[test]
    fn the_peer_table_holds_each_peer_against_the_line_over_as_many_rails() {
        let mut one = config("one", 2, "2gbit");
        one.argv.extend(["--testbed-rails".to_string(), "1".to_string()]);
        let fig = Figure { title: "bw".into(), metric: Metric::Bw, configs: vec![one, config("two", 2, "2gbit")] };
        let lines = [line("one", &[(8, 2.0), (1 << 20, 230.0)]), line("two", &[(8, 2.0), (1 << 20, 460.0)])];
        let peer = |rails: PeerRails, points: Vec<(u64, f64)>, total: f64| PeerRun {
            tool: if points.is_empty() { "iperf3".into() } else { "Open MPI".into() },
            metric: Metric::Bw,
            testbed: TestbedSpec { rails: 2, rate: "2gbit".into(), bus: None },
            what: String::new(),
            commands: vec![],
            per_rail: vec![],
            total: Some(total),
            points,
            failed: None,
            rails,
            study: None,
        };
        let first = peer(PeerRails::First, vec![(8, 4.0), (1 << 20, 200.0)], 200.0);
        let all = peer(PeerRails::All, vec![(1 << 20, 400.0)], 400.0);
        let iperf = peer(PeerRails::All, vec![], 500.0);
        assert_eq!(counterpart(&fig, &first), Some(0));
        assert_eq!(counterpart(&fig, &all), Some(1));
        let t = peer_table(&fig, &lines, &[&first, &all, &iperf]);
        assert!(t.contains("<th>Open MPI, rail0 only on 2 x 2gbit (MB/s; one / it)</th>"), "{t}");
        assert!(t.contains("<th>iperf3, 2 stream(s) on 2 x 2gbit (MB/s; two / it)</th>"), "{t}");
        // 8 B: Open MPI on rail0 4.0, multirail on one rail 2.0; Open MPI
        // on all rails has no 8 B; iperf3 is flat (no ratio at 8 B).
        assert!(t.contains("<tr><td>8 B</td><td>4.00 (0.50 x)</td><td>–</td><td>500.00</td></tr>"), "{t}");
        assert!(
            t.contains("<td>1M</td><td>200.00 (1.15 x)</td><td>400.00 (1.15 x)</td><td>500.00 (0.92 x)</td>"),
            "{t}"
        );
        assert_eq!(peer_table(&fig, &lines, &[]), "");
    }

    #[test]
    fn the_peers_study_variants_are_drawn_in_its_figures_only() {
        let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/report-results-peers.json");
        let mut results: Results = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
        let mut other = results.plan.studies[0].clone();
        other.id = "fdr-edr".into();
        let fig = &results.plan.studies[0].figures[0];
        let mine = peers_of(&results, &results.plan.studies[0], fig).len();
        let theirs = peers_of(&results, &other, fig);
        assert!(theirs.iter().all(|p| p.study.is_none() && p.rails == PeerRails::All), "{theirs:?}");
        assert!(mine > theirs.len() && !theirs.is_empty(), "{mine} vs {}", theirs.len());
        // A peer of another testbed or metric is not drawn.
        results.peers.retain(|p| p.testbed.rate != "2gbit" || p.metric != Metric::Bw);
        assert!(peers_of(&results, &results.plan.studies[0], fig).is_empty());
    }

    #[test]
    fn the_model_of_a_line_counts_the_rails_it_uses_at_their_rates() {
        assert_eq!(testbed_model(&config("pair", 2, "2gbit")), Some(500.0));
        let mut one = config("one", 2, "2gbit");
        one.argv.extend(["--testbed-rails".to_string(), "1".to_string()]);
        assert_eq!(testbed_model(&one), Some(250.0));
        assert_eq!(testbed_model(&config("unequal", 2, "1gbit,3gbit")), Some(500.0));
        one.testbed.as_mut().unwrap().rate = "1gbit,3gbit".into();
        assert_eq!(testbed_model(&one), Some(125.0));
    }

    #[test]
    fn medians_per_size_over_rounds() {
        let m = medians(&[vec![(8, 3.0), (16, 1.0)], vec![(8, 1.0), (16, 2.0)], vec![(8, 2.0)]]);
        assert_eq!(m, vec![(8, 2.0), (16, 1.5)]);
    }
}
