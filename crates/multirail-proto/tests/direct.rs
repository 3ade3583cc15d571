//! The direct path of small messages (`Config::direct_eager`): a small
//! eager message with nothing of the general path waiting goes straight
//! onto the rail the scheduler would pick (the one rail; with several, the
//! pair's preferred rail while it has little in flight), completes at once
//! and is kept only until the peer acknowledges it. Its promise is the general path's: in
//! order, once, and not lost when its connection is lost first.
//! Simulated ranks and time: deterministic.

use std::time::Duration;

use bytes::Bytes;
use multirail_proto::core::{Config, RailCaps};
use multirail_proto::sim::{Done, LinkSpec, Sim, pattern};
use multirail_proto::wire::{FrameHeader, Op};

fn one_rail(direct: bool) -> Sim {
    Sim::new(2, &[LinkSpec::gbit(10.0, 5)], Config { direct_eager: direct, ..Config::default() })
}

/// [`one_rail`] with the direct path on, its sends written within the
/// call (`Core::isend_now`, as the endpoint's `isend` does) or not.
fn one_rail_sending_now(now: bool) -> Sim {
    let mut sim = one_rail(true);
    sim.send_now = now;
    sim
}

/// Rank 0 sends `sizes` to rank 1 in order (tag = index), rank 1 receives
/// them with the receives posted first; every payload is checked.
fn send_all(sim: &mut Sim, sizes: &[usize]) {
    let recvs: Vec<_> =
        sizes.iter().enumerate().map(|(i, &len)| sim.irecv(1, Some(0), Some(i as u64), len.max(1))).collect();
    let sends: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| sim.isend(0, 1, i as u64, Bytes::from(pattern(i as u64, len))))
        .collect();
    let done = |s: &Sim| recvs.iter().all(|&r| s.is_done(1, r)) && sends.iter().all(|&q| s.is_done(0, q));
    assert!(sim.run_until(Duration::from_secs(10), done), "not everything arrived");
    for (i, r) in recvs.into_iter().enumerate() {
        let Some(Done::Recv(Ok(st), buf)) = sim.take(1, r) else { panic!("receive {i} failed") };
        assert_eq!(st.len as usize, sizes[i]);
        assert_eq!(&buf[..sizes[i]], &pattern(i as u64, sizes[i])[..], "message {i}");
    }
}

#[test]
fn a_lone_small_message_goes_direct_and_completes_at_once() {
    for now in [false, true] {
        lone_small_message(now);
    }
}

fn lone_small_message(send_now: bool) {
    let mut sim = one_rail_sending_now(send_now);
    let r = sim.irecv(1, Some(0), Some(5), 64);
    let s = sim.isend(0, 1, 5, Bytes::from(pattern(5, 64)));
    // Complete before anything moved: its bytes are the rail's.
    assert!(sim.is_done(0, s), "a direct send completes when queued");
    assert_eq!(sim.nodes[0].direct_sent(), 1);
    assert_eq!(sim.nodes[0].unacked_messages(), 1, "kept until acknowledged");
    assert!(sim.run_until(Duration::from_secs(1), |x| x.is_done(1, r)));
    // The acknowledgement releases it (and the rail's window).
    assert!(sim.run_until(Duration::from_secs(1), |x| x.nodes[0].unacked_messages() == 0));
    sim.nodes[0].check_invariants().unwrap();
    assert!(sim.nodes[0].rail_stats(1, sim.now)[0].tx_bytes >= 64, "counted as the rail's data");

    // Off: the general path takes it.
    let mut sim = one_rail(false);
    sim.isend(0, 1, 5, Bytes::from(pattern(5, 64)));
    assert_eq!(sim.nodes[0].direct_sent(), 0);
}

