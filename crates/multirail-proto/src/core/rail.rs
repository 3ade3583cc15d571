//! Per-(peer, rail) state: connection, liveness, output queues, bytes in
//! flight, throughput and round-trip estimates, pending acknowledgements.

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use crate::sched::RailView;
use crate::time::Time;
use crate::wire::{AckRange, FrameHeader, Op};

use super::connect::ConnPlan;
use super::{RailCaps, Transmit};

/// What the core handed to the driver for one rail, in order, so that
/// `on_sent(n)` can tell which frames were written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handed {
    Frag {
        seq: u64,
        offset: u64,
    },
    /// A direct send to a peer with several rails (stamped when written).
    Direct {
        seq: u64,
    },
    Ping {
        id: u64,
    },
    Ctrl,
}

/// A fragment waiting in a rail's data queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FragRef {
    pub seq: u64,
    pub offset: u64,
}

/// Delivery-rate estimation in the style of BBR: each acknowledged
/// fragment yields a sample of bytes delivered over the time it took.
/// Two estimates come from the samples: the largest recent one (for
/// windows and timeouts: never below what the rail has shown it can do)
/// and their mean (for planning: samples taken over a shaper's burst or
/// after a held-back acknowledgement err both ways, and the largest of
/// them over-estimated two equal 2 Gbit testbed rails by 40-50 %, and
/// unequally: 370 and 356 MB/s).
#[derive(Debug, Clone)]
pub(crate) struct RateEstimator {
    /// Bytes acknowledged on this rail so far.
    pub delivered: u64,
    /// When `delivered` last grew (or when the rail became busy).
    pub delivered_time: Time,
    /// Send time of the newest acknowledged fragment.
    pub first_sent_time: Time,
    /// (when, bytes/s, counts for planning: see [`PLAN_MIN_BYTES`]).
    samples: VecDeque<(Time, f64, bool)>,
    pub last_sample: Option<Time>,
    /// `rate()` as of the last sample: the largest recent sample and when
    /// it leaves the window (the hot path asks far more often than samples
    /// arrive).
    best: f64,
    best_until: Time,
    /// [`Self::mean_rate`] as of the last sample, until its oldest sample
    /// leaves the window.
    mean: f64,
    mean_until: Time,
    /// Sum and count of the samples of each second of the last
    /// [`LONG_WINDOW`], oldest first: what the scheduler plans with when
    /// nothing is recent.
    seconds: VecDeque<(Time, f64, u32)>,
}

/// How long the scheduler remembers a rail's throughput when no recent
/// sample refreshes it.
pub const LONG_WINDOW: Duration = Duration::from_secs(10);

/// Samples older than this no longer count towards the estimate, so a
/// rail that slows down is noticed within this time.
pub const RATE_WINDOW: Duration = Duration::from_millis(250);
/// Samples shorter than this are dominated by latency or by bursts a
/// shaper lets through at memory speed (tbf's bucket): on the testbed,
/// 20 us samples over-estimated rails and unbalanced split messages
/// (4 MiB ping-pong on two rails took 0.556x one rail; with 1 ms, 0.506x).
const MIN_SAMPLE_INTERVAL: Duration = Duration::from_micros(1000);

/// A sample of fewer bytes than this says how long a small frame took
/// (latency, the peer's acknowledgement delay), not what the rail can
/// carry: it counts towards the planning rate only if it raises it. On the
/// testbed, a group's rows (a few hundred bytes, alone on a rail that
/// carried little else) read 0.1 MB/s, and a one-sender stream of 1 MiB
/// messages planned a 250 MB/s rail at 1-50 MB/s and sent 2 % of its bytes
/// there, in about one run of three (0.24 instead of 0.45 GB/s).
pub const PLAN_MIN_BYTES: u64 = 32 << 10;

