//! Messages that arrive before their receives: whole small messages are
//! kept aside as they come (`Core::stored_received`), and must keep every
//! rule of the general path: matching in send order (also among
//! rendezvous messages and with wildcards), truncation, credits given back,
//! duplicates dropped after a rail failure, and still deliverable after
//! their sender failed.

use std::time::Duration;

use bytes::Bytes;
use multirail_proto::core::{Config, RecvError};
use multirail_proto::sim::{Done, LinkSpec, Sim};

fn pattern(seed: u64, len: usize) -> Bytes {
    multirail_proto::sim::pattern(seed, len).into()
}

fn one_rail() -> Sim {
    Sim::new(2, &[LinkSpec::gbit(10.0, 5)], Config::default())
}

/// Runs until node 1 holds `n` messages kept aside (all arrived, none
/// received).
fn arrive(sim: &mut Sim, n: u64) {
    assert!(
        sim.run_until(Duration::from_secs(1), |s| s.nodes[1].stored_received() >= n),
        "kept aside {} of {n}; errors {:?}",
        sim.nodes[1].stored_received(),
        sim.errors
    );
}

/// Receives at node 1 and checks the status and the bytes.
fn expect(sim: &mut Sim, src: Option<u32>, tag: Option<u64>, want_tag: u64, seed: u64, len: usize) {
    let r = sim.irecv(1, src, tag, len.max(1));
    assert!(sim.run_until(Duration::from_secs(1), |s| s.is_done(1, r)), "receive of tag {want_tag}");
    match sim.take(1, r) {
        Some(Done::Recv(Ok(st), buf)) => {
            assert_eq!((st.peer, st.tag, st.len as usize), (0, want_tag, len), "matched out of order");
            assert_eq!(&buf[..len], &pattern(seed, len)[..], "payload of message {seed}");
        }
        other => panic!("receive of tag {want_tag}: {other:?}"),
    }
}

#[test]
fn small_messages_that_arrive_first_are_kept_aside_and_matched_oldest_first() {
    let mut sim = one_rail();
    // Tags 0 1 2 0 1 2 ...; seeds are the send order.
    let sizes = [8usize, 0, 100, 1, 4000, 64, 8, 300, 2];
    for (i, &n) in sizes.iter().enumerate() {
        sim.isend(0, 1, (i % 3) as u64, pattern(i as u64, n));
    }
    arrive(&mut sim, sizes.len() as u64);
    let held = sim.nodes[1].unexpected_bytes(0);
    assert!(held >= sizes.iter().sum::<usize>() as u64, "their credits stay charged: {held}");
    // Tag 2 first: its oldest (message 2), then any tag: the oldest left
    // (message 0), then by source only, then tag 1 twice.
    expect(&mut sim, Some(0), Some(2), 2, 2, sizes[2]);
    expect(&mut sim, None, None, 0, 0, sizes[0]);
    expect(&mut sim, Some(0), None, 1, 1, sizes[1]);
    expect(&mut sim, None, Some(1), 1, 4, sizes[4]);
    expect(&mut sim, Some(0), Some(1), 1, 7, sizes[7]);
    for i in [3usize, 5, 6, 8] {
        expect(&mut sim, Some(0), None, (i % 3) as u64, i as u64, sizes[i]);
    }
    assert_eq!(sim.nodes[1].unexpected_bytes(0), 0, "every credit went back");
    assert_eq!(sim.nodes[1].stored_received(), sizes.len() as u64);
    assert!(sim.errors.is_empty(), "{:?}", sim.errors);
    sim.nodes[1].check_invariants().unwrap();
    // The sender hears of all of them.
    assert!(sim.run_until(Duration::from_secs(1), |s| s.nodes[0].unacked_messages() == 0));
}

#[test]
fn a_kept_aside_message_keeps_its_place_among_rendezvous_messages() {
    let mut sim = one_rail();
    let big = (Config::default().eager_limit + 1) as usize;
    let sizes = [big, 10, big, 20];
    for (i, &n) in sizes.iter().enumerate() {
        sim.isend(0, 1, 5, pattern(i as u64, n));
    }
    // The small ones are kept aside behind the RTSs, which wait for a
    // receive.
    arrive(&mut sim, 2);
    for (i, &n) in sizes.iter().enumerate() {
        expect(&mut sim, Some(0), Some(5), 5, i as u64, n);
    }
    assert_eq!(sim.nodes[1].unexpected_bytes(0), 0);
    assert!(sim.errors.is_empty(), "{:?}", sim.errors);
}

