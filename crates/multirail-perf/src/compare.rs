//! The statistics side of `multirail bench --compare A B ...`: the CLI runs
//! each configuration in turn, round after round (so a noisy machine's
//! drift hits them all alike), and hands the results here. Per size we take
//! the median over rounds of each configuration and its ratio to the first
//! configuration, and print them side by side or as JSON lines.
//!
//! A configuration is named by assignments such as `policy=adaptive`
//! ([`parse_assignment`]); [`CompareKey`] lists what may vary.

use std::fmt::{self, Write};
use std::str::FromStr;

use serde::Serialize;

use crate::report::json::to_line;
use crate::result::{SizeResult, Unit};
use crate::spec::{Test, osu::FIELD_WIDTH};
use crate::stats::median;

/// A setting a comparison may vary (the CLI applies it to the endpoint or
/// the spec).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompareKey {
    Policy,
    Rails,
    Progress,
    EagerLimit,
    Chunk,
    Window,
    /// How many of the testbed's rails to use (`--testbed-rails`).
    TestbedRails,
}

impl CompareKey {
    pub const ALL: [CompareKey; 7] = [
        CompareKey::Policy,
        CompareKey::Rails,
        CompareKey::Progress,
        CompareKey::EagerLimit,
        CompareKey::Chunk,
        CompareKey::Window,
        CompareKey::TestbedRails,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CompareKey::Policy => "policy",
            CompareKey::Rails => "rails",
            CompareKey::Progress => "progress",
            CompareKey::EagerLimit => "eager-limit",
            CompareKey::Chunk => "chunk",
            CompareKey::Window => "window",
            CompareKey::TestbedRails => "testbed-rails",
        }
    }

    /// `policy, rails, progress, eager-limit, chunk, window, testbed-rails`.
    pub fn list() -> String {
        CompareKey::ALL.map(CompareKey::name).join(", ")
    }
}

impl fmt::Display for CompareKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CompareKey {
    type Err = CompareError;
    fn from_str(s: &str) -> Result<CompareKey, CompareError> {
        let k = s.trim().to_ascii_lowercase().replace('_', "-");
        CompareKey::ALL
            .into_iter()
            .find(|c| c.name() == k)
            .ok_or_else(|| CompareError::UnknownKey(s.trim().to_string()))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompareError {
    #[error("'{0}' is not KEY=VALUE (for example policy=adaptive)")]
    NotAssignment(String),
    #[error(
        "unknown setting '{0}': a comparison may vary {keys}, or an environment variable of the ranks (env:NAME=VALUE)",
        keys = CompareKey::list()
    )]
    UnknownKey(String),
    #[error("'{0}' gives no value after '='")]
    EmptyValue(String),
    #[error("nothing to compare: no configurations")]
    NoConfigurations,
    #[error("{labels} labels for {configs} configurations")]
    LabelCount { labels: usize, configs: usize },
}

/// Splits `policy=adaptive` at the first `=` into a key and its value
/// (values may hold `=`, `,` and `:`: `policy=16K:single,*:stripe`).
pub fn parse_assignment(s: &str) -> Result<(CompareKey, String), CompareError> {
    let (key, value) = s.split_once('=').ok_or_else(|| CompareError::NotAssignment(s.to_string()))?;
    let key: CompareKey = key.parse()?;
    let value = value.trim();
    if value.is_empty() {
        return Err(CompareError::EmptyValue(s.to_string()));
    }
    Ok((key, value.to_string()))
}

/// Medians and ratios of K configurations, per size.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub test: Test,
    pub unit: Unit,
    pub labels: Vec<String>,
    pub rows: Vec<CompareRow>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CompareRow {
    pub size: u64,
    /// Per configuration: median over the rounds that measured this size.
    pub medians: Vec<Option<f64>>,
    /// Per configuration: how many rounds measured this size.
    pub rounds: Vec<usize>,
    /// Per configuration: its median over the first configuration's.
    pub ratios: Vec<Option<f64>>,
}

/// Compares `results[config][round][size]`, labelled by `labels`.
pub fn compare(test: Test, labels: &[String], results: &[Vec<Vec<SizeResult>>]) -> Result<Comparison, CompareError> {
    if results.is_empty() {
        return Err(CompareError::NoConfigurations);
    }
    if labels.len() != results.len() {
        return Err(CompareError::LabelCount { labels: labels.len(), configs: results.len() });
    }
    let rows = sizes(results).into_iter().map(|size| row(size, results)).collect();
    Ok(Comparison { test, unit: test.unit(), labels: labels.to_vec(), rows })
}

/// Every size measured, in order of first appearance.
fn sizes(results: &[Vec<Vec<SizeResult>>]) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::new();
    for r in results.iter().flatten().flatten() {
        if !out.contains(&r.size) {
            out.push(r.size);
        }
    }
    out
}

