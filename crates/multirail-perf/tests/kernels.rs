//! Every kernel smoke-runs over 2 loopback rails with tiny iteration
//! counts; its OSU table, JSON lines and CSV are parsed back.

mod common;

use std::time::Duration;

use multirail::Progress as Engine;
use multirail_perf::report::json::JsonRecord;
use multirail_perf::report::osu::TableOptions;
use multirail_perf::report::{csv, json, osu};
use multirail_perf::{BenchSpec, Progress, RunInfo, SizeResult, Test, run};

fn tiny(test: Test, pairs: u32) -> BenchSpec {
    let mut s = BenchSpec::new(test);
    s.iterations = Some(2);
    s.warmup = Some(1);
    s.window = 4;
    s.pairs = pairs;
    s
}

/// Runs `spec` on `ranks` ranks; returns rank 0's results, its run info
/// and the progress events every rank saw.
fn bench(spec: &BenchSpec, ranks: u32, engine: Engine) -> (Vec<SizeResult>, RunInfo) {
    let mut outs = common::job(
        ranks,
        |_| common::builder(2, engine),
        |ep| {
            let mut events = Vec::new();
            let r = run(&ep, spec, &mut |p: Progress| {
                events.push((p.index(), p.total(), matches!(p, Progress::Done { .. })))
            });
            (r.expect("benchmark runs"), RunInfo::from_endpoint(&ep, spec), events)
        },
    );
    let n = spec.sizes.len();
    let expected: Vec<_> = (0..n).flat_map(|i| [(i, n, false), (i, n, true)]).collect();
    for (rank, (results, _, events)) in outs.iter().enumerate() {
        assert_eq!(events, &expected, "progress events of rank {rank}");
        if rank > 0 {
            assert!(results.is_empty(), "rank {rank} returns nothing");
        }
    }
    let (results, info, _) = outs.swap_remove(0);
    (results, info)
}

/// Parses the OSU table back: OSU's columns first, then the rail columns.
fn check_table(spec: &BenchSpec, info: &RunInfo, results: &[SizeResult]) {
    let opts = TableOptions { rail_stats: true, ..TableOptions::default() };
    let text = osu::table(info, results, &opts);
    let osu_cols = if spec.test == Test::MbwMr { 3 } else { 2 };
    let rows: Vec<Vec<&str>> =
        text.lines().filter(|l| !l.starts_with('#')).map(|l| l.split_whitespace().collect()).collect();
    assert!(text.starts_with(&format!("# multirail OSU-style {} v", spec.test.title())), "{text}");
    assert_eq!(rows.len(), spec.sizes.len(), "{text}");
    for ((row, &size), r) in rows.iter().zip(&spec.sizes).zip(results) {
        assert_eq!(row.len(), osu_cols + 2 * info.rails.len(), "{text}");
        assert_eq!(row[0].parse::<u64>().unwrap(), size);
        for v in &row[1..osu_cols] {
            let v: f64 = v.parse().unwrap();
            assert!(v >= 0.0 && v.is_finite(), "{text}");
        }
        // The cell is the measured value at OSU's two decimals (a 1-byte
        // bandwidth on a loaded machine can print as 0.00; that the value
        // itself is positive is checked on the JSON, unrounded).
        assert_eq!(row[1], format!("{:.2}", r.value), "{text}");
        if size > 0 {
            assert!(r.value > 0.0, "{text}");
        }
    }
}

/// Parses the JSON lines and the CSV back.
fn check_json_and_csv(spec: &BenchSpec, info: &RunInfo, results: &[SizeResult]) {
    let text = json::lines(info, results);
    let recs: Vec<JsonRecord> = text.lines().map(|l| serde_json::from_str(l).expect("valid JSON")).collect();
    assert_eq!(recs.iter().map(|r| r.size).collect::<Vec<_>>(), spec.sizes);
    for r in &recs {
        assert_eq!(r.test, spec.test);
        assert!(r.value.is_finite() && (r.value > 0.0 || r.size == 0), "{r:?}");
        assert_eq!(r.p50.is_some(), spec.test.is_latency());
        assert_eq!(r.msg_rate.is_some(), spec.test == Test::MbwMr);
        assert_eq!(r.iterations, 2);
        assert_eq!(r.config.rails.len(), 2);
        assert_eq!(r.rail_bytes.len(), 2);
        assert_eq!((r.config.window, r.config.pairs), (spec.window, spec.pairs));
    }
    let table = csv::csv(info, results);
    assert_eq!(table.lines().count(), spec.sizes.len() + 1);
    assert!(table.starts_with("test,size,value,unit,"));
}

