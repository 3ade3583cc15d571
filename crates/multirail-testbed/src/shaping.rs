//! The `tbf` parameters that emulate a link of a given rate.
//!
//! `tbf` sends a packet when its bucket holds enough tokens; tokens arrive at
//! `rate` and the bucket holds at most `burst` bytes. Two constraints pick
//! `burst` (measurements in `docs/testbed.md`, section Shaping):
//!
//! * It must hold one whole GSO packet. veth hands `tbf` TCP super-packets
//!   of up to 64 KiB payload, which `tbf` charges with every segment's
//!   headers (about 68 KiB). A smaller bucket makes `tbf` split them in
//!   software: a 64 KiB bucket cost retransmits and up to 6% of the rate,
//!   32 KiB and below much more.
//! * It must absorb the jitter of the dequeue timer: tokens beyond `burst`
//!   are lost, so a late softirq costs `rate × delay`. 100 µs of line rate
//!   keeps a single stream at the emulated wire speed up to 5 Gbit/s on a
//!   two-core VM.
//!
//! Hence `burst = 96 KiB + rate × 100 µs` (121 KiB at 2 Gbit/s). Bigger
//! buckets do not help throughput but let longer messages through at memory
//! speed, which flatters ping-pong latencies, so the bucket stays this small.
//!
//! `latency` bounds the queue (`limit = rate × latency + burst`). 5 ms never
//! dropped a packet of a single bbr or cubic stream in the measurements, and
//! is short enough that a ping-pong next to a bulk transfer still sees a
//! link-like delay rather than seconds of bufferbloat.
//!
//! Offloads stay on: capping GSO at 16 or 32 KiB to allow a smaller bucket
//! lost throughput and caused retransmits at 2 Gbit/s and above.

use serde::Serialize;

use crate::rate::Rate;

/// Bucket part that holds one GSO packet with all its headers, plus slack.
pub const BURST_BASE_BYTES: u64 = 96 * 1024;

/// Line-rate time added to the bucket for timer jitter, in microseconds.
pub const BURST_JITTER_US: u64 = 100;

/// Queue bound of every rail, in microseconds at line rate.
pub const LATENCY_US: u64 = 5_000;

/// `tbf` settings of one egress point, as chosen by [`Shaping::for_rate`] or
/// as read back from the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Shaping {
    /// Token rate.
    pub rate: Rate,
    /// Bucket size in bytes (the kernel rounds it, so a read-back value may
    /// differ from the requested one by a few bytes).
    pub burst_bytes: u64,
    /// Longest time a packet may wait in the queue, in microseconds.
    pub latency_us: u64,
}

impl Shaping {
    /// The settings this crate uses for a link of `rate`.
    pub fn for_rate(rate: Rate) -> Shaping {
        let jitter_bytes = rate.bytes_per_sec().saturating_mul(BURST_JITTER_US) / 1_000_000;
        Shaping { rate, burst_bytes: BURST_BASE_BYTES.saturating_add(jitter_bytes), latency_us: LATENCY_US }
    }

    /// Arguments after `tc qdisc add dev IF root`.
    pub fn tc_args(&self) -> Vec<String> {
        vec![
            "tbf".into(),
            "rate".into(),
            self.rate.tc_arg(),
            "burst".into(),
            self.burst_bytes.to_string(),
            "latency".into(),
            format!("{}us", self.latency_us),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(text: &str) -> Rate {
        text.parse().unwrap()
    }

    #[test]
    fn burst_grows_with_rate() {
        assert_eq!(Shaping::for_rate(rate("100mbit")).burst_bytes, 98_304 + 1_250);
        assert_eq!(Shaping::for_rate(rate("2gbit")).burst_bytes, 98_304 + 25_000);
        assert_eq!(Shaping::for_rate(rate("10gbit")).burst_bytes, 98_304 + 125_000);
    }

    #[test]
    fn tc_arguments() {
        let args = Shaping::for_rate(rate("2gbit")).tc_args();
        assert_eq!(args.join(" "), "tbf rate 2000000000bit burst 123304 latency 5000us");
    }
}
