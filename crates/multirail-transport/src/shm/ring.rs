//! A single-producer / single-consumer byte ring in memory it does not own.
//!
//! The ring lives in a region given by a raw pointer (inside a shared
//! mapping, or a heap buffer for tests); see the [module docs](super) for
//! the layout and the wake protocol. Two handles use it: one [`Producer`]
//! and one [`Consumer`], possibly in different processes that map the
//! region at different addresses (everything in the region is an offset or
//! a counter, never a pointer).
//!
//! # Counters
//!
//! `head` is the number of bytes ever written (only the producer stores
//! it), `tail` the number of bytes ever read (only the consumer stores it).
//! Both only grow (wrapping at 2^64, which takes centuries). Byte `n` of
//! the stream lives at `data[n % capacity]`. `head - tail` is the number
//! of readable bytes and is never more than `capacity`.
//!
//! Each side keeps its own counter in a local variable (it never reads it
//! back from shared memory, which a faulty peer could change) and a cached
//! copy of the other side's counter, so the fast path touches the peer's
//! cache line only when the cached value says "full" or "empty".
//!
//! # Memory ordering of the data
//!
//! The producer copies bytes into the free part of the data area, then
//! stores `head` with `Release`. The consumer loads `head` with `Acquire`
//! before copying bytes out, so it sees every byte written before that
//! `head`. Symmetrically the consumer stores `tail` with `Release` after
//! copying bytes out, and the producer loads `tail` with `Acquire` before
//! overwriting that space. So the non-atomic copies never race.
//!
//! # A peer that breaks the rules
//!
//! A counter read from the peer is checked before it is used: a `head`
//! or `tail` that would make `head - tail` exceed the capacity is a
//! [`RingError::Corrupt`], never an out-of-bounds access. Every index into
//! the data area is reduced modulo the capacity. What the ring cannot
//! defend against is a peer that scribbles on the data area while we copy
//! from it: we would then read garbage bytes (which the framing above
//! rejects), but still only inside the region.

use std::alloc::{self, Layout};
use std::io::IoSlice;
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

#[cfg(not(target_has_atomic = "64"))]
compile_error!("the shm ring needs lock-free 64-bit atomics");

/// Alignment of the ring and size of its control lines: 128 bytes, two
/// 64-byte cache lines, so the adjacent-line prefetcher does not make the
/// producer's and the consumer's lines share traffic.
pub const RING_ALIGN: usize = 128;
/// Bytes of control lines before the data area.
pub const RING_HEADER: usize = 3 * RING_ALIGN;
/// Smallest data area.
pub const MIN_CAPACITY: usize = 4 << 10;
/// Largest data area (keeps every offset and length far from overflow).
pub const MAX_CAPACITY: usize = 1 << 30;

/// Offsets inside the ring region.
mod field {
    use super::RING_ALIGN;
    /// Producer's line: `head` (u64).
    pub const HEAD: usize = 0;
    /// Producer's line: "the producer closed" (u32, 0 or 1).
    pub const PRODUCER_CLOSED: usize = 8;
    /// Consumer's line: `tail` (u64).
    pub const TAIL: usize = RING_ALIGN;
    /// Consumer's line: "the consumer closed" (u32, 0 or 1).
    pub const CONSUMER_CLOSED: usize = RING_ALIGN + 8;
    /// Consumer's line: lent payloads the consumer finished copying (u64,
    /// single-copy transfers: `super::super::cma`).
    pub const LENT_DONE: usize = RING_ALIGN + 16;
    /// Wake line: "the consumer sleeps until data arrives" (u32).
    pub const CONSUMER_WAKE: usize = 2 * RING_ALIGN;
    /// Wake line: "the producer sleeps until space is freed" (u32).
    pub const PRODUCER_WAKE: usize = 2 * RING_ALIGN + 4;
    /// Start of the data area.
    pub const DATA: usize = 3 * RING_ALIGN;
}

/// Bytes a ring with `capacity` bytes of data occupies.
pub const fn ring_len(capacity: usize) -> usize {
    RING_HEADER + capacity
}

/// Whether `capacity` is a valid data-area size: a power of two in
/// [`MIN_CAPACITY`]..=[`MAX_CAPACITY`].
pub const fn valid_capacity(capacity: usize) -> bool {
    capacity.is_power_of_two() && capacity >= MIN_CAPACITY && capacity <= MAX_CAPACITY
}

/// Keeps the memory under a ring alive as long as a handle uses it.
pub type KeepAlive = Arc<dyn Send + Sync>;

/// What can go wrong with a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// API misuse: the capacity is not a power of two in range.
    #[error("ring capacity {0} is not a power of two between 4 KiB and 1 GiB")]
    BadCapacity(usize),
    /// API misuse: the region is not aligned to [`RING_ALIGN`].
    #[error("ring region is not aligned to {RING_ALIGN} bytes")]
    Misaligned,
    /// The peer broke the ring: `head - tail` is more than the capacity.
    #[error(
        "ring counters are inconsistent (head {head}, tail {tail}, capacity {capacity}): the peer corrupted the ring"
    )]
    Corrupt { head: u64, tail: u64, capacity: u64 },
}

/// The ring region as seen by one handle.
#[derive(Clone, Copy)]
struct Region {
    base: NonNull<u8>,
    capacity: u64,
}

impl Region {
    /// Checks the region's shape.
    ///
    /// # Safety
    /// See [`Producer::new`].
    unsafe fn new(base: *mut u8, capacity: usize) -> Result<Region, RingError> {
        if !valid_capacity(capacity) {
            return Err(RingError::BadCapacity(capacity));
        }
        let base = NonNull::new(base).ok_or(RingError::Misaligned)?;
        if !(base.as_ptr() as usize).is_multiple_of(RING_ALIGN) {
            return Err(RingError::Misaligned);
        }
        Ok(Region { base, capacity: capacity as u64 })
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is one of the `field` constants, a multiple of 8
        // inside the control lines; the region is valid, aligned to 128 and
        // alive for as long as `self` (constructor preconditions), and its
        // control words are only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(off).cast::<u64>()) }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as in `u64_at`, with a multiple of 4.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(off).cast::<u32>()) }
    }

