//! OSU's table: `# `-prefixed header lines, then one row per size printed
//! with OSU's `"%-*d%*.*f"` (width 10, then `FIELD_WIDTH` 18 and
//! `FLOAT_PRECISION` 2). Optional columns (OSU's full format, percentiles,
//! per-rail bytes and shares) come after OSU's first ones, so scripts that
//! read those read ours.
//!
//! ```text
//! # multirail OSU-style Bandwidth Test v0.1.0
//! # rails: tcp:127.0.0.1,tcp:127.0.0.2  policy: *:adaptive  progress: polled  eager-limit: 64K  chunk: 256K  checksum: off  spin: 200us  direct: on
//! # [ window size: 64 ]
//! # Size      Bandwidth (MB/s)
//! 1                       2.89
//! ```

use std::fmt::Write;

use crate::info::RunInfo;
use crate::model::ModelColumns;
use crate::report::format_size;
use crate::result::SizeResult;
use crate::spec::{Test, osu::FIELD_WIDTH};

/// Width of each per-rail column.
const RAIL_WIDTH: usize = 12;
/// The percentiles printed, as OSU's `-z` default (`50,90,99`).
const PERCENTILES: [u32; 3] = [50, 90, 99];

/// Optional columns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableOptions {
    /// Per rail: payload MB moved in the timed part and share in percent.
    pub rail_stats: bool,
    /// OSU's full format (`-f`: min and max latency, iterations) and
    /// P50/P90/P99 one-way latency columns named as OSU's `-z` ones
    /// (latency tests).
    pub full: bool,
    /// The bandwidth model's predictions and measured/predicted
    /// (`bench bw --model`), after OSU's columns and before the rails'.
    pub model: Option<ModelColumns>,
}

/// The whole table.
pub fn table(info: &RunInfo, results: &[SizeResult], opts: &TableOptions) -> String {
    let mut out = header(info, opts);
    for r in results {
        out.push_str(&row(info, r, opts));
    }
    out
}

/// The header lines, each ending in a newline.
pub fn header(info: &RunInfo, opts: &TableOptions) -> String {
    let mut out = format!("# multirail OSU-style {} v{}\n", info.test.title(), info.version);
    out.push_str(&format!(
        "# rails: {}  policy: {}  progress: {}  eager-limit: {}  chunk: {}  checksum: {}  spin: {}us  direct: {}\n",
        info.rails.join(","),
        info.policy,
        info.progress,
        format_size(info.eager_limit),
        format_size(info.chunk),
        if info.checksum { "on" } else { "off" },
        info.spin_us,
        if info.direct { "on" } else { "off" }
    ));
    match info.test {
        // OSU's own line (osu_mbw_mr.c).
        Test::MbwMr => out.push_str(&format!("# [ pairs: {} ] [ window size: {} ]\n", info.pairs, info.window)),
        Test::Bw | Test::Bibw => out.push_str(&format!("# [ window size: {} ]\n", info.window)),
        Test::MultiLat => out.push_str(&format!("# [ pairs: {} ]\n", info.pairs)),
        Test::Latency => {}
    }
    if let Some(p) = info.placement() {
        out.push_str(&format!("# placement: {p}\n"));
    }
    if let Some(m) = &opts.model {
        out.push_str(&m.header_line());
    }
    out.push_str(&columns(info, opts));
    out
}

/// The column-name line: OSU's `print_header` and osu_mbw_mr's.
fn columns(info: &RunInfo, opts: &TableOptions) -> String {
    let w = FIELD_WIDTH;
    let mut out = match info.test {
        Test::Latency | Test::MultiLat => format!("{:<10}{:>w$}", "# Size", "Latency (us)"),
        Test::Bw | Test::Bibw => format!("{:<10}{:>w$}", "# Size", "Bandwidth (MB/s)"),
        Test::MbwMr => format!("{:<10}{:>w$}{:>w$}", "# Size", "MB/s", "Messages/s"),
    };
    if info.validate {
        let _ = write!(out, "{:>w$}", "Validation");
    }
    if opts.full && info.test.is_latency() {
        let _ = write!(out, "{:>w$}{:>w$}{:>w$}", "Min Latency(us)", "Max Latency(us)", "Iterations");
        for p in PERCENTILES {
            let _ = write!(out, "{:>w$}", format!("P{p} Tail Lat(us)"));
        }
    }
    if opts.model.is_some() {
        for c in ["Multi-HCA (MB/s)", "Meas/HCA", "Multi-port (MB/s)", "Meas/port"] {
            let _ = write!(out, "{c:>w$}");
        }
    }
    if opts.rail_stats {
        for k in 0..info.rails.len() {
            let _ = write!(out, "{:>RAIL_WIDTH$}{:>RAIL_WIDTH$}", format!("rail{k}(MB)"), format!("rail{k}(%)"));
        }
    }
    out.push('\n');
    out
}