/// What a fragment (or a ping) remembers about its rail when it was written.
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
            best: 0.0,
            best_until: Time::ZERO,
            mean: 0.0,
            mean_until: Time::ZERO,
            seconds: VecDeque::new(),
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
        let send_elapsed = stamp.sent_time.since(stamp.first_sent_time);
        let ack_elapsed = now.since(stamp.delivered_time);
        let interval = send_elapsed.max(ack_elapsed);
        let bytes = self.delivered - stamp.delivered;
        if interval < MIN_SAMPLE_INTERVAL || bytes == 0 {
            return;
        }
        let rate = bytes as f64 / interval.as_secs_f64();
        let plan = bytes >= PLAN_MIN_BYTES || rate > self.planning_rate(now);
        while self.samples.front().is_some_and(|(t, ..)| now.since(*t) > RATE_WINDOW) {
            self.samples.pop_front();
        }
        if self.samples.len() >= 64 {
            self.samples.pop_front();
        }
        self.samples.push_back((now, rate, plan));
        self.last_sample = Some(now);
        self.refresh(now);
        if !plan {
            return;
        }
        while self.seconds.front().is_some_and(|(t, ..)| now.since(*t) > LONG_WINDOW) {
            self.seconds.pop_front();
        }
        match self.seconds.back_mut() {
            Some((t, sum, n)) if now.since(*t) < Duration::from_secs(1) => {
                *sum += rate;
                *n += 1;
            }
            _ => self.seconds.push_back((now, rate, 1)),
        }
    }

    /// Recomputes the cached maximum and mean of the samples still in the
    /// window.
    fn refresh(&mut self, now: Time) {
        let best =
            self.samples.iter().filter(|(t, ..)| now.since(*t) <= RATE_WINDOW).max_by(|a, b| a.1.total_cmp(&b.1));
        match best {
            Some(&(t, r, _)) => {
                self.best = r;
                self.best_until = t + RATE_WINDOW;
            }
            None => {
                self.best = 0.0;
                self.best_until = Time(u64::MAX);
            }
        }
        (self.mean, self.mean_until) = self.window_mean(now).unwrap_or((0.0, Time(u64::MAX)));
    }

    /// The mean of the planning samples of the last [`RATE_WINDOW`] and
    /// when the oldest of them leaves it; `None` when there is none.
    fn window_mean(&self, now: Time) -> Option<(f64, Time)> {
        let (mut sum, mut n, mut oldest) = (0.0, 0u32, None);
        // Newest first: stop at the first sample out of the window.
        for &(t, r, _) in self.samples.iter().rev().take_while(|(t, ..)| now.since(*t) <= RATE_WINDOW).filter(|s| s.2) {
            sum += r;
            n += 1;
            oldest = Some(t);
        }
        oldest.map(|t| (sum / f64::from(n), t + RATE_WINDOW))
    }

    /// Current estimate in bytes/s: [`Self::recent_rate`], or when
    /// nothing is that recent the last measurement (0 before any).
    pub fn rate(&self, now: Time) -> f64 {
        let recent = self.recent_rate(now);
        if recent > 0.0 { recent } else { self.samples.back().map_or(0.0, |s| s.1) }
    }

    /// The largest sample of the last [`RATE_WINDOW`], 0 when there is
    /// none.
    pub fn recent_rate(&self, now: Time) -> f64 {
        if now <= self.best_until && self.best > 0.0 {
            return self.best;
        }
        // Newest last: stop at the first sample out of the window (on the
        // hot path, with no recent sample, that is the first one looked at).
        self.samples.iter().rev().take_while(|(t, ..)| now.since(*t) <= RATE_WINDOW).map(|s| s.1).fold(0.0, f64::max)
    }

    /// The mean of the planning samples of the last [`RATE_WINDOW`], 0
    /// when there is none.
    pub fn mean_rate(&self, now: Time) -> f64 {
        if now <= self.mean_until && self.mean > 0.0 {
            return self.mean;
        }
        self.window_mean(now).map_or(0.0, |(mean, _)| mean)
    }

    /// What the scheduler plans with: [`Self::mean_rate`], else the
    /// largest mean of one second's samples in the last [`LONG_WINDOW`]
    /// (0 when there is none). Not the last sample, as [`Self::rate`]
    /// falls back to: lone messages of a few hundred KiB yield few samples
    /// (most acknowledgements come back within [`MIN_SAMPLE_INTERVAL`]),
    /// and those they yield were mostly taken while an acknowledgement was
    /// held back. Two equal testbed rails planned with such leftovers
    /// split lone 256 KiB messages up to 180K/75K; the largest of many is
    /// stable.
    pub fn planning_rate(&self, now: Time) -> f64 {
        let recent = self.mean_rate(now);
        if recent > 0.0 {
            return recent;
        }
        self.seconds
            .iter()
            .rev()
            .take_while(|(t, ..)| now.since(*t) <= LONG_WINDOW)
            .map(|&(_, sum, n)| sum / f64::from(n))
            .fold(0.0, f64::max)
    }
}

