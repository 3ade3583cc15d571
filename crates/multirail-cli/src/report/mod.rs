//! `multirail report`: re-runs the seed studies ([`plan`]) as child
//! `multirail bench ... --json` runs, records everything in
//! `DIR/results.json` ([`Results`]) and renders `DIR/index.html` and the
//! figures ([`html`]). `--from FILE` renders recorded results again.

pub mod html;
pub mod peers;
pub mod plan;

use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::child;
use crate::cli::ReportArgs;
use plan::{Plan, TestbedSpec};

/// Where and with what the numbers were made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineInfo {
    pub hostname: String,
    pub cpus: usize,
    #[serde(default)]
    pub cpu_model: String,
    #[serde(default)]
    pub kernel: String,
}

impl MachineInfo {
    pub fn this() -> MachineInfo {
        let m = multirail_perf::report::plot::Machine::this();
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_default();
        let kernel =
            std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default();
        MachineInfo { hostname: m.hostname, cpus: m.cpus, cpu_model, kernel }
    }
}

/// One child run: which line of which figure, its command, what it printed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub study: String,
    /// Index of the figure in its study, and of the configuration in it.
    pub figure: usize,
    pub config: usize,
    /// 1-based.
    pub round: u32,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// The JSON lines it printed (bench records, or bench cbr's ratios).
    pub records: Vec<serde_json::Value>,
    pub duration_s: f64,
    /// Why it has no records: its exit status and the end of its stderr,
    /// or why it did not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

/// Everything a report measured: `DIR/results.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub version: String,
    /// When it started, UTC: `2026-11-25 20:31:07 UTC`.
    pub date: String,
    pub machine: MachineInfo,
    /// The command line of the report itself.
    pub command: String,
    pub plan: Plan,
    pub runs: Vec<Run>,
    /// `--peers`: other tools on the same rails.
    #[serde(default)]
    pub peers: Vec<peers::PeerRun>,
    /// Things skipped and why (printed and shown on the page).
    pub notes: Vec<String>,
    pub duration_s: f64,
    /// Every planned run was made (false after Ctrl-C or while running).
    pub complete: bool,
}

/// `2026-11-25 20:31:07 UTC` from seconds since the epoch.
pub fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Days since 1970-01-01 to a civil date (proleptic Gregorian), by
    // eras of 400 years (146097 days).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem % 3600 / 60, rem % 60)
}

fn now_utc() -> String {
    utc(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()))
}

/// Writes results.json, index.html and the figures into `dir`.
pub fn write_all(dir: &Path, results: &Results) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(results).context("serialising the results")?;
    write(&dir.join("results.json"), &json)?;
    let page = html::render(results);
    for (name, svg) in &page.figures {
        write(&dir.join(name), svg)?;
    }
    write(&dir.join("index.html"), &page.html)
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    // Written whole under another name, then renamed: a reader (or
    // Ctrl-C) never sees half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// `multirail report`.
pub fn run(args: &ReportArgs) -> anyhow::Result<i32> {
    std::fs::create_dir_all(&args.out).with_context(|| format!("--out {}", args.out.display()))?;
    if let Some(from) = &args.from {
        let text = std::fs::read_to_string(from).with_context(|| format!("--from {}", from.display()))?;
        let results: Results = serde_json::from_str(&text)
            .with_context(|| format!("--from {}: not a report's results.json", from.display()))?;
        let page = html::render(&results);
        for (name, svg) in &page.figures {
            write(&args.out.join(name), svg)?;
        }
        write(&args.out.join("index.html"), &page.html)?;
        // The page's numbers go with it (unless they are already there).
        let dest = args.out.join("results.json");
        let same = std::fs::canonicalize(&dest).ok().is_some_and(|d| std::fs::canonicalize(from).ok() == Some(d));
        if !same {
            write(&dest, &text)?;
        }
        eprintln!("# report rendered from {} into {}", from.display(), args.out.join("index.html").display());
        return Ok(0);
    }
    measure(args)
}

/// A testbed the report brought up; taken down when dropped (also on an
/// error). Ctrl-C or a kill ends the report before that: a watcher
/// process (a shell that ignores SIGINT) takes it down once the report is
/// gone.
struct Testbed {
    prefix: String,
    watcher: Option<std::process::Child>,
}

/// The watcher's script: $1 the report's pid, $2 this executable, $3 the
/// prefix. It looks once a second, for at most a day.
const WATCHER: &str = "trap '' INT HUP; n=0; while [ $n -lt 86400 ] && kill -0 \"$1\" 2>/dev/null; do sleep 1; \
                       n=$((n+1)); done; exec \"$2\" testbed down --prefix \"$3\" >/dev/null 2>&1";

