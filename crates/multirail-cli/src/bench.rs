//! `multirail bench`: OSU-style benchmarks. The command is a launcher
//! (local ranks, testbed ranks, comparisons) or a rank (started by us, by
//! mpirun/srun, or as --server/--connect); the kernels and report writers
//! live in multirail-perf.

mod agree;
mod cbr;
mod fail;
mod group;
mod plot;
mod rank;

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use anyhow::{Context, bail};
use multirail::{Config, JobInfo};
use multirail_perf::compare::{self, CompareKey};
use multirail_perf::model::{ModelColumns, ModelInput};
use multirail_perf::report::json::JsonRecord;
use multirail_perf::{BenchSpec, RunInfo, SizeResult, Test};
use multirail_proto::units::{format_size, parse_size};

use crate::cli::{BenchArgs, TestName};
use crate::launch::{self, RankEnv};

pub fn run(args: BenchArgs) -> anyhow::Result<i32> {
    if args.test == TestName::Cbr {
        // A launcher of other bench runs, never a rank itself.
        return cbr::run(&args);
    }
    if args.test == TestName::Group {
        // Its own ranks and report (not an OSU sweep).
        return group::run(&args);
    }
    let launched = std::env::var_os(launch::LAUNCHED).is_some();
    if launched {
        let job = JobInfo::from_env()?.context("MULTIRAIL_LAUNCHED is set but MULTIRAIL_RANK/SIZE are not")?;
        return rank::run(&args, &job);
    }
    // Fail on a bad --plot or --model before measuring anything.
    plot::target(&args)?;
    check_model(&args)?;
    if !args.compare.is_empty() {
        return run_compare(&args);
    }
    if let Some(job) = JobInfo::from_env()? {
        // Started by mpirun/srun (or by hand with MULTIRAIL_RANK/SIZE).
        return rank::run(&args, &job);
    }
    if args.server {
        if args.port == 0 {
            anyhow::bail!(
                "--port 0: the client must know the port; give one both sides use (default 18515), e.g. --port 13337"
            );
        }
        let key = key_for_server();
        let job = JobInfo {
            rank: 0,
            size: 2,
            root: Some(format!("0.0.0.0:{}", args.port)),
            pmix: false,
            source: "--server",
            multi_node: Some(true),
            local_size: None,
        };
        if !args.quiet {
            eprintln!(
                "# waiting for the client on port {} (it chooses the test and its parameters); on the other host run:",
                args.port
            );
            eprintln!(
                "#   MULTIRAIL_KEY={key} multirail bench {} --connect THIS_HOST:{} ...",
                test_of(args.test),
                args.port
            );
        }
        return rank::run_with_key(&args, &job, Some(key));
    }
    if let Some(addr) = &args.connect {
        check_connect(addr)?;
        if !args.quiet {
            eprintln!("# joining the server at {addr}; the server prints the results");
        }
        let job = JobInfo {
            rank: 1,
            size: 2,
            root: Some(addr.clone()),
            pmix: false,
            source: "--connect",
            multi_node: Some(true),
            local_size: None,
        };
        return rank::run(&args, &job);
    }
    let extra = match args.model && args.link.is_none() {
        true => vec!["--model-links".to_string(), calibrate(&args)?],
        false => vec![],
    };
    let (code, _) = launch_local(&args, &extra, &[], false)?;
    Ok(code)
}

/// `--connect HOST:PORT` must name a server address (said here with the
/// flag, not later as the MULTIRAIL_ROOT it becomes).
fn check_connect(addr: &str) -> anyhow::Result<()> {
    use std::net::ToSocketAddrs;
    let mut found =
        addr.to_socket_addrs().with_context(|| format!("--connect {addr}: cannot resolve it as HOST:PORT"))?;
    found.next().with_context(|| format!("--connect {addr}: the host has no address"))?;
    Ok(())
}

/// `--model` is for bw, and its rates must parse.
fn check_model(args: &BenchArgs) -> anyhow::Result<()> {
    if !args.model {
        return Ok(());
    }
    if args.test != TestName::Bw {
        bail!("--model predicts one-way bandwidth: use it with `multirail bench bw`");
    }
    if let Some(l) = &args.link {
        crate::model::parse_links(l).context("--link")?;
    }
    crate::model::parse_opt(args.nic.as_deref()).context("--nic")?;
    crate::model::parse_opt(args.host.as_deref()).context("--host")?;
    Ok(())
}

