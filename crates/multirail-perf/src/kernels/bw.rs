//! osu_bw: rank 0 isends a window of messages to rank 1 and waits for
//! them, rank 1 irecvs them and replies with 4 bytes; each window is timed
//! from the first isend to the reply and the times are summed
//! (`size / 1e6 * iterations * window_size / t_total` MB/s).

use std::time::{Duration, Instant};

use multirail::Endpoint;

use super::driver::{Counts, drive};
use super::rails::RailMeter;
use super::window::{WindowReceiver, WindowSender};
use super::{BenchError, SizePlan, tag};
use crate::result::{SizeResult, Unit};
use crate::stats;

pub(crate) fn run_size(ep: &Endpoint, plan: &SizePlan) -> Result<Option<SizeResult>, BenchError> {
    match ep.rank() {
        0 => {
            let mut meter = None;
            let (elapsed, counts) = send_windows(ep, 1, plan, |s| {
                if s.first_timed {
                    meter = Some(RailMeter::start(ep, 1));
                }
                Ok(())
            })?;
            let rail_bytes = meter.map(|m| m.bytes(ep)).unwrap_or_default();
            Ok(Some(bw_result(plan, 1, elapsed, counts, rail_bytes)))
        }
        _ => {
            receive_windows(ep, 0, plan, |_| Ok(()))?;
            Ok(None)
        }
    }
}

/// The sender's side of the bw loop to `peer`; `before` runs ahead of
/// each window, outside the timed interval. Returns the summed window time.
pub(crate) fn send_windows(
    ep: &Endpoint,
    peer: u32,
    plan: &SizePlan,
    mut before: impl FnMut(super::driver::Step) -> Result<(), BenchError>,
) -> Result<(Duration, Counts), BenchError> {
    let mut tx = WindowSender::new(ep, peer, tag::DATA, plan, 0);
    let mut elapsed = Duration::ZERO;
    let counts = drive(ep, plan, 1, |s| {
        tx.prepare(s.iteration);
        before(s)?;
        let t0 = Instant::now();
        tx.post()?;
        tx.complete()?;
        tx.await_reply()?;
        if s.timed {
            elapsed += t0.elapsed();
        }
        Ok(None)
    })?;
    Ok((elapsed, counts))
}

/// The receiver's side of the bw loop from `peer`.
pub(crate) fn receive_windows(
    ep: &Endpoint,
    peer: u32,
    plan: &SizePlan,
    mut before: impl FnMut(super::driver::Step) -> Result<(), BenchError>,
) -> Result<Counts, BenchError> {
    let mut rx = WindowReceiver::new(ep, peer, tag::DATA, plan, 0);
    drive(ep, plan, 1, |s| {
        before(s)?;
        rx.post()?;
        rx.complete()?;
        rx.reply()?;
        Ok(if plan.validate { rx.check(s.iteration) } else { None })
    })
}

/// `pairs` streams of `counts.timed` windows in `elapsed` (per stream).
pub(crate) fn bw_result(
    plan: &SizePlan,
    pairs: u32,
    elapsed: Duration,
    counts: Counts,
    rail_bytes: Vec<u64>,
) -> SizeResult {
    let messages = f64::from(pairs) * counts.timed as f64 * plan.window as f64;
    SizeResult {
        size: plan.size,
        value: stats::megabytes_per_sec(plan.size as f64 * messages, elapsed),
        unit: Unit::MegabytesPerSec,
        msg_rate: None,
        percentiles: None,
        iterations: counts.timed,
        warmup: counts.warmup,
        rail_bytes,
        elapsed,
        capped: counts.capped,
    }
}
