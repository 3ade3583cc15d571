//! # multirail-transport — rails
//!
//! The layer below the multirail driver. A [`Rail`] is one reliable,
//! ordered, non-blocking frame pipe to one peer: it writes frames
//! (a 48-byte header and a payload) and reads them, handing each header to
//! a [`FrameSink`] that says where the payload goes, so payloads land
//! straight in their destination buffer.
//!
//! Rails here:
//! * [`tcp::TcpRail`]: one TCP connection bound to a local address or
//!   interface (`tcp:10.0.0.1`, `tcp:eth1`), with vectored writes;
//! * [`loopback::LoopbackRail`]: an in-process pair, for tests;
//! * [`fault::FaultRail`]: wraps any rail and injects seeded faults (drop,
//!   corrupt, delay, rate limit, kill) for tests and failover demos.
//!
//! * `ofi::OfiRail` (cargo feature `ofi`): an `FI_EP_RDM` endpoint of a
//!   libfabric provider (`ofi:tcp`, `ofi:shm`, `ofi:verbs`...) per peer.
//!
//! [`shm`] holds the building blocks of a shared-memory rail between
//! processes on one host (rings in a memfd segment, a Unix-socket
//! doorbell); it is the only module with `unsafe` code.
//!
//! [`spec`] parses rail lists like `tcp:127.0.0.1,tcp:eth1`, and
//! [`handshake`] runs the authenticated HELLO exchange over a blocking
//! stream before a connection becomes a rail.

// `unsafe` is allowed only in `shm` (mmap, atomics in shared memory,
// SCM_RIGHTS) and `ofi` (the libfabric FFI); every block there carries a
// `// SAFETY:` comment.
#![deny(unsafe_code)]

pub mod fault;
pub mod handshake;
pub mod loopback;
#[cfg(feature = "ofi")]
#[allow(unsafe_code)]
pub mod ofi;
#[allow(unsafe_code)]
pub mod shm;
pub mod spec;
pub mod tcp;

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use bytes::Bytes;
use multirail_proto::core::{PayloadDest, ProtocolError};
use multirail_proto::wire::{FrameHeader, WireError};

pub use spec::RailSpec;

/// What a rail says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RailCaps {
    /// Human-readable name, e.g. `tcp:127.0.0.2`.
    pub name: String,
    /// Bytes/s, 0 = unknown (measured at run time).
    pub bandwidth: u64,
    /// One-way latency, ZERO = unknown.
    pub latency: Duration,
    /// Largest frame payload this rail carries.
    pub max_frame: u32,
}

/// Why a rail stopped working. Every variant ends the rail's connection.
#[derive(Debug, thiserror::Error)]
pub enum RailError {
    #[error("connection closed by peer")]
    Closed,
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("malformed frame: {0}")]
    Wire(#[from] WireError),
    #[error("protocol violation: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("killed by fault injection")]
    Killed,
    #[error("replaced by a new connection from the peer")]
    Replaced,
}

/// Receives frames from a rail. Implemented by the driver over the core.
pub trait FrameSink {
    /// A header arrived; return where its payload goes.
    fn on_header(&mut self, hdr: &FrameHeader) -> Result<PayloadDest, ProtocolError>;
    /// The payload of `hdr` is in `dest` (`complete`), or reading it was
    /// abandoned because the rail failed (`!complete`).
    fn on_payload(&mut self, hdr: &FrameHeader, dest: PayloadDest, complete: bool) -> Result<(), ProtocolError>;
    /// Bytes of a long payload arrived: the rail is alive.
    fn on_activity(&mut self) {}
    /// A whole frame whose payload is already in memory (a small frame in
    /// the rail's read buffer): by default `on_header`, a copy and
    /// `on_payload`; a sink can store it in one step.
    fn on_frame(&mut self, hdr: &FrameHeader, payload: &[u8]) -> Result<(), ProtocolError> {
        let mut dest = self.on_header(hdr)?;
        if let Some(dst) = dest.as_mut_slice() {
            let n = dst.len().min(payload.len());
            dst[..n].copy_from_slice(&payload[..n]);
        }
        self.on_payload(hdr, dest, true)
    }
}

/// Result of a [`Rail::flush`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flushed {
    /// Frames completely written by this call.
    pub frames: usize,
    /// Bytes written by this call.
    pub bytes: usize,
    /// The rail could not take everything (socket full): wait for writable.
    pub blocked: bool,
}

/// Result of a [`Rail::poll_recv`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Received {
    pub frames: usize,
    pub bytes: usize,
    /// Stopped because the per-call budget ran out: more may be readable.
    pub more: bool,
}

