//! The two zero-copy paths of the C API.
//!
//! * Sends of at least [`LEND_FROM`] bytes lend the caller's memory: the
//!   [`Bytes`] multirail sends (and resends, should a rail fail) is a view
//!   of it, and a flag ([`Returned`]) is set once multirail dropped the
//!   last view. Waiting for such a send waits for the flag too, so the
//!   buffer is the caller's again when `mr_wait` returns.
//! * Memory from `mr_alloc` is a [`BytesMut`] multirail owns. A receive
//!   into it (from its first byte) hands that very allocation to the
//!   receive, so the message lands in place; `mr_wait` takes it back.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};

use multirail::{Bytes, BytesMut};

/// Sends this long or longer are lent rather than copied (a copy of a
/// small message costs less than the bookkeeping).
pub const LEND_FROM: usize = 64 << 10;

/// Set once multirail no longer holds a lent buffer.
#[derive(Default)]
pub struct Returned {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Returned {
    fn set(&self) {
        *self.done.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }

    pub fn is_set(&self) -> bool {
        *self.done.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks until the buffer is returned, making progress on `ep`
    /// meanwhile: multirail keeps a sent buffer until the peer acknowledged
    /// it, and the acknowledgement has to be read.
    pub fn wait_on(&self, ep: &multirail::Endpoint) {
        while !self.is_set() {
            if ep.progress_until(|| self.is_set(), Some(std::time::Duration::from_millis(1))).is_err() {
                // The endpoint is shut down: nothing sends from the
                // buffer any more.
                return;
            }
        }
    }

    /// Blocks until the buffer is returned (another thread makes the
    /// progress).
    #[cfg(test)]
    pub fn wait(&self) {
        let mut d = self.done.lock().unwrap_or_else(|e| e.into_inner());
        while !*d {
            d = self.cv.wait(d).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// A view of the caller's bytes; dropping it returns them.
struct Lent {
    ptr: *const u8,
    len: usize,
    back: Arc<Returned>,
}

// SAFETY: the caller keeps the bytes unchanged and alive until `back` is
// set (mr_isend's contract, enforced by mr_wait waiting for it).
unsafe impl Send for Lent {}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: see `Send`; `len` >= LEND_FROM > 0 and ptr is not NULL.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.back.set();
    }
}

/// `len` bytes at `ptr` as [`Bytes`] without a copy, and the flag set when
/// multirail lets go of them.
///
/// # Safety
/// `ptr` has `len` (> 0) readable bytes that stay unchanged and allocated
/// until the flag is set.
pub unsafe fn lend(ptr: *const u8, len: usize) -> (Bytes, Arc<Returned>) {
    let back = Arc::new(Returned::default());
    (Bytes::from_owner(Lent { ptr, len, back: back.clone() }), back)
}

/// Memory from `mr_alloc`. `head` (all of it) is out while a receive holds
/// it; `keeper`, an empty split of the same allocation, keeps the memory
/// allocated whatever happens to `head`, so the caller's pointer never
/// dangles before `mr_free`.
struct Block {
    head: Option<BytesMut>,
    /// While a receive of fewer bytes than the block holds the front: the
    /// back part, joined again on return.
    rest: Option<BytesMut>,
    _keeper: BytesMut,
    len: usize,
    /// A receive holds the memory (all of it, or its front).
    out: bool,
}

static BLOCKS: Mutex<BTreeMap<usize, Block>> = Mutex::new(BTreeMap::new());

fn blocks() -> std::sync::MutexGuard<'static, BTreeMap<usize, Block>> {
    BLOCKS.lock().unwrap_or_else(|e| e.into_inner())
}

/// `len` zeroed bytes that receives fill in place.
pub fn alloc(len: usize) -> *mut u8 {
    // One byte more, split off and kept: it holds the allocation.
    let mut head = BytesMut::zeroed(len + 1);
    let keeper = head.split_off(len);
    let ptr = head.as_mut_ptr();
    blocks().insert(ptr as usize, Block { head: Some(head), rest: None, _keeper: keeper, len, out: false });
    ptr
}

/// Frees memory from [`alloc`]; refused while a receive holds it.
pub fn free(ptr: *mut u8) -> Result<(), String> {
    let mut b = blocks();
    let Some(block) = b.get(&(ptr as usize)) else {
        return Err(format!("{ptr:?} is not memory from mr_alloc (or was freed already)"));
    };
    if block.out {
        return Err("a receive into this memory is still pending: wait for it or free it first".into());
    }
    b.remove(&(ptr as usize));
    Ok(())
}

/// For a receive of `cap` bytes into `ptr`: the block's memory, if `ptr`
/// is the start of a block that no other receive holds and `cap` fits.
pub fn take(ptr: *mut u8, cap: usize) -> Option<BytesMut> {
    let mut b = blocks();
    let block = b.get_mut(&(ptr as usize))?;
    if cap > block.len || cap == 0 {
        return None;
    }
    let mut head = block.head.take()?;
    block.out = true;
    if cap < block.len {
        block.rest = Some(head.split_off(cap));
    }
    Some(head)
}

/// Takes back what a receive returns: the same memory (the message is in
/// place already), or, had multirail moved it, a copy of its first `n`
/// bytes (later receives into the block then copy as well).
pub fn give_back(ptr: *mut u8, got: BytesMut, n: usize) {
    let mut b = blocks();
    let Some(block) = b.get_mut(&(ptr as usize)) else { return };
    block.out = false;
    let rest = block.rest.take();
    if got.as_ptr() == ptr.cast_const() {
        let mut head = got;
        if let Some(rest) = rest {
            if head.as_ptr().wrapping_add(head.len()) == rest.as_ptr() {
                head.unsplit(rest); // contiguous: O(1), no copy
            } else {
                return; // not whole again: leave the block to the copy path
            }
        }
        if head.len() == block.len {
            block.head = Some(head);
        }
        return;
    }
    let n = n.min(got.len()).min(block.len);
    // SAFETY: `_keeper` keeps the block's `len` bytes at `ptr` allocated,
    // and no receive writes them (`head` is not out).
    unsafe { std::ptr::copy_nonoverlapping(got.as_ptr(), ptr, n) };
}

/// True if `ptr` is memory from [`alloc`].
#[cfg(test)]
pub fn is_block(ptr: *const u8) -> bool {
    blocks().contains_key(&(ptr as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_goes_out_whole_or_in_part_and_comes_back_in_place() {
        let p = alloc(1000);
        assert!(is_block(p));
        let head = take(p, 1000).expect("the whole block");
        assert_eq!(head.as_ptr(), p.cast_const());
        assert!(take(p, 10).is_none(), "out already");
        assert!(free(p).is_err(), "refused while a receive holds it");
        give_back(p, head, 0);
        let mut part = take(p, 100).expect("the front");
        assert_eq!((part.as_ptr(), part.len()), (p.cast_const(), 100));
        assert!(free(p).is_err(), "refused while a receive holds part of it");
        part[..3].copy_from_slice(b"abc");
        give_back(p, part, 3);
        let again = take(p, 1000).expect("whole again after the part came back");
        assert_eq!(&again[..3], b"abc");
        give_back(p, again, 0);
        assert!(take(p, 1001).is_none(), "larger than the block");
        assert!(free(p).is_ok());
        assert!(!is_block(p));
    }

    #[test]
    fn memory_moved_by_multirail_is_copied_back() {
        let p = alloc(16);
        let head = take(p, 16).unwrap();
        drop(head);
        let mut other = BytesMut::zeroed(16);
        other[..4].copy_from_slice(b"wxyz");
        give_back(p, other, 4);
        // SAFETY: the block is allocated until freed.
        assert_eq!(unsafe { std::slice::from_raw_parts(p, 4) }, b"wxyz");
        assert!(take(p, 16).is_none(), "copy mode from now on");
        free(p).unwrap();
    }

    #[test]
    fn a_lent_buffer_is_returned_when_the_last_view_goes() {
        let data = vec![7u8; 100_000];
        // SAFETY: data outlives the views and is not changed.
        let (bytes, back) = unsafe { lend(data.as_ptr(), data.len()) };
        let view = bytes.slice(10..20);
        drop(bytes);
        assert!(!*back.done.lock().unwrap());
        assert_eq!(&view[..], &[7u8; 10]);
        drop(view);
        back.wait();
    }
}
