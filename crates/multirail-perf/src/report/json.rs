//! JSON lines: one object per size with the measurement and the full
//! configuration it was made with. [`JsonRecord`] reads them back.

use serde::{Deserialize, Serialize};

use crate::info::RunInfo;
use crate::model::ModelColumns;
use crate::result::{SizeResult, Unit};
use crate::spec::Test;

/// One line of the JSON output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonRecord {
    pub test: Test,
    pub size: u64,
    pub value: f64,
    pub unit: Unit,
    /// One-way latency percentiles in µs (latency tests), and the
    /// smallest and largest sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p90: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    /// Messages per second (mbw_mr).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub msg_rate: Option<f64>,
    /// Payload bytes per rail during the timed iterations.
    pub rail_bytes: Vec<u64>,
    pub iterations: u64,
    pub warmup: u64,
    /// Seconds the timed intervals add up to.
    pub elapsed_s: f64,
    /// Stopped early by the time cap.
    pub capped: bool,
    /// `bench bw --model`: the NPC'09 predictions in MB/s and
    /// measured/predicted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_multi_hca: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio_multi_hca: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_multi_port: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio_multi_port: Option<f64>,
    pub config: JsonConfig,
}

/// The configuration part of a [`JsonRecord`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonConfig {
    pub rails: Vec<String>,
    pub policy: String,
    pub progress: String,
    pub eager_limit: u64,
    pub chunk: u64,
    /// CRC32C on every payload (absent in output of older versions).
    #[serde(default)]
    pub checksum: bool,
    /// Busy-poll time of a waiting thread in microseconds.
    #[serde(default)]
    pub spin_us: u64,
    /// The direct path for small messages (MULTIRAIL_DIRECT; absent in
    /// output of older versions, which had none).
    #[serde(default)]
    pub direct: bool,
    pub window: u32,
    pub pairs: u32,
    pub validate: bool,
    pub version: String,
    /// The host of every rank (rank `r` on host `hosts[r]`), so a reader
    /// knows which pairs were intra-node; absent when not known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<u32>,
}

impl JsonConfig {
    pub fn new(info: &RunInfo) -> JsonConfig {
        JsonConfig {
            rails: info.rails.clone(),
            policy: info.policy.clone(),
            progress: info.progress.clone(),
            eager_limit: info.eager_limit,
            chunk: info.chunk,
            checksum: info.checksum,
            spin_us: info.spin_us,
            direct: info.direct,
            window: info.window,
            pairs: info.pairs,
            validate: info.validate,
            version: info.version.clone(),
            hosts: info.hosts.clone(),
        }
    }
}

pub fn record(info: &RunInfo, r: &SizeResult) -> JsonRecord {
    record_with_model(info, r, None)
}

/// [`record`] with the model's predictions and ratios.
pub fn record_with_model(info: &RunInfo, r: &SizeResult, model: Option<&ModelColumns>) -> JsonRecord {
    let predicted = model.map(ModelColumns::megabytes_per_sec);
    let ratios = model.map(|m| m.ratios(r.value));
    JsonRecord {
        test: info.test,
        size: r.size,
        value: r.value,
        unit: r.unit,
        min: r.percentiles.map(|p| p.min),
        p50: r.percentiles.map(|p| p.p50),
        p90: r.percentiles.map(|p| p.p90),
        p99: r.percentiles.map(|p| p.p99),
        max: r.percentiles.map(|p| p.max),
        msg_rate: r.msg_rate,
        rail_bytes: r.rail_bytes.clone(),
        iterations: r.iterations,
        warmup: r.warmup,
        elapsed_s: r.elapsed.as_secs_f64(),
        capped: r.capped,
        predicted_multi_hca: predicted.map(|p| p.0),
        ratio_multi_hca: ratios.map(|p| p.0),
        predicted_multi_port: predicted.map(|p| p.1),
        ratio_multi_port: ratios.map(|p| p.1),
        config: JsonConfig::new(info),
    }
}

/// One size as one line of JSON (with the newline).
pub fn line(info: &RunInfo, r: &SizeResult) -> String {
    to_line(&record(info, r))
}

/// One size as one line of JSON, with the model's columns.
pub fn line_with_model(info: &RunInfo, r: &SizeResult, model: Option<&ModelColumns>) -> String {
    to_line(&record_with_model(info, r, model))
}

