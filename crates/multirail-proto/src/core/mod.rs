//! The endpoint state machine.
//!
//! [`Core`] is everything one endpoint knows about its peers, with no IO.
//! Its methods fall in four groups; call them in this order in a loop:
//!
//! * **setup**: [`Core::add_peer`]; then, as connections come and go,
//!   [`Core::rail_up`] (a handshake completed; also for a connection that
//!   replaces another), [`Core::rail_down`] (a connection failed loudly),
//!   [`Core::connect_failed`] and [`Core::peer_unreachable`];
//! * **application commands**: [`Core::isend`], [`Core::irecv`],
//!   [`Core::close`];
//! * **inputs from rails**: [`Core::on_header`] when a frame header was read
//!   (it says where the payload goes), then [`Core::on_payload`] once the
//!   payload is in; [`Core::rail_activity`] while a long payload streams
//!   in; [`Core::on_sent`] when frames were written;
//!   [`Core::handle_timeout`] when the deadline from
//!   [`Core::poll_timeout`] passes;
//! * **outputs**: [`Core::poll_transmit`] per rail (frames to write, in
//!   order), [`Core::poll_connect`] (connections to open),
//!   [`Core::poll_event`] (completed requests, rail and peer news),
//!   [`Core::take_wakeups`] (rails that have new output).
//!
//! Every input carries `now`; the core never reads a clock.
//!
//! Guarantees: messages from one peer are matched in the order they were
//! sent, whatever rails their fragments took; every message is delivered
//! exactly once while at least one rail to its peer works; memory held for
//! a peer is bounded by the credits we granted it plus the buffers the
//! application posted, never by lengths a peer claims. How rails and peers
//! are judged alive is in [`liveness`]; which connections are opened when,
//! in [`connect`].

pub mod connect;
mod frags;
pub mod liveness;
pub(crate) mod peermap;
mod rail;
mod ranges;
mod recv;
mod recvbuf;
mod send;
mod seqmap;

pub(crate) use seqmap::{SeqMap, SeqSet};

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use crate::sched::{BuiltinSchedulers, PolicyTable, Scheduler, SchedulerFactory};
use crate::time::Time;
use crate::wire::frame::Limits;
use crate::wire::{FrameHeader, Op, WireError};

pub use connect::{ConnectFailure, ConnectRequest};
pub(crate) use rail::Owed;
pub use rail::{RATE_WINDOW, RailStats};
pub use ranges::RangeSet;
pub use recvbuf::{Lease, RecvBuffer};

use peermap::{ActiveSet, PeerMap};
use rail::RailState;
use recv::InMsg;
use send::OutMsg;

/// A peer is named by its rank.
pub type PeerId = u32;
/// A rail is named by its index in the rail list (the same on both sides).
pub type RailId = usize;

/// Credits charged per message on top of its eager payload: what the
/// receiver spends on bookkeeping for one unexpected message.
pub const MESSAGE_OVERHEAD: u64 = 64;

/// Rendezvous announcements (RTS) a peer may have outstanding at our side
/// beyond its eager credit: when eager credit runs out, messages still get
/// announced, so a receive for another tag can match them.
pub const RTS_CREDITS: u64 = 4096;

/// How far ahead of the next message to match a peer may number messages.
pub const SEQ_WINDOW: u64 = 1 << 24;

/// Identifies a send or receive request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReqId(pub u64);

/// Protocol tunables. Defaults are documented (and justified) in the
/// README's environment-variable table.
#[derive(Debug, Clone)]
pub struct Config {
    /// Our rank.
    pub rank: u32,
    /// Messages up to this size go eager; larger ones use rendezvous.
    pub eager_limit: u64,
    /// Unexpected eager bytes we buffer per peer (granted as credits).
    pub unexpected_limit: u64,
    /// Largest chunk a scheduler hands to a rail (one frame).
    pub chunk: u64,
    /// Bounds on what peers may send.
    pub limits: Limits,
    /// Scheduling policy by message size.
    pub policy: PolicyTable,
    /// Put a CRC32C of the payload in every data frame and check it.
    pub checksum: bool,
    /// A small eager message to a peer reached over one rail, with nothing
    /// of the general path waiting to be written, goes straight onto that
    /// rail's queue, kept only in a per-peer list until the peer
    /// acknowledges it (no scheduling, no per-fragment state): the direct
    /// path (docs/protocol.md §5; `MULTIRAIL_DIRECT`).
    pub direct_eager: bool,
    /// Longest an acknowledgement is held back to be batched.
    pub ack_delay: Duration,
    /// Longest returned credits wait for a frame to ride on before an ACK
    /// of their own goes (a quarter of the grant owed goes at once).
    pub credit_delay: Duration,
    /// Acknowledge at once when this many bytes are unacknowledged on a rail.
    pub ack_bytes: u64,
    /// Most bytes one rail may have in flight (assigned, unacknowledged).
    /// The window actually used follows the rail's measured throughput:
    /// `rail_window_time` worth of bytes, at least `rail_window_min`, at
    /// most this.
    pub rail_window: u64,
    pub rail_window_min: u64,
    pub rail_window_time: Duration,
    /// The shorter window small whole messages (`spread`) are placed
    /// against: the rail's rate times (`spread_window_time` + its smallest
    /// raw round trip + its excess round trip), at least
    /// `spread_window_min`, at most the rail's window. Messages that find
    /// no rail within it wait and go to the first rail whose
    /// acknowledgements free room, so the rails' actual speeds decide the
    /// split, not their estimates. Rails inside the host
    /// ([`RailCaps::host_local`]) have none: their speed is the CPUs',
    /// and the round trips the short window waits for cost more than a
    /// wrong split (4 KiB `bench bw` ran at 0.58 x with it over shm).
    pub spread_window_time: Duration,
    pub spread_window_min: u64,
    /// The floor of the short window instead of `spread_window_min` when
    /// the peer has several rails, where the window decides the split:
    /// a stream's rate estimate is often absent or read from a shaper's
    /// burst, the window is then its floor, and two rails' floors that
    /// hold a whole OSU window of 1-2 KiB messages split it evenly
    /// whatever the rails' speeds (1 + 3 Gbit: twice the slow rail). A
    /// frame asks for an acknowledgement against this window too. The
    /// window holds at least [`crate::sched::SHORT_WINDOW_MESSAGES`] of
    /// the messages placed against it, which also keeps a ping-pong of up
    /// to 16 KiB from asking (its replies carry the acknowledgements).
    pub spread_split_min: u64,
    /// Ask the peer to acknowledge at once (flag ACK_NOW) each time this
    /// fraction of a rail's spread window was written since the last ask:
    /// acknowledgements then come while the window still has room, not
    /// after `ack_bytes` or `ack_delay`. 0 = never ask.
    pub ack_request_div: u32,
    /// Floor of the retransmission timeout (the excess round trip beyond
    /// queueing after which an unacknowledged fragment makes its rail
    /// suspect).
    pub rto_min: Duration,
    /// A rail that owes us an answer other than an acknowledgement and on
    /// which nothing arrived this long is probed.
    pub probe_interval: Duration,
    /// Work pending with a peer and nothing from it on any rail this long:
    /// the peer is declared dead.
    pub peer_timeout: Duration,
    /// A rail suspect this long gets a replacement connection (and again
    /// each time an attempt fails, after the retry delay).
    pub replace_after: Duration,
    /// First delay before retrying a connection; doubles up to
    /// `connect_retry_max`.
    pub connect_retry: Duration,
    pub connect_retry_max: Duration,
    /// Open every rail to every peer at once (`true`), or each rail when a
    /// message first needs it or the peer opens it (`false`).
    pub eager_connect: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            rank: 0,
            eager_limit: 256 << 10,
            unexpected_limit: 8 << 20,
            chunk: 256 << 10,
            limits: Limits::default(),
            policy: PolicyTable::default(),
            checksum: false,
            direct_eager: true,
            ack_delay: Duration::from_millis(1),
            credit_delay: Duration::from_millis(10),
            ack_bytes: 256 << 10,
            rail_window: 16 << 20,
            rail_window_min: 512 << 10,
            rail_window_time: Duration::from_millis(2),
            spread_window_time: Duration::from_micros(500),
            spread_window_min: 64 << 10,
            spread_split_min: 16 << 10,
            ack_request_div: 4,
            rto_min: Duration::from_millis(20),
            probe_interval: Duration::from_millis(200),
            peer_timeout: Duration::from_secs(30),
            replace_after: Duration::from_millis(500),
            connect_retry: Duration::from_millis(100),
            connect_retry_max: Duration::from_millis(500),
            eager_connect: false,
        }
    }
}

