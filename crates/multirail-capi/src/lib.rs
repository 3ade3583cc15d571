//! The C API of multirail (`include/multirail.h`, generated from this file
//! by cbindgen). Handles are opaque; every function returns an
//! [`mr_err`] and leaves a message for [`mr_last_error`] on failure; a
//! panic inside is caught and reported as `MR_ERR_INTERNAL`, never
//! unwound into C. See docs/c.md.

#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char};
use std::net::{TcpListener, ToSocketAddrs};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use multirail::{Builder, Bytes, BytesMut, Config, Detached, Endpoint, Error, Request};

mod memory;

/// Matches a message from any source (as `src` of a receive).
pub const MR_ANY_SOURCE: u32 = u32::MAX;
/// Matches a message with any tag (as `tag` of a receive).
pub const MR_ANY_TAG: u64 = u64::MAX;

/// What every function returns: `MR_OK`, or why it failed (the message
/// is in `mr_last_error()`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum mr_err {
    MR_OK = 0,
    /// A NULL handle or pointer, a string that is not UTF-8, a request
    /// already finished, an endpoint with requests still open.
    MR_ERR_INVALID_ARGUMENT = 1,
    /// A setting is invalid (the message names it and the value).
    MR_ERR_CONFIG = 2,
    /// The ranks could not meet or a rail could not be connected.
    MR_ERR_SETUP = 3,
    /// Every rail to the peer is down.
    MR_ERR_PEER_FAILED = 4,
    /// The peer closed its endpoint.
    MR_ERR_PEER_CLOSED = 5,
    /// The message was longer than the buffer: the status has its full
    /// length; nothing was written to the buffer.
    MR_ERR_TRUNCATED = 6,
    /// No such rank (or this rank itself).
    MR_ERR_NO_SUCH_PEER = 7,
    MR_ERR_TIMEOUT = 8,
    /// The endpoint is shut down.
    MR_ERR_SHUTDOWN = 9,
    MR_ERR_IO = 10,
    /// A bug in multirail (a caught panic); the message says where.
    MR_ERR_INTERNAL = 11,
}

/// Who sent a received message, its tag and its full length in bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct mr_status {
    pub source: u32,
    pub tag: u64,
    pub len: u64,
}

/// One process's endpoint (opaque).
pub struct mr_endpoint {
    ep: Arc<Endpoint>,
}

/// A send or receive in progress (opaque).
pub struct mr_request {
    ep: Arc<Endpoint>,
    req: Option<Detached>,
    /// Where a receive's data goes, and how much fits there.
    dst: *mut u8,
    cap: usize,
    /// A receive into `mr_alloc` memory, handed to multirail in place.
    in_place: bool,
    /// A send that lent the caller's buffer: set when it is theirs again.
    lent: Option<Arc<memory::Returned>>,
}

impl Drop for mr_request {
    /// A lent send's buffer is the caller's again only once multirail let
    /// go of it: freeing the request waits for that.
    fn drop(&mut self) {
        if let Some(back) = self.lent.take() {
            // The send's own completion comes first (without it the
            // buffer could be held until the endpoint closes).
            if let Some(d) = self.req.take()
                && let Ok(r) = self.ep.attach(d)
            {
                let _ = match r {
                    Request::Send(s) => s.wait().map(|_| ()),
                    Request::Recv(v) => v.wait().map(|_| ()),
                };
            }
            back.wait_on(&self.ep);
        }
    }
}

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last(msg: &str) {
    let c = CString::new(msg.replace('\0', "\\0")).expect("NULs replaced");
    LAST.with(|l| *l.borrow_mut() = c);
}

