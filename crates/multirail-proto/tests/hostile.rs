//! A hostile (or broken) peer, frame by frame, against one protocol core.
//!
//! Each test feeds frames to a [`Core`] the way a driver does
//! (`on_frame`, and `on_header`/`on_payload` where the split matters),
//! asserts the exact [`ProtocolError`] (or the documented outcome), closes
//! the offending rail as the driver would (`rail_down`), and then checks
//! that the core keeps serving: a good message from the same peer on
//! another rail, and one from another peer, are still delivered intact.
//! No IO, no clock: deterministic.

use std::collections::HashMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use multirail_proto::core::{
    Config, Core, Event, MESSAGE_OVERHEAD, PayloadDest, PeerId, ProtocolError, RTS_CREDITS, RailCaps, RailId,
    RecvError, ReqId, SEQ_WINDOW, SendError, Status, Transmit,
};
use multirail_proto::sim::{Done, LinkSpec, Sim, pattern};
use multirail_proto::time::Time;
use multirail_proto::wire::frame::{Limits, payload_checksum};
use multirail_proto::wire::{AckRange, AckRepr, Flags, FrameHeader, Op, WireError};

/// Unexpected eager bytes our core buffers per peer (and grants as credit).
const LIMIT: u64 = 64 << 10;
/// Tag of the "good" messages that prove the core still serves.
const GOOD_TAG: u64 = 0x600d;
/// Rails per peer in the default harness.
const RAILS: usize = 3;

fn cfg() -> Config {
    Config { rank: 0, unexpected_limit: LIMIT, eager_limit: 16 << 10, ..Config::default() }
}

// ----- frame builders -----

fn hdr(op: Op, seq: u64, tag: u64, total: u64, offset: u64, len: u32) -> FrameHeader {
    let mut h = FrameHeader::new(op);
    h.seq = seq;
    h.tag = tag;
    h.total_len = total;
    h.offset = offset;
    h.frag_len = len;
    h
}

fn eager(seq: u64, tag: u64, total: u64, offset: u64, len: u32) -> FrameHeader {
    hdr(Op::Eager, seq, tag, total, offset, len)
}

fn data(seq: u64, tag: u64, total: u64, offset: u64, len: u32) -> FrameHeader {
    hdr(Op::Data, seq, tag, total, offset, len)
}

fn rts(seq: u64, tag: u64, total: u64) -> FrameHeader {
    hdr(Op::Rts, seq, tag, total, 0, 0)
}

fn cts(seq: u64, tag: u64, total: u64) -> FrameHeader {
    hdr(Op::Cts, seq, tag, total, 0, 0)
}

fn ack(ranges: &[AckRange]) -> (FrameHeader, Vec<u8>) {
    let repr = AckRepr { ranges: ranges.to_vec() };
    let mut h = FrameHeader::new(Op::Ack);
    h.aux = ranges.len() as u32;
    h.frag_len = repr.buffer_len() as u32;
    (h, repr.to_vec())
}

/// One core (rank 0) with peers 1 and 2, every rail up, and a record of
/// everything it reported.
struct Harness {
    core: Core,
    now: Time,
    recvs: HashMap<ReqId, (Result<Status, RecvError>, BytesMut)>,
    sends: HashMap<ReqId, Result<(), SendError>>,
    rail_downs: Vec<(PeerId, RailId, String)>,
    failed: Vec<PeerId>,
}

impl Harness {
    fn new() -> Harness {
        Harness::with(cfg(), RAILS)
    }

    fn with(cfg: Config, rails: usize) -> Harness {
        let mut core = Core::new(cfg);
        for peer in [1, 2] {
            core.add_peer(peer, rails);
            for r in 0..rails {
                core.rail_up(peer, r, RailCaps::default(), LIMIT, Time::ZERO);
            }
        }
        Harness {
            core,
            now: Time::ZERO,
            recvs: HashMap::new(),
            sends: HashMap::new(),
            rail_downs: Vec::new(),
            failed: Vec::new(),
        }
    }

    fn tick(&mut self) -> Time {
        self.now = self.now + Duration::from_micros(10);
        self.now
    }

    fn collect(&mut self) {
        while let Some(e) = self.core.poll_event() {
            match e {
                Event::RecvDone { req, result, buf } => {
                    assert!(self.recvs.insert(req, (result, buf)).is_none(), "receive {req:?} completed twice");
                }
                Event::SendDone { req, result } => {
                    assert!(self.sends.insert(req, result).is_none(), "send {req:?} completed twice");
                }
                Event::RailDown { peer, rail, reason } => self.rail_downs.push((peer, rail, reason)),
                Event::PeerFailed { failure } => self.failed.push(failure.peer),
                Event::PeerClosed { .. } | Event::RailSuspect { .. } | Event::RailAlive { .. } => {}
            }
        }
    }