/// The window settings of [`Config`], for [`rail::RailState::view`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct WindowCfg {
    pub min: u64,
    pub max: u64,
    pub time: Duration,
    pub small_min: u64,
    /// `Config::spread_split_min`.
    pub split_min: u64,
    pub small_time: Duration,
    /// The peer acknowledges at once when this many bytes are
    /// unacknowledged on a rail (`Config::ack_bytes`; 0 = no such bound).
    pub ack_bytes: u64,
}

impl Config {
    pub(crate) fn window_cfg(&self) -> WindowCfg {
        WindowCfg {
            min: self.rail_window_min.max(2 * self.chunk),
            max: self.rail_window,
            time: self.rail_window_time,
            small_min: self.spread_window_min,
            split_min: self.spread_split_min,
            small_time: self.spread_window_time,
            ack_bytes: self.ack_bytes,
        }
    }
}

/// What a rail says about itself (from configuration or its HELLO).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RailCaps {
    /// Bytes/s, 0 = unknown.
    pub bandwidth: u64,
    pub latency: Duration,
    /// The path never leaves this host (shared memory, a loopback
    /// address, or a connection from one of the host's addresses to
    /// itself): the CPUs, not a wire, set its speed, so `spread` places
    /// small messages against its whole window and never asks for
    /// acknowledgements at once (see `Config::spread_window_time`).
    pub host_local: bool,
    /// Bytes the rail itself holds between the two ranks at no cost (a
    /// `shm` rail's ring): its window is never below this (within
    /// `rail_window`). Such a rail rarely yields a throughput sample (its
    /// bursts end well within a millisecond), so without this floor its
    /// window stays at `rail_window_min` and every few hundred KiB wait
    /// for an acknowledgement round trip. 0 = nothing known.
    pub buffer: u64,
    /// The rail may lose or corrupt frames while its connection stays up
    /// (fault injection: `MULTIRAIL_FAULTS` `drop`, `corrupt`). Only the
    /// general path's per-fragment bookkeeping finds such losses (a later
    /// fragment acknowledged first), so the direct path keeps off it.
    pub may_lose: bool,
}

/// A frame for the driver to write: header, then payload.
#[derive(Debug, Clone)]
pub struct Transmit {
    pub header: FrameHeader,
    pub payload: Bytes,
}

/// Where the payload of a frame whose header was just read must go.
#[derive(Debug)]
pub enum PayloadDest {
    /// The frame has no payload.
    None,
    /// Read exactly `frag_len` bytes into `lease.buf`, then hand it back.
    Lease(Lease),
    /// Read into this vector (control payloads, duplicates to compare).
    Scratch(Vec<u8>),
    /// Read and drop `frag_len` bytes (duplicates, truncated messages).
    Discard,
}

impl PayloadDest {
    /// The slice to read the payload into, if it is kept.
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        match self {
            PayloadDest::Lease(l) => Some(&mut l.buf[..]),
            PayloadDest::Scratch(v) => Some(&mut v[..]),
            PayloadDest::None | PayloadDest::Discard => None,
        }
    }
}

/// What a completed receive matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub peer: PeerId,
    pub tag: u64,
    pub len: u64,
}

/// Why a peer is unreachable: what happened to each of its rails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerFailure {
    pub peer: PeerId,
    pub rails: Vec<(RailId, String)>,
}

impl std::fmt::Display for PeerFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "peer {} unreachable", self.peer)?;
        // The same reason on every rail (a peer timeout, a process gone)
        // is said once.
        let mut reasons = self.rails.iter().map(|(_, why)| why);
        match reasons.next() {
            None => Ok(()),
            Some(first) if reasons.all(|w| w == first) => write!(f, ": {first}"),
            Some(_) => {
                f.write_str(": ")?;
                for (i, (r, why)) in self.rails.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "rail {r}: {why}")?;
                }
                Ok(())
            }
        }
    }
}

/// A send that did not complete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("{0}")]
    PeerFailed(PeerFailure),
    #[error("peer {0} closed its endpoint")]
    PeerClosed(PeerId),
}

/// A receive that did not complete normally.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    #[error("message of {} bytes from peer {} (tag {}) does not fit the {buf_len}-byte buffer", status.len, status.peer, status.tag)]
    Truncated { status: Status, buf_len: u64 },
    #[error("{0}")]
    PeerFailed(PeerFailure),
    #[error("peer {0} closed its endpoint")]
    PeerClosed(PeerId),
}