/// One size's row, ending in a newline.
pub fn row(info: &RunInfo, r: &SizeResult, opts: &TableOptions) -> String {
    let w = FIELD_WIDTH;
    let mut out = format!("{:<10}{:>w$.2}", r.size, r.value);
    if info.test == Test::MbwMr {
        let _ = write!(out, "{:>w$.2}", r.msg_rate.unwrap_or(f64::NAN));
    }
    if info.validate {
        // A failed validation ends the run, so every printed row passed.
        let _ = write!(out, "{:>w$}", "Pass");
    }
    if opts.full && info.test.is_latency() {
        match r.percentiles {
            Some(p) => {
                let _ = write!(out, "{:>w$.2}{:>w$.2}{:>w$}", p.min, p.max, r.iterations);
                let _ = write!(out, "{:>w$.2}{:>w$.2}{:>w$.2}", p.p50, p.p90, p.p99);
            }
            None => {
                let _ = write!(out, "{:>w$}{:>w$}{:>w$}", "-", "-", r.iterations);
                out.push_str(&format!("{:>w$}", "-").repeat(PERCENTILES.len()));
            }
        }
    }
    if let Some(m) = &opts.model {
        let (hca, port) = m.megabytes_per_sec();
        let (rh, rp) = m.ratios(r.value);
        let _ = write!(out, "{hca:>w$.2}{rh:>w$.3}{port:>w$.2}{rp:>w$.3}");
    }
    if opts.rail_stats {
        for (bytes, share) in r.rail_bytes.iter().zip(r.rail_shares()) {
            let _ = write!(out, "{:>RAIL_WIDTH$.2}{:>RAIL_WIDTH$.2}", *bytes as f64 / 1e6, share);
        }
    }
    out.push('\n');
    out
}

