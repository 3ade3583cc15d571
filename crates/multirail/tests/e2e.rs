//! End-to-end over real loopback TCP and shared memory, the ranks threads
//! of this process. One conformance suite (random sizes from 0 B to
//! 16 MiB under every policy, payloads verified, many messages in flight;
//! any-source matching, truncation, simultaneous first sends, detached
//! requests, the direct path, `progress_until`; both progress engines)
//! is instantiated per rail set, a module each: `over_tcp` (two loopback
//! TCP rails), `over_shm`, `over_shm_tcp` and `over_tcp_shm` (both
//! orders: the order decides which rail a pair's small messages take).
//! Every instance checks that it ran over its set. Then tests of one rail
//! kind: other TCP rail counts, the `shm` ring, automatic shared memory
//! between same-host ranks, the libfabric rails (`--features ofi`), the
//! engines' spinning and wake-ups, TCP write coalescing.

mod common;

use common::*;
use multirail::{Builder, Bytes, BytesMut, Endpoint, Finished, Progress, Request, ShmMode};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn exchange(nrails: usize, progress: Progress, policy: &str, seed: u64, count: usize) {
    exchange_on(&rails(nrails), progress, policy, seed, count)
}

fn exchange_on(rail_list: &str, progress: Progress, policy: &str, seed: u64, count: usize) {
    let sizes = sizes(seed, count);
    job(2, |_| builder(rail_list, progress, policy), |ep| exchange_rank(ep, rail_list, policy, &sizes));
}

/// The endpoint of [`exchange_on`]. `ofi:` rails are all connected before
/// the first send (here and in [`wait_rails_up`]): setting one up takes
/// longer than a TCP connect (a fabric per connection, the address
/// exchange), and a burst sent before is striped over the rails that are
/// up, which the stripe check refuses.
fn builder(rail_list: &str, progress: Progress, policy: &str) -> Builder {
    Endpoint::builder()
        .shm(ShmMode::Off)
        .policy(policy)
        .progress(progress)
        .rails(rail_list)
        .key("k")
        .eager_connect(rail_list.contains("ofi:"))
}