/// The peer broke the protocol on one rail. The driver must close that
/// rail connection (and call [`Core::rail_down`]); other rails continue.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("malformed frame: {0}")]
    Wire(#[from] WireError),
    #[error("DATA for message {seq}, which was never announced or accepted")]
    UnannouncedData { seq: u64 },
    #[error("frame for message {seq} disagrees with earlier frames ({what})")]
    Inconsistent { seq: u64, what: &'static str },
    #[error("payload checksum mismatch in message {seq} at offset {offset}")]
    Checksum { seq: u64, offset: u64 },
    #[error("duplicate fragment of message {seq} at offset {offset} has different bytes")]
    ConflictingDuplicate { seq: u64, offset: u64 },
    #[error("peer exceeded its unexpected-message credit ({used} + {cost} > {limit} bytes)")]
    CreditExceeded { used: u64, cost: u64, limit: u64 },
    #[error("peer exceeded its {limit} outstanding rendezvous announcements")]
    RtsCreditExceeded { limit: u64 },
    #[error("message sequence {seq} is outside the window [{next}, {next}+{window})")]
    SeqOutOfWindow { seq: u64, next: u64, window: u64 },
    #[error("eager message of {len} bytes exceeds our limit of {limit}")]
    EagerTooLong { len: u64, limit: u64 },
    #[error("{op:?} for unknown message {seq}")]
    UnknownMessage { op: Op, seq: u64 },
    #[error("ACK for bytes that were never sent (message {seq})")]
    BogusAck { seq: u64 },
    #[error("peer keeps sending but does not read: {bytes} bytes of control frames queued for it")]
    ControlBacklog { bytes: usize },
}

/// Something the driver or application should know.
#[derive(Debug)]
pub enum Event {
    SendDone {
        req: ReqId,
        result: Result<(), SendError>,
    },
    RecvDone {
        req: ReqId,
        result: Result<Status, RecvError>,
        buf: BytesMut,
    },
    /// A rail's connection failed (the driver closes it).
    RailDown {
        peer: PeerId,
        rail: RailId,
        reason: String,
    },
    /// A rail owes an answer it did not give in time: it is routed around
    /// until it answers a probe.
    RailSuspect {
        peer: PeerId,
        rail: RailId,
        reason: String,
    },
    /// A suspect rail answered and carries traffic again.
    RailAlive {
        peer: PeerId,
        rail: RailId,
    },
    PeerFailed {
        failure: PeerFailure,
    },
    PeerClosed {
        peer: PeerId,
    },
}

/// Tags at or above this value are the library's own (a barrier, a
/// group's control traffic): a receive with any tag (`None`) never
/// matches them, so an application's wildcard receive cannot take them.
pub const RESERVED_TAGS: u64 = 1 << 63;

/// A receive posted and not yet matched.
#[derive(Debug)]
pub(crate) struct Posted {
    pub req: ReqId,
    pub src: Option<PeerId>,
    pub tag: Option<u64>,
    pub buf: BytesMut,
}

impl Posted {
    fn matches(&self, peer: PeerId, tag: u64) -> bool {
        self.src.is_none_or(|s| s == peer) && self.tag.map_or(tag < RESERVED_TAGS, |t| t == tag)
    }
}

/// A message that became matchable before any receive matched it (in
/// [`Core`]'s queue of them, in arrival order).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unmatched {
    pub peer: PeerId,
    pub seq: u64,
    pub tag: u64,
    /// Kept aside whole on arrival (in [`Peer::stored`]), not in
    /// [`Peer::inc`].
    pub stored: bool,
}

/// A small message that arrived whole before its receive was posted: its
/// bytes, kept aside until a receive takes them (bounded, as every
/// unexpected byte, by the credits granted to the peer).
#[derive(Debug)]
pub(crate) struct Stored {
    pub seq: u64,
    pub tag: u64,
    pub data: BytesMut,
    /// Credits given back when a receive takes it.
    pub credit: u64,
}

pub(crate) struct Peer {
    pub rails: Vec<RailState>,
    /// One scheduler per policy tier.
    pub scheds: Vec<Box<dyn Scheduler>>,
    // --- send side ---
    pub next_seq: u64,
    /// Messages not started yet (waiting for credits or a rail), in order.
    pub waiting: VecDeque<u64>,
    /// Started messages not yet fully acknowledged.
    pub out: SeqMap<OutMsg>,
    /// Messages sent by the direct path ([`Config::direct_eager`]) and not
    /// yet acknowledged, in sequence order (their bytes count in their
    /// rail's `inflight`, as the general path's do).
    pub direct: VecDeque<send::Direct>,
    /// Messages whose plan still has unassigned bytes.
    pub sending: SeqSet,
    /// Scratch for `schedule` (kept to avoid an allocation per call).
    pub views_buf: Vec<crate::sched::RailView>,
    /// Fragments to re-send after a rail failure: (seq, offset).
    pub retx: VecDeque<(u64, u64)>,
    /// The peer's eager grant (from its HELLO), once a rail came up.
    pub credit_grant: Option<u64>,
    /// Eager credit charged so far, and the largest cumulative return the
    /// peer reported: what is available is `grant - (spent - back)`.
    pub credit_spent: u64,
    pub credit_back: u64,
    /// The same for RTS announcements (grant [`RTS_CREDITS`]).
    pub rts_spent: u64,
    pub rts_back: u64,
    /// Every message below this was delivered by the peer (the largest
    /// delivered prefix it reported).
    pub acked_prefix: u64,
    /// Since when a waiting message cannot start for lack of credit.
    pub credit_blocked_since: Option<Time>,
    /// Messages whose RTS must go again (state `RtsAgain`).
    pub rts_again: BTreeSet<u64>,
    // --- receive side ---
    pub next_match: u64,
    /// Messages arrived (in part) and not yet delivered, by sequence
    /// number. Boxed: the tree shifts its values on every insert and
    /// removal, and a message's state is a few hundred bytes (a stream of
    /// unexpected small messages spent about 1700 instructions per
    /// message on those moves).
    pub inc: BTreeMap<u64, Box<InMsg>>,
    /// Whole eager messages that arrived unexpected, kept aside in
    /// sequence order (see `Core::store_unexpected`); each is also
    /// delivered (`done`) for duplicates and acknowledgements, and listed
    /// in `Core::unexpected`.
    pub stored: VecDeque<Stored>,
    /// Messages fully delivered (for dropping duplicates, and the delivered
    /// prefix we report).
    pub done: RangeSet,
    /// Credits the peer has used at our side and not got back.
    pub credit_used: u64,
    /// Cumulative credits given back, and the values last reported.
    pub credit_returned: u64,
    pub credit_reported: u64,
    /// RTS announcements from the peer held at our side; cumulative
    /// returned and last reported.
    pub rts_used: u64,
    pub rts_returned: u64,
    pub rts_reported: u64,
    pub ack_due: Option<Time>,
    /// When returned credits are reported in an ACK of their own.
    pub credit_due: Option<Time>,
    /// Receives posted that name this peer as the source, and since when
    /// there has been at least one.
    pub posted_from: u32,
    pub posted_since: Time,
    // --- liveness ---
    /// When anything last arrived from the peer, on any rail (or work with
    /// it began after a quiet time).
    pub last_rx: Time,
    pub next_ping: u64,
    // --- lifecycle ---
    pub failed: Option<PeerFailure>,
    pub closed_by_peer: bool,
}

impl Peer {
    pub(crate) fn up_rails(&self) -> usize {
        self.rails.iter().filter(|r| r.up).count()
    }

