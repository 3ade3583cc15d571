//! Errors of the public API, by category: configuration, setup, a peer
//! that failed or closed, a receive that did not fit.

use multirail_proto::core::{PeerFailure, RecvError, SendError, Status};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is invalid (names the setting and the value).
    #[error("configuration: {0}")]
    Config(String),
    /// Ranks could not meet or a rail could not be connected.
    #[error("setup: {0}")]
    Setup(String),
    /// Every rail to the peer is down.
    #[error("{0}")]
    PeerFailed(PeerFailure),
    #[error("peer {0} closed its endpoint")]
    PeerClosed(u32),
    /// The message was longer than the posted buffer.
    #[error("message of {} bytes from peer {} (tag {}) does not fit the {buf_len}-byte buffer", status.len, status.peer, status.tag)]
    Truncated { status: Status, buf_len: u64 },
    #[error("no such peer: rank {0}")]
    NoSuchPeer(u32),
    #[error("timed out")]
    Timeout,
    #[error("the endpoint is shut down")]
    Shutdown,
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

impl From<SendError> for Error {
    fn from(e: SendError) -> Self {
        match e {
            SendError::PeerFailed(f) => Error::PeerFailed(f),
            SendError::PeerClosed(p) => Error::PeerClosed(p),
        }
    }
}

impl From<RecvError> for Error {
    fn from(e: RecvError) -> Self {
        match e {
            RecvError::Truncated { status, buf_len } => Error::Truncated { status, buf_len },
            RecvError::PeerFailed(f) => Error::PeerFailed(f),
            RecvError::PeerClosed(p) => Error::PeerClosed(p),
        }
    }
}