/// The message of the last failed call on this thread ("" if none yet).
/// Valid until the next failing call on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn mr_last_error() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// A short constant name for a code: "MR_ERR_TRUNCATED".
#[unsafe(no_mangle)]
pub extern "C" fn mr_err_name(code: mr_err) -> *const c_char {
    let s: &'static CStr = match code {
        mr_err::MR_OK => c"MR_OK",
        mr_err::MR_ERR_INVALID_ARGUMENT => c"MR_ERR_INVALID_ARGUMENT",
        mr_err::MR_ERR_CONFIG => c"MR_ERR_CONFIG",
        mr_err::MR_ERR_SETUP => c"MR_ERR_SETUP",
        mr_err::MR_ERR_PEER_FAILED => c"MR_ERR_PEER_FAILED",
        mr_err::MR_ERR_PEER_CLOSED => c"MR_ERR_PEER_CLOSED",
        mr_err::MR_ERR_TRUNCATED => c"MR_ERR_TRUNCATED",
        mr_err::MR_ERR_NO_SUCH_PEER => c"MR_ERR_NO_SUCH_PEER",
        mr_err::MR_ERR_TIMEOUT => c"MR_ERR_TIMEOUT",
        mr_err::MR_ERR_SHUTDOWN => c"MR_ERR_SHUTDOWN",
        mr_err::MR_ERR_IO => c"MR_ERR_IO",
        mr_err::MR_ERR_INTERNAL => c"MR_ERR_INTERNAL",
    };
    s.as_ptr()
}

/// A failure: its code and message.
struct Fail(mr_err, String);

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        let code = match &e {
            Error::Config(_) => mr_err::MR_ERR_CONFIG,
            Error::Setup(_) => mr_err::MR_ERR_SETUP,
            Error::PeerFailed(_) => mr_err::MR_ERR_PEER_FAILED,
            Error::PeerClosed(_) => mr_err::MR_ERR_PEER_CLOSED,
            Error::Truncated { .. } => mr_err::MR_ERR_TRUNCATED,
            Error::NoSuchPeer(_) => mr_err::MR_ERR_NO_SUCH_PEER,
            Error::Timeout => mr_err::MR_ERR_TIMEOUT,
            Error::Shutdown => mr_err::MR_ERR_SHUTDOWN,
            Error::Io(_) => mr_err::MR_ERR_IO,
        };
        Fail(code, e.to_string())
    }
}

fn invalid(msg: impl Into<String>) -> Fail {
    Fail(mr_err::MR_ERR_INVALID_ARGUMENT, msg.into())
}

/// Runs `f`, turning its failure or panic into a code and a message.
fn guard(what: &str, f: impl FnOnce() -> Result<(), Fail>) -> mr_err {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => mr_err::MR_OK,
        Ok(Err(Fail(code, msg))) => {
            set_last(&format!("{what}: {msg}"));
            code
        }
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last(&format!("{what}: internal error (please report): {msg}"));
            mr_err::MR_ERR_INTERNAL
        }
    }
}

/// `p` as a reference, or a failure naming `name`.
///
/// # Safety
/// `p` is NULL or points to a live `T`.
unsafe fn obj<'a, T>(p: *const T, name: &str) -> Result<&'a T, Fail> {
    // SAFETY: the caller passes NULL or a valid pointer.
    unsafe { p.as_ref() }.ok_or_else(|| invalid(format!("{name} is NULL")))
}

fn out<T>(p: *mut T, name: &str, v: T) -> Result<(), Fail> {
    if p.is_null() {
        return Err(invalid(format!("{name} is NULL")));
    }
    // SAFETY: non-NULL; the caller passes a writable pointer.
    unsafe { p.write(v) };
    Ok(())
}

/// A C string argument; NULL gives `None`.
///
/// # Safety
/// `s` is NULL or a NUL-terminated string.
unsafe fn opt_str<'a>(s: *const c_char, name: &str) -> Result<Option<&'a str>, Fail> {
    if s.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL, NUL-terminated by contract.
    let c = unsafe { CStr::from_ptr(s) };
    c.to_str().map(Some).map_err(|_| invalid(format!("{name} is not UTF-8: {c:?}")))
}

/// # Safety
/// `buf` points to `len` readable bytes (or `len` is 0).
unsafe fn slice<'a>(buf: *const u8, len: usize) -> Result<&'a [u8], Fail> {
    if len == 0 {
        return Ok(&[]);
    }
    if buf.is_null() {
        return Err(invalid(format!("buffer is NULL but its length is {len}")));
    }
    // SAFETY: checked non-NULL; `len` readable bytes by contract.
    Ok(unsafe { std::slice::from_raw_parts(buf, len) })
}

fn src_tag(src: u32, tag: u64) -> (Option<u32>, Option<u64>) {
    ((src != MR_ANY_SOURCE).then_some(src), (tag != MR_ANY_TAG).then_some(tag))
}

