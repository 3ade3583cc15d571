//! PMIx key/value exchange for processes started by a PMIx launcher.
//!
//! This is a bootstrap layer, below multirail's own connection setup: it
//! lets a process started by `mpirun` (Open MPI 4.1 runs a PMIx server and
//! sets `PMIX_RANK`, `PMIX_NAMESPACE` and `PMIX_SERVER_URI*` for each
//! process) or by `srun --mpi=pmix` learn its rank and the job size, publish
//! small blobs (such as its rail addresses) and fetch every other rank's, so
//! ranks find each other without a meeting point of their own.
//!
//! What it promises:
//! * **No build-time dependency on PMIx.** libpmix is loaded at run time
//!   with `dlopen` (via `libloading`): `$MULTIRAIL_PMIX_LIB` if set (only
//!   that path), otherwise `libpmix.so.2`, then `libpmix.so`. One binary uses
//!   PMIx where it is installed and reports [`PmixError::NotFound`] where not.
//!   The library, once loaded, stays loaded for the life of the process.
//! * **Exact bytes.** [`Pmix::put`] stores the value as a PMIx byte object
//!   (`PMIX_BYTE_OBJECT`), so [`Pmix::get`] returns exactly the bytes put,
//!   NULs and empty values included.
//! * **Nothing leaks.** Values PMIx returns are copied and released at once;
//!   a [`Pmix`] calls `PMIx_Finalize` when dropped.
//!
//! The usual sequence is [`Pmix::init`], [`Pmix::put`] (any number),
//! [`Pmix::commit`], [`Pmix::fence`] (every rank), then [`Pmix::get`].
//! The structs are laid out for the PMIx 4.x ABI (checked against the 4.2
//! headers); the calls used are part of the PMIx standard since 2.0.

use std::ffi::{CStr, CString, c_char};
use std::ptr;
use std::sync::OnceLock;

mod ffi;

/// Environment variable naming the exact libpmix to load, overriding the
/// default search of `libpmix.so.2` then `libpmix.so`.
pub const LIB_ENV: &str = "MULTIRAIL_PMIX_LIB";

/// Why a PMIx operation failed.
#[derive(Debug, thiserror::Error)]
pub enum PmixError {
    /// The environment does not show a PMIx launcher (checked before any
    /// library is loaded).
    #[error(
        "not started by a PMIx launcher: PMIX_RANK and PMIX_NAMESPACE are not set \
         (start the program under `mpirun` or `srun --mpi=pmix`)"
    )]
    NotLaunched,
    /// libpmix could not be loaded or lacks a needed symbol; the text names
    /// every library tried and why it failed.
    #[error("libpmix not loadable (set {LIB_ENV} to its path): {0}")]
    NotFound(String),
    /// A PMIx call returned a status other than `PMIX_SUCCESS`.
    #[error("{what} failed: {} (PMIx status {status})", status_text(*status))]
    Call {
        /// The PMIx function, e.g. `"PMIx_Fence"`.
        what: &'static str,
        /// The `pmix_status_t` it returned.
        status: i32,
    },
    /// A key or value was unusable: a key too long or containing NUL, or a
    /// value of an unexpected PMIx type.
    #[error("bad PMIx key or value: {0}")]
    BadValue(String),
}

/// A PMIx client session of this process. `PMIx_Finalize` is called on drop.
///
/// PMIx client calls are thread-safe (the library moves each onto its own
/// progress thread), so a `Pmix` may be shared between threads. Several
/// `Pmix` values may coexist: PMIx counts `PMIx_Init` calls and only the
/// last `PMIx_Finalize` closes the connection to the server.
pub struct Pmix {
    api: &'static ffi::Api,
    me: ffi::Proc,
    namespace: String,
}

impl std::fmt::Debug for Pmix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pmix")
            .field("library", &self.api.path)
            .field("namespace", &self.namespace)
            .field("rank", &self.me.rank)
            .finish()
    }
}

