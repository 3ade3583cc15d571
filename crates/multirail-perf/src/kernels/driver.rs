//! The iteration loop every kernel shares: warm-up then timed iterations,
//! bounded by count, with the agreements that stop a size early (wall-clock
//! cap) or end the run (a bad payload). Every rank runs the same sequence
//! of agreements, so ranks never disagree about where they are.

use std::time::Instant;

use multirail::Endpoint;

use super::SizePlan;
use super::coll::{self, Verdict};
use crate::error::{BenchError, ValidationError};

/// One call of a kernel's step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Step {
    /// Iteration index, warm-up included (part of the validation pattern).
    pub iteration: u64,
    /// Counted in the result (after warm-up).
    pub timed: bool,
    /// The first timed iteration: start meters and synchronise here,
    /// before starting the clock.
    pub first_timed: bool,
}

/// How many iterations ran.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counts {
    pub warmup: u64,
    pub timed: u64,
    /// Stopped by the wall-clock cap.
    pub capped: bool,
}

/// Runs `step` for the plan's warm-up and timed iterations.
///
/// Ranks agree after every iteration when validating (so a bad payload
/// stops every rank), and every `check_every` iterations when a time cap
/// is set (rank 0's clock decides; warm-up is cut short first, and at
/// least one timed iteration always runs). Without either, no message is
/// added to the benchmark's own.
pub(crate) fn drive(
    ep: &Endpoint,
    plan: &SizePlan,
    check_every: u64,
    mut step: impl FnMut(Step) -> Result<Option<ValidationError>, BenchError>,
) -> Result<Counts, BenchError> {
    let deadline = plan.cap.map(|c| Instant::now() + c);
    let total = plan.warmup.saturating_add(plan.iterations);
    let mut counts = Counts::default();
    let mut i = 0;
    while i < total {
        let timed = i >= plan.warmup;
        let bad = step(Step { iteration: i, timed, first_timed: i == plan.warmup })?;
        if timed {
            counts.timed += 1;
        } else {
            counts.warmup += 1;
        }
        let pace = deadline.is_some() && (i + 1) % check_every.max(1) == 0;
        if plan.validate || pace {
            let stop = ep.rank() == 0 && deadline.is_some_and(|d| Instant::now() >= d);
            let v = coll::agree(ep, Verdict { stop, error: bad })?;
            if let Some(e) = v.error {
                return Err(e.into());
            }
            if v.stop && !timed {
                i = plan.warmup;
                continue;
            }
            if v.stop {
                counts.capped = i + 1 < total;
                break;
            }
        }
        i += 1;
    }
    Ok(counts)
}
