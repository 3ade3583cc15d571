//! Sends and receives in progress: [`Op`] (what a request holds) and the
//! Python `Request` object.

use std::sync::{Arc, Mutex};

use multirail::{Bytes, BytesMut, Detached, Endpoint, Request};
use pyo3::prelude::*;

use crate::buffer::{self, PyBuf, Returned};
use crate::owned::Owned;
use crate::{Status, to_py};

/// Sends of at least this many bytes lend the Python buffer to multirail
/// instead of copying it. It is the size from which the receiver
/// acknowledges a message as soon as it is complete (the protocol's
/// `ack_bytes`), so waiting for the buffer to come back costs about one
/// round trip; below it a copy is cheaper than that wait.
pub(crate) const LEND_FROM: usize = 256 << 10;

/// Most bytes of receive buffers an endpoint keeps for reuse: a window of
/// 64 receives of 4 MiB (as `multirail bench bw` posts) reuses its
/// buffers instead of faulting in fresh pages every time.
const POOL_BYTES: usize = 256 << 20;
/// Smaller receive buffers are simply allocated (and received into
/// through a copy, even when they are a `multirail.Buffer`).
const POOL_FROM: usize = 64 << 10;
pub(crate) const IN_PLACE_FROM: usize = POOL_FROM;

/// An endpoint and the receive buffers it reuses.
pub(crate) struct Shared {
    pub ep: Endpoint,
    pool: Mutex<Vec<BytesMut>>,
}

impl Shared {
    pub fn new(ep: Endpoint) -> Shared {
        Shared { ep, pool: Mutex::new(Vec::new()) }
    }

    /// A buffer of `len` bytes for multirail to receive into: a reused one
    /// if one is big enough (no fresh pages to fault in), else a new one.
    fn scratch(&self, len: usize) -> BytesMut {
        if len < POOL_FROM {
            return BytesMut::zeroed(len);
        }
        let reused = {
            let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            let best = pool.iter().enumerate().filter(|(_, b)| b.capacity() >= len).min_by_key(|(_, b)| b.capacity());
            best.map(|(i, _)| i).map(|i| pool.swap_remove(i))
        };
        match reused {
            Some(mut b) => {
                b.resize(len, 0);
                b
            }
            None => BytesMut::zeroed(len),
        }
    }

    fn give_back(&self, b: BytesMut) {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        let held: usize = pool.iter().map(BytesMut::capacity).sum();
        if b.capacity() >= POOL_FROM && held + b.capacity() <= POOL_BYTES {
            pool.push(b);
        }
    }
}

/// A Python buffer lent to multirail, kept exported until multirail
/// returns it. Dropped earlier (its request abandoned), it is handed to
/// [`buffer::orphan`] instead of being released under multirail's feet.
struct Lent {
    buf: Option<PyBuf>,
    back: Arc<Returned>,
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take()
            && !self.back.is_set()
        {
            buffer::orphan(b, self.back.clone());
        }
    }
}

enum Kind {
    /// A copied send (`None`) or a lent buffer.
    Send(Option<Lent>),
    /// The caller's buffer, and the `multirail.Buffer` memory behind it
    /// that the message lands in, if any (else it is copied there).
    Recv(PyBuf, Option<Arc<Owned>>),
}

/// A started send or receive: everything needed to finish it.
pub(crate) struct Op {
    shared: Arc<Shared>,
    req: Detached,
    kind: Kind,
}

