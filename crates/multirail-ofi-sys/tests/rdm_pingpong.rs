//! Smoke test of the bindings and the C shim: in one process, two FI_EP_RDM
//! endpoints of one provider exchange addresses (fi_getname, fi_av_insert)
//! and ping-pong 8 B and 1 MiB messages both ways, untagged and (where the
//! provider offers FI_TAGGED) tagged, polling their completion queues with
//! bounded loops, then close everything. Buffers are registered when the
//! provider's `mr_mode` asks for FI_MR_LOCAL.
//!
//! Providers: `tcp;ofi_rxm` on 127.0.0.1 (required: Debian's libfabric has
//! it), and `shm` (skipped, with the reason printed, where absent).

#[cfg(not(mr_ofi_found))]
#[test]
fn skipped_without_libfabric() {
    eprintln!("skipped: multirail-ofi-sys was built without libfabric (see its build warning)");
}

#[cfg(mr_ofi_found)]
mod common;

#[cfg(mr_ofi_found)]
mod pingpong {
    use std::ffi::c_void;
    use std::ptr;
    use std::time::{Duration, Instant};

    use multirail_ofi_sys::*;

    use super::common::{Info, Request, c_string, check, describe, get_rdm_info, info_to_string};

    /// Message sizes: one that any provider sends eagerly, one that needs
    /// its large-message (rendezvous) path.
    const SIZES: [usize; 2] = [8, 1 << 20];
    /// Round trips per size and kind of operation.
    const ROUNDS: usize = 4;
    /// Bounds of every wait for a completion.
    const WAIT_TIME: Duration = Duration::from_secs(20);
    const WAIT_POLLS: usize = 50_000_000;
    /// Completion entries read per fi_cq_read.
    const CQ_BATCH: usize = 8;

    /// An fi_info list, the fabric and the domain opened from its first
    /// entry. Closed in reverse order of opening.
    struct Domain {
        info: Info,
        fabric: *mut fid_fabric,
        domain: *mut fid_domain,
        /// Register buffers even where the provider does not ask for it, so
        /// that fi_mr_reg/fi_mr_desc/fi_close(mr) run on every machine.
        register_always: bool,
    }

    impl Domain {
        fn open(info: Info) -> Domain {
            let mut fabric = ptr::null_mut();
            let mut domain = ptr::null_mut();
            // SAFETY: info.0 is a valid, non-empty fi_info list from
            // fi_getinfo; the out-pointers are valid; the objects are closed
            // in Drop before the info is freed.
            unsafe {
                check("fi_fabric", fi_fabric((*info.0).fabric_attr, &mut fabric, ptr::null_mut()));
                let mut this = Domain { info, fabric, domain: ptr::null_mut(), register_always: false };
                check("fi_domain", mr_ofi_domain(fabric, this.info.0, &mut domain, ptr::null_mut()));
                this.domain = domain;
                this
            }
        }

        fn info(&self) -> &fi_info {
            // SAFETY: the list is owned by self and outlives the borrow.
            unsafe { &*self.info.0 }
        }

        /// Whether the provider asks for local memory registration.
        fn needs_mr_local(&self) -> bool {
            // SAFETY: domain_attr is always allocated in a returned fi_info.
            let mode = unsafe { (*self.info().domain_attr).mr_mode };
            mode & FI_MR_LOCAL as i32 != 0
        }

        fn has_tagged(&self) -> bool {
            self.info().caps & u64::from(FI_TAGGED) != 0
        }
    }

    impl Drop for Domain {
        fn drop(&mut self) {
            // SAFETY: each fid was opened by Domain::open (or is null) and
            // every endpoint using the domain was dropped before (the tests
            // declare the Domain first, so it drops last).
            unsafe {
                if !self.domain.is_null() {
                    check("fi_close(domain)", mr_ofi_close(self.domain.cast()));
                }
                if !self.fabric.is_null() {
                    check("fi_close(fabric)", mr_ofi_close(self.fabric.cast()));
                }
            }
        }
    }

    /// A completion this test waits for: the op's context pointer and what
    /// the completion entry said.
    #[derive(Clone, Copy, Debug)]
    struct Completion {
        context: *mut c_void,
        len: usize,
        tag: u64,
    }