#[test]
fn small_and_large_messages_mixed_arrive_in_order_on_either_path() {
    // Small ones go direct while nothing else is in flight; a large one
    // (rendezvous) and what follows it take the general path until it is
    // acknowledged. Order and content must not depend on the mix.
    let mut sizes = Vec::new();
    for i in 0..60usize {
        sizes.push(match i % 10 {
            3 => 1 << 20,
            7 => 300 << 10,
            _ => (i * 97) % 4000,
        });
    }
    for (direct, now) in [(true, false), (true, true), (false, false)] {
        let mut sim = one_rail(direct);
        sim.send_now = now;
        send_all(&mut sim, &sizes);
        assert_eq!(sim.nodes[0].direct_sent() > 0, direct);
        assert!(sim.run_until(Duration::from_secs(1), |x| x.nodes[0].unacked_messages() == 0));
        sim.nodes[0].check_invariants().unwrap();
    }
}

/// Runs a mixed load from both ranks: ping-pongs of small messages (the
/// direct path), a window of 64 small ones (past the rail's room: the
/// general path takes over mid-stream), large ones (rendezvous) among
/// them, every payload checked. Returns the frames put on each link, in
/// order, with their times.
fn mixed_load(rails: usize, send_now: bool) -> Vec<multirail_proto::sim::WireFrame> {
    let mut sim = if rails == 1 { one_rail(true) } else { two_rails(Config::default()) };
    sim.send_now = send_now;
    sim.log_wire();
    let mut tag = 0u64;
    let mut exchange = |sim: &mut Sim, from: u32, sizes: &[usize]| {
        let to = 1 - from;
        let base = tag;
        tag += sizes.len() as u64;
        let recvs: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(i, &len)| sim.irecv(to, Some(from), Some(base + i as u64), len.max(1)))
            .collect();
        for (i, &len) in sizes.iter().enumerate() {
            let t = base + i as u64;
            sim.isend(from, to, t, Bytes::from(pattern(t, len)));
            // The endpoint writes a queued send within `isend` too, when
            // its connection is free.
            sim.flush();
        }
        assert!(sim.run_until(Duration::from_secs(10), |s| recvs.iter().all(|&r| s.is_done(to, r))));
        for (i, r) in recvs.into_iter().enumerate() {
            let t = base + i as u64;
            let Some(Done::Recv(Ok(st), buf)) = sim.take(to, r) else { panic!("receive {t} failed") };
            assert_eq!(&buf[..st.len as usize], &pattern(t, sizes[i])[..], "message {t}");
        }
    };
    for i in 0..40usize {
        exchange(&mut sim, (i % 2) as u32, &[(i * 211) % 3000 + 1]);
    }
    let window: Vec<usize> = (0..64).map(|i| 512 + (i * 37) % 2048).collect();
    exchange(&mut sim, 0, &window);
    exchange(&mut sim, 1, &[8, 300 << 10, 64, 1 << 20, 16]);
    for i in 0..20usize {
        exchange(&mut sim, (i % 2) as u32, &[8]);
    }
    assert!(sim.run_until(Duration::from_secs(1), |x| (0..2).all(|n| x.nodes[n].unacked_messages() == 0)));
    for n in &sim.nodes {
        n.check_invariants().unwrap();
    }
    if send_now {
        assert!(sim.nodes[0].direct_sent() > 0 && sim.nodes[1].direct_sent() > 0);
    }
    let mut log = sim.wire_log().to_vec();
    // Per link, in order (links are independent).
    log.sort_by_key(|&(from, to, rail, ..)| (from, to, rail));
    log
}

#[test]
fn a_send_written_within_isend_puts_the_same_frames_on_the_wire() {
    // `Core::isend_now` (the endpoint's path for a lone small message)
    // must send exactly what `isend` and then `poll_transmit` would:
    // the same frames (sequence numbers, flags such as ACK_NOW, the
    // piggybacked prefix), at the same times, in the same order on each
    // link, and so the same everything after them.
    for rails in [1, 2] {
        let queued = mixed_load(rails, false);
        let now = mixed_load(rails, true);
        assert!(queued.len() > 150, "the load put {} frames on the wire", queued.len());
        assert_eq!(queued.len(), now.len(), "{rails} rails: a different number of frames");
        for (k, (a, b)) in queued.iter().zip(&now).enumerate() {
            assert_eq!(a, b, "{rails} rails: frame {k} differs");
        }
    }
}

