//! The sweep ([`run`]) and the OSU kernels it dispatches to, one file per
//! benchmark plus the pieces they share: window and ping-pong halves,
//! the iteration driver, small collectives and the per-rail byte meter.

mod bibw;
mod bw;
mod coll;
mod control;
mod driver;
mod latency;
mod mbw_mr;
mod multi_lat;
mod payload;
mod pingpong;
mod rails;
mod window;

use std::time::Duration;

use multirail::Endpoint;

use crate::error::BenchError;
use crate::result::SizeResult;
use crate::spec::{BenchSpec, Test};

/// Message tags. Data and replies never share a tag, and control
/// messages sit far above anything a benchmark sends.
pub(crate) mod tag {
    /// Data from the lower rank of a pair (OSU's tag 100).
    pub const DATA: u64 = 100;
    /// bibw data from rank 1 back to rank 0 (OSU's tag 10).
    pub const DATA_BACK: u64 = 10;
    /// The receiver's short reply after each bw window (OSU's tag 101).
    pub const REPLY: u64 = 101;
    /// Ping and pong of the latency tests (OSU uses tag 1 both ways).
    pub const PING: u64 = 1;
    pub const PONG: u64 = 2;
    const CONTROL: u64 = 1 << 62;
    /// Verdicts gathered to rank 0 and broadcast back.
    pub const AGREE_UP: u64 = CONTROL + 1;
    pub const AGREE_DOWN: u64 = CONTROL + 2;
    /// Per-rank results gathered to rank 0 (mbw_mr times, multi_lat samples).
    pub const GATHER: u64 = CONTROL + 3;
}

/// Where a sweep is: sent to the `progress` callback of [`run`] before
/// and after each message size, on every rank.
#[derive(Debug, Clone, Copy)]
pub enum Progress<'a> {
    /// Size `index` (of `total`) starts.
    Start { index: usize, total: usize, size: u64 },
    /// Size `index` (of `total`) finished; `result` is rank 0's.
    Done { index: usize, total: usize, size: u64, result: Option<&'a SizeResult> },
}

impl Progress<'_> {
    pub fn index(&self) -> usize {
        match *self {
            Progress::Start { index, .. } | Progress::Done { index, .. } => index,
        }
    }
    pub fn total(&self) -> usize {
        match *self {
            Progress::Start { total, .. } | Progress::Done { total, .. } => total,
        }
    }
}

/// Runs the sweep of `spec` on this rank; every rank of the job calls it.
///
/// Rank roles follow OSU (rank 0 pings or sends, rank 1 answers; with
/// pairs rank i works with rank i + pairs, higher ranks idle). Rank 0
/// returns one [`SizeResult`] per size, the other ranks an empty vector.
/// A validation failure is returned by every rank.
pub fn run(ep: &Endpoint, spec: &BenchSpec, progress: &mut dyn FnMut(Progress)) -> Result<Vec<SizeResult>, BenchError> {
    spec.check(ep.size())?;
    let total = spec.sizes.len();
    let mut out = Vec::with_capacity(if ep.rank() == 0 { total } else { 0 });
    for (index, &size) in spec.sizes.iter().enumerate() {
        progress(Progress::Start { index, total, size });
        let plan = SizePlan::new(spec, size)?;
        // OSU: MPI_Barrier before each size's loop.
        ep.barrier()?;
        let result = run_size(ep, spec.test, &plan)?;
        progress(Progress::Done { index, total, size, result: result.as_ref() });
        out.extend(result);
    }
    Ok(out)
}

fn run_size(ep: &Endpoint, test: Test, plan: &SizePlan) -> Result<Option<SizeResult>, BenchError> {
    match test {
        Test::Latency => latency::run_size(ep, plan),
        Test::Bw => bw::run_size(ep, plan),
        Test::Bibw => bibw::run_size(ep, plan),
        Test::MbwMr => mbw_mr::run_size(ep, plan),
        Test::MultiLat => multi_lat::run_size(ep, plan),
    }
}

const MAX_SAMPLE_RESERVE: usize = 1 << 24;

/// One size of a sweep, with every count resolved.
#[derive(Debug, Clone)]
pub(crate) struct SizePlan {
    pub size: u64,
    /// `size` as a buffer length (checked to fit).
    pub len: usize,
    pub iterations: u64,
    pub warmup: u64,
    pub window: usize,
    pub pairs: u32,
    pub validate: bool,
    pub cap: Option<Duration>,
}

impl SizePlan {
    fn new(spec: &BenchSpec, size: u64) -> Result<SizePlan, BenchError> {
        let len = usize::try_from(size)
            .map_err(|_| BenchError::Spec(format!("message size {size} does not fit in memory")))?;
        Ok(SizePlan {
            size,
            len,
            iterations: spec.iterations_for(size),
            warmup: spec.warmup_for(size),
            window: spec.window as usize,
            pairs: spec.pairs,
            validate: spec.validate,
            cap: spec.max_time_per_size,
        })
    }

    /// Capacity for per-iteration samples. At most `iterations` are
    /// timed, so up to 16 Mi iterations (128 MiB of samples) pushing never
    /// reallocates; beyond that (or with a huge count bounded by a time
    /// cap) the vector grows, rarely, rather than reserving gigabytes.
    pub fn sample_capacity(&self) -> usize {
        usize::try_from(self.iterations).unwrap_or(usize::MAX).min(MAX_SAMPLE_RESERVE)
    }
}