impl Testbed {
    fn up(prefix: &str, spec: &TestbedSpec) -> anyhow::Result<Testbed> {
        // A testbed left by an interrupted report goes first.
        let _ = child::run_env(&down_argv(prefix), &[]);
        child::checked_env(&spec.up_argv(prefix), &[])
            .with_context(|| format!("bringing up testbed {}", spec.describe()))?;
        let watcher = std::env::current_exe().ok().and_then(|exe| {
            std::process::Command::new("sh")
                .args(["-c", WATCHER, "multirail-report-watcher", &std::process::id().to_string()])
                .arg(exe)
                .arg(prefix)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .ok()
        });
        Ok(Testbed { prefix: prefix.into(), watcher })
    }
}

fn down_argv(prefix: &str) -> Vec<String> {
    ["testbed", "down", "--prefix", prefix].map(String::from).to_vec()
}

impl Drop for Testbed {
    fn drop(&mut self) {
        if let Some(mut w) = self.watcher.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        if let Err(e) = child::checked_env(&down_argv(&self.prefix), &[]) {
            eprintln!("multirail report: taking testbed '{}' down: {e:#}", self.prefix);
        }
    }
}

/// One planned child run.
#[derive(Debug, Clone, PartialEq)]
struct Job {
    study: usize,
    figure: usize,
    config: usize,
    round: u32,
}

/// Whether this binary's `testbed up` takes `--bus` (the multi-port setup).
fn testbed_has_bus() -> bool {
    child::run_env(&["testbed".into(), "up".into(), "--help".into()], &[])
        .map(|f| f.stdout.contains("--bus"))
        .unwrap_or(false)
}

/// The child runs of `plan` in the order they run. Rounds are interleaved
/// (round 1 of every configuration, then round 2, ...), so that a slow
/// spell of the machine does not fall on one line; with testbeds, the runs
/// that need the same one go together, in the order the testbeds are first
/// needed (a stable sort: rounds stay interleaved within a testbed).
fn jobs(plan: &Plan) -> Vec<Job> {
    let mut jobs = Vec::new();
    let most = plan.studies.iter().flat_map(|s| &s.figures).flat_map(|f| &f.configs).map(|c| c.rounds).max();
    for round in 1..=most.unwrap_or(0) {
        for (s, study) in plan.studies.iter().enumerate() {
            for (f, fig) in study.figures.iter().enumerate() {
                for (c, cfg) in fig.configs.iter().enumerate() {
                    if round <= cfg.rounds {
                        jobs.push(Job { study: s, figure: f, config: c, round });
                    }
                }
            }
        }
    }
    let spec_of = |j: &Job| plan.studies[j.study].figures[j.figure].configs[j.config].testbed.clone();
    let mut order: Vec<Option<TestbedSpec>> = Vec::new();
    for j in &jobs {
        let s = spec_of(j);
        if !order.contains(&s) {
            order.push(s);
        }
    }
    jobs.sort_by_key(|j| order.iter().position(|s| *s == spec_of(j)));
    jobs
}

