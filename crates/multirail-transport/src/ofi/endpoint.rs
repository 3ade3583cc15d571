//! Opening an RDM endpoint: provider selection (`fi_getinfo` hints), the
//! fabric, domain, completion queue, address vector and endpoint, memory
//! registration. One [`OfiEndpoint`] per (peer, rail): it owns every
//! object it opened and closes them in reverse order.

use std::ffi::{CString, c_void};
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::ptr;

use multirail_ofi_sys as sys;

use super::{OfiError, c_string, check, malloc_string, shmname};
use crate::spec::OfiTarget as Selector;

/// The `prov_name`s to try for a provider as users name it: the
/// RDM-capable stack first. On 1.x, tcp and verbs reach FI_EP_RDM only
/// through the ofi_rxm utility provider; on 2.x tcp offers it alone.
pub fn prov_names(provider: &str) -> Vec<String> {
    match provider {
        "tcp" | "verbs" => vec![format!("{provider};ofi_rxm"), provider.to_string()],
        _ => vec![provider.to_string()],
    }
}

/// The reverse of [`prov_names`]: what to write in a spec.
pub fn short_name(prov_name: &str) -> &str {
    prov_name.strip_suffix(";ofi_rxm").unwrap_or(prov_name)
}

/// The owner of an `fi_info` list.
pub(crate) struct Info(*mut sys::fi_info);

impl Info {
    pub(crate) fn iter(&self) -> impl Iterator<Item = &sys::fi_info> {
        let mut next = self.0;
        std::iter::from_fn(move || {
            // SAFETY: the list is owned by self, each `next` is null or a
            // valid entry, and the borrow ends before self is dropped.
            let entry = unsafe { next.as_ref()? };
            next = entry.next;
            Some(entry)
        })
    }
}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: self.0 came from fi_getinfo or fi_allocinfo (or is null,
        // which fi_freeinfo accepts), and is freed exactly once.
        unsafe { sys::fi_freeinfo(self.0) };
    }
}

/// What `fi_getinfo` is asked for.
pub(crate) struct Hints {
    prov_name: Option<String>,
    domain: Option<String>,
    node: Option<IpAddr>,
    /// Receives that match only the peer's address (FI_DIRECTED_RECV).
    directed: bool,
    /// RMA reads of what the peer lends, and of what we lend it
    /// (FI_RMA, FI_READ, FI_REMOTE_READ).
    rma: bool,
}

impl Hints {
    /// Any RDM provider with FI_MSG (for listing).
    pub(crate) fn any() -> Hints {
        Hints { prov_name: None, domain: None, node: None, directed: false, rma: false }
    }
}

/// The `mr_mode` bits the rail can follow: it registers its bounce
/// buffers once (FI_MR_LOCAL), binds registrations to the endpoint where
/// asked (FI_MR_ENDPOINT), and gives the peer the address and key of what
/// it lends as the provider wants them (FI_MR_VIRT_ADDR, FI_MR_PROV_KEY).
fn supported_mr_mode() -> i32 {
    (sys::FI_MR_LOCAL | sys::FI_MR_VIRT_ADDR | sys::FI_MR_ALLOCATED | sys::FI_MR_PROV_KEY | sys::FI_MR_ENDPOINT) as i32
}

