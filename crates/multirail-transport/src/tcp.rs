//! The TCP rail: one connection per (peer, rail), bound to the rail's
//! local address, `TCP_NODELAY`, large socket buffers, vectored writes of
//! header + payload, and payloads read straight into their destination.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use bytes::Bytes;
use multirail_proto::core::PayloadDest;
use multirail_proto::wire::FrameHeader;
use multirail_proto::wire::frame::Limits;
use socket2::{Domain, Protocol, SockRef, Socket, Type};

use crate::shm::cma;
use crate::{Flushed, FrameSink, Rail, RailCaps, RailError, Received};

/// Staging buffer for reading headers and small frames in few syscalls.
const STAGE: usize = 256 << 10;
/// Payloads at least this long are read straight into their destination.
const DIRECT_READ: usize = 32 << 10;
/// After a payload read straight into its destination, reads stay exact
/// (a header; a small frame's payload with the next header) until this
/// many small frames in a row came: a read into staging as large as it
/// can be, in a stream that mixes small frames with large ones, takes in
/// the head of the next large payload and copies it out again (3 % of the
/// CPU of an all-senders group run of 1 MB messages).
const MIXED_RUN: u32 = 32;
/// Bytes read per `poll_recv` call before yielding to other rails.
const RECV_BUDGET: usize = 8 << 20;
/// How often reading a long payload reports activity to the sink.
const ACTIVITY_EVERY: Duration = Duration::from_millis(1);
/// Slices per `writev`.
const MAX_IOV: usize = 64;
/// The short gather list of a flush of at most half as many frames.
const FEW_IOV: usize = 8;

/// Socket options applied to every rail connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketOptions {
    /// SO_SNDBUF / SO_RCVBUF in bytes; `None` leaves Linux autotuning on.
    pub buffer: Option<usize>,
    /// TCP_NOTSENT_LOWAT: most bytes written but not yet sent that the
    /// kernel holds; beyond it writes wait. Keeps the queue where control
    /// frames (ACKs, CTS) can overtake data in our own hands, so they are
    /// not stuck behind megabytes of data in the socket. `None`: no limit.
    pub notsent_lowat: Option<u32>,
    pub connect_timeout: Duration,
}

impl Default for SocketOptions {
    fn default() -> Self {
        SocketOptions { buffer: None, notsent_lowat: None, connect_timeout: Duration::from_secs(10) }
    }
}

/// Applies `TCP_NODELAY`, the buffer sizes and the unsent-bytes limit.
pub fn tune(stream: &TcpStream, opts: &SocketOptions) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let s = SockRef::from(stream);
    if let Some(b) = opts.buffer {
        s.set_send_buffer_size(b)?;
        s.set_recv_buffer_size(b)?;
    }
    if let Some(l) = opts.notsent_lowat {
        s.set_tcp_notsent_lowat(l)?;
    }
    Ok(())
}

