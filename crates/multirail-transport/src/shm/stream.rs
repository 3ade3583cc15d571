//! [`ShmStream`]: a non-blocking byte stream over a shared segment.
//!
//! Like a non-blocking socket: `read` and `write_vectored` return
//! `WouldBlock` when the ring is empty or full, `read` returns `Ok(0)` only
//! at the end of a cleanly closed stream, and [`AsRawFd`] gives the fd to
//! wait on in `poll`/`epoll`. The one difference: call
//! [`arm_for_sleep`](ShmStream::arm_for_sleep) right before sleeping, and
//! sleep only if it returns `false` (see the wake protocol in the
//! [module docs](super)).
//!
//! Order of calls in an event loop, per stream:
//! 1. `write_vectored` / `read` until `WouldBlock` (or enough);
//! 2. `arm_for_sleep()`; if `true`, go back to 1;
//! 3. wait for the fd to be readable (with any other fds), then go to 1.

use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{Ordering, fence};
use std::time::Duration;

use super::ShmError;
use super::cma::{self, Cma};
use super::doorbell::{Doorbell, recv_fd, send_fd};
use super::ring::{Consumer, Producer};
use super::segment::{Segment, Side};
use crate::tcp::LentCopy;

/// Message sent with the segment's fd (`/2`: followed by the CMA
/// handshake, [`super::cma::handshake`]).
const HELLO: &[u8] = b"multirail-shm/2";
/// The opener's answer once it has validated and mapped the segment.
const ACK: u8 = b'A';

/// One end of a shared-memory byte stream.
#[derive(Debug)]
pub struct ShmStream {
    tx: Producer,
    rx: Consumer,
    bell: Doorbell,
    /// The doorbell reported EOF or a reset.
    peer_gone: bool,
    /// The last write found the ring full: arm for space before sleeping.
    write_blocked: bool,
    shut: bool,
    /// The event loop arms us before it sleeps ([`crate::Rail::arm`]):
    /// reads that find the ring empty do not arm (or drain the doorbell).
    engine_arms: bool,
    /// We asked the producer for a wake-up and have not withdrawn it.
    armed: bool,
    /// Empty reads since the doorbell was last looked at (engine mode).
    empty_reads: u32,
    /// Writes since the peer's "closed" flag was last looked at.
    writes_unchecked: u32,
    /// A read found the end of the stream (the peer closed its side).
    peer_ended: bool,
    /// Doorbells rung (a diagnostic).
    rung: u64,
    /// Single-copy transfers, as the handshake decided.
    cma: Cma,
    /// Payloads of at least this many bytes are lent (with `cma.lend`).
    lend_min: usize,
}

/// In engine mode, a busy loop that never sleeps still looks at the
/// doorbell (for a dead peer's end-of-file) once per this many empty reads.
const DOORBELL_EVERY: u32 = 256;

/// A write looks at the peer's "consumer closed" flag once per this many
/// writes (and whenever the ring is full). The flag shares a cache line
/// with the consumer's `tail`, which the peer writes after every read:
/// looking at it on every write cost each small message a cache-line
/// transfer each way between the two ranks' cores. A peer that closes
/// cleanly is seen sooner by its doorbell's end of file or the end of its
/// stream; one that dies, by the doorbell.
const CLOSED_CHECK_EVERY: u32 = 64;

/// What a write to a peer that closed or went away returns.
fn peer_closed() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "shm peer closed or went away")
}

fn ring_err(e: impl Into<ShmError>) -> io::Error {
    e.into().into()
}

