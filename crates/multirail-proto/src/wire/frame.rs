//! The fixed 48-byte frame header that precedes every frame on an
//! established rail.
//!
//! ```text
//!  0      1      2             4                           8
//!  +------+------+-------------+---------------------------+
//!  | ver  |  op  |    flags    |  payload checksum (CRC32C)|
//!  +------+------+-------------+---------------------------+
//!  8  seq: per-peer message sequence number (u64)
//! 16  tag (u64)
//! 24  total_len: length of the whole message (u64)
//! 32  offset: where this fragment's payload starts in the message (u64)
//! 40  frag_len: payload bytes following this header (u32)
//! 44  aux: op-specific (u32)
//! 48  payload (frag_len bytes)
//! ```
//!
//! Which fields mean what for each op is specified in `docs/protocol.md`
//! and enforced by [`FrameHeader::parse`].

use super::{WireError, check_len, get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};

mod field {
    pub const VERSION: usize = 0;
    pub const OP: usize = 1;
    pub const FLAGS: usize = 2;
    pub const CHECKSUM: usize = 4;
    pub const SEQ: usize = 8;
    pub const TAG: usize = 16;
    pub const TOTAL: usize = 24;
    pub const OFFSET: usize = 32;
    pub const FRAG_LEN: usize = 40;
    pub const AUX: usize = 44;
}

/// Frame header version byte (the HELLO version governs the connection; this
/// byte lets a reader reject a desynchronised stream early).
pub const FRAME_VERSION: u8 = 1;

/// Frame operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Op {
    /// Unsolicited message data (a small message, whole or in fragments).
    Eager = 1,
    /// Request to send: announces a rendezvous message (no payload).
    Rts = 2,
    /// Clear to send: the receiver matched an RTS and posted a buffer.
    Cts = 3,
    /// Rendezvous message data, written straight into the posted buffer.
    Data = 4,
    /// Acknowledges received byte ranges and returns eager credits.
    Ack = 5,
    /// A liveness probe (flag PING) or its answer (flag PONG).
    Heartbeat = 6,
    /// Orderly shutdown of the sending endpoint.
    Close = 7,
}

impl Op {
    pub fn from_u8(v: u8) -> Option<Op> {
        Some(match v {
            1 => Op::Eager,
            2 => Op::Rts,
            3 => Op::Cts,
            4 => Op::Data,
            5 => Op::Ack,
            6 => Op::Heartbeat,
            7 => Op::Close,
            _ => return None,
        })
    }
    /// Ops whose payload is message data addressed by (seq, offset).
    pub fn carries_data(self) -> bool {
        matches!(self, Op::Eager | Op::Data)
    }
}

/// Header flag bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Flags(pub u16);

impl Flags {
    /// `checksum` holds the CRC32C of the payload.
    pub const CHECKSUM: Flags = Flags(0x0001);
    /// CTS only: the receiver will not take the data (truncation); the
    /// sender completes the send without transmitting it.
    pub const DISCARD: Flags = Flags(0x0002);
    /// EAGER/DATA/RTS: this frame is a retransmission after a rail failure.
    pub const RETRANSMIT: Flags = Flags(0x0004);
    /// Any op but ACK: `aux` holds the low 32 bits of the sender's
    /// delivered prefix (every message of the receiver's numbering below
    /// it was delivered): an acknowledgement riding on other traffic.
    pub const ACKED: Flags = Flags(0x0008);
    /// HEARTBEAT: a probe; answer with a HEARTBEAT carrying PONG and the
    /// same `seq`.
    pub const PING: Flags = Flags(0x0010);
    /// HEARTBEAT: the answer to the PING numbered `seq`; `total_len` and
    /// `tag` carry the answerer's cumulative credit counters (as ACK).
    pub const PONG: Flags = Flags(0x0020);
    /// EAGER/DATA: acknowledge at once what this rail has received (with
    /// this frame), without waiting for the acknowledgement threshold or
    /// delay: the sender's window on the rail is running out.
    pub const ACK_NOW: Flags = Flags(0x0040);
    pub const ALL: u16 = 0x007f;

