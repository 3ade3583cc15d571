//! Soak: two ranks stream messages of random sizes (0 B to 8 MiB) to each
//! other in both directions over three loopback rails while a thread kills
//! random rails at random times (they reconnect by themselves). Every
//! payload is checked, every wait is bounded, and resident memory must
//! stay flat.
//!
//! ```text
//! cargo test -p multirail --test soak -- --nocapture                  # 60 s (CI)
//! MULTIRAIL_SOAK_SECS=600 cargo test --release -p multirail --test soak -- --nocapture
//! ```
//!
//! `MULTIRAIL_SOAK_SEED` picks another sequence of sizes and kills.

mod common;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use multirail::{Builder, Bytes, BytesMut, Endpoint, FaultConfig, Progress};

const NRAILS: usize = 3;
const MAX_SIZE: u64 = 8 << 20;
/// Messages in flight per direction.
const WINDOW: usize = 6;
/// No single send or receive may take longer than this ("must not hang").
const STALL_LIMIT: Duration = Duration::from_secs(60);
/// A killed rail must be back within this long.
const RECOVERY_LIMIT: Duration = Duration::from_secs(20);
/// Resident memory may grow this much after the warm-up (messages in
/// flight alone vary by up to 2 x 2 x WINDOW x 8 MiB).
const RSS_SLACK: u64 = 128 << 20;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

fn mix(mut x: u64) -> u64 {
    // splitmix64 finaliser
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Size of message `i` in direction `dir`: both ends compute it.
fn size_of(seed: u64, dir: u64, i: u64) -> usize {
    let h = mix(seed ^ mix(dir << 56 ^ i));
    let r = h % 100;
    let x = h >> 8;
    (match r {
        0..=4 => 0,
        5..=24 => x % 1024,
        25..=54 => x % (64 << 10),
        55..=79 => x % (1 << 20),
        80..=97 => x % MAX_SIZE,
        _ => MAX_SIZE,
    }) as usize
}

/// Payload of message `i` in direction `dir` (8 bytes per step: cheap).
fn payload(seed: u64, dir: u64, i: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 8);
    let mut x = mix(seed ^ dir.rotate_left(40) ^ i) | 1;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

#[derive(Default)]
struct Stats {
    msgs: AtomicU64,
    bytes: AtomicU64,
    kills: AtomicU64,
    recoveries: AtomicU64,
    max_recovery_ns: AtomicU64,
    /// Nanoseconds since the start of the last completion, and the
    /// longest gap between two completions.
    last_completion_ns: AtomicU64,
    max_stall_ns: AtomicU64,
    /// A thread failed or finished its part: stop.
    stop: AtomicBool,
    done_dirs: AtomicU64,
}

impl Stats {
    fn completed(&self, t0: Instant, bytes: u64) {
        let now = t0.elapsed().as_nanos() as u64;
        let prev = self.last_completion_ns.swap(now, Ordering::AcqRel);
        self.max_stall_ns.fetch_max(now.saturating_sub(prev), Ordering::AcqRel);
        self.msgs.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

struct StopOnPanic<'a>(&'a Stats);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.stop.store(true, Ordering::Release);
        }
    }
}