impl Pmix {
    /// True if the environment says a PMIx server launched us (PMIX_RANK and PMIX_NAMESPACE set).
    pub fn detected() -> bool {
        detected_in(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
    }

    /// Loads libpmix (once per process) without starting a session: `Ok`
    /// if [`init`](Self::init) can get as far as calling `PMIx_Init`.
    pub fn loadable() -> Result<(), PmixError> {
        api().map(|_| ())
    }

    /// Loads libpmix and calls PMIx_Init. Err if not detected or not loadable.
    ///
    /// Errors: [`PmixError::NotLaunched`] without the launcher's environment,
    /// [`PmixError::NotFound`] if no libpmix loads, [`PmixError::Call`] if
    /// `PMIx_Init` fails (e.g. the server named in the environment is gone).
    pub fn init() -> Result<Pmix, PmixError> {
        if !Self::detected() {
            return Err(PmixError::NotLaunched);
        }
        let api = api()?;
        let mut me = ffi::Proc { nspace: [0; ffi::MAX_NSLEN + 1], rank: 0 };
        // SAFETY: `me` is a valid, writable pmix_proc_t; no info array is
        // passed (NULL, 0), which PMIx_Init accepts.
        let status = unsafe { (api.init)(&mut me, ptr::null_mut(), 0) };
        check("PMIx_Init", status)?;
        // The nspace array is zero-initialised and PMIx writes at most
        // MAX_NSLEN characters, so it always holds a NUL.
        let len = me.nspace.iter().position(|&c| c == 0).unwrap_or(me.nspace.len());
        let bytes: Vec<u8> = me.nspace[..len].iter().map(|&c| c as u8).collect();
        let namespace = String::from_utf8_lossy(&bytes).into_owned();
        Ok(Pmix { api, me, namespace })
    }

    /// This process's rank in its namespace.
    pub fn rank(&self) -> u32 {
        self.me.rank
    }

    /// This process's namespace (the job's name as PMIx knows it).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Job size (PMIx_Get of PMIX_JOB_SIZE on the wildcard rank of our namespace).
    pub fn size(&self) -> Result<u32, PmixError> {
        let value = self.get_value(ffi::RANK_WILDCARD, ffi::JOB_SIZE)?;
        match value.type_() {
            // SAFETY: the type code says the union holds `uint32`.
            ffi::UINT32 => Ok(unsafe { value.data().uint32 }),
            other => Err(PmixError::BadValue(format!("pmix.job.size has PMIx type {other}, expected PMIX_UINT32"))),
        }
    }

    /// Publishes `value` under `key` for every rank (PMIX_GLOBAL scope).
    ///
    /// The value is stored as a PMIx byte object (`PMIX_BYTE_OBJECT`), which
    /// PMIx copies, so any bytes round-trip. It is visible to other ranks
    /// after [`commit`](Self::commit) and a [`fence`](Self::fence). Keys are
    /// at most 511 bytes without NUL; PMIx reserves keys starting `pmix`.
    pub fn put(&self, key: &str, value: &[u8]) -> Result<(), PmixError> {
        let key = c_key(key)?;
        let bo = ffi::ByteObject {
            // PMIx never writes through it; NULL for an empty value so the
            // library does not see a dangling pointer.
            bytes: if value.is_empty() { ptr::null_mut() } else { value.as_ptr().cast_mut().cast::<c_char>() },
            size: value.len(),
        };
        let mut val = ffi::Value { type_: ffi::BYTE_OBJECT, data: ffi::ValueData { bo } };
        // SAFETY: `key` is NUL-terminated and `val` a valid byte-object
        // value whose bytes outlive the call; PMIx_Put copies the value
        // before it returns (it blocks until its progress thread is done).
        let status = unsafe { (self.api.put)(ffi::GLOBAL, key.as_ptr(), &mut val) };
        check("PMIx_Put", status)
    }

    /// Pushes every value [`put`](Self::put) so far to the local PMIx server.
    pub fn commit(&self) -> Result<(), PmixError> {
        // SAFETY: PMIx_Commit takes no arguments; the session is initialised.
        check("PMIx_Commit", unsafe { (self.api.commit)() })
    }

    /// Collective over every rank of our namespace, collecting the data put so far (PMIX_COLLECT_DATA=true).
    ///
    /// Blocks until every rank of the namespace has called it; afterwards
    /// [`get`](Self::get) answers from the local copy of the data.
    pub fn fence(&self) -> Result<(), PmixError> {
        let all = ffi::Proc { nspace: self.me.nspace, rank: ffi::RANK_WILDCARD };
        let info = ffi::Info::new_bool(ffi::COLLECT_DATA, true);
        // SAFETY: one valid proc and one valid info entry, both living
        // across the (blocking) call.
        let status = unsafe { (self.api.fence)(&all, 1, &info, 1) };
        check("PMIx_Fence", status)
    }

    /// Fetches the value `rank` of our namespace published under `key`.
    ///
    /// Like `PMIx_Get`, this waits for the value if the rank has not made it
    /// available yet; after a [`fence`](Self::fence) it answers locally. A
    /// `PMIX_STRING` value (put by another PMIx client) is returned as its
    /// bytes; any other type is [`PmixError::BadValue`].
    pub fn get(&self, rank: u32, key: &str) -> Result<Vec<u8>, PmixError> {
        let key = c_key(key)?;
        let value = self.get_value(rank, &key)?;
        let data = value.data();
        match value.type_() {
            ffi::BYTE_OBJECT => {
                // SAFETY: the type code says the union holds `bo`.
                let bo = unsafe { data.bo };
                if bo.bytes.is_null() || bo.size == 0 {
                    return Ok(Vec::new());
                }
                // SAFETY: PMIx hands back `size` readable bytes at `bytes`,
                // owned by `value`, which lives until the end of this scope.
                Ok(unsafe { std::slice::from_raw_parts(bo.bytes.cast::<u8>(), bo.size) }.to_vec())
            }
            ffi::STRING => {
                // SAFETY: the type code says the union holds `string`.
                let s = unsafe { data.string };
                if s.is_null() {
                    return Ok(Vec::new());
                }
                // SAFETY: a PMIX_STRING is NUL-terminated and owned by `value`.
                Ok(unsafe { CStr::from_ptr(s) }.to_bytes().to_vec())
            }
            other => Err(PmixError::BadValue(format!(
                "rank {rank} key {key:?} has PMIx type {other}, expected PMIX_BYTE_OBJECT"
            ))),
        }
    }

    fn get_value(&self, rank: u32, key: &CStr) -> Result<OwnedValue, PmixError> {
        let proc_ = ffi::Proc { nspace: self.me.nspace, rank };
        let mut out: *mut ffi::Value = ptr::null_mut();
        // SAFETY: valid proc and NUL-terminated key, no info (NULL, 0), and a
        // writable out-pointer; on success PMIx stores a value the caller owns.
        let status = unsafe { (self.api.get)(&proc_, key.as_ptr(), ptr::null(), 0, &mut out) };
        // Take ownership first so that a value is released even on error.
        let value = OwnedValue { api: self.api, ptr: out };
        check("PMIx_Get", status)?;
        if out.is_null() {
            return Err(PmixError::BadValue(format!("PMIx_Get of {key:?} succeeded but returned no value")));
        }
        Ok(value)
    }
}

impl Drop for Pmix {
    fn drop(&mut self) {
        // SAFETY: this session called PMIx_Init successfully; no info is
        // passed. A failure cannot be reported from drop and leaves nothing
        // for us to clean up.
        let _ = unsafe { (self.api.finalize)(ptr::null(), 0) };
    }
}

/// A `pmix_value_t*` returned by `PMIx_Get`, released on drop the way
/// 4.2's `PMIX_VALUE_RELEASE` does: `PMIx_Value_destruct`, then `free`.
struct OwnedValue {
    api: &'static ffi::Api,
    ptr: *mut ffi::Value,
}

impl OwnedValue {
    fn type_(&self) -> u16 {
        // SAFETY: only called after `get_value` checked `ptr` is non-null;
        // it points to a value PMIx allocated and we own.
        unsafe { (*self.ptr).type_ }
    }