#[test]
fn a_kept_aside_message_too_long_for_its_receive_is_truncated_and_the_next_arrives() {
    let mut sim = one_rail();
    sim.isend(0, 1, 1, pattern(0, 100));
    sim.isend(0, 1, 1, pattern(1, 10));
    arrive(&mut sim, 2);
    let r = sim.irecv(1, Some(0), Some(1), 50);
    assert!(sim.run_until(Duration::from_secs(1), |s| s.is_done(1, r)));
    match sim.take(1, r) {
        Some(Done::Recv(Err(RecvError::Truncated { status, buf_len }), buf)) => {
            assert_eq!((status.len, status.tag, buf_len, buf.len()), (100, 1, 50, 50));
        }
        other => panic!("{other:?}"),
    }
    expect(&mut sim, Some(0), Some(1), 1, 1, 10);
    assert_eq!(sim.nodes[1].unexpected_bytes(0), 0, "the truncated message's credit went back too");
}

#[test]
fn a_copy_resent_after_its_rail_failed_is_dropped_not_delivered_twice() {
    let mut sim = Sim::new(2, &[LinkSpec::gbit(10.0, 5), LinkSpec::gbit(10.0, 5)], Config::default());
    let n = 6u64;
    for i in 0..n {
        sim.isend(0, 1, 3, pattern(i, 16));
    }
    // Arrived, kept aside, not yet acknowledged (the ACK waits for its
    // delay): the rail dies under the acknowledgements, and the sender
    // sends its copies again on the other rail.
    assert!(sim.run_until(Duration::from_millis(1), |s| s.nodes[1].stored_received() > 0));
    assert!(sim.nodes[0].unacked_messages() > 0, "nothing was left to send again");
    let rail = sim.nodes[0].rail_stats(1, sim.now).iter().position(|r| r.tx_frames > 0).unwrap();
    sim.kill(0, 1, rail, "connection reset");
    assert!(sim.run_until(Duration::from_secs(2), |s| s.nodes[0].unacked_messages() == 0), "{:?}", sim.errors);
    let other = 1 - rail;
    assert!(sim.nodes[0].rail_stats(1, sim.now)[other].retransmits > 0, "no copy was sent again");
    assert!(sim.nodes[1].rail_stats(0, sim.now)[other].rx_frames > 0, "no copy arrived");
    let got: Vec<_> = (0..n).map(|_| sim.irecv(1, Some(0), Some(3), 16)).collect();
    let extra = sim.irecv(1, Some(0), Some(3), 16);
    sim.run_for(Duration::from_millis(50));
    for (i, r) in got.into_iter().enumerate() {
        match sim.take(1, r) {
            Some(Done::Recv(Ok(st), buf)) => assert_eq!((st.len, &buf[..]), (16, &pattern(i as u64, 16)[..])),
            other => panic!("message {i}: {other:?}"),
        }
    }
    assert!(!sim.is_done(1, extra), "a message was delivered twice");
    assert!(sim.errors.is_empty(), "{:?}", sim.errors);
    sim.nodes[1].check_invariants().unwrap();
}

#[test]
fn kept_aside_messages_stay_deliverable_after_their_sender_failed() {
    let mut sim = one_rail();
    sim.isend(0, 1, 1, pattern(0, 30));
    sim.isend(0, 1, 2, pattern(1, 40));
    arrive(&mut sim, 2);
    sim.crash(0);
    assert!(sim.run_until(Duration::from_secs(60), |s| !s.nodes[1].peer_alive(0)), "the crash was never noticed");
    expect(&mut sim, Some(0), Some(2), 2, 1, 40);
    expect(&mut sim, None, None, 1, 0, 30);
    let r = sim.irecv(1, Some(0), None, 10);
    assert!(matches!(sim.take(1, r), Some(Done::Recv(Err(RecvError::PeerFailed(_)), _))), "nothing more from it");
}
