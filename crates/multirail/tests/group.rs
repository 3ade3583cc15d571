//! Ordered multicast groups (`multirail::group`) over loopback TCP: three
//! ranks as threads of this process, random message sizes up to 1 MiB,
//! every payload checked, identical delivery sequences at every member, and
//! a member that leaves mid-run.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Rng, config, job};
use multirail::group::{Mode, Senders};
use multirail::{Builder, Bytes, Endpoint, Group, GroupEvent, GroupOptions, Progress};

const HEADER: usize = 12;
/// Every wait of these tests ends by then.
const LIMIT: Duration = Duration::from_secs(120);

fn make(_r: u32) -> Builder {
    Builder::new(config(2, Progress::Threaded))
}

/// Message `k` of `sender`, `len` bytes (at least the header): the header
/// names it, the rest is a pattern of both.
fn payload(sender: u32, k: u64, len: usize) -> Bytes {
    let len = len.max(HEADER);
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&sender.to_le_bytes());
    v.extend_from_slice(&k.to_le_bytes());
    v.extend(
        (HEADER..len).map(|i| (i as u64).wrapping_mul(7).wrapping_add(k * 13).wrapping_add(u64::from(sender)) as u8),
    );
    Bytes::from(v)
}

/// Checks a payload against its header and the delivering sender;
/// returns its `k`.
fn check(sender: u32, p: &[u8]) -> u64 {
    assert!(p.len() >= HEADER, "payload of {} bytes", p.len());
    let s = u32::from_le_bytes(p[..4].try_into().unwrap());
    let k = u64::from_le_bytes(p[4..12].try_into().unwrap());
    assert_eq!(s, sender, "payload of sender {s} delivered as sender {sender}'s");
    assert!(payload(s, k, p.len())[..] == *p, "payload {k} of sender {s} ({} bytes) is corrupt", p.len());
    k
}

fn senders_of(s: &Senders, n: u32) -> Vec<u32> {
    match s {
        Senders::All => (0..n).collect(),
        Senders::One(r) => vec![*r],
        Senders::List(l) => l.clone(),
    }
}

/// One member: joins the group, sends `count` random-size messages if it
/// is a sender (from a second thread), receives until it delivered every
/// sender's `count`; returns the (sender, k) sequence.
fn member(ep: Endpoint, senders: Senders, mode: Mode, count: u64, max: usize, window: u32) -> Vec<(u32, u64)> {
    let n = ep.size();
    let me = ep.rank();
    ep.barrier().unwrap();
    let ep = Arc::new(ep);
    let opts = GroupOptions { senders: senders.clone(), mode, window, max_message: max, ..GroupOptions::default() };
    let g = Group::new(ep.clone(), opts).unwrap();
    let from = senders_of(&senders, n);
    let expected = count * from.len() as u64;
    let t0 = Instant::now();
    let seq = std::thread::scope(|s| {
        if from.contains(&me) {
            let g = &g;
            s.spawn(move || {
                let mut rng = Rng(0x9e37_79b9 + u64::from(me) * 1_000_003);
                for k in 0..count {
                    // Mostly small, sometimes up to `max`.
                    let len = match rng.below(4) {
                        0 => rng.below(max as u64 + 1) as usize,
                        _ => rng.below(64 * 1024) as usize,
                    };
                    g.ordered_send_timeout(payload(me, k, len.min(max)), LIMIT).unwrap();
                }
            });
        }
        let mut seq = Vec::new();
        let mut next = vec![0u64; n as usize];
        while (seq.len() as u64) < expected {
            assert!(t0.elapsed() < LIMIT, "rank {me}: {} of {expected} delivered in {LIMIT:?}", seq.len());
            match g.recv_timeout(Duration::from_secs(1)).unwrap() {
                Some(GroupEvent::Message(d)) => {
                    let k = check(d.sender, &d.payload);
                    assert_eq!(k, next[d.sender as usize], "rank {me}: sender {}'s messages out of order", d.sender);
                    next[d.sender as usize] += 1;
                    assert_eq!(d.view, 0);
                    seq.push((d.sender, k));
                }
                Some(GroupEvent::View { view, members }) => panic!("rank {me}: unexpected view {view} {members:?}"),
                None => {}
            }
        }
        seq
    });
    // Everybody delivered everything before anyone stops driving.
    ep.barrier().unwrap();
    drop(g);
    Arc::try_unwrap(ep).ok().expect("the group let go of the endpoint").close().unwrap();
    seq
}

