//! The Python module `multirail` (built with maturin: `pip install
//! ./crates/multirail-py`): an [`Endpoint`](endpoint::PyEndpoint) that
//! sends and receives any buffer-protocol object, requests to test and
//! wait on, and a `multirail.Error` exception hierarchy carrying the Rust
//! messages. The GIL is released whenever a call waits. See
//! docs/python.md; `multirail.pyi` holds the type stubs.

mod buffer;
mod endpoint;
mod owned;
mod request;

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::{PyErr, create_exception};

create_exception!(multirail, Error, PyException, "Any failure of multirail (the message says what and why).");
create_exception!(multirail, ConfigError, Error, "A setting or argument is invalid (the message names it).");
create_exception!(multirail, SetupError, Error, "The ranks could not meet or a rail could not be connected.");
create_exception!(multirail, PeerFailedError, Error, "Every rail to the peer is down.");
create_exception!(multirail, PeerClosedError, Error, "The peer closed its endpoint.");
create_exception!(
    multirail,
    TruncatedError,
    Error,
    "The message was longer than the buffer; nothing was written to the buffer. `source`, `tag`, `length` \
     (the message's full length) and `buffer_len` say what came."
);
create_exception!(multirail, NoSuchPeerError, Error, "No such rank (or this rank itself).");
create_exception!(multirail, ShutdownError, Error, "The endpoint is closed.");

/// Matches a message from any source (`source` of a receive).
pub const ANY_SOURCE: i64 = -1;
/// Matches a message with any tag (`tag` of a receive).
pub const ANY_TAG: i64 = -1;

/// A Rust error as the matching Python exception, with its message.
pub(crate) fn to_py(e: multirail::Error) -> PyErr {
    use multirail::Error as E;
    let msg = e.to_string();
    match e {
        E::Config(_) => ConfigError::new_err(msg),
        E::Setup(_) => SetupError::new_err(msg),
        E::PeerFailed(_) => PeerFailedError::new_err(msg),
        E::PeerClosed(_) => PeerClosedError::new_err(msg),
        E::NoSuchPeer(_) => NoSuchPeerError::new_err(msg),
        E::Shutdown => ShutdownError::new_err(msg),
        E::Truncated { status, buf_len } => Python::attach(|py| {
            let err = TruncatedError::new_err(msg);
            let v = err.value(py);
            let set = || -> PyResult<()> {
                v.setattr("source", status.peer)?;
                v.setattr("tag", status.tag)?;
                v.setattr("length", status.len)?;
                v.setattr("buffer_len", buf_len)
            };
            set().map_or_else(|e| e, |()| err)
        }),
        E::Timeout | E::Io(_) => Error::new_err(msg),
    }
}

/// Who sent a received message, its tag and its full length in bytes.
#[pyclass(module = "multirail", frozen, get_all)]
#[derive(Clone, Copy)]
pub struct Status {
    /// The sender's rank.
    pub source: u32,
    pub tag: u64,
    /// The message's length in bytes (the bytes received).
    pub len: u64,
}

#[pymethods]
impl Status {
    fn __repr__(&self) -> String {
        format!("Status(source={}, tag={}, len={})", self.source, self.tag, self.len)
    }
}

impl From<multirail::Status> for Status {
    fn from(s: multirail::Status) -> Status {
        Status { source: s.peer, tag: s.tag, len: s.len }
    }
}

#[pymodule]
#[pyo3(name = "multirail")]
fn multirail_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("ANY_SOURCE", ANY_SOURCE)?;
    m.add("ANY_TAG", ANY_TAG)?;
    m.add("Error", py.get_type::<Error>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("SetupError", py.get_type::<SetupError>())?;
    m.add("PeerFailedError", py.get_type::<PeerFailedError>())?;
    m.add("PeerClosedError", py.get_type::<PeerClosedError>())?;
    m.add("TruncatedError", py.get_type::<TruncatedError>())?;
    m.add("NoSuchPeerError", py.get_type::<NoSuchPeerError>())?;
    m.add("ShutdownError", py.get_type::<ShutdownError>())?;
    m.add_class::<Status>()?;
    m.add_class::<endpoint::PyEndpoint>()?;
    m.add_class::<request::PyRequest>()?;
    m.add_class::<owned::PyOwnedBuffer>()?;
    Ok(())
}