fn status(st: multirail::Status) -> mr_status {
    mr_status { source: st.peer, tag: st.tag, len: st.len }
}

// ----- endpoints -----

/// An endpoint for a process started by `multirail run`, mpirun or srun:
/// settings from the `MULTIRAIL_*` variables, rank, size and meeting point
/// from the launcher (as the `multirail` command does).
///
/// # Safety
/// `out` is a writable pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mr_endpoint_from_env(out_ep: *mut *mut mr_endpoint) -> mr_err {
    guard("mr_endpoint_from_env", || {
        let ep = Endpoint::from_env()?;
        out(out_ep, "out", Box::into_raw(Box::new(mr_endpoint { ep: Arc::new(ep) })))
    })
}

/// An endpoint with explicit rails (`"tcp:127.0.0.1,tcp:127.0.0.2"`, as
/// `MULTIRAIL_RAILS`; NULL for the default), `rank` of `size`, and `root`
/// (`"host:port"`: rank 0 listens there, the others connect there; NULL
/// only when `size` is 1). `key` (NULL: none) authenticates the rails;
/// every rank must pass the same. Other settings come from the
/// `MULTIRAIL_*` variables.
///
/// # Safety
/// Strings are NULL or NUL-terminated; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mr_endpoint_create(
    rails: *const c_char,
    rank: u32,
    size: u32,
    root: *const c_char,
    key: *const c_char,
    out_ep: *mut *mut mr_endpoint,
) -> mr_err {
    guard("mr_endpoint_create", || {
        // SAFETY: by contract.
        let (rails, root, key) = unsafe { (opt_str(rails, "rails")?, opt_str(root, "root")?, opt_str(key, "key")?) };
        let mut b = Builder::new(Config::from_env()?).rank(rank, size);
        if let Some(r) = rails {
            b = b.rails(r);
        }
        if let Some(k) = key {
            b = b.key(k.as_bytes());
        }
        if let Some(r) = root {
            let addr = r
                .to_socket_addrs()
                .map_err(|e| Fail(mr_err::MR_ERR_CONFIG, format!("root {r:?} is not host:port ({e})")))?
                .next()
                .ok_or_else(|| Fail(mr_err::MR_ERR_CONFIG, format!("root {r:?} resolves to no address")))?;
            b = if rank == 0 {
                let l = TcpListener::bind(addr)
                    .map_err(|e| Fail(mr_err::MR_ERR_SETUP, format!("rank 0 cannot listen on root {r}: {e}")))?;
                b.root_listener(l)
            } else {
                b.root(addr)
            };
        } else if size > 1 {
            return Err(Fail(mr_err::MR_ERR_CONFIG, format!("a job of {size} ranks needs root (\"host:port\")")));
        }
        let ep = b.build()?;
        out(out_ep, "out", Box::into_raw(Box::new(mr_endpoint { ep: Arc::new(ep) })))
    })
}

/// This process's rank.
///
/// # Safety
/// `ep` is NULL or an endpoint; `rank` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mr_endpoint_rank(ep: *const mr_endpoint, rank: *mut u32) -> mr_err {
    // SAFETY: by contract.
    guard("mr_endpoint_rank", || out(rank, "rank", unsafe { obj(ep, "ep") }?.ep.rank()))
}

/// The number of ranks of the job.
///
/// # Safety
/// `ep` is NULL or an endpoint; `size` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mr_endpoint_size(ep: *const mr_endpoint, size: *mut u32) -> mr_err {
    // SAFETY: by contract.
    guard("mr_endpoint_size", || out(size, "size", unsafe { obj(ep, "ep") }?.ep.size()))
}

/// Waits until everything sent was delivered, closes the rails and frees
/// `ep`. Refused (`MR_ERR_INVALID_ARGUMENT`, `ep` stays usable) while
/// requests of `ep` are not yet waited for or freed. NULL is accepted.
///
/// # Safety
/// `ep` is NULL or an endpoint not used after this call succeeds.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mr_endpoint_close(ep: *mut mr_endpoint) -> mr_err {
    guard("mr_endpoint_close", || {
        if ep.is_null() {
            return Ok(());
        }
        // SAFETY: a pointer from Box::into_raw, by contract.
        let open = Arc::strong_count(&unsafe { &*ep }.ep) - 1;
        if open > 0 {
            return Err(invalid(format!("{open} requests are still open: wait for or free them first")));
        }
        // SAFETY: as above; not used by the caller afterwards.
        let b = unsafe { Box::from_raw(ep) };
        let ep = Arc::into_inner(b.ep).expect("no request holds it");
        Ok(ep.close()?)
    })
}

