//! Sans-IO ordering core of multirail's ordered multicast group.
//!
//! [`GroupCore`] is one member of a group with a fixed initial membership
//! (ranks `0..n`) and a declared set of senders. It does no I/O, starts no
//! thread and reads no clock. The caller feeds it inputs:
//!
//! * [`GroupCore::send`]: the application multicasts a payload;
//! * [`GroupCore::on_message`]: a [`Frame`] arrived from a member;
//! * [`GroupCore::on_tick`]: time passed (`now` is a [`Duration`] since an
//!   origin the caller picks; it must not go back);
//! * [`GroupCore::on_peer_lost`]: the channel below lost every rail to a
//!   member;
//!
//! and then ends the turn with [`GroupCore::drain_effects`], which runs the
//! ordering engine once over everything that arrived and returns the
//! [`Effect`]s: frames to send, deliveries, view changes. Calling it after a
//! batch of inputs rather than after each one is the receiver-side batching:
//! the counters go out once per turn, as one row overwrite.
//!
//! Order (Derecho's `ordered_send`): the `k`-th of the `S` senders of a view
//! gives its message `index` the global sequence number `index * S + k`.
//! Every member publishes, per sender, how many messages it holds as a
//! contiguous prefix (`num_received`) and from that how many sequence
//! numbers it holds in order (`seq_num`). A message is delivered once the
//! minimum of `seq_num` over all members passes it: every member holds it.
//! A sender that lags others fills its turns with null runs (reactively,
//! when it learns that others are ahead); nulls take sequence numbers and
//! are never delivered. A sender may have at most `window` of its messages
//! undelivered at some member, so a member buffers at most `window`
//! messages per sender.
//!
//! Membership: on a suspected failure the member wedges (no more sends or
//! deliveries in the view). The lowest unsuspected member leads: once every
//! unsuspected member shows a wedged row, it proposes the ragged trim, per
//! sender the minimum of their `num_received`. Members adopt it from their
//! current leader; once every unsuspected member of the proposal echoes it,
//! each delivers exactly the messages under the trim, in order, installs
//! the next view without the suspected members and re-sends its own
//! messages that fell past the trim. See README.md for the guarantees and
//! what is not promised.
//!
//! ```
//! use bytes::Bytes;
//! use multirail_group::{Effect, GroupConfig, GroupCore, Senders};
//!
//! // Two members; member 1 sends. Frames go through their byte encoding.
//! let mk = |me| {
//!     let cfg = GroupConfig { senders: Senders::One(1), ..GroupConfig::new(2, me) };
//!     GroupCore::new(cfg).unwrap()
//! };
//! let mut g = [mk(0), mk(1)];
//! g[1].send(Bytes::from_static(b"hello")).unwrap();
//! let mut delivered = vec![Vec::new(), Vec::new()];
//! for _ in 0..4 {
//!     for me in 0..2 {
//!         for e in g[me].drain_effects() {
//!             match e {
//!                 Effect::Send { to, frame } => {
//!                     let bytes = frame.encode();
//!                     let frame = multirail_group::Frame::decode(&bytes).unwrap();
//!                     g[to as usize].on_message(me as u32, frame);
//!                 }
//!                 Effect::Deliver { sender, payload, .. } => delivered[me].push((sender, payload)),
//!                 _ => {}
//!             }
//!         }
//!     }
//! }
//! assert_eq!(delivered[0], vec![(1, Bytes::from_static(b"hello"))]);
//! assert_eq!(delivered[0], delivered[1]);
//! ```

#![forbid(unsafe_code)]

mod frame;
mod log;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use bytes::{Bytes, BytesMut};

pub use frame::{DecodeError, Frame, MAX_RANKS, Proposal, Row, WIRE_VERSION};
use log::{Entry, SenderLog};

/// A member's rows may be late by this many failure timeouts while the
/// channel still hears from it. Rows travel behind the large messages
/// queued before them in the channel: three senders of 100 MB messages on
/// one host held them back for seconds (2 with window 2, up to 10 with
/// window 16), past the 1 s timeout, and every member suspected the
/// others (2026-11-26). The price: a member whose group stopped but whose
/// endpoint lives on (its acknowledgements still arrive) is excluded only
/// after this long; a member whose process is gone or stopped is not
/// heard and goes after the failure timeout as before.
pub const ROWS_LATE_FACTOR: u32 = 60;

/// Payloads of at least this many bytes are relayed along the chain (when
/// the view has three members or more) by default; see
/// [`GroupConfig::relay_min`].
pub const DEFAULT_RELAY_MIN: usize = 64 * 1024;

/// Payloads longer than this travel in chunks of this many bytes by
/// default; see [`GroupConfig::chunk`].
pub const DEFAULT_CHUNK: usize = 1 << 20;

/// Buffers of reassembled messages kept for reuse ([`GroupCore::recycle`]):
/// at most this many, and at most [`POOL_BYTES`] in all.
const POOL_BUFFERS: usize = 8;
const POOL_BYTES: usize = 256 << 20;

/// A member is named by its rank in the initial membership.
pub type Rank = u32;

/// Which members send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Senders {
    All,
    One(Rank),
    List(Vec<Rank>),
}

