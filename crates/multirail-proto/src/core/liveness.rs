//! Finding dead links in tens of milliseconds without crying wolf.
//!
//! One mechanism covers every silent failure; nothing is sent on a rail
//! that owes us nothing:
//!
//! * **Suspect, from acknowledgements.** Every fragment written on a rail
//!   (and every direct send to a peer with several rails) has a
//!   deadline: the time the bytes queued ahead of it need at the
//!   rail's measured rate, plus the retransmission timeout (RTO) of the
//!   rail's *excess* round trip (what acknowledgements take beyond that
//!   queueing), `max(rto_min, srtt + 4 rttvar)`. A fragment past its
//!   deadline makes the rail **suspect**.
//! * **Suspect, from probes.** A rail that owes us an answer that is not
//!   an acknowledgement (the CTS for an RTS it carried, the DATA for a CTS
//!   it carried, credits we wait for, a message we wait to receive from
//!   the peer) and on which nothing arrived for `probe_interval` gets a
//!   PING. A PING unanswered by its deadline makes the rail suspect.
//! * **Blame the rail, not a silent peer.** A deadline passes for every
//!   rail at once when the peer itself is late (its process descheduled on
//!   an oversubscribed host, paused, swapping) or when this process ran
//!   late and has not read what arrived; moving data to another rail then
//!   helps nothing. So a rail past its deadline is suspected only once the
//!   peer was heard on *another* rail after that deadline, and a grace of
//!   half the rail's RTO after that (a peer that just woke up answers on
//!   every rail in one round, its acknowledgements maybe a delayed-ack
//!   timer later). Until then the other rails get a PING each, to draw
//!   that evidence out of an idle rail, and the rail is looked at again
//!   every quarter RTO. A dead link under a live peer is routed around
//!   about 3/4 RTO after its deadline; a peer silent everywhere only
//!   pauses (and the peer timeout below still applies). A look that comes
//!   long after the blame was due means this rank itself was off its CPU
//!   (`ran_late`): the rail gets one more grace, once per deadline, so the
//!   rank reads what came before it blames.
//! * **Not the last rail.** Suspecting the only usable rail would move its
//!   data nowhere: it is probed instead, and its overdue fragments wait
//!   (TCP delivers them when the link returns). Rails never opened
//!   (connections on demand: lone small messages open only the preferred
//!   rail) are opened when that PING is overdue too. Once another rail answers again,
//!   the overdue rail is suspected at once.
//! * **Suspect is not down.** A suspect rail's unacknowledged fragments
//!   and unanswered RTSs move to the other rails at once, the CTSs it
//!   carried are sent again elsewhere, acknowledgements it owes travel
//!   elsewhere, and it gets no new data. It is sent one PING (at most one
//!   is ever in flight on a rail, so a dead rail costs no memory); the
//!   PONG ends the suspicion and the rail rejoins the schedule. A rail
//!   suspect for `replace_after` also gets a fresh connection (`connect`),
//!   because TCP itself comes back from a long outage only after its own
//!   exponential backoff.
//! * **Down** is for loud failures only (an error, end of stream, a
//!   protocol violation): the driver says so with [`Core::rail_down`].
//! * **A peer is dead** only when the driver reports it unreachable
//!   (every rail refused: its process is gone), or when work with it is
//!   pending and nothing at all arrived from it on any rail for
//!   `peer_timeout`: a slow or paused peer still answers, a starved one
//!   answers late, and neither fails the job.

use std::time::Duration;

use bytes::Bytes;

use crate::time::Time;
use crate::wire::{Flags, FrameHeader, Op};

use super::rail::{Handed, Overdue, Ping, RailState, SendStamp};
use super::send::FragState;
use super::{Config, Core, Event, Owed, Peer, PeerId, RailId, Transmit, push_wake};

/// Retransmission timeout before a rail has any round-trip sample.
pub const RTO_INITIAL: Duration = Duration::from_millis(200);
/// A suspicion ended by a PONG within this time was a slow path, not an
/// outage: its round trip is a sample for the estimator (so a slow path
/// raises the timeout instead of being suspected again and again).
pub const SLOW_NOT_DEAD: Duration = Duration::from_secs(1);

