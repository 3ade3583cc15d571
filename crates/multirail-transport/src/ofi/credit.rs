//! Receive credits of an [`super::OfiStream`]: a sender never has more
//! messages on their way than its peer has receives posted for it.
//!
//! Why: through `tcp;ofi_rxm`, a send of at most rxm's eager limit (16 KiB by
//! default, 64 KiB in ranks the `multirail` command starts) completes as soon
//! as it leaves, whether or not the peer has a receive
//! posted for it. A message that finds none is buffered by the peer's rxm
//! as "unexpected", without bound: a sender faster than its reader grew the
//! reader's process to 7 GB. Larger sends wait for the receiver (rxm's
//! rendezvous), but cost a round trip each.
//!
//! How: each side starts with one credit per receive its peer posted before
//! saying "ready" (`SLOTS`). Posting a message (data, or only credits)
//! takes a credit. Every message starts with a [`HEADER`]: the receives
//! its sender has posted again since its previous message, which the peer
//! adds to its credits. Returns ride on data going the other way; when
//! none goes and half the slots ([`Credits::return_at`]) are owed, a
//! message carrying only the header returns them. Each side needs at
//! least 4 slots: with fewer, half the slots is 1, and two sides would
//! return each other's credit-only messages forever.
//!
//! No deadlock: the last credit is only spent by a message that returns at
//! least `return_at` credits. A side can only be stuck with its last
//! credit spent; the message that spent it gave the peer at least
//! `return_at` credits, so the peer can always post its own return (the
//! model test below runs random interleavings to the end).

/// Bytes in front of every message: credits returned (u32,
/// little-endian), then how many payloads the peer lent its sender has
/// read so far (u32, a running count that wraps; see
/// [`super::stream`]'s RMA section).
pub const HEADER: usize = 8;

/// Credits of one direction, both ends of it: what we may still post, and
/// what we owe the peer.
#[derive(Debug, Clone)]
pub struct Credits {
    /// Messages we may post before the peer returns credits.
    avail: u32,
    /// Receives we posted again since our last message (owed to the peer).
    owed: u32,
    /// Receives each side posts (the most credits anyone can hold).
    slots: u32,
}

impl Credits {
    /// Both sides posted `slots` receives before starting.
    pub fn new(slots: u32) -> Credits {
        assert!(slots >= 4, "credit flow control needs at least four receive slots");
        Credits { avail: slots, owed: 0, slots }
    }

    /// Owed credits that make a message worth sending for them alone.
    pub fn return_at(&self) -> u32 {
        self.slots / 2
    }

    /// Whether the next message may be posted: the last credit is kept for
    /// a message that returns at least [`Credits::return_at`].
    pub fn may_post(&self) -> bool {
        self.avail >= 2 || (self.avail == 1 && self.owed >= self.return_at())
    }

    /// What the next message's header returns.
    pub fn owed(&self) -> u32 {
        self.owed
    }

    /// A message was posted with [`Credits::owed`] in its header.
    pub fn posted(&mut self) {
        debug_assert!(self.may_post());
        self.avail -= 1;
        self.owed = 0;
    }

    /// A message from the peer returned `n` credits.
    pub fn returned(&mut self, n: u32) -> Result<(), String> {
        match self.avail.checked_add(n).filter(|&a| a <= self.slots) {
            Some(a) => {
                self.avail = a;
                Ok(())
            }
            None => Err(format!(
                "the peer returned {n} receive credits with {} of {} still unspent (protocol error)",
                self.avail, self.slots
            )),
        }
    }

    /// One of our receives for the peer was posted again.
    pub fn reposted(&mut self) {
        self.owed += 1;
    }

    /// Whether a message carrying only credits should go now (call when no
    /// data waits to be posted, which would carry them).
    pub fn wants_return(&self) -> bool {
        self.owed >= self.return_at() && self.may_post()
    }

