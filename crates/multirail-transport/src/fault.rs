//! A rail wrapper that injects faults, reproducibly from a seed: silently
//! dropped frames, corrupted payload bytes, added delay, a bandwidth limit,
//! and death of the rail at a time, after a byte count, or on command.
//!
//! Drop and corrupt act on payload-carrying frames only (EAGER/DATA) and
//! leave headers intact, so framing survives and the protocol's own checks
//! (ACK gaps, checksums, `--validate`) are what notice.

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use multirail_proto::core::PayloadDest;
use multirail_proto::wire::FrameHeader;

use crate::{Flushed, FrameSink, Rail, RailCaps, RailError, Received};

/// What to inject.
#[derive(Debug, Clone, Default)]
pub struct FaultConfig {
    pub seed: u64,
    /// Probability that a data frame is silently lost.
    pub drop: f64,
    /// Probability that one payload byte of a data frame is flipped.
    pub corrupt: f64,
    /// Every frame waits this long before it is written.
    pub delay: Duration,
    /// Bandwidth limit in bytes/s.
    pub rate: Option<u64>,
    /// The rail dies at this instant.
    pub kill_at: Option<Instant>,
    /// The rail dies after writing this many bytes.
    pub kill_after_bytes: Option<u64>,
    /// The rail dies when this flag is set (from another thread).
    pub kill_switch: Option<Arc<AtomicBool>>,
}

/// Small deterministic generator (xorshift64*); no OS randomness. Also
/// the shm ring tests' size generator.
#[derive(Debug, Clone)]
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    #[cfg(test)]
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

enum Marker {
    Dropped,
    Forwarded,
}

/// A rail with faults.
pub struct FaultRail<R: Rail> {
    inner: R,
    cfg: FaultConfig,
    rng: Rng,
    /// Frames not yet passed to the inner rail, with their release time.
    held: VecDeque<(Instant, FrameHeader, Bytes)>,
    markers: VecDeque<Marker>,
    tokens: f64,
    refill: Instant,
    written: u64,
    dead: bool,
    /// Counters, for tests: frames dropped and corrupted.
    pub dropped: u64,
    pub corrupted: u64,
}

impl<R: Rail> FaultRail<R> {
    pub fn new(inner: R, cfg: FaultConfig) -> FaultRail<R> {
        let seed = cfg.seed | 1;
        FaultRail {
            inner,
            rng: Rng(seed),
            cfg,
            held: VecDeque::new(),
            markers: VecDeque::new(),
            tokens: 0.0,
            refill: Instant::now(),
            written: 0,
            dead: false,
            dropped: 0,
            corrupted: 0,
        }
    }

    pub fn inner(&self) -> &R {
        &self.inner
    }

    fn check_kill(&mut self) -> Result<(), RailError> {
        let now = Instant::now();
        let switched = self.cfg.kill_switch.as_ref().is_some_and(|k| k.load(Ordering::Relaxed));
        let timed = self.cfg.kill_at.is_some_and(|t| now >= t);
        let counted = self.cfg.kill_after_bytes.is_some_and(|b| self.written >= b);
        if !self.dead && (switched || timed || counted) {
            self.dead = true;
            self.inner.shutdown();
        }
        if self.dead { Err(RailError::Killed) } else { Ok(()) }
    }

    fn refill_tokens(&mut self, now: Instant) {
        if let Some(rate) = self.cfg.rate {
            let burst = (rate as f64 * 0.002).max(64.0 * 1024.0);
            self.tokens = (self.tokens + now.duration_since(self.refill).as_secs_f64() * rate as f64).min(burst);
        }
        self.refill = now;
    }

    /// Passes frames whose time has come (and that the rate allows) on.
    fn release(&mut self) {
        let now = Instant::now();
        self.refill_tokens(now);
        while let Some((at, _, _)) = self.held.front() {
            if *at > now || (self.cfg.rate.is_some() && self.tokens <= 0.0) {
                break;
            }
            let (_, h, mut payload) = self.held.pop_front().expect("peeked");
            let size = FrameHeader::LEN + payload.len();
            self.tokens -= size as f64;
            self.written += size as u64;
            let data = h.op.carries_data() && !payload.is_empty();
            if data && self.rng.chance(self.cfg.drop) {
                self.dropped += 1;
                self.markers.push_back(Marker::Dropped);
                continue;
            }
            if data && self.rng.chance(self.cfg.corrupt) {
                let mut v = payload.to_vec();
                let i = (self.rng.next() % v.len() as u64) as usize;
                v[i] ^= 0x5a;
                payload = Bytes::from(v);
                self.corrupted += 1;
            }
            self.inner.send(&h, payload);
            self.markers.push_back(Marker::Forwarded);
        }
    }
}

