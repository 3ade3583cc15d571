//! Helpers shared by the integration tests: hints, error text, and an RDM
//! fabric + domain with endpoints that own their CQ and AV. Test code only:
//! it panics on any libfabric error, naming the call.

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::ffi::{CStr, CString, c_void};
use std::ptr;

use multirail_ofi_sys::*;

/// `-ret` as libfabric's error text, with the call that failed.
pub fn describe(what: &str, ret: impl TryInto<i64>) -> String {
    let ret: i64 = ret.try_into().unwrap_or(i64::MIN);
    let code = i32::try_from(ret.unsigned_abs()).unwrap_or(i32::MAX);
    // SAFETY: fi_strerror accepts any int and returns a pointer to a static,
    // NUL-terminated string.
    let text = unsafe { CStr::from_ptr(fi_strerror(code)) };
    format!("{what} failed: {ret} ({})", text.to_string_lossy())
}

/// Panics with the error text unless `ret` is zero or positive.
pub fn check(what: &str, ret: impl TryInto<i64>) -> i64 {
    let ret: i64 = ret.try_into().unwrap_or(i64::MIN);
    assert!(ret >= 0, "{}", describe(what, ret));
    ret
}

/// A NUL-terminated C string owned by Rust, or "" for a null pointer.
pub fn c_string(ptr: *const std::ffi::c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: libfabric's name fields are NUL-terminated strings that live
    // as long as the fi_info that holds them; the caller keeps it alive.
    unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
}

/// `strdup`: strings inside hints are freed by `fi_freeinfo` with free().
pub fn malloc_string(s: &str) -> *mut std::ffi::c_char {
    let s = CString::new(s).expect("no NUL inside");
    // SAFETY: s is a valid NUL-terminated string; strdup copies it into
    // malloc'd memory that fi_freeinfo later frees.
    let copy = unsafe { libc::strdup(s.as_ptr()) };
    assert!(!copy.is_null(), "strdup failed");
    copy
}

/// The owner of an `fi_info` list from `fi_getinfo` or `mr_ofi_allocinfo`.
pub struct Info(pub *mut fi_info);

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: self.0 came from fi_getinfo/mr_ofi_allocinfo (or is null,
        // which fi_freeinfo accepts) and is freed exactly once, here.
        unsafe { fi_freeinfo(self.0) };
    }
}

/// What an RDM test asks a provider for.
pub struct Request<'a> {
    /// `fabric_attr->prov_name`, e.g. "tcp;ofi_rxm" or "shm".
    pub provider: &'a str,
    /// `fi_getinfo`'s node (with `FI_SOURCE`): the local address to bind.
    pub node: Option<&'a str>,
    /// `FI_MSG`, plus `FI_TAGGED` when wanted.
    pub caps: u64,
    /// `info->addr_format`, or `FI_FORMAT_UNSPEC`.
    pub addr_format: u32,
    /// Register message buffers even where `mr_mode` does not ask for it.
    pub register_always: bool,
}

/// The memory registration modes these tests know how to follow.
pub fn supported_mr_mode() -> i32 {
    (FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY) as i32
}

/// `fi_getinfo` for an RDM endpoint, or the error code (`-FI_ENODATA` when
/// no provider matches).
pub fn get_rdm_info(request: &Request) -> Result<Info, i32> {
    // SAFETY: mr_ofi_allocinfo returns a zeroed fi_info with every
    // attribute struct allocated (or null on OOM, checked below).
    let hints = Info(unsafe { mr_ofi_allocinfo() });
    assert!(!hints.0.is_null(), "fi_allocinfo failed");
    // SAFETY: hints.0 and its attribute pointers were just allocated by
    // libfabric and are exclusively ours; strings are malloc'd so that
    // fi_freeinfo can free them.
    unsafe {
        let h = &mut *hints.0;
        h.caps = request.caps;
        // Contexts are fi_context2 values owned by each operation, so both
        // context modes can be granted.
        h.mode = FI_CONTEXT | FI_CONTEXT2;
        h.addr_format = request.addr_format;
        (*h.ep_attr).type_ = FI_EP_RDM;
        (*h.domain_attr).mr_mode = supported_mr_mode();
        (*h.fabric_attr).prov_name = malloc_string(request.provider);
    }
    let node = request.node.map(|n| CString::new(n).expect("no NUL"));
    let (node_ptr, flags) = match &node {
        Some(n) => (n.as_ptr(), FI_SOURCE),
        None => (ptr::null(), 0),
    };
    let mut info: *mut fi_info = ptr::null_mut();
    // SAFETY: node is null or a live C string, service is null, hints is a
    // valid fi_info, and info receives a list we own (freed by Info).
    let ret = unsafe { fi_getinfo(FI_API_VERSION, node_ptr, ptr::null(), flags, hints.0, &mut info) };
    if ret != 0 {
        return Err(ret);
    }
    Ok(Info(info))
}

/// `fi_tostr` of an `fi_info`'s first entry, for test logs.
pub fn info_to_string(info: *const fi_info) -> String {
    // SAFETY: info is a valid fi_info; fi_tostr returns a pointer to a
    // thread-local buffer valid until the next call, copied at once.
    c_string(unsafe { fi_tostr(info.cast::<c_void>(), FI_TYPE_INFO) })
}