/// Delivery order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One total order over all senders (round robin over sequence numbers).
    Ordered,
    /// Per-sender FIFO, no order across senders. A message is delivered once
    /// every member holds it (as in ordered mode), so the view-change cut is
    /// the same; only the cross-sender wait is gone. No nulls are sent.
    Unordered,
}

/// How a group member is set up.
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// Members are ranks `0..members`.
    pub members: u32,
    /// This member's rank.
    pub me: Rank,
    pub senders: Senders,
    /// Own messages that may be undelivered at some member (at least 1).
    pub window: u32,
    pub mode: Mode,
    /// A member whose heartbeat does not advance for this long, and from
    /// whom the channel heard nothing either ([`GroupCore::on_alive`]), is
    /// suspected; one whose heartbeat does not advance for
    /// [`ROWS_LATE_FACTOR`] times this long is suspected whatever the
    /// channel says.
    pub failure_timeout: Duration,
    /// How often this member bumps its heartbeat (and so pushes its row).
    pub heartbeat_interval: Duration,
    /// Stop (`Effect::Partitioned`) rather than go on when half or more of
    /// the view is suspected, so that a cut-off minority never installs a
    /// view of its own. Derecho's rule, on here by default.
    pub partition_safety: bool,
    /// A payload of at least this many bytes is relayed: the sender sends
    /// it once, to the next member of the view in rank order, and each
    /// member passes it on to the next (wrapping round) until it reaches
    /// the member before the sender. One sender then needs its link once
    /// per message, not once per member, at the price of a hop per member
    /// in latency. Smaller payloads go from the sender to every member.
    /// `usize::MAX` turns relaying off. Only the sender reads it: members
    /// may differ.
    pub relay_min: usize,
    /// A payload longer than this many bytes is sent in chunks of this
    /// size ([`Frame::Chunk`]); a relaying member passes each chunk on as
    /// it arrives, so a long message crosses the chain in pipeline rather
    /// than store-and-forward, and the receives the caller posts need not
    /// be as long as the longest message. Members copy the chunks into one
    /// buffer per message (reused through [`GroupCore::recycle`]).
    /// `usize::MAX`: whole messages. Only the sender reads it.
    pub chunk: usize,
}

impl GroupConfig {
    /// All members send, ordered, window 16, timeout 1 s, heartbeat 10 ms,
    /// partition safety on.
    pub fn new(members: u32, me: Rank) -> GroupConfig {
        GroupConfig {
            members,
            me,
            senders: Senders::All,
            window: 16,
            mode: Mode::Ordered,
            failure_timeout: Duration::from_secs(1),
            heartbeat_interval: Duration::from_millis(10),
            partition_safety: true,
            relay_min: DEFAULT_RELAY_MIN,
            chunk: DEFAULT_CHUNK,
        }
    }
}

/// Why [`GroupCore::new`] refused a configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    NoMembers,
    MeOutOfRange,
    SenderOutOfRange(Rank),
    ZeroWindow,
    TooManyMembers,
    ZeroChunk,
}

/// Why [`GroupCore::send`] refused a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendError {
    /// `window` own messages are undelivered somewhere (or messages carried
    /// over from the previous view are still waiting): try after more
    /// inputs.
    WindowFull,
    /// A view change is under way; sends resume in the next view.
    Wedged,
    /// This member is not a sender in the current view.
    NotASender,
    /// This member was excluded from the group; it will never send again.
    Stopped,
    /// The payload is longer than a frame can carry (`u32::MAX` bytes).
    TooLarge,
}

/// What the core asks the caller to do or tells the application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Send `frame` to member `to` (the caller encodes it).
    Send { to: Rank, frame: Frame },
    /// Deliver a message, in this order, to the application.
    Deliver { view: u64, sender: Rank, index: u64, payload: Bytes },
    /// The member stopped sending and delivering in `view_id`: a view
    /// change has begun.
    Wedged { view_id: u64, suspected: Vec<Rank> },
    /// View `view_id` is installed with `members`; deliveries that follow
    /// belong to it.
    ViewChange { view_id: u64, members: Vec<Rank> },
    /// The others installed a view without this member (or suspect it):
    /// the core stops for good.
    Expelled { view_id: u64 },
    /// This member suspects half or more of its view (partition safety):
    /// it may be the one cut off, so it stops for good rather than go on.
    Partitioned { view_id: u64 },
}

/// A message whose chunks are arriving.
struct Part {
    buf: BytesMut,
    total: usize,
    got: usize,
    /// (offset, length) of each chunk taken.
    have: Vec<(usize, usize)>,
}

/// One group member's ordering state machine.
pub struct GroupCore {
    n: u32,
    me: Rank,
    declared: Vec<Rank>,
    window: u64,
    mode: Mode,
    timeout: Duration,
    hb_interval: Duration,
    partition_safety: bool,
    relay_min: usize,
    chunk: usize,

