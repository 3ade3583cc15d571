//! The two halves of OSU's bandwidth window: a sender that isends
//! `window` messages and waits for them all, and a receiver that irecvs
//! `window` messages into its own buffers and waits for them all. bw and
//! mbw_mr add the receiver's short reply; bibw runs both halves at once.

use bytes::{Bytes, BytesMut};
use multirail::{Endpoint, RecvRequest, SendRequest};

use super::payload::{self, Payloads};
use super::{SizePlan, tag};
use crate::error::{BenchError, ValidationError};

/// OSU's reply after each window is 4 bytes (`MPI_Recv(r_buf, 4, ...)`).
const REPLY_LEN: usize = 4;

pub(crate) struct WindowSender<'e> {
    ep: &'e Endpoint,
    peer: u32,
    tag: u64,
    payloads: Payloads,
    reqs: Vec<SendRequest<'e>>,
    reply: BytesMut,
}

impl<'e> WindowSender<'e> {
    /// Sends to `peer` with `tag`; `direction` keys the validation pattern.
    pub fn new(ep: &'e Endpoint, peer: u32, tag: u64, plan: &SizePlan, direction: u32) -> Self {
        let payloads = Payloads::new(plan.size, plan.len, plan.window, plan.validate, direction);
        let reqs = Vec::with_capacity(plan.window);
        WindowSender { ep, peer, tag, payloads, reqs, reply: BytesMut::zeroed(REPLY_LEN) }
    }

    /// Prepares the payloads of `iteration` (before the clock starts).
    pub fn prepare(&mut self, iteration: u64) {
        self.payloads.prepare(iteration);
    }

    /// Starts sending the prepared window.
    pub fn post(&mut self) -> Result<(), BenchError> {
        for p in self.payloads.slots() {
            self.reqs.push(self.ep.isend(self.peer, self.tag, p.clone())?);
        }
        Ok(())
    }

    /// Waits until every message of the window is sent.
    pub fn complete(&mut self) -> Result<(), BenchError> {
        for r in self.reqs.drain(..) {
            r.wait()?;
        }
        Ok(())
    }

    /// Waits for the receiver's reply to the window.
    pub fn await_reply(&mut self) -> Result<(), BenchError> {
        let buf = std::mem::take(&mut self.reply);
        let (buf, _) = self.ep.irecv(Some(self.peer), Some(tag::REPLY), buf)?.wait()?;
        self.reply = buf;
        Ok(())
    }
}

pub(crate) struct WindowReceiver<'e> {
    ep: &'e Endpoint,
    peer: u32,
    tag: u64,
    size: u64,
    direction: u32,
    bufs: Vec<BytesMut>,
    lens: Vec<u64>,
    reqs: Vec<RecvRequest<'e>>,
    reply: Bytes,
}

impl<'e> WindowReceiver<'e> {
    /// Receives from `peer` with `tag`; `direction` is the sender's.
    pub fn new(ep: &'e Endpoint, peer: u32, tag: u64, plan: &SizePlan, direction: u32) -> Self {
        WindowReceiver {
            ep,
            peer,
            tag,
            size: plan.size,
            direction,
            bufs: (0..plan.window).map(|_| BytesMut::zeroed(plan.len)).collect(),
            lens: Vec::with_capacity(plan.window),
            reqs: Vec::with_capacity(plan.window),
            reply: Bytes::from(vec![0u8; REPLY_LEN]),
        }
    }

    /// Posts a receive for every message of the window.
    pub fn post(&mut self) -> Result<(), BenchError> {
        for b in self.bufs.drain(..) {
            self.reqs.push(self.ep.irecv(Some(self.peer), Some(self.tag), b)?);
        }
        Ok(())
    }

    /// Waits for the whole window; buffers come back in message order.
    pub fn complete(&mut self) -> Result<(), BenchError> {
        self.lens.clear();
        for r in self.reqs.drain(..) {
            let (b, st) = r.wait()?;
            self.bufs.push(b);
            self.lens.push(st.len);
        }
        Ok(())
    }

    /// Sends the short reply that ends a bw window.
    pub fn reply(&mut self) -> Result<(), BenchError> {
        Ok(self.ep.isend(self.peer, tag::REPLY, self.reply.clone())?.wait()?)
    }

    /// Checks every message of the last window against `iteration`'s pattern.
    pub fn check(&self, iteration: u64) -> Option<ValidationError> {
        let bad = self.bufs.iter().zip(&self.lens).enumerate().find_map(|(j, (b, &len))| {
            payload::check(b, len, self.size, iteration, j, self.direction).map(|off| (j, off))
        });
        bad.map(|(j, offset)| ValidationError {
            size: self.size,
            offset,
            iteration,
            message: u32::try_from(j).unwrap_or(u32::MAX),
            rank: self.ep.rank(),
        })
    }
}
