//! Frame encoding round trips, garbage is rejected without a panic, and a
//! core fed arbitrary (decodable) frames never panics.

use std::time::Duration;

use bytes::Bytes;
use multirail_group::{
    DecodeError, Effect, Frame, GroupConfig, GroupCore, Mode, Proposal, Row, SendError, Senders, WIRE_VERSION,
};
use proptest::prelude::*;

fn proposal() -> impl Strategy<Value = Option<Proposal>> {
    proptest::option::of(
        (0u64..4, proptest::collection::vec(0u64..20, 0..5), proptest::collection::vec(0u32..6, 0..6))
            .prop_map(|(view, trim, members)| Proposal { view, trim, members }),
    )
}

fn row() -> impl Strategy<Value = Row> {
    (
        (0u64..4, 0u64..50, 0u64..50),
        proptest::collection::vec(0u64..20, 0..5),
        (0u64..60, 0u64..60),
        proptest::collection::vec(0u64..20, 0..5),
        any::<bool>(),
        proptest::collection::vec(0u32..6, 0..3),
        proposal(),
        proposal(),
    )
        .prop_map(
            |(
                (view, version, heartbeat),
                num_received,
                (seq_num, delivered),
                delivered_from,
                wedged,
                suspected,
                proposal,
                installed_from,
            )| Row {
                view,
                version,
                heartbeat,
                num_received,
                seq_num,
                delivered,
                delivered_from,
                wedged,
                suspected,
                proposal,
                installed_from,
            },
        )
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (0u64..4, 0u32..6, 0u64..20, proptest::collection::vec(any::<u8>(), 0..64), any::<bool>()).prop_map(
            |(view, sender, index, p, relay)| Frame::Data { view, sender, index, payload: Bytes::from(p), relay }
        ),
        (0u64..4, 0u32..6, 0u64..20, 0u32..32, proptest::collection::vec(any::<u8>(), 1..32), 0u32..8, any::<bool>())
            .prop_map(|(view, sender, index, offset, p, extra, relay)| Frame::Chunk {
                view,
                sender,
                index,
                total: offset + p.len() as u32 + extra,
                offset,
                bytes: Bytes::from(p),
                relay
            }),
        (0u64..4, 0u32..6, 0u64..20, 1u64..10)
            .prop_map(|(view, sender, first, count)| { Frame::Null { view, sender, first, count } }),
        row().prop_map(Frame::Row),
    ]
}

proptest! {
    #[test]
    fn round_trip(f in frame()) {
        let b = f.encode();
        prop_assert_eq!(b[0], WIRE_VERSION);
        prop_assert_eq!(Frame::decode(&b), Ok(f));
    }

    /// A data frame or chunk split in head and payload joins back into
    /// itself, its payload the very bytes given (no copy); the head alone
    /// is not a frame, and a payload of another length is refused.
    #[test]
    fn split_round_trip(f in frame(), extra in 1usize..4) {
        let Some((head, payload)) = f.encode_head() else {
            let control = matches!(f, Frame::Null { .. } | Frame::Row(_));
            prop_assert!(control, "only data frames and chunks split");
            return Ok(());
        };
        prop_assert!(Frame::is_head(&head));
        prop_assert!(!Frame::is_head(&f.encode()));
        prop_assert!(Frame::decode(&head).is_err());
        let joined = Frame::decode_split(&head, payload.clone());
        prop_assert_eq!(joined.as_ref(), Ok(&f));
        if let Ok(Frame::Data { payload: p, .. } | Frame::Chunk { bytes: p, .. }) = &joined {
            prop_assert_eq!(p.as_ptr(), payload.as_ptr(), "the payload is kept, not copied");
        }
        let mut longer = payload.to_vec();
        longer.extend(std::iter::repeat_n(0u8, extra));
        prop_assert!(Frame::decode_split(&head, Bytes::from(longer)).is_err());
        if !payload.is_empty() {
            prop_assert!(Frame::decode_split(&head, payload.slice(1..)).is_err());
        }
        prop_assert!(Frame::decode_split(&f.encode(), payload).is_err(), "a whole frame is not a head");
    }

    #[test]
    fn mutated_heads_never_panic(f in frame(), at in 0usize..100, byte in any::<u8>(), len in 0usize..64) {
        if let Some((head, _)) = f.encode_head() {
            let mut v = head.to_vec();
            let at = at % v.len();
            v[at] = byte;
            let _ = Frame::decode_split(&Bytes::from(v), Bytes::from(vec![0u8; len]));
        }
    }

    #[test]
    fn garbage_never_panics(v in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = Frame::decode(&Bytes::from(v));
    }

    #[test]
    fn truncated_or_extended_is_rejected(f in frame(), cut in 0usize..1000, extra in 1usize..4) {
        let b = f.encode();
        let cut = cut % b.len();
        prop_assert!(Frame::decode(&b.slice(..cut)).is_err());
        let mut longer = b.to_vec();
        longer.extend(std::iter::repeat_n(0u8, extra));
        prop_assert!(Frame::decode(&Bytes::from(longer)).is_err());
    }

    #[test]
    fn mutated_frames_never_panic(f in frame(), at in 0usize..1000, byte in any::<u8>()) {
        let mut v = f.encode().to_vec();
        let at = at % v.len();
        v[at] = byte;
        let _ = Frame::decode(&Bytes::from(v));
    }

    /// Members are trusted (no Byzantine tolerance), but a core fed
    /// nonsense from them must not panic.
    #[test]
    fn core_survives_arbitrary_frames(
        n in 2u32..6,
        ordered in any::<bool>(),
        inputs in proptest::collection::vec((0u32..6, frame(), 0u8..8), 0..80),
    ) {
        let mut cfg = GroupConfig::new(n, 0);
        cfg.window = 3;
        cfg.mode = if ordered { Mode::Ordered } else { Mode::Unordered };
        cfg.failure_timeout = Duration::from_millis(30);
        let mut g = GroupCore::new(cfg).unwrap();
        let mut t = 0u64;
        for (from, f, op) in inputs {
            match op {
                0 => {
                    let _ = g.send(Bytes::from_static(b"x"));
                }
                1 => {
                    t += 7;
                    g.on_tick(Duration::from_millis(t));
                }
                2 => g.on_peer_lost(from),
                _ => g.on_message(from, f),
            }
            for e in g.drain_effects() {
                if let Effect::Deliver { payload, .. } = e {
                    prop_assert!(payload.len() <= 71);
                }
            }
        }
    }
}

