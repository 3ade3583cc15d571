//! Frames exchanged between group members, and their byte encoding.
//!
//! Four kinds: [`Frame::Data`] (one application message, sent by its
//! sender to every member or relayed along the chain), [`Frame::Chunk`]
//! (a piece of a message longer than the sender's chunk size, travelling
//! the same way), [`Frame::Null`]
//! (a run of null messages that fill an idle sender's turns) and
//! [`Frame::Row`] (the sender's whole state row: monotonic counters and the
//! view-change fields, pushed as an overwrite; later rows subsume earlier
//! ones, so only the latest one matters).
//!
//! Encoding: a version byte ([`WIRE_VERSION`]), a tag byte, then the fields
//! little-endian. [`Frame::decode`] rejects anything malformed with an error,
//! never a panic, and never allocates more than the input's length justifies.
//!
//! A data frame or chunk may also travel *split* in two messages: its head
//! ([`Frame::encode_head`]: the same encoding without the payload's bytes,
//! behind a tag byte of its own) and then the payload's bytes alone. The
//! sender then sends its application's bytes as they are, without copying
//! them behind a header; the receiver joins the two with
//! [`Frame::decode_split`] and keeps the payload without a copy.

use bytes::{BufMut, Bytes, BytesMut};

use crate::Rank;

/// First byte of every encoded frame.
pub const WIRE_VERSION: u8 = 1;

const TAG_DATA: u8 = 1;
const TAG_NULL: u8 = 2;
const TAG_ROW: u8 = 3;
/// A [`Frame::Data`] with `relay` set: same fields as [`TAG_DATA`].
const TAG_RELAY: u8 = 4;
/// A [`Frame::Chunk`] without `relay`.
const TAG_CHUNK: u8 = 5;
/// A [`Frame::Chunk`] with `relay` set.
const TAG_RELAY_CHUNK: u8 = 6;
/// The head of a split data frame or chunk: this tag, then the frame's own
/// tag and fields (its length included), without the payload's bytes.
const TAG_SPLIT: u8 = 7;

/// Bytes of a data frame's or chunk's tag and fields, at most (the
/// payload comes after them).
const HEAD_MAX: usize = 1 + 8 + 4 + 8 + 4 + 4 + 4;

/// Most ranks a decoded list may hold.
pub const MAX_RANKS: usize = 1 << 16;

/// The leader's proposal that ends view `view`: deliver exactly the messages
/// of the sender at position `p` with index `< trim[p]`, then install view
/// `view + 1` with `members`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proposal {
    pub view: u64,
    pub trim: Vec<u64>,
    pub members: Vec<Rank>,
}

/// One member's state row. Every counter is monotonic within a view; `view`,
/// `version` and `heartbeat` are monotonic for the life of the member.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Row {
    /// The view these counters belong to.
    pub view: u64,
    /// Bumped on every push; a receiver keeps only the highest.
    pub version: u64,
    /// Bumped every heartbeat interval; failure detection watches it.
    pub heartbeat: u64,
    /// Per sender position of `view`: how many of its messages (data and
    /// nulls) this member holds as a contiguous prefix.
    pub num_received: Vec<u64>,
    /// How many global sequence numbers this member holds in order.
    pub seq_num: u64,
    /// How many sequence numbers (ordered) or messages (unordered) this
    /// member has delivered or skipped (nulls) in `view`.
    pub delivered: u64,
    /// Per sender position of `view`: how many of its messages this member
    /// has delivered or skipped (the send window watches it).
    pub delivered_from: Vec<u64>,
    /// This member has stopped sending and delivering in `view`; from then
    /// on `num_received` is final for `view`.
    pub wedged: bool,
    /// Ranks this member believes dead (only grows).
    pub suspected: Vec<Rank>,
    /// The proposal ending `view` this member has adopted, if any.
    pub proposal: Option<Proposal>,
    /// The proposal that created `view` (None for view 0).
    pub installed_from: Option<Proposal>,
}

/// A frame between members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Message `index` of `sender` in `view`. With `relay`, it travels
    /// along the view's chain (the sender gives it to the next member in
    /// rank order, each member passes it on, wrapping round, up to the one
    /// before the sender); without, the sender gives it to every member.
    Data { view: u64, sender: Rank, index: u64, payload: Bytes, relay: bool },
    /// Bytes `offset .. offset + bytes.len()` of message `index` of
    /// `sender`, whose payload is `total` bytes long: a payload longer than
    /// the sender's chunk size travels in chunks, each passed on along the
    /// chain (with `relay`) as soon as it arrives, so a long message
    /// crosses the chain in pipeline instead of store-and-forward.
    Chunk { view: u64, sender: Rank, index: u64, total: u32, offset: u32, bytes: Bytes, relay: bool },
    /// Null messages `first .. first + count` of `sender` in `view`.
    Null { view: u64, sender: Rank, first: u64, count: u64 },
    /// The state row of the member that sends it.
    Row(Row),
}

