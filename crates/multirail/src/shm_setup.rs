//! Setting up a `shm` rail over its authenticated loopback connection.
//!
//! A `shm` rail is opened, accepted, authenticated, raced and replaced
//! exactly like a TCP rail: over a loopback TCP connection, with the
//! HELLO exchange and the connection generations of [`crate::connections`].
//! Once authenticated, that connection only carries the hand-over below
//! and is then closed; the rail's bytes move through a shared segment.
//!
//! 1. The accepting side binds a Unix socket with a random name in the
//!    *abstract* namespace (no file, gone with the process) and sends
//!    `"MRSH"`, the name's length (u8), the name, and a 16-byte random
//!    token over the authenticated connection.
//! 2. The opening side connects to that name and sends the token first.
//!    Abstract names are per network namespace, and so per host in the
//!    emulated cluster: a peer on another host cannot be reached, and the
//!    rail fails with an error saying so.
//! 3. Over the Unix socket the opening side creates the segment (a memfd)
//!    and passes its fd ([`ShmStream::pair_over`]); the Unix socket stays
//!    as the rail's doorbell, and its end-of-stream is how a dead peer is
//!    noticed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use multirail_transport::shm::{ShmStream, Side};

const MAGIC: &[u8; 4] = b"MRSH";
const NAME_PREFIX: &str = "multirail-shm-";
const TOKEN: usize = 16;

/// The accepting side (the peer opened the connection).
pub(crate) fn accept(mut ctl: TcpStream, timeout: Duration, cma: Option<usize>) -> Result<ShmStream, String> {
    let mut nonce = [0u8; 8];
    let mut token = [0u8; TOKEN];
    getrandom::fill(&mut nonce).map_err(|e| format!("no random numbers: {e}"))?;
    getrandom::fill(&mut token).map_err(|e| format!("no random numbers: {e}"))?;
    let name = format!("{NAME_PREFIX}{}-{:016x}", std::process::id(), u64::from_le_bytes(nonce));
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| format!("socket name: {e}"))?;
    let listener = UnixListener::bind_addr(&addr).map_err(|e| format!("cannot bind a local socket: {e}"))?;
    let mut msg = Vec::with_capacity(5 + name.len() + TOKEN);
    msg.extend_from_slice(MAGIC);
    msg.push(name.len() as u8);
    msg.extend_from_slice(name.as_bytes());
    msg.extend_from_slice(&token);
    ctl.write_all(&msg).map_err(|e| format!("sending the socket name: {e}"))?;
    // Wait for the peer on the Unix socket, bounded; a connection without
    // the token (another local process) is dropped.
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + timeout;
    let sock = loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).map_err(|e| e.to_string())?;
                s.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
                let mut got = [0u8; TOKEN];
                if (&s).read_exact(&mut got).is_ok() && got == token {
                    break s;
                }
                tracing::warn!("shm: dropped a local connection without the rail's token");
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(format!("accepting the peer's local socket: {e}")),
        }
        if Instant::now() >= deadline {
            return Err(format!("the peer did not connect to the shared-memory socket within {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    drop(listener);
    sock.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    ShmStream::pair_over(sock, Side::Opener, 0, cma).map_err(|e| format!("shared segment from the peer: {e}"))
}

/// The opening side (we opened the connection).
pub(crate) fn connect(
    mut ctl: TcpStream,
    timeout: Duration,
    capacity: usize,
    cma: Option<usize>,
) -> Result<ShmStream, String> {
    ctl.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    let mut head = [0u8; 5];
    ctl.read_exact(&mut head).map_err(|e| format!("waiting for the peer's socket name: {e}"))?;
    if &head[..4] != MAGIC {
        return Err("the peer is not a shared-memory rail (is `shm` at the same place in both rail lists?)".into());
    }
    let mut rest = vec![0u8; head[4] as usize + TOKEN];
    ctl.read_exact(&mut rest).map_err(|e| format!("reading the peer's socket name: {e}"))?;
    let (name, token) = rest.split_at(head[4] as usize);
    if !name.starts_with(NAME_PREFIX.as_bytes()) {
        return Err("the peer sent a socket name that is not a multirail one".into());
    }
    let addr = SocketAddr::from_abstract_name(name).map_err(|e| format!("socket name: {e}"))?;
    let mut sock = UnixStream::connect_addr(&addr).map_err(|e| {
        format!("the peer is not on this host (shared memory needs both ranks on one host): local socket: {e}")
    })?;
    sock.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    sock.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    sock.write_all(token).map_err(|e| format!("local socket: {e}"))?;
    drop(ctl);
    ShmStream::pair_over(sock, Side::Creator, capacity, cma).map_err(|e| format!("shared segment: {e}"))
}