    pub fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }
    pub fn with(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }
}

/// Bounds applied while parsing: nothing larger is ever accepted from a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload of one frame.
    pub max_frame: u32,
    /// Largest message.
    pub max_message: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_frame: 16 << 20, max_message: 1 << 40 }
    }
}

/// A parsed, validated frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub op: Op,
    pub flags: Flags,
    pub checksum: u32,
    pub seq: u64,
    pub tag: u64,
    pub total_len: u64,
    pub offset: u64,
    pub frag_len: u32,
    pub aux: u32,
}

impl FrameHeader {
    pub const LEN: usize = 48;

    /// A header with every field zero but `op`.
    pub fn new(op: Op) -> FrameHeader {
        FrameHeader {
            op,
            flags: Flags::default(),
            checksum: 0,
            seq: 0,
            tag: 0,
            total_len: 0,
            offset: 0,
            frag_len: 0,
            aux: 0,
        }
    }

    /// Parses and validates the first [`FrameHeader::LEN`] bytes of `b`.
    pub fn parse(b: &[u8], limits: &Limits) -> Result<FrameHeader, WireError> {
        check_len(b, Self::LEN)?;
        let version = b[field::VERSION];
        if version != FRAME_VERSION {
            return Err(WireError::Version { got: version as u16, ours: FRAME_VERSION as u16 });
        }
        let op = Op::from_u8(b[field::OP]).ok_or(WireError::UnknownOp(b[field::OP]))?;
        let flags = get_u16(b, field::FLAGS);
        if flags & !Flags::ALL != 0 {
            return Err(WireError::UnknownFlags(flags));
        }
        let h = FrameHeader {
            op,
            flags: Flags(flags),
            checksum: get_u32(b, field::CHECKSUM),
            seq: get_u64(b, field::SEQ),
            tag: get_u64(b, field::TAG),
            total_len: get_u64(b, field::TOTAL),
            offset: get_u64(b, field::OFFSET),
            frag_len: get_u32(b, field::FRAG_LEN),
            aux: get_u32(b, field::AUX),
        };
        h.validate(limits)?;
        Ok(h)
    }

    fn validate(&self, limits: &Limits) -> Result<(), WireError> {
        if self.frag_len > limits.max_frame {
            return Err(WireError::FrameTooLong { len: self.frag_len, max: limits.max_frame });
        }
        let has_payload_flags = self.flags.contains(Flags::CHECKSUM);
        if matches!(self.op, Op::Eager | Op::Data | Op::Rts) && self.total_len > limits.max_message {
            return Err(WireError::MessageTooLong { total: self.total_len, max: limits.max_message });
        }
        match self.op {
            Op::Eager | Op::Data => {
                let end = self.offset.checked_add(self.frag_len as u64);
                if end.is_none_or(|e| e > self.total_len) {
                    return Err(WireError::FragmentOutside {
                        offset: self.offset,
                        len: self.frag_len,
                        total: self.total_len,
                    });
                }
                if self.frag_len == 0 && self.total_len != 0 {
                    return Err(WireError::BadField { field: "frag_len", value: 0 });
                }
            }
            Op::Ack => {
                let n = self.aux as u64;
                if n * super::AckRange::LEN as u64 != self.frag_len as u64 {
                    return Err(WireError::BadField { field: "aux", value: n });
                }
                if has_payload_flags {
                    return Err(WireError::UnknownFlags(self.flags.0));
                }
            }
            Op::Rts | Op::Cts | Op::Heartbeat | Op::Close => {
                if self.frag_len != 0 {
                    return Err(WireError::UnexpectedPayload { op: self.op, len: self.frag_len });
                }
                if has_payload_flags {
                    return Err(WireError::UnknownFlags(self.flags.0));
                }
            }
        }
        if self.flags.contains(Flags::DISCARD) && self.op != Op::Cts {
            return Err(WireError::UnknownFlags(self.flags.0));
        }
        // ACK carries its prefix in `seq` (and `aux` counts its ranges).
        if self.flags.contains(Flags::ACKED) && self.op == Op::Ack {
            return Err(WireError::UnknownFlags(self.flags.0));
        }
        if self.flags.contains(Flags::ACK_NOW) && !matches!(self.op, Op::Eager | Op::Data) {
            return Err(WireError::UnknownFlags(self.flags.0));
        }
        let probe = self.flags.0 & (Flags::PING.0 | Flags::PONG.0);
        if probe != 0 && (self.op != Op::Heartbeat || probe == Flags::PING.0 | Flags::PONG.0) {
            return Err(WireError::UnknownFlags(self.flags.0));
        }
        Ok(())
    }