/// Sends messages 0, 1, ... to `peer` until `run` elapsed, at most
/// `WINDOW` in flight; the last one's tag has bit 0 set.
fn sender(ep: &Endpoint, peer: u32, seed: u64, run: Duration, t0: Instant, stats: &Stats) -> u64 {
    let _s = StopOnPanic(stats);
    let dir = ep.rank() as u64;
    let mut inflight: VecDeque<(u64, multirail::SendRequest<'_>)> = VecDeque::new();
    let mut i = 0u64;
    loop {
        assert!(!stats.stop.load(Ordering::Acquire), "stopped: another thread failed");
        assert!(i < 100_000_000);
        let last = t0.elapsed() >= run;
        let size = size_of(seed, dir, i);
        let data = Bytes::from(payload(seed, dir, i, size));
        inflight.push_back((i, ep.isend(peer, i << 1 | last as u64, data).expect("isend")));
        i += 1;
        while inflight.len() >= WINDOW || (last && !inflight.is_empty()) {
            let (n, r) = inflight.pop_front().expect("not empty");
            if let Err(e) = r.wait_timeout(Some(STALL_LIMIT)) {
                panic!("rank {}: send {n} to rank {peer} ({} bytes): {e}", ep.rank(), size_of(seed, dir, n));
            }
        }
        if last {
            return i;
        }
    }
}

/// Receives from `peer` in order, checking every byte, until the message
/// marked last.
fn receiver(ep: &Endpoint, peer: u32, seed: u64, t0: Instant, stats: &Stats) -> u64 {
    let _s = StopOnPanic(stats);
    let dir = peer as u64;
    let mut posted: VecDeque<(u64, multirail::RecvRequest<'_>)> = VecDeque::new();
    let mut next_post = 0u64;
    loop {
        assert!(!stats.stop.load(Ordering::Acquire), "stopped: another thread failed");
        assert!(next_post < 100_000_000);
        while posted.len() < WINDOW {
            let size = size_of(seed, dir, next_post);
            posted.push_back((next_post, ep.irecv(Some(peer), None, BytesMut::zeroed(size)).expect("irecv")));
            next_post += 1;
        }
        let (i, r) = posted.pop_front().expect("posted");
        let size = size_of(seed, dir, i);
        let (buf, res) = match r.wait_with_buffer(Some(STALL_LIMIT)) {
            Ok(x) => x,
            Err(e) => panic!("rank {}: receive {i} from rank {peer} ({size} bytes): {e}", ep.rank()),
        };
        let st = res.unwrap_or_else(|e| panic!("rank {}: receive {i} from rank {peer}: {e}", ep.rank()));
        assert_eq!(st.tag >> 1, i, "rank {}: messages from rank {peer} in order", ep.rank());
        assert_eq!(st.len as usize, size, "message {i} from rank {peer}: length");
        if buf[..size] != payload(seed, dir, i, size)[..] {
            let want = payload(seed, dir, i, size);
            let first = buf.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            panic!("rank {}: message {i} from rank {peer} ({size} bytes) corrupted from byte {first}", ep.rank());
        }
        stats.completed(t0, size as u64);
        if st.tag & 1 == 1 {
            return i + 1;
        }
    }
}

fn rails_up(eps: &[&Endpoint; 2], rail: Option<usize>) -> bool {
    eps.iter().enumerate().all(|(r, ep)| {
        let s = ep.rail_stats(1 - r as u32);
        match rail {
            Some(k) => s[k].up,
            None => s.iter().all(|x| x.up),
        }
    })
}

/// Sleeps `d` in small steps; false if told to stop.
fn nap(d: Duration, stats: &Stats) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if stats.stop.load(Ordering::Acquire) || stats.done_dirs.load(Ordering::Acquire) >= 2 {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5).min(end.saturating_duration_since(Instant::now())));
    }
    true
}

