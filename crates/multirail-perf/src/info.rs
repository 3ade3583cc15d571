//! The configuration a run was made with, as the report writers print it.

use multirail::{Config, Endpoint};

use crate::spec::{BenchSpec, Test};

/// Everything a report says about how the numbers were made.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    pub test: Test,
    /// Rails in index order (`tcp:127.0.0.1`).
    pub rails: Vec<String>,
    /// The policy table (`16K:single,*:adaptive`).
    pub policy: String,
    /// Progress engine (`threaded`, `polled`).
    pub progress: String,
    pub eager_limit: u64,
    pub chunk: u64,
    /// CRC32C on every payload (MULTIRAIL_CHECKSUM, `--checksum`).
    pub checksum: bool,
    /// How long a waiting thread busy-polls, in microseconds
    /// (MULTIRAIL_SPIN_US; from an endpoint, the value in force).
    pub spin_us: u64,
    pub window: u32,
    pub pairs: u32,
    pub validate: bool,
    /// multirail-perf's version.
    pub version: String,
}

impl RunInfo {
    pub fn new(cfg: &Config, spec: &BenchSpec) -> RunInfo {
        RunInfo {
            test: spec.test,
            rails: cfg.rails.iter().map(|r| r.to_string()).collect(),
            policy: cfg.proto.policy.to_string(),
            progress: cfg.progress.to_string(),
            eager_limit: cfg.proto.eager_limit,
            chunk: cfg.proto.chunk,
            checksum: cfg.proto.checksum,
            spin_us: u64::try_from(cfg.spin.as_micros()).unwrap_or(u64::MAX),
            window: spec.window,
            pairs: spec.pairs,
            validate: spec.validate,
            version: crate::VERSION.to_string(),
        }
    }

    pub fn from_endpoint(ep: &Endpoint, spec: &BenchSpec) -> RunInfo {
        RunInfo::new(ep.config(), spec)
    }
}