/// Counters per rail, for `--rail-stats` and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RailStats {
    pub up: bool,
    /// Up, but routed around: it owes an answer it did not give in time.
    pub suspect: bool,
    /// Payload bytes of EAGER/DATA frames written (including retransmissions).
    pub tx_bytes: u64,
    pub tx_frames: u64,
    /// Of `tx_frames`, the EAGER frames of the direct path
    /// (`Config::direct_eager`).
    pub direct_frames: u64,
    /// Payload bytes of EAGER/DATA frames received.
    pub rx_bytes: u64,
    pub rx_frames: u64,
    /// Fragments re-sent on this rail after another rail failed or a
    /// fragment was lost.
    pub retransmits: u64,
    /// Fragments written on this rail that never arrived.
    pub lost: u64,
    /// Times this rail went down (its connection failed).
    pub downs: u64,
    /// Times this rail became suspect.
    pub suspects: u64,
    /// Times a connection for this rail came up (first one included).
    pub connects: u64,
    /// Current throughput estimate, bytes/s.
    pub rate: u64,
    /// Smoothed round-trip time beyond queueing (what the retransmission
    /// timeout is built from), microseconds.
    pub srtt_us: u64,
    /// Most bytes this rail may have in flight now (its window).
    pub window: u64,
}

/// Round-trip estimation, RFC 6298 style, of the *excess* round trip: the
/// time an acknowledgement (or a PONG) took beyond what the bytes queued
/// ahead of it on the rail explain. Queueing grows and shrinks with load;
/// the excess is what is left: propagation, the peer's acknowledgement
/// delay, scheduling noise.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Rtt {
    pub srtt: Option<Duration>,
    pub rttvar: Duration,
    /// The smallest sample: the path's own round trip, without the time
    /// the bytes took to drain (a raw round trip of a 256 KiB fragment is
    /// mostly its own transmission time, and taking half of it as the
    /// rail's latency skewed the adaptive split towards the rail that
    /// happened to see smaller fragments).
    pub min: Option<Duration>,
    /// The smallest raw round trip of a fragment (written to acknowledged,
    /// queueing included): what a window must cover at the least. The
    /// excess round trip cannot tell it when the window itself limits the
    /// rate (the queueing it subtracts is then computed from that rate).
    pub raw_min: Option<Duration>,
}

impl Rtt {
    pub fn sample_raw(&mut self, r: Duration) {
        self.raw_min = Some(self.raw_min.map_or(r, |m| m.min(r)));
    }

    pub fn sample(&mut self, r: Duration) {
        self.min = Some(self.min.map_or(r, |m| m.min(r)));
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                let diff = s.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + diff) / 4;
                self.srtt = Some((s * 7 + r) / 8);
            }
        }
    }

    /// `srtt + 4 rttvar`, at least `min`; before any sample, `initial`.
    pub fn timeout(&self, min: Duration, initial: Duration) -> Duration {
        match self.srtt {
            Some(s) => (s + self.rttvar * 4).max(min),
            None => initial.max(min),
        }
    }
}

/// Memory of a path that was recently slow: a suspicion that a probe's
/// answer ended soon (a stall, not an outage) sets a floor under the
/// retransmission timeout, twice that round trip (at most [`SLOW_CAP`]),
/// halving every second. Per-fragment samples alone forget a stall within
/// milliseconds, so a peer that keeps stalling would be suspected each time.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SlowFloor {
    floor: Duration,
    at: Time,
}

/// Highest floor a slow episode sets.
pub const SLOW_CAP: Duration = Duration::from_millis(500);

impl SlowFloor {
    pub fn get(&self, now: Time) -> Duration {
        let halvings = now.since(self.at).as_secs_f64();
        self.floor.mul_f64(0.5f64.powf(halvings))
    }

    pub fn stalled(&mut self, rtt: Duration, now: Time) {
        self.floor = self.get(now).max(rtt * 2).min(SLOW_CAP);
        self.at = now;
    }
}

