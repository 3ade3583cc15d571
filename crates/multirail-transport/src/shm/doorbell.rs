//! The Unix socket beside a segment: fd passing and wake-ups.
//!
//! [`send_fd`] / [`recv_fd`] hand the segment's fd to the peer with
//! `SCM_RIGHTS`, together with a few bytes of message. After that the
//! socket becomes a [`Doorbell`]: one byte written means "look at the
//! rings again", and EOF means the peer closed it or died (the kernel
//! closes a dead process's sockets), which is how peer death is noticed
//! without heartbeats.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};

use super::ShmError;

/// Most message bytes sent with an fd.
pub const MAX_FD_MSG: usize = 256;
/// Fds we have room for when receiving: more than one is an error, but we
/// take them (and close them) rather than let the kernel truncate.
const FD_ROOM: usize = 4;
/// Bytes read per `recv` when draining the doorbell, and rounds.
const DRAIN_CHUNK: usize = 64;
const DRAIN_ROUNDS: usize = 64;
/// Retries after EINTR.
const EINTR_RETRIES: usize = 100;

/// Sends `fd` and `bytes` (1..=[`MAX_FD_MSG`] bytes; at least one, since a
/// stream socket carries no ancillary data without data) in one message.
/// Meant for a blocking socket, before it becomes a doorbell.
pub fn send_fd(sock: &UnixStream, fd: BorrowedFd<'_>, bytes: &[u8]) -> Result<(), ShmError> {
    if bytes.is_empty() || bytes.len() > MAX_FD_MSG {
        return Err(ShmError::FdMessage(format!("{} message bytes (1..={MAX_FD_MSG} allowed)", bytes.len())));
    }
    let fds = [fd];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("SCM_RIGHTS does not fit its buffer").into());
    }
    let mut sent = retry_eintr(|| sendmsg(sock, &[IoSlice::new(bytes)], &mut control))?;
    // The fd went with the first byte; send any rest as plain data.
    let mut rounds = 0;
    while sent < bytes.len() {
        rounds += 1;
        if rounds > EINTR_RETRIES {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "fd message stuck").into());
        }
        sent += retry_eintr(|| rustix::net::send(sock, &bytes[sent..], SendFlags::NOSIGNAL))?;
    }
    Ok(())
}

fn sendmsg(
    sock: &UnixStream,
    iov: &[IoSlice<'_>],
    control: &mut SendAncillaryBuffer<'_, '_, '_>,
) -> Result<usize, Errno> {
    rustix::net::sendmsg(sock, iov, control, SendFlags::NOSIGNAL)
}

fn retry_eintr<T>(mut f: impl FnMut() -> Result<T, Errno>) -> io::Result<T> {
    for _ in 0..EINTR_RETRIES {
        match f() {
            Err(Errno::INTR) => continue,
            r => return r.map_err(io::Error::from),
        }
    }
    Err(io::Error::from(Errno::INTR))
}

/// Receives one message sent by [`send_fd`]: exactly one fd (received
/// close-on-exec) and its bytes. Anything else is an error, and every fd
/// that came with it is closed. EOF before the message is
/// `UnexpectedEof`. Blocks on a blocking socket.
pub fn recv_fd(sock: &UnixStream) -> Result<(OwnedFd, Vec<u8>), ShmError> {
    let mut buf = [0u8; MAX_FD_MSG];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(FD_ROOM))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = retry_eintr(|| {
        rustix::net::recvmsg(sock, &mut [IoSliceMut::new(&mut buf)], &mut control, RecvFlags::CMSG_CLOEXEC)
    })?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = m {
            fds.extend(it);
        }
    }
    if msg.bytes == 0 && fds.is_empty() {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed before sending the segment").into());
    }
    if msg.flags.contains(ReturnFlags::CTRUNC) {
        return Err(ShmError::FdMessage(format!("more than {FD_ROOM} fds (ancillary data truncated)")));
    }
    if fds.len() != 1 {
        // Dropping `fds` closes whatever came.
        return Err(ShmError::FdMessage(format!("expected exactly one fd, got {}", fds.len())));
    }
    let fd = fds.pop().ok_or_else(|| ShmError::FdMessage("no fd".into()))?;
    Ok((fd, buf[..msg.bytes].to_vec()))
}

/// Why the doorbell stopped working.
#[derive(Debug, thiserror::Error)]
pub enum DoorbellError {
    /// EOF or a reset: the peer closed its end or died.
    #[error("the peer closed the doorbell (closed or died)")]
    PeerClosed,
    #[error("doorbell: {0}")]
    Io(io::Error),
}