/// Waits (bounded) until every rail to `peer` is up, so that a first
/// burst is striped over all of them.
fn wait_rails_up(ep: &Endpoint, peer: u32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !ep.rail_stats(peer).iter().all(|s| s.up) {
        assert!(std::time::Instant::now() < deadline, "rails not up after 20 s: {:?}", ep.rail_stats(peer));
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Message sizes from 0 B to 16 MiB.
fn sizes(seed: u64, count: usize) -> Vec<usize> {
    let mut rng = Rng(seed);
    (0..count)
        .map(|_| match rng.below(5) {
            0 => 0,
            1 => rng.below(100) as usize,
            2 => rng.below(100_000) as usize,
            3 => rng.below(2 << 20) as usize,
            _ => (rng.below(16 << 20) + 1) as usize,
        })
        .collect()
}

/// One rank's part: rank 0 sends everything at once, rank 1 checks order,
/// lengths and every byte.
fn exchange_rank(ep: Endpoint, rail_list: &str, policy: &str, sizes: &[usize]) {
    exchange_part(&ep, rail_list, policy, sizes);
    ep.close().unwrap();
}

/// [`exchange_rank`] but the close.
fn exchange_part(ep: &Endpoint, rail_list: &str, policy: &str, sizes: &[usize]) {
    let nrails = rail_list.split(',').count();
    if rail_list.contains("ofi:") {
        wait_rails_up(ep, 1 - ep.rank());
    }
    if ep.rank() == 0 {
        // Everything in flight at once.
        let reqs: Vec<Request> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| ep.isend(1, i as u64, pattern(i as u64, n)).unwrap().into())
            .collect();
        for r in ep.wait_all(reqs) {
            r.unwrap();
        }
    } else {
        let reqs: Vec<Request> =
            sizes.iter().map(|&n| ep.irecv(Some(0), None, BytesMut::zeroed(n)).unwrap().into()).collect();
        for (i, r) in ep.wait_all(reqs).into_iter().enumerate() {
            let Finished::Received(buf, st) = r.unwrap() else { panic!() };
            assert_eq!(st.tag, i as u64, "in order");
            assert_eq!(st.len as usize, sizes[i]);
            assert!(buf[..] == pattern(i as u64, sizes[i])[..], "payload {i} ({} bytes)", sizes[i]);
        }
        let stats = ep.rail_stats(0);
        assert_eq!(stats.len(), nrails);
        if nrails > 1 && policy.contains("stripe") {
            assert!(stats.iter().all(|s| s.rx_bytes > 0), "all rails used: {stats:?}");
        }
    }
}

// ----- the conformance suite, one instance per rail set -----

/// A rail list the conformance suite runs over, as `MULTIRAIL_RAILS`
/// spells it. Its endpoints have automatic shared memory off, so ranks of
/// this process (one host) talk over exactly these rails and no `shm`
/// rail of their own is added.
#[derive(Clone, Copy, Debug)]
struct RailSet(&'static str);

thread_local! {
    /// Payload bytes received over a `shm` rail in the jobs of the test
    /// running on this thread ([`RailSet::job`], [`RailSet::conform`]).
    static SHM_RECEIVED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl RailSet {
    fn names(self) -> Vec<&'static str> {
        self.0.split(',').collect()
    }

    /// The index of the `shm` rail, if the set has one.
    fn shm(self) -> Option<usize> {
        self.names().iter().position(|&n| n == "shm")
    }

    /// An endpoint over exactly this set; the default engine and policy.
    fn builder(self) -> Builder {
        Endpoint::builder().shm(ShmMode::Off).rails(self.0).key("k")
    }

    /// Runs one test of the suite over this set, and checks that it ran
    /// over it: each of its jobs did ([`RailSet::job`]), and with a `shm`
    /// rail in the set, payload crossed it in some job of the test. (Not
    /// in every job: a pair's small messages take its preferred rail,
    /// `(rank + peer) mod rails`, and a burst at the start goes over the
    /// rails up by then, TCP before `shm`, whose set-up takes longer. So
    /// the tests of few, small or early messages run over pairs whose
    /// preferred rails are each rail of a two-rail set, ranks 0-1 and
    /// 0-2, or send once more when every rail is up.)
    fn conform(self, test: impl FnOnce(RailSet)) {
        SHM_RECEIVED.set(0);
        test(self);
        if self.shm().is_some() {
            assert!(SHM_RECEIVED.get() > 0, "{self:?}: no payload crossed the shm rail in any job of the test");
        }
    }

    /// Runs `f` on `n` ranks with endpoints from `make(self.builder())`,
    /// then checks every rank ran over this set ([`RailSet::check`]) and
    /// closes its endpoint. Every rank checks before any closes, so the
    /// checks are of the test's traffic; closing has its own test
    /// (`tests/close.rs`: until 2026-12-03 a peer closing while a rail this
    /// rank opened on demand was up here but not yet there dropped that
    /// connection without a CLOSE, and this rank counted a failed rail).
    fn job<T: Send>(
        self,
        n: u32,
        make: impl Fn(Builder) -> Builder + Sync,
        f: impl Fn(&Endpoint) -> T + Sync,
    ) -> Vec<T> {
        let out = job(
            n,
            |_| make(self.builder()),
            |ep| {
                let t = f(&ep);
                let shm_received = self.check(&ep);
                ep.barrier().unwrap();
                ep.close().unwrap();
                (t, shm_received)
            },
        );
        SHM_RECEIVED.set(SHM_RECEIVED.get() + out.iter().map(|o| o.1).sum::<u64>());
        out.into_iter().map(|o| o.0).collect()
    }

    /// Asserts that `ep`'s rails are this set's, that it reaches every
    /// peer over all of them, and that no rail failed (only became suspect
    /// for a while, or answered again: a rail that broke and left its
    /// traffic to the others would pass the test's own checks); returns
    /// the payload bytes it received over the `shm` rail from all peers.
    fn check(self, ep: &Endpoint) -> u64 {
        let me = ep.rank();
        let names = self.names();
        assert_eq!(ep.rail_names(), names, "{self:?}: rank {me}'s rails");
        let all: Vec<usize> = (0..names.len()).collect();
        let mut shm_received = 0;
        for p in (0..ep.size()).filter(|&p| p != me) {
            assert_eq!(ep.rails_to(p), all, "{self:?}: rank {me} reaches rank {p} over every rail of the set");
            let stats = ep.rail_stats(p);
            assert_eq!(stats.len(), names.len(), "{self:?}: rank {me} to {p}: {stats:?}");
            if let Some(i) = self.shm() {
                shm_received += stats[i].rx_bytes;
            }
        }
        let errors = ep.rail_errors();
        assert!(
            errors.iter().all(|e| e.2.starts_with("suspect") || e.2 == "answered again"),
            "{self:?}: rank {me}: a rail failed: {errors:?}"
        );
        shm_received
    }
}

/// The end-to-end suite, as one module of tests per rail set: `$seed`
/// seeds its random sizes. Tests of one rail kind (the `shm` ring, TCP
/// write coalescing, the engines' wake-up counters: below) are not part
/// of it.
macro_rules! conformance {
    ($($set:ident: $rails:literal, seed $seed:literal;)*) => {$(
        #[doc = concat!("The conformance suite over `", $rails, "`.")]
        mod $set {
            use super::*;

            const RAILS: RailSet = RailSet($rails);

            #[test]
            fn random_sizes_every_policy_polled() {
                RAILS.conform(|r| super::random_sizes_every_policy(r, Progress::Polled, $seed));
            }

            #[test]
            fn random_sizes_every_policy_threaded() {
                RAILS.conform(|r| super::random_sizes_every_policy(r, Progress::Threaded, $seed + 10));
            }

            #[test]
            fn blocking_ping_pong_and_any_source() {
                RAILS.conform(super::blocking_ping_pong_and_any_source);
            }

            #[test]
            fn truncation_is_a_receive_error_and_the_buffer_comes_back() {
                RAILS.conform(super::truncation_is_a_receive_error_and_the_buffer_comes_back);
            }

            #[test]
            fn simultaneous_first_sends_settle_on_one_connection_per_rail() {
                RAILS.conform(super::simultaneous_first_sends_settle_on_one_connection_per_rail);
            }

            #[test]
            fn detached_requests_complete_after_attach() {
                RAILS.conform(super::detached_requests_complete_after_attach);
            }

            #[test]
            fn a_send_completed_inside_isend_survives_detach() {
                RAILS.conform(super::a_send_completed_inside_isend_survives_detach);
            }

            #[test]
            fn progress_until_waits_for_a_sent_buffer_to_be_let_go() {
                RAILS.conform(super::progress_until_waits_for_a_sent_buffer_to_be_let_go);
            }
        }
    )*};
}

// `shm` beside TCP in both orders: the order decides which rail a pair's
// small messages take (rail 1 for ranks 0 and 1: TCP in the first, `shm`
// in the second).
conformance! {
    over_tcp: "tcp:127.0.0.1,tcp:127.0.0.2", seed 10;
    over_shm: "shm", seed 40;
    over_shm_tcp: "shm,tcp:127.0.0.1", seed 50;
    over_tcp_shm: "tcp:127.0.0.1,shm", seed 60;
}

/// The random-size exchange ([`exchange_rank`]) under every policy: 25
/// messages from 0 B to 16 MiB in flight at once, each checked (and under
/// `stripe`, every rail used).
fn random_sizes_every_policy(rails: RailSet, progress: Progress, seed: u64) {
    let policies =
        ["*:single", "*:round-robin", "*:stripe", "*:weighted", "16K:single,*:adaptive", "16K:spread,*:adaptive"];
    for (i, policy) in policies.into_iter().enumerate() {
        let sizes = sizes(seed + i as u64, 25);
        rails.job(2, |b| b.progress(progress).policy(policy), |ep| exchange_part(ep, rails.0, policy, &sizes));
    }
}

/// Three ranks: any-source receives, then a blocking ping-pong between
/// ranks 1 and 2 with rank 2 receiving from any source. Both engines.
fn blocking_ping_pong_and_any_source(rails: RailSet) {
    for progress in [Progress::Polled, Progress::Threaded] {
        rails.job(
            3,
            |b| b.progress(progress),
            |ep| {
                let me = ep.rank();
                if me == 0 {
                    let mut seen = [false; 3];
                    for _ in 0..2 {
                        let mut buf = [0u8; 16];
                        let st = ep.recv(None, None, &mut buf).unwrap();
                        assert_eq!(&buf[..st.len as usize], format!("hi from {}", st.peer).as_bytes());
                        seen[st.peer as usize] = true;
                        ep.send(st.peer, 9, b"ack").unwrap();
                    }
                    assert!(seen[1] && seen[2]);
                } else {
                    ep.send(0, 1, format!("hi from {me}").as_bytes()).unwrap();
                    let mut buf = [0u8; 3];
                    ep.recv(Some(0), Some(9), &mut buf).unwrap();
                    assert_eq!(&buf, b"ack");
                }
                for i in 0..200u32 {
                    // Ping-pong between 1 and 2 under any-source matching.
                    match me {
                        1 => {
                            ep.send(2, 5, &i.to_le_bytes()).unwrap();
                            let mut b = [0u8; 4];
                            ep.recv(Some(2), Some(5), &mut b).unwrap();
                            assert_eq!(u32::from_le_bytes(b), i + 1);
                        }
                        2 => {
                            let mut b = [0u8; 4];
                            ep.recv(None, Some(5), &mut b).unwrap();
                            ep.send(1, 5, &(u32::from_le_bytes(b) + 1).to_le_bytes()).unwrap();
                        }
                        _ => break,
                    }
                }
                ep.barrier().unwrap();
            },
        );
    }
}

/// A message longer than the receive buffer fails that receive (an eager
/// and a rendezvous size), the buffer comes back, and the next message
/// still arrives. Rank 0 sends to ranks 1 and 2, whose preferred rails
/// differ.
fn truncation_is_a_receive_error_and_the_buffer_comes_back(rails: RailSet) {
    rails.job(
        3,
        |b| b,
        |ep| {
            if ep.rank() == 0 {
                for to in [1, 2] {
                    ep.send(to, 1, &[1u8; 100]).unwrap();
                    ep.send(to, 2, &vec![2u8; 1 << 20]).unwrap();
                    ep.send(to, 3, b"after").unwrap();
                }
            } else {
                let (buf, r) = ep.irecv(Some(0), None, BytesMut::zeroed(10)).unwrap().wait_with_buffer(None).unwrap();
                assert_eq!(buf.len(), 10);
                assert!(matches!(r, Err(multirail::Error::Truncated { buf_len: 10, .. })), "{r:?}");
                let mut small = vec![0u8; 1000];
                let e = ep.recv(Some(0), None, &mut small).unwrap_err();
                assert!(e.to_string().contains("does not fit"), "{e}");
                let mut b = [0u8; 5];
                ep.recv(Some(0), None, &mut b).unwrap();
                assert_eq!(&b, b"after");
            }
        },
    );
}

/// Both ranks send first, at once, so both open the same rails at the
/// same time (a `shm` rail is opened over a loopback TCP connection, and
/// raced, like a TCP rail): the two ends must settle on one connection per
/// rail without any rail failing, which [`RailSet::check`] sees
/// (regression: the losing connection was closed while the other end
/// still used it, which it took for a failure). Once every rail is up,
/// the connections settled on carry a striped message each way.
fn simultaneous_first_sends_settle_on_one_connection_per_rail(rails: RailSet) {
    for round in 0..8 {
        rails.job(
            2,
            |b| b.policy("*:stripe"),
            |ep| {
                let peer = 1 - ep.rank();
                for (tag, settled) in [(1, false), (2, true)] {
                    if settled {
                        wait_rails_up(ep, peer);
                    }
                    let data = pattern(round * 2 + tag, 300_000);
                    let s = ep.isend(peer, tag, data.clone()).unwrap();
                    let (buf, st) = ep.irecv(Some(peer), Some(tag), BytesMut::zeroed(300_000)).unwrap().wait().unwrap();
                    s.wait().unwrap();
                    assert_eq!(st.len, 300_000, "round {round}, message {tag}");
                    assert!(buf[..] == data[..], "round {round}, message {tag}");
                }
                ep.barrier().unwrap();
            },
        );
    }
}

/// Detached requests (for the C and Python bindings) complete like the
/// others once attached again, also a receive whose message came while it
/// was detached, and an endpoint refuses another's request. Three ranks,
/// every pair: the small messages go first, each on its pair's preferred
/// rail (the first traffic, so no backlog moves them).
fn detached_requests_complete_after_attach(rails: RailSet) {
    // Rank 0 leaves its receive from rank 1 here for rank 1's endpoint.
    let handed = std::sync::Mutex::new(None);
    rails.job(
        3,
        |b| b,
        |ep| {
            let me = ep.rank();
            let peers: Vec<u32> = (0..ep.size()).filter(|&p| p != me).collect();
            let mut early: Vec<(u32, multirail::Detached)> = peers
                .iter()
                .map(|&p| (p, Request::from(ep.irecv(Some(p), Some(6), BytesMut::zeroed(3)).unwrap()).detach()))
                .collect();
            for &p in &peers {
                ep.send(p, 6, b"six").unwrap();
            }
            let mut reqs = Vec::new();
            for &p in &peers {
                let s = Request::from(ep.isend(p, 5, pattern(u64::from(me), 300_000)).unwrap()).detach();
                let r = Request::from(ep.irecv(Some(p), Some(5), BytesMut::zeroed(300_000)).unwrap()).detach();
                assert!(s.is_send() && !r.is_send());
                reqs.extend([ep.attach(s).unwrap(), ep.attach(r).unwrap()]);
            }
            let got = ep.wait_all(reqs);
            for (i, &p) in peers.iter().enumerate() {
                let Some(Ok(Finished::Received(buf, st))) = got.get(2 * i + 1) else { panic!("no receive from {p}") };
                assert_eq!((st.peer, st.len), (p, 300_000));
                assert!(buf[..] == pattern(u64::from(p), 300_000)[..], "from rank {p}");
            }
            if me == 0 {
                *handed.lock().unwrap() = early.iter().position(|e| e.0 == 1).map(|i| early.remove(i).1);
            }
            ep.barrier().unwrap();
            if me == 1 {
                let theirs = handed.lock().unwrap().take().expect("rank 0's request");
                let err = ep.attach(theirs).err().expect("another endpoint's request");
                assert!(err.to_string().contains("another endpoint"), "{err}");
            }
            for (p, d) in early {
                let Request::Recv(r) = ep.attach(d).unwrap() else { panic!("a receive") };
                let (buf, st) = r.wait().unwrap();
                assert_eq!((st.peer, &buf[..]), (p, &b"six"[..]));
            }
            ep.barrier().unwrap();
        },
    );
}

/// A small send completes inside `isend` (the direct path: its one frame
/// goes straight onto the rail) and keeps its outcome in the request:
/// `test` says so at once, and the outcome survives a detach and attach
/// (it moves into the endpoint's map of completions; without that move
/// the wait below times out). Every pair of three ranks, whose preferred
/// rails over two rails are both.
fn a_send_completed_inside_isend_survives_detach(rails: RailSet) {
    rails.job(
        3,
        |b| b,
        |ep| {
            let me = ep.rank();
            let peers: Vec<u32> = (0..ep.size()).filter(|&p| p != me).collect();
            // Connections open on demand: a message each way opens the
            // pair's rail; then no one sends before every rank is done.
            let warm: Vec<Request> = peers.iter().map(|&p| ep.isend(p, 6, Vec::new()).unwrap().into()).collect();
            for &p in &peers {
                ep.recv(Some(p), Some(6), &mut []).unwrap();
            }
            for r in ep.wait_all(warm) {
                r.unwrap();
            }
            ep.barrier().unwrap();
            for &p in &peers {
                let s = ep.isend(p, 7, pattern(u64::from(me), 64)).unwrap();
                assert!(s.test(), "rank {me} to {p}: a direct send is complete when isend returns");
                let d = Request::from(s).detach();
                let Request::Send(s) = ep.attach(d).unwrap() else { panic!("a send") };
                s.wait_timeout(Some(Duration::from_secs(20))).unwrap();
            }
            for &p in &peers {
                let (buf, st) = ep.irecv(Some(p), Some(7), BytesMut::zeroed(64)).unwrap().wait().unwrap();
                assert_eq!(st.len, 64);
                assert!(buf[..] == pattern(u64::from(p), 64)[..], "from rank {p}");
            }
            ep.barrier().unwrap();
        },
    );
}

/// `progress_until` makes progress until a condition holds: a sent
/// buffer (whose owner flags its drop) is let go of once the peer's
/// acknowledgement is read, also when the send completed before that; a
/// condition that never holds returns false at the timeout. Both engines.
fn progress_until_waits_for_a_sent_buffer_to_be_let_go(rails: RailSet) {
    struct Flagged(Vec<u8>, Arc<AtomicBool>);
    impl AsRef<[u8]> for Flagged {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }
    impl Drop for Flagged {
        fn drop(&mut self) {
            self.1.store(true, Ordering::Release);
        }
    }
    for progress in [Progress::Polled, Progress::Threaded] {
        rails.job(
            2,
            |b| b.progress(progress),
            |ep| {
                let peer = 1 - ep.rank();
                let mut buf = vec![0u8; 1 << 20];
                if ep.rank() == 0 {
                    for k in 0..8 {
                        let dropped = Arc::new(AtomicBool::new(false));
                        let data = Bytes::from_owner(Flagged(pattern(k, 1 << 20).to_vec(), dropped.clone()));
                        ep.isend(peer, k, data).unwrap().wait().unwrap();
                        let held = ep
                            .progress_until(|| dropped.load(Ordering::Acquire), Some(Duration::from_secs(20)))
                            .unwrap();
                        assert!(held, "{progress:?}: message {k}: the buffer was let go of within 20 s");
                    }
                    let never = ep.progress_until(|| false, Some(Duration::from_millis(20))).unwrap();
                    assert!(!never, "a condition that never holds: false at the timeout");
                } else {
                    for k in 0..8 {
                        let st = ep.recv(Some(peer), Some(k), &mut buf).unwrap();
                        assert!(buf[..st.len as usize] == pattern(k, 1 << 20)[..]);
                    }
                }
                ep.barrier().unwrap();
            },
        );
    }
}

/// The environment variable that hands [`child_rank`] its job.
const CHILD_JOB: &str = "MULTIRAIL_E2E_CHILD";

/// [`exchange_on`] with rank 1 in a child process (this test binary
/// running [`child_rank`]), for rails whose provider wants one rank per
/// process.
#[cfg(feature = "ofi")]
fn exchange_across_processes(rail_list: &str, progress: Progress, policy: &str, seed: u64, count: usize) {
    let root = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let job = format!("{}|{rail_list}|{progress}|{policy}|{seed}|{count}", root.local_addr().unwrap());
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "child_rank", "--nocapture"])
        .env(CHILD_JOB, job)
        .spawn()
        .expect("the test binary runs again as rank 1");
    let ep = builder(rail_list, progress, policy).rank(0, 2);
    exchange_rank(ep.root_listener(root).build().expect("rank 0"), rail_list, policy, &sizes(seed, count));
    let status = child.wait().unwrap();
    assert!(status.success(), "rank 1 (child process) failed: {status}");
}

