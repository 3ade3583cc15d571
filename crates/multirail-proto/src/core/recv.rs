//! The receiving side: frames in, messages out. Messages become matchable
//! strictly in sequence order (MPI non-overtaking); their fragments land
//! by offset in the posted buffer (or an unexpected buffer bounded by the
//! credits we granted), from any rail, in any order.

use bytes::{Bytes, BytesMut};

use crate::wire::{Flags, FrameHeader, Op, frame::payload_checksum};

use super::recvbuf::RecvBuffer;
use super::{
    Core, Event, MESSAGE_OVERHEAD, Owed, PayloadDest, PeerId, Posted, ProtocolError, RTS_CREDITS, RailId, RangeSet,
    RecvError, ReqId, SEQ_WINDOW, Status, Transmit, push_wake, take_at,
};
use crate::time::Time;

/// Ranges pending acknowledgement on one rail before an ACK goes out
/// regardless of bytes (a flood of tiny fragments cannot grow the list).
const MAX_PENDING_RANGES: usize = 1024;
/// CTS answers to re-sent RTSs for one message (a sender re-sends its RTS
/// once per failed rail; more is a peer misbehaving).
const MAX_CTS_RESENDS: u8 = 16;
/// Bytes of control frames queued for one rail. A peer that keeps sending
/// while it does not read ours would grow this without bound.
pub const MAX_CTRL_BACKLOG: usize = 4 << 20;

/// Where a message's bytes go.
#[derive(Debug)]
pub(crate) enum InBuf {
    /// Not decided yet (only between creation and matching).
    None,
    /// An unexpected buffer of our own, exactly the message length.
    Own(RecvBuffer),
    /// The application's posted buffer.
    User(RecvBuffer),
    /// Nobody wants the bytes (truncated receive): count and drop them.
    Discard,
}

#[derive(Debug)]
pub(crate) struct InMsg {
    pub tag: u64,
    pub total: u64,
    pub eager: bool,
    pub buf: InBuf,
    pub received: RangeSet,
    /// Fragments fully received (a zero-length message has one).
    pub frames: u64,
    /// The receive this message matched.
    pub req: Option<ReqId>,
    /// The application's buffer while the bytes are still in `Own`.
    pub user_buf: Option<BytesMut>,
    /// Credits to give back once the bytes no longer occupy our memory.
    pub credit: u64,
    /// Rail the RTS came on; the CTS goes back on it.
    pub rts_rail: RailId,
    pub cts_sent: bool,
    pub cts_resends: u8,
    /// The rail the CTS went on while no DATA arrived yet (that rail owes
    /// us the data, see `liveness`), and when it went.
    pub cts_rail: Option<RailId>,
    pub cts_at: Time,
}

impl InMsg {
    fn new(hdr: &FrameHeader, credit: u64, rail: RailId) -> InMsg {
        InMsg {
            tag: hdr.tag,
            total: hdr.total_len,
            eager: hdr.op == Op::Eager,
            buf: InBuf::None,
            received: RangeSet::new(),
            frames: 0,
            req: None,
            user_buf: None,
            credit,
            rts_rail: rail,
            cts_sent: false,
            cts_resends: 0,
            cts_rail: None,
            cts_at: Time::ZERO,
        }
    }

    /// Every byte is in and no piece of the buffer is out on lease.
    pub fn is_complete(&self) -> bool {
        let leased = match &self.buf {
            InBuf::Own(b) | InBuf::User(b) => b.leased(),
            _ => 0,
        };
        self.frames > 0 && self.received.covered() == self.total && leased == 0
    }

    /// For failing a matched receive: its request and the user's buffer.
    pub fn into_request_buffer(self) -> Option<(ReqId, BytesMut)> {
        let req = self.req?;
        let buf = match (self.buf, self.user_buf) {
            (_, Some(b)) => b,
            (InBuf::User(b), None) => b.into_inner(),
            _ => BytesMut::new(),
        };
        Some((req, buf))
    }

    fn check_same(&self, hdr: &FrameHeader, seq: u64) -> Result<(), ProtocolError> {
        if hdr.tag != self.tag {
            return Err(ProtocolError::Inconsistent { seq, what: "tag" });
        }
        if hdr.total_len != self.total {
            return Err(ProtocolError::Inconsistent { seq, what: "total length" });
        }
        let eager = hdr.op == Op::Eager;
        if hdr.op != Op::Rts && eager != self.eager {
            return Err(ProtocolError::Inconsistent { seq, what: "eager vs rendezvous" });
        }
        Ok(())
    }