#[test]
fn unknown_version_and_tag() {
    assert_eq!(Frame::decode(&Bytes::from_static(&[9, 1])), Err(DecodeError::Version(9)));
    assert_eq!(Frame::decode(&Bytes::from_static(&[WIRE_VERSION, 77])), Err(DecodeError::Tag(77)));
    assert_eq!(Frame::decode(&Bytes::new()), Err(DecodeError::Short));
    // A list length far beyond the input is refused before allocating.
    let mut v = vec![WIRE_VERSION, 3];
    v.extend_from_slice(&[0; 24]);
    v.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(Frame::decode(&Bytes::from(v)).is_err());
}

/// A chunk must lie inside its message and carry at least one byte.
#[test]
fn chunks_outside_their_message_are_refused() {
    let chunk = |total, offset, bytes: &'static [u8]| {
        Frame::Chunk { view: 0, sender: 1, index: 2, total, offset, bytes: Bytes::from_static(bytes), relay: true }
            .encode()
    };
    assert!(Frame::decode(&chunk(6, 3, b"abc")).is_ok());
    assert_eq!(Frame::decode(&chunk(6, 4, b"abc")), Err(DecodeError::Invalid("chunk outside its message")));
    assert_eq!(Frame::decode(&chunk(u32::MAX, u32::MAX, b"a")), Err(DecodeError::Invalid("chunk outside its message")));
    assert_eq!(Frame::decode(&chunk(6, 0, b"")), Err(DecodeError::Invalid("chunk outside its message")));
}

/// Two members, member 1 the only sender: its messages are delivered at
/// both once both hold them, never before; the window refuses the
/// `window + 1`-th undelivered message.
#[test]
fn two_members_by_hand() {
    let mk = |me| {
        let mut c = GroupConfig::new(2, me);
        c.senders = Senders::One(1);
        c.window = 2;
        GroupCore::new(c).unwrap()
    };
    let (mut a, mut b) = (mk(0), mk(1));
    assert_eq!(a.send(Bytes::from_static(b"no")), Err(SendError::NotASender));
    assert_eq!(b.send(Bytes::from_static(b"m0")), Ok(0));
    assert_eq!(b.send(Bytes::from_static(b"m1")), Ok(1));
    assert_eq!(b.send(Bytes::from_static(b"m2")), Err(SendError::WindowFull));
    // Exchange until quiet, by hand.
    let mut delivered: [Vec<Bytes>; 2] = [Vec::new(), Vec::new()];
    let mut to_a = Vec::new();
    let mut to_b = Vec::new();
    for e in b.drain_effects() {
        match e {
            Effect::Send { to: 0, frame } => to_a.push(frame),
            // b alone delivers nothing: a has not said it holds them.
            other => panic!("unexpected {other:?}"),
        }
    }
    for _ in 0..6 {
        for f in to_a.drain(..) {
            a.on_message(1, f);
        }
        for e in a.drain_effects() {
            match e {
                Effect::Send { frame, .. } => to_b.push(frame),
                Effect::Deliver { payload, .. } => delivered[0].push(payload),
                _ => {}
            }
        }
        for f in to_b.drain(..) {
            b.on_message(0, f);
        }
        for e in b.drain_effects() {
            match e {
                Effect::Send { frame, .. } => to_a.push(frame),
                Effect::Deliver { payload, .. } => delivered[1].push(payload),
                _ => {}
            }
        }
    }
    assert_eq!(delivered[0], vec![Bytes::from_static(b"m0"), Bytes::from_static(b"m1")]);
    assert_eq!(delivered[0], delivered[1]);
    assert_eq!(b.send(Bytes::from_static(b"m2")), Ok(2));
    assert_eq!(a.buffered_bytes(), 0);
}

