//! `report --peers`: other tools measured on the same rails, as extra
//! lines of the figures ([`jobs`] decides which, from the plan). iperf3:
//! one TCP stream per rail, all rails at once (and `--bidir` where a figure
//! shows bibw), inside the namespaces of the testbed the report brought up
//! (server in host1, client in host0, each bound to its rail's address).
//! UCX: `ucx_perftest -t tag_bw` and `-t tag_lat` (UCX_TLS=tcp) per message
//! size, server in host1, client in host0. Open MPI: `bench/mpi/mr_bw`
//! (`-b` for bibw), `mr_pingpong` and `mr_mbw_mr` under mpirun across the
//! two hosts, ob1 with the tcp BTL. Every figure gets the peers over all
//! its rails; the figures of the `peers` study also get Open MPI's and
//! UCX's rail variants (rail0 only, `btl_tcp_links=2`, bandwidth hints) and
//! Open MPI's multi-pair rate: what `bench/compare.sh` measured before it
//! became a wrapper of `report --study peers`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use super::plan::{Metric, Plan, TestbedSpec};
use crate::child;

/// One peer measurement on one testbed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerRun {
    /// `iperf3`.
    pub tool: String,
    /// Which figures it belongs to: bw (the default, also in results of
    /// older versions) or latency.
    #[serde(default = "bw")]
    pub metric: Metric,
    pub testbed: TestbedSpec,
    /// What was measured, for the page.
    pub what: String,
    /// The command lines, as run.
    pub commands: Vec<String>,
    /// Received MB/s of each rail's stream, and their sum.
    pub per_rail: Vec<f64>,
    pub total: Option<f64>,
    /// Per message size (tools that have one, as UCX's tag_bw), MB/s.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub points: Vec<(u64, f64)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// Which rails it used and how it was told about them.
    #[serde(default)]
    pub rails: PeerRails,
    /// Drawn only in this study's figures (the variants of the `peers`
    /// study); none: in every figure of its metric on its testbed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub study: Option<String>,
}

fn bw() -> Metric {
    Metric::Bw
}

/// The rails a peer runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerRails {
    /// Every rail of the testbed (the tool's own multi-rail defaults).
    #[default]
    All,
    /// rail0 alone.
    First,
    /// Open MPI: every rail, two TCP connections per rail (btl_tcp_links=2).
    Links2,
    /// Open MPI: every rail, told each rail's rate (btl_tcp_bandwidth_railN).
    Hints,
    /// Open MPI: every rail, the default btl_tcp_flags without `put` (no
    /// RDMA-style pipeline for large messages: sends only).
    NoPut,
}

impl PeerRails {
    /// What the label of its line adds: `, rail0 only`.
    pub fn suffix(self) -> &'static str {
        match self {
            PeerRails::All => "",
            PeerRails::First => ", rail0 only",
            PeerRails::Links2 => ", btl_tcp_links=2",
            PeerRails::Hints => ", bandwidth hints",
            PeerRails::NoPut => ", send-only (no put)",
        }
    }
}

/// A peer tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    Iperf3,
    Ompi,
    Ucx,
}

impl Tool {
    /// Whether it is installed (on PATH).
    pub fn installed(self) -> bool {
        match self {
            Tool::Iperf3 => which("iperf3").is_some(),
            Tool::Ompi => which("mpirun").is_some() && which("mpicc").is_some(),
            Tool::Ucx => which("ucx_perftest").is_some(),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Tool::Iperf3 => "iperf3",
            Tool::Ompi => "Open MPI",
            Tool::Ucx => "ucx_perftest",
        }
    }
}

/// One peer measurement the report makes on a testbed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerJob {
    pub tool: Tool,
    pub metric: Metric,
    pub rails: PeerRails,
    pub study: Option<String>,
}

/// The study whose figures get the peers' rail variants.
pub const STUDY: &str = "peers";

