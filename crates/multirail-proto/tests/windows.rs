//! What bounds the bytes in flight on one rail: its window, the measured
//! rate times `rail_window_time`, at least `rail_window_min`, and at least
//! what the rail buffers by itself (`RailCaps::buffer`, a shm ring).
//! Against one core, no IO, no clock: deterministic.

use std::time::Duration;

use bytes::Bytes;
use multirail_proto::core::{Config, Core, PeerId, RailCaps};
use multirail_proto::sim::pattern;
use multirail_proto::time::Time;

const PEER: PeerId = 1;
const CREDIT: u64 = 1 << 30;
const MSG: usize = 64 << 10;

/// The lengths of the data frames a core hands out at once for messages
/// of `lens` bytes to a peer whose rails have `caps`, rail by rail.
fn frames_of(cfg: &Config, caps: &[RailCaps], lens: &[usize]) -> Vec<u32> {
    let mut c = Core::new(cfg.clone());
    c.add_peer(PEER, caps.len());
    for (r, &k) in caps.iter().enumerate() {
        c.rail_up(PEER, r, k, CREDIT, Time::ZERO);
    }
    let t = Time::ZERO + Duration::from_millis(1);
    for (i, &len) in lens.iter().enumerate() {
        c.isend(PEER, i as u64, Bytes::from(pattern(i as u64, len)), t);
    }
    let mut out = Vec::new();
    for r in 0..caps.len() {
        while let Some(f) = c.poll_transmit(PEER, r, t) {
            if f.header.op.carries_data() {
                out.push(f.header.frag_len);
            }
        }
    }
    out
}

/// Data bytes placed at once on one rail with `caps` for `n` messages of
/// `MSG` bytes.
fn placed(cfg: &Config, caps: RailCaps, n: usize) -> u64 {
    frames_of(cfg, &[caps], &vec![MSG; n]).iter().map(|&l| u64::from(l)).sum()
}

#[test]
fn a_rail_that_buffers_by_itself_keeps_that_much_in_flight() {
    // No rate measured yet (a shm rail's bursts are too short to yield
    // one): the window is its floor. 512 KiB by default; a rail with a
    // 4 MiB ring gets 4 MiB (measured: shm `bench bw` 1.3-1.9 x at
    // 64 KiB-4 MiB), and never more than `rail_window`.
    let cfg = Config { rail_window_min: 512 << 10, rail_window: 16 << 20, chunk: 256 << 10, ..Config::default() };
    let n = 256; // 16 MiB offered
    assert_eq!(placed(&cfg, RailCaps::default(), n), 512 << 10, "the configured floor");
    let ring = RailCaps { buffer: 4 << 20, host_local: true, ..RailCaps::default() };
    assert_eq!(placed(&cfg, ring, n), 4 << 20, "the ring's size");
    let small_max = Config { rail_window: 2 << 20, ..cfg.clone() };
    assert_eq!(placed(&small_max, ring, n), 2 << 20, "capped by rail_window");
}

#[test]
fn a_peer_reached_only_through_rings_gets_chunks_of_a_quarter_ring() {
    // Fewer, larger frames through a ring (measured: shm `bench bw` 1 MiB
    // 1.14 x, 4 MiB 1.07 x with 1 MiB chunks); a peer with any rail that
    // does not buffer keeps the configured chunk, which splits the
    // message across rails of different kinds.
    let cfg = Config { eager_limit: 4 << 20, chunk: 256 << 10, ..Config::default() };
    let ring = RailCaps { buffer: 4 << 20, host_local: true, ..RailCaps::default() };
    let tcp = RailCaps { host_local: true, ..RailCaps::default() };
    assert_eq!(frames_of(&cfg, &[ring], &[2 << 20]), [1 << 20; 2], "shm alone: 1 MiB chunks");
    // (Of 2 MiB, the 512 KiB window of a rail that does not buffer takes
    // the first two chunks.)
    assert_eq!(frames_of(&cfg, &[tcp], &[2 << 20]), [256 << 10; 2], "tcp alone: the configured chunk");
    let mixed = frames_of(&cfg, &[ring, tcp], &[2 << 20]);
    assert!(mixed.iter().all(|&l| l <= 256 << 10), "shm beside tcp: the configured chunk: {mixed:?}");
    let big = Config { chunk: 2 << 20, ..cfg.clone() };
    assert_eq!(frames_of(&big, &[ring], &[2 << 20]), [2 << 20], "a larger configured chunk stays");
}
