//! Report writers: pure functions from a [`RunInfo`](crate::RunInfo) and
//! [`SizeResult`](crate::SizeResult)s to text. [`osu`] prints OSU's table,
//! [`json`] one JSON object per size, [`csv`] a header row and one row per
//! size. Each also offers its header and rows separately, so the CLI can
//! print a row as soon as a size finishes. [`plot`] draws SVG or PNG plots.

pub mod csv;
pub mod json;
pub mod osu;
pub mod plot;

/// A byte count as `MULTIRAIL_*` settings are written (`64K`, `4M`).
pub use multirail_proto::units::format_size;