    fn head(&self) -> &AtomicU64 {
        self.u64_at(field::HEAD)
    }
    fn tail(&self) -> &AtomicU64 {
        self.u64_at(field::TAIL)
    }
    fn producer_closed(&self) -> &AtomicU32 {
        self.u32_at(field::PRODUCER_CLOSED)
    }
    fn consumer_closed(&self) -> &AtomicU32 {
        self.u32_at(field::CONSUMER_CLOSED)
    }
    fn lent_done(&self) -> &AtomicU64 {
        self.u64_at(field::LENT_DONE)
    }
    fn consumer_wake(&self) -> &AtomicU32 {
        self.u32_at(field::CONSUMER_WAKE)
    }
    fn producer_wake(&self) -> &AtomicU32 {
        self.u32_at(field::PRODUCER_WAKE)
    }

    /// `head - tail` if it is a possible fill level, else `Corrupt`.
    fn used(&self, head: u64, tail: u64) -> Result<u64, RingError> {
        let used = head.wrapping_sub(tail);
        if used > self.capacity {
            return Err(RingError::Corrupt { head, tail, capacity: self.capacity });
        }
        Ok(used)
    }

    /// Copies `src` to stream position `pos`.
    ///
    /// # Safety
    /// `src.len() <= capacity`, and the bytes `pos..pos + src.len()` are
    /// free space owned by the (only) producer calling this.
    unsafe fn copy_in(&self, pos: u64, src: &[u8]) {
        let cap = self.capacity as usize;
        let off = (pos & (self.capacity - 1)) as usize;
        let first = src.len().min(cap - off);
        // SAFETY: `off < cap` and `first <= cap - off`, so the first copy
        // stays in the data area; the second copies `src.len() - first <=
        // cap` bytes to its start. The data area is `cap` bytes after
        // `DATA` in the valid region; `src` is a distinct allocation (our
        // caller's buffer), and the caller owns these bytes of the ring.
        unsafe {
            let data = self.base.as_ptr().add(field::DATA);
            ptr::copy_nonoverlapping(src.as_ptr(), data.add(off), first);
            ptr::copy_nonoverlapping(src.as_ptr().add(first), data, src.len() - first);
        }
    }

    /// Copies from stream position `pos` into `dst`.
    ///
    /// # Safety
    /// `dst.len() <= capacity`, and the bytes `pos..pos + dst.len()` are
    /// published data owned by the (only) consumer calling this.
    unsafe fn copy_out(&self, pos: u64, dst: &mut [u8]) {
        let cap = self.capacity as usize;
        let off = (pos & (self.capacity - 1)) as usize;
        let first = dst.len().min(cap - off);
        // SAFETY: mirror image of `copy_in`.
        unsafe {
            let data = self.base.as_ptr().add(field::DATA);
            ptr::copy_nonoverlapping(data.add(off), dst.as_mut_ptr(), first);
            ptr::copy_nonoverlapping(data, dst.as_mut_ptr().add(first), dst.len() - first);
        }
    }
}

/// The writing end of a ring.
pub struct Producer {
    region: Region,
    /// Bytes ever written (the authoritative copy; shared `head` mirrors it).
    head: u64,
    /// Last `tail` seen; `head - cached_tail <= capacity` always.
    cached_tail: u64,
    _keep: KeepAlive,
}

// SAFETY: a Producer is the only writer of its ring's free space and
// `head`; it holds no thread-bound state, and `_keep` is Send + Sync. The
// raw pointer only stops the auto trait; moving the handle to another
// thread changes nothing about who accesses what.
unsafe impl Send for Producer {}

impl Producer {
    /// Attaches the producer of the ring at `base`.
    ///
    /// Errors: the capacity is not a power of two in range, `base` is not
    /// aligned to [`RING_ALIGN`], or the counters found there are
    /// inconsistent.
    ///
    /// # Safety
    /// * `base..base + ring_len(capacity)` is valid for reads and writes,
    ///   and stays so while the returned producer lives (`keep` is what
    ///   keeps it mapped or allocated);
    /// * the region was zero-filled before first use (fresh `ftruncate`d
    ///   file or `alloc_zeroed`), or holds a ring left by earlier handles;
    /// * at most one `Producer` for this ring exists at any time, in all
    ///   processes together, and nothing but ring handles touches it.
    pub unsafe fn new(base: *mut u8, capacity: usize, keep: KeepAlive) -> Result<Producer, RingError> {
        // SAFETY: forwarded from our caller.
        let region = unsafe { Region::new(base, capacity)? };
        let head = region.head().load(Ordering::Relaxed);
        let tail = region.tail().load(Ordering::Acquire);
        region.used(head, tail)?;
        Ok(Producer { region, head, cached_tail: tail, _keep: keep })
    }

    /// Size of the data area.
    pub fn capacity(&self) -> usize {
        self.region.capacity as usize
    }

    /// Bytes ever written.
    pub fn written(&self) -> u64 {
        self.head
    }

    fn refresh_tail(&mut self) -> Result<(), RingError> {
        let tail = self.region.tail().load(Ordering::Acquire);
        self.region.used(self.head, tail)?;
        self.cached_tail = tail;
        Ok(())
    }

    /// Free bytes now (reads the consumer's counter).
    pub fn free(&mut self) -> Result<usize, RingError> {
        self.refresh_tail()?;
        Ok((self.region.capacity - self.head.wrapping_sub(self.cached_tail)) as usize)
    }

    /// Copies as many bytes of `bufs` as fit, in order (the last slice
    /// copied may be cut), and publishes them. Returns the number of bytes
    /// written: 0 means the ring is full (or `bufs` is empty).
    ///
    /// After a write that returned more than 0, call
    /// [`take_consumer_wake`](Self::take_consumer_wake).
    pub fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize, RingError> {
        let want = bufs.iter().fold(0u64, |acc, b| acc.saturating_add(b.len() as u64));
        if want == 0 {
            return Ok(0);
        }
        let cap = self.region.capacity;
        let mut free = cap - self.head.wrapping_sub(self.cached_tail);
        if free < want {
            self.refresh_tail()?;
            free = cap - self.head.wrapping_sub(self.cached_tail);
        }
        let mut written = 0u64;
        for buf in bufs {
            if written == free {
                break;
            }
            let take = (buf.len() as u64).min(free - written) as usize;
            // SAFETY: `written + take <= free <= capacity`, and the `free`
            // bytes from `head` on were released by the consumer (its
            // Release store of `tail`, our Acquire load in refresh_tail).
            unsafe { self.region.copy_in(self.head.wrapping_add(written), &buf[..take]) };
            written += take as u64;
        }
        self.head = self.head.wrapping_add(written);
        if written > 0 {
            self.region.head().store(self.head, Ordering::Release);
        }
        Ok(written as usize)
    }