impl ShmStream {
    /// Sets up a stream over a connected Unix socket to a process on this
    /// host. The [`Side::Creator`] makes a segment with rings of
    /// `ring_capacity` bytes (power of two, 4 KiB..=1 GiB) and sends its
    /// fd; the [`Side::Opener`] receives, validates and maps it (its
    /// `ring_capacity` is ignored), then acknowledges. Blocks until done:
    /// pass a blocking socket, with a read timeout if the peer may hang.
    /// Afterwards the socket is the stream's non-blocking doorbell.
    ///
    /// Then both sides run the CMA handshake ([`super::cma`]): with `cma`
    /// `Some(min)` each offers to read the other's memory directly and to
    /// lend its own payloads of at least `min` bytes; the stream does so in
    /// each direction the kernel allows. `None`: never.
    pub fn pair_over(
        sock: UnixStream,
        side: Side,
        ring_capacity: usize,
        cma: Option<usize>,
    ) -> Result<ShmStream, ShmError> {
        let (tx, rx) = match side {
            Side::Creator => {
                let seg = Segment::create(ring_capacity)?;
                let ends = seg.endpoints(Side::Creator)?;
                send_fd(&sock, seg.fd(), HELLO)?;
                let mut ack = [0u8; 1];
                (&sock).read_exact(&mut ack).map_err(|e| {
                    if e.kind() == io::ErrorKind::UnexpectedEof {
                        io::Error::new(e.kind(), "the peer closed instead of accepting the shared segment")
                    } else {
                        e
                    }
                })?;
                if ack[0] != ACK {
                    return Err(ShmError::FdMessage(format!("expected the opener's ack, got byte {}", ack[0])));
                }
                ends
            }
            Side::Opener => {
                let (fd, msg) = recv_fd(&sock)?;
                if msg != HELLO {
                    return Err(ShmError::FdMessage(format!("unexpected message {:?}", String::from_utf8_lossy(&msg))));
                }
                let seg = Segment::open(fd)?;
                let ends = seg.endpoints(Side::Opener)?;
                (&sock).write_all(&[ACK])?;
                ends
            }
        };
        let agreed = cma::handshake(&sock, cma.is_some())?;
        let mut s = ShmStream::from_parts(tx, rx, Doorbell::new(sock)?);
        s.cma = agreed;
        s.lend_min = cma.unwrap_or(usize::MAX);
        Ok(s)
    }

    /// Both ends of a stream in this process (two mappings of one
    /// segment, a socket pair for the doorbells), e.g. for tests.
    pub fn pair(ring_capacity: usize) -> Result<(ShmStream, ShmStream), ShmError> {
        let (a, b) = UnixStream::pair()?;
        let seg = Segment::create(ring_capacity)?;
        let other = Segment::open(seg.fd().try_clone_to_owned()?)?;
        let (atx, arx) = seg.endpoints(Side::Creator)?;
        let (btx, brx) = other.endpoints(Side::Opener)?;
        Ok((ShmStream::from_parts(atx, arx, Doorbell::new(a)?), ShmStream::from_parts(btx, brx, Doorbell::new(b)?)))
    }

    /// [`pair`](Self::pair) with single-copy transfers both ways, where
    /// this process may read itself with `process_vm_readv`.
    /// Payloads of at least `min` bytes are lent.
    pub fn pair_cma(ring_capacity: usize, min: usize) -> Result<(ShmStream, ShmStream), ShmError> {
        let (mut a, mut b) = ShmStream::pair(ring_capacity)?;
        if let Some(me) = cma::self_readable() {
            a.cma = Cma { read_from: Some(me), lend: true };
            b.cma = a.cma;
            a.lend_min = min;
            b.lend_min = min;
        }
        Ok((a, b))
    }

    /// Whether large payloads go to the peer by single copy.
    pub fn lends(&self) -> bool {
        self.cma.lend
    }

    /// A stream from its pieces: the producer towards the peer, the
    /// consumer from it, and the doorbell connected to the peer's.
    pub fn from_parts(tx: Producer, rx: Consumer, bell: Doorbell) -> ShmStream {
        ShmStream {
            tx,
            rx,
            bell,
            peer_gone: false,
            write_blocked: false,
            shut: false,
            engine_arms: false,
            armed: false,
            empty_reads: 0,
            writes_unchecked: 0,
            peer_ended: false,
            rung: 0,
            cma: Cma::default(),
            lend_min: usize::MAX,
        }
    }

    /// Bytes each direction's ring holds.
    pub fn capacity(&self) -> usize {
        self.tx.capacity()
    }

    /// Bytes readable now.
    pub fn available(&mut self) -> io::Result<usize> {
        self.rx.available().map_err(ring_err)
    }

    fn ring_peer(&mut self) {
        self.rung += 1;
        if self.bell.ring().is_err() {
            self.peer_gone = true;
        }
    }

    fn read_ring(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        let n = self.rx.read(dst).map_err(ring_err)?;
        if n > 0 && self.rx.take_producer_wake() {
            self.ring_peer();
        }
        Ok(n)
    }