/// The model's columns for rank 0 of a bw run with `--model` (none in a
/// launcher's sub-run): link rates from `--link`, else from the launcher's
/// single-rail runs (`--model-links`).
pub fn model_columns(args: &BenchArgs, nrails: usize) -> anyhow::Result<Option<ModelColumns>> {
    if !args.model || args.sub_run {
        return Ok(None);
    }
    check_model(args)?;
    let (links, from) = match (&args.link, &args.model_links) {
        (Some(l), _) => (crate::model::parse_links(l)?, "given: --link".to_string()),
        (None, Some(m)) => {
            let v = m.split(',').map(|x| x.trim().parse::<f64>()).collect::<Result<Vec<_>, _>>();
            let largest = spec_of(args, 2)?.sizes.into_iter().max().unwrap_or(0);
            (v.context("--model-links")?, format!("measured: one bw run per rail at {}", format_size(largest)))
        }
        (None, None) => bail!(
            "--model needs each rail's bandwidth: give --link RATE, or start the run locally or with \
             --testbed so that multirail measures every rail alone first"
        ),
    };
    let nic = crate::model::parse_opt(args.nic.as_deref())?;
    let host = crate::model::parse_opt(args.host.as_deref())?;
    Ok(Some(ModelColumns::new(ModelInput::new(nrails, &links, nic, host)?, from)))
}

/// `--model` without `--link`: one bw run per rail, alone, at the largest
/// size of the sweep with the sweep's loop counts. Returns the rails'
/// bandwidths in bytes/s as `--model-links` takes them.
fn calibrate(args: &BenchArgs) -> anyhow::Result<String> {
    let largest = spec_of(args, 2)?.sizes.into_iter().max().context("--sizes: no sizes")?;
    let nrails = rail_count(args)?;
    let mut rates = Vec::new();
    for k in 0..nrails {
        if !args.quiet {
            eprintln!("# --model: measuring rail {k} alone (bw at {})", format_size(largest));
        }
        let size = largest.to_string();
        let extra: Vec<String> = ["--sub-run", "--only-rail", &k.to_string(), "--sizes", &size, "--json", "--quiet"]
            .map(String::from)
            .to_vec();
        let mut sub = args.clone();
        sub.sizes = Some(size.clone());
        sub.only_rail = Some(k);
        let (code, lines) = launch_local(&sub, &extra, &[], true)?;
        if code != 0 {
            bail!("--model: the single-rail run on rail {k} failed (exit {code})");
        }
        let value = lines
            .iter()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str::<JsonRecord>(l))
            .collect::<Result<Vec<_>, _>>()
            .context("reading the single-rail run's JSON output")?
            .into_iter()
            .find(|r| r.size == largest)
            .map(|r| r.value)
            .with_context(|| format!("--model: the single-rail run on rail {k} reported nothing"))?;
        rates.push(format!("{}", value * 1e6));
    }
    Ok(rates.join(","))
}

/// The rails of a rank in a testbed host: `--rails` if given (resolved by
/// the rank inside its host, so `tcp:rail0,tcp:rail1` or
/// `ofi:tcp:rail0,ofi:tcp:rail1` name that host's interfaces), else the
/// host's rail addresses.
fn testbed_rails_of(args: &BenchArgs, host: &crate::testbed::HostPlacement) -> String {
    args.rails.clone().unwrap_or_else(|| host.rails.clone())
}

/// How many rails a local or testbed run uses.
fn rail_count(args: &BenchArgs) -> anyhow::Result<usize> {
    if let Some(p) = crate::testbed::placement(args.testbed, &args.testbed_prefix, 2, Default::default())? {
        let n = testbed_rails_of(args, &p.hosts[0]).split(',').count();
        return Ok(args.testbed_rails.unwrap_or(n).clamp(1, n));
    }
    Ok(config_of(args)?.rails.len())
}

