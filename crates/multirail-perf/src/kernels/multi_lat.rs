//! osu_multi_lat: ranks 0..pairs each ping-pong with rank i + pairs, all
//! at once. All ranks pass a barrier when the timed part starts (as OMB 5.x
//! does at `i == skip`; OMB 7.x adds a barrier before every round trip,
//! which we leave out so pairs overlap as they would in an application).
//! The reported latency is the average over pairs (OMB 5.x reduces the
//! ranks' latencies; 7.x prints rank 0's alone), and the percentiles are
//! over every pair's round trips: pingers send their samples to rank 0.

use multirail::Endpoint;

use super::coll::{recv_words, send_words};
use super::driver::{Counts, drive};
use super::latency::{CHECK_EVERY, latency_result};
use super::pingpong::{Pinger, Ponger};
use super::rails::RailMeter;
use super::{BenchError, SizePlan, tag};
use crate::result::SizeResult;

pub(crate) fn run_size(ep: &Endpoint, plan: &SizePlan) -> Result<Option<SizeResult>, BenchError> {
    let (rank, pairs) = (ep.rank(), plan.pairs);
    if rank < pairs {
        let (samples, counts, rails) = ping(ep, rank + pairs, plan)?;
        if rank != 0 {
            send_words(ep, 0, tag::GATHER, &samples)?;
            return Ok(None);
        }
        return gather(ep, plan, samples, counts, rails).map(Some);
    }
    let mut ponger = (rank < 2 * pairs).then(|| Ponger::new(ep, rank - pairs, plan));
    drive(ep, plan, CHECK_EVERY, |s| {
        if s.first_timed {
            ep.barrier()?;
        }
        match ponger.as_mut() {
            Some(p) => p.round(s.iteration),
            None => Ok(None),
        }
    })?;
    Ok(None)
}

/// Runs this pair's round trips; rank 0 also meters its rails.
fn ping(ep: &Endpoint, peer: u32, plan: &SizePlan) -> Result<(Vec<u64>, Counts, Vec<u64>), BenchError> {
    let mut p = Pinger::new(ep, peer, plan);
    let mut meter = None;
    let counts = drive(ep, plan, CHECK_EVERY, |s| {
        if s.first_timed {
            ep.barrier()?;
            if ep.rank() == 0 {
                meter = Some(RailMeter::start(ep, peer));
            }
        }
        p.round(s.iteration, s.timed)
    })?;
    let rails = meter.map(|m| m.bytes(ep)).unwrap_or_default();
    Ok((p.samples, counts, rails))
}

fn gather(
    ep: &Endpoint,
    plan: &SizePlan,
    mut all: Vec<u64>,
    counts: Counts,
    rails: Vec<u64>,
) -> Result<SizeResult, BenchError> {
    let n = all.len();
    for p in 1..plan.pairs {
        all.extend(recv_words(ep, p, tag::GATHER, n)?);
    }
    let mut r = latency_result(plan, &all, counts, rails);
    r.elapsed /= plan.pairs; // the pairs ran side by side: time per pair
    Ok(r)
}