    /// Reads available bytes. `WouldBlock` when none are there yet;
    /// `Ok(0)` at end of stream (the peer closed cleanly and everything it
    /// wrote has been read) or after our own [`shutdown`](Self::shutdown);
    /// `ConnectionAborted` once everything is read if the peer went away
    /// without closing; `InvalidData` if the peer corrupted the ring.
    pub fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        if dst.is_empty() {
            return Ok(0);
        }
        let n = self.read_ring(dst)?;
        if n > 0 {
            return Ok(n);
        }
        if self.rx.is_producer_closed() {
            // Everything written before the close is visible now.
            let n = self.read_ring(dst)?;
            self.peer_ended |= n == 0;
            return Ok(n);
        }
        if self.shut {
            return Ok(0);
        }
        if self.peer_gone {
            return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "shm peer went away without closing"));
        }
        Err(io::ErrorKind::WouldBlock.into())
    }

    /// Writes as much of `bufs` as fits, in order. `WouldBlock` when the
    /// ring is full; `BrokenPipe` after our shutdown, once the peer went
    /// away or its stream ended, or once it closed (looked at every
    /// [`CLOSED_CHECK_EVERY`] writes and when the ring is full). Rings the
    /// peer's doorbell if it sleeps.
    pub fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if bufs.iter().all(|b| b.is_empty()) {
            return Ok(0);
        }
        if self.shut {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "shm stream shut down"));
        }
        if self.writes_unchecked == 0 && self.tx.is_consumer_closed() {
            self.peer_ended = true;
        }
        self.writes_unchecked = (self.writes_unchecked + 1) % CLOSED_CHECK_EVERY;
        if self.peer_gone || self.peer_ended {
            return Err(peer_closed());
        }
        let n = self.tx.write_vectored(bufs).map_err(ring_err)?;
        if n == 0 {
            if self.tx.is_consumer_closed() {
                self.peer_ended = true;
                return Err(peer_closed());
            }
            self.write_blocked = true;
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.write_blocked = false;
        if self.tx.take_consumer_wake() {
            self.ring_peer();
        }
        Ok(n)
    }

    /// Call right before sleeping on [`as_raw_fd`](AsRawFd::as_raw_fd):
    /// drains the doorbell, then asks the peer to wake us for data (and
    /// for space, if the last write found the ring full). Returns `true`
    /// if we must not sleep: something is readable or writable already,
    /// or the peer closed or went away (the next `read`/`write` tells).
    /// Nothing may read the doorbell between this and the sleep.
    pub fn arm_for_sleep(&mut self) -> bool {
        if self.shut || self.peer_gone {
            return true;
        }
        if self.bell.drain().is_err() {
            self.peer_gone = true;
            return true;
        }
        if self.rx.arm() {
            return true;
        }
        if self.write_blocked && self.tx.arm_for_space() {
            self.rx.disarm();
            return true;
        }
        false
    }

    /// Sleeps until there may be something to do, at most `timeout`:
    /// [`arm_for_sleep`](Self::arm_for_sleep), then a `poll` on the
    /// doorbell. Returns `false` if the time ran out. For blocking users
    /// and tests; event loops poll the fd themselves.
    pub fn wait(&mut self, timeout: Option<Duration>) -> io::Result<bool> {
        if self.arm_for_sleep() {
            return Ok(true);
        }
        self.bell.wait(timeout)
    }

    /// Closes both directions: the peer reads what we wrote, then end of
    /// stream, and its writes fail. Idempotent; also done on drop.
    pub fn shutdown(&mut self) {
        if !self.shut {
            self.shut = true;
            // Flags first, then the socket: a peer woken by the EOF finds
            // the flags set.
            self.tx.close();
            self.rx.close();
            self.bell.shutdown();
        }
    }
}