/// What [`Op::finish`] leaves to drop once the GIL is back.
pub(crate) struct Leftover(#[allow(dead_code)] Kind);

impl Op {
    /// Starts sending `buf` (lent if large, else copied).
    pub fn send(shared: &Arc<Shared>, buf: PyBuf, dest: u32, tag: u64) -> Result<Op, multirail::Error> {
        let (data, lent) = if buf.len() >= LEND_FROM {
            let (data, back) = buffer::lend(&buf);
            (data, Some(Lent { buf: Some(buf), back }))
        } else {
            (Bytes::copy_from_slice(buf.as_slice()), None)
        };
        let req = Request::from(shared.ep.isend(dest, tag, data)?).detach();
        Ok(Op { shared: shared.clone(), req, kind: Kind::Send(lent) })
    }

    /// Posts a receive whose message goes to `buf`: in place if `owned`
    /// (the `multirail.Buffer` behind `buf`) is not in use by another
    /// receive, else through a buffer of multirail's.
    pub fn recv(
        shared: &Arc<Shared>,
        buf: PyBuf,
        owned: Option<Arc<Owned>>,
        src: Option<u32>,
        tag: Option<u64>,
    ) -> Result<Op, multirail::Error> {
        let ep = &shared.ep;
        if let Some(s) = src.filter(|&s| s >= ep.size() || s == ep.rank()) {
            // Refused before the memory is lent (a refused irecv keeps it).
            return Err(multirail::Error::NoSuchPeer(s));
        }
        let (into, owned) = match owned.and_then(|o| o.lend().map(|h| (h, o))) {
            Some((head, o)) => (head, Some(o)),
            None => (shared.scratch(buf.len()), None),
        };
        let req = Request::from(ep.irecv(src, tag, into)?).detach();
        Ok(Op { shared: shared.clone(), req, kind: Kind::Recv(buf, owned) })
    }

    /// True once the request finished (`finish` then returns at once).
    pub fn test(self) -> (Op, bool) {
        let Op { shared, req, kind } = self;
        let (req, done) = match shared.ep.attach(req) {
            Ok(r) => {
                let done = match &r {
                    Request::Send(s) => s.test(),
                    Request::Recv(v) => v.test(),
                };
                (r.detach(), done)
            }
            Err(_) => unreachable!("a request is attached to its own endpoint"),
        };
        (Op { shared, req, kind }, done)
    }

    /// Waits for the request (call without the GIL). A receive's message
    /// is copied into the caller's buffer (nothing, if truncated);
    /// a lent send buffer is waited for until multirail returns it (or the
    /// peer timeout passes: then it is released later, see `orphan`).
    pub fn finish(self) -> (Result<Option<Status>, multirail::Error>, Leftover) {
        let Op { shared, req, kind } = self;
        let req = match shared.ep.attach(req) {
            Ok(r) => r,
            Err(e) => return (Err(e), Leftover(kind)),
        };
        match (req, kind) {
            (Request::Send(s), Kind::Send(lent)) => {
                let res = s.wait();
                if let (Ok(()), Some(l)) = (&res, &lent) {
                    l.back.wait(shared.ep.config().proto.peer_timeout);
                }
                (res.map(|()| None), Leftover(Kind::Send(lent)))
            }
            (Request::Recv(r), Kind::Recv(mut dst, owned)) => {
                let res = match r.wait_with_buffer(None) {
                    Ok((got, res)) => {
                        // A truncated message delivers no bytes at all.
                        let n = res.as_ref().map_or(0, |st| st.len as usize);
                        match &owned {
                            Some(o) => o.give_back(got, n),
                            None => {
                                dst.write(&got[..n]);
                                shared.give_back(got);
                            }
                        }
                        res.map(|st| Some(st.into()))
                    }
                    Err(e) => Err(e),
                };
                (res, Leftover(Kind::Recv(dst, owned)))
            }
            _ => unreachable!("a request keeps its kind"),
        }
    }
}

/// A send or receive in progress (from `Endpoint.isend`/`irecv`).
#[pyclass(module = "multirail", name = "Request", frozen)]
pub struct PyRequest {
    /// `None` once finished (or while a thread waits on it).
    op: Mutex<Option<Op>>,
    /// How it finished, for a second `wait`.
    outcome: Mutex<Option<PyResult<Option<Status>>>>,
    is_send: bool,
    /// A receive that lands in place (in a `multirail.Buffer`'s memory).
    #[pyo3(get)]
    in_place: bool,
}

impl PyRequest {
    pub(crate) fn new(op: Op, is_send: bool) -> PyRequest {
        let in_place = matches!(op.kind, Kind::Recv(_, Some(_)));
        PyRequest { op: Mutex::new(Some(op)), outcome: Mutex::new(None), is_send, in_place }
    }

    /// Waits (without the GIL) and returns the outcome (again, for a
    /// request already waited for).
    pub(crate) fn wait_py(&self, py: Python<'_>) -> PyResult<Option<Status>> {
        let op = self.op.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(op) = op else {
            let out = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
            return match out.as_ref() {
                Some(Ok(st)) => Ok(*st),
                Some(Err(e)) => Err(e.clone_ref(py)),
                None => Err(crate::Error::new_err("another thread is waiting on this request")),
            };
        };
        let (res, leftover) = py.detach(|| op.finish());
        drop(leftover);
        buffer::release_orphans(py);
        let res = res.map_err(to_py);
        let copy = match &res {
            Ok(st) => Ok(*st),
            Err(e) => Err(e.clone_ref(py)),
        };
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(copy);
        res
    }
}

#[pymethods]
impl PyRequest {
    /// True once the request finished (then `wait` returns at once).
    fn test(&self) -> bool {
        let mut slot = self.op.lock().unwrap_or_else(|e| e.into_inner());
        match slot.take() {
            Some(op) => {
                let (op, done) = op.test();
                *slot = Some(op);
                done
            }
            None => self.outcome.lock().unwrap_or_else(|e| e.into_inner()).is_some(),
        }
    }

    /// Waits for the request, the GIL released. A send returns None, a
    /// receive its Status; a failure raises (again on every later call).
    fn wait(&self, py: Python<'_>) -> PyResult<Option<Status>> {
        self.wait_py(py)
    }

    fn __repr__(&self) -> String {
        let state = if self.op.lock().unwrap_or_else(|e| e.into_inner()).is_some() { "pending" } else { "finished" };
        format!("<multirail.Request {} {state}>", if self.is_send { "send" } else { "recv" })
    }
}
