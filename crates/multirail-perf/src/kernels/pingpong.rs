//! The two halves of OSU's ping-pong (osu_latency, osu_multi_lat): the
//! pinger sends then receives and times each round trip
//! (`t_start`/`t_end` around `MPI_Send` + `MPI_Recv`, summed, as OMB 7.x);
//! the ponger receives then sends.

use std::time::Instant;

use bytes::BytesMut;
use multirail::Endpoint;

use super::payload::{self, Payloads};
use super::{SizePlan, tag};
use crate::error::{BenchError, ValidationError};

/// Pattern directions: ping from the pinger, pong from the ponger.
const PING: u32 = 0;
const PONG: u32 = 1;

pub(crate) struct Pinger<'e> {
    ep: &'e Endpoint,
    peer: u32,
    size: u64,
    validate: bool,
    payload: Payloads,
    buf: BytesMut,
    /// Timed round trips in nanoseconds.
    pub samples: Vec<u64>,
}

impl<'e> Pinger<'e> {
    pub fn new(ep: &'e Endpoint, peer: u32, plan: &SizePlan) -> Self {
        Pinger {
            ep,
            peer,
            size: plan.size,
            validate: plan.validate,
            payload: Payloads::new(plan.size, plan.len, 1, plan.validate, PING),
            buf: BytesMut::zeroed(plan.len),
            samples: Vec::with_capacity(plan.sample_capacity()),
        }
    }

    /// One round trip; its time is kept when `timed`.
    pub fn round(&mut self, iteration: u64, timed: bool) -> Result<Option<ValidationError>, BenchError> {
        self.payload.prepare(iteration);
        let ping = self.payload.slots()[0].clone();
        let buf = std::mem::take(&mut self.buf);
        let t0 = Instant::now();
        self.ep.isend(self.peer, tag::PING, ping)?.wait()?;
        let (buf, st) = self.ep.irecv(Some(self.peer), Some(tag::PONG), buf)?.wait()?;
        let rtt = t0.elapsed();
        self.buf = buf;
        if timed {
            // A round trip under 584 years fits in u64 nanoseconds.
            self.samples.push(u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX));
        }
        Ok(self.validate.then(|| check(self.ep, &self.buf, st.len, self.size, iteration, PONG)).flatten())
    }
}

pub(crate) struct Ponger<'e> {
    ep: &'e Endpoint,
    peer: u32,
    size: u64,
    validate: bool,
    payload: Payloads,
    buf: BytesMut,
}

impl<'e> Ponger<'e> {
    pub fn new(ep: &'e Endpoint, peer: u32, plan: &SizePlan) -> Self {
        Ponger {
            ep,
            peer,
            size: plan.size,
            validate: plan.validate,
            payload: Payloads::new(plan.size, plan.len, 1, plan.validate, PONG),
            buf: BytesMut::zeroed(plan.len),
        }
    }

    /// Answers one ping.
    pub fn round(&mut self, iteration: u64) -> Result<Option<ValidationError>, BenchError> {
        self.payload.prepare(iteration);
        let pong = self.payload.slots()[0].clone();
        let buf = std::mem::take(&mut self.buf);
        let (buf, st) = self.ep.irecv(Some(self.peer), Some(tag::PING), buf)?.wait()?;
        self.ep.isend(self.peer, tag::PONG, pong)?.wait()?;
        self.buf = buf;
        Ok(self.validate.then(|| check(self.ep, &self.buf, st.len, self.size, iteration, PING)).flatten())
    }
}

fn check(ep: &Endpoint, buf: &[u8], len: u64, size: u64, iteration: u64, direction: u32) -> Option<ValidationError> {
    payload::check(buf, len, size, iteration, 0, direction).map(|offset| ValidationError {
        size,
        offset,
        iteration,
        message: 0,
        rank: ep.rank(),
    })
}