impl Drop for ShmStream {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// As the byte stream of a rail ([`crate::tcp::StreamRail`]), which any
/// progress engine drives by edge-triggered readiness of one fd: a read
/// that returns less than asked leaves the stream armed (after draining
/// the doorbell), so the peer's next write rings it and the fd becomes
/// readable; a write that finds the ring full arms for space, so the
/// reader's next read rings it.
impl crate::tcp::ByteStream for ShmStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.engine_arms {
            // The engine polls us every round while it spins and arms us
            // before it sleeps. A wake-up asked for before is withdrawn
            // (it would only cost the peer a doorbell).
            if self.armed {
                self.rx.disarm();
                self.armed = false;
            }
            let r = ShmStream::read(self, buf);
            if matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
                // A loop kept busy by other rails may not sleep (and arm)
                // for long: look for a dead peer now and then.
                self.empty_reads += 1;
                if self.empty_reads >= DOORBELL_EVERY {
                    self.empty_reads = 0;
                    if self.bell.drain().is_err() {
                        self.peer_gone = true;
                        return ShmStream::read(self, buf);
                    }
                }
            }
            return r;
        }
        let mut n = 0;
        // Ends: each round either reads more (at most `buf.len()` bytes in
        // all) or returns; `arm` says true only with data or a close there.
        loop {
            match ShmStream::read(self, &mut buf[n..]) {
                Ok(0) => return Ok(n),
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // Report the bytes; the error comes with the next read.
                Err(_) if n > 0 => return Ok(n),
                Err(e) => return Err(e),
            }
            if n == buf.len() {
                return Ok(n);
            }
            if self.shut || self.peer_gone {
                continue;
            }
            if self.bell.drain().is_err() {
                self.peer_gone = true;
                continue;
            }
            if !self.rx.arm() {
                return if n > 0 { Ok(n) } else { Err(io::ErrorKind::WouldBlock.into()) };
            }
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        loop {
            match ShmStream::write_vectored(self, bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if !self.tx.arm_for_space() {
                        return Err(e);
                    }
                    // Space was freed meanwhile: try again.
                }
                r => return r,
            }
        }
    }

    fn raw_fd(&self) -> std::os::fd::RawFd {
        self.bell.as_raw_fd()
    }

    fn shutdown(&mut self) {
        ShmStream::shutdown(self);
    }

    fn spin_poll(&self) -> bool {
        true
    }

    fn arm(&mut self) -> bool {
        self.engine_arms = true;
        let go_on = self.arm_for_sleep();
        self.armed = !go_on;
        go_on
    }

    fn engine_arms(&mut self) {
        self.engine_arms = true;
    }

    fn input_hint(&mut self) -> bool {
        // Armed: the next read withdraws the wake-up (not armed by the
        // engine: it may arm itself); closed, gone or shut: the next read
        // says so.
        !self.engine_arms
            || self.armed
            || self.shut
            || self.peer_gone
            || self.rx.is_producer_closed()
            || self.rx.available().map_or(true, |n| n > 0)
    }

    fn wakeups_sent(&self) -> u64 {
        self.rung
    }

    fn lend_min(&self) -> Option<usize> {
        self.cma.lend.then_some(self.lend_min)
    }

    fn lent_done(&self) -> u64 {
        self.tx.lent_done()
    }

    fn copy_lent(&mut self, desc: &[u8], len: usize, dst: Option<&mut [u8]>) -> io::Result<LentCopy> {
        let (addr, lent_len) = cma::parse_descriptor(desc);
        if lent_len != len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a lent payload of {lent_len} bytes in a frame of {len}"),
            ));
        }
        let Some(pid) = self.cma.read_from else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the peer lent a payload although we cannot read its memory",
            ));
        };
        if let Some(dst) = dst {
            cma::read_from(pid, addr, dst)?;
        }
        // The peer marks its ring closed before it lets lent payloads go
        // (`StreamRail`'s drop): a copy that raced with that is garbage.
        fence(Ordering::SeqCst);
        if self.rx.is_producer_closed() {
            return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "the peer withdrew a lent payload"));
        }
        self.rx.lent_copied();
        Ok(LentCopy::Done)
    }
}

impl Read for ShmStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        ShmStream::read(self, buf)
    }
}

impl Write for ShmStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        ShmStream::write_vectored(self, bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsFd for ShmStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.bell.as_fd()
    }
}

