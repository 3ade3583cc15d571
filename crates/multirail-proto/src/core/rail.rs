//! Per-(peer, rail) state: liveness, output queues, bytes in flight,
//! throughput and latency estimates, pending acknowledgements.

use std::collections::VecDeque;
use std::time::Duration;

use crate::sched::RailView;
use crate::time::Time;
use crate::wire::{AckRange, FrameHeader};

use super::{RailCaps, Transmit};

/// What the core handed to the driver for one rail, in order, so that
/// `on_sent(n)` can tell which frames were written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handed {
    Frag { seq: u64, offset: u64 },
    Ctrl,
}

/// A fragment waiting in a rail's data queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FragRef {
    pub seq: u64,
    pub offset: u64,
}

/// Delivery-rate estimation in the style of BBR: each acknowledged
/// fragment yields a sample of bytes delivered over the time it took; the
/// estimate is the largest recent sample.
#[derive(Debug, Clone)]
pub(crate) struct RateEstimator {
    /// Bytes acknowledged on this rail so far.
    pub delivered: u64,
    /// When `delivered` last grew (or when the rail became busy).
    pub delivered_time: Time,
    /// Send time of the newest acknowledged fragment.
    pub first_sent_time: Time,
    samples: VecDeque<(Time, f64)>,
    pub last_sample: Option<Time>,
    min_rtt: Option<Duration>,
    /// Smoothed extra delay of acknowledgements beyond what our own queue
    /// on the rail explains: the reverse path's queueing (traffic the other
    /// way delays our ACKs).
    pub ack_delay: Option<Duration>,
}

/// Samples older than this no longer count towards the estimate, so a
/// rail that slows down is noticed within this time.
pub const RATE_WINDOW: Duration = Duration::from_millis(250);
/// Samples shorter than this are dominated by latency or by bursts a
/// shaper lets through at memory speed (tbf's bucket): on the testbed,
/// 20 us samples over-estimated rails and unbalanced split messages
/// (4 MiB ping-pong on two rails took 0.556x one rail; with 1 ms, 0.506x).
const MIN_SAMPLE_INTERVAL: Duration = Duration::from_micros(1000);

/// What a fragment remembers about its rail when it was written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SendStamp {
    pub sent_time: Time,
    /// Bytes written on the rail and unacknowledged when this was written.
    pub queued: u64,
    pub delivered: u64,
    pub delivered_time: Time,
    pub first_sent_time: Time,
}

impl RateEstimator {
    pub fn new() -> RateEstimator {
        RateEstimator {
            delivered: 0,
            delivered_time: Time::ZERO,
            first_sent_time: Time::ZERO,
            samples: VecDeque::new(),
            last_sample: None,
            min_rtt: None,
            ack_delay: None,
        }
    }

    /// Called when a fragment is written; `idle` means nothing else was
    /// in flight on the rail, so the clock restarts.
    pub fn on_send(&mut self, now: Time, idle: bool, queued: u64) -> SendStamp {
        if idle {
            self.delivered_time = now;
            self.first_sent_time = now;
        }
        SendStamp {
            sent_time: now,
            queued,
            delivered: self.delivered,
            delivered_time: self.delivered_time,
            first_sent_time: self.first_sent_time,
        }
    }

    /// Called when a fragment of `len` bytes written with `stamp` is acked.
    pub fn on_ack(&mut self, len: u64, stamp: &SendStamp, now: Time) {
        self.delivered += len;
        self.delivered_time = now;
        self.first_sent_time = self.first_sent_time.max(stamp.sent_time);
        let rtt = now.since(stamp.sent_time);
        self.min_rtt = Some(self.min_rtt.map_or(rtt, |m| m.min(rtt)));
        let rate = self.rate(now);
        if rate > 0.0 {
            let own = Duration::from_secs_f64(stamp.queued as f64 / rate);
            let extra = rtt.saturating_sub(own);
            self.ack_delay = Some(self.ack_delay.map_or(extra, |d| (d * 7 + extra) / 8));
        }
        let send_elapsed = stamp.sent_time.since(stamp.first_sent_time);
        let ack_elapsed = now.since(stamp.delivered_time);
        let interval = send_elapsed.max(ack_elapsed);
        let bytes = self.delivered - stamp.delivered;
        if interval < MIN_SAMPLE_INTERVAL || bytes == 0 {
            return;
        }
        let rate = bytes as f64 / interval.as_secs_f64();
        while self.samples.front().is_some_and(|(t, _)| now.since(*t) > RATE_WINDOW) {
            self.samples.pop_front();
        }
        if self.samples.len() >= 64 {
            self.samples.pop_front();
        }
        self.samples.push_back((now, rate));
        self.last_sample = Some(now);
    }