    /// A frame as the driver delivers it: the header goes over the wire
    /// format first, so it is one a peer can actually send.
    fn frame(&mut self, peer: PeerId, rail: RailId, h: FrameHeader, payload: &[u8]) -> Result<(), ProtocolError> {
        let parsed = FrameHeader::parse(&h.to_bytes(), &self.core.config().limits).expect("a well-formed header");
        assert_eq!(parsed.payload_len(), payload.len(), "test frame with a wrong payload length");
        let now = self.tick();
        let r = self.core.on_frame(peer, rail, &parsed, payload, now);
        self.collect();
        r
    }

    fn ok(&mut self, peer: PeerId, rail: RailId, h: FrameHeader, payload: &[u8]) {
        if let Err(e) = self.frame(peer, rail, h, payload) {
            panic!("frame {h:?} from peer {peer} on rail {rail} refused: {e}");
        }
    }

    /// The frame must be refused with exactly `want`; the driver then
    /// closes that rail, and only that rail.
    fn refused(&mut self, peer: PeerId, rail: RailId, h: FrameHeader, payload: &[u8], want: ProtocolError) {
        let got = self.frame(peer, rail, h, payload);
        assert_eq!(got, Err(want.clone()), "frame {h:?} from peer {peer} on rail {rail}");
        let up_before: Vec<bool> = (0..self.core.rail_count(peer)).map(|r| self.core.is_rail_up(peer, r)).collect();
        let now = self.tick();
        self.core.rail_down(peer, rail, &want.to_string(), now);
        self.collect();
        assert!(!self.core.is_rail_up(peer, rail));
        let last = self.rail_downs.last().expect("a RailDown event");
        assert_eq!((last.0, last.1), (peer, rail));
        assert!(last.2.contains(&want.to_string()), "{last:?}");
        for (r, was) in up_before.into_iter().enumerate() {
            if r != rail {
                assert_eq!(self.core.is_rail_up(peer, r), was, "rail {r} to peer {peer} unaffected");
            }
        }
        assert!(self.core.peer_alive(peer), "peer {peer} still served");
        assert!(self.failed.is_empty(), "no peer failed: {:?}", self.failed);
    }

    fn irecv(&mut self, src: Option<PeerId>, tag: Option<u64>, len: usize) -> ReqId {
        let now = self.tick();
        let r = self.core.irecv(src, tag, BytesMut::zeroed(len), now);
        self.collect();
        r
    }

    fn recv_done(&mut self, req: ReqId) -> Option<(Status, Vec<u8>)> {
        match self.recvs.remove(&req) {
            None => None,
            Some((Ok(st), buf)) => Some((st, buf[..st.len as usize].to_vec())),
            Some((Err(e), _)) => panic!("receive {req:?} failed: {e}"),
        }
    }

    /// Posts a receive for (`peer`, `tag`) and expects exactly `want` now.
    fn expect_message(&mut self, peer: PeerId, tag: u64, want: &[u8]) {
        let req = self.irecv(Some(peer), Some(tag), want.len() + 16);
        let (st, got) = self.recv_done(req).unwrap_or_else(|| panic!("message (peer {peer}, tag {tag}) not delivered"));
        assert_eq!(st, Status { peer, tag, len: want.len() as u64 });
        assert!(got == want, "payload of (peer {peer}, tag {tag})");
    }

    /// Eager message `seq` with `len` pattern bytes, in one fragment.
    fn good_eager(&mut self, peer: PeerId, rail: RailId, seq: u64, tag: u64, len: usize) -> Vec<u8> {
        let p = pattern(seq ^ tag ^ ((peer as u64) << 40), len);
        self.ok(peer, rail, eager(seq, tag, len as u64, 0, len as u32), &p);
        p
    }

    /// The core still serves: message `seq1` from peer 1 on `rail1` and
    /// message `seq2` from peer 2 (on its rail 0) are delivered intact.
    fn still_serving(&mut self, seq1: u64, rail1: RailId, seq2: u64) {
        for (peer, rail, seq) in [(1, rail1, seq1), (2, 0, seq2)] {
            let tag = GOOD_TAG + seq;
            let p = self.good_eager(peer, rail, seq, tag, 1000);
            self.expect_message(peer, tag, &p);
        }
        assert!(self.core.unexpected_bytes(1) <= LIMIT && self.core.unexpected_bytes(2) <= LIMIT);
    }

    /// Frames the core has for `peer`, from every up rail (reported written).
    fn drain_tx(&mut self, peer: PeerId) -> Vec<(RailId, Transmit)> {
        let mut out = Vec::new();
        for rail in 0..self.core.rail_count(peer) {
            let now = self.tick();
            let mut n = 0;
            while let Some(t) = self.core.poll_transmit(peer, rail, now) {
                out.push((rail, t));
                n += 1;
                assert!(n < 100_000, "endless output");
            }
            self.core.on_sent(peer, rail, n, now);
        }
        self.collect();
        out
    }

