//! Which host each rank runs on when several share a host
//! (`--ranks-per-host K --mapping block|cyclic`): one small function,
//! [`Layout::host_of`], for the launchers and for benchmarks that compare
//! intra- and inter-node pairs.

use clap::ValueEnum;

/// How ranks fill the hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Mapping {
    /// Ranks 0..K-1 on host0, K..2K-1 on host1, ...
    #[default]
    Block,
    /// Rank i on host i mod H (H = the hosts the job needs): neighbours
    /// alternate hosts.
    Cyclic,
}

/// K ranks per host, placed by a [`Mapping`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub per_host: u32,
    pub mapping: Mapping,
}

impl Default for Layout {
    /// One rank per host: rank i on host i.
    fn default() -> Self {
        Layout { per_host: 1, mapping: Mapping::Block }
    }
}

impl Layout {
    /// Hosts a job of `ranks` needs: ceil(ranks / K).
    pub fn hosts(&self, ranks: u32) -> u32 {
        ranks.div_ceil(self.per_host.max(1))
    }

    /// The host (0-based) of `rank` in a job of `ranks`.
    pub fn host_of(&self, rank: u32, ranks: u32) -> u32 {
        match self.mapping {
            Mapping::Block => rank / self.per_host.max(1),
            Mapping::Cyclic => rank % self.hosts(ranks).max(1),
        }
    }

    /// Ranks on `host`, in rank order.
    pub fn ranks_on(&self, host: u32, ranks: u32) -> Vec<u32> {
        (0..ranks).filter(|&r| self.host_of(r, ranks) == host).collect()
    }

    /// `host0: 0,1  host1: 2,3` for logs and messages.
    pub fn describe(&self, ranks: u32) -> String {
        (0..self.hosts(ranks))
            .map(|h| {
                let rs: Vec<String> = self.ranks_on(h, ranks).iter().map(u32::to_string).collect();
                format!("host{h}: {}", rs.join(","))
            })
            .collect::<Vec<_>>()
            .join("  ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(per_host: u32, mapping: Mapping) -> Layout {
        Layout { per_host, mapping }
    }

    #[test]
    fn block_fills_a_host_before_the_next() {
        let l = layout(2, Mapping::Block);
        assert_eq!((0..4).map(|r| l.host_of(r, 4)).collect::<Vec<_>>(), [0, 0, 1, 1]);
        assert_eq!(l.hosts(5), 3, "a last host half full");
        assert_eq!(l.host_of(4, 5), 2);
        assert_eq!(l.describe(4), "host0: 0,1  host1: 2,3");
    }

    #[test]
    fn cyclic_alternates_hosts() {
        let l = layout(2, Mapping::Cyclic);
        assert_eq!((0..4).map(|r| l.host_of(r, 4)).collect::<Vec<_>>(), [0, 1, 0, 1]);
        assert_eq!(l.describe(4), "host0: 0,2  host1: 1,3");
        let three = layout(2, Mapping::Cyclic);
        assert_eq!((0..6).map(|r| three.host_of(r, 6)).collect::<Vec<_>>(), [0, 1, 2, 0, 1, 2]);
        // Never more than K ranks on a host, whatever N.
        for n in 1..12 {
            for k in 1..5 {
                for m in [Mapping::Block, Mapping::Cyclic] {
                    let l = layout(k, m);
                    assert!((0..l.hosts(n)).all(|h| l.ranks_on(h, n).len() as u32 <= k), "{n} ranks, {k}/host, {m:?}");
                }
            }
        }
    }

    #[test]
    fn one_per_host_is_rank_i_on_host_i() {
        for m in [Mapping::Block, Mapping::Cyclic] {
            let l = layout(1, m);
            assert_eq!((0..3).map(|r| l.host_of(r, 3)).collect::<Vec<_>>(), [0, 1, 2]);
        }
        assert_eq!(Layout::default(), layout(1, Mapping::Block));
    }
}