/// A listener on `ip:port` (port 0 = any), for a rail's incoming connections.
pub fn listen(ip: IpAddr, port: u16, opts: &SocketOptions) -> io::Result<TcpListener> {
    let s = Socket::new(Domain::for_address(SocketAddr::new(ip, port)), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    if let Some(b) = opts.buffer {
        // Must be set before listen() for the window scale to follow.
        s.set_recv_buffer_size(b)?;
        s.set_send_buffer_size(b)?;
    }
    s.bind(&SocketAddr::new(ip, port).into())?;
    s.listen(128)?;
    Ok(s.into())
}

/// Connects from `local` (and optionally device `iface`) to `remote`.
pub fn connect(local: IpAddr, iface: Option<&str>, remote: SocketAddr, opts: &SocketOptions) -> io::Result<TcpStream> {
    let s = Socket::new(Domain::for_address(remote), Type::STREAM, Some(Protocol::TCP))?;
    if let Some(dev) = iface {
        // Needs CAP_NET_RAW; binding the address alone is enough for routing
        // on separate subnets, so a refusal is not fatal.
        let _ = s.bind_device(Some(dev.as_bytes()));
    }
    if let Some(b) = opts.buffer {
        s.set_recv_buffer_size(b)?;
        s.set_send_buffer_size(b)?;
    }
    s.bind(&SocketAddr::new(local, 0).into())?;
    s.connect_timeout(&remote.into(), opts.connect_timeout)?;
    let stream: TcpStream = s.into();
    tune(&stream, opts)?;
    Ok(stream)
}

struct OutFrame {
    header: [u8; FrameHeader::LEN],
    payload: Bytes,
}

impl OutFrame {
    fn len(&self) -> usize {
        FrameHeader::LEN + self.payload.len()
    }
}

struct Partial {
    header: FrameHeader,
    dest: PayloadDest,
    got: usize,
}

/// A non-blocking, reliable, ordered byte stream: what the framing of
/// [`StreamRail`] needs. A TCP connection is one; the shared-memory rail's
/// ring pair is another.
///
/// `read` and `write_vectored` return `WouldBlock` instead of blocking,
/// and `Ok(0)` from `read` means end of stream. A read that returns less
/// than asked must mean "drained": the stream then announces new bytes by
/// making [`ByteStream::raw_fd`] readable (edge-triggered epoll).
pub trait ByteStream: Send {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
    /// The descriptor to wait on.
    fn raw_fd(&self) -> RawFd;
    /// Ends the stream (the peer sees end of stream).
    fn shutdown(&mut self);
    /// See [`Rail::close`].
    fn close(&mut self, by: Instant) {
        let _ = by;
        self.shutdown();
    }
    /// See [`Rail::spin_poll`].
    fn spin_poll(&self) -> bool {
        false
    }
    /// See [`Rail::arm`].
    fn arm(&mut self) -> bool {
        false
    }
    /// See [`Rail::engine_arms`].
    fn engine_arms(&mut self) {}
    /// See [`Rail::input_hint`]: false only if a read now would certainly
    /// find nothing and change nothing.
    fn input_hint(&mut self) -> bool {
        true
    }
    /// See [`Rail::wakeups_sent`].
    fn wakeups_sent(&self) -> u64 {
        0
    }
    /// See [`Rail::deadline`]: a stream whose new bytes make no fd
    /// readable at all asks to be looked at again by then.
    fn deadline(&self) -> Option<Instant> {
        None
    }
    /// Single-copy transfers (shared memory with CMA, [`crate::shm::cma`];
    /// RMA reads of an `ofi` rail): payloads of at least this many bytes
    /// are *lent* — the stream carries a descriptor
    /// ([`ByteStream::lend`]) instead of the bytes, the peer copies them
    /// out of our memory ([`ByteStream::copy_lent`]) and says so
    /// ([`ByteStream::lent_done`]). `None`: never.
    fn lend_min(&self) -> Option<usize> {
        None
    }
    /// Bytes of the descriptor that stands for a lent payload.
    fn lent_desc_len(&self) -> usize {
        cma::DESCRIPTOR_LEN
    }
    /// The descriptor that lends `payload` to the peer (the caller keeps
    /// it alive, unmoved, until [`ByteStream::lent_done`] counts it);
    /// `None`: send it inline after all. By default its address and
    /// length ([`cma::descriptor`]).
    fn lend(&mut self, payload: &[u8]) -> Option<Bytes> {
        Some(Bytes::copy_from_slice(&cma::descriptor(payload.as_ptr() as u64, payload.len() as u64)))
    }
    /// How many lent payloads the peer has copied, ever (untrusted).
    fn lent_done(&self) -> u64 {
        0
    }
    /// Starts copying the `len` bytes the peer lent with `desc`
    /// ([`ByteStream::lent_desc_len`] bytes). [`LentCopy::Done`]: copied
    /// into `dst` (`None`: dropped) already, and the peer told;
    /// [`LentCopy::Started`]: the copy goes on in the background, and
    /// [`ByteStream::lent_poll`] finishes it (copies are finished in the
    /// order they were started). An error fails the stream.
    fn copy_lent(&mut self, desc: &[u8], len: usize, dst: Option<&mut [u8]>) -> io::Result<LentCopy> {
        let _ = (desc, len, dst);
        Err(io::Error::new(io::ErrorKind::InvalidData, "the peer lent a payload on a stream without single copy"))
    }
    /// Whether the oldest started copy has finished; if so its bytes are
    /// in `dst` (`None`: dropped) and the peer is told. An error fails the
    /// stream.
    fn lent_poll(&mut self, dst: Option<&mut [u8]>) -> io::Result<bool> {
        let _ = dst;
        Err(io::Error::other("no copy of a lent payload was started"))
    }
}

/// What [`ByteStream::copy_lent`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LentCopy {
    /// The payload is in its destination.
    Done,
    /// The copy goes on; [`ByteStream::lent_poll`] finishes it.
    Started,
}

/// Lent payloads a [`StreamRail`] reads at once (copies started, not
/// yet finished).
const MAX_READING: usize = 8;

/// Frame flag bit, private to a [`StreamRail`] and cleared before the
/// header is parsed: the payload is lent (a [`crate::shm::cma`]
/// descriptor follows instead of the bytes). Streams that cannot lend
/// never set it, and refuse it.
pub(crate) const LENT_FLAG: u8 = 0x80;
/// Index of the flags' high byte in an encoded header.
pub(crate) const FLAGS_HIGH: usize = 3;

