//! The libfabric (`ofi`) rail, behind the `ofi` cargo feature.
//!
//! A rail `ofi:PROVIDER[:DOMAIN_OR_ADDRESS]` is, per peer, one `FI_EP_RDM`
//! endpoint of its own (fabric, domain, completion queue, address vector)
//! that talks to exactly one peer endpoint, plus the authenticated TCP
//! connection it was set up over (the *side channel*), which afterwards
//! only says whether the peer is alive. The protocol core's frames travel
//! as a byte stream ([`OfiStream`]) chopped into `fi_send` messages of at
//! most [`CHUNK`] bytes, so the framing, validation and limits of
//! [`crate::tcp::StreamRail`] apply unchanged: an `ofi` rail is a
//! `StreamRail<OfiStream>`.
//!
//! * [`endpoint`] opens the libfabric objects for an [`OfiTarget`];
//! * [`stream`] is the byte stream: bounce buffers registered once
//!   (where the provider's `mr_mode` asks for `FI_MR_LOCAL`), receives
//!   pre-posted, completions read from the CQ, its wait fd (when the
//!   provider gives one) and the side channel behind one epoll fd; large
//!   payloads lent and pulled with `fi_read` where both sides have RMA
//!   (its "RMA: lent payloads" section);
//! * [`shmname`] names `shm` endpoints' files in /dev/shm and removes
//!   those of dead processes;
//! * [`list_providers`] is what `multirail info` prints.
//!
//! Setup order (both sides, after HELLO): [`endpoint::OfiEndpoint::open`],
//! send our [`endpoint::OfiEndpoint::address`] over the side channel, read
//! the peer's, then [`OfiStream::new`], which inserts it, posts the
//! receives and waits for the peer's "ready" on the side channel.
//!
//! This is the only module besides `shm` with `unsafe` code (the FFI);
//! every block carries a `// SAFETY:` comment.

pub mod credit;
pub mod endpoint;
pub mod shmname;
pub mod stream;

use std::ffi::{CStr, CString, c_char};
use std::fmt;
use std::io;

use multirail_ofi_sys as sys;

pub use crate::spec::OfiTarget;
pub use endpoint::OfiEndpoint;
pub use stream::OfiStream;

/// The rail type: frames over an [`OfiStream`].
pub type OfiRail = crate::tcp::StreamRail<OfiStream>;

/// Bytes per `fi_send` (and per pre-posted receive buffer).
pub const CHUNK: usize = 64 << 10;

/// Every call into libfabric holds this process-wide lock. Each rail
/// connection has its own fabric and domain (`FI_THREAD_DOMAIN`), which
/// by the specification needs no lock across domains; but libfabric 1.17
/// crashed here (SIGSEGV inside the library) when threads used different
/// domains at once: closing an `ofi:tcp` endpoint while others ran, and
/// two `ofi:shm` ranks in one process. Serializing the calls (each is
/// short and non-blocking) avoids that at the price of parallelism
/// between `ofi` rails of one process.
static LIBFABRIC: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub(crate) fn lock() -> std::sync::MutexGuard<'static, ()> {
    LIBFABRIC.lock().unwrap_or_else(|p| p.into_inner())
}

/// Puts the default action back on SIGSEGV, SIGBUS, SIGILL and SIGFPE.
///
/// Debian's libfabric loads libinfinipath (its `psm` provider), whose
/// load-time constructor installs handlers for these signals that print a
/// backtrace and exit with status 1, so a crash looks like an ordinary
/// failure (and, for `multirail bench`, like a failed validation). A
/// program that wants a crash to be reported as one (killed by the
/// signal, core dump as configured) calls this first thing in `main`;
/// the library itself leaves the process's handlers alone.
pub fn default_crash_signals() {
    for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE] {
        // SAFETY: SIG_DFL is always a valid disposition, and these
        // signals are not used by this program for anything else.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
}

/// A failed libfabric call: which one and its `-FI_E*` code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfiError {
    pub call: &'static str,
    pub code: i64,
}

impl fmt::Display for OfiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let errno = i32::try_from(self.code.unsigned_abs()).unwrap_or(i32::MAX);
        // SAFETY: fi_strerror accepts any int and returns a pointer to a
        // static NUL-terminated string.
        let text = unsafe { CStr::from_ptr(sys::fi_strerror(errno)) };
        write!(f, "{} failed: {} ({})", self.call, self.code, text.to_string_lossy())
    }
}

impl std::error::Error for OfiError {}

impl From<OfiError> for io::Error {
    fn from(e: OfiError) -> io::Error {
        io::Error::other(e.to_string())
    }
}

