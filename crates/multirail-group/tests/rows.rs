//! How many rows a message costs: deliveries alone push a row only once
//! some sender's count moved by a quarter of the window; the rest rides on
//! the next row pushed for another reason (at the latest the heartbeat).
//! Three members, member 0 sends, frames delivered turn by turn without
//! loss or delay, through their byte encoding.

use std::time::Duration;

use bytes::Bytes;
use multirail_group::{Effect, Frame, GroupConfig, GroupCore, Senders};

struct Group {
    cores: Vec<GroupCore>,
    /// Row frames each member sent.
    rows: Vec<u64>,
    /// Indices each member delivered.
    delivered: Vec<Vec<u64>>,
}

impl Group {
    fn new(window: u32) -> Group {
        let cores: Vec<GroupCore> = (0..3)
            .map(|me| {
                let cfg = GroupConfig { senders: Senders::One(0), window, ..GroupConfig::new(3, me) };
                GroupCore::new(cfg).unwrap()
            })
            .collect();
        let mut g = Group { cores, rows: vec![0; 3], delivered: vec![Vec::new(); 3] };
        g.tick(Duration::ZERO);
        g.rows = vec![0; 3];
        g
    }

    fn tick(&mut self, now: Duration) {
        for c in &mut self.cores {
            c.on_tick(now);
        }
        self.settle();
    }

    /// Turns until no frame is in flight: each member drains its effects,
    /// then every frame sent in that round arrives.
    fn settle(&mut self) {
        for _ in 0..100 {
            let mut flight = Vec::new();
            for (me, c) in self.cores.iter_mut().enumerate() {
                for e in c.drain_effects() {
                    match e {
                        Effect::Send { to, frame } => {
                            if matches!(frame, Frame::Row(_)) {
                                self.rows[me] += 1;
                            }
                            flight.push((to, me as u32, frame.encode()));
                        }
                        Effect::Deliver { index, .. } => self.delivered[me].push(index),
                        other => panic!("member {me}: unexpected {other:?}"),
                    }
                }
            }
            if flight.is_empty() {
                return;
            }
            for (to, from, bytes) in flight {
                self.cores[to as usize].on_message(from, Frame::decode(&bytes).unwrap());
            }
        }
        panic!("frames still in flight after 100 rounds");
    }

    fn send(&mut self) {
        self.cores[0].send(Bytes::from_static(b"0123456789")).unwrap();
    }
}

/// One message: the sender pushes one row (with the data), each member one
/// (once it holds it), each to the two others: six row frames. Pushing a
/// row for each delivery as well made it twelve.
#[test]
fn a_delivery_alone_pushes_no_row() {
    let mut g = Group::new(64);
    g.send();
    g.settle();
    assert_eq!(g.delivered, vec![vec![0]; 3]);
    assert_eq!(g.rows, vec![2, 2, 2]);
    // The sender keeps its message until the rows say it is delivered
    // everywhere: the counts go out with the next heartbeat.
    assert_eq!(g.cores[0].buffered_bytes(), 10);
    g.tick(Duration::from_millis(10));
    assert_eq!(g.cores[0].buffered_bytes(), 0);
}

/// A full window of 8 sent at once: each member holds all 8 in one turn
/// (one row), and delivers them in a later one. That delivery moved its
/// count by more than a quarter window, so it pushes a row of its own, and
/// the sender's window reopens without waiting for a heartbeat.
#[test]
fn a_quarter_window_of_deliveries_pushes_a_row() {
    let mut g = Group::new(8);
    for _ in 0..8 {
        g.send();
    }
    assert!(!g.cores[0].can_send());
    g.settle();
    for d in &g.delivered {
        assert_eq!(d, &(0..8).collect::<Vec<u64>>());
    }
    assert_eq!(g.rows, vec![4, 4, 4]);
    assert!(g.cores[0].can_send(), "the window stayed closed");
    assert_eq!(g.cores[0].buffered_bytes(), 0);
}

/// Messages one at a time: the deliveries of each ride on the row that
/// says the next one arrived, so a stream costs two rows per member and
/// message however long it is, and the window (8, shorter than the
/// stream) never closes.
#[test]
fn deliveries_ride_on_the_next_row() {
    let mut g = Group::new(8);
    for k in 1..=20u64 {
        g.send();
        g.settle();
        assert_eq!(g.rows, vec![2 * k; 3], "after message {k}");
        assert!(g.cores[0].can_send(), "window closed after message {k}");
    }
    for d in &g.delivered {
        assert_eq!(d, &(0..20).collect::<Vec<u64>>());
    }
}
