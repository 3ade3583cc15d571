//! `multirail.Buffer`: memory multirail owns, which a receive fills in
//! place (no copy). Python sees it through numpy's array interface
//! (`np.asarray(buf)`), which needs no buffer protocol, so it works in the
//! abi3-py39 build too.

use std::sync::{Arc, Mutex};

use multirail::BytesMut;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The memory of a [`PyOwnedBuffer`]. `head` covers all of it and is
/// handed to a receive while one is pending; `keeper` (an empty split of
/// the same allocation) keeps the memory alive whatever happens to `head`,
/// so numpy views of it never dangle.
pub(crate) struct Owned {
    head: Mutex<Option<BytesMut>>,
    _keeper: BytesMut,
    ptr: usize,
    len: usize,
}

impl Owned {
    /// The whole buffer for a receive, if no other receive holds it.
    pub fn lend(&self) -> Option<BytesMut> {
        self.head.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Takes back what a receive returns: the same memory (the message is
    /// already in place), or, if multirail had to move it, a copy of its
    /// first `n` bytes (then later receives copy too).
    pub fn give_back(&self, got: BytesMut, n: usize) {
        if got.as_ptr() as usize == self.ptr && got.len() == self.len {
            *self.head.lock().unwrap_or_else(|e| e.into_inner()) = Some(got);
            return;
        }
        let n = n.min(got.len()).min(self.len);
        if n > 0 {
            // SAFETY: `_keeper` keeps the `len` bytes at `ptr` allocated;
            // nothing else writes them (`head` is out).
            unsafe { std::ptr::copy_nonoverlapping(got.as_ptr(), self.ptr as *mut u8, n) };
        }
    }
}

/// Memory for receives that land in place (no copy): use it through numpy,
/// `a = np.asarray(multirail.Buffer(n))` (uint8; `.view(np.float64)` for
/// another type) and receive into `a` (or a view of all of it).
#[pyclass(module = "multirail", name = "Buffer", frozen)]
pub struct PyOwnedBuffer {
    pub(crate) owned: Arc<Owned>,
}

#[pymethods]
impl PyOwnedBuffer {
    /// `nbytes` zeroed bytes.
    #[new]
    fn new(nbytes: usize) -> PyOwnedBuffer {
        // One byte more, split off and kept: it holds the allocation.
        let mut head = BytesMut::zeroed(nbytes + 1);
        let keeper = head.split_off(nbytes);
        let (ptr, len) = (head.as_ptr() as usize, head.len());
        PyOwnedBuffer { owned: Arc::new(Owned { head: Mutex::new(Some(head)), _keeper: keeper, ptr, len }) }
    }

    fn __len__(&self) -> usize {
        self.owned.len
    }

    /// numpy's array interface (version 3): the bytes as a uint8 vector.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", (self.owned.len,))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.owned.ptr, false))?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!("<multirail.Buffer of {} bytes>", self.owned.len)
    }
}

/// The [`Owned`] memory `obj` covers exactly, if `obj` is a
/// `multirail.Buffer` or an array viewing all of one (numpy's `base`
/// chain), whose data starts at `ptr` and is `len` bytes long.
pub(crate) fn owned_behind(obj: &Bound<'_, PyAny>, ptr: *mut u8, len: usize) -> Option<Arc<Owned>> {
    let mut cur = obj.clone();
    for _ in 0..4 {
        if let Ok(b) = cur.cast::<PyOwnedBuffer>() {
            let o = &b.get().owned;
            return (o.ptr == ptr as usize && o.len == len).then(|| o.clone());
        }
        cur = match cur.getattr_opt("base") {
            Ok(Some(next)) if !next.is_none() => next,
            _ => return None,
        };
    }
    None
}
