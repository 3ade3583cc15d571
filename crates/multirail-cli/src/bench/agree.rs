//! A two-host run (`--server` / `--connect`) agrees on what to run, as
//! ucx_perftest and iperf3 do: once the endpoint is up, the client sends
//! its test and parameters, and the server runs them (whatever test it was
//! started with). Settings fixed when the endpoint was built (policy,
//! progress, eager limit, chunk, checksum) cannot be taken over: if they
//! differ, the server refuses, naming both sides' values, and the client's
//! user reads the same reason. Both waits are bounded by the setup timeout.

use std::time::Duration;

use anyhow::{Context, bail};
use clap::ValueEnum;
use multirail::{Config, Endpoint};
use multirail_proto::units::format_size;
use serde::{Deserialize, Serialize};

use crate::cli::{BenchArgs, TestName};

/// Tags of the agreement: above multirail-perf's own control tags
/// (`1 << 62` + 1..3), below multirail's reserved ones (`1 << 63`).
const PARAMS_TAG: u64 = (1 << 62) + 16;
const REPLY_TAG: u64 = (1 << 62) + 17;
/// Version of [`Params`]; a server refuses any other.
const VERSION: u32 = 1;
/// Largest message of the agreement.
const MAX_MESSAGE: usize = 64 * 1024;

/// What the client runs, as it sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Params {
    version: u32,
    test: String,
    sizes: Option<String>,
    message_size: Option<String>,
    iterations: Option<u64>,
    warmup: Option<u64>,
    window: u32,
    pairs: u32,
    validate: bool,
    /// Endpoint settings in force: (name as a flag, value).
    settings: Vec<(String, String)>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    /// `None`: the server runs the client's test.
    refused: Option<String>,
}

impl Params {
    fn of(args: &BenchArgs, cfg: &Config) -> Params {
        Params {
            version: VERSION,
            test: super::test_of(args.test).to_string(),
            sizes: args.sizes.clone(),
            message_size: args.message_size.clone(),
            iterations: args.iterations,
            warmup: args.warmup,
            window: args.window,
            pairs: args.pairs,
            validate: args.validate,
            settings: settings(cfg),
        }
    }

    /// The test as a command line: `bw --sizes 16 --iterations 3`.
    fn command(&self) -> String {
        let mut s = self.test.clone();
        let mut add = |flag: &str, v: Option<String>| {
            if let Some(v) = v {
                s.push_str(&format!(" --{flag} {v}"));
            }
        };
        add("sizes", self.sizes.clone());
        add("message-size", self.message_size.clone());
        add("iterations", self.iterations.map(|v| v.to_string()));
        add("warmup", self.warmup.map(|v| v.to_string()));
        add("window", Some(self.window).filter(|&w| w != multirail_perf::osu::WINDOW_SIZE).map(|w| w.to_string()));
        add("pairs", Some(self.pairs.to_string()).filter(|p| p != "1"));
        if self.validate {
            s.push_str(" --validate");
        }
        s
    }
}

/// The settings both sides must share, as flags name them.
fn settings(cfg: &Config) -> Vec<(String, String)> {
    vec![
        ("--policy".into(), cfg.proto.policy.to_string()),
        ("--progress".into(), cfg.progress.to_string()),
        ("--eager-limit".into(), format_size(cfg.proto.eager_limit)),
        ("--chunk".into(), format_size(cfg.proto.chunk)),
        ("--checksum".into(), if cfg.proto.checksum { "on" } else { "off" }.into()),
    ]
}

/// The client's side: sends its parameters, waits (at most `limit`) for
/// the server's answer; a refusal is an error carrying its reason.
pub fn as_client(ep: &Endpoint, args: &BenchArgs, limit: Duration) -> anyhow::Result<()> {
    let mine = serde_json::to_vec(&Params::of(args, ep.config()))?;
    ep.send(0, PARAMS_TAG, &mine).context("sending the test to the server")?;
    let reply: Reply = receive(ep, REPLY_TAG, limit, "the server's answer")?;
    match reply.refused {
        Some(why) => bail!("the server refused the run: {why}"),
        None => Ok(()),
    }
}

/// The server's side: the client's test and parameters in place of ours,
/// or an error (also sent to the client) naming what differs.
pub fn as_server(ep: &Endpoint, args: &BenchArgs, limit: Duration) -> anyhow::Result<BenchArgs> {
    let theirs: Params = receive(ep, PARAMS_TAG, limit, "the client's test")?;
    let ours = Params::of(args, ep.config());
    let verdict = adopt(args, &ours, &theirs);
    let reply = Reply { refused: verdict.as_ref().err().cloned() };
    ep.send(1, REPLY_TAG, &serde_json::to_vec(&reply)?).context("answering the client")?;
    let adopted = verdict.map_err(anyhow::Error::msg)?;
    if !args.quiet && theirs.command() != ours.command() {
        eprintln!(
            "# running the client's test: `{}` (this server was started with `{}`)",
            theirs.command(),
            ours.command()
        );
    }
    Ok(adopted)
}

