//! Deterministic scenario tests of the protocol core: simulated rails of
//! different bandwidth and latency, a virtual clock, no IO.

use std::time::Duration;

use bytes::Bytes;
use multirail_proto::core::{Config, Event, MESSAGE_OVERHEAD, RailCaps, RecvError, SendError};
use multirail_proto::sched::{PolicyKind, PolicyTable};
use multirail_proto::sim::{Done, LinkSpec, Sim};

/// Deterministic bytes for message `seed`.
fn pattern(seed: u64, len: usize) -> Bytes {
    multirail_proto::sim::pattern(seed, len).into()
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn cfg(policy: &str) -> Config {
    Config { policy: policy.parse().unwrap(), ..Config::default() }
}

fn rails4() -> Vec<LinkSpec> {
    vec![LinkSpec::gbit(1.0, 50), LinkSpec::gbit(3.0, 5), LinkSpec::gbit(10.0, 200), LinkSpec::gbit(2.0, 20)]
}

/// Sends `sizes` from 0 to 1 with tags = index, receiver posts in order,
/// and checks every message arrives whole, in order, exactly once.
/// Returns how long until every request was done (to within 10 us of
/// virtual time).
fn send_and_verify(sim: &mut Sim, sizes: &[usize], post_first: bool) -> Duration {
    let t0 = sim.now;
    let mut recvs = Vec::new();
    if post_first {
        for &s in sizes {
            recvs.push(sim.irecv(1, Some(0), None, s.max(1)));
        }
    }
    let sends: Vec<_> =
        sizes.iter().enumerate().map(|(i, &s)| sim.isend(0, 1, i as u64, pattern(i as u64, s))).collect();
    if !post_first {
        for &s in sizes {
            recvs.push(sim.irecv(1, Some(0), None, s.max(1)));
        }
    }
    let all = |sim: &Sim| recvs.iter().all(|r| sim.is_done(1, *r)) && sends.iter().all(|r| sim.is_done(0, *r));
    assert!(
        sim.run_until_within(Duration::from_secs(60), Duration::from_micros(10), all),
        "not all messages completed; errors {:?}",
        sim.errors
    );
    let took = sim.now - t0;
    for (i, r) in recvs.iter().enumerate() {
        match sim.take(1, *r) {
            Some(Done::Recv(Ok(st), buf)) => {
                assert_eq!(st.tag, i as u64, "message {i} matched out of order");
                assert_eq!(st.len as usize, sizes[i]);
                assert_eq!(&buf[..sizes[i]], &pattern(i as u64, sizes[i])[..], "payload of message {i}");
            }
            other => panic!("receive {i}: {other:?}"),
        }
    }
    for s in sends {
        assert!(matches!(sim.take(0, s), Some(Done::Send(Ok(())))));
    }
    assert!(sim.errors.is_empty(), "{:?}", sim.errors);
    // Everything sent gets acknowledged and released.
    assert!(
        sim.run_until(Duration::from_secs(1), |s| s.nodes[0].unacked_messages() == 0),
        "{} messages never acknowledged",
        sim.nodes[0].unacked_messages()
    );
    took
}

#[test]
fn ordering_across_rails_every_policy_and_rail_count() {
    for policy in PolicyKind::ALL {
        for n in 1..=4 {
            let mut sim = Sim::new(2, &rails4()[..n], cfg(&format!("*:{policy}")));
            let mut rng = Rng(42 + n as u64);
            let sizes: Vec<usize> = (0..60)
                .map(|_| match rng.below(4) {
                    0 => rng.below(64) as usize,
                    1 => rng.below(64 << 10) as usize,
                    2 => rng.below(1 << 20) as usize,
                    _ => (1 << 20) + rng.below(3 << 20) as usize,
                })
                .collect();
            send_and_verify(&mut sim, &sizes, n % 2 == 0);
        }
    }
}

#[test]
fn reassembly_by_offset_when_fragments_arrive_out_of_order() {
    // Rail 2 is fast but far: its fragments arrive after later fragments
    // from the other rails.
    let mut c = cfg("*:stripe");
    c.chunk = 16 << 10;
    let mut sim = Sim::new(2, &rails4(), c);
    send_and_verify(&mut sim, &[3 << 20, 1, 0, 777_777], true);
    let st = sim.nodes[1].rail_stats(0, sim.now);
    assert!(st.iter().all(|r| r.rx_bytes > 0), "every rail carried data: {st:?}");
}

#[test]
fn many_messages_in_flight_any_source_any_tag() {
    let mut sim = Sim::new(3, &rails4()[..2], cfg("16K:single,*:adaptive"));
    let mut recvs = Vec::new();
    for _ in 0..200 {
        recvs.push(sim.irecv(2, None, None, 100_000));
    }
    let mut sends = Vec::new();
    for i in 0..100u64 {
        sends.push(sim.isend(0, 2, i, pattern(i, (i as usize * 997) % 100_000)));
        sends.push(sim.isend(1, 2, 1000 + i, pattern(1000 + i, (i as usize * 7919) % 100_000)));
    }
    assert!(sim.run_until(Duration::from_secs(30), |s| recvs.iter().all(|r| s.is_done(2, *r))));
    let (mut next0, mut next1) = (0, 1000);
    for r in recvs {
        let Some(Done::Recv(Ok(st), buf)) = sim.take(2, r) else { panic!() };
        // Per source, tags come in send order.
        match st.peer {
            0 => {
                assert_eq!(st.tag, next0);
                next0 += 1;
            }
            1 => {
                assert_eq!(st.tag, next1);
                next1 += 1;
            }
            _ => panic!(),
        }
        assert_eq!(&buf[..st.len as usize], &pattern(st.tag, st.len as usize)[..]);
    }
}

fn bytes_per_rail(sim: &Sim) -> Vec<u64> {
    sim.nodes[0].rail_stats(1, sim.now).iter().map(|r| r.tx_bytes).collect()
}

#[test]
fn weighted_shares_follow_bandwidth() {
    let links = [LinkSpec::gbit(1.0, 10), LinkSpec::gbit(3.0, 10)];
    let mut sim = Sim::new(2, &links, cfg("*:weighted"));
    sim.set_caps(0, 1, 0, RailCaps { bandwidth: 125_000_000, ..RailCaps::default() });
    sim.set_caps(0, 1, 1, RailCaps { bandwidth: 375_000_000, ..RailCaps::default() });
    send_and_verify(&mut sim, &[8 << 20], true);
    assert_eq!(bytes_per_rail(&sim), vec![2 << 20, 6 << 20]);
}

#[test]
fn stripe_splits_equally_and_round_robin_alternates() {
    let links = [LinkSpec::gbit(1.0, 10), LinkSpec::gbit(3.0, 10)];
    let mut sim = Sim::new(2, &links, cfg("*:stripe"));
    send_and_verify(&mut sim, &[4 << 20], true);
    assert_eq!(bytes_per_rail(&sim), vec![2 << 20, 2 << 20]);

    let mut sim = Sim::new(2, &links, cfg("*:round-robin"));
    send_and_verify(&mut sim, &[1000, 1000, 1000, 1000], true);
    assert_eq!(bytes_per_rail(&sim), vec![2000, 2000]);
}

/// Virtual time to deliver one message of `len` bytes, with the receive
/// posted first.
fn transfer_time(sim: &mut Sim, len: usize, tag: u64) -> Duration {
    let r = sim.irecv(1, Some(0), Some(tag), len);
    let t0 = sim.now;
    sim.isend(0, 1, tag, pattern(tag, len));
    assert!(sim.run_until(Duration::from_secs(10), |s| s.is_done(1, r)));
    sim.take(1, r);
    sim.now - t0
}

#[test]
fn adaptive_converges_on_unequal_rails() {
    // 1 Gbit/s + 3 Gbit/s = 500 MB/s together; nothing tells the
    // scheduler the speeds.
    let links = [LinkSpec::gbit(1.0, 20), LinkSpec::gbit(3.0, 20)];
    let mut sim = Sim::new(2, &links, cfg("*:adaptive"));
    let len = 4 << 20;
    for i in 0..5 {
        transfer_time(&mut sim, len, i); // warm-up: the rates get measured
    }
    let before = bytes_per_rail(&sim);
    let t = transfer_time(&mut sim, len, 99);
    let after = bytes_per_rail(&sim);
    let ideal = len as f64 / 500e6;
    let eff = ideal / t.as_secs_f64();
    assert!(eff > 0.9, "4 MiB took {t:?}, {:.0}% of the ideal {ideal:.4}s", eff * 100.0);
    let slow = (after[0] - before[0]) as f64 / len as f64;
    assert!((0.18..0.32).contains(&slow), "slow rail carried {:.0}% (ideal 25%)", slow * 100.0);
    // Equal striping would be bounded by the slow rail: 2 MiB at 125 MB/s.
    let mut stripe = Sim::new(2, &links, cfg("*:stripe"));
    let ts = transfer_time(&mut stripe, len, 1);
    assert!(ts > t.mul_f64(1.3), "stripe {ts:?} vs adaptive {t:?}");
}

#[test]
fn small_messages_keep_single_rail_latency() {
    let links = [LinkSpec::gbit(10.0, 10), LinkSpec::gbit(10.0, 10)];
    let mut one = Sim::new(2, &links[..1], cfg("*:single"));
    let mut two = Sim::new(2, &links, cfg("16K:single,*:adaptive"));
    let a = transfer_time(&mut one, 8, 1);
    let b = transfer_time(&mut two, 8, 1);
    assert_eq!(a, b);
}

#[test]
fn spread_keeps_one_rail_for_a_lone_message_and_every_rail_for_a_stream() {
    let links = [LinkSpec::gbit(2.0, 50), LinkSpec::gbit(2.0, 50)];
    // A lone small message: exactly the latency of one rail.
    let mut one = Sim::new(2, &links[..1], cfg("*:single"));
    let mut two = Sim::new(2, &links, Config::default());
    assert_eq!(transfer_time(&mut one, 8, 1), transfer_time(&mut two, 8, 1));
    assert_eq!(bytes_per_rail(&two).iter().filter(|&&b| b > 0).count(), 1, "one rail for one message");
    // A stream of whole 4 KiB messages: both rails, in order, faster than one.
    let sizes = vec![4096; 512];
    let t_two = send_and_verify(&mut two, &sizes, true);
    let b = bytes_per_rail(&two);
    assert!(b[0] > 512 << 10 && b[1] > 512 << 10, "both rails carried the stream: {b:?}");
    let t_one = send_and_verify(&mut one, &sizes, true);
    assert!(t_two.as_secs_f64() < 0.7 * t_one.as_secs_f64(), "two rails {t_two:?} vs one {t_one:?}");
}

#[test]
fn rendezvous_waits_for_the_receive() {
    let mut sim = Sim::new(2, &rails4()[..2], cfg("*:stripe"));
    let s = sim.isend(0, 1, 5, pattern(5, 1 << 20));
    sim.run_for(Duration::from_millis(50));
    assert_eq!(bytes_per_rail(&sim).iter().sum::<u64>(), 0, "no data before the receive is posted");
    assert!(!sim.is_done(0, s));
    let r = sim.irecv(1, None, Some(5), 1 << 20);
    assert!(sim.run_until(Duration::from_secs(5), |x| x.is_done(1, r) && x.is_done(0, s)));
    let Some(Done::Recv(Ok(st), buf)) = sim.take(1, r) else { panic!() };
    assert_eq!(st.len, 1 << 20);
    assert_eq!(&buf[..], &pattern(5, 1 << 20)[..]);
    assert_eq!(bytes_per_rail(&sim).iter().sum::<u64>(), 1 << 20, "each byte sent once");
}

#[test]
fn unexpected_messages_are_bounded_and_the_sender_waits() {
    let mut c = cfg("*:single");
    c.unexpected_limit = 64 << 10;
    c.eager_limit = 16 << 10;
    let mut sim = Sim::new(2, &rails4()[..2], c);
    // 100 eager messages of 10 KB = 1 MB, far more than the 64 KiB limit.
    let sends: Vec<_> = (0..100).map(|i| sim.isend(0, 1, i, pattern(i, 10_000))).collect();
    let mut peak = 0;
    sim.run_until(Duration::from_millis(200), |s| {
        peak = peak.max(s.nodes[1].unexpected_bytes(0));
        false
    });
    assert!(peak <= 64 << 10, "unexpected buffer reached {peak}");
    assert!(peak > 32 << 10, "the credit was used ({peak})");
    assert!(!sends.iter().all(|s| sim.is_done(0, *s)), "the flood waits");
    let recvs: Vec<_> = (0..100).map(|i| sim.irecv(1, Some(0), Some(i), 10_000)).collect();
    assert!(sim.run_until(Duration::from_secs(5), |s| recvs.iter().all(|r| s.is_done(1, *r))));
    for (i, r) in recvs.into_iter().enumerate() {
        let Some(Done::Recv(Ok(_), buf)) = sim.take(1, r) else { panic!() };
        assert_eq!(&buf[..], &pattern(i as u64, 10_000)[..]);
    }
    assert!(sim.run_until(Duration::from_secs(1), |s| sends.iter().all(|r| s.is_done(0, *r))));
}

#[test]
fn an_unposted_tag_does_not_deadlock_behind_a_flood() {
    // Credits run out on tag 1 messages nobody receives yet; a message
    // with tag 2 must still get through (it goes rendezvous).
    let mut c = cfg("*:single");
    c.unexpected_limit = 32 << 10;
    let mut sim = Sim::new(2, &rails4()[..1], c);
    for i in 0..20 {
        sim.isend(0, 1, 1, pattern(i, 4000));
    }
    sim.isend(0, 1, 2, pattern(99, 100));
    let r = sim.irecv(1, Some(0), Some(2), 100);
    assert!(sim.run_until(Duration::from_secs(1), |s| s.is_done(1, r)));
}

#[test]
fn truncation_is_an_error_on_that_receive_only() {
    let mut c = cfg("16K:single,*:adaptive");
    c.eager_limit = 64 << 10; // 150 000 B messages go by rendezvous
    let mut sim = Sim::new(2, &rails4()[..2], c);
    let r1 = sim.irecv(1, Some(0), None, 10); // eager too big
    let r2 = sim.irecv(1, Some(0), None, 1000); // rendezvous too big
    let r3 = sim.irecv(1, Some(0), None, 200_000);
    let s1 = sim.isend(0, 1, 1, pattern(1, 100));
    let s2 = sim.isend(0, 1, 2, pattern(2, 150_000));
    let s3 = sim.isend(0, 1, 3, pattern(3, 150_000));
    assert!(sim.run_until(Duration::from_secs(5), |s| [r1, r2, r3].iter().all(|r| s.is_done(1, *r))
        && [s1, s2, s3].iter().all(|r| s.is_done(0, *r))));
    assert!(matches!(sim.take(1, r1), Some(Done::Recv(Err(RecvError::Truncated { buf_len: 10, .. }), _))));
    assert!(matches!(sim.take(1, r2), Some(Done::Recv(Err(RecvError::Truncated { buf_len: 1000, .. }), _))));
    let Some(Done::Recv(Ok(st), buf)) = sim.take(1, r3) else { panic!() };
    assert_eq!(st.tag, 3);
    assert_eq!(&buf[..150_000], &pattern(3, 150_000)[..]);
    // The discarded rendezvous data never crossed the wire.
    assert!(bytes_per_rail(&sim).iter().sum::<u64>() < 100 + 2 * 150_000);
    assert!(sim.errors.is_empty());
}

#[test]
fn zero_byte_messages() {
    for policy in ["*:single", "*:stripe", "*:adaptive"] {
        let mut sim = Sim::new(2, &rails4()[..3], cfg(policy));
        send_and_verify(&mut sim, &[0, 0, 5, 0], false);
    }
    // A zero-byte message sent as rendezvous (no credits) too.
    let mut c = cfg("*:single");
    c.unexpected_limit = MESSAGE_OVERHEAD;
    let mut sim = Sim::new(2, &rails4()[..1], c);
    send_and_verify(&mut sim, &[0, 0, 0], false);
}

#[test]
fn checksums_are_carried_and_checked() {
    let mut c = cfg("*:stripe");
    c.checksum = true;
    let mut sim = Sim::new(2, &rails4()[..2], c);
    send_and_verify(&mut sim, &[100, 1 << 20], true);
}

#[test]
fn policy_table_picks_by_size() {
    let links = [LinkSpec::gbit(1.0, 10), LinkSpec::gbit(1.0, 10)];
    let mut sim = Sim::new(2, &links, cfg("1K:single,*:stripe"));
    send_and_verify(&mut sim, &[1024], true);
    let b = bytes_per_rail(&sim);
    assert!(b[0] == 0 || b[1] == 0, "1 KiB went on one rail: {b:?}");
    send_and_verify(&mut sim, &[1025], true);
    let b = bytes_per_rail(&sim);
    assert!(b[0] > 0 && b[1] > 0, "1025 bytes striped: {b:?}");
    assert_eq!("1K:single,*:stripe".parse::<PolicyTable>().unwrap().lookup(1025), PolicyKind::Stripe);
}

// ---------- rail failures ----------

fn big_sizes() -> Vec<usize> {
    vec![3 << 20, 100, 2 << 20, 70_000, 5 << 20, 1]
}

/// Runs `sizes` from 0 to 1 and applies `fault` once `when(sim)` holds.
fn with_fault(policy: &str, sizes: &[usize], when: impl Fn(&Sim) -> bool, fault: impl FnOnce(&mut Sim)) -> Sim {
    let mut sim = Sim::new(2, &rails4()[..3], cfg(policy));
    let recvs: Vec<_> = sizes.iter().map(|&s| sim.irecv(1, Some(0), None, s)).collect();
    let sends: Vec<_> =
        sizes.iter().enumerate().map(|(i, &s)| sim.isend(0, 1, i as u64, pattern(i as u64, s))).collect();
    assert!(sim.run_until(Duration::from_secs(10), |s| when(s)), "fault condition never held");
    fault(&mut sim);
    let all = |s: &Sim| recvs.iter().all(|r| s.is_done(1, *r)) && sends.iter().all(|r| s.is_done(0, *r));
    assert!(sim.run_until(Duration::from_secs(30), all), "stalled after the fault");
    for (i, r) in recvs.iter().enumerate() {
        let Some(Done::Recv(Ok(st), buf)) = sim.take(1, *r) else { panic!("receive {i} failed") };
        assert_eq!(st.tag, i as u64);
        assert_eq!(&buf[..sizes[i]], &pattern(i as u64, sizes[i])[..], "message {i}");
    }
    // Everything sent is eventually acknowledged and released.
    assert!(sim.run_until(Duration::from_secs(1), |s| s.nodes[0].unacked_messages() == 0));
    sim
}

fn tx(sim: &Sim) -> u64 {
    bytes_per_rail(sim).iter().sum()
}

#[test]
fn rail_dies_before_anything_is_sent() {
    let mut sim = Sim::new(2, &rails4()[..3], cfg("*:adaptive"));
    sim.cut(0, 1, 1, "link down");
    send_and_verify(&mut sim, &big_sizes(), true);
    assert_eq!(bytes_per_rail(&sim)[1], 0);
}

#[test]
fn rail_dies_after_rts_before_cts() {
    // The receive is posted late, so the RTS sits at the receiver; the rail
    // that carried it dies; the CTS must still arrive.
    let mut sim = Sim::new(2, &rails4()[..2], cfg("*:single"));
    let s = sim.isend(0, 1, 7, pattern(7, 1 << 20));
    sim.run_for(Duration::from_millis(5));
    let single_rail = 1; // rank 0 + peer 1 picks rail 1
    sim.cut(0, 1, single_rail, "cable pulled");
    let r = sim.irecv(1, Some(0), Some(7), 1 << 20);
    assert!(sim.run_until(Duration::from_secs(5), |x| x.is_done(1, r) && x.is_done(0, s)));
    let Some(Done::Recv(Ok(_), buf)) = sim.take(1, r) else { panic!() };
    assert_eq!(&buf[..], &pattern(7, 1 << 20)[..]);
}

#[test]
fn rail_dies_with_rts_in_flight() {
    // Kill the RTS's rail while the RTS is on the wire: it is re-sent.
    let with_rts_on_wire = |s: &Sim| s.now > multirail_proto::Time::ZERO;
    with_fault("*:single", &[1 << 20], with_rts_on_wire, |s| s.cut(0, 1, 1, "down"));
}

#[test]
fn rail_dies_mid_data() {
    for policy in ["*:stripe", "*:adaptive", "*:weighted", "*:round-robin"] {
        let sim = with_fault(policy, &big_sizes(), |s| tx(s) > 2 << 20, |s| s.cut(0, 1, 0, "link down"));
        let st = sim.nodes[0].rail_stats(1, sim.now);
        assert!(st[0].downs == 1 && !st[0].up);
        assert!(st.iter().map(|r| r.retransmits).sum::<u64>() > 0 || policy.contains("round"), "{policy}: {st:?}");
    }
}

#[test]
fn rail_dies_with_acks_in_flight_and_duplicates_are_dropped() {
    // Kill right after data was received but before all ACKs returned:
    // fragments are re-sent, the receiver sees duplicates and drops them.
    let sim = with_fault(
        "*:stripe",
        &[4 << 20],
        |s| s.nodes[1].rail_stats(0, s.now).iter().map(|r| r.rx_bytes).sum::<u64>() >= 4 << 20,
        |s| s.cut(0, 1, 2, "down"),
    );
    let rx: u64 = sim.nodes[1].rail_stats(0, sim.now).iter().map(|r| r.rx_bytes).sum();
    assert!(rx >= 4 << 20);
}

#[test]
fn rail_comes_back_and_rejoins_the_schedule() {
    let mut sim = Sim::new(2, &rails4()[..2], cfg("*:stripe"));
    sim.cut(0, 1, 0, "down");
    send_and_verify(&mut sim, &[1 << 20], true);
    let before = bytes_per_rail(&sim)[0];
    assert_eq!(before, 0);
    sim.revive(0, 1, 0);
    send_and_verify(&mut sim, &[1 << 20], true);
    assert_eq!(bytes_per_rail(&sim)[0], 1 << 19, "rail 0 carries its half again");
}

#[test]
fn two_rails_die_one_after_the_other() {
    let sim = with_fault(
        "*:adaptive",
        &big_sizes(),
        |s| tx(s) > 1 << 20,
        |s| {
            s.cut(0, 1, 0, "first");
            s.run_until(Duration::from_secs(1), |x| tx(x) > 4 << 20);
            s.cut(0, 1, 2, "second");
        },
    );
    let up: Vec<bool> = sim.nodes[0].rail_stats(1, sim.now).iter().map(|r| r.up).collect();
    assert_eq!(up, vec![false, true, false]);
}

#[test]
fn a_crashed_peer_fails_pending_operations_naming_each_rail() {
    // The process behind rank 1 dies mid-transfer: its connections reset,
    // and reconnecting is refused on every rail (nothing listens any
    // more). Rank 0's operations with it fail, saying why for each rail;
    // everything else goes on.
    let mut sim = Sim::new(3, &rails4()[..2], cfg("*:adaptive"));
    let s = sim.isend(0, 1, 1, pattern(1, 8 << 20));
    let r = sim.irecv(0, Some(1), Some(1), 100);
    let r_any = sim.irecv(0, None, Some(9), 10);
    let _ = sim.irecv(1, Some(0), Some(1), 8 << 20);
    sim.run_until(Duration::from_secs(1), |x| tx(x) > 1 << 20);
    let t0 = sim.now;
    sim.crash(1);
    assert!(sim.run_until(Duration::from_secs(5), |x| x.is_done(0, s)));
    assert!(sim.now - t0 < Duration::from_millis(100), "refusals are fast: {:?}", sim.now - t0);
    match sim.take(0, s) {
        Some(Done::Send(Err(SendError::PeerFailed(f)))) => {
            assert_eq!(f.peer, 1);
            // Each rail's reason is kept; the message says a shared one once.
            assert_eq!(f.rails.len(), 2);
            assert!(f.rails.iter().all(|(_, why)| why.contains("connection refused")), "{:?}", f.rails);
            let msg = SendError::PeerFailed(f).to_string();
            assert!(msg.contains("peer 1 unreachable: connection refused"), "{msg}");
        }
        other => panic!("send: {other:?}"),
    }
    assert!(matches!(sim.take(0, r), Some(Done::Recv(Err(RecvError::PeerFailed(_)), _))));
    assert!(!sim.is_done(0, r_any), "an any-source receive stays posted");
    assert!(sim.log.iter().any(|(n, e)| *n == 0 && matches!(e, Event::PeerFailed { .. })));
    // Other peers are untouched.
    let r2 = sim.irecv(0, Some(2), None, 100);
    sim.isend(2, 0, 3, pattern(3, 100));
    assert!(sim.run_until(Duration::from_secs(1), |x| x.is_done(0, r2)));
    // New operations on the failed peer fail at once.
    let s2 = sim.isend(0, 1, 1, pattern(1, 10));
    assert!(matches!(sim.take(0, s2), Some(Done::Send(Err(_)))));
}

#[test]
fn small_messages_meeting_their_receive_take_the_fast_path() {
    // Receives posted first, one rail (so frames arrive in order), whole
    // eager messages (rounds that fit the credit, or the sender would
    // switch to rendezvous): each is received by the fast path, and the
    // credit it used comes back (four times the grant goes through).
    let mut c = cfg("*:single");
    c.unexpected_limit = 64 << 10;
    let mut sim = Sim::new(2, &rails4()[..1], c.clone());
    let round: Vec<usize> = (0..10).map(|i| [0, 1, 8, 1000, 4096][i % 5]).collect();
    let rounds = 30;
    assert!(rounds * round.iter().sum::<usize>() > 4 * (64 << 10));
    for _ in 0..rounds {
        send_and_verify(&mut sim, &round, true);
    }
    assert_eq!(sim.nodes[1].fast_received(), (rounds * round.len()) as u64);
    sim.nodes[1].check_invariants().unwrap();

    // Two rails of different latency, small messages spread over both:
    // those that overtake an earlier one wait in the general path, and
    // become matchable when the fast path takes the one they overtook
    // (the simulator checks after every step that none is left behind).
    let slow_fast = [LinkSpec::gbit(1.0, 200), LinkSpec::gbit(1.0, 5)];
    // Two messages: the second (fast rail) overtakes the first and must
    // not be left waiting once the first is taken.
    for n in [2, 64] {
        let mut sim = Sim::new(2, &slow_fast, cfg("*:round-robin"));
        send_and_verify(&mut sim, &vec![8; n], true);
        let fast = sim.nodes[1].fast_received() as usize;
        assert!(fast > 0 && fast < n, "{fast} of {n} by the fast path: expected some overtaken");
    }

    // Not taken: messages that arrive before their receive.
    let mut sim = Sim::new(2, &rails4()[..1], c.clone());
    let sends: Vec<_> = (0..3).map(|i| sim.isend(0, 1, i, pattern(i, 8))).collect();
    sim.run_for(Duration::from_millis(10));
    let recvs: Vec<_> = (0..3).map(|_| sim.irecv(1, Some(0), None, 8)).collect();
    assert!(sim.run_until(Duration::from_secs(1), |sim| recvs.iter().all(|r| sim.is_done(1, *r))
        && sends.iter().all(|r| sim.is_done(0, *r))));
    for (i, r) in recvs.into_iter().enumerate() {
        let Some(Done::Recv(Ok(st), buf)) = sim.take(1, r) else { panic!("receive {i}") };
        assert_eq!((st.tag, &buf[..]), (i as u64, &pattern(i as u64, 8)[..]));
    }
    assert_eq!(sim.nodes[1].fast_received(), 0);

    // Not taken: a message in several fragments; a receive too small.
    let mut c2 = c.clone();
    c2.chunk = 1024;
    let mut sim = Sim::new(2, &rails4()[..1], c2);
    send_and_verify(&mut sim, &[4000, 8], true);
    assert_eq!(sim.nodes[1].fast_received(), 1, "only the 8-byte message is whole");
    let mut sim = Sim::new(2, &rails4()[..1], c);
    let r = sim.irecv(1, Some(0), None, 4);
    let s = sim.isend(0, 1, 7, pattern(7, 8));
    assert!(sim.run_until(Duration::from_secs(1), |sim| sim.is_done(1, r) && sim.is_done(0, s)));
    assert!(matches!(sim.take(1, r), Some(Done::Recv(Err(RecvError::Truncated { buf_len: 4, .. }), _))));
    assert_eq!(sim.nodes[1].fast_received(), 0);
}

#[test]
fn a_wildcard_tag_never_matches_a_reserved_tag() {
    // A library message (tag at or above RESERVED_TAGS, like the barrier's)
    // arrives first, then an application message: a receive with any tag
    // takes the application's, before and after they arrive; only a
    // receive naming the reserved tag takes the library's.
    let reserved = multirail_proto::core::RESERVED_TAGS + 5;
    for post_first in [true, false] {
        let mut sim = Sim::new(2, &rails4()[..1], cfg("*:single"));
        let any = post_first.then(|| sim.irecv(1, None, None, 64));
        let s1 = sim.isend(0, 1, reserved, pattern(1, 16));
        let s2 = sim.isend(0, 1, 7, pattern(2, 32));
        sim.run_for(Duration::from_millis(10));
        let any = any.unwrap_or_else(|| sim.irecv(1, None, None, 64));
        let lib = sim.irecv(1, Some(0), Some(reserved), 64);
        assert!(sim.run_until(Duration::from_secs(1), |sim| [s1, s2].iter().all(|r| sim.is_done(0, *r))
            && sim.is_done(1, any)
            && sim.is_done(1, lib)));
        let Some(Done::Recv(Ok(st), buf)) = sim.take(1, any) else { panic!("the wildcard receive") };
        assert_eq!((st.tag, &buf[..st.len as usize]), (7, &pattern(2, 32)[..]), "posted first: {post_first}");
        let Some(Done::Recv(Ok(st), buf)) = sim.take(1, lib) else { panic!("the reserved receive") };
        assert_eq!((st.tag, &buf[..st.len as usize]), (reserved, &pattern(1, 16)[..]));
    }
}

#[test]
fn a_connection_ending_after_the_peers_close_is_not_a_rail_down() {
    let mut sim = Sim::new(2, &rails4()[..2], cfg("*:adaptive"));
    send_and_verify(&mut sim, &[1 << 20], true);
    let now = sim.now;
    sim.nodes[1].close(now);
    assert!(sim.run_until(Duration::from_secs(5), |s| !s.nodes[0].peer_alive(1)), "rank 0 heard the CLOSE");
    sim.kill(0, 1, 1, "connection reset by peer");
    let st = sim.nodes[0].rail_stats(1, sim.now);
    assert_eq!(st.iter().map(|r| r.downs).sum::<u64>(), 0, "the close is not a failure: {st:?}");
    // Before the close, the same reset is one.
    let mut sim = Sim::new(2, &rails4()[..2], cfg("*:adaptive"));
    send_and_verify(&mut sim, &[1 << 20], true);
    sim.kill(0, 1, 1, "connection reset by peer");
    assert_eq!(sim.nodes[0].rail_stats(1, sim.now)[1].downs, 1);
}

#[test]
fn a_connection_that_comes_up_while_closing_gets_a_close() {
    // Rank 0 opened rail 1 and holds it up (a connector counts it up once
    // it wrote its AUTH); rank 1 is still reading that AUTH when it closes,
    // so its CLOSE goes on rail 0 alone, over a slow link. Rank 1 then
    // installs the connection (`late`) or drops it, and the connection ends:
    // its end reaches rank 0 before rail 0's CLOSE. Installed while closing,
    // it carries a CLOSE of its own first, and its end is the close; dropped
    // without one, its end is a failed rail (an end of stream alone proves no
    // clean close: a killed process's sockets end too).
    for late in [true, false] {
        let mut sim = Sim::new(2, &[LinkSpec::gbit(1.0, 5_000), LinkSpec::gbit(1.0, 10)], cfg("*:adaptive"));
        let now = sim.now;
        // Rank 1 has not installed rail 1 yet: down in its view alone (its
        // event is taken here, so the simulator leaves the link connected).
        sim.nodes[1].rail_down(0, 1, "not installed yet", now);
        while sim.nodes[1].poll_event().is_some() {}
        sim.nodes[1].close(now);
        if late {
            sim.set_caps(1, 0, 1, RailCaps::default());
        }
        sim.run_for(Duration::from_millis(1));
        // Rail 0's CLOSE is still on its way; rail 1's came (late) or none.
        assert_eq!(sim.nodes[0].peer_alive(1), !late, "late {late}: rank 0 heard a CLOSE on rail 1");
        sim.kill(0, 1, 1, "connection closed by peer");
        let downs = sim.nodes[0].rail_stats(1, sim.now)[1].downs;
        let rail_downs =
            |sim: &Sim| sim.log.iter().filter(|(n, e)| *n == 0 && matches!(e, Event::RailDown { .. })).count();
        assert_eq!((downs, rail_downs(&sim)), if late { (0, 0) } else { (1, 1) }, "late {late}: {:?}", sim.log);
        assert!(
            sim.run_until(Duration::from_secs(1), |s| !s.nodes[0].peer_alive(1)),
            "late {late}: rank 0 heard the close"
        );
        // Rank 1 ends its other connections, after their CLOSE (rail 1's
        // too, if rank 0 opened it again: a connection that came up while
        // rank 1 was closing): rank 0 is done with the peer, no more downs.
        sim.kill(0, 1, 0, "connection closed by peer");
        sim.kill(0, 1, 1, "connection closed by peer");
        let downs: Vec<u64> = sim.nodes[0].rail_stats(1, sim.now).iter().map(|r| r.downs).collect();
        assert_eq!(downs, [0, !late as u64], "late {late}");
        assert!(sim.log.iter().any(|(n, e)| *n == 0 && matches!(e, Event::PeerClosed { peer: 1 })), "late {late}");
    }
}

#[test]
fn a_message_received_right_before_the_receivers_close_is_acknowledged() {
    // Rank 1 receives a small message and closes at once: its CLOSE goes
    // after the acknowledgement, so rank 0 can close without waiting.
    for direct in [true, false] {
        let mut c = cfg("*:single");
        c.direct_eager = direct;
        let mut sim = Sim::new(2, &rails4()[..1], c);
        let r = sim.irecv(1, Some(0), Some(9), 64);
        let s = sim.isend(0, 1, 9, pattern(3, 8));
        assert!(sim.run_until(Duration::from_secs(1), |sim| sim.is_done(1, r) && sim.is_done(0, s)));
        let now = sim.now;
        sim.nodes[1].close(now);
        assert!(
            sim.run_until(Duration::from_secs(5), |s| s.nodes[0].is_quiescent()),
            "direct {direct}: rank 0 still waits for {:?}",
            sim.nodes[0].unacked_by_peer()
        );
    }
}
