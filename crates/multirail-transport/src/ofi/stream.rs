//! [`OfiStream`]: a non-blocking, ordered byte stream over one RDM
//! endpoint talking to one peer, the [`ByteStream`] under an `ofi` rail.
//!
//! Writes are copied into one of [`SLOTS`] send buffers of [`CHUNK`]
//! bytes and posted with `fi_send`; a slot is free again once its send
//! completes. [`SLOTS`] receive buffers of [`CHUNK`] bytes are posted
//! ahead. With `FI_ORDER_SAS` the k-th message matches the k-th posted
//! receive, so reads take bytes from the receive slots in posting order
//! (whatever order their completions come in) and re-post each slot once
//! it is read out. A message is posted only on a credit: each starts with
//! an 8-byte header returning the receives its sender posted again, so no
//! message reaches the peer without a receive posted for it
//! ([`super::credit`]). Both pools are registered once, when the provider asks
//! (`FI_MR_LOCAL`).
//!
//! # RMA: lent payloads
//!
//! Where both endpoints were opened with `FI_RMA` (and lending is on,
//! `MULTIRAIL_OFI_RMA`), large payloads do not go through the bounce
//! buffers: [`ByteStream::lend`] registers the payload for remote reads
//! (`FI_REMOTE_READ`, one registration per payload) and the stream
//! carries only a [`LENT_DESC`]-byte descriptor (address, length, key).
//! The reader pulls it with `fi_read` in pieces of at most [`READ_CHUNK`]
//! bytes into [`READ_SLOTS`] read buffers of its own, several pieces and
//! payloads at once, and copies each piece into the frame's destination
//! as it comes ([`ByteStream::lent_poll`], oldest first). A payload read
//! out is counted in the second half of the header of our next message
//! (a header-only message when no other goes); the lender closes the
//! registrations of the payloads counted, oldest first, and only then
//! lets them go. The read buffers are the stream's own, kept with the
//! endpoint (see `Drop`), so a read still in the provider's hands when a
//! rail fails never writes into memory that went back to the core. A
//! descriptor with a wrong key or range fails the read: the rail fails,
//! nothing is delivered. Through `tcp;ofi_rxm` this takes the user-space
//! copies of the bounce buffers and of rxm's eager protocol off every
//! large payload but one (read buffer to destination).
//!
//! Order of calls in an event loop, as for the shared-memory stream:
//! 1. `write_vectored` / `read` until `WouldBlock`;
//! 2. `arm()`; if `true`, go back to 1 (completions are waiting, or a
//!    send still has to be posted);
//! 3. wait for [`ByteStream::raw_fd`] to be readable, then go to 1.
//!
//! `raw_fd` is an epoll fd holding the CQ's wait fd (if the provider gives
//! one) and the side channel: it becomes readable on a completion or when
//! the peer's process is gone. `arm` calls `fi_trywait` before a sleep, as
//! libfabric requires. A provider without a wait fd is polled: `arm` says
//! "do not sleep" for [`SPIN_ARMS`] sleeps in a row, then lets the engine
//! sleep until its next timer, and its `deadline` brings an engine that
//! does not spin (the threaded one) back every [`POLL_EVERY`] (rounded up
//! to the event loop's millisecond).
//!
//! # Sleeping by the doorbell
//!
//! Through `tcp;ofi_rxm` a CQ wait fd costs every completion a signal (a
//! write and a read of a socket pair), and puts the provider's socket in
//! four nested epoll sets (tcp's CQ, rxm's CQ, this stream's, the
//! engine's), which every arriving segment walks inside the sender's
//! system call. A stream opened with `doorbell` has a CQ without a wait
//! fd, and sleeps on the side channel alone:
//! * before a sleep (`arm`, nothing to do), it sends the peer a notice
//!   ([`NOTICE`]: the number of the peer's messages it has received), then
//!   reads the CQ once more;
//! * a side reading a notice that counts fewer messages than it posted
//!   rings at once ([`RING`], one byte); one that counts all of them rings
//!   at its next post, or at its next attempt the provider refuses for
//!   now (rxm's first message one way waits for a connection, which
//!   needs the sleeper's progress). So a message the sleeper did not
//!   count is always rung for, whichever of notice and message crossed
//!   first; the ring makes the sleeper's fd readable, and ends its
//!   notice;
//! * while the provider holds sends of ours (posted, not completed), its
//!   sleeps are bounded (`deadline`: 50 µs, doubling up to 1.6 ms while
//!   nothing completes), since nothing announces their progress; and it
//!   does not sleep while an injected message (no completion) may still
//!   wait in the provider: it sends a message of the header alone by
//!   `fi_send` first, whose completion says that all before it is
//!   written;
//! * a side whose peer sends notices looks at the side channel at the
//!   first empty read after each post and every [`SIDE_EVERY_NOTICES`]
//!   empty reads, so a notice waits little for its ring.
//!
//! A rank that lends payloads (RMA) must wake when its peer reads them,
//! which nothing rings for: lending streams keep the wait fd.
//!
//! # Closing in order
//!
//! The messages travel on the provider's connections, the end of the
//! stream on the side channel, so the end can overtake the last messages
//! (an endpoint's CLOSE frame and acknowledgements), and what the provider
//! still holds is lost when the process exits. A stream closed by
//! [`ByteStream::close`] first drives the provider until every posted send
//! completed (an injected last message confirmed as for a sleep), for at
//! most the time it is given, then sends [`BYE`] with the number of
//! messages it posted, then ends the side channel. A reader that gets the
//! bye (or the end after it) reports the end of the stream only once it
//! has received that many messages, or [`BYE_WAIT`] after the bye.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::io::{self, IoSlice, Read, Write};
use std::mem::ManuallyDrop;
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::ptr;
use std::time::{Duration, Instant};

use multirail_ofi_sys as sys;
use rustix::event::epoll;

use super::credit::{Credits, HEADER};
use super::endpoint::OfiEndpoint;
use super::{CHUNK, EAGAIN, OfiError, c_string, check};
use crate::spec::OfiTarget as Selector;
use crate::tcp::{ByteStream, LentCopy};
use bytes::Bytes;

/// Send buffers and receive buffers, each of [`CHUNK`] bytes.
pub const SLOTS: usize = 16;
/// Completion entries read per `fi_cq_read`.
const CQ_BATCH: usize = 16;
/// Empty reads between two looks at the side channel.
const SIDE_EVERY: u32 = 256;
/// Without a CQ wait fd: sleeps refused in a row before one is allowed.
pub const SPIN_ARMS: u32 = 1 << 10;
/// Without a CQ wait fd: how soon an engine that does not spin comes back.
const POLL_EVERY: Duration = Duration::from_micros(50);
/// By the doorbell, with sends held by the provider: the bound on a sleep
/// doubles from [`POLL_EVERY`] up to `POLL_EVERY << POLL_BACKOFF_MAX`
/// (1.6 ms) while nothing completes.
const POLL_BACKOFF_MAX: u32 = 5;
/// Setup message: magic, then provider name and address, each with a
/// length in front.
/// Version 2 (`MRO2`): every message starts with the credit header
/// ([`super::credit`]); version 1 (`MROF`) had none.
/// Version 3 (`MRO3`): an 8-byte header (credits, lent payloads read) and
/// a flags byte after the address (bit 0: the endpoint has RMA).
/// Version 4 (`MRO4`): after the flags, rxm's eager limit in this process
/// (u32, little-endian; see [`rxm_eager_limit`] and [`check_eager`]).
/// Version 5 (`MRO5`): after `READY` the side channel carries sleep
/// notices ([`NOTICE`]) and rings ([`RING`]) (see "Sleeping" in the
/// module docs); version 4 sent nothing there.
/// Version 6 (`MRO6`): and a [`BYE`] before the end ("Closing in order").
/// Version 7 (`MRO7`): flag [`FLAG_CONNECT`]: after `READY` each side
/// sends a message of the header alone and waits for the peer's
/// ([`OfiStream::connect`]).
const MAGIC: &[u8; 4] = b"MRO7";
/// Side channel: "I sleep, having received this many of your messages"
/// (the byte, then a u64, little-endian).
const NOTICE: u8 = b'S';
/// Bytes of a notice or a bye ([`side_message`]).
const NOTICE_LEN: usize = 9;
/// Side channel: "wake up" (the answer to a notice, once the messages it
/// did not count are posted).
const RING: u8 = b'W';
/// Side channel: "I close, having posted this many messages" (the byte,
/// then a u64, little-endian; see "Closing in order" in the module docs).
const BYE: u8 = b'B';
/// A reader that got a bye waits at most this long for the messages it
/// counts, then reports the end anyway.
pub const BYE_WAIT: Duration = Duration::from_secs(1);
/// With a peer that sleeps by notices: empty reads between two looks at
/// the side channel (a notice that came after the look that followed our
/// last post waits at most this long for its ring).
const SIDE_EVERY_NOTICES: u32 = 32;
/// Setup flag: the endpoint was opened with RMA and serves and makes reads.
const FLAG_RMA: u8 = 1;
/// Setup flag: exchange a first message before returning
/// ([`OfiStream::connect`]); either side asking is enough.
const FLAG_CONNECT: u8 = 2;
/// Read buffers of a stream that reads lent payloads, each of
/// [`READ_CHUNK`] bytes (allocated at the first lent payload).
pub const READ_SLOTS: usize = 8;
/// Most bytes per `fi_read`.
pub const READ_CHUNK: usize = 256 << 10;
/// Bytes of a lent payload's descriptor: address, length and key, each
/// a little-endian u64.
pub const LENT_DESC: usize = 24;
/// Keys of lent registrations, where the provider lets us pick them:
/// `LENT_KEY_BASE + n % LENT_KEYS` for the n-th payload lent (the pools'
/// registrations use 1, 2, 3).
const LENT_KEY_BASE: u64 = 1 << 16;
const LENT_KEYS: u64 = 1 << 24;
/// Longest address accepted from the peer.
const MAX_ADDR: usize = 1024;
/// Sent by each side once its receives are posted.
const READY: u8 = b'R';

/// A heap region libfabric reads or writes by pointer while we hold it:
/// allocated once, never moved, reached only through raw pointers.
struct Region {
    ptr: *mut u8,
    len: usize,
}

impl Region {
    fn new(len: usize) -> Region {
        let ptr = Box::into_raw(vec![0u8; len].into_boxed_slice()).cast::<u8>();
        Region { ptr, len }
    }

    fn slot(&self, i: usize) -> *mut u8 {
        self.part(i, CHUNK)
    }