/// A rail past its deadline, not yet blamed: the peer has not been heard
/// on another rail since that deadline (see `liveness`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Overdue {
    /// The deadline this is about; a later one (an answer came, the
    /// oldest fragment moved on) makes it stale.
    pub deadline: Time,
    /// The last time the peer was heard on another rail, as first seen
    /// after the deadline: the rail is blamed a grace period after it.
    pub heard: Option<Time>,
    /// When the rail was last looked at.
    pub checked: Time,
    /// The rail was once not blamed because this rank looked at it late
    /// (see `liveness::ran_late`): at its next look it is blamed however
    /// late that look comes.
    pub excused: bool,
}

/// An answer a rail owes us (see [`RailState::owing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Owed {
    /// The CTS for our RTS of message `seq`.
    Cts(u64),
    /// The first DATA for our CTS of the peer's message `seq`.
    Data(u64),
}

/// A probe in flight on a rail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ping {
    pub id: u64,
    /// Set once the driver wrote it (the timeout runs from then).
    pub stamp: Option<SendStamp>,
    /// When the core queued it.
    pub queued_at: Time,
}

#[derive(Debug)]
pub(crate) struct RailState {
    /// A connection is established (it may be suspect).
    pub up: bool,
    pub caps: RailCaps,
    pub ctrl: VecDeque<Transmit>,
    /// Bytes (headers and payloads) in `ctrl`.
    pub ctrl_bytes: usize,
    pub data: VecDeque<FragRef>,
    /// Frames of the direct path (`Core::send_direct`), after the control
    /// frames and before the data fragments.
    pub direct: VecDeque<Transmit>,
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
    pub rtt: Rtt,
    pub slow: SlowFloor,
    pub last_tx: Time,
    /// When a frame (or part of a long payload) last arrived.
    pub last_rx: Time,
    pub last_used: Option<Time>,
    /// Since when the rail is suspect: it owed an answer it did not give
    /// in time. No new data goes to it; its unacknowledged data moved.
    pub suspect_since: Option<Time>,
    /// A PONG answering a ping numbered at least this ends the suspicion.
    pub clears_from: u64,
    /// The probe in flight, if any (at most one per rail).
    pub ping: Option<Ping>,
    /// Past its deadline, waiting for the peer to show life elsewhere.
    pub overdue: Option<Overdue>,
    /// Answers this rail owes us other than acknowledgements, by when they
    /// were asked for: the CTS for an RTS it carried, the first DATA for a
    /// CTS it carried (see `liveness`).
    pub owing: BTreeSet<(Time, Owed)>,
    /// Ranges received on this rail and not yet acknowledged.
    pub acks: Vec<AckRange>,
    pub ack_bytes: u64,
    /// Data bytes handed out since the last frame that asked for an
    /// acknowledgement at once.
    pub unrequested: u64,
    pub down_reason: Option<String>,
    pub conn: ConnPlan,
    pub stats: RailStats,
}

impl RailState {
    pub fn new(connect_retry: Duration) -> RailState {
        RailState {
            up: false,
            caps: RailCaps::default(),
            ctrl: VecDeque::new(),
            ctrl_bytes: 0,
            data: VecDeque::new(),
            direct: VecDeque::new(),
            handed: VecDeque::new(),
            written_log: VecDeque::new(),
            inflight: 0,
            written_unacked: 0,
            est: RateEstimator::new(),
            rtt: Rtt::default(),
            slow: SlowFloor::default(),
            last_tx: Time::ZERO,
            last_rx: Time::ZERO,
            last_used: None,
            suspect_since: None,
            clears_from: 0,
            ping: None,
            overdue: None,
            owing: BTreeSet::new(),
            acks: Vec::new(),
            ack_bytes: 0,
            unrequested: 0,
            down_reason: None,
            conn: ConnPlan::new(connect_retry),
            stats: RailStats::default(),
        }
    }

    /// Up and not suspect: new data, control frames and acknowledgements
    /// may go here.
    pub fn usable(&self) -> bool {
        self.up && self.suspect_since.is_none()
    }

