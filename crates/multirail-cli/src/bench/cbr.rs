//! `multirail bench cbr`: the HotI'09 Communication Balance Ratios. Runs
//! latency, bw, bibw and mbw_mr once intra-node (two ranks on this host
//! over shared memory) and once inter-node (two ranks on two testbed hosts,
//! or over loopback TCP without `--testbed`), each as a child `multirail
//! bench TEST --json`, and prints intra / inter per size
//! (`multirail_perf::cbr`).
//!
//! A side of the comparison is a [`Side`]: flags that place the ranks. The
//! block/cyclic variant of the study (4 ranks on 2 hosts) is one more pair
//! of sides once `bench --testbed` can put several ranks in one host; the
//! rest of this file does not change.

use anyhow::{Context, bail};
use multirail_perf::cbr::{self, CbrRecord, Metric};
use multirail_perf::report::plot::{self, Chart, CustomAxis, Machine, Series};

use crate::child;
use crate::cli::BenchArgs;

/// Where the ranks of one side run, as flags of `multirail bench`.
#[derive(Debug, Clone, PartialEq)]
pub struct Side {
    /// `intra-node` / `inter-node`.
    pub name: &'static str,
    /// One line for the header: where the ranks ran, over what.
    pub describe: String,
    pub flags: Vec<String>,
    /// Variables set for the side's runs (shown with the command).
    pub env: Vec<(String, String)>,
}

/// The two sides of a run: intra-node over shm, and inter-node on the
/// testbed or (said so in the description) over loopback TCP.
pub fn sides(args: &BenchArgs) -> (Side, Side) {
    let intra = Side {
        name: "intra-node",
        describe: "2 ranks on this host over shared memory (--rails shm)".into(),
        flags: vec!["--rails".into(), "shm".into()],
        env: vec![],
    };
    let inter = if args.testbed {
        let mut flags = vec!["--testbed".into(), "--testbed-prefix".into(), args.testbed_prefix.clone()];
        let mut rails = "all its rails".to_string();
        if let Some(n) = args.testbed_rails {
            flags.extend(["--testbed-rails".into(), n.to_string()]);
            rails = format!("its first {n} rail(s)");
        }
        Side {
            name: "inter-node",
            describe: format!("2 ranks in hosts host0 and host1 of testbed '{}', over {rails}", args.testbed_prefix),
            flags,
            env: vec![],
        }
    } else {
        let rails = args.rails.clone().unwrap_or_else(|| multirail::DEFAULT_RAILS.to_string());
        Side {
            name: "inter-node",
            describe: format!(
                "no --testbed: 2 ranks on THIS host over loopback TCP ({rails}, MULTIRAIL_SHM=off), standing in \
                 for two nodes"
            ),
            flags: vec!["--rails".into(), rails],
            // Ranks of one host would otherwise talk over shared memory.
            env: vec![("MULTIRAIL_SHM".into(), "off".into())],
        }
    };
    (intra, inter)
}

/// The flags every child gets from ours (sizes, loop counts, settings).
fn common_flags(args: &BenchArgs) -> Vec<String> {
    let mut out = Vec::new();
    let mut opt = |flag: &str, v: &Option<String>| {
        if let Some(v) = v {
            out.extend([flag.to_string(), v.clone()]);
        }
    };
    opt("--sizes", &args.sizes);
    opt("--policy", &args.policy);
    opt("--progress", &args.progress);
    opt("--eager-limit", &args.eager_limit);
    opt("--chunk", &args.chunk);
    if let Some(n) = args.iterations {
        out.extend(["--iterations".into(), n.to_string()]);
    }
    if let Some(n) = args.warmup {
        out.extend(["--warmup".into(), n.to_string()]);
    }
    out.extend(["--window".into(), args.window.to_string(), "--pin".into(), args.pin.clone()]);
    if args.checksum {
        out.push("--checksum".into());
    }
    if args.validate {
        out.push("--validate".into());
    }
    out
}

/// The command line of one metric on one side.
pub fn child_argv(args: &BenchArgs, metric: Metric, side: &Side) -> Vec<String> {
    let mut argv: Vec<String> = vec!["bench".into(), metric.test().name().into(), "--json".into(), "--quiet".into()];
    argv.extend(side.flags.iter().cloned());
    argv.extend(common_flags(args));
    if metric == Metric::MultiBw {
        argv.extend(["--pairs".into(), args.pairs.to_string()]);
    }
    argv
}

/// Flags that make no sense for `cbr` are refused by name.
fn check(args: &BenchArgs) -> anyhow::Result<()> {
    let refused = [
        (!args.compare.is_empty(), "--compare"),
        (args.model, "--model"),
        (args.server, "--server"),
        (args.connect.is_some(), "--connect"),
        (!args.fail_rail.is_empty(), "--fail-rail"),
        (args.csv, "--csv"),
        (args.rail_stats, "--rail-stats"),
    ];
    if let Some((_, flag)) = refused.iter().find(|(set, _)| *set) {
        bail!(
            "bench cbr runs its own local and --testbed pairs and prints a ratio table: {flag} is not available \
             with it (it takes --testbed, --sizes, --iterations, --warmup, --window, --pairs, the multirail \
             settings, --json and --plot)"
        );
    }
    Ok(())
}

