//! State shared by the application threads and the progress engine: the
//! protocol core behind one mutex, the rail connections (one mutex each),
//! completed requests, and the glue that feeds frames between them.
//!
//! Lock order: a rail connection first, then the core. Never the reverse.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use multirail_proto::core::{
    Core, Event, PayloadDest, PeerFailure, PeerId, ProtocolError, RailId, RecvError, ReqId, SendError, Status,
};
use multirail_proto::time::Time;
use multirail_proto::wire::FrameHeader;
use multirail_transport::{FrameSink, Rail, RailError};

/// Bytes pulled from the core into a rail's own queue ahead of the socket.
const FILL_TARGET: usize = 1 << 20;

/// A finished request.
#[derive(Debug)]
pub enum Completion {
    Send(Result<(), SendError>),
    Recv(Result<Status, RecvError>, BytesMut),
}

/// Something that can wake whoever drives a rail.
pub trait Wake: Send + Sync {
    fn wake(&self);
}

/// One (peer, rail) connection.
pub struct Slot {
    pub peer: PeerId,
    pub rail: RailId,
    pub name: String,
    pub conn: Mutex<Option<Box<dyn Rail>>>,
    /// The core asked for this connection to be closed.
    pub close_requested: AtomicBool,
    /// Someone queued output for this rail since it was last serviced.
    pub wake_pending: AtomicBool,
    pub waker: Mutex<Option<Arc<dyn Wake>>>,
}

impl Slot {
    pub fn lock_conn(&self) -> MutexGuard<'_, Option<Box<dyn Rail>>> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub struct Inner {
    pub core: Core,
    pub done: HashMap<ReqId, Completion>,
    /// Why rails failed, newest last (for diagnostics).
    pub rail_errors: Vec<(PeerId, RailId, String)>,
    pub failures: Vec<PeerFailure>,
}

pub struct Shared {
    pub inner: Mutex<Inner>,
    /// Signalled whenever requests complete.
    pub done_cv: Condvar,
    pub origin: Instant,
    pub slots: Vec<Arc<Slot>>,
    pub slot_index: HashMap<(PeerId, RailId), usize>,
    pub shutdown: AtomicBool,
}

/// What servicing a slot found.
#[derive(Debug, Clone, Copy, Default)]
pub struct Serviced {
    /// Output is queued in the rail: wait for writability.
    pub want_write: bool,
    /// The read budget ran out: service again without waiting.
    pub more: bool,
    pub deadline: Option<Instant>,
}

impl Shared {
    pub fn new(core: Core, slots: Vec<Arc<Slot>>) -> Shared {
        let slot_index = slots.iter().enumerate().map(|(i, s)| ((s.peer, s.rail), i)).collect();
        Shared {
            inner: Mutex::new(Inner { core, done: HashMap::new(), rail_errors: Vec::new(), failures: Vec::new() }),
            done_cv: Condvar::new(),
            origin: Instant::now(),
            slots,
            slot_index,
            shutdown: AtomicBool::new(false),
        }
    }

    pub fn now(&self) -> Time {
        Time::from_nanos(self.origin.elapsed().as_nanos() as u64)
    }

    pub fn instant(&self, t: Time) -> Instant {
        self.origin + Duration::from_nanos(t.as_nanos())
    }

    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the core, then hands out what it produced: completed
    /// requests (waking waiters), rails with new output (waking their
    /// drivers), rails the core gave up on (closing them).
    pub fn with_core<R>(&self, f: impl FnOnce(&mut Core, Time) -> R) -> R {
        let (r, wake) = self.with_core_deferred(f);
        for i in wake {
            self.wake_slot(i);
        }
        r
    }