/// Why bytes are not a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The input ends inside a field.
    Short,
    /// Unknown version byte.
    Version(u8),
    /// Unknown frame tag.
    Tag(u8),
    /// A field is out of range or bytes are left over.
    Invalid(&'static str),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Short => write!(f, "frame truncated"),
            DecodeError::Version(v) => write!(f, "unknown frame version {v}"),
            DecodeError::Tag(t) => write!(f, "unknown frame tag {t}"),
            DecodeError::Invalid(w) => write!(f, "invalid frame: {w}"),
        }
    }
}

impl std::error::Error for DecodeError {}

fn put_proposal(b: &mut BytesMut, p: &Option<Proposal>) {
    match p {
        None => b.put_u8(0),
        Some(p) => {
            b.put_u8(1);
            b.put_u64_le(p.view);
            b.put_u32_le(p.trim.len() as u32);
            for t in &p.trim {
                b.put_u64_le(*t);
            }
            b.put_u32_le(p.members.len() as u32);
            for m in &p.members {
                b.put_u32_le(*m);
            }
        }
    }
}

impl Frame {
    /// Encodes the frame (version byte first).
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        self.encode_into(&mut b);
        b.freeze()
    }

    /// Appends the frame's encoding to `b` (a reused buffer saves the
    /// allocation, and for large frames its page faults).
    pub fn encode_into(&self, b: &mut BytesMut) {
        b.put_u8(WIRE_VERSION);
        match self {
            Frame::Data { payload, .. } | Frame::Chunk { bytes: payload, .. } => {
                b.reserve(HEAD_MAX + payload.len());
                self.put_head(b);
                b.put_slice(payload);
            }
            Frame::Null { view, sender, first, count } => {
                b.put_u8(TAG_NULL);
                b.put_u64_le(*view);
                b.put_u32_le(*sender);
                b.put_u64_le(*first);
                b.put_u64_le(*count);
            }
            Frame::Row(r) => {
                b.put_u8(TAG_ROW);
                b.put_u64_le(r.view);
                b.put_u64_le(r.version);
                b.put_u64_le(r.heartbeat);
                b.put_u32_le(r.num_received.len() as u32);
                for n in &r.num_received {
                    b.put_u64_le(*n);
                }
                b.put_u64_le(r.seq_num);
                b.put_u64_le(r.delivered);
                b.put_u32_le(r.delivered_from.len() as u32);
                for n in &r.delivered_from {
                    b.put_u64_le(*n);
                }
                b.put_u8(r.wedged as u8);
                b.put_u32_le(r.suspected.len() as u32);
                for s in &r.suspected {
                    b.put_u32_le(*s);
                }
                put_proposal(b, &r.proposal);
                put_proposal(b, &r.installed_from);
            }
        }
    }

    /// The tag and fields of a data frame or chunk, its length included,
    /// without the payload's bytes (nothing for other frames).
    fn put_head(&self, b: &mut BytesMut) {
        match self {
            Frame::Data { view, sender, index, payload, relay } => {
                b.put_u8(if *relay { TAG_RELAY } else { TAG_DATA });
                b.put_u64_le(*view);
                b.put_u32_le(*sender);
                b.put_u64_le(*index);
                b.put_u32_le(payload.len() as u32);
            }
            Frame::Chunk { view, sender, index, total, offset, bytes, relay } => {
                b.put_u8(if *relay { TAG_RELAY_CHUNK } else { TAG_CHUNK });
                b.put_u64_le(*view);
                b.put_u32_le(*sender);
                b.put_u64_le(*index);
                b.put_u32_le(*total);
                b.put_u32_le(*offset);
                b.put_u32_le(bytes.len() as u32);
            }
            Frame::Null { .. } | Frame::Row(_) => {}
        }
    }

    /// For a data frame or chunk: the head of its split form (see the
    /// module docs) and the payload to send after it, which is the
    /// frame's own (no copy). `None` for other frames.
    pub fn encode_head(&self) -> Option<(Bytes, Bytes)> {
        let payload = match self {
            Frame::Data { payload, .. } | Frame::Chunk { bytes: payload, .. } => payload.clone(),
            Frame::Null { .. } | Frame::Row(_) => return None,
        };
        let mut b = BytesMut::with_capacity(2 + HEAD_MAX);
        b.put_u8(WIRE_VERSION);
        b.put_u8(TAG_SPLIT);
        self.put_head(&mut b);
        Some((b.freeze(), payload))
    }

    /// True if `bytes` is the head of a split frame (its payload is the
    /// next message on the same path); [`Frame::decode_split`] joins them.
    pub fn is_head(bytes: &[u8]) -> bool {
        bytes.len() >= 2 && bytes[0] == WIRE_VERSION && bytes[1] == TAG_SPLIT
    }

    /// Joins a split frame: `head` as [`Frame::encode_head`] made it and
    /// the payload that followed it (kept as it is, no copy). The
    /// payload's length must be the one the head gives.
    pub fn decode_split(head: &Bytes, payload: Bytes) -> Result<Frame, DecodeError> {
        let mut r = Reader { b: head, at: 0 };
        let v = r.u8()?;
        if v != WIRE_VERSION {
            return Err(DecodeError::Version(v));
        }
        match r.u8()? {
            TAG_SPLIT => {}
            t => return Err(DecodeError::Tag(t)),
        }
        let f = match r.u8()? {
            t @ (TAG_DATA | TAG_RELAY | TAG_CHUNK | TAG_RELAY_CHUNK) => {
                Self::decode_data(t, &mut r, head, Some(payload))?
            }
            t => return Err(DecodeError::Tag(t)),
        };
        if r.left() != 0 {
            return Err(DecodeError::Invalid("trailing bytes"));
        }
        Ok(f)
    }

    /// The fields of a data frame or chunk with tag `tag`, then its
    /// payload: `payload` if given (a split frame's, whose length must
    /// match), else the next bytes of `bytes` (sliced, no copy).
    fn decode_data(tag: u8, r: &mut Reader<'_>, bytes: &Bytes, payload: Option<Bytes>) -> Result<Frame, DecodeError> {
        let view = r.u64()?;
        let sender = r.u32()?;
        let index = r.u64()?;
        let chunk = matches!(tag, TAG_CHUNK | TAG_RELAY_CHUNK);
        let (total, offset) = if chunk { (r.u32()?, r.u32()?) } else { (0, 0) };
        let len = r.u32()?;
        if chunk && (len == 0 || u64::from(offset) + u64::from(len) > u64::from(total)) {
            return Err(DecodeError::Invalid("chunk outside its message"));
        }
        let len = len as usize;
        let payload = match payload {
            Some(p) if p.len() == len => p,
            Some(_) => return Err(DecodeError::Invalid("split payload of another length")),
            None if len > r.left() => return Err(DecodeError::Short),
            None => {
                r.at += len;
                bytes.slice(r.at - len..r.at)
            }
        };
        Ok(match tag {
            TAG_DATA | TAG_RELAY => Frame::Data { view, sender, index, payload, relay: tag == TAG_RELAY },
            _ => Frame::Chunk { view, sender, index, total, offset, bytes: payload, relay: tag == TAG_RELAY_CHUNK },
        })
    }

    /// Decodes one frame that fills `bytes` exactly. Data payloads are
    /// slices of `bytes` (no copy). The head of a split frame is not a
    /// frame by itself ([`Frame::is_head`], [`Frame::decode_split`]).
    pub fn decode(bytes: &Bytes) -> Result<Frame, DecodeError> {
        let mut r = Reader { b: bytes, at: 0 };
        let v = r.u8()?;
        if v != WIRE_VERSION {
            return Err(DecodeError::Version(v));
        }
        let tag = r.u8()?;
        let f = match tag {
            TAG_DATA | TAG_RELAY | TAG_CHUNK | TAG_RELAY_CHUNK => Self::decode_data(tag, &mut r, bytes, None)?,
            TAG_NULL => {
                let view = r.u64()?;
                let sender = r.u32()?;
                let first = r.u64()?;
                let count = r.u64()?;
                if count == 0 || first.checked_add(count).is_none() {
                    return Err(DecodeError::Invalid("null run"));
                }
                Frame::Null { view, sender, first, count }
            }
            TAG_ROW => {
                let view = r.u64()?;
                let version = r.u64()?;
                let heartbeat = r.u64()?;
                let num_received = r.vec_u64()?;
                let seq_num = r.u64()?;
                let delivered = r.u64()?;
                let delivered_from = r.vec_u64()?;
                let wedged = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(DecodeError::Invalid("wedged flag")),
                };
                let suspected = r.vec_u32()?;
                let proposal = r.proposal()?;
                let installed_from = r.proposal()?;
                Frame::Row(Row {
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
                })
            }
            t => return Err(DecodeError::Tag(t)),
        };
        if r.left() != 0 {
            return Err(DecodeError::Invalid("trailing bytes"));
        }
        Ok(f)
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn left(&self) -> usize {
        self.b.len() - self.at
    }
    fn take<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        if self.left() < N {
            return Err(DecodeError::Short);
        }
        let mut a = [0u8; N];
        a.copy_from_slice(&self.b[self.at..self.at + N]);
        self.at += N;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    fn len(&mut self, elem: usize) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        if n > MAX_RANKS {
            return Err(DecodeError::Invalid("list too long"));
        }
        if n.saturating_mul(elem) > self.left() {
            return Err(DecodeError::Short);
        }
        Ok(n)
    }
    fn vec_u64(&mut self) -> Result<Vec<u64>, DecodeError> {
        let n = self.len(8)?;
        (0..n).map(|_| self.u64()).collect()
    }
    fn vec_u32(&mut self) -> Result<Vec<u32>, DecodeError> {
        let n = self.len(4)?;
        (0..n).map(|_| self.u32()).collect()
    }
    fn proposal(&mut self) -> Result<Option<Proposal>, DecodeError> {
        match self.u8()? {
            0 => Ok(None),
            1 => {
                let view = self.u64()?;
                let trim = self.vec_u64()?;
                let members = self.vec_u32()?;
                Ok(Some(Proposal { view, trim, members }))
            }
            _ => Err(DecodeError::Invalid("proposal flag")),
        }
    }
}