    /// [`write_vectored`](Self::write_vectored) with one slice.
    pub fn write(&mut self, buf: &[u8]) -> Result<usize, RingError> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    /// After publishing: whether the consumer asked to be woken (it armed
    /// before sleeping). If true, ring the doorbell; the request is
    /// consumed, so later writes return false until the consumer arms again.
    ///
    /// The fence pairs with the one in [`Consumer::arm`]: see the module docs.
    pub fn take_consumer_wake(&self) -> bool {
        fence(Ordering::SeqCst);
        let flag = self.region.consumer_wake();
        // Plain load first: the common case (consumer awake) does not
        // write the shared wake line.
        flag.load(Ordering::Relaxed) != 0 && flag.swap(0, Ordering::AcqRel) != 0
    }

    /// Before sleeping because the ring was full: asks the consumer to wake
    /// us when it frees space. Returns true if the producer must not sleep:
    /// space is already free, the consumer closed, or the counters are
    /// corrupt (the next write reports it). On true the request is
    /// withdrawn.
    pub fn arm_for_space(&mut self) -> bool {
        let flag = self.region.producer_wake();
        flag.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let tail = self.region.tail().load(Ordering::Acquire);
        let go_on = match self.region.used(self.head, tail) {
            Ok(used) => used < self.region.capacity || self.is_consumer_closed(),
            Err(_) => true,
        };
        if go_on {
            flag.store(0, Ordering::Relaxed);
        }
        go_on
    }

    /// Marks the stream finished: the consumer sees end of stream once it
    /// has read everything written before. Also done on drop.
    pub fn close(&self) {
        // Release: a consumer that sees the flag sees every `head` before it.
        self.region.producer_closed().store(1, Ordering::Release);
    }

    /// Whether the consumer closed its end (nobody will read any more).
    pub fn is_consumer_closed(&self) -> bool {
        self.region.consumer_closed().load(Ordering::Acquire) != 0
    }

    /// How many lent payloads the consumer has finished copying
    /// ([`Consumer::lent_copied`]). Untrusted: the caller treats a count
    /// beyond what it lent as "all of them".
    pub fn lent_done(&self) -> u64 {
        self.region.lent_done().load(Ordering::Acquire)
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.close();
    }
}

/// The reading end of a ring.
pub struct Consumer {
    region: Region,
    /// Bytes ever read (the authoritative copy; shared `tail` mirrors it).
    tail: u64,
    /// Last `head` seen; `cached_head - tail <= capacity` always.
    cached_head: u64,
    _keep: KeepAlive,
}

// SAFETY: as for `Producer`: the only reader of published bytes and writer
// of `tail`, no thread-bound state.
unsafe impl Send for Consumer {}

impl Consumer {
    /// Attaches the consumer of the ring at `base`.
    ///
    /// # Safety
    /// As [`Producer::new`], with "at most one `Consumer`".
    pub unsafe fn new(base: *mut u8, capacity: usize, keep: KeepAlive) -> Result<Consumer, RingError> {
        // SAFETY: forwarded from our caller.
        let region = unsafe { Region::new(base, capacity)? };
        let tail = region.tail().load(Ordering::Relaxed);
        let head = region.head().load(Ordering::Acquire);
        region.used(head, tail)?;
        Ok(Consumer { region, tail, cached_head: head, _keep: keep })
    }

    /// Size of the data area.
    pub fn capacity(&self) -> usize {
        self.region.capacity as usize
    }

    /// Bytes ever read.
    pub fn consumed(&self) -> u64 {
        self.tail
    }

    fn refresh_head(&mut self) -> Result<(), RingError> {
        let head = self.region.head().load(Ordering::Acquire);
        self.region.used(head, self.tail)?;
        self.cached_head = head;
        Ok(())
    }

    /// Readable bytes now (reads the producer's counter).
    pub fn available(&mut self) -> Result<usize, RingError> {
        self.refresh_head()?;
        Ok(self.cached_head.wrapping_sub(self.tail) as usize)
    }

    /// Copies up to `dst.len()` readable bytes into `dst` and frees their
    /// space. Returns the count: 0 means empty (or `dst` is empty); see
    /// [`is_producer_closed`](Self::is_producer_closed) for end of stream.
    ///
    /// After a read that returned more than 0, call
    /// [`take_producer_wake`](Self::take_producer_wake).
    pub fn read(&mut self, dst: &mut [u8]) -> Result<usize, RingError> {
        if dst.is_empty() {
            return Ok(0);
        }
        let mut avail = self.cached_head.wrapping_sub(self.tail);
        if avail < dst.len() as u64 {
            self.refresh_head()?;
            avail = self.cached_head.wrapping_sub(self.tail);
        }
        let n = avail.min(dst.len() as u64) as usize;
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: `n <= avail <= capacity`, and the bytes from `tail` on up
        // to `cached_head` were published by the producer (its Release
        // store of `head`, our Acquire load in refresh_head).
        unsafe { self.region.copy_out(self.tail, &mut dst[..n]) };
        self.tail = self.tail.wrapping_add(n as u64);
        self.region.tail().store(self.tail, Ordering::Release);
        Ok(n)
    }

    /// After freeing space: whether the producer asked to be woken (it
    /// found the ring full and armed). If true, ring the doorbell.
    pub fn take_producer_wake(&self) -> bool {
        fence(Ordering::SeqCst);
        let flag = self.region.producer_wake();
        flag.load(Ordering::Relaxed) != 0 && flag.swap(0, Ordering::AcqRel) != 0
    }

    /// Before sleeping because the ring was empty: asks the producer to
    /// wake us when it publishes. Returns true if the consumer must not
    /// sleep: data is already there, the producer closed, or the counters
    /// are corrupt (the next read reports it). On true the request is
    /// withdrawn.
    pub fn arm(&mut self) -> bool {
        let flag = self.region.consumer_wake();
        flag.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let head = self.region.head().load(Ordering::Acquire);
        let go_on = head != self.tail || self.is_producer_closed();
        if go_on {
            flag.store(0, Ordering::Relaxed);
        }
        go_on
    }

    /// Withdraws a wake request made by [`arm`](Self::arm) (a spurious
    /// doorbell may still come if the producer took it already).
    pub fn disarm(&self) {
        self.region.consumer_wake().store(0, Ordering::Relaxed);
    }

    /// Whether the producer closed. Every byte it wrote before closing is
    /// readable once this returns true, so "closed and `read` returns 0"
    /// is end of stream — read again *after* seeing the flag.
    pub fn is_producer_closed(&self) -> bool {
        self.region.producer_closed().load(Ordering::Acquire) != 0
    }