fn row(size: u64, results: &[Vec<Vec<SizeResult>>]) -> CompareRow {
    let values: Vec<Vec<f64>> = results
        .iter()
        .map(|rounds| {
            rounds.iter().flatten().filter(|r| r.size == size && !r.value.is_nan()).map(|r| r.value).collect()
        })
        .collect();
    let medians: Vec<Option<f64>> = values.iter().map(|v| median(v)).collect();
    let base = medians[0].filter(|b| *b != 0.0);
    let ratios = medians.iter().map(|m| Some(m.as_ref()? / base?)).collect();
    CompareRow { size, rounds: values.iter().map(Vec::len).collect(), medians, ratios }
}

/// Labels longer than this are replaced in the table header by `[k]` and
/// listed in a legend above it, so wide comparisons stay readable.
const LONG_LABEL: usize = 24;

/// The side-by-side table: `# Size  <label1>  <label2>  ratio2/1 ...`.
/// With long labels: a legend `# [k] <label> (N rounds)` and columns `[k]`.
pub fn table(cmp: &Comparison) -> String {
    let legend = cmp.labels.iter().any(|l| l.len() > LONG_LABEL);
    let heads: Vec<String> =
        if legend { (1..=cmp.labels.len()).map(|k| format!("[{k}]")).collect() } else { cmp.labels.clone() };
    let widths: Vec<usize> = heads.iter().map(|l| (l.len() + 2).max(FIELD_WIDTH)).collect();
    let ratio_names: Vec<String> = (2..=cmp.labels.len()).map(|k| format!("ratio{k}/1")).collect();
    let mut out = format!("# multirail OSU-style {} v{}: comparison\n", cmp.test.title(), crate::VERSION);
    if legend {
        let _ = writeln!(out, "# median {} over rounds of each configuration:", cmp.unit);
        for (k, l) in cmp.labels.iter().enumerate() {
            let _ = writeln!(out, "# [{}] {l} ({} rounds)", k + 1, max_rounds(cmp, k));
        }
    } else {
        let rounds =
            cmp.labels.iter().enumerate().map(|(k, l)| format!("{l}: {}", max_rounds(cmp, k))).collect::<Vec<_>>();
        let _ = writeln!(out, "# median {} over rounds ({})", cmp.unit, rounds.join(", "));
    }
    out.push_str(&format!("{:<10}", "# Size"));
    for (l, w) in heads.iter().zip(&widths) {
        let _ = write!(out, "{l:>w$}");
    }
    for r in &ratio_names {
        let _ = write!(out, "{r:>12}");
    }
    out.push('\n');
    for row in &cmp.rows {
        out.push_str(&format!("{:<10}", row.size));
        for (m, w) in row.medians.iter().zip(&widths) {
            let _ = write!(out, "{:>w$}", cell(*m, 2));
        }
        for r in &row.ratios[1..] {
            let _ = write!(out, "{:>12}", cell(*r, 3));
        }
        out.push('\n');
    }
    out
}

fn max_rounds(cmp: &Comparison, k: usize) -> usize {
    cmp.rows.iter().map(|r| r.rounds[k]).max().unwrap_or(0)
}

fn cell(v: Option<f64>, decimals: usize) -> String {
    v.map(|x| format!("{x:.decimals$}")).unwrap_or_else(|| "-".into())
}

#[derive(Serialize)]
struct JsonRow<'a> {
    test: Test,
    size: u64,
    unit: Unit,
    configs: Vec<JsonConfigValue<'a>>,
}

#[derive(Serialize)]
struct JsonConfigValue<'a> {
    label: &'a str,
    median: Option<f64>,
    rounds: usize,
    ratio: Option<f64>,
}