/// `fi_getinfo` for an RDM endpoint with in-order sends.
pub(crate) fn getinfo(hints: &Hints) -> Result<Info, OfiError> {
    // SAFETY: fi_allocinfo returns a zeroed fi_info with its attribute
    // structs allocated, or null (checked).
    let h = Info(unsafe { sys::mr_ofi_allocinfo() });
    if h.0.is_null() {
        return Err(OfiError { call: "fi_allocinfo", code: -(sys::FI_ENOMEM as i64) });
    }
    let dup = |s: &str| malloc_string(s).map_err(|_| OfiError { call: "strdup", code: -(sys::FI_EINVAL as i64) });
    // SAFETY: h.0 and its attributes were just allocated and are ours;
    // strings are malloc'd because fi_freeinfo frees them.
    unsafe {
        let i = &mut *h.0;
        i.caps = u64::from(sys::FI_MSG) | if hints.directed { sys::FI_DIRECTED_RECV } else { 0 };
        if hints.rma {
            i.caps |= u64::from(sys::FI_RMA | sys::FI_READ | sys::FI_REMOTE_READ);
        }
        // Each operation owns an fi_context2 (see stream.rs).
        i.mode = sys::FI_CONTEXT | sys::FI_CONTEXT2;
        (*i.ep_attr).type_ = sys::FI_EP_RDM;
        (*i.tx_attr).msg_order = sys::FI_ORDER_SAS;
        (*i.rx_attr).msg_order = sys::FI_ORDER_SAS;
        (*i.domain_attr).mr_mode = supported_mr_mode();
        // Each endpoint has its own domain, used by one thread at a time.
        (*i.domain_attr).threading = sys::FI_THREAD_DOMAIN;
        if let Some(p) = &hints.prov_name {
            (*i.fabric_attr).prov_name = dup(p)?;
        }
        if let Some(d) = &hints.domain {
            (*i.domain_attr).name = dup(d)?;
        }
    }
    let node = hints.node.map(|ip| CString::new(ip.to_string()).expect("an address has no NUL"));
    let (node_ptr, flags) = match &node {
        Some(n) => (n.as_ptr(), sys::FI_SOURCE),
        None => (ptr::null(), 0),
    };
    let mut info = ptr::null_mut();
    // SAFETY: node is null or a live C string, hints is valid, and the
    // returned list is owned by the Info below.
    let ret = unsafe { sys::fi_getinfo(sys::FI_API_VERSION, node_ptr, ptr::null(), flags, h.0, &mut info) };
    check("fi_getinfo", ret)?;
    Ok(Info(info))
}

/// Finds the first provider entry matching `sel`, trying the provider
/// stacks of [`Selector::prov_names`] in order, directed receives first,
/// each with RMA first (when `rma`). Returns it with whether receives are
/// directed and whether it has RMA.
fn select(sel: &Selector, rma: bool) -> Result<(Info, bool, bool), String> {
    let mut last = None;
    for prov_name in prov_names(&sel.provider) {
        for directed in [true, false] {
            for rma in [true, false].into_iter().filter(|&r| rma || !r) {
                let hints = Hints {
                    prov_name: Some(prov_name.clone()),
                    domain: sel.domain.clone(),
                    node: sel.node,
                    directed,
                    rma,
                };
                match getinfo(&hints) {
                    Ok(info) => return Ok((info, directed, rma)),
                    Err(e) => last = Some(e),
                }
            }
        }
    }
    let what = match (&sel.node, &sel.domain) {
        (Some(ip), _) => format!(" bound to {ip}"),
        (_, Some(d)) => format!(" in domain {d}"),
        _ => String::new(),
    };
    Err(format!(
        "libfabric provider '{}'{what} offers no reliable-datagram (FI_EP_RDM) endpoint with in-order messages here ({}); \
         `multirail info` lists the usable providers and domains",
        sel.provider,
        last.map_or_else(String::new, |e| e.to_string())
    ))
}

/// An enabled RDM endpoint with its own fabric, domain, CQ and AV.
pub struct OfiEndpoint {
    info: Info,
    fabric: *mut sys::fid_fabric,
    domain: *mut sys::fid_domain,
    cq: *mut sys::fid_cq,
    av: *mut sys::fid_av,
    ep: *mut sys::fid_ep,
    mrs: Vec<*mut sys::fid_mr>,
    wait_fd: Option<RawFd>,
    directed: bool,
    /// Opened with FI_RMA: it may lend and read lent payloads.
    rma: bool,
    /// The file in /dev/shm behind an `shm` endpoint (see [`shmname`]).
    shm_file: Option<String>,
}

// SAFETY: the endpoint's objects live in a domain of their own, opened
// with FI_THREAD_DOMAIN, and are only used through `&mut self` (the rail
// sits behind a lock), so one thread at a time calls into them; no handle
// is tied to the thread that opened it.
unsafe impl Send for OfiEndpoint {}

impl OfiEndpoint {
    /// Opens and enables an endpoint for `sel`, with RMA if `rma` and the
    /// provider has it. The CQ gets an fd to wait on where the provider
    /// offers one (`FI_WAIT_FD`) and `wait_fd` asks for it, else none.
    pub fn open(sel: &Selector, rma: bool, wait_fd: bool) -> Result<OfiEndpoint, String> {
        let libfabric = super::lock();
        let (info, directed, rma) = select(sel, rma)?;
        let mut this = OfiEndpoint {
            info,
            fabric: ptr::null_mut(),
            domain: ptr::null_mut(),
            cq: ptr::null_mut(),
            av: ptr::null_mut(),
            ep: ptr::null_mut(),
            mrs: Vec::new(),
            wait_fd: None,
            directed,
            rma,
            shm_file: None,
        };
        let opened = this.open_objects(wait_fd);
        // On failure `this` is dropped on return, and its Drop closes what
        // was opened under the lock: release it first (it is not reentrant;
        // holding it there hung the process for good).
        drop(libfabric);
        opened.map_err(|e| format!("libfabric provider {}: {e}", this.provider()))?;
        Ok(this)
    }