    /// Our own sends to `peer` still work: a small (eager) and a large
    /// (rendezvous) message complete and are fully acknowledged, with
    /// `peer` played by the test (answering RTS with CTS, acking data).
    fn sends_still_work(&mut self, peer: PeerId) {
        let small = Bytes::from(pattern(1, 500));
        let large = Bytes::from(pattern(2, 100_000));
        let now = self.tick();
        let a = self.core.isend(peer, 1, small.clone(), now);
        let b = self.core.isend(peer, 2, large.clone(), now);
        let mut got: HashMap<u64, Vec<u8>> = HashMap::new();
        for _round in 0..100 {
            let tx = self.drain_tx(peer);
            if tx.is_empty() {
                break;
            }
            for (rail, t) in tx {
                let h = t.header;
                match h.op {
                    Op::Rts => {
                        self.ok(peer, rail, cts(h.seq, h.tag, h.total_len), &[]);
                    }
                    Op::Eager | Op::Data => {
                        let m = got.entry(h.tag).or_insert_with(|| vec![0; h.total_len as usize]);
                        m[h.offset as usize..h.offset as usize + t.payload.len()].copy_from_slice(&t.payload);
                        let (ah, ap) = ack(&[AckRange { seq: h.seq, offset: h.offset, len: h.frag_len }]);
                        self.ok(peer, rail, ah, &ap);
                    }
                    _ => {}
                }
            }
        }
        assert_eq!(self.sends.remove(&a), Some(Ok(())));
        assert_eq!(self.sends.remove(&b), Some(Ok(())));
        assert!(got[&1] == small[..] && got[&2] == large[..], "our data went out intact");
        assert_eq!(self.core.unacked_messages(), 0, "everything acknowledged and released");
    }
}

// ----- data for messages that do not exist (yet) -----

#[test]
fn data_for_a_message_never_announced() {
    let mut h = Harness::new();
    h.refused(1, 0, data(0, 7, 1000, 0, 1000), &[1; 1000], ProtocolError::UnannouncedData { seq: 0 });
    h.still_serving(0, 1, 0);
}

#[test]
fn data_before_cts_was_sent() {
    let mut h = Harness::new();
    let total = 100_000u64;
    h.ok(1, 0, rts(0, 7, total), &[]);
    // Announced, but we have not matched it (no CTS yet): no data allowed.
    h.refused(1, 0, data(0, 7, total, 0, 1000), &[1; 1000], ProtocolError::UnannouncedData { seq: 0 });
    // The announcement survives: once a receive matches, the CTS goes out
    // on a live rail and the data is accepted there.
    let req = h.irecv(Some(1), Some(7), total as usize);
    let tx = h.drain_tx(1);
    let (rail, _) = tx.iter().find(|(_, t)| t.header.op == Op::Cts && t.header.seq == 0).expect("a CTS for message 0");
    let rail = *rail;
    assert_ne!(rail, 0, "not on the closed rail");
    let p = pattern(7, total as usize);
    h.ok(1, rail, data(0, 7, total, 0, 60_000), &p[..60_000]);
    h.ok(1, rail, data(0, 7, total, 60_000, 40_000), &p[60_000..]);
    let (st, got) = h.recv_done(req).expect("rendezvous message delivered");
    assert_eq!(st.len, total);
    assert!(got == p);
    h.still_serving(1, 1, 0);
}

// ----- fragments that disagree with each other -----

#[test]
fn fragment_with_another_tag() {
    let mut h = Harness::new();
    let p = pattern(3, 200);
    h.ok(1, 0, eager(0, 7, 200, 0, 100), &p[..100]);
    h.refused(1, 0, eager(0, 8, 200, 100, 100), &p[100..], ProtocolError::Inconsistent { seq: 0, what: "tag" });
    // The honest rest of the message completes it.
    h.ok(1, 1, eager(0, 7, 200, 100, 100), &p[100..]);
    h.expect_message(1, 7, &p);
    h.still_serving(1, 1, 0);
}

#[test]
fn fragment_with_another_total_length() {
    let mut h = Harness::new();
    let p = pattern(3, 200);
    h.ok(1, 0, eager(0, 7, 200, 0, 100), &p[..100]);
    h.refused(
        1,
        0,
        eager(0, 7, 300, 100, 100),
        &p[100..],
        ProtocolError::Inconsistent { seq: 0, what: "total length" },
    );
    h.ok(1, 1, eager(0, 7, 200, 100, 100), &p[100..]);
    h.expect_message(1, 7, &p);
    h.still_serving(1, 1, 0);
}

#[test]
fn rts_for_an_eager_message() {
    let mut h = Harness::new();
    let p = pattern(3, 200);
    h.ok(1, 0, eager(0, 7, 200, 0, 100), &p[..100]);
    h.refused(1, 0, rts(0, 7, 200), &[], ProtocolError::Inconsistent { seq: 0, what: "RTS for an eager message" });
    h.ok(1, 1, eager(0, 7, 200, 100, 100), &p[100..]);
    h.expect_message(1, 7, &p);
    h.still_serving(1, 1, 0);
}

