//! State shared by the application threads and the progress engine: the
//! protocol core behind one mutex, the rail connections (one mutex each),
//! completed requests, and the glue that feeds frames between them.
//!
//! Lock order: a rail connection first, then the core. Never the reverse.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use multirail_proto::core::{
    Core, Event, PayloadDest, PeerFailure, PeerId, ProtocolError, RailId, RecvError, ReqId, SendError, Status,
};
use multirail_proto::time::Time;
use multirail_proto::wire::FrameHeader;
use multirail_transport::{FrameSink, Rail, RailError};

use crate::connections::{ConnId, ConnectQueue};

/// Slots with new output (rarely more than a few: no allocation).
pub type Slots = smallvec::SmallVec<[usize; 4]>;

/// Bytes pulled from the core into a rail's own queue ahead of the socket.
const FILL_TARGET: usize = 1 << 20;
/// Queued output up to this size is written with the core locked.
const INLINE_WRITE: usize = 64 << 10;

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
    /// Which connection `conn` is (taken with `conn` held, never alone
    /// before it).
    pub id: Mutex<Option<ConnId>>,
    /// Highest connection generation seen for this rail.
    pub max_gen: AtomicU32,
}

impl Slot {
    pub fn new(peer: PeerId, rail: RailId, name: String) -> Slot {
        Slot {
            peer,
            rail,
            name,
            conn: Mutex::new(None),
            close_requested: AtomicBool::new(false),
            wake_pending: AtomicBool::new(false),
            waker: Mutex::new(None),
            id: Mutex::new(None),
            max_gen: AtomicU32::new(0),
        }
    }