    /// Where the payload of `hdr`, arriving on `rail`, goes. With `data`
    /// (the payload is in memory already), a fresh fragment whose range of
    /// the buffer is at home is copied there at once: [`Dest::Stored`].
    fn dest_for(&mut self, hdr: &FrameHeader, rail: RailId, data: Option<&[u8]>) -> Result<Dest, ProtocolError> {
        let (off, len) = (hdr.offset, hdr.frag_len as u64);
        let fresh = !self.received.overlaps(off, off + len) && (len > 0 || self.frames == 0);
        if let (Some(d), true, InBuf::Own(b) | InBuf::User(b)) = (data, fresh, &mut self.buf)
            && b.copy_in(off, d)
        {
            return Ok(Dest::Stored);
        }
        self.lease_for(hdr, rail).map(Dest::Payload)
    }

    fn lease_for(&mut self, hdr: &FrameHeader, rail: RailId) -> Result<PayloadDest, ProtocolError> {
        let (off, len) = (hdr.offset, hdr.frag_len as u64);
        if self.received.contains(off, off + len) && (len > 0 || self.frames > 0) {
            // A duplicate (re-sent after a rail failure): compare it.
            return Ok(match self.buf {
                InBuf::Own(_) | InBuf::User(_) => PayloadDest::Scratch(vec![0; len as usize]),
                _ => PayloadDest::Discard,
            });
        }
        if self.received.overlaps(off, off + len) {
            return Err(ProtocolError::Inconsistent { seq: hdr.seq, what: "fragment overlaps an earlier one" });
        }
        Ok(match &mut self.buf {
            InBuf::Own(b) | InBuf::User(b) => match b.lease(off, len, rail) {
                Some(l) => PayloadDest::Lease(l),
                None => match b.holder(off, len) {
                    // Another rail went quiet in the middle of this
                    // fragment, and the sender re-sent it here: the silent
                    // rail's piece is given up, this copy is read instead.
                    Some(h) if h != rail => {
                        b.abandon(off);
                        b.lease(off, len, rail).map_or(PayloadDest::Discard, PayloadDest::Lease)
                    }
                    _ => PayloadDest::Discard,
                },
            },
            InBuf::None | InBuf::Discard => PayloadDest::Discard,
        })
    }
}

/// What became of a payload: the core stored it itself, or it goes to a
/// destination the caller fills.
pub(crate) enum Dest {
    Stored,
    Payload(PayloadDest),
}

impl Dest {
    fn payload(self) -> PayloadDest {
        match self {
            Dest::Payload(p) => p,
            // Only `on_frame` passes data that can be stored.
            Dest::Stored => PayloadDest::None,
        }
    }
}

impl Core {
    /// A frame header arrived on `rail` from `peer`. Returns where its
    /// payload goes; read it there and call [`Core::on_payload`]. An error
    /// means the peer broke the protocol: close this rail.
    pub fn on_header(
        &mut self,
        peer: PeerId,
        rail: RailId,
        hdr: &FrameHeader,
        now: Time,
    ) -> Result<PayloadDest, ProtocolError> {
        self.header_dest(peer, rail, hdr, now, None).map(Dest::payload)
    }

    /// [`Core::on_header`], storing the payload at once when `data` has it
    /// and its place in the buffer is free.
    fn header_dest(
        &mut self,
        peer: PeerId,
        rail: RailId,
        hdr: &FrameHeader,
        now: Time,
        data: Option<&[u8]>,
    ) -> Result<Dest, ProtocolError> {
        if !self.accept_header(peer, rail, hdr, now)? {
            return Ok(Dest::Payload(PayloadDest::Discard));
        }
        self.dispatch(peer, rail, hdr, now, data)
    }

    /// What every frame does first: notes that the peer and the rail are
    /// alive and takes the piggybacked delivered prefix. False: the frame
    /// is not for us any more (peer failed, rail declared down); drop it.
    fn accept_header(
        &mut self,
        peer: PeerId,
        rail: RailId,
        hdr: &FrameHeader,
        now: Time,
    ) -> Result<bool, ProtocolError> {
        self.active.insert(peer);
        let Some(p) = self.peers.get_mut(&peer) else { return Ok(false) };
        if p.failed.is_some() {
            return Ok(false);
        }
        match p.rails.get_mut(rail) {
            Some(r) if r.up && r.ctrl_bytes >= MAX_CTRL_BACKLOG => {
                return Err(ProtocolError::ControlBacklog { bytes: r.ctrl_bytes });
            }
            Some(r) if r.up => r.last_rx = now,
            // A rail we declared down: the driver is closing it.
            _ => return Ok(false),
        }
        p.last_rx = now;
        if hdr.flags.contains(Flags::ACKED) {
            let prefix = p.widen_prefix(hdr.aux).ok_or(ProtocolError::BogusAck { seq: hdr.aux as u64 })?;
            self.rx_prefix(peer, prefix, now)?;
        }
        Ok(true)
    }