/// The server's key: MULTIRAIL_KEY, or a fresh one the client is told.
fn key_for_server() -> String {
    std::env::var("MULTIRAIL_KEY").ok().filter(|k| !k.is_empty()).unwrap_or_else(multirail::generate_key)
}

pub fn test_of(t: TestName) -> Test {
    match t {
        TestName::Latency => Test::Latency,
        TestName::Bw => Test::Bw,
        TestName::Bibw => Test::Bibw,
        TestName::MbwMr => Test::MbwMr,
        TestName::MultiLat => Test::MultiLat,
        // `bench::run` hands cbr to its own module before any single test
        // is set up; nothing else asks for its test.
        TestName::Cbr => unreachable!("bench cbr runs other tests, it is not one"),
        TestName::Group => unreachable!("bench group has its own module"),
    }
}

/// Ranks a local run needs.
fn ranks_for(args: &BenchArgs) -> u32 {
    if args.test == TestName::Group {
        return args.nodes;
    }
    if test_of(args.test).uses_pairs() { 2 * args.pairs.max(1) } else { 2 }
}

/// `8` | `1K:4M` (OSU's doubling from the first to the last) | `8,64K,1M`.
pub fn parse_sizes(s: &str) -> anyhow::Result<Vec<u64>> {
    let s = s.trim();
    if let Some((a, b)) = s.split_once(':') {
        let (lo, hi) = (parse_size(a).map_err(anyhow::Error::msg)?, parse_size(b).map_err(anyhow::Error::msg)?);
        if lo > hi {
            bail!("the range must go from small to large");
        }
        return Ok(multirail_perf::osu_sizes(lo, hi));
    }
    let v: Vec<u64> = s.split(',').map(|x| parse_size(x).map_err(anyhow::Error::msg)).collect::<anyhow::Result<_>>()?;
    if v.is_empty() {
        bail!("no sizes given");
    }
    Ok(v)
}

/// OSU's `-m [MIN:]MAX`: sizes doubling from MIN (default: the test's
/// smallest, `smallest`) to MAX (default: OSU's largest).
pub fn parse_message_size(s: &str, smallest: u64) -> anyhow::Result<Vec<u64>> {
    let size = |x: &str, default: u64| match x.trim() {
        "" => Ok(default),
        t => parse_size(t).map_err(anyhow::Error::msg),
    };
    let (lo, hi) = match s.split_once(':') {
        Some((a, b)) => (size(a, smallest)?, size(b, multirail_perf::osu::MAX_MESSAGE_SIZE)?),
        None if s.trim().is_empty() => bail!("give [MIN:]MAX, e.g. 8, 8:1M or 1K:"),
        None => (smallest, size(s, 0)?),
    };
    if lo > hi {
        bail!("MIN {} is above MAX {}", format_size(lo), format_size(hi));
    }
    Ok(multirail_perf::osu_sizes(lo, hi))
}

/// The benchmark to run, from the flags.
pub fn spec_of(args: &BenchArgs, ranks: u32) -> anyhow::Result<BenchSpec> {
    let test = test_of(args.test);
    let mut spec = BenchSpec::new(test);
    if let Some(s) = &args.sizes {
        spec.sizes = parse_sizes(s).with_context(|| format!("--sizes {s}"))?;
    }
    if let Some(m) = &args.message_size {
        let smallest = spec.sizes.iter().copied().min().unwrap_or(0);
        spec.sizes = parse_message_size(m, smallest).with_context(|| format!("-m {m}"))?;
    }
    if args.full && !test.is_latency() {
        bail!(
            "-f/--full adds per-message latency columns, which only latency and multi_lat measure \
             (bandwidth tests time whole windows)"
        );
    }
    spec.iterations = args.iterations;
    spec.warmup = args.warmup;
    spec.window = args.window;
    spec.pairs = if test.uses_pairs() { args.pairs.max(1) } else { 1 };
    spec.validate = args.validate;
    spec.check(ranks)?;
    Ok(spec)
}

