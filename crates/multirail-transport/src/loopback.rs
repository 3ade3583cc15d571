//! An in-process rail pair: frames move through shared queues; a Unix
//! socket pair carries only wake-ups, so the rail can be polled with epoll
//! like any other.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use multirail_proto::wire::FrameHeader;

use crate::{Flushed, FrameSink, Rail, RailCaps, RailError, Received};

#[derive(Default)]
struct Queue {
    frames: VecDeque<(FrameHeader, Bytes)>,
    closed: bool,
}

/// One end of an in-process rail.
pub struct LoopbackRail {
    caps: RailCaps,
    tx: Arc<Mutex<Queue>>,
    rx: Arc<Mutex<Queue>>,
    wake: UnixStream,
    pending: VecDeque<(FrameHeader, Bytes)>,
}

/// Two connected loopback rails.
pub fn pair(name: &str) -> io::Result<(LoopbackRail, LoopbackRail)> {
    let (wa, wb) = UnixStream::pair()?;
    wa.set_nonblocking(true)?;
    wb.set_nonblocking(true)?;
    let q1 = Arc::new(Mutex::new(Queue::default()));
    let q2 = Arc::new(Mutex::new(Queue::default()));
    let caps = RailCaps { name: name.to_string(), bandwidth: 0, latency: Duration::ZERO, max_frame: 16 << 20 };
    Ok((
        LoopbackRail { caps: caps.clone(), tx: q1.clone(), rx: q2.clone(), wake: wa, pending: VecDeque::new() },
        LoopbackRail { caps, tx: q2, rx: q1, wake: wb, pending: VecDeque::new() },
    ))
}

fn lock(q: &Mutex<Queue>) -> std::sync::MutexGuard<'_, Queue> {
    // A panic elsewhere while holding the queue poisons it; the queue
    // itself is still consistent (single push/pop operations).
    q.lock().unwrap_or_else(|e| e.into_inner())
}

impl Rail for LoopbackRail {
    fn caps(&self) -> &RailCaps {
        &self.caps
    }
    fn poll_fd(&self) -> Option<RawFd> {
        Some(self.wake.as_raw_fd())
    }
    fn send(&mut self, header: &FrameHeader, payload: Bytes) {
        self.pending.push_back((*header, payload));
    }
    fn queued_bytes(&self) -> usize {
        self.pending.iter().map(|(_, p)| FrameHeader::LEN + p.len()).sum()
    }
    fn flush(&mut self) -> Result<Flushed, RailError> {
        let mut res = Flushed::default();
        if self.pending.is_empty() {
            return Ok(res);
        }
        {
            let mut q = lock(&self.tx);
            if q.closed {
                return Err(RailError::Closed);
            }
            for f in self.pending.drain(..) {
                res.frames += 1;
                res.bytes += FrameHeader::LEN + f.1.len();
                q.frames.push_back(f);
            }
        }
        match self.wake.write(&[1]) {
            Ok(_) => {}
            // The wake-up buffer is full: the peer is already woken.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
        Ok(res)
    }
    fn poll_recv(&mut self, sink: &mut dyn FrameSink) -> Result<Received, RailError> {
        let mut drain = [0u8; 256];
        while let Ok(n) = self.wake.read(&mut drain) {
            if n == 0 {
                break;
            }
        }
        let mut res = Received::default();
        loop {
            let next = {
                let mut q = lock(&self.rx);
                match q.frames.pop_front() {
                    Some(f) => f,
                    None if q.closed => return Err(RailError::Closed),
                    None => return Ok(res),
                }
            };
            let (h, payload) = next;
            let mut dest = sink.on_header(&h)?;
            if let Some(d) = dest.as_mut_slice() {
                d.copy_from_slice(&payload[..d.len()]);
            }
            sink.on_payload(&h, dest, true)?;
            res.frames += 1;
            res.bytes += FrameHeader::LEN + payload.len();
        }
    }
    fn take_partial(&mut self) -> Option<(FrameHeader, multirail_proto::core::PayloadDest)> {
        None
    }
    fn shutdown(&mut self) {
        lock(&self.tx).closed = true;
        lock(&self.rx).closed = true;
        let _ = self.wake.write(&[1]);
    }
}