    /// The rest of [`Core::header_dest`], by operation.
    fn dispatch(
        &mut self,
        peer: PeerId,
        rail: RailId,
        hdr: &FrameHeader,
        now: Time,
        data: Option<&[u8]>,
    ) -> Result<Dest, ProtocolError> {
        let p = self.peers.get_mut(&peer).expect("accept_header checked");
        let none = Dest::Payload(PayloadDest::None);
        match hdr.op {
            Op::Eager => self.rx_eager(peer, rail, hdr, now, data),
            Op::Data => self.rx_data(peer, rail, hdr, data),
            Op::Rts => self.rx_rts(peer, rail, hdr, now).map(|_| none),
            Op::Cts => self.rx_cts(peer, hdr, now).map(|_| none),
            Op::Ack => Ok(Dest::Payload(PayloadDest::Scratch(vec![0; hdr.payload_len()]))),
            Op::Heartbeat => {
                self.rx_heartbeat(peer, rail, hdr, now);
                Ok(none)
            }
            Op::Close => {
                p.closed_by_peer = true;
                Ok(none)
            }
        }
    }

    /// The payload of `hdr` is in `dest` (`complete`), or the rail failed
    /// while reading it (`!complete`: the bytes are not used).
    pub fn on_payload(
        &mut self,
        peer: PeerId,
        rail: RailId,
        hdr: &FrameHeader,
        dest: PayloadDest,
        complete: bool,
        now: Time,
    ) -> Result<(), ProtocolError> {
        if !self.peers.contains_key(&peer) {
            return Ok(());
        }
        match dest {
            PayloadDest::None => Ok(()),
            PayloadDest::Scratch(v) if hdr.op == Op::Ack => {
                if complete {
                    self.rx_ack(peer, hdr, &v, now)
                } else {
                    Ok(())
                }
            }
            PayloadDest::Scratch(v) => {
                if complete {
                    self.check_duplicate(peer, hdr, &v)?;
                    self.received(peer, rail, hdr, now);
                }
                Ok(())
            }
            PayloadDest::Discard => {
                if complete && hdr.op.carries_data() && !self.dropped_while_leased(peer, hdr) {
                    self.received(peer, rail, hdr, now);
                }
                Ok(())
            }
            PayloadDest::Lease(lease) => {
                let bad_sum =
                    complete && hdr.flags.contains(Flags::CHECKSUM) && payload_checksum(&lease.buf) != hdr.checksum;
                let p = self.peers.get_mut(&peer).expect("checked above");
                let mut current = true;
                if let Some(m) = p.inc.get_mut(&hdr.seq)
                    && let InBuf::Own(b) | InBuf::User(b) = &mut m.buf
                {
                    current = b.give_back(lease);
                }
                if !current {
                    // Abandoned for a copy on another rail: these bytes
                    // are not used (nor acknowledged).
                    return Ok(());
                }
                if bad_sum {
                    return Err(ProtocolError::Checksum { seq: hdr.seq, offset: hdr.offset });
                }
                if complete {
                    self.received(peer, rail, hdr, now);
                } else {
                    self.try_finish(peer, hdr.seq, now);
                }
                Ok(())
            }
        }
    }

    /// A whole frame at once (payload already in memory): a fresh data
    /// fragment is copied straight into its buffer; anything else goes
    /// through `on_header`, a copy and `on_payload`.
    pub fn on_frame(
        &mut self,
        peer: PeerId,
        rail: RailId,
        hdr: &FrameHeader,
        payload: &[u8],
        now: Time,
    ) -> Result<(), ProtocolError> {
        let checked = !hdr.flags.contains(Flags::CHECKSUM) || payload_checksum(payload) == hdr.checksum;
        let data = (hdr.op.carries_data() && checked && payload.len() == hdr.payload_len()).then_some(payload);
        if !self.accept_header(peer, rail, hdr, now)? {
            return Ok(());
        }
        if let Some(d) = data.filter(|_| hdr.op == Op::Eager)
            && self.rx_eager_whole(peer, rail, hdr, d, now)?
        {
            return Ok(());
        }
        match self.dispatch(peer, rail, hdr, now, data)? {
            Dest::Stored => {
                self.received(peer, rail, hdr, now);
                Ok(())
            }
            Dest::Payload(mut dest) => {
                if let Some(dst) = dest.as_mut_slice() {
                    let n = dst.len().min(payload.len());
                    dst[..n].copy_from_slice(&payload[..n]);
                }
                self.on_payload(peer, rail, hdr, dest, true, now)
            }
        }
    }

    fn check_seq(&self, peer: PeerId, seq: u64) -> Result<(), ProtocolError> {
        let p = &self.peers[&peer];
        if seq >= p.next_match.saturating_add(SEQ_WINDOW) {
            return Err(ProtocolError::SeqOutOfWindow { seq, next: p.next_match, window: SEQ_WINDOW });
        }
        Ok(())
    }