/// How the user gave the rails, for messages: `--rails X`,
/// `MULTIRAIL_RAILS=X`, or the default.
fn rails_named(args: &BenchArgs) -> String {
    match (&args.rails, std::env::var("MULTIRAIL_RAILS").ok().filter(|v| !v.trim().is_empty())) {
        (Some(r), _) => format!("--rails {r}"),
        (None, Some(v)) => format!("MULTIRAIL_RAILS={v}"),
        (None, None) => format!("the default rails ({})", multirail::DEFAULT_RAILS),
    }
}

/// Settings: defaults, then MULTIRAIL_* variables, then flags. A value
/// from a flag is checked in the flag's name and quoted as typed.
pub fn config_of(args: &BenchArgs) -> anyhow::Result<Config> {
    let mut c = Config::default();
    c.read_env()?;
    if let Some(r) = &args.rails {
        c.rails = multirail_transport::RailSpec::parse_list(r).map_err(|e| anyhow::anyhow!("--rails {r}: {e}"))?;
    }
    if let Some(p) = &args.policy {
        c.proto.policy = p.parse().map_err(|e| anyhow::anyhow!("--policy: {e}"))?;
    }
    if let Some(p) = &args.progress {
        c.progress = p.parse().map_err(|e| anyhow::anyhow!("--progress: {e}"))?;
    }
    if let Some(v) = &args.eager_limit {
        c.proto.eager_limit = parse_size(v).map_err(|e| anyhow::anyhow!("--eager-limit {v}: {e}"))?;
        if c.proto.eager_limit > c.proto.unexpected_limit {
            bail!(
                "--eager-limit {v} is above MULTIRAIL_UNEXPECTED_LIMIT ({}): {}",
                format_size(c.proto.unexpected_limit),
                multirail::EAGER_ABOVE_UNEXPECTED
            );
        }
    }
    if let Some(v) = &args.chunk {
        c.proto.chunk = c.parse_chunk(v).map_err(|e| anyhow::anyhow!("--chunk {v}: {e}"))?;
        if c.proto.chunk > c.proto.rail_window {
            bail!(
                "--chunk {v} is above MULTIRAIL_RAIL_WINDOW ({}): a rail must hold at least one chunk in flight",
                format_size(c.proto.rail_window)
            );
        }
    }
    if args.checksum {
        c.proto.checksum = true;
    }
    if let Some(k) = args.only_rail {
        let n = c.rails.len();
        let rail = c.rails.get(k).cloned().with_context(|| format!("--only-rail {k}: there are only {n} rails"))?;
        c.rails = vec![rail];
    }
    if args.only_rail.is_some() || args.model {
        // That rail alone (a --model calibration run), or the rails the
        // model predicts: also between ranks of one host.
        c.shm = multirail::ShmMode::Off;
    }
    c.validate()?;
    Ok(c)
}

