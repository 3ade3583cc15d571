//! Per-rail payload bytes moved between two moments, from the endpoint's
//! rail counters (sent + received, retransmissions included).

use multirail::Endpoint;

pub(crate) struct RailMeter {
    peer: u32,
    start: Vec<u64>,
}

impl RailMeter {
    /// Starts counting the rails to `peer`.
    pub fn start(ep: &Endpoint, peer: u32) -> RailMeter {
        RailMeter { peer, start: totals(ep, peer) }
    }

    /// Bytes per rail since [`start`](Self::start).
    pub fn bytes(&self, ep: &Endpoint) -> Vec<u64> {
        let now = totals(ep, self.peer);
        now.iter().enumerate().map(|(k, &n)| n.saturating_sub(self.start.get(k).copied().unwrap_or(0))).collect()
    }
}

/// Bytes per rail of the job (`ep.rail_names()` order): a rail the pair
/// does not use (the `shm` rail to another host, the network rails to a
/// rank of this host) counts 0.
fn totals(ep: &Endpoint, peer: u32) -> Vec<u64> {
    let mut out = vec![0; ep.config().rails.len()];
    for (g, r) in ep.rails_to(peer).into_iter().zip(ep.rail_stats(peer)) {
        out[g] = r.tx_bytes + r.rx_bytes;
    }
    out
}