    pub fn lock_conn(&self) -> MutexGuard<'_, Option<Box<dyn Rail>>> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn lock_id(&self) -> MutexGuard<'_, Option<ConnId>> {
        self.id.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Hashes request ids (a counter) by multiplication: the completion map is
/// touched for every message, and SipHash costs more than the rest of it.
#[derive(Default)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Most rail events kept for diagnostics (older ones are counted).
const MAX_RAIL_EVENTS: usize = 256;

/// A connection replaced by a newer one stays open (unused) this long
/// before it is closed: the peer switches to the new connection too, and
/// by then the old one's end of stream is no news to it (closed at once,
/// the peer could take it for a failure of the rail it still uses).
const PARK: Duration = Duration::from_secs(2);

pub struct Inner {
    pub core: Core,
    pub done: HashMap<ReqId, Completion, BuildHasherDefault<IdHasher>>,
    /// The request one thread waits for ([`Shared::take_or_await`]; at most
    /// one at a time; others wait on `done`), and its completion once it
    /// came: a wait for the next message (a ping-pong's every one) takes
    /// it here, not through the map.
    awaited: Option<ReqId>,
    awaited_done: Option<Completion>,
    /// What happened to rails (failures, suspicions), oldest first, at
    /// most [`MAX_RAIL_EVENTS`] (for diagnostics).
    pub rail_errors: Vec<(PeerId, RailId, String)>,
    /// Rail events not kept in `rail_errors`.
    pub rail_errors_dropped: u64,
    pub failures: Vec<PeerFailure>,
}

pub struct Shared {
    pub inner: Mutex<Inner>,
    /// Signalled whenever requests complete, if someone waits on it
    /// (`done_waiters`; a notification costs a system call).
    pub done_cv: Condvar,
    pub done_waiters: AtomicUsize,
    pub origin: Instant,
    pub slots: Vec<Arc<Slot>>,
    /// This endpoint's rank and rail count: slot `(peer, rail)` is at
    /// `peer' * rails + rail`, peer' counting the other ranks in order.
    rank: PeerId,
    rails: usize,
    pub shutdown: AtomicBool,
    /// Bumped whenever a connection is installed (an engine that keeps a
    /// second registration of every connection knows to look again).
    pub conn_epoch: AtomicU64,
    /// Times an IO thread of the threaded engine returned from epoll
    /// (diagnostics: see `Endpoint::io_thread_wakeups`).
    pub io_wakeups: AtomicU64,
    /// Times the polled loop slept until its timeout with nothing ready
    /// (diagnostics: see `Endpoint::sleeps_timed_out`).
    pub sleep_timeouts: AtomicU64,
    /// Times a spinning waiter gave its CPU away (diagnostics: see
    /// `Endpoint::spin_yields`).
    pub spin_yields: AtomicU64,
    /// Spinning rounds skipped because nothing could be there
    /// (diagnostics: see `Endpoint::quiet_rounds`).
    pub quiet_rounds: AtomicU64,
    /// Where this host's peers last ran ([`crate::cpus::PeerCpus`]).
    pub peer_cpus: crate::cpus::PeerCpus,
    /// Waits that yielded from their first round because the peer they
    /// waited for last ran on the waiter's CPU (diagnostics: see
    /// `Endpoint::peer_here_waits`).
    pub peer_here_waits: AtomicU64,
    /// `isend`s since the last wait, and when the last one was made
    /// (nanoseconds since `origin`): write coalescing (`Config::coalesce`).
    pub burst: AtomicU64,
    pub last_isend: AtomicU64,
    /// Some slot's output was deferred and may not be written yet.
    pub deferred_any: AtomicBool,
    /// Flushes of a rail that wrote something (diagnostics: see
    /// `Endpoint::rail_writes`).
    pub writes: AtomicU64,
    /// Connections the core asked for, for the connector thread.
    pub connect_q: ConnectQueue,
    /// Handshakes of incoming connections under way on their own threads
    /// ([`Shared::wait_handshakes`]).
    pub handshakes: Arc<AtomicUsize>,
    /// Replaced connections waiting to be closed (see [`PARK`]).
    parked: Mutex<Vec<(Instant, Box<dyn Rail>)>>,
    /// Slots woken (`wake_pending` set) since their loop last looked, by
    /// rail: a loop visits these instead of every slot of a large job.
    woken: Vec<Mutex<Vec<usize>>>,
    woken_any: Vec<AtomicBool>,
}

/// What servicing a slot found.
#[derive(Debug, Clone, Copy, Default)]
pub struct Serviced {
    /// Output is queued in the rail: wait for writability.
    pub want_write: bool,
    /// The read budget ran out: service again without waiting.
    pub more: bool,
    /// Frames arrived: a waiter's condition may hold now.
    pub received: bool,
    pub deadline: Option<Instant>,
    /// The connection's file descriptor (none: not connected).
    pub fd: Option<std::os::fd::RawFd>,
    /// The rail wants reading on every round of a spinning loop and arming
    /// before a sleep ([`multirail_transport::Rail::spin_poll`]).
    pub spin: bool,
}

impl Shared {
    /// `slots`: one per (peer, rail), peers in rank order (without
    /// `rank`, ours), rails in index order.
    pub fn new(core: Core, slots: Vec<Arc<Slot>>, rank: PeerId) -> Shared {
        let rails = slots.iter().map(|s| s.rail + 1).max().unwrap_or(1);
        let ranks = slots.len() / rails + 1;
        debug_assert!(slots.iter().enumerate().all(|(i, s)| {
            let p = s.peer - (s.peer > rank) as PeerId;
            i == p as usize * rails + s.rail
        }));
        Shared {
            inner: Mutex::new(Inner {
                core,
                done: HashMap::default(),
                awaited: None,
                awaited_done: None,
                rail_errors: Vec::new(),
                rail_errors_dropped: 0,
                failures: Vec::new(),
            }),
            done_cv: Condvar::new(),
            done_waiters: AtomicUsize::new(0),
            origin: Instant::now(),
            slots,
            rank,
            rails,
            shutdown: AtomicBool::new(false),
            conn_epoch: AtomicU64::new(0),
            io_wakeups: AtomicU64::new(0),
            sleep_timeouts: AtomicU64::new(0),
            spin_yields: AtomicU64::new(0),
            quiet_rounds: AtomicU64::new(0),
            peer_cpus: crate::cpus::PeerCpus::new(ranks),
            peer_here_waits: AtomicU64::new(0),
            burst: AtomicU64::new(0),
            last_isend: AtomicU64::new(0),
            deferred_any: AtomicBool::new(false),
            writes: AtomicU64::new(0),
            connect_q: ConnectQueue::default(),
            handshakes: Arc::new(AtomicUsize::new(0)),
            parked: Mutex::new(Vec::new()),
            woken: (0..rails).map(|_| Mutex::new(Vec::new())).collect(),
            woken_any: (0..rails).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// The slot of rail `rail` to `peer`, if there is one.
    pub fn slot_of(&self, peer: PeerId, rail: RailId) -> Option<usize> {
        if peer == self.rank || rail >= self.rails {
            return None;
        }
        let i = (peer - (peer > self.rank) as PeerId) as usize * self.rails + rail;
        (i < self.slots.len()).then_some(i)
    }

    /// This endpoint's rank.
    pub fn rank(&self) -> PeerId {
        self.rank
    }

    pub fn now(&self) -> Time {
        self.time_of(Instant::now())
    }

    pub fn instant(&self, t: Time) -> Instant {
        self.origin + Duration::from_nanos(t.as_nanos())
    }

    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sleeps on `done_cv` for at most `t` (call with the lock held, after
    /// checking under it that what you wait for has not happened).
    pub fn wait_done<'a>(&'a self, g: MutexGuard<'a, Inner>, t: Duration) -> MutexGuard<'a, Inner> {
        self.done_waiters.fetch_add(1, Ordering::AcqRel);
        let g = self.done_cv.wait_timeout(g, t).unwrap_or_else(|e| e.into_inner()).0;
        self.done_waiters.fetch_sub(1, Ordering::AcqRel);
        g
    }

    /// Runs `f` on the core, then hands out what it produced: completed
    /// requests (waking waiters), rails with new output (waking their
    /// drivers), rails the core gave up on (closing them).
    pub fn with_core<R>(&self, f: impl FnOnce(&mut Core, Time) -> R) -> R {
        self.with_core_at(None, f)
    }

    /// Like [`Shared::with_core`], but returns the slots with new output
    /// instead of waking their drivers, so the caller can first try to
    /// write them itself.
    pub fn with_core_deferred<R>(&self, f: impl FnOnce(&mut Core, Time) -> R) -> (R, Slots) {
        self.with_core_deferred_at(None, f)
    }

    /// [`Shared::with_core_deferred`] at `at`, a clock reading the caller
    /// took a moment ago (`None`: read the clock now).
    pub fn with_core_deferred_at<R>(&self, at: Option<Time>, f: impl FnOnce(&mut Core, Time) -> R) -> (R, Slots) {
        let g = self.lock();
        let now = at.unwrap_or_else(|| self.now());
        self.core_then(g, now, f)
    }

    /// [`Shared::with_core`] at `at`, a clock reading the caller took a
    /// moment ago (`None`: read the clock now).
    fn with_core_at<R>(&self, at: Option<Time>, f: impl FnOnce(&mut Core, Time) -> R) -> R {
        let (r, wake) = self.with_core_deferred_at(at, f);
        for i in wake {
            self.wake_slot(i);
        }
        r
    }

    /// `t` on the core's clock.
    pub fn time_of(&self, t: Instant) -> Time {
        Time::from_nanos(t.saturating_duration_since(self.origin).as_nanos() as u64)
    }

    /// [`Shared::with_core_deferred`] with the lock already taken and the
    /// clock read (`now`).
    fn core_then<R>(
        &self,
        mut g: MutexGuard<'_, Inner>,
        now: Time,
        f: impl FnOnce(&mut Core, Time) -> R,
    ) -> (R, Slots) {
        let r = f(&mut g.core, now);
        let mut completed = false;
        let mut close = Vec::new();
        while let Some(e) = g.core.poll_event() {
            match e {
                Event::SendDone { req, result } => {
                    g.complete(req, Completion::Send(result));
                    completed = true;
                }
                Event::RecvDone { req, result, buf } => {
                    g.complete(req, Completion::Recv(result, buf));
                    completed = true;
                }
                Event::RailDown { peer, rail, reason } => {
                    tracing::warn!(peer, rail, "rail down: {reason}");
                    g.note_rail(peer, rail, reason);
                    close.push((peer, rail));
                }
                Event::RailSuspect { peer, rail, reason } => {
                    tracing::warn!(peer, rail, "rail suspect, routed around: {reason}");
                    g.note_rail(peer, rail, format!("suspect: {reason}"));
                }
                Event::RailAlive { peer, rail } => {
                    tracing::info!(peer, rail, "rail answered again");
                    g.note_rail(peer, rail, "answered again".into());
                }
                Event::PeerFailed { failure } => {
                    tracing::error!("{failure}");
                    g.failures.push(failure);
                    completed = true;
                }
                Event::PeerClosed { peer } => tracing::debug!(peer, "peer closed"),
            }
        }
        let mut wake = Slots::new();
        g.core.drain_wakeups(|p, r| wake.extend(self.slot_of(p, r)));
        // Read under the lock: a waiter registers under it before sleeping.
        let notify = completed && self.done_waiters.load(Ordering::Acquire) > 0;
        let mut dial = Vec::new();
        if g.core.connect_due(now) {
            while let Some(req) = g.core.poll_connect(now) {
                dial.push(req);
            }
        }
        drop(g);
        if !dial.is_empty() {
            self.connect_q.push(dial);
        }
        for (peer, rail) in close {
            if let Some(i) = self.slot_of(peer, rail) {
                self.slots[i].close_requested.store(true, Ordering::Release);
                self.wake_slot(i);
            }
        }
        if notify {
            self.done_cv.notify_all();
        }
        (r, wake)
    }

    /// Writes the given slots' output from this thread where the rail is
    /// free; wakes the engine for the rest.
    pub fn send_now_or_wake(&self, slots: Slots) {
        for i in slots {
            if !self.try_send_now(i) {
                self.wake_slot(i);
            }
        }
    }

    pub fn wake_slot(&self, i: usize) {
        let s = &self.slots[i];
        if !s.wake_pending.swap(true, Ordering::AcqRel) {
            let mut w = self.woken[s.rail].lock().unwrap_or_else(|e| e.into_inner());
            w.push(i);
            self.woken_any[s.rail].store(true, Ordering::Release);
        }
        let w = s.waker.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(w) = w {
            w.wake();
        }
    }

    /// Marks slot `i` as having output without waking its driver: the
    /// next loop round of whoever runs it writes it (write coalescing).
    pub fn defer_slot(&self, i: usize) {
        let s = &self.slots[i];
        self.deferred_any.store(true, Ordering::Release);
        if !s.wake_pending.swap(true, Ordering::AcqRel) {
            let mut w = self.woken[s.rail].lock().unwrap_or_else(|e| e.into_inner());
            w.push(i);
            self.woken_any[s.rail].store(true, Ordering::Release);
        }
    }

    /// Writes deferred output from this thread where the rail is free
    /// (`test` makes no other progress).
    pub fn flush_deferred(&self) {
        self.flush_deferred_then(|_| {});
    }

    /// [`Shared::flush_deferred`], and wakes the engine for the slots it
    /// could not write in full (a busy connection, a full socket).
    pub fn flush_deferred_or_wake(&self) {
        self.flush_deferred_then(|i| self.wake_slot(i));
    }

    /// Writes the slots with deferred output where the rail is free;
    /// `unwritten` gets each one left with output.
    fn flush_deferred_then(&self, mut unwritten: impl FnMut(usize)) {
        if take_flag(&self.deferred_any) {
            for (i, s) in self.slots.iter().enumerate() {
                if s.wake_pending.load(Ordering::Acquire) && !self.try_send_now(i) {
                    unwritten(i);
                }
            }
        }
    }

    /// True if a slot of `rail` was woken since the last `take_woken`.
    pub fn any_woken(&self, rail: RailId) -> bool {
        self.woken_any[rail].load(Ordering::Acquire)
    }

    /// The slots of `rail` woken since the last call, appended to `into`
    /// (each at most once; some may have been serviced meanwhile).
    pub fn take_woken(&self, rail: RailId, into: &mut Vec<usize>) {
        if !take_flag(&self.woken_any[rail]) {
            return;
        }
        let mut w = self.woken[rail].lock().unwrap_or_else(|e| e.into_inner());
        into.append(&mut w);
    }

    /// The number of rails (slots are grouped by peer, then rail).
    pub fn rail_count(&self) -> usize {
        self.rails
    }

    /// Runs due timers; returns when the core next needs them.
    pub fn run_timers(&self) -> Option<Instant> {
        self.close_parked(false);
        let next = self.with_core(|c, now| match c.poll_timeout() {
            Some(t) if t <= now => {
                c.handle_timeout(now);
                c.poll_timeout()
            }
            t => t,
        });
        next.map(|t| self.instant(t))
    }

    /// Reads from and writes to slot `i` as far as possible without blocking.
    /// Writing is only attempted when there may be something to write: the
    /// core said so (`wake_pending`, also while the frames just read were
    /// handled), or bytes wait in the rail for the socket.
    pub fn service(&self, i: usize) -> Serviced {
        self.service_at(i, None)
    }

    /// [`Shared::service`], with the frames it reads handed to the core
    /// at `at`, a clock reading the caller took a moment ago (a spinning
    /// loop's round reads the clock once, not once per frame as well);
    /// `None`: read the clock for each.
    pub fn service_at(&self, i: usize, at: Option<Instant>) -> Serviced {
        let s = &self.slots[i];
        let woken = take_flag(&s.wake_pending);
        let mut conn = s.lock_conn();
        if take_flag(&s.close_requested)
            && let Some(rail) = conn.take()
        {
            *s.lock_id() = None;
            self.retire(s, rail);
        }
        let Some(rail) = conn.as_mut() else { return Serviced::default() };
        let mut sink = CoreSink { shared: self, peer: s.peer, rail: s.rail, at: at.map(|t| self.time_of(t)), dated: 0 };
        let (more, received) = match rail.poll_recv(&mut sink) {
            Ok(r) => (r.more, r.frames > 0),
            Err(e) => {
                self.fail(i, &mut conn, e);
                return Serviced::default();
            }
        };
        let write = woken || take_flag(&s.wake_pending) || rail.queued_bytes() > 0;
        if write && let Err(e) = self.pump_send(s, rail.as_mut()) {
            self.fail(i, &mut conn, e);
            return Serviced::default();
        }
        let rail = conn.as_ref().expect("still connected");
        Serviced {
            want_write: rail.queued_bytes() > 0,
            more,
            received,
            deadline: rail.deadline(),
            fd: rail.poll_fd(),
            spin: rail.spin_poll(),
        }
    }

    /// See [`crate::Endpoint::wakeups_sent`].
    pub fn wakeups_sent(&self) -> u64 {
        self.slots.iter().map(|s| s.lock_conn().as_ref().map_or(0, |r| r.wakeups_sent())).sum()
    }

    /// True if servicing slot `i` now would certainly do nothing: no
    /// output for it, no close asked for, and its rail says so
    /// ([`multirail_transport::Rail::input_hint`]). A slot in use by
    /// another thread is not quiet.
    pub fn quiet(&self, i: usize) -> bool {
        let s = &self.slots[i];
        if s.wake_pending.load(Ordering::Acquire) || s.close_requested.load(Ordering::Acquire) {
            return false;
        }
        let Ok(mut conn) = s.conn.try_lock() else { return false };
        conn.as_mut().is_some_and(|r| !r.input_hint())
    }

    /// Before the loop sleeps: arms slot `i`'s rail (see
    /// [`multirail_transport::Rail::arm`]). True: something is there, do
    /// not sleep. A slot in use by another thread is not armed (that
    /// thread is awake and will look).
    pub fn arm(&self, i: usize) -> bool {
        let s = &self.slots[i];
        let Ok(mut conn) = s.conn.try_lock() else { return true };
        conn.as_mut().is_some_and(|r| r.arm())
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

    /// Moves frames from the core into the rail and writes them. A small
    /// amount is written with the core locked, so taking the frames,
    /// writing them and reporting them written cost one lock (the latency
    /// path of small messages); bulk data is written outside the lock.
    fn pump_send(&self, s: &Slot, rail: &mut dyn Rail) -> Result<(), RailError> {
        let mut written = 0;
        loop {
            let inline = self.with_core(|c, now| self.fill_inline(c, now, s, rail, written));
            match inline {
                Some(r) => {
                    r?;
                    return Ok(());
                }
                None if rail.queued_bytes() == 0 => return Ok(()),
                None => {}
            }
            let f = rail.flush()?;
            if f.bytes > 0 {
                self.writes.fetch_add(1, Ordering::Relaxed);
            }
            written = f.frames;
            if f.blocked || f.bytes == 0 {
                if written > 0 {
                    self.with_core(|c, now| c.on_sent(s.peer, s.rail, written, now));
                }
                return Ok(());
            }
        }
    }

    /// After a write on slot `s` with the core locked (`c`): counts it if
    /// it wrote anything, and reports the frames it completed as sent.
    fn flushed(&self, c: &mut Core, s: &Slot, f: multirail_transport::Flushed, now: Time) {
        if f.bytes > 0 {
            self.writes.fetch_add(1, Ordering::Relaxed);
        }
        if f.frames > 0 {
            c.on_sent(s.peer, s.rail, f.frames, now);
        }
    }

    /// With the core locked: reports `written` frames as sent, moves the
    /// core's frames for `s` into `rail` (up to `FILL_TARGET` queued) and,
    /// when at most `INLINE_WRITE` bytes are queued, writes them now.
    /// `Some(blocked?)` if it wrote; `None` if nothing is queued or the
    /// queue is bulk, to be written outside the lock.
    fn fill_inline(
        &self,
        c: &mut Core,
        now: Time,
        s: &Slot,
        rail: &mut dyn Rail,
        written: usize,
    ) -> Option<Result<bool, RailError>> {
        if written > 0 {
            c.on_sent(s.peer, s.rail, written, now);
        }
        while rail.queued_bytes() < FILL_TARGET {
            let Some(t) = c.poll_transmit(s.peer, s.rail, now) else { break };
            tracing::trace!(peer = s.peer, rail = s.rail, op = ?t.header.op, seq = t.header.seq, off = t.header.offset, len = t.header.frag_len, "tx");
            rail.send(&t.header, t.payload);
        }
        let q = rail.queued_bytes();
        (q > 0 && q <= INLINE_WRITE).then(|| {
            rail.flush().map(|f| {
                self.flushed(c, s, f, now);
                f.blocked
            })
        })
    }

    /// An `isend` of `data` to `peer` with `tag`: the request, the time it
    /// was made, and its outcome if it completed at once. Small messages
    /// take the direct path in one step when they may
    /// ([`Core::isend_now`]): the frame is written under the same lock
    /// as the core's bookkeeping, on a connection this thread holds with
    /// nothing queued in it; else [`Shared::core_send_then`].
    pub fn isend(&self, peer: PeerId, tag: u64, data: bytes::Bytes) -> (ReqId, Time, Option<Result<(), SendError>>) {
        let mut g = self.lock();
        let now = self.now();
        // Never wait for a connection with the core locked.
        let free = |rail| {
            let i = self.slot_of(peer, rail)?;
            let conn = self.slots[i].conn.try_lock().ok()?;
            conn.as_ref().is_some_and(|r| r.queued_bytes() == 0).then_some((i, conn))
        };
        let data = match g.core.isend_now(peer, tag, data, now, free) {
            Ok((req, t, _, (i, mut conn))) => {
                let Some(r) = conn.as_mut() else { unreachable!("checked while locked") };
                match r.send_now(&t.header, t.payload) {
                    Ok(f) => {
                        self.flushed(&mut g.core, &self.slots[i], f, now);
                        let left = r.queued_bytes() > 0;
                        drop(g);
                        drop(conn);
                        if left {
                            self.wake_slot(i);
                        }
                    }
                    Err(e) => {
                        drop(g);
                        self.fail(i, &mut conn, e);
                    }
                }
                return (req, now, Some(Ok(())));
            }
            Err(data) => data,
        };
        self.core_send_then(g, now, |c, now| {
            let id = c.isend(peer, tag, data, now);
            (id, now, c.take_send_done(id))
        })
    }

    /// With the core locked (`g`, clock read at `now`): runs `f` on the
    /// core and, under the same lock, writes the small output it produced
    /// on connections that are free (the latency path of an `isend`: one
    /// lock and one clock reading instead of two). What is left (a busy
    /// connection, bulk data, a blocked or failed write) goes the usual
    /// way: [`Shared::send_now_or_wake`].
    fn core_send_then<R>(&self, g: MutexGuard<'_, Inner>, now: Time, f: impl FnOnce(&mut Core, Time) -> R) -> R {
        let ((r, mut rest), wake) = self.core_then(g, now, |c, now| {
            let r = f(c, now);
            let mut slots = Slots::new();
            c.drain_wakeups(|p, rail| slots.extend(self.slot_of(p, rail)));
            let mut rest = Slots::new();
            for i in slots {
                let s = &self.slots[i];
                // Never wait for a connection with the core locked (its
                // holder may be waiting for the core).
                let written = s.conn.try_lock().ok().is_some_and(|mut conn| {
                    conn.as_mut().is_none_or(|rail| {
                        matches!(self.fill_inline(c, now, s, rail.as_mut(), 0), Some(Ok(_))) && rail.queued_bytes() == 0
                    })
                });
                if !written {
                    rest.push(i);
                }
            }
            (r, rest)
        });
        for i in wake {
            if !rest.contains(&i) {
                rest.push(i);
            }
        }
        self.send_now_or_wake(rest);
        r
    }

    /// Closes a connection the core already gave up on. A payload being
    /// read into a leased piece of a receive buffer goes back to the core
    /// first: a lease that never returns would keep that range of the
    /// message "being read" forever, and every re-sent copy of it would be
    /// dropped (the job would wedge).
    fn retire(&self, s: &Slot, mut rail: Box<dyn Rail>) {
        self.reclaim(s, rail.as_mut());
        rail.shutdown();
    }

    fn reclaim(&self, s: &Slot, rail: &mut dyn Rail) {
        while let Some((h, d)) = rail.take_partial() {
            self.with_core(|c, now| {
                let _ = c.on_payload(s.peer, s.rail, &h, d, false, now);
            });
        }
    }

    /// Closes parked connections older than [`PARK`] (all with `all`).
    pub fn close_parked(&self, all: bool) {
        let mut p = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        if p.is_empty() {
            return;
        }
        let now = Instant::now();
        let (old, keep): (Vec<_>, Vec<_>) = p.drain(..).partition(|(t, _)| all || now.duration_since(*t) >= PARK);
        *p = keep;
        drop(p);
        for (_, mut r) in old {
            r.shutdown();
        }
    }

    /// Takes a failed rail out: the core hears of it, the socket closes.
    fn fail(&self, i: usize, conn: &mut Option<Box<dyn Rail>>, err: RailError) {
        let s = &self.slots[i];
        let Some(mut rail) = conn.take() else { return };
        *s.lock_id() = None;
        let partials: Vec<_> = std::iter::from_fn(|| rail.take_partial()).collect();
        rail.shutdown();
        let reason = err.to_string();
        if self.peer_wanted(s.peer) {
            tracing::warn!(peer = s.peer, rail = s.rail, name = %s.name, "rail failed: {reason}");
        } else {
            tracing::debug!(peer = s.peer, rail = s.rail, "rail closed: {reason}");
        }
        self.with_core(|c, now| {
            for (h, d) in partials {
                let _ = c.on_payload(s.peer, s.rail, &h, d, false, now);
            }
            c.rail_down(s.peer, s.rail, &reason, now);
        });
    }

    /// Installs an authenticated connection for slot `i`, unless the slot
    /// holds a connection that beats it (`connections`). A connection it
    /// replaces is retired, and the core sends again what it held.
    /// Returns whether the new connection was installed.
    pub fn install(
        &self,
        i: usize,
        mut rail: Box<dyn Rail>,
        id: ConnId,
        caps: multirail_proto::core::RailCaps,
        credits: u64,
    ) -> bool {
        let s = &self.slots[i];
        let mut conn = s.lock_conn();
        let mut cur = s.lock_id();
        if conn.is_some() && cur.is_some_and(|c| !id.beats(&c)) {
            // The peer may hold this one as its current connection until
            // it sees the winner: close it later, not now.
            self.parked.lock().unwrap_or_else(|e| e.into_inner()).push((Instant::now(), rail));
            return false;
        }
        s.max_gen.fetch_max(id.generation, Ordering::AcqRel);
        *cur = Some(id);
        drop(cur);
        if let Some(mut old) = conn.take() {
            self.reclaim(s, old.as_mut());
            self.parked.lock().unwrap_or_else(|e| e.into_inner()).push((Instant::now(), old));
        }
        s.close_requested.store(false, Ordering::Release);
        // Both engines arm spin-polled rails before they sleep.
        rail.engine_arms();
        *conn = Some(rail);
        let closing = self.with_core(|c, now| {
            c.rail_up(s.peer, s.rail, caps, credits, now);
            c.is_closing()
        });
        if closing {
            // Up once this endpoint is closing (its handshake ended during or
            // after `Endpoint::close`): the core queued a CLOSE on it. The
            // peer may hold the connection up already, so it gets that CLOSE
            // before its end, written here: the engine may have stopped.
            let mut rail = conn.take().expect("installed above");
            *s.lock_id() = None;
            drop(conn);
            let _ = self.pump_send(s, rail.as_mut());
            let _ = rail.flush();
            rail.close(Instant::now() + crate::endpoint::CLOSE_LINGER);
            self.with_core(|c, now| c.rail_down(s.peer, s.rail, "closed", now));
            return true;
        }
        drop(conn);
        self.conn_epoch.fetch_add(1, Ordering::AcqRel);
        self.wake_slot(i);
        true
    }

    /// Waits, until `by` at most, for the handshakes of incoming
    /// connections still under way to end. The connector holds such a
    /// connection up once it wrote its AUTH, before this end read it; once
    /// the endpoint is closing, the handshake ends by installing the
    /// connection, which sends the peer a CLOSE on it ([`Shared::install`]).
    /// Waited for, it does so before the process can exit, which would end
    /// the connection without one: a failed rail for the peer. (Our own
    /// attempts are not waited for: the peer's end holds one up only once
    /// it read our AUTH, and ours installs it right after writing that.)
    pub fn wait_handshakes(&self, by: Instant) {
        while self.handshakes.load(Ordering::Acquire) > 0 && Instant::now() < by {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// True if a connection from `peer` that passed its handshake is to be
    /// installed: the core still wants rails to the peer, or this endpoint
    /// is closing (the peer may hold the connection up already: installed,
    /// it gets a CLOSE, [`Shared::install`]).
    pub fn takes_connection(&self, peer: PeerId) -> bool {
        let g = self.lock();
        g.core.peer_alive(peer) || g.core.is_closing()
    }

    /// True if the core still wants rails to `peer` (it has not failed or
    /// closed).
    pub fn peer_wanted(&self, peer: PeerId) -> bool {
        self.lock().core.peer_alive(peer)
    }

    /// Takes the completion of `req` if it is there; if not, and no other
    /// thread awaits one, `req` becomes the awaited request (true: the
    /// caller must end its wait with [`Shared::end_await`]).
    pub fn take_or_await(&self, req: ReqId) -> (Option<Completion>, bool) {
        let mut g = self.lock();
        if let Some(c) = g.done.remove(&req) {
            return (Some(c), false);
        }
        if g.awaited.is_some() {
            return (None, false);
        }
        g.awaited = Some(req);
        (None, true)
    }

    /// Ends the wait [`Shared::take_or_await`] began without taking the
    /// completion (a timeout): one that came meanwhile goes to the map.
    pub fn end_await(&self) {
        let mut g = self.lock();
        let req = g.awaited.take();
        if let (Some(req), Some(c)) = (req, g.awaited_done.take()) {
            g.done.insert(req, c);
        }
    }
}

impl Inner {
    /// `req` completed.
    fn complete(&mut self, req: ReqId, c: Completion) {
        if self.awaited == Some(req) && self.awaited_done.is_none() {
            self.awaited_done = Some(c);
        } else {
            self.done.insert(req, c);
        }
    }

    /// The completion of the awaited request `req` if it came (the wait
    /// is then over: nothing is awaited any more). It comes nowhere else:
    /// [`Shared::take_or_await`] looked in the map when it began awaiting.
    pub fn take_awaited(&mut self, req: ReqId) -> Option<Completion> {
        debug_assert_eq!(self.awaited, Some(req));
        let c = self.awaited_done.take()?;
        self.awaited = None;
        Some(c)
    }
}

/// Clears `flag` and returns whether it was set. The common case on a
/// spinning loop's every round, a flag that is not set, costs a load, not a
/// locked read-modify-write.
fn take_flag(flag: &AtomicBool) -> bool {
    flag.load(Ordering::Acquire) && flag.swap(false, Ordering::AcqRel)
}

/// Feeds frames from one rail into the core.
struct CoreSink<'a> {
    shared: &'a Shared,
    peer: PeerId,
    rail: RailId,
    /// The last clock reading (the caller's, if it read the clock a
    /// moment ago: [`Shared::service_at`]), and how many frames it dated.
    at: Option<Time>,
    dated: u32,
}

/// Frames in a row one clock reading dates. A read goes on up to the
/// rail's budget (milliseconds of small frames), so a reading is taken
/// again now and then; a payload read into place (which may take long)
/// takes one of its own.
const FRAMES_PER_READING: u32 = 8;

impl CoreSink<'_> {
    /// The time of the next frame's arrival: the last reading, unless it
    /// dated [`FRAMES_PER_READING`] frames already.
    fn frame_time(&mut self) -> Time {
        match self.at {
            Some(t) if self.dated < FRAMES_PER_READING => {
                self.dated += 1;
                t
            }
            _ => self.fresh_time(),
        }
    }

    /// A new clock reading, which the next frames may use.
    fn fresh_time(&mut self) -> Time {
        let t = self.shared.now();
        (self.at, self.dated) = (Some(t), 1);
        t
    }
}

impl Inner {
    fn note_rail(&mut self, peer: PeerId, rail: RailId, what: String) {
        if self.rail_errors.len() < MAX_RAIL_EVENTS {
            self.rail_errors.push((peer, rail, what));
        } else {
            self.rail_errors_dropped += 1;
        }
    }
}

impl FrameSink for CoreSink<'_> {
    fn on_header(&mut self, hdr: &FrameHeader) -> Result<PayloadDest, ProtocolError> {
        tracing::trace!(peer = self.peer, rail = self.rail, op = ?hdr.op, seq = hdr.seq, off = hdr.offset, len = hdr.frag_len, "rx");
        let at = self.frame_time();
        self.shared.with_core_at(Some(at), |c, now| c.on_header(self.peer, self.rail, hdr, now))
    }
    fn on_payload(&mut self, hdr: &FrameHeader, dest: PayloadDest, complete: bool) -> Result<(), ProtocolError> {
        // A payload may take long to read: its own time.
        let at = self.fresh_time();
        self.shared.with_core_at(Some(at), |c, now| c.on_payload(self.peer, self.rail, hdr, dest, complete, now))
    }
    fn on_activity(&mut self) {
        let at = self.fresh_time();
        self.shared.with_core_at(Some(at), |c, now| c.rail_activity(self.peer, self.rail, now))
    }
    fn on_frame(&mut self, hdr: &FrameHeader, payload: &[u8]) -> Result<(), ProtocolError> {
        tracing::trace!(peer = self.peer, rail = self.rail, op = ?hdr.op, seq = hdr.seq, off = hdr.offset, len = hdr.frag_len, "rx");
        let at = self.frame_time();
        self.shared.with_core_at(Some(at), |c, now| c.on_frame(self.peer, self.rail, hdr, payload, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use multirail_proto::core::{Config, RailCaps};
    use multirail_proto::wire::Op;
    use multirail_transport::shm::ShmStream;
    use multirail_transport::tcp::StreamRail;

    fn eager(seq: u64, tag: u64) -> (FrameHeader, bytes::Bytes) {
        let mut h = FrameHeader::new(Op::Eager);
        (h.seq, h.tag, h.total_len, h.frag_len) = (seq, tag, 8, 8);
        (h, bytes::Bytes::from_static(&[7; 8]))
    }

    /// Rank 0's shared state with one shared-memory rail to rank 1, and
    /// rank 1's end of it (small frames reach the sink whole: `on_frame`).
    fn one_peer() -> (Shared, StreamRail<ShmStream>) {
        let mut core = Core::new(Config::default());
        core.add_peer(1, 1);
        let shared = Shared::new(core, vec![Arc::new(Slot::new(1, 0, "shm to rank 1".into()))], 0);
        let (a, b) = ShmStream::pair(1 << 16).unwrap();
        let rail = |s| {
            let caps = multirail_transport::RailCaps {
                name: "shm".into(),
                bandwidth: 0,
                latency: Duration::ZERO,
                max_frame: 1 << 20,
            };
            StreamRail::over(s, caps, multirail_proto::wire::frame::Limits::default())
        };
        let (ours, theirs) = (rail(a), rail(b));
        let caps = RailCaps { host_local: true, ..RailCaps::default() };
        assert!(shared.install(0, Box::new(ours), ConnId { generation: 1, initiator: 0 }, caps, 1 << 20));
        (shared, theirs)
    }

    /// Rank 1 sends eager frames `(seq, tag)`.
    fn send(theirs: &mut StreamRail<ShmStream>, frames: impl IntoIterator<Item = (u64, u64)>) {
        for (seq, tag) in frames {
            let (h, p) = eager(seq, tag);
            theirs.send(&h, p);
        }
        theirs.flush().unwrap();
    }

    /// The spinning loop's clock reading dates the first frames a service
    /// reads (no clock reading of their own), at most
    /// `FRAMES_PER_READING` of them: a long read reads the clock again, so
    /// it does not date every frame from its start.
    #[test]
    fn a_service_dates_its_first_frames_by_the_callers_reading_and_later_ones_by_the_clock() {
        let (shared, mut theirs) = one_peer();
        let heard = || shared.lock().core.last_heard(1).map(Time::as_nanos);
        send(&mut theirs, [(0, 1)]);
        let late = shared.origin + Duration::from_secs(1000);
        assert!(shared.service_at(0, Some(late)).received);
        assert_eq!(heard(), Some(1_000_000_000_000), "the caller's reading");
        send(&mut theirs, (1..FRAMES_PER_READING as u64).map(|s| (s, 1)));
        assert!(shared.service_at(0, Some(late + Duration::from_secs(1000))).received);
        assert_eq!(heard(), Some(2_000_000_000_000), "as many frames as one reading dates");
        send(&mut theirs, (FRAMES_PER_READING as u64..2 * FRAMES_PER_READING as u64 + 1).map(|s| (s, 1)));
        assert!(shared.service_at(0, Some(late + Duration::from_secs(3000))).received);
        let last = heard().unwrap();
        assert!(last < 1_000_000_000_000, "the later frames read the clock: {last} ns");
    }

    /// One waiting thread's request completes into a slot of its own (not
    /// the map); a second waiter uses the map; a wait that gives up moves
    /// a completion that came meanwhile into the map, where the next wait
    /// finds it.
    #[test]
    fn an_awaited_completion_is_kept_for_its_waiter_and_goes_to_the_map_when_the_wait_gives_up() {
        let (shared, mut theirs) = one_peer();
        let recv = |tag| shared.with_core(|c, now| c.irecv(Some(1), Some(tag), BytesMut::zeroed(8), now));
        let (a, b) = (recv(1), recv(2));
        assert!(matches!(shared.take_or_await(a), (None, true)));
        assert!(matches!(shared.take_or_await(b), (None, false)), "one awaited request at a time");
        send(&mut theirs, [(0, 2), (1, 1)]);
        assert!(shared.service(0).received);
        {
            let g = shared.lock();
            assert!(g.done.contains_key(&b), "the second waiter's completion is in the map");
            assert!(!g.done.contains_key(&a) && g.awaited_done.is_some(), "the awaited one is in its slot");
        }
        shared.end_await();
        assert!(matches!(shared.take_or_await(a), (Some(Completion::Recv(Ok(st), _)), false) if st.tag == 1));
        let c = recv(3);
        assert!(matches!(shared.take_or_await(c), (None, true)), "the slot is free again");
        assert!(shared.lock().take_awaited(c).is_none());
        send(&mut theirs, [(2, 3)]);
        assert!(shared.service(0).received);
        assert!(matches!(shared.lock().take_awaited(c), Some(Completion::Recv(Ok(st), _)) if st.tag == 3));
        assert!(shared.lock().awaited.is_none(), "taking it ended the wait");
    }
}