    /// Charges `cost` credits to `peer`, refusing a peer that overdraws.
    fn charge(&mut self, peer: PeerId, cost: u64) -> Result<(), ProtocolError> {
        let limit = self.cfg.unexpected_limit;
        let p = self.peers.get_mut(&peer).expect("caller checked");
        if p.credit_used.saturating_add(cost) > limit {
            return Err(ProtocolError::CreditExceeded { used: p.credit_used, cost, limit });
        }
        p.credit_used += cost;
        Ok(())
    }

    fn is_done(&self, peer: PeerId, seq: u64) -> bool {
        // u64::MAX is never a delivered message (and `seq + 1` would overflow).
        seq.checked_add(1).is_some_and(|end| self.peers[&peer].done.contains(seq, end))
    }

    fn rx_eager(
        &mut self,
        peer: PeerId,
        rail: RailId,
        hdr: &FrameHeader,
        now: Time,
        data: Option<&[u8]>,
    ) -> Result<Dest, ProtocolError> {
        let seq = hdr.seq;
        if self.is_done(peer, seq) {
            return Ok(Dest::Payload(PayloadDest::Discard));
        }
        self.check_seq(peer, seq)?;
        if !self.peers[&peer].inc.contains_key(&seq) {
            if seq < self.peers[&peer].next_match {
                return Err(ProtocolError::UnknownMessage { op: hdr.op, seq });
            }
            if hdr.total_len > self.cfg.unexpected_limit {
                return Err(ProtocolError::EagerTooLong { len: hdr.total_len, limit: self.cfg.unexpected_limit });
            }
            let cost = hdr.total_len + MESSAGE_OVERHEAD;
            self.charge(peer, cost)?;
            self.peers.get_mut(&peer).expect("checked").inc.insert(seq, Box::new(InMsg::new(hdr, cost, rail)));
            self.advance_matching(peer, now);
            let m = self.peers.get_mut(&peer).expect("checked").inc.get_mut(&seq).expect("just inserted");
            if matches!(m.buf, InBuf::None) {
                m.buf = InBuf::Own(RecvBuffer::new(BytesMut::zeroed(hdr.total_len as usize)));
            }
        }
        let m = self.peers.get_mut(&peer).expect("checked").inc.get_mut(&seq).expect("present");
        m.check_same(hdr, seq)?;
        m.dest_for(hdr, rail, data)
    }

    /// The common case of a small message, taken without the general
    /// machinery: a whole eager message (one frame) that is the next to
    /// match and meets a posted receive large enough goes straight into
    /// that receive's buffer and completes it; one that meets no receive
    /// is kept aside whole ([`Core::store_unexpected`]). No
    /// incoming-message state is created. Returns false (nothing done) in
    /// every other case, which the general path handles: out of order, a
    /// fragment, truncated, over the credit or length limits.
    fn rx_eager_whole(
        &mut self,
        peer: PeerId,
        rail: RailId,
        hdr: &FrameHeader,
        data: &[u8],
        now: Time,
    ) -> Result<bool, ProtocolError> {
        let (seq, len) = (hdr.seq, hdr.total_len);
        let p = self.peers.get_mut(&peer).expect("accept_header checked");
        // `inc` never holds `next_match` between calls (advance_matching
        // takes it at once), so this message is fresh: not a duplicate,
        // not begun on another rail.
        if seq != p.next_match || hdr.offset != 0 || hdr.frag_len as u64 != len {
            return Ok(false);
        }
        let cost = len + MESSAGE_OVERHEAD;
        if len > self.cfg.unexpected_limit || p.credit_used.saturating_add(cost) > self.cfg.unexpected_limit {
            return Ok(false);
        }
        let Some(i) = self.posted.iter().position(|x| x.matches(peer, hdr.tag)) else {
            self.store_unexpected(peer, rail, hdr, data, cost, now)?;
            return Ok(true);
        };
        if (self.posted[i].buf.len() as u64) < len {
            return Ok(false);
        }
        let Posted { req, src, mut buf, .. } = take_at(&mut self.posted, i).expect("index from position");
        if src == Some(peer) {
            p.posted_from = p.posted_from.saturating_sub(1);
        }
        p.next_match += 1;
        buf[..data.len()].copy_from_slice(data);
        p.done.insert(seq, seq + 1);
        let later_arrived = !p.inc.is_empty();
        self.fast_rx += 1;
        self.events.push_back(Event::RecvDone { req, result: Ok(Status { peer, tag: hdr.tag, len }), buf });
        if later_arrived {
            // Messages that overtook this one become matchable now.
            self.advance_matching(peer, now);
        }
        // The credit is taken and given back at once, as the general path
        // does when a message meets its receive before its bytes.
        self.charge(peer, cost)?;
        self.return_credit(peer, cost, now);
        self.note_rx(peer, rail, hdr, len >= self.cfg.ack_bytes, now);
        Ok(true)
    }