/// Rank 1 of [`exchange_across_processes`]; run by it, not alone.
#[test]
#[ignore = "run as a child process by exchange_across_processes"]
fn child_rank() {
    let job = std::env::var(CHILD_JOB).expect("run by exchange_across_processes");
    let f: Vec<&str> = job.split('|').collect();
    let [root, rails, progress, policy, seed, count] = f[..] else { panic!("bad {CHILD_JOB}: {job}") };
    let ep = builder(rails, progress.parse().unwrap(), policy).rank(1, 2).root(root.parse().unwrap());
    exchange_rank(ep.build().expect("rank 1"), rails, policy, &sizes(seed.parse().unwrap(), count.parse().unwrap()));
}

/// The random-size exchange over TCP rail counts other than the suite's
/// two.
#[test]
fn one_rail_both_engines() {
    exchange(1, Progress::Polled, "16K:single,*:adaptive", 1, 40);
    exchange(1, Progress::Threaded, "16K:single,*:adaptive", 2, 40);
}

#[test]
fn four_rails_both_engines() {
    exchange(4, Progress::Polled, "*:stripe", 30, 40);
    exchange(4, Progress::Threaded, "4K:single,*:adaptive", 31, 40);
}

/// A waiter spinning on `shm` skips the rounds in which nothing can be
/// there (the ring says so at the cost of a load) and still takes every
/// message, in order, intact, and the peer's close.
#[test]
fn a_spinning_wait_on_shm_skips_empty_rounds_and_misses_nothing() {
    let n = 3000u64;
    let skipped = job(
        2,
        |_| builder("shm", Progress::Polled, "16K:single,*:adaptive").spin(Duration::from_millis(5)),
        |ep| {
            let peer = 1 - ep.rank();
            let mut buf = vec![0u8; 256];
            for i in 0..n {
                let len = (i * 37 % 200) as usize;
                if (i % 2 == 0) == (ep.rank() == 0) {
                    ep.send(peer, i, &pattern(i, len)).unwrap();
                } else {
                    let st = ep.recv(Some(peer), None, &mut buf).unwrap();
                    assert_eq!((st.tag, st.len as usize), (i, len), "in order");
                    assert_eq!(&buf[..len], &pattern(i, len)[..], "message {i}");
                }
            }
            let skipped = ep.quiet_rounds();
            if ep.rank() == 0 {
                ep.close().unwrap();
            } else {
                // The peer's close ends a wait that would otherwise spin on.
                let e = ep.recv(Some(peer), None, &mut buf).unwrap_err();
                assert!(matches!(e, multirail::Error::PeerClosed(0)), "{e}");
            }
            skipped
        },
    );
    assert!(skipped.iter().sum::<u64>() > 0, "no round was skipped: {skipped:?}");
}

