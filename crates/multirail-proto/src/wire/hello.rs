//! The 128-byte rail handshake message. The same layout serves the three
//! handshake steps (HELLO, HELLO reply with proof, AUTH) and REJECT.
//!
//! ```text
//!   0  magic "MRAILHLO" (8 bytes)
//!   8  protocol version (u16)
//!  10  kind (u8): 1 HELLO, 2 AUTH, 3 REJECT
//!  11  reason (u8): REJECT reason, else 0
//!  12  rank (u32)            sender's rank in the job
//!  16  size (u32)            number of ranks in the job
//!  20  rail index (u16)      which rail this connection is
//!  22  rail count (u16)      how many rails the sender has
//!  24  job id (u64)
//!  32  bandwidth (u64)       rail bandwidth in bytes/s, 0 = unknown
//!  40  latency (u32)         rail latency in ns, 0 = unknown
//!  44  max frame (u32)       largest frame payload the sender accepts
//!  48  nonce (32 bytes)      fresh random bytes per connection
//!  80  proof (32 bytes)      HMAC-SHA256 proof of the job key, or zero
//! 112  credits (u64)         bytes of unexpected eager data the sender
//!                            will buffer for this peer (flow control)
//! 120  generation (u32)      connection generation: which of two
//!                            connections for the same rail wins
//! 124  reserved (u32)        zero
//! ```
//!
//! See [`crate::handshake`] for the exchange and how proofs are computed.

use super::{PROTOCOL_VERSION, WireError, check_len, get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};

pub const MAGIC: [u8; 8] = *b"MRAILHLO";

mod field {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const KIND: usize = 10;
    pub const REASON: usize = 11;
    pub const RANK: usize = 12;
    pub const SIZE: usize = 16;
    pub const RAIL: usize = 20;
    pub const RAIL_COUNT: usize = 22;
    pub const JOB: usize = 24;
    pub const BANDWIDTH: usize = 32;
    pub const LATENCY: usize = 40;
    pub const MAX_FRAME: usize = 44;
    pub const NONCE: usize = 48;
    pub const PROOF: usize = 80;
    pub const CREDITS: usize = 112;
    pub const GENERATION: usize = 120;
    pub const RESERVED: usize = 124;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum HelloKind {
    Hello = 1,
    Auth = 2,
    Reject = 3,
}

/// Why a handshake was refused; sent in a REJECT so the other side can say
/// exactly what was wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RejectReason {
    Version = 1,
    Job = 2,
    Key = 3,
    Malformed = 4,
    /// The rank or rail index is not one this endpoint expects.
    Identity = 5,
    Timeout = 6,
    /// A newer connection for this rail exists (see `generation`).
    Superseded = 7,
    Unknown = 255,
}

impl RejectReason {
    pub fn from_u8(v: u8) -> RejectReason {
        match v {
            1 => RejectReason::Version,
            2 => RejectReason::Job,
            3 => RejectReason::Key,
            4 => RejectReason::Malformed,
            5 => RejectReason::Identity,
            6 => RejectReason::Timeout,
            7 => RejectReason::Superseded,
            _ => RejectReason::Unknown,
        }
    }
}

impl std::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RejectReason::Version => "protocol version mismatch",
            RejectReason::Job => "different job id",
            RejectReason::Key => "wrong job key (MULTIRAIL_KEY)",
            RejectReason::Malformed => "malformed handshake",
            RejectReason::Identity => "unexpected rank or rail index",
            RejectReason::Timeout => "handshake timed out",
            RejectReason::Superseded => "a newer connection for this rail exists",
            RejectReason::Unknown => "unknown reason",
        })
    }
}

/// A parsed handshake message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloRepr {
    pub version: u16,
    pub kind: HelloKind,
    pub reason: u8,
    pub rank: u32,
    pub size: u32,
    pub rail_index: u16,
    pub rail_count: u16,
    pub job_id: u64,
    pub bandwidth: u64,
    pub latency_ns: u32,
    pub max_frame: u32,
    pub nonce: [u8; 32],
    pub proof: [u8; 32],
    pub credits: u64,
    /// Connection generation (see the module documentation of
    /// `multirail::connections`): between two connections for the same
    /// rail, the higher generation wins; at equal generations the one
    /// opened by the lower rank wins.
    pub generation: u32,
}

impl HelloRepr {
    pub const LEN: usize = 128;