fn measure(args: &ReportArgs) -> anyhow::Result<i32> {
    if args.testbed && not_root() {
        bail!("--testbed brings up emulated clusters with network namespaces: run it as root (sudo)");
    }
    let started = Instant::now();
    let plan = plan::plan(args);
    let mut notes = Vec::new();
    let wants_bus = plan
        .studies
        .iter()
        .flat_map(|s| &s.figures)
        .flat_map(|f| &f.configs)
        .any(|c| c.testbed.as_ref().is_some_and(|t| t.bus.is_some()));
    let bus = !wants_bus || testbed_has_bus();
    if !bus {
        notes.push(
            "multi-port half of the udapl study skipped: this multirail's `testbed up` has no --bus (rails sharing \
             one shaped bus)"
                .to_string(),
        );
    }
    if args.peers {
        notes.extend(peers::notes(args.testbed));
    }
    for n in &notes {
        eprintln!("# {n}");
    }
    let jobs = jobs(&plan);
    let mut results = Results {
        version: env!("CARGO_PKG_VERSION").into(),
        date: now_utc(),
        machine: MachineInfo::this(),
        command: std::env::args()
            .map(|a| if a.contains(' ') { format!("'{a}'") } else { a })
            .collect::<Vec<_>>()
            .join(" "),
        plan: plan.clone(),
        runs: Vec::new(),
        peers: Vec::new(),
        notes,
        duration_s: 0.0,
        complete: false,
    };
    // The plan is on disk before anything runs.
    write_all(&args.out, &results)?;
    let bar = ProgressBar::new(jobs.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} runs  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut testbed: Option<(TestbedSpec, Result<Testbed, String>)> = None;
    for job in &jobs {
        let study = &plan.studies[job.study];
        let fig = &study.figures[job.figure];
        let cfg = &fig.configs[job.config];
        bar.set_message(format!("{}: {} / {} (round {})", study.id, fig.title, cfg.label, job.round));
        let mut run = Run {
            study: study.id.clone(),
            figure: job.figure,
            config: job.config,
            round: job.round,
            argv: cfg.argv.clone(),
            env: cfg.env.clone(),
            records: Vec::new(),
            duration_s: 0.0,
            failed: None,
        };
        let t0 = Instant::now();
        let ready = match &cfg.testbed {
            Some(spec) if spec.bus.is_some() && !bus => Err("skipped: `testbed up` has no --bus".to_string()),
            Some(spec) => {
                if testbed.as_ref().is_none_or(|(s, _)| s != spec) {
                    drop(testbed.take()); // the old one goes down first
                    bar.set_message(format!("testbed up {}", spec.describe()));
                    testbed = Some((spec.clone(), Testbed::up(&args.prefix, spec).map_err(|e| format!("{e:#}"))));
                    let is_up = testbed.as_ref().is_some_and(|t| t.1.is_ok());
                    let jobs =
                        if is_up && args.peers { peers::jobs(&plan, spec, peers::Tool::installed) } else { vec![] };
                    for job in &jobs {
                        let name = format!("{}{} {}", job.tool.name(), job.rails.suffix(), job.metric.test());
                        bar.set_message(format!("{name} on {}", spec.describe()));
                        let p = peers::run(job, &args.prefix, spec, args.quick);
                        if let Some(why) = &p.failed {
                            bar.println(format!("# {name} on {} failed: {why}", spec.describe()));
                        }
                        results.peers.push(p);
                        write_all(&args.out, &results)?;
                    }
                }
                match testbed.as_ref().map(|t| &t.1) {
                    Some(Err(e)) => Err(e.clone()),
                    _ => Ok(()),
                }
            }
            None => Ok(()),
        };
        match ready {
            Err(why) => run.failed = Some(why),
            Ok(()) => match child::run_env(&cfg.argv, &cfg.env) {
                Err(e) => run.failed = Some(format!("{e:#}")),
                Ok(f) => {
                    run.records = f.stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
                    if f.code != 0 || run.records.is_empty() {
                        let tail: Vec<&str> = f.stderr.lines().rev().take(8).collect();
                        let tail: Vec<&str> = tail.into_iter().rev().collect();
                        run.failed = Some(format!("exit {}: {}", f.code, tail.join("\n")));
                    }
                }
            },
        }
        run.duration_s = t0.elapsed().as_secs_f64();
        if let Some(why) = &run.failed {
            bar.println(format!("# failed: {} / {}: {}", study.id, cfg.label, why.lines().last().unwrap_or("")));
        }
        results.runs.push(run);
        results.duration_s = started.elapsed().as_secs_f64();
        write_all(&args.out, &results)?;
        bar.inc(1);
    }
    drop(testbed);
    bar.finish_and_clear();
    results.complete = true;
    results.duration_s = started.elapsed().as_secs_f64();
    write_all(&args.out, &results)?;
    let failed = results.runs.iter().filter(|r| r.failed.is_some()).count();
    eprintln!(
        "# report: {} runs ({failed} failed) in {:.0} s: {}",
        results.runs.len(),
        results.duration_s,
        args.out.join("index.html").display()
    );
    Ok(0)
}

/// Whether this process lacks root (from /proc/self/status: no unsafe
/// code in this crate).
fn not_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(2));
    euid.is_some_and(|u| u != "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_interleave_and_testbeds_group() {
        let parse = |extra: &[&str]| plan::plan(&plan::test_args(&[&["--study", "fdr-edr"], extra].concat()));
        let short = |js: &[Job]| js.iter().map(|j| (j.figure, j.config, j.round)).collect::<Vec<_>>();
        // Loopback: round 1 of every line, then round 2, then round 3.
        let js = jobs(&parse(&[]));
        assert_eq!(js.len(), 18);
        assert_eq!(short(&js[..7]), [(0, 0, 1), (0, 1, 1), (1, 0, 1), (1, 1, 1), (2, 0, 1), (2, 1, 1), (0, 0, 2)]);
        // Testbeds: every run on the slower set (config 0), then the faster.
        let js = jobs(&parse(&["--testbed"]));
        assert!(js[..9].iter().all(|j| j.config == 0) && js[9..].iter().all(|j| j.config == 1));
        assert_eq!(short(&js[..4]), [(0, 0, 1), (1, 0, 1), (2, 0, 1), (0, 0, 2)]);
    }

    #[test]
    fn dates_are_utc_civil_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_795_638_667), "2026-11-25 20:31:07 UTC");
    }
}