fn run(senders: Senders, mode: Mode, count: u64, max: usize, window: u32) {
    let seqs = job(3, make, |ep| member(ep, senders.clone(), mode, count, max, window));
    let nsenders = senders_of(&senders, 3).len() as u64;
    for s in &seqs {
        assert_eq!(s.len() as u64, count * nsenders);
    }
    match mode {
        Mode::Ordered => {
            assert_eq!(seqs[0], seqs[1], "ranks 0 and 1 delivered different sequences");
            assert_eq!(seqs[0], seqs[2], "ranks 0 and 2 delivered different sequences");
        }
        Mode::Unordered => {
            // Per sender FIFO is checked as delivered; the same set.
            for s in &seqs[1..] {
                let (mut a, mut b) = (seqs[0].clone(), s.clone());
                a.sort_unstable();
                b.sort_unstable();
                assert_eq!(a, b);
            }
        }
    }
}

#[test]
fn ordered_all_senders() {
    run(Senders::All, Mode::Ordered, 40, 1 << 20, 8);
}

#[test]
fn ordered_one_sender() {
    run(Senders::One(1), Mode::Ordered, 60, 1 << 20, 8);
}

#[test]
fn unordered_all_senders() {
    run(Senders::All, Mode::Unordered, 40, 1 << 20, 8);
}

#[test]
fn unordered_one_sender() {
    run(Senders::One(0), Mode::Unordered, 60, 1 << 20, 4);
}

#[test]
fn small_messages_small_window() {
    run(Senders::All, Mode::Ordered, 500, 256, 2);
}

/// What a member of the leave test saw.
#[derive(Debug)]
struct Seen {
    /// Deliveries and views, in order: (view, sender, k); a view is
    /// (view, u32::MAX, number of members).
    events: Vec<(u64, u32, u64)>,
}

/// How rank 2 goes away.
#[derive(Clone, Copy, PartialEq)]
enum Leave {
    /// It closes its group, then its endpoint.
    Close,
    /// Every rail of its endpoint is cut (and every reconnection) while it
    /// keeps running: it must stop by itself (partition safety).
    Silence,
}

/// Rank 2 leaves after delivering `leave_after` messages; ranks 0 and 1
/// must install view 1 = {0, 1}, deliver identical sequences, and go on
/// until each has delivered all `count` of both survivors. Rank 2's
/// sequence is a prefix of theirs.
fn leave_run(how: Leave, leave_after: u64, count: u64, max: usize, chunk: usize) {
    let survivors_done = std::sync::Barrier::new(2);
    let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let make = |r: u32| {
        let mut b = Builder::new(config(2, Progress::Threaded)).peer_timeout(Duration::from_secs(1));
        if r == 2 {
            for rail in 0..2 {
                let f = multirail::FaultConfig { kill_switch: Some(cut.clone()), ..Default::default() };
                b = b.fault(rail, f);
            }
        }
        b
    };
    let seen = job(3, make, |ep| {
        let me = ep.rank();
        ep.barrier().unwrap();
        let ep = Arc::new(ep);
        let opts = GroupOptions {
            window: 4,
            max_message: max,
            failure_timeout: Duration::from_millis(500),
            chunk,
            ..GroupOptions::default()
        };
        let g = Group::new(ep.clone(), opts).unwrap();
        let t0 = Instant::now();
        let mut events = Vec::new();
        std::thread::scope(|s| {
            let g = &g;
            let sender = s.spawn(move || {
                let mut rng = Rng(77 + u64::from(me));
                for k in 0..count {
                    let len = rng.below(max as u64 + 1) as usize;
                    match g.ordered_send_timeout(payload(me, k, len), LIMIT) {
                        Ok(()) => {}
                        // Rank 2's group closes under it.
                        Err(_) if me == 2 => return,
                        Err(e) => panic!("rank {me}: send {k}: {e}"),
                    }
                }
            });
            let mut next = [0u64; 3];
            let mut view = 0;
            loop {
                assert!(t0.elapsed() < LIMIT, "rank {me}: stuck after {events:?}");
                if me == 2 && events.len() as u64 >= leave_after {
                    break;
                }
                if me != 2 && view == 1 && next[0] == count && next[1] == count {
                    break;
                }
                match g.recv_timeout(Duration::from_secs(1)).unwrap() {
                    Some(GroupEvent::Message(d)) => {
                        let k = check(d.sender, &d.payload);
                        assert_eq!(k, next[d.sender as usize], "rank {me}: sender {} out of order", d.sender);
                        next[d.sender as usize] += 1;
                        assert_eq!(d.view, view);
                        events.push((d.view, d.sender, k));
                    }
                    Some(GroupEvent::View { view: v, members }) => {
                        assert_eq!((v, members.as_slice()), (1, &[0, 1][..]), "rank {me}");
                        view = v;
                        events.push((v, u32::MAX, members.len() as u64));
                    }
                    None => {}
                }
            }
            match how {
                // The group stops (a send blocked in the sender thread
                // fails), then the endpoint closes.
                Leave::Close if me == 2 => g.close(),
                Leave::Silence if me == 2 => {
                    cut.store(true, std::sync::atomic::Ordering::Release);
                    // It may still deliver what every member held; then it
                    // finds itself cut off from half of its view and stops.
                    loop {
                        assert!(t0.elapsed() < LIMIT, "rank 2 never stopped");
                        match g.recv_timeout(Duration::from_secs(1)) {
                            Ok(Some(GroupEvent::Message(d))) => {
                                let k = check(d.sender, &d.payload);
                                assert_eq!(k, next[d.sender as usize]);
                                next[d.sender as usize] += 1;
                                events.push((d.view, d.sender, k));
                            }
                            Ok(Some(GroupEvent::View { view, members })) => {
                                panic!("rank 2 installed view {view} {members:?}")
                            }
                            Ok(None) => {}
                            Err(multirail::GroupError::Partitioned(0) | multirail::GroupError::Expelled(0)) => break,
                            Err(e) => panic!("rank 2: {e}"),
                        }
                    }
                }
                _ => {}
            }
            sender.join().unwrap();
        });
        if me == 2 {
            drop(g);
            drop(Arc::try_unwrap(ep).ok().expect("the group let go of the endpoint"));
        } else {
            survivors_done.wait();
            drop(g);
            drop(ep);
        }
        Seen { events }
    });
    let (a, b, c) = (&seen[0].events, &seen[1].events, &seen[2].events);
    assert_eq!(a, b, "the survivors delivered different sequences");
    assert!(a.iter().any(|e| e.1 == u32::MAX), "no view change");
    let cut = a.iter().position(|e| e.1 == u32::MAX).unwrap();
    assert!(c.len() <= cut && a[..c.len()] == c[..], "rank 2's deliveries are not a prefix of the survivors'");
    // Nothing twice.
    let mut all: Vec<_> = a.iter().filter(|e| e.1 != u32::MAX).map(|e| (e.1, e.2)).collect();
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "a message was delivered twice");
}