/// The shm rail's two paths for large payloads: single copy from the
/// sender's memory (lent from 1 byte on, so every payload takes it) and
/// always through the ring (`MULTIRAIL_SHM_CMA=off`).
#[test]
fn shm_rail_single_copy_and_through_the_ring() {
    for (i, cma) in [Some(1), None].into_iter().enumerate() {
        let sizes = sizes(42 + i as u64, 40);
        let b = move |_| builder("shm", Progress::Polled, "16K:single,*:adaptive").shm_cma(cma);
        job(2, b, |ep| exchange_rank(ep, "shm", "16K:single,*:adaptive", &sizes));
    }
}

/// The rails to one peer and the bytes each carried.
type PeerRails = (Vec<usize>, Vec<u64>);

/// Runs 3 ranks (threads of this process: one host) with `make`, every
/// pair exchanging a validated message each way; returns each rank's
/// rail names and, per peer, the rails used and the bytes they carried.
fn host_job(make: impl Fn(u32) -> Builder + Sync) -> Vec<(Vec<String>, Vec<PeerRails>)> {
    job(3, make, |ep| {
        let me = ep.rank();
        let peers: Vec<u32> = (0..3).filter(|&p| p != me).collect();
        let sends: Vec<Request> =
            peers.iter().map(|&p| ep.isend(p, 5, pattern(u64::from(me), 100_000)).unwrap().into()).collect();
        for &p in &peers {
            let mut buf = vec![0u8; 100_000];
            let st = ep.recv(Some(p), Some(5), &mut buf).unwrap();
            assert_eq!(buf[..st.len as usize], pattern(u64::from(p), 100_000)[..], "from rank {p}");
        }
        for r in ep.wait_all(sends) {
            r.unwrap();
        }
        let per_peer = (0..3)
            .map(|p| (ep.rails_to(p), ep.rail_stats(p).iter().map(|s| s.tx_bytes + s.rx_bytes).collect()))
            .collect();
        let names = ep.rail_names();
        ep.close().unwrap();
        (names, per_peer)
    })
}