/// Returns once every rank has called `mr_barrier`.
///
/// # Safety
/// `ep` is NULL or an endpoint.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mr_barrier(ep: *const mr_endpoint) -> mr_err {
    // SAFETY: by contract.
    guard("mr_barrier", || Ok(unsafe { obj(ep, "ep") }?.ep.barrier()?))
}

// ----- blocking -----

/// Sends `len` bytes at `buf` to rank `peer` with `tag` (below 2^63).
/// The data is copied: `buf` is free again when this returns.
///
/// # Safety
/// `ep` is NULL or an endpoint; `buf` has `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mr_send(ep: *const mr_endpoint, peer: u32, tag: u64, buf: *const u8, len: usize) -> mr_err {
    guard("mr_send", || {
        // SAFETY: by contract.
        let (ep, data) = unsafe { (obj(ep, "ep")?, slice(buf, len)?) };
        Ok(ep.ep.send(peer, tag, data)?)
    })
}

/// Receives a message from `src` (or `MR_ANY_SOURCE`) with `tag` (or
/// `MR_ANY_TAG`) into `buf` of `cap` bytes; `st` (may be NULL) gets who
/// sent it, its tag and its length. A longer message gives
/// `MR_ERR_TRUNCATED`, nothing written to `buf`, and its full length in
/// `st->len` (the message is consumed).
///
/// # Safety
/// `ep` is NULL or an endpoint; `buf` has `cap` writable bytes; `st` is
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mr_recv(
    ep: *const mr_endpoint,
    src: u32,
    tag: u64,
    buf: *mut u8,
    cap: usize,
    st: *mut mr_status,
) -> mr_err {
    let mut req = std::ptr::null_mut();
    // SAFETY: by contract.
    let code = unsafe { mr_irecv(ep, src, tag, buf, cap, &mut req) };
    if code != mr_err::MR_OK {
        return code;
    }
    // SAFETY: `req` comes from mr_irecv; `st` by contract.
    unsafe { mr_wait(req, st) }
}

// ----- memory -----

/// `*out` = `len` zeroed bytes that receives fill in place: a receive
/// into this memory (from its first byte, any `cap` up to `len`) hands the
/// memory itself to multirail, so the message is not copied. Use it like
/// any buffer; free it with `mr_free`.
///
/// # Safety
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mr_alloc(len: usize, out_ptr: *mut *mut u8) -> mr_err {
    guard("mr_alloc", || {
        if len == 0 {
            return Err(invalid("len is 0"));
        }
        out(out_ptr, "out", memory::alloc(len))
    })
}

/// Frees memory from `mr_alloc` (NULL is accepted). Refused while a
/// receive into it is pending, and for good after a pending receive into
/// it was freed with `mr_request_free` (multirail may still write it).
///
/// # Safety
/// `ptr` is NULL or from `mr_alloc`, not used after this call succeeds.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mr_free(ptr: *mut u8) -> mr_err {
    guard("mr_free", || if ptr.is_null() { Ok(()) } else { memory::free(ptr).map_err(invalid) })
}

// ----- non-blocking -----

fn start(
    ep: &mr_endpoint,
    r: Request<'_>,
    out_req: *mut *mut mr_request,
    fill: impl FnOnce(&mut mr_request),
) -> Result<(), Fail> {
    let mut req = Box::new(mr_request {
        ep: ep.ep.clone(),
        req: Some(r.detach()),
        dst: std::ptr::null_mut(),
        cap: 0,
        in_place: false,
        lent: None,
    });
    fill(&mut req);
    out(out_req, "req", Box::into_raw(req))
}