    fn open_objects(&mut self, wait_fd: bool) -> Result<(), OfiError> {
        let info = self.info.0;
        // SAFETY: info is the first entry of a list from fi_getinfo; every
        // out-pointer is a field of self, closed in Drop (nulls skipped);
        // attribute structs are zeroed (each field's default) then filled.
        unsafe {
            check("fi_fabric", sys::fi_fabric((*info).fabric_attr, &mut self.fabric, ptr::null_mut()))?;
            check("fi_domain", sys::mr_ofi_domain(self.fabric, info, &mut self.domain, ptr::null_mut()))?;
            self.open_cq(wait_fd)?;
            let mut av_attr: sys::fi_av_attr = std::mem::zeroed();
            av_attr.type_ = sys::FI_AV_TABLE;
            av_attr.count = 1;
            check("fi_av_open", sys::mr_ofi_av_open(self.domain, &mut av_attr, &mut self.av, ptr::null_mut()))?;
            check("fi_endpoint", sys::mr_ofi_endpoint(self.domain, info, &mut self.ep, ptr::null_mut()))?;
            let both = u64::from(sys::FI_TRANSMIT | sys::FI_RECV);
            check("fi_ep_bind(cq)", sys::mr_ofi_ep_bind(self.ep, self.cq.cast(), both))?;
            check("fi_ep_bind(av)", sys::mr_ofi_ep_bind(self.ep, self.av.cast(), 0))?;
            self.name_shm_file()?;
            check("fi_enable", sys::mr_ofi_enable(self.ep))?;
        }
        Ok(())
    }

    /// Gives an `shm` endpoint a name of multirail's own before it is
    /// enabled, after removing the files dead processes left (see
    /// [`shmname`] for why the provider's default name is not safe).
    fn name_shm_file(&mut self) -> Result<(), OfiError> {
        if self.provider() != "shm" {
            return Ok(());
        }
        shmname::reclaim(std::path::Path::new(shmname::SHM_DIR));
        let file = shmname::next_file_name();
        let address = CString::new(shmname::address_of(&file)).expect("a name has no NUL");
        let bytes = address.as_bytes_with_nul();
        // SAFETY: the endpoint is open and not yet enabled; the provider
        // copies the NUL-terminated name (bytes.len() counts the NUL).
        let ret = unsafe { sys::mr_ofi_setname(self.ep.cast(), bytes.as_ptr().cast_mut().cast(), bytes.len()) };
        check("fi_setname", ret)?;
        self.shm_file = Some(file);
        Ok(())
    }

    /// Removes the file behind an `shm` endpoint that stays open but will
    /// not be used again (see [`shmname::unlink`]); nothing for others.
    pub fn unlink_shm_file(&mut self) {
        if let Some(file) = self.shm_file.take() {
            shmname::unlink(&file);
        }
    }

    /// A CQ with a wait fd if asked and the provider has one, else without.
    fn open_cq(&mut self, wait_fd: bool) -> Result<(), OfiError> {
        for wait in [sys::FI_WAIT_FD, sys::FI_WAIT_NONE] {
            if wait == sys::FI_WAIT_FD && !wait_fd {
                continue;
            }
            // SAFETY: zeroed attributes are the defaults; cq is ours.
            let ret = unsafe {
                let mut attr: sys::fi_cq_attr = std::mem::zeroed();
                attr.format = sys::FI_CQ_FORMAT_MSG;
                attr.wait_obj = wait;
                attr.size = 256;
                sys::mr_ofi_cq_open(self.domain, &mut attr, &mut self.cq, ptr::null_mut())
            };
            if ret != 0 {
                if wait == sys::FI_WAIT_NONE {
                    check("fi_cq_open", ret)?;
                }
                continue;
            }
            if wait == sys::FI_WAIT_FD {
                let mut fd: std::ffi::c_int = -1;
                // SAFETY: FI_GETWAIT on a CQ opened with FI_WAIT_FD writes
                // one int (the fd) to arg.
                let ret = unsafe {
                    sys::mr_ofi_control(self.cq.cast(), sys::FI_GETWAIT as i32, (&mut fd as *mut i32).cast())
                };
                if ret == 0 && fd >= 0 {
                    self.wait_fd = Some(fd);
                } else {
                    // No fd after all: start again without a wait object.
                    // SAFETY: cq was just opened and nothing is bound to it.
                    unsafe { sys::mr_ofi_close(self.cq.cast()) };
                    self.cq = ptr::null_mut();
                    continue;
                }
            }
            return Ok(());
        }
        Ok(())
    }