/// A `shm` rail's window is at least its ring (4 MiB by default): with
/// no throughput measured (its bursts are too short to yield a sample)
/// it used to stay at the 512 KiB floor, and every 512 KiB waited for an
/// acknowledgement (shm `bench bw` 1.3-1.9 x at 64 KiB-4 MiB with the
/// ring's worth in flight). A TCP rail beside it keeps the floor.
#[test]
fn a_shm_rail_keeps_its_ring_in_flight() {
    let windows = job(
        2,
        |_| builder("shm,tcp:127.0.0.1", Progress::Polled, "*:single").eager_connect(true),
        |ep| {
            let peer = 1 - ep.rank();
            wait_rails_up(&ep, peer);
            let w: Vec<u64> = ep.rail_stats(peer).iter().map(|s| s.window).collect();
            // Not closed before the peer saw its rails up too (a rail
            // whose last handshake answer meets a closed peer never is).
            ep.barrier().unwrap();
            ep.close().unwrap();
            w
        },
    );
    for (rank, w) in windows.iter().enumerate() {
        assert_eq!(w.len(), 2, "rank {rank}: {w:?}");
        assert!(w[0] >= 4 << 20, "rank {rank}: shm window {} < its 4 MiB ring", w[0]);
        assert!(w[1] < w[0], "rank {rank}: the TCP rail has no ring: {w:?}");
    }
}

#[test]
fn same_host_peers_use_shm_by_default() {
    for (me, (names, per_peer)) in host_job(|_| Endpoint::builder().key("k")).into_iter().enumerate() {
        assert_eq!(names, ["tcp:127.0.0.1", "tcp:127.0.0.2", "shm"], "the default rails, then the automatic shm");
        for (p, (to, bytes)) in per_peer.into_iter().enumerate().filter(|&(p, _)| p != me) {
            assert_eq!(to, [2], "rank {me} to {p}: shm alone");
            assert!(bytes.len() == 1 && bytes[0] > 0, "rank {me} to {p}: {bytes:?}");
        }
    }
}

#[test]
fn explicit_shm_in_the_rail_list_or_shm_off_keeps_the_rails() {
    let explicit = host_job(|_| Endpoint::builder().rails("shm,tcp:127.0.0.1").key("k"));
    let off = host_job(|_| Endpoint::builder().rails(&rails(2)).shm(ShmMode::Off).key("k"));
    for (label, results, want) in
        [("shm,tcp", explicit, vec!["shm", "tcp:127.0.0.1"]), ("off", off, vec!["tcp:127.0.0.1", "tcp:127.0.0.2"])]
    {
        for (me, (names, per_peer)) in results.into_iter().enumerate() {
            assert_eq!(names, want, "{label}");
            for (p, (to, bytes)) in per_peer.into_iter().enumerate().filter(|&(p, _)| p != me) {
                assert_eq!(to, [0, 1], "{label}: rank {me} to {p}: every configured rail");
                assert_eq!(bytes.len(), 2, "{label}");
            }
        }
    }
}

#[test]
fn a_rank_with_shm_off_uses_the_rails_while_the_others_use_shm() {
    let mode = |r: u32| if r == 0 { ShmMode::Off } else { ShmMode::Auto };
    for (me, (names, per_peer)) in host_job(|r| Endpoint::builder().shm(mode(r)).key("k")).into_iter().enumerate() {
        assert_eq!(names.len(), 3, "every rank has the job's rail list, shm included");
        for (p, (to, _)) in per_peer.into_iter().enumerate().filter(|&(p, _)| p != me) {
            let want: &[usize] = if me == 0 || p == 0 { &[0, 1] } else { &[2] };
            assert_eq!(to, want, "rank {me} to {p}");
        }
    }
}

/// The libfabric rail over `tcp;ofi_rxm` on two loopback addresses, alone
/// and beside a TCP rail (built with `--features ofi`).
#[cfg(feature = "ofi")]
#[test]
fn ofi_tcp_two_rails_both_engines() {
    let two = "ofi:tcp:127.0.0.1,ofi:tcp:127.0.0.2";
    exchange_on(two, Progress::Polled, "*:stripe", 70, 30);
    exchange_on(two, Progress::Threaded, "16K:single,*:adaptive", 71, 30);
    exchange_on("ofi:tcp:127.0.0.1,tcp:127.0.0.2", Progress::Polled, "16K:single,*:adaptive", 72, 20);
}