#[test]
fn member_leaves_survivors_go_on() {
    leave_run(Leave::Close, 20, 60, 64 * 1024, GroupOptions::default().chunk);
}

/// Messages up to 1 MiB, those over 256 KiB in chunks: a member dies
/// while chunks of its and the others' messages are under way.
#[test]
fn member_leaves_large_messages() {
    leave_run(Leave::Close, 5, 30, 1 << 20, 256 << 10);
}

#[test]
fn member_silenced_survivors_go_on() {
    leave_run(Leave::Silence, 20, 60, 64 * 1024, GroupOptions::default().chunk);
}

#[test]
fn member_silenced_large_messages() {
    leave_run(Leave::Silence, 5, 30, 1 << 20, 256 << 10);
}

/// A group of ranks 0 and 2 of a job of 3; rank 1 is not a member. One
/// thread per member sends and drains deliveries with `try_recv`.
#[test]
fn subset_of_ranks() {
    let seqs = job(3, make, |ep| {
        let me = ep.rank();
        ep.barrier().unwrap();
        let ep = Arc::new(ep);
        let opts = GroupOptions {
            members: Some(vec![0, 2]),
            senders: Senders::List(vec![0, 2]),
            window: 4,
            max_message: 4096,
            ..GroupOptions::default()
        };
        let mut seq = Vec::new();
        let g = if me == 1 {
            assert!(Group::new(ep.clone(), opts).is_err(), "rank 1 is not a member");
            None
        } else {
            Some(Group::new(ep.clone(), opts).unwrap())
        };
        if let Some(g) = &g {
            let t0 = Instant::now();
            let take = |e: GroupEvent, seq: &mut Vec<(u32, u64)>| match e {
                GroupEvent::Message(d) => seq.push((d.sender, check(d.sender, &d.payload))),
                GroupEvent::View { .. } => panic!("no view change expected"),
            };
            for k in 0..50u64 {
                g.ordered_send_timeout(payload(me, k, 100 + k as usize * 40), LIMIT).unwrap();
                while let Some(e) = g.try_recv().unwrap() {
                    take(e, &mut seq);
                }
            }
            while seq.len() < 100 {
                assert!(t0.elapsed() < LIMIT, "rank {me}: {} of 100", seq.len());
                if let Some(e) = g.recv_timeout(Duration::from_secs(1)).unwrap() {
                    take(e, &mut seq);
                }
            }
        }
        ep.barrier().unwrap();
        drop(g);
        seq
    });
    assert_eq!(seqs[0].len(), 100);
    assert_eq!(seqs[0], seqs[2]);
    assert!(seqs[1].is_empty());
}