    view: u64,
    members: Vec<Rank>,
    senders: Vec<Rank>,
    my_pos: Option<usize>,
    logs: Vec<SenderLog>,
    /// Messages of others whose chunks are arriving, by (sender position,
    /// index), and the bytes they reserve.
    parts: BTreeMap<(usize, u64), Part>,
    parts_bytes: usize,
    /// Buffers handed back for reassembly ([`GroupCore::recycle`]).
    pool: Vec<BytesMut>,
    /// Per sender position: next index to deliver.
    next_deliver: Vec<u64>,
    /// Own next index (data and nulls).
    next_index: u64,
    /// Own data messages not yet known delivered (ordered) or received
    /// (unordered) everywhere: re-sent in the next view if past the trim.
    own: VecDeque<(u64, Bytes)>,
    own_bytes: usize,
    /// Own messages carried over from an earlier view, to send first.
    carry: VecDeque<Bytes>,
    delivered: u64,

    rows: Vec<Option<Row>>,
    heartbeat: u64,
    version: u64,
    wedged: bool,
    suspected: BTreeSet<Rank>,
    proposal: Option<Proposal>,
    installed_from: Option<Proposal>,
    /// Something in the row changed that others wait for (what we hold,
    /// suspicions, the view change, the heartbeat): push it this turn.
    dirty: bool,
    /// `next_deliver` as of the last row pushed. Deliveries alone only
    /// open senders' windows, so they push a row once some sender's count
    /// moved by a quarter window (see [`GroupCore::report_due`]); the rest
    /// rides on the next row.
    reported: Vec<u64>,
    /// Data and nulls of the next view that came before we installed it.
    stash: Vec<(Rank, Frame)>,
    stash_bytes: usize,

    hb_seen: Vec<bool>,
    last_seen: Vec<Duration>,
    /// The channel heard from a member since the last tick ([`GroupCore::on_alive`]).
    alive_seen: Vec<bool>,
    /// When the channel last heard from each member.
    alive_at: Vec<Duration>,
    /// Until when the suspicions in each member's rows are not taken in:
    /// a failure timeout from when it was heard again after a silence of
    /// half the failure timeout or more (`end_silence`; see `on_row`).
    rows_quarantined_until: Vec<Duration>,
    /// The time of the last tick, and whether its suspicion check was
    /// skipped because this member itself ran late (see `on_tick`).
    last_tick: Duration,
    skipped_late_tick: bool,
    next_hb: Option<Duration>,
    stopped: bool,
    effects: Vec<Effect>,
}

impl GroupCore {
    pub fn new(cfg: GroupConfig) -> Result<GroupCore, ConfigError> {
        if cfg.members == 0 {
            return Err(ConfigError::NoMembers);
        }
        if cfg.members as usize > MAX_RANKS {
            return Err(ConfigError::TooManyMembers);
        }
        if cfg.me >= cfg.members {
            return Err(ConfigError::MeOutOfRange);
        }
        if cfg.window == 0 {
            return Err(ConfigError::ZeroWindow);
        }
        if cfg.chunk == 0 {
            return Err(ConfigError::ZeroChunk);
        }
        let declared: Vec<Rank> = match &cfg.senders {
            Senders::All => (0..cfg.members).collect(),
            Senders::One(r) => vec![*r],
            Senders::List(l) => l.iter().copied().collect::<BTreeSet<_>>().into_iter().collect(),
        };
        if let Some(r) = declared.iter().find(|r| **r >= cfg.members) {
            return Err(ConfigError::SenderOutOfRange(*r));
        }
        let n = cfg.members as usize;
        let mut g = GroupCore {
            n: cfg.members,
            me: cfg.me,
            declared,
            window: cfg.window as u64,
            mode: cfg.mode,
            timeout: cfg.failure_timeout,
            hb_interval: cfg.heartbeat_interval,
            partition_safety: cfg.partition_safety,
            relay_min: cfg.relay_min,
            chunk: cfg.chunk,
            view: 0,
            members: (0..cfg.members).collect(),
            senders: Vec::new(),
            my_pos: None,
            logs: Vec::new(),
            parts: BTreeMap::new(),
            parts_bytes: 0,
            pool: Vec::new(),
            next_deliver: Vec::new(),
            next_index: 0,
            own: VecDeque::new(),
            own_bytes: 0,
            carry: VecDeque::new(),
            delivered: 0,
            rows: vec![None; n],
            heartbeat: 0,
            version: 0,
            wedged: false,
            suspected: BTreeSet::new(),
            proposal: None,
            installed_from: None,
            dirty: true,
            reported: Vec::new(),
            stash: Vec::new(),
            stash_bytes: 0,
            hb_seen: vec![false; n],
            last_seen: vec![Duration::ZERO; n],
            alive_seen: vec![false; n],
            alive_at: vec![Duration::ZERO; n],
            rows_quarantined_until: vec![Duration::ZERO; n],
            last_tick: Duration::ZERO,
            skipped_late_tick: false,
            next_hb: None,
            stopped: false,
            effects: Vec::new(),
        };
        g.reset_view_state();
        Ok(g)
    }

    fn reset_view_state(&mut self) {
        self.senders = self.declared.iter().copied().filter(|r| self.members.contains(r)).collect();
        self.my_pos = self.senders.iter().position(|r| *r == self.me);
        self.logs = self.senders.iter().map(|_| SenderLog::default()).collect();
        for (_, p) in std::mem::take(&mut self.parts) {
            self.recycle(p.buf);
        }
        self.parts_bytes = 0;
        self.next_deliver = vec![0; self.senders.len()];
        self.reported = vec![0; self.senders.len()];
        self.next_index = 0;
        self.own.clear();
        self.own_bytes = 0;
        self.delivered = 0;
        self.proposal = None;
        self.wedged = self.members.iter().any(|m| self.suspected.contains(m));
    }

