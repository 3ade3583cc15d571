//! Which connections the core wants, and when to try them.
//!
//! Rails to a peer are opened on demand: when a message to the peer needs
//! them, when the peer connected one to us, or when a connection is lost
//! (a reconnection) or suspect for `replace_after` (a replacement: TCP
//! recovers from a long outage only after its own exponential backoff, a
//! fresh connection at once). The driver asks [`Core::poll_connect`] what
//! to open, opens it, and reports [`Core::rail_up`] or
//! [`Core::connect_failed`]. Nothing here does IO; the backoff is
//! arithmetic on the `now` the driver passes in.
//!
//! A peer is declared unreachable when every rail the core wanted was
//! refused (nothing listens there any more: the process is gone) and none
//! is up. Attempts that time out (a host or link that does not answer)
//! keep being retried; such a peer fails only by the peer timeout
//! (`liveness`).

use std::time::Duration;

use crate::time::Time;

use super::liveness::stuck_since;
use super::{Core, PeerId, RailId};

/// A rail that fails again within this time of coming up is flapping:
/// its retry delay keeps growing instead of starting over.
pub const STABLE: Duration = Duration::from_secs(2);

/// Connection bookkeeping of one rail.
#[derive(Debug, Clone)]
pub(crate) struct ConnPlan {
    /// The core wants this rail connected. Once wanted, a rail stays
    /// wanted (it is reconnected after failures) until the peer is gone.
    pub wanted: bool,
    /// The driver is running an attempt for it.
    pub connecting: bool,
    /// No attempt before this time.
    pub next_try: Time,
    /// When the running (or last) attempt started.
    pub attempt_at: Time,
    /// Wait before the next attempt after a failure (doubles to a max).
    pub delay: Duration,
    /// When the current connection came up.
    pub up_since: Option<Time>,
    /// The last attempt was refused (nothing listens at the peer's end).
    pub refused: bool,
    /// Why the last attempt failed, for error messages.
    pub last_error: Option<String>,
}

impl ConnPlan {
    pub fn new(first_delay: Duration) -> ConnPlan {
        ConnPlan {
            wanted: false,
            connecting: false,
            next_try: Time::ZERO,
            attempt_at: Time::ZERO,
            delay: first_delay,
            up_since: None,
            refused: false,
            last_error: None,
        }
    }
}

/// How a connection attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectFailure {
    /// Actively refused: nothing listens at the peer's address (its
    /// process is gone) or it refused our handshake for good.
    Refused,
    /// Timed out, unreachable, reset during the handshake, superseded by
    /// another connection...: worth trying again.
    Transient,
}

/// A connection the core asks the driver to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectRequest {
    pub peer: PeerId,
    pub rail: RailId,
    /// The rail is up but suspect: the new connection replaces the old.
    pub replace: bool,
}

impl Core {
    /// Marks rails to `peer` as wanted: `rails` = `None` for all of them.
    pub(crate) fn want_rails(&mut self, peer: PeerId, rail: Option<RailId>) {
        let Some(p) = self.peers.get_mut(&peer) else { return };
        for (i, r) in p.rails.iter_mut().enumerate() {
            if rail.is_none_or(|k| k == i) && !r.conn.wanted {
                r.conn.wanted = true;
                self.connect_dirty = true;
            }
        }
    }

    /// True if [`Core::poll_connect`] may have a request at `now` (cheap:
    /// for the driver's hot path).
    pub fn connect_due(&self, now: Time) -> bool {
        self.connect_dirty || self.connect_next.is_some_and(|t| t <= now)
    }

    /// The rail small messages to `peer` use (both sides pick the same).
    pub(crate) fn preferred_rail(&self, peer: PeerId) -> RailId {
        let n = self.rail_count(peer).max(1);
        (self.cfg.rank as usize + peer as usize) % n
    }

    /// Wants the rails a message of `len` bytes will use: one for a small
    /// message under `single`, or under `spread` while its rail has no
    /// backlog; all of them otherwise.
    pub(crate) fn want_for_message(&mut self, peer: PeerId, len: u64) {
        use crate::sched::{PolicyKind, SPREAD_BACKLOG};
        let kind = self.cfg.policy.lookup(len);
        let preferred = self.preferred_rail(peer);
        let backlog = self.peers.get(&peer).and_then(|p| p.rails.get(preferred)).map_or(0, |r| r.inflight);
        let one = len <= self.cfg.eager_limit
            && match kind {
                PolicyKind::Single => true,
                PolicyKind::Spread => backlog < SPREAD_BACKLOG,
                _ => false,
            };
        self.want_rails(peer, one.then_some(preferred));
    }