    /// A whole eager message that is the next to match and meets no posted
    /// receive (the caller checked, and that its credit fits): its bytes
    /// are kept aside in [`Peer::stored`] with its credit charged, until a
    /// receive takes them ([`Core::deliver_stored`]). The message counts
    /// as delivered at once (`done`): the peer may let its copy go (the
    /// general path acknowledges an unexpected message's fragments as
    /// they arrive, too), and a copy re-sent over another rail is dropped
    /// as a duplicate. Costs an allocation and a copy, where the general
    /// path's incoming-message state cost about 2400 instructions more
    /// per message.
    fn store_unexpected(
        &mut self,
        peer: PeerId,
        rail: RailId,
        hdr: &FrameHeader,
        data: &[u8],
        cost: u64,
        now: Time,
    ) -> Result<(), ProtocolError> {
        let (seq, tag) = (hdr.seq, hdr.tag);
        let p = self.peers.get_mut(&peer).expect("accept_header checked");
        p.next_match += 1;
        p.done.insert(seq, seq + 1);
        p.stored.push_back(super::Stored { seq, tag, data: BytesMut::from(data), credit: cost });
        let later_arrived = !p.inc.is_empty();
        self.unexpected.push_back(super::Unmatched { peer, seq, tag, stored: true });
        self.stored_rx += 1;
        if later_arrived {
            self.advance_matching(peer, now);
        }
        self.charge(peer, cost)?;
        self.note_rx(peer, rail, hdr, hdr.total_len >= self.cfg.ack_bytes, now);
        Ok(())
    }

    /// A receive takes the kept-aside message `seq` from `peer` (listed as
    /// unexpected): its bytes are copied into the receive's buffer (or it
    /// is too small: truncated, as [`Core::attach`] reports it) and its
    /// credit goes back.
    pub(crate) fn deliver_stored(&mut self, peer: PeerId, seq: u64, posted: Posted, now: Time) {
        self.active.insert(peer);
        let p = self.peers.get_mut(&peer).expect("listed as unexpected");
        let i = p.stored.iter().position(|s| s.seq == seq).expect("listed as unexpected");
        let s = take_at(&mut p.stored, i).expect("index from position");
        let Posted { req, mut buf, .. } = posted;
        let status = Status { peer, tag: s.tag, len: s.data.len() as u64 };
        let result = if buf.len() < s.data.len() {
            Err(RecvError::Truncated { status, buf_len: buf.len() as u64 })
        } else {
            buf[..s.data.len()].copy_from_slice(&s.data);
            Ok(status)
        };
        self.events.push_back(Event::RecvDone { req, result, buf });
        self.return_credit(peer, s.credit, now);
    }

    fn rx_data(
        &mut self,
        peer: PeerId,
        rail: RailId,
        hdr: &FrameHeader,
        data: Option<&[u8]>,
    ) -> Result<Dest, ProtocolError> {
        let seq = hdr.seq;
        if self.is_done(peer, seq) {
            return Ok(Dest::Payload(PayloadDest::Discard));
        }
        let p = self.peers.get_mut(&peer).expect("caller checked");
        let Some(m) = p.inc.get_mut(&seq) else { return Err(ProtocolError::UnannouncedData { seq }) };
        if m.eager || !m.cts_sent {
            return Err(ProtocolError::UnannouncedData { seq });
        }
        m.check_same(hdr, seq)?;
        // The data started: the CTS got through.
        if let Some(r) = m.cts_rail.take() {
            let at = m.cts_at;
            p.settle(r, at, Owed::Data(seq));
        }
        let m = p.inc.get_mut(&seq).expect("checked above");
        m.dest_for(hdr, rail, data)
    }

    fn rx_rts(&mut self, peer: PeerId, rail: RailId, hdr: &FrameHeader, now: Time) -> Result<(), ProtocolError> {
        let seq = hdr.seq;
        if self.is_done(peer, seq) {
            return Ok(());
        }
        self.check_seq(peer, seq)?;
        let p = self.peers.get_mut(&peer).expect("caller checked");
        if let Some(m) = p.inc.get_mut(&seq) {
            m.check_same(hdr, seq)?;
            if m.eager {
                return Err(ProtocolError::Inconsistent { seq, what: "RTS for an eager message" });
            }
            // The sender re-sent its RTS (its first rail failed): answer
            // on the rail it uses now.
            m.rts_rail = rail;
            if let Some(old) = m.cts_rail.filter(|_| m.cts_sent && m.cts_resends < MAX_CTS_RESENDS) {
                m.cts_resends += 1;
                // Our CTS may have died with a rail: send it again.
                let was = m.cts_at;
                m.cts_rail = Some(rail);
                m.cts_at = now;
                let cts = cts_frame(seq, m.tag, m.total, false);
                p.settle(old, was, Owed::Data(seq));
                p.owe(rail, now, Owed::Data(seq));
                p.rails[rail].push_ctrl(cts);
                push_wake(&mut self.wakeups, peer, rail);
            }
            return Ok(());
        }
        if seq < p.next_match {
            return Err(ProtocolError::UnknownMessage { op: hdr.op, seq });
        }
        let p = self.peers.get_mut(&peer).expect("caller checked");
        if p.rts_used >= RTS_CREDITS {
            return Err(ProtocolError::RtsCreditExceeded { limit: RTS_CREDITS });
        }
        p.rts_used += 1;
        p.inc.insert(seq, Box::new(InMsg::new(hdr, 0, rail)));
        self.advance_matching(peer, now);
        Ok(())
    }