/// Starts every rank of a local (or testbed) job as a child process with
/// the same arguments plus `extra`; rank 0's stdout is ours unless
/// `capture`, in which case its lines are returned.
pub(crate) fn launch_local(
    args: &BenchArgs,
    extra: &[String],
    extra_env: &[(String, String)],
    capture: bool,
) -> anyhow::Result<(i32, Vec<String>)> {
    let np = ranks_for(args);
    // Check the flags here, once, before starting anything.
    if args.test != TestName::Group {
        spec_of(args, np)?;
    }
    let cfg = config_of(args)?;
    let pins = launch::parse_pin(&args.pin, np)?;
    let placement = crate::testbed::placement(args.testbed, &args.testbed_prefix, np, args.layout())?;
    if placement.is_none() {
        launch::check_rails(&cfg.rails, &rails_named(args))?;
    }
    fail::parse_plans(&args.fail_rail, rail_count(args)?, placement.is_some())?;
    let port = launch::free_port("127.0.0.1")?;
    let root = placement.as_ref().map_or(format!("127.0.0.1:{port}"), |p| p.root(port));
    let key = std::env::var("MULTIRAIL_KEY").ok().filter(|k| !k.is_empty()).unwrap_or_else(multirail::generate_key);
    let job = format!("bench-{}-{}", std::process::id(), multirail::generate_key());
    let exe = std::env::current_exe().context("cannot find the multirail executable")?;
    let mut argv: Vec<String> = std::env::args().skip(1).collect();
    argv.extend(extra.iter().cloned());
    let errors = launch::RankErrors::new(&job)?;
    let mut children = Vec::new();
    for rank in 0..np {
        let mut env = RankEnv {
            rank,
            size: np,
            root: root.clone(),
            key: key.clone(),
            job: job.clone(),
            extra: vec![],
            error_file: Some(errors.path(rank)),
        };
        // Ranks sharing this machine's CPUs, which decides whether waits
        // spin: every rank, the testbed's hosts included (they are
        // namespaces of this machine).
        env.extra.push(("MULTIRAIL_LOCAL_SIZE".into(), np.to_string()));
        let netns = placement.as_ref().map(|p| p.hosts[rank as usize].netns.clone());
        if let Some(p) = &placement {
            let host_rails = testbed_rails_of(args, &p.hosts[rank as usize]);
            let rails: Vec<&str> = host_rails.split(',').collect();
            let n = args.testbed_rails.unwrap_or(rails.len()).clamp(1, rails.len());
            env.extra.push(("MULTIRAIL_RAILS".into(), rails[..n].join(",")));
            env.extra.push((fail::TESTBED_HOST.into(), p.hosts[rank as usize].host.to_string()));
            env.extra.push((fail::TESTBED_PREFIX.into(), args.testbed_prefix.clone()));
        }
        let mut cmd = launch::rank_command(&exe.to_string_lossy(), &argv, pins[rank as usize], netns.as_deref());
        env.apply(&mut cmd);
        cmd.envs(extra_env.iter().map(|(k, v)| (k, v)));
        cmd.stdout(if capture && rank == 0 { Stdio::piped() } else { launch::stdout_for(rank) });
        match cmd.spawn().with_context(|| format!("starting rank {rank}")) {
            Ok(c) => children.push((rank, c)),
            Err(e) => {
                launch::kill_all(&mut children);
                return Err(e);
            }
        }
    }
    let mut lines = Vec::new();
    if capture && let Some(out) = children.first_mut().and_then(|(_, c)| c.stdout.take()) {
        for l in BufReader::new(out).lines() {
            lines.push(l?);
        }
    }
    Ok((launch::wait_all(children, &errors)?, lines))
}

/// `--compare`: every configuration once per round, alternating, then
/// medians side by side with ratios to the first.
fn run_compare(args: &BenchArgs) -> anyhow::Result<i32> {
    let configs: Vec<Config1> = args.compare.iter().map(|c| parse_config(c)).collect::<anyhow::Result<_>>()?;
    let labels: Vec<String> = args.compare.clone();
    let mut results: Vec<Vec<Vec<SizeResult>>> = vec![Vec::new(); configs.len()];
    let rounds = args.rounds.max(1);
    for round in 0..rounds {
        for (i, cfg) in configs.iter().enumerate() {
            if !args.quiet {
                eprintln!("# round {}/{rounds}: {}", round + 1, labels[i]);
            }
            let mut extra: Vec<String> = vec!["--json".into(), "--quiet".into(), "--sub-run".into()];
            for (k, v) in &cfg.flags {
                extra.push(format!("--{}", k.name()));
                extra.push(v.clone());
            }
            let mut sub = args.clone();
            sub.compare.clear();
            apply_assignments(&mut sub, &cfg.flags);
            let (code, lines) = launch_local(&sub, &extra, &cfg.env, true)?;
            if code != 0 {
                bail!("configuration '{}' failed in round {} (exit {code})", labels[i], round + 1);
            }
            let parsed: Vec<SizeResult> = lines
                .iter()
                .filter(|l| l.starts_with('{'))
                .map(|l| serde_json::from_str::<JsonRecord>(l).map(record_to_result))
                .collect::<Result<_, _>>()
                .context("reading a rank's JSON output")?;
            results[i].push(parsed);
        }
    }
    let cmp = compare::compare(test_of(args.test), &labels, &results)?;
    if args.json {
        print!("{}", compare::json_lines(&cmp));
    } else {
        println!(
            "# multirail bench {} --compare: median of {rounds} rounds per configuration, alternating",
            test_of(args.test)
        );
        print!("{}", compare::table(&cmp));
    }
    if let Some(path) = plot::target(args)? {
        let base = RunInfo::new(&config_of(args)?, &spec_of(args, ranks_for(args))?);
        plot::compared(&path, &cmp, rounds, &base)?;
        if !args.quiet {
            eprintln!("# plot written to {}", path.display());
        }
    }
    Ok(0)
}