/// Starts sending `len` bytes at `buf`; `*req` is the request to test or
/// wait on. A message shorter than 64 KiB is copied (`buf` is free again
/// when this returns); a longer one is sent from `buf` itself, which must
/// stay unchanged until `mr_wait`, `mr_wait_all` or `mr_request_free`
/// returns for the request (they wait until multirail let go of it).
///
/// # Safety
/// `ep` is NULL or an endpoint; `buf` has `len` readable bytes, unchanged
/// until the request is waited for or freed when `len` >= 64 KiB; `req`
/// is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mr_isend(
    ep: *const mr_endpoint,
    peer: u32,
    tag: u64,
    buf: *const u8,
    len: usize,
    req: *mut *mut mr_request,
) -> mr_err {
    guard("mr_isend", || {
        // SAFETY: by contract.
        let (ep, data) = unsafe { (obj(ep, "ep")?, slice(buf, len)?) };
        if data.len() < memory::LEND_FROM {
            let r = ep.ep.isend(peer, tag, Bytes::copy_from_slice(data))?;
            return start(ep, r.into(), req, |_| {});
        }
        // SAFETY: `data` stays unchanged until the flag is set (contract;
        // mr_wait and mr_request_free wait for it).
        let (bytes, back) = unsafe { memory::lend(data.as_ptr(), data.len()) };
        let r = ep.ep.isend(peer, tag, bytes)?;
        start(ep, r.into(), req, |q| q.lent = Some(back))
    })
}

/// Posts a receive into `buf` of `cap` bytes; `*req` is the request.
/// `buf` must stay valid until the request is waited for or freed. Into
/// memory from `mr_alloc` (from its first byte) the message lands in
/// place; into other memory it is copied when the request is waited for.
///
/// # Safety
/// `ep` is NULL or an endpoint; `buf` has `cap` writable bytes until the
/// request completes; `req` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mr_irecv(
    ep: *const mr_endpoint,
    src: u32,
    tag: u64,
    buf: *mut u8,
    cap: usize,
    req: *mut *mut mr_request,
) -> mr_err {
    guard("mr_irecv", || {
        // SAFETY: by contract.
        let ep = unsafe { obj(ep, "ep")? };
        if buf.is_null() && cap > 0 {
            return Err(invalid(format!("buffer is NULL but its capacity is {cap}")));
        }
        let (s, t) = src_tag(src, tag);
        let (mem, in_place) = match memory::take(buf, cap) {
            Some(m) => (m, true),
            None => (BytesMut::zeroed(cap), false),
        };
        let r = match ep.ep.irecv(s, t, mem) {
            Ok(r) => r,
            Err(e) => {
                if in_place {
                    // The buffer went with the failed call: copy mode.
                    memory::give_back(buf, BytesMut::new(), 0);
                }
                return Err(e.into());
            }
        };
        start(ep, r.into(), req, |q| {
            q.dst = buf;
            q.cap = cap;
            q.in_place = in_place;
        })
    })
}

/// Sets `*done` to 1 if the request finished (then `mr_wait` returns at
/// once), else 0.
///
/// # Safety
/// `req` is NULL or a request; `done` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mr_test(req: *mut mr_request, done: *mut i32) -> mr_err {
    guard("mr_test", || {
        // SAFETY: by contract.
        let r = unsafe { req.as_mut() }.ok_or_else(|| invalid("req is NULL"))?;
        let d = r.req.take().ok_or_else(|| invalid("the request already finished"))?;
        let a = r.ep.attach(d)?;
        let finished = match &a {
            Request::Send(s) => s.test(),
            Request::Recv(v) => v.test(),
        };
        r.req = Some(a.detach());
        out(done, "done", i32::from(finished))
    })
}