    /// The `i`-th part of `size` bytes.
    fn part(&self, i: usize, size: usize) -> *mut u8 {
        assert!((i + 1) * size <= self.len);
        // SAFETY: checked just above: the offset is inside the allocation.
        unsafe { self.ptr.add(i * size) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from Box::into_raw of a boxed slice of len
        // bytes and are freed once; the endpoint (and its registrations)
        // is dropped first, so libfabric no longer touches it.
        drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RecvState {
    Posted,
    Done(usize),
    /// Read out, waiting to be posted again.
    Free,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadState {
    Free,
    /// A piece of this many bytes is being read.
    Posted(usize),
    /// The piece is in the buffer.
    Done(usize),
}

/// A payload the peer lent, being read.
#[derive(Debug, Clone, Copy)]
struct LentIn {
    addr: u64,
    key: u64,
    len: usize,
    /// Bytes of it asked for with `fi_read` so far.
    asked: usize,
}

/// Reading lent payloads: the buffers and the payloads in progress.
struct Reads {
    buf: Region,
    desc: *mut c_void,
    ctx: Box<[sys::fi_context2]>,
    state: [ReadState; READ_SLOTS],
    /// Slots in the order their pieces were asked for.
    order: VecDeque<usize>,
    /// Lent payloads started, oldest first, and bytes of the oldest
    /// already copied out.
    lent: VecDeque<LentIn>,
    copied: usize,
}

/// One end of a byte stream over an RDM endpoint. See the module docs.
pub struct OfiStream {
    // The endpoint and everything libfabric reads or writes by pointer
    // are released by `Drop`, together (see [`Leftover`]).
    ep: ManuallyDrop<OfiEndpoint>,
    peer: sys::fi_addr_t,
    side: TcpStream,
    poller: OwnedFd,
    recv_buf: ManuallyDrop<Region>,
    recv_desc: *mut c_void,
    recv_ctx: ManuallyDrop<Box<[sys::fi_context2]>>,
    recv: [RecvState; SLOTS],
    /// The slot to read from next, and bytes of it already read.
    recv_head: usize,
    recv_pos: usize,
    /// Slots read out, to post again in this order.
    repost: VecDeque<usize>,
    send_buf: ManuallyDrop<Region>,
    send_desc: *mut c_void,
    send_ctx: ManuallyDrop<Box<[sys::fi_context2]>>,
    /// Bytes of each filled send slot, header included.
    send_len: [usize; SLOTS],
    send_done: [bool; SLOTS],
    /// Most stream bytes per `fi_send` (the header comes on top).
    send_max: usize,
    /// Messages of at most this many bytes (header included) go by
    /// `fi_inject`: done when the call returns, no completion.
    inject_max: usize,
    /// Receive credits: what we may post, what we owe (see `credit`).
    credits: Credits,
    /// Receives of the initial batch not posted yet (the peer was given a
    /// credit for each already; posting them owes nothing).
    initial_unposted: usize,
    /// Monotonic counts: sends completed <= posted <= filled.
    completed: u64,
    posted: u64,
    filled: u64,
    peer_gone: bool,
    empty_reads: u32,
    empty_arms: u32,
    /// The event loop arms us before it sleeps ([`ByteStream::arm`]);
    /// until it does, empty reads prepare the sleep themselves.
    engine_arms: bool,
    /// A completion error, reported by the next read or write.
    failed: Option<String>,
    shut: bool,
    /// `fi_cq_read` calls, and messages sent by `fi_inject` (diagnostics).
    cq_reads: u64,
    injected: u64,
    /// No CQ wait fd: this side sleeps by notices and rings on the side
    /// channel ("Sleeping" in the module docs).
    doorbell: bool,
    /// Receive completions so far (messages of the header alone too).
    recvd: u64,
    /// We sent a notice and were not rung since.
    notice_out: bool,
    /// The peer's last notice counted all we had posted: ring at our next
    /// post.
    peer_asleep: bool,
    /// The peer has sent notices: look at the side channel often.
    peer_notices: bool,
    /// A ring that could not be written yet, and rings written.
    ring_pending: bool,
    rings: u64,
    /// The peer's bye: how many messages it posted, and by when we wait
    /// for them ([`BYE_WAIT`]).
    peer_bye: Option<(u64, Instant)>,
    /// A notice or bye read in part.
    side_buf: [u8; NOTICE_LEN],
    side_len: usize,
    /// Look at the side channel at the next empty read (we posted since).
    side_after_post: bool,
    /// The posted count right after the last injected message (0: none
    /// yet). Sends complete in order, so it is surely written once
    /// `completed` passes it: a message sent after it has completed
    /// ([`OfiStream::inject_unconfirmed`]).
    inject_last: u64,
    /// The next message goes by `fi_send` even if it could be injected.
    no_inject: bool,
    /// Doorbell mode, sends held by the provider: sleeps in a row that
    /// found nothing (each bounded by twice the previous, from
    /// [`POLL_EVERY`]).
    poll_backoff: u32,
    /// Both endpoints have RMA: the peer may lend, and we read.
    rma: bool,
    /// Payloads of at least this many bytes are lent (with `rma`).
    lend_min: Option<usize>,
    /// Registrations of our lent payloads not yet read, oldest first.
    lent_mrs: VecDeque<*mut sys::fid_mr>,
    /// Payloads ever lent, and how many of them the peer has read.
    lent_total: u64,
    lent_read: u64,
    /// Set up at the first payload the peer lends.
    reads: Option<ManuallyDrop<Reads>>,
    /// Lent payloads read out (running count), and the count our last
    /// message carried.
    reads_done: u32,
    reads_told: u32,
    /// How long the first messages took to cross at setup, if they did
    /// ([`OfiStream::connect`]).
    connected_in: Option<Duration>,
}

// SAFETY: the raw pointers are the endpoint's registrations and buffers,
// owned by this value and used only through `&mut self`; see OfiEndpoint.
unsafe impl Send for OfiStream {}

fn context() -> sys::fi_context2 {
    sys::fi_context2 { internal: [ptr::null_mut(); 8] }
}

impl OfiStream {
    /// Sets up the stream over the authenticated side channel `side`
    /// (blocking; `timeout` bounds each wait for the peer): opens an
    /// endpoint for `sel`, exchanges addresses, posts the receives, and
    /// waits until the peer has posted its own. Afterwards `side` is only
    /// watched for the peer's end.
    ///
    /// `send`: most bytes per `fi_send`, header included (at most
    /// [`CHUNK`]; `None`: [`default_send`] for the provider opened). Through
    /// rxm, a peer with another eager limit is refused ([`check_eager`]).
    /// `lend`: payloads of at least this many bytes are lent (RMA, see the
    /// module docs) where both endpoints have RMA; `None`: the endpoint is
    /// opened without RMA, and neither side lends.
    /// `doorbell`: the CQ gets no wait fd, and this side sleeps by notices
    /// and rings on the side channel ("Sleeping" in the module docs).
    /// `connect`: both sides exchange a first message before returning
    /// ([`OfiStream::connect`]), as they do when the peer asks.
    pub fn over_side_channel(
        sel: &Selector,
        mut side: TcpStream,
        timeout: Duration,
        send: Option<usize>,
        lend: Option<usize>,
        doorbell: bool,
        connect: bool,
    ) -> Result<OfiStream, String> {
        side.set_nonblocking(false).map_err(|e| e.to_string())?;
        side.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
        side.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
        let mut ep = OfiEndpoint::open(sel, lend.is_some(), !doorbell)?;
        let provider = ep.provider();
        let addr = ep.address().map_err(|e| e.to_string())?;
        let flags = (if ep.rma() { FLAG_RMA } else { 0 }) | (if connect { FLAG_CONNECT } else { 0 });
        let eager = rxm_eager_limit();
        side.write_all(&setup_message(&provider, &addr, flags, eager))
            .map_err(|e| format!("sending our address: {e}"))?;
        let (peer_provider, peer_addr, peer_flags, peer_eager) =
            read_setup_message(&mut side).map_err(|e| e.explain(timeout))?;
        if peer_provider != provider {
            return Err(format!(
                "the peer opened libfabric provider '{peer_provider}' for this rail, we opened '{provider}' \
                 (do both ranks have the same providers?)"
            ));
        }
        check_eager(&provider, eager, peer_eager)?;
        let peer = ep.insert_peer(&peer_addr).map_err(|e| format!("the peer's address was refused: {e}"))?;
        let send = send_size(&provider, send, eager);
        let rma = ep.rma() && peer_flags & FLAG_RMA != 0;
        let mut stream = OfiStream::new(ep, peer, side, Some(send)).map_err(|e| e.to_string())?;
        stream.rma = rma;
        stream.lend_min = lend.filter(|_| rma);
        stream.doorbell = doorbell;
        stream.side.write_all(&[READY]).map_err(|e| format!("side channel: {e}"))?;
        let mut ready = [0u8; 1];
        stream
            .side
            .read_exact(&mut ready)
            .map_err(|e| SetupError::Io("waiting for the peer's receives", e).explain(timeout))?;
        if ready[0] != READY {
            return Err("the peer sent something else than 'ready' on the side channel".into());
        }
        stream.side.set_nonblocking(true).map_err(|e| e.to_string())?;
        // Either side may ask; both then exchange.
        if connect || peer_flags & FLAG_CONNECT != 0 {
            stream.connect(timeout)?;
        }
        Ok(stream)
    }

    /// Both sides post a message of the header alone at once and drive
    /// the provider until their own has completed and the peer's has
    /// arrived, at most `timeout`.
    ///
    /// Through rxm, the first message one way sets up its connection,
    /// which needs the peer's progress: done here, while both sides are
    /// sure to be reading, and not at the first message of the job, whose
    /// peer may be busy elsewhere or asleep. rxm resolves the two
    /// connection requests that cross; an end that waited for the other's
    /// message before sending its own made 64 ranks on 2 CPUs slower.
    fn connect(&mut self, timeout: Duration) -> Result<(), String> {
        let start = Instant::now();
        self.fill_header_only();
        loop {
            {
                let _libfabric = super::lock();
                self.check_side();
                // By fi_send, not inject: its completion says it was
                // written, so it arrives whether or not anyone drives our
                // provider after we return.
                self.no_inject = true;
                let r = self.progress();
                self.no_inject = false;
                r?;
                if self.completed == self.filled && self.recvd > 0 {
                    self.connected_in = Some(start.elapsed());
                    return Ok(());
                }
            }
            if self.peer_gone {
                return Err("the peer closed the side channel before its first message came".into());
            }
            if start.elapsed() >= timeout {
                let what = if self.completed < self.filled {
                    "the provider did not send our first message"
                } else {
                    "the peer's first message did not come"
                };
                return Err(format!(
                    "{what} within {} s (the peer's process is stalled or the provider's connection \
                     cannot be made; MULTIRAIL_SETUP_TIMEOUT sets the wait)",
                    timeout.as_secs_f64()
                ));
            }
            std::thread::sleep(POLL_EVERY);
        }
    }

    fn new(ep: OfiEndpoint, peer: sys::fi_addr_t, side: TcpStream, send: Option<usize>) -> Result<OfiStream, OfiError> {
        let recv_buf = Region::new(SLOTS * CHUNK);
        let send_buf = Region::new(SLOTS * CHUNK);
        // Declared after the buffers, so that on an early return it is
        // dropped (and its registrations closed) before they are freed.
        let mut ep = ep;
        let send_max = send.map_or(CHUNK, |n| n.clamp(HEADER + 1, CHUNK)) - HEADER;
        let inject_max = ep.inject_size();
        // SAFETY: both regions are heap allocations that never move and
        // are freed only after `ep` (declared first) has been dropped.
        let (recv_desc, send_desc) = unsafe {
            (
                ep.register(std::slice::from_raw_parts_mut(recv_buf.ptr, recv_buf.len), u64::from(sys::FI_RECV))?,
                ep.register(std::slice::from_raw_parts_mut(send_buf.ptr, send_buf.len), u64::from(sys::FI_SEND))?,
            )
        };
        let poller = epoll::create(epoll::CreateFlags::CLOEXEC)
            .map_err(|e| OfiError { call: "epoll_create", code: -i64::from(e.raw_os_error()) })?;
        let add = |fd: std::os::fd::BorrowedFd<'_>| {
            epoll::add(&poller, fd, epoll::EventData::new_u64(0), epoll::EventFlags::IN)
                .map_err(|e| OfiError { call: "epoll_ctl", code: -i64::from(e.raw_os_error()) })
        };
        add(side.as_fd())?;
        if let Some(fd) = ep.wait_fd() {
            // SAFETY: the CQ's wait fd stays open as long as the CQ, which
            // outlives the poller (both owned by self, poller never
            // borrowed past it); it is only registered, never closed here.
            add(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })?;
        }
        let mut this = OfiStream {
            ep: ManuallyDrop::new(ep),
            peer,
            side,
            poller,
            recv_buf: ManuallyDrop::new(recv_buf),
            recv_desc,
            recv_ctx: ManuallyDrop::new((0..SLOTS).map(|_| context()).collect()),
            recv: [RecvState::Free; SLOTS],
            recv_head: 0,
            recv_pos: 0,
            repost: (0..SLOTS).collect(),
            send_buf: ManuallyDrop::new(send_buf),
            send_desc,
            send_ctx: ManuallyDrop::new((0..SLOTS).map(|_| context()).collect()),
            send_len: [0; SLOTS],
            send_done: [false; SLOTS],
            send_max,
            inject_max,
            credits: Credits::new(SLOTS as u32),
            initial_unposted: SLOTS,
            completed: 0,
            posted: 0,
            filled: 0,
            peer_gone: false,
            empty_reads: 0,
            empty_arms: 0,
            engine_arms: false,
            failed: None,
            shut: false,
            cq_reads: 0,
            injected: 0,
            doorbell: false,
            recvd: 0,
            notice_out: false,
            peer_asleep: false,
            peer_notices: false,
            ring_pending: false,
            rings: 0,
            peer_bye: None,
            side_buf: [0; NOTICE_LEN],
            side_len: 0,
            side_after_post: false,
            inject_last: 0,
            no_inject: false,
            poll_backoff: 0,
            rma: false,
            lend_min: None,
            lent_mrs: VecDeque::new(),
            lent_total: 0,
            lent_read: 0,
            reads: None,
            reads_done: 0,
            reads_told: 0,
            connected_in: None,
        };
        // Receives the provider cannot take yet (-FI_EAGAIN) are posted by
        // the next read, in order.
        this.post_receives_locked()?;
        Ok(this)
    }

    /// The provider's name, whether receives are directed (match only
    /// the peer's address), how completions are waited for, RMA, and the
    /// bytes per `fi_send`.
    pub fn describe(&self) -> String {
        let directed = if self.ep.directed() { "directed receives" } else { "receives from any address" };
        let wait = if self.ep.wait_fd().is_some() {
            "CQ wait fd"
        } else if self.doorbell {
            "doorbell on the side channel"
        } else {
            "polled CQ"
        };
        let rma = match (self.rma, self.lend_min) {
            (false, _) => "no RMA".to_string(),
            (true, None) => "RMA reads, lends nothing".to_string(),
            (true, Some(n)) => format!("RMA reads, lends payloads of {n} bytes and more"),
        };
        let send = self.send_max + HEADER;
        let first = match self.connected_in {
            Some(t) => format!("; first messages crossed at setup in {:.1} ms", t.as_secs_f64() * 1e3),
            None => String::new(),
        };
        format!(
            "{} domain {} ({directed}, {wait}, {rma}, {send} bytes per fi_send{first})",
            self.ep.provider(),
            self.ep.domain_name()
        )
    }

    fn post_receives_locked(&mut self) -> Result<(), OfiError> {
        let _libfabric = super::lock();
        self.post_receives()
    }

    /// Posts the read-out receive slots again, in order; stops at
    /// `-FI_EAGAIN` (retried on the next call).
    fn post_receives(&mut self) -> Result<(), OfiError> {
        let src = if self.ep.directed() { self.peer } else { sys::FI_ADDR_UNSPEC };
        while let Some(&i) = self.repost.front() {
            let ctx: *mut sys::fi_context2 = &mut self.recv_ctx[i];
            // SAFETY: slot i is a CHUNK-byte part of the registered receive
            // region, not in use (Free), and its context is owned by self;
            // both stay in place until the completion or the endpoint's
            // close.
            let ret = unsafe {
                sys::mr_ofi_recv(self.ep.ep(), self.recv_buf.slot(i).cast(), CHUNK, self.recv_desc, src, ctx.cast())
            };
            if ret == EAGAIN {
                return Ok(());
            }
            check("fi_recv", ret as i64)?;
            self.recv[i] = RecvState::Posted;
            self.repost.pop_front();
            if self.initial_unposted > 0 {
                self.initial_unposted -= 1;
            } else {
                self.credits.reposted();
            }
        }
        Ok(())
    }

    /// Posts filled send slots, in order, while the credits allow; stops at
    /// `-FI_EAGAIN`. Then, if nothing waits and credits are due, posts a
    /// message that only returns them.
    fn post_sends(&mut self) -> Result<(), OfiError> {
        loop {
            if self.posted == self.filled {
                // Nothing waits: a message of the header alone, if credits
                // are due or the peer waits to hear of payloads read.
                let tell = self.reads_done != self.reads_told && self.credits.may_post();
                if !(self.credits.wants_return() || tell) || self.filled - self.completed >= SLOTS as u64 {
                    return Ok(());
                }
                self.fill_header_only();
            }
            if !self.credits.may_post() {
                return Ok(());
            }
            let i = (self.posted % SLOTS as u64) as usize;
            let ctx: *mut sys::fi_context2 = &mut self.send_ctx[i];
            let mut header = [0u8; HEADER];
            header[..4].copy_from_slice(&self.credits.owed().to_le_bytes());
            header[4..].copy_from_slice(&self.reads_done.to_le_bytes());
            // SAFETY: slot i is filled and not posted: nothing else reads
            // or writes it; HEADER <= CHUNK.
            unsafe { ptr::copy_nonoverlapping(header.as_ptr(), self.send_buf.slot(i), HEADER) };
            let inject = self.send_len[i] <= self.inject_max && !self.no_inject;
            // SAFETY: slot i holds send_len[i] bytes and is not touched
            // until its completion (an inject copies them before it
            // returns); context owned by self; peer is in the AV.
            let ret = unsafe {
                if inject {
                    sys::mr_ofi_inject(self.ep.ep(), self.send_buf.slot(i).cast(), self.send_len[i], self.peer)
                } else {
                    sys::mr_ofi_send(
                        self.ep.ep(),
                        self.send_buf.slot(i).cast(),
                        self.send_len[i],
                        self.send_desc,
                        self.peer,
                        ctx.cast(),
                    )
                }
            };
            if ret == EAGAIN {
                // The provider cannot take it yet. Through rxm that is
                // also a connection being set up, at the first message
                // this way, which needs the peer's progress: a peer asleep
                // by the doorbell is rung (each notice of its once), or it
                // would sleep on while we retry.
                if self.peer_asleep {
                    self.ring();
                }
                return Ok(());
            }
            check(if inject { "fi_inject" } else { "fi_send" }, ret as i64)?;
            self.credits.posted();
            self.reads_told = self.reads_done;
            self.send_done[i] = false;
            self.posted += 1;
            if inject {
                self.injected += 1;
                self.inject_last = self.posted;
                self.send_complete(i);
            }
            self.side_after_post = true;
            if self.peer_asleep {
                self.ring();
            }
        }
    }

    /// Fills the next send slot with a message of the header alone (the
    /// header is written when it is posted). The caller checked that the
    /// slot is free.
    fn fill_header_only(&mut self) {
        let i = (self.filled % SLOTS as u64) as usize;
        self.send_len[i] = HEADER;
        self.filled += 1;
    }

    /// Reads the CQ and records what completed, then posts what waits.
    /// Returns whether anything completed.
    fn progress(&mut self) -> Result<bool, String> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = self.read_cq().and_then(|any| {
            self.skip_credit_only();
            self.post_receives().map_err(|e| e.to_string())?;
            self.post_sends().map_err(|e| e.to_string())?;
            self.post_reads().map_err(|e| e.to_string())?;
            Ok(any)
        });
        if let Err(e) = &r {
            self.failed = Some(e.clone());
        }
        r
    }

    /// Frees the received messages at the head that carry only credits
    /// (their credits were counted at completion), so that their receives
    /// are posted again, and credits owed for them, whether or not anyone
    /// reads the stream: a writer that never reads still returns them.
    fn skip_credit_only(&mut self) {
        while self.recv_pos == 0 && self.recv[self.recv_head] == RecvState::Done(0) {
            self.release_head();
        }
    }

    /// The head receive slot is read out: queue it to be posted again and
    /// move to the next one.
    fn release_head(&mut self) {
        self.recv[self.recv_head] = RecvState::Free;
        self.repost.push_back(self.recv_head);
        self.recv_head = (self.recv_head + 1) % SLOTS;
        self.recv_pos = 0;
    }

    fn read_cq(&mut self) -> Result<bool, String> {
        let mut any = false;
        loop {
            let mut entries = [sys::fi_cq_msg_entry { op_context: ptr::null_mut(), flags: 0, len: 0 }; CQ_BATCH];
            // SAFETY: entries has room for CQ_BATCH entries of the CQ's
            // format (FI_CQ_FORMAT_MSG).
            let ret = unsafe { sys::mr_ofi_cq_read(self.ep.cq(), entries.as_mut_ptr().cast(), CQ_BATCH) };
            self.cq_reads += 1;
            if ret == EAGAIN {
                return Ok(any);
            }
            if ret == -(sys::FI_EAVAIL as isize) {
                return Err(self.error_entry());
            }
            let n = check("fi_cq_read", ret as i64).map_err(|e| e.to_string())? as usize;
            for e in &entries[..n] {
                self.complete(e.op_context, e.len)?;
            }
            any |= n > 0;
            if n > 0 {
                self.poll_backoff = 0;
            }
            if n < CQ_BATCH {
                return Ok(any);
            }
        }
    }

    /// Which slot a completion's context belongs to.
    fn complete(&mut self, ctx: *mut c_void, len: usize) -> Result<(), String> {
        let at = |ctxs: &[sys::fi_context2]| ctxs.iter().position(|c| ptr::eq(c, ctx.cast()));
        if let Some(i) = at(&self.recv_ctx) {
            if len > CHUNK {
                return Err(format!("a receive completed with {len} bytes in a {CHUNK}-byte buffer"));
            }
            if len < HEADER {
                return Err(format!("the peer sent a message of {len} bytes, shorter than its {HEADER}-byte header"));
            }
            let mut header = [0u8; HEADER];
            // SAFETY: the receive into slot i completed with len >= HEADER
            // bytes, so libfabric no longer writes them.
            unsafe { ptr::copy_nonoverlapping(self.recv_buf.slot(i), header.as_mut_ptr(), HEADER) };
            let [c0, c1, c2, c3, r0, r1, r2, r3] = header;
            self.recvd += 1;
            self.credits.returned(u32::from_le_bytes([c0, c1, c2, c3]))?;
            self.peer_read(u32::from_le_bytes([r0, r1, r2, r3]))?;
            self.recv[i] = RecvState::Done(len - HEADER);
        } else if let Some(i) = self.reads.as_ref().and_then(|r| at(&r.ctx)) {
            let r = self.reads.as_mut().expect("just found");
            let ReadState::Posted(n) = r.state[i] else {
                return Err("a read completed in a read buffer that was not being read into".into());
            };
            r.state[i] = ReadState::Done(n);
        } else if let Some(i) = at(&self.send_ctx) {
            self.send_complete(i);
        } else {
            return Err("a completion for an operation this rail did not post".into());
        }
        Ok(())
    }

    /// An injected message (no completion) may still wait in the provider:
    /// no message sent after it has completed yet.
    fn inject_unconfirmed(&self) -> bool {
        self.inject_last != 0 && self.completed <= self.inject_last
    }

    /// The peer said bye and messages it counts have not come yet (and
    /// [`BYE_WAIT`] has not passed).
    fn bye_pending(&self) -> bool {
        self.peer_bye.is_some_and(|(k, until)| self.recvd < k && Instant::now() < until)
    }

    /// Closing: drives the provider until every message posted (and any
    /// filled one the credits let us post) is written, or `by`; see
    /// "Closing in order" in the module docs. True when all were.
    /// The libfabric lock is taken for each round, not across the sleeps
    /// (other streams of the process go on meanwhile).
    fn linger(&mut self, by: Instant) -> bool {
        loop {
            {
                let _libfabric = super::lock();
                // A notice of the peer's tells us to ring it for what we
                // post (or fail to post) now.
                self.check_side();
                if self.peer_gone {
                    return false;
                }
                if self.posted < self.filled && self.credits.may_post() && self.post_sends().is_err() {
                    return false;
                }
                if self.progress().is_err() || self.failed.is_some() {
                    return false;
                }
                if self.posted == self.filled && self.completed == self.posted {
                    // An injected message has no completion: one of the
                    // header alone by fi_send behind it says it was written.
                    if !self.inject_unconfirmed() {
                        return true;
                    }
                    self.post_probe();
                }
            }
            if Instant::now() >= by {
                return false;
            }
            std::thread::sleep(POLL_EVERY);
        }
    }

    /// Send slot `i`'s message is out of our hands: free it, and every
    /// slot before it that is.
    fn send_complete(&mut self, i: usize) {
        self.send_done[i] = true;
        while self.completed < self.posted && self.send_done[(self.completed % SLOTS as u64) as usize] {
            self.completed += 1;
        }
    }

    /// The peer's header says it has read `count` (running, wrapping) of
    /// the payloads we lent: close their registrations, oldest first.
    /// [`ByteStream::lent_done`] then lets the rail free them.
    fn peer_read(&mut self, count: u32) -> Result<(), String> {
        let new = u64::from(count.wrapping_sub(self.lent_read as u32));
        if new == 0 {
            return Ok(());
        }
        if new > self.lent_total - self.lent_read {
            return Err(format!(
                "the peer says it read {new} more lent payloads, but {} are lent (protocol error)",
                self.lent_total - self.lent_read
            ));
        }
        for _ in 0..new {
            let mr = self.lent_mrs.pop_front().expect("counted above");
            // SAFETY: mr is a registration of ours, open, and the peer is
            // done with it; it is not used again.
            unsafe { self.ep.close_mr(mr) };
        }
        self.lent_read += new;
        Ok(())
    }

    /// Asks for the next pieces of the lent payloads started, in order,
    /// while read buffers are free; stops at `-FI_EAGAIN`.
    fn post_reads(&mut self) -> Result<(), OfiError> {
        let Some(r) = self.reads.as_deref_mut() else { return Ok(()) };
        for lent in r.lent.iter_mut() {
            while lent.asked < lent.len {
                let Some(i) = r.state.iter().position(|s| *s == ReadState::Free) else { return Ok(()) };
                let n = (lent.len - lent.asked).min(READ_CHUNK);
                let ctx: *mut sys::fi_context2 = &mut r.ctx[i];
                // SAFETY: read buffer i (READ_CHUNK bytes, n <= READ_CHUNK)
                // is free and registered where the provider asks; it and
                // its context stay in place until the completion or the
                // endpoint's close (see Drop). The peer is in the AV.
                let ret = unsafe {
                    sys::mr_ofi_read(
                        self.ep.ep(),
                        r.buf.part(i, READ_CHUNK).cast(),
                        n,
                        r.desc,
                        self.peer,
                        lent.addr.wrapping_add(lent.asked as u64),
                        lent.key,
                        ctx.cast(),
                    )
                };
                if ret == EAGAIN {
                    return Ok(());
                }
                check("fi_read", ret as i64)?;
                r.state[i] = ReadState::Posted(n);
                r.order.push_back(i);
                lent.asked += n;
            }
        }
        Ok(())
    }

    /// The read buffers, at the first payload the peer lends. The caller
    /// holds the libfabric lock.
    fn reads(&mut self) -> Result<&mut Reads, OfiError> {
        if self.reads.is_none() {
            let buf = Region::new(READ_SLOTS * READ_CHUNK);
            // SAFETY: buf is a heap allocation that never moves, kept with
            // the endpoint (Drop) until the endpoint is closed.
            let desc = unsafe {
                self.ep.register_locked(std::slice::from_raw_parts_mut(buf.ptr, buf.len), u64::from(sys::FI_READ))?
            };
            self.reads = Some(ManuallyDrop::new(Reads {
                buf,
                desc,
                ctx: (0..READ_SLOTS).map(|_| context()).collect(),
                state: [ReadState::Free; READ_SLOTS],
                order: VecDeque::new(),
                lent: VecDeque::new(),
                copied: 0,
            }));
        }
        Ok(self.reads.as_deref_mut().expect("just set"))
    }

    /// Copies the pieces of the oldest lent payload read so far into
    /// `dst`, in order; true once all of it is there (the payload is then
    /// counted as read, and the peer told with our next message).
    fn finish_read(&mut self, mut dst: Option<&mut [u8]>) -> bool {
        let Some(r) = self.reads.as_deref_mut() else { return false };
        let Some(&lent) = r.lent.front() else { return false };
        while let Some(&i) = r.order.front() {
            let ReadState::Done(n) = r.state[i] else { break };
            if let Some(d) = dst.as_deref_mut() {
                // SAFETY: the read into buffer i completed with n <=
                // READ_CHUNK bytes, so libfabric no longer writes them; the
                // pieces of the oldest payload come first in `order`, and
                // they add up to its length, which is dst's.
                unsafe {
                    ptr::copy_nonoverlapping(r.buf.part(i, READ_CHUNK), d[r.copied..r.copied + n].as_mut_ptr(), n)
                };
            }
            r.copied += n;
            r.state[i] = ReadState::Free;
            r.order.pop_front();
            if r.copied == lent.len {
                r.lent.pop_front();
                r.copied = 0;
                self.reads_done = self.reads_done.wrapping_add(1);
                return true;
            }
        }
        false
    }

    /// Whether a read piece waits to be copied out.
    fn has_read_ready(&self) -> bool {
        self.reads
            .as_deref()
            .and_then(|r| r.order.front().map(|&i| matches!(r.state[i], ReadState::Done(_))))
            .unwrap_or(false)
    }

    /// The CQ's error entry as text (an error ends the stream).
    fn error_entry(&mut self) -> String {
        // SAFETY: zeroed is a valid entry (no error-data buffer asked).
        let mut err: sys::fi_cq_err_entry = unsafe { std::mem::zeroed() };
        // SAFETY: err is a valid entry to fill; flags 0.
        let ret = unsafe { sys::mr_ofi_cq_readerr(self.ep.cq(), &mut err, 0) };
        if ret < 0 {
            return OfiError { call: "fi_cq_readerr", code: ret as i64 }.to_string();
        }
        let mut text = [0 as std::ffi::c_char; 256];
        // SAFETY: text is writable for its length; the result lives in text
        // or in the provider.
        let detail = c_string(unsafe {
            sys::mr_ofi_cq_strerror(self.ep.cq(), err.prov_errno, err.err_data, text.as_mut_ptr(), text.len())
        });
        let code = OfiError { call: "operation", code: -i64::from(err.err) };
        format!("libfabric completion error: {code} (provider: {detail})")
    }

    /// Looks at the side channel: end of stream or an error means the
    /// peer's process (or its host) is gone.
    fn check_side(&mut self) {
        let mut buf = [0u8; 64];
        loop {
            match Read::read(&mut self.side, &mut buf) {
                Ok(0) => {
                    self.peer_gone = true;
                    return;
                }
                Ok(n) => {
                    for &b in &buf[..n] {
                        self.side_byte(b);
                    }
                    if n < buf.len() {
                        break;
                    }
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => break,
                Err(_) => {
                    self.peer_gone = true;
                    return;
                }
            }
        }
        if self.ring_pending {
            self.ring();
        }
    }

    /// One byte from the side channel: part of a notice or a bye, or a
    /// ring.
    fn side_byte(&mut self, b: u8) {
        if self.side_len > 0 || b == NOTICE || b == BYE {
            self.side_buf[self.side_len] = b;
            self.side_len += 1;
            if self.side_len == NOTICE_LEN {
                self.side_len = 0;
                let k = u64::from_le_bytes(self.side_buf[1..].try_into().expect("8 bytes"));
                if self.side_buf[0] == BYE {
                    if k < self.recvd {
                        self.failed =
                            Some(format!("the peer says it posted {k} messages, but we received {}", self.recvd));
                    }
                    self.peer_bye = Some((k, Instant::now() + BYE_WAIT));
                    return;
                }
                self.peer_notices = true;
                if k > self.posted {
                    self.failed =
                        Some(format!("the peer says it received {k} of our messages, but we posted {}", self.posted));
                } else if k < self.posted {
                    // Messages it did not count are on their way: ring now.
                    self.ring();
                } else {
                    self.peer_asleep = true;
                }
            }
        } else if b == RING {
            self.notice_out = false;
        } else {
            self.failed =
                Some(format!("the peer sent byte {b:#04x} on the side channel (a notice or a ring expected)"));
        }
    }

    /// Wakes the peer: one byte on the side channel.
    fn ring(&mut self) {
        self.peer_asleep = false;
        match Write::write(&mut self.side, &[RING]) {
            Ok(1) => {
                self.ring_pending = false;
                self.rings += 1;
            }
            Ok(_) => self.ring_pending = true,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {
                self.ring_pending = true
            }
            Err(_) => self.peer_gone = true,
        }
    }

    /// Doorbell mode, before a sleep: tells the peer how many of its
    /// messages we received. False if it could not be written (stay awake).
    fn send_notice(&mut self) -> bool {
        let m = side_message(NOTICE, self.recvd);
        // A 9-byte write to a socket whose other bytes are single rings and
        // notices, one outstanding each way: it fits whole or not at all.
        match Write::write(&mut self.side, &m) {
            Ok(n) if n == m.len() => {
                self.notice_out = true;
                true
            }
            Ok(_) => {
                self.failed = Some("the side channel took part of a sleep notice".into());
                false
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => false,
            Err(_) => {
                self.peer_gone = true;
                false
            }
        }
    }

    /// Doorbell mode: an injected message may still wait in the provider
    /// (a full socket) with nothing to announce when it is written. Posts a
    /// message of the header alone by `fi_send` behind it: once that one
    /// completes, all before it is written. False if it cannot be posted
    /// (no free slot or credit: then the peer holds our messages, and
    /// returns the credits by a message, which rings us).
    fn post_probe(&mut self) -> bool {
        if self.posted < self.filled || self.filled - self.completed >= SLOTS as u64 || !self.credits.may_post() {
            return false;
        }
        self.fill_header_only();
        self.no_inject = true;
        let r = self.post_sends();
        self.no_inject = false;
        if let Err(e) = r {
            self.failed = Some(e.to_string());
        }
        true
    }

    /// Reads the CQ and copies completed receives, in posting order, into
    /// `buf`; posts the read-out slots again.
    fn deliver(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // The CQ is read only when no received message waits: a frame read
        // in pieces (header, then payload) costs one CQ read, not one per
        // piece (each a system call or two through tcp;ofi_rxm).
        if !self.has_recv_ready() {
            self.progress().map_err(io::Error::other)?;
        }
        let mut n = 0;
        while n < buf.len() {
            let RecvState::Done(len) = self.recv[self.recv_head] else { break };
            let take = (len - self.recv_pos).min(buf.len() - n);
            // SAFETY: the slot's receive completed (Done), so libfabric no
            // longer writes it; HEADER + recv_pos + take <= HEADER + len <= CHUNK.
            unsafe {
                ptr::copy_nonoverlapping(
                    self.recv_buf.slot(self.recv_head).add(HEADER + self.recv_pos),
                    buf[n..].as_mut_ptr(),
                    take,
                );
            }
            n += take;
            self.recv_pos += take;
            if self.recv_pos == len {
                self.release_head();
            }
        }
        if !self.repost.is_empty() {
            self.post_receives().map_err(io::Error::from)?;
            // Credits due and nothing else to carry them: an engine that
            // arms us returns them from its next round or `arm` (after
            // the reply that this message may bring, which carries them);
            // one that does not may sleep next, so they go now.
            if !self.engine_arms {
                self.post_sends().map_err(io::Error::from)?;
            }
        }
        Ok(n)
    }

    /// `fi_trywait` on the CQ: true when sleeping on its fd is safe.
    fn try_wait(&mut self) -> bool {
        let mut fids = [self.ep.cq().cast::<sys::fid>()];
        // SAFETY: fids holds this endpoint's CQ, opened with a wait fd.
        unsafe { sys::mr_ofi_trywait(self.ep.fabric(), fids.as_mut_ptr(), 1) == 0 }
    }

    fn has_recv_ready(&self) -> bool {
        matches!(self.recv[self.recv_head], RecvState::Done(_))
    }
}

/// Bytes per `fi_send` (header included) by default, with rxm's eager
/// limit `eager` in this process: through `tcp;ofi_rxm` at most that
/// limit (16 KiB unless `FI_OFI_RXM_EAGER_LIMIT` says more), a whole
/// buffer elsewhere.
///
/// A send larger than the eager limit goes by rxm's segmentation or
/// rendezvous protocol, a round trip more per message: on the 2 x 2 Gbit
/// testbed (2026-11-25) 16 KiB sends moved 1 MiB / 4 MiB messages 1.13 /
/// 1.15 x faster than 64 KiB ones by rendezvous, and 64 KiB ones sent
/// eagerly (`FI_OFI_RXM_EAGER_LIMIT=65536`) 1.1-1.3 x faster again
/// (2026-11-29). Eager sends are safe only with the credits
/// ([`super::credit`]): rxm buffers an eager message that finds no
/// receive posted, without bound.
pub fn default_send(provider: &str, eager: usize) -> usize {
    if provider == "tcp;ofi_rxm" { eager.min(CHUNK) } else { CHUNK }
}

/// Bytes per `fi_send` on a rail of `provider`: `requested`
/// (`MULTIRAIL_OFI_SEND`) or the default for rxm's eager limit `eager`;
/// at least the header and a byte, at most [`CHUNK`].
pub fn send_size(provider: &str, requested: Option<usize>, eager: usize) -> usize {
    requested.unwrap_or_else(|| default_send(provider, eager)).clamp(HEADER + 1, CHUNK)
}

/// Refuses a peer whose rxm has another eager limit: across such a pair
/// rxm delivers nothing at all, whatever the message sizes (measured with
/// libfabric 1.17 over `tcp`: 65536 against 16384, 32768 against 65536,
/// with 16 KiB sends too; both sides waited until their peer timeout).
pub fn check_eager(provider: &str, eager: usize, peer_eager: usize) -> Result<(), String> {
    if !provider.ends_with(";ofi_rxm") || eager == peer_eager {
        return Ok(());
    }
    Err(format!(
        "rxm's eager limit is {eager} bytes here and {peer_eager} at the peer, and rxm moves nothing between \
         different limits: give every rank the same FI_OFI_RXM_EAGER_LIMIT (or FI_OFI_RXM_BUFFER_SIZE, \
         which it follows); the multirail command sets FI_OFI_RXM_EAGER_LIMIT={RXM_EAGER_PREFERRED} for \
         itself and its ranks when neither is set, a program linking the library does not"
    ))
}

/// rxm's default eager limit (`FI_OFI_RXM_BUFFER_SIZE`'s default).
pub const RXM_EAGER_DEFAULT: usize = 16 << 10;

/// The eager limit multirail asks rxm for (`FI_OFI_RXM_EAGER_LIMIT`, set
/// by the `multirail` command for itself and the ranks it starts when
/// neither that variable nor `FI_OFI_RXM_BUFFER_SIZE` is set): 64 KiB
/// messages eagerly, a whole buffer per `fi_send`. Through `tcp`, rxm
/// takes an eager message larger than its bounce buffers straight into
/// the posted receive, so its memory stays that of 16 KiB buffers (peak
/// RSS of a 2-rail loopback `bench bw` 456 MB against 469 MB with the
/// default, 948 MB with `FI_OFI_RXM_BUFFER_SIZE=65536`; 2026-11-29).
pub const RXM_EAGER_PREFERRED: usize = 64 << 10;

/// rxm's eager limit in this process as libfabric reads it at its first
/// use: `FI_OFI_RXM_EAGER_LIMIT`, else `FI_OFI_RXM_BUFFER_SIZE` (which it
/// follows), else 16 KiB.
pub fn rxm_eager_limit() -> usize {
    let var = |k: &str| std::env::var(k).ok();
    eager_limit_of(var("FI_OFI_RXM_EAGER_LIMIT").as_deref(), var("FI_OFI_RXM_BUFFER_SIZE").as_deref())
}

fn eager_limit_of(eager: Option<&str>, buffer: Option<&str>) -> usize {
    // Leading decimal digits, as C's strtoul reads them; a value without
    // any is ignored.
    let num = |v: &str| {
        let t = v.trim_start();
        let end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        t[..end].parse::<usize>().ok()
    };
    eager.and_then(num).or_else(|| buffer.and_then(num)).unwrap_or(RXM_EAGER_DEFAULT)
}

/// rxm's receive queue depth per endpoint that multirail asks for
/// (`FI_OFI_RXM_MSG_RX_SIZE`, set by the `multirail` command for itself
/// and the ranks it starts when the user did not set it).
///
/// Through `tcp`, rxm shares one receive context among an endpoint's
/// connections and by default posts 4096 bounce buffers to it, about 52 MB
/// of the 88 MB an endpoint held (peak RSS of a 2-rank `bench bw --sizes
/// 8,1K,16K` over one `ofi:tcp:127.0.0.1` rail: 99 MB, 47 MB with 1024;
/// tcp rails 9 MB). Every `ofi` rail to every peer is an endpoint of its
/// own with one connection, and the credits keep at most [`SLOTS`]
/// messages (plus a probe) in flight on it, so 1024 is still far more
/// than it can use. 64 ranks of `bench mbw_mr --pairs 32` over
/// `ofi:tcp:127.0.0.1` (2026-11-29) peaked at 16.7 GB of the machine's
/// 24 with the default, 7.4 GB with 1024; the bandwidth and
/// latency on the testbed and on loopback did not change measurably
/// (`docs/benchmarks.md`).
pub const RXM_MSG_RX_PREFERRED: usize = 1024;

/// The variables and values the `multirail` command sets at its start
/// (one thread only, before any libfabric call) for `tcp;ofi_rxm`: 64 KiB
/// eager sends ([`RXM_EAGER_PREFERRED`]) unless the user set rxm's eager
/// limit or buffer size, and a receive queue of [`RXM_MSG_RX_PREFERRED`]
/// buffers unless the user set `FI_OFI_RXM_MSG_RX_SIZE`.
pub fn preferred_rxm_env() -> Vec<(&'static str, String)> {
    preferred_rxm_env_of(|k| std::env::var_os(k).is_some())
}

fn preferred_rxm_env_of(set: impl Fn(&str) -> bool) -> Vec<(&'static str, String)> {
    let mut vars = Vec::new();
    if !set("FI_OFI_RXM_EAGER_LIMIT") && !set("FI_OFI_RXM_BUFFER_SIZE") {
        vars.push(("FI_OFI_RXM_EAGER_LIMIT", RXM_EAGER_PREFERRED.to_string()));
    }
    if !set("FI_OFI_RXM_MSG_RX_SIZE") {
        vars.push(("FI_OFI_RXM_MSG_RX_SIZE", RXM_MSG_RX_PREFERRED.to_string()));
    }
    vars
}

/// A notice or a bye on the side channel: the byte `kind`, then `count`
/// (little-endian).
fn side_message(kind: u8, count: u64) -> [u8; NOTICE_LEN] {
    let mut m = [0u8; NOTICE_LEN];
    m[0] = kind;
    m[1..].copy_from_slice(&count.to_le_bytes());
    m
}

fn setup_message(provider: &str, addr: &[u8], flags: u8, eager: usize) -> Vec<u8> {
    let mut m = Vec::with_capacity(4 + 1 + provider.len() + 2 + addr.len() + 1 + 4);
    m.extend_from_slice(MAGIC);
    m.push(provider.len().min(255) as u8);
    m.extend_from_slice(&provider.as_bytes()[..provider.len().min(255)]);
    m.extend_from_slice(&(addr.len() as u16).to_le_bytes());
    m.extend_from_slice(addr);
    m.push(flags);
    m.extend_from_slice(&(eager.min(u32::MAX as usize) as u32).to_le_bytes());
    m
}

/// Why the peer's setup message or its "ready" did not come.
enum SetupError {
    /// Reading what: the error.
    Io(&'static str, io::Error),
    /// The peer sent something that is not a setup message of ours.
    Refused(String),
}

impl SetupError {
    /// The message for the rail's error, with the time waited when the
    /// peer said nothing (a read timeout is `WouldBlock` on Linux).
    fn explain(self, timeout: Duration) -> String {
        match self {
            SetupError::Io(what, e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                format!(
                    "{what}: nothing came from the peer for {timeout:?} (it passed the handshake, so it runs, \
                     but has not finished opening its libfabric endpoint: a host with many more ranks than cores? \
                     MULTIRAIL_SETUP_TIMEOUT bounds this wait)"
                )
            }
            SetupError::Io(what, e) => format!("{what}: {e}"),
            SetupError::Refused(m) => m,
        }
    }
}

/// Reads the peer's provider name, address, flags and rxm eager limit,
/// every length bounded.
fn read_setup_message(side: &mut TcpStream) -> Result<(String, Vec<u8>, u8, usize), SetupError> {
    let err = |e: io::Error| SetupError::Io("reading the peer's libfabric address", e);
    let mut head = [0u8; 5];
    side.read_exact(&mut head).map_err(err)?;
    if &head[..3] == b"MRO" && &head[..4] != MAGIC {
        return Err(SetupError::Refused(
            "the peer runs another version of the ofi rail (run the same multirail build on every rank)".into(),
        ));
    }
    if &head[..4] != MAGIC {
        return Err(SetupError::Refused(
            "the peer is not an ofi rail (is the same `ofi:` rail at the same place in both rail lists?)".into(),
        ));
    }
    let mut name = vec![0u8; head[4] as usize];
    side.read_exact(&mut name).map_err(err)?;
    let mut len = [0u8; 2];
    side.read_exact(&mut len).map_err(err)?;
    let len = u16::from_le_bytes(len) as usize;
    if len == 0 || len > MAX_ADDR {
        return Err(SetupError::Refused(format!(
            "the peer sent a libfabric address of {len} bytes (1..={MAX_ADDR} allowed)"
        )));
    }
    let mut addr = vec![0u8; len];
    side.read_exact(&mut addr).map_err(err)?;
    let mut flags = [0u8; 1];
    side.read_exact(&mut flags).map_err(err)?;
    let mut eager = [0u8; 4];
    side.read_exact(&mut eager).map_err(err)?;
    Ok((String::from_utf8_lossy(&name).into_owned(), addr, flags[0], u32::from_le_bytes(eager) as usize))
}

/// What libfabric may still touch by pointer: the endpoint (first field,
/// so it is closed first), its buffers and operation contexts.
struct Leftover {
    _ep: OfiEndpoint,
    _recv_buf: Region,
    _send_buf: Region,
    _recv_ctx: Box<[sys::fi_context2]>,
    _send_ctx: Box<[sys::fi_context2]>,
    _reads: Option<Reads>,
}

// SAFETY: a leftover is never used again, only kept or dropped (under the
// libfabric lock, which `OfiEndpoint::drop` takes).
unsafe impl Send for Leftover {}

/// Endpoints not closed: see [`OfiStream`]'s `Drop`.
static QUARANTINE: std::sync::Mutex<Vec<Leftover>> = std::sync::Mutex::new(Vec::new());
/// At most this many endpoints (about 2 MiB of buffers and a few sockets
/// each) are kept open; past it they are closed.
pub const QUARANTINE_MAX: usize = 64;

impl Drop for OfiStream {
    /// Keeps the endpoint open, with its buffers, until the process exits
    /// (the kernel then releases its sockets), up to [`QUARANTINE_MAX`]
    /// endpoints per process; past that, closes the endpoint, then frees
    /// the buffers.
    ///
    /// Why not close: libfabric 1.17's `tcp;ofi_rxm` crashes inside
    /// `fi_close` on an endpoint whose connection broke with a transfer in
    /// progress: the flush hands `rxm_handle_comp_error` a cancelled
    /// operation with a null context (SIGSEGV; seen on the testbed in
    /// about one run in three when a rail's link went down mid-run and its
    /// replaced connection was closed). What is in progress inside the
    /// provider (rendezvous, segments) is not visible from here, so no
    /// endpoint is trusted to close safely while the process runs.
    ///
    /// An `shm` endpoint's file in /dev/shm is removed at once all the
    /// same: both ends keep their mappings, and no one opens it again.
    fn drop(&mut self) {
        self.ep.unlink_shm_file();
        // The payloads we lent are freed after this (the rail holds
        // them): no one may read them through their registrations then.
        if !self.lent_mrs.is_empty() {
            let _libfabric = super::lock();
            while let Some(mr) = self.lent_mrs.pop_front() {
                // SAFETY: an open registration of ours, not used again.
                unsafe { self.ep.close_mr(mr) };
            }
        }
        // SAFETY: each field is taken exactly once, here, and self is not
        // used afterwards.
        let left = unsafe {
            Leftover {
                _ep: ManuallyDrop::take(&mut self.ep),
                _recv_buf: ManuallyDrop::take(&mut self.recv_buf),
                _send_buf: ManuallyDrop::take(&mut self.send_buf),
                _recv_ctx: ManuallyDrop::take(&mut self.recv_ctx),
                _send_ctx: ManuallyDrop::take(&mut self.send_ctx),
                _reads: self.reads.take().map(ManuallyDrop::into_inner),
            }
        };
        let mut q = QUARANTINE.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() < QUARANTINE_MAX {
            q.push(left);
            return;
        }
        drop(q);
        drop(left);
    }
}

impl ByteStream for OfiStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let _libfabric = super::lock();
        let mut n = self.deliver(buf)?;
        // An engine that never arms us sleeps on raw_fd after a read that
        // finds nothing: make that sleep safe as fi_trywait requires, and
        // read what it says is there (bounded: each round reads the CQ).
        if n == 0 && !buf.is_empty() && !self.engine_arms && self.ep.wait_fd().is_some() {
            for _ in 0..8 {
                if self.try_wait() {
                    break;
                }
                n = self.deliver(buf)?;
                if n > 0 {
                    break;
                }
            }
        }
        if n > 0 || buf.is_empty() {
            self.empty_reads = 0;
            return Ok(n);
        }
        self.empty_reads += 1;
        let notices = self.peer_notices
            && (std::mem::take(&mut self.side_after_post) || self.empty_reads.is_multiple_of(SIDE_EVERY_NOTICES));
        if !self.engine_arms || notices || self.empty_reads.is_multiple_of(SIDE_EVERY) {
            self.check_side();
        }
        if self.shut || ((self.peer_gone || self.peer_bye.is_some()) && !self.bye_pending()) {
            return Ok(0);
        }
        Err(io::ErrorKind::WouldBlock.into())
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let _libfabric = super::lock();
        if self.shut {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        // Completions are reaped before the send only when they are
        // needed (a free slot, a credit): otherwise the CQ read (a system
        // call or two through tcp;ofi_rxm) would come between a received
        // message and the reply to it. The engine reads the CQ anyway.
        if let Some(e) = &self.failed {
            return Err(io::Error::other(e.clone()));
        }
        if self.filled - self.completed >= SLOTS as u64 || !self.credits.may_post() {
            self.progress().map_err(io::Error::other)?;
        }
        let mut total = 0;
        let mut parts = bufs.iter().map(|b| &b[..]).filter(|b| !b.is_empty()).peekable();
        let mut part_pos = 0;
        while self.filled - self.completed < SLOTS as u64 && parts.peek().is_some() {
            let i = (self.filled % SLOTS as u64) as usize;
            let mut len = 0;
            let max = self.send_max;
            while len < max {
                let Some(part) = parts.peek() else { break };
                let take = (part.len() - part_pos).min(max - len);
                // SAFETY: slot i is free (its send completed, or never
                // posted) and has CHUNK bytes; HEADER + len + take <= CHUNK.
                unsafe {
                    ptr::copy_nonoverlapping(part[part_pos..].as_ptr(), self.send_buf.slot(i).add(HEADER + len), take)
                };
                len += take;
                part_pos += take;
                if part_pos == part.len() {
                    parts.next();
                    part_pos = 0;
                }
            }
            self.send_len[i] = HEADER + len;
            self.filled += 1;
            total += len;
        }
        self.post_sends().map_err(io::Error::from)?;
        if total == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(total)
    }

    fn raw_fd(&self) -> RawFd {
        self.poller.as_raw_fd()
    }

    fn shutdown(&mut self) {
        self.shut = true;
        let _ = self.side.shutdown(std::net::Shutdown::Both);
    }

    fn close(&mut self, by: Instant) {
        if !self.shut && !self.peer_gone && self.failed.is_none() {
            // Sends still in the provider at `by` are lost with the
            // process, as over a connection that breaks.
            self.linger(by);
            let m = side_message(BYE, self.posted);
            // Best effort: a side channel too full for 9 bytes (a peer
            // that has not read for long) gets the end alone.
            let _ = Write::write(&mut self.side, &m);
        }
        self.shutdown();
    }

    fn spin_poll(&self) -> bool {
        true
    }

    fn lend_min(&self) -> Option<usize> {
        self.lend_min
    }

    fn lent_desc_len(&self) -> usize {
        LENT_DESC
    }

    fn lend(&mut self, payload: &[u8]) -> Option<Bytes> {
        self.lend_min?;
        let _libfabric = super::lock();
        let key = LENT_KEY_BASE + self.lent_total % LENT_KEYS;
        // SAFETY: the rail keeps the payload alive and in place until
        // lent_done counts it, which is after its registration is closed
        // (peer_read, or Drop); keys of the lent registrations still open
        // are the last far fewer than LENT_KEYS, so unique.
        let (mr, addr, key) = match unsafe { self.ep.register_lent(payload.as_ptr(), payload.len(), key) } {
            Ok(r) => r,
            Err(_) => {
                // The provider refuses (out of registrations, say): this
                // stream sends everything inline from now on.
                self.lend_min = None;
                return None;
            }
        };
        self.lent_mrs.push_back(mr);
        self.lent_total += 1;
        let mut d = [0u8; LENT_DESC];
        d[..8].copy_from_slice(&addr.to_le_bytes());
        d[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        d[16..].copy_from_slice(&key.to_le_bytes());
        Some(Bytes::copy_from_slice(&d))
    }

    fn lent_done(&self) -> u64 {
        self.lent_read
    }

    fn copy_lent(&mut self, desc: &[u8], len: usize, _dst: Option<&mut [u8]>) -> io::Result<LentCopy> {
        let _libfabric = super::lock();
        if !self.rma {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the peer lent a payload although this endpoint has no RMA",
            ));
        }
        let word = |i: usize| u64::from_le_bytes(desc[i * 8..i * 8 + 8].try_into().expect("descriptor"));
        let (addr, lent_len, key) = (word(0), word(1), word(2));
        if lent_len != len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a lent payload of {lent_len} bytes in a frame of {len}"),
            ));
        }
        self.reads()?.lent.push_back(LentIn { addr, key, len, asked: 0 });
        self.post_reads()?;
        Ok(LentCopy::Started)
    }

    fn lent_poll(&mut self, dst: Option<&mut [u8]>) -> io::Result<bool> {
        let _libfabric = super::lock();
        if self.reads.as_ref().is_none_or(|r| r.lent.is_empty()) {
            return Err(io::Error::other("no copy of a lent payload was started"));
        }
        if !self.has_read_ready() {
            self.progress().map_err(io::Error::other)?;
        }
        let done = self.finish_read(dst);
        // Freed read buffers take the next pieces; a payload read out is
        // told to the peer (with a header alone if nothing else goes).
        self.post_reads()?;
        if done {
            self.post_sends()?;
        }
        Ok(done)
    }

    fn deadline(&self) -> Option<Instant> {
        // Without a wait fd nothing announces a completion: an engine that
        // only services a rail on readiness or a deadline (the threaded
        // one) must come back on its own; by the doorbell, only while the
        // provider holds sends of ours (the peer rings for the rest).
        if self.doorbell {
            return (self.posted > self.completed).then(|| Instant::now() + POLL_EVERY * (1 << self.poll_backoff));
        }
        self.ep.wait_fd().is_none().then(|| Instant::now() + POLL_EVERY)
    }

    fn wakeups_sent(&self) -> u64 {
        self.rings
    }

    fn engine_arms(&mut self) {
        self.engine_arms = true;
    }

    fn arm(&mut self) -> bool {
        let _libfabric = super::lock();
        self.engine_arms = true;
        match self.progress() {
            Err(_) => return true, // the next read reports it
            Ok(true) => return true,
            Ok(false) => {}
        }
        // Filled sends waiting for credits are no reason to stay awake: the
        // peer's return arrives as a completion.
        let can_post = self.posted < self.filled && self.credits.may_post();
        if self.has_recv_ready() || self.has_read_ready() || can_post || !self.repost.is_empty() {
            return true;
        }
        self.check_side();
        if self.peer_gone || self.failed.is_some() || self.peer_bye.is_some() {
            // The next read reports it; messages the bye counts are
            // looked for until they came or `BYE_WAIT` passed.
            return true;
        }
        if self.doorbell {
            // Sends the provider still holds need its progress: the sleep
            // is bounded (`deadline`), longer each time nothing moved.
            if self.posted > self.completed {
                self.poll_backoff = (self.poll_backoff + 1).min(POLL_BACKOFF_MAX);
            } else if self.inject_unconfirmed() && self.post_probe() {
                return true;
            }
            if !self.notice_out {
                if !self.send_notice() {
                    return true;
                }
                // What came before the notice went is ours to see: look
                // once more (the peer rings for anything after).
                let posted = self.posted;
                if !matches!(self.progress(), Ok(false)) || self.has_recv_ready() || self.posted != posted {
                    return true;
                }
            }
            return false;
        }
        if self.ep.wait_fd().is_none() {
            self.empty_arms += 1;
            if self.empty_arms < SPIN_ARMS {
                return true;
            }
            self.empty_arms = 0;
            return false;
        }
        !self.try_wait()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::StreamRail;
    use crate::tests_util::{CollectSink, pair_streams};
    use crate::{Rail, RailCaps, RailError};
    use bytes::Bytes;
    use multirail_proto::wire::frame::Limits;
    use multirail_proto::wire::{FrameHeader, Op};

    fn tcp_loopback() -> Selector {
        Selector { provider: "tcp".into(), node: Some("127.0.0.1".parse().unwrap()), domain: None }
    }

    fn pair(sel: &Selector) -> Option<(OfiStream, OfiStream)> {
        pair_sending(sel, None)
    }

    /// A connected pair whose sends are at most `send` bytes, lending
    /// nothing.
    fn pair_sending(sel: &Selector, send: Option<usize>) -> Option<(OfiStream, OfiStream)> {
        pair_with(sel, send, None, None)
    }

    /// A connected pair: sends of at most `send` bytes; `a` lends payloads
    /// of at least `lend_a` bytes, `b` of `lend_b`.
    fn pair_with(
        sel: &Selector,
        send: Option<usize>,
        lend_a: Option<usize>,
        lend_b: Option<usize>,
    ) -> Option<(OfiStream, OfiStream)> {
        pair_full(sel, send, lend_a, lend_b, false)
    }

    /// A connected pair whose sides sleep by the side channel's doorbell.
    fn pair_doorbell(sel: &Selector) -> Option<(OfiStream, OfiStream)> {
        pair_full(sel, None, None, None, true)
    }

    fn pair_full(
        sel: &Selector,
        send: Option<usize>,
        lend_a: Option<usize>,
        lend_b: Option<usize>,
        doorbell: bool,
    ) -> Option<(OfiStream, OfiStream)> {
        pair_connecting(sel, send, lend_a, lend_b, doorbell, [false, false])
    }

    /// `connect`: whether a and b ask for the first messages to cross at
    /// setup ([`OfiStream::connect`]), as on a crowded host.
    fn pair_connecting(
        sel: &Selector,
        send: Option<usize>,
        lend_a: Option<usize>,
        lend_b: Option<usize>,
        doorbell: bool,
        connect: [bool; 2],
    ) -> Option<(OfiStream, OfiStream)> {
        let (a, b) = pair_streams();
        let t = Duration::from_secs(20);
        let sel2 = sel.clone();
        let hb =
            std::thread::spawn(move || OfiStream::over_side_channel(&sel2, b, t, send, lend_b, doorbell, connect[1]));
        let a = OfiStream::over_side_channel(sel, a, t, send, lend_a, doorbell, connect[0]);
        let b = hb.join().unwrap();
        match (a, b) {
            (Ok(a), Ok(b)) => Some((a, b)),
            (Err(e), _) | (_, Err(e)) if e.contains("offers no reliable-datagram") => {
                eprintln!("skipped: {e}");
                None
            }
            (a, b) => panic!("setup failed: {:?} / {:?}", a.err(), b.err()),
        }
    }

    fn rail(s: OfiStream) -> StreamRail<OfiStream> {
        let caps = RailCaps { name: "ofi".into(), bandwidth: 0, latency: Duration::ZERO, max_frame: 1 << 24 };
        StreamRail::over(s, caps, Limits::default())
    }

    /// Frames of every size class (inside one chunk, across chunks, more
    /// than all send slots hold) arrive whole and in order, both ways.
    fn frames_cross_in_order(sel: Selector) {
        frames_cross_in_order_sending(sel, None);
    }

    fn frames_cross_in_order_sending(sel: Selector, send: Option<usize>) {
        let Some((a, b)) = pair_sending(&sel, send) else { return };
        eprintln!("{}", a.describe());
        let (mut a, mut b) = (rail(a), rail(b));
        let sizes = [0usize, 1, 8, 48, CHUNK - 48, CHUNK, CHUNK + 1, 3 << 20, 5, 100_000];
        send_patterns(&mut a, &mut b, &sizes);
        cross_and_check(&mut a, &mut b, &sizes);
        assert_eq!(a.queued_bytes(), 0);
    }

    /// Queues on `a` and on `b` a frame of each size, `seq` = index,
    /// payload `pattern(index)` from `a`, `pattern(index + 100)` from `b`.
    fn send_patterns(a: &mut StreamRail<OfiStream>, b: &mut StreamRail<OfiStream>, sizes: &[usize]) {
        for (i, &n) in sizes.iter().enumerate() {
            let mut h = FrameHeader::new(Op::Eager);
            h.seq = i as u64;
            h.total_len = n as u64;
            h.frag_len = n as u32;
            a.send(&h, Bytes::from(multirail_proto::sim::pattern(i as u64, n).to_vec()));
            b.send(&h, Bytes::from(multirail_proto::sim::pattern(i as u64 + 100, n).to_vec()));
        }
    }

    /// Drives both rails until every frame of [`send_patterns`] arrived
    /// and nothing is still lent (at most 30 s), then checks each frame's
    /// order and bytes.
    fn cross_and_check(a: &mut StreamRail<OfiStream>, b: &mut StreamRail<OfiStream>, sizes: &[usize]) {
        let (mut sa, mut sb) = (CollectSink::default(), CollectSink::default());
        let deadline = Instant::now() + Duration::from_secs(30);
        while sa.frames.len() < sizes.len()
            || sb.frames.len() < sizes.len()
            || a.lent_outstanding() + b.lent_outstanding() > 0
        {
            assert!(
                Instant::now() < deadline,
                "timed out: {} / {} frames, {} / {} still lent",
                sa.frames.len(),
                sb.frames.len(),
                a.lent_outstanding(),
                b.lent_outstanding()
            );
            a.flush().unwrap();
            b.flush().unwrap();
            a.poll_recv(&mut sa).unwrap();
            b.poll_recv(&mut sb).unwrap();
        }
        for (sink, base) in [(&sb, 0), (&sa, 100)] {
            for (i, (h, p)) in sink.frames.iter().enumerate() {
                assert_eq!(h.seq, i as u64);
                assert_eq!(p[..], multirail_proto::sim::pattern(i as u64 + base, sizes[i])[..], "frame {i}");
            }
        }
    }

    /// Frames with RMA: payloads of at least `MIN` bytes are lent (only a
    /// descriptor crosses), smaller ones are copied; all arrive intact
    /// and in order both ways, also a payload larger than all read
    /// buffers together, and each side lets go of what it lent once the
    /// peer says it has read it.
    fn lent_frames_cross_and_are_returned(sel: Selector) {
        const MIN: usize = 16 << 10;
        let Some((a, b)) = pair_with(&sel, None, Some(MIN), Some(MIN)) else { return };
        eprintln!("{}", a.describe());
        if !a.rma {
            eprintln!("skipped: provider {} has no RMA here", a.ep.provider());
            return;
        }
        let (mut a, mut b) = (rail(a), rail(b));
        let big = READ_SLOTS * READ_CHUNK + 12345;
        let sizes = [MIN, 5, MIN - 1, big, 0, 200 << 10, MIN + 1, 3 << 20, 48];
        let lent = sizes.iter().filter(|&&n| n >= MIN).count();
        send_patterns(&mut a, &mut b, &sizes);
        assert_eq!(a.lent_outstanding(), lent, "payloads of at least {MIN} bytes are lent");
        assert_eq!(b.lent_outstanding(), lent);
        cross_and_check(&mut a, &mut b, &sizes);
        assert_eq!(a.stream().lent_mrs.len() + b.stream().lent_mrs.len(), 0, "registrations closed");
    }

    #[test]
    fn tcp_lent_frames_cross_and_are_returned() {
        lent_frames_cross_and_are_returned(tcp_loopback());
    }

    #[test]
    fn shm_lent_frames_cross_and_are_returned() {
        let _one_at_a_time = shm_names_lock();
        lent_frames_cross_and_are_returned(shm());
    }

    /// A peer that claims to have read more payloads than were lent to it
    /// is a protocol error; counts wrap at 2^32.
    #[test]
    fn a_read_count_beyond_the_loans_is_refused() {
        let Some((mut a, _b)) = pair_with(&tcp_loopback(), None, Some(1024), Some(1024)) else { return };
        if !a.rma {
            eprintln!("skipped: no RMA here");
            return;
        }
        assert!(a.peer_read(0).is_ok(), "nothing new");
        let e = a.peer_read(1).unwrap_err();
        assert!(e.contains("read 1 more lent payloads, but 0 are lent"), "{e}");
        // Two loans outstanding after 2^32 - 1 returned: the count wraps.
        a.lent_total = u64::from(u32::MAX) + 2;
        a.lent_read = u64::from(u32::MAX);
        a.lent_mrs.extend([ptr::null_mut(); 2]); // never closed: refused first
        let r = a.peer_read(2);
        a.lent_mrs.clear();
        assert!(r.as_ref().is_err_and(|e| e.contains("read 3 more")), "{r:?}");
    }

    /// A descriptor whose key lends nothing: the read fails, the rail
    /// fails, and nothing is delivered.
    #[test]
    fn a_lent_payload_with_a_wrong_key_fails_the_rail() {
        let Some((a, b)) = pair_with(&tcp_loopback(), None, Some(1024), Some(1024)) else { return };
        if !a.rma {
            eprintln!("skipped: no RMA here");
            return;
        }
        let (mut a, mut b) = (rail(a), rail(b));
        let mut h = FrameHeader::new(Op::Eager);
        h.total_len = 4096;
        h.frag_len = 4096;
        let payload = Bytes::from(vec![7u8; 4096]);
        // Lend it for real, then send a second descriptor for the same
        // range under another key, written straight into the stream.
        a.send(&h, payload.clone());
        let mut raw = h.to_bytes();
        raw[crate::tcp::FLAGS_HIGH] |= crate::tcp::LENT_FLAG;
        let mut d = [0u8; LENT_DESC];
        d[8..16].copy_from_slice(&4096u64.to_le_bytes());
        d[16..].copy_from_slice(&0xdead_beefu64.to_le_bytes());
        let mut sink = CollectSink::default();
        let deadline = Instant::now() + Duration::from_secs(20);
        while sink.frames.is_empty() {
            assert!(Instant::now() < deadline, "the honest loan did not arrive");
            a.flush().unwrap();
            a.arm(); // the lender's progress serves the read
            b.poll_recv(&mut sink).unwrap();
        }
        let forged = [&raw[..], &d[..]].concat();
        let mut at = 0;
        while at < forged.len() {
            assert!(Instant::now() < deadline, "could not write the forged frame");
            match a.stream_mut().write_vectored(&[IoSlice::new(&forged[at..])]) {
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("write: {e}"),
            }
        }
        let err = loop {
            assert!(Instant::now() < deadline, "the forged loan was not refused");
            a.flush().unwrap();
            a.arm();
            if let Err(e) = b.poll_recv(&mut sink) {
                break e;
            }
            b.arm();
        };
        eprintln!("refused: {err}");
        assert_eq!(sink.frames.len(), 1, "only the honest payload is delivered");
        assert!(sink.frames[0].1.iter().all(|&x| x == 7));
        assert!(matches!(err, RailError::Io(_)), "{err}");
    }

    /// Writes `bytes` whole into `s` (retrying while it would block).
    fn write_all(s: &mut OfiStream, bytes: &[u8]) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut at = 0;
        while at < bytes.len() {
            assert!(Instant::now() < deadline, "could not write");
            match s.write_vectored(&[IoSlice::new(&bytes[at..])]) {
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("write: {e}"),
            }
        }
    }

    /// Reads exactly `buf.len()` bytes from `s` (at most 20 s).
    fn read_exact(s: &mut OfiStream, buf: &mut [u8]) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut at = 0;
        while at < buf.len() {
            assert!(Instant::now() < deadline, "read {at} of {} bytes", buf.len());
            match s.read(&mut buf[at..]) {
                Ok(0) => panic!("end of stream"),
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// Reads `s` until the end of the stream (at most 20 s).
    fn read_to_end(s: &mut OfiStream) -> Vec<u8> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut got = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            assert!(Instant::now() < deadline, "no end of stream after {} bytes", got.len());
            match s.read(&mut buf) {
                Ok(0) => return got,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// Closing in order: a stream closed right after its last writes (the
    /// provider still holding some: the first message also sets up rxm's
    /// connection) hands every byte to its reader, which reads all along,
    /// before the reader sees the end; a bye that counts messages that
    /// never come ends the stream after `BYE_WAIT`.
    fn a_closed_stream_hands_over_its_last_messages(doorbell: bool) {
        let Some((mut a, b)) = pair_full(&tcp_loopback(), None, None, None, doorbell) else { return };
        let reader = std::thread::spawn(move || {
            let mut b = b;
            let got = read_to_end(&mut b);
            (b, got)
        });
        // Small messages (injected) and larger ones, fewer than the
        // credits let through.
        let mut sent = Vec::new();
        for k in 0..SLOTS / 2 {
            let len = if k % 2 == 0 { 20 } else { 3000 };
            let m: Vec<u8> = (0..len).map(|i| (i * 7 + k) as u8).collect();
            write_all(&mut a, &m);
            sent.extend_from_slice(&m);
        }
        a.close(Instant::now() + Duration::from_secs(10));
        assert!(
            a.shut && a.posted == a.filled && a.completed == a.posted && !a.inject_unconfirmed(),
            "all written: posted {} filled {} completed {} inject_last {} may_post {}",
            a.posted,
            a.filled,
            a.completed,
            a.inject_last,
            a.credits.may_post()
        );
        let posted = a.posted;
        drop(a);
        let (b, got) = reader.join().unwrap();
        assert_eq!(got.len(), sent.len(), "bytes before the end");
        assert!(got == sent, "the bytes read differ from the bytes written");
        assert_eq!(b.peer_bye.map(|(k, _)| k), Some(posted), "the bye counts every message posted");
        assert_eq!(b.recvd, posted);
        // A bye counting one message more than ever comes: the end is
        // reported once BYE_WAIT has passed.
        let Some((a, mut b)) = pair_full(&tcp_loopback(), None, None, None, doorbell) else { return };
        Write::write_all(&mut (&a.side), &side_message(BYE, a.posted + 1)).unwrap();
        read_side_until(&mut b, |b| b.peer_bye.is_some());
        let mut buf = [0u8; 8];
        assert_eq!(b.read(&mut buf).map_err(|e| e.kind()), Err(io::ErrorKind::WouldBlock), "waits for it");
        assert!(read_to_end(&mut b).is_empty());
        drop(a);
    }

    /// A peer that reads nothing returns no credits: a closing stream
    /// with messages it cannot post waits for them only until the time it
    /// was given, then says bye with what it posted; those arrive, the
    /// rest is lost as with a connection that breaks.
    #[test]
    fn a_peer_that_reads_nothing_holds_a_close_only_for_its_time() {
        let Some((mut a, b)) = pair(&tcp_loopback()) else { return };
        let m = [7u8; 100];
        for _ in 0..SLOTS {
            write_all(&mut a, &m);
        }
        assert!(a.posted < a.filled, "more written than the credits let post");
        let given = Duration::from_secs(1);
        let start = Instant::now();
        a.close(start + given);
        let took = start.elapsed();
        assert!(took >= given, "gave up after {took:?}, before its time");
        assert!(took < given * 5, "held for {took:?}");
        assert!(a.shut && a.posted < a.filled);
        let posted = a.posted;
        drop(a);
        let mut b = b;
        let got = read_to_end(&mut b);
        assert_eq!(got.len() as u64, posted * m.len() as u64, "what was posted arrives");
        assert_eq!(b.peer_bye.map(|(k, _)| k), Some(posted));
    }

    #[test]
    fn a_closed_stream_hands_over_its_last_messages_with_the_wait_fd() {
        a_closed_stream_hands_over_its_last_messages(false);
    }

    #[test]
    fn a_closed_stream_hands_over_its_last_messages_by_the_doorbell() {
        a_closed_stream_hands_over_its_last_messages(true);
    }

    /// A message that fits the provider's inject size goes by `fi_inject`:
    /// its slot is free when the write returns, with no completion to
    /// wait for; a larger one by `fi_send`, freed at its completion. Both
    /// arrive intact. A write with a free slot and a credit reads no CQ
    /// (the reply to a message is not held up by it), and a message read
    /// in pieces costs one CQ read, not one per piece.
    fn small_sends_are_injected(sel: Selector) {
        let Some((mut a, mut b)) = pair(&sel) else { return };
        eprintln!("{} (inject size {})", a.describe(), a.inject_max);
        // A first message sets up rxm's connection (its send may be
        // refused with EAGAIN meanwhile, and posted by a later CQ read).
        write_all(&mut a, b"hello");
        let mut hello = [0u8; 5];
        while a.posted < a.filled {
            let _ = a.read(&mut []);
            let _ = b.read(&mut []);
        }
        read_exact(&mut b, &mut hello);
        let injected = a.injected;
        let small: Vec<u8> = (0..56u8).collect();
        let reads = a.cq_reads;
        write_all(&mut a, &small);
        assert_eq!(a.cq_reads, reads, "a write with a free slot and a credit reads no CQ");
        if a.inject_max >= HEADER + small.len() {
            assert_eq!(a.injected, injected + 1);
            assert_eq!(a.completed, a.posted, "an injected message frees its slot at once");
        } else {
            assert_eq!(a.injected, 0, "the provider injects at most {} bytes", a.inject_max);
        }
        let large = multirail_proto::sim::pattern(3, CHUNK - HEADER).to_vec();
        write_all(&mut a, &large);
        assert!(a.completed < a.posted, "a large message is sent, and waits for its completion");
        let mut got = vec![0u8; small.len()];
        // The first piece: the CQ is read until the message is there.
        read_exact(&mut b, &mut got[..48]);
        let reads = b.cq_reads;
        read_exact(&mut b, &mut got[48..]);
        assert_eq!(b.cq_reads, reads, "the rest of a received message is read without the CQ");
        assert_eq!(got, small);
        let mut got = vec![0u8; large.len()];
        read_exact(&mut b, &mut got);
        assert!(got == large, "the large message arrived intact");
    }

    #[test]
    fn tcp_small_sends_are_injected() {
        small_sends_are_injected(tcp_loopback());
    }

    #[test]
    fn shm_small_sends_are_injected() {
        let _one_at_a_time = shm_names_lock();
        small_sends_are_injected(shm());
    }

    /// A warmed-up doorbell pair: one message a -> b read, so that rxm's
    /// connection is up.
    fn doorbell_pair() -> Option<(OfiStream, OfiStream)> {
        let (mut a, mut b) = pair_doorbell(&tcp_loopback())?;
        assert!(a.ep.wait_fd().is_none() && a.doorbell, "{}", a.describe());
        write_all(&mut a, b"hello");
        let deadline = Instant::now() + Duration::from_secs(20);
        while a.posted < a.filled {
            assert!(Instant::now() < deadline, "rxm's connection did not come up");
            let _ = a.read(&mut []);
            let _ = b.read(&mut []);
        }
        let mut hello = [0u8; 5];
        read_exact(&mut b, &mut hello);
        Some((a, b))
    }

    /// Arms `s` until it lets its engine sleep (at most 20 s).
    fn arm_until_asleep(s: &mut OfiStream) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while s.arm() {
            assert!(Instant::now() < deadline, "never let the engine sleep");
        }
    }

    /// Reads the side channel of `s` (an empty read does) until `until`.
    fn read_side_until(s: &mut OfiStream, until: impl Fn(&OfiStream) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !until(s) {
            assert!(Instant::now() < deadline, "the side channel did not bring it");
            s.check_side();
        }
    }

    /// Whether `fd` becomes readable within `ms` milliseconds.
    fn readable_within(fd: RawFd, ms: i32) -> bool {
        // SAFETY: fd is open for the duration of the call (owned by the
        // stream the caller borrows).
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let mut p = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
        let t = rustix::event::Timespec { tv_sec: i64::from(ms / 1000), tv_nsec: i64::from(ms % 1000) * 1_000_000 };
        rustix::event::poll(&mut p, Some(&t)).unwrap_or(0) > 0
    }

    /// Doorbell mode: a reader that goes to sleep tells its peer how many
    /// messages it received; the peer's next message rings it (its fd,
    /// the side channel, becomes readable), once; the ring ends the notice.
    #[test]
    fn doorbell_a_sleeping_reader_is_rung_by_the_next_message() {
        let Some((mut a, mut b)) = doorbell_pair() else { return };
        arm_until_asleep(&mut b);
        assert!(b.notice_out);
        assert!(!readable_within(b.raw_fd(), 50), "nothing to wake for yet");
        read_side_until(&mut a, |a| a.peer_asleep);
        assert_eq!(a.rings, 0);
        write_all(&mut a, b"wake up");
        assert_eq!(a.rings, 1, "the message rang");
        assert!(!a.peer_asleep);
        assert!(readable_within(b.raw_fd(), 5000), "the ring wakes the reader");
        let mut got = [0u8; 7];
        read_exact(&mut b, &mut got);
        assert_eq!(&got, b"wake up");
        read_side_until(&mut b, |b| !b.notice_out);
        write_all(&mut a, b"!");
        assert_eq!(a.rings, 1, "a peer that is awake is not rung");
    }

    /// Doorbell mode, the first message ever: rxm sets up its connection
    /// then, which needs the sleeping peer's progress, so a post the
    /// provider cannot take yet rings the peer too; the message then
    /// arrives.
    #[test]
    fn doorbell_a_sleeper_is_rung_while_the_first_message_waits_for_the_connection() {
        let Some((mut a, mut b)) = pair_doorbell(&tcp_loopback()) else { return };
        arm_until_asleep(&mut b);
        read_side_until(&mut a, |a| a.peer_asleep);
        write_all(&mut a, b"first");
        let eagain = a.posted < a.filled;
        eprintln!("the first post waited for rxm's connection: {eagain}");
        assert_eq!(a.rings, 1, "rung at the first attempt");
        assert!(readable_within(b.raw_fd(), 5000), "the ring wakes the sleeper");
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut got = [0u8; 5];
        let mut at = 0;
        while at < got.len() {
            assert!(Instant::now() < deadline, "the first message did not arrive");
            let _ = a.read(&mut []);
            match b.read(&mut got[at..]) {
                Ok(n) if n > 0 => at += n,
                Ok(_) => panic!("end of stream"),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("read: {e}"),
            }
        }
        assert_eq!(&got, b"first");
    }

    /// Through rxm, the first message one way waits for a connection that
    /// needs the peer's progress. A pair set up with `connect` made it,
    /// so a message is taken at once while the peer reads nothing (asleep,
    /// or busy elsewhere: 64 ranks on 2 CPUs left messages unacknowledged
    /// for 10 s that way); a pair set up without has to wait.
    #[test]
    fn a_pair_that_connected_at_setup_takes_the_first_message_while_the_peer_reads_nothing() {
        let Some((mut a, b)) = pair_connecting(&tcp_loopback(), None, None, None, false, [true, true]) else { return };
        assert!(a.recvd == 1 && b.recvd == 1, "one message each way at setup");
        eprintln!("{}", a.describe());
        for i in 0..3u8 {
            write_all(&mut a, &[i; 100]);
            assert_eq!(a.posted, a.filled, "message {i} was taken at once");
        }
        let Some((mut a, b)) = pair(&tcp_loopback()) else { return };
        write_all(&mut a, b"first");
        assert!(a.posted < a.filled, "without, the first message waits for the peer");
        drop(b);
    }

    /// One side asking for the first messages at setup is enough: both
    /// exchange them (each decides from its own host's crowding, and a
    /// side waiting for a first message the other never sends would
    /// wait out the setup timeout).
    #[test]
    fn either_side_asking_makes_both_exchange_first_messages() {
        for asks in [true, false] {
            let Some((a, b)) = pair_connecting(&tcp_loopback(), None, None, None, false, [asks, !asks]) else {
                return;
            };
            assert_eq!((a.recvd, b.recvd, a.completed, b.completed), (1, 1, 1, 1), "asks: {asks}");
        }
    }

    /// Doorbell mode, the sender's side: a notice that counts fewer
    /// messages than were posted (the rest crossed it) is answered by a
    /// ring at once; one that counts all of them makes the next post ring;
    /// one that counts more than were posted fails the stream.
    #[test]
    fn doorbell_a_notice_is_answered_by_what_was_posted() {
        let Some((mut a, mut b)) = doorbell_pair() else { return };
        let notice = |k: u64| side_message(NOTICE, k);
        let posted = a.posted;
        assert!(posted >= 1);
        // Split in two writes: a notice read in part is kept.
        let m = notice(posted - 1);
        Write::write_all(&mut b.side, &m[..4]).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        a.check_side();
        assert_eq!(a.rings, 0);
        Write::write_all(&mut b.side, &m[4..]).unwrap();
        read_side_until(&mut a, |a| a.rings == 1);
        assert!(!a.peer_asleep, "rung at once: nothing left to ring for");
        Write::write_all(&mut b.side, &notice(posted)).unwrap();
        read_side_until(&mut a, |a| a.peer_asleep);
        assert_eq!(a.rings, 1);
        Write::write_all(&mut b.side, &notice(posted + 1)).unwrap();
        read_side_until(&mut a, |a| a.failed.is_some());
        let e = a.failed.clone().unwrap();
        assert!(e.contains("received") && e.contains("we posted"), "{e}");
    }

    /// Doorbell mode: an injected message has no completion, and may still
    /// sit in the provider when the rank wants to sleep; it sleeps only
    /// once a message sent after it (a header alone, by `fi_send`) has
    /// completed, so nothing of ours waits in the provider while we sleep.
    #[test]
    fn doorbell_an_injected_message_is_confirmed_before_sleeping() {
        let Some((mut a, mut b)) = doorbell_pair() else { return };
        if a.inject_max < HEADER + 3 {
            eprintln!("skipped: this provider injects at most {} bytes", a.inject_max);
            return;
        }
        arm_until_asleep(&mut a);
        read_side_until(&mut b, |b| b.peer_asleep);
        let (posted, injected) = (a.posted, a.injected);
        write_all(&mut a, b"abc");
        assert_eq!((a.posted, a.injected), (posted + 1, injected + 1), "injected");
        assert!(a.inject_unconfirmed());
        assert!(a.arm(), "no sleep with an injected message unconfirmed");
        assert_eq!((a.posted, a.injected), (posted + 2, injected + 1), "a header alone, sent");
        arm_until_asleep(&mut a);
        assert!(!a.inject_unconfirmed());
        let mut got = [0u8; 3];
        read_exact(&mut b, &mut got);
        assert_eq!(&got, b"abc");
    }

    /// With an engine that arms the rails before it sleeps, credits due
    /// after a read are returned by the next CQ read or `arm`, not by the
    /// read itself: frames of every size still cross both ways (the
    /// credits flow, nothing stalls).
    #[test]
    fn tcp_frames_cross_in_order_when_the_engine_arms() {
        let Some((a, b)) = pair(&tcp_loopback()) else { return };
        let (mut a, mut b) = (rail(a), rail(b));
        a.engine_arms();
        b.engine_arms();
        let sizes = [0usize, 1, 8, 48, CHUNK - 48, CHUNK, CHUNK + 1, 3 << 20, 5, 100_000];
        send_patterns(&mut a, &mut b, &sizes);
        cross_and_check(&mut a, &mut b, &sizes);
    }

    #[test]
    fn tcp_frames_cross_in_order_in_16k_sends() {
        // MULTIRAIL_OFI_SEND=16K: frames cut across many sends, each
        // smaller than one buffer.
        frames_cross_in_order_sending(tcp_loopback(), Some(16 << 10));
    }

    /// A reader whose engine runs but who does not read holds its writer
    /// to the receives it posted: eager sends through rxm (16 KiB) never
    /// pile up in the reader's rxm. Then the reader reads, and the writer
    /// goes on, every byte in order, on credits returned by messages that
    /// carry nothing else (the reader sends no data).
    #[test]
    fn a_writer_is_held_to_the_receives_its_peer_posted() {
        let send = RXM_EAGER_DEFAULT;
        let Some((mut a, mut b)) = pair_sending(&tcp_loopback(), Some(send)) else { return };
        let per_send = send - HEADER;
        let total = 8 << 20;
        let data = multirail_proto::sim::pattern(7, total);
        let mut written = 0;
        // Phase 1: write while the reader only drives its provider. Without
        // credits every eager send completes at once and this runs to the
        // end of the data.
        let until = Instant::now() + Duration::from_secs(10);
        let mut blocked_since: Option<Instant> = None;
        while written < total && Instant::now() < until {
            b.arm();
            match a.write_vectored(&[IoSlice::new(&data[written..(written + per_send).min(total)])]) {
                Ok(n) => {
                    written += n;
                    blocked_since = None;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    a.arm();
                    if blocked_since.get_or_insert_with(Instant::now).elapsed() > Duration::from_millis(300) {
                        break;
                    }
                }
                Err(e) => panic!("write: {e}"),
            }
        }
        // What the writer accepts: the reader's receives (all but the last
        // credit), plus its own send buffers, filled and waiting.
        let bound = (2 * SLOTS - 1) * per_send;
        assert!(
            written <= bound,
            "the writer got {written} bytes out to a reader that read nothing; its {SLOTS} receives and the \
             writer's {SLOTS} send buffers hold {bound}"
        );
        assert!(written >= SLOTS * per_send, "only {written} bytes written");
        // Phase 2: the reader reads; the writer finishes.
        let mut got = vec![0u8; total];
        let mut read = 0;
        let until = Instant::now() + Duration::from_secs(60);
        while read < total {
            assert!(Instant::now() < until, "stalled at {read} of {total} bytes read, {written} written");
            if written < total {
                match a.write_vectored(&[IoSlice::new(&data[written..(written + per_send).min(total)])]) {
                    Ok(n) => written += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        a.arm();
                    }
                    Err(e) => panic!("write: {e}"),
                }
            } else {
                a.arm();
            }
            match b.read(&mut got[read..]) {
                Ok(0) => panic!("end of stream"),
                Ok(n) => read += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    b.arm();
                }
                Err(e) => panic!("read: {e}"),
            }
        }
        assert!(got == data, "the bytes read differ from the bytes written");
    }

    #[test]
    fn rxm_sends_stay_eager_unless_asked() {
        let rxm = "tcp;ofi_rxm";
        assert_eq!(default_send(rxm, RXM_EAGER_DEFAULT), 16 << 10);
        assert_eq!(default_send(rxm, RXM_EAGER_PREFERRED), CHUNK);
        assert_eq!(default_send(rxm, 1 << 20), CHUNK, "at most a buffer");
        assert_eq!(default_send("verbs;ofi_rxm", RXM_EAGER_DEFAULT), CHUNK);
        assert_eq!(default_send("shm", RXM_EAGER_DEFAULT), CHUNK);
        assert_eq!(send_size(rxm, None, 64 << 10), 64 << 10);
        assert_eq!(send_size(rxm, Some(32 << 10), 64 << 10), 32 << 10, "asked for");
        assert_eq!(send_size(rxm, None, 4), HEADER + 1, "at least the header and a byte");
        assert_eq!(send_size("shm", None, 4), CHUNK, "other providers ignore rxm");
        assert_eq!(send_size("shm", Some(1 << 20), 4), CHUNK, "at most a buffer");
    }

    #[test]
    fn peers_with_different_rxm_eager_limits_are_refused() {
        let rxm = "tcp;ofi_rxm";
        assert!(check_eager(rxm, 65536, 65536).is_ok());
        let e = check_eager(rxm, 65536, 16384).unwrap_err();
        assert!(e.contains("65536 bytes here and 16384 at the peer") && e.contains("FI_OFI_RXM_EAGER_LIMIT"), "{e}");
        assert!(check_eager("verbs;ofi_rxm", 16384, 32768).is_err());
        assert!(check_eager("shm", 65536, 16384).is_ok(), "no rxm, no limit");
    }

    #[test]
    fn rxm_eager_limit_is_read_as_libfabric_reads_it() {
        assert_eq!(eager_limit_of(None, None), RXM_EAGER_DEFAULT);
        assert_eq!(eager_limit_of(Some("65536"), None), 65536);
        assert_eq!(eager_limit_of(None, Some("32768")), 32768, "follows the buffer size");
        assert_eq!(eager_limit_of(Some("8192"), Some("32768")), 8192);
        assert_eq!(eager_limit_of(Some(" 4096junk"), None), 4096);
        assert_eq!(eager_limit_of(Some("64K"), None), 64, "strtoul stops at the K");
        assert_eq!(eager_limit_of(Some("lots"), Some("2048")), 2048);
    }

    #[test]
    fn the_command_prefers_64k_eager_sends_and_1024_receive_buffers_unless_the_user_chose() {
        let names = |set: &[&str]| -> Vec<String> {
            preferred_rxm_env_of(|k| set.contains(&k)).into_iter().map(|(k, v)| format!("{k}={v}")).collect()
        };
        assert_eq!(names(&[]), ["FI_OFI_RXM_EAGER_LIMIT=65536", "FI_OFI_RXM_MSG_RX_SIZE=1024"]);
        assert_eq!(names(&["FI_OFI_RXM_BUFFER_SIZE"]), ["FI_OFI_RXM_MSG_RX_SIZE=1024"]);
        assert_eq!(names(&["FI_OFI_RXM_EAGER_LIMIT"]), ["FI_OFI_RXM_MSG_RX_SIZE=1024"]);
        assert_eq!(names(&["FI_OFI_RXM_MSG_RX_SIZE"]), ["FI_OFI_RXM_EAGER_LIMIT=65536"]);
        assert!(names(&["FI_OFI_RXM_EAGER_LIMIT", "FI_OFI_RXM_MSG_RX_SIZE"]).is_empty());
    }

    #[test]
    fn tcp_frames_cross_in_order() {
        frames_cross_in_order(tcp_loopback());
    }

    #[test]
    fn shm_frames_cross_in_order() {
        let _one_at_a_time = shm_names_lock();
        frames_cross_in_order(shm());
    }

    /// The `shm` tests below plant files under names the provider or this
    /// process will use; they run one at a time, and with no other `shm`
    /// test, so that no other endpoint takes a planted name.
    static SHM_NAMES: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn shm_names_lock() -> std::sync::MutexGuard<'static, ()> {
        SHM_NAMES.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn shm() -> Selector {
        Selector { provider: "shm".into(), node: None, domain: None }
    }

    /// Files planted in /dev/shm as a dead process would have left them
    /// (a zeroed region header), removed again when dropped.
    struct Planted(Vec<std::path::PathBuf>);

    impl Planted {
        fn new(names: impl IntoIterator<Item = String>) -> Planted {
            let dir = std::path::Path::new(super::super::shmname::SHM_DIR);
            let paths = names
                .into_iter()
                .map(|n| dir.join(n))
                .filter(|p| !p.exists())
                .inspect(|p| std::fs::write(p, vec![0u8; 4096]).expect("write to /dev/shm"))
                .collect();
            Planted(paths)
        }
    }

    impl Drop for Planted {
        fn drop(&mut self) {
            for p in &self.0 {
                let _ = std::fs::remove_file(p);
            }
        }
    }

    /// Regression (CI, 2026-11-28): `shm` files that an earlier process
    /// with this pid left under libfabric's default names
    /// (`<pid>:<uid>:<n>`) made `fi_enable` fail with -FI_EBUSY. With such
    /// files planted, a pair opens, its endpoints' files carry multirail's
    /// names, and they are gone once the streams are dropped.
    #[test]
    fn shm_endpoints_ignore_stale_default_files_and_leave_none_behind() {
        use std::os::unix::fs::MetadataExt;
        let _one_at_a_time = shm_names_lock();
        let dir = std::path::Path::new(super::super::shmname::SHM_DIR);
        let uid = std::fs::metadata("/proc/self").expect("/proc/self").uid();
        let me = std::process::id();
        // libfabric numbers a process's endpoints from 0; this process
        // opens far fewer than this.
        let planted = Planted::new((0..256).map(|n| format!("{me}:{uid}:{n}")));
        let opened = pair(&shm());
        let files: Vec<String> = opened
            .iter()
            .flat_map(|(a, b)| [a, b])
            .map(|s| s.ep.shm_file().expect("an shm endpoint has a file").to_string())
            .collect();
        for file in &files {
            assert!(file.starts_with(super::super::shmname::PREFIX), "{file}");
            assert!(dir.join(file).exists(), "{file} is not in {}", dir.display());
        }
        drop(opened);
        drop(planted);
        for file in &files {
            assert!(!dir.join(file).exists(), "{file} was left behind");
        }
    }

    /// An endpoint that fails to enable is an error naming the call. It
    /// used to hang the process for good: the failed open dropped the
    /// half-open endpoint while holding the libfabric lock, which its
    /// `Drop` takes again. Here `fi_enable` fails because files are
    /// planted under the names this process gives its next endpoints.
    #[test]
    fn an_endpoint_that_fails_to_enable_is_an_error_not_a_hang() {
        let _one_at_a_time = shm_names_lock();
        let _planted = Planted::new(super::super::shmname::upcoming(4));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(OfiEndpoint::open(&shm(), false, true).err()));
        let err = rx.recv_timeout(Duration::from_secs(60)).expect("OfiEndpoint::open hung");
        let Some(err) = err else { panic!("opened over a planted file") };
        if err.contains("offers no reliable-datagram") {
            eprintln!("skipped: {err}");
            return;
        }
        assert!(err.contains("fi_enable failed"), "{err}");
    }

    #[test]
    fn the_peer_going_away_closes_the_rail() {
        let Some((a, b)) = pair(&tcp_loopback()) else { return };
        let mut b = rail(b);
        drop(a);
        let mut sink = CollectSink::default();
        let deadline = Instant::now() + Duration::from_secs(10);
        let err = loop {
            assert!(Instant::now() < deadline, "the peer's end was not noticed");
            match b.poll_recv(&mut sink) {
                Ok(_) => {
                    b.arm();
                }
                Err(e) => break e,
            }
        };
        assert!(matches!(err, RailError::Closed | RailError::Io(_)), "{err}");
    }

    #[test]
    fn garbage_from_the_peer_is_a_wire_error() {
        let Some((mut a, b)) = pair(&tcp_loopback()) else { return };
        let mut b = rail(b);
        assert_eq!(a.write_vectored(&[IoSlice::new(&[0xff; 48])]).unwrap(), 48);
        let mut sink = CollectSink::default();
        let deadline = Instant::now() + Duration::from_secs(10);
        let err = loop {
            assert!(Instant::now() < deadline, "garbage not refused");
            a.arm();
            if let Err(e) = b.poll_recv(&mut sink) {
                break e;
            }
        };
        assert!(matches!(err, RailError::Wire(_)), "{err}");
        assert!(sink.frames.is_empty());
    }

    #[test]
    fn a_peer_that_is_not_an_ofi_rail_is_refused() {
        let (mut a, b) = pair_streams();
        a.write_all(b"MRSH\x03abc").unwrap();
        let e = OfiStream::over_side_channel(&tcp_loopback(), b, Duration::from_secs(5), None, None, false, false)
            .err()
            .expect("refused");
        assert!(e.contains("not an ofi rail"), "{e}");
        // An earlier version of the stream (MRO3: no eager limit in the
        // setup message): its messages would be misread.
        let (mut a, b) = pair_streams();
        let mut old = setup_message("tcp;ofi_rxm", &[1], 0, RXM_EAGER_DEFAULT);
        old[..4].copy_from_slice(b"MRO3");
        a.write_all(&old).unwrap();
        let e = OfiStream::over_side_channel(&tcp_loopback(), b, Duration::from_secs(5), None, None, false, false)
            .err()
            .expect("refused");
        assert!(e.contains("another version of the ofi rail"), "{e}");
        let (mut a, b) = pair_streams();
        let mut m = setup_message("tcp;ofi_rxm", &[1], 0, RXM_EAGER_DEFAULT);
        m[4 + 1 + 11..4 + 1 + 11 + 2].copy_from_slice(&60_000u16.to_le_bytes());
        a.write_all(&m).unwrap();
        let e = OfiStream::over_side_channel(&tcp_loopback(), b, Duration::from_secs(5), None, None, false, false)
            .err()
            .expect("refused");
        assert!(e.contains("address of 60000 bytes"), "{e}");
        // A peer whose rxm has another eager limit than ours: refused
        // before its address is used (the real peer would hang).
        let (mut a, b) = pair_streams();
        a.write_all(&setup_message("tcp;ofi_rxm", &[1], 0, rxm_eager_limit() + 1)).unwrap();
        let e = OfiStream::over_side_channel(&tcp_loopback(), b, Duration::from_secs(5), None, None, false, false)
            .err()
            .expect("refused");
        assert!(e.contains("rxm's eager limit") && e.contains("at the peer"), "{e}");
    }

    #[test]
    fn a_peer_that_sends_no_address_is_named_with_the_time_waited() {
        // The peer passed the handshake but sends half an address, then
        // nothing (its side stays open).
        let (mut a, b) = pair_streams();
        a.write_all(&setup_message("tcp;ofi_rxm", &[1, 2, 3], 0, rxm_eager_limit())[..7]).unwrap();
        let e = OfiStream::over_side_channel(&tcp_loopback(), b, Duration::from_millis(200), None, None, false, false)
            .err()
            .expect("gave up");
        assert!(e.contains("reading the peer's libfabric address: nothing came from the peer for 200ms"), "{e}");
        assert!(e.contains("MULTIRAIL_SETUP_TIMEOUT"), "{e}");
        // A peer that is gone is named as such.
        let (a, b) = pair_streams();
        drop(a);
        let e = OfiStream::over_side_channel(&tcp_loopback(), b, Duration::from_secs(5), None, None, false, false)
            .err()
            .expect("gave up");
        assert!(e.contains("reading the peer's libfabric address") && !e.contains("nothing came"), "{e}");
    }
}