#[test]
fn eager_fragment_for_a_rendezvous_message() {
    let mut h = Harness::new();
    h.ok(1, 0, rts(0, 7, 200), &[]);
    h.refused(
        1,
        0,
        eager(0, 7, 200, 0, 100),
        &[0; 100],
        ProtocolError::Inconsistent { seq: 0, what: "eager vs rendezvous" },
    );
    h.still_serving(1, 1, 0);
}

#[test]
fn fragment_overlapping_part_of_an_earlier_one() {
    let mut h = Harness::new();
    let p = pattern(3, 200);
    h.ok(1, 0, eager(0, 7, 200, 0, 100), &p[..100]);
    h.refused(
        1,
        0,
        eager(0, 7, 200, 50, 100),
        &p[50..150],
        ProtocolError::Inconsistent { seq: 0, what: "fragment overlaps an earlier one" },
    );
    h.ok(1, 1, eager(0, 7, 200, 100, 100), &p[100..]);
    h.expect_message(1, 7, &p);
    h.still_serving(1, 1, 0);
}

// ----- duplicates -----

#[test]
fn conflicting_duplicate_in_an_unexpected_buffer() {
    let mut h = Harness::new();
    let p = pattern(3, 200);
    h.ok(1, 0, eager(0, 7, 200, 0, 100), &p[..100]);
    let mut other = p[..100].to_vec();
    other[42] ^= 1;
    h.refused(1, 0, eager(0, 7, 200, 0, 100), &other, ProtocolError::ConflictingDuplicate { seq: 0, offset: 0 });
    // The first copy stands.
    h.ok(1, 1, eager(0, 7, 200, 100, 100), &p[100..]);
    h.expect_message(1, 7, &p);
    h.still_serving(1, 1, 0);
}

#[test]
fn conflicting_duplicate_in_a_posted_rendezvous_buffer() {
    let mut h = Harness::new();
    let total = 10_000u64;
    let req = h.irecv(Some(1), Some(7), total as usize);
    h.ok(1, 0, rts(0, 7, total), &[]);
    assert!(h.drain_tx(1).iter().any(|(_, t)| t.header.op == Op::Cts), "CTS sent");
    let p = pattern(4, total as usize);
    h.ok(1, 0, data(0, 7, total, 0, 4000), &p[..4000]);
    let mut other = p[..4000].to_vec();
    other[3999] ^= 0x80;
    h.refused(1, 0, data(0, 7, total, 0, 4000), &other, ProtocolError::ConflictingDuplicate { seq: 0, offset: 0 });
    assert!(h.recv_done(req).is_none());
    h.ok(1, 1, data(0, 7, total, 4000, 6000), &p[4000..]);
    let (_, got) = h.recv_done(req).expect("delivered");
    assert!(got == p, "the first copy stands");
    h.still_serving(1, 1, 0);
}

#[test]
fn exact_duplicates_are_dropped_acknowledged_and_delivered_once() {
    let mut h = Harness::new();
    let p = pattern(3, 200);
    h.ok(1, 0, eager(0, 7, 200, 0, 100), &p[..100]);
    h.ok(1, 1, eager(0, 7, 200, 0, 100), &p[..100]);
    h.ok(1, 0, eager(0, 7, 200, 100, 100), &p[100..]);
    h.ok(1, 2, eager(0, 7, 200, 100, 100), &p[100..]);
    assert_eq!(h.core.unexpected_bytes(1), 200 + MESSAGE_OVERHEAD, "charged once");
    h.expect_message(1, 7, &p);
    // A second receive for the same message finds nothing.
    let again = h.irecv(Some(1), Some(7), 200);
    // Duplicates of a delivered message are dropped too.
    h.ok(1, 2, eager(0, 7, 200, 0, 100), &p[..100]);
    h.ok(1, 0, eager(0, 7, 200, 0, 200), &p);
    assert!(h.recv_done(again).is_none(), "delivered exactly once");
    assert_eq!(h.core.unexpected_bytes(1), 0);
    // Every copy is acknowledged on the rail it came on.
    let later = h.now + Duration::from_millis(10);
    h.core.handle_timeout(later);
    let mut acked: HashMap<RailId, Vec<AckRange>> = HashMap::new();
    for (rail, t) in h.drain_tx(1) {
        if t.header.op == Op::Ack {
            acked.entry(rail).or_default().extend(AckRepr::parse(&t.payload, t.header.aux).unwrap().ranges);
        }
    }
    let covers = |rail: RailId, off: u64, len: u64| {
        acked
            .get(&rail)
            .is_some_and(|v| v.iter().any(|r| r.seq == 0 && r.offset <= off && r.offset + r.len as u64 >= off + len))
    };
    assert!(covers(0, 0, 100) && covers(1, 0, 100) && covers(0, 100, 100) && covers(2, 100, 100), "{acked:?}");
    assert!(covers(2, 0, 100) && covers(0, 0, 200), "duplicates after delivery acknowledged: {acked:?}");
    h.still_serving(1, 1, 0);
}

