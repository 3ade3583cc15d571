//! The sending side: starting messages (eager or rendezvous, within the
//! peer's credits), assigning chunks to rails through the schedulers,
//! tracking every fragment until it is acknowledged, and moving the
//! fragments of a failed rail to the survivors.

use bytes::Bytes;

use crate::sched::{MessageInfo, Plan, PolicyKind, RailView, SPREAD_BACKLOG, least_loaded, nth_where};
use crate::time::Time;
use crate::wire::{AckRepr, Flags, FrameHeader, Op, frame::payload_checksum};

use super::frags::FragMap;
use super::rail::{FragRef, Handed, SendStamp};
use super::{Core, Event, MESSAGE_OVERHEAD, Owed, Peer, PeerId, ProtocolError, RailId, ReqId, Transmit, push_wake};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutState {
    /// Not started: waiting for credits or its turn.
    Waiting,
    /// RTS sent on `rail`; waiting for CTS.
    Rts { rail: RailId },
    /// The RTS must go (again) as soon as a rail is usable: the one it went
    /// on failed or is suspect.
    RtsAgain,
    /// Data being assigned and written.
    Sending,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FragState {
    /// In a rail's data queue or handed to the driver, not yet written.
    Queued,
    /// Written on its rail; `stamp` is valid.
    Written,
    /// Waiting for a surviving rail after its rail failed.
    Orphaned,
    Acked,
}

#[derive(Debug, Clone)]
pub(crate) struct Frag {
    pub len: u32,
    pub rail: RailId,
    pub state: FragState,
    pub ever_written: bool,
    pub retransmit: bool,
    pub stamp: SendStamp,
}

/// A message sent by the direct path: all that is kept of it until the
/// peer acknowledges it (to send it again if its rail fails first).
#[derive(Debug)]
pub(crate) struct Direct {
    pub seq: u64,
    pub tag: u64,
    pub data: Bytes,
    pub rail: RailId,
    /// When it was written, to a peer with several rails (`Core::on_sent`):
    /// its acknowledgement is a round-trip sample and its deadline finds a
    /// silent rail, as a general fragment's does. `None` until written, and
    /// always to a peer with one rail (nowhere to move it to).
    pub stamp: Option<SendStamp>,
}

#[derive(Debug)]
pub(crate) struct OutMsg {
    pub req: ReqId,
    pub seq: u64,
    pub tag: u64,
    pub data: Bytes,
    pub eager: bool,
    pub state: OutState,
    /// When the RTS was (last) handed out.
    pub rts_at: Time,
    pub tier: usize,
    pub plan: Option<Plan>,
    /// Fragments by offset.
    pub frags: FragMap,
    pub unwritten: usize,
    pub unacked: usize,
    /// `SendDone` was reported.
    pub completed: bool,
}

impl OutMsg {
    pub fn new(req: ReqId, seq: u64, tag: u64, data: Bytes) -> OutMsg {
        OutMsg {
            req,
            seq,
            tag,
            data,
            eager: false,
            state: OutState::Waiting,
            rts_at: Time::ZERO,
            tier: 0,
            plan: None,
            frags: FragMap::default(),
            unwritten: 0,
            unacked: 0,
            completed: false,
        }
    }

    pub fn len(&self) -> u64 {
        self.data.len() as u64
    }

    fn plan_done(&self) -> bool {
        self.plan.as_ref().is_some_and(|p| p.is_done())
    }

    /// The frame carrying the fragment at `offset`.
    pub fn transmit(&self, offset: u64, checksum: bool) -> Option<Transmit> {
        let f = self.frags.get(&offset)?;
        if f.state == FragState::Acked {
            return None;
        }
        let start = offset as usize;
        let payload = self.data.slice(start..start + f.len as usize);
        let mut h = FrameHeader::new(if self.eager { Op::Eager } else { Op::Data });
        h.seq = self.seq;
        h.tag = self.tag;
        h.total_len = self.len();
        h.offset = offset;
        h.frag_len = f.len;
        if f.retransmit {
            h.flags = h.flags.with(Flags::RETRANSMIT);
        }
        if checksum {
            h.flags = h.flags.with(Flags::CHECKSUM);
            h.checksum = payload_checksum(&payload);
        }
        Some(Transmit { header: h, payload })
    }

    fn rts(&self, retransmit: bool) -> Transmit {
        let mut h = FrameHeader::new(Op::Rts);
        h.seq = self.seq;
        h.tag = self.tag;
        h.total_len = self.len();
        if retransmit {
            h.flags = Flags::RETRANSMIT;
        }
        Transmit { header: h, payload: Bytes::new() }
    }
}

impl Peer {
    /// The rail a message of `len` bytes may go on by the direct path, if
    /// it may: the rail the general path would give it, and nothing of
    /// what the general path would do differs.
    ///
    /// * The message is eager and one frame; the peer granted credits
    ///   that cover it.
    /// * Nothing of the general path waits to be written: no message
    ///   waiting or partly scheduled, no fragment to send again, no RTS to
    ///   repeat, nothing queued on the rail (the direct frame must not
    ///   overtake one on its rail; written and unacknowledged ones may
    ///   stay).
    /// * The rail is usable and does not lose frames silently
    ///   (`RailCaps::may_lose`: only the general path's bookkeeping finds
    ///   a lost frame).
    /// * One rail: its bytes in flight stay within the short window's
    ///   floor (`Config::spread_window_min`; on a rail that buffers by
    ///   itself, its buffer, at most `rail_window`), as the general path's
    ///   stream of small messages would, or the rail is empty.
    /// * Several rails: the message's policy tier is `spread` or `single`,
    ///   and the rail is the pair's preferred one among the usable rails
    ///   with less than [`SPREAD_BACKLOG`] in flight: where `spread` puts a
    ///   lone message. Beyond that backlog the general path spreads whole
    ///   messages over every rail. Its frame is stamped when written
    ///   ([`Direct::stamp`]), so a silent rail is found as the general
    ///   path finds it.
    pub(crate) fn direct_rail(&self, peer: PeerId, len: u64, cfg: &super::Config) -> Option<RailId> {
        let max_frame = u64::from(cfg.limits.max_frame);
        let fits = len <= cfg.eager_limit && len <= self.chunk(cfg.chunk, max_frame) && len <= max_frame;
        let clear = self.waiting.is_empty()
            && self.sending.first().is_none()
            && self.retx.is_empty()
            && self.rts_again.is_empty();
        if !(fits && clear && self.credit_grant.is_some() && self.credits() >= len + MESSAGE_OVERHEAD) {
            return None;
        }
        let (rail, room_ok) = if let [r] = self.rails.as_slice() {
            let room = if r.caps.host_local {
                r.caps.buffer.max(cfg.spread_window_min).min(cfg.rail_window)
            } else {
                cfg.spread_window_min
            };
            (0, r.inflight == 0 || r.inflight + len <= room)
        } else {
            if !matches!(cfg.policy.lookup(len), PolicyKind::Spread | PolicyKind::Single) {
                return None;
            }
            let rail = nth_where(self.rails.iter().map(|r| r.usable()), cfg.rank as usize + peer as usize)?;
            (rail, self.rails[rail].inflight < SPREAD_BACKLOG)
        };
        let r = &self.rails[rail];
        (room_ok && r.data.is_empty() && r.usable() && !r.caps.may_lose).then_some(rail)
    }
}

impl Core {
    /// The direct path of [`Core::isend`] (the caller checked
    /// [`Peer::direct_rail`]): the eager frame goes into `rail`'s direct
    /// queue (after its control frames, before its data fragments) and its
    /// bytes count in the rail's bytes in flight; the caller completes the
    /// send: its bytes are the rail's now. The message is kept in
    /// `Peer::direct` until the peer acknowledges it (its delivered prefix
    /// covers it, or an ACK range names it); if its rail fails first,
    /// [`Core::requeue_rail`] turns it into a general message to send
    /// again.
    pub(crate) fn send_direct(&mut self, peer: PeerId, rail: RailId, seq: u64, tag: u64, data: Bytes, now: Time) {
        let header = self.record_direct(peer, rail, seq, tag, &data, now);
        let p = self.peers.get_mut(&peer).expect("caller checked");
        p.rails[rail].direct.push_back(Transmit { header, payload: data });
        push_wake(&mut self.wakeups, peer, rail);
    }

    /// What the direct path keeps of message `seq` sent to `peer` on
    /// `rail` ([`Core::send_direct`], [`Core::isend_now`]): its credits and
    /// bytes in flight are spent, it is kept in `Peer::direct` until
    /// acknowledged. Returns its frame's header (without the flags that
    /// [`Core::poll_transmit`] adds).
    pub(crate) fn record_direct(
        &mut self,
        peer: PeerId,
        rail: RailId,
        seq: u64,
        tag: u64,
        data: &Bytes,
        now: Time,
    ) -> FrameHeader {
        let checksum = self.cfg.checksum;
        let p = self.peers.get_mut(&peer).expect("caller checked");
        let len = data.len() as u64;
        p.credit_spent += len + MESSAGE_OVERHEAD;
        let mut h = FrameHeader::new(Op::Eager);
        h.seq = seq;
        h.tag = tag;
        h.total_len = len;
        h.frag_len = len as u32;
        if checksum {
            h.flags = h.flags.with(Flags::CHECKSUM);
            h.checksum = payload_checksum(data);
        }
        let several = p.rails.len() > 1;
        let r = &mut p.rails[rail];
        r.inflight += len;
        // As `schedule` would: the rail was used now, and a rail that
        // carries messages is one to keep connected.
        let want = several && !r.conn.wanted;
        if several {
            r.last_used = Some(now);
        }
        p.direct.push_back(Direct { seq, tag, data: data.clone(), rail, stamp: None });
        self.direct_tx += 1;
        if want {
            self.want_rails(peer, Some(rail));
        }
        h
    }

    /// Starts waiting messages, re-sends orphaned fragments and RTSs and
    /// assigns new chunks to rails with room, for one peer.
    pub(crate) fn schedule(&mut self, peer: PeerId, now: Time) {
        self.active.insert(peer);
        let (eager_limit, window, chunk, rank) =
            (self.cfg.eager_limit, self.cfg.window_cfg(), self.cfg.chunk, self.cfg.rank);
        let Some(p) = self.peers.get_mut(&peer) else { return };
        if p.failed.is_some() || p.up_rails() == 0 {
            return;
        }
        if p.rts_again.is_empty() && p.waiting.is_empty() && p.retx.is_empty() && p.sending.first().is_none() {
            // Nothing to start, re-send or place (a receive matched, an
            // ACK that settled everything): what the steps below would
            // conclude, without measuring every rail for them.
            p.credit_blocked_since = None;
            return;
        }
        let chunk = p.chunk(chunk, self.cfg.limits.max_frame as u64);
        let mut views = std::mem::take(&mut p.views_buf);
        views.clear();
        let several = p.rails.len() > 1;
        views.extend(p.rails.iter().map(|r| r.view(&window, several, now)));
        crate::sched::assume_unmeasured_as_fast(&mut views);

        // 0. RTSs whose rail failed go again, in order.
        if let Some(rail) = least_loaded(&views) {
            for seq in std::mem::take(&mut p.rts_again) {
                let Some(m) = p.out.get_mut(&seq).filter(|m| m.state == OutState::RtsAgain) else { continue };
                m.state = OutState::Rts { rail };
                m.rts_at = now;
                p.rails[rail].push_ctrl(m.rts(true));
                p.owe(rail, now, Owed::Cts(seq));
                push_wake(&mut self.wakeups, peer, rail);
            }
        }

        // 1. Start messages in order while the peer's credits allow.
        let mut blocked = false;
        while let Some(&seq) = p.waiting.front() {
            if p.credit_grant.is_none() {
                break;
            }
            let (credits, rts_credits) = (p.credits(), p.rts_credits());
            let m = p.out.get_mut(&seq).expect("waiting messages are in out");
            let len = m.len();
            if len <= eager_limit && credits >= len + MESSAGE_OVERHEAD {
                p.credit_spent += len + MESSAGE_OVERHEAD;
                m.eager = true;
                m.state = OutState::Sending;
                m.tier = self.cfg.policy.tier_of(len);
                let info = MessageInfo { len, rank, peer };
                m.plan = Some(p.scheds[m.tier].start(&info, &views, chunk, now));
                p.sending.insert(seq);
            } else if rts_credits > 0 {
                let Some(rail) = least_loaded(&views) else { break };
                p.rts_spent += 1;
                m.state = OutState::Rts { rail };
                m.rts_at = now;
                p.rails[rail].push_ctrl(m.rts(false));
                p.owe(rail, now, Owed::Cts(seq));
                push_wake(&mut self.wakeups, peer, rail);
            } else {
                blocked = true;
                break;
            }
            p.waiting.pop_front();
        }
        if blocked {
            p.credit_blocked_since.get_or_insert(now);
        } else {
            p.credit_blocked_since = None;
        }

        // 2. Fragments orphaned by a failed rail go first, in order.
        while let Some(&(seq, offset)) = p.retx.front() {
            let Some(f) = p.out.get_mut(&seq).and_then(|m| m.frags.get_mut(&offset)) else {
                p.retx.pop_front();
                continue;
            };
            if f.state != FragState::Orphaned {
                p.retx.pop_front();
                continue;
            }
            let Some(rail) = least_loaded(&views).filter(|&r| views[r].has_room()) else { break };
            f.rail = rail;
            f.state = FragState::Queued;
            f.retransmit = true;
            views[rail].assign(u64::from(f.len));
            let r = &mut p.rails[rail];
            r.inflight += f.len as u64;
            r.stats.retransmits += 1;
            r.data.push_back(FragRef { seq, offset });
            push_wake(&mut self.wakeups, peer, rail);
            p.retx.pop_front();
        }

        // 3. New chunks, message by message in order.
        let mut cursor = p.sending.first();
        while let Some(seq) = cursor {
            cursor = p.sending.next_after(seq);
            let m = p.out.get_mut(&seq).expect("sending messages are in out");
            let sched = &mut p.scheds[m.tier];
            let plan = m.plan.as_mut().expect("sending messages have a plan");
            while let Some(c) = sched.next(plan, &views, now) {
                let len = c.len as u32;
                m.frags.insert(
                    c.offset,
                    Frag {
                        len,
                        rail: c.rail,
                        state: FragState::Queued,
                        ever_written: false,
                        retransmit: false,
                        stamp: SendStamp::default(),
                    },
                );
                m.unwritten += 1;
                m.unacked += 1;
                views[c.rail].assign(c.len);
                views[c.rail].last_used = Some(now);
                let r = &mut p.rails[c.rail];
                r.inflight += c.len;
                r.last_used = Some(now);
                r.data.push_back(FragRef { seq, offset: c.offset });
                push_wake(&mut self.wakeups, peer, c.rail);
            }
            if plan.is_done() {
                p.sending.remove(&seq);
            }
        }
        p.views_buf = views;
    }

    /// Frames handed out on `rail` were written, the first `n` in order.
    pub fn on_sent(&mut self, peer: PeerId, rail: RailId, n: usize, now: Time) {
        self.active.insert(peer);
        let Some(p) = self.peers.get_mut(&peer) else { return };
        let Some(r) = p.rails.get_mut(rail) else { return };
        for _ in 0..n {
            let Some(h) = r.handed.pop_front() else { break };
            let (seq, offset) = match h {
                Handed::Frag { seq, offset } => (seq, offset),
                Handed::Ping { id } => {
                    Self::ping_written(r, id, now);
                    continue;
                }
                Handed::Direct { seq } => {
                    // A peer with several rails: stamped like a fragment.
                    if let Ok(i) = p.direct.binary_search_by_key(&seq, |d| d.seq) {
                        let d = &mut p.direct[i];
                        if d.rail == rail && d.stamp.is_none() {
                            d.stamp = Some(r.est.on_send(now, r.written_unacked == 0, r.written_unacked));
                            r.written_unacked += d.data.len() as u64;
                        }
                    }
                    continue;
                }
                Handed::Ctrl => continue,
            };
            let Some(m) = p.out.get_mut(&seq) else { continue };
            let Some(f) = m.frags.get_mut(&offset) else { continue };
            if f.state != FragState::Queued || f.rail != rail {
                continue;
            }
            f.state = FragState::Written;
            f.stamp = r.est.on_send(now, r.written_unacked == 0, r.written_unacked);
            r.written_log.push_back(FragRef { seq, offset });
            r.written_unacked += f.len as u64;
            if !f.ever_written {
                f.ever_written = true;
                m.unwritten -= 1;
            }
            if !m.completed && m.unwritten == 0 && m.plan_done() {
                m.completed = true;
                self.events.push_back(Event::SendDone { req: m.req, result: Ok(()) });
                // Acknowledged before it was reported written: nothing
                // more to keep. (Otherwise the ACK that completes it
                // releases it.)
                if m.unacked == 0 {
                    p.out.discard(&seq);
                }
            }
        }
    }

    /// Drops messages that are completed and fully acknowledged.
    fn release_acked(&mut self, peer: PeerId) {
        let Some(p) = self.peers.get_mut(&peer) else { return };
        let done: Vec<u64> =
            p.out.iter().filter(|(_, m)| m.completed && m.unacked == 0 && m.plan_done()).map(|(s, _)| s).collect();
        for s in done {
            p.out.discard(&s);
        }
    }

    /// Handles a CTS: the receiver posted a buffer for message `seq`.
    pub(crate) fn rx_cts(&mut self, peer: PeerId, hdr: &FrameHeader, now: Time) -> Result<(), ProtocolError> {
        let (rank, window) = (self.cfg.rank, self.cfg.window_cfg());
        let p = self.peers.get_mut(&peer).expect("caller checked");
        let chunk = p.chunk(self.cfg.chunk, self.cfg.limits.max_frame as u64);
        if hdr.seq >= p.next_seq {
            return Err(ProtocolError::UnknownMessage { op: hdr.op, seq: hdr.seq });
        }
        let Some(m) = p.out.get_mut(&hdr.seq) else { return Ok(()) }; // duplicate
        match m.state {
            OutState::Rts { rail } => {
                let at = m.rts_at;
                p.settle(rail, at, Owed::Cts(hdr.seq));
            }
            OutState::RtsAgain => {
                p.rts_again.remove(&hdr.seq);
            }
            // A duplicate CTS after an RTS retransmission.
            _ => return Ok(()),
        }
        let m = p.out.get_mut(&hdr.seq).expect("checked above");
        if hdr.flags.contains(Flags::DISCARD) {
            // The receiver's buffer is too small: MPI completes the send.
            let req = m.req;
            p.out.discard(&hdr.seq);
            self.events.push_back(Event::SendDone { req, result: Ok(()) });
            return Ok(());
        }
        let several = p.rails.len() > 1;
        let views: Vec<RailView> = p.rails.iter().map(|r| r.view(&window, several, now)).collect();
        m.state = OutState::Sending;
        m.tier = self.cfg.policy.tier_of(m.len());
        let info = MessageInfo { len: m.len(), rank, peer };
        m.plan = Some(p.scheds[m.tier].start(&info, &views, chunk, now));
        p.sending.insert(hdr.seq);
        self.schedule(peer, now);
        Ok(())
    }

    /// Handles an ACK: the delivered prefix (`seq`), cumulative credits
    /// (`total_len`, `tag`) and received ranges, which mark fragments
    /// delivered and feed the rate and round-trip estimators.
    pub(crate) fn rx_ack(
        &mut self,
        peer: PeerId,
        hdr: &FrameHeader,
        payload: &[u8],
        now: Time,
    ) -> Result<(), ProtocolError> {
        let ack = AckRepr::parse(payload, hdr.aux)?;
        self.rx_prefix(peer, hdr.seq, now)?;
        self.take_credits(peer, hdr.total_len, hdr.tag);
        let p = self.peers.get_mut(&peer).expect("caller checked");
        let mut touched = Vec::new();
        for range in &ack.ranges {
            if range.seq >= p.next_seq {
                return Err(ProtocolError::BogusAck { seq: range.seq });
            }
            let end = range.offset + range.len as u64;
            let Some(m) = p.out.get_mut(&range.seq) else {
                // A direct send that arrived while an earlier message
                // holds the delivered prefix back: released as the general
                // path releases a message acknowledged by its ranges.
                if let Ok(i) = p.direct.binary_search_by_key(&range.seq, |d| d.seq)
                    && range.offset == 0
                    && end >= p.direct[i].data.len() as u64
                {
                    let d = p.direct.remove(i).expect("index from the search");
                    ack_direct(&mut p.rails, &d, now);
                }
                continue;
            };
            // `max(offset + 1)`: an empty range acknowledges the empty
            // fragment of an empty message.
            for (&off, f) in m.frags.range_mut(range.offset..end.max(range.offset + 1)) {
                if off + f.len as u64 > end || f.state == FragState::Acked {
                    continue;
                }
                ack_frag(&mut p.rails, f, now);
                if !touched.contains(&f.rail) {
                    touched.push(f.rail);
                }
                m.unacked -= 1;
                if !f.ever_written {
                    // Acknowledged before we wrote it (only a misbehaving
                    // peer does that): it needs no writing any more.
                    f.ever_written = true;
                    m.unwritten -= 1;
                }
            }
            if !m.completed && m.unwritten == 0 && m.plan_done() {
                m.completed = true;
                self.events.push_back(Event::SendDone { req: m.req, result: Ok(()) });
            }
        }
        for rail in touched {
            detect_losses(p, rail);
            trim_written_log(p, rail);
        }
        self.release_acked(peer);
        self.schedule(peer, now);
        Ok(())
    }

    /// The peer delivered every message below `prefix`: their fragments
    /// are acknowledged. A prefix older than one already known is stale
    /// (it travelled on a slower rail) and changes nothing.
    pub(crate) fn rx_prefix(&mut self, peer: PeerId, prefix: u64, now: Time) -> Result<(), ProtocolError> {
        let p = self.peers.get_mut(&peer).expect("caller checked");
        if prefix > p.next_seq {
            return Err(ProtocolError::BogusAck { seq: prefix });
        }
        if prefix <= p.acked_prefix {
            return Ok(());
        }
        if p.waiting.front().is_some_and(|&s| s < prefix) {
            // Messages start in order: the peer claims one never sent.
            return Err(ProtocolError::BogusAck { seq: prefix - 1 });
        }
        let from = p.acked_prefix;
        p.acked_prefix = prefix;
        while p.direct.front().is_some_and(|d| d.seq < prefix) {
            let d = p.direct.pop_front().expect("front checked");
            ack_direct(&mut p.rails, &d, now);
        }
        let mut touched = [false; 8];
        let mut touched_more = false;
        while let Some(seq) = p.out.first_in(from, prefix) {
            // Settled where it is, then dropped in place (no copy out).
            let m = p.out.get_mut(&seq).expect("from range");
            let (state, rts_at, req, completed) = (m.state, m.rts_at, m.req, m.completed);
            for f in m.frags.values_mut().filter(|f| f.state != FragState::Acked) {
                match touched.get_mut(f.rail) {
                    Some(t) => *t = true,
                    None => touched_more = true,
                }
                ack_frag(&mut p.rails, f, now);
            }
            p.out.discard(&seq);
            if let OutState::Rts { rail } = state {
                p.settle(rail, rts_at, Owed::Cts(seq));
            }
            p.sending.remove(&seq);
            if !completed {
                self.events.push_back(Event::SendDone { req, result: Ok(()) });
            }
        }
        if !p.retx.is_empty() {
            p.retx.retain(|(s, _)| *s >= prefix);
        }
        if !p.rts_again.is_empty() {
            p.rts_again = p.rts_again.split_off(&prefix);
        }
        for rail in 0..p.rails.len() {
            if touched_more || touched.get(rail).copied().unwrap_or(false) {
                trim_written_log(p, rail);
            }
        }
        Ok(())
    }

    /// Takes cumulative credit counters from an ACK or PONG. Counters only
    /// grow, so a stale report (from a slower rail) changes nothing, and
    /// never beyond what we spent.
    pub(crate) fn take_credits(&mut self, peer: PeerId, eager_total: u64, rts_total: u64) {
        let p = self.peers.get_mut(&peer).expect("caller checked");
        p.credit_back = p.credit_back.max(eager_total.min(p.credit_spent));
        p.rts_back = p.rts_back.max(rts_total.min(p.rts_spent));
    }

    /// After `rail` failed or turned suspect: its unacknowledged fragments
    /// become orphans for the other rails, and RTSs sent on it go again.
    pub(crate) fn requeue_rail(&mut self, peer: PeerId, rail: RailId, now: Time) {
        let Some(p) = self.peers.get_mut(&peer) else { return };
        // Direct sends on this rail become general messages, written (their
        // frame may be in the peer's hands) and complete; the loop below
        // orphans them like any written fragment.
        let (moved, kept): (Vec<Direct>, Vec<Direct>) =
            std::mem::take(&mut p.direct).into_iter().partition(|d| d.rail == rail);
        p.direct = kept.into();
        p.rails[rail].direct.clear();
        for d in moved {
            let len = d.data.len() as u64;
            let mut m = OutMsg::new(ReqId(0), d.seq, d.tag, d.data);
            m.eager = true;
            m.state = OutState::Sending;
            m.completed = true;
            m.unacked = 1;
            m.plan = Some(Plan::whole(len, rail));
            m.frags.insert(
                0,
                Frag {
                    len: len as u32,
                    rail,
                    state: FragState::Written,
                    ever_written: true,
                    retransmit: false,
                    stamp: d.stamp.unwrap_or_default(),
                },
            );
            p.out.insert(d.seq, m);
        }
        for (seq, m) in p.out.iter_mut() {
            for (&off, f) in m.frags.iter_mut() {
                if f.rail == rail && matches!(f.state, FragState::Queued | FragState::Written) {
                    f.state = FragState::Orphaned;
                    p.retx.push_back((seq, off));
                }
            }
            if m.state == (OutState::Rts { rail }) {
                m.state = OutState::RtsAgain;
                p.rts_again.insert(seq);
                p.rails[rail].owing.remove(&(m.rts_at, Owed::Cts(seq)));
            }
        }
        // Keep re-sends in message order.
        let mut v: Vec<(u64, u64)> = std::mem::take(&mut p.retx).into();
        v.sort_unstable();
        v.dedup();
        p.retx = v.into();
        let r = &mut p.rails[rail];
        r.data.clear();
        r.inflight = 0;
        r.written_unacked = 0;
        r.written_log.clear();
        self.schedule(peer, now);
    }
}

/// Marks fragment `f` acknowledged, releasing its rail's window and
/// feeding that rail's estimators (not for re-sent fragments: their
/// acknowledgement may be for either copy).
fn ack_frag(rails: &mut [super::rail::RailState], f: &mut Frag, now: Time) {
    let r = &mut rails[f.rail];
    match f.state {
        FragState::Written => ack_written(r, f.len as u64, &f.stamp, !f.retransmit, now),
        FragState::Queued => r.inflight = r.inflight.saturating_sub(f.len as u64),
        FragState::Orphaned | FragState::Acked => {}
    }
    f.state = FragState::Acked;
}

/// Bytes written with `stamp` were acknowledged: they leave the rail's
/// window and feed its rate estimator, and its round-trip estimator when
/// `sample` (not for re-sent bytes: their acknowledgement may be for
/// either copy).
fn ack_written(r: &mut super::rail::RailState, len: u64, stamp: &SendStamp, sample: bool, now: Time) {
    r.inflight = r.inflight.saturating_sub(len);
    r.written_unacked = r.written_unacked.saturating_sub(len);
    r.est.on_ack(len, stamp, now);
    if sample {
        let rtt = now.since(stamp.sent_time);
        r.rtt.sample_raw(rtt);
        let queue = (stamp.queued + len) as f64 / r.drain_rate(now);
        r.rtt.sample(rtt.saturating_sub(std::time::Duration::from_secs_f64(queue)));
    }
}

/// A direct send was acknowledged (by a range or the delivered prefix):
/// its bytes leave the rail's window, and a stamped one is a sample as a
/// written fragment is.
fn ack_direct(rails: &mut [super::rail::RailState], d: &Direct, now: Time) {
    let r = &mut rails[d.rail];
    let len = d.data.len() as u64;
    match &d.stamp {
        Some(stamp) => ack_written(r, len, stamp, true, now),
        None => r.inflight = r.inflight.saturating_sub(len),
    }
}

/// Drops acknowledged entries from the front of `rail`'s write log (they
/// were acknowledged by a delivered prefix or out of order).
fn trim_written_log(p: &mut super::Peer, rail: RailId) {
    let Peer { out, rails, .. } = p;
    let log = &mut rails[rail].written_log;
    while let Some(f) = log.front() {
        let live = out
            .get(&f.seq)
            .and_then(|m| m.frags.get(&f.offset))
            .is_some_and(|fr| fr.rail == rail && matches!(fr.state, FragState::Written | FragState::Queued));
        if live {
            break;
        }
        log.pop_front();
    }
}

/// Fragments written on `rail` before the newest acknowledged one, and
/// still unacknowledged, were lost (the rail dropped them): re-send them.
fn detect_losses(p: &mut super::Peer, rail: RailId) {
    let state = |out: &super::SeqMap<OutMsg>, f: &FragRef| -> Option<FragState> {
        out.get(&f.seq).and_then(|m| m.frags.get(&f.offset)).filter(|fr| fr.rail == rail).map(|fr| fr.state)
    };
    let log = &p.rails[rail].written_log;
    let Some(last) = log.iter().rposition(|f| matches!(state(&p.out, f), Some(FragState::Acked) | None)) else {
        return;
    };
    let older: Vec<FragRef> = p.rails[rail].written_log.drain(..=last).collect();
    for f in older {
        if state(&p.out, &f) != Some(FragState::Written) {
            continue;
        }
        let fr = p.out.get_mut(&f.seq).and_then(|m| m.frags.get_mut(&f.offset)).expect("state was found");
        fr.state = FragState::Orphaned;
        let r = &mut p.rails[rail];
        r.inflight = r.inflight.saturating_sub(fr.len as u64);
        r.written_unacked = r.written_unacked.saturating_sub(fr.len as u64);
        r.stats.lost += 1;
        p.retx.push_back((f.seq, f.offset));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::WindowCfg;
    use super::super::rail::RailState;
    use super::*;

    /// The latency the scheduler plans with is the path's round trip, not
    /// a fragment's own transmission time: on the testbed, half the raw
    /// round trip of 256 KiB fragments (0.3-0.65 ms) differed between two
    /// equal rails and skewed lone 1 MiB messages 53/47 (2.45 ms against
    /// stripe's 2.12).
    #[test]
    fn a_rails_latency_is_its_round_trip_without_its_own_transmission_time() {
        let mut rails = [RailState::new(Duration::from_millis(100))];
        let t0 = Time::ZERO + Duration::from_secs(1);
        let len = 256 << 10;
        let stamp = rails[0].est.on_send(t0, true, 0);
        rails[0].inflight = len as u64;
        rails[0].written_unacked = len as u64;
        let mut f = Frag { len, rail: 0, state: FragState::Written, ever_written: true, retransmit: false, stamp };
        // 100 MB/s: 2.62 ms on the wire, then a 100 us round trip.
        let wire = Duration::from_secs_f64(len as f64 / 100e6);
        ack_frag(&mut rails, &mut f, t0 + wire + Duration::from_micros(100));
        let w = WindowCfg {
            min: 1 << 20,
            max: 16 << 20,
            time: Duration::from_millis(2),
            small_min: 64 << 10,
            split_min: 16 << 10,
            small_time: Duration::from_micros(500),
            ack_bytes: 256 << 10,
        };
        let view = rails[0].view(&w, false, t0 + wire + Duration::from_micros(100));
        assert_eq!(view.inflight, 0);
        assert!(view.latency <= Duration::from_micros(50), "latency {:?} counts the transmission", view.latency);
        assert!(view.rate > 0.0, "a fresh sample is planned with");
        // Long after, with nothing measured since, the scheduler plans
        // without it (lone messages then split evenly, or by `@RATE` hints)
        // while the rail's timeouts still drain at the last rate.
        let later = t0 + Duration::from_secs(11);
        assert_eq!(rails[0].view(&w, false, later).rate, 0.0);
        assert!(rails[0].drain_rate(later) > 9e7);
    }
}
