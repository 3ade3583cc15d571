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
    /// Small messages to a one-rail peer take the direct path
    /// (MULTIRAIL_DIRECT).
    pub direct: bool,
    pub window: u32,
    pub pairs: u32,
    pub validate: bool,
    /// multirail-perf's version.
    pub version: String,
    /// The host of every rank ([`Endpoint::hosts`]); empty when not known.
    pub hosts: Vec<u32>,
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
            direct: cfg.proto.direct_eager,
            window: spec.window,
            pairs: spec.pairs,
            validate: spec.validate,
            version: crate::VERSION.to_string(),
            hosts: Vec::new(),
        }
    }

    pub fn from_endpoint(ep: &Endpoint, spec: &BenchSpec) -> RunInfo {
        RunInfo { hosts: ep.hosts().to_vec(), ..RunInfo::new(ep.config(), spec) }
    }

    /// The pairs of ranks the test measures: `i` and `i + pairs` for the
    /// multi-pair tests, else 0 and 1.
    pub fn measured_pairs(&self) -> Vec<(u32, u32)> {
        if self.test.uses_pairs() { (0..self.pairs).map(|i| (i, i + self.pairs)).collect() } else { vec![(0, 1)] }
    }

    /// `host0: 0,1  host1: 2,3  pairs: 0-2 inter-node, 1-3 inter-node`
    /// (None when the hosts are not known).
    pub fn placement(&self) -> Option<String> {
        if self.hosts.is_empty() {
            return None;
        }
        let nhosts = self.hosts.iter().max().map_or(0, |&h| h + 1);
        let mut parts: Vec<String> = (0..nhosts)
            .map(|h| {
                let ranks: Vec<String> =
                    (0..self.hosts.len()).filter(|&r| self.hosts[r] == h).map(|r| r.to_string()).collect();
                format!("host{h}: {}", ranks.join(","))
            })
            .collect();
        let pairs: Vec<String> = self
            .measured_pairs()
            .into_iter()
            .filter_map(|(a, b)| {
                let (ha, hb) = (self.hosts.get(a as usize)?, self.hosts.get(b as usize)?);
                Some(format!("{a}-{b} {}", if ha == hb { "intra-node" } else { "inter-node" }))
            })
            .collect();
        parts.push(format!("pairs: {}", pairs.join(", ")));
        Some(parts.join("  "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(test: Test, pairs: u32, hosts: &[u32]) -> RunInfo {
        let spec = BenchSpec { pairs, ..BenchSpec::new(test) };
        RunInfo { hosts: hosts.to_vec(), ..RunInfo::new(&Config::default(), &spec) }
    }

    #[test]
    fn placement_names_hosts_and_which_measured_pairs_are_intra_node() {
        let block = info(Test::MbwMr, 2, &[0, 0, 1, 1]);
        assert_eq!(block.placement().unwrap(), "host0: 0,1  host1: 2,3  pairs: 0-2 inter-node, 1-3 inter-node");
        let cyclic = info(Test::MultiLat, 2, &[0, 1, 0, 1]);
        assert_eq!(cyclic.placement().unwrap(), "host0: 0,2  host1: 1,3  pairs: 0-2 intra-node, 1-3 intra-node");
        let local = info(Test::Bw, 1, &[0, 0]);
        assert_eq!(local.placement().unwrap(), "host0: 0,1  pairs: 0-1 intra-node");
        assert_eq!(info(Test::Latency, 1, &[]).placement(), None, "hosts not known");
    }
}