/// Rank 0 sends 30 messages of 200 KiB to a group of 3. Relayed (the
/// default for this size) they go 0 -> 1 -> 2: rank 0's rails to rank 2
/// carry only rows and nulls, rank 1 passes every message on. With
/// relaying off, rank 0 sends each message to both. The same in chunks of
/// 48 KiB (five per message, passed on one by one and reassembled into
/// buffers the group reuses). Every payload is checked and the orders
/// agree.
#[test]
fn one_sender_relays_large_messages_along_the_chain() {
    const COUNT: u64 = 30;
    const LEN: usize = 200 * 1024;
    let total = COUNT * LEN as u64;
    let relay = GroupOptions::default().relay_min;
    for (relay_min, chunk) in [(relay, usize::MAX), (usize::MAX, usize::MAX), (relay, 48 << 10), (usize::MAX, 48 << 10)]
    {
        // Per rank: (delivered sequence, payload bytes sent to each rank).
        let out = job(3, make, |ep| {
            let me = ep.rank();
            ep.barrier().unwrap();
            let ep = Arc::new(ep);
            let opts = GroupOptions {
                senders: Senders::One(0),
                window: 4,
                max_message: LEN,
                relay_min,
                chunk,
                ..GroupOptions::default()
            };
            let g = Group::new(ep.clone(), opts).unwrap();
            let t0 = Instant::now();
            // Deliveries queue up in the group while the sender sends.
            if me == 0 {
                for k in 0..COUNT {
                    g.ordered_send_timeout(payload(0, k, LEN), LIMIT).unwrap();
                }
            }
            let mut seq = Vec::new();
            while (seq.len() as u64) < COUNT {
                assert!(t0.elapsed() < LIMIT, "rank {me}: {} of {COUNT} delivered", seq.len());
                if let Some(e) = g.recv_timeout(Duration::from_secs(1)).unwrap() {
                    match e {
                        GroupEvent::Message(d) => seq.push(check(d.sender, &d.payload)),
                        GroupEvent::View { .. } => panic!("no view change expected"),
                    }
                }
            }
            ep.barrier().unwrap();
            drop(g);
            let tx: Vec<u64> =
                (0..3).map(|p| if p == me { 0 } else { ep.rail_stats(p).iter().map(|s| s.tx_bytes).sum() }).collect();
            (seq, tx)
        });
        for (seq, _) in &out {
            assert_eq!(seq, &(0..COUNT).collect::<Vec<_>>());
        }
        let tx = |from: usize, to: usize| out[from].1[to];
        if relay_min == usize::MAX {
            assert!(tx(0, 1) >= total && tx(0, 2) >= total, "direct: rank 0 sent {} and {}", tx(0, 1), tx(0, 2));
            assert!(tx(1, 2) < total / 4, "direct: rank 1 passed on {} bytes", tx(1, 2));
        } else {
            assert!(tx(0, 1) >= total && tx(1, 2) >= total, "relayed: 0->1 {} 1->2 {}", tx(0, 1), tx(1, 2));
            assert!(tx(0, 2) < total / 4, "relayed: rank 0 sent {} bytes to rank 2", tx(0, 2));
            assert!(tx(2, 0) < total / 4, "relayed: rank 2 sent {} bytes back to rank 0", tx(2, 0));
        }
    }
}