    /// The chunk for messages starting now: `base` (`Config::chunk`),
    /// or, when every up rail to this peer buffers by itself (a same-host
    /// pair on `shm` alone, [`RailCaps::buffer`]), a quarter of the
    /// smallest buffer if that is larger, at most `max` (the largest
    /// frame). Fewer, larger frames through a ring: `bench bw --rails shm`
    /// 1.14 x at 512 KiB and 1 MiB, 1.07 x at 4 MiB with 1 MiB chunks
    /// (4 MiB chunks, a whole ring each, lost: 0.76 x at 4 MiB).
    pub(crate) fn chunk(&self, base: u64, max: u64) -> u64 {
        let smallest = self.rails.iter().filter(|r| r.up).map(|r| r.caps.buffer).min().unwrap_or(0);
        (smallest / 4).min(max).max(base)
    }

    /// Eager credit we may still spend at the peer (0 before its HELLO).
    pub(crate) fn credits(&self) -> u64 {
        self.credit_grant.map_or(0, |g| g.saturating_sub(self.credit_spent - self.credit_back))
    }

    pub(crate) fn rts_credits(&self) -> u64 {
        RTS_CREDITS.saturating_sub(self.rts_spent - self.rts_back)
    }

    /// The rail for a control frame: a usable rail with the least queued.
    pub(crate) fn best_ctrl_rail(&self) -> Option<RailId> {
        self.rails.iter().enumerate().filter(|(_, r)| r.usable()).min_by_key(|(_, r)| r.inflight).map(|(i, _)| i)
    }

    /// The rail for control frames that belong to `rail`: itself while it
    /// is usable, else the best other one.
    pub(crate) fn carrier(&self, rail: RailId) -> Option<RailId> {
        if self.rails.get(rail).is_some_and(|r| r.usable()) { Some(rail) } else { self.best_ctrl_rail() }
    }

    /// `rail` owes us `what`, asked for at `at`.
    pub(crate) fn owe(&mut self, rail: RailId, at: Time, what: rail::Owed) {
        self.rails[rail].owing.insert((at, what));
    }

    /// `rail` no longer owes `what` (answered, or asked of another rail).
    pub(crate) fn settle(&mut self, rail: RailId, at: Time, what: rail::Owed) {
        self.rails[rail].owing.remove(&(at, what));
    }

    /// The sequence number of a message starting now (work starting
    /// after a quiet time restarts the silence clock).
    fn start_message(&mut self, now: Time) -> u64 {
        if self.idle() {
            self.last_rx = self.last_rx.max(now);
        }
        self.next_seq += 1;
        self.next_seq - 1
    }

    /// Nothing in progress either way (work starting now restarts the
    /// silence clock).
    fn idle(&self) -> bool {
        self.nothing_out() && self.waiting.is_empty() && self.posted_from == 0 && self.inc.is_empty()
    }

    /// No sent message waits for its acknowledgement (either path).
    pub(crate) fn nothing_out(&self) -> bool {
        self.out.is_empty() && self.direct.is_empty()
    }

    /// Messages of ours wait for this peer's acknowledgement, and it can
    /// still give it (neither failed nor closed): closing waits for it.
    fn awaits_acks(&self) -> bool {
        !(self.nothing_out() || self.failed.is_some() || self.closed_by_peer)
    }
}

/// Takes element `i` of `q` out. The receive queues are searched from the
/// front and hit there almost always: `pop_front` then, which costs a
/// fraction of the general `remove` on every small message.
pub(crate) fn take_at<T>(q: &mut std::collections::VecDeque<T>, i: usize) -> Option<T> {
    if i == 0 { q.pop_front() } else { q.remove(i) }
}

/// Notes that `rail` to `peer` has new output (once).
pub(crate) fn push_wake(w: &mut Vec<(PeerId, RailId)>, peer: PeerId, rail: RailId) {
    if !w.contains(&(peer, rail)) {
        w.push((peer, rail));
    }
}

/// The sans-IO endpoint. See the module documentation for how to drive it.
pub struct Core {
    cfg: Config,
    factory: Arc<dyn SchedulerFactory>,
    peers: PeerMap,
    posted: VecDeque<Posted>,
    /// Matchable, unmatched messages in arrival order.
    unexpected: VecDeque<Unmatched>,
    events: VecDeque<Event>,
    /// Rails with new output since `take_wakeups` (few; no duplicates).
    wakeups: Vec<(PeerId, RailId)>,
    next_req: u64,
    closing: bool,
    /// Something changed that may make [`Core::poll_connect`] return a
    /// request; else it has nothing before `connect_next`.
    connect_dirty: bool,
    connect_next: Option<Time>,
    /// Peers that may have a timer: touched since `handle_timeout` last
    /// found them quiet. Timers cost in proportion to these, not to every
    /// peer of a large job.
    active: ActiveSet,
    /// Messages taken by the small-message fast path (`rx_eager_whole`).
    fast_rx: u64,
    /// Whole eager messages kept aside on arrival, unexpected
    /// (`Peer::stored`).
    stored_rx: u64,
    /// Messages sent by the direct path (`Core::isend`).
    direct_tx: u64,
}

impl Core {
    pub fn new(cfg: Config) -> Core {
        Core::with_schedulers(cfg, Arc::new(BuiltinSchedulers))
    }

    pub fn with_schedulers(cfg: Config, factory: Arc<dyn SchedulerFactory>) -> Core {
        Core {
            cfg,
            factory,
            peers: PeerMap::default(),
            posted: VecDeque::new(),
            unexpected: VecDeque::new(),
            events: VecDeque::new(),
            wakeups: Vec::new(),
            next_req: 1,
            closing: false,
            connect_dirty: true,
            connect_next: None,
            active: ActiveSet::default(),
            fast_rx: 0,
            stored_rx: 0,
            direct_tx: 0,
        }
    }