    /// Writes the header into the first [`FrameHeader::LEN`] bytes of `b`.
    ///
    /// # Panics
    /// If `b` is shorter than [`FrameHeader::LEN`].
    pub fn emit(&self, b: &mut [u8]) {
        b[field::VERSION] = FRAME_VERSION;
        b[field::OP] = self.op as u8;
        put_u16(b, field::FLAGS, self.flags.0);
        put_u32(b, field::CHECKSUM, self.checksum);
        put_u64(b, field::SEQ, self.seq);
        put_u64(b, field::TAG, self.tag);
        put_u64(b, field::TOTAL, self.total_len);
        put_u64(b, field::OFFSET, self.offset);
        put_u32(b, field::FRAG_LEN, self.frag_len);
        put_u32(b, field::AUX, self.aux);
    }

    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        self.emit(&mut b);
        b
    }

    /// Payload length as usize.
    pub fn payload_len(&self) -> usize {
        self.frag_len as usize
    }
}

/// CRC32C (Castagnoli) of a payload, as carried in the `checksum` field.
pub fn payload_checksum(payload: &[u8]) -> u32 {
    crc32c::crc32c(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    // An EAGER fragment: seq 7, tag 0x1234, total 100, offset 10, 20 bytes,
    // checksummed.
    static EAGER_BYTES: [u8; 48] = [
        0x01, 0x01, 0x01, 0x00, 0xef, 0xbe, 0xad, 0xde, // ver op flags checksum
        0x07, 0, 0, 0, 0, 0, 0, 0, // seq
        0x34, 0x12, 0, 0, 0, 0, 0, 0, // tag
        100, 0, 0, 0, 0, 0, 0, 0, // total
        10, 0, 0, 0, 0, 0, 0, 0, // offset
        20, 0, 0, 0, // frag_len
        0, 0, 0, 0, // aux
    ];

    fn eager_repr() -> FrameHeader {
        FrameHeader {
            op: Op::Eager,
            flags: Flags::CHECKSUM,
            checksum: 0xdead_beef,
            seq: 7,
            tag: 0x1234,
            total_len: 100,
            offset: 10,
            frag_len: 20,
            aux: 0,
        }
    }

    #[test]
    fn eager_parse() {
        assert_eq!(FrameHeader::parse(&EAGER_BYTES, &Limits::default()), Ok(eager_repr()));
    }

    #[test]
    fn eager_emit() {
        assert_eq!(eager_repr().to_bytes(), EAGER_BYTES);
    }

    fn roundtrip(h: FrameHeader) -> FrameHeader {
        FrameHeader::parse(&h.to_bytes(), &Limits::default()).expect("valid header")
    }

    #[test]
    fn rts_bytes() {
        let mut h = FrameHeader::new(Op::Rts);
        h.seq = 1;
        h.tag = 2;
        h.total_len = 1 << 20;
        let b = h.to_bytes();
        assert_eq!(&b[..4], &[1, 2, 0, 0]);
        assert_eq!(&b[24..32], &[0, 0, 0x10, 0, 0, 0, 0, 0]);
        assert_eq!(roundtrip(h), h);
    }

    #[test]
    fn cts_discard_bytes() {
        let mut h = FrameHeader::new(Op::Cts);
        h.seq = 9;
        h.flags = Flags::DISCARD;
        let b = h.to_bytes();
        assert_eq!(&b[..4], &[1, 3, 2, 0]);
        assert_eq!(b[8], 9);
        assert_eq!(roundtrip(h), h);
    }

    #[test]
    fn data_bytes() {
        let mut h = FrameHeader::new(Op::Data);
        h.seq = 3;
        h.total_len = 4096;
        h.offset = 4000;
        h.frag_len = 96;
        let b = h.to_bytes();
        assert_eq!(b[1], 4);
        assert_eq!(&b[32..34], &[0xa0, 0x0f]);
        assert_eq!(b[40], 96);
        assert_eq!(roundtrip(h), h);
    }

    #[test]
    fn ack_bytes() {
        let mut h = FrameHeader::new(Op::Ack);
        h.total_len = 512; // credits returned
        h.aux = 2;
        h.frag_len = 48;
        let b = h.to_bytes();
        assert_eq!(b[1], 5);
        assert_eq!(b[44], 2);
        assert_eq!(roundtrip(h), h);
    }

    #[test]
    fn heartbeat_and_close_bytes() {
        let mut h = FrameHeader::new(Op::Heartbeat);
        h.aux = 77;
        assert_eq!(h.to_bytes()[1], 6);
        assert_eq!(roundtrip(h), h);
        let mut c = FrameHeader::new(Op::Close);
        c.aux = 1;
        assert_eq!(c.to_bytes()[1], 7);
        assert_eq!(roundtrip(c), c);
    }

    #[test]
    fn ping_pong_and_piggyback_bytes() {
        let mut h = FrameHeader::new(Op::Heartbeat);
        h.flags = Flags::PING.with(Flags::ACKED);
        h.seq = 5;
        h.aux = 0xdead_beef;
        let b = h.to_bytes();
        assert_eq!(&b[..4], &[1, 6, 0x18, 0]);
        assert_eq!(b[8], 5);
        assert_eq!(&b[44..48], &[0xef, 0xbe, 0xad, 0xde]);
        assert_eq!(roundtrip(h), h);
        let mut p = FrameHeader::new(Op::Heartbeat);
        p.flags = Flags::PONG;
        p.total_len = 1 << 20; // cumulative eager credit returned
        p.tag = 3; // cumulative RTS credit returned
        assert_eq!(p.to_bytes()[2], 0x20);
        assert_eq!(roundtrip(p), p);
        let mut e = eager_repr();
        e.flags = Flags::ACKED;
        e.aux = 77;
        assert_eq!(roundtrip(e), e);
    }

    #[test]
    fn probe_flags_only_on_heartbeat_and_acked_never_on_ack() {
        let lim = Limits::default();
        let mut h = FrameHeader::new(Op::Cts);
        h.flags = Flags::PING;
        assert!(FrameHeader::parse(&h.to_bytes(), &lim).is_err());
        let mut h = FrameHeader::new(Op::Heartbeat);
        h.flags = Flags::PING.with(Flags::PONG);
        assert!(FrameHeader::parse(&h.to_bytes(), &lim).is_err());
        let mut h = FrameHeader::new(Op::Ack);
        h.flags = Flags::ACKED;
        assert!(FrameHeader::parse(&h.to_bytes(), &lim).is_err());
    }

    #[test]
    fn truncated() {
        assert_eq!(
            FrameHeader::parse(&EAGER_BYTES[..47], &Limits::default()),
            Err(WireError::Truncated { need: 48, got: 47 })
        );
        assert!(FrameHeader::parse(&[], &Limits::default()).is_err());
    }

    #[test]
    fn unknown_op_and_version() {
        let mut b = EAGER_BYTES;
        b[1] = 0;
        assert_eq!(FrameHeader::parse(&b, &Limits::default()), Err(WireError::UnknownOp(0)));
        b[1] = 200;
        assert_eq!(FrameHeader::parse(&b, &Limits::default()), Err(WireError::UnknownOp(200)));
        let mut b = EAGER_BYTES;
        b[0] = 2;
        assert!(matches!(FrameHeader::parse(&b, &Limits::default()), Err(WireError::Version { got: 2, .. })));
    }

    #[test]
    fn unknown_flags() {
        let mut b = EAGER_BYTES;
        b[3] = 0x80;
        assert_eq!(FrameHeader::parse(&b, &Limits::default()), Err(WireError::UnknownFlags(0x8001)));
        let mut b = EAGER_BYTES;
        b[2] = 0x81;
        assert_eq!(FrameHeader::parse(&b, &Limits::default()), Err(WireError::UnknownFlags(0x0081)));
        // DISCARD is only meaningful on CTS.
        let mut h = eager_repr();
        h.flags = Flags::DISCARD;
        assert!(FrameHeader::parse(&h.to_bytes(), &Limits::default()).is_err());
        // ACK_NOW only on frames that carry message bytes.
        h.flags = Flags::ACK_NOW;
        assert!(FrameHeader::parse(&h.to_bytes(), &Limits::default()).is_ok());
        for op in [Op::Ack, Op::Rts, Op::Cts, Op::Heartbeat] {
            let mut c = FrameHeader::new(op);
            c.flags = Flags::ACK_NOW;
            assert!(FrameHeader::parse(&c.to_bytes(), &Limits::default()).is_err(), "{op:?}");
        }
    }

    #[test]
    fn impossible_lengths() {
        let lim = Limits { max_frame: 1024, max_message: 1 << 20 };
        // Fragment past the end of the message.
        let mut h = eager_repr();
        h.offset = 90;
        assert!(matches!(FrameHeader::parse(&h.to_bytes(), &lim), Err(WireError::FragmentOutside { .. })));
        // Offset + len overflowing u64.
        h.offset = u64::MAX - 5;
        h.total_len = 100;
        assert!(matches!(FrameHeader::parse(&h.to_bytes(), &lim), Err(WireError::FragmentOutside { .. })));
        // Frame larger than the configured maximum.
        let mut h = eager_repr();
        h.frag_len = 2048;
        h.total_len = 4096;
        h.offset = 0;
        assert_eq!(FrameHeader::parse(&h.to_bytes(), &lim), Err(WireError::FrameTooLong { len: 2048, max: 1024 }));
        // Message larger than the configured maximum.
        let mut h = FrameHeader::new(Op::Rts);
        h.total_len = (1 << 20) + 1;
        assert!(matches!(FrameHeader::parse(&h.to_bytes(), &lim), Err(WireError::MessageTooLong { .. })));
        // Control frames carry no payload.
        let mut h = FrameHeader::new(Op::Cts);
        h.frag_len = 1;
        assert!(matches!(FrameHeader::parse(&h.to_bytes(), &lim), Err(WireError::UnexpectedPayload { .. })));
        // ACK payload must be exactly `aux` ranges.
        let mut h = FrameHeader::new(Op::Ack);
        h.aux = 3;
        h.frag_len = 48;
        assert!(matches!(FrameHeader::parse(&h.to_bytes(), &lim), Err(WireError::BadField { field: "aux", .. })));
        // A zero-length fragment of a non-empty message is meaningless.
        let mut h = eager_repr();
        h.frag_len = 0;
        assert!(FrameHeader::parse(&h.to_bytes(), &lim).is_err());
    }

    #[test]
    fn empty_message_is_valid() {
        let mut h = FrameHeader::new(Op::Eager);
        h.seq = 1;
        assert_eq!(roundtrip(h), h);
    }

    #[test]
    fn checksum_is_crc32c() {
        // RFC 3720 test vector: 32 bytes of zeros.
        assert_eq!(payload_checksum(&[0u8; 32]), 0x8a91_36aa);
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(b in proptest::collection::vec(proptest::num::u8::ANY, 0..100)) {
            let _ = FrameHeader::parse(&b, &Limits::default());
        }

        #[test]
        fn parse_emit_roundtrip(b in proptest::collection::vec(proptest::num::u8::ANY, 48..=48)) {
            if let Ok(h) = FrameHeader::parse(&b, &Limits::default()) {
                proptest::prop_assert_eq!(&h.to_bytes()[..], &b[..]);
            }
        }
    }
}