    /// Tells the producer nobody will read any more. Also done on drop.
    pub fn close(&self) {
        self.region.consumer_closed().store(1, Ordering::Release);
    }

    /// Tells the producer one more of the payloads it lent has been copied
    /// and its memory may go ([`Producer::lent_done`]). Only this side
    /// writes the counter, so a plain load and store are enough.
    pub fn lent_copied(&self) {
        let c = self.region.lent_done();
        c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.close();
    }
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer").field("capacity", &self.capacity()).field("written", &self.written()).finish()
    }
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer").field("capacity", &self.capacity()).field("consumed", &self.consumed()).finish()
    }
}

/// A zeroed, [`RING_ALIGN`]-aligned heap allocation.
struct HeapRegion {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the allocation is plain memory; HeapRegion itself only frees it.
unsafe impl Send for HeapRegion {}
// SAFETY: as above; a shared HeapRegion offers no access at all.
unsafe impl Sync for HeapRegion {}

impl Drop for HeapRegion {
    fn drop(&mut self) {
        // SAFETY: allocated in `pair_in_heap` with this layout; the last
        // ring handle holding the Arc is gone.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A ring in a private heap allocation: an in-process SPSC byte pipe, and
/// what the tests use (it runs under Miri, unlike a mapping).
pub fn pair_in_heap(capacity: usize) -> Result<(Producer, Consumer), RingError> {
    if !valid_capacity(capacity) {
        return Err(RingError::BadCapacity(capacity));
    }
    let layout =
        Layout::from_size_align(ring_len(capacity), RING_ALIGN).map_err(|_| RingError::BadCapacity(capacity))?;
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { alloc::alloc_zeroed(layout) };
    let Some(ptr) = NonNull::new(ptr) else { alloc::handle_alloc_error(layout) };
    let keep: KeepAlive = Arc::new(HeapRegion { ptr, layout });
    // SAFETY: the allocation is ring_len(capacity) bytes, zeroed, aligned,
    // kept alive by `keep`, and these are the only two handles on it.
    unsafe {
        let p = Producer::new(ptr.as_ptr(), capacity, keep.clone())?;
        let c = Consumer::new(ptr.as_ptr(), capacity, keep)?;
        Ok((p, c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;
    use std::sync::{Condvar, Mutex};
    use std::time::{Duration, Instant};

    const CAP: usize = MIN_CAPACITY;

    /// A deterministic byte stream: byte `i` of stream `seed`.
    fn stream_byte(seed: u64, i: u64) -> u8 {
        let mut x = seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 29;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        (x ^ (x >> 32)) as u8
    }

    use crate::fault::Rng;

    #[test]
    fn layout_lines_are_separate_and_aligned() {
        assert_eq!(field::HEAD / RING_ALIGN, 0);
        assert_eq!(field::PRODUCER_CLOSED / RING_ALIGN, 0);
        assert_eq!(field::TAIL / RING_ALIGN, 1);
        assert_eq!(field::CONSUMER_CLOSED / RING_ALIGN, 1);
        assert_eq!(field::LENT_DONE / RING_ALIGN, 1);
        assert_eq!(field::LENT_DONE % 8, 0);
        assert_eq!(field::CONSUMER_WAKE / RING_ALIGN, 2);
        assert_eq!(field::PRODUCER_WAKE / RING_ALIGN, 2);
        assert_eq!(field::DATA, RING_HEADER);
        assert_eq!(RING_HEADER % RING_ALIGN, 0);
        assert_eq!(ring_len(CAP), RING_HEADER + CAP);
    }

    #[test]
    fn bad_capacities_and_alignment_are_refused() {
        for cap in [0, 1, 4095, 4097, 6144, MAX_CAPACITY * 2] {
            assert_eq!(pair_in_heap(cap).err(), Some(RingError::BadCapacity(cap)));
        }
        let (_p, _c) = pair_in_heap(CAP).unwrap();
        let keep: KeepAlive = Arc::new(());
        let mut buf = vec![0u8; ring_len(CAP) + 2 * RING_ALIGN];
        let off = buf.as_ptr().align_offset(RING_ALIGN) + 8;
        // SAFETY: the (misaligned) region is inside `buf`, which outlives
        // the call; the constructor fails before touching it.
        let r = unsafe { Producer::new(buf.as_mut_ptr().add(off), CAP, keep) };
        assert_eq!(r.err(), Some(RingError::Misaligned));
    }

    #[test]
    fn full_and_empty_are_zero() {
        let (mut p, mut c) = pair_in_heap(CAP).unwrap();
        let mut out = [0u8; 16];
        assert_eq!(c.read(&mut out).unwrap(), 0);
        assert_eq!(p.write(&[]).unwrap(), 0);
        let big = vec![7u8; CAP + 100];
        assert_eq!(p.write(&big).unwrap(), CAP);
        assert_eq!(p.write(&[1]).unwrap(), 0);
        assert_eq!(p.free().unwrap(), 0);
        assert_eq!(c.available().unwrap(), CAP);
        assert_eq!(c.read(&mut out).unwrap(), 16);
        assert_eq!(out, [7u8; 16]);
        assert_eq!(p.write(&[1; 20]).unwrap(), 16);
    }

    #[test]
    fn vectored_write_keeps_order_and_cuts_the_last_slice() {
        let (mut p, mut c) = pair_in_heap(CAP).unwrap();
        let a = vec![1u8; 1000];
        let b = vec![2u8; 3000];
        let d = vec![3u8; 500];
        let n = p.write_vectored(&[IoSlice::new(&a), IoSlice::new(&[]), IoSlice::new(&b), IoSlice::new(&d)]).unwrap();
        assert_eq!(n, 4096);
        let mut out = vec![0u8; 5000];
        assert_eq!(c.read(&mut out).unwrap(), 4096);
        assert!(out[..1000].iter().all(|&x| x == 1));
        assert!(out[1000..4000].iter().all(|&x| x == 2));
        assert!(out[4000..4096].iter().all(|&x| x == 3));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Write(Vec<usize>),
        Read(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![prop::collection::vec(0usize..3000, 0..4).prop_map(Op::Write), (0usize..6000).prop_map(Op::Read),]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: if cfg!(miri) { 4 } else { 256 }, ..ProptestConfig::default() })]
        /// Random interleavings of writes and reads wrap the ring many
        /// times and always agree with a VecDeque model.
        #[test]
        fn wraps_around_like_a_deque(ops in prop::collection::vec(op(), 1..if cfg!(miri) { 20 } else { 200 })) {
            let (mut p, mut c) = pair_in_heap(CAP).unwrap();
            let mut model: VecDeque<u8> = VecDeque::new();
            let mut next = 0u64;
            for op in ops {
                match op {
                    Op::Write(lens) => {
                        let bufs: Vec<Vec<u8>> = lens.iter().map(|&l| {
                            let v: Vec<u8> = (0..l as u64).map(|i| stream_byte(1, next + i)).collect();
                            next += l as u64;
                            v
                        }).collect();
                        let slices: Vec<IoSlice> = bufs.iter().map(|b| IoSlice::new(b)).collect();
                        let n = p.write_vectored(&slices).unwrap();
                        let total: usize = lens.iter().sum();
                        prop_assert_eq!(n, total.min(CAP - model.len()));
                        model.extend(bufs.iter().flatten().take(n));
                        // Bytes not taken are "unwritten": rewind the generator.
                        next -= (total - n) as u64;
                    }
                    Op::Read(len) => {
                        let mut out = vec![0u8; len];
                        let n = c.read(&mut out).unwrap();
                        prop_assert_eq!(n, len.min(model.len()));
                        let expect: Vec<u8> = model.drain(..n).collect();
                        prop_assert_eq!(&out[..n], &expect[..]);
                    }
                }
                prop_assert_eq!(c.available().unwrap(), model.len());
            }
            prop_assert_eq!(p.written() - c.consumed(), model.len() as u64);
        }
    }

    #[test]
    fn wake_requests_are_taken_once() {
        let (mut p, mut c) = pair_in_heap(CAP).unwrap();
        assert!(!p.take_consumer_wake(), "nobody asked");
        assert!(!c.arm(), "empty ring: the consumer may sleep");
        p.write(b"x").unwrap();
        assert!(p.take_consumer_wake(), "the consumer armed: ring");
        p.write(b"y").unwrap();
        assert!(!p.take_consumer_wake(), "already taken");
        // Data there: arming says "don't sleep" and withdraws itself.
        assert!(c.arm());
        p.write(b"z").unwrap();
        assert!(!p.take_consumer_wake());

        // The other direction.
        let mut out = [0u8; 3];
        assert_eq!(c.read(&mut out).unwrap(), 3);
        assert!(!c.take_producer_wake());
        assert_eq!(p.write(&vec![0u8; CAP]).unwrap(), CAP);
        assert!(!p.arm_for_space(), "full ring: the producer may sleep");
        assert_eq!(c.read(&mut out).unwrap(), 3);
        assert!(c.take_producer_wake());
        assert!(!c.take_producer_wake());
        assert!(p.arm_for_space(), "space is free: don't sleep");
        c.read(&mut out).unwrap();
        assert!(!c.take_producer_wake(), "withdrawn");
    }

    #[test]
    fn close_is_seen_after_the_data() {
        let (mut p, mut c) = pair_in_heap(CAP).unwrap();
        p.write(b"last words").unwrap();
        assert!(!c.is_producer_closed());
        drop(p);
        assert!(c.is_producer_closed());
        assert!(c.arm(), "closed: don't sleep");
        let mut out = [0u8; 32];
        assert_eq!(c.read(&mut out).unwrap(), 10);
        assert_eq!(&out[..10], b"last words");
        assert_eq!(c.read(&mut out).unwrap(), 0);

        let (mut p, c) = pair_in_heap(CAP).unwrap();
        assert!(!p.is_consumer_closed());
        p.write(&vec![0u8; CAP]).unwrap();
        drop(c);
        assert!(p.is_consumer_closed());
        assert!(p.arm_for_space(), "nobody will free space: don't sleep");
    }

    #[test]
    fn corrupt_counters_are_errors() {
        let (mut p, mut c) = pair_in_heap(CAP).unwrap();
        // A peer claims more data than the ring holds.
        c.region.head().store(CAP as u64 + 1, Ordering::Release);
        let mut out = [0u8; 8];
        assert!(matches!(c.read(&mut out), Err(RingError::Corrupt { .. })));
        assert!(matches!(c.available(), Err(RingError::Corrupt { .. })));
        assert!(c.arm(), "corrupt: don't sleep, let read report it");
        // A peer claims to have read more than was written.
        // (The producer trusts its cached tail while that shows room, so
        // fill the ring first to make it look.)
        assert_eq!(p.write(&vec![0u8; CAP]).unwrap(), CAP);
        p.region.tail().store(CAP as u64 + 5, Ordering::Release);
        assert!(matches!(p.write(&[0u8; 1]), Err(RingError::Corrupt { .. })));
        assert!(matches!(p.free(), Err(RingError::Corrupt { .. })));
        assert!(p.arm_for_space());
        // Attaching to a corrupt ring fails too.
        let base = p.region.base.as_ptr();
        // SAFETY: the region is alive (held by `p`), and the new handle is
        // never used: the constructor refuses the counters.
        let r = unsafe { Consumer::new(base, CAP, Arc::new(())) };
        assert!(matches!(r, Err(RingError::Corrupt { .. })));
    }

    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(if cfg!(miri) { 600 } else { 60 })
    }

    /// Two threads, spinning: `writes` random-sized writes (0..=max
    /// bytes) of a generated stream; the reader checks every byte in order.
    fn stress(writes: u32, max: u64, cap: usize) {
        let (mut p, mut c) = pair_in_heap(cap).unwrap();
        let end = deadline();
        let writer = std::thread::spawn(move || {
            let mut rng = Rng(0x1234_5678);
            let mut pos = 0u64;
            let mut buf = vec![0u8; max as usize];
            for _ in 0..writes {
                let len = rng.below(max + 1) as usize;
                for (i, b) in buf[..len].iter_mut().enumerate() {
                    *b = stream_byte(7, pos + i as u64);
                }
                // Split in two slices to exercise the vectored path.
                let (a, b) = buf[..len].split_at(len / 3);
                let mut done = 0;
                while done < len {
                    assert!(Instant::now() < end, "writer stuck");
                    let slices = if done < a.len() {
                        vec![IoSlice::new(&a[done..]), IoSlice::new(b)]
                    } else {
                        vec![IoSlice::new(&b[done - a.len()..])]
                    };
                    let n = p.write_vectored(&slices).unwrap();
                    if n == 0 {
                        std::thread::yield_now();
                    }
                    done += n;
                }
                pos += len as u64;
            }
            pos
        });
        let mut got = 0u64;
        let mut sum = 0u64;
        let mut out = vec![0u8; 3000];
        let mut rng = Rng(99);
        loop {
            assert!(Instant::now() < end, "reader stuck");
            let want = 1 + rng.below(out.len() as u64) as usize;
            let closed = c.is_producer_closed();
            let n = c.read(&mut out[..want]).unwrap();
            for (i, &b) in out[..n].iter().enumerate() {
                assert_eq!(b, stream_byte(7, got + i as u64), "byte {} differs", got + i as u64);
                sum = sum.wrapping_mul(31).wrapping_add(b as u64);
            }
            got += n as u64;
            if n == 0 {
                if closed {
                    break;
                }
                std::thread::yield_now();
            }
        }
        let sent = writer.join().unwrap();
        assert_eq!(got, sent);
        assert_ne!(sum, 0);
    }

    #[test]
    fn two_threads_move_a_checked_stream() {
        if cfg!(miri) {
            stress(200, 3000, CAP);
        } else {
            // 20k writes of up to 20 KB each: ~200 MB through a 64 KiB ring.
            stress(20_000, 20_000, 64 << 10);
        }
    }

    #[test]
    fn two_threads_through_the_smallest_ring() {
        stress(if cfg!(miri) { 100 } else { 20_000 }, 5000, CAP);
    }

    /// A doorbell stand-in that Miri can run: a counter under a mutex.
    /// `wait` fails the test if no ring comes within the bound (a lost
    /// wake-up), instead of hanging.
    #[derive(Default)]
    struct Bell {
        rings: Mutex<u64>,
        cv: Condvar,
    }
    impl Bell {
        fn ring(&self) {
            *self.rings.lock().unwrap() += 1;
            self.cv.notify_one();
        }
        fn wait(&self, who: &str) {
            let bound = Duration::from_secs(if cfg!(miri) { 300 } else { 20 });
            let g = self.rings.lock().unwrap();
            let (mut g, t) = self.cv.wait_timeout_while(g, bound, |n| *n == 0).unwrap();
            assert!(!t.timed_out(), "{who}: lost wake-up");
            *g = 0;
        }
    }

    /// Both sides sleep whenever they cannot go on, and only wake through
    /// the protocol: if a wake-up were ever lost, one side would sleep
    /// forever (here: fail after the bound).
    #[test]
    fn sleeping_sides_are_always_woken() {
        let (mut p, mut c) = pair_in_heap(CAP).unwrap();
        let data_bell = Arc::new(Bell::default());
        let space_bell = Arc::new(Bell::default());
        let total: u64 = if cfg!(miri) { 40_000 } else { 16 << 20 };
        let (db, sb) = (data_bell.clone(), space_bell.clone());
        let writer = std::thread::spawn(move || {
            let mut rng = Rng(5);
            let mut pos = 0u64;
            let mut buf = vec![0u8; 2500];
            let mut sleeps = 0u64;
            while pos < total {
                let len = (1 + rng.below(buf.len() as u64)).min(total - pos) as usize;
                for (i, b) in buf[..len].iter_mut().enumerate() {
                    *b = stream_byte(3, pos + i as u64);
                }
                let mut done = 0;
                while done < len {
                    let n = p.write(&buf[done..len]).unwrap();
                    if n > 0 {
                        done += n;
                        if p.take_consumer_wake() {
                            db.ring();
                        }
                    } else if !p.arm_for_space() {
                        sb.wait("writer");
                        sleeps += 1;
                    }
                }
                pos += len as u64;
            }
            drop(p); // close
            db.ring(); // a close is a state change the consumer must see
            sleeps
        });
        let mut got = 0u64;
        let mut out = vec![0u8; 1700];
        let mut sleeps = 0u64;
        let mut rounds = 0u64;
        loop {
            rounds += 1;
            assert!(rounds < 100_000_000, "reader looped too long");
            let n = c.read(&mut out).unwrap();
            if n > 0 {
                for (i, &b) in out[..n].iter().enumerate() {
                    assert_eq!(b, stream_byte(3, got + i as u64));
                }
                got += n as u64;
                if c.take_producer_wake() {
                    space_bell.ring();
                }
                continue;
            }
            if c.is_producer_closed() && c.available().unwrap() == 0 {
                break;
            }
            if !c.arm() {
                data_bell.wait("reader");
                sleeps += 1;
            }
        }
        let writer_sleeps = writer.join().unwrap();
        assert_eq!(got, total);
        // How often each side slept depends on scheduling; print it, do
        // not assert it.
        eprintln!("reader slept {sleeps} times, writer {writer_sleeps} times");
    }

    // ---- Many threads at once (issue 10) ----
    //
    // The ring is SPSC: several writers share one `Producer` behind a
    // mutex (as a rail serializes its users), several rings run side by
    // side, and a monitor thread watches the shared counters of every
    // ring while they move.

    /// How a side waits when it cannot go on: sleep through the wake
    /// protocol (doorbells) or spin with `yield_now`.
    #[derive(Default)]
    struct Wakes {
        sleep: bool,
        /// Rung by the producer when the consumer asked for data.
        data: Bell,
        /// Rung by the consumer when the producer asked for space.
        space: Bell,
        /// Times a side went to sleep (a diagnostic: scheduling decides).
        sleeps: std::sync::atomic::AtomicU64,
    }

    /// Bound on the turns of one read or write loop (beside the deadline).
    const ROUNDS: u64 = 1 << 32;

    /// Writes all of `bytes` in random pieces (each split in two slices,
    /// for the vectored path), waiting on a full ring as `w` says.
    fn write_all(p: &mut Producer, bytes: &[u8], rng: &mut Rng, w: &Wakes, end: Instant, who: &str) {
        let (mut done, mut round) = (0, 0);
        while done < bytes.len() {
            round += 1;
            assert!(round < ROUNDS && Instant::now() < end, "{who}: stuck writing ({done} of {} bytes)", bytes.len());
            let piece = 1 + rng.below((bytes.len() - done) as u64) as usize;
            let (a, b) = bytes[done..done + piece].split_at(rng.below(piece as u64 + 1) as usize);
            let n = p.write_vectored(&[IoSlice::new(a), IoSlice::new(b)]).unwrap();
            assert!(n <= piece, "{who}: wrote {n} bytes of {piece}");
            if n > 0 {
                done += n;
                if p.take_consumer_wake() {
                    w.data.ring();
                }
                continue;
            }
            assert!(!p.is_consumer_closed(), "{who}: the consumer went away");
            if !w.sleep {
                std::thread::yield_now();
            } else if !p.arm_for_space() {
                w.space.wait(who);
                w.sleeps.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Reads until end of stream in random sizes (1..=max), passing every
    /// piece to `sink`; returns the bytes read.
    fn read_all(
        c: &mut Consumer,
        max: usize,
        rng: &mut Rng,
        w: &Wakes,
        end: Instant,
        who: &str,
        mut sink: impl FnMut(&[u8]),
    ) -> u64 {
        let mut out = vec![0u8; max];
        let mut round = 0;
        loop {
            round += 1;
            assert!(round < ROUNDS && Instant::now() < end, "{who}: stuck reading after {} bytes", c.consumed());
            let want = 1 + rng.below(max as u64) as usize;
            let n = c.read(&mut out[..want]).unwrap();
            assert!(n <= want);
            if n > 0 {
                sink(&out[..n]);
                if c.take_producer_wake() {
                    w.space.ring();
                }
                continue;
            }
            // The flag first, then look again: "closed and empty" is the end.
            if c.is_producer_closed() && c.available().unwrap() == 0 {
                return c.consumed();
            }
            if !w.sleep {
                std::thread::yield_now();
            } else if !c.arm() {
                w.data.wait(who);
                w.sleeps.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A read-only view of a ring's shared counters for a third thread.
    struct Watch {
        region: Region,
        _keep: KeepAlive,
    }
    // SAFETY: a Watch only loads the control words atomically (through
    // `Region`'s accessors), and `_keep` keeps the memory alive.
    unsafe impl Send for Watch {}
    impl Watch {
        fn of(p: &Producer) -> Watch {
            Watch { region: p.region, _keep: p._keep.clone() }
        }
    }

    /// Samples every ring's counters until `stop` (or a bound): `head` and
    /// `tail` never go back, and `head - tail` never exceeds the capacity.
    /// `head` is loaded first: the producer's `tail` load that allowed
    /// that `head` happens before our `tail` load (its Release, our
    /// Acquire), so we see at least that `tail` and the bound holds for
    /// every sample. Returns the number of samples.
    fn watch(rings: Vec<Watch>, stop: Arc<std::sync::atomic::AtomicBool>, end: Instant) -> u64 {
        let mut last = vec![(0u64, 0u64); rings.len()];
        let bound: u64 = if cfg!(miri) { 2_000 } else { 5_000_000 };
        let mut samples = 0;
        while samples < bound && Instant::now() < end && !stop.load(Ordering::Acquire) {
            for (i, r) in rings.iter().enumerate() {
                let head = r.region.head().load(Ordering::Acquire);
                let tail = r.region.tail().load(Ordering::Acquire);
                let cap = r.region.capacity;
                assert!(head >= last[i].0 && tail >= last[i].1, "ring {i}: a counter went back");
                assert!(
                    head < tail || head - tail <= cap,
                    "ring {i}: head {head} - tail {tail} exceeds the capacity {cap}"
                );
                last[i] = (head, tail);
            }
            samples += 1;
            std::thread::yield_now();
        }
        samples
    }

    /// Record header: writer id, its sequence number, payload length
    /// (u32 each, little-endian).
    const RECORD_HEADER: usize = 12;

    fn record(id: u32, seq: u32, len: usize) -> Vec<u8> {
        let mut r = Vec::with_capacity(RECORD_HEADER + len);
        r.extend_from_slice(&id.to_le_bytes());
        r.extend_from_slice(&seq.to_le_bytes());
        r.extend_from_slice(&(len as u32).to_le_bytes());
        r.extend((0..len as u64).map(|j| stream_byte(((id as u64) << 32) | seq as u64, j)));
        r
    }

    /// Parses whole records from the front of `buf`, checking each
    /// writer's sequence is gap-free and every payload intact; leaves a
    /// partial record in `buf`.
    fn parse_records(buf: &mut Vec<u8>, next_seq: &mut [u32], max_len: usize) {
        let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let mut pos = 0;
        while buf.len() - pos >= RECORD_HEADER {
            let (id, seq, len) = (u32_at(buf, pos), u32_at(buf, pos + 4), u32_at(buf, pos + 8) as usize);
            assert!((id as usize) < next_seq.len(), "bad writer id {id}: the stream is garbled");
            assert_eq!(seq, next_seq[id as usize], "writer {id}: a record lost, repeated or out of order");
            assert!((1..=max_len).contains(&len), "writer {id} record {seq}: bad length {len}");
            if buf.len() - pos < RECORD_HEADER + len {
                break;
            }
            let payload = &buf[pos + RECORD_HEADER..pos + RECORD_HEADER + len];
            let seed = ((id as u64) << 32) | seq as u64;
            for (j, &b) in payload.iter().enumerate() {
                assert_eq!(b, stream_byte(seed, j as u64), "writer {id} record {seq}: payload byte {j} differs");
            }
            next_seq[id as usize] += 1;
            pos += RECORD_HEADER + len;
        }
        buf.drain(..pos);
    }

    /// The record checker itself notices a lost, repeated or damaged
    /// record (so the many-writer tests would).
    #[test]
    fn record_checker_catches_a_broken_stream() {
        let check = |recs: &[Vec<u8>]| {
            let mut buf: Vec<u8> = recs.concat();
            let mut next = vec![0u32; 2];
            std::panic::catch_unwind(move || {
                parse_records(&mut buf, &mut next, 100);
                (buf.len(), next)
            })
        };
        let (a0, a1, b0) = (record(0, 0, 10), record(0, 1, 20), record(1, 0, 30));
        let ok = check(&[a0.clone(), b0.clone(), a1.clone()]).expect("a good stream");
        assert_eq!(ok, (0, vec![2, 1]));
        assert!(check(&[a1.clone(), a0.clone()]).is_err(), "out of order");
        assert!(check(&[a0.clone(), a0.clone()]).is_err(), "repeated");
        assert!(check(&[b0.clone(), a1.clone()]).is_err(), "lost");
        let mut bad = a0.clone();
        bad[RECORD_HEADER + 3] ^= 1;
        assert!(check(&[bad]).is_err(), "damaged payload");
        let mut cut = a0.clone();
        cut.remove(RECORD_HEADER);
        assert!(check(&[cut, b0]).is_err(), "a byte lost");
        // A partial record waits for the rest.
        assert_eq!(check(&[a0[..15].to_vec()]).unwrap(), (15, vec![0, 0]));
    }

    /// Runs `writers` threads, each sending `records` records of random
    /// length (1..=max_len) through one shared producer, the lock held for
    /// a whole record (written in random pieces); one consumer parses them.
    fn shared_producer(writers: u32, records: u32, max_len: usize, cap: usize, sleep: bool) {
        let (p, mut c) = pair_in_heap(cap).unwrap();
        let end = deadline();
        let watch_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watcher = {
            let (rings, stop) = (vec![Watch::of(&p)], watch_stop.clone());
            std::thread::spawn(move || watch(rings, stop, end))
        };
        let p = Arc::new(Mutex::new(Some(p)));
        let wakes = Arc::new(Wakes { sleep, ..Wakes::default() });
        let handles: Vec<_> = (0..writers)
            .map(|id| {
                let (p, w) = (p.clone(), wakes.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng(0x5EED_0000 + id as u64);
                    let mut sent = 0u64;
                    for seq in 0..records {
                        let rec = record(id, seq, 1 + rng.below(max_len as u64) as usize);
                        let mut guard = p.lock().unwrap();
                        let p = guard.as_mut().expect("the producer closed early");
                        write_all(p, &rec, &mut rng, &w, end, &format!("writer {id}"));
                        drop(guard);
                        sent += rec.len() as u64;
                        if rng.below(4) == 0 {
                            std::thread::yield_now();
                        }
                    }
                    sent
                })
            })
            .collect();
        let reader = {
            let w = wakes.clone();
            std::thread::spawn(move || {
                let mut rng = Rng(77);
                let mut buf = Vec::new();
                let mut next_seq = vec![0u32; writers as usize];
                let got = read_all(&mut c, 2 * cap, &mut rng, &w, end, "reader", |b| {
                    buf.extend_from_slice(b);
                    parse_records(&mut buf, &mut next_seq, max_len);
                });
                assert!(buf.is_empty(), "{} bytes of a partial record at the end", buf.len());
                (got, next_seq)
            })
        };
        let sent: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
        // Close even if a writer failed, so the reader ends.
        drop(p.lock().unwrap_or_else(|e| e.into_inner()).take());
        wakes.data.ring();
        let read = reader.join();
        watch_stop.store(true, Ordering::Release);
        let samples = watcher.join().unwrap();
        let sent: u64 = sent.into_iter().map(|s| s.unwrap()).sum();
        let (got, next_seq) = read.unwrap();
        assert_eq!(next_seq, vec![records; writers as usize], "records per writer");
        assert_eq!(got, sent);
        let sleeps = wakes.sleeps.load(Ordering::Relaxed);
        eprintln!("{writers} writers: {sent} bytes, {sleeps} sleeps, {samples} counter samples");
    }

    #[test]
    fn many_writers_share_a_producer_record_by_record() {
        if cfg!(miri) {
            shared_producer(3, 4, 1500, CAP, false);
        } else {
            // ~16 MB and ~18 MB: enough to fill the ring thousands of times.
            shared_producer(8, 1_000, 4_000, CAP, false);
            shared_producer(6, 300, 20_000, 16 << 10, false);
        }
    }

    #[test]
    fn many_sleeping_writers_share_a_producer() {
        if cfg!(miri) {
            shared_producer(3, 4, 1500, CAP, true);
        } else {
            shared_producer(8, 1_000, 4_000, CAP, true);
        }
    }

    /// `pairs` rings at once, each with its own writer and reader, random
    /// capacities (the smallest at least twice), random write and read
    /// sizes (both up to beyond the capacity), alternately sleeping and
    /// spinning; a monitor watches all the counters.
    fn rings_side_by_side(pairs: u64, total: u64) {
        let end = deadline();
        let mut rng = Rng(0xB0A7);
        let mut watches = Vec::new();
        let mut threads = Vec::new();
        let mut all_wakes = Vec::new();
        for k in 0..pairs {
            let cap = if k < 2 { CAP } else { CAP << rng.below(5) };
            let (mut p, mut c) = pair_in_heap(cap).unwrap();
            watches.push(Watch::of(&p));
            let wakes = Arc::new(Wakes { sleep: k % 2 == 1, ..Wakes::default() });
            let seed = 100 + k;
            all_wakes.push(wakes.clone());
            let w = wakes.clone();
            let writer = std::thread::spawn(move || {
                let mut rng = Rng(seed);
                let mut buf = vec![0u8; 2 * cap];
                let mut pos = 0u64;
                while pos < total {
                    let len = (1 + rng.below(buf.len() as u64)).min(total - pos) as usize;
                    for (i, b) in buf[..len].iter_mut().enumerate() {
                        *b = stream_byte(seed, pos + i as u64);
                    }
                    write_all(&mut p, &buf[..len], &mut rng, &w, end, &format!("writer {k}"));
                    pos += len as u64;
                }
                assert_eq!(p.written(), total);
                drop(p); // close
                w.data.ring(); // a close is a state change the reader must see
                pos
            });
            let reader = std::thread::spawn(move || {
                let mut rng = Rng(seed ^ 0xFFFF);
                let mut got = 0u64;
                let n = read_all(&mut c, cap + cap / 2, &mut rng, &wakes, end, &format!("reader {k}"), |b| {
                    for (i, &x) in b.iter().enumerate() {
                        assert_eq!(x, stream_byte(seed, got + i as u64), "ring {k}: byte {} differs", got + i as u64);
                    }
                    got += b.len() as u64;
                });
                assert_eq!(n, got);
                got
            });
            threads.push((cap, writer, reader));
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watcher = {
            let stop = stop.clone();
            std::thread::spawn(move || watch(watches, stop, end))
        };
        let results: Vec<_> = threads.into_iter().map(|(cap, w, r)| (cap, w.join(), r.join())).collect();
        stop.store(true, Ordering::Release);
        let samples = watcher.join().unwrap();
        for (k, (cap, sent, got)) in results.into_iter().enumerate() {
            let (sent, got) = (sent.unwrap(), got.unwrap());
            assert_eq!(sent, total, "ring {k} (capacity {cap})");
            assert_eq!(got, total, "ring {k} (capacity {cap})");
        }
        let sleeps: Vec<u64> = all_wakes.iter().map(|w| w.sleeps.load(Ordering::Relaxed)).collect();
        eprintln!("{pairs} rings: {total} bytes each, sleeps per ring {sleeps:?}, {samples} counter samples");
    }

    #[test]
    fn independent_rings_run_side_by_side() {
        if cfg!(miri) {
            rings_side_by_side(2, 12_000);
        } else {
            rings_side_by_side(4, 4 << 20);
        }
    }
}