#[test]
fn a_send_is_written_within_isend_only_when_nothing_waits_on_its_rail() {
    // The conditions of `Core::isend_now`: it declines (changing nothing)
    // while a control frame waits on the rail, when the caller cannot
    // write to the rail now, and for what the direct path would not take;
    // `isend` then queues as before.
    let mut sim = one_rail(true);
    let t = sim.now;
    let core = &mut sim.nodes[0];
    let big = Bytes::from(pattern(1, 1 << 20));
    assert_eq!(core.send_now_rail(1, big.len() as u64), None);
    assert!(core.isend_now(1, 1, big, t, Some).is_err(), "a rendezvous message");
    assert_eq!(core.send_now_rail(1, 64), Some(0));
    let (req, frame, _, _) = core.isend_now(1, 2, Bytes::from(pattern(2, 64)), t, Some).expect("a lone small message");
    assert_eq!((frame.header.seq, frame.header.tag, frame.payload.len()), (0, 2, 64));
    assert!(core.take_send_done(req).is_none(), "complete, no event");
    assert!(core.poll_transmit(1, 0, t).is_none(), "handed over, not queued");
    core.on_sent(1, 0, 1, t);
    // A control frame waits on the rail (the CTS for the peer's RTS of a
    // posted receive): declined, nothing changed; once it is written,
    // the next message goes with the following sequence number.
    core.irecv(Some(1), Some(9), bytes::BytesMut::zeroed(1 << 20), t);
    let mut rts = FrameHeader::new(Op::Rts);
    (rts.tag, rts.total_len) = (9, 1 << 20);
    core.on_frame(1, 0, &rts, &[], t).unwrap();
    assert_eq!(core.send_now_rail(1, 64), None);
    assert!(core.isend_now(1, 3, Bytes::from(pattern(3, 64)), t, Some).is_err());
    let cts = core.poll_transmit(1, 0, t).expect("the CTS");
    assert_eq!(cts.header.op, Op::Cts);
    core.on_sent(1, 0, 1, t);
    let (_, frame, _, _) = core.isend_now(1, 3, Bytes::from(pattern(3, 64)), t, Some).expect("nothing waits now");
    assert_eq!(frame.header.seq, 1);

    // Several rails: on the rail the direct path picks. A caller that
    // cannot write to it now (its connection busy) changes nothing.
    let mut sim = two_rails(Config::default());
    let t = sim.now;
    let core = &mut sim.nodes[0];
    let rail = core.send_now_rail(1, 64).expect("a lone small message goes direct");
    assert!(core.isend_now(1, 1, Bytes::from(pattern(1, 64)), t, |_| None::<()>).is_err());
    let asked = |r| (r == rail).then_some(());
    let (_, frame, on, ()) = core.isend_now(1, 1, Bytes::from(pattern(1, 64)), t, asked).expect("the rail is free");
    assert_eq!((on, frame.header.seq), (rail, 0), "the declined send took no sequence number");
}

#[test]
fn a_direct_send_lost_with_its_connection_goes_again() {
    for now in [false, true] {
        lost_with_its_connection(now);
    }
}

fn lost_with_its_connection(send_now: bool) {
    // The connection resets while the frame is on the wire: it is lost.
    // The rail reconnects and the message must still arrive, once.
    let mut sim = one_rail_sending_now(send_now);
    let r = sim.irecv(1, Some(0), Some(1), 100);
    sim.isend(0, 1, 1, Bytes::from(pattern(1, 100)));
    assert_eq!(sim.nodes[0].direct_sent(), 1);
    sim.step(); // handed to the link
    sim.kill(0, 1, 0, "connection reset");
    assert!(sim.run_until(Duration::from_secs(5), |x| x.is_done(1, r)), "the lost direct send never arrived");
    let Some(Done::Recv(Ok(_), buf)) = sim.take(1, r) else { panic!() };
    assert_eq!(&buf[..100], &pattern(1, 100)[..]);
    // Nothing else completes with it: a second receive for any message
    // stays open (no duplicate delivery).
    let extra = sim.irecv(1, None, None, 100);
    sim.run_for(Duration::from_millis(200));
    assert!(!sim.is_done(1, extra), "the message was delivered twice");
    assert!(sim.run_until(Duration::from_secs(1), |x| x.nodes[0].unacked_messages() == 0));
    sim.nodes[0].check_invariants().unwrap();
}

