//! CSV (RFC 4180): a header row, then one row per size. Fields holding a
//! comma or a quote (policy tables, rail lists) are quoted. Per-rail byte
//! columns come last, one per rail.

use std::fmt::Display;

use crate::info::RunInfo;
use crate::model::ModelColumns;
use crate::result::SizeResult;

const COLUMNS: &str = "test,size,value,unit,p50_us,p90_us,p99_us,msg_rate,iterations,warmup,elapsed_s,capped,\
                       rails,policy,progress,eager_limit,chunk,window,pairs,validate,version";

/// The header row for `nrails` rails.
pub fn header(nrails: usize) -> String {
    let mut out = String::from(COLUMNS);
    for k in 0..nrails {
        out.push_str(&format!(",rail{k}_bytes"));
    }
    out.push('\n');
    out
}

/// One size's row.
pub fn row(info: &RunInfo, r: &SizeResult) -> String {
    let opt = |x: Option<f64>| x.map(|v| v.to_string()).unwrap_or_default();
    let p = r.percentiles;
    let mut fields: Vec<String> = vec![
        info.test.to_string(),
        r.size.to_string(),
        r.value.to_string(),
        r.unit.to_string(),
        opt(p.map(|p| p.p50)),
        opt(p.map(|p| p.p90)),
        opt(p.map(|p| p.p99)),
        opt(r.msg_rate),
        r.iterations.to_string(),
        r.warmup.to_string(),
        r.elapsed.as_secs_f64().to_string(),
        r.capped.to_string(),
    ];
    let config: [&dyn Display; 9] = [
        &info.rails.join(","),
        &info.policy,
        &info.progress,
        &info.eager_limit,
        &info.chunk,
        &info.window,
        &info.pairs,
        &info.validate,
        &info.version,
    ];
    fields.extend(config.iter().map(|v| v.to_string()));
    fields.extend(r.rail_bytes.iter().map(|b| b.to_string()));
    let mut out = fields.iter().map(|f| quote(f)).collect::<Vec<_>>().join(",");
    out.push('\n');
    out
}

/// The columns `bench bw --model` adds after the rails' (MB/s and ratios).
const MODEL_COLUMNS: &str = ",predicted_multi_hca,ratio_multi_hca,predicted_multi_port,ratio_multi_port";

/// [`header`], plus the model's columns when `model`.
pub fn header_with_model(nrails: usize, model: bool) -> String {
    let mut out = header(nrails);
    if model {
        out.pop();
        out.push_str(MODEL_COLUMNS);
        out.push('\n');
    }
    out
}

/// [`row`], plus the model's predictions (MB/s) and measured/predicted.
pub fn row_with_model(info: &RunInfo, r: &SizeResult, model: Option<&ModelColumns>) -> String {
    let mut out = row(info, r);
    if let Some(m) = model {
        let (hca, port) = m.megabytes_per_sec();
        let (rh, rp) = m.ratios(r.value);
        out.pop();
        out.push_str(&format!(",{hca},{rh},{port},{rp}\n"));
    }
    out
}

/// Header and every row.
pub fn csv(info: &RunInfo, results: &[SizeResult]) -> String {
    let mut out = header(info.rails.len());
    for r in results {
        out.push_str(&row(info, r));
    }
    out
}

/// Quotes a field when it needs it (RFC 4180).
pub fn quote(field: &str) -> String {
    if field.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_string()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::result::{Percentiles, Unit};
    use crate::spec::Test;

    #[test]
    fn csv_with_quoted_policy() {
        let info = RunInfo {
            test: Test::Latency,
            rails: vec!["tcp:127.0.0.1".into(), "tcp:127.0.0.2".into()],
            policy: "16K:single,*:adaptive".into(),
            progress: "polled".into(),
            eager_limit: 65536,
            chunk: 262144,
            checksum: false,
            spin_us: 200,
            direct: true,
            window: 64,
            pairs: 1,
            validate: true,
            version: "0.1.0".into(),
            hosts: vec![],
        };
        let r = SizeResult {
            size: 0,
            value: 1.5,
            unit: Unit::Micros,
            msg_rate: None,
            percentiles: Some(Percentiles { min: 1.0, p50: 1.25, p90: 2.0, p99: 4.5, max: 5.0 }),
            iterations: 1000,
            warmup: 100,
            rail_bytes: vec![0, 12],
            elapsed: Duration::from_millis(3),
            capped: false,
        };
        let expected = "test,size,value,unit,p50_us,p90_us,p99_us,msg_rate,iterations,warmup,elapsed_s,capped,\
                        rails,policy,progress,eager_limit,chunk,window,pairs,validate,version,rail0_bytes,rail1_bytes\n\
                        latency,0,1.5,us,1.25,2,4.5,,1000,100,0.003,false,\
                        \"tcp:127.0.0.1,tcp:127.0.0.2\",\"16K:single,*:adaptive\",polled,65536,262144,64,1,true,0.1.0,0,12\n";
        assert_eq!(csv(&info, &[r]), expected);
    }

    #[test]
    fn model_columns_come_last() {
        assert!(
            header_with_model(1, true)
                .ends_with(",rail0_bytes,predicted_multi_hca,ratio_multi_hca,predicted_multi_port,ratio_multi_port\n")
        );
        assert_eq!(header_with_model(1, false), header(1));
    }

    #[test]
    fn quoting() {
        assert_eq!(quote("plain"), "plain");
        assert_eq!(quote("a,b"), "\"a,b\"");
        assert_eq!(quote("say \"hi\""), "\"say \"\"hi\"\"\"");
    }
}