    /// Current estimate in bytes/s (0 when nothing was measured recently).
    pub fn rate(&self, now: Time) -> f64 {
        let recent =
            self.samples.iter().filter(|(t, _)| now.since(*t) <= RATE_WINDOW).map(|(_, r)| *r).fold(0.0, f64::max);
        if recent > 0.0 {
            recent
        } else {
            // Nothing recent: the last measurement is still the best guess.
            self.samples.back().map_or(0.0, |s| s.1)
        }
    }

    /// Half the smallest round trip seen.
    pub fn latency(&self) -> Option<Duration> {
        self.min_rtt.map(|r| r / 2)
    }
}

/// Counters per rail, for `--rail-stats` and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RailStats {
    pub up: bool,
    /// Payload bytes of EAGER/DATA frames written (including retransmissions).
    pub tx_bytes: u64,
    pub tx_frames: u64,
    /// Payload bytes of EAGER/DATA frames received.
    pub rx_bytes: u64,
    pub rx_frames: u64,
    /// Fragments re-sent on this rail after another rail failed or a
    /// fragment was lost.
    pub retransmits: u64,
    /// Fragments written on this rail that never arrived.
    pub lost: u64,
    /// Times this rail went down.
    pub downs: u64,
    /// Current throughput estimate, bytes/s.
    pub rate: u64,
}

#[derive(Debug)]
pub(crate) struct RailState {
    pub up: bool,
    pub caps: RailCaps,
    pub ctrl: VecDeque<Transmit>,
    /// Bytes (headers and payloads) in `ctrl`.
    pub ctrl_bytes: usize,
    pub data: VecDeque<FragRef>,
    pub handed: VecDeque<Handed>,
    /// Data fragments written on this rail and not yet known delivered, in
    /// write order. The peer acknowledges in arrival order, which on an
    /// ordered rail is write order: an unacknowledged entry older than an
    /// acknowledged one was lost.
    pub written_log: VecDeque<FragRef>,
    /// Bytes assigned to this rail and not yet acknowledged.
    pub inflight: u64,
    /// Bytes written to the driver and not yet acknowledged.
    pub written_unacked: u64,
    pub est: RateEstimator,
    pub last_tx: Time,
    pub last_rx: Time,
    pub last_used: Option<Time>,
    /// A fragment timed out on this rail: no new data goes to it until a
    /// frame arrives on it (proof of life) or it is declared down.
    pub suspect: bool,
    /// Ranges received on this rail and not yet acknowledged.
    pub acks: Vec<AckRange>,
    pub ack_bytes: u64,
    pub down_reason: Option<String>,
    pub stats: RailStats,
}

impl RailState {
    pub fn new() -> RailState {
        RailState {
            up: false,
            caps: RailCaps::default(),
            ctrl: VecDeque::new(),
            ctrl_bytes: 0,
            data: VecDeque::new(),
            handed: VecDeque::new(),
            written_log: VecDeque::new(),
            inflight: 0,
            written_unacked: 0,
            est: RateEstimator::new(),
            last_tx: Time::ZERO,
            last_rx: Time::ZERO,
            last_used: None,
            suspect: false,
            acks: Vec::new(),
            ack_bytes: 0,
            down_reason: None,
            stats: RailStats::default(),
        }
    }

    pub fn push_ctrl(&mut self, t: Transmit) {
        self.ctrl_bytes += FrameHeader::LEN + t.payload.len();
        self.ctrl.push_back(t);
    }