    // ----- getters -----

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn peers(&self) -> impl Iterator<Item = PeerId> + '_ {
        self.peers.keys()
    }

    pub fn rail_count(&self, peer: PeerId) -> usize {
        self.peers.get(&peer).map_or(0, |p| p.rails.len())
    }

    /// True unless `peer` failed or closed (rails to it are still wanted).
    pub fn peer_alive(&self, peer: PeerId) -> bool {
        self.peers.get(&peer).is_some_and(|p| p.failed.is_none() && !p.closed_by_peer) && !self.closing
    }

    pub fn is_rail_up(&self, peer: PeerId, rail: RailId) -> bool {
        self.rail(peer, rail).is_some_and(|r| r.up)
    }

    /// When a frame from `peer` last arrived on any rail (or a connection
    /// to it came up); `None` before any.
    pub fn last_heard(&self, peer: PeerId) -> Option<Time> {
        self.peers.get(&peer)?.rails.iter().map(|r| r.last_rx).filter(|&t| t > Time::ZERO).max()
    }

    /// Per-rail counters for `peer`.
    pub fn rail_stats(&self, peer: PeerId, now: Time) -> Vec<RailStats> {
        let w = self.cfg.window_cfg();
        self.peers.get(&peer).map_or_else(Vec::new, |p| {
            p.rails
                .iter()
                .map(|r| RailStats {
                    up: r.up,
                    suspect: r.suspect_since.is_some(),
                    rate: r.est.rate(now) as u64,
                    srtt_us: r.rtt.srtt.map_or(0, |d| d.as_micros() as u64),
                    window: r.rail_window(&w, now),
                    ..r.stats
                })
                .collect()
        })
    }

    /// True if `rail` to `peer` has frames to write.
    pub fn has_transmit(&self, peer: PeerId, rail: RailId) -> bool {
        self.rail(peer, rail).is_some_and(|r| r.has_output())
    }

    /// Number of requests still pending (sends not yet written, receives
    /// not yet complete), for leak checks and orderly shutdown.
    pub fn pending_sends(&self) -> usize {
        self.peers.values().map(|p| p.out.values().filter(|m| !m.completed).count() + p.waiting.len()).sum()
    }

    /// Bytes held for retransmission (sent, not yet acknowledged).
    pub fn unacked_messages(&self) -> usize {
        self.peers.values().map(|p| p.out.len() + p.direct.len()).sum()
    }

    /// Peers that still hold messages of ours unacknowledged (and are
    /// neither failed nor closed), with how many: what keeps
    /// [`Core::is_quiescent`] false.
    pub fn unacked_by_peer(&self) -> Vec<(PeerId, usize)> {
        self.peers.iter().filter(|(_, p)| p.awaits_acks()).map(|(id, p)| (id, p.out.len() + p.direct.len())).collect()
    }

    /// Messages sent by the direct path ([`Config::direct_eager`]). For
    /// tests and stats.
    pub fn direct_sent(&self) -> u64 {
        self.direct_tx
    }

    /// Bytes of unexpected data buffered for `peer`.
    /// Messages received by the small-message fast path (a whole eager
    /// message meeting its posted receive in order). For tests and stats.
    pub fn fast_received(&self) -> u64 {
        self.fast_rx
    }

    /// Messages that arrived whole before their receive and were kept
    /// aside as they came (no incoming-message state). For tests and stats.
    pub fn stored_received(&self) -> u64 {
        self.stored_rx
    }

    pub fn unexpected_bytes(&self, peer: PeerId) -> u64 {
        self.peers.get(&peer).map_or(0, |p| p.credit_used)
    }

    /// Checks the bookkeeping that ties messages to rails: what each rail
    /// owes matches the messages' states, and bytes in flight match the
    /// fragments. For tests (the simulator runs it as it goes).
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        for (id, p) in self.peers.iter() {
            let n = p.rails.len();
            let mut owing: Vec<BTreeSet<(Time, Owed)>> = vec![BTreeSet::new(); n];
            let mut inflight = vec![0u64; n];
            let mut written = vec![0u64; n];
            for (seq, m) in p.out.iter() {
                match m.state {
                    send::OutState::Rts { rail } => {
                        owing[rail].insert((m.rts_at, Owed::Cts(seq)));
                    }
                    send::OutState::RtsAgain if !p.rts_again.contains(&seq) => {
                        return Err(format!("peer {id}: message {seq} must re-send its RTS but is not listed"));
                    }
                    _ => {}
                }
                for f in m.frags.values() {
                    match f.state {
                        send::FragState::Queued => inflight[f.rail] += f.len as u64,
                        send::FragState::Written => {
                            inflight[f.rail] += f.len as u64;
                            written[f.rail] += f.len as u64;
                        }
                        _ => {}
                    }
                }
            }
            for d in &p.direct {
                inflight[d.rail] += d.data.len() as u64;
                if d.stamp.is_some() {
                    written[d.rail] += d.data.len() as u64;
                }
            }
            if p.inc.contains_key(&p.next_match) {
                // The small-message fast path relies on this.
                return Err(format!("peer {id}: message {} arrived but was not made matchable", p.next_match));
            }
            for (&seq, m) in &p.inc {
                if let Some(r) = m.cts_rail {
                    owing[r].insert((m.cts_at, Owed::Data(seq)));
                }
            }
            let mut last = None;
            for st in &p.stored {
                let listed = self.unexpected.iter().any(|u| u.peer == id && u.seq == st.seq && u.stored);
                if last.is_some_and(|l| l >= st.seq) || st.seq >= p.next_match || !listed || p.inc.contains_key(&st.seq)
                {
                    return Err(format!("peer {id}: kept-aside message {} is out of order or not listed once", st.seq));
                }
                if !st.seq.checked_add(1).is_some_and(|end| p.done.contains(st.seq, end)) {
                    return Err(format!("peer {id}: kept-aside message {} is not counted as delivered", st.seq));
                }
                last = Some(st.seq);
            }
            let timers = p.ack_due.is_some() || p.credit_due.is_some() || self.liveness_deadline(p).is_some();
            if timers && !self.active.contains(&id) {
                return Err(format!("peer {id} has a timer but is not among the active peers"));
            }
            for (i, r) in p.rails.iter().enumerate() {
                if r.owing != owing[i] {
                    return Err(format!("peer {id} rail {i}: owes {:?}, the messages say {:?}", r.owing, owing[i]));
                }
                if r.up && (r.inflight, r.written_unacked) != (inflight[i], written[i]) {
                    return Err(format!(
                        "peer {id} rail {i}: in flight {}/{} written, the fragments say {}/{}",
                        r.inflight, r.written_unacked, inflight[i], written[i]
                    ));
                }
            }
        }
        Ok(())
    }

    fn rail(&self, peer: PeerId, rail: RailId) -> Option<&RailState> {
        self.peers.get(&peer).and_then(|p| p.rails.get(rail))
    }

    fn new_req(&mut self) -> ReqId {
        let r = ReqId(self.next_req);
        self.next_req += 1;
        r
    }

    // ----- setup -----

    /// Declares a peer with `rails` rails, none connected until
    /// [`Core::rail_up`]. With `eager_connect` every rail is wanted at once.
    pub fn add_peer(&mut self, peer: PeerId, rails: usize) {
        let scheds = self.cfg.policy.tiers.iter().map(|(_, k)| self.factory.build(*k)).collect();
        let retry = self.cfg.connect_retry;
        self.peers.insert(
            peer,
            Peer {
                rails: (0..rails).map(|_| RailState::new(retry)).collect(),
                scheds,
                next_seq: 0,
                waiting: VecDeque::new(),
                out: SeqMap::new(),
                direct: VecDeque::new(),
                sending: SeqSet::default(),
                views_buf: Vec::new(),
                retx: VecDeque::new(),
                credit_grant: None,
                credit_spent: 0,
                credit_back: 0,
                rts_spent: 0,
                rts_back: 0,
                acked_prefix: 0,
                credit_blocked_since: None,
                rts_again: BTreeSet::new(),
                next_match: 0,
                inc: BTreeMap::new(),
                stored: VecDeque::new(),
                done: RangeSet::new(),
                credit_used: 0,
                credit_returned: 0,
                credit_reported: 0,
                rts_used: 0,
                rts_returned: 0,
                rts_reported: 0,
                ack_due: None,
                credit_due: None,
                posted_from: 0,
                posted_since: Time::ZERO,
                last_rx: Time::ZERO,
                next_ping: 1,
                failed: None,
                closed_by_peer: false,
            },
        );
        if self.cfg.eager_connect {
            self.want_rails(peer, None);
        }
    }

    /// A connection for `rail` to `peer` is established and authenticated.
    /// `credits` is the unexpected-message allowance from the peer's HELLO.
    /// If the rail was up already, the new connection replaces the old
    /// one: what was unacknowledged or unanswered on the old one goes again.
    /// A connection that comes up once [`Core::close`] was called gets a
    /// CLOSE at once: its opener may hold it up already (a connector counts
    /// a connection up once it wrote its AUTH, before the acceptor read it),
    /// and its end must read as the close, not as a failed rail.
    pub fn rail_up(&mut self, peer: PeerId, rail: RailId, caps: RailCaps, credits: u64, now: Time) {
        self.active.insert(peer);
        let Some(p) = self.peers.get_mut(&peer) else { return };
        if p.failed.is_some() || rail >= p.rails.len() {
            return;
        }
        let replacing = p.rails[rail].up;
        if replacing {
            self.forget_connection(peer, rail, now);
        }
        let p = self.peers.get_mut(&peer).expect("checked");
        let r = &mut p.rails[rail];
        r.up = true;
        r.caps = caps;
        r.down_reason = None;
        r.last_rx = now;
        r.last_tx = now;
        p.last_rx = p.last_rx.max(now);
        if p.credit_grant.is_none() {
            p.credit_grant = Some(credits);
        }
        self.conn_up(peer, rail, now);
        if self.closing {
            let r = &mut self.peers.get_mut(&peer).expect("checked").rails[rail];
            r.push_ctrl(Transmit { header: FrameHeader::new(Op::Close), payload: Bytes::new() });
            push_wake(&mut self.wakeups, peer, rail);
            return;
        }
        self.resend_stale_cts(peer, now);
        self.schedule(peer, now);
    }

    /// The connection that carried `rail` is gone (failed or replaced):
    /// its fragments and RTSs are sent again, CTSs it carried go again,
    /// and credits it may have carried are reported again.
    fn forget_connection(&mut self, peer: PeerId, rail: RailId, now: Time) {
        let p = self.peers.get_mut(&peer).expect("caller checked");
        let r = &mut p.rails[rail];
        r.up = false;
        r.reset_connection();
        self.requeue_rail(peer, rail, now);
        self.report_credits_again(peer, now);
    }

    /// A connection for `rail` to `peer` failed (an error, end of stream,
    /// a protocol violation). Its unacknowledged fragments move to the
    /// other rails; the rail is reconnected later ([`connect`]). Once the
    /// peer sent CLOSE, its last rail going down ends it quietly.
    pub fn rail_down(&mut self, peer: PeerId, rail: RailId, reason: &str, now: Time) {
        self.active.insert(peer);
        let Some(p) = self.peers.get_mut(&peer) else { return };
        let Some(r) = p.rails.get_mut(rail) else { return };
        if !r.up {
            if r.down_reason.is_none() {
                r.down_reason = Some(reason.to_string());
            }
            return;
        }
        self.forget_connection(peer, rail, now);
        let p = self.peers.get_mut(&peer).expect("checked");
        let r = &mut p.rails[rail];
        r.down_reason = Some(reason.to_string());
        let closed = p.closed_by_peer || self.closing;
        if !closed {
            // A connection ending once either side closed is the close,
            // not a failure: it is not counted.
            r.stats.downs += 1;
            self.events.push_back(Event::RailDown { peer, rail, reason: reason.to_string() });
        }
        self.conn_down(peer, rail, now);
        let p = self.peers.get_mut(&peer).expect("checked");
        if p.up_rails() == 0 && closed {
            self.peer_closed(peer);
            return;
        }
        self.resend_stale_cts(peer, now);
        self.schedule(peer, now);
    }

    // ----- application commands -----

    /// Starts sending `data` to `peer` with `tag`. The request completes
    /// when every byte has been handed to a rail; by the direct path
    /// ([`Config::direct_eager`]), at once: its one frame is the rail's.
    pub fn isend(&mut self, peer: PeerId, tag: u64, data: Bytes, now: Time) -> ReqId {
        self.active.insert(peer);
        let req = self.new_req();
        let Some(p) = self.peers.get_mut(&peer) else {
            let failure = PeerFailure { peer, rails: vec![] };
            self.events.push_back(Event::SendDone { req, result: Err(SendError::PeerFailed(failure)) });
            return req;
        };
        if let Some(f) = &p.failed {
            let e = SendError::PeerFailed(f.clone());
            self.events.push_back(Event::SendDone { req, result: Err(e) });
            return req;
        }
        if p.closed_by_peer {
            self.events.push_back(Event::SendDone { req, result: Err(SendError::PeerClosed(peer)) });
            return req;
        }
        let seq = p.start_message(now);
        let len = data.len() as u64;
        if self.cfg.direct_eager
            && let Some(rail) = p.direct_rail(peer, len, &self.cfg)
        {
            self.send_direct(peer, rail, seq, tag, data, now);
            self.events.push_back(Event::SendDone { req, result: Ok(()) });
            return req;
        }
        p.out.insert(seq, OutMsg::new(req, seq, tag, data));
        p.waiting.push_back(seq);
        self.want_for_message(peer, len);
        self.schedule(peer, now);
        req
    }

    /// The direct path in one call: if [`Core::isend`] would send `data`
    /// by the direct path, on rail `r` ([`Core::send_now_rail`]), and
    /// `take(r)` gives the means to write to it at once (`Some(w)`: the
    /// caller holds the rail's connection, with nothing queued in it), the
    /// message is sent as `isend` would send it, its send is complete (no
    /// [`Event::SendDone`]), and its frame is handed back with `r` and `w`
    /// as [`Core::poll_transmit`] would hand it; the rail is not reported
    /// as having output. The caller must write the frame to `r` at once,
    /// ahead of anything else, and report it written with
    /// [`Core::on_sent`] as usual. `Err(data)`: not taken, nothing changed
    /// (use [`Core::isend`]).
    pub fn isend_now<W>(
        &mut self,
        peer: PeerId,
        tag: u64,
        data: Bytes,
        now: Time,
        take: impl FnOnce(RailId) -> Option<W>,
    ) -> Result<(ReqId, Transmit, RailId, W), Bytes> {
        let Some(rail) = self.send_now_rail(peer, data.len() as u64) else { return Err(data) };
        let Some(w) = take(rail) else { return Err(data) };
        // As `isend` and then `poll_transmit` would, for this case.
        self.active.insert(peer);
        let req = self.new_req();
        let (window, div) = (self.cfg.window_cfg(), self.cfg.ack_request_div);
        let seq = self.peers.get_mut(&peer).expect("checked").start_message(now);
        let mut header = self.record_direct(peer, rail, seq, tag, &data, now);
        let p = self.peers.get_mut(&peer).expect("checked");
        let several = p.rails.len() > 1;
        let r = &mut p.rails[rail];
        if r.hand_direct(seq, data.len() as u64, several, &window, div, now) {
            header.flags = header.flags.with(crate::wire::Flags::ACK_NOW);
        }
        r.last_tx = now;
        self.piggyback(peer, &mut header);
        Ok((req, Transmit { header, payload: data }, rail, w))
    }

    /// The rail [`Core::isend_now`] would take a message of `len` bytes to
    /// `peer` on now, if it would: the direct path's
    /// ([`Peer::direct_rail`]), with nothing of the core waiting to be
    /// written on it (no control frame, no direct frame).
    pub fn send_now_rail(&self, peer: PeerId, len: u64) -> Option<RailId> {
        let p = self.peers.get(&peer)?;
        if !self.cfg.direct_eager || p.failed.is_some() || p.closed_by_peer {
            return None;
        }
        let rail = p.direct_rail(peer, len, &self.cfg)?;
        let r = &p.rails[rail];
        (r.ctrl.is_empty() && r.direct.is_empty()).then_some(rail)
    }

    /// Posts a receive into `buf` for a message from `src` (any if `None`)
    /// with `tag` (any below [`RESERVED_TAGS`] if `None`). The buffer comes back in the
    /// [`Event::RecvDone`] event.
    pub fn irecv(&mut self, src: Option<PeerId>, tag: Option<u64>, buf: BytesMut, now: Time) -> ReqId {
        let req = self.new_req();
        let posted = Posted { req, src, tag, buf };
        // Oldest matching unexpected message first.
        let hit = self.unexpected.iter().position(|u| {
            posted.matches(u.peer, u.tag)
                && (u.stored || self.peers.get(&u.peer).is_some_and(|p| p.inc.contains_key(&u.seq)))
        });
        if let Some(i) = hit {
            let u = take_at(&mut self.unexpected, i).expect("index from position");
            if u.stored {
                self.deliver_stored(u.peer, u.seq, posted, now);
            } else {
                self.attach(u.peer, u.seq, posted, now);
                self.schedule(u.peer, now);
            }
            return req;
        }
        if let Some(src) = src {
            self.active.insert(src);
            if let Some(err) = self.peer_gone_error(src) {
                self.events.push_back(Event::RecvDone { req, result: Err(err), buf: posted.buf });
                return req;
            }
            let p = self.peers.get_mut(&src).expect("peer_gone_error checked");
            if p.idle() {
                p.last_rx = p.last_rx.max(now);
            }
            if p.posted_from == 0 {
                p.posted_since = now;
            }
            p.posted_from += 1;
        }
        self.posted.push_back(posted);
        req
    }

    fn peer_gone_error(&self, peer: PeerId) -> Option<RecvError> {
        match self.peers.get(&peer) {
            None => Some(RecvError::PeerFailed(PeerFailure { peer, rails: vec![] })),
            Some(p) if p.failed.is_some() => Some(RecvError::PeerFailed(p.failed.clone().expect("checked"))),
            Some(p) if p.closed_by_peer && p.up_rails() == 0 => Some(RecvError::PeerClosed(peer)),
            _ => None,
        }
    }

    /// Orderly shutdown: queues CLOSE on every rail. Rails going down
    /// afterwards are not reported as failures.
    pub fn close(&mut self, now: Time) {
        self.closing = true;
        self.active.extend(self.peers.keys());
        let ids: Vec<PeerId> = self.peers.keys().collect();
        for id in ids {
            // Acknowledge everything first: the peer may be waiting for it
            // before it closes too.
            self.flush_acks(id, now, true);
            let p = self.peers.get_mut(&id).expect("id from keys");
            for (i, r) in p.rails.iter_mut().enumerate() {
                if r.up {
                    r.push_ctrl(Transmit { header: FrameHeader::new(Op::Close), payload: Bytes::new() });
                    push_wake(&mut self.wakeups, id, i);
                }
            }
        }
    }

    /// True once [`Core::close`] was called.
    pub fn is_closing(&self) -> bool {
        self.closing
    }

    /// True once every send is written and acknowledged, so closing now
    /// loses nothing.
    pub fn is_quiescent(&self) -> bool {
        self.peers.values().all(|p| !p.awaits_acks())
    }

    // ----- outputs -----

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The outcome of send `req` if its [`Event::SendDone`] is the newest
    /// event (a send that completed inside the [`Core::isend`] just
    /// called: the direct path, or a peer known to have failed), taken out
    /// of the event queue; `None` otherwise (the event stays).
    pub fn take_send_done(&mut self, req: ReqId) -> Option<Result<(), SendError>> {
        if !matches!(self.events.back(), Some(Event::SendDone { req: r, .. }) if *r == req) {
            return None;
        }
        match self.events.pop_back() {
            Some(Event::SendDone { result, .. }) => Some(result),
            _ => unreachable!("checked above"),
        }
    }

    /// Rails that got new output since the last call.
    pub fn take_wakeups(&mut self) -> Vec<(PeerId, RailId)> {
        std::mem::take(&mut self.wakeups)
    }

    /// Hands each rail with new output to `f` (no allocation).
    pub fn drain_wakeups(&mut self, mut f: impl FnMut(PeerId, RailId)) {
        for (p, r) in self.wakeups.drain(..) {
            f(p, r);
        }
    }

    /// The next frame to write on `rail` to `peer`, if any. Report frames
    /// as written, in order, with [`Core::on_sent`].
    pub fn poll_transmit(&mut self, peer: PeerId, rail: RailId, now: Time) -> Option<Transmit> {
        let (checksum, window, div) = (self.cfg.checksum, self.cfg.window_cfg(), self.cfg.ack_request_div);
        let p = self.peers.get_mut(&peer)?;
        let several = p.rails.len() > 1;
        let r = p.rails.get_mut(rail)?;
        if !r.up {
            return None;
        }
        let mut t = None;
        if let Some(c) = r.pop_ctrl() {
            r.handed.push_back(Self::handed_for(&c.header));
            t = Some(c);
        } else if let Some(mut d) = r.direct.pop_front() {
            if r.hand_direct(d.header.seq, d.payload.len() as u64, several, &window, div, now) {
                d.header.flags = d.header.flags.with(crate::wire::Flags::ACK_NOW);
            }
            t = Some(d);
        } else {
            while let Some(f) = r.data.pop_front() {
                let Some(msg) = p.out.get(&f.seq) else { continue };
                let Some(mut d) = msg.transmit(f.offset, checksum) else { continue };
                r.handed.push_back(rail::Handed::Frag { seq: f.seq, offset: f.offset });
                r.stats.tx_bytes += d.payload.len() as u64;
                r.stats.tx_frames += 1;
                if r.request_ack(d.payload.len() as u64, &window, div, several, now) {
                    d.header.flags = d.header.flags.with(crate::wire::Flags::ACK_NOW);
                }
                t = Some(d);
                break;
            }
        }
        let mut t = t?;
        r.last_tx = now;
        self.piggyback(peer, &mut t.header);
        Some(t)
    }

    /// The earliest time [`Core::handle_timeout`] has work to do.
    pub fn poll_timeout(&self) -> Option<Time> {
        let mut t: Option<Time> = None;
        let mut at = |x: Time| t = Some(t.map_or(x, |y| y.min(x)));
        for p in self.active.iter().filter_map(|id| self.peers.get(id)) {
            if let Some(d) = p.ack_due {
                at(d);
            }
            if let Some(d) = p.credit_due {
                at(d);
            }
            if let Some(d) = self.liveness_deadline(p) {
                at(d);
            }
        }
        // Connection attempts: due now if something changed (the driver
        // asks poll_connect, which caches the next deadline), else cached.
        if self.connect_dirty && !self.closing {
            at(Time::ZERO);
        } else if let Some(d) = self.connect_next {
            at(d);
        }
        t
    }

    /// Runs timers: delayed acknowledgements, retransmission timeouts,
    /// probes, the peer timeout.
    pub fn handle_timeout(&mut self, now: Time) {
        let ids: Vec<PeerId> = self.active.iter().copied().collect();
        for id in ids {
            let p = &self.peers[&id];
            if p.ack_due.is_some_and(|d| d <= now) {
                self.flush_acks(id, now, false);
            }
            if self.peers[&id].credit_due.is_some_and(|d| d <= now) {
                self.flush_acks(id, now, true);
            }
            self.run_liveness(id, now);
            let p = &self.peers[&id];
            if p.ack_due.is_none() && p.credit_due.is_none() && self.liveness_deadline(p).is_none() {
                self.active.remove(&id);
            }
        }
    }

    /// Bytes of a long payload arrived on a rail: the peer is there.
    pub fn rail_activity(&mut self, peer: PeerId, rail: RailId, now: Time) {
        self.active.insert(peer);
        if let Some(p) = self.peers.get_mut(&peer) {
            p.last_rx = now;
            if let Some(r) = p.rails.get_mut(rail) {
                r.last_rx = now;
            }
        }
    }

    // ----- failure handling -----

    fn fail_peer(&mut self, peer: PeerId) {
        self.connect_dirty = true;
        let p = self.peers.get_mut(&peer).expect("caller checked");
        let failure = PeerFailure {
            peer,
            rails: p
                .rails
                .iter()
                .enumerate()
                .map(|(i, r)| (i, r.down_reason.clone().unwrap_or_else(|| "never connected".into())))
                .collect(),
        };
        p.failed = Some(failure.clone());
        self.finish_peer(peer, SendError::PeerFailed(failure.clone()), RecvError::PeerFailed(failure.clone()));
        self.events.push_back(Event::PeerFailed { failure });
    }

    fn peer_closed(&mut self, peer: PeerId) {
        self.finish_peer(peer, SendError::PeerClosed(peer), RecvError::PeerClosed(peer));
        self.events.push_back(Event::PeerClosed { peer });
    }

    /// Fails every pending operation involving `peer`; complete unexpected
    /// messages stay deliverable.
    fn finish_peer(&mut self, peer: PeerId, send_err: SendError, recv_err: RecvError) {
        let p = self.peers.get_mut(&peer).expect("caller checked");
        for (_, m) in std::mem::take(&mut p.out) {
            if !m.completed {
                self.events.push_back(Event::SendDone { req: m.req, result: Err(send_err.clone()) });
            }
        }
        // Direct sends completed when queued.
        p.direct.clear();
        p.waiting.clear();
        p.sending.clear();
        p.retx.clear();
        p.posted_from = 0;
        p.credit_blocked_since = None;
        p.rts_again.clear();
        for r in p.rails.iter_mut() {
            r.owing.clear();
        }
        for r in p.rails.iter_mut() {
            r.conn.wanted = false;
        }
        let incomplete: Vec<u64> = p.inc.iter().filter(|(_, m)| !m.is_complete()).map(|(s, _)| *s).collect();
        for seq in incomplete {
            let m = p.inc.remove(&seq).expect("seq from iter");
            if let Some((req, buf)) = (*m).into_request_buffer() {
                self.events.push_back(Event::RecvDone { req, result: Err(recv_err.clone()), buf });
            }
        }
        let p = &self.peers[&peer];
        self.unexpected.retain(|u| u.peer != peer || u.stored || p.inc.contains_key(&u.seq));
        let mut keep = VecDeque::new();
        for posted in std::mem::take(&mut self.posted) {
            if posted.src == Some(peer) {
                self.events.push_back(Event::RecvDone {
                    req: posted.req,
                    result: Err(recv_err.clone()),
                    buf: posted.buf,
                });
            } else {
                keep.push_back(posted);
            }
        }
        self.posted = keep;
    }
}