/// `Ok(ret)` for zero or a positive count, else the error of `call`.
pub(crate) fn check(call: &'static str, ret: impl Into<i64>) -> Result<i64, OfiError> {
    let ret = ret.into();
    if ret < 0 { Err(OfiError { call, code: ret }) } else { Ok(ret) }
}

/// `-FI_EAGAIN` as the data-transfer calls return it.
pub(crate) const EAGAIN: isize = -(sys::FI_EAGAIN as isize);

/// A C string owned by Rust, or "" for null.
pub(crate) fn c_string(ptr: *const c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: libfabric's names are NUL-terminated and live as long as the
    // fi_info holding them, which the caller keeps alive.
    unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
}

/// `strdup`: strings inside `fi_info` hints are freed by `fi_freeinfo`.
pub(crate) fn malloc_string(s: &str) -> Result<*mut c_char, String> {
    let s = CString::new(s).map_err(|_| format!("'{}' contains a NUL byte", s.escape_debug()))?;
    // SAFETY: s is a valid C string; strdup copies it into malloc'd memory.
    let copy = unsafe { libc::strdup(s.as_ptr()) };
    if copy.is_null() { Err("out of memory".into()) } else { Ok(copy) }
}

/// One usable RDM provider and domain, as `multirail info` lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderInfo {
    /// `fabric_attr->prov_name`, e.g. `tcp;ofi_rxm`.
    pub provider: String,
    /// `domain_attr->name`, e.g. `lo` or `mlx5_0`.
    pub domain: String,
    /// `fabric_attr->name`, e.g. `127.0.0.0/8`.
    pub fabric: String,
    /// The rail spec that selects it, e.g. `ofi:tcp:lo`.
    pub spec: String,
}

/// Every provider/domain pair offering `FI_EP_RDM` with `FI_MSG` here
/// (what the `ofi` rail can use), in libfabric's order, without repeats.
pub fn list_providers() -> Result<Vec<ProviderInfo>, String> {
    let info = endpoint::getinfo(&endpoint::Hints::any())
        .map_err(|e| if e.code == -(sys::FI_ENODATA as i64) { String::new() } else { e.to_string() });
    let info = match info {
        Ok(info) => info,
        Err(e) if e.is_empty() => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out: Vec<ProviderInfo> = Vec::new();
    for entry in info.iter() {
        // SAFETY: entries of a list returned by fi_getinfo always have
        // their fabric and domain attributes allocated.
        let (provider, fabric, domain) = unsafe {
            (
                c_string((*entry.fabric_attr).prov_name),
                c_string((*entry.fabric_attr).name),
                c_string((*entry.domain_attr).name),
            )
        };
        let short = endpoint::short_name(&provider);
        let spec = format!("ofi:{short}:{domain}");
        let item = ProviderInfo { provider, domain, fabric, spec };
        if !out.contains(&item) {
            out.push(item);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The handler each crash signal has now.
    fn handler(sig: i32) -> libc::sighandler_t {
        // SAFETY: a zeroed sigaction is a valid out-buffer; a null new
        // action only reads the current one.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            assert_eq!(libc::sigaction(sig, std::ptr::null(), &mut old), 0);
            old.sa_sigaction
        }
    }

    #[test]
    fn crash_signals_get_their_default_action_back() {
        // In a program linked with libfabric something else holds SIGSEGV
        // at start (libinfinipath's constructor, or Rust's stack-overflow
        // guard where nothing else did).
        assert_ne!(handler(libc::SIGSEGV), libc::SIG_DFL, "the premise: SIGSEGV has a handler");
        default_crash_signals();
        for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE] {
            assert_eq!(handler(sig), libc::SIG_DFL, "signal {sig}");
        }
    }

    #[test]
    fn the_tcp_provider_is_listed_with_its_spec() {
        let list = list_providers().expect("fi_getinfo");
        let tcp = list.iter().find(|p| p.provider == "tcp;ofi_rxm").expect("tcp;ofi_rxm is in every 1.x build");
        assert!(tcp.spec.starts_with("ofi:tcp:"), "{tcp:?}");
        assert!(!tcp.domain.is_empty());
    }

    #[test]
    fn errors_name_the_call_and_the_code() {
        let e = check("fi_send", -(sys::FI_EAGAIN as i64)).unwrap_err();
        let text = e.to_string();
        assert!(text.starts_with("fi_send failed: -11 ("), "{text}");
        assert_eq!(check("fi_recv", 3), Ok(3));
    }
}