    pub fn pop_ctrl(&mut self) -> Option<Transmit> {
        let t = self.ctrl.pop_front()?;
        self.ctrl_bytes -= FrameHeader::LEN + t.payload.len();
        Some(t)
    }

    pub fn clear_ctrl(&mut self) {
        self.ctrl.clear();
        self.ctrl_bytes = 0;
    }

    pub fn has_output(&self) -> bool {
        self.up && (!self.ctrl.is_empty() || !self.data.is_empty())
    }

    /// Bytes this rail may have in flight: `time` worth at its measured
    /// rate, within `[min, max]`. A small window keeps the scheduler's
    /// commitments short, so a wrong throughput estimate costs little; it
    /// grows with the rail's speed so fast rails stay busy.
    pub fn window(&self, min: u64, max: u64, time: Duration, now: Time) -> u64 {
        // Cover how late acknowledgements come back too: with traffic the
        // other way they queue behind it.
        let t = time + self.est.ack_delay.unwrap_or_default();
        let by_rate = (self.est.rate(now) * t.as_secs_f64()) as u64;
        by_rate.clamp(min.min(max), max)
    }

    pub fn view(&self, w: &super::WindowCfg, now: Time) -> RailView {
        let rate = self.est.rate(now);
        RailView {
            up: self.up && !self.suspect,
            inflight: self.inflight,
            window: self.window(w.min, w.max, w.time, now),
            rate,
            bandwidth: self.caps.bandwidth,
            latency: self.est.latency().unwrap_or(self.caps.latency),
            last_sample: self.est.last_sample,
            last_used: self.last_used,
        }
    }

    /// Records a received range for the next ACK on this rail, merging it
    /// with the previous range when contiguous.
    pub fn note_received(&mut self, seq: u64, offset: u64, len: u32) {
        self.ack_bytes += len as u64;
        if let Some(last) = self.acks.last_mut() {
            if last.seq == seq && last.offset + last.len as u64 == offset {
                if let Some(l) = last.len.checked_add(len) {
                    last.len = l;
                    return;
                }
            }
        }
        self.acks.push(AckRange { seq, offset, len });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_of_a_steady_stream() {
        // 100 fragments of 64 KiB, one every 0.5 ms (131 MB/s), each acked
        // 2 ms after it was sent.
        let mut e = RateEstimator::new();
        let mut stamps = VecDeque::new();
        let step = Duration::from_micros(500);
        let mut now = Time::ZERO;
        for i in 0..100u64 {
            let idle = i == 0;
            stamps.push_back(e.on_send(now, idle, 0));
            if i >= 4 {
                let s = stamps.pop_front().unwrap();
                e.on_ack(65536, &s, now);
            }
            now = now + step;
        }
        let r = e.rate(now);
        let want = 65536.0 / step.as_secs_f64();
        assert!((r - want).abs() / want < 0.05, "rate {r} want {want}");
        assert_eq!(e.latency(), Some(Duration::from_millis(1)));
    }

    #[test]
    fn old_samples_expire() {
        let mut e = RateEstimator::new();
        let s = e.on_send(Time::ZERO, true, 0);
        e.on_ack(1 << 20, &s, Time::ZERO + Duration::from_millis(1));
        assert!(e.rate(Time::ZERO + Duration::from_millis(2)) > 1e8);
        let later = Time::ZERO + Duration::from_secs(1);
        let s = e.on_send(later, true, 0);
        e.on_ack(1 << 10, &s, later + Duration::from_millis(1));
        assert!(e.rate(later + Duration::from_millis(2)) < 2e6);
    }

    #[test]
    fn acks_merge() {
        let mut r = RailState::new();
        r.note_received(1, 0, 10);
        r.note_received(1, 10, 10);
        r.note_received(2, 0, 5);
        r.note_received(1, 30, 5);
        assert_eq!(r.acks.len(), 3);
        assert_eq!(r.acks[0], AckRange { seq: 1, offset: 0, len: 20 });
        assert_eq!(r.ack_bytes, 30);
    }
}