#[cfg(test)]
mod tests {
    use super::PeerFailure;

    #[test]
    fn peer_failure_says_a_shared_reason_once_and_different_ones_per_rail() {
        let why = "nothing from rank 3 for 30s (peer timeout)".to_string();
        let same = PeerFailure { peer: 3, rails: vec![(0, why.clone()), (1, why.clone())] };
        assert_eq!(same.to_string(), format!("peer 3 unreachable: {why}"));
        let differ = PeerFailure { peer: 1, rails: vec![(0, "connection refused".into()), (1, "reset".into())] };
        assert_eq!(differ.to_string(), "peer 1 unreachable: rail 0: connection refused; rail 1: reset");
        assert_eq!(PeerFailure { peer: 2, rails: vec![] }.to_string(), "peer 2 unreachable");
    }

    #[test]
    fn take_at_takes_the_element_asked_for_and_keeps_the_order_of_the_rest() {
        let mut q: std::collections::VecDeque<u32> = (0..5).collect();
        q.rotate_left(2); // wrapped storage: 2 3 4 0 1
        assert_eq!(super::take_at(&mut q, 0), Some(2));
        assert_eq!(super::take_at(&mut q, 2), Some(0));
        assert_eq!(q.iter().copied().collect::<Vec<_>>(), [3, 4, 1]);
        assert_eq!(super::take_at(&mut q, 3), None);
    }
}
