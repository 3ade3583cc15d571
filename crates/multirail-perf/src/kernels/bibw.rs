//! osu_bibw: ranks 0 and 1 each post a window of irecvs, then isend a
//! window to the other, then wait for all (rank 0: sends then receives;
//! rank 1: receives then sends, as OSU). Rank 0 times each window and
//! counts both directions: `size / 1e6 * iterations * window * 2 / t_total`.

use std::time::{Duration, Instant};

use multirail::Endpoint;

use super::driver::drive;
use super::rails::RailMeter;
use super::window::{WindowReceiver, WindowSender};
use super::{BenchError, SizePlan, tag};
use crate::result::SizeResult;

pub(crate) fn run_size(ep: &Endpoint, plan: &SizePlan) -> Result<Option<SizeResult>, BenchError> {
    match ep.rank() {
        0 => rank0(ep, plan).map(Some),
        _ => {
            let mut tx = WindowSender::new(ep, 0, tag::DATA_BACK, plan, 1);
            let mut rx = WindowReceiver::new(ep, 0, tag::DATA, plan, 0);
            drive(ep, plan, 1, |s| {
                tx.prepare(s.iteration);
                rx.post()?;
                tx.post()?;
                rx.complete()?;
                tx.complete()?;
                Ok(if plan.validate { rx.check(s.iteration) } else { None })
            })?;
            Ok(None)
        }
    }
}

fn rank0(ep: &Endpoint, plan: &SizePlan) -> Result<SizeResult, BenchError> {
    let mut tx = WindowSender::new(ep, 1, tag::DATA, plan, 0);
    let mut rx = WindowReceiver::new(ep, 1, tag::DATA_BACK, plan, 1);
    let mut elapsed = Duration::ZERO;
    let mut meter = None;
    let counts = drive(ep, plan, 1, |s| {
        tx.prepare(s.iteration);
        if s.first_timed {
            meter = Some(RailMeter::start(ep, 1));
        }
        let t0 = Instant::now();
        rx.post()?;
        tx.post()?;
        tx.complete()?;
        rx.complete()?;
        if s.timed {
            elapsed += t0.elapsed();
        }
        Ok(if plan.validate { rx.check(s.iteration) } else { None })
    })?;
    let rail_bytes = meter.map(|m| m.bytes(ep)).unwrap_or_default();
    // Both directions: twice the pairs of a one-way stream.
    Ok(super::bw::bw_result(plan, 2, elapsed, counts, rail_bytes))
}
