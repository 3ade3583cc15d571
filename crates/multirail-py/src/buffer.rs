//! Python buffers (bytes, bytearray, memoryview, numpy arrays...) held
//! while multirail reads or writes them.
//!
//! The buffer protocol (`PyObject_GetBuffer`, `Py_buffer`) joined the
//! stable ABI only in Python 3.11, so pyo3 offers no `PyBuffer` to an
//! abi3-py39 build. The functions and the struct are the same in every
//! CPython since 3.3 (3.11 declared the existing layout stable), and every
//! CPython exports them, so this module declares them itself.

use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use multirail::Bytes;
use pyo3::prelude::*;
use pyo3::{PyErr, ffi};

/// `Py_buffer` (Include/pybuffer.h, unchanged since Python 3.3).
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: isize,
    itemsize: isize,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut isize,
    strides: *mut isize,
    suboffsets: *mut isize,
    internal: *mut c_void,
}

// SAFETY: these are CPython's declarations (Include/pybuffer.h); both are
// exported by every CPython 3.x.
unsafe extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut RawBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
}

const PYBUF_WRITABLE: c_int = 0x0001;
const PYBUF_STRIDES: c_int = 0x0010 | 0x0008;
/// Contiguous in memory (C or Fortran order): one run of `len` bytes.
const PYBUF_ANY_CONTIGUOUS: c_int = 0x0080 | PYBUF_STRIDES;

/// A buffer export of a Python object: its bytes stay where they are (a
/// bytearray cannot be resized, for instance) until this is dropped.
pub struct PyBuf {
    raw: Box<RawBuffer>,
}

// SAFETY: the export pins the memory; the pointer is only dereferenced
// while `self` lives, and releasing it takes the GIL (Drop).
unsafe impl Send for PyBuf {}
// SAFETY: as above; `&PyBuf` gives only the address and length.
unsafe impl Sync for PyBuf {}

impl PyBuf {
    /// Exports `obj`'s memory, writable if `writable` (else any buffer).
    /// Raises `BufferError`/`TypeError` as Python does for an object
    /// without (writable, contiguous) buffer.
    pub fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<PyBuf> {
        let mut raw = Box::new(RawBuffer {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        });
        let flags = PYBUF_ANY_CONTIGUOUS | if writable { PYBUF_WRITABLE } else { 0 };
        // SAFETY: the GIL is held (`obj` is bound); `raw` is a writable
        // Py_buffer.
        if unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *raw, flags) } != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(PyBuf { raw })
    }

    pub fn len(&self) -> usize {
        self.raw.len as usize
    }

    pub fn ptr(&self) -> *mut u8 {
        self.raw.buf.cast()
    }

    /// The bytes (the export pins them for as long as `self` lives).
    pub fn as_slice(&self) -> &[u8] {
        if self.len() == 0 {
            return &[];
        }
        // SAFETY: an exported contiguous buffer of `len` bytes, pinned
        // while `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len()) }
    }

    /// Copies `src` to the start of the buffer (a writable export, at
    /// least `src.len()` bytes long).
    pub fn write(&mut self, src: &[u8]) {
        assert!(src.len() <= self.len() && self.raw.readonly == 0, "checked by the caller");
        if !src.is_empty() {
            // SAFETY: writable and long enough (asserted), pinned.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr(), src.len()) };
        }
    }
}

impl Drop for PyBuf {
    fn drop(&mut self) {
        // Cheap when the GIL is already held (the usual case).
        Python::attach(|_| {
            // SAFETY: exported by PyObject_GetBuffer, released once.
            unsafe { PyBuffer_Release(&mut *self.raw) }
        });
    }
}

/// Set when multirail lets go of a lent buffer.
#[derive(Default)]
pub struct Returned {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Returned {
    pub fn is_set(&self) -> bool {
        *self.done.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits up to `limit`; true if it was returned.
    pub fn wait(&self, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        while !*done {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            done = self.cv.wait_timeout(done, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        true
    }

    fn set(&self) {
        *self.done.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }
}

/// A view of a [`PyBuf`]'s bytes that multirail may keep (to send, and
/// to resend if a rail fails) until the peer acknowledges them. It does
/// not own the export: the request keeps the [`PyBuf`] until `back` is
/// set, so no thread of multirail ever needs the GIL.
struct Lent {
    ptr: *const u8,
    len: usize,
    back: Arc<Returned>,
}

// SAFETY: the bytes are pinned by an export kept until `back` is set.
unsafe impl Send for Lent {}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: see `Send`; `len` > 0 (only large buffers are lent).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.back.set();
    }
}

/// `buf`'s bytes as [`Bytes`] without a copy, and the flag set once
/// multirail no longer needs them. `buf` must outlive the flag.
pub fn lend(buf: &PyBuf) -> (Bytes, Arc<Returned>) {
    let back = Arc::new(Returned::default());
    let lent = Lent { ptr: buf.ptr(), len: buf.len(), back: back.clone() };
    (Bytes::from_owner(lent), back)
}

/// Exports whose bytes multirail still held when their request was
/// dropped unwaited: released by later calls, once returned.
static ORPHANS: Mutex<Vec<(PyBuf, Arc<Returned>)>> = Mutex::new(Vec::new());

pub fn orphan(buf: PyBuf, back: Arc<Returned>) {
    ORPHANS.lock().unwrap_or_else(|e| e.into_inner()).push((buf, back));
}

/// Releases the orphaned exports multirail has let go of (with the GIL).
pub fn release_orphans(_py: Python<'_>) {
    let done: Vec<_> = {
        let mut o = ORPHANS.lock().unwrap_or_else(|e| e.into_inner());
        if o.is_empty() {
            return;
        }
        let (done, held) = std::mem::take(&mut *o).into_iter().partition(|(_, back)| back.is_set());
        *o = held;
        done
    };
    // Released outside the lock: releasing may run the exporter's code.
    drop(done);
}