/// The same exchange over rails whose provider connections were made at
/// setup (`MULTIRAIL_OFI_CONNECT=setup`, what a crowded host does): the
/// first messages of setup are not taken for the stream's.
#[cfg(feature = "ofi")]
#[test]
fn ofi_tcp_rails_connected_at_setup() {
    let two = "ofi:tcp:127.0.0.1,ofi:tcp:127.0.0.2";
    for (progress, policy, seed) in
        [(Progress::Polled, "*:stripe", 73), (Progress::Threaded, "16K:single,*:adaptive", 74)]
    {
        let sizes = sizes(seed, 30);
        job(2, |_| builder(two, progress, policy).ofi_connect(Some(true)), |ep| exchange_rank(ep, two, policy, &sizes));
    }
}

/// Every wait a sleep (no spinning): in a ping-pong of small messages
/// each one finds its reader asleep, so it crosses only if the reader's
/// notice and the sender's ring work (both engines; rings are counted);
/// then the bulk exchange; and the same with the CQ's wait fd instead
/// (`MULTIRAIL_OFI_WAIT=fd`, no rings).
#[cfg(feature = "ofi")]
#[test]
fn ofi_tcp_sleeping_ranks_are_woken_by_the_doorbell_or_the_wait_fd() {
    let two = "ofi:tcp:127.0.0.1,ofi:tcp:127.0.0.2";
    for (doorbell, progress, policy, seed) in [
        (true, Progress::Polled, "*:stripe", 75),
        (true, Progress::Threaded, "16K:single,*:adaptive", 76),
        (false, Progress::Polled, "16K:single,*:adaptive", 77),
    ] {
        let sizes = sizes(seed, 20);
        job(
            2,
            |_| builder(two, progress, policy).spin(Duration::ZERO).ofi_doorbell(doorbell),
            |ep| {
                let (me, peer) = (ep.rank(), 1 - ep.rank());
                wait_rails_up(&ep, peer);
                let mut buf = [0u8; 8];
                for i in 0..50u64 {
                    if me == 0 {
                        ep.send(peer, i, &i.to_le_bytes()).unwrap();
                        ep.recv(Some(peer), Some(i), &mut buf).unwrap();
                    } else {
                        ep.recv(Some(peer), Some(i), &mut buf).unwrap();
                        ep.send(peer, i, &buf).unwrap();
                    }
                    assert_eq!(u64::from_le_bytes(buf), i, "ping-pong {i}");
                }
                let rings = ep.wakeups_sent();
                if doorbell {
                    assert!(rings > 0, "rank {me}: no ring in 50 ping-pongs between sleeping ranks");
                } else {
                    assert_eq!(rings, 0, "rank {me}: the wait fd needs no ring");
                }
                exchange_rank(ep, two, policy, &sizes)
            },
        );
    }
}

/// The libfabric rail over `tcp;ofi_rxm` with RMA (off there by
/// default): payloads of 64 KiB and more are lent and read with `fi_read`.
#[cfg(feature = "ofi")]
#[test]
fn ofi_tcp_rma_reads_both_engines() {
    let two = "ofi:tcp:127.0.0.1,ofi:tcp:127.0.0.2";
    let rma = multirail::OfiRma::From(64 << 10);
    for (progress, policy, seed) in
        [(Progress::Polled, "*:stripe", 73), (Progress::Threaded, "16K:single,*:adaptive", 74)]
    {
        let sizes = sizes(seed, 30);
        job(2, |_| builder(two, progress, policy).ofi_rma(rma), |ep| exchange_rank(ep, two, policy, &sizes));
    }
}

/// The libfabric `shm` provider, alone and beside the native shm rail,
/// one rank per process (the normal case); large payloads by RMA read
/// (the default through `shm`).
#[cfg(feature = "ofi")]
#[test]
fn ofi_shm_rail_both_engines() {
    exchange_across_processes("ofi:shm", Progress::Polled, "16K:single,*:adaptive", 80, 30);
    exchange_across_processes("ofi:shm", Progress::Threaded, "16K:single,*:adaptive", 81, 30);
    exchange_across_processes("ofi:shm,shm", Progress::Polled, "*:stripe", 82, 20);
}

/// Two ranks of one process, each with its own libfabric domain: without
/// the rail's process-wide lock on libfabric calls, 1.17's shm provider
/// hung or crashed here (docs/rails/ofi.md).
#[cfg(feature = "ofi")]
#[test]
fn ofi_shm_two_ranks_in_one_process() {
    exchange_on("ofi:shm", Progress::Polled, "16K:single,*:adaptive", 83, 30);
    exchange_on("ofi:shm", Progress::Threaded, "16K:single,*:adaptive", 84, 30);
}

/// `rounds` round trips of 8 B between ranks 0 and 1, each checked.
fn ping_pong_8b(ep: &Endpoint, rounds: u64) {
    let peer = 1 - ep.rank();
    let mut buf = [0u8; 8];
    for i in 0..rounds {
        if ep.rank() == 0 {
            ep.send(peer, i, &i.to_le_bytes()).unwrap();
            ep.recv(Some(peer), Some(i), &mut buf).unwrap();
        } else {
            ep.recv(Some(peer), Some(i), &mut buf).unwrap();
            ep.send(peer, i, &buf).unwrap();
        }
        assert_eq!(u64::from_le_bytes(buf), i);
    }
}

/// A counter of `ep` that load can only raise, read over `rounds` 8 B
/// round trips (after `warm_up` more) on both ranks of a pair, up to 5
/// times until both saw fewer than `bound`: this rank's fewest. (The ranks
/// agree on going on with a message of tag 1 << 40, apart from the
/// ping-pong's.)
fn fewest_over_ping_pongs(ep: &Endpoint, warm_up: u64, rounds: u64, bound: u64, counter: fn(&Endpoint) -> u64) -> u64 {
    const ATTEMPTS: u64 = 5;
    let peer = 1 - ep.rank();
    ping_pong_8b(ep, warm_up); // connections up
    let mut fewest = u64::MAX;
    for _ in 0..ATTEMPTS {
        let before = counter(ep);
        ping_pong_8b(ep, rounds);
        fewest = fewest.min(counter(ep) - before);
        let mut theirs = [0u8; 8];
        ep.send(peer, 1 << 40, &fewest.to_le_bytes()).unwrap();
        ep.recv(Some(peer), Some(1 << 40), &mut theirs).unwrap();
        if fewest.max(u64::from_le_bytes(theirs)) < bound {
            break;
        }
    }
    ep.barrier().unwrap();
    fewest
}

