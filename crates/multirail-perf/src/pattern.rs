//! The payload pattern of `--validate`: bytes derived from (message size,
//! iteration, message index, direction), so a byte that is flipped, lost,
//! shifted or delivered to the wrong message is noticed.

/// The seed of one message's pattern.
pub(crate) fn seed(size: u64, iteration: u64, message: u32, direction: u32) -> u64 {
    let mut h = splitmix(size);
    h = splitmix(h ^ iteration);
    splitmix(h ^ (u64::from(message) << 32 | u64::from(direction)))
}

/// SplitMix64's output function: a cheap, well-mixed bijection.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The 8 pattern bytes at offsets `8 * word ..`.
fn word(seed: u64, word: usize) -> [u8; 8] {
    splitmix(seed ^ (word as u64).wrapping_mul(0xd6e8_feb8_6659_fd93)).to_le_bytes()
}

/// Fills `buf` with the pattern of `seed`.
pub(crate) fn fill(buf: &mut [u8], seed: u64) {
    let n = buf.len() / 8;
    let mut chunks = buf.chunks_exact_mut(8);
    for (i, c) in chunks.by_ref().enumerate() {
        c.copy_from_slice(&word(seed, i));
    }
    let rest = chunks.into_remainder();
    let w = word(seed, n);
    rest.copy_from_slice(&w[..rest.len()]);
}

/// The first offset where `buf` differs from the pattern of `seed`.
pub(crate) fn first_mismatch(buf: &[u8], seed: u64) -> Option<usize> {
    let mut chunks = buf.chunks_exact(8);
    for (i, c) in chunks.by_ref().enumerate() {
        let w = word(seed, i);
        if c != w {
            return c.iter().zip(w).position(|(a, b)| *a != b).map(|k| i * 8 + k);
        }
    }
    let rest = chunks.remainder();
    let w = word(seed, buf.len() / 8);
    rest.iter().zip(w).position(|(a, b)| *a != b).map(|k| buf.len() / 8 * 8 + k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_then_check_finds_nothing() {
        for len in [0, 1, 7, 8, 9, 64, 1000] {
            let mut b = vec![0u8; len];
            fill(&mut b, seed(len as u64, 3, 1, 0));
            assert_eq!(first_mismatch(&b, seed(len as u64, 3, 1, 0)), None, "len {len}");
        }
    }

    #[test]
    fn every_flipped_byte_is_found_at_its_offset() {
        let s = seed(21, 0, 0, 0);
        for off in 0..21 {
            let mut b = vec![0u8; 21];
            fill(&mut b, s);
            b[off] ^= 0x10;
            assert_eq!(first_mismatch(&b, s), Some(off));
        }
    }

    #[test]
    fn messages_differ_by_every_key_part() {
        let base = seed(64, 5, 2, 0);
        let others = [seed(128, 5, 2, 0), seed(64, 6, 2, 0), seed(64, 5, 3, 0), seed(64, 5, 2, 1)];
        let mut b = vec![0u8; 64];
        fill(&mut b, base);
        for o in others {
            assert_ne!(o, base);
            assert!(first_mismatch(&b, o).is_some());
        }
    }
}