/// A rail went silent in the middle of a fragment, holding the piece of
/// the buffer it was reading into; the sender re-sent the fragment on
/// another rail. The copy is read (the silent rail's piece is given up):
/// the message completes at once, intact, and whatever the silent rail
/// hands back later, complete or not, is not used.
#[test]
fn a_copy_of_a_fragment_stuck_on_a_silent_rail_is_read_instead() {
    for stale_completes in [false, true] {
        let mut h = Harness::new();
        let p = pattern(9, 200);
        let first = eager(0, 7, 200, 0, 100);
        // Rail 0 starts reading fragment [0, 100) into the buffer, then
        // goes silent...
        let now = h.tick();
        let stale = h.core.on_header(1, 0, &first, now).unwrap();
        assert!(matches!(stale, PayloadDest::Lease(_)));
        // ... the sender re-sends it on rail 1, which reads it.
        let now = h.tick();
        let PayloadDest::Lease(mut l) = h.core.on_header(1, 1, &first, now).unwrap() else {
            panic!("the copy gets a piece of the buffer")
        };
        l.buf.copy_from_slice(&p[..100]);
        h.core.on_payload(1, 1, &first, PayloadDest::Lease(l), true, now).unwrap();
        h.ok(1, 1, eager(0, 7, 200, 100, 100), &p[100..]);
        let req = h.irecv(Some(1), Some(7), 200);
        let (_, got) = h.recv_done(req).expect("complete without the silent rail");
        assert!(got == p);
        // The silent rail wakes up: its bytes (garbage here) are ignored.
        let now = h.tick();
        let stale = match stale {
            PayloadDest::Lease(mut l) => {
                l.buf.fill(0xee);
                PayloadDest::Lease(l)
            }
            other => other,
        };
        h.core.on_payload(1, 0, &first, stale, stale_completes, now).unwrap();
        h.collect();
        assert!(h.rail_downs.is_empty(), "nothing wrong with either rail");
        h.still_serving(1, 1, 0);
    }
}

/// The other order: the copy's read is the one that fails. The message
/// must not complete from bytes that never arrived; the next copy does it.
#[test]
fn a_copy_whose_read_fails_is_not_counted_as_received() {
    let mut h = Harness::new();
    let p = pattern(9, 200);
    let first = eager(0, 7, 200, 0, 100);
    let now = h.tick();
    let stuck = h.core.on_header(1, 0, &first, now).unwrap();
    let now = h.tick();
    let copy = h.core.on_header(1, 1, &first, now).unwrap();
    h.ok(1, 2, eager(0, 7, 200, 100, 100), &p[100..]);
    // Rail 1 dies mid-payload, then rail 0 too.
    h.core.on_payload(1, 1, &first, copy, false, now).unwrap();
    h.core.on_payload(1, 0, &first, stuck, false, now).unwrap();
    h.core.rail_down(1, 0, "connection reset", now);
    h.core.rail_down(1, 1, "connection reset", now);
    h.collect();
    let req = h.irecv(Some(1), Some(7), 200);
    assert!(h.recv_done(req).is_none(), "not complete: [0, 100) never arrived");
    h.ok(1, 2, first, &p[..100]);
    let (_, got) = h.recv_done(req).expect("delivered after the re-send");
    assert!(got == p);
}

// ----- flow control -----

#[test]
fn eager_flood_beyond_the_granted_credit() {
    let mut h = Harness::new();
    let len = 1000u64;
    let cost = len + MESSAGE_OVERHEAD;
    let fit = LIMIT / cost;
    let mut sent = Vec::new();
    for seq in 0..fit {
        sent.push(h.good_eager(1, 0, seq, seq, len as usize));
        assert!(h.core.unexpected_bytes(1) <= LIMIT);
    }
    assert_eq!(h.core.unexpected_bytes(1), fit * cost);
    h.refused(
        1,
        0,
        eager(fit, fit, len, 0, len as u32),
        &pattern(0, len as usize),
        ProtocolError::CreditExceeded { used: fit * cost, cost, limit: LIMIT },
    );
    assert_eq!(h.core.unexpected_bytes(1), fit * cost, "the refused message holds nothing");
    // Peer 1's overdraft costs peer 2 nothing.
    let p = h.good_eager(2, 0, 0, GOOD_TAG, 1000);
    h.expect_message(2, GOOD_TAG, &p);
    // Receiving frees the credit; everything buffered arrives intact.
    for (seq, p) in sent.iter().enumerate() {
        h.expect_message(1, seq as u64, p);
    }
    assert_eq!(h.core.unexpected_bytes(1), 0);
    h.still_serving(fit, 1, 1);
}