/// While a thread waits and spins, the threaded engine's IO threads keep
/// out of epoll: it reads and writes the rails itself, so a ping-pong does
/// not wake an IO thread per message as well (on two cores, those
/// wake-ups took the CPU from the spinning waiters: 1.8 x the polled
/// engine's latency). A wake-up is counted whenever an IO thread returns
/// from epoll (timers alone would bring them out every millisecond; the
/// kernel does not return to them when the waiter read the data first, so
/// without the park this counted about 220 per 2000 round trips, with it
/// 0-3); only a waiter preempted for longer than the hand-off (1 ms)
/// between two waits lets them back in, which a loaded machine does often:
/// the count is taken up to 5 times and the fewest must be under the bound.
#[test]
fn threaded_io_threads_stay_parked_while_a_waiter_spins() {
    const ROUNDS: u64 = 2000;
    let woke = job(
        2,
        |_| builder("tcp:127.0.0.1", Progress::Threaded, "*:adaptive").spin(Duration::from_secs(5)),
        |ep| fewest_over_ping_pongs(&ep, 100, ROUNDS, ROUNDS / 20, Endpoint::io_thread_wakeups),
    );
    for (rank, w) in woke.iter().enumerate() {
        assert!(*w < ROUNDS / 20, "rank {rank}: IO threads woke {w} times in {ROUNDS} round trips");
    }
    println!("IO thread wake-ups in {ROUNDS} round trips: {woke:?}");
}

/// A waiter that spins over shared memory costs its peer no doorbell, under
/// either engine: the engine tells the rail up front that whoever sleeps on
/// it arms it first (the polled loop before its sleeps, the threaded
/// engine's IO threads before theirs), so reads that find the ring empty
/// ask for no wake-up. Before, a loop that never slept left every empty
/// read armed, and each 8 B message cost a doorbell `send` on the writer's
/// side and a `recv` on the reader's (1999 rings per 2000 round trips; 8 B
/// latency 3.25 us instead of 2.34). A waiter preempted past its spin
/// sleeps and is rung legitimately, so the count is taken up to 5 times and
/// the fewest must be small.
#[test]
fn a_spinning_waiter_over_shm_is_never_rung() {
    const ROUNDS: u64 = 2000;
    // Whether the rings showed depended on the spin and on timing (an
    // engine that had armed once before the count was spared): without
    // the fix each engine rang for every message with one spin or the
    // other, varying between runs, so both spins, both engines.
    for progress in [Progress::Polled, Progress::Threaded] {
        for spin in [None, Some(Duration::from_secs(5))] {
            let rung = job(
                2,
                |_| {
                    let b = builder("shm", progress, "*:single");
                    match spin {
                        Some(s) => b.spin(s),
                        None => b,
                    }
                },
                |ep| fewest_over_ping_pongs(&ep, 100, ROUNDS, ROUNDS / 20, Endpoint::wakeups_sent),
            );
            println!("{progress:?}, spin {spin:?}: doorbells rung in {ROUNDS} round trips: {rung:?}");
            for (rank, r) in rung.iter().enumerate() {
                assert!(
                    *r < ROUNDS / 20,
                    "{progress:?}, spin {spin:?}: rank {rank} rang its peer's doorbell {r} times in {ROUNDS} round trips"
                );
            }
        }
    }
}

/// A spinning waiter whose message is late gives its CPU away between
/// rounds (`sched_yield`) when threads wait for a CPU, so a peer that
/// shares its CPU gets to run and send it: two unpinned ranks the kernel
/// had put on one CPU took a whole spin (200 us) per message before, about
/// 25 us with it (docs/benchmarks.md). Here the machine is made crowded
/// (one busy thread more than it has CPUs, for the length of the job).
/// Rank 0 spins in a receive that rank 1 answers 5 ms after it asked;
/// should rank 0 be preempted for all of that between its request and its
/// receive (the message then there at once), the exchange is tried again,
/// up to 5 times. Both engines.
#[test]
fn a_spinning_waiter_yields_its_cpu_once_its_wait_is_long_on_a_crowded_machine() {
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| multirail::cpus::parse_list(s.trim()))
        .map_or(2, |v| v.len());
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..=cpus {
            s.spawn(|| {
                // Bounded: the job ends it, or 20 s do.
                while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(20) {
                    std::hint::spin_loop();
                }
            });
        }
        yields_in_long_waits();
        stop.store(true, Ordering::Relaxed);
    });
}

fn yields_in_long_waits() {
    for progress in [Progress::Polled, Progress::Threaded] {
        let yields = job(
            2,
            |_| builder("tcp:127.0.0.1", progress, "*:single").spin(Duration::from_secs(5)),
            |ep| {
                ping_pong_8b(&ep, 20); // connections up
                let peer = 1 - ep.rank();
                let mut most = 0;
                for attempt in 0..5u64 {
                    let before = ep.spin_yields();
                    let mut b = [0u8; 8];
                    if ep.rank() == 0 {
                        ep.send(peer, 1 << 40, &attempt.to_le_bytes()).unwrap();
                        ep.recv(Some(peer), Some(1 << 41), &mut b).unwrap();
                    } else {
                        ep.recv(Some(peer), Some(1 << 40), &mut b).unwrap();
                        std::thread::sleep(Duration::from_millis(5));
                        ep.send(peer, 1 << 41, &b).unwrap();
                    }
                    most = most.max(ep.spin_yields() - before);
                    // Both ranks agree on going on.
                    let mut theirs = [0u8; 8];
                    ep.send(peer, 1 << 42, &most.to_le_bytes()).unwrap();
                    ep.recv(Some(peer), Some(1 << 42), &mut theirs).unwrap();
                    let rank0 = if ep.rank() == 0 { most } else { u64::from_le_bytes(theirs) };
                    if rank0 > 0 {
                        break;
                    }
                }
                ep.barrier().unwrap();
                most
            },
        );
        println!("{progress:?}: yields in rank 0's 5 ms wait: {}", yields[0]);
        assert!(yields[0] > 0, "{progress:?}: rank 0 spun 5 ms in a receive and never gave its CPU away");
    }
}