    /// An RDM endpoint with its own completion queue (transmit and receive)
    /// and address vector.
    struct Endpoint {
        name: &'static str,
        ep: *mut fid_ep,
        cq: *mut fid_cq,
        av: *mut fid_av,
        /// The other endpoint, as inserted into `av`.
        peer: fi_addr_t,
        done: Vec<Completion>,
    }

    impl Endpoint {
        fn open(domain: &Domain, name: &'static str) -> Endpoint {
            let mut this = Endpoint {
                name,
                ep: ptr::null_mut(),
                cq: ptr::null_mut(),
                av: ptr::null_mut(),
                peer: FI_ADDR_UNSPEC,
                done: Vec::new(),
            };
            // SAFETY: attribute structs are zeroed (every field's "default")
            // and then filled; the domain and info outlive the endpoint;
            // out-pointers are valid; objects are closed in Drop.
            unsafe {
                let mut cq_attr: fi_cq_attr = std::mem::zeroed();
                cq_attr.format = FI_CQ_FORMAT_TAGGED;
                cq_attr.wait_obj = FI_WAIT_NONE;
                cq_attr.size = 128;
                check("fi_cq_open", mr_ofi_cq_open(domain.domain, &mut cq_attr, &mut this.cq, ptr::null_mut()));

                let mut av_attr: fi_av_attr = std::mem::zeroed();
                av_attr.type_ = FI_AV_TABLE;
                av_attr.count = 4;
                check("fi_av_open", mr_ofi_av_open(domain.domain, &mut av_attr, &mut this.av, ptr::null_mut()));

                check("fi_endpoint", mr_ofi_endpoint(domain.domain, domain.info.0, &mut this.ep, ptr::null_mut()));
                let both = u64::from(FI_TRANSMIT | FI_RECV);
                check("fi_ep_bind(cq)", mr_ofi_ep_bind(this.ep, this.cq.cast(), both));
                check("fi_ep_bind(av)", mr_ofi_ep_bind(this.ep, this.av.cast(), 0));
                if c_string((*domain.info().fabric_attr).prov_name) == "shm" {
                    this.name_shm_file();
                }
                check("fi_enable", mr_ofi_enable(this.ep));
            }
            this
        }

        /// Names an `shm` endpoint's file in /dev/shm (`fi_setname`, before
        /// `fi_enable`) so that no file another process left can collide:
        /// the provider's default, `<pid>:<uid>:<n>`, makes `fi_enable`
        /// fail with -FI_EBUSY when a dead process with this pid left one.
        fn name_shm_file(&mut self) {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
            let name = format!("fi_shm://multirail-ofisys-{}-{nanos}-{}", std::process::id(), self.name);
            let name = std::ffi::CString::new(name).unwrap();
            let bytes = name.as_bytes_with_nul();
            // SAFETY: the endpoint is open and not enabled; the provider
            // copies the NUL-terminated name.
            check("fi_setname", unsafe {
                mr_ofi_setname(self.ep.cast(), bytes.as_ptr().cast_mut().cast(), bytes.len())
            });
            let address = self.address();
            assert!(
                address.starts_with(&bytes[..bytes.len() - 1]),
                "fi_getname does not give the name set: {:?}",
                String::from_utf8_lossy(&address)
            );
        }

        /// The endpoint's address, as fi_getname returns it.
        fn address(&self) -> Vec<u8> {
            let mut buf = vec![0u8; 512];
            let mut len = buf.len();
            // SAFETY: buf has len writable bytes; ep is open.
            let ret = unsafe { mr_ofi_getname(self.ep.cast(), buf.as_mut_ptr().cast(), &mut len) };
            check("fi_getname", ret);
            assert!(len <= buf.len(), "address of {len} bytes");
            buf.truncate(len);
            buf
        }

        fn insert_peer(&mut self, address: &[u8]) {
            let mut addr: fi_addr_t = FI_ADDR_NOTAVAIL;
            // SAFETY: address holds one address in the provider's format (it
            // came from fi_getname on the same provider); addr receives it.
            let ret = unsafe { mr_ofi_av_insert(self.av, address.as_ptr().cast(), 1, &mut addr, 0, ptr::null_mut()) };
            assert_eq!(ret, 1, "{}", describe("fi_av_insert", ret));
            assert_ne!(addr, FI_ADDR_NOTAVAIL);
            self.peer = addr;
        }

