//! Runs the HELLO exchange of [`multirail_proto::handshake`] over a
//! blocking stream, with a deadline, before the connection becomes a rail.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use multirail_proto::handshake::{AcceptorWaiting, ConnectorSent, HandshakeError, LocalHello, PeerHello};
use multirail_proto::wire::{HelloRepr, RejectReason};

/// Why a connection did not become a rail.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeFailure {
    #[error("handshake I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("handshake not completed within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Refused(#[from] HandshakeError),
}

/// Reads one whole handshake message within `timeout` (for the message,
/// not for each read: a peer dripping bytes slowly does not extend it).
fn read_msg<S: Read + Timeouts>(s: &mut S, timeout: Duration) -> Result<[u8; HelloRepr::LEN], HandshakeFailure> {
    let deadline = Instant::now() + timeout;
    let mut b = [0u8; HelloRepr::LEN];
    let mut got = 0;
    while got < b.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(HandshakeFailure::Timeout(timeout));
        }
        s.set_timeouts(Some(left))?;
        match s.read(&mut b[got..]) {
            Ok(0) => {
                return Err(HandshakeFailure::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed during handshake",
                )));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(HandshakeFailure::Timeout(timeout));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(b)
}

/// Something we can set a read timeout on.
pub trait Timeouts {
    fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()>;
}

impl Timeouts for std::net::TcpStream {
    fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(t)?;
        self.set_write_timeout(t)
    }
}

impl Timeouts for std::os::unix::net::UnixStream {
    fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(t)?;
        self.set_write_timeout(t)
    }
}

/// Connector side: sends HELLO, checks the reply, sends AUTH.
pub fn connect<S: Read + Write + Timeouts>(
    s: &mut S,
    local: &LocalHello,
    key: &[u8],
    timeout: Duration,
) -> Result<PeerHello, HandshakeFailure> {
    s.set_timeouts(Some(timeout))?;
    let (state, hello) = ConnectorSent::start(local, key);
    s.write_all(&hello)?;
    let reply = read_msg(s, timeout)?;
    let (auth, peer) = state.on_reply(&reply)?;
    s.write_all(&auth)?;
    s.set_timeouts(None)?;
    Ok(peer)
}

/// Acceptor side: reads HELLO, lets `check` vet the claimed identity
/// (its error picks the REJECT reason), replies, then verifies AUTH. On
/// refusal a REJECT saying why is sent before returning; nothing else is
/// read.
pub fn accept<S: Read + Write + Timeouts>(
    s: &mut S,
    local: &LocalHello,
    key: &[u8],
    timeout: Duration,
    check: impl FnOnce(&PeerHello) -> Result<(), HandshakeError>,
) -> Result<PeerHello, HandshakeFailure> {
    s.set_timeouts(Some(timeout))?;
    let hello = match read_msg(s, timeout) {
        Ok(h) => h,
        Err(e) => {
            if matches!(e, HandshakeFailure::Timeout(_)) {
                let _ = s.write_all(&HelloRepr::reject(RejectReason::Timeout).to_bytes());
            }
            return Err(e);
        }
    };
    let refuse = |s: &mut S, e: HandshakeError| -> HandshakeFailure {
        if let Some(b) = e.reject_bytes() {
            let _ = s.write_all(&b);
        }
        HandshakeFailure::Refused(e)
    };
    let (state, reply, claimed) = match AcceptorWaiting::new(local, key).on_hello(&hello) {
        Ok(x) => x,
        Err(e) => return Err(refuse(s, e)),
    };
    if let Err(e) = check(&claimed) {
        return Err(refuse(s, e));
    }
    s.write_all(&reply)?;
    let auth = read_msg(s, timeout)?;
    let peer = state.on_auth(&auth).map_err(|e| refuse(s, e))?;
    s.set_timeouts(None)?;
    Ok(peer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn hello(rank: u32, job: u64) -> LocalHello {
        LocalHello {
            job_id: job,
            rank,
            size: 2,
            rail_index: 0,
            rail_count: 1,
            bandwidth: 0,
            latency_ns: 0,
            max_frame: 1 << 20,
            credits: 1 << 20,
            nonce: [rank as u8 + 1; 32],
            generation: 0,
        }
    }

    fn run(
        ckey: &'static [u8],
        akey: &'static [u8],
        cjob: u64,
    ) -> (Result<PeerHello, HandshakeFailure>, Result<PeerHello, HandshakeFailure>) {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || connect(&mut a, &hello(1, cjob), ckey, Duration::from_secs(5)));
        let acc = accept(&mut b, &hello(0, 7), akey, Duration::from_secs(5), |_| Ok(()));
        drop(b);
        (t.join().unwrap(), acc)
    }

    #[test]
    fn good_key() {
        let (c, a) = run(b"k", b"k", 7);
        assert_eq!(c.unwrap().rank, 0);
        assert_eq!(a.unwrap().rank, 1);
    }

    #[test]
    fn wrong_key_is_clear_on_both_sides() {
        let (c, a) = run(b"k1", b"k2", 7);
        // The connector cannot verify the acceptor's proof.
        assert!(c.unwrap_err().to_string().contains("job key"));
        assert!(a.is_err());
    }

    #[test]
    fn wrong_job_is_reported_to_the_connector() {
        let (c, a) = run(b"k", b"k", 8);
        assert!(c.unwrap_err().to_string().contains("different job id"), "connector sees the reason");
        assert!(a.unwrap_err().to_string().contains("job"));
    }

    #[test]
    fn silent_peer_times_out() {
        let (_a, mut b) = UnixStream::pair().unwrap();
        let e = accept(&mut b, &hello(0, 7), b"k", Duration::from_millis(100), |_| Ok(())).unwrap_err();
        assert!(matches!(e, HandshakeFailure::Timeout(_)), "{e}");
    }

    #[test]
    fn identity_check_refuses() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || connect(&mut a, &hello(1, 7), b"k", Duration::from_secs(5)));
        let e = accept(&mut b, &hello(0, 7), b"k", Duration::from_secs(5), |p| {
            Err(HandshakeError::Identity(format!("rank {} not in job", p.rank)))
        });
        assert!(e.unwrap_err().to_string().contains("rank 1 not in job"));
        assert!(t.join().unwrap().unwrap_err().to_string().contains("unexpected rank"));
    }
}
