//! One rank of a benchmark: build the endpoint, run the sweep, and (rank
//! 0) print each size's row as soon as it is measured.

use std::io::{IsTerminal, Write};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use multirail::{Endpoint, JobInfo};
use multirail_perf::report::{csv, json, osu};
use multirail_perf::{BenchError, Progress, RunInfo, SizeResult};

use super::{agree, config_of, fail, plot, spec_of};
use crate::cli::BenchArgs;

pub fn run(args: &BenchArgs, job: &JobInfo) -> anyhow::Result<i32> {
    run_with_key(args, job, None)
}

/// How long `--connect` retries a server that refuses (is not listening).
const CLIENT_REFUSED_LIMIT: std::time::Duration = std::time::Duration::from_secs(3);

pub fn run_with_key(args: &BenchArgs, job: &JobInfo, key: Option<String>) -> anyhow::Result<i32> {
    let mut cfg = config_of(args)?;
    if job.source == "--connect" {
        // A client the user started: a server that is not there is an
        // error within seconds, as with iperf3 or ucx_perftest.
        cfg.root_refused_limit = Some(CLIENT_REFUSED_LIMIT.min(cfg.setup_timeout));
    }
    if let Some(k) = key {
        cfg.key = Some(k.into_bytes());
    }
    spec_of(args, job.size)?;
    let plot_to = plot::target(args)?;
    let plans = args.fail_rail.iter().map(|s| fail::FailPlan::parse(s)).collect::<anyhow::Result<Vec<_>>>()?;
    let failure = Some(fail::Injector::prepare(plans, &mut cfg, job.rank)?).filter(|i| !i.is_empty());
    let limit = cfg.setup_timeout;
    let ep = Endpoint::from_job(cfg, job).with_context(|| format!("rank {} of {}", job.rank, job.size))?;
    let code =
        crate::launch::reported_before_drop(measure(&ep, args, job, failure.as_ref(), plot_to.as_deref(), limit))?;
    ep.close().with_context(|| format!("rank {}: closing", job.rank))?;
    Ok(code)
}

/// Everything a rank does with its endpoint: agree on the test (two
/// hosts), sweep the sizes and (rank 0) print and plot them.
fn measure(
    ep: &Endpoint,
    args: &BenchArgs,
    job: &JobInfo,
    failure: Option<&fail::Injector>,
    plot_to: Option<&std::path::Path>,
    limit: std::time::Duration,
) -> anyhow::Result<i32> {
    // Two hosts: the server runs the client's test.
    let adopted;
    let args = match job.source {
        "--server" => {
            adopted = agree::as_server(ep, args, limit)?;
            &adopted
        }
        "--connect" => {
            agree::as_client(ep, args, limit)?;
            args
        }
        _ => args,
    };
    let spec = spec_of(args, job.size)?;
    let lead = ep.rank() == 0;
    if let Some(inj) = failure.filter(|_| lead) {
        inj.check_rails(ep, 1)?;
    }
    let info = RunInfo::from_endpoint(ep, &spec);
    let model = if lead { super::model_columns(args, info.rails.len())? } else { None };
    let opts = osu::TableOptions { rail_stats: args.rail_stats, full: args.full, model: model.clone() };
    let model = model.as_ref();
    let mut out = std::io::stdout().lock();
    if lead {
        let head = if args.json {
            String::new()
        } else if args.csv {
            csv::header_with_model(info.rails.len(), model.is_some())
        } else {
            osu::header(&info, &opts)
        };
        out.write_all(head.as_bytes())?;
        out.flush()?;
    }
    let bar = progress_bar(lead && !args.quiet, spec.sizes.len());
    let mut write_err = None;
    let mut measured: Vec<SizeResult> = Vec::new();
    let mut sweep = || {
        multirail_perf::run(ep, &spec, &mut |p| match p {
            Progress::Start { size, .. } => {
                bar.set_message(format!("size {}", multirail_proto::units::format_size(size)))
            }
            Progress::Done { result: Some(r), .. } => {
                bar.inc(1);
                measured.push(r.clone());
                let line = if args.json {
                    json::line_with_model(&info, r, model)
                } else if args.csv {
                    csv::row_with_model(&info, r, model)
                } else {
                    osu::row(&info, r, &opts)
                };
                if let Err(e) = out.write_all(line.as_bytes()).and_then(|()| out.flush()) {
                    write_err.get_or_insert(e);
                }
            }
            Progress::Done { .. } => bar.inc(1),
        })
    };
    let res = match failure.filter(|_| lead) {
        Some(inj) => {
            let (res, report) = inj.watch(ep, 1, &mut sweep);
            if !args.quiet {
                eprint!("{report}");
            }
            res
        }
        None => sweep(),
    };
    bar.finish_and_clear();
    if let Some(e) = write_err {
        return Err(e.into());
    }

    let code = match res {
        Ok(_) => 0,
        Err(BenchError::Validation(v)) => {
            // OSU's table shows the failed size with `Fail`; JSON and CSV
            // rows are measurements, and there is none for it.
            if lead && !args.json && !args.csv {
                let _ = out.write_all(osu::failed_row(&info, v.size).as_bytes()).and_then(|()| out.flush());
            }
            eprintln!("multirail: validation failed on rank {}: {v}", ep.rank());
            1
        }
        Err(e) => return Err(e).context(format!("rank {}", ep.rank())),
    };
    if let Some(path) = plot_to.filter(|_| lead && code == 0) {
        plot::single(path, &info, &measured)?;
        if !args.quiet {
            eprintln!("# plot written to {}", path.display());
        }
    }
    Ok(code)
}

fn progress_bar(show: bool, len: usize) -> ProgressBar {
    if !show || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} sizes  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}