    /// Parses a handshake message. Only magic, version and kind are
    /// checked here; identity and proof are checked by [`crate::handshake`].
    pub fn parse(b: &[u8]) -> Result<HelloRepr, WireError> {
        check_len(b, Self::LEN)?;
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&b[field::MAGIC..field::MAGIC + 8]);
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        let version = get_u16(b, field::VERSION);
        let kind = match b[field::KIND] {
            1 => HelloKind::Hello,
            2 => HelloKind::Auth,
            3 => HelloKind::Reject,
            k => return Err(WireError::UnknownKind(k)),
        };
        // A REJECT is understood whatever its version, so that a peer can
        // tell us "wrong version" in a way we can read.
        if version != PROTOCOL_VERSION && kind != HelloKind::Reject {
            return Err(WireError::Version { got: version, ours: PROTOCOL_VERSION });
        }
        let reserved = get_u32(b, field::RESERVED);
        if reserved != 0 && kind != HelloKind::Reject {
            return Err(WireError::BadField { field: "hello.reserved", value: reserved as u64 });
        }
        let mut nonce = [0u8; 32];
        nonce.copy_from_slice(&b[field::NONCE..field::NONCE + 32]);
        let mut proof = [0u8; 32];
        proof.copy_from_slice(&b[field::PROOF..field::PROOF + 32]);
        Ok(HelloRepr {
            version,
            kind,
            reason: b[field::REASON],
            rank: get_u32(b, field::RANK),
            size: get_u32(b, field::SIZE),
            rail_index: get_u16(b, field::RAIL),
            rail_count: get_u16(b, field::RAIL_COUNT),
            job_id: get_u64(b, field::JOB),
            bandwidth: get_u64(b, field::BANDWIDTH),
            latency_ns: get_u32(b, field::LATENCY),
            max_frame: get_u32(b, field::MAX_FRAME),
            nonce,
            proof,
            credits: get_u64(b, field::CREDITS),
            generation: get_u32(b, field::GENERATION),
        })
    }

    pub fn emit(&self, b: &mut [u8]) {
        b[field::MAGIC..field::MAGIC + 8].copy_from_slice(&MAGIC);
        put_u16(b, field::VERSION, self.version);
        b[field::KIND] = self.kind as u8;
        b[field::REASON] = self.reason;
        put_u32(b, field::RANK, self.rank);
        put_u32(b, field::SIZE, self.size);
        put_u16(b, field::RAIL, self.rail_index);
        put_u16(b, field::RAIL_COUNT, self.rail_count);
        put_u64(b, field::JOB, self.job_id);
        put_u64(b, field::BANDWIDTH, self.bandwidth);
        put_u32(b, field::LATENCY, self.latency_ns);
        put_u32(b, field::MAX_FRAME, self.max_frame);
        b[field::NONCE..field::NONCE + 32].copy_from_slice(&self.nonce);
        b[field::PROOF..field::PROOF + 32].copy_from_slice(&self.proof);
        put_u64(b, field::CREDITS, self.credits);
        put_u32(b, field::GENERATION, self.generation);
        put_u32(b, field::RESERVED, 0);
    }

    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        self.emit(&mut b);
        b
    }

    /// A REJECT message carrying `reason`.
    pub fn reject(reason: RejectReason) -> HelloRepr {
        HelloRepr {
            version: PROTOCOL_VERSION,
            kind: HelloKind::Reject,
            reason: reason as u8,
            rank: 0,
            size: 0,
            rail_index: 0,
            rail_count: 0,
            job_id: 0,
            bandwidth: 0,
            latency_ns: 0,
            max_frame: 0,
            nonce: [0; 32],
            proof: [0; 32],
            credits: 0,
            generation: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> HelloRepr {
        HelloRepr {
            version: PROTOCOL_VERSION,
            kind: HelloKind::Hello,
            reason: 0,
            rank: 1,
            size: 2,
            rail_index: 3,
            rail_count: 4,
            job_id: 0x0102_0304_0506_0708,
            bandwidth: 250_000_000,
            latency_ns: 20_000,
            max_frame: 1 << 20,
            nonce: [0xaa; 32],
            proof: [0; 32],
            credits: 8 << 20,
            generation: 0x0102_0304,
        }
    }

    fn sample_bytes() -> [u8; 128] {
        let mut b = [0u8; 128];
        b[..8].copy_from_slice(b"MRAILHLO");
        b[8] = 5; // version
        b[10] = 1; // kind HELLO
        b[12] = 1; // rank
        b[16] = 2; // size
        b[20] = 3; // rail index
        b[22] = 4; // rail count
        b[24..32].copy_from_slice(&[8, 7, 6, 5, 4, 3, 2, 1]);
        b[32..36].copy_from_slice(&[0x80, 0xb2, 0xe6, 0x0e]); // 250e6
        b[40..42].copy_from_slice(&[0x20, 0x4e]); // 20000
        b[46] = 0x10; // 1 MiB
        b[48..80].copy_from_slice(&[0xaa; 32]);
        b[114] = 0x80; // 8 MiB credits
        b[120..124].copy_from_slice(&[4, 3, 2, 1]); // generation
        b
    }

    #[test]
    fn parse() {
        assert_eq!(HelloRepr::parse(&sample_bytes()), Ok(sample()));
    }

    #[test]
    fn emit() {
        assert_eq!(sample().to_bytes(), sample_bytes());
    }

    #[test]
    fn bad_magic_version_kind() {
        let mut b = sample_bytes();
        b[0] = b'X';
        assert!(matches!(HelloRepr::parse(&b), Err(WireError::BadMagic(_))));
        let mut b = sample_bytes();
        b[8] = 9;
        assert_eq!(HelloRepr::parse(&b), Err(WireError::Version { got: 9, ours: 5 }));
        let mut b = sample_bytes();
        b[10] = 0;
        assert_eq!(HelloRepr::parse(&b), Err(WireError::UnknownKind(0)));
        assert!(matches!(HelloRepr::parse(&b[..127]), Err(WireError::Truncated { .. })));
        let mut b = sample_bytes();
        b[125] = 1;
        assert!(matches!(HelloRepr::parse(&b), Err(WireError::BadField { field: "hello.reserved", .. })));
    }

    #[test]
    fn reject_is_readable_across_versions() {
        let mut r = HelloRepr::reject(RejectReason::Version);
        r.version = 42;
        let got = HelloRepr::parse(&r.to_bytes()).expect("reject parses");
        assert_eq!(got.kind, HelloKind::Reject);
        assert_eq!(RejectReason::from_u8(got.reason), RejectReason::Version);
    }
}
