//! The Python `Endpoint`: creation, blocking and non-blocking calls.

use std::net::{TcpListener, ToSocketAddrs};
use std::sync::{Arc, Mutex};

use multirail::{Builder, Config, Endpoint};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::buffer::{self, PyBuf};
use crate::owned;
use crate::request::{IN_PLACE_FROM, Op, PyRequest, Shared};
use crate::{ANY_SOURCE, ANY_TAG, ConfigError, SetupError, ShutdownError, Status, to_py};

/// One process's endpoint of a job: `Endpoint.from_env()` under
/// `multirail run`, mpirun or srun, or `Endpoint(rails, rank, size, root)`.
#[pyclass(module = "multirail", name = "Endpoint", frozen)]
pub struct PyEndpoint {
    /// `None` once closed.
    shared: Mutex<Option<Arc<Shared>>>,
}

impl PyEndpoint {
    fn wrap(ep: Endpoint) -> PyEndpoint {
        PyEndpoint { shared: Mutex::new(Some(Arc::new(Shared::new(ep)))) }
    }

    fn get(&self) -> PyResult<Arc<Shared>> {
        let s = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        s.clone().ok_or_else(|| ShutdownError::new_err("the endpoint is closed"))
    }
}

/// `root` ("host:port") for `rank`: rank 0 listens there, the others
/// connect there.
fn with_root(b: Builder, rank: u32, root: &str) -> PyResult<Builder> {
    let addr = root
        .to_socket_addrs()
        .map_err(|e| ConfigError::new_err(format!("root {root:?} is not host:port ({e})")))?
        .next()
        .ok_or_else(|| ConfigError::new_err(format!("root {root:?} resolves to no address")))?;
    if rank != 0 {
        return Ok(b.root(addr));
    }
    let l = TcpListener::bind(addr)
        .map_err(|e| SetupError::new_err(format!("rank 0 cannot listen on root {root}: {e}")))?;
    Ok(b.root_listener(l))
}

fn dest(v: i64) -> PyResult<u32> {
    u32::try_from(v).map_err(|_| PyValueError::new_err(format!("dest {v} is not a rank (0 or more)")))
}

/// A receive's `source` or `tag`: `any` (ANY_SOURCE, ANY_TAG) matches
/// any; else a value of `T`, or a ValueError that says why not.
fn matching<T: TryFrom<i64>>(v: i64, any: i64, why_not: impl FnOnce() -> String) -> PyResult<Option<T>> {
    if v == any {
        return Ok(None);
    }
    T::try_from(v).map(Some).map_err(|_| PyValueError::new_err(why_not()))
}

fn source(v: i64) -> PyResult<Option<u32>> {
    matching(v, ANY_SOURCE, || format!("source {v} is not a rank (0 or more) nor ANY_SOURCE"))
}

fn send_tag(v: i64) -> PyResult<u64> {
    u64::try_from(v).map_err(|_| PyValueError::new_err(format!("tag {v} is negative (tags are 0 to 2**63 - 1)")))
}

fn recv_tag(v: i64) -> PyResult<Option<u64>> {
    matching(v, ANY_TAG, || format!("tag {v} is negative (tags are 0 to 2**63 - 1, or ANY_TAG)"))
}

/// Posts a receive into `buf` (in place if it is all of a
/// `multirail.Buffer`; small ones are not looked at: copying them is cheap).
fn start_recv(shared: &Arc<Shared>, buf: &Bound<'_, PyAny>, source: i64, tag: i64) -> PyResult<Op> {
    let (source, tag) = (self::source(source)?, recv_tag(tag)?);
    let pb = PyBuf::get(buf, true)?;
    let owned = if pb.len() >= IN_PLACE_FROM { owned::owned_behind(buf, pb.ptr(), pb.len()) } else { None };
    Op::recv(shared, pb, owned, source, tag).map_err(to_py)
}

/// Finishes `op` without the GIL.
fn finish(py: Python<'_>, op: Op) -> PyResult<Option<Status>> {
    let (res, leftover) = py.detach(|| op.finish());
    drop(leftover);
    buffer::release_orphans(py);
    res.map_err(to_py)
}

#[pymethods]
impl PyEndpoint {
    /// An endpoint with explicit rails (as MULTIRAIL_RAILS, e.g.
    /// "tcp:127.0.0.1,tcp:127.0.0.2"; None: the default), `rank` of
    /// `size`, and `root` ("host:port": rank 0 listens there, the others
    /// connect there; needed when size > 1). `key` authenticates the rails
    /// (every rank passes the same). Other settings come from MULTIRAIL_*.
    #[new]
    #[pyo3(signature = (rails=None, rank=0, size=1, root=None, key=None))]
    fn new(
        py: Python<'_>,
        rails: Option<&str>,
        rank: u32,
        size: u32,
        root: Option<&str>,
        key: Option<&str>,
    ) -> PyResult<PyEndpoint> {
        let mut b = Builder::new(Config::from_env().map_err(to_py)?).rank(rank, size);
        if let Some(r) = rails {
            b = b.rails(r);
        }
        if let Some(k) = key {
            b = b.key(k.as_bytes());
        }
        b = match root {
            Some(r) => with_root(b, rank, r)?,
            None if size > 1 => {
                return Err(ConfigError::new_err(format!("a job of {size} ranks needs root (\"host:port\")")));
            }
            None => b,
        };
        let ep = py.detach(|| b.build()).map_err(to_py)?;
        Ok(PyEndpoint::wrap(ep))
    }

