//! Wire formats: the rail handshake ([`hello`]) and the frame header ([`frame`]),
//! plus the payload of ACK frames ([`ack`]).
//!
//! Each type comes as a parse/emit pair in the smoltcp style: a validated
//! `Repr` with `parse(&[u8]) -> Result<Repr, WireError>`, `emit(&mut [u8])`
//! and a constant `LEN`. Field offsets live in private `field` modules.
//!
//! **No-panic contract:** `parse` accepts any byte slice and returns either a
//! fully validated value or a [`WireError`]; nothing a peer sends can make it
//! panic, allocate, or index out of bounds. `emit` panics only if the caller
//! passes a buffer shorter than `LEN` (an API misuse, not peer input).
//!
//! All integers are little-endian. The normative description is
//! `docs/protocol.md`; the byte-vector tests in each module pin it.

pub mod ack;
pub mod frame;
pub mod hello;

pub use ack::{AckRange, AckRepr};
pub use frame::{Flags, FrameHeader, Op};
pub use hello::{HelloKind, HelloRepr, RejectReason};

/// Protocol version spoken by this implementation (HELLO and frame header).
pub const PROTOCOL_VERSION: u16 = 5;

/// Why bytes from a peer were refused. Every variant is "the peer sent
/// something we will not accept"; see [`crate::Error`] for the categories.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("truncated: need {need} bytes, got {got}")]
    Truncated { need: usize, got: usize },
    #[error("bad magic {0:02x?}: not a multirail peer")]
    BadMagic([u8; 8]),
    #[error("unsupported protocol version {got} (we speak {ours})")]
    Version { got: u16, ours: u16 },
    #[error("unknown op {0}")]
    UnknownOp(u8),
    #[error("unknown flag bits {0:#06x}")]
    UnknownFlags(u16),
    #[error("unknown handshake kind {0}")]
    UnknownKind(u8),
    #[error("fragment {offset}+{len} lies outside a message of {total} bytes")]
    FragmentOutside { offset: u64, len: u32, total: u64 },
    #[error("frame payload of {len} bytes exceeds the limit of {max}")]
    FrameTooLong { len: u32, max: u32 },
    #[error("message of {total} bytes exceeds the limit of {max}")]
    MessageTooLong { total: u64, max: u64 },
    #[error("op {op:?} must not carry a payload ({len} bytes)")]
    UnexpectedPayload { op: Op, len: u32 },
    #[error("field {field} has invalid value {value}")]
    BadField { field: &'static str, value: u64 },
}

pub(crate) fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
pub(crate) fn get_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}
pub(crate) fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}
pub(crate) fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn check_len(b: &[u8], need: usize) -> Result<(), WireError> {
    if b.len() < need { Err(WireError::Truncated { need, got: b.len() }) } else { Ok(()) }
}