    /// Makes every consecutive arrived message matchable, in order.
    fn advance_matching(&mut self, peer: PeerId, now: Time) {
        loop {
            let p = self.peers.get_mut(&peer).expect("caller checked");
            let seq = p.next_match;
            let Some(m) = p.inc.get(&seq) else { break };
            let tag = m.tag;
            p.next_match += 1;
            match self.posted.iter().position(|x| x.matches(peer, tag)) {
                Some(i) => {
                    let posted = take_at(&mut self.posted, i).expect("index from position");
                    if posted.src == Some(peer) {
                        let p = self.peers.get_mut(&peer).expect("caller checked");
                        p.posted_from = p.posted_from.saturating_sub(1);
                    }
                    self.attach(peer, seq, posted, now);
                }
                None => self.unexpected.push_back(super::Unmatched { peer, seq, tag, stored: false }),
            }
        }
    }

    /// Gives back a message's credits (its bytes left our memory). The
    /// counters are cumulative; they travel in the next ACK or PONG.
    fn return_credit(&mut self, peer: PeerId, credit: u64, now: Time) {
        self.active.insert(peer);
        let quarter = (self.cfg.unexpected_limit / 4).max(1);
        let p = self.peers.get_mut(&peer).expect("caller checked");
        if credit == 0 && p.rts_returned == p.rts_reported {
            return;
        }
        p.credit_used = p.credit_used.saturating_sub(credit);
        p.credit_returned += credit;
        if p.credit_returned - p.credit_reported >= quarter || p.rts_returned - p.rts_reported >= RTS_CREDITS / 4 {
            self.flush_acks(peer, now, true);
        } else if p.credit_due.is_none() {
            p.credit_due = Some(now + self.cfg.credit_delay);
        }
    }

    /// Matches message `seq` from `peer` with a posted receive.
    pub(crate) fn attach(&mut self, peer: PeerId, seq: u64, posted: Posted, now: Time) {
        self.active.insert(peer);
        let p = self.peers.get_mut(&peer).expect("caller checked");
        let m = p.inc.get_mut(&seq).expect("caller checked");
        let Posted { req, buf, .. } = posted;
        if m.total > buf.len() as u64 {
            let status = Status { peer, tag: m.tag, len: m.total };
            let err = RecvError::Truncated { status, buf_len: buf.len() as u64 };
            self.events.push_back(Event::RecvDone { req, result: Err(err), buf });
            self.attach_truncated(peer, seq, now);
            return;
        }
        let credit = if !m.eager {
            m.req = Some(req);
            m.cts_sent = true;
            m.buf = InBuf::User(RecvBuffer::new(buf));
            let credit = std::mem::take(&mut m.credit);
            self.answer_rts(peer, seq, false, now);
            credit
        } else if matches!(m.buf, InBuf::None) {
            // Matched before any byte arrived: receive in place.
            m.buf = InBuf::User(RecvBuffer::new(buf));
            m.req = Some(req);
            std::mem::take(&mut m.credit)
        } else {
            // Bytes are (partly) in our unexpected buffer; copied at the end.
            m.req = Some(req);
            m.user_buf = Some(buf);
            self.try_finish(peer, seq, now);
            return;
        };
        self.return_credit(peer, credit, now);
    }

    /// The receive matched to `seq` was too small (already reported).
    fn attach_truncated(&mut self, peer: PeerId, seq: u64, now: Time) {
        let p = self.peers.get_mut(&peer).expect("caller checked");
        let m = p.inc.get_mut(&seq).expect("caller checked");
        let credit = std::mem::take(&mut m.credit);
        if m.eager {
            // Keep counting fragments so duplicates are recognised, but
            // hold no bytes.
            m.buf = InBuf::Discard;
        } else {
            // Tell the sender not to send the data.
            self.answer_rts(peer, seq, true, now);
            let p = self.peers.get_mut(&peer).expect("caller checked");
            p.inc.remove(&seq);
            p.done.insert(seq, seq + 1);
        }
        self.return_credit(peer, credit, now);
        self.try_finish(peer, seq, now);
    }