        /// Reads every available completion into `done`. Returns how many.
        fn poll(&mut self) -> usize {
            let mut entries = [fi_cq_tagged_entry {
                op_context: ptr::null_mut(),
                flags: 0,
                len: 0,
                buf: ptr::null_mut(),
                data: 0,
                tag: 0,
            }; CQ_BATCH];
            // SAFETY: entries has room for CQ_BATCH entries of the CQ's
            // format (FI_CQ_FORMAT_TAGGED).
            let ret = unsafe { mr_ofi_cq_read(self.cq, entries.as_mut_ptr().cast(), CQ_BATCH) };
            if ret == -(FI_EAGAIN as isize) {
                return 0;
            }
            if ret == -(FI_EAVAIL as isize) {
                self.fail_with_error_entry();
            }
            let count = usize::try_from(check("fi_cq_read", ret)).expect("non-negative");
            for entry in &entries[..count] {
                self.done.push(Completion { context: entry.op_context, len: entry.len, tag: entry.tag });
            }
            count
        }

        fn fail_with_error_entry(&mut self) -> ! {
            // SAFETY: fi_cq_err_entry is plain data; zero (err_data null,
            // err_data_size 0) asks the provider for no error data buffer.
            let mut err: fi_cq_err_entry = unsafe { std::mem::zeroed() };
            // SAFETY: err is a valid entry to fill; flags 0.
            let ret = unsafe { mr_ofi_cq_readerr(self.cq, &mut err, 0) };
            check("fi_cq_readerr", ret);
            let mut text = [0 as std::ffi::c_char; 256];
            // SAFETY: text is a writable buffer of the given length; the
            // returned string lives in text or in the provider.
            let detail = c_string(unsafe {
                mr_ofi_cq_strerror(self.cq, err.prov_errno, err.err_data, text.as_mut_ptr(), text.len())
            });
            panic!("{}: completion error: {} (provider: {detail})", self.name, describe("operation", -(err.err)));
        }

        /// Removes and returns the completion of `context`, if it arrived.
        fn take(&mut self, context: *mut c_void) -> Option<Completion> {
            let at = self.done.iter().position(|c| c.context == context)?;
            Some(self.done.swap_remove(at))
        }
    }

    impl Drop for Endpoint {
        fn drop(&mut self) {
            // SAFETY: each fid was opened by Endpoint::open (or is null);
            // the endpoint goes first, then what it was bound to.
            unsafe {
                for (what, fid) in [
                    ("fi_close(ep)", self.ep.cast::<fid>()),
                    ("fi_close(av)", self.av.cast::<fid>()),
                    ("fi_close(cq)", self.cq.cast::<fid>()),
                ] {
                    if !fid.is_null() {
                        let ret = mr_ofi_close(fid);
                        if !std::thread::panicking() {
                            check(what, ret);
                        }
                    }
                }
            }
        }
    }

    /// Polls both endpoints (manual-progress providers move data only
    /// inside calls) until `sender` has the completion of `send_ctx` and
    /// `receiver` that of `recv_ctx`; bounded in polls and time.
    fn wait_pair(
        sender: &mut Endpoint,
        send_ctx: *mut c_void,
        receiver: &mut Endpoint,
        recv_ctx: *mut c_void,
    ) -> (Completion, Completion) {
        let deadline = Instant::now() + WAIT_TIME;
        let (mut sent, mut received) = (None, None);
        for poll in 0..WAIT_POLLS {
            sender.poll();
            receiver.poll();
            sent = sent.or_else(|| sender.take(send_ctx));
            received = received.or_else(|| receiver.take(recv_ctx));
            if let (Some(s), Some(r)) = (sent, received) {
                return (s, r);
            }
            if poll % 1024 == 0 && Instant::now() > deadline {
                break;
            }
        }
        panic!(
            "{} -> {}: no completion within {WAIT_TIME:?} / {WAIT_POLLS} polls (send done: {}, receive done: {})",
            sender.name,
            receiver.name,
            sent.is_some(),
            received.is_some()
        );
    }

    /// Retries a post while it returns -FI_EAGAIN, progressing both CQs in
    /// between; bounded in tries and time.
    fn post(what: &str, a: &mut Endpoint, b: &mut Endpoint, mut op: impl FnMut() -> isize) {
        let deadline = Instant::now() + WAIT_TIME;
        for _ in 0..WAIT_POLLS {
            let ret = op();
            if ret != -(FI_EAGAIN as isize) {
                check(what, ret);
                return;
            }
            a.poll();
            b.poll();
            if Instant::now() > deadline {
                break;
            }
        }
        panic!("{what}: still -FI_EAGAIN after {WAIT_TIME:?}");
    }