/// The peer runs of testbed `spec` for `plan`, in the order they run,
/// for the tools `installed` says are there. On every testbed iperf3 (the
/// practical limit), `--bidir` too when a figure on it shows bibw; per
/// metric a figure on it shows (bw, bibw, latency), Open MPI and UCX (no
/// bibw test) over all rails. For the figures of the `peers` study also:
/// Open MPI and UCX on rail0 only (bw, latency; Open MPI bibw too), Open
/// MPI with btl_tcp_links=2 and with bandwidth hints (bw), send-only (bw,
/// bibw), Open MPI's mr_mbw_mr (mbw_mr).
pub fn jobs(plan: &Plan, spec: &TestbedSpec, installed: impl Fn(Tool) -> bool) -> Vec<PeerJob> {
    let shows = |metric: Metric, study: Option<&str>| {
        plan.studies
            .iter()
            .filter(|s| study.is_none_or(|id| s.id == id))
            .flat_map(|s| &s.figures)
            .filter(|f| f.metric == metric)
            .any(|f| f.configs.iter().any(|c| c.testbed.as_ref() == Some(spec)))
    };
    let mut out = Vec::new();
    let mut add = |tool: Tool, metric: Metric, rails: PeerRails, study: Option<&str>| {
        if installed(tool) {
            out.push(PeerJob { tool, metric, rails, study: study.map(String::from) });
        }
    };
    add(Tool::Iperf3, Metric::Bw, PeerRails::All, None);
    if shows(Metric::Bibw, None) {
        add(Tool::Iperf3, Metric::Bibw, PeerRails::All, None);
    }
    for metric in [Metric::Bw, Metric::Bibw, Metric::Latency] {
        if shows(metric, None) {
            add(Tool::Ompi, metric, PeerRails::All, None);
            if metric != Metric::Bibw {
                add(Tool::Ucx, metric, PeerRails::All, None);
            }
        }
    }
    let peers = Some(STUDY);
    for metric in [Metric::Bw, Metric::Latency] {
        if shows(metric, peers) {
            add(Tool::Ompi, metric, PeerRails::First, peers);
            add(Tool::Ucx, metric, PeerRails::First, peers);
        }
    }
    if shows(Metric::Bw, peers) {
        add(Tool::Ompi, Metric::Bw, PeerRails::Links2, peers);
        add(Tool::Ompi, Metric::Bw, PeerRails::Hints, peers);
        add(Tool::Ompi, Metric::Bw, PeerRails::NoPut, peers);
    }
    if shows(Metric::Bibw, peers) {
        add(Tool::Ompi, Metric::Bibw, PeerRails::First, peers);
        add(Tool::Ompi, Metric::Bibw, PeerRails::NoPut, peers);
    }
    if shows(Metric::MbwMr, peers) {
        add(Tool::Ompi, Metric::MbwMr, PeerRails::All, peers);
    }
    out
}

/// Measures `job` on testbed `prefix` (described by `spec`).
pub fn run(job: &PeerJob, prefix: &str, spec: &TestbedSpec, quick: bool) -> PeerRun {
    let mut r = match job.tool {
        Tool::Iperf3 => iperf3(prefix, spec, if quick { 2 } else { 5 }, job.metric == Metric::Bibw),
        Tool::Ucx => ucx(prefix, spec, quick, job.metric, job.rails),
        Tool::Ompi => ompi(prefix, spec, quick, job.metric, job.rails),
    };
    r.study = job.study.clone();
    r
}

impl PeerRun {
    /// A run of `tool` on testbed `spec`, filled by `fill`; its error
    /// is kept in `failed` (the report goes on).
    fn measure(
        tool: &str,
        metric: Metric,
        rails: PeerRails,
        spec: &TestbedSpec,
        what: String,
        fill: impl FnOnce(&mut PeerRun) -> anyhow::Result<()>,
    ) -> PeerRun {
        let mut run = PeerRun {
            tool: tool.into(),
            metric,
            testbed: spec.clone(),
            what,
            commands: vec![],
            per_rail: vec![],
            total: None,
            points: vec![],
            failed: None,
            rails,
            study: None,
        };
        if let Err(e) = fill(&mut run) {
            run.failed = Some(format!("{e:#}"));
        }
        run
    }
}

/// Where `tool` is on PATH.
pub fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(tool)).find(|f| f.is_file()))
}

/// The lines `--peers` prints and puts on the page before measuring.
pub fn notes(testbed: bool) -> Vec<String> {
    let what = [
        (Tool::Iperf3, "iperf3", "one TCP stream per rail, all rails at once (and --bidir where a figure shows bibw)"),
        (Tool::Ucx, "ucx_perftest", "tag_bw and tag_lat per size, UCX_TLS=tcp"),
        (Tool::Ompi, "mpirun", "bench/mpi/mr_bw (-b for bibw), mr_pingpong and mr_mbw_mr, ob1 + tcp BTL"),
    ];
    what.into_iter()
        .map(|(tool, exe, how)| match (tool.installed(), testbed) {
            (false, _) if tool == Tool::Ompi => {
                "--peers: Open MPI (mpirun and mpicc) is not installed: skipped".to_string()
            }
            (false, _) => format!("--peers: {exe} is not installed: skipped"),
            (true, false) => format!(
                "--peers: {} skipped: it runs between testbed hosts (one address per rail), and there is no --testbed",
                tool.name()
            ),
            (true, true) => format!(
                "--peers: {} ({}) measured once per testbed: {how}",
                tool.name(),
                which(exe).map(|p| p.display().to_string()).unwrap_or_default()
            ),
        })
        .collect()
}