    fn data(&self) -> ffi::ValueData {
        // SAFETY: as in `type_`.
        unsafe { (*self.ptr).data }
    }
}

impl Drop for OwnedValue {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        // SAFETY: `ptr` came from PMIx_Get, which allocates it with
        // malloc/calloc (PMIX_VALUE_CREATE) and hands ownership to us; it is
        // released exactly once, here, by the library's own destructor for
        // its contents and then libc `free` for the struct.
        unsafe {
            (self.api.value_destruct)(self.ptr);
            libc::free(self.ptr.cast());
        }
    }
}

/// Both launcher variables present, as reported by `is_set`.
fn detected_in(is_set: impl Fn(&str) -> bool) -> bool {
    is_set("PMIX_RANK") && is_set("PMIX_NAMESPACE")
}

/// Library names to try, in order: only `explicit` if given.
fn candidates(explicit: Option<String>) -> Vec<String> {
    match explicit {
        Some(path) if !path.is_empty() => vec![path],
        _ => vec!["libpmix.so.2".into(), "libpmix.so".into()],
    }
}

/// The process-wide library, loaded on first use and never unloaded
/// (unloading a library that ran threads is not worth the risk).
static API: OnceLock<Result<ffi::Api, String>> = OnceLock::new();

fn api() -> Result<&'static ffi::Api, PmixError> {
    API.get_or_init(|| ffi::Api::open(&candidates(std::env::var(LIB_ENV).ok())))
        .as_ref()
        .map_err(|e| PmixError::NotFound(e.clone()))
}

