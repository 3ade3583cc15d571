//! Payload of an ACK frame: a list of received byte ranges.
//!
//! The ACK header carries the number of ranges in `aux` and the eager
//! credits returned to the sender in `total_len`. Each range is 24 bytes:
//!
//! ```text
//!  0  seq (u64)      message the range belongs to
//!  8  offset (u64)   first byte of the range
//! 16  len (u32)      length of the range
//! 20  reserved (u32) zero
//! ```

use super::{WireError, check_len, get_u32, get_u64, put_u32, put_u64};

/// One acknowledged range of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AckRange {
    pub seq: u64,
    pub offset: u64,
    pub len: u32,
}

impl AckRange {
    pub const LEN: usize = 24;

    pub fn parse(b: &[u8]) -> Result<AckRange, WireError> {
        check_len(b, Self::LEN)?;
        let reserved = get_u32(b, 20);
        if reserved != 0 {
            return Err(WireError::BadField { field: "ack.reserved", value: reserved as u64 });
        }
        let r = AckRange { seq: get_u64(b, 0), offset: get_u64(b, 8), len: get_u32(b, 16) };
        if r.offset.checked_add(r.len as u64).is_none() {
            return Err(WireError::BadField { field: "ack.offset", value: r.offset });
        }
        Ok(r)
    }

    pub fn emit(&self, b: &mut [u8]) {
        put_u64(b, 0, self.seq);
        put_u64(b, 8, self.offset);
        put_u32(b, 16, self.len);
        put_u32(b, 20, 0);
    }
}

/// A whole ACK payload.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AckRepr {
    pub ranges: Vec<AckRange>,
}

impl AckRepr {
    /// Parses a payload of exactly `count` ranges. The count was already
    /// bounded by the frame header (`frag_len <= max_frame`), so the
    /// allocation is bounded too.
    pub fn parse(b: &[u8], count: u32) -> Result<AckRepr, WireError> {
        let need = count as usize * AckRange::LEN;
        if b.len() != need {
            return Err(WireError::Truncated { need, got: b.len() });
        }
        let ranges = b.chunks_exact(AckRange::LEN).map(AckRange::parse).collect::<Result<_, _>>()?;
        Ok(AckRepr { ranges })
    }

    pub fn buffer_len(&self) -> usize {
        self.ranges.len() * AckRange::LEN
    }

    pub fn emit(&self, b: &mut [u8]) {
        for (r, chunk) in self.ranges.iter().zip(b.chunks_exact_mut(AckRange::LEN)) {
            r.emit(chunk);
        }
    }

    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.buffer_len()];
        self.emit(&mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static ONE: [u8; 24] = [
        5, 0, 0, 0, 0, 0, 0, 0, // seq
        0, 0, 1, 0, 0, 0, 0, 0, // offset 65536
        0, 0, 2, 0, // len 131072
        0, 0, 0, 0,
    ];

    #[test]
    fn parse_and_emit() {
        let r = AckRange { seq: 5, offset: 65536, len: 131072 };
        assert_eq!(AckRange::parse(&ONE), Ok(r));
        let mut b = [0xffu8; 24];
        r.emit(&mut b);
        assert_eq!(b, ONE);
        let repr = AckRepr { ranges: vec![r, r] };
        let v = repr.to_vec();
        assert_eq!(v.len(), 48);
        assert_eq!(AckRepr::parse(&v, 2), Ok(repr));
    }

    #[test]
    fn rejects_bad_input() {
        assert!(AckRepr::parse(&ONE, 2).is_err());
        assert!(AckRepr::parse(&ONE[..23], 1).is_err());
        let mut b = ONE;
        b[20] = 1;
        assert!(AckRange::parse(&b).is_err());
        let mut b = ONE;
        b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(AckRange::parse(&b).is_err());
    }
}