/// An honest sender (a second core, through the simulator) with far more
/// to send than the receiver's credit: it waits instead of overdrawing,
/// and the receiver never holds more than it granted.
#[test]
fn honest_sender_waits_for_credit() {
    let rails = [LinkSpec::gbit(10.0, 5), LinkSpec::gbit(10.0, 20)];
    let mut sim = Sim::new(2, &rails, cfg());
    // More messages than eager credit plus RTS credits cover.
    let n = (LIMIT / 1064 + RTS_CREDITS + 800) as usize;
    let sizes: Vec<usize> = (0..n).map(|i| [1000, 1, 0, 5000, 16 << 10][i % 5]).collect();
    let sends: Vec<ReqId> =
        sizes.iter().enumerate().map(|(i, &s)| sim.isend(0, 1, i as u64, Bytes::from(pattern(i as u64, s)))).collect();
    let bounded = |sim: &Sim| {
        assert!(
            sim.nodes[1].unexpected_bytes(0) <= LIMIT,
            "receiver holds {} > {LIMIT}",
            sim.nodes[1].unexpected_bytes(0)
        );
        assert!(sim.errors.is_empty(), "{:?}", sim.errors);
    };
    // Nothing is received for a while: the sender must stall, not overdraw.
    let end = sim.now + Duration::from_secs(2);
    while sim.now < end {
        bounded(&sim);
        assert!(sim.step(), "credit-blocked senders keep probing");
    }
    // Stalled: the tail waits at the sender.
    assert!(sim.nodes[0].pending_sends() > 0);
    assert!(!sim.is_done(0, *sends.last().unwrap()), "the last message waits for credit");
    // Receive everything, in order, checking memory at every step.
    let recvs: Vec<ReqId> = sizes.iter().map(|&s| sim.irecv(1, Some(0), None, s)).collect();
    let mut steps = 0;
    while !recvs.iter().all(|r| sim.is_done(1, *r)) {
        bounded(&sim);
        assert!(sim.step(), "stalled before every message arrived");
        steps += 1;
        assert!(steps < 5_000_000, "not done after {steps} steps");
    }
    for (i, r) in recvs.iter().enumerate() {
        match sim.take(1, *r) {
            Some(Done::Recv(Ok(st), buf)) => {
                assert_eq!((st.tag, st.len as usize), (i as u64, sizes[i]), "message {i} in order");
                assert!(buf[..sizes[i]] == pattern(i as u64, sizes[i])[..], "payload {i}");
            }
            other => panic!("receive {i}: {other:?}"),
        }
    }
    assert!(sim.run_until(Duration::from_secs(5), |s| sends.iter().all(|r| s.is_done(0, *r))));
    assert!(sim.errors.is_empty(), "{:?}", sim.errors);
    assert_eq!(sim.nodes[1].unexpected_bytes(0), 0);
}

#[test]
fn rts_beyond_the_rts_credit() {
    let mut h = Harness::new();
    for seq in 0..RTS_CREDITS {
        h.ok(1, 0, rts(seq, 7, 1 << 20), &[]);
    }
    h.refused(1, 0, rts(RTS_CREDITS, 7, 1 << 20), &[], ProtocolError::RtsCreditExceeded { limit: RTS_CREDITS });
    h.still_serving(RTS_CREDITS, 1, 0);
    // A receive matching one announcement frees one RTS credit.
    let _r = h.irecv(Some(1), Some(7), 1 << 20);
    h.ok(1, 1, rts(RTS_CREDITS + 1, 7, 1 << 20), &[]);
    h.refused(1, 1, rts(RTS_CREDITS + 2, 7, 1 << 20), &[], ProtocolError::RtsCreditExceeded { limit: RTS_CREDITS });
    h.still_serving(RTS_CREDITS + 2, 2, 1);
}

#[test]
fn eager_message_larger_than_the_unexpected_limit() {
    let mut h = Harness::new();
    h.refused(
        1,
        0,
        eager(0, 7, LIMIT + 1, 0, 1000),
        &[0; 1000],
        ProtocolError::EagerTooLong { len: LIMIT + 1, limit: LIMIT },
    );
    // One that fits the whole credit exactly is fine.
    let fits = (LIMIT - MESSAGE_OVERHEAD) as usize;
    let p = h.good_eager(1, 1, 0, 7, fits);
    assert_eq!(h.core.unexpected_bytes(1), LIMIT);
    h.expect_message(1, 7, &p);
    // The whole limit plus bookkeeping is not.
    h.refused(
        1,
        1,
        eager(1, 7, LIMIT, 0, 1000),
        &[0; 1000],
        ProtocolError::CreditExceeded { used: 0, cost: LIMIT + MESSAGE_OVERHEAD, limit: LIMIT },
    );
    h.still_serving(1, 2, 0);
}

// ----- sequence numbers -----

#[test]
fn seq_far_beyond_the_window() {
    let mut h = Harness::new();
    let out = |seq| ProtocolError::SeqOutOfWindow { seq, next: 0, window: SEQ_WINDOW };
    h.refused(1, 0, eager(SEQ_WINDOW, 7, 10, 0, 10), &[0; 10], out(SEQ_WINDOW));
    h.refused(1, 1, rts(SEQ_WINDOW + 12_345, 7, 1 << 20), &[], out(SEQ_WINDOW + 12_345));
    // The last seq inside the window is accepted (and waits its turn).
    h.ok(1, 2, eager(SEQ_WINDOW - 1, 7, 10, 0, 10), &[0; 10]);
    h.still_serving(0, 2, 0);
}

