//! `multirail bench cbr`: the HotI'09 Communication Balance Ratios. Runs
//! latency, bw, bibw and mbw_mr once intra-node (two ranks on this host
//! over shared memory) and once inter-node (two ranks on two testbed hosts,
//! or over loopback TCP without `--testbed`), each as a child `multirail
//! bench TEST --json`, and prints intra / inter per size
//! (`multirail_perf::cbr`).
//!
//! A side of the comparison is a [`Side`]: flags that place the ranks.
//!
//! # Block and cyclic (`--testbed --ranks-per-host 2 --mapping M`)
//!
//! The study's placement question, 4 ranks on 2 hosts. Both sides run in
//! the testbed:
//!
//! * intra-node: latency, bw, bibw between ranks 0 and 1 both in host0
//!   (`--ranks-per-host 2`: a 2-rank job fills one host, they talk over
//!   shared memory); mbw_mr with 2 pairs `(0,2),(1,3)` placed cyclic, so
//!   each pair is inside one host and both hosts are busy at once.
//! * inter-node: latency, bw, bibw between ranks 0 and 1 in host0 and host1
//!   (one rank per host); mbw_mr with the same 2 pairs placed block, so
//!   both pairs cross the rails at once.
//!
//! With 2 ranks per host on 2 hosts there are only these two cases: a pair
//! shares a host or it does not. So the ratios are the cluster's, not the
//! mapping's; the mapping decides which of an application's pairs get
//! which side. Under block, neighbours `(0,1),(2,3)` share a host and OSU's
//! pairs `(i, i+2)` (the mbw_mr partners) cross; under cyclic it is the
//! other way round. That is how HotI'09 reads block against cyclic: where
//! CBR-x is near 1 the mapping hardly matters for an application bound by
//! x, where it is far from 1 the mapping that keeps the heavy pairs on the
//! better side wins. The header names the mapping's placement and which
//! pairs see which side. Without `--mapping` nothing of this applies.

use anyhow::{Context, bail};
use multirail_perf::cbr::{self, CbrRecord, Metric};
use multirail_perf::report::plot::{self, Chart, CustomAxis, Machine, Series};

use clap::ValueEnum;

use crate::child;
use crate::cli::BenchArgs;
use crate::placement::{Layout, Mapping};

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
    /// Flags for the Multi-BW run (mbw_mr) instead of `flags`, `--pairs`
    /// included (the block/cyclic variant places its 4 ranks differently
    /// from its 2-rank runs); `None`: `flags` and `--pairs` from ours.
    pub multi_flags: Option<Vec<String>>,
}

/// The two sides of a run: intra-node over shm, and inter-node on the
/// testbed or (said so in the description) over loopback TCP.
pub fn sides(args: &BenchArgs) -> (Side, Side) {
    if args.testbed && args.mapping.is_some() {
        return mapping_sides(args);
    }
    let intra = Side {
        name: "intra-node",
        describe: "2 ranks on this host over shared memory (--rails shm)".into(),
        flags: vec!["--rails".into(), "shm".into()],
        env: vec![],
        multi_flags: None,
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
            multi_flags: None,
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
            multi_flags: None,
        }
    };
    (intra, inter)
}

/// Ranks per host of the block/cyclic variant: 4 ranks on 2 hosts.
pub const MAPPING_RANKS_PER_HOST: u32 = 2;
/// Pairs of its Multi-BW run.
pub const MAPPING_PAIRS: u32 = 2;

/// The block/cyclic variant (module header): both sides in the testbed,
/// 2-rank runs in one host or across two, the 4-rank mbw_mr with its pairs
/// kept in a host (cyclic) or sent across (block).
fn mapping_sides(args: &BenchArgs) -> (Side, Side) {
    let mut base = vec!["--testbed".to_string(), "--testbed-prefix".into(), args.testbed_prefix.clone()];
    if let Some(n) = args.testbed_rails {
        base.extend(["--testbed-rails".into(), n.to_string()]);
    }
    let per_host = ["--ranks-per-host".to_string(), MAPPING_RANKS_PER_HOST.to_string()];
    let multi = |m: Mapping| {
        let name = m.to_possible_value().map(|v| v.get_name().to_owned()).unwrap_or_default();
        let mut f = base.clone();
        f.extend(per_host.iter().cloned());
        f.extend(["--mapping".into(), name, "--pairs".into(), MAPPING_PAIRS.to_string()]);
        f
    };
    let (in_hosts, across) = (multi(Mapping::Cyclic), multi(Mapping::Block));
    let prefix = &args.testbed_prefix;
    let ranks = 2 * MAPPING_PAIRS;
    let layout = |m| Layout { per_host: MAPPING_RANKS_PER_HOST, mapping: m }.describe(ranks);
    let intra = Side {
        name: "intra-node",
        describe: format!(
            "ranks sharing a host of testbed '{prefix}' over shared memory: ranks 0,1 in host0; mbw_mr pairs (0,2) \
             in host0 and (1,3) in host1 at once ({})",
            layout(Mapping::Cyclic)
        ),
        flags: [base.clone(), per_host.to_vec()].concat(),
        env: vec![],
        multi_flags: Some(in_hosts),
    };
    let inter = Side {
        name: "inter-node",
        describe: format!(
            "ranks on two hosts of testbed '{prefix}' over its rails: ranks 0,1 in host0,host1; mbw_mr pairs (0,2), \
             (1,3) both across at once ({})",
            layout(Mapping::Block)
        ),
        flags: base,
        env: vec![],
        multi_flags: Some(across),
    };
    (intra, inter)
}