    /// The next connection to open now, if any; it counts as in progress
    /// until [`Core::rail_up`] or [`Core::connect_failed`].
    pub fn poll_connect(&mut self, now: Time) -> Option<ConnectRequest> {
        let (closing, replace_after) = (self.closing, self.cfg.replace_after);
        if closing || !self.connect_due(now) {
            return None;
        }
        let cfg = &self.cfg;
        for (peer, p) in self.peers.iter_mut() {
            if p.failed.is_some() || p.closed_by_peer {
                continue;
            }
            for rail in 0..p.rails.len() {
                let stuck = stuck_since(cfg, p, rail);
                let r = &mut p.rails[rail];
                let c = &mut r.conn;
                if !c.wanted || c.connecting || now < c.next_try {
                    continue;
                }
                let replace = match (r.up, stuck) {
                    (false, _) => false,
                    (true, Some(since)) if now.since(since) >= replace_after => true,
                    _ => continue,
                };
                c.connecting = true;
                c.attempt_at = now;
                return Some(ConnectRequest { peer, rail, replace });
            }
        }
        self.connect_dirty = false;
        self.connect_next = self.connect_deadline();
        None
    }

    /// When [`Core::poll_connect`] next has something (for the driver's
    /// sleep), if anything is pending.
    pub(crate) fn connect_deadline(&self) -> Option<Time> {
        if self.closing {
            return None;
        }
        let mut t: Option<Time> = None;
        for p in self.peers.values().filter(|p| p.failed.is_none() && !p.closed_by_peer) {
            for (rail, r) in p.rails.iter().enumerate().filter(|(_, r)| r.conn.wanted && !r.conn.connecting) {
                let at = match (r.up, stuck_since(&self.cfg, p, rail)) {
                    (false, _) => r.conn.next_try,
                    (true, Some(since)) => r.conn.next_try.max(since + self.cfg.replace_after),
                    (true, None) => continue,
                };
                t = Some(t.map_or(at, |x| x.min(at)));
            }
        }
        t
    }

    /// An attempt from [`Core::poll_connect`] failed. The rail is tried
    /// again after a growing delay; when every wanted rail to the peer was
    /// refused and none is up, the peer is unreachable and its operations
    /// fail.
    pub fn connect_failed(&mut self, peer: PeerId, rail: RailId, how: ConnectFailure, why: &str, now: Time) {
        self.active.insert(peer);
        self.connect_dirty = true;
        let max = self.cfg.connect_retry_max;
        let Some(p) = self.peers.get_mut(&peer) else { return };
        let Some(r) = p.rails.get_mut(rail) else { return };
        let c = &mut r.conn;
        c.connecting = false;
        // Counted from the start of the attempt: an attempt that timed out
        // already waited.
        c.next_try = now.max(c.attempt_at + c.delay);
        c.delay = (c.delay * 2).min(max);
        c.refused = how == ConnectFailure::Refused;
        c.last_error = Some(why.to_string());
        if !r.up && r.down_reason.is_none() {
            r.down_reason = Some(why.to_string());
        }
        // The rail small messages wanted cannot be had: want the others.
        if p.up_rails() == 0 {
            for r in p.rails.iter_mut() {
                r.conn.wanted = true;
            }
        }
        let all_refused = p.up_rails() == 0 && p.rails.iter().filter(|r| r.conn.wanted).all(|r| r.conn.refused);
        if all_refused && p.failed.is_none() {
            for r in p.rails.iter_mut() {
                if let Some(e) = &r.conn.last_error {
                    r.down_reason = Some(e.clone());
                }
            }
            self.fail_peer(peer);
        }
    }

    /// The driver knows the peer is gone (for example its process exited).
    pub fn peer_unreachable(&mut self, peer: PeerId, why: &str) {
        let Some(p) = self.peers.get_mut(&peer) else { return };
        if p.failed.is_some() {
            return;
        }
        for r in p.rails.iter_mut() {
            if r.down_reason.is_none() || r.up {
                r.down_reason = Some(why.to_string());
            }
        }
        self.fail_peer(peer);
    }

    /// Bookkeeping when a connection comes up.
    pub(crate) fn conn_up(&mut self, peer: PeerId, rail: RailId, now: Time) {
        self.connect_dirty = true;
        let first = self.cfg.connect_retry;
        let Some(r) = self.peers.get_mut(&peer).and_then(|p| p.rails.get_mut(rail)) else { return };
        let c = &mut r.conn;
        c.wanted = true;
        c.connecting = false;
        c.refused = false;
        c.last_error = None;
        // A replacement for a suspect rail is tried again `replace_after`
        // after the next suspicion, not at once.
        c.next_try = now;
        if c.up_since.is_none_or(|t| now.since(t) >= STABLE) {
            c.delay = first;
        }
        c.up_since = Some(now);
        r.stats.connects += 1;
    }

    /// Bookkeeping when a connection goes down: when to try again.
    pub(crate) fn conn_down(&mut self, peer: PeerId, rail: RailId, now: Time) {
        self.connect_dirty = true;
        let max = self.cfg.connect_retry_max;
        let Some(r) = self.peers.get_mut(&peer).and_then(|p| p.rails.get_mut(rail)) else { return };
        let c = &mut r.conn;
        // A rail that was stable is retried at once (a reset is often
        // transient, and a refusal tells fast that the peer is gone); one
        // that flaps waits, longer each time.
        let flapping = r.stats.connects > 1 && c.up_since.is_some_and(|t| now.since(t) < STABLE);
        if flapping {
            c.next_try = now + c.delay;
            c.delay = (c.delay * 2).min(max);
        } else {
            c.next_try = now;
        }
    }
}
