//! What to run: the test, the message sizes and the loop counts, with the
//! OSU Micro-Benchmarks' defaults.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::result::Unit;

/// The OSU Micro-Benchmarks (OMB) 7.x defaults, with where each comes from.
///
/// Sources: `c/util/osu_util.h`, `c/util/osu_util.c` (`process_options`),
/// `configure.ac` and the benchmarks in `c/mpi/pt2pt/standard/` of OMB 7.4.
pub mod osu {
    /// `LARGE_MESSAGE_SIZE` (osu_util.h): above this many bytes the
    /// benchmarks switch to the `*_LARGE` loop counts
    /// (`if (size > LARGE_MESSAGE_SIZE)` in osu_latency.c, osu_bw.c,
    /// osu_bibw.c, osu_multi_lat.c).
    pub const LARGE_MESSAGE_SIZE: u64 = 8192;
    /// `MAX_MESSAGE_SIZE` = `1 << 22` (osu_util.h), the default largest size.
    pub const MAX_MESSAGE_SIZE: u64 = 1 << 22;
    /// `MIN_MESSAGE_SIZE` (osu_util.h); `process_options` lowers it to 0
    /// for point-to-point latency tests (`options.min_message_size = 0`
    /// when `bench == PT2PT` and subtype `LAT`): osu_latency and
    /// osu_multi_lat start at 0 bytes, the bandwidth tests at 1.
    pub const MIN_MESSAGE_SIZE: u64 = 1;
    /// `LAT_LOOP_SMALL` / `LAT_SKIP_SMALL` (osu_util.h): latency iterations
    /// and warm-up up to `LARGE_MESSAGE_SIZE`.
    pub const LAT_LOOP_SMALL: u64 = 10_000;
    pub const LAT_SKIP_SMALL: u64 = 100;
    /// `LAT_LOOP_LARGE` / `LAT_SKIP_LARGE` (osu_util.h): above it.
    pub const LAT_LOOP_LARGE: u64 = 1_000;
    pub const LAT_SKIP_LARGE: u64 = 10;
    /// `BW_LOOP_SMALL` / `BW_SKIP_SMALL` (osu_util.h): bandwidth windows
    /// and warm-up windows up to `LARGE_MESSAGE_SIZE`.
    pub const BW_LOOP_SMALL: u64 = 100;
    pub const BW_SKIP_SMALL: u64 = 10;
    /// `BW_LOOP_LARGE` / `BW_SKIP_LARGE` (osu_util.h): above it.
    pub const BW_LOOP_LARGE: u64 = 20;
    pub const BW_SKIP_LARGE: u64 = 2;
    /// `WINDOW_SIZE_LARGE` (osu_util.h), the default `options.window_size`.
    pub const WINDOW_SIZE: u32 = 64;
    /// `AC_DEFINE([FIELD_WIDTH], [18])` in configure.ac (the 20 in
    /// osu_util.h is only a fallback when config.h is absent).
    pub const FIELD_WIDTH: usize = 18;
    /// `AC_DEFINE([FLOAT_PRECISION], [2])` in configure.ac.
    pub const FLOAT_PRECISION: usize = 2;
}

/// OSU's size sequence from `min` to `max`: 0 (if `min` is 0), then
/// doubling from 1 (`size = (size ? size * 2 : 1)` in osu_latency.c).
pub fn osu_sizes(min: u64, max: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut s = min;
    while s <= max {
        out.push(s);
        s = match s {
            0 => 1,
            _ => match s.checked_mul(2) {
                Some(n) => n,
                None => break,
            },
        };
    }
    out
}

/// The benchmarks, named after the OSU programs they reproduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Test {
    /// `osu_latency`: ping-pong between ranks 0 and 1.
    Latency,
    /// `osu_bw`: rank 0 streams windows of messages to rank 1.
    Bw,
    /// `osu_bibw`: ranks 0 and 1 stream windows to each other at once.
    Bibw,
    /// `osu_mbw_mr`: `pairs` senders stream to `pairs` receivers at once.
    MbwMr,
    /// `osu_multi_lat`: `pairs` ping-pongs at once.
    MultiLat,
}

impl Test {
    pub const ALL: [Test; 5] = [Test::Latency, Test::Bw, Test::Bibw, Test::MbwMr, Test::MultiLat];