fn at_least(t: &mut Option<Time>, x: Time) {
    *t = Some(t.map_or(x, |y| y.min(x)));
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// The rail's retransmission timeout.
pub(crate) fn rto(cfg: &Config, r: &RailState, now: Time) -> Duration {
    r.rtt.timeout(cfg.rto_min, RTO_INITIAL).max(r.slow.get(now))
}

/// When the oldest unacknowledged fragment written on `rail` is overdue:
/// of the general path's (its write log) or of the direct path's (to a
/// peer with several rails, [`super::send::Direct::stamp`]), whichever
/// is due first.
pub(crate) fn rto_deadline(cfg: &Config, p: &Peer, rail: RailId) -> Option<Time> {
    let r = &p.rails[rail];
    let deadline = |len: u64, stamp: SendStamp| {
        let drain = (stamp.queued + len) as f64 / r.drain_rate(stamp.sent_time);
        stamp.sent_time + Duration::from_secs_f64(drain) + rto(cfg, r, stamp.sent_time)
    };
    let frag = r.written_log.iter().find_map(|f| {
        p.out
            .get(&f.seq)
            .and_then(|m| m.frags.get(&f.offset))
            .filter(|fr| fr.state == FragState::Written && fr.rail == rail)
            .map(|fr| deadline(fr.len as u64, fr.stamp))
    });
    let direct =
        p.direct.iter().find_map(|d| d.stamp.filter(|_| d.rail == rail).map(|s| deadline(d.data.len() as u64, s)));
    match (frag, direct) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// When the PING in flight on `r` is overdue.
fn ping_deadline(cfg: &Config, r: &RailState) -> Option<Time> {
    let ping = r.ping?;
    let (sent, queued) = ping.stamp.map_or((ping.queued_at, r.written_unacked), |s| (s.sent_time, s.queued));
    let drain = queued as f64 / r.drain_rate(sent);
    Some(sent + Duration::from_secs_f64(drain) + rto(cfg, r, sent))
}

/// The earliest deadline of `rail`: its oldest unacknowledged fragment's
/// or its PING's, and whether it is the PING's.
fn rail_deadline(cfg: &Config, p: &Peer, rail: RailId) -> Option<(Time, bool)> {
    let r = &p.rails[rail];
    match (rto_deadline(cfg, p, rail), ping_deadline(cfg, r)) {
        (Some(a), Some(b)) if b < a => Some((b, true)),
        (Some(a), _) => Some((a, false)),
        (None, b) => b.map(|b| (b, true)),
    }
}

/// Since when `rail` is stuck: suspect, or past its current deadline
/// while the peer is silent everywhere (see [`Overdue`]). A stuck rail
/// gets a fresh connection after `replace_after` (see `connect`): after a
/// long outage of every rail, TCP's own backoff would come back late.
pub(crate) fn stuck_since(cfg: &Config, p: &Peer, rail: RailId) -> Option<Time> {
    let r = &p.rails[rail];
    r.suspect_since.or_else(|| {
        let o = r.overdue?;
        (rail_deadline(cfg, p, rail).map(|(d, _)| d) == Some(o.deadline)).then_some(o.deadline)
    })
}

/// How long a rail past deadline `d` is given after the peer was heard
/// elsewhere: half its RTO.
fn grace(cfg: &Config, r: &RailState, d: Time) -> Duration {
    rto(cfg, r, d) / 2
}

/// Whether this rank looks at a rail due for blame (its peer heard
/// elsewhere at `h`, the rail's grace `g`) at `now` so long after the
/// blame was due (`h + g`) that it was itself late: more than half the
/// grace (at least [`LATE_MIN`]) after. A rank taken off its CPU for a while
/// (an oversubscribed host, a hypervisor's steal) runs its timers when it
/// comes back, and the engine may run them before it has read every
/// socket: the rail's answer may be there, unread, while another rail's
/// bytes were read. Such a rail is given one more grace from `now`, once
/// per deadline, so a dead link is still blamed by the next look.
fn ran_late(g: Duration, h: Time, now: Time) -> bool {
    now.since(h + g) > (g / 2).max(LATE_MIN)
}

/// Least lateness [`ran_late`] counts: timers are run about a millisecond
/// late at worst by an engine that is on its CPU (epoll's timeout is in
/// milliseconds).
pub const LATE_MIN: Duration = Duration::from_millis(2);

/// When a rail past deadline `d` whose peer is silent everywhere is looked
/// at again.
fn recheck(cfg: &Config, r: &RailState, d: Time) -> Duration {
    (grace(cfg, r, d) / 2).max(Duration::from_millis(1))
}

/// When `r`, due at `d`, is looked at next (see [`Overdue`]).
fn next_look(cfg: &Config, r: &RailState, d: Time) -> Time {
    match r.overdue.filter(|o| o.deadline == d) {
        Some(Overdue { heard: Some(h), .. }) => h + grace(cfg, r, d),
        Some(o) => o.checked + recheck(cfg, r, d),
        None => d,
    }
}

impl Peer {
    /// Since when `rail` owes us an answer other than an acknowledgement
    /// (see the module documentation), if it does.
    fn owed_since(&self, rail: RailId) -> Option<Time> {
        let mut t = self.rails[rail].owing.first().map(|(at, _)| *at);
        if let Some(b) = self.credit_blocked_since {
            at_least(&mut t, b);
        }
        if self.posted_from > 0 {
            at_least(&mut t, self.posted_since);
        }
        t
    }

    /// Work is pending with this peer: a timeout of silence means trouble.
    pub(crate) fn has_work(&self) -> bool {
        !self.nothing_out()
            || !self.waiting.is_empty()
            || self.rails.iter().any(|r| !r.owing.is_empty())
            || (self.posted_from > 0 && self.up_rails() > 0)
    }

    /// The last time the peer was heard on a rail other than `rail`, if
    /// that was at or after `since`.
    fn heard_elsewhere(&self, rail: RailId, since: Time) -> Option<Time> {
        let others = self.rails.iter().enumerate().filter(|&(j, r)| j != rail && r.up);
        others.map(|(_, r)| r.last_rx).filter(|&t| t >= since).max()
    }

    /// When a quiet `rail` that owes us an answer gets a PING.
    fn probe_deadline(&self, cfg: &Config, rail: RailId) -> Option<Time> {
        let r = &self.rails[rail];
        if !r.usable() || r.ping.is_some() {
            return None;
        }
        let owed = self.owed_since(rail)?;
        Some(owed.max(r.last_rx) + cfg.probe_interval)
    }
}

impl Core {
    /// The earliest liveness deadline of `p` (overdue fragments and
    /// probes, quiet rails, the peer timeout).
    pub(crate) fn liveness_deadline(&self, p: &Peer) -> Option<Time> {
        let mut t = None;
        if p.failed.is_some() {
            return None;
        }
        // An idle peer (the common case in a large job) has no deadline.
        let quiet = p.nothing_out()
            && p.waiting.is_empty()
            && p.posted_from == 0
            && p.credit_blocked_since.is_none()
            && p.rails.iter().all(|r| r.owing.is_empty() && r.ping.is_none());
        if quiet {
            return None;
        }
        let usable = p.rails.iter().filter(|r| r.usable()).count();
        for (i, r) in p.rails.iter().enumerate().filter(|(_, r)| r.up) {
            if r.suspect_since.is_none()
                && usable > 1
                && let Some((d, _)) = rail_deadline(&self.cfg, p, i)
            {
                at_least(&mut t, next_look(&self.cfg, r, d));
            }
            // The last usable rail of several: at its deadline it gets a
            // PING; if the PING is overdue too, the other rails are
            // connected (`run_liveness`); nothing more to do once both are.
            if r.suspect_since.is_none() && usable == 1 && p.rails.len() > 1 {
                let d = if r.ping.is_none() {
                    rto_deadline(&self.cfg, p, i)
                } else if p.rails.iter().any(|x| !x.conn.wanted) {
                    ping_deadline(&self.cfg, r)
                } else {
                    None
                };
                if let Some(d) = d {
                    at_least(&mut t, d);
                }
            }
            if let Some(d) = p.probe_deadline(&self.cfg, i) {
                at_least(&mut t, d);
            }
        }
        if p.has_work() && !self.closing {
            at_least(&mut t, p.last_rx + self.cfg.peer_timeout);
        }
        t
    }

    /// Runs the liveness timers of `peer` due at `now`.
    pub(crate) fn run_liveness(&mut self, peer: PeerId, now: Time) {
        let Some(p) = self.peers.get(&peer) else { return };
        if p.failed.is_some() {
            return;
        }
        let mut suspects = Vec::new();
        let mut pings = Vec::new();
        // Rails past their deadline, not blamed yet; those of them whose
        // peer was not heard elsewhere since.
        let mut waits = Vec::new();
        let mut silent = Vec::new();
        let usable = p.rails.iter().filter(|r| r.usable()).count();
        // The last usable rail's PING is overdue: connect every other rail
        // (with connections on demand a pair of small messages opens only
        // its preferred rail), so that the data has somewhere to go. Not
        // at the first deadline: a peer that is only slow (descheduled on
        // an oversubscribed host) usually answers the PING, and 64 ranks
        // on 2 CPUs would open a second rail for most of their pairs.
        let mut want_all = false;
        for (i, r) in p.rails.iter().enumerate().filter(|(_, r)| r.up) {
            if r.suspect_since.is_none() && usable == 1 {
                // The last usable rail: probe it, wait for it.
                want_all |= ping_deadline(&self.cfg, r).is_some_and(|d| d <= now);
                let overdue = rto_deadline(&self.cfg, p, i).is_some_and(|d| d <= now);
                if overdue && r.ping.is_none() {
                    pings.push(i);
                    continue;
                }
            }
            if r.suspect_since.is_none()
                && usable > 1
                && let Some((d, ping)) = rail_deadline(&self.cfg, p, i).filter(|&(d, _)| d <= now)
            {
                let current = r.overdue.filter(|o| o.deadline == d);
                let heard = current.and_then(|o| o.heard);
                let excused = current.is_some_and(|o| o.excused);
                let g = grace(&self.cfg, r, d);
                match heard.or_else(|| p.heard_elsewhere(i, d)) {
                    Some(h) if now >= h + g && !excused && ran_late(g, h, now) => {
                        // This rank looks at the rail long after it was
                        // due: it was off its CPU, and what the rail
                        // brought meanwhile may be unread. It reads
                        // before it blames: one more grace from now.
                        waits.push((i, Overdue { deadline: d, heard: Some(now), checked: now, excused: true }));
                    }
                    Some(h) if now >= h + g => {
                        let late = ms(now.since(d) + rto(&self.cfg, r, now));
                        let why = if ping {
                            format!("probe unanswered for {late} while the peer answers on other rails")
                        } else {
                            format!(
                                "no acknowledgement for {late} beyond its queue while the peer answers on other rails"
                            )
                        };
                        suspects.push((i, why));
                    }
                    heard => {
                        if heard.is_none() {
                            silent.push(i);
                        }
                        waits.push((i, Overdue { deadline: d, heard, checked: now, excused }));
                    }
                }
                continue;
            }
            if p.probe_deadline(&self.cfg, i).is_some_and(|d| d <= now) {
                pings.push(i);
            }
        }
        // Ask the other rails for a sign of life (`send_ping` skips a rail
        // that already has a PING in flight, also one asked twice here).
        for &i in &silent {
            pings.extend(p.rails.iter().enumerate().filter(|&(j, r)| j != i && r.usable()).map(|(j, _)| j));
        }
        let gone = p.has_work() && !self.closing && now.since(p.last_rx) >= self.cfg.peer_timeout;
        if want_all {
            self.want_rails(peer, None);
        }
        let p = self.peers.get_mut(&peer).expect("checked");
        for (rail, o) in waits {
            let r = &mut p.rails[rail];
            // A new stuck rail: its replacement time is a new connection deadline.
            self.connect_dirty |= r.overdue.is_none_or(|x| x.deadline != o.deadline);
            r.overdue = Some(o);
        }
        for (rail, why) in suspects {
            // Never the last usable one (an earlier one may have just gone).
            if self.peers[&peer].rails.iter().filter(|r| r.usable()).count() > 1 {
                self.suspect(peer, rail, &why, now);
            }
        }
        for rail in pings {
            self.send_ping(peer, rail, now);
        }
        if gone {
            let why = format!("nothing from rank {peer} for {:?} (peer timeout)", self.cfg.peer_timeout);
            self.peer_unreachable(peer, &why);
        }
    }

    /// Makes `rail` to `peer` suspect: see the module documentation.
    pub(crate) fn suspect(&mut self, peer: PeerId, rail: RailId, why: &str, now: Time) {
        let Some(p) = self.peers.get_mut(&peer) else { return };
        let r = &mut p.rails[rail];
        if !r.up || r.suspect_since.is_some() {
            return;
        }
        r.suspect_since = Some(now);
        r.overdue = None;
        r.stats.suspects += 1;
        self.connect_dirty = true;
        r.data.clear();
        r.written_log.clear();
        r.inflight = 0;
        r.written_unacked = 0;
        // The PING in flight (if any) or the next one ends the suspicion.
        r.clears_from = r.ping.map_or(p.next_ping, |x| x.id);
        let moved = r.take_movable_ctrl();
        self.events.push_back(Event::RailSuspect { peer, rail, reason: why.to_string() });
        self.requeue_rail(peer, rail, now);
        self.resend_stale_cts(peer, now);
        self.report_credits_again(peer, now);
        let p = self.peers.get_mut(&peer).expect("checked");
        if let Some(to) = p.best_ctrl_rail() {
            for t in moved {
                p.rails[to].push_ctrl(t);
            }
            push_wake(&mut self.wakeups, peer, to);
        }
        if !self.peers[&peer].rails[rail].acks.is_empty() {
            // What it received goes acknowledged on another rail.
            self.flush_rail_acks(peer, rail);
        }
        self.send_ping(peer, rail, now);
        self.schedule(peer, now);
    }

    /// Queues a PING on `rail`, unless one is already in flight there.
    pub(crate) fn send_ping(&mut self, peer: PeerId, rail: RailId, now: Time) {
        let Some(p) = self.peers.get_mut(&peer) else { return };
        let id = p.next_ping;
        let r = &mut p.rails[rail];
        if !r.up || r.ping.is_some() {
            return;
        }
        p.next_ping += 1;
        r.ping = Some(Ping { id, stamp: None, queued_at: now });
        let mut h = FrameHeader::new(Op::Heartbeat);
        h.flags = Flags::PING;
        h.seq = id;
        r.push_ctrl(Transmit { header: h, payload: Bytes::new() });
        push_wake(&mut self.wakeups, peer, rail);
    }

    /// A HEARTBEAT arrived: answer a PING, or take a PONG's news.
    pub(crate) fn rx_heartbeat(&mut self, peer: PeerId, rail: RailId, hdr: &FrameHeader, now: Time) {
        if hdr.flags.contains(Flags::PING) {
            let p = self.peers.get_mut(&peer).expect("caller checked");
            let mut h = FrameHeader::new(Op::Heartbeat);
            h.flags = Flags::PONG;
            h.seq = hdr.seq;
            h.total_len = p.credit_returned;
            h.tag = p.rts_returned;
            p.credit_reported = p.credit_returned;
            p.rts_reported = p.rts_returned;
            p.rails[rail].push_ctrl(Transmit { header: h, payload: Bytes::new() });
            push_wake(&mut self.wakeups, peer, rail);
            return;
        }
        if !hdr.flags.contains(Flags::PONG) {
            return; // a plain keepalive
        }
        self.take_credits(peer, hdr.total_len, hdr.tag);
        let p = self.peers.get_mut(&peer).expect("caller checked");
        let r = &mut p.rails[rail];
        if r.ping.is_some_and(|x| hdr.seq >= x.id) {
            let ping = r.ping.take().expect("checked");
            // A PONG that ends a long suspicion waited out an outage: it
            // says nothing about the round trip. One that ends a short one
            // says the path is slow: the estimator must know.
            let slow = r.suspect_since.is_none_or(|since| now.since(since) < SLOW_NOT_DEAD);
            if let (Some(stamp), true) = (ping.stamp, slow) {
                let rtt = now.since(stamp.sent_time);
                let queue = Duration::from_secs_f64(stamp.queued as f64 / r.drain_rate(now));
                let excess = rtt.saturating_sub(queue);
                r.rtt.sample(excess);
                if r.suspect_since.is_some() {
                    r.slow.stalled(excess, now);
                }
            }
        }
        if r.suspect_since.is_some() && hdr.seq >= r.clears_from {
            r.suspect_since = None;
            r.ping = None;
            self.events.push_back(Event::RailAlive { peer, rail });
            self.resend_stale_cts(peer, now);
            self.schedule(peer, now);
        }
    }

    /// CTSs that went on a rail no longer usable, for messages whose data
    /// has not started, go again on a usable rail (when there is one; else
    /// when a rail comes back).
    pub(crate) fn resend_stale_cts(&mut self, peer: PeerId, now: Time) {
        let p = self.peers.get_mut(&peer).expect("caller checked");
        let Some(to) = p.best_ctrl_rail() else { return };
        let stale: Vec<(RailId, Time, u64)> = p
            .rails
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.usable())
            .flat_map(|(i, r)| {
                r.owing.iter().filter_map(move |&(at, w)| match w {
                    Owed::Data(seq) => Some((i, at, seq)),
                    Owed::Cts(_) => None,
                })
            })
            .collect();
        let mut again = Vec::new();
        for (from, at, seq) in stale {
            p.settle(from, at, Owed::Data(seq));
            let Some(m) = p.inc.get_mut(&seq) else { continue };
            m.cts_rail = Some(to);
            m.cts_at = now;
            again.push(super::recv::cts_frame(seq, m.tag, m.total, false));
            p.owe(to, now, Owed::Data(seq));
        }
        for t in again {
            p.rails[to].push_ctrl(t);
            push_wake(&mut self.wakeups, peer, to);
        }
    }

    /// Credits we returned may have died with a connection: report the
    /// cumulative counters again soon (a repeat is harmless).
    pub(crate) fn report_credits_again(&mut self, peer: PeerId, now: Time) {
        let delay = self.cfg.ack_delay;
        let p = self.peers.get_mut(&peer).expect("caller checked");
        if p.credit_returned > 0 || p.rts_returned > 0 {
            p.credit_reported = 0;
            p.rts_reported = 0;
            p.credit_due = Some(p.credit_due.map_or(now + delay, |d| d.min(now + delay)));
        }
    }

    /// A PING the driver wrote: its timeout runs from now.
    pub(crate) fn ping_written(r: &mut RailState, id: u64, now: Time) {
        if let Some(ping) = r.ping.as_mut().filter(|x| x.id == id) {
            ping.stamp =
                Some(super::rail::SendStamp { sent_time: now, queued: r.written_unacked, ..Default::default() });
        }
    }

    /// True if `h` (just handed out) is a PING, for `on_sent` bookkeeping.
    pub(crate) fn handed_for(h: &FrameHeader) -> Handed {
        if h.op == Op::Heartbeat && h.flags.contains(Flags::PING) { Handed::Ping { id: h.seq } } else { Handed::Ctrl }
    }
}