    /// A message buffer, registered with the domain when the provider asks.
    struct Buffer {
        bytes: Vec<u8>,
        mr: *mut fid_mr,
        desc: *mut c_void,
    }

    impl Buffer {
        fn new(domain: &Domain, len: usize, key: u64) -> Buffer {
            let mut this = Buffer { bytes: vec![0; len], mr: ptr::null_mut(), desc: ptr::null_mut() };
            if domain.needs_mr_local() || domain.register_always {
                let access = u64::from(FI_SEND | FI_RECV);
                // SAFETY: the region is this Vec's heap allocation, which
                // never moves or shrinks while registered (closed in Drop
                // before the Vec is freed); key is unique per domain.
                unsafe {
                    let ret = mr_ofi_mr_reg(
                        domain.domain,
                        this.bytes.as_ptr().cast(),
                        len,
                        access,
                        0,
                        key,
                        0,
                        &mut this.mr,
                        ptr::null_mut(),
                    );
                    check("fi_mr_reg", ret);
                    this.desc = mr_ofi_mr_desc(this.mr);
                }
            }
            this
        }
    }

    impl Drop for Buffer {
        fn drop(&mut self) {
            if !self.mr.is_null() {
                // SAFETY: mr was registered by Buffer::new and no operation
                // on the buffer is outstanding once a test drops it.
                let ret = unsafe { mr_ofi_close(self.mr.cast()) };
                if !std::thread::panicking() {
                    check("fi_close(mr)", ret);
                }
            }
        }
    }

    /// The payload of message `seq` of `len` bytes: every byte depends on
    /// its position and the message, so a misplaced chunk is caught.
    fn fill(buf: &mut [u8], seq: u64) {
        for (i, byte) in buf.iter_mut().enumerate() {
            let i = i as u64;
            *byte = (i.wrapping_mul(131) ^ (i >> 8) ^ seq.wrapping_mul(17)) as u8;
        }
    }

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Kind {
        Msg,
        Tagged,
    }

    /// One message from `from` to `to`: receive posted first, then the
    /// send; waits for both completions and checks length, tag and bytes.
    fn one_message(domain: &Domain, kind: Kind, from: &mut Endpoint, to: &mut Endpoint, len: usize, seq: u64) {
        let mut send = Buffer::new(domain, len, 2 * seq + 1);
        let mut recv = Buffer::new(domain, len, 2 * seq + 2);
        fill(&mut send.bytes, seq);
        let tag = 0x5eed_0000 + seq;
        // Owned per operation, as FI_CONTEXT/FI_CONTEXT2 mode requires, and
        // boxed so their addresses (the completion's op_context) are stable.
        let mut send_ctx = Box::new(fi_context2 { internal: [ptr::null_mut(); 8] });
        let mut recv_ctx = Box::new(fi_context2 { internal: [ptr::null_mut(); 8] });
        let send_ctx: *mut c_void = (&mut *send_ctx as *mut fi_context2).cast();
        let recv_ctx: *mut c_void = (&mut *recv_ctx as *mut fi_context2).cast();

        let recv_ptr = recv.bytes.as_mut_ptr().cast::<c_void>();
        let send_ptr = send.bytes.as_ptr().cast::<c_void>();
        let (to_ep, from_ep, peer) = (to.ep, from.ep, from.peer);
        // SAFETY (both closures): buffers, descriptors and contexts stay
        // alive and untouched until wait_pair has seen both completions;
        // the endpoints are enabled; peer is an address from this AV.
        post("fi_recv", from, to, || unsafe {
            match kind {
                Kind::Msg => mr_ofi_recv(to_ep, recv_ptr, len, recv.desc, FI_ADDR_UNSPEC, recv_ctx),
                Kind::Tagged => mr_ofi_trecv(to_ep, recv_ptr, len, recv.desc, FI_ADDR_UNSPEC, tag, 0, recv_ctx),
            }
        });
        post("fi_send", from, to, || unsafe {
            match kind {
                Kind::Msg => mr_ofi_send(from_ep, send_ptr, len, send.desc, peer, send_ctx),
                Kind::Tagged => mr_ofi_tsend(from_ep, send_ptr, len, send.desc, peer, tag, send_ctx),
            }
        });
        let (_, got) = wait_pair(from, send_ctx, to, recv_ctx);
        assert_eq!(got.len, len, "{kind:?} {} -> {}: received length", from.name, to.name);
        if kind == Kind::Tagged {
            assert_eq!(got.tag, tag, "received tag");
        }
        assert!(recv.bytes == send.bytes, "{kind:?} {} -> {}: {len} B payload differs", from.name, to.name);
    }