    /// `prov_name` of the chosen provider, e.g. `tcp;ofi_rxm`.
    pub fn provider(&self) -> String {
        // SAFETY: fabric_attr is allocated in an fi_getinfo entry.
        c_string(unsafe { (*(*self.info.0).fabric_attr).prov_name })
    }

    /// The domain's name, e.g. `lo`.
    pub fn domain_name(&self) -> String {
        // SAFETY: domain_attr is allocated in an fi_getinfo entry.
        c_string(unsafe { (*(*self.info.0).domain_attr).name })
    }

    /// Whether receives match only the peer's address.
    pub fn directed(&self) -> bool {
        self.directed
    }

    /// Most bytes one `fi_inject` takes (`tx_attr->inject_size`; 0 if the
    /// provider has no inject).
    pub fn inject_size(&self) -> usize {
        // SAFETY: tx_attr is allocated in an fi_getinfo entry.
        unsafe { (*(*self.info.0).tx_attr).inject_size }
    }

    /// The fd the CQ signals on, if the provider gave one.
    pub fn wait_fd(&self) -> Option<RawFd> {
        self.wait_fd
    }

    /// The file in /dev/shm behind an `shm` endpoint, while it has one.
    pub fn shm_file(&self) -> Option<&str> {
        self.shm_file.as_deref()
    }

    /// Whether the provider asks for local buffers to be registered.
    pub fn needs_mr_local(&self) -> bool {
        self.mr_mode() & sys::FI_MR_LOCAL as i32 != 0
    }

    /// The endpoint's address as `fi_getname` gives it.
    pub fn address(&self) -> Result<Vec<u8>, OfiError> {
        let _libfabric = super::lock();
        let mut buf = vec![0u8; 256];
        loop {
            let mut len = buf.len();
            // SAFETY: buf has len writable bytes; ep is enabled.
            let ret = unsafe { sys::mr_ofi_getname(self.ep.cast(), buf.as_mut_ptr().cast(), &mut len) };
            if ret == -(sys::FI_ETOOSMALL as i32) && len > buf.len() && len <= 1 << 16 {
                buf.resize(len, 0);
                continue;
            }
            check("fi_getname", ret)?;
            buf.truncate(len);
            return Ok(buf);
        }
    }

    /// Inserts the peer's address (from its `fi_getname`) into the AV.
    pub fn insert_peer(&mut self, address: &[u8]) -> Result<sys::fi_addr_t, OfiError> {
        let _libfabric = super::lock();
        let mut addr: sys::fi_addr_t = sys::FI_ADDR_NOTAVAIL;
        // SAFETY: address holds bytes the peer says are one address of this
        // provider's format; providers validate the format (a malformed
        // one fails the insert); addr receives one fi_addr_t.
        let ret = unsafe { sys::mr_ofi_av_insert(self.av, address.as_ptr().cast(), 1, &mut addr, 0, ptr::null_mut()) };
        if ret != 1 || addr == sys::FI_ADDR_NOTAVAIL {
            return Err(OfiError { call: "fi_av_insert", code: i64::from(ret.min(-1)) });
        }
        Ok(addr)
    }

    /// Whether the endpoint was opened with RMA (FI_RMA, FI_READ,
    /// FI_REMOTE_READ).
    pub fn rma(&self) -> bool {
        self.rma
    }

    fn mr_mode(&self) -> i32 {
        // SAFETY: domain_attr is allocated in an fi_getinfo entry.
        unsafe { (*(*self.info.0).domain_attr).mr_mode }
    }

    /// Registers `buf` for local use (`access`: FI_SEND, FI_RECV,
    /// FI_READ...) if the provider asks for it; returns the descriptor to
    /// pass with it (null otherwise).
    ///
    /// # Safety
    /// `buf` must stay allocated, and not move, until this endpoint is
    /// dropped (which closes the registration first).
    pub unsafe fn register(&mut self, buf: &mut [u8], access: u64) -> Result<*mut c_void, OfiError> {
        let _libfabric = super::lock();
        // SAFETY: the caller's promise; the lock is held.
        unsafe { self.register_locked(buf, access) }
    }

