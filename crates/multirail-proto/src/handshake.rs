//! The rail handshake, as a sans-IO state machine with one type per state.
//!
//! ```text
//! connector                                   acceptor
//!   HELLO {nonce_c, proof = 0}  ───────────▶  checks magic, version, job
//!                               ◀───────────  HELLO {nonce_a, proof_a}
//!   checks job, proof_a
//!   AUTH {proof_c}              ───────────▶  checks proof_c
//! ```
//!
//! `proof_a = HMAC-SHA256(key, "multirail/1 acceptor"  || T)` and
//! `proof_c = HMAC-SHA256(key, "multirail/1 connector" || T)`, where `T` is
//! the connector's HELLO followed by the acceptor's HELLO, both emitted with
//! a zero proof field. Both proofs cover both nonces, so neither side can be
//! replayed. Any failure on the acceptor side produces a REJECT to send back
//! before closing; nothing after a failed handshake is read.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::wire::{HelloKind, HelloRepr, PROTOCOL_VERSION, RejectReason, WireError};

type HmacSha256 = Hmac<Sha256>;

/// What one side says about itself in its HELLO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalHello {
    pub job_id: u64,
    pub rank: u32,
    pub size: u32,
    pub rail_index: u16,
    pub rail_count: u16,
    pub bandwidth: u64,
    pub latency_ns: u32,
    pub max_frame: u32,
    /// Bytes of unexpected eager data we will buffer for the peer.
    pub credits: u64,
    /// Fresh random bytes; the caller supplies them (no OS randomness here).
    pub nonce: [u8; 32],
    /// Connection generation (connector: the one it proposes; acceptor:
    /// ignored, the reply echoes the connector's).
    pub generation: u32,
}

impl LocalHello {
    fn repr(&self) -> HelloRepr {
        HelloRepr {
            version: PROTOCOL_VERSION,
            kind: HelloKind::Hello,
            reason: 0,
            rank: self.rank,
            size: self.size,
            rail_index: self.rail_index,
            rail_count: self.rail_count,
            job_id: self.job_id,
            bandwidth: self.bandwidth,
            latency_ns: self.latency_ns,
            max_frame: self.max_frame,
            nonce: self.nonce,
            proof: [0; 32],
            credits: self.credits,
            generation: self.generation,
        }
    }
}

/// The authenticated peer, as learned from its HELLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerHello {
    pub rank: u32,
    pub size: u32,
    pub rail_index: u16,
    pub rail_count: u16,
    pub bandwidth: u64,
    pub latency_ns: u32,
    pub max_frame: u32,
    pub credits: u64,
    pub generation: u32,
}

impl From<&HelloRepr> for PeerHello {
    fn from(h: &HelloRepr) -> Self {
        PeerHello {
            rank: h.rank,
            size: h.size,
            rail_index: h.rail_index,
            rail_count: h.rail_count,
            bandwidth: h.bandwidth,
            latency_ns: h.latency_ns,
            max_frame: h.max_frame,
            credits: h.credits,
            generation: h.generation,
        }
    }
}

/// Why a handshake failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("malformed handshake: {0}")]
    Wire(#[from] WireError),
    #[error("peer refused the connection: {0}")]
    Rejected(RejectReason),
    #[error("peer belongs to job {theirs:#x}, we are job {ours:#x}")]
    WrongJob { ours: u64, theirs: u64 },
    #[error("peer does not know the job key (MULTIRAIL_KEY differs)")]
    BadKey,
    #[error("expected a {expected:?} message, got {got:?}")]
    UnexpectedKind { expected: HelloKind, got: HelloKind },
    #[error("peer identity refused: {0}")]
    Identity(String),
    /// The acceptor holds a newer connection for this rail.
    #[error("a newer connection for this rail exists")]
    Superseded,
}

impl HandshakeError {
    /// The REJECT reason to send back for this error, if any.
    pub fn reject_reason(&self) -> Option<RejectReason> {
        Some(match self {
            HandshakeError::Wire(WireError::Version { .. }) => RejectReason::Version,
            HandshakeError::Wire(_) | HandshakeError::UnexpectedKind { .. } => RejectReason::Malformed,
            HandshakeError::WrongJob { .. } => RejectReason::Job,
            HandshakeError::BadKey => RejectReason::Key,
            HandshakeError::Identity(_) => RejectReason::Identity,
            HandshakeError::Superseded => RejectReason::Superseded,
            HandshakeError::Rejected(_) => return None,
        })
    }

