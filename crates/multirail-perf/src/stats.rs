//! Statistics: medians (for comparisons), OSU's averages and latency
//! percentiles (through an HDR histogram).

use std::time::Duration;

use hdrhistogram::Histogram;

use crate::result::Percentiles;

/// The median of `values`, ignoring NaNs; the mean of the two middle
/// values for an even count. `None` when nothing is left.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len().is_multiple_of(2) { (v[mid - 1] + v[mid]) / 2.0 } else { v[mid] })
}

/// Sum of round-trip samples in nanoseconds, as a duration.
pub fn total(samples_ns: &[u64]) -> Duration {
    Duration::from_nanos(samples_ns.iter().sum())
}

/// OSU's latency: `t_total * 1e6 / (2.0 * iterations)`, the mean one-way
/// time in µs of round trips given in nanoseconds.
pub fn one_way_mean_us(samples_ns: &[u64]) -> f64 {
    let sum: u64 = samples_ns.iter().sum();
    sum as f64 / 1e3 / (2.0 * samples_ns.len() as f64)
}

/// min, p50/p90/p99 (3 significant digits) and max one-way latency in µs
/// of round trips given in nanoseconds; `None` without samples.
pub fn one_way_percentiles(samples_ns: &[u64]) -> Option<Percentiles> {
    if samples_ns.is_empty() {
        return None;
    }
    // Auto-resizing histogram with 3 significant figures; `new` fails only
    // for more than 5 significant figures.
    let mut h = Histogram::<u64>::new(3).expect("3 significant figures are supported");
    for &s in samples_ns {
        // `record` grows the histogram to fit; only a value beyond what
        // it can ever track fails, and is then clamped to the maximum.
        if h.record(s).is_err() {
            h.saturating_record(s);
        }
    }
    let one_way_us = |q: f64| h.value_at_quantile(q) as f64 / 2.0 / 1e3;
    let exact = |ns: Option<&u64>| ns.map_or(f64::NAN, |&s| s as f64 / 2.0 / 1e3);
    Some(Percentiles {
        min: exact(samples_ns.iter().min()),
        p50: one_way_us(0.50),
        p90: one_way_us(0.90),
        p99: one_way_us(0.99),
        max: exact(samples_ns.iter().max()),
    })
}

/// Bandwidth in MB/s (MB = 10^6 bytes) of `bytes` moved in `elapsed`.
pub fn megabytes_per_sec(bytes: f64, elapsed: Duration) -> f64 {
    bytes / 1e6 / elapsed.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_and_nan() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[10.0, 20.0]), Some(15.0));
        assert_eq!(median(&[2.0, f64::NAN, 4.0]), Some(3.0));
    }

    #[test]
    fn osu_latency_is_half_the_mean_round_trip() {
        // Round trips of 2, 4 and 6 µs: one way 1, 2, 3 µs, mean 2 µs.
        assert_eq!(one_way_mean_us(&[2000, 4000, 6000]), 2.0);
        assert_eq!(total(&[2000, 4000, 6000]), Duration::from_micros(12));
    }

    #[test]
    fn percentiles_of_known_samples() {
        // Round trips of 2..=200 µs in 2 µs steps: one way 1..=100 µs.
        let s: Vec<u64> = (1..=100).map(|i| i * 2000).collect();
        let p = one_way_percentiles(&s).unwrap();
        let close = |a: f64, b: f64| (a - b).abs() <= b * 0.002;
        assert!(close(p.p50, 50.0) && close(p.p90, 90.0) && close(p.p99, 99.0), "{p:?}");
        assert_eq!((p.min, p.max), (1.0, 100.0), "exact");
        assert_eq!(one_way_percentiles(&[]), None);
    }

    #[test]
    fn bandwidth_uses_decimal_megabytes() {
        assert_eq!(megabytes_per_sec(2e6, Duration::from_millis(500)), 4.0);
    }
}