/// Regression: seq = u64::MAX overflowed (`seq + 1`) in the receive path.
#[test]
fn seq_u64_max_in_every_op() {
    let mut h = Harness::with(cfg(), 6);
    let max = u64::MAX;
    let out = ProtocolError::SeqOutOfWindow { seq: max, next: 0, window: SEQ_WINDOW };
    h.refused(1, 0, eager(max, 7, 10, 0, 10), &[0; 10], out.clone());
    h.refused(1, 1, rts(max, 7, 10), &[], out);
    h.refused(1, 2, data(max, 7, 10, 0, 10), &[0; 10], ProtocolError::UnannouncedData { seq: max });
    h.refused(1, 3, cts(max, 7, 10), &[], ProtocolError::UnknownMessage { op: Op::Cts, seq: max });
    let (ah, ap) = ack(&[AckRange { seq: max, offset: 0, len: 10 }]);
    h.refused(1, 4, ah, &ap, ProtocolError::BogusAck { seq: max });
    h.still_serving(0, 5, 0);
    h.sends_still_work(1);
}

// ----- the send side: CTS and ACK from a peer that makes things up -----

#[test]
fn cts_for_a_message_never_sent() {
    let mut h = Harness::new();
    h.refused(1, 0, cts(0, 7, 1 << 20), &[], ProtocolError::UnknownMessage { op: Op::Cts, seq: 0 });
    // A CTS for a message we did send but that is not waiting for one
    // (eager, or already cleared) is a harmless duplicate: ignored.
    let now = h.tick();
    h.core.isend(1, 7, Bytes::from_static(b"small"), now);
    h.ok(1, 1, cts(0, 7, 5), &[]);
    h.refused(1, 1, cts(1, 7, 5), &[], ProtocolError::UnknownMessage { op: Op::Cts, seq: 1 });
    h.sends_still_work(1);
    h.still_serving(0, 2, 0);
}

#[test]
fn ack_for_a_message_never_sent() {
    let mut h = Harness::new();
    let (ah, ap) = ack(&[AckRange { seq: 0, offset: 0, len: 100 }]);
    h.refused(1, 0, ah, &ap, ProtocolError::BogusAck { seq: 0 });
    // Ranges of a real message that match no fragment are ignored.
    h.sends_still_work(1);
    let (ah, ap) = ack(&[AckRange { seq: 1, offset: 7, len: 3 }, AckRange { seq: 0, offset: 1 << 40, len: 1 }]);
    h.ok(1, 1, ah, &ap);
    let (ah, ap) = ack(&[AckRange { seq: 0, offset: 0, len: 1 }, AckRange { seq: 2, offset: 0, len: 1 }]);
    h.refused(1, 1, ah, &ap, ProtocolError::BogusAck { seq: 2 });
    h.sends_still_work(1);
    h.still_serving(0, 2, 0);
}

#[test]
fn ack_with_a_malformed_range() {
    let mut h = Harness::new();
    let (ah, mut ap) = ack(&[AckRange { seq: 0, offset: 0, len: 1 }]);
    ap[20] = 1; // reserved must be zero
    h.refused(1, 0, ah, &ap, ProtocolError::Wire(WireError::BadField { field: "ack.reserved", value: 1 }));
    h.still_serving(0, 1, 0);
    h.sends_still_work(1);
}

// ----- integrity -----

#[test]
fn checksum_mismatch() {
    let mut h = Harness::new();
    let p = pattern(5, 300);
    let mut bad = eager(0, 7, 300, 0, 300);
    bad.flags = Flags::CHECKSUM;
    bad.checksum = payload_checksum(&p) ^ 1;
    h.refused(1, 0, bad, &p, ProtocolError::Checksum { seq: 0, offset: 0 });
    // Nothing of the bad frame counts: the honest copy completes it.
    let mut good = eager(0, 7, 300, 0, 300);
    good.flags = Flags::CHECKSUM;
    good.checksum = payload_checksum(&p);
    h.ok(1, 1, good, &p);
    h.expect_message(1, 7, &p);
    // Corrupted bytes with a matching sum of the original are refused too.
    let mut corrupted = pattern(6, 300);
    let mut g2 = eager(1, 8, 300, 0, 300);
    g2.flags = Flags::CHECKSUM;
    g2.checksum = payload_checksum(&corrupted);
    corrupted[0] ^= 0xff;
    h.refused(1, 1, g2, &corrupted, ProtocolError::Checksum { seq: 1, offset: 0 });
    // Its header announced message 1; the honest copy completes it.
    corrupted[0] ^= 0xff;
    h.ok(1, 2, g2, &corrupted);
    h.expect_message(1, 8, &corrupted);
    h.still_serving(2, 2, 0);
}