    /// Like [`Shared::with_core`], but returns the slots with new output
    /// instead of waking their drivers, so the caller can first try to
    /// write them itself.
    pub fn with_core_deferred<R>(&self, f: impl FnOnce(&mut Core, Time) -> R) -> (R, Vec<usize>) {
        let mut g = self.lock();
        let now = self.now();
        let r = f(&mut g.core, now);
        let mut completed = false;
        let mut close = Vec::new();
        while let Some(e) = g.core.poll_event() {
            match e {
                Event::SendDone { req, result } => {
                    g.done.insert(req, Completion::Send(result));
                    completed = true;
                }
                Event::RecvDone { req, result, buf } => {
                    g.done.insert(req, Completion::Recv(result, buf));
                    completed = true;
                }
                Event::RailDown { peer, rail, reason } => {
                    tracing::warn!(peer, rail, "rail down: {reason}");
                    g.rail_errors.push((peer, rail, reason));
                    close.push((peer, rail));
                }
                Event::PeerFailed { failure } => {
                    tracing::error!("{failure}");
                    g.failures.push(failure);
                    completed = true;
                }
                Event::PeerClosed { peer } => tracing::debug!(peer, "peer closed"),
            }
        }
        let wake = g.core.take_wakeups();
        drop(g);
        for (peer, rail) in close {
            if let Some(&i) = self.slot_index.get(&(peer, rail)) {
                self.slots[i].close_requested.store(true, Ordering::Release);
                self.wake_slot(i);
            }
        }
        let wake: Vec<usize> = wake.iter().filter_map(|k| self.slot_index.get(k).copied()).collect();
        if completed {
            self.done_cv.notify_all();
        }
        (r, wake)
    }

    /// Writes the given slots' output from this thread where the rail is
    /// free; wakes the engine for the rest.
    pub fn send_now_or_wake(&self, slots: Vec<usize>) {
        for i in slots {
            if !self.try_send_now(i) {
                self.wake_slot(i);
            }
        }
    }

    pub fn wake_slot(&self, i: usize) {
        let s = &self.slots[i];
        s.wake_pending.store(true, Ordering::Release);
        let w = s.waker.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(w) = w {
            w.wake();
        }
    }

    /// Runs due timers; returns when the core next needs them.
    pub fn run_timers(&self) -> Option<Instant> {
        let next = self.with_core(|c, now| {
            if c.poll_timeout().is_some_and(|t| t <= now) {
                c.handle_timeout(now);
            }
            c.poll_timeout()
        });
        next.map(|t| self.instant(t))
    }

    /// Reads from and writes to slot `i` as far as possible without blocking.
    pub fn service(&self, i: usize) -> Serviced {
        let s = &self.slots[i];
        s.wake_pending.store(false, Ordering::Release);
        let mut conn = s.lock_conn();
        if s.close_requested.swap(false, Ordering::AcqRel) {
            if let Some(rail) = conn.take() {
                self.retire(s, rail);
            }
        }
        let Some(rail) = conn.as_mut() else { return Serviced::default() };
        let mut sink = CoreSink { shared: self, peer: s.peer, rail: s.rail };
        let more = match rail.poll_recv(&mut sink) {
            Ok(r) => r.more,
            Err(e) => {
                self.fail(i, &mut conn, e);
                return Serviced::default();
            }
        };
        if let Err(e) = self.pump_send(s, rail.as_mut()) {
            self.fail(i, &mut conn, e);
            return Serviced::default();
        }
        let rail = conn.as_ref().expect("still connected");
        Serviced { want_write: rail.queued_bytes() > 0, more, deadline: rail.deadline() }
    }

    /// Sends what the core has for this rail, if the connection is free
    /// (the application's fast path). Returns false if it was busy.
    pub fn try_send_now(&self, i: usize) -> bool {
        let s = &self.slots[i];
        let Ok(mut conn) = s.conn.try_lock() else { return false };
        let Some(rail) = conn.as_mut() else { return true };
        match self.pump_send(s, rail.as_mut()) {
            Ok(()) => rail.queued_bytes() == 0,
            Err(e) => {
                self.fail(i, &mut conn, e);
                true
            }
        }
    }