/// A polled waiter that sleeps (the spin off, as on a host with more
/// ranks than CPUs) is woken by its peer's message, not found by the next
/// timer. Over shared memory the loop reads the rings right before it
/// sleeps; a round that read the message the waiter waits for slept on
/// regardless, and about one message in three waited for the 1 ms
/// acknowledgement timer (8 B ping-pong: 185 us one-way instead of 20).
/// Preemption on a loaded machine can make a wait outlast a timer too, so
/// the count is taken up to 5 times and the fewest must be small. With a
/// 1 us spin, a waiter first reads its socket directly and takes it out
/// of the epoll set, then sleeps: the socket must be back in the set by
/// then (without that, every wait ended at a timer).
#[test]
fn a_sleeping_polled_waiter_is_woken_by_its_message_not_a_timer() {
    const ROUNDS: u64 = 300;
    for (rails, spin_us) in [("shm", 0), ("tcp:127.0.0.1", 0), ("tcp:127.0.0.1", 1)] {
        let timed_out = job(
            2,
            |_| builder(rails, Progress::Polled, "*:single").spin(Duration::from_micros(spin_us)),
            |ep| fewest_over_ping_pongs(&ep, 20, ROUNDS, ROUNDS / 10, Endpoint::sleeps_timed_out),
        );
        println!("{rails}, spin {spin_us} us: sleeps ended by a timer in {ROUNDS} round trips: {timed_out:?}");
        for (rank, t) in timed_out.iter().enumerate() {
            assert!(
                *t < ROUNDS / 10,
                "{rails}, spin {spin_us} us: rank {rank} slept until a timer {t} times in {ROUNDS} round trips"
            );
        }
    }
}

/// A burst of small `isend`s leaves in a few vectored writes, not one per
/// message (write coalescing, `MULTIRAIL_COALESCE`), and every message
/// arrives in order; with coalescing off each message is a write. Both
/// engines. Coalescing is an optimisation that timing decides: a burst
/// coalesces only while the application waited less than the engine's
/// hand-off ago, and only across `isend`s less than 20 us apart, so one
/// preemption of the sender at the wrong moment (a loaded CI machine
/// running many spinning ranks on 2 cores) leaves a whole burst
/// uncoalesced; it happened once in CI (64 writes). So a burst is tried up
/// to 20 times and one that coalesces suffices; with coalescing off no
/// burst ever could, and under the polled engine each `isend` is a write.
#[test]
fn a_burst_of_small_isends_leaves_in_few_writes() {
    const N: u64 = 64;
    const ATTEMPTS: u32 = 20;
    for progress in [Progress::Polled, Progress::Threaded] {
        for coalesce in [32, 0] {
            let writes = job(
                2,
                |_| {
                    Builder::new(multirail::Config { coalesce, ..Default::default() })
                        .shm(ShmMode::Off)
                        .progress(progress)
                        .rails("tcp:127.0.0.1")
                        .key("k")
                },
                |ep| {
                    let mut buf = [0u8; 8];
                    if ep.rank() == 0 {
                        let mut fewest = u64::MAX;
                        for attempt in 1..=ATTEMPTS {
                            ep.send(1, 0, b"warm-up!").unwrap();
                            ep.recv(Some(1), Some(0), &mut buf).unwrap();
                            let before = ep.rail_writes();
                            let reqs: Vec<Request> =
                                (0..N).map(|i| ep.isend(1, i, i.to_le_bytes().to_vec()).unwrap().into()).collect();
                            for r in ep.wait_all(reqs) {
                                r.unwrap();
                            }
                            fewest = fewest.min(ep.rail_writes() - before);
                            ep.recv(Some(1), Some(0), &mut buf).unwrap();
                            let again = coalesce > 0 && fewest >= N / 2 && attempt < ATTEMPTS;
                            ep.send(1, 0, &[u8::from(again); 8]).unwrap();
                            if !again {
                                break;
                            }
                        }
                        fewest
                    } else {
                        loop {
                            ep.recv(Some(0), Some(0), &mut buf).unwrap();
                            ep.send(0, 0, b"warm-up!").unwrap();
                            for i in 0..N {
                                let st = ep.recv(Some(0), None, &mut buf).unwrap();
                                assert_eq!((st.tag, u64::from_le_bytes(buf)), (i, i), "in order");
                            }
                            ep.send(0, 0, b"done").unwrap();
                            ep.recv(Some(0), Some(0), &mut buf).unwrap();
                            if buf[0] == 0 {
                                break 0;
                            }
                        }
                    }
                },
            );
            println!("{progress:?}, MULTIRAIL_COALESCE={coalesce}: {N} isends in {} writes (fewest)", writes[0]);
            if coalesce > 0 {
                assert!(
                    writes[0] < N / 2,
                    "{progress:?}: {N} small isends took at least {} writes in each of {ATTEMPTS} bursts",
                    writes[0]
                );
            } else if progress == Progress::Polled {
                // No other thread can hold the connection: each isend
                // writes. (Under `threaded` an IO thread that holds it when
                // an isend comes writes several at once, how often depends
                // on the load, so that count is only printed.)
                assert!(writes[0] >= N, "coalescing off: {N} isends took only {} writes", writes[0]);
            }
        }
    }
}

/// A message left queued by a burst that the application never waits
/// for still leaves: the engine writes it when its hand-off ends (<= ~4 ms)
/// or when it next services the connection (an acknowledgement comes in),
/// here long before the sender's next call 500 ms later.
#[test]
fn a_coalesced_message_leaves_without_a_wait() {
    for progress in [Progress::Polled, Progress::Threaded] {
        let arrived = Arc::new(AtomicBool::new(false));
        let sender_waited = Arc::new(AtomicBool::new(false));
        job(
            2,
            |_| builder("tcp:127.0.0.1", progress, "*:adaptive"),
            |ep| {
                let mut buf = [0u8; 8];
                if ep.rank() == 0 {
                    ep.send(1, 0, b"warm-up!").unwrap();
                    ep.recv(Some(1), Some(0), &mut buf).unwrap();
                    let a = ep.isend(1, 1, b"first".to_vec()).unwrap();
                    let b = ep.isend(1, 2, b"second".to_vec()).unwrap();
                    // No call into multirail for 500 ms.
                    std::thread::sleep(Duration::from_millis(500));
                    sender_waited.store(true, Ordering::SeqCst);
                    a.wait().unwrap();
                    b.wait().unwrap();
                } else {
                    ep.recv(Some(0), Some(0), &mut buf).unwrap();
                    ep.send(0, 0, b"warm-up!").unwrap();
                    ep.recv(Some(0), Some(1), &mut buf).unwrap();
                    ep.recv(Some(0), Some(2), &mut buf).unwrap();
                    arrived.store(!sender_waited.load(Ordering::SeqCst), Ordering::SeqCst);
                }
            },
        );
        assert!(arrived.load(Ordering::SeqCst), "{progress:?}: the second message waited for the sender's wait");
    }
}