#[test]
fn a_direct_send_delivered_before_its_acknowledgement_is_lost_is_not_delivered_twice() {
    for now in [false, true] {
        delivered_before_its_acknowledgement_is_lost(now);
    }
}

fn delivered_before_its_acknowledgement_is_lost(send_now: bool) {
    // The frame arrives; the connection resets before the acknowledgement
    // comes back, so the sender sends it again: the receiver drops the
    // copy.
    let mut sim = one_rail_sending_now(send_now);
    let r = sim.irecv(1, Some(0), Some(1), 100);
    sim.isend(0, 1, 1, Bytes::from(pattern(1, 100)));
    assert!(sim.run_until(Duration::from_secs(1), |x| x.is_done(1, r)));
    assert_eq!(sim.nodes[0].unacked_messages(), 1, "not acknowledged yet (the acknowledgement is delayed)");
    sim.kill(0, 1, 0, "connection reset");
    let extra = sim.irecv(1, None, None, 100);
    assert!(sim.run_until(Duration::from_secs(5), |x| x.nodes[0].unacked_messages() == 0), "never acknowledged");
    sim.run_for(Duration::from_millis(200));
    assert!(!sim.is_done(1, extra), "the message was delivered twice");
    // The channel goes on: the open receive takes the next message.
    sim.isend(0, 1, 42, Bytes::from(pattern(42, 80)));
    assert!(sim.run_until(Duration::from_secs(1), |x| x.is_done(1, extra)));
    let Some(Done::Recv(Ok(st), buf)) = sim.take(1, extra) else { panic!() };
    assert_eq!((st.tag, &buf[..80]), (42, &pattern(42, 80)[..]));
}

#[test]
fn a_rail_that_may_lose_frames_keeps_the_general_path() {
    // Injected drops or corruption (`MULTIRAIL_FAULTS`): only the general
    // path's bookkeeping finds a lost frame, by a later one acknowledged
    // first, and sends it again.
    let mut sim = one_rail(true);
    sim.set_caps(0, 1, 0, RailCaps { may_lose: true, ..RailCaps::default() });
    send_all(&mut sim, &[8, 100, 4000]);
    assert_eq!(sim.nodes[0].direct_sent(), 0);
}

#[test]
fn a_send_completed_inside_isend_is_taken_from_the_event_queue() {
    use multirail_proto::core::Event;
    let mut sim = one_rail(true);
    let now = sim.now;
    let core = &mut sim.nodes[0];
    let id = core.isend(1, 5, Bytes::from(pattern(5, 64)), now);
    assert!(matches!(core.take_send_done(id), Some(Ok(()))), "the direct path completes inside isend");
    assert!(core.take_send_done(id).is_none(), "taken once");
    while let Some(e) = core.poll_event() {
        assert!(!matches!(e, Event::SendDone { req, .. } if req == id), "taken, not also queued");
    }

    // The general path completes later: nothing to take, the event comes.
    let mut sim = one_rail(false);
    let now = sim.now;
    let id = sim.nodes[0].isend(1, 5, Bytes::from(pattern(5, 64)), now);
    assert!(sim.nodes[0].take_send_done(id).is_none());
}

fn two_rails(cfg: Config) -> Sim {
    Sim::new(2, &[LinkSpec::gbit(2.0, 50), LinkSpec::gbit(2.0, 50)], cfg)
}