impl ByteStream for TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Read::read(self, buf)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        Write::write_vectored(self, bufs)
    }
    fn raw_fd(&self) -> RawFd {
        self.as_raw_fd()
    }
    fn shutdown(&mut self) {
        let _ = TcpStream::shutdown(self, std::net::Shutdown::Both);
    }
}

/// A rail over one TCP connection.
pub type TcpRail = StreamRail<TcpStream>;

/// Frames over a [`ByteStream`]: vectored writes of header + payload,
/// small frames parsed in a staging buffer, large payloads read straight
/// into their destination.
pub struct StreamRail<S: ByteStream> {
    caps: RailCaps,
    stream: S,
    limits: Limits,
    out: VecDeque<OutFrame>,
    /// Bytes of the front frame already written.
    out_pos: usize,
    out_bytes: usize,
    stage: Box<[u8]>,
    lo: usize,
    hi: usize,
    partial: Option<Partial>,
    scratch: Box<[u8]>,
    /// Small frames to come before reads fill the staging buffer again;
    /// until then they are exact (see [`MIXED_RUN`] and `poll_recv`).
    mixed: u32,
    /// Payload bytes of large frames ([`DIRECT_READ`] or more) copied out
    /// of staging rather than read straight into their destination.
    staged_large: u64,
    /// A read in this `poll_recv` call returned less than it asked for:
    /// the socket is drained, and (epoll being edge-triggered) new bytes
    /// will be announced; reading again now would only say EAGAIN.
    drained: bool,
    last_activity: Instant,
    /// Payloads lent to the peer and not yet copied by it, oldest first.
    lent: VecDeque<Bytes>,
    /// Payloads ever lent; `lent_total - lent.len()` were returned.
    lent_total: u64,
    /// Lent payloads the stream is copying in the background
    /// ([`LentCopy::Started`]), oldest first.
    reading: VecDeque<Partial>,
}

impl<S: ByteStream> Drop for StreamRail<S> {
    fn drop(&mut self) {
        if !self.lent.is_empty() {
            // The peer may be copying from these payloads right now: end
            // the stream first (the peer checks that after every copy, see
            // `crate::shm::cma`), and only then let them go.
            self.stream.shutdown();
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        }
    }
}

impl StreamRail<TcpStream> {
    /// Wraps an authenticated connection. Switches it to non-blocking.
    pub fn new(stream: TcpStream, caps: RailCaps, limits: Limits) -> io::Result<TcpRail> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        Ok(StreamRail::over(stream, caps, limits))
    }
}

impl<S: ByteStream> StreamRail<S> {
    /// Frames over `stream`, which must already be non-blocking.
    pub fn over(stream: S, caps: RailCaps, limits: Limits) -> StreamRail<S> {
        StreamRail {
            caps,
            stream,
            limits,
            out: VecDeque::new(),
            out_pos: 0,
            out_bytes: 0,
            stage: vec![0; STAGE].into_boxed_slice(),
            lo: 0,
            hi: 0,
            partial: None,
            scratch: vec![0; 64 << 10].into_boxed_slice(),
            mixed: 0,
            staged_large: 0,
            drained: false,
            last_activity: Instant::now(),
            lent: VecDeque::new(),
            lent_total: 0,
            reading: VecDeque::new(),
        }
    }

    /// The stream under the frames.
    pub fn stream(&self) -> &S {
        &self.stream
    }

    /// The stream under the frames, to write to it directly (tests of
    /// hostile input).
    pub fn stream_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// Payload bytes of large frames that were read into the staging
    /// buffer and copied out of it (a diagnostic: large payloads are meant
    /// to be read straight into their destination).
    pub fn staged_large_bytes(&self) -> u64 {
        self.staged_large
    }

    /// Payloads lent and not yet copied by the peer.
    pub fn lent_outstanding(&self) -> usize {
        self.lent.len()
    }

    /// Lets go of the payloads the peer has copied.
    fn release_lent(&mut self) {
        if self.lent.is_empty() {
            return;
        }
        let returned = self.stream.lent_done().min(self.lent_total);
        let keep = (self.lent_total - returned) as usize;
        while self.lent.len() > keep {
            self.lent.pop_front();
        }
    }

    /// Reads into the staging buffer; Ok(false) when it would block.
    fn fill_stage(&mut self) -> Result<bool, RailError> {
        self.fill_stage_upto(usize::MAX)
    }