    // ---- queries -------------------------------------------------------

    pub fn me(&self) -> Rank {
        self.me
    }
    pub fn view_id(&self) -> u64 {
        self.view
    }
    pub fn members(&self) -> &[Rank] {
        &self.members
    }
    /// Senders of the current view, in sequence-number order.
    pub fn senders(&self) -> &[Rank] {
        &self.senders
    }
    pub fn is_wedged(&self) -> bool {
        self.wedged
    }
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }
    pub fn suspected(&self) -> impl Iterator<Item = Rank> + '_ {
        self.suspected.iter().copied()
    }
    /// How many messages of `sender` this member holds as a contiguous
    /// prefix in the current view (None if it is not a sender of it).
    pub fn num_received(&self, sender: Rank) -> Option<u64> {
        let p = self.senders.iter().position(|r| *r == sender)?;
        Some(self.logs[p].contig)
    }
    /// How many sequence numbers this member holds in order.
    pub fn seq_num(&self) -> u64 {
        let s = self.senders.len() as u64;
        self.logs.iter().enumerate().map(|(p, l)| l.contig * s + p as u64).min().unwrap_or(0)
    }
    /// Sequence numbers (ordered) or messages (unordered) delivered or
    /// skipped in the current view.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }
    /// Payload bytes held: received and undelivered messages of others
    /// (whole, or the full length of those whose chunks are arriving), own
    /// messages kept until delivered everywhere or carried over from the
    /// previous view, and frames of the next view received before
    /// installing it.
    pub fn buffered_bytes(&self) -> usize {
        let others: usize =
            self.logs.iter().enumerate().filter(|(p, _)| Some(*p) != self.my_pos).map(|(_, l)| l.bytes).sum();
        let carried: usize = self.carry.iter().map(|b| b.len()).sum();
        others + self.parts_bytes + self.own_bytes + self.stash_bytes + carried
    }
    /// Own messages held to be sent when the view allows.
    pub fn carried(&self) -> usize {
        self.carry.len()
    }

    fn seq(&self, pos: usize, index: u64) -> u64 {
        index.saturating_mul(self.senders.len() as u64).saturating_add(pos as u64)
    }

    /// The row of `j` if it is about the current view.
    fn row(&self, j: Rank) -> Option<&Row> {
        let r = self.rows[j as usize].as_ref()?;
        let s = self.senders.len();
        (r.view == self.view && r.num_received.len() == s && r.delivered_from.len() == s).then_some(r)
    }

    fn others(&self) -> impl Iterator<Item = Rank> + '_ {
        self.members.iter().copied().filter(|m| *m != self.me && !self.suspected.contains(m))
    }

    /// The chain of relayed messages: the member after (`step` 1) or
    /// before (`step` -1) `r` among the unsuspected members of the view,
    /// in rank order, wrapping round; `r` itself if it is alone.
    fn ring(&self, r: Rank, step: isize) -> Rank {
        let live = || self.members.iter().copied().filter(|m| !self.suspected.contains(m));
        let Some(i) = live().position(|m| m == r) else {
            return r;
        };
        let at = (i as isize + step).rem_euclid(live().count() as isize) as usize;
        live().nth(at).expect("in range")
    }

    // ---- inputs --------------------------------------------------------

    /// Multicasts `payload`; returns its index in the current view.
    pub fn send(&mut self, payload: Bytes) -> Result<u64, SendError> {
        if self.stopped {
            return Err(SendError::Stopped);
        }
        if self.wedged {
            return Err(SendError::Wedged);
        }
        if self.my_pos.is_none() {
            return Err(SendError::NotASender);
        }
        if payload.len() > u32::MAX as usize {
            return Err(SendError::TooLarge);
        }
        if !self.carry.is_empty() || !self.window_open() {
            return Err(SendError::WindowFull);
        }
        Ok(self.send_now(payload))
    }

    /// [`GroupCore::send`] would take a message now.
    pub fn can_send(&self) -> bool {
        !self.stopped && !self.wedged && self.my_pos.is_some() && self.carry.is_empty() && self.window_open()
    }

    fn window_open(&self) -> bool {
        let Some(pos) = self.my_pos else {
            return false;
        };
        let i = self.next_index;
        if i < self.window {
            return true;
        }
        let old = i - self.window;
        self.next_deliver[pos] > old && self.others().all(|j| self.delivered_everywhere_at(j, pos, old))
    }

    /// Member `j`'s row says it delivered message `index` of the sender at
    /// `pos` (of the current view).
    fn delivered_everywhere_at(&self, j: Rank, pos: usize, index: u64) -> bool {
        self.row(j).is_some_and(|r| r.delivered_from.get(pos).is_some_and(|d| *d > index))
    }

    fn send_now(&mut self, payload: Bytes) -> u64 {
        let pos = self.my_pos.expect("sender");
        let index = self.next_index;
        self.next_index += 1;
        self.logs[pos].insert(Entry { start: index, len: 1, payload: Some(payload.clone()) });
        self.own_bytes += payload.len();
        self.own.push_back((index, payload.clone()));
        let relay = payload.len() >= self.relay_min && self.others().nth(1).is_some();
        let to: Vec<Rank> = if relay { vec![self.ring(self.me, 1)] } else { self.others().collect() };
        let (view, me) = (self.view, self.me);
        if payload.len() > self.chunk {
            // Chunk by chunk, each to every destination, so that the first
            // is on its way along the chain while the rest are queued.
            let total = payload.len() as u32;
            let mut offset = 0;
            while offset < payload.len() {
                let end = payload.len().min(offset + self.chunk);
                let bytes = payload.slice(offset..end);
                let frame = Frame::Chunk { view, sender: me, index, total, offset: offset as u32, bytes, relay };
                for t in &to {
                    self.effects.push(Effect::Send { to: *t, frame: frame.clone() });
                }
                offset = end;
            }
        } else {
            let frame = Frame::Data { view, sender: me, index, payload, relay };
            for t in to {
                self.effects.push(Effect::Send { to: t, frame: frame.clone() });
            }
        }
        self.dirty = true;
        index
    }

    /// A frame from member `from`.
    pub fn on_message(&mut self, from: Rank, frame: Frame) {
        if self.stopped || from >= self.n || from == self.me {
            return;
        }
        match frame {
            Frame::Row(r) => self.on_row(from, r),
            Frame::Data { view, .. } | Frame::Chunk { view, .. } | Frame::Null { view, .. } => {
                if view == self.view + 1 {
                    if let Frame::Data { payload: b, .. } | Frame::Chunk { bytes: b, .. } = &frame {
                        self.stash_bytes += b.len();
                    }
                    self.stash.push((from, frame));
                } else if view == self.view {
                    self.on_data(from, frame);
                }
            }
        }
    }

    fn on_data(&mut self, from: Rank, frame: Frame) {
        if self.wedged || self.suspected.contains(&from) {
            return;
        }
        let (sender, relay) = match &frame {
            Frame::Data { sender, relay, .. } | Frame::Chunk { sender, relay, .. } => (*sender, *relay),
            Frame::Null { sender, .. } => (*sender, false),
            Frame::Row(_) => return,
        };
        // A message comes from its sender, or along the chain from the
        // member before us.
        let expected = if relay { self.ring(self.me, -1) } else { sender };
        if from != expected || sender == self.me {
            return;
        }
        let Some(pos) = self.senders.iter().position(|r| *r == sender) else {
            return;
        };
        let entry = match &frame {
            Frame::Data { index, payload, .. } => Some(Entry { start: *index, len: 1, payload: Some(payload.clone()) }),
            Frame::Null { first, count, .. } => Some(Entry { start: *first, len: *count, payload: None }),
            Frame::Chunk { index, total, offset, bytes, .. } => {
                match self.add_chunk(pos, *index, *total, *offset, bytes) {
                    None => return,
                    Some(whole) => whole.map(|p| Entry { start: *index, len: 1, payload: Some(p) }),
                }
            }
            Frame::Row(_) => return,
        };
        // A chunk that is new (whether or not it completes its message) or
        // a message that is new goes on along the chain.
        let new = match entry {
            Some(e) => self.logs[pos].insert(e),
            None => true,
        };
        if new {
            self.dirty = true;
            if relay {
                let next = self.ring(self.me, 1);
                if next != sender {
                    self.effects.push(Effect::Send { to: next, frame });
                }
            }
        }
    }

    /// Copies a chunk of message `index` of the sender at `pos` into its
    /// buffer. `None`: refused (the message is held already, or the chunk
    /// overlaps one held, or disagrees on the length); `Some(None)`: taken,
    /// more to come; `Some(Some(payload))`: the message is complete.
    fn add_chunk(&mut self, pos: usize, index: u64, total: u32, offset: u32, bytes: &Bytes) -> Option<Option<Bytes>> {
        if self.logs[pos].holds(index) {
            return None;
        }
        let total = total as usize;
        if !self.parts.contains_key(&(pos, index)) {
            let buf = match self.pool.iter().position(|b| b.capacity() >= total) {
                Some(i) => self.pool.swap_remove(i),
                None => BytesMut::with_capacity(total),
            };
            self.parts.insert((pos, index), Part { buf, total, got: 0, have: Vec::new() });
            self.parts_bytes += total;
        }
        let part = self.parts.get_mut(&(pos, index)).expect("inserted");
        let (at, n) = (offset as usize, bytes.len());
        if part.total != total || part.have.iter().any(|&(a, l)| at < a + l && a < at + n) {
            return None;
        }
        // Chunks come in order along one path; a gap (chunks reordered)
        // is filled with zeros until its chunk comes.
        if part.buf.len() < at + n {
            part.buf.resize(at, 0);
            part.buf.extend_from_slice(bytes);
        } else {
            part.buf[at..at + n].copy_from_slice(bytes);
        }
        part.got += n;
        part.have.push((at, n));
        if part.got < total {
            return Some(None);
        }
        let part = self.parts.remove(&(pos, index)).expect("present");
        self.parts_bytes -= total;
        Some(Some(part.buf.freeze()))
    }

    /// Hands back the buffer of a delivered message that was sent in
    /// chunks, once the application is done with it: the next such message
    /// is reassembled into it, without a fresh allocation and its page
    /// faults. Its contents are discarded.
    pub fn recycle(&mut self, mut buf: BytesMut) {
        buf.clear();
        let pooled: usize = self.pool.iter().map(|b| b.capacity()).sum();
        if buf.capacity() > 0 && self.pool.len() < POOL_BUFFERS && pooled + buf.capacity() <= POOL_BYTES {
            self.pool.push(buf);
        }
    }

    fn on_row(&mut self, from: Rank, r: Row) {
        // A member we excluded or suspect is dead to us (fail-stop): what
        // it says no longer counts. Its rows can still come, late: a member
        // cut off by a partition suspects everybody, and once its links
        // heal TCP delivers the rows it wrote meanwhile; taking in those
        // suspicions made the survivors suspect each other and stop
        // (testbed, `bench group --fail-member 1@500ms:silence`).
        if !self.members.contains(&from) || self.suspected.contains(&from) {
            return;
        }
        if let Some(old) = &self.rows[from as usize] {
            if old.version >= r.version {
                return;
            }
            if r.heartbeat > old.heartbeat {
                self.hb_seen[from as usize] = true;
            }
        } else {
            self.hb_seen[from as usize] = true;
        }
        // A row that ends a silence of half the failure timeout or more
        // (no row, no frame of any kind) was written while its member was
        // cut off from us, so it probably was cut off from the others too:
        // what it suspects is what it could not hear, not what failed. Its
        // suspicions (of us too) are not taken in for a failure timeout. A
        // member cut off by a partition suspects the others one by one,
        // each when its own timeout runs out; if its links heal just as it
        // stops (partition safety), its rows can reach a survivor before
        // the survivor's own timeout has run out for it, and a row
        // suspecting one survivor made the other suspect it and stop too
        // (testbed, `bench group --fail-member 1@882ms:silence` with the
        // CPUs busy, 2026-11-27). A suspicion that stands is taken in from
        // the member's next rows, one failure timeout later. The silence
        // may have ended a tick or more before the row comes (the data
        // queued ahead of it in the channel came first): `on_tick` marks
        // it then.
        let fu = from as usize;
        self.end_silence(fu, self.last_tick);
        if self.last_tick < self.rows_quarantined_until[fu] {
            self.rows[fu] = Some(r);
            return;
        }
        for s in &r.suspected {
            if *s == self.me {
                if self.members.contains(&from) {
                    self.stop();
                }
                return;
            }
            self.suspect(*s);
        }
        self.rows[from as usize] = Some(r);
    }

    /// The channel heard from `rank` (any frame, on any rail) since the
    /// last tick: its process is there, even if its rows are late, queued
    /// behind large messages in the channel.
    pub fn on_alive(&mut self, rank: Rank) {
        if let Some(a) = self.alive_seen.get_mut(rank as usize) {
            *a = true;
        }
    }

    /// The channel lost every rail to `rank`.
    pub fn on_peer_lost(&mut self, rank: Rank) {
        if !self.stopped {
            self.suspect(rank);
        }
    }

    /// Time is `now`: heartbeats and failure detection.
    pub fn on_tick(&mut self, now: Duration) {
        if self.stopped {
            return;
        }
        let next = *self.next_hb.get_or_insert_with(|| {
            self.last_seen.iter_mut().for_each(|t| *t = now);
            self.alive_at.iter_mut().for_each(|t| *t = now);
            now
        });
        if now >= next {
            self.heartbeat += 1;
            self.dirty = true;
            self.next_hb = Some(now + self.hb_interval);
        }
        // A tick a quarter failure timeout after the last one: this member
        // ran late itself (descheduled, paused), and what the others sent
        // meanwhile may be unread still. Everybody looks silent; judge on
        // the next tick, after a turn has read the channel (one tick in a
        // row at most, so a member that always runs late still judges).
        let late = now.saturating_sub(self.last_tick) >= self.timeout / 4 && !self.skipped_late_tick;
        self.skipped_late_tick = late;
        self.last_tick = now;
        for j in 0..self.n {
            let ju = j as usize;
            let alive = std::mem::take(&mut self.alive_seen[ju]);
            let hb = std::mem::take(&mut self.hb_seen[ju]);
            if alive || hb {
                self.end_silence(ju, now);
            }
            if alive {
                self.alive_at[ju] = now;
            }
            if hb {
                self.last_seen[ju] = now;
                continue;
            }
            if j == self.me || !self.members.contains(&j) || late {
                continue;
            }
            let rows_late = now.saturating_sub(self.last_seen[ju]);
            let silent = now.saturating_sub(self.alive_at[ju]) >= self.timeout;
            if rows_late >= self.timeout && (silent || rows_late >= self.timeout * ROWS_LATE_FACTOR) {
                self.suspect(j);
            }
        }
    }

    /// Member `j` is heard at `now` (a frame, or a row): if that ends a
    /// silence of half the failure timeout or more, the suspicions in its
    /// rows are not taken in for a failure timeout (see `on_row`).
    fn end_silence(&mut self, j: usize, now: Duration) {
        let heard = self.alive_at[j].max(self.last_seen[j]);
        if self.next_hb.is_some() && now.saturating_sub(heard) >= self.timeout / 2 {
            self.rows_quarantined_until[j] = self.rows_quarantined_until[j].max(now + self.timeout);
        }
    }

    fn suspect(&mut self, r: Rank) {
        if r == self.me || r >= self.n || !self.suspected.insert(r) {
            return;
        }
        self.dirty = true;
        if self.members.contains(&r) {
            self.wedge();
        }
    }

    fn wedge(&mut self) {
        if !self.wedged {
            self.wedged = true;
            self.dirty = true;
            self.effects
                .push(Effect::Wedged { view_id: self.view, suspected: self.suspected.iter().copied().collect() });
        }
    }

    fn stop(&mut self) {
        if !self.stopped {
            self.stopped = true;
            self.effects.push(Effect::Expelled { view_id: self.view });
        }
    }

    // ---- the engine ------------------------------------------------------

    /// Ends a turn: runs the engine over what arrived since the last call
    /// and returns what to do, in order.
    pub fn drain_effects(&mut self) -> Vec<Effect> {
        // An install may unblock more work; each pass installs at most one
        // view, and views only go forward.
        for _ in 0..8 {
            if self.stopped || !self.step() {
                break;
            }
        }
        if !self.stopped && (self.dirty || self.report_due()) {
            self.push_row();
        }
        std::mem::take(&mut self.effects)
    }

    /// One pass; true if a view was installed.
    fn step(&mut self) -> bool {
        if let Some(p) = self.learned_decision() {
            return self.install(p);
        }
        if !self.wedged {
            while !self.carry.is_empty() && self.window_open() {
                let p = self.carry.pop_front().expect("non-empty");
                self.send_now(p);
            }
            if self.mode == Mode::Ordered {
                self.send_nulls();
            }
            self.deliver();
            self.release_own();
            false
        } else {
            self.view_change()
        }
    }

    /// A member already in the next view tells which proposal created it.
    fn learned_decision(&self) -> Option<Proposal> {
        self.rows.iter().flatten().find_map(|r| {
            let p = r.installed_from.as_ref()?;
            (r.view == self.view + 1 && p.view == self.view).then(|| p.clone())
        })
    }

    fn send_nulls(&mut self) {
        let Some(me) = self.my_pos else { return };
        let mut target = self.next_index;
        for (k, l) in self.logs.iter().enumerate() {
            let t = if me < k { l.contig } else { l.contig.saturating_sub(1) };
            target = target.max(t);
        }
        if target > self.next_index {
            let first = self.next_index;
            let count = target - first;
            self.next_index = target;
            self.logs[me].insert(Entry { start: first, len: count, payload: None });
            let frame = Frame::Null { view: self.view, sender: self.me, first, count };
            let to: Vec<Rank> = self.others().collect();
            for t in to {
                self.effects.push(Effect::Send { to: t, frame: frame.clone() });
            }
            self.dirty = true;
        }
    }

    fn deliver_one(&mut self, pos: usize, index: u64) -> bool {
        match self.logs[pos].take(index) {
            Some(p) => {
                self.next_deliver[pos] = index + 1;
                self.delivered += 1;
                if let Some(payload) = p {
                    self.effects.push(Effect::Deliver { view: self.view, sender: self.senders[pos], index, payload });
                }
                true
            }
            None => false,
        }
    }

    fn deliver(&mut self) {
        let s = self.senders.len();
        if s == 0 {
            return;
        }
        match self.mode {
            Mode::Ordered => {
                let mut stable = self.seq_num();
                for j in self.others().collect::<Vec<_>>() {
                    stable = stable.min(self.row(j).map_or(0, |r| r.seq_num));
                }
                while self.delivered < stable {
                    let q = self.delivered;
                    let (pos, index) = ((q % s as u64) as usize, q / s as u64);
                    if !self.deliver_one(pos, index) {
                        break;
                    }
                }
            }
            Mode::Unordered => {
                for pos in 0..s {
                    let mut stable = self.logs[pos].contig;
                    for j in self.others().collect::<Vec<_>>() {
                        stable = stable.min(self.row(j).map_or(0, |r| r.num_received[pos]));
                    }
                    while self.next_deliver[pos] < stable {
                        if !self.deliver_one(pos, self.next_deliver[pos]) {
                            break;
                        }
                    }
                }
            }
        }
    }

    fn release_own(&mut self) {
        let Some(pos) = self.my_pos else { return };
        while let Some((index, _)) = self.own.front() {
            let index = *index;
            let done =
                self.next_deliver[pos] > index && self.others().all(|j| self.delivered_everywhere_at(j, pos, index));
            if !done {
                break;
            }
            let (_, p) = self.own.pop_front().expect("front");
            self.own_bytes -= p.len();
        }
    }

    /// Wedged: lead or follow the change; true if a view was installed.
    fn view_change(&mut self) -> bool {
        let survivors: Vec<Rank> = self.members.iter().copied().filter(|m| !self.suspected.contains(m)).collect();
        if self.partition_safety && survivors.len() * 2 <= self.members.len() {
            if !self.stopped {
                self.stopped = true;
                self.effects.push(Effect::Partitioned { view_id: self.view });
            }
            return false;
        }
        let leader = survivors[0]; // never empty: we do not suspect ourselves
        if leader == self.me {
            if self.proposal.is_none() {
                let mut trim: Vec<u64> = self.logs.iter().map(|l| l.contig).collect();
                let mut ready = true;
                for j in &survivors {
                    if *j == self.me {
                        continue;
                    }
                    match self.row(*j) {
                        Some(r) if r.wedged => {
                            for (t, n) in trim.iter_mut().zip(&r.num_received) {
                                *t = (*t).min(*n);
                            }
                        }
                        _ => ready = false,
                    }
                }
                if ready {
                    self.proposal = Some(Proposal { view: self.view, trim, members: survivors.clone() });
                    self.dirty = true;
                }
            }
        } else if let Some(p) = self.row(leader).and_then(|r| r.proposal.clone())
            && self.proposal.as_ref() != Some(&p)
        {
            if !self.valid(&p) {
                self.stop();
                return false;
            }
            self.proposal = Some(p);
            self.dirty = true;
        }
        let Some(p) = self.proposal.clone() else {
            return false;
        };
        let all_echo = p.members.iter().filter(|j| **j != self.me && !self.suspected.contains(j)).all(|j| {
            self.rows[*j as usize].as_ref().is_some_and(|r| {
                (r.view == self.view && r.proposal.as_ref() == Some(&p))
                    || (r.view == self.view + 1 && r.installed_from.as_ref() == Some(&p))
            })
        });
        if all_echo {
            return self.install(p);
        }
        false
    }

    /// A proposal we can carry out: for this view, includes us, and trims
    /// no higher than what we hold.
    fn valid(&self, p: &Proposal) -> bool {
        p.view == self.view
            && (!self.partition_safety || p.members.len() * 2 > self.members.len())
            && p.trim.len() == self.senders.len()
            && p.members.contains(&self.me)
            && p.members.iter().all(|m| self.members.contains(m))
            && p.trim
                .iter()
                .zip(&self.logs)
                .enumerate()
                .all(|(pos, (t, l))| *t <= l.contig && *t >= self.next_deliver[pos])
    }

    /// Delivers exactly up to `p.trim`, installs the next view; true if
    /// installed.
    fn install(&mut self, p: Proposal) -> bool {
        if !self.valid(&p) {
            self.stop();
            return false;
        }
        self.wedged = true;
        let s = self.senders.len();
        match self.mode {
            Mode::Ordered => {
                let end = p
                    .trim
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| **t > 0)
                    .map(|(pos, t)| self.seq(pos, t - 1).saturating_add(1))
                    .max()
                    .unwrap_or(0);
                for q in self.delivered..end {
                    let (pos, index) = ((q % s as u64) as usize, q / s as u64);
                    if index < p.trim[pos] {
                        self.deliver_one(pos, index);
                    }
                }
            }
            Mode::Unordered => {
                for pos in 0..s {
                    while self.next_deliver[pos] < p.trim[pos] {
                        self.deliver_one(pos, self.next_deliver[pos]);
                    }
                }
            }
        }
        // Own messages past the trim go out again, first, in the new view.
        let mut carry: VecDeque<Bytes> = match self.my_pos {
            Some(pos) => self.own.iter().filter(|(i, _)| *i >= p.trim[pos]).map(|(_, b)| b.clone()).collect(),
            None => VecDeque::new(),
        };
        carry.extend(self.carry.drain(..));
        self.carry = carry;

        self.view = p.view + 1;
        self.members = p.members.clone();
        self.installed_from = Some(p);
        self.reset_view_state();
        if !self.declared.contains(&self.me) {
            self.carry.clear();
        }
        self.dirty = true;
        self.effects.push(Effect::ViewChange { view_id: self.view, members: self.members.clone() });
        if self.wedged {
            self.effects
                .push(Effect::Wedged { view_id: self.view, suspected: self.suspected.iter().copied().collect() });
        }
        self.stash_bytes = 0;
        for (from, f) in std::mem::take(&mut self.stash) {
            self.on_message(from, f);
        }
        true
    }

    /// Deliveries not pushed yet must go out now: some sender's count moved
    /// by a quarter of the window (at least one message), so that a sender
    /// whose window is full learns of a quarter of it at once, while a
    /// stream of deliveries costs a row per quarter window instead of one
    /// per turn. Smaller moves go out with the next row pushed for another
    /// reason, at the latest the next heartbeat.
    fn report_due(&self) -> bool {
        let step = (self.window / 4).max(1);
        self.next_deliver.iter().zip(&self.reported).any(|(d, r)| *d >= r + step)
    }

    fn push_row(&mut self) {
        self.dirty = false;
        self.reported.clone_from(&self.next_deliver);
        self.version += 1;
        let row = Row {
            view: self.view,
            version: self.version,
            heartbeat: self.heartbeat,
            num_received: self.logs.iter().map(|l| l.contig).collect(),
            seq_num: self.seq_num(),
            delivered: self.delivered,
            delivered_from: self.next_deliver.clone(),
            wedged: self.wedged,
            suspected: self.suspected.iter().copied().collect(),
            proposal: self.proposal.clone(),
            installed_from: self.installed_from.clone(),
        };
        let to: Vec<Rank> = self.others().collect();
        for t in to {
            self.effects.push(Effect::Send { to: t, frame: Frame::Row(row.clone()) });
        }
    }
}