    /// [`OfiEndpoint::register`] for a caller that holds the libfabric lock.
    ///
    /// # Safety
    /// As for [`OfiEndpoint::register`].
    pub unsafe fn register_locked(&mut self, buf: &mut [u8], access: u64) -> Result<*mut c_void, OfiError> {
        if !self.needs_mr_local() {
            return Ok(ptr::null_mut());
        }
        let key = self.mrs.len() as u64 + 1;
        // SAFETY: the caller keeps buf alive and in place while registered
        // (this endpoint closes it before it is freed); keys 1.. are this
        // function's, unique within this endpoint's own domain.
        let mr = unsafe { self.reg(buf.as_ptr(), buf.len(), access, key)? };
        self.mrs.push(mr);
        // SAFETY: mr was just opened.
        Ok(unsafe { sys::mr_ofi_mr_desc(mr) })
    }

    /// Registers `len` bytes at `ptr` for the peer to read (FI_REMOTE_READ)
    /// under `key` (unless the provider picks keys): returns the
    /// registration, and the address and key the peer reads them with.
    /// The caller closes it ([`OfiEndpoint::close_mr`]) before the memory
    /// goes.
    ///
    /// # Safety
    /// The memory must stay allocated, and not move, until the registration
    /// is closed; `key` must not be one of a registration still open.
    pub unsafe fn register_lent(
        &mut self,
        ptr: *const u8,
        len: usize,
        key: u64,
    ) -> Result<(*mut sys::fid_mr, u64, u64), OfiError> {
        // SAFETY: the caller's promises.
        let mr = unsafe { self.reg(ptr, len, u64::from(sys::FI_REMOTE_READ), key)? };
        let mode = self.mr_mode();
        // SAFETY: mr was just opened.
        let key = if mode & sys::FI_MR_PROV_KEY as i32 != 0 { unsafe { sys::mr_ofi_mr_key(mr) } } else { key };
        let addr = if mode & sys::FI_MR_VIRT_ADDR as i32 != 0 { ptr as u64 } else { 0 };
        Ok((mr, addr, key))
    }

    /// Closes a registration of [`OfiEndpoint::register_lent`].
    ///
    /// # Safety
    /// `mr` is open, from this endpoint, and not used afterwards.
    pub unsafe fn close_mr(&mut self, mr: *mut sys::fid_mr) {
        // SAFETY: the caller's promise.
        unsafe { sys::mr_ofi_close(mr.cast()) };
    }

    /// `fi_mr_reg`, then bind and enable where the provider asks
    /// (FI_MR_ENDPOINT). The caller holds the libfabric lock.
    ///
    /// # Safety
    /// As for [`OfiEndpoint::register_lent`].
    unsafe fn reg(&mut self, ptr: *const u8, len: usize, access: u64, key: u64) -> Result<*mut sys::fid_mr, OfiError> {
        let mut mr = ptr::null_mut();
        // SAFETY: the caller's promises on ptr/len/key; mr receives the
        // registration.
        unsafe {
            let ret = sys::mr_ofi_mr_reg(self.domain, ptr.cast(), len, access, 0, key, 0, &mut mr, ptr::null_mut());
            check("fi_mr_reg", ret)?;
            if self.mr_mode() & sys::FI_MR_ENDPOINT as i32 != 0 {
                let bound = check("fi_mr_bind", sys::mr_ofi_mr_bind(mr, self.ep.cast(), 0))
                    .and_then(|_| check("fi_mr_enable", sys::mr_ofi_mr_enable(mr)));
                if let Err(e) = bound {
                    sys::mr_ofi_close(mr.cast());
                    return Err(e);
                }
            }
        }
        Ok(mr)
    }

    pub(crate) fn ep(&self) -> *mut sys::fid_ep {
        self.ep
    }

    pub(crate) fn cq(&self) -> *mut sys::fid_cq {
        self.cq
    }

    pub(crate) fn fabric(&self) -> *mut sys::fid_fabric {
        self.fabric
    }
}

impl Drop for OfiEndpoint {
    fn drop(&mut self) {
        let _libfabric = super::lock();
        let mut fids: Vec<*mut sys::fid> = vec![self.ep.cast()];
        fids.extend(self.mrs.iter().map(|m| m.cast::<sys::fid>()));
        fids.extend([self.av.cast(), self.cq.cast(), self.domain.cast(), self.fabric.cast()]);
        for fid in fids {
            if !fid.is_null() {
                // SAFETY: each fid was opened here and is closed once, the
                // endpoint first (ending its operations), then what it used.
                unsafe { sys::mr_ofi_close(fid) };
            }
        }
    }
}
