//! `report --peers`: other tools measured on the same rails, as extra
//! lines of the figures. Built: iperf3, one TCP stream per rail, all rails
//! at once, inside the namespaces of the testbed the report brought up
//! (server in host1, client in host0, each bound to its rail's address).
//! UCX: `ucx_perftest -t tag_bw` and `-t tag_lat` (UCX_TLS=tcp over all the
//! testbed's rails) per message size, server in host1, client in host0.
//! Open MPI: `bench/mpi/mr_bw` and `mr_pingpong` under mpirun across the
//! two hosts, ob1 with the tcp BTL over all the rails. Not here (still in
//! `bench/compare.sh`): bibw of the peers, Open MPI's rail options
//! (`btl_tcp_links`, bandwidth hints), UCX on one rail.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use super::plan::{Metric, TestbedSpec};
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
}

fn bw() -> Metric {
    Metric::Bw
}

impl PeerRun {
    /// A run of `tool` on testbed `spec`, filled by `fill`; its error
    /// is kept in `failed` (the report goes on).
    fn measure(
        tool: &str,
        metric: Metric,
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
    let mut out = Vec::new();
    match (which("iperf3"), testbed) {
        (None, _) => out.push("--peers: iperf3 is not installed: skipped".into()),
        (Some(_), false) => out.push(
            "--peers: iperf3 skipped: it runs one stream per rail between testbed hosts, and there is no \
             --testbed (over loopback its streams would share one interface)"
                .into(),
        ),
        (Some(p), true) => out.push(format!(
            "--peers: iperf3 ({}) measured once per testbed: one TCP stream per rail, all rails at once",
            p.display()
        )),
    }
    match (which("ucx_perftest"), testbed) {
        (None, _) => out.push("--peers: ucx_perftest is not installed: skipped".into()),
        (Some(_), false) => {
            out.push("--peers: ucx_perftest skipped: it runs between testbed hosts, and there is no --testbed".into())
        }
        (Some(p), true) => out.push(format!(
            "--peers: ucx_perftest ({}) tag_bw and tag_lat measured once per testbed, UCX_TLS=tcp over all its rails",
            p.display()
        )),
    }
    out.push(match (which("mpirun"), which("mpicc"), testbed) {
        (None, _, _) | (_, None, _) => "--peers: Open MPI (mpirun and mpicc) is not installed: skipped".into(),
        (Some(_), Some(_), false) => {
            "--peers: Open MPI skipped: it runs between testbed hosts, and there is no --testbed".into()
        }
        (Some(p), Some(_), true) => format!(
            "--peers: Open MPI ({}) bench/mpi/mr_bw and mr_pingpong measured once per testbed: ob1, tcp BTL over all its rails",
            p.display()
        ),
    });
    out
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

/// The received rate of an iperf3 `-J` report, MB/s.
pub fn iperf3_rate(json: &str) -> anyhow::Result<f64> {
    let v: serde_json::Value = serde_json::from_str(json).context("reading iperf3 -J")?;
    let bits = v["end"]["sum_received"]["bits_per_second"].as_f64().context("no end.sum_received in iperf3 -J")?;
    Ok(bits / 8.0 / 1e6)
}

const PORT: u16 = 5201;

/// iperf3 on the testbed `prefix` (described by `spec`): one stream per
/// rail for `secs` seconds, all at once.
pub fn iperf3(prefix: &str, spec: &TestbedSpec, secs: u32) -> PeerRun {
    PeerRun::measure(
        "iperf3",
        Metric::Bw,
        spec,
        format!("iperf3, {} TCP stream(s), one per rail, {secs} s", spec.rails),
        |run| iperf3_into(run, prefix, secs),
    )
}

fn iperf3_into(run: &mut PeerRun, prefix: &str, secs: u32) -> anyhow::Result<()> {
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
            let argv: Vec<String> =
                ["ip", "netns", "exec", &ns0, "iperf3", "-c", a1, "-B", a0, "-p", &port, "-t", &t, "-J"]
                    .map(String::from)
                    .to_vec();
            run.commands.push(show(&argv));
            clients.push(spawn(&argv, true, "iperf3 -c")?);
        }
        let limit = Duration::from_secs(u64::from(secs) + 20);
        for (r, c) in clients.into_iter().enumerate() {
            let out = wait(c, limit).with_context(|| format!("iperf3 -c on rail {r}"))?;
            run.per_rail.push(iperf3_rate(&out).with_context(|| format!("rail {r}"))?);
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

/// Sizes of the UCX runs, and the messages sent at each (fewer for large
/// messages: about 128 MiB, or 512 MiB without --quick, per size).
pub fn ucx_sizes(quick: bool) -> Vec<(u64, u64)> {
    let (sizes, budget, most): (&[u64], u64, u64) = if quick {
        (&[8, 64 << 10, 1 << 20], 128 << 20, 320)
    } else {
        (&[8, 1 << 10, 64 << 10, 1 << 20, 4 << 20], 512 << 20, 1280)
    };
    sizes.iter().map(|&s| (s, (budget / s).clamp(64, most))).collect()
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
/// testbed `prefix`.
pub fn ucx(prefix: &str, spec: &TestbedSpec, quick: bool, metric: Metric) -> PeerRun {
    let test = if metric == Metric::Latency { "tag_lat" } else { "tag_bw" };
    PeerRun::measure(
        "ucx_perftest",
        metric,
        spec,
        format!("UCX {test}, UCX_TLS=tcp over {} rail(s), UCX_MAX_RNDV_RAILS={}", spec.rails, spec.rails),
        |run| ucx_into(run, prefix, quick),
    )
}

fn ucx_into(run: &mut PeerRun, prefix: &str, quick: bool) -> anyhow::Result<()> {
    let Hosts { ns0, ns1, rails } = addresses(prefix)?;
    let devices: Vec<String> = (0..rails.len()).map(|r| format!("rail{r}")).collect();
    let env: Vec<String> = vec![
        "env".into(),
        "UCX_TLS=tcp".into(),
        format!("UCX_NET_DEVICES={}", devices.join(",")),
        format!("UCX_MAX_RNDV_RAILS={}", rails.len()),
    ];
    let latency = run.metric == Metric::Latency;
    let test = if latency { "tag_lat" } else { "tag_bw" };
    for (k, (size, n)) in ucx_sizes(quick).into_iter().enumerate() {
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

/// The OSU-style `SIZE VALUE` lines of mr_bw's output.
pub fn osu_points(out: &str) -> Vec<(u64, f64)> {
    out.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let size = w.next()?.parse().ok()?;
            let value = w.next()?.parse().ok()?;
            w.next().is_none().then_some((size, value))
        })
        .collect()
}

/// Open MPI's `mr_bw` (bw) or `mr_pingpong` (latency), ob1 + tcp BTL
/// over every rail, on testbed `prefix`.
pub fn ompi(prefix: &str, spec: &TestbedSpec, quick: bool, metric: Metric) -> PeerRun {
    let what = if metric == Metric::Latency {
        format!("Open MPI bench/mpi/mr_pingpong, ob1 + tcp BTL over {} rail(s)", spec.rails)
    } else {
        format!("Open MPI bench/mpi/mr_bw, ob1 + tcp BTL over {} rail(s), window 64", spec.rails)
    };
    PeerRun::measure("Open MPI", metric, spec, what, |run| ompi_into(run, prefix, quick))
}

fn ompi_into(run: &mut PeerRun, prefix: &str, quick: bool) -> anyhow::Result<()> {
    let bench = bench_dir();
    let name = if run.metric == Metric::Latency { "mr_pingpong" } else { "mr_bw" };
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
    let ifs: Vec<String> = (0..rails.len()).map(|r| format!("rail{r}")).collect();
    let args: Vec<String> = if run.metric == Metric::Latency {
        // mr_pingpong's own counts (OSU's) without --quick.
        let a: &[&str] = if quick { &["-s", "8,64K,1M", "-i", "100", "-w", "10"] } else { &["-s", "1:4M"] };
        a.iter().map(|s| s.to_string()).collect()
    } else if quick {
        ["-s", "8,64K,1M", "-i", "5", "-w", "1", "-W", "64"].map(String::from).to_vec()
    } else {
        ["-s", "1:4M", "-i", "20", "-w", "2", "-W", "64"].map(String::from).to_vec()
    };
    let p = prog.to_string_lossy().into_owned();
    let mut argv: Vec<String> = vec!["env".into(), format!("MR_NETNS_PREFIX={prefix}"), "ip".into(), "netns".into()];
    argv.extend(["exec".into(), ns0, "mpirun".into(), "--allow-run-as-root".into(), "--bind-to".into(), "none".into()]);
    for (k, v) in [
        ("plm_rsh_agent", agent.to_string_lossy().into_owned()),
        ("oob_tcp_if_include", "rail0".to_string()),
        ("pml", "ob1".into()),
        ("btl", "tcp,self".into()),
        ("btl_tcp_if_include", ifs.join(",")),
    ] {
        argv.extend(["--mca".into(), k.into(), v]);
    }
    argv.extend(["-np".into(), "1".into(), "-H".into(), rails[0].0.clone(), p.clone()]);
    argv.extend(args.iter().cloned());
    argv.extend([":".into(), "-np".into(), "1".into(), "-H".into(), rails[0].1.clone(), p]);
    argv.extend(args.iter().cloned());
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
        assert_eq!(iperf3_rate(j).unwrap(), 250.0);
        assert!(iperf3_rate(r#"{"error":"unable to connect"}"#).is_err());
    }

    #[test]
    fn mr_bw_output_in_points() {
        let out = "# rank 0: host vm\n# Size      Bandwidth (MB/s)\n8                       0.95\n65536   337.13\n1048576 329.73\n";
        assert_eq!(osu_points(out), vec![(8, 0.95), (65536, 337.13), (1 << 20, 329.73)]);
    }

    #[test]
    fn ucx_perftest_final_line_in_megabytes() {
        let out = "|     Test     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |\n\
                   +--------------+\n                         320    683.331  6394.444  4524.209      156.39     221.03         156         221\n\
                   | Message size: 1048576   |\n";
        assert!((ucx_rate(out).unwrap() - 221.03 * 1.048576).abs() < 1e-9);
        assert!(ucx_rate("error").is_err());
        assert_eq!(ucx_latency(out).unwrap(), 4524.209);
        let q = ucx_sizes(true);
        assert_eq!(q, vec![(8, 320), (65536, 320), (1 << 20, 128)]);
        assert!(ucx_sizes(false).iter().all(|&(_, n)| (64..=1280).contains(&n)));
    }
}
