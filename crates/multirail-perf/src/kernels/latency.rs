//! osu_latency: rank 0 pings rank 1, which answers; one-way latency is
//! half the round trip, averaged over the timed iterations
//! (`latency = t_total * 1e6 / (2.0 * iterations)`), plus percentiles over
//! every timed round trip.

use multirail::Endpoint;

use super::driver::{Counts, drive};
use super::pingpong::{Pinger, Ponger};
use super::rails::RailMeter;
use super::{BenchError, SizePlan};
use crate::result::{SizeResult, Unit};
use crate::stats;

/// With a time cap, ranks agree whether to stop every this many round
/// trips (an agreement per round trip would double the message count).
pub(crate) const CHECK_EVERY: u64 = 32;

pub(crate) fn run_size(ep: &Endpoint, plan: &SizePlan) -> Result<Option<SizeResult>, BenchError> {
    match ep.rank() {
        0 => pinger(ep, plan).map(Some),
        _ => {
            let mut p = Ponger::new(ep, 0, plan);
            drive(ep, plan, CHECK_EVERY, |s| p.round(s.iteration))?;
            Ok(None)
        }
    }
}

fn pinger(ep: &Endpoint, plan: &SizePlan) -> Result<SizeResult, BenchError> {
    let mut p = Pinger::new(ep, 1, plan);
    let mut meter = None;
    let counts = drive(ep, plan, CHECK_EVERY, |s| {
        if s.first_timed {
            meter = Some(RailMeter::start(ep, 1));
        }
        p.round(s.iteration, s.timed)
    })?;
    let rail_bytes = meter.map(|m| m.bytes(ep)).unwrap_or_default();
    Ok(latency_result(plan, &p.samples, counts, rail_bytes))
}

/// A latency result from round trips in nanoseconds.
pub(crate) fn latency_result(plan: &SizePlan, samples: &[u64], counts: Counts, rail_bytes: Vec<u64>) -> SizeResult {
    SizeResult {
        size: plan.size,
        value: stats::one_way_mean_us(samples),
        unit: Unit::Micros,
        msg_rate: None,
        percentiles: stats::one_way_percentiles(samples),
        iterations: counts.timed,
        warmup: counts.warmup,
        rail_bytes,
        elapsed: stats::total(samples),
        capped: counts.capped,
    }
}