/// One JSON object per size: every configuration's median, rounds and ratio.
pub fn json_lines(cmp: &Comparison) -> String {
    let mut out = String::new();
    for row in &cmp.rows {
        let configs = (0..cmp.labels.len())
            .map(|k| JsonConfigValue {
                label: &cmp.labels[k],
                median: row.medians[k],
                rounds: row.rounds[k],
                ratio: row.ratios[k],
            })
            .collect();
        out.push_str(&to_line(&JsonRow { test: cmp.test, size: row.size, unit: cmp.unit, configs }));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn r(size: u64, value: f64) -> SizeResult {
        SizeResult {
            size,
            value,
            unit: Unit::MegabytesPerSec,
            msg_rate: None,
            percentiles: None,
            iterations: 1,
            warmup: 0,
            rail_bytes: vec![],
            elapsed: Duration::from_secs(1),
            capped: false,
        }
    }

    fn labels() -> Vec<String> {
        vec!["policy=single".into(), "policy=adaptive".into()]
    }

    /// Two configurations: the first with 3 rounds, the second with 4.
    fn sample() -> Comparison {
        let single = vec![vec![r(1, 2.0), r(2, 10.0)], vec![r(1, 4.0), r(2, 30.0)], vec![r(1, 3.0), r(2, 20.0)]];
        let adaptive =
            vec![vec![r(1, 6.0), r(2, 40.0)], vec![r(1, 2.0)], vec![r(1, 4.0), r(2, 50.0)], vec![r(1, 100.0)]];
        compare(Test::Bw, &labels(), &[single, adaptive]).unwrap()
    }

    #[test]
    fn medians_and_ratios() {
        let c = sample();
        assert_eq!(c.rows.len(), 2);
        // size 1: single {2,4,3} -> 3; adaptive {6,2,4,100} -> (4+6)/2 = 5.
        assert_eq!(c.rows[0].medians, vec![Some(3.0), Some(5.0)]);
        assert_eq!(c.rows[0].rounds, vec![3, 4]);
        assert_eq!(c.rows[0].ratios, vec![Some(1.0), Some(5.0 / 3.0)]);
        // size 2: single {10,30,20} -> 20; adaptive {40,50} -> 45.
        assert_eq!(c.rows[1].medians, vec![Some(20.0), Some(45.0)]);
        assert_eq!(c.rows[1].ratios[1], Some(2.25));
    }

    #[test]
    fn missing_and_zero_baselines_have_no_ratio() {
        let c = compare(Test::Bw, &labels(), &[vec![vec![r(1, 0.0)]], vec![vec![r(1, 2.0), r(4, 1.0)]]]).unwrap();
        assert_eq!(c.rows[0].ratios, vec![None, None]);
        assert_eq!(c.rows[1].medians, vec![None, Some(1.0)]);
        assert_eq!(c.rows[1].ratios, vec![None, None]);
    }

    #[test]
    fn comparison_table() {
        let v = crate::VERSION;
        let expected = format!("# multirail OSU-style Bandwidth Test v{v}: comparison\n")
            + "# median MB/s over rounds (policy=single: 3, policy=adaptive: 4)\n"
            + "# Size         policy=single   policy=adaptive    ratio2/1\n"
            + "1                       3.00              5.00       1.667\n"
            + "2                      20.00             45.00       2.250\n";
        assert_eq!(table(&sample()), expected);
    }

    #[test]
    fn long_labels_get_a_legend() {
        let mut c = sample();
        c.labels = vec!["rails=tcp:127.0.0.1;progress=polled".into(), "rails=tcp:127.0.0.1;progress=threaded".into()];
        let v = crate::VERSION;
        let expected = format!("# multirail OSU-style Bandwidth Test v{v}: comparison\n")
            + "# median MB/s over rounds of each configuration:\n"
            + "# [1] rails=tcp:127.0.0.1;progress=polled (3 rounds)\n"
            + "# [2] rails=tcp:127.0.0.1;progress=threaded (4 rounds)\n"
            + "# Size                   [1]               [2]    ratio2/1\n"
            + "1                       3.00              5.00       1.667\n"
            + "2                      20.00             45.00       2.250\n";
        assert_eq!(table(&c), expected);
    }

    #[test]
    fn comparison_json() {
        let got = json_lines(&sample());
        let first = got.lines().next().unwrap();
        assert_eq!(
            first,
            r#"{"test":"bw","size":1,"unit":"MB/s","configs":[{"label":"policy=single","median":3.0,"rounds":3,"ratio":1.0},{"label":"policy=adaptive","median":5.0,"rounds":4,"ratio":1.6666666666666667}]}"#
        );
        assert_eq!(got.lines().count(), 2);
    }

    #[test]
    fn assignments() {
        assert_eq!(parse_assignment("policy=adaptive"), Ok((CompareKey::Policy, "adaptive".into())));
        assert_eq!(
            parse_assignment("policy=16K:single,*:stripe"),
            Ok((CompareKey::Policy, "16K:single,*:stripe".into()))
        );
        assert_eq!(parse_assignment("eager_limit=8K"), Ok((CompareKey::EagerLimit, "8K".into())));
        assert_eq!(parse_assignment(" Chunk = 1M "), Ok((CompareKey::Chunk, "1M".into())));
        assert_eq!(parse_assignment("adaptive"), Err(CompareError::NotAssignment("adaptive".into())));
        assert_eq!(parse_assignment("window="), Err(CompareError::EmptyValue("window=".into())));
        let e = parse_assignment("colour=red").unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown setting 'colour': a comparison may vary policy, rails, progress, eager-limit, chunk, window, \
             testbed-rails, or an environment variable of the ranks (env:NAME=VALUE)"
        );
    }

    #[test]
    fn bad_inputs() {
        assert_eq!(compare(Test::Bw, &[], &[]), Err(CompareError::NoConfigurations));
        assert_eq!(compare(Test::Bw, &labels(), &[vec![]]), Err(CompareError::LabelCount { labels: 2, configs: 1 }));
    }
}
