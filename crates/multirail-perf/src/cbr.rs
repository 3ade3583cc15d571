//! Communication Balance Ratios (Subramoni, Koop and Panda, "Designing
//! Next Generation Clusters: Evaluation of InfiniBand DDR/QDR on Intel
//! Computing Platforms", HotI 2009):
//!
//! ```text
//! CBR-Latency   = Latency_Intra   / Latency_Inter
//! CBR-Bandwidth = Bandwidth_Intra / Bandwidth_Inter
//! CBR-Bi-BW     = Bi-BW_Intra     / Bi-BW_Inter
//! CBR-Multi-BW  = Multi-BW_Intra  / Multi-BW_Inter
//! ```
//!
//! per message size, "intra" measured between ranks on one host and
//! "inter" between ranks on different hosts. CBR-x = 1 means the cluster is
//! balanced for metric x: an application bound by x can be placed anywhere
//! without much effect. Below 1 latency is better inside a host; above 1
//! bandwidth is. [`BALANCED`] is how near 1 we still call balanced.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::report::format_size;
use crate::spec::Test;

/// A ratio within this factor of 1 (either way) reads as balanced.
pub const BALANCED: f64 = 1.1;

/// The four ratios of the study, each from one OSU test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Metric {
    #[serde(rename = "CBR-Latency")]
    Latency,
    #[serde(rename = "CBR-Bandwidth")]
    Bandwidth,
    #[serde(rename = "CBR-Bi-BW")]
    BiBw,
    #[serde(rename = "CBR-Multi-BW")]
    MultiBw,
}

impl Metric {
    pub const ALL: [Metric; 4] = [Metric::Latency, Metric::Bandwidth, Metric::BiBw, Metric::MultiBw];

    /// The test that measures it (OSU's osu_latency, osu_bw, osu_bibw, osu_mbw_mr).
    pub fn test(self) -> Test {
        match self {
            Metric::Latency => Test::Latency,
            Metric::Bandwidth => Test::Bw,
            Metric::BiBw => Test::Bibw,
            Metric::MultiBw => Test::MbwMr,
        }
    }

    /// The study's name: `CBR-Bi-BW`.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Latency => "CBR-Latency",
            Metric::Bandwidth => "CBR-Bandwidth",
            Metric::BiBw => "CBR-Bi-BW",
            Metric::MultiBw => "CBR-Multi-BW",
        }
    }

    /// Which applications the ratio speaks for (the study's wording).
    pub fn matters_for(self) -> &'static str {
        match self {
            Metric::Latency => "latency-bound applications",
            Metric::Bandwidth => "bandwidth-bound applications",
            Metric::BiBw => "applications that exchange data both ways at once",
            Metric::MultiBw => "communication-intensive applications (many pairs at once)",
        }
    }
}

/// One size of one metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CbrRecord {
    pub metric: Metric,
    pub test: Test,
    pub size: u64,
    /// The intra-node measurement (µs or MB/s, the test's unit).
    pub intra: f64,
    /// The inter-node measurement.
    pub inter: f64,
    pub unit: crate::Unit,
    /// intra / inter.
    pub cbr: f64,
    /// One line saying what the ratio means.
    pub reading: String,
}

/// The ratios of `metric` at every size both sides measured (sizes in the
/// order of `intra`); a size whose inter-node value is not positive has no
/// ratio and is left out.
pub fn ratios(metric: Metric, intra: &[(u64, f64)], inter: &[(u64, f64)]) -> Vec<CbrRecord> {
    intra
        .iter()
        .filter_map(|&(size, a)| {
            let b = inter.iter().find(|p| p.0 == size)?.1;
            if !(b > 0.0 && a.is_finite() && a >= 0.0) {
                return None;
            }
            let cbr = a / b;
            Some(CbrRecord {
                metric,
                test: metric.test(),
                size,
                intra: a,
                inter: b,
                unit: metric.test().unit(),
                cbr,
                reading: reading(metric, cbr),
            })
        })
        .collect()
}

/// Whether `cbr` is within [`BALANCED`] of 1.
pub fn balanced(cbr: f64) -> bool {
    cbr > 0.0 && cbr.max(1.0 / cbr) <= BALANCED
}

/// What one ratio says: `balanced: placement hardly matters` or which side
/// is better and by how much.
pub fn reading(metric: Metric, cbr: f64) -> String {
    if balanced(cbr) {
        return format!("balanced (within {:.0}% of 1): placement hardly matters", (BALANCED - 1.0) * 100.0);
    }
    if cbr <= 0.0 {
        return "intra-node measured nothing".into();
    }
    let latency = metric == Metric::Latency;
    // For latency lower is better, so a ratio below 1 favours intra-node.
    let intra_better = if latency { cbr < 1.0 } else { cbr > 1.0 };
    let factor = cbr.max(1.0 / cbr);
    let what = if latency { "lower latency" } else { "more bandwidth" };
    match intra_better {
        true => format!("intra-node {factor:.1}x {what}: keep these peers on one host"),
        false => format!("inter-node {factor:.1}x {what}: spreading these peers over hosts pays"),
    }
}