/// host0's and host1's namespaces and, per rail, its address in each.
struct Hosts {
    ns0: String,
    ns1: String,
    rails: Vec<(String, String)>,
}

/// The hosts of testbed `prefix`, from `multirail testbed status --json`.
fn addresses(prefix: &str) -> anyhow::Result<Hosts> {
    let argv: Vec<String> = ["testbed", "status", "--prefix", prefix, "--json"].map(String::from).to_vec();
    let out = child::checked_env(&argv, &[])?;
    let v: serde_json::Value = serde_json::from_str(out.trim()).context("reading testbed status --json")?;
    let host = |i: usize| &v["hosts"][i];
    let ns = |i: usize| host(i)["netns"].as_str().map(String::from).context("no netns in testbed status");
    let rails = |i: usize| -> Vec<String> {
        host(i)["rails"]
            .as_array()
            .map_or(vec![], |a| a.iter().filter_map(|r| r["addr"].as_str().map(String::from)).collect())
    };
    let (a, b) = (rails(0), rails(1));
    if a.is_empty() || a.len() != b.len() {
        bail!("testbed status: host0 has {} rail addresses, host1 {}", a.len(), b.len());
    }
    Ok(Hosts { ns0: ns(0)?, ns1: ns(1)?, rails: a.into_iter().zip(b).collect() })
}