/// With a window of one, each message can enter the group only once the
/// previous one is delivered everywhere, which the driver learns from rows
/// in the middle of a turn. It must take the waiting message in that same
/// moment, not at its next tick: with a 4 s heartbeat (ticks every 2 s),
/// 10 messages would take about 20 s if each waited for a tick; they take
/// milliseconds (2026-11-27: 12 ms per message at the default 10 ms
/// heartbeat before, 0.35-0.5 ms after, on loopback).
#[test]
fn a_reopened_window_takes_the_next_message_at_once() {
    const COUNT: u64 = 10;
    let out = job(3, make, |ep| {
        let me = ep.rank();
        ep.barrier().unwrap();
        let ep = Arc::new(ep);
        let opts = GroupOptions {
            senders: Senders::One(0),
            window: 1,
            max_message: 1024,
            heartbeat_interval: Duration::from_secs(4),
            failure_timeout: Duration::from_secs(60),
            ..GroupOptions::default()
        };
        let g = Group::new(ep.clone(), opts).unwrap();
        let t0 = Instant::now();
        let mut seq = Vec::new();
        std::thread::scope(|s| {
            if me == 0 {
                s.spawn(|| {
                    for k in 0..COUNT {
                        g.ordered_send_timeout(payload(0, k, 1024), LIMIT).unwrap();
                    }
                });
            }
            while (seq.len() as u64) < COUNT {
                assert!(t0.elapsed() < LIMIT, "rank {me}: {} of {COUNT} delivered", seq.len());
                if let Some(GroupEvent::Message(d)) = g.recv_timeout(Duration::from_secs(1)).unwrap() {
                    seq.push(check(d.sender, &d.payload));
                }
            }
        });
        let took = t0.elapsed();
        ep.barrier().unwrap();
        (seq, took)
    });
    for (seq, took) in &out {
        assert_eq!(seq, &(0..COUNT).collect::<Vec<_>>());
        assert!(*took < Duration::from_secs(10), "{COUNT} messages took {took:?}: each waited for a tick");
    }
}

/// A member whose application stops calling `recv` (busy elsewhere)
/// stays in the group and holds nobody up: while an application thread
/// receives, it drives the group itself, and when it stops the group's own
/// thread takes over (rows, heartbeats), so the senders' windows keep
/// moving. Rank 2 stops after its 20th delivery for five failure timeouts
/// and until ranks 0 and 1 delivered every message (which needs its rows),
/// then receives everything it missed, in the same order as the others.
/// Polled progress, as `multirail bench` runs it.
#[test]
fn a_member_that_stops_receiving_for_a_while_holds_nobody_up() {
    const COUNT: u64 = 200;
    let timeout = Duration::from_millis(300);
    let finished = std::sync::atomic::AtomicUsize::new(0);
    let out = job(
        3,
        |_| Builder::new(config(2, Progress::Polled)),
        |ep| {
            let me = ep.rank();
            ep.barrier().unwrap();
            let ep = Arc::new(ep);
            let opts = GroupOptions {
                senders: Senders::List(vec![0, 1]),
                window: 4,
                max_message: 4096,
                failure_timeout: timeout,
                ..GroupOptions::default()
            };
            let g = Group::new(ep.clone(), opts).unwrap();
            let t0 = Instant::now();
            let mut seq = Vec::new();
            // Rank 2: after how many deliveries it stopped, and whether the
            // others finished meanwhile.
            let mut paused = None;
            std::thread::scope(|s| {
                if me < 2 {
                    s.spawn(|| {
                        for k in 0..COUNT {
                            let len = 100 + (k as usize * 131) % 3900;
                            g.ordered_send_timeout(payload(me, k, len), LIMIT).unwrap();
                        }
                    });
                }
                while (seq.len() as u64) < 2 * COUNT {
                    assert!(t0.elapsed() < LIMIT, "rank {me}: {} of {} delivered", seq.len(), 2 * COUNT);
                    if me == 2 && paused.is_none() && seq.len() >= 20 {
                        std::thread::sleep(timeout * 5);
                        let t = Instant::now();
                        while finished.load(std::sync::atomic::Ordering::Acquire) < 2 && t.elapsed() < LIMIT / 4 {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        paused = Some((seq.len(), finished.load(std::sync::atomic::Ordering::Acquire)));
                    }
                    match g.recv_timeout(Duration::from_secs(1)).unwrap() {
                        Some(GroupEvent::Message(d)) => seq.push((d.sender, check(d.sender, &d.payload))),
                        Some(GroupEvent::View { view, members }) => {
                            panic!("rank {me}: view {view} {members:?} while a member only stopped receiving")
                        }
                        None => {}
                    }
                }
                if me < 2 {
                    finished.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                }
            });
            ep.barrier().unwrap();
            drop(g);
            (seq, paused)
        },
    );
    assert_eq!(out[0].0, out[1].0, "ranks 0 and 1 delivered different sequences");
    assert_eq!(out[0].0, out[2].0, "ranks 0 and 2 delivered different sequences");
    assert_eq!(
        out[2].1,
        Some((20, 2)),
        "rank 2 stopped receiving after 20 deliveries, and ranks 0 and 1 delivered everything meanwhile"
    );
}