#[test]
fn configs_are_checked() {
    use multirail_group::ConfigError;
    let mut c = GroupConfig::new(3, 3);
    assert_eq!(GroupCore::new(c.clone()).err(), Some(ConfigError::MeOutOfRange));
    c.me = 0;
    c.window = 0;
    assert_eq!(GroupCore::new(c.clone()).err(), Some(ConfigError::ZeroWindow));
    c.window = 1;
    c.senders = Senders::List(vec![0, 5]);
    assert_eq!(GroupCore::new(c.clone()).err(), Some(ConfigError::SenderOutOfRange(5)));
    assert_eq!(GroupCore::new(GroupConfig::new(0, 0)).err(), Some(ConfigError::NoMembers));
    // No senders at all is allowed: nothing is ever delivered.
    c.senders = Senders::List(vec![]);
    let mut g = GroupCore::new(c).unwrap();
    assert_eq!(g.send(Bytes::from_static(b"x")), Err(SendError::NotASender));
    assert!(g.drain_effects().iter().all(|e| matches!(e, Effect::Send { .. })));
}

/// A group of one delivers its own messages at once.
#[test]
fn group_of_one() {
    let mut g = GroupCore::new(GroupConfig::new(1, 0)).unwrap();
    for i in 0..40u8 {
        g.send(Bytes::from(vec![i])).unwrap();
        let d: Vec<_> = g.drain_effects();
        assert_eq!(d.len(), 1);
        assert!(matches!(&d[0], Effect::Deliver { index, .. } if *index == i as u64));
    }
    assert_eq!(g.buffered_bytes(), 0);
}

/// Member 0 of two, with a 1 s failure timeout; time in milliseconds.
fn lone_member_0() -> GroupCore {
    let mut cfg = GroupConfig::new(2, 0);
    cfg.failure_timeout = Duration::from_secs(1);
    GroupCore::new(cfg).unwrap()
}

fn wedged(g: &mut GroupCore) -> bool {
    g.drain_effects().iter().any(|e| matches!(e, Effect::Wedged { .. }))
}

/// Rows late behind large messages, while the channel hears the member:
/// not suspected until the rows are `ROWS_LATE_FACTOR` timeouts late.
#[test]
fn late_rows_from_a_member_the_channel_hears_are_tolerated() {
    let mut g = lone_member_0();
    g.on_tick(Duration::ZERO);
    let limit = 1000 * u64::from(multirail_group::ROWS_LATE_FACTOR);
    let mut t = 0;
    while t + 100 < limit {
        t += 100;
        g.on_alive(1);
        g.on_tick(Duration::from_millis(t));
        assert!(!wedged(&mut g) && g.suspected().next().is_none(), "suspected at {t} ms while heard");
    }
    g.on_alive(1);
    g.on_tick(Duration::from_millis(limit));
    assert!(wedged(&mut g), "rows {limit} ms late and still not suspected");
    assert_eq!(g.suspected().collect::<Vec<_>>(), vec![1]);
}

/// Neither rows nor anything else: suspected after the failure timeout,
/// as before; the channel falling silent after rows stopped counts from
/// its own last word.
#[test]
fn a_member_silent_on_the_channel_too_is_suspected_after_the_timeout() {
    let mut g = lone_member_0();
    g.on_tick(Duration::ZERO);
    g.on_tick(Duration::from_millis(999));
    assert!(!wedged(&mut g));
    g.on_tick(Duration::from_millis(1000));
    assert!(wedged(&mut g), "silent for the timeout and not suspected");

    let mut g = lone_member_0();
    g.on_tick(Duration::ZERO);
    g.on_alive(1);
    g.on_tick(Duration::from_millis(600));
    g.on_tick(Duration::from_millis(1500));
    assert!(!wedged(&mut g), "heard at 600 ms: not silent for 1 s at 1500 ms");
    g.on_tick(Duration::from_millis(1600));
    assert!(wedged(&mut g));
}