    /// The bytes of the REJECT message to send back, if any.
    pub fn reject_bytes(&self) -> Option<[u8; HelloRepr::LEN]> {
        self.reject_reason().map(|r| HelloRepr::reject(r).to_bytes())
    }
}

fn proof(key: &[u8], label: &[u8], c: &HelloRepr, a: &HelloRepr) -> HmacSha256 {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(label);
    let mut c = *c;
    c.proof = [0; 32];
    let mut a = *a;
    a.proof = [0; 32];
    mac.update(&c.to_bytes());
    mac.update(&a.to_bytes());
    mac
}

const ACCEPTOR_LABEL: &[u8] = b"multirail/1 acceptor";
const CONNECTOR_LABEL: &[u8] = b"multirail/1 connector";

fn parse_kind(b: &[u8], expected: HelloKind) -> Result<HelloRepr, HandshakeError> {
    let h = HelloRepr::parse(b)?;
    if h.kind == HelloKind::Reject {
        return Err(HandshakeError::Rejected(RejectReason::from_u8(h.reason)));
    }
    if h.kind != expected {
        return Err(HandshakeError::UnexpectedKind { expected, got: h.kind });
    }
    Ok(h)
}

/// Connector, first state: HELLO sent, waiting for the acceptor's reply.
pub struct ConnectorSent {
    key: Vec<u8>,
    mine: HelloRepr,
}

impl ConnectorSent {
    /// Starts a handshake; returns the state and the HELLO to send.
    pub fn start(local: &LocalHello, key: &[u8]) -> (ConnectorSent, [u8; HelloRepr::LEN]) {
        let mine = local.repr();
        (ConnectorSent { key: key.to_vec(), mine }, mine.to_bytes())
    }

    /// Handles the acceptor's reply. On success returns the AUTH message to
    /// send and the peer's identity; the connection is then established.
    pub fn on_reply(self, b: &[u8]) -> Result<([u8; HelloRepr::LEN], PeerHello), HandshakeError> {
        let theirs = parse_kind(b, HelloKind::Hello)?;
        if theirs.job_id != self.mine.job_id {
            return Err(HandshakeError::WrongJob { ours: self.mine.job_id, theirs: theirs.job_id });
        }
        proof(&self.key, ACCEPTOR_LABEL, &self.mine, &theirs)
            .verify_slice(&theirs.proof)
            .map_err(|_| HandshakeError::BadKey)?;
        let mut auth = self.mine;
        auth.kind = HelloKind::Auth;
        auth.proof = proof(&self.key, CONNECTOR_LABEL, &self.mine, &theirs).finalize().into_bytes().into();
        Ok((auth.to_bytes(), PeerHello::from(&theirs)))
    }
}

/// Acceptor, first state: waiting for a HELLO.
pub struct AcceptorWaiting {
    key: Vec<u8>,
    local: LocalHello,
}

/// Acceptor, second state: reply sent, waiting for AUTH.
pub struct AcceptorReplied {
    key: Vec<u8>,
    theirs: HelloRepr,
    mine: HelloRepr,
}

impl AcceptorWaiting {
    /// `local.rail_index` is ignored: the acceptor answers on the rail the
    /// connector names, which the caller checks in `on_hello`'s result.
    pub fn new(local: &LocalHello, key: &[u8]) -> AcceptorWaiting {
        AcceptorWaiting { key: key.to_vec(), local: local.clone() }
    }

    /// Handles the connector's HELLO. On success returns the next state,
    /// the reply to send and the (not yet authenticated) peer identity.
    /// On failure, send [`HandshakeError::reject_bytes`] and close.
    pub fn on_hello(self, b: &[u8]) -> Result<(AcceptorReplied, [u8; HelloRepr::LEN], PeerHello), HandshakeError> {
        let theirs = parse_kind(b, HelloKind::Hello)?;
        if theirs.job_id != self.local.job_id {
            return Err(HandshakeError::WrongJob { ours: self.local.job_id, theirs: theirs.job_id });
        }
        let mut mine = self.local.repr();
        mine.rail_index = theirs.rail_index;
        mine.generation = theirs.generation;
        mine.proof = proof(&self.key, ACCEPTOR_LABEL, &theirs, &mine).finalize().into_bytes().into();
        let peer = PeerHello::from(&theirs);
        Ok((AcceptorReplied { key: self.key, theirs, mine }, mine.to_bytes(), peer))
    }
}