    /// Reads into the staging buffer until it holds at most `want` bytes.
    fn fill_stage_upto(&mut self, want: usize) -> Result<bool, RailError> {
        if self.lo > 0 {
            self.stage.copy_within(self.lo..self.hi, 0);
            self.hi -= self.lo;
            self.lo = 0;
        }
        if self.drained {
            return Ok(false);
        }
        let end = want.max(self.hi + 1).min(self.stage.len());
        match self.stream.read(&mut self.stage[self.hi..end]) {
            Ok(0) => Err(RailError::Closed),
            Ok(n) => {
                self.drained = n < end - self.hi;
                self.hi += n;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(true),
            Err(e) => Err(e.into()),
        }
    }

    /// Reads into the staging buffer: `exact` bytes in a stream with large
    /// frames ([`MIXED_RUN`]), else as many as fit.
    fn fill_stage_exact(&mut self, exact: usize) -> Result<bool, RailError> {
        self.fill_stage_upto(if self.mixed > 0 { exact } else { usize::MAX })
    }

    /// Moves payload bytes into the partial frame; Ok(false) = would block.
    fn fill_partial(&mut self, sink: &mut dyn FrameSink) -> Result<bool, RailError> {
        let p = self.partial.as_mut().expect("caller checked");
        let need = p.header.payload_len() - p.got;
        let staged = self.hi - self.lo;
        if staged > 0 {
            let n = staged.min(need);
            if let Some(dst) = p.dest.as_mut_slice() {
                dst[p.got..p.got + n].copy_from_slice(&self.stage[self.lo..self.lo + n]);
            }
            if p.header.payload_len() >= DIRECT_READ {
                self.staged_large += n as u64;
            }
            self.lo += n;
            p.got += n;
            return Ok(true);
        }
        if need < DIRECT_READ {
            // Among large frames: this payload and the next header only.
            return self.fill_stage_exact(need + FrameHeader::LEN);
        }
        if self.drained {
            return Ok(false);
        }
        let (r, asked) = match p.dest.as_mut_slice() {
            Some(dst) => (self.stream.read(&mut dst[p.got..]), need),
            None => {
                let n = need.min(self.scratch.len());
                (self.stream.read(&mut self.scratch[..n]), n)
            }
        };
        match r {
            Ok(0) => Err(RailError::Closed),
            Ok(n) => {
                self.drained = n < asked;
                p.got += n;
                // Long payloads keep the rail alive; telling the sink once
                // a millisecond is enough.
                if self.last_activity.elapsed() >= ACTIVITY_EVERY {
                    self.last_activity = Instant::now();
                    sink.on_activity();
                }
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(true),
            Err(e) => Err(e.into()),
        }
    }
}

impl<S: ByteStream> Rail for StreamRail<S> {
    fn caps(&self) -> &RailCaps {
        &self.caps
    }

    fn poll_fd(&self) -> Option<RawFd> {
        Some(self.stream.raw_fd())
    }

    fn deadline(&self) -> Option<Instant> {
        self.stream.deadline()
    }

    fn send(&mut self, header: &FrameHeader, payload: Bytes) {
        let mut bytes = header.to_bytes();
        let payload = match self.stream.lend_min() {
            Some(min) if payload.len() >= min.max(1) => match self.stream.lend(&payload) {
                Some(d) => {
                    bytes[FLAGS_HIGH] |= LENT_FLAG;
                    self.lent.push_back(payload);
                    self.lent_total += 1;
                    d
                }
                None => payload,
            },
            _ => payload,
        };
        let f = OutFrame { header: bytes, payload };
        self.out_bytes += f.len();
        self.out.push_back(f);
    }

    fn queued_bytes(&self) -> usize {
        self.out_bytes - self.out_pos
    }

    /// Bytes staged or being copied, output queued, or the stream's hint.
    fn input_hint(&mut self) -> bool {
        self.hi > self.lo
            || self.partial.is_some()
            || !self.reading.is_empty()
            || self.queued_bytes() > 0
            || self.stream.input_hint()
    }

    /// With nothing queued, one vectored write of header and payload from
    /// where they are; what it leaves is queued as `send` would queue it.
    fn send_now(&mut self, header: &FrameHeader, payload: Bytes) -> Result<Flushed, RailError> {
        let lends = self.stream.lend_min().is_some_and(|min| payload.len() >= min.max(1));
        if !self.out.is_empty() || lends {
            self.send(header, payload);
            return self.flush();
        }
        self.release_lent();
        let bytes = header.to_bytes();
        let total = bytes.len() + payload.len();
        let n = write_some(&mut self.stream, &[IoSlice::new(&bytes), IoSlice::new(&payload)])?.unwrap_or(0);
        if n == total {
            return Ok(Flushed { frames: 1, bytes: n, blocked: false });
        }
        self.out.push_back(OutFrame { header: bytes, payload });
        self.out_bytes += total;
        self.out_pos = n;
        if n == 0 {
            return Ok(Flushed { blocked: true, ..Flushed::default() });
        }
        let rest = self.flush()?;
        Ok(Flushed { bytes: n + rest.bytes, ..rest })
    }

    fn flush(&mut self) -> Result<Flushed, RailError> {
        self.release_lent();
        let mut res = Flushed::default();
        while !self.out.is_empty() {
            // On the stack: a flush per small message must not allocate.
            // A few frames (a lone message and its acknowledgement) take
            // a short array: filling all `MAX_IOV` entries first cost more
            // than the rest of the flush.
            let (mut few, mut many);
            let iov: &mut [IoSlice<'_>] = if self.out.len() * 2 <= FEW_IOV {
                few = [IoSlice::new(&[]); FEW_IOV];
                &mut few
            } else {
                many = [IoSlice::new(&[]); MAX_IOV];
                &mut many
            };
            let used = gather(&self.out, self.out_pos, iov);
            let Some(n) = write_some(&mut self.stream, &iov[..used])? else {
                res.blocked = true;
                return Ok(res);
            };
            res.bytes += n;
            let mut left = self.out_pos + n;
            while let Some(f) = self.out.front() {
                if left < f.len() {
                    break;
                }
                left -= f.len();
                self.out_bytes -= f.len();
                self.out.pop_front();
                res.frames += 1;
            }
            self.out_pos = left;
        }
        Ok(res)
    }

    fn poll_recv(&mut self, sink: &mut dyn FrameSink) -> Result<Received, RailError> {
        self.release_lent();
        let mut res = Received::default();
        self.drained = false;
        let start = (self.hi - self.lo) as isize;
        loop {
            if let Some(p) = self.reading.front_mut() {
                if self.stream.lent_poll(p.dest.as_mut_slice())? {
                    let p = self.reading.pop_front().expect("just looked");
                    res.bytes += FrameHeader::LEN + p.header.payload_len();
                    res.frames += 1;
                    sink.on_payload(&p.header, p.dest, true)?;
                    continue;
                }
                if self.reading.len() >= MAX_READING {
                    return Ok(res);
                }
            }
            if self.partial.is_some() {
                let before = self.partial.as_ref().map_or(0, |p| p.got);
                let progressed = self.fill_partial(sink)?;
                let p = self.partial.as_ref().expect("still there");
                res.bytes += p.got - before;
                if p.got == p.header.payload_len() {
                    let p = self.partial.take().expect("still there");
                    sink.on_payload(&p.header, p.dest, true)?;
                    res.frames += 1;
                } else if !progressed {
                    return Ok(res);
                }
            } else if self.hi - self.lo >= FrameHeader::LEN && self.stage[self.lo + FLAGS_HIGH] & LENT_FLAG != 0 {
                // A lent payload: header and descriptor; the stream copies
                // it out of the peer's memory, at once or in the background.
                if self.reading.len() >= MAX_READING {
                    return Ok(res);
                }
                let mut raw = [0u8; FrameHeader::LEN];
                raw.copy_from_slice(&self.stage[self.lo..self.lo + FrameHeader::LEN]);
                raw[FLAGS_HIGH] &= !LENT_FLAG;
                let header = FrameHeader::parse(&raw, &self.limits)?;
                let desc_len = self.stream.lent_desc_len();
                if self.hi - self.lo < FrameHeader::LEN + desc_len {
                    if !self.fill_stage()? {
                        return Ok(res);
                    }
                    continue;
                }
                let len = header.payload_len();
                if len == 0 {
                    return Err(RailError::Io(io::Error::new(io::ErrorKind::InvalidData, "a lent payload of 0 bytes")));
                }
                let at = self.lo + FrameHeader::LEN;
                self.lo = at + desc_len;
                self.mixed = 0;
                let dest = sink.on_header(&header)?;
                // Held as partial while copying, so an error gives it back.
                let p = self.partial.insert(Partial { header, dest, got: 0 });
                let copy = self.stream.copy_lent(&self.stage[at..at + desc_len], len, p.dest.as_mut_slice())?;
                let p = self.partial.take().expect("just put");
                match copy {
                    LentCopy::Done if self.reading.is_empty() => {
                        res.bytes += FrameHeader::LEN + len;
                        res.frames += 1;
                        sink.on_payload(&p.header, p.dest, true)?;
                    }
                    LentCopy::Done => {
                        return Err(RailError::Io(io::Error::other(
                            "a lent payload was copied at once while earlier ones are still being copied",
                        )));
                    }
                    LentCopy::Started => self.reading.push_back(p),
                }
            } else if self.hi - self.lo >= FrameHeader::LEN && !self.reading.is_empty() {
                // A frame behind lent payloads still being copied waits
                // for them: a rail delivers in order.
                return Ok(res);
            } else if self.hi - self.lo >= FrameHeader::LEN {
                let header = FrameHeader::parse(&self.stage[self.lo..self.hi], &self.limits)?;
                // In a stream with large frames, read only the next header
                // (or a small frame and the next header) into staging, so
                // large payloads go straight to their destination instead
                // of being copied out of the staging buffer ([`MIXED_RUN`]).
                let len = header.payload_len();
                self.mixed = if len >= DIRECT_READ { MIXED_RUN } else { self.mixed.saturating_sub(1) };
                self.lo += FrameHeader::LEN;
                res.bytes += FrameHeader::LEN;
                if len < DIRECT_READ && self.hi - self.lo >= len {
                    // The whole frame is here: one step.
                    let (a, b) = (self.lo, self.lo + len);
                    self.lo = b;
                    res.bytes += len;
                    res.frames += 1;
                    sink.on_frame(&header, &self.stage[a..b])?;
                } else {
                    let dest = sink.on_header(&header)?;
                    self.partial = Some(Partial { header, dest, got: 0 });
                }
            } else if !self.fill_stage_exact(FrameHeader::LEN)? {
                return Ok(res);
            }
            if res.bytes as isize - start > RECV_BUDGET as isize {
                res.more = true;
                return Ok(res);
            }
        }
    }

    fn take_partial(&mut self) -> Option<(FrameHeader, PayloadDest)> {
        self.partial.take().or_else(|| self.reading.pop_front()).map(|p| (p.header, p.dest))
    }

    fn shutdown(&mut self) {
        self.stream.shutdown();
    }

    fn close(&mut self, by: Instant) {
        self.stream.close(by);
    }

    fn spin_poll(&self) -> bool {
        self.stream.spin_poll()
    }

    fn arm(&mut self) -> bool {
        // Bytes read ahead into staging count as something to do, unless
        // they wait behind lent payloads being copied: then the stream
        // says when a copy is done.
        (self.hi > self.lo && self.reading.is_empty()) || self.stream.arm()
    }

    fn engine_arms(&mut self) {
        self.stream.engine_arms()
    }

    fn wakeups_sent(&self) -> u64 {
        self.stream.wakeups_sent()
    }
}

/// One vectored write to `stream`: the bytes it took, `None` if it would
/// block (retried when interrupted); taking none is a closed stream.
fn write_some<S: ByteStream>(stream: &mut S, bufs: &[IoSlice<'_>]) -> Result<Option<usize>, RailError> {
    loop {
        match stream.write_vectored(bufs) {
            Ok(0) => return Err(RailError::Closed),
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Fills `iov` with the queued frames' bytes from `skip` on (headers and
/// payloads, whole frames only while two entries are left); returns how
/// many entries it used.
fn gather<'a>(out: &'a VecDeque<OutFrame>, mut skip: usize, iov: &mut [IoSlice<'a>]) -> usize {
    let mut used = 0;
    for f in out.iter() {
        if used + 2 > iov.len() {
            break;
        }
        for part in [&f.header[..], &f.payload[..]] {
            if skip >= part.len() {
                skip -= part.len();
            } else {
                iov[used] = IoSlice::new(&part[skip..]);
                used += 1;
                skip = 0;
            }
        }
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests_util::{CollectSink, pair_streams};

    /// Flushes `a` and reads `b` until `n` frames arrived (at most 10 s).
    fn deliver(a: &mut impl Rail, b: &mut impl Rail, n: usize) -> CollectSink {
        let mut sink = CollectSink::default();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while sink.frames.len() < n {
            assert!(std::time::Instant::now() < deadline, "timed out");
            a.flush().unwrap();
            b.poll_recv(&mut sink).unwrap();
        }
        sink
    }

    /// Frame `i` of a numbered sequence: an eager frame with sequence
    /// number `i` and `n` bytes of value `i`.
    fn numbered(i: usize, n: usize) -> (FrameHeader, Bytes) {
        let mut h = FrameHeader::new(multirail_proto::wire::Op::Eager);
        h.seq = i as u64;
        h.total_len = n as u64;
        h.frag_len = n as u32;
        (h, Bytes::from(vec![i as u8; n]))
    }

    /// The frames [`numbered`] made for `sizes` arrived whole and in order.
    fn check_numbered(sink: &CollectSink, sizes: &[usize]) {
        assert_eq!(sink.frames.len(), sizes.len());
        for (i, (h, p)) in sink.frames.iter().enumerate() {
            assert_eq!(h.seq, i as u64);
            assert_eq!(p.len(), sizes[i]);
            assert!(p.iter().all(|&x| x == i as u8), "frame {i} corrupted");
        }
    }

    fn rail(s: TcpStream) -> TcpRail {
        let caps = RailCaps { name: "t".into(), bandwidth: 0, latency: Duration::ZERO, max_frame: 1 << 24 };
        TcpRail::new(s, caps, Limits::default()).unwrap()
    }

    #[test]
    fn frames_of_all_sizes_cross_in_order() {
        let (a, b) = pair_streams();
        let (mut a, mut b) = (rail(a), rail(b));
        let sizes = [0usize, 1, 47, 48, 4096, 32 << 10, (32 << 10) + 1, 3 << 20, 5];
        for (i, &n) in sizes.iter().enumerate() {
            let (h, p) = numbered(i, n);
            a.send(&h, p);
        }
        check_numbered(&deliver(&mut a, &mut b, sizes.len()), &sizes);
        assert_eq!(a.queued_bytes(), 0);
    }

    #[test]
    fn large_payloads_among_small_frames_are_not_read_through_staging() {
        // Large and small frames alternate, all written before the reader
        // looks. Only the first large payload may be read (in part) into
        // staging: after it, reads stay exact, so a small frame's read does
        // not take in the head of the large payload behind it.
        let (a, b) = pair_streams();
        let (mut a, mut b) = (rail(a), rail(b));
        let sizes = [300usize << 10, 100, 300 << 10, 7, 300 << 10, 2000, 300 << 10, 0, 300 << 10];
        for (i, &n) in sizes.iter().enumerate() {
            let (h, p) = numbered(i, n);
            a.send(&h, p);
        }
        check_numbered(&deliver(&mut a, &mut b, sizes.len()), &sizes);
        assert!(
            b.staged_large_bytes() <= STAGE as u64,
            "{} bytes of large payloads went through staging",
            b.staged_large_bytes()
        );
    }

    #[test]
    fn frames_written_at_once_keep_their_order_when_the_socket_fills() {
        // `send_now` writes a frame without queueing it when nothing is
        // queued; a write the socket takes in part leaves the rest queued,
        // and what follows queues behind it. A 12 MiB frame does not fit
        // in the socket buffers (256 KiB asked each way) of a peer that is
        // not reading.
        let (a, b) = pair_streams();
        socket2::SockRef::from(&a).set_send_buffer_size(256 << 10).unwrap();
        socket2::SockRef::from(&b).set_recv_buffer_size(256 << 10).unwrap();
        let (mut a, mut b) = (rail(a), rail(b));
        let sizes = [8usize, 12 << 20, 5, 64 << 10, 1];
        let mut parts = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let (h, p) = numbered(i, n);
            let queued_before = a.queued_bytes();
            let f = a.send_now(&h, p).unwrap();
            parts.push((queued_before, f));
        }
        let (_, first) = parts[0];
        assert_eq!((first.frames, first.bytes), (1, FrameHeader::LEN + 8), "a lone small frame is written whole");
        let (_, big) = parts[1];
        assert!(big.bytes < FrameHeader::LEN + (12 << 20) && big.blocked, "the big frame fits only in part: {big:?}");
        assert!(parts[2..].iter().all(|&(q, f)| q > 0 && f.frames == 0), "later frames queue behind it");
        check_numbered(&deliver(&mut a, &mut b, sizes.len()), &sizes);
        assert_eq!(a.queued_bytes(), 0);
    }

    #[test]
    fn garbage_is_a_wire_error_and_eof_is_closed() {
        let (mut a, b) = pair_streams();
        let mut b = rail(b);
        a.write_all(&[0xff; 48]).unwrap();
        let mut sink = CollectSink::default();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let err = loop {
            assert!(std::time::Instant::now() < deadline);
            match b.poll_recv(&mut sink) {
                Ok(_) => continue,
                Err(e) => break e,
            }
        };
        assert!(matches!(err, RailError::Wire(_)), "{err}");
        let (a, b) = pair_streams();
        let mut b = rail(b);
        drop(a);
        let err = loop {
            assert!(std::time::Instant::now() < deadline);
            if let Err(e) = b.poll_recv(&mut sink) {
                break e;
            }
        };
        assert!(matches!(err, RailError::Closed));
    }

    fn shm_rail(s: crate::shm::ShmStream) -> StreamRail<crate::shm::ShmStream> {
        let caps = RailCaps { name: "s".into(), bandwidth: 0, latency: Duration::ZERO, max_frame: 1 << 24 };
        StreamRail::over(s, caps, Limits::default())
    }

    fn frame(seq: u64, n: usize) -> (FrameHeader, Bytes) {
        let mut h = FrameHeader::new(multirail_proto::wire::Op::Eager);
        h.seq = seq;
        h.total_len = n as u64;
        h.frag_len = n as u32;
        (h, Bytes::from((0..n).map(|i| (i as u8) ^ (seq as u8)).collect::<Vec<u8>>()))
    }

    /// Streams with single copy: frames at or above the threshold are
    /// lent (only a descriptor goes through the ring), smaller ones are
    /// copied through it; all arrive intact and in order, and the writer
    /// lets go of each lent payload once the reader copied it.
    #[test]
    fn lent_payloads_arrive_intact_in_order_and_are_returned() {
        const MIN: usize = 16 << 10;
        let (a, b) = crate::shm::ShmStream::pair_cma(64 << 10, MIN).unwrap();
        if !a.lends() {
            eprintln!("skipped: process_vm_readv is not allowed here");
            return;
        }
        let (mut a, mut b) = (shm_rail(a), shm_rail(b));
        // Larger than the ring (64 KiB) too: a lent payload does not need room in it.
        let sizes = [MIN, 5, MIN - 1, 3 << 20, 0, 200 << 10, MIN + 1];
        let sent: Vec<(FrameHeader, Bytes)> = sizes.iter().enumerate().map(|(i, &n)| frame(i as u64, n)).collect();
        for (h, p) in &sent {
            a.send(h, p.clone());
        }
        assert_eq!(a.lent_outstanding(), 4, "the four payloads of at least {MIN} bytes are lent");
        // Lent frames take 64 bytes of the ring, not their payload.
        let ring_bytes: usize = sizes.iter().map(|&n| FrameHeader::LEN + if n >= MIN { 16 } else { n }).sum();
        assert_eq!(a.queued_bytes(), ring_bytes);
        let sink = deliver(&mut a, &mut b, sizes.len());
        for ((h, p), (gh, gp)) in sent.iter().zip(&sink.frames) {
            assert_eq!(h, gh, "the header arrives as sent, without the private flag");
            assert_eq!(&p[..], &gp[..], "payload of frame {}", h.seq);
        }
        a.flush().unwrap();
        assert_eq!(a.lent_outstanding(), 0, "every loan returned once copied");
    }

    /// A writer that goes away with payloads still lent: the reader must
    /// not deliver what it copies from the withdrawn memory.
    #[test]
    fn a_loan_withdrawn_before_the_copy_is_an_error_not_data() {
        let (a, b) = crate::shm::ShmStream::pair_cma(64 << 10, 1024).unwrap();
        if !a.lends() {
            eprintln!("skipped: process_vm_readv is not allowed here");
            return;
        }
        let (mut a, mut b) = (shm_rail(a), shm_rail(b));
        let (h, p) = frame(1, 8192);
        a.send(&h, p);
        a.flush().unwrap();
        assert_eq!(a.lent_outstanding(), 1);
        drop(a);
        let mut sink = CollectSink::default();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let err = loop {
            assert!(std::time::Instant::now() < deadline, "timed out");
            match b.poll_recv(&mut sink) {
                Ok(_) => continue,
                Err(e) => break e,
            }
        };
        assert!(sink.frames.is_empty(), "nothing delivered");
        assert!(matches!(&err, RailError::Io(e) if e.kind() == io::ErrorKind::ConnectionAborted), "{err}");
    }

    /// A stream that cannot lend refuses a frame that claims to be lent.
    #[test]
    fn a_lent_frame_on_tcp_is_refused() {
        let (mut a, b) = pair_streams();
        let mut b = rail(b);
        let (h, _) = frame(1, 4096);
        let mut raw = h.to_bytes();
        raw[FLAGS_HIGH] |= LENT_FLAG;
        a.write_all(&raw).unwrap();
        a.write_all(&cma::descriptor(4096, 4096)).unwrap();
        let mut sink = CollectSink::default();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let err = loop {
            assert!(std::time::Instant::now() < deadline);
            if let Err(e) = b.poll_recv(&mut sink) {
                break e;
            }
        };
        assert!(matches!(&err, RailError::Io(e) if e.kind() == io::ErrorKind::InvalidData), "{err}");
    }
}
