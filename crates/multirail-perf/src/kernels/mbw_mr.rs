//! osu_mbw_mr: ranks 0..pairs each run the bw loop to rank i + pairs, all
//! at once. As in OMB 7.4's `calc_bw`, every rank passes a barrier before
//! each window (outside the timed interval), each sender sums its window
//! times, rank 0 averages the senders' sums (`MPI_Reduce` of `t`, divided
//! by `num_pairs`) and reports
//! `size / 1e6 * pairs * iterations * window / t` MB/s and
//! `1e6 * bw / size` messages/s. Ranks from 2 * pairs on only keep step.

use std::time::Duration;

use multirail::Endpoint;

use super::bw::{bw_result, receive_windows, send_windows};
use super::coll::{recv_words, send_words};
use super::driver::drive;
use super::rails::RailMeter;
use super::{BenchError, SizePlan, tag};
use crate::result::SizeResult;

pub(crate) fn run_size(ep: &Endpoint, plan: &SizePlan) -> Result<Option<SizeResult>, BenchError> {
    let (rank, pairs) = (ep.rank(), plan.pairs);
    if rank == 0 {
        return root(ep, plan).map(Some);
    }
    if rank < pairs {
        let (elapsed, _) = send_windows(ep, rank + pairs, plan, |_| Ok(ep.barrier()?))?;
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        send_words(ep, 0, tag::GATHER, &[nanos])?;
    } else if rank < 2 * pairs {
        receive_windows(ep, rank - pairs, plan, |_| Ok(ep.barrier()?))?;
    } else {
        drive(ep, plan, 1, |_| {
            ep.barrier()?;
            Ok(None)
        })?;
    }
    Ok(None)
}

fn root(ep: &Endpoint, plan: &SizePlan) -> Result<SizeResult, BenchError> {
    let peer = plan.pairs;
    let mut meter = None;
    let (mine, counts) = send_windows(ep, peer, plan, |s| {
        ep.barrier()?;
        if s.first_timed {
            meter = Some(RailMeter::start(ep, peer));
        }
        Ok(())
    })?;
    let rail_bytes = meter.map(|m| m.bytes(ep)).unwrap_or_default();
    let mut sum = mine;
    for p in 1..plan.pairs {
        let w = recv_words(ep, p, tag::GATHER, 1)?;
        sum += Duration::from_nanos(w[0]);
    }
    let mean = sum / plan.pairs;
    let mut r = bw_result(plan, plan.pairs, mean, counts, rail_bytes);
    // = 1e6 * bw / size, without dividing by a size of 0.
    r.msg_rate = Some(f64::from(plan.pairs) * counts.timed as f64 * plan.window as f64 / mean.as_secs_f64());
    Ok(r)
}