    /// Messages we may still post (diagnostics and tests).
    pub fn available(&self) -> u32 {
        self.avail
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[test]
    fn the_last_credit_waits_for_a_return() {
        let mut c = Credits::new(4);
        for _ in 0..3 {
            assert!(c.may_post());
            c.posted();
        }
        assert_eq!(c.available(), 1);
        assert!(!c.may_post(), "data must not take the last credit");
        c.reposted();
        assert!(!c.may_post() && !c.wants_return());
        c.reposted();
        assert!(c.may_post() && c.wants_return(), "a return of half the slots may");
        assert_eq!(c.owed(), 2);
        c.posted();
        assert_eq!((c.available(), c.owed()), (0, 0));
        assert!(!c.may_post());
        c.returned(3).unwrap();
        assert_eq!(c.available(), 3);
    }

    #[test]
    fn more_credits_than_slots_are_a_protocol_error() {
        let mut c = Credits::new(16);
        c.posted();
        c.returned(1).unwrap();
        assert!(c.returned(1).unwrap_err().contains("protocol error"));
        assert!(c.returned(u32::MAX).is_err());
        assert_eq!(c.available(), 16);
    }

    /// One side of the model: credits, data waiting, and the peer's
    /// messages in its receive slots (not yet read).
    struct Side {
        credits: Credits,
        to_send: u32,
        unread: VecDeque<bool>,
        posted_recvs: u32,
        data_received: u32,
    }

    /// The peers' messages in flight: (credits returned, carries data).
    type Wire = VecDeque<(u32, bool)>;

    /// Action `a` is done by side `a % 2`: `a / 2` = 0 posts a message
    /// (data if any waits, else a return if one is due), 1 takes the
    /// peer's next message off the wire into a posted receive, 2 reads one
    /// received message (posting its receive again).
    fn step(sides: &mut [Side; 2], wires: &mut [Wire; 2], action: u8, slots: u32) -> bool {
        let (who, what) = ((action % 2) as usize, action / 2);
        let other = 1 - who;
        match what {
            0 => {
                let s = &mut sides[who];
                let data = s.to_send > 0;
                if !(data && s.credits.may_post() || !data && s.credits.wants_return()) {
                    return false;
                }
                let ret = s.credits.owed();
                s.credits.posted();
                s.to_send -= data as u32;
                wires[who].push_back((ret, data));
                true
            }
            1 => {
                // wires[other] carries other's messages to `who`.
                let Some((ret, data)) = wires[other].pop_front() else { return false };
                let s = &mut sides[who];
                assert!(s.posted_recvs > 0, "a message arrived with no receive posted for it");
                assert!(s.posted_recvs <= slots);
                s.posted_recvs -= 1;
                s.credits.returned(ret).unwrap();
                s.unread.push_back(data);
                true
            }
            _ => {
                let s = &mut sides[who];
                let Some(data) = s.unread.pop_front() else { return false };
                s.data_received += data as u32;
                s.posted_recvs += 1;
                s.credits.reposted();
                true
            }
        }
    }

    proptest! {
        /// Any interleaving: no message ever finds its receiver without a
        /// posted receive, and from any point a fair schedule delivers
        /// all the data (no deadlock).
        #[test]
        fn credits_never_overrun_receives_and_never_deadlock(
            slots in 4u32..20,
            a_data in 0u32..200,
            b_data in 0u32..200,
            actions in proptest::collection::vec(0u8..6, 0..2000),
        ) {
            let side = |n| Side {
                credits: Credits::new(slots), to_send: n, unread: VecDeque::new(),
                posted_recvs: slots, data_received: 0,
            };
            let mut sides = [side(a_data), side(b_data)];
            let mut wires: [Wire; 2] = [VecDeque::new(), VecDeque::new()];
            for a in actions {
                step(&mut sides, &mut wires, a, slots);
            }
            // Fair completion: every action in turn until none can run.
            let mut rounds = 0;
            loop {
                let mut any = false;
                for a in 0..6 {
                    any |= step(&mut sides, &mut wires, a, slots);
                }
                if !any { break; }
                rounds += 1;
                prop_assert!(rounds < 100_000, "no quiescence");
            }
            prop_assert_eq!(sides[1].data_received, a_data);
            prop_assert_eq!(sides[0].data_received, b_data);
            for (s, w) in sides.iter().zip(&wires) {
                prop_assert!(s.unread.is_empty() && w.is_empty());
            }
        }
    }
}