/// Waits for `req`, frees it, and returns its outcome; a receive's status
/// goes to `st` (may be NULL; untouched for a send).
fn finish(req: *mut mr_request, st: *mut mr_status) -> Result<(), Fail> {
    if req.is_null() {
        return Err(invalid("req is NULL"));
    }
    // SAFETY: a pointer from Box::into_raw (by contract), freed here.
    let mut r = unsafe { Box::from_raw(req) };
    let d = r.req.take().ok_or_else(|| invalid("the request already finished"))?;
    match r.ep.attach(d)? {
        Request::Send(s) => {
            let res = s.wait();
            if let Some(back) = r.lent.take() {
                back.wait_on(&r.ep);
            }
            Ok(res?)
        }
        Request::Recv(v) => {
            // Memory from mr_alloc is given back on every way out.
            let give_back = |buf: BytesMut, n: usize| {
                if r.in_place {
                    memory::give_back(r.dst, buf, n);
                }
            };
            let (buf, res) = match v.wait_with_buffer(None) {
                Ok(x) => x,
                Err(e) => {
                    give_back(BytesMut::new(), 0);
                    return Err(e.into());
                }
            };
            let (stat, res) = match res {
                Ok(s) => (s, Ok(())),
                // The core delivers nothing of a message too long for its
                // buffer: nothing is copied.
                Err(Error::Truncated { status, buf_len }) => (status, Err(Error::Truncated { status, buf_len })),
                Err(e) => {
                    give_back(buf, 0);
                    return Err(e.into());
                }
            };
            let n = if res.is_ok() { (stat.len as usize).min(r.cap).min(buf.len()) } else { 0 };
            if r.in_place {
                give_back(buf, n);
            } else if n > 0 {
                // SAFETY: `dst` has `cap` writable bytes (mr_irecv's contract).
                unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), r.dst, n) };
            }
            if !st.is_null() {
                // SAFETY: non-NULL and writable by contract.
                unsafe { st.write(status(stat)) };
            }
            Ok(res?)
        }
    }
}

/// Waits for `req` to finish and frees it. For a receive, the data is in
/// its buffer and `st` (may be NULL) gets the status.
///
/// # Safety
/// `req` is NULL or a request, not used after this call; `st` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mr_wait(req: *mut mr_request, st: *mut mr_status) -> mr_err {
    guard("mr_wait", || finish(req, st))
}

/// Waits for `n` requests and frees them all; `sts` (may be NULL) has `n`
/// entries for their statuses. Returns the first failure (by position).
///
/// # Safety
/// `reqs` has `n` requests (NULL entries are skipped); `sts` is NULL or
/// has `n` writable entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mr_wait_all(reqs: *mut *mut mr_request, n: usize, sts: *mut mr_status) -> mr_err {
    guard("mr_wait_all", || {
        if reqs.is_null() && n > 0 {
            return Err(invalid("reqs is NULL"));
        }
        let mut first = Ok(());
        for i in 0..n {
            // SAFETY: `n` entries by contract.
            let slot = unsafe { &mut *reqs.add(i) };
            let req = std::mem::replace(slot, std::ptr::null_mut());
            if req.is_null() {
                continue;
            }
            // SAFETY: only reached with `sts` non-NULL, and then it has `n`
            // entries by contract; `i < n`, so `sts.add(i)` stays inside
            // that array (`finish` writes through it only if non-NULL).
            let st = if sts.is_null() { std::ptr::null_mut() } else { unsafe { sts.add(i) } };
            if let Err(Fail(c, m)) = finish(req, st)
                && first.is_ok()
            {
                first = Err(Fail(c, format!("request {i}: {m}")));
            }
        }
        first
    })
}

/// Frees a request without waiting for it (a send still goes out; a
/// receive's data, when it comes, is dropped). NULL is accepted.
///
/// # Safety
/// `req` is NULL or a request, not used after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mr_request_free(req: *mut mr_request) -> mr_err {
    guard("mr_request_free", || {
        if !req.is_null() {
            // SAFETY: from Box::into_raw, by contract.
            drop(unsafe { Box::from_raw(req) });
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_its_name() {
        for (c, n) in [(mr_err::MR_OK, "MR_OK"), (mr_err::MR_ERR_TRUNCATED, "MR_ERR_TRUNCATED")] {
            // SAFETY: static C strings.
            assert_eq!(unsafe { CStr::from_ptr(mr_err_name(c)) }.to_str().unwrap(), n);
        }
    }

    #[test]
    fn a_panic_becomes_internal_with_its_message() {
        let code = guard("here", || panic!("boom"));
        assert_eq!(code, mr_err::MR_ERR_INTERNAL);
        // SAFETY: from mr_last_error.
        let msg = unsafe { CStr::from_ptr(mr_last_error()) }.to_str().unwrap().to_owned();
        assert!(msg.contains("here") && msg.contains("boom"), "{msg}");
    }
}