/// A one-line summary of a metric over all its sizes: the range of the
/// ratio and where (by size) it is balanced.
pub fn summary(rows: &[CbrRecord]) -> String {
    let Some(first) = rows.first() else { return "no sizes measured on both sides".into() };
    let (lo, hi) = rows.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), r| (l.min(r.cbr), h.max(r.cbr)));
    let at = |v: f64| rows.iter().find(|r| r.cbr == v).map_or(0, |r| r.size);
    let bal: Vec<&CbrRecord> = rows.iter().filter(|r| balanced(r.cbr)).collect();
    let balance = match bal.len() {
        0 => "balanced at no size".to_string(),
        n if n == rows.len() => "balanced at every size".to_string(),
        n => format!(
            "balanced at {n} of {} sizes ({} to {})",
            rows.len(),
            format_size(bal[0].size),
            format_size(bal[n - 1].size)
        ),
    };
    format!(
        "{}: {lo:.2} (at {}) to {hi:.2} (at {}), {balance}; matters for {}",
        first.metric.name(),
        format_size(at(lo)),
        format_size(at(hi)),
        first.metric.matters_for()
    )
}

/// The table `bench cbr` prints: per metric a header, its summary and one
/// row per size.
pub fn table(rows: &[CbrRecord]) -> String {
    let mut out = String::new();
    for metric in Metric::ALL {
        let mine: Vec<CbrRecord> = rows.iter().filter(|r| r.metric == metric).cloned().collect();
        if mine.is_empty() {
            continue;
        }
        let unit = metric.test().unit();
        let _ = writeln!(out, "# {} = {} intra / inter ({})", metric.name(), metric.test(), unit);
        let _ = writeln!(out, "# {}", summary(&mine));
        let _ = writeln!(out, "{:<10}{:>14}{:>14}{:>10}  Reading", "# Size", "Intra", "Inter", "CBR");
        for r in &mine {
            let _ = writeln!(out, "{:<10}{:>14.2}{:>14.2}{:>10.3}  {}", r.size, r.intra, r.inter, r.cbr, r.reading);
        }
        out.push('\n');
    }
    out
}

/// One JSON object per line, per metric and size.
pub fn json_lines(rows: &[CbrRecord]) -> String {
    rows.iter().map(crate::report::json::to_line).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The HotI'09 definitions on made-up measurements: intra / inter.
    #[test]
    fn ratios_are_intra_over_inter_at_common_sizes() {
        let intra = [(1, 0.5), (1024, 1.0), (4096, 3.0), (8192, 9.0)];
        let inter = [(1, 2.0), (1024, 1.05), (4096, 2.0), (65536, 5.0)];
        let r = ratios(Metric::Latency, &intra, &inter);
        let got: Vec<(u64, f64)> = r.iter().map(|x| (x.size, x.cbr)).collect();
        assert_eq!(got, vec![(1, 0.25), (1024, 1.0 / 1.05), (4096, 1.5)]);
        assert_eq!(r[0].test, Test::Latency);
        assert_eq!(r[0].unit, crate::Unit::Micros);
        assert_eq!(r[0].reading, "intra-node 4.0x lower latency: keep these peers on one host");
        assert_eq!(r[1].reading, "balanced (within 10% of 1): placement hardly matters");
        assert_eq!(r[2].reading, "inter-node 1.5x lower latency: spreading these peers over hosts pays");
    }

    #[test]
    fn bandwidth_reads_the_other_way() {
        let r = ratios(Metric::Bandwidth, &[(64, 300.0), (1 << 20, 100.0)], &[(64, 100.0), (1 << 20, 200.0)]);
        assert_eq!(r[0].cbr, 3.0);
        assert_eq!(r[0].reading, "intra-node 3.0x more bandwidth: keep these peers on one host");
        assert_eq!(r[1].reading, "inter-node 2.0x more bandwidth: spreading these peers over hosts pays");
        assert_eq!(r[1].unit, crate::Unit::MegabytesPerSec);
    }

    #[test]
    fn zero_inter_has_no_ratio() {
        assert!(ratios(Metric::BiBw, &[(8, 1.0)], &[(8, 0.0)]).is_empty());
        assert!(ratios(Metric::BiBw, &[(8, f64::NAN)], &[(8, 1.0)]).is_empty());
    }

    #[test]
    fn summary_and_table() {
        let r = ratios(Metric::MultiBw, &[(1, 1.0), (2, 1.05), (4, 4.0)], &[(1, 1.0), (2, 1.0), (4, 1.0)]);
        assert_eq!(
            summary(&r),
            "CBR-Multi-BW: 1.00 (at 1) to 4.00 (at 4), balanced at 2 of 3 sizes (1 to 2); \
             matters for communication-intensive applications (many pairs at once)"
        );
        let t = table(&r);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "# CBR-Multi-BW = mbw_mr intra / inter (MB/s)");
        assert_eq!(lines.len(), 3 + 3 + 1);
        let cols: Vec<&str> = lines[5].split_whitespace().take(5).collect();
        assert_eq!(cols, ["4", "4.00", "1.00", "4.000", "intra-node"], "{t}");
        assert_eq!(summary(&[]), "no sizes measured on both sides");
    }

    #[test]
    fn json_round_trip_uses_the_studys_names() {
        let r = ratios(Metric::BiBw, &[(8, 2.0)], &[(8, 1.0)]);
        let line = json_lines(&r);
        assert!(line.starts_with(r#"{"metric":"CBR-Bi-BW","test":"bibw","size":8,"intra":2.0,"inter":1.0,"#), "{line}");
        assert_eq!(serde_json::from_str::<CbrRecord>(line.trim()).unwrap(), r[0]);
    }
}