/// The timed part moved at least `factor * size * iterations` payload
/// bytes over rank 0's rails.
fn check_rail_bytes(results: &[SizeResult], factor: u64) {
    for r in results {
        let total: u64 = r.rail_bytes.iter().sum();
        assert!(total >= factor * r.size * r.iterations, "size {}: {:?}", r.size, r.rail_bytes);
    }
}

fn check_all(spec: &BenchSpec, info: &RunInfo, results: &[SizeResult]) {
    assert_eq!(results.len(), spec.sizes.len());
    assert!(results.iter().all(|r| r.iterations == 2 && r.warmup == 1 && !r.capped));
    check_table(spec, info, results);
    check_json_and_csv(spec, info, results);
}

#[test]
fn latency_smoke() {
    let spec = tiny(Test::Latency, 1);
    let (results, info) = bench(&spec, 2, Engine::Polled);
    assert_eq!(spec.sizes[0], 0, "OSU's latency sizes start at 0");
    check_all(&spec, &info, &results);
    check_rail_bytes(&results, 2);
    let p = results[3].percentiles.expect("percentiles");
    assert!(p.p50 > 0.0 && p.p50 <= p.p90 && p.p90 <= p.p99);
}

#[test]
fn bw_smoke() {
    let spec = tiny(Test::Bw, 1);
    let (results, info) = bench(&spec, 2, Engine::Threaded);
    assert_eq!(spec.sizes, multirail_perf::osu_sizes(1, 4 << 20));
    check_all(&spec, &info, &results);
    check_rail_bytes(&results, spec.window as u64);
}

#[test]
fn bibw_smoke() {
    let spec = tiny(Test::Bibw, 1);
    let (results, info) = bench(&spec, 2, Engine::Polled);
    check_all(&spec, &info, &results);
    // Rank 0 has received every message when its timing stops; some of
    // its own sends may still be on their way (bibw has no final reply).
    check_rail_bytes(&results, spec.window as u64);
}

#[test]
fn mbw_mr_smoke_two_pairs() {
    let spec = tiny(Test::MbwMr, 2);
    let (results, info) = bench(&spec, 4, Engine::Polled);
    check_all(&spec, &info, &results);
    check_rail_bytes(&results, spec.window as u64);
    for r in &results {
        let rate = r.msg_rate.unwrap();
        // messages/s = 1e6 * MB/s / size (OSU's print).
        assert!((rate - 1e6 * r.value / r.size as f64).abs() <= rate * 1e-9, "{r:?}");
    }
}

#[test]
fn multi_lat_smoke_two_pairs() {
    let spec = tiny(Test::MultiLat, 2);
    let (results, info) = bench(&spec, 4, Engine::Threaded);
    check_all(&spec, &info, &results);
    check_rail_bytes(&results, 2);
}

#[test]
fn validated_runs_pass_on_clean_rails() {
    for test in [Test::Latency, Test::Bw, Test::Bibw] {
        let mut spec = tiny(test, 1);
        spec.validate = true;
        spec.sizes = multirail_perf::osu_sizes(if test == Test::Latency { 0 } else { 1 }, 1 << 20);
        let (results, info) = bench(&spec, 2, Engine::Polled);
        assert_eq!(results.len(), spec.sizes.len(), "{test}");
        let table = osu::table(&info, &results, &TableOptions::default());
        assert!(table.lines().find(|l| l.starts_with("# Size")).unwrap().ends_with("Validation"), "{table}");
    }
    let mut spec = tiny(Test::MbwMr, 2);
    spec.validate = true;
    spec.sizes = vec![1, 4096, 100_000];
    assert_eq!(bench(&spec, 5, Engine::Polled).0.len(), 3, "an idle fifth rank keeps step");
}

#[test]
fn time_cap_stops_early_and_says_so() {
    for test in [Test::Latency, Test::Bw, Test::MultiLat] {
        let mut spec = tiny(test, 1);
        spec.sizes = vec![1, 64];
        spec.iterations = Some(1_000_000_000);
        spec.warmup = Some(1_000_000_000);
        spec.max_time_per_size = Some(Duration::from_millis(30));
        let (results, _) = bench(&spec, 2, Engine::Polled);
        for r in &results {
            assert!(r.capped, "{test}: {r:?}");
            assert!(r.iterations >= 1 && r.iterations < 1_000_000_000, "{test}: {r:?}");
            assert!(r.value > 0.0 && r.value.is_finite(), "{test}: {r:?}");
        }
    }
}

#[test]
fn wrong_job_size_is_refused_on_every_rank() {
    let spec = tiny(Test::Bw, 1);
    let errs = common::job(
        3,
        |_| common::builder(1, Engine::Polled),
        |ep| run(&ep, &spec, &mut |_| {}).unwrap_err().to_string(),
    );
    assert!(errs.iter().all(|e| e.contains("exactly 2 ranks")), "{errs:?}");
}