    /// A direct send's frame (of `len` payload bytes, message `seq`) is
    /// handed to the driver: counted as data, and asks for an
    /// acknowledgement as data does (a stream of them on a wire otherwise
    /// waits for the delayed ones: 4 KiB on a 2 Gbit testbed rail, 131
    /// instead of 236 MB/s). True: the frame asks now (`ACK_NOW`).
    pub fn hand_direct(
        &mut self,
        seq: u64,
        len: u64,
        several: bool,
        w: &super::WindowCfg,
        div: u32,
        now: Time,
    ) -> bool {
        self.handed.push_back(if several { Handed::Direct { seq } } else { Handed::Ctrl });
        self.stats.tx_bytes += len;
        self.stats.tx_frames += 1;
        self.stats.direct_frames += 1;
        self.request_ack(len, w, div, several, now)
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

    /// Removes the queued control frames that may travel on another rail
    /// (everything but probes, which test this rail).
    pub fn take_movable_ctrl(&mut self) -> Vec<Transmit> {
        let (keep, moved): (VecDeque<Transmit>, VecDeque<Transmit>) =
            std::mem::take(&mut self.ctrl).into_iter().partition(|t| t.header.op == Op::Heartbeat);
        self.ctrl = keep;
        self.ctrl_bytes = self.ctrl.iter().map(|t| FrameHeader::LEN + t.payload.len()).sum();
        moved.into()
    }

    pub fn has_output(&self) -> bool {
        self.up && (!self.ctrl.is_empty() || !self.direct.is_empty() || !self.data.is_empty())
    }

    /// Forgets everything about the connection that carried this rail
    /// (what was queued, written, in flight or pending acknowledgement);
    /// the caller moves the fragments elsewhere first.
    pub fn reset_connection(&mut self) {
        self.clear_ctrl();
        self.data.clear();
        self.direct.clear();
        self.handed.clear();
        self.written_log.clear();
        self.inflight = 0;
        self.written_unacked = 0;
        // Ranges received but not yet acknowledged on this connection: the
        // sender will re-send them and we will acknowledge the duplicates.
        self.acks.clear();
        self.ack_bytes = 0;
        self.unrequested = 0;
        self.ping = None;
        self.overdue = None;
        self.suspect_since = None;
    }

    /// Bytes this rail may have in flight: `time` worth at its measured
    /// rate, within `[min, max]`. A small window keeps the scheduler's
    /// commitments short, so a wrong throughput estimate costs little; it
    /// grows with the rail's speed so fast rails stay busy.
    pub fn window(&self, min: u64, max: u64, time: Duration, now: Time) -> u64 {
        // Cover the excess round trip too: with traffic the other way,
        // acknowledgements queue behind it.
        let t = time + self.rtt.srtt.unwrap_or_default();
        let by_rate = (self.est.rate(now) * t.as_secs_f64()) as u64;
        by_rate.clamp(min.min(max), max)
    }

    /// This rail's window under `w`: [`Self::window`] with its floor
    /// raised to what the rail buffers by itself
    /// ([`super::RailCaps::buffer`]).
    pub fn rail_window(&self, w: &super::WindowCfg, now: Time) -> u64 {
        self.window(w.min.max(self.caps.buffer), w.max, w.time, now)
    }

    /// Counts `len` data bytes handed out; true if their frame should ask
    /// for an acknowledgement at once: a `1/div` of the short window went
    /// out since the last ask, and half of it is in flight (below that the
    /// window is no limit, and a ping-pong's replies acknowledge each
    /// message without an ACK frame). `several`: the peer has several
    /// rails, and the window is the one their split is decided by
    /// (`Config::spread_split_min`, but at least
    /// [`SHORT_WINDOW_MESSAGES`](crate::sched::SHORT_WINDOW_MESSAGES)
    /// frames of this one's size, so a lone message of a ping-pong stays
    /// below half of it). Never on a rail inside the host
    /// ([`super::RailCaps::host_local`]): it has no short window.
    pub fn request_ack(&mut self, len: u64, w: &super::WindowCfg, div: u32, several: bool, now: Time) -> bool {
        if div == 0 || self.caps.host_local {
            return false;
        }
        self.unrequested += len;
        // Never below the floor: a lone message in a ping-pong leaves here
        // without computing the window.
        let min = if several { w.split_min.max(crate::sched::SHORT_WINDOW_MESSAGES * len) } else { w.small_min };
        let (div, floor) = (div as u64, min.min(w.min).min(w.max));
        if self.unrequested < floor / div || self.inflight < floor / 2 {
            return false;
        }
        let window = self.short_window(min, w, self.rail_window(w, now), now);
        if self.unrequested < window / div || self.inflight < window / 2 {
            return false;
        }
        self.unrequested = 0;
        true
    }

    /// The window small whole messages are placed against (see
    /// `Config::spread_window_time`), at most `window`, the rail's; its
    /// floor is `Config::spread_split_min` when the peer has `several`
    /// rails, else `Config::spread_window_min`; on a rail inside the host,
    /// `window` itself.
    pub fn small_window(&self, w: &super::WindowCfg, window: u64, several: bool, now: Time) -> u64 {
        if self.caps.host_local {
            return window;
        }
        self.short_window(if several { w.split_min } else { w.small_min }, w, window, now)
    }

    fn short_window(&self, floor: u64, w: &super::WindowCfg, window: u64, now: Time) -> u64 {
        self.window(floor, window, w.small_time + self.rtt.raw_min.unwrap_or_default(), now)
    }

    pub fn view(&self, w: &super::WindowCfg, several: bool, now: Time) -> RailView {
        let window = self.rail_window(w, now);
        let rate = self.est.planning_rate(now);
        RailView {
            up: self.usable(),
            inflight: self.inflight,
            undelivered: self.inflight - self.drained_since_ack(rate, w.ack_bytes, now),
            window,
            small_window: self.small_window(w, window, several, now),
            rate,
            bandwidth: self.caps.bandwidth,
            latency: self.rtt.min.map_or(self.caps.latency, |r| r / 2),
            last_sample: self.est.last_sample,
            last_used: self.last_used,
        }
    }

    /// Bytes written on this rail and not yet acknowledged that its link
    /// has carried since the last acknowledgement, estimated at `rate`
    /// (measured; 0 without a measurement). Acknowledgements come every
    /// 256 KiB (`Config::ack_bytes`), a millisecond on a 2 Gbit rail: the
    /// rail acknowledged last looks that much emptier than another, and a
    /// message's tail planned from `inflight` alone ended its rails up to
    /// 1 ms apart. At most `ack_bytes` (when not 0): the peer would have
    /// acknowledged more, so a rail whose acknowledgements stop (a silent
    /// link) does not look emptier than one acknowledgement's worth.
    fn drained_since_ack(&self, rate: f64, ack_bytes: u64, now: Time) -> u64 {
        if self.written_unacked == 0 || rate <= 0.0 {
            return 0;
        }
        // Since the last acknowledgement, or since the rail became busy.
        let since = now.since(self.est.delivered_time).as_secs_f64();
        let cap = if ack_bytes == 0 { u64::MAX } else { ack_bytes };
        ((rate * since) as u64).min(cap).min(self.written_unacked).min(self.inflight)
    }

    /// Throughput to convert queued bytes into time with: measured, else
    /// advertised, else a pessimistic 1 MB/s (a timeout computed from it is
    /// long rather than wrong).
    pub fn drain_rate(&self, now: Time) -> f64 {
        let r = self.est.rate(now);
        if r > 0.0 {
            r
        } else if self.caps.bandwidth > 0 {
            self.caps.bandwidth as f64
        } else {
            1e6
        }
    }

    /// Records a received range for the next ACK on this rail, merging it
    /// with the previous range when contiguous.
    pub fn note_received(&mut self, seq: u64, offset: u64, len: u32) {
        self.ack_bytes += len as u64;
        if let Some(last) = self.acks.last_mut()
            && last.seq == seq
            && last.offset + last.len as u64 == offset
            && let Some(l) = last.len.checked_add(len)
        {
            last.len = l;
            return;
        }
        self.acks.push(AckRange { seq, offset, len });
    }

    /// Drops pending ranges of messages below `prefix` (a piggybacked
    /// delivered prefix acknowledged them all).
    pub fn drop_acked_below(&mut self, prefix: u64) {
        if self.acks.iter().any(|a| a.seq < prefix) {
            self.acks.retain(|a| a.seq >= prefix);
            self.ack_bytes = self.acks.iter().map(|a| a.len as u64).sum();
        }
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
    }

    #[test]
    fn old_samples_expire() {
        let mut e = RateEstimator::new();
        let s = e.on_send(Time::ZERO, true, 0);
        e.on_ack(1 << 20, &s, Time::ZERO + Duration::from_millis(1));
        assert!(e.rate(Time::ZERO + Duration::from_millis(2)) > 1e8);
        let later = Time::ZERO + Duration::from_secs(1);
        // Nothing for a second: no recent rate, but the scheduler and the
        // timeouts still know the rail.
        assert_eq!(e.recent_rate(later), 0.0);
        assert!(e.rate(later) > 1e8);
        assert!(e.planning_rate(later) > 1e8);
        assert_eq!(e.planning_rate(later + LONG_WINDOW), 0.0, "forgotten after the long window");
        let s = e.on_send(later, true, 0);
        e.on_ack(1 << 10, &s, later + Duration::from_millis(1));
        assert!(e.rate(later + Duration::from_millis(2)) < 2e6);
    }

    #[test]
    fn planning_rate_is_the_largest_mean_of_a_second_in_the_long_window_not_the_last() {
        // Samples of a backlog (200 and 220 MB/s), then over seconds lone
        // fragments whose acknowledgements were held back (30-60 MB/s).
        let mut e = RateEstimator::new();
        let ms = Duration::from_millis;
        let s = e.on_send(Time::ZERO, true, 0);
        e.on_ack(400_000, &s, Time::ZERO + ms(2));
        let s = e.on_send(Time::ZERO + ms(10), true, 0);
        e.on_ack(440_000, &s, Time::ZERO + ms(12));
        for i in 1..=8u64 {
            let at = Time::ZERO + ms(500 + 1000 * i);
            let s = e.on_send(at, true, 0);
            e.on_ack(25_000 + i * 5_000, &s, at + ms(1));
        }
        let now = Time::ZERO + ms(8_900);
        assert_eq!(e.recent_rate(now), 0.0);
        assert_eq!(e.mean_rate(now), 0.0);
        assert!(e.rate(now) < 7e7, "the timeouts' fallback is the last sample");
        assert_eq!(e.planning_rate(now), 2.1e8);
    }

    #[test]
    fn planning_rate_is_the_mean_of_recent_samples_windows_use_the_largest() {
        // A shaped link passes 250 MB/s; samples over its bursts read 300,
        // others 200. The largest over-estimates it, the mean does not.
        let mut e = RateEstimator::new();
        let ms = Duration::from_millis;
        let mut now = Time::ZERO;
        for i in 0..20u64 {
            let s = e.on_send(now, true, 0);
            let bytes = if i % 2 == 0 { 600_000 } else { 400_000 };
            now = now + ms(2);
            e.on_ack(bytes, &s, now);
        }
        assert_eq!(e.rate(now), 3e8);
        assert!((e.planning_rate(now) - 2.5e8).abs() < 1.0, "{}", e.planning_rate(now));
        // Computed afresh once older samples leave the window (only the
        // last, 200 MB/s, is left), none once all did.
        assert_eq!(e.mean_rate(now + (RATE_WINDOW - ms(1))), 2e8);
        assert_eq!(e.mean_rate(now + RATE_WINDOW + ms(40)), 0.0);
    }

    /// Small frames alone on a rail (a group's rows) yield samples of how
    /// long they took, not of what the rail carries: they leave the
    /// planning rate alone (the windows' largest sample too), unless
    /// nothing larger was ever measured.
    #[test]
    fn samples_of_small_frames_do_not_lower_the_planning_rate() {
        let ms = Duration::from_millis;
        let mut e = RateEstimator::new();
        // 250 MB/s over a backlog.
        let s = e.on_send(Time::ZERO, true, 0);
        e.on_ack(500_000, &s, Time::ZERO + ms(2));
        // Then 200 B frames, each acknowledged 1.2 ms after it left.
        let mut now = Time::ZERO + ms(3);
        for _ in 0..100 {
            let s = e.on_send(now, true, 0);
            now = now + Duration::from_micros(1200);
            e.on_ack(200, &s, now);
            now = now + ms(2);
        }
        // 320 ms later the backlog's sample has left the recent window;
        // the small frames' are the only recent ones.
        assert_eq!(e.mean_rate(now), 0.0, "no planning sample is recent");
        assert!(e.recent_rate(now) > 0.0 && e.recent_rate(now) < 1e6, "the windows see the small frames");
        assert_eq!(e.planning_rate(now), 2.5e8, "planned at what the backlog showed");

        // Never anything larger: the small frames are what is known.
        let mut e = RateEstimator::new();
        let s = e.on_send(Time::ZERO, true, 0);
        e.on_ack(200, &s, Time::ZERO + Duration::from_micros(1250));
        assert_eq!(e.planning_rate(Time::ZERO + ms(2)), 160_000.0);
    }

    #[test]
    fn written_bytes_drain_at_the_rails_rate_between_acknowledgements() {
        let ms = Duration::from_millis;
        let mut r = RailState::new(ms(100));
        // 250 MB/s measured: 500 KB acknowledged 2 ms after they went out.
        let s = r.est.on_send(Time::ZERO, true, 0);
        r.est.on_ack(500_000, &s, Time::ZERO + ms(2));
        let rate = r.est.planning_rate(Time::ZERO + ms(2));
        assert_eq!(rate, 2.5e8);
        r.inflight = 1 << 20;
        let ack = 256 << 10;
        assert_eq!(r.drained_since_ack(rate, ack, Time::ZERO + ms(3)), 0, "nothing written");
        r.written_unacked = 768 << 10;
        assert_eq!(r.drained_since_ack(rate, ack, Time::ZERO + ms(3)), 250_000, "1 ms since the acknowledgement");
        assert_eq!(
            r.drained_since_ack(rate, ack, Time::ZERO + ms(20)),
            ack,
            "no more than the peer lets go unacknowledged (its acknowledgements stopped)"
        );
        assert_eq!(r.drained_since_ack(rate, 0, Time::ZERO + ms(20)), 768 << 10, "at most what was written");
        assert_eq!(r.drained_since_ack(0.0, ack, Time::ZERO + ms(3)), 0, "no guess without a rate");
    }

    #[test]
    fn rtt_follows_rfc6298() {
        let ms = Duration::from_millis;
        let mut r = Rtt::default();
        assert_eq!(r.timeout(ms(20), ms(200)), ms(200), "no sample: the initial timeout");
        r.sample(ms(4));
        assert_eq!((r.srtt, r.rttvar), (Some(ms(4)), ms(2)));
        assert_eq!(r.timeout(ms(1), ms(200)), ms(12));
        assert_eq!(r.timeout(ms(20), ms(200)), ms(20), "never below the floor");
        for _ in 0..50 {
            r.sample(ms(4));
        }
        assert!(r.timeout(ms(1), ms(200)) < ms(5), "steady samples shrink the variance");
        r.sample(ms(100));
        assert!(r.timeout(ms(1), ms(200)) > ms(90), "a jump widens it at once");
    }

    #[test]
    fn a_slow_episode_sets_a_floor_that_decays() {
        let ms = Duration::from_millis;
        let t = |n: u64| Time::ZERO + ms(n);
        let mut s = SlowFloor::default();
        assert_eq!(s.get(t(0)), Duration::ZERO);
        s.stalled(ms(150), t(1000));
        assert_eq!(s.get(t(1000)), ms(300));
        assert_eq!(s.get(t(2000)), ms(150));
        s.stalled(ms(400), t(3000));
        assert_eq!(s.get(t(3000)), SLOW_CAP, "capped");
    }

    #[test]
    fn acks_merge_and_drop_below_a_prefix() {
        let mut r = RailState::new(Duration::from_millis(100));
        r.note_received(1, 0, 10);
        r.note_received(1, 10, 10);
        r.note_received(2, 0, 5);
        r.note_received(1, 30, 5);
        assert_eq!(r.acks.len(), 3);
        assert_eq!(r.acks[0], AckRange { seq: 1, offset: 0, len: 20 });
        assert_eq!(r.ack_bytes, 30);
        r.drop_acked_below(2);
        assert_eq!(r.acks, vec![AckRange { seq: 2, offset: 0, len: 5 }]);
        assert_eq!(r.ack_bytes, 5);
    }
}