// ----- malformed headers (what wire/frame.rs does not test already) -----

fn parse(h: &FrameHeader) -> Result<FrameHeader, WireError> {
    FrameHeader::parse(&h.to_bytes(), &Limits::default())
}

#[test]
fn header_every_unknown_op_is_refused() {
    let mut b = FrameHeader::new(Op::Heartbeat).to_bytes();
    for op in (0u8..=255).filter(|o| !(1..=7).contains(o)) {
        b[1] = op;
        assert_eq!(FrameHeader::parse(&b, &Limits::default()), Err(WireError::UnknownOp(op)));
    }
}

#[test]
fn header_impossible_lengths_in_data_frames() {
    let lim = Limits::default();
    // offset + len overflowing u64, in a DATA frame.
    let h = data(0, 0, 100, u64::MAX - 5, 10);
    assert!(matches!(parse(&h), Err(WireError::FragmentOutside { .. })));
    // Messages over max_message, for EAGER and DATA.
    for op in [Op::Eager, Op::Data] {
        let h = hdr(op, 0, 0, lim.max_message + 1, 0, 10);
        assert_eq!(parse(&h), Err(WireError::MessageTooLong { total: lim.max_message + 1, max: lim.max_message }));
        assert!(parse(&hdr(op, 0, 0, lim.max_message, lim.max_message - 10, 10)).is_ok(), "boundary accepted");
    }
    // A frame of u32::MAX bytes, and the boundary.
    assert_eq!(
        parse(&eager(0, 0, 1 << 33, 0, u32::MAX)),
        Err(WireError::FrameTooLong { len: u32::MAX, max: lim.max_frame })
    );
    assert!(parse(&eager(0, 0, 1 << 33, 0, lim.max_frame)).is_ok());
    assert!(parse(&eager(0, 0, 1 << 33, 0, lim.max_frame + 1)).is_err());
    // An ACK claiming u32::MAX ranges without the payload for them.
    let mut h = FrameHeader::new(Op::Ack);
    h.aux = u32::MAX;
    assert!(matches!(parse(&h), Err(WireError::BadField { field: "aux", .. })));
}

#[test]
fn header_control_frames_carry_no_payload_or_checksum() {
    for op in [Op::Rts, Op::Cts, Op::Heartbeat, Op::Close] {
        let h = hdr(op, 0, 0, 0, 0, 8);
        assert_eq!(parse(&h), Err(WireError::UnexpectedPayload { op, len: 8 }), "{op:?}");
    }
    for op in [Op::Rts, Op::Cts, Op::Heartbeat, Op::Close, Op::Ack] {
        let mut h = FrameHeader::new(op);
        h.flags = Flags::CHECKSUM;
        assert_eq!(parse(&h), Err(WireError::UnknownFlags(Flags::CHECKSUM.0)), "{op:?}");
    }
}

// ----- a peer that acknowledges early, re-sends RTS forever, or never reads -----

#[test]
fn ack_for_data_not_yet_written_still_completes_the_send() {
    let mut h = Harness::new();
    let now = h.tick();
    let req = h.core.isend(1, 5, Bytes::from(pattern(5, 1000)), now);
    h.collect();
    // The peer acknowledges message 0 before we wrote a byte of it.
    let (ah, ap) = ack(&[AckRange { seq: 0, offset: 0, len: 1000 }]);
    h.ok(1, 0, ah, &ap);
    h.drain_tx(1);
    assert_eq!(h.sends.remove(&req), Some(Ok(())), "the send completes instead of hanging");
    assert_eq!(h.core.unacked_messages(), 0);
}

#[test]
fn duplicate_rts_flood_queues_a_bounded_number_of_cts() {
    let mut h = Harness::new();
    let req = h.irecv(Some(1), Some(9), 100_000);
    h.ok(1, 0, rts(0, 9, 100_000), &[]);
    for _ in 0..10_000 {
        h.ok(1, 0, rts(0, 9, 100_000), &[]);
    }
    let ctses = h.drain_tx(1).iter().filter(|(_, t)| t.header.op == Op::Cts).count();
    assert!(ctses <= 17, "{ctses} CTS queued for one message");
    assert!(!h.recvs.contains_key(&req), "still waiting for the data");
    h.still_serving(1, 1, 0);
}

#[test]
fn peer_that_never_reads_its_acknowledgements_is_cut_off() {
    let mut h = Harness::new();
    // Tiny eager messages, each acknowledged on rail 0; we never hand the
    // ACK frames to the (stalled) connection.
    let mut refused = None;
    for seq in 0..2_000_000u64 {
        let p = pattern(seq, 1);
        match h.frame(1, 0, eager(seq, 3, 1, 0, 1), &p) {
            Ok(()) => {
                let req = h.irecv(Some(1), Some(3), 1);
                assert!(h.recvs.remove(&req).is_some());
            }
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    assert!(matches!(refused, Some(ProtocolError::ControlBacklog { .. })), "{refused:?}");
}
