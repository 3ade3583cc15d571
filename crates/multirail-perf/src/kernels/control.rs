//! The wire form of control messages between ranks (verdicts, gathered
//! results): little-endian words plus an FNV-1a checksum, written three
//! times. The rails may be corrupting payloads on purpose (that is what
//! `--validate` is for), so a receiver takes the first copy whose checksum
//! holds: one flipped byte per frame cannot change a control message.

use bytes::Bytes;

use crate::error::BenchError;

const COPIES: usize = 3;

/// Encoded length of `words` words.
pub(crate) fn encoded_len(words: usize) -> usize {
    COPIES * (words + 1) * 8
}

pub(crate) fn encode(words: &[u64]) -> Bytes {
    let mut out = Vec::with_capacity(encoded_len(words.len()));
    for _ in 0..COPIES {
        for w in words {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(&fnv1a(words).to_le_bytes());
    }
    Bytes::from(out)
}

/// Decodes a message of exactly `words` words from `from` (named in errors).
pub(crate) fn decode(buf: &[u8], words: usize, from: u32) -> Result<Vec<u64>, BenchError> {
    if buf.len() != encoded_len(words) {
        return Err(BenchError::Protocol(format!(
            "control message from rank {from} has {} bytes, expected {}",
            buf.len(),
            encoded_len(words)
        )));
    }
    for copy in buf.chunks_exact((words + 1) * 8) {
        let mut v: Vec<u64> = copy.chunks_exact(8).map(le_word).collect();
        let sum = v.pop().unwrap_or_default();
        if fnv1a(&v) == sum {
            return Ok(v);
        }
    }
    Err(BenchError::Protocol(format!("every copy of a control message from rank {from} arrived corrupted")))
}

fn le_word(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_le_bytes(a)
}

/// FNV-1a over the words' bytes: any single changed byte changes it.
fn fnv1a(words: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in words.iter().flat_map(|w| w.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let m = encode(&[1, u64::MAX, 7]);
        assert_eq!(m.len(), encoded_len(3));
        assert_eq!(decode(&m, 3, 1).unwrap(), vec![1, u64::MAX, 7]);
        assert_eq!(decode(&encode(&[]), 0, 1).unwrap(), Vec::<u64>::new());
    }

    #[test]
    fn survives_one_flipped_byte_anywhere() {
        let m = encode(&[42, 43]);
        for i in 0..m.len() {
            let mut b = m.to_vec();
            b[i] ^= 0x80;
            assert_eq!(decode(&b, 2, 1).unwrap(), vec![42, 43], "byte {i}");
        }
    }

    #[test]
    fn rejects_wrong_length_and_total_corruption() {
        let m = encode(&[5]);
        assert!(decode(&m[1..], 1, 3).unwrap_err().to_string().contains("rank 3"));
        let mut b = m.to_vec();
        for copy in 0..3 {
            b[copy * 16] ^= 1;
        }
        assert!(decode(&b, 1, 3).unwrap_err().to_string().contains("corrupted"));
    }
}