/// One configuration of `--compare`: flags to set, and environment
/// variables (`env:MULTIRAIL_SPIN_US=0`) for its ranks.
struct Config1 {
    flags: Vec<(CompareKey, String)>,
    env: Vec<(String, String)>,
}

fn parse_config(s: &str) -> anyhow::Result<Config1> {
    let mut c = Config1 { flags: Vec::new(), env: Vec::new() };
    for item in s.split(';').map(str::trim).filter(|x| !x.is_empty()) {
        match item.strip_prefix("env:") {
            Some(kv) => {
                let (k, v) =
                    kv.split_once('=').with_context(|| format!("--compare {item}: expected env:NAME=VALUE"))?;
                c.env.push((k.trim().to_string(), v.trim().to_string()));
            }
            None => c.flags.push(compare::parse_assignment(item)?),
        }
    }
    Ok(c)
}

/// Applies comparison assignments to a copy of the flags (so the launcher
/// checks and places ranks with them).
fn apply_assignments(a: &mut BenchArgs, cfg: &[(CompareKey, String)]) {
    for (k, v) in cfg {
        match k {
            CompareKey::Policy => a.policy = Some(v.clone()),
            CompareKey::Rails => a.rails = Some(v.clone()),
            CompareKey::Progress => a.progress = Some(v.clone()),
            CompareKey::EagerLimit => a.eager_limit = Some(v.clone()),
            CompareKey::Chunk => a.chunk = Some(v.clone()),
            CompareKey::Window => a.window = v.parse().unwrap_or(a.window),
            CompareKey::TestbedRails => a.testbed_rails = v.parse().ok(),
        }
    }
}

fn record_to_result(r: JsonRecord) -> SizeResult {
    SizeResult {
        size: r.size,
        value: r.value,
        unit: r.unit,
        msg_rate: r.msg_rate,
        percentiles: match (r.p50, r.p90, r.p99) {
            (Some(p50), Some(p90), Some(p99)) => Some(multirail_perf::Percentiles {
                min: r.min.unwrap_or(f64::NAN),
                p50,
                p90,
                p99,
                max: r.max.unwrap_or(f64::NAN),
            }),
            _ => None,
        },
        iterations: r.iterations,
        warmup: r.warmup,
        rail_bytes: r.rail_bytes,
        elapsed: std::time::Duration::from_secs_f64(r.elapsed_s.max(0.0)),
        capped: r.capped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_sizes("8").unwrap(), vec![8]);
        assert_eq!(parse_sizes("1K:8K").unwrap(), vec![1024, 2048, 4096, 8192]);
        assert_eq!(parse_sizes("0:4").unwrap(), vec![0, 1, 2, 4]);
        assert_eq!(parse_sizes("8,64K,1M").unwrap(), vec![8, 65536, 1 << 20]);
        assert!(parse_sizes("4M:1K").is_err());
        assert!(parse_sizes("x").is_err());
    }

    #[test]
    fn osu_message_size_is_min_colon_max() {
        assert_eq!(parse_message_size("8", 0).unwrap(), vec![0, 1, 2, 4, 8]);
        assert_eq!(parse_message_size("8", 1).unwrap(), vec![1, 2, 4, 8]);
        assert_eq!(parse_message_size("8:1M", 1).unwrap().len(), 18);
        assert_eq!(parse_message_size("2:8", 0).unwrap(), vec![2, 4, 8]);
        let to_max = parse_message_size("1M:", 1).unwrap();
        assert_eq!(to_max, vec![1 << 20, 2 << 20, multirail_perf::osu::MAX_MESSAGE_SIZE]);
        assert!(parse_message_size("8:2", 1).unwrap_err().to_string().contains("above"));
        assert!(parse_message_size("", 1).is_err() && parse_message_size("x", 1).is_err());
    }
}