/// Every size, one line each.
pub fn lines(info: &RunInfo, results: &[SizeResult]) -> String {
    results.iter().map(|r| line(info, r)).collect()
}

/// Serializes a record as one line of JSON Lines, the format of every
/// `--json` of the `multirail` command (records with string map keys only).
pub fn to_line(value: &impl Serialize) -> String {
    // Our records hold only strings, numbers, booleans and sequences:
    // serde_json cannot fail on them (non-finite floats become null).
    let mut s = serde_json::to_string(value).expect("plain records always serialize");
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::result::Percentiles;

    fn info(test: Test) -> RunInfo {
        RunInfo {
            test,
            rails: vec!["tcp:127.0.0.1".into(), "tcp:127.0.0.2".into()],
            policy: "*:adaptive".into(),
            progress: "threaded".into(),
            eager_limit: 65536,
            chunk: 262144,
            checksum: false,
            spin_us: 200,
            direct: true,
            window: 64,
            pairs: 1,
            validate: false,
            version: "0.1.0".into(),
            hosts: vec![],
        }
    }

    const CONFIG: &str = r#""config":{"rails":["tcp:127.0.0.1","tcp:127.0.0.2"],"policy":"*:adaptive","progress":"threaded","eager_limit":65536,"chunk":262144,"checksum":false,"spin_us":200,"direct":true,"window":64,"pairs":1,"validate":false,"version":"0.1.0"}"#;

    #[test]
    fn latency_line_has_percentiles() {
        let r = SizeResult {
            size: 8,
            value: 1.25,
            unit: Unit::Micros,
            msg_rate: None,
            percentiles: Some(Percentiles { min: 0.5, p50: 1.0, p90: 2.0, p99: 3.5, max: 9.0 }),
            iterations: 100,
            warmup: 10,
            rail_bytes: vec![800, 0],
            elapsed: Duration::from_micros(250),
            capped: false,
        };
        let expected = String::from(
            r#"{"test":"latency","size":8,"value":1.25,"unit":"us","min":0.5,"p50":1.0,"p90":2.0,"p99":3.5,"max":9.0,"#,
        ) + r#""rail_bytes":[800,0],"iterations":100,"warmup":10,"elapsed_s":0.00025,"capped":false,"#
            + CONFIG
            + "}\n";
        let got = line(&info(Test::Latency), &r);
        assert_eq!(got, expected);
        assert_eq!(serde_json::from_str::<JsonRecord>(&got).unwrap(), record(&info(Test::Latency), &r));
    }

    #[test]
    fn mbw_mr_line_has_message_rate() {
        let r = SizeResult {
            size: 1,
            value: 2.0,
            unit: Unit::MegabytesPerSec,
            msg_rate: Some(2e6),
            percentiles: None,
            iterations: 3,
            warmup: 0,
            rail_bytes: vec![],
            elapsed: Duration::from_secs(1),
            capped: true,
        };
        let expected = String::from(r#"{"test":"mbw_mr","size":1,"value":2.0,"unit":"MB/s","msg_rate":2000000.0,"#)
            + r#""rail_bytes":[],"iterations":3,"warmup":0,"elapsed_s":1.0,"capped":true,"#
            + CONFIG
            + "}\n";
        assert_eq!(lines(&info(Test::MbwMr), &[r]), expected);
    }

    #[test]
    fn bw_line_with_model() {
        let r = SizeResult {
            size: 4194304,
            value: 500.0,
            unit: Unit::MegabytesPerSec,
            msg_rate: None,
            percentiles: None,
            iterations: 3,
            warmup: 0,
            rail_bytes: vec![],
            elapsed: Duration::from_secs(1),
            capped: false,
        };
        let m = crate::model::ModelInput::new(2, &[500e6], Some(800e6), None).unwrap();
        let m = ModelColumns::new(m, "given");
        let got = line_with_model(&info(Test::Bw), &r, Some(&m));
        assert!(
            got.contains(r#""capped":false,"predicted_multi_hca":1000.0,"ratio_multi_hca":0.5,"predicted_multi_port":800.0,"ratio_multi_port":0.625,"config""#),
            "{got}"
        );
        assert_eq!(serde_json::from_str::<JsonRecord>(&got).unwrap().predicted_multi_port, Some(800.0));
    }
}