impl<R: Rail> Rail for FaultRail<R> {
    fn caps(&self) -> &RailCaps {
        self.inner.caps()
    }
    fn poll_fd(&self) -> Option<RawFd> {
        self.inner.poll_fd()
    }
    fn deadline(&self) -> Option<Instant> {
        let mut d = self.held.front().map(|(at, _, _)| *at);
        if let (Some(rate), Some(_)) = (self.cfg.rate, d)
            && self.tokens <= 0.0
        {
            let wait = Duration::from_secs_f64((-self.tokens + 1.0) / rate as f64);
            d = d.map(|t| t.max(self.refill + wait));
        }
        if self.cfg.kill_switch.is_some() {
            // Look at the switch regularly.
            let soon = Instant::now() + Duration::from_millis(5);
            d = Some(d.map_or(soon, |t| t.min(soon)));
        }
        match (d, self.cfg.kill_at) {
            (Some(a), Some(b)) if !self.dead => Some(a.min(b)),
            (None, Some(b)) if !self.dead => Some(b),
            (a, _) => a.or(self.inner.deadline()),
        }
    }
    fn send(&mut self, header: &FrameHeader, payload: Bytes) {
        let at = Instant::now() + self.cfg.delay;
        self.held.push_back((at, *header, payload));
    }
    fn queued_bytes(&self) -> usize {
        self.held.iter().map(|(_, _, p)| FrameHeader::LEN + p.len()).sum::<usize>() + self.inner.queued_bytes()
    }
    fn flush(&mut self) -> Result<Flushed, RailError> {
        self.check_kill()?;
        self.release();
        let inner = self.inner.flush()?;
        let mut done = inner.frames;
        let mut res = Flushed { frames: 0, bytes: inner.bytes, blocked: inner.blocked || !self.held.is_empty() };
        while let Some(m) = self.markers.front() {
            match m {
                Marker::Dropped => {}
                Marker::Forwarded if done > 0 => done -= 1,
                Marker::Forwarded => break,
            }
            self.markers.pop_front();
            res.frames += 1;
        }
        self.check_kill()?;
        Ok(res)
    }
    fn poll_recv(&mut self, sink: &mut dyn FrameSink) -> Result<Received, RailError> {
        self.check_kill()?;
        self.inner.poll_recv(sink)
    }
    fn take_partial(&mut self) -> Option<(FrameHeader, PayloadDest)> {
        self.inner.take_partial()
    }
    fn shutdown(&mut self) {
        self.inner.shutdown()
    }
    fn close(&mut self, by: std::time::Instant) {
        self.inner.close(by)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loopback;
    use crate::tests_util::CollectSink;
    use multirail_proto::wire::Op;

    fn data(i: u64, n: usize) -> (FrameHeader, Bytes) {
        let mut h = FrameHeader::new(Op::Eager);
        h.seq = i;
        h.total_len = n as u64;
        h.frag_len = n as u32;
        (h, Bytes::from(vec![7u8; n]))
    }

    fn pump(a: &mut impl Rail, b: &mut impl Rail, sink: &mut CollectSink, want: usize, limit: Duration) -> usize {
        let end = Instant::now() + limit;
        let mut flushed = 0;
        while sink.frames.len() < want && Instant::now() < end {
            flushed += a.flush().unwrap().frames;
            b.poll_recv(sink).unwrap();
            std::thread::sleep(Duration::from_micros(200));
        }
        flushed
    }

    #[test]
    fn drops_and_corrupts_reproducibly() {
        let run = || {
            let (a, mut b) = loopback::pair("l").unwrap();
            let cfg = FaultConfig { seed: 9, drop: 0.2, corrupt: 0.2, ..Default::default() };
            let mut a = FaultRail::new(a, cfg);
            for i in 0..200 {
                let (h, p) = data(i, 100);
                a.send(&h, p);
            }
            let mut sink = CollectSink::default();
            let mut flushed = 0;
            let end = Instant::now() + Duration::from_secs(2);
            while flushed < 200 && Instant::now() < end {
                flushed += a.flush().unwrap().frames;
            }
            b.poll_recv(&mut sink).unwrap();
            let got: Vec<u64> = sink.frames.iter().map(|f| f.0.seq).collect();
            let bad = sink.frames.iter().filter(|f| f.1.iter().any(|&x| x != 7)).count();
            (got, bad, a.dropped, flushed)
        };
        let (got, bad, dropped, flushed) = run();
        assert!(dropped > 20 && dropped < 70, "dropped {dropped}");
        assert_eq!(got.len() as u64 + dropped, 200);
        assert!(bad > 20, "corrupted {bad}");
        assert_eq!(flushed, 200, "dropped frames count as written");
        assert_eq!(run().0, got, "same seed, same faults");
    }

    #[test]
    fn rate_limit_paces_writes() {
        let (a, mut b) = loopback::pair("l").unwrap();
        let cfg = FaultConfig { rate: Some(10_000_000), ..Default::default() };
        let mut a = FaultRail::new(a, cfg);
        for i in 0..20 {
            let (h, p) = data(i, 100_000);
            a.send(&h, p);
        }
        let t = Instant::now();
        let mut sink = CollectSink::default();
        pump(&mut a, &mut b, &mut sink, 20, Duration::from_secs(5));
        let el = t.elapsed().as_secs_f64();
        // 2 MB at 10 MB/s: at least ~0.19 s (minus the initial burst).
        assert!(el > 0.15, "took {el}s");
        assert_eq!(sink.frames.len(), 20);
    }

    #[test]
    fn kill_switch_and_byte_limit() {
        let (a, _b) = loopback::pair("l").unwrap();
        let k = Arc::new(AtomicBool::new(false));
        let mut a = FaultRail::new(a, FaultConfig { kill_switch: Some(k.clone()), ..Default::default() });
        assert!(a.flush().is_ok());
        k.store(true, Ordering::Relaxed);
        assert!(matches!(a.flush(), Err(RailError::Killed)));
        let (a, _b) = loopback::pair("l").unwrap();
        let mut a = FaultRail::new(a, FaultConfig { kill_after_bytes: Some(1000), ..Default::default() });
        for i in 0..10 {
            let (h, p) = data(i, 500);
            a.send(&h, p);
        }
        assert!(matches!(a.flush(), Err(RailError::Killed)));
    }
}