    /// Opens two endpoints on `request`'s provider and ping-pongs. Returns
    /// false (after printing why) when the provider is not available here.
    fn run(request: Request) -> bool {
        let info = match get_rdm_info(&request) {
            Ok(info) => info,
            Err(ret) if ret == -(FI_ENODATA as i32) => {
                eprintln!(
                    "skipped: provider {:?} offers no FI_EP_RDM endpoint here (fi_getinfo: -FI_ENODATA)",
                    request.provider
                );
                return false;
            }
            Err(ret) => panic!("{}", describe("fi_getinfo", ret)),
        };
        if std::env::var_os("MULTIRAIL_OFI_TEST_VERBOSE").is_some() {
            eprintln!("{}", info_to_string(info.0));
        }
        let mut domain = Domain::open(info);
        domain.register_always = request.register_always;
        // SAFETY: fabric_attr and domain_attr are allocated in a returned info.
        let (prov, dom) =
            unsafe { (c_string((*domain.info().fabric_attr).prov_name), c_string((*domain.info().domain_attr).name)) };
        eprintln!(
            "provider {prov}, domain {dom}, tagged: {}, FI_MR_LOCAL asked: {}, registering buffers: {}",
            domain.has_tagged(),
            domain.needs_mr_local(),
            domain.needs_mr_local() || domain.register_always,
        );

        let mut a = Endpoint::open(&domain, "A");
        let mut b = Endpoint::open(&domain, "B");
        let (addr_a, addr_b) = (a.address(), b.address());
        assert_ne!(addr_a, addr_b, "two endpoints, one address");
        a.insert_peer(&addr_b);
        b.insert_peer(&addr_a);

        let mut kinds = vec![Kind::Msg];
        if domain.has_tagged() {
            kinds.push(Kind::Tagged);
        }
        let mut seq = 0u64;
        for &kind in &kinds {
            for len in SIZES {
                for _ in 0..ROUNDS {
                    one_message(&domain, kind, &mut a, &mut b, len, seq);
                    one_message(&domain, kind, &mut b, &mut a, len, seq + 1);
                    seq += 2;
                }
            }
        }
        assert!(a.done.is_empty() && b.done.is_empty(), "unexpected extra completions");
        eprintln!("{prov}: {seq} messages ({kinds:?} x {SIZES:?} B x {ROUNDS} round trips) checked");
        drop((a, b));
        true
    }

    #[test]
    fn tcp_rxm_rdm_pingpong_on_loopback() {
        let ran = run(Request {
            provider: "tcp;ofi_rxm",
            node: Some("127.0.0.1"),
            caps: u64::from(FI_MSG | FI_TAGGED),
            addr_format: FI_SOCKADDR_IN,
            register_always: false,
        });
        // Debian's and upstream's 1.x builds always have tcp and ofi_rxm.
        assert!(ran, "tcp;ofi_rxm must be available");
    }

    #[test]
    fn shm_rdm_pingpong() {
        run(Request {
            provider: "shm",
            node: None,
            caps: u64::from(FI_MSG | FI_TAGGED),
            addr_format: FI_FORMAT_UNSPEC,
            register_always: false,
        });
    }

    /// Neither tcp;ofi_rxm nor shm asks for FI_MR_LOCAL on this machine, so
    /// this run registers every buffer anyway (allowed by fi_mr(3)) to cover
    /// the registration path that verbs or EFA will take.
    #[test]
    fn tcp_rxm_rdm_pingpong_with_registered_buffers() {
        let ran = run(Request {
            provider: "tcp;ofi_rxm",
            node: Some("127.0.0.1"),
            caps: u64::from(FI_MSG | FI_TAGGED),
            addr_format: FI_SOCKADDR_IN,
            register_always: true,
        });
        assert!(ran, "tcp;ofi_rxm must be available");
    }
}