    /// Answers the RTS of message `seq` with a CTS (DISCARD when the
    /// receive is too small), on the rail the RTS came by if it is usable,
    /// else the best usable rail, and gives the sender its RTS credit back.
    fn answer_rts(&mut self, peer: PeerId, seq: u64, discard: bool, now: Time) {
        let p = self.peers.get_mut(&peer).expect("caller checked");
        let Some(rail) = p.carrier(p.inc[&seq].rts_rail).or_else(|| p.rails.iter().position(|r| r.up)) else {
            // No rail at all: the CTS goes when one comes up.
            let m = p.inc.get_mut(&seq).expect("caller checked");
            if !discard {
                let rail = m.rts_rail;
                m.cts_rail = Some(rail);
                m.cts_at = now;
                p.owe(rail, now, Owed::Data(seq));
            }
            p.rts_used -= 1;
            p.rts_returned += 1;
            return;
        };
        let m = p.inc.get_mut(&seq).expect("caller checked");
        let cts = cts_frame(seq, m.tag, m.total, discard);
        if !discard {
            m.cts_rail = Some(rail);
            m.cts_at = now;
            p.owe(rail, now, Owed::Data(seq));
        }
        p.rails[rail].push_ctrl(cts);
        p.rts_used -= 1;
        p.rts_returned += 1;
        push_wake(&mut self.wakeups, peer, rail);
    }

    /// Records a fully received fragment and acknowledges it.
    fn received(&mut self, peer: PeerId, rail: RailId, hdr: &FrameHeader, now: Time) {
        let ack_bytes = self.cfg.ack_bytes;
        let p = self.peers.get_mut(&peer).expect("caller checked");
        let seq = hdr.seq;
        let mut big_done = false;
        if let Some(m) = p.inc.get_mut(&seq) {
            m.received.insert(hdr.offset, hdr.offset + hdr.frag_len as u64);
            m.frames += 1;
            big_done = m.received.covered() == m.total && m.total >= ack_bytes;
        }
        self.note_rx(peer, rail, hdr, big_done, now);
        self.try_finish(peer, seq, now);
    }

    /// Counts a received fragment on its rail and acknowledges it: in an
    /// ACK at once when enough is pending (or a large message completed,
    /// `big_done`), else within the ACK delay.
    fn note_rx(&mut self, peer: PeerId, rail: RailId, hdr: &FrameHeader, big_done: bool, now: Time) {
        let (ack_bytes, ack_delay) = (self.cfg.ack_bytes, self.cfg.ack_delay);
        let p = self.peers.get_mut(&peer).expect("caller checked");
        let seq = hdr.seq;
        if let Some(r) = p.rails.get_mut(rail) {
            r.stats.rx_bytes += hdr.frag_len as u64;
            r.stats.rx_frames += 1;
            if r.up {
                r.note_received(seq, hdr.offset, hdr.frag_len);
            }
            let asked = hdr.flags.contains(Flags::ACK_NOW);
            if r.ack_bytes >= ack_bytes || big_done || asked || r.acks.len() >= MAX_PENDING_RANGES {
                self.flush_rail_acks(peer, rail);
            } else if p.ack_due.is_none() {
                p.ack_due = Some(now + ack_delay);
            }
        }
    }

    /// True if the payload of `hdr` was dropped only because another rail
    /// was reading the same range into the buffer at the time: those bytes
    /// are not in, and if that read fails the sender must still re-send
    /// them, so the copy is neither recorded nor acknowledged.
    fn dropped_while_leased(&self, peer: PeerId, hdr: &FrameHeader) -> bool {
        let Some(m) = self.peers[&peer].inc.get(&hdr.seq) else { return false };
        matches!(m.buf, InBuf::Own(_) | InBuf::User(_))
            && !m.received.contains(hdr.offset, hdr.offset + hdr.frag_len as u64)
    }

    fn check_duplicate(&self, peer: PeerId, hdr: &FrameHeader, bytes: &[u8]) -> Result<(), ProtocolError> {
        let Some(m) = self.peers[&peer].inc.get(&hdr.seq) else { return Ok(()) };
        let mut have = vec![0u8; bytes.len()];
        let known = match &m.buf {
            InBuf::Own(b) | InBuf::User(b) => b.copy_out(hdr.offset, &mut have),
            _ => false,
        };
        if known && have != bytes {
            return Err(ProtocolError::ConflictingDuplicate { seq: hdr.seq, offset: hdr.offset });
        }
        Ok(())
    }

    /// Completes message `seq` if all its bytes are in and it is matched.
    pub(crate) fn try_finish(&mut self, peer: PeerId, seq: u64, now: Time) {
        let p = self.peers.get_mut(&peer).expect("caller checked");
        let Some(m) = p.inc.get(&seq) else { return };
        if !m.is_complete() {
            return;
        }
        let matched = m.req.is_some() || matches!(m.buf, InBuf::Discard);
        if !matched {
            return; // complete but unexpected: waits for a receive
        }
        let mut m = p.inc.remove(&seq).expect("present");
        if let Some(r) = m.cts_rail.take() {
            p.settle(r, m.cts_at, Owed::Data(seq));
        }
        p.done.insert(seq, seq + 1);
        let status = Status { peer, tag: m.tag, len: m.total };
        let credit = std::mem::take(&mut m.credit);
        match (std::mem::replace(&mut m.buf, InBuf::None), m.req) {
            (InBuf::User(b), Some(req)) => {
                self.events.push_back(Event::RecvDone { req, result: Ok(status), buf: b.into_inner() });
            }
            (InBuf::Own(b), Some(req)) => {
                let mut user = m.user_buf.take().unwrap_or_default();
                let own = b.into_inner();
                user[..own.len()].copy_from_slice(&own);
                self.events.push_back(Event::RecvDone { req, result: Ok(status), buf: user });
            }
            _ => {}
        }
        self.return_credit(peer, credit, now);
    }