    /// The name used on the command line and in JSON: `mbw_mr`.
    pub fn name(self) -> &'static str {
        match self {
            Test::Latency => "latency",
            Test::Bw => "bw",
            Test::Bibw => "bibw",
            Test::MbwMr => "mbw_mr",
            Test::MultiLat => "multi_lat",
        }
    }

    /// OSU's title without "OSU MPI" (`#define BENCHMARK` in each source).
    pub fn title(self) -> &'static str {
        match self {
            Test::Latency => "Latency Test",
            Test::Bw => "Bandwidth Test",
            Test::Bibw => "Bi-Directional Bandwidth Test",
            Test::MbwMr => "Multiple Bandwidth / Message Rate Test",
            Test::MultiLat => "Multi Latency Test",
        }
    }

    pub fn unit(self) -> Unit {
        if self.is_latency() { Unit::Micros } else { Unit::MegabytesPerSec }
    }

    /// Latency tests report µs (and percentiles); the others MB/s.
    pub fn is_latency(self) -> bool {
        matches!(self, Test::Latency | Test::MultiLat)
    }

    /// Tests that run `pairs` pairs (rank i with rank i + pairs).
    pub fn uses_pairs(self) -> bool {
        matches!(self, Test::MbwMr | Test::MultiLat)
    }

    /// Tests that send windows of messages.
    pub fn uses_window(self) -> bool {
        matches!(self, Test::Bw | Test::Bibw | Test::MbwMr)
    }

    /// OSU's default sizes: 0 B (latency tests only) and 1 B to 4 MiB.
    pub fn default_sizes(self) -> Vec<u64> {
        let min = if self.is_latency() { 0 } else { osu::MIN_MESSAGE_SIZE };
        osu_sizes(min, osu::MAX_MESSAGE_SIZE)
    }

    /// OSU's timed iterations for `size` (windows, for bandwidth tests).
    pub fn default_iterations(self, size: u64) -> u64 {
        let large = size > osu::LARGE_MESSAGE_SIZE;
        match self {
            Test::Latency | Test::MultiLat if large => osu::LAT_LOOP_LARGE,
            Test::Latency | Test::MultiLat => osu::LAT_LOOP_SMALL,
            Test::Bw | Test::Bibw if large => osu::BW_LOOP_LARGE,
            Test::Bw | Test::Bibw => osu::BW_LOOP_SMALL,
            // osu_mbw_mr.c's calc_bw() loops `options.iterations +
            // options.skip` for every size: no large-message switch.
            Test::MbwMr => osu::BW_LOOP_SMALL,
        }
    }

    /// OSU's warm-up iterations (`skip`) for `size`.
    pub fn default_warmup(self, size: u64) -> u64 {
        let large = size > osu::LARGE_MESSAGE_SIZE;
        match self {
            Test::Latency | Test::MultiLat if large => osu::LAT_SKIP_LARGE,
            Test::Latency | Test::MultiLat => osu::LAT_SKIP_SMALL,
            Test::Bw | Test::Bibw if large => osu::BW_SKIP_LARGE,
            Test::Bw | Test::Bibw => osu::BW_SKIP_SMALL,
            Test::MbwMr => osu::BW_SKIP_SMALL,
        }
    }
}

impl fmt::Display for Test {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Test {
    type Err = String;
    /// Accepts our names and OSU's program names (`osu_bw`).
    fn from_str(s: &str) -> Result<Test, String> {
        let t = s.trim().to_ascii_lowercase().replace('-', "_");
        let t = t.strip_prefix("osu_").unwrap_or(&t);
        Test::ALL
            .into_iter()
            .find(|x| x.name() == t)
            .ok_or_else(|| format!("unknown test '{s}' (choose latency, bw, bibw, mbw_mr or multi_lat)"))
    }
}

/// One benchmark sweep: a test over a list of message sizes.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchSpec {
    pub test: Test,
    /// Message sizes in bytes, run in this order.
    pub sizes: Vec<u64>,
    /// Timed iterations per size; `None` = OSU's default for each size.
    pub iterations: Option<u64>,
    /// Warm-up iterations per size; `None` = OSU's default for each size.
    pub warmup: Option<u64>,
    /// Messages in flight per window (bw, bibw, mbw_mr).
    pub window: u32,
    /// Pairs for mbw_mr and multi_lat: rank i works with rank i + pairs.
    /// OSU uses every rank (`pairs = numprocs / 2`); the CLI passes that.
    pub pairs: u32,
    /// Check every byte of every received message.
    pub validate: bool,
    /// Stop a size early after this long (warm-up included); the result
    /// then counts only the iterations that ran.
    pub max_time_per_size: Option<Duration>,
}