impl AcceptorReplied {
    /// Handles the connector's AUTH; on success the peer is authenticated.
    pub fn on_auth(self, b: &[u8]) -> Result<PeerHello, HandshakeError> {
        let auth = parse_kind(b, HelloKind::Auth)?;
        proof(&self.key, CONNECTOR_LABEL, &self.theirs, &self.mine)
            .verify_slice(&auth.proof)
            .map_err(|_| HandshakeError::BadKey)?;
        Ok(PeerHello::from(&self.theirs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(rank: u32, job: u64, nonce: u8) -> LocalHello {
        LocalHello {
            job_id: job,
            rank,
            size: 2,
            rail_index: 1,
            rail_count: 2,
            bandwidth: 0,
            latency_ns: 0,
            max_frame: 1 << 20,
            credits: 1 << 20,
            nonce: [nonce; 32],
            generation: 3,
        }
    }

    fn run(
        ckey: &[u8],
        akey: &[u8],
        cjob: u64,
        ajob: u64,
    ) -> (Result<PeerHello, HandshakeError>, Result<PeerHello, HandshakeError>) {
        let (c, hello) = ConnectorSent::start(&local(1, cjob, 1), ckey);
        let a = AcceptorWaiting::new(&local(0, ajob, 2), akey);
        let (a, reply, _) = match a.on_hello(&hello) {
            Ok(x) => x,
            Err(e) => {
                let rej = e.reject_bytes().expect("acceptor errors carry a reject");
                return (c.on_reply(&rej).map(|x| x.1), Err(e));
            }
        };
        match c.on_reply(&reply) {
            Ok((auth, peer)) => (Ok(peer), a.on_auth(&auth)),
            Err(e) => (Err(e), Err(HandshakeError::Rejected(RejectReason::Unknown))),
        }
    }

    #[test]
    fn same_key_succeeds() {
        let (c, a) = run(b"k", b"k", 7, 7);
        assert_eq!(c.expect("connector ok").rank, 0);
        let a = a.expect("acceptor ok");
        assert_eq!((a.rank, a.rail_index, a.generation), (1, 1, 3));
    }

    #[test]
    fn wrong_key_refused_by_connector() {
        let (c, _) = run(b"k1", b"k2", 7, 7);
        assert_eq!(c, Err(HandshakeError::BadKey));
    }

    #[test]
    fn wrong_job_refused_and_reported() {
        let (c, a) = run(b"k", b"k", 7, 8);
        assert_eq!(a, Err(HandshakeError::WrongJob { ours: 8, theirs: 7 }));
        assert_eq!(c, Err(HandshakeError::Rejected(RejectReason::Job)));
    }

    #[test]
    fn acceptor_refuses_forged_auth() {
        let (c, hello) = ConnectorSent::start(&local(1, 7, 1), b"k");
        let a = AcceptorWaiting::new(&local(0, 7, 2), b"k");
        let (a, reply, _) = a.on_hello(&hello).unwrap();
        let (mut auth, _) = c.on_reply(&reply).unwrap();
        auth[90] ^= 1;
        assert_eq!(a.on_auth(&auth), Err(HandshakeError::BadKey));
    }

    #[test]
    fn acceptor_refuses_replayed_auth() {
        // An AUTH captured from one connection is useless on another,
        // because the acceptor's nonce differs.
        let (c, hello) = ConnectorSent::start(&local(1, 7, 1), b"k");
        let (a1, reply1, _) = AcceptorWaiting::new(&local(0, 7, 2), b"k").on_hello(&hello).unwrap();
        let (auth, _) = c.on_reply(&reply1).unwrap();
        assert!(a1.on_auth(&auth).is_ok());
        let (a2, _, _) = AcceptorWaiting::new(&local(0, 7, 3), b"k").on_hello(&hello).unwrap();
        assert_eq!(a2.on_auth(&auth), Err(HandshakeError::BadKey));
    }

    #[test]
    fn garbage_and_version_are_rejected_with_reason() {
        let a = AcceptorWaiting::new(&local(0, 7, 2), b"k");
        let e = a.on_hello(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n....................................................................................").err().unwrap();
        assert_eq!(e.reject_reason(), Some(RejectReason::Malformed));
        let (_, hello) = ConnectorSent::start(&local(1, 7, 1), b"k");
        let mut h = hello;
        h[8] = 9;
        let e = AcceptorWaiting::new(&local(0, 7, 2), b"k").on_hello(&h).err().unwrap();
        assert_eq!(e.reject_reason(), Some(RejectReason::Version));
    }
}