/// Our flags with the client's test and parameters, or why not.
fn adopt(args: &BenchArgs, ours: &Params, theirs: &Params) -> Result<BenchArgs, String> {
    if theirs.version != VERSION {
        return Err(format!(
            "the client speaks version {} of the agreement, this server {VERSION}: run the same multirail on both hosts",
            theirs.version
        ));
    }
    let differ: Vec<String> = ours
        .settings
        .iter()
        .filter_map(|(name, mine)| {
            let other = theirs.settings.iter().find(|(n, _)| n == name).map_or("(not sent)", |(_, v)| v.as_str());
            (other != mine).then(|| format!("{name}: the client has {other}, this server {mine}"))
        })
        .collect();
    if !differ.is_empty() {
        return Err(format!(
            "the two sides must use the same settings; {} (give the same flags and MULTIRAIL_* variables on both hosts)",
            differ.join("; ")
        ));
    }
    let test = TestName::from_str(&theirs.test, true)
        .map_err(|_| format!("the client runs a test this server does not know: '{}'", theirs.test))?;
    let mut a = args.clone();
    a.test = test;
    a.sizes = theirs.sizes.clone();
    a.message_size = theirs.message_size.clone();
    a.iterations = theirs.iterations;
    a.warmup = theirs.warmup;
    a.window = theirs.window;
    a.pairs = theirs.pairs;
    a.validate = theirs.validate;
    super::spec_of(&a, 2).map_err(|e| format!("the client's test `{}` cannot run here: {e:#}", theirs.command()))?;
    Ok(a)
}

/// Receives one JSON message from the other rank within `limit`.
fn receive<T: for<'de> Deserialize<'de>>(ep: &Endpoint, tag: u64, limit: Duration, what: &str) -> anyhow::Result<T> {
    let peer = 1 - ep.rank();
    let req = ep.irecv(Some(peer), Some(tag), &[0u8; MAX_MESSAGE][..])?;
    let (buf, st) = match req.wait_with_buffer(Some(limit)) {
        Err(multirail::Error::Timeout) => {
            bail!("{what} did not come within {limit:?} (MULTIRAIL_SETUP_TIMEOUT): is the other side multirail bench?")
        }
        other => other?,
    };
    let st = st.with_context(|| format!("receiving {what}"))?;
    serde_json::from_slice(&buf[..st.len as usize]).with_context(|| format!("reading {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(line: &str) -> BenchArgs {
        let cli = crate::cli::Cli::parse_from(format!("multirail bench {line}").split_whitespace());
        match cli.command {
            crate::cli::Command::Bench(b) => *b,
            _ => unreachable!(),
        }
    }

    fn params(line: &str, cfg: &Config) -> Params {
        Params::of(&args(line), cfg)
    }

    #[test]
    fn the_server_takes_the_clients_test_and_parameters() {
        let cfg = Config::default();
        let server = args("latency --sizes 8 --server");
        let theirs = params("bw --sizes 16 -i 3 -x 1 -W 8 --validate", &cfg);
        let a = adopt(&server, &params("latency --sizes 8", &cfg), &theirs).unwrap();
        assert_eq!(a.test, TestName::Bw);
        assert_eq!(
            (a.sizes.as_deref(), a.iterations, a.warmup, a.window, a.validate),
            (Some("16"), Some(3), Some(1), 8, true)
        );
        assert!(a.server, "the server's own flags stay");
        let a = adopt(&server, &params("latency --sizes 8", &cfg), &params("bw -m 4:16", &cfg)).unwrap();
        assert_eq!((a.sizes, a.message_size.as_deref()), (None, Some("4:16")), "OSU's -m too");
        assert_eq!(theirs.command(), "bw --sizes 16 --iterations 3 --warmup 1 --window 8 --validate");
    }

    #[test]
    fn different_settings_are_refused_naming_both_values() {
        let ours = Config::default();
        let mut theirs_cfg = Config::default();
        theirs_cfg.proto.policy = "*:single".parse().unwrap();
        theirs_cfg.proto.checksum = true;
        let e = adopt(&args("bw"), &params("bw", &ours), &params("bw", &theirs_cfg)).unwrap_err();
        let policy = format!("--policy: the client has *:single, this server {}", ours.proto.policy);
        assert!(e.contains(&policy) && e.contains("--checksum: the client has on, this server off"), "{e}");
    }

    #[test]
    fn another_version_or_an_impossible_test_is_refused() {
        let cfg = Config::default();
        let mut theirs = params("bw", &cfg);
        theirs.version = VERSION + 1;
        assert!(adopt(&args("bw"), &params("bw", &cfg), &theirs).unwrap_err().contains("version"));
        let mut theirs = params("bw", &cfg);
        theirs.test = "osu_alltoall".into();
        assert!(adopt(&args("bw"), &params("bw", &cfg), &theirs).unwrap_err().contains("'osu_alltoall'"));
        let theirs = params("mbw_mr --pairs 2", &cfg);
        assert!(adopt(&args("bw"), &params("bw", &cfg), &theirs).unwrap_err().contains("cannot run here"));
    }
}