impl From<Errno> for DoorbellError {
    fn from(e: Errno) -> DoorbellError {
        match e {
            Errno::PIPE | Errno::CONNRESET => DoorbellError::PeerClosed,
            e => DoorbellError::Io(e.into()),
        }
    }
}

/// The wake-up side of the socket. Non-blocking; poll [`as_fd`](AsFd)
/// for readability to sleep until rung (or until the peer goes away).
#[derive(Debug)]
pub struct Doorbell {
    sock: UnixStream,
}

impl Doorbell {
    /// Takes over `sock` and makes it non-blocking.
    pub fn new(sock: UnixStream) -> io::Result<Doorbell> {
        sock.set_nonblocking(true)?;
        Ok(Doorbell { sock })
    }

    /// Wakes the peer: writes one byte. A full socket (`EAGAIN`) is fine:
    /// wake-ups are already pending, which is all a byte means.
    pub fn ring(&self) -> Result<(), DoorbellError> {
        for _ in 0..EINTR_RETRIES {
            match rustix::net::send(&self.sock, &[1], SendFlags::NOSIGNAL | SendFlags::DONTWAIT) {
                Ok(_) | Err(Errno::AGAIN) => return Ok(()),
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(DoorbellError::Io(Errno::INTR.into()))
    }

    /// Reads every pending wake-up byte without blocking and returns how
    /// many there were; EOF is `PeerClosed` (after the bytes before it).
    /// Bounded: a peer flooding the socket only leaves it readable.
    pub fn drain(&self) -> Result<usize, DoorbellError> {
        let mut buf = [0u8; DRAIN_CHUNK];
        let mut total = 0;
        let mut rounds = 0;
        while rounds < DRAIN_ROUNDS {
            rounds += 1;
            match rustix::net::recv(&self.sock, &mut buf[..], RecvFlags::DONTWAIT) {
                Ok((0, _)) => return Err(DoorbellError::PeerClosed),
                Ok((n, _)) => total += n,
                Err(Errno::AGAIN) => return Ok(total),
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(total)
    }

    /// Blocks until the doorbell is readable (rung, or the peer closed) or
    /// `timeout` passes; returns whether it is readable. Does not drain.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let ts = timeout.map(|d| Timespec { tv_sec: d.as_secs() as _, tv_nsec: d.subsec_nanos() as _ });
        let mut fds = [PollFd::new(&self.sock, PollFlags::IN)];
        let n = retry_eintr(|| rustix::event::poll(&mut fds, ts.as_ref()))?;
        Ok(n > 0)
    }

    /// Shuts the socket down both ways: the peer's doorbell sees EOF.
    pub fn shutdown(&self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

impl AsFd for Doorbell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl AsRawFd for Doorbell {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::sync::Arc;

    fn memfd_with(bytes: &[u8]) -> std::fs::File {
        let fd = rustix::fs::memfd_create("doorbell-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let mut f = std::fs::File::from(fd);
        f.write_all(bytes).unwrap();
        f
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn an_fd_crosses_a_socket_pair() {
        let (a, b) = UnixStream::pair().unwrap();
        let f = memfd_with(b"shared bytes");
        send_fd(&a, f.as_fd(), b"hello").unwrap();
        let (fd, msg) = recv_fd(&b).unwrap();
        assert_eq!(msg, b"hello");
        assert_ne!(fd.as_raw_fd(), f.as_raw_fd());
        let (sa, sb) = (rustix::fs::fstat(&f).unwrap(), rustix::fs::fstat(&fd).unwrap());
        assert_eq!((sa.st_dev, sa.st_ino), (sb.st_dev, sb.st_ino), "the same file");
        let flags = rustix::io::fcntl_getfd(&fd).unwrap();
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
        let mut g = std::fs::File::from(fd);
        g.rewind().unwrap();
        let mut s = String::new();
        g.read_to_string(&mut s).unwrap();
        assert_eq!(s, "shared bytes");
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn wrong_messages_are_errors() {
        let f = memfd_with(b"x");
        // Message length limits.
        let (a, b) = UnixStream::pair().unwrap();
        assert!(matches!(send_fd(&a, f.as_fd(), b""), Err(ShmError::FdMessage(_))));
        assert!(matches!(send_fd(&a, f.as_fd(), &[0; MAX_FD_MSG + 1]), Err(ShmError::FdMessage(_))));
        // Bytes without an fd.
        (&a).write_all(b"no fd here").unwrap();
        assert!(matches!(recv_fd(&b), Err(ShmError::FdMessage(m)) if m.contains("got 0")));
        // Two fds: refused, and both closed on our side.
        let g = memfd_with(b"y");
        let fds = [f.as_fd(), g.as_fd()];
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
        sendmsg(&a, &[IoSlice::new(b"two")], &mut control).unwrap();
        assert!(matches!(recv_fd(&b), Err(ShmError::FdMessage(m)) if m.contains("got 2")));
        // EOF.
        drop(a);
        match recv_fd(&b) {
            Err(ShmError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof),
            other => panic!("expected EOF, got {other:?}"),
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn rings_are_drained_and_a_full_socket_is_fine() {
        let (a, b) = UnixStream::pair().unwrap();
        let (a, b) = (Doorbell::new(a).unwrap(), Doorbell::new(b).unwrap());
        assert_eq!(b.drain().unwrap(), 0);
        assert!(!b.wait(Some(Duration::ZERO)).unwrap());
        a.ring().unwrap();
        a.ring().unwrap();
        assert!(b.wait(Some(Duration::ZERO)).unwrap());
        assert_eq!(b.drain().unwrap(), 2);
        assert_eq!(b.drain().unwrap(), 0);
        // Far more rings than the socket buffer holds: never an error.
        for _ in 0..100_000 {
            a.ring().unwrap();
        }
        let mut drained = 0;
        for _ in 0..100_000 {
            let n = b.drain().unwrap();
            if n == 0 {
                break;
            }
            drained += n;
        }
        assert!(drained > 0 && drained < 100_000, "{drained}: some rings merged into pending ones");
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn a_closed_peer_is_reported_both_ways() {
        let (a, b) = UnixStream::pair().unwrap();
        let (a, b) = (Doorbell::new(a).unwrap(), Doorbell::new(b).unwrap());
        a.ring().unwrap();
        a.shutdown();
        assert!(b.wait(Some(Duration::from_secs(10))).unwrap(), "EOF wakes a sleeper");
        assert!(matches!(b.drain(), Err(DoorbellError::PeerClosed)));
        drop(a);
        // Writing to a dead peer is an error, not SIGPIPE.
        assert!(matches!(b.ring(), Err(DoorbellError::PeerClosed)));
    }

    /// A thread that arms and sleeps on the real doorbell is always woken:
    /// 20k round trips where the consumer sleeps whenever the ring is
    /// empty. A lost wake-up fails the 20 s wait instead of hanging.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn armed_sleeper_is_woken_through_the_socket() {
        let (mut p, mut c) = super::super::ring::pair_in_heap(4096).unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        let (wake_consumer, consumer_bell) = (Doorbell::new(a).unwrap(), Doorbell::new(b).unwrap());
        let messages = 20_000u32;
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done2 = done.clone();
        let reader = std::thread::spawn(move || {
            let mut got = 0u32;
            let mut sleeps = 0u32;
            let mut buf = [0u8; 4];
            let mut have = 0;
            while got < messages {
                let n = c.read(&mut buf[have..]).unwrap();
                have += n;
                if have == 4 {
                    assert_eq!(u32::from_le_bytes(buf), got, "in order");
                    got += 1;
                    have = 0;
                    continue;
                }
                if n > 0 {
                    continue;
                }
                consumer_bell.drain().unwrap();
                if !c.arm() {
                    assert!(consumer_bell.wait(Some(Duration::from_secs(20))).unwrap(), "lost wake-up at {got}");
                    sleeps += 1;
                }
            }
            done2.store(true, std::sync::atomic::Ordering::Relaxed);
            sleeps
        });
        for i in 0..messages {
            let bytes = i.to_le_bytes();
            let mut off = 0;
            let mut spins = 0u64;
            while off < 4 {
                spins += 1;
                assert!(spins < 1 << 30, "writer stuck");
                off += p.write(&bytes[off..]).unwrap();
            }
            if p.take_consumer_wake() {
                wake_consumer.ring().unwrap();
            }
            // Let the reader fall asleep now and then.
            if i % 64 == 0 {
                std::thread::yield_now();
            }
        }
        let sleeps = reader.join().unwrap();
        assert!(done.load(std::sync::atomic::Ordering::Relaxed));
        eprintln!("reader slept {sleeps} times");
    }
}