#[test]
fn to_a_peer_with_several_rails_a_lone_small_message_goes_direct_on_the_preferred_rail() {
    let mut sim = two_rails(Config::default());
    let r = sim.irecv(1, Some(0), Some(5), 64);
    let s = sim.isend(0, 1, 5, Bytes::from(pattern(5, 64)));
    assert!(sim.is_done(0, s), "a direct send completes when queued");
    assert_eq!(sim.nodes[0].direct_sent(), 1);
    assert!(sim.run_until(Duration::from_secs(1), |x| x.is_done(1, r)));
    // Ranks 0 and 1: (0 + 1) mod 2 = rail 1, the rail `spread` gives it.
    let st = sim.nodes[0].rail_stats(1, sim.now);
    assert_eq!((st[0].tx_frames, st[1].direct_frames), (0, 1), "{st:?}");
    assert!(sim.run_until(Duration::from_secs(1), |x| x.nodes[0].unacked_messages() == 0));
    sim.nodes[0].check_invariants().unwrap();

    // Policies that split or alternate small messages keep the general path.
    for policy in ["stripe", "round-robin", "adaptive"] {
        let mut sim = two_rails(Config { policy: policy.parse().unwrap(), ..Config::default() });
        sim.isend(0, 1, 5, Bytes::from(pattern(5, 64)));
        assert_eq!(sim.nodes[0].direct_sent(), 0, "{policy}");
    }
}

#[test]
fn a_stream_of_small_messages_to_several_rails_still_uses_every_rail_in_order() {
    // The preferred rail takes them directly while it has less than 32 KiB
    // in flight; beyond, the general path spreads whole messages.
    let sizes: Vec<usize> = (0..600).map(|i| 1000 + (i * 37) % 7000).collect();
    let mut sim = two_rails(Config::default());
    send_all(&mut sim, &sizes);
    let st = sim.nodes[0].rail_stats(1, sim.now);
    assert!(sim.nodes[0].direct_sent() > 0, "some went direct");
    assert!((sim.nodes[0].direct_sent() as usize) < sizes.len(), "not all: a backlog spreads");
    assert!(st[0].tx_bytes > 100_000 && st[1].tx_bytes > 100_000, "both rails carried the stream: {st:?}");
    assert!(sim.run_until(Duration::from_secs(1), |x| x.nodes[0].unacked_messages() == 0));
    sim.nodes[0].check_invariants().unwrap();
}

#[test]
fn a_direct_send_acknowledged_by_a_range_is_released_while_an_earlier_message_holds_the_prefix() {
    // Message 0 is large and unmatched (its RTS waits for a receive), so
    // the receiver's delivered prefix stays at 0. Message 1 goes direct;
    // its ACK range releases it and its bytes in flight (else the rail's
    // deadline would run on a message the peer holds).
    for rails in [1, 2] {
        let links = vec![LinkSpec::gbit(2.0, 50); rails];
        let mut sim = Sim::new(2, &links, Config::default());
        let big = sim.isend(0, 1, 1, Bytes::from(pattern(1, 1 << 20)));
        sim.run_for(Duration::from_millis(5));
        sim.isend(0, 1, 2, Bytes::from(pattern(2, 64)));
        assert_eq!(sim.nodes[0].direct_sent(), 1, "{rails} rail(s)");
        sim.run_for(Duration::from_millis(50));
        assert_eq!(sim.nodes[0].unacked_messages(), 1, "{rails} rail(s): only the unmatched large one is kept");
        sim.nodes[0].check_invariants().unwrap();
        // Both arrive, in order, once the receives are posted.
        let r1 = sim.irecv(1, Some(0), Some(1), 1 << 20);
        let r2 = sim.irecv(1, Some(0), Some(2), 64);
        assert!(sim.run_until(Duration::from_secs(2), |x| x.is_done(1, r1) && x.is_done(1, r2) && x.is_done(0, big)));
        let Some(Done::Recv(Ok(_), buf)) = sim.take(1, r2) else { panic!() };
        assert_eq!(&buf[..64], &pattern(2, 64)[..]);
    }
}
