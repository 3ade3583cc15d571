//! `bench --plot FILE.svg|FILE.png`: which file, and the chart for a single
//! run (written by rank 0) or a comparison (written by the launcher). The
//! drawing is `multirail_perf::report::plot`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use multirail_perf::compare::Comparison;
use multirail_perf::report::format_size;
use multirail_perf::report::plot::{self, Chart, Machine, Series};
use multirail_perf::{RunInfo, SizeResult};

use crate::cli::BenchArgs;

/// The plot this process writes: none in a launcher's sub-run (the
/// launcher plots), else `--plot`, checked now so that a bad name fails
/// before anything is measured.
pub fn target(args: &BenchArgs) -> anyhow::Result<Option<PathBuf>> {
    match &args.plot {
        Some(p) if !args.sub_run => {
            plot::check_path(p).with_context(|| format!("--plot {}", p.display()))?;
            Ok(Some(p.clone()))
        }
        _ => Ok(None),
    }
}

/// The settings line under the title: `rails ...  policy ...`.
fn settings(info: &RunInfo) -> String {
    format!(
        "policy {}  progress {}  eager-limit {}  chunk {}",
        info.policy,
        info.progress,
        format_size(info.eager_limit),
        format_size(info.chunk)
    )
}

/// One run: one line, labelled with its rails.
pub fn single(path: &Path, info: &RunInfo, results: &[SizeResult]) -> anyhow::Result<()> {
    let chart = Chart {
        test: info.test,
        config: settings(info),
        machine: Machine::this(),
        series: vec![Series {
            label: format!("rails {}", info.rails.join(",")),
            points: results.iter().map(|r| (r.size, r.value)).collect(),
        }],
        custom: None,
    };
    plot::write(path, &chart).with_context(|| format!("--plot {}", path.display()))
}

/// A comparison: one line per configuration (its medians).
pub fn compared(path: &Path, cmp: &Comparison, rounds: u32, base: &RunInfo) -> anyhow::Result<()> {
    let series = cmp
        .labels
        .iter()
        .enumerate()
        .map(|(k, label)| Series {
            label: label.clone(),
            points: cmp.rows.iter().filter_map(|r| Some((r.size, r.medians[k]?))).collect(),
        })
        .collect();
    let chart = Chart {
        test: cmp.test,
        config: format!(
            "median of {rounds} rounds per configuration; otherwise rails {}  {}",
            base.rails.join(","),
            settings(base)
        ),
        machine: Machine::this(),
        series,
        custom: None,
    };
    plot::write(path, &chart).with_context(|| format!("--plot {}", path.display()))
}