/// Kills one rail at a time, only while every other rail is up (so a
/// peer never loses its last rail), and checks it comes back.
fn killer(eps: [&Endpoint; 2], switches: &[Arc<AtomicBool>], seed: u64, run: Duration, t0: Instant, stats: &Stats) {
    let _s = StopOnPanic(stats);
    let mut rng = Rng(mix(seed ^ 0x4b11) | 1);
    while t0.elapsed() < run {
        if !nap(Duration::from_millis(100 + rng.below(1200)), stats) {
            return;
        }
        let k = rng.below(NRAILS as u64) as usize;
        let wait_all = Instant::now();
        while !rails_up(&eps, None) {
            assert!(
                wait_all.elapsed() < RECOVERY_LIMIT,
                "rails not all up: {:?} / {:?}",
                eps[0].rail_stats(1),
                eps[1].rail_stats(0)
            );
            if !nap(Duration::from_millis(10), stats) {
                return;
            }
        }
        switches[k].store(true, Ordering::Release);
        stats.kills.fetch_add(1, Ordering::Relaxed);
        let dead = nap(Duration::from_millis(20 + rng.below(400)), stats);
        switches[k].store(false, Ordering::Release);
        if !dead {
            return;
        }
        let t = Instant::now();
        while !rails_up(&eps, Some(k)) {
            assert!(t.elapsed() < RECOVERY_LIMIT, "rail {k} not back after {:?}", t.elapsed());
            if !nap(Duration::from_millis(5), stats) {
                return;
            }
        }
        stats.recoveries.fetch_add(1, Ordering::Relaxed);
        stats.max_recovery_ns.fetch_max(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

#[test]
fn soak() {
    let secs = env_u64("MULTIRAIL_SOAK_SECS", 60);
    let seed = env_u64("MULTIRAIL_SOAK_SEED", 0x50a4);
    let run = Duration::from_secs(secs);
    eprintln!("soak: {secs} s, seed {seed}, {NRAILS} rails, sizes 0 B..8 MiB, {WINDOW} in flight each way");
    let switches: Vec<Arc<AtomicBool>> = (0..NRAILS).map(|_| Arc::new(AtomicBool::new(false))).collect();
    let make = |rank: u32| {
        let mut c = config(NRAILS, if rank == 0 { Progress::Polled } else { Progress::Threaded });
        c.proto.connect_retry = Duration::from_millis(100);
        c.proto.connect_retry_max = Duration::from_millis(400);
        let mut b = Builder::new(c);
        for (k, sw) in switches.iter().enumerate() {
            b = b.fault(k, FaultConfig { kill_switch: Some(sw.clone()), ..Default::default() });
        }
        b
    };
    // Both endpoints live in this thread's scope, shared by the workers.
    let root = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = root.local_addr().unwrap();
    let (ep0, ep1) = std::thread::scope(|s| {
        let b0 = make(0).rank(0, 2).root_listener(root);
        let b1 = make(1).rank(1, 2).root(addr);
        let h0 = s.spawn(move || b0.build().expect("rank 0"));
        let h1 = s.spawn(move || b1.build().expect("rank 1"));
        (h0.join().unwrap(), h1.join().unwrap())
    });
    let stats = Stats::default();
    let rss_start = rss_bytes();
    let t0 = Instant::now();
    let samples: Vec<(Duration, u64)> = std::thread::scope(|s| {
        let (st, eps) = (&stats, [&ep0, &ep1]);
        let sampler = s.spawn(move || {
            let mut v = vec![(Duration::ZERO, rss_bytes())];
            while st.done_dirs.load(Ordering::Acquire) < 2 && !st.stop.load(Ordering::Acquire) {
                assert!(t0.elapsed() < run + STALL_LIMIT * 3, "the soak never ended");
                std::thread::sleep(Duration::from_nanos(1_000_000_000 - t0.elapsed().subsec_nanos() as u64));
                v.push((t0.elapsed(), rss_bytes()));
            }
            v
        });
        let kill = s.spawn(move || killer(eps, &switches, seed, run, t0, st));
        let mut workers = Vec::new();
        for (me, ep) in eps.iter().enumerate() {
            let peer = 1 - me as u32;
            let ep = *ep;
            workers.push(s.spawn(move || ("sent", sender(ep, peer, seed, run, t0, st))));
            workers.push(s.spawn(move || {
                let n = receiver(ep, peer, seed, t0, st);
                st.done_dirs.fetch_add(1, Ordering::AcqRel);
                ("received", n)
            }));
        }
        let mut failure = None;
        for (i, w) in workers.into_iter().enumerate() {
            match w.join() {
                Ok((what, n)) => eprintln!("rank {}: {what} {n} messages", i / 2),
                Err(p) => {
                    failure.get_or_insert(p);
                }
            }
        }
        stats.stop.store(true, Ordering::Release);
        if let Err(p) = kill.join() {
            failure.get_or_insert(p);
        }
        let samples = sampler.join();
        if let Some(p) = failure {
            std::panic::resume_unwind(p);
        }
        samples.expect("sampler")
    });
    let took = t0.elapsed();
    let downs: Vec<u64> =
        [(&ep0, 1), (&ep1, 0)].iter().map(|(ep, p)| ep.rail_stats(*p).iter().map(|r| r.downs).sum()).collect();
    let retransmits: u64 =
        [(&ep0, 1), (&ep1, 0)].iter().map(|(ep, p)| ep.rail_stats(*p).iter().map(|r| r.retransmits).sum::<u64>()).sum();
    let errors = [ep0.rail_errors(), ep1.rail_errors()];
    std::thread::scope(|s| {
        let c0 = s.spawn(move || ep0.close());
        let c1 = s.spawn(move || ep1.close());
        c0.join().unwrap().expect("rank 0 closes cleanly");
        c1.join().unwrap().expect("rank 1 closes cleanly");
    });

    // Memory: flat after the warm-up.
    eprintln!("RSS samples (s: MiB):");
    for chunk in samples.chunks(10) {
        let line: Vec<String> =
            chunk.iter().map(|(t, r)| format!("{:>4.0}: {:>6.1}", t.as_secs_f64(), mib(*r))).collect();
        eprintln!("  {}", line.join("  "));
    }
    // The RSS "at the end of the warm-up" is the highest sample of the
    // warm-up (the first 20 % of the run): a single sample depends on
    // which messages happen to be in flight (up to ~200 MiB of them), a
    // leak shows as growth beyond everything seen during the warm-up.
    let warm_at = run.mul_f64(0.2);
    let warm_idx = samples.iter().position(|(t, _)| *t >= warm_at).unwrap_or(samples.len() - 1);
    let rss_warm = samples[..=warm_idx].iter().map(|s| s.1).max().unwrap_or(0);
    let rss_max = samples.iter().map(|s| s.1).max().unwrap_or(0);
    let rss_max_after = samples[warm_idx..].iter().map(|s| s.1).max().unwrap_or(0);
    let rss_end = samples.last().map_or(0, |s| s.1);

    let msgs = stats.msgs.load(Ordering::Relaxed);
    let bytes = stats.bytes.load(Ordering::Relaxed);
    let mut reasons: Vec<String> = errors.iter().flatten().map(|e| e.2.clone()).collect();
    reasons.sort();
    reasons.dedup();
    eprintln!("soak summary ({:.1} s, seed {seed}):", took.as_secs_f64());
    eprintln!("  messages received  {msgs} ({:.1} MiB, {:.1} MiB/s)", mib(bytes), mib(bytes) / took.as_secs_f64());
    eprintln!("  rail kills         {}", stats.kills.load(Ordering::Relaxed));
    eprintln!(
        "  reconnections      {} observed (slowest {:.0} ms); rail downs rank 0 {}, rank 1 {}; retransmitted fragments {retransmits}",
        stats.recoveries.load(Ordering::Relaxed),
        stats.max_recovery_ns.load(Ordering::Relaxed) as f64 / 1e6,
        downs[0],
        downs[1]
    );
    eprintln!(
        "  max stall          {:.0} ms (longest time without a completed receive)",
        stats.max_stall_ns.load(Ordering::Relaxed) as f64 / 1e6
    );
    eprintln!(
        "  RSS                start {:.1} MiB, warm-up max {:.1} MiB, max {:.1} MiB (after warm-up {:.1}), end {:.1} MiB",
        mib(rss_start),
        mib(rss_warm),
        mib(rss_max),
        mib(rss_max_after),
        mib(rss_end)
    );
    eprintln!("  rail failure reasons: {reasons:?}");
    assert!(msgs > 0);
    assert!(
        rss_max_after <= rss_warm + RSS_SLACK,
        "resident memory grew by {:.1} MiB after the warm-up (allowed {:.1} MiB)",
        mib(rss_max_after - rss_warm),
        mib(RSS_SLACK)
    );
}
