//! Send buffers. Without validation one buffer (filled with `'a'`, like
//! OSU's `set_buffer_pt2pt`) is shared by every message: cloning a `Bytes`
//! only bumps a reference count. With validation each message of a window
//! gets its own pattern, refilled in place when the protocol has let go of
//! the previous one.

use bytes::{Bytes, BytesMut};

use crate::pattern;

pub(crate) struct Payloads {
    size: u64,
    direction: u32,
    validate: bool,
    slots: Vec<Bytes>,
}

impl Payloads {
    /// `count` payloads of `len` (= `size`) bytes; `direction` tells the
    /// two senders of a bidirectional test apart in the pattern.
    pub fn new(size: u64, len: usize, count: usize, validate: bool, direction: u32) -> Payloads {
        let shared = Bytes::from(vec![b'a'; len]);
        Payloads { size, direction, validate, slots: vec![shared; count] }
    }

    /// Makes the payloads of `iteration` (call before starting the clock).
    pub fn prepare(&mut self, iteration: u64) {
        if self.validate {
            for (j, slot) in self.slots.iter_mut().enumerate() {
                let message = u32::try_from(j).unwrap_or(u32::MAX);
                refill(slot, pattern::seed(self.size, iteration, message, self.direction));
            }
        }
    }

    /// The payloads last prepared.
    pub fn slots(&self) -> &[Bytes] {
        &self.slots
    }
}

/// Writes the pattern of `seed` into `slot`, reusing its memory when no
/// one else holds it (allocating otherwise: validation runs are checks,
/// and this happens before the clock starts).
fn refill(slot: &mut Bytes, seed: u64) {
    let len = slot.len();
    let mut buf = std::mem::take(slot).try_into_mut().unwrap_or_else(|_| BytesMut::zeroed(len));
    pattern::fill(&mut buf, seed);
    *slot = buf.freeze();
}

/// The first wrong byte of a received message, if any.
pub(crate) fn check(
    buf: &[u8],
    received: u64,
    size: u64,
    iteration: u64,
    message: usize,
    direction: u32,
) -> Option<u64> {
    let message = u32::try_from(message).unwrap_or(u32::MAX);
    let seed = pattern::seed(size, iteration, message, direction);
    let n = usize::try_from(received.min(size)).unwrap_or(usize::MAX).min(buf.len());
    match pattern::first_mismatch(&buf[..n], seed) {
        Some(off) => Some(off as u64),
        None if received != size => Some(n as u64),
        None => None,
    }
}