    /// Queues an ACK with every pending range of `rail` (and the credit
    /// counters), on `rail` while it is usable, else on the best usable
    /// rail (the ranges still say which fragments arrived).
    pub(crate) fn flush_rail_acks(&mut self, peer: PeerId, rail: RailId) {
        let max_ranges = (self.cfg.limits.max_frame as usize / crate::wire::AckRange::LEN).clamp(1, 4096);
        let p = self.peers.get_mut(&peer).expect("caller checked");
        let Some(carrier) = p.carrier(rail) else { return };
        let r = &mut p.rails[rail];
        let ranges = std::mem::take(&mut r.acks);
        r.ack_bytes = 0;
        let mut chunks: Vec<&[crate::wire::AckRange]> = ranges.chunks(max_ranges).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        p.credit_reported = p.credit_returned;
        p.rts_reported = p.rts_returned;
        for c in chunks {
            let repr = crate::wire::AckRepr { ranges: c.to_vec() };
            let mut h = FrameHeader::new(Op::Ack);
            // `seq` (the delivered prefix) is filled in when it leaves.
            h.total_len = p.credit_returned;
            h.tag = p.rts_returned;
            h.aux = c.len() as u32;
            h.frag_len = repr.buffer_len() as u32;
            p.rails[carrier].push_ctrl(Transmit { header: h, payload: Bytes::from(repr.to_vec()) });
        }
        push_wake(&mut self.wakeups, peer, carrier);
    }

    /// Sends every pending acknowledgement of `peer` now; with
    /// `include_credit`, also credit counters not reported yet.
    pub(crate) fn flush_acks(&mut self, peer: PeerId, _now: Time, include_credit: bool) {
        let p = self.peers.get_mut(&peer).expect("caller checked");
        p.ack_due = None;
        if include_credit {
            p.credit_due = None;
        }
        let rails: Vec<RailId> =
            p.rails.iter().enumerate().filter(|(_, r)| r.up && !r.acks.is_empty()).map(|(i, _)| i).collect();
        for rail in &rails {
            self.flush_rail_acks(peer, *rail);
        }
        let p = self.peers.get_mut(&peer).expect("caller checked");
        let unreported = p.credit_returned > p.credit_reported || p.rts_returned > p.rts_reported;
        if include_credit
            && unreported
            && let Some(rail) = p.best_ctrl_rail()
        {
            self.flush_rail_acks(peer, rail);
        }
    }

    /// Stamps an outgoing frame with our delivered prefix (ACK: in `seq`;
    /// any other frame: low 32 bits in `aux`, flag ACKED). Pending ranges
    /// of messages below it need no ACK of their own any more.
    pub(crate) fn piggyback(&mut self, peer: PeerId, h: &mut FrameHeader) {
        let Some(p) = self.peers.get_mut(&peer) else { return };
        let prefix = p.done.prefix();
        if h.op == Op::Ack {
            h.seq = prefix;
        } else {
            h.flags = h.flags.with(Flags::ACKED);
            h.aux = prefix as u32;
        }
        for r in p.rails.iter_mut() {
            r.drop_acked_below(prefix);
        }
        if p.rails.iter().all(|r| r.acks.is_empty()) {
            // Nothing left to acknowledge; returned credits keep their own
            // (longer) timer.
            p.ack_due = None;
        }
    }
}

impl super::Peer {
    /// The full delivered prefix from its low 32 bits, relative to what we
    /// sent: it lies in `[next_seq - 2^32, next_seq]`. `None` if no such
    /// value exists (the peer claims messages we never sent).
    pub(crate) fn widen_prefix(&self, low: u32) -> Option<u64> {
        let hi = self.next_seq;
        let cand = (hi & !0xffff_ffff) | low as u64;
        if cand <= hi { Some(cand) } else { cand.checked_sub(1 << 32) }
    }
}

pub(crate) fn cts_frame(seq: u64, tag: u64, total: u64, discard: bool) -> Transmit {
    let mut h = FrameHeader::new(Op::Cts);
    h.seq = seq;
    h.tag = tag;
    h.total_len = total;
    if discard {
        h.flags = Flags::DISCARD;
    }
    Transmit { header: h, payload: Bytes::new() }
}