/// A reliable, ordered, non-blocking frame pipe to one peer.
///
/// Contract: frames are delivered whole and in the order they were
/// queued, or the rail fails with a [`RailError`]; after an error the rail
/// is dead and must be dropped. Nothing blocks.
pub trait Rail: Send {
    fn caps(&self) -> &RailCaps;
    /// File descriptor to wait on for readability/writability, if any.
    fn poll_fd(&self) -> Option<RawFd>;
    /// When the rail wants to be polled again even without IO readiness
    /// (delayed or rate-limited frames).
    fn deadline(&self) -> Option<Instant> {
        None
    }
    /// Queues a frame. Never blocks; call [`Rail::flush`] to write.
    fn send(&mut self, header: &FrameHeader, payload: Bytes);
    /// Bytes queued and not yet written.
    fn queued_bytes(&self) -> usize;
    /// Writes queued frames until done or the rail would block.
    fn flush(&mut self) -> Result<Flushed, RailError>;
    /// [`Rail::send`] then [`Rail::flush`]; a rail with nothing queued may
    /// write the frame without queueing it first (the latency path of a
    /// lone small message).
    fn send_now(&mut self, header: &FrameHeader, payload: Bytes) -> Result<Flushed, RailError> {
        self.send(header, payload);
        self.flush()
    }
    /// Reads available frames into `sink` without blocking.
    fn poll_recv(&mut self, sink: &mut dyn FrameSink) -> Result<Received, RailError>;
    /// After an error: gives back a payload destination that was being
    /// filled, so the sink can reclaim it; call until `None` (a rail
    /// copying several lent payloads at once has several).
    fn take_partial(&mut self) -> Option<(FrameHeader, PayloadDest)>;
    /// Closes the connection (the peer sees end-of-stream).
    fn shutdown(&mut self);
    /// Closes the connection in order, when the endpoint closes: what was
    /// written reaches the peer before it sees the end, waiting at most
    /// until `by` for that. Rails whose end travels behind their bytes
    /// (a TCP connection, a ring) just [`Rail::shutdown`].
    fn close(&mut self, by: Instant) {
        let _ = by;
        self.shutdown();
    }
    /// The rail's new bytes make no fd readable while its reader is awake
    /// (shared memory): an engine that busy-polls reads it on every round
    /// and calls [`Rail::arm`] before each sleep, instead of waiting for
    /// readiness.
    fn spin_poll(&self) -> bool {
        false
    }
    /// Called right before the engine sleeps on [`Rail::poll_fd`]: from
    /// now on the engine arms the rail before every sleep (a read that
    /// finds nothing no longer does). Returns true if something is there
    /// already: do not sleep. Only for rails that say [`Rail::spin_poll`].
    fn arm(&mut self) -> bool {
        false
    }
    /// The engine says, once, before it first reads the rail, that whoever
    /// sleeps on the rail [`arm`](Rail::arm)s it first, so a read that
    /// finds nothing need not ask the peer for a wake-up (on shared memory
    /// that request costs a system call per message on each side). Only rails that say [`Rail::spin_poll`] care. Without
    /// this call such a rail arms itself on every empty read until its
    /// first `arm`.
    fn engine_arms(&mut self) {}
    /// How many wake-ups this rail sent its peer (shared memory's doorbell
    /// writes, each a system call). A diagnostic.
    fn wakeups_sent(&self) -> u64 {
        0
    }
    /// For a rail that says [`Rail::spin_poll`]: false only if servicing
    /// it now would certainly do nothing (no byte to read, none staged,
    /// nothing queued to write, no wake-up to withdraw), so a spinning
    /// loop may look at it this cheaply instead. True when it cannot tell.
    fn input_hint(&mut self) -> bool {
        true
    }
}

impl Rail for Box<dyn Rail> {
    fn caps(&self) -> &RailCaps {
        (**self).caps()
    }
    fn poll_fd(&self) -> Option<RawFd> {
        (**self).poll_fd()
    }
    fn deadline(&self) -> Option<Instant> {
        (**self).deadline()
    }
    fn send(&mut self, header: &FrameHeader, payload: Bytes) {
        (**self).send(header, payload)
    }
    fn queued_bytes(&self) -> usize {
        (**self).queued_bytes()
    }
    fn flush(&mut self) -> Result<Flushed, RailError> {
        (**self).flush()
    }
    fn send_now(&mut self, header: &FrameHeader, payload: Bytes) -> Result<Flushed, RailError> {
        (**self).send_now(header, payload)
    }
    fn poll_recv(&mut self, sink: &mut dyn FrameSink) -> Result<Received, RailError> {
        (**self).poll_recv(sink)
    }
    fn take_partial(&mut self) -> Option<(FrameHeader, PayloadDest)> {
        (**self).take_partial()
    }
    fn shutdown(&mut self) {
        (**self).shutdown()
    }
    fn close(&mut self, by: Instant) {
        (**self).close(by)
    }
    fn spin_poll(&self) -> bool {
        (**self).spin_poll()
    }
    fn arm(&mut self) -> bool {
        (**self).arm()
    }
    fn engine_arms(&mut self) {
        (**self).engine_arms()
    }
    fn wakeups_sent(&self) -> u64 {
        (**self).wakeups_sent()
    }
    fn input_hint(&mut self) -> bool {
        (**self).input_hint()
    }
}

#[cfg(test)]
pub(crate) mod tests_util {
    use super::*;
    use multirail_proto::core::PayloadDest;
    use std::net::{TcpListener, TcpStream};

    /// Collects frames with copies of their payloads.
    #[derive(Default)]
    pub struct CollectSink {
        pub frames: Vec<(FrameHeader, Vec<u8>)>,
    }

    impl FrameSink for CollectSink {
        fn on_header(&mut self, hdr: &FrameHeader) -> Result<PayloadDest, ProtocolError> {
            Ok(PayloadDest::Scratch(vec![0; hdr.payload_len()]))
        }
        fn on_payload(&mut self, hdr: &FrameHeader, dest: PayloadDest, _complete: bool) -> Result<(), ProtocolError> {
            let PayloadDest::Scratch(v) = dest else { unreachable!("we only hand out scratch") };
            self.frames.push((*hdr, v));
            Ok(())
        }
    }

    pub fn pair_streams() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }
}