/// The header line of the block/cyclic variant: where `mapping` puts the 4
/// ranks and which of an application's pairs see which side.
pub fn mapping_line(mapping: Mapping) -> String {
    let placed = Layout { per_host: MAPPING_RANKS_PER_HOST, mapping }.describe(2 * MAPPING_PAIRS);
    let (near, far) = match mapping {
        Mapping::Block => ("neighbours (0,1),(2,3)", "OSU's pairs (0,2),(1,3) (mbw_mr's partners)"),
        Mapping::Cyclic => ("OSU's pairs (0,2),(1,3) (mbw_mr's partners)", "neighbours (0,1),(2,3)"),
    };
    let name = mapping.to_possible_value().map(|v| v.get_name().to_owned()).unwrap_or_default();
    format!("--mapping {name} ({placed}): {near} get the intra-node side, {far} the inter-node side")
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
    match (&side.multi_flags, metric) {
        (Some(multi), Metric::MultiBw) => {
            argv.extend(multi.iter().cloned());
            argv.extend(common_flags(args));
        }
        _ => {
            argv.extend(side.flags.iter().cloned());
            argv.extend(common_flags(args));
            if metric == Metric::MultiBw {
                argv.extend(["--pairs".into(), args.pairs.to_string()]);
            }
        }
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
    if args.mapping.is_some() {
        if args.ranks_per_host != MAPPING_RANKS_PER_HOST {
            bail!(
                "bench cbr --mapping compares block and cyclic placement of 4 ranks on 2 hosts: give \
                 --ranks-per-host {MAPPING_RANKS_PER_HOST} (not {})",
                args.ranks_per_host
            );
        }
        if args.pairs != 1 && args.pairs != MAPPING_PAIRS {
            bail!(
                "bench cbr --mapping runs mbw_mr with {MAPPING_PAIRS} pairs (4 ranks); --pairs {} does not fit",
                args.pairs
            );
        }
    }
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
        if let Some(mapping) = args.mapping.filter(|_| args.testbed) {
            println!("# {}", mapping_line(mapping));
        }
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
    fn without_mapping_nothing_changes() {
        let a = args(&["--testbed", "--testbed-prefix", "tb", "--ranks-per-host", "2", "--sizes", "8"]);
        let (intra, inter) = sides(&a);
        assert_eq!(intra.flags, ["--rails", "shm"]);
        assert_eq!(inter.flags, ["--testbed", "--testbed-prefix", "tb"]);
        assert!(intra.multi_flags.is_none() && inter.multi_flags.is_none());
    }

    #[test]
    fn block_and_cyclic_sides_run_four_ranks_on_two_hosts() {
        for mapping in ["block", "cyclic"] {
            let a = args(&[
                "--testbed",
                "--testbed-prefix",
                "bz",
                "--ranks-per-host",
                "2",
                "--mapping",
                mapping,
                "--sizes",
                "8,1M",
                "--iterations",
                "5",
            ]);
            check(&a).unwrap();
            let (intra, inter) = sides(&a);
            let tail = "--sizes 8,1M --iterations 5 --window 64 --pin none";
            // 2-rank tests: ranks 0,1 both in host0 (a 2-rank job fills one host) ...
            for (metric, test) in [(Metric::Latency, "latency"), (Metric::Bandwidth, "bw"), (Metric::BiBw, "bibw")] {
                assert_eq!(
                    child_argv(&a, metric, &intra).join(" "),
                    format!("bench {test} --json --quiet --testbed --testbed-prefix bz --ranks-per-host 2 {tail}")
                );
                // ... or in host0 and host1.
                assert_eq!(
                    child_argv(&a, metric, &inter).join(" "),
                    format!("bench {test} --json --quiet --testbed --testbed-prefix bz {tail}")
                );
            }
            // mbw_mr: pairs (0,2),(1,3) inside the hosts (cyclic) or across (block).
            assert_eq!(
                child_argv(&a, Metric::MultiBw, &intra).join(" "),
                format!(
                    "bench mbw_mr --json --quiet --testbed --testbed-prefix bz --ranks-per-host 2 --mapping cyclic \
                     --pairs 2 {tail}"
                )
            );
            assert_eq!(
                child_argv(&a, Metric::MultiBw, &inter).join(" "),
                format!(
                    "bench mbw_mr --json --quiet --testbed --testbed-prefix bz --ranks-per-host 2 --mapping block \
                     --pairs 2 {tail}"
                )
            );
            assert!(intra.describe.contains("host0: 0,2  host1: 1,3"), "{}", intra.describe);
            assert!(inter.describe.contains("host0: 0,1  host1: 2,3"), "{}", inter.describe);
        }
    }

    #[test]
    fn the_mapping_line_says_which_pairs_see_which_side() {
        let block = mapping_line(Mapping::Block);
        assert!(block.starts_with("--mapping block (host0: 0,1  host1: 2,3): neighbours (0,1),(2,3) get the intra"));
        let cyclic = mapping_line(Mapping::Cyclic);
        assert!(cyclic.starts_with("--mapping cyclic (host0: 0,2  host1: 1,3): OSU's pairs (0,2),(1,3)"), "{cyclic}");
    }

    #[test]
    fn mapping_needs_two_ranks_per_host() {
        let e = check(&args(&["--testbed", "--mapping", "cyclic"])).unwrap_err().to_string();
        assert!(e.contains("give --ranks-per-host 2 (not 1)"), "{e}");
        let e = check(&args(&["--testbed", "--ranks-per-host", "2", "--mapping", "block", "--pairs", "3"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--pairs 3 does not fit"), "{e}");
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