/// `multirail bench cbr`.
pub fn run(args: &BenchArgs) -> anyhow::Result<i32> {
    check(args)?;
    let plot_to = super::plot::target(args)?;
    let (intra, inter) = sides(args);
    let mut rows: Vec<CbrRecord> = Vec::new();
    for metric in Metric::ALL {
        let mut points = Vec::new();
        for side in [&intra, &inter] {
            if !args.quiet {
                eprintln!("# cbr: {} {}", metric.test(), side.name);
            }
            let argv = child_argv(args, metric, side);
            let out =
                child::checked_env(&argv, &side.env).with_context(|| format!("{} {}", metric.name(), side.name))?;
            let recs = child::records(&out)?;
            points.push(recs.iter().map(|r| (r.size, r.value)).collect::<Vec<_>>());
        }
        rows.extend(cbr::ratios(metric, &points[0], &points[1]));
    }
    if args.json {
        print!("{}", cbr::json_lines(&rows));
    } else {
        println!("# multirail bench cbr: Communication Balance Ratios (HotI'09), CBR = intra / inter per size");
        println!("# intra-node: {}", intra.describe);
        println!("# inter-node: {}", inter.describe);
        println!(
            "# latency: below 1 intra-node is faster; bandwidths: above 1 intra-node is faster; \
             within {:.0}% of 1 is balanced",
            (cbr::BALANCED - 1.0) * 100.0
        );
        print!("{}", cbr::table(&rows));
    }
    if let Some(path) = plot_to {
        let chart = ratio_chart(&rows, &format!("intra: {}; inter: {}", intra.describe, inter.describe));
        plot::write(&path, &chart).with_context(|| format!("--plot {}", path.display()))?;
        if !args.quiet {
            eprintln!("# plot written to {}", path.display());
        }
    }
    Ok(0)
}

/// The four ratios against message size, on a log axis (1 = balanced).
pub fn ratio_chart(rows: &[CbrRecord], config: &str) -> Chart {
    let series = Metric::ALL
        .iter()
        .map(|&m| Series {
            label: m.name().into(),
            points: rows.iter().filter(|r| r.metric == m).map(|r| (r.size, r.cbr)).collect(),
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    Chart {
        test: multirail_perf::Test::Bw,
        config: config.into(),
        machine: Machine::this(),
        series,
        custom: Some(CustomAxis {
            what: "bench cbr: Communication Balance Ratios".into(),
            y_label: "CBR = intra / inter (1 = balanced)".into(),
            log_y: true,
        }),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn args(extra: &[&str]) -> BenchArgs {
        let mut argv = vec!["multirail", "bench", "cbr"];
        argv.extend_from_slice(extra);
        match crate::cli::Cli::parse_from(argv).command {
            crate::cli::Command::Bench(a) => *a,
            _ => unreachable!(),
        }
    }

    #[test]
    fn sides_place_ranks_on_shm_and_the_testbed() {
        let a = args(&["--testbed", "--testbed-prefix", "tb", "--sizes", "8,1M", "--iterations", "5"]);
        let (intra, inter) = sides(&a);
        assert_eq!(
            child_argv(&a, Metric::Latency, &intra).join(" "),
            "bench latency --json --quiet --rails shm --sizes 8,1M --iterations 5 --window 64 --pin none"
        );
        assert_eq!(
            child_argv(&a, Metric::MultiBw, &inter).join(" "),
            "bench mbw_mr --json --quiet --testbed --testbed-prefix tb --sizes 8,1M --iterations 5 --window 64 \
             --pin none --pairs 1"
        );
        assert!(inter.describe.contains("testbed 'tb'"), "{}", inter.describe);
        assert!(intra.env.is_empty() && inter.env.is_empty());
    }

    #[test]
    fn without_a_testbed_the_inter_node_side_keeps_off_shared_memory() {
        // Ranks of one host would otherwise talk over the automatic shm rail,
        // and both sides would measure shared memory.
        let (intra, inter) = sides(&args(&["--sizes", "8"]));
        assert_eq!(inter.env, vec![("MULTIRAIL_SHM".to_string(), "off".to_string())]);
        assert!(inter.describe.contains("MULTIRAIL_SHM=off"), "{}", inter.describe);
        assert!(intra.env.is_empty());
    }

    #[test]
    fn without_testbed_the_inter_side_says_it_is_loopback() {
        let (_, inter) = sides(&args(&["--rails", "tcp:127.0.0.1"]));
        assert_eq!(inter.flags, ["--rails", "tcp:127.0.0.1"]);
        assert!(inter.describe.starts_with("no --testbed: 2 ranks on THIS host over loopback TCP"));
    }

    #[test]
    fn flags_it_cannot_honour_are_refused_by_name() {
        for (flag, extra) in
            [("--model", vec!["--model"]), ("--compare", vec!["--compare", "policy=single"]), ("--csv", vec!["--csv"])]
        {
            let e = check(&args(&extra)).unwrap_err().to_string();
            assert!(e.contains(&format!("{flag} is not available")), "{e}");
        }
        check(&args(&["--json", "--sizes", "8"])).unwrap();
    }
}
