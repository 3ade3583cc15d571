//! # multirail-perf — OSU-style benchmarks over multirail
//!
//! The layer between the `multirail bench` command and the [`multirail`]
//! library: the benchmark kernels, their statistics and the writers of
//! their reports. The CLI parses flags into a [`BenchSpec`], builds an
//! [`Endpoint`](multirail::Endpoint) per rank, calls [`run`] on every rank
//! and hands rank 0's [`SizeResult`]s to a writer in [`report`].
//!
//! What it promises:
//!
//! * **OSU semantics.** [`Test::Latency`], [`Test::Bw`], [`Test::Bibw`],
//!   [`Test::MbwMr`] and [`Test::MultiLat`] follow `osu_latency`, `osu_bw`,
//!   `osu_bibw`, `osu_mbw_mr` and `osu_multi_lat` of the OSU
//!   Micro-Benchmarks 7.x: the same rank roles, message sizes, iteration
//!   and warm-up counts, what is timed and how the number is computed
//!   (latency is half the round trip in µs; MB/s uses MB = 10^6 bytes).
//!   Where we differ from OSU the code says so next to the difference.
//! * **OSU's output.** [`report::osu`] prints OSU's header and column
//!   layout (`%-10d%18.2f`), so scripts written for OSU read our tables;
//!   our extra columns (percentiles, per-rail bytes) come after OSU's.
//!   [`report::json`] and [`report::csv`] carry every number and the full
//!   configuration.
//! * **Honest numbers.** Every loop is bounded by a count; an optional
//!   wall-clock cap per size stops early and reports the iterations that
//!   actually ran. Timed loops allocate nothing: buffers are made before
//!   the clock starts and receive buffers are reused.
//! * **Checked payloads.** With [`BenchSpec::validate`] every byte of
//!   every received message is compared with what the sender wrote; the
//!   first mismatch ends the run with a [`ValidationError`] naming the
//!   message size and offset, on every rank.
//! * **Comparisons.** [`compare`] turns rounds of runs of several
//!   configurations into medians and ratios (for `bench --compare`).
//! * **Balance ratios.** [`cbr`] computes the HotI'09 Communication
//!   Balance Ratios (intra-node / inter-node) and reads them.
//! * **A model and plots.** [`model`] predicts multi-rail bandwidth the
//!   way the NPC'09 uDAPL study does (multi-HCA and multi-port);
//!   [`report::plot`] draws results against message size as SVG or PNG
//!   with a font built in (no system fonts needed).

#![forbid(unsafe_code)]

pub mod cbr;
pub mod compare;
mod error;
mod info;
mod kernels;
pub mod model;
mod pattern;
pub mod report;
mod result;
mod spec;
pub mod stats;

pub use error::{BenchError, ValidationError};
pub use info::RunInfo;
pub use kernels::{Progress, run};
pub use result::{Percentiles, SizeResult, Unit};
pub use spec::{BenchSpec, Test, osu, osu_sizes};

/// This crate's version, printed in report headers and JSON records.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