    /// Moves frames from the core into the rail and writes them.
    fn pump_send(&self, s: &Slot, rail: &mut dyn Rail) -> Result<(), RailError> {
        loop {
            if rail.queued_bytes() < FILL_TARGET {
                self.with_core(|c, now| {
                    while rail.queued_bytes() < FILL_TARGET {
                        let Some(t) = c.poll_transmit(s.peer, s.rail, now) else { break };
                        tracing::trace!(peer = s.peer, rail = s.rail, op = ?t.header.op, seq = t.header.seq, off = t.header.offset, len = t.header.frag_len, "tx");
                        rail.send(&t.header, t.payload);
                    }
                });
            }
            if rail.queued_bytes() == 0 {
                return Ok(());
            }
            let f = rail.flush()?;
            if f.frames > 0 {
                self.with_core(|c, now| c.on_sent(s.peer, s.rail, f.frames, now));
            }
            if f.blocked || f.bytes == 0 {
                return Ok(());
            }
        }
    }

    /// Closes a connection the core already gave up on. A payload being
    /// read into a leased piece of a receive buffer goes back to the core
    /// first: a lease that never returns would keep that range of the
    /// message "being read" forever, and every re-sent copy of it would be
    /// dropped (the job would wedge).
    fn retire(&self, s: &Slot, mut rail: Box<dyn Rail>) {
        if let Some((h, d)) = rail.take_partial() {
            self.with_core(|c, now| {
                let _ = c.on_payload(s.peer, s.rail, &h, d, false, now);
            });
        }
        rail.shutdown();
    }

    /// Takes a failed rail out: the core hears of it, the socket closes.
    fn fail(&self, i: usize, conn: &mut Option<Box<dyn Rail>>, err: RailError) {
        let s = &self.slots[i];
        let Some(mut rail) = conn.take() else { return };
        let partial = rail.take_partial();
        rail.shutdown();
        let reason = err.to_string();
        if self.peer_wanted(s.peer) {
            tracing::warn!(peer = s.peer, rail = s.rail, name = %s.name, "rail failed: {reason}");
        } else {
            tracing::debug!(peer = s.peer, rail = s.rail, "rail closed: {reason}");
        }
        self.with_core(|c, now| {
            if let Some((h, d)) = partial {
                let _ = c.on_payload(s.peer, s.rail, &h, d, false, now);
            }
            c.rail_down(s.peer, s.rail, &reason, now);
        });
    }

    /// Installs a (re)connected rail and tells the core it is up. A
    /// connection it replaces is taken down first (its fragments move to
    /// the other rails before this one rejoins).
    pub fn install(&self, i: usize, rail: Box<dyn Rail>, caps: multirail_proto::core::RailCaps, credits: u64) {
        let s = &self.slots[i];
        let mut conn = s.lock_conn();
        if conn.is_some() {
            self.fail(i, &mut conn, RailError::Replaced);
        }
        s.close_requested.store(false, Ordering::Release);
        *conn = Some(rail);
        self.with_core(|c, now| c.rail_up(s.peer, s.rail, caps, credits, now));
        drop(conn);
        self.wake_slot(i);
    }

    /// True if the core still wants rails to `peer` (it has not failed or
    /// closed).
    pub fn peer_wanted(&self, peer: PeerId) -> bool {
        self.lock().core.peer_alive(peer)
    }

    /// Takes the completion of `req` if it is there.
    pub fn take_done(&self, req: ReqId) -> Option<Completion> {
        self.lock().done.remove(&req)
    }
}

/// Feeds frames from one rail into the core.
struct CoreSink<'a> {
    shared: &'a Shared,
    peer: PeerId,
    rail: RailId,
}

impl FrameSink for CoreSink<'_> {
    fn on_header(&mut self, hdr: &FrameHeader) -> Result<PayloadDest, ProtocolError> {
        tracing::trace!(peer = self.peer, rail = self.rail, op = ?hdr.op, seq = hdr.seq, off = hdr.offset, len = hdr.frag_len, "rx");
        self.shared.with_core(|c, now| c.on_header(self.peer, self.rail, hdr, now))
    }
    fn on_payload(&mut self, hdr: &FrameHeader, dest: PayloadDest, complete: bool) -> Result<(), ProtocolError> {
        self.shared.with_core(|c, now| c.on_payload(self.peer, self.rail, hdr, dest, complete, now))
    }
    fn on_activity(&mut self) {
        self.shared.with_core(|c, now| c.rail_activity(self.peer, self.rail, now))
    }
}