impl AsRawFd for ShmStream {
    fn as_raw_fd(&self) -> RawFd {
        self.bell.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    use std::time::Instant;

    const CAP: usize = 64 << 10;
    const BOUND: Duration = Duration::from_secs(30);

    /// Sends `out` and reads `expect` bytes back, concurrently, never
    /// blocking in read or write; sleeps with `wait`. Bounded in time.
    fn pump(s: &mut ShmStream, out: &[u8], expect: usize) -> io::Result<Vec<u8>> {
        let end = Instant::now() + BOUND;
        let mut sent = 0;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 10_000];
        while sent < out.len() || got.len() < expect {
            assert!(Instant::now() < end, "pump stuck: sent {sent}/{}, got {}/{expect}", out.len(), got.len());
            let mut progress = false;
            if sent < out.len() {
                let chunk = &out[sent..out.len().min(sent + 7000)];
                let (a, b) = chunk.split_at(chunk.len() / 2);
                match s.write_vectored(&[IoSlice::new(a), IoSlice::new(b)]) {
                    Ok(n) => {
                        sent += n;
                        progress = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            if got.len() < expect {
                // Never past `expect`: what follows belongs to the caller.
                let want = buf.len().min(expect - got.len());
                match s.read(&mut buf[..want]) {
                    Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                    Ok(n) => {
                        got.extend_from_slice(&buf[..n]);
                        progress = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            if !progress {
                s.wait(Some(BOUND))?;
            }
        }
        Ok(got)
    }

    /// Reads until `read` returns something other than data or
    /// `WouldBlock`, sleeping in between: the data and the final result.
    fn read_to_end(s: &mut ShmStream) -> (Vec<u8>, io::Result<usize>) {
        let end = Instant::now() + BOUND;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 4096];
        loop {
            assert!(Instant::now() < end, "read_to_end stuck after {} bytes", got.len());
            match s.read(&mut buf) {
                Ok(0) => return (got, Ok(0)),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    s.wait(Some(BOUND)).unwrap();
                }
                Err(e) => return (got, Err(e)),
            }
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn empty_and_full_would_block() {
        let (mut a, mut b) = ShmStream::pair(4096).unwrap();
        let mut buf = [0u8; 100];
        assert_eq!(b.read(&mut buf).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        assert!(!b.arm_for_sleep(), "nothing to do: may sleep");
        assert_eq!(a.write(&[5u8; 5000]).unwrap(), 4096);
        assert_eq!(a.write(&[5u8; 1]).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        assert!(!a.arm_for_sleep(), "full: may sleep");
        // b slept armed, so a's write rang its doorbell; b's read frees
        // space and rings a's.
        assert!(b.wait(Some(Duration::ZERO)).unwrap(), "b was rung");
        assert_eq!(b.read(&mut buf).unwrap(), 100);
        assert!(a.wait(Some(Duration::ZERO)).unwrap(), "a was rung");
        assert_eq!(a.write(&[5u8; 200]).unwrap(), 100);
        assert_eq!(b.available().unwrap(), 4096);
        assert_eq!(a.capacity(), 4096);
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn pair_over_a_socket_echoes_across_threads() {
        let (sa, sb) = UnixStream::pair().unwrap();
        let data = multirail_proto::sim::pattern(1, 8 << 20);
        let echo = std::thread::spawn(move || {
            let mut s = ShmStream::pair_over(sb, Side::Opener, 0, Some(cma::DEFAULT_MIN)).unwrap();
            let mut buf = vec![0u8; 30_000];
            let mut pending: Vec<u8> = Vec::new();
            let mut done = 0usize;
            let end = Instant::now() + BOUND;
            let mut eof = false;
            while !eof || !pending.is_empty() {
                assert!(Instant::now() < end, "echo stuck after {done}");
                let mut progress = false;
                if pending.len() < 1 << 20 && !eof {
                    match s.read(&mut buf) {
                        Ok(0) => eof = true,
                        Ok(n) => {
                            pending.extend_from_slice(&buf[..n]);
                            progress = true;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => panic!("echo read: {e}"),
                    }
                }
                if !pending.is_empty() {
                    match s.write(&pending) {
                        Ok(n) => {
                            pending.drain(..n);
                            done += n;
                            progress = true;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => panic!("echo write: {e}"),
                    }
                }
                if !progress && !eof {
                    s.wait(Some(BOUND)).unwrap();
                }
            }
            done
        });
        let mut s = ShmStream::pair_over(sa, Side::Creator, CAP, Some(cma::DEFAULT_MIN)).unwrap();
        assert_eq!(s.capacity(), CAP);
        let back = pump(&mut s, &data, data.len()).unwrap();
        assert!(back == data, "echo differs");
        s.shutdown();
        assert_eq!(echo.join().unwrap(), data.len());
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn clean_close_is_end_of_stream_after_the_data() {
        let (mut a, mut b) = ShmStream::pair(4096).unwrap();
        a.write_all(b"before the close").unwrap();
        drop(a);
        let (got, end) = read_to_end(&mut b);
        assert_eq!(got, b"before the close");
        assert_eq!(end.unwrap(), 0);
        assert_eq!(b.read(&mut [0u8; 8]).unwrap(), 0, "stays at end");
        assert_eq!(b.write(b"x").unwrap_err().kind(), io::ErrorKind::BrokenPipe);
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn writes_to_a_peer_that_closed_are_refused_within_a_bounded_number() {
        let (mut a, b) = ShmStream::pair(1 << 16).unwrap();
        a.write_all(b"x").unwrap();
        drop(b);
        let refused = (0..2 * CLOSED_CHECK_EVERY).position(|_| a.write(b"y").is_err()).expect("never refused");
        assert!(refused < CLOSED_CHECK_EVERY as usize, "refused after {refused} writes");
        assert_eq!(a.write(b"z").unwrap_err().kind(), io::ErrorKind::BrokenPipe, "and stays refused");
        // A full ring says so at once.
        let (mut a, b) = ShmStream::pair(4096).unwrap();
        a.write_all(b"x").unwrap();
        while a.write(&[0u8; 1024]).is_ok() {}
        drop(b);
        assert_eq!(a.write(b"y").unwrap_err().kind(), io::ErrorKind::BrokenPipe);
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn our_own_shutdown_stops_both_ways() {
        let (mut a, _b) = ShmStream::pair(4096).unwrap();
        a.shutdown();
        a.shutdown();
        assert_eq!(a.read(&mut [0u8; 8]).unwrap(), 0);
        assert_eq!(a.write(b"x").unwrap_err().kind(), io::ErrorKind::BrokenPipe);
        assert!(a.arm_for_sleep());
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn a_bad_hello_is_refused_and_the_creator_hears_it() {
        let (sa, sb) = UnixStream::pair().unwrap();
        let opener = std::thread::spawn(move || {
            let (fd, _msg) = recv_fd(&sb).unwrap();
            // A peer speaking another version refuses by closing.
            drop((fd, sb));
        });
        let r = ShmStream::pair_over(sa, Side::Creator, 4096, Some(cma::DEFAULT_MIN));
        opener.join().unwrap();
        match r {
            Err(ShmError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof),
            other => panic!("expected EOF, got {other:?}"),
        }

        let (sa, sb) = UnixStream::pair().unwrap();
        let seg = Segment::create(4096).unwrap();
        send_fd(&sa, seg.fd(), b"multirail-shm/9").unwrap();
        assert!(matches!(
            ShmStream::pair_over(sb, Side::Opener, 0, Some(cma::DEFAULT_MIN)),
            Err(ShmError::FdMessage(_))
        ));
    }

    /// Whether `s`'s doorbell has been rung (readable now), draining it.
    fn rung(s: &ShmStream) -> bool {
        let r = s.bell.wait(Some(Duration::ZERO)).unwrap();
        s.bell.drain().unwrap();
        r
    }

    /// As a rail's byte stream, before an engine arms it: a read that finds
    /// the ring empty (or drains it) leaves it armed, so the next write
    /// rings the doorbell — an edge-triggered loop never misses data.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn as_a_byte_stream_a_short_read_arms() {
        use crate::tcp::ByteStream;
        let (mut a, mut b) = ShmStream::pair(4096).unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(ByteStream::read(&mut b, &mut buf).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        ByteStream::write_vectored(&mut a, &[IoSlice::new(b"one")]).unwrap();
        assert!(rung(&b), "armed by the empty read");
        assert_eq!(ByteStream::read(&mut b, &mut buf).unwrap(), 3, "short read: drained, armed again");
        ByteStream::write_vectored(&mut a, &[IoSlice::new(b"two")]).unwrap();
        assert!(rung(&b));
        // One wake-up per arm.
        ByteStream::write_vectored(&mut a, &[IoSlice::new(b"xyz")]).unwrap();
        assert!(!rung(&b), "the arm was used up by the write before");
        // A read that fills the buffer promises nothing and arms nothing.
        assert_eq!(ByteStream::read(&mut b, &mut buf[..6]).unwrap(), 6);
        ByteStream::write_vectored(&mut a, &[IoSlice::new(b"w")]).unwrap();
        assert!(!rung(&b), "a full read left it unarmed");
    }

    /// Once an engine arms it before sleeping, empty reads no longer arm:
    /// a peer writing while we spin rings no doorbell (no syscall per
    /// message), and only the armed sleep is woken.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn armed_by_the_engine_only_a_sleep_is_rung() {
        use crate::tcp::ByteStream;
        let (mut a, mut b) = ShmStream::pair(4096).unwrap();
        assert!(b.spin_poll());
        let mut buf = [0u8; 64];
        assert!(!ByteStream::arm(&mut b), "nothing there: sleep");
        ByteStream::write_vectored(&mut a, &[IoSlice::new(b"wake")]).unwrap();
        assert!(rung(&b), "the sleeper is woken");
        assert_eq!(ByteStream::read(&mut b, &mut buf).unwrap(), 4);
        // Spinning: empty reads, writes from the peer, no doorbell.
        for i in 0..100u8 {
            assert_eq!(ByteStream::read(&mut b, &mut buf).unwrap_err().kind(), io::ErrorKind::WouldBlock);
            ByteStream::write_vectored(&mut a, &[IoSlice::new(&[i])]).unwrap();
            assert!(!rung(&b), "no doorbell while the reader spins");
            assert_eq!(ByteStream::read(&mut b, &mut buf).unwrap(), 1);
            assert_eq!(buf[0], i);
        }
        // Arming with data already there: do not sleep.
        ByteStream::write_vectored(&mut a, &[IoSlice::new(b"x")]).unwrap();
        assert!(ByteStream::arm(&mut b));
        // The peer's death is seen by the arm before a sleep.
        assert_eq!(ByteStream::read(&mut b, &mut buf).unwrap(), 1);
        drop(a);
        assert!(ByteStream::arm(&mut b), "a closed peer: do not sleep");
        assert_eq!(ByteStream::read(&mut b, &mut buf).unwrap(), 0, "clean close: end of stream");
    }

    /// An engine that says up front that it arms before sleeping
    /// ([`ByteStream::engine_arms`]) never has its reads arm, from the first
    /// read on: before this, a loop that spun and never slept kept arming
    /// on every empty read, and each message cost a doorbell `send` on the
    /// writer's side and a `recv` draining it on the reader's.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn an_engine_that_arms_before_sleeping_is_never_rung_while_it_spins() {
        use crate::tcp::ByteStream;
        let (mut a, mut b) = ShmStream::pair(4096).unwrap();
        ByteStream::engine_arms(&mut b);
        let mut buf = [0u8; 64];
        for i in 0..100u8 {
            assert_eq!(ByteStream::read(&mut b, &mut buf).unwrap_err().kind(), io::ErrorKind::WouldBlock);
            ByteStream::write_vectored(&mut a, &[IoSlice::new(&[i])]).unwrap();
            assert!(!rung(&b), "no doorbell while the reader spins");
            assert_eq!(ByteStream::read(&mut b, &mut buf).unwrap(), 1, "a short read arms nothing either");
            assert_eq!(buf[0], i);
        }
        // Its sleep is still woken: it arms first.
        assert!(!ByteStream::arm(&mut b), "nothing there: sleep");
        ByteStream::write_vectored(&mut a, &[IoSlice::new(b"wake")]).unwrap();
        assert!(rung(&b), "the sleeper is woken");
    }

    /// The hint that lets a spinning loop skip a read: "nothing" only when
    /// a read would find nothing and change nothing.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn the_input_hint_says_nothing_only_when_a_read_would_find_nothing() {
        use crate::tcp::ByteStream;
        let (mut a, mut b) = ShmStream::pair(4096).unwrap();
        assert!(ByteStream::input_hint(&mut b), "before the engine arms it, a read may arm it: cannot tell");
        ByteStream::engine_arms(&mut b);
        assert!(!ByteStream::input_hint(&mut b), "empty");
        ByteStream::write_vectored(&mut a, &[IoSlice::new(b"abc")]).unwrap();
        assert!(ByteStream::input_hint(&mut b), "bytes written");
        let mut buf = [0u8; 64];
        assert_eq!(ByteStream::read(&mut b, &mut buf).unwrap(), 3);
        assert!(!ByteStream::input_hint(&mut b), "read");
        assert!(!ByteStream::arm(&mut b), "armed for a sleep");
        assert!(ByteStream::input_hint(&mut b), "armed: the next read withdraws the wake-up");
        assert_eq!(ByteStream::read(&mut b, &mut buf).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        assert!(!ByteStream::input_hint(&mut b));
        drop(a);
        assert!(ByteStream::input_hint(&mut b), "closed: the read says so");
        assert_eq!(ByteStream::read(&mut b, &mut buf).unwrap(), 0);
    }

    /// A loop that never sleeps (busy with other rails) still learns of a
    /// peer that died without closing, within DOORBELL_EVERY empty reads.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn a_busy_loop_sees_a_dead_peer() {
        use crate::tcp::ByteStream;
        let (a, mut b) = ShmStream::pair(4096).unwrap();
        assert!(!ByteStream::arm(&mut b));
        let mut buf = [0u8; 64];
        assert_eq!(ByteStream::read(&mut b, &mut buf).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        // Death without closing: the socket goes, the rings stay open.
        a.bell.shutdown();
        let mut seen = None;
        for n in 1..=DOORBELL_EVERY + 1 {
            match ByteStream::read(&mut b, &mut buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                other => {
                    seen = Some((n, other));
                    break;
                }
            }
        }
        let (n, r) = seen.expect("the dead peer was never noticed");
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::ConnectionAborted);
        assert!(n <= DOORBELL_EVERY, "noticed after {n} empty reads");
    }

    // --- a real second process -------------------------------------------

    const CHILD_ENV: &str = "MULTIRAIL_SHM_TEST_CHILD";
    const CHILD_DATA: usize = 1 << 20;

    /// Not a test on its own: the body of the child process spawned by
    /// the tests below (it returns at once when run normally). It echoes
    /// CHILD_DATA bytes, writes a last message, then closes cleanly or
    /// exits without closing (like a crash: no destructor runs).
    #[test]
    fn child_entry() {
        let Ok(spec) = std::env::var(CHILD_ENV) else { return };
        let (fd, mode) = spec.split_once(':').unwrap();
        let fd: i32 = fd.parse().unwrap();
        // SAFETY: the parent passed us this fd (inherited on purpose) and
        // nothing else in this process owns it.
        let sock = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let mut s = ShmStream::pair_over(sock, Side::Opener, 0, Some(cma::DEFAULT_MIN)).unwrap();
        let mut echoed = 0;
        let mut buf = vec![0u8; 16_000];
        let end = Instant::now() + BOUND;
        while echoed < CHILD_DATA {
            assert!(Instant::now() < end);
            match s.read(&mut buf) {
                Ok(n) if n > 0 => {
                    let mut off = 0;
                    while off < n {
                        assert!(Instant::now() < end);
                        match s.write(&buf[off..n]) {
                            Ok(k) => off += k,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                s.wait(Some(BOUND)).unwrap();
                            }
                            Err(e) => panic!("child write: {e}"),
                        }
                    }
                    echoed += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    s.wait(Some(BOUND)).unwrap();
                }
                other => panic!("child read: {other:?}"),
            }
        }
        // The parent may not have read the whole echo yet: a full ring
        // means wait, as for the echo.
        let mut off = 0;
        while off < mode.len() {
            assert!(Instant::now() < end);
            match s.write(&mode.as_bytes()[off..]) {
                Ok(k) => off += k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    s.wait(Some(BOUND)).unwrap();
                }
                Err(e) => panic!("child write: {e}"),
            }
        }
        if mode == "crash" {
            std::process::exit(0);
        }
        drop(s);
    }

    /// Runs `child_entry` in a new process connected by a socket.
    fn spawn_child(mode: &str) -> (std::process::Child, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let raw = theirs.as_raw_fd();
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "shm::stream::tests::child_entry", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, format!("{raw}:{mode}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        // SAFETY: the closure runs in the forked child before exec and
        // only calls fcntl, which is async-signal-safe; it clears
        // close-on-exec on our end of the pair in the child alone, so no
        // other process spawned meanwhile inherits it.
        unsafe {
            cmd.pre_exec(move || {
                // SAFETY: `raw` is open in the child (fork copied it).
                let fd = BorrowedFd::borrow_raw(raw);
                rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty()).map_err(io::Error::from)
            });
        }
        let child = cmd.spawn().unwrap();
        drop(theirs);
        (child, ours)
    }

    fn run_child(mode: &str) -> (Vec<u8>, io::Result<usize>) {
        let (mut child, sock) = spawn_child(mode);
        sock.set_read_timeout(Some(BOUND)).unwrap();
        let mut s = ShmStream::pair_over(sock, Side::Creator, CAP, Some(cma::DEFAULT_MIN)).unwrap();
        let data = multirail_proto::sim::pattern(9, CHILD_DATA);
        let back = pump(&mut s, &data, data.len()).unwrap();
        assert!(back == data, "echo from the child differs");
        let status = child.wait().unwrap();
        assert!(status.success(), "child failed: {status}");
        read_to_end(&mut s)
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn a_process_that_closes_gives_end_of_stream() {
        let (tail, end) = run_child("clean");
        assert_eq!(tail, b"clean");
        assert_eq!(end.unwrap(), 0);
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn a_process_that_dies_is_an_error_after_its_data() {
        let (tail, end) = run_child("crash");
        assert_eq!(tail, b"crash", "what it wrote before dying is still read");
        assert_eq!(end.unwrap_err().kind(), io::ErrorKind::ConnectionAborted);
    }
}