fn check(what: &'static str, status: ffi::Status) -> Result<(), PmixError> {
    if status == ffi::SUCCESS { Ok(()) } else { Err(PmixError::Call { what, status }) }
}

fn c_key(key: &str) -> Result<CString, PmixError> {
    if key.is_empty() || key.len() > ffi::MAX_KEYLEN {
        return Err(PmixError::BadValue(format!("key must be 1..={} bytes, got {}", ffi::MAX_KEYLEN, key.len())));
    }
    CString::new(key).map_err(|_| PmixError::BadValue(format!("key {key:?} contains NUL")))
}

/// PMIx's name for `status` if the library is loaded, else a placeholder.
/// Formatting an error never loads the library as a side effect.
fn status_text(status: i32) -> String {
    let Some(Ok(api)) = API.get() else { return "PMIx error".into() };
    // SAFETY: PMIx_Error_string returns NULL or a pointer to a static,
    // NUL-terminated string constant.
    let s = unsafe { (api.error_string)(status) };
    if s.is_null() {
        return "PMIx error".into();
    }
    // SAFETY: non-null, static and NUL-terminated, as above.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_needs_both_variables() {
        assert!(!detected_in(|_| false));
        assert!(!detected_in(|v| v == "PMIX_RANK"));
        assert!(!detected_in(|v| v == "PMIX_NAMESPACE"));
        assert!(detected_in(|v| v == "PMIX_RANK" || v == "PMIX_NAMESPACE"));
    }

    #[test]
    fn init_without_launcher_says_what_to_set() {
        if Pmix::detected() {
            println!("skipping: running inside a PMIx job");
            return;
        }
        let err = Pmix::init().expect_err("init outside a PMIx job must fail");
        assert!(matches!(err, PmixError::NotLaunched));
        let msg = err.to_string();
        assert!(msg.contains("PMIX_RANK") && msg.contains("PMIX_NAMESPACE"), "{msg}");
        assert!(msg.contains("mpirun"), "{msg}");
    }

    #[test]
    fn explicit_library_is_the_only_candidate() {
        assert_eq!(candidates(Some("/opt/pmix/lib/libpmix.so".into())), vec!["/opt/pmix/lib/libpmix.so"]);
        assert_eq!(candidates(Some(String::new())), vec!["libpmix.so.2", "libpmix.so"]);
        assert_eq!(candidates(None), vec!["libpmix.so.2", "libpmix.so"]);
    }

    #[test]
    fn keys_are_checked() {
        assert!(c_key("mr.addr").is_ok());
        assert!(matches!(c_key(""), Err(PmixError::BadValue(_))));
        assert!(matches!(c_key("a\0b"), Err(PmixError::BadValue(_))));
        assert!(matches!(c_key(&"k".repeat(512)), Err(PmixError::BadValue(_))));
        assert!(c_key(&"k".repeat(511)).is_ok());
    }

    #[test]
    fn call_error_names_the_function() {
        let msg = PmixError::Call { what: "PMIx_Fence", status: -46 }.to_string();
        assert!(msg.contains("PMIx_Fence") && msg.contains("-46"), "{msg}");
    }

    /// Loads the installed libpmix, if there is one, and resolves every symbol.
    #[test]
    fn installed_library_resolves() {
        let installed = ["/usr/lib/x86_64-linux-gnu/libpmix.so.2", "/usr/lib64/libpmix.so.2", "/usr/lib/libpmix.so.2"]
            .iter()
            .any(|p| std::path::Path::new(p).exists());
        if !installed {
            println!("skipping: no libpmix.so.2 installed");
            return;
        }
        if let Err(e) = ffi::Api::open(&candidates(None)) {
            panic!("libpmix is installed but did not load: {e}");
        }
    }
}
