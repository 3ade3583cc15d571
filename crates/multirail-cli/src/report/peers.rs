//! `report --peers`: other tools measured on the same rails, as extra
//! lines of the figures. Built: iperf3, one TCP stream per rail, all rails
//! at once, inside the namespaces of the testbed the report brought up
//! (server in host1, client in host0, each bound to its rail's address).
//! Not built: UCX `ucx_perftest` and Open MPI (`bench/compare.sh` runs
//! them).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use super::plan::TestbedSpec;
use crate::child;

/// One peer measurement on one testbed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerRun {
    /// `iperf3`.
    pub tool: String,
    pub testbed: TestbedSpec,
    /// What was measured, for the page.
    pub what: String,
    /// The command lines, as run.
    pub commands: Vec<String>,
    /// Received MB/s of each rail's stream, and their sum.
    pub per_rail: Vec<f64>,
    pub total: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
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
    for tool in ["ucx_perftest", "mpirun"] {
        out.push(match which(tool) {
            Some(p) => format!(
                "--peers: {tool} is installed ({}), but running it is not built into multirail report yet: not \
                 measured (bench/compare.sh measures it on a testbed)",
                p.display()
            ),
            None => format!("--peers: {tool} is not installed: skipped"),
        });
    }
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
    let mut run = PeerRun {
        tool: "iperf3".into(),
        testbed: spec.clone(),
        what: format!("iperf3, {} TCP stream(s), one per rail, {secs} s", spec.rails),
        commands: vec![],
        per_rail: vec![],
        total: None,
        failed: None,
    };
    if let Err(e) = iperf3_into(&mut run, prefix, secs) {
        run.failed = Some(format!("{e:#}"));
    }
    run
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
        let c = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting iperf3 -s")?;
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
            clients.push(
                Command::new(&argv[0])
                    .args(&argv[1..])
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .context("starting iperf3 -c")?,
            );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iperf3_json_gives_received_megabytes() {
        let j = r#"{"start":{},"end":{"sum_sent":{"bits_per_second":2.1e9},"sum_received":{"bits_per_second":2.0e9}}}"#;
        assert_eq!(iperf3_rate(j).unwrap(), 250.0);
        assert!(iperf3_rate(r#"{"error":"unable to connect"}"#).is_err());
    }
}