/// The row of the size whose payload check failed, as OSU prints it:
/// the size, `Fail` in the Validation column, and no measurement (the
/// run stopped at the first bad byte, so there is none to print).
pub fn failed_row(info: &RunInfo, size: u64) -> String {
    let w = FIELD_WIDTH;
    let mut out = format!("{size:<10}{:>w$}", "-");
    if info.test == Test::MbwMr {
        let _ = write!(out, "{:>w$}", "-");
    }
    let _ = write!(out, "{:>w$}", "Fail");
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::result::{Percentiles, Unit};

    pub(crate) fn info(test: Test) -> RunInfo {
        RunInfo {
            test,
            rails: vec!["tcp:127.0.0.1".into(), "tcp:127.0.0.2".into()],
            policy: "16K:single,*:adaptive".into(),
            progress: "polled".into(),
            eager_limit: 64 << 10,
            chunk: 256 << 10,
            checksum: false,
            spin_us: 200,
            direct: true,
            window: 64,
            pairs: 2,
            validate: false,
            version: "0.1.0".into(),
            hosts: vec![],
        }
    }

    fn result(size: u64, value: f64, unit: Unit) -> SizeResult {
        SizeResult {
            size,
            value,
            unit,
            msg_rate: None,
            percentiles: None,
            iterations: 10,
            warmup: 1,
            rail_bytes: vec![3_000_000, 1_000_000],
            elapsed: Duration::from_millis(2),
            capped: false,
        }
    }

    const CONFIG: &str = "# rails: tcp:127.0.0.1,tcp:127.0.0.2  policy: 16K:single,*:adaptive  progress: polled  eager-limit: 64K  chunk: 256K  checksum: off  spin: 200us  direct: on\n";

    #[test]
    fn latency_table_is_osus() {
        let rows = [result(0, 1.5, Unit::Micros), result(4194304, 1234.567, Unit::Micros)];
        let expected = String::from("# multirail OSU-style Latency Test v0.1.0\n")
            + CONFIG
            + "# Size          Latency (us)\n"
            + "0                       1.50\n"
            + "4194304              1234.57\n";
        assert_eq!(table(&info(Test::Latency), &rows, &TableOptions::default()), expected);
    }

    #[test]
    fn bw_table_is_osus() {
        let rows = [result(1, 2.891, Unit::MegabytesPerSec)];
        let expected = String::from("# multirail OSU-style Bandwidth Test v0.1.0\n")
            + CONFIG
            + "# [ window size: 64 ]\n"
            + "# Size      Bandwidth (MB/s)\n"
            + "1                       2.89\n";
        assert_eq!(table(&info(Test::Bw), &rows, &TableOptions::default()), expected);
        assert!(
            header(&info(Test::Bibw), &TableOptions::default())
                .starts_with("# multirail OSU-style Bi-Directional Bandwidth Test v0.1.0\n")
        );
    }

    #[test]
    fn mbw_mr_table_is_osus() {
        let mut r = result(8, 16.0, Unit::MegabytesPerSec);
        r.msg_rate = Some(2_000_000.0);
        let expected = String::from("# multirail OSU-style Multiple Bandwidth / Message Rate Test v0.1.0\n")
            + CONFIG
            + "# [ pairs: 2 ] [ window size: 64 ]\n"
            + "# Size                  MB/s        Messages/s\n"
            + "8                      16.00        2000000.00\n";
        assert_eq!(table(&info(Test::MbwMr), &[r], &TableOptions::default()), expected);
    }

    #[test]
    fn extra_columns_follow_osus() {
        let mut i = info(Test::MultiLat);
        i.validate = true;
        let mut r = result(2, 3.0, Unit::Micros);
        r.percentiles = Some(Percentiles { min: 1.5, p50: 2.5, p90: 4.0, p99: 10.25, max: 12.0 });
        let opts = TableOptions { rail_stats: true, full: true, model: None };
        let expected = String::from("# multirail OSU-style Multi Latency Test v0.1.0\n")
            + CONFIG
            + "# [ pairs: 2 ]\n"
            + "# Size          Latency (us)        Validation   Min Latency(us)   Max Latency(us)        Iterations"
            + "  P50 Tail Lat(us)  P90 Tail Lat(us)  P99 Tail Lat(us)"
            + "   rail0(MB)    rail0(%)   rail1(MB)    rail1(%)\n"
            + "2                       3.00              Pass              1.50             12.00                10"
            + "              2.50              4.00             10.25"
            + "        3.00       75.00        1.00       25.00\n";
        assert_eq!(table(&i, &[r], &opts), expected);
    }

    #[test]
    fn model_columns_follow_osus() {
        use crate::model::{ModelColumns, ModelInput};
        let m = ModelInput::new(2, &[500e6], None, None).unwrap();
        let opts = TableOptions { model: Some(ModelColumns::new(m, "given: --link")), ..TableOptions::default() };
        let expected = String::from("# multirail OSU-style Bandwidth Test v0.1.0\n")
            + CONFIG
            + "# [ window size: 64 ]\n"
            + "# model (NPC'09), MB/s: links [500.00, 500.00] (given: --link), NIC bus no limit, host bus no limit \
               -> multi-HCA 1000.00, multi-port 1000.00\n"
            + "# Size      Bandwidth (MB/s)  Multi-HCA (MB/s)          Meas/HCA Multi-port (MB/s)         Meas/port\n"
            + "4194304               750.00           1000.00             0.750           1000.00             0.750\n";
        let r = result(4194304, 750.0, Unit::MegabytesPerSec);
        assert_eq!(table(&info(Test::Bw), &[r], &opts), expected);
    }

    #[test]
    fn missing_percentiles_print_dashes() {
        let opts = TableOptions { rail_stats: false, full: true, model: None };
        let line = row(&info(Test::Latency), &result(1, 1.0, Unit::Micros), &opts);
        let dashes = |n: usize| format!("{:>18}", "-").repeat(n);
        assert_eq!(line, format!("1{}1.00{}{:>18}{}\n", " ".repeat(23), dashes(2), 10, dashes(3)));
    }
}
