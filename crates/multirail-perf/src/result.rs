//! What one message size of a sweep measured.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The unit of [`SizeResult::value`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Unit {
    /// One-way latency in microseconds.
    #[serde(rename = "us")]
    Micros,
    /// Bandwidth in MB/s, MB = 10^6 bytes (as OSU).
    #[serde(rename = "MB/s")]
    MegabytesPerSec,
}

impl Unit {
    pub fn symbol(self) -> &'static str {
        match self {
            Unit::Micros => "us",
            Unit::MegabytesPerSec => "MB/s",
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.symbol())
    }
}

/// One-way latency percentiles in microseconds, with the smallest and
/// largest sample (exact; the percentiles have 3 significant digits).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// The measurement of one message size (meaningful on rank 0).
#[derive(Debug, Clone, PartialEq)]
pub struct SizeResult {
    /// Message size in bytes.
    pub size: u64,
    /// Average one-way latency (µs) or bandwidth (MB/s), as OSU computes it.
    pub value: f64,
    pub unit: Unit,
    /// Messages per second (mbw_mr).
    pub msg_rate: Option<f64>,
    /// Latency percentiles over every timed round trip (latency tests).
    pub percentiles: Option<Percentiles>,
    /// Timed iterations that ran (windows for bandwidth tests).
    pub iterations: u64,
    /// Warm-up iterations that ran.
    pub warmup: u64,
    /// Payload bytes per rail (sent + received by rank 0 to and from its
    /// partner) during the timed iterations.
    pub rail_bytes: Vec<u64>,
    /// Sum of the timed intervals (what OSU divides by).
    pub elapsed: Duration,
    /// Stopped early by [`BenchSpec::max_time_per_size`](crate::BenchSpec::max_time_per_size).
    pub capped: bool,
}

impl SizeResult {
    /// Each rail's share of [`rail_bytes`](Self::rail_bytes) in percent
    /// (all zero when nothing moved).
    pub fn rail_shares(&self) -> Vec<f64> {
        let total: u64 = self.rail_bytes.iter().sum();
        self.rail_bytes.iter().map(|&b| if total == 0 { 0.0 } else { b as f64 * 100.0 / total as f64 }).collect()
    }
}