/// Waits for `c` at most `limit`; kills it after that. Its stdout.
fn wait(mut c: Child, limit: Duration) -> anyhow::Result<String> {
    let end = Instant::now() + limit;
    loop {
        if let Some(st) = c.try_wait()? {
            let out = c.wait_with_output()?;
            if !st.success() {
                bail!("exit {st}: {}", String::from_utf8_lossy(&out.stderr).trim());
            }
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        if Instant::now() > end {
            let _ = c.kill();
            let _ = c.wait();
            bail!("still running after {limit:?}: killed");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether something listens on `port` in namespace `ns` (`ss`).
fn listening(ns: &str, port: u16) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns, "ss", "-Hltn", &format!("sport = :{port}")])
        .output()
        .is_ok_and(|o| !o.stdout.is_empty())
}

/// Starts `argv` with stdin closed and stderr captured; stdout captured
/// too, or dropped.
fn spawn(argv: &[String], stdout: bool, what: &str) -> anyhow::Result<Child> {
    Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(if stdout { Stdio::piped() } else { Stdio::null() })
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {what}"))
}

/// The received rate of an iperf3 `-J` report, MB/s; with `--bidir`
/// (`bidir`), both directions' received rates added.
pub fn iperf3_rate(json: &str, bidir: bool) -> anyhow::Result<f64> {
    let v: serde_json::Value = serde_json::from_str(json).context("reading iperf3 -J")?;
    let mut bits = v["end"]["sum_received"]["bits_per_second"].as_f64().context("no end.sum_received in iperf3 -J")?;
    if bidir {
        bits += v["end"]["sum_received_bidir_reverse"]["bits_per_second"]
            .as_f64()
            .context("no end.sum_received_bidir_reverse in iperf3 -J (--bidir needs iperf3 3.7 or later)")?;
    }
    Ok(bits / 8.0 / 1e6)
}

const PORT: u16 = 5201;

/// iperf3 on the testbed `prefix` (described by `spec`): one stream per
/// rail for `secs` seconds, all at once; with `bidir`, each stream both
/// ways at once (`--bidir`, for the bibw figures).
pub fn iperf3(prefix: &str, spec: &TestbedSpec, secs: u32, bidir: bool) -> PeerRun {
    let (metric, how) = if bidir { (Metric::Bibw, " --bidir (both directions counted)") } else { (Metric::Bw, "") };
    PeerRun::measure(
        "iperf3",
        metric,
        PeerRails::All,
        spec,
        format!("iperf3{how}, {} TCP stream(s), one per rail, {secs} s", spec.rails),
        |run| iperf3_into(run, prefix, secs, bidir),
    )
}

fn iperf3_into(run: &mut PeerRun, prefix: &str, secs: u32, bidir: bool) -> anyhow::Result<()> {
    let Hosts { ns0, ns1, rails } = addresses(prefix)?;
    let show = |v: &[String]| v.join(" ");
    let mut servers = Vec::new();
    for (r, (_, a1)) in rails.iter().enumerate() {
        let port = (PORT + r as u16).to_string();
        let argv: Vec<String> =
            ["ip", "netns", "exec", &ns1, "iperf3", "-s", "-1", "-B", a1, "-p", &port].map(String::from).to_vec();
        run.commands.push(show(&argv));
        let c = spawn(&argv, false, "iperf3 -s")?;
        servers.push(c);
    }
    let result = (|| -> anyhow::Result<()> {
        for r in 0..rails.len() {
            let port = PORT + r as u16;
            let t = Instant::now();
            while !listening(&ns1, port) {
                if t.elapsed() > Duration::from_secs(5) {
                    bail!("iperf3 -s on port {port} in {ns1} not listening after 5 s");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let mut clients = Vec::new();
        for (r, (a0, a1)) in rails.iter().enumerate() {
            let port = (PORT + r as u16).to_string();
            let t = secs.to_string();
            let mut argv: Vec<String> =
                ["ip", "netns", "exec", &ns0, "iperf3", "-c", a1, "-B", a0, "-p", &port, "-t", &t, "-J"]
                    .map(String::from)
                    .to_vec();
            if bidir {
                argv.push("--bidir".into());
            }
            run.commands.push(show(&argv));
            clients.push(spawn(&argv, true, "iperf3 -c")?);
        }
        let limit = Duration::from_secs(u64::from(secs) + 20);
        for (r, c) in clients.into_iter().enumerate() {
            let out = wait(c, limit).with_context(|| format!("iperf3 -c on rail {r}"))?;
            run.per_rail.push(iperf3_rate(&out, bidir).with_context(|| format!("rail {r}"))?);
        }
        run.total = Some(run.per_rail.iter().sum());
        Ok(())
    })();
    for mut s in servers {
        // A server whose client never came would wait for ever.
        if result.is_err() {
            let _ = s.kill();
        }
        let _ = wait(s, Duration::from_secs(10));
    }
    result
}

/// Sizes of the UCX runs, and the messages sent at each: about 128 MiB
/// (512 MiB without --quick) per size, at least 64 and at most 1280
/// messages above 16 KiB, 20000 at and below (a window of tiny messages
/// goes by in microseconds). Bandwidth without --quick adds the small
/// sizes of issue 9's message-rate table (1 B to 16 KiB).
pub fn ucx_sizes(quick: bool, metric: Metric) -> Vec<(u64, u64)> {
    let (sizes, budget): (&[u64], u64) = if quick {
        (&[8, 64 << 10, 1 << 20], 128 << 20)
    } else if metric == Metric::Bw {
        (&[1, 8, 64, 512, 1 << 10, 2 << 10, 4 << 10, 8 << 10, 16 << 10, 64 << 10, 1 << 20, 4 << 20], 512 << 20)
    } else {
        (&[8, 1 << 10, 64 << 10, 1 << 20, 4 << 20], 512 << 20)
    };
    let most = |s: u64| {
        if s <= 16 << 10 {
            20_000
        } else if quick {
            320
        } else {
            1280
        }
    };
    sizes.iter().map(|&s| (s, (budget / s).clamp(64, most(s)))).collect()
}

/// The overall bandwidth of a `ucx_perftest -f` report, MB/s (it prints
/// MiB/s): the 6th number of its last line of numbers.
pub fn ucx_rate(out: &str) -> anyhow::Result<f64> {
    let row = out
        .lines()
        .rev()
        .map(|l| l.split_whitespace().filter_map(|w| w.parse::<f64>().ok()).collect::<Vec<_>>())
        .find(|n| n.len() == 8)
        .context("no result line in ucx_perftest's output")?;
    Ok(row[5] * 1_048_576.0 / 1e6)
}

const UCX_PORT: u16 = 13400;

/// The one-way latency of a `ucx_perftest -t tag_lat -f` report, µs: the
/// 4th number (overall) of its last line of numbers.
pub fn ucx_latency(out: &str) -> anyhow::Result<f64> {
    let row = out
        .lines()
        .rev()
        .map(|l| l.split_whitespace().filter_map(|w| w.parse::<f64>().ok()).collect::<Vec<_>>())
        .find(|n| n.len() == 8)
        .context("no result line in ucx_perftest's output")?;
    Ok(row[3])
}

/// `ucx_perftest -t tag_bw` (bw) or `-t tag_lat` (latency) per size on
/// testbed `prefix`, over all its rails or rail0 alone.
pub fn ucx(prefix: &str, spec: &TestbedSpec, quick: bool, metric: Metric, rails: PeerRails) -> PeerRun {
    let test = if metric == Metric::Latency { "tag_lat" } else { "tag_bw" };
    let over = if rails == PeerRails::First {
        "rail0 only (UCX_NET_DEVICES=rail0)".to_string()
    } else {
        format!("{} rail(s), UCX_MAX_RNDV_RAILS={}", spec.rails, spec.rails)
    };
    PeerRun::measure("ucx_perftest", metric, rails, spec, format!("UCX {test}, UCX_TLS=tcp over {over}"), |run| {
        ucx_into(run, prefix, quick)
    })
}

fn ucx_into(run: &mut PeerRun, prefix: &str, quick: bool) -> anyhow::Result<()> {
    let Hosts { ns0, ns1, rails } = addresses(prefix)?;
    let used = if run.rails == PeerRails::First { 1 } else { rails.len() };
    let devices: Vec<String> = (0..used).map(|r| format!("rail{r}")).collect();
    let mut env: Vec<String> =
        vec!["env".into(), "UCX_TLS=tcp".into(), format!("UCX_NET_DEVICES={}", devices.join(","))];
    if used > 1 {
        env.push(format!("UCX_MAX_RNDV_RAILS={used}"));
    }
    let latency = run.metric == Metric::Latency;
    let test = if latency { "tag_lat" } else { "tag_bw" };
    for (k, (size, n)) in ucx_sizes(quick, run.metric).into_iter().enumerate() {
        // Round trips are cheap: as many as OSU's latency test makes.
        let n = if latency { if quick { 100 } else { 1000 } } else { n };
        let port = (UCX_PORT + k as u16).to_string();
        let mut server: Vec<String> = ["ip", "netns", "exec", &ns1].map(String::from).to_vec();
        server.extend(env.iter().cloned());
        server.extend(["ucx_perftest".into(), "-p".into(), port.clone()]);
        let mut client: Vec<String> = ["ip", "netns", "exec", &ns0].map(String::from).to_vec();
        client.extend(env.iter().cloned());
        client.extend(
            ["ucx_perftest", &rails[0].1, "-p", &port, "-t", test, "-s", &size.to_string(), "-n", &n.to_string()]
                .map(String::from),
        );
        client.extend(["-w".into(), (n / 5).max(1).to_string(), "-f".into()]);
        run.commands.push(format!("server: {}", server.join(" ")));
        run.commands.push(format!("client: {}", client.join(" ")));
        let s = spawn(&server, false, "ucx_perftest (server)")?;
        let t = Instant::now();
        let port_n = UCX_PORT + k as u16;
        let mut ready = true;
        while !listening(&ns1, port_n) {
            if t.elapsed() > Duration::from_secs(5) {
                ready = false;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let result = if ready {
            spawn(&client, true, "ucx_perftest (client)")
                .and_then(|c| wait(c, Duration::from_secs(90)))
                .and_then(|out| if latency { ucx_latency(&out) } else { ucx_rate(&out) })
        } else {
            Err(anyhow::anyhow!("ucx_perftest server not listening on port {port_n} after 5 s"))
        };
        let mut s = s;
        if result.is_err() {
            let _ = s.kill();
        }
        let _ = wait(s, Duration::from_secs(10));
        run.points.push((size, result.with_context(|| format!("size {size}"))?));
    }
    run.total = run.points.last().map(|p| p.1);
    Ok(())
}

/// `bench/` of the source tree this executable was built from.
fn bench_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench"))
}

/// The OSU-style `SIZE VALUE [MESSAGES/S]` lines of mr_bw's, mr_pingpong's
/// or mr_mbw_mr's output. With a messages/s column (mr_bw -m, mr_mbw_mr),
/// MB/s comes from it: its digits survive at 1 B, where MB/s has two.
pub fn osu_points(out: &str) -> Vec<(u64, f64)> {
    out.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let size: u64 = w.first()?.parse().ok()?;
            match w[1..] {
                [v] => Some((size, v.parse().ok()?)),
                [_, m] => Some((size, size as f64 * m.parse::<f64>().ok()? / 1e6)),
                _ => None,
            }
        })
        .collect()
}

/// Every rail's rate in Mbit/s for btl_tcp_bandwidth_railN, from the
/// testbed's `--rate` (one rate for all rails, or one per rail).
pub fn mbit_per_rail(spec: &TestbedSpec) -> anyhow::Result<Vec<u64>> {
    let rates: Vec<&str> = spec.rate.split(',').collect();
    (0..spec.rails)
        .map(|r| {
            let text = if rates.len() == 1 { rates[0] } else { rates.get(r).copied().unwrap_or_default() };
            let bytes = multirail_perf::model::parse_rate(text)?;
            Ok((bytes * 8.0 / 1e6).round() as u64)
        })
        .collect()
}

/// The MCA parameters that pick the rails of an Open MPI run.
pub fn ompi_rails(spec: &TestbedSpec, rails: PeerRails) -> anyhow::Result<Vec<(String, String)>> {
    let all: Vec<String> = (0..spec.rails).map(|r| format!("rail{r}")).collect();
    let mut mca = vec![(
        "btl_tcp_if_include".to_string(),
        if rails == PeerRails::First { "rail0".into() } else { all.join(",") },
    )];
    match rails {
        PeerRails::All | PeerRails::First => {}
        PeerRails::Links2 => mca.push(("btl_tcp_links".into(), "2".into())),
        // Open MPI 4.1's default btl_tcp_flags, without put.
        PeerRails::NoPut => mca.push(("btl_tcp_flags".into(), "send,inplace,need-ack,need-csum,hetero-rdma".into())),
        PeerRails::Hints => {
            for (r, m) in mbit_per_rail(spec)?.into_iter().enumerate() {
                mca.push((format!("btl_tcp_bandwidth_rail{r}"), m.to_string()));
            }
        }
    }
    Ok(mca)
}

/// The program, its arguments and the ranks per host of an Open MPI run of
/// `metric`. mbw_mr: 2 pairs, ranks 0-1 in host0 sending to ranks 2-3 in
/// host1, at [`super::plan::MBW_SIZES`].
fn ompi_program(metric: Metric, quick: bool) -> (&'static str, Vec<String>, usize) {
    let a = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    match (metric, quick) {
        // mr_pingpong's own counts (OSU's) without --quick.
        (Metric::Latency, true) => ("mr_pingpong", a(&["-s", "8,64K,1M", "-i", "100", "-w", "10"]), 1),
        (Metric::Latency, false) => ("mr_pingpong", a(&["-s", "1:4M"]), 1),
        (Metric::MbwMr, true) => ("mr_mbw_mr", a(&["-p", "2", "-s", super::plan::MBW_QUICK, "-i", "5", "-w", "1"]), 2),
        (Metric::MbwMr, false) => ("mr_mbw_mr", a(&["-p", "2", "-s", super::plan::MBW_SIZES]), 2),
        (m, quick) => {
            let mut v = if m == Metric::Bibw { a(&["-b"]) } else { vec![] };
            v.extend(a(if quick {
                &["-m", "-s", "8,64K,1M", "-i", "5", "-w", "1", "-W", "64"]
            } else {
                &["-m", "-s", "1:4M", "-i", "20", "-w", "2", "-W", "64"]
            }));
            ("mr_bw", v, 1)
        }
    }
}

/// Open MPI's `mr_bw` (bw; `-b` for bibw), `mr_pingpong` (latency) or
/// `mr_mbw_mr` (mbw_mr), ob1 + tcp BTL over `rails`, on testbed `prefix`.
pub fn ompi(prefix: &str, spec: &TestbedSpec, quick: bool, metric: Metric, rails: PeerRails) -> PeerRun {
    let (name, _, per_host) = ompi_program(metric, quick);
    let over = if rails == PeerRails::First { "rail0 only".to_string() } else { format!("{} rail(s)", spec.rails) };
    let how = match rails {
        PeerRails::Links2 => ", btl_tcp_links=2",
        PeerRails::Hints => ", btl_tcp_bandwidth_railN = each rail's rate",
        PeerRails::NoPut => ", btl_tcp_flags without put (send-only)",
        _ => "",
    };
    let what = match metric {
        Metric::Bibw => format!("Open MPI bench/mpi/mr_bw -b, ob1 + tcp BTL over {over}{how}, window 64"),
        Metric::Bw => format!("Open MPI bench/mpi/mr_bw, ob1 + tcp BTL over {over}{how}, window 64"),
        Metric::MbwMr => format!(
            "Open MPI bench/mpi/mr_mbw_mr, {per_host} pairs (ranks 0-{} in host0 send to host1), ob1 + tcp BTL \
             over {over}{how}, window 64",
            per_host - 1
        ),
        _ => format!("Open MPI bench/mpi/{name}, ob1 + tcp BTL over {over}{how}"),
    };
    PeerRun::measure("Open MPI", metric, rails, spec, what, |run| ompi_into(run, spec, prefix, quick))
}

fn ompi_into(run: &mut PeerRun, spec: &TestbedSpec, prefix: &str, quick: bool) -> anyhow::Result<()> {
    let bench = bench_dir();
    let (name, args, per_host) = ompi_program(run.metric, quick);
    let (src, agent) = (bench.join(format!("mpi/{name}.c")), bench.join("lib/netns-agent"));
    if !src.is_file() || !agent.is_file() {
        bail!("{} or {} not found: this multirail was not built from a source tree", src.display(), agent.display());
    }
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let dir = exe.parent().context("no directory of this executable")?.join("report-mpi");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let prog = dir.join(name);
    let build = ["mpicc", "-O2", "-o", &prog.to_string_lossy(), &src.to_string_lossy()].map(String::from).to_vec();
    run.commands.push(build.join(" "));
    let out = Command::new(&build[0]).args(&build[1..]).stdin(Stdio::null()).output().context("starting mpicc")?;
    if !out.status.success() {
        bail!("mpicc failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let Hosts { ns0, rails, .. } = addresses(prefix)?;
    let p = prog.to_string_lossy().into_owned();
    let mut argv: Vec<String> = vec!["env".into(), format!("MR_NETNS_PREFIX={prefix}"), "ip".into(), "netns".into()];
    argv.extend(["exec".into(), ns0, "mpirun".into(), "--allow-run-as-root".into(), "--bind-to".into(), "none".into()]);
    let mut mca: Vec<(String, String)> = vec![
        ("plm_rsh_agent".into(), agent.to_string_lossy().into_owned()),
        ("oob_tcp_if_include".into(), "rail0".into()),
        ("pml".into(), "ob1".into()),
        ("btl".into(), "tcp,self".into()),
    ];
    mca.extend(ompi_rails(spec, run.rails)?);
    if per_host > 1 {
        // More ranks than this machine may have CPUs: busy-polling ranks
        // yield, as Open MPI does itself when it knows it is oversubscribed.
        mca.push(("mpi_yield_when_idle".into(), "1".into()));
    }
    for (k, v) in mca {
        argv.extend(["--mca".into(), k, v]);
    }
    for host in [&rails[0].0, &rails[0].1] {
        if host != &rails[0].0 {
            argv.push(":".into());
        }
        let h = if per_host > 1 { format!("{host}:{per_host}") } else { host.clone() };
        argv.extend(["-np".into(), per_host.to_string(), "-H".into(), h, p.clone()]);
        argv.extend(args.iter().cloned());
    }
    run.commands.push(argv.join(" "));
    let c = spawn(&argv, true, "mpirun")?;
    let out = wait(c, Duration::from_secs(300)).with_context(|| format!("mpirun {name}"))?;
    run.points = osu_points(&out);
    if run.points.is_empty() {
        bail!("no results in {name}'s output");
    }
    run.total = run.points.last().map(|p| p.1);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iperf3_json_gives_received_megabytes() {
        let j = r#"{"start":{},"end":{"sum_sent":{"bits_per_second":2.1e9},"sum_received":{"bits_per_second":2.0e9}}}"#;
        assert_eq!(iperf3_rate(j, false).unwrap(), 250.0);
        assert!(iperf3_rate(j, true).is_err(), "no reverse direction in a one-way report");
        assert!(iperf3_rate(r#"{"error":"unable to connect"}"#, false).is_err());
        let b = r#"{"end":{"sum_received":{"bits_per_second":1.6e9},"sum_received_bidir_reverse":{"bits_per_second":1.2e9}}}"#;
        assert_eq!(iperf3_rate(b, true).unwrap(), 350.0);
    }

    #[test]
    fn mr_bw_output_in_points() {
        let out = "# rank 0: host vm\n# Size      Bandwidth (MB/s)\n8                       0.95\n65536   337.13\n1048576 329.73\n";
        assert_eq!(osu_points(out), vec![(8, 0.95), (65536, 337.13), (1 << 20, 329.73)]);
        // -m (and mr_mbw_mr): MB/s from the messages/s column.
        let m = "# Size  Bandwidth (MB/s)  Messages/s\n1   0.12   123456.78\n8 0.95 118750.00 extra\n";
        assert_eq!(osu_points(m), vec![(1, 0.12345678)]);
    }

    #[test]
    fn open_mpi_is_told_its_rails() {
        let spec = |rate: &str| TestbedSpec { rails: 2, rate: rate.into(), bus: None };
        let kv = |v: Vec<(String, String)>| v.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
        let two = spec("2gbit");
        assert_eq!(kv(ompi_rails(&two, PeerRails::All).unwrap()), "btl_tcp_if_include=rail0,rail1");
        assert_eq!(kv(ompi_rails(&two, PeerRails::First).unwrap()), "btl_tcp_if_include=rail0");
        assert_eq!(kv(ompi_rails(&two, PeerRails::Links2).unwrap()), "btl_tcp_if_include=rail0,rail1 btl_tcp_links=2");
        assert_eq!(
            kv(ompi_rails(&spec("1gbit,3gbit"), PeerRails::Hints).unwrap()),
            "btl_tcp_if_include=rail0,rail1 btl_tcp_bandwidth_rail0=1000 btl_tcp_bandwidth_rail1=3000"
        );
        assert_eq!(mbit_per_rail(&spec("3500mbit")).unwrap(), [3500, 3500]);
        assert!(mbit_per_rail(&spec("fast")).is_err());
        let (prog, args, per_host) = ompi_program(Metric::MbwMr, false);
        assert_eq!((prog, args.join(" "), per_host), ("mr_mbw_mr", "-p 2 -s 8,512,4K,64K,1M".to_string(), 2));
        let (prog, args, _) = ompi_program(Metric::Bibw, true);
        assert_eq!((prog, args.join(" ").as_str()), ("mr_bw", "-b -m -s 8,64K,1M -i 5 -w 1 -W 64"));
    }

    #[test]
    fn peers_follow_the_figures_of_each_testbed() {
        use super::super::plan::{plan as make_plan, test_args};
        let plan = |extra: &[&str]| make_plan(&test_args(&[&["--testbed", "--peers"], extra].concat()));
        let spec = |rate: &str| TestbedSpec { rails: 2, rate: rate.into(), bus: None };
        let short = |js: Vec<PeerJob>| {
            js.iter()
                .map(|j| {
                    format!(
                        "{}{} {}{}",
                        j.tool.name(),
                        j.rails.suffix(),
                        j.metric.test(),
                        j.study.as_ref().map_or("", |_| " *")
                    )
                })
                .collect::<Vec<_>>()
        };
        let all = |_: Tool| true;
        // fdr-edr shows latency, bw and bibw on 2 x 1gbit: the peers over all rails.
        assert_eq!(
            short(jobs(&plan(&["--study", "fdr-edr"]), &spec("1gbit"), all)),
            [
                "iperf3 bw",
                "iperf3 bibw",
                "Open MPI bw",
                "ucx_perftest bw",
                "Open MPI bibw",
                "Open MPI latency",
                "ucx_perftest latency"
            ]
        );
        // The peers study adds its variants (*: drawn only in its figures).
        let p = plan(&["--study", "peers"]);
        let two = short(jobs(&p, &spec("2gbit"), all));
        for v in [
            "Open MPI, rail0 only bw *",
            "ucx_perftest, rail0 only latency *",
            "Open MPI, btl_tcp_links=2 bw *",
            "Open MPI, bandwidth hints bw *",
            "Open MPI, send-only (no put) bibw *",
            "Open MPI, rail0 only bibw *",
            "Open MPI mbw_mr *",
        ] {
            assert!(two.contains(&v.to_string()), "{v} in {two:?}");
        }
        // Unequal rails: bw only.
        let unequal = short(jobs(&p, &spec("1gbit,3gbit"), all));
        assert!(unequal.contains(&"Open MPI, bandwidth hints bw *".to_string()), "{unequal:?}");
        assert!(unequal.iter().all(|j| j.contains(" bw")), "{unequal:?}");
        // A testbed no figure uses gets iperf3 alone; missing tools nothing.
        assert_eq!(short(jobs(&p, &spec("9gbit"), all)), ["iperf3 bw"]);
        assert!(jobs(&p, &spec("2gbit"), |_| false).is_empty());
        assert!(jobs(&p, &spec("2gbit"), |t| t == Tool::Iperf3).iter().all(|j| j.tool == Tool::Iperf3));
    }

    #[test]
    fn ucx_perftest_final_line_in_megabytes() {
        let out = "|     Test     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |\n\
                   +--------------+\n                         320    683.331  6394.444  4524.209      156.39     221.03         156         221\n\
                   | Message size: 1048576   |\n";
        assert!((ucx_rate(out).unwrap() - 221.03 * 1.048576).abs() < 1e-9);
        assert!(ucx_rate("error").is_err());
        assert_eq!(ucx_latency(out).unwrap(), 4524.209);
        let q = ucx_sizes(true, Metric::Bw);
        assert_eq!(q, vec![(8, 20_000), (65536, 320), (1 << 20, 128)]);
        let full = ucx_sizes(false, Metric::Bw);
        assert!(full.iter().all(|&(s, n)| (64..=1280).contains(&n) || (s <= 16 << 10 && n == 20_000)), "{full:?}");
        let sizes: Vec<u64> = full.iter().map(|p| p.0).collect();
        for s in [1, 64, 512, 2 << 10, 4 << 10, 8 << 10, 16 << 10, 4 << 20] {
            assert!(sizes.contains(&s), "issue 9's size {s} in {sizes:?}");
        }
        assert!(ucx_sizes(false, Metric::Latency).len() < full.len());
    }
}