/// Ticks every 10 ms after `from` up to `to` ms, the channel hearing
/// `heard` before each; returns `to`.
fn tick_hearing(g: &mut GroupCore, from: u64, to: u64, heard: &[u32]) -> u64 {
    let mut t = from;
    while t < to {
        t += 10;
        for &j in heard {
            g.on_alive(j);
        }
        g.on_tick(Duration::from_millis(t));
    }
    t
}

/// Member 2 of three, 1 s failure timeout, every member heard at `t` ms.
fn member_2_of_3_heard_until(t: u64) -> GroupCore {
    let mut cfg = GroupConfig::new(3, 2);
    cfg.failure_timeout = Duration::from_secs(1);
    let mut g = GroupCore::new(cfg).unwrap();
    g.on_tick(Duration::ZERO);
    tick_hearing(&mut g, 0, t, &[0, 1]);
    g.drain_effects();
    g
}

fn row_of(version: u64, suspected: Vec<u32>) -> Frame {
    Frame::Row(Row {
        version,
        heartbeat: version,
        num_received: vec![0; 3],
        delivered_from: vec![0; 3],
        suspected,
        ..Row::default()
    })
}

/// A member cut off for half the failure timeout or more comes back with
/// rows that suspect the members it could not hear: those suspicions (of
/// us too) are not taken in for a failure timeout. One that stands is
/// taken in from its later rows.
#[test]
fn a_row_that_ends_a_silence_does_not_spread_its_suspicions() {
    let mut g = member_2_of_3_heard_until(1000);
    // 1 is silent from 1000 ms; 0 is heard on.
    let t = tick_hearing(&mut g, 1000, 1600, &[0]);
    // The channel hears 1 again (the data queued ahead of its rows), a
    // tick before its rows come.
    let t = tick_hearing(&mut g, t, t + 10, &[0, 1]);
    g.on_message(1, row_of(50, vec![0]));
    g.on_message(1, row_of(51, vec![0, 2]));
    g.on_alive(0);
    g.on_alive(1);
    g.on_tick(Duration::from_millis(t + 10));
    assert!(!g.is_stopped(), "stopped on a stale row that suspects it");
    assert!(!wedged(&mut g) && g.suspected().next().is_none(), "took in a stale suspicion");
    // It keeps suspecting 0 a failure timeout later, heard all along.
    tick_hearing(&mut g, t + 10, 2700, &[0, 1]);
    g.on_message(1, row_of(60, vec![0]));
    assert!(wedged(&mut g), "a suspicion that stands is taken in");
    assert_eq!(g.suspected().collect::<Vec<_>>(), vec![0]);
}

/// Without a silence before it, a row's suspicion is taken in at once.
#[test]
fn a_row_from_a_member_heard_all_along_spreads_its_suspicions_at_once() {
    let mut g = member_2_of_3_heard_until(1000);
    g.on_message(1, row_of(50, vec![0]));
    assert!(wedged(&mut g));
    assert_eq!(g.suspected().collect::<Vec<_>>(), vec![0]);
}

/// The same when the row ends the silence itself (nothing of 1 came
/// before it).
#[test]
fn a_row_that_ends_a_silence_itself_is_held_back_too() {
    let mut g = member_2_of_3_heard_until(1000);
    tick_hearing(&mut g, 1000, 1600, &[0]);
    g.on_message(1, row_of(50, vec![0, 2]));
    assert!(!g.is_stopped() && !wedged(&mut g) && g.suspected().next().is_none());
}

/// A tick long after the last one (this member was descheduled or
/// paused): everybody looks silent, but nobody is suspected before a turn
/// has read what came meanwhile; on the next tick a member still silent is.
#[test]
fn a_member_that_ran_late_itself_judges_only_after_reading_the_channel() {
    let mut g = member_2_of_3_heard_until(1000);
    g.on_tick(Duration::from_millis(2500));
    assert!(!wedged(&mut g), "suspected the others after its own pause");
    // The turn after the pause read frames from 0 only.
    g.on_alive(0);
    g.on_tick(Duration::from_millis(2505));
    assert!(wedged(&mut g), "1 was not heard after the pause either");
    assert_eq!(g.suspected().collect::<Vec<_>>(), vec![1]);
}