    /// The endpoint of a process started by `multirail run`, mpirun or
    /// srun: settings from MULTIRAIL_*, rank, size and root from the
    /// launcher (as the multirail command does).
    #[staticmethod]
    fn from_env(py: Python<'_>) -> PyResult<PyEndpoint> {
        let ep = py.detach(Endpoint::from_env).map_err(to_py)?;
        Ok(PyEndpoint::wrap(ep))
    }

    #[getter]
    fn rank(&self) -> PyResult<u32> {
        Ok(self.get()?.ep.rank())
    }

    #[getter]
    fn size(&self) -> PyResult<u32> {
        Ok(self.get()?.ep.size())
    }

    /// The job's rails ("tcp:127.0.0.1", ..., "shm").
    #[getter]
    fn rail_names(&self) -> PyResult<Vec<String>> {
        Ok(self.get()?.ep.rail_names())
    }

    /// Sends `buf` (any buffer: bytes, bytearray, memoryview, numpy
    /// array...) to rank `dest`; returns once `buf` may be reused.
    #[pyo3(signature = (buf, dest, tag=0))]
    fn send(&self, py: Python<'_>, buf: &Bound<'_, PyAny>, dest: i64, tag: i64) -> PyResult<()> {
        let op = Op::send(&self.get()?, PyBuf::get(buf, false)?, self::dest(dest)?, send_tag(tag)?).map_err(to_py)?;
        finish(py, op).map(|_| ())
    }

    /// Receives a message into the writable `buf`; returns its Status.
    #[pyo3(signature = (buf, source=ANY_SOURCE, tag=ANY_TAG))]
    fn recv(&self, py: Python<'_>, buf: &Bound<'_, PyAny>, source: i64, tag: i64) -> PyResult<Status> {
        let op = start_recv(&self.get()?, buf, source, tag)?;
        Ok(finish(py, op)?.expect("a receive has a status"))
    }

    /// Starts sending `buf`; don't change it until the request is waited
    /// for.
    #[pyo3(signature = (buf, dest, tag=0))]
    fn isend(&self, buf: &Bound<'_, PyAny>, dest: i64, tag: i64) -> PyResult<PyRequest> {
        let op = Op::send(&self.get()?, PyBuf::get(buf, false)?, self::dest(dest)?, send_tag(tag)?).map_err(to_py)?;
        Ok(PyRequest::new(op, true))
    }

    /// Posts a receive into the writable `buf`; don't touch it until the
    /// request is waited for.
    #[pyo3(signature = (buf, source=ANY_SOURCE, tag=ANY_TAG))]
    fn irecv(&self, buf: &Bound<'_, PyAny>, source: i64, tag: i64) -> PyResult<PyRequest> {
        let op = start_recv(&self.get()?, buf, source, tag)?;
        Ok(PyRequest::new(op, false))
    }

    /// Waits for every request (in order) and returns their results (None
    /// for a send, a Status for a receive); raises the first failure once
    /// all were waited for.
    #[staticmethod]
    fn wait_all(py: Python<'_>, requests: Vec<Bound<'_, PyRequest>>) -> PyResult<Vec<Option<Status>>> {
        let mut out = Vec::with_capacity(requests.len());
        let mut first = None;
        for r in &requests {
            match r.get().wait_py(py) {
                Ok(st) => out.push(st),
                Err(e) => {
                    first.get_or_insert(e);
                    out.push(None);
                }
            }
        }
        first.map_or(Ok(out), Err)
    }

    /// Returns once every rank has called barrier().
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        let s = self.get()?;
        py.detach(|| s.ep.barrier()).map_err(to_py)
    }

    /// Waits until everything sent was delivered and closes the rails.
    /// Refused while requests are still pending. Closing twice is fine.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let mut slot = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        let Some(s) = slot.take() else { return Ok(()) };
        match Arc::try_unwrap(s) {
            Ok(s) => {
                drop(slot);
                py.detach(|| s.ep.close()).map_err(to_py)
            }
            Err(s) => {
                let open = Arc::strong_count(&s) - 1;
                *slot = Some(s);
                Err(crate::Error::new_err(format!("{open} requests are still pending: wait for them before closing")))
            }
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.close(py)
    }

    fn __repr__(&self) -> String {
        match self.get() {
            Ok(s) => format!("<multirail.Endpoint rank {} of {}>", s.ep.rank(), s.ep.size()),
            Err(_) => "<multirail.Endpoint closed>".into(),
        }
    }
}