impl BenchSpec {
    /// OSU's defaults for `test`: default sizes, window 64, one pair.
    pub fn new(test: Test) -> BenchSpec {
        BenchSpec {
            test,
            sizes: test.default_sizes(),
            iterations: None,
            warmup: None,
            window: osu::WINDOW_SIZE,
            pairs: 1,
            validate: false,
            max_time_per_size: None,
        }
    }

    pub fn iterations_for(&self, size: u64) -> u64 {
        self.iterations.unwrap_or_else(|| self.test.default_iterations(size))
    }

    pub fn warmup_for(&self, size: u64) -> u64 {
        self.warmup.unwrap_or_else(|| self.test.default_warmup(size))
    }

    /// Checks the spec against a job of `ranks` ranks.
    pub fn check(&self, ranks: u32) -> Result<(), BenchError> {
        let bad = |m: String| Err(BenchError::Spec(m));
        if self.sizes.is_empty() {
            return bad("no message sizes".into());
        }
        if let Some(&s) = self.sizes.iter().find(|&&s| usize::try_from(s).is_err()) {
            return bad(format!("message size {s} does not fit in memory"));
        }
        if self.iterations == Some(0) {
            return bad("iterations must be at least 1".into());
        }
        if self.window == 0 {
            return bad("window must be at least 1".into());
        }
        if self.test.uses_pairs() {
            if self.pairs == 0 {
                return bad("pairs must be at least 1".into());
            }
            if u64::from(ranks) < 2 * u64::from(self.pairs) {
                return bad(format!(
                    "{} with {} pairs needs {} ranks, the job has {ranks}",
                    self.test,
                    self.pairs,
                    2 * self.pairs
                ));
            }
        } else if ranks != 2 {
            return bad(format!("{} needs exactly 2 ranks, the job has {ranks}", self.test));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_sizes_are_osus() {
        let bw = Test::Bw.default_sizes();
        assert_eq!(bw.len(), 23);
        assert_eq!((bw[0], bw[1], bw[22]), (1, 2, 4 << 20));
        let lat = Test::Latency.default_sizes();
        assert_eq!(lat.len(), 24);
        assert_eq!((lat[0], lat[1], lat[2], lat[23]), (0, 1, 2, 4 << 20));
        assert_eq!(Test::MultiLat.default_sizes(), lat);
        assert_eq!(osu_sizes(3, 20), vec![3, 6, 12]);
        assert_eq!(osu_sizes(u64::MAX, u64::MAX), vec![u64::MAX]);
    }

    #[test]
    fn default_counts_switch_above_8k() {
        assert_eq!((Test::Latency.default_iterations(8192), Test::Latency.default_warmup(8192)), (10_000, 100));
        assert_eq!((Test::Latency.default_iterations(8193), Test::Latency.default_warmup(8193)), (1_000, 10));
        assert_eq!((Test::Bw.default_iterations(8192), Test::Bw.default_warmup(8192)), (100, 10));
        assert_eq!((Test::Bibw.default_iterations(16384), Test::Bibw.default_warmup(16384)), (20, 2));
        assert_eq!((Test::MbwMr.default_iterations(4 << 20), Test::MbwMr.default_warmup(4 << 20)), (100, 10));
        let mut s = BenchSpec::new(Test::Bw);
        s.iterations = Some(3);
        assert_eq!((s.iterations_for(1), s.iterations_for(1 << 20), s.warmup_for(1 << 20)), (3, 3, 2));
    }

    #[test]
    fn test_names_round_trip() {
        for t in Test::ALL {
            assert_eq!(t.name().parse::<Test>(), Ok(t));
        }
        assert_eq!("osu_mbw_mr".parse::<Test>(), Ok(Test::MbwMr));
        assert_eq!("Multi-Lat".parse::<Test>(), Ok(Test::MultiLat));
        assert!("alltoall".parse::<Test>().unwrap_err().contains("choose latency"));
    }

    #[test]
    fn check_rejects_bad_specs() {
        assert!(BenchSpec::new(Test::Bw).check(2).is_ok());
        assert!(BenchSpec::new(Test::Bw).check(3).unwrap_err().to_string().contains("exactly 2 ranks"));
        let mut m = BenchSpec::new(Test::MbwMr);
        m.pairs = 2;
        assert!(m.check(4).is_ok() && m.check(5).is_ok());
        assert!(m.check(3).unwrap_err().to_string().contains("needs 4 ranks"));
        let mut w = BenchSpec::new(Test::Bibw);
        w.window = 0;
        assert!(w.check(2).is_err());
        w.window = 1;
        w.iterations = Some(0);
        assert!(w.check(2).is_err());
        w.iterations = None;
        w.sizes.clear();
        assert!(w.check(2).is_err());
    }
}
