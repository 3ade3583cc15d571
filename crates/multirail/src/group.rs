//! Ordered multicast groups over an [`Endpoint`] (issue 17).
//!
//! A [`Group`] is a fixed set of the job's ranks (all of them, or a listed
//! subset) in which a declared set of senders multicast messages with
//! [`Group::ordered_send`]; every member delivers the same messages in the
//! same order ([`Mode::Ordered`]; per-sender order only with
//! [`Mode::Unordered`]) through [`Group::recv`] and [`Group::try_recv`],
//! and a message is delivered only once every member holds it. When a
//! member dies the survivors agree on one cut, install a view without it
//! and go on; the application sees a [`GroupEvent::View`]. The ordering and
//! membership logic is the sans-IO core of `multirail-group` (its README
//! states the model, the guarantees and what is not promised); this module
//! moves its frames over the endpoint and feeds it time and failures.
//!
//! # Wire
//!
//! Frames travel as ordinary multirail messages on reserved tags (at or
//! above [`RESERVED_TAGS`], never matched by an application's wildcard
//! receive): group `id` uses [`GROUP_TAGS`]` + 2 * id` for data frames and
//! the next tag for control frames (rows and null runs), so large data
//! lands in large posted buffers and rows in small ones. Rows and data may
//! overtake each other; the core does not depend on their order.
//!
//! # Who drives the core
//!
//! The core, the posted receives and the sends in flight sit behind one
//! lock; whoever holds it runs a turn (inputs, then `drain_effects`, then
//! the effects out). Three kinds of thread do:
//!
//! * The application thread in [`Group::recv`]: it runs turns, then waits
//!   inside the endpoint's progress engine itself until a group frame
//!   arrives, a message is handed over, or the next tick is due. A
//!   delivery wakes that thread alone.
//! * The thread in [`Group::ordered_send`], when the group's queue was
//!   empty and nobody else runs a turn: the message leaves in that call.
//! * The group's own driver thread, whenever no application thread is in
//!   `recv` (it takes over at most half a heartbeat plus 2 ms after the
//!   last one left): the core must bump its heartbeat and push its row
//!   every few milliseconds, and an application busy elsewhere for
//!   longer than the failure timeout (1 s by default) would be excluded
//!   by the others, and would also hold back the window of every sender
//!   that waits for its rows. The thread keeps the member live whatever
//!   the application does.
//!
//! Before 2026-11-28 only the driver thread ran turns, and a message cost a
//! hand-off from the sending thread to the driver and one from the driver
//! to the receiving thread: on the 3-host testbed of the 2-vCPU machine,
//! with one sender's 8 B messages sent one at a time, each hand-off took
//! about 30 µs of the message's 290 µs (docs/benchmarks.md).
//!
//! # Large messages
//!
//! Payloads of [`GroupOptions::relay_min`] bytes or more are relayed along
//! the chain of members (the core decides who passes what on; the driver
//! sends a relayed frame on as the bytes it received, without a copy), and
//! payloads longer than [`GroupOptions::chunk`] travel in chunks, each
//! passed on as it arrives, so the data receives posted here are at most a
//! chunk long and a long message crosses the chain in pipeline. Buffers
//! of received frames and of reassembled messages are taken back once
//! nobody holds them and reused.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use multirail_group::{Effect, Frame, GroupCore};
pub use multirail_group::{Mode, Senders};
use multirail_proto::core::{RecvError, ReqId};

use crate::shared::Completion;
use crate::{Endpoint, Error, RESERVED_TAGS};

/// The first tag of the group range: `2^63 + 0x4752 * 2^32` ("GR"). Group
/// `id` uses `GROUP_TAGS + 2 * id` (data) and `GROUP_TAGS + 2 * id + 1`
/// (rows and nulls). The range ends far below the barrier's `2^64 - 2`.
pub const GROUP_TAGS: u64 = RESERVED_TAGS + (0x4752 << 32);

/// Bytes a data frame adds to its payload (version, kind, view, sender,
/// index, length, and for a chunk the message's length and the offset),
/// rounded up.
const DATA_OVERHEAD: usize = 48;
/// Buffers [`take_back`] looks at per turn.
const TAKE_BACK_LOOK: usize = 64;
/// Control receives posted per peer (rows and nulls are small).
const POSTED_CTRL: usize = 4;
/// Data receive buffers posted per peer are capped at this many bytes,
/// and at a window's worth of frames up to this many: a frame that finds
/// no receive posted is copied twice (into a buffer of its own, then into
/// the receive), while every byte posted is memory touched.
const POSTED_DATA_BYTES: usize = 16 << 20;
const MAX_POSTED_DATA: usize = 64;
/// When the view has several senders, own data frames handed to the
/// endpoint and not yet sent are capped at this many bytes per peer (at
/// least one frame); the rest wait in the driver. The endpoint sends one
/// peer's messages in order, so without the cap a sender's whole window
/// (64 x 100 MB) would be queued ahead of the chunks it relays for the
/// others, and those would wait for seconds while every member holds
/// gigabytes of undeliverable messages.
const OWN_INFLIGHT_BYTES: usize = 8 << 20;
/// Data frames and chunks with payloads of at least this many bytes
/// travel split (the frame's head, then its payload as a message of its
/// own; see `multirail_group::Frame::encode_head`): a sender's own
/// payloads then go out as the application's bytes, with no copy behind a
/// header and none of the page faults of a fresh buffer to copy into. Below
/// it, the copy costs less than the second message.
const SPLIT_MIN: usize = 64 << 10;
/// The driver thread stays parked this long after an application thread
/// last drove the group from `recv`: one that receives in a loop comes
/// back within microseconds, and taking the endpoint back from it each
/// time would cost two wake-ups per delivery.
const HANDOFF: Duration = Duration::from_millis(2);
/// Turns an application thread runs back to back ([`Driver::turns`]).
const APP_TURNS: usize = 16;

/// How a group is set up. Ranks are the endpoint's ranks.
#[derive(Clone, Debug)]
pub struct GroupOptions {
    /// Tells groups on one endpoint apart (their tags); the members of one
    /// group must use the same id.
    pub id: u16,
    /// The members (endpoint ranks); `None`: every rank of the job.
    pub members: Option<Vec<u32>>,
    /// Which members send (endpoint ranks).
    pub senders: Senders,
    /// Own messages that may be undelivered at some member (at least 1).
    pub window: u32,
    pub mode: Mode,
    /// Largest payload [`Group::ordered_send`] takes (data receive buffers
    /// are this large, or [`GroupOptions::chunk`] if that is smaller).
    pub max_message: usize,
    /// A member that shows no sign of life for this long is excluded.
    pub failure_timeout: Duration,
    /// How often a member bumps its heartbeat and pushes its row.
    pub heartbeat_interval: Duration,
    /// Stop rather than go on when half or more of the view is suspected
    /// (see the core's README).
    pub partition_safety: bool,
    /// Payloads of at least this many bytes are relayed along the chain of
    /// members (in rank order, from the sender round to the member before
    /// it) when the view has three members or more: the sender's links
    /// carry each message once instead of once per member. `usize::MAX`:
    /// never (every member gets each message from its sender).
    pub relay_min: usize,
    /// Payloads longer than this travel in chunks of this many bytes,
    /// each passed on along the chain as soon as it arrives (a long
    /// message crosses the chain in pipeline instead of store-and-forward),
    /// and data receives are posted at most this long. Members copy the
    /// chunks into one buffer per message. `usize::MAX`: whole messages.
    pub chunk: usize,
}

impl Default for GroupOptions {
    /// Group 0 of every rank, all senders, ordered, window 16, messages up
    /// to 1 MiB, failure timeout 1 s, heartbeat 10 ms, partition safety on,
    /// payloads of 64 KiB or more relayed, payloads over 1 MiB in 1 MiB
    /// chunks.
    fn default() -> GroupOptions {
        GroupOptions {
            id: 0,
            members: None,
            senders: Senders::All,
            window: 16,
            mode: Mode::Ordered,
            max_message: 1 << 20,
            failure_timeout: Duration::from_secs(1),
            heartbeat_interval: Duration::from_millis(10),
            partition_safety: true,
            relay_min: multirail_group::DEFAULT_RELAY_MIN,
            chunk: multirail_group::DEFAULT_CHUNK,
        }
    }
}

/// A delivered message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The view it was delivered in.
    pub view: u64,
    /// Its sender (endpoint rank).
    pub sender: u32,
    /// Its index among the sender's messages of `view`.
    pub index: u64,
    pub payload: Bytes,
}

/// What [`Group::recv`] returns, in delivery order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupEvent {
    Message(Delivery),
    /// View `view` is installed with `members` (endpoint ranks); the
    /// messages that follow belong to it.
    View {
        view: u64,
        members: Vec<u32>,
    },
}

/// Why a group call failed.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    #[error("group configuration: {0}")]
    Config(String),
    #[error("this rank is not a sender of the group")]
    NotASender,
    #[error("a {len}-byte message is above the group's max_message of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("timed out")]
    Timeout,
    /// The others excluded this member (they suspected it).
    #[error("excluded from the group in view {0}")]
    Expelled(u64),
    /// This member suspected half or more of its view and stopped.
    #[error("stopped in view {0}: half or more of the view is unreachable (partition safety)")]
    Partitioned(u64),
    #[error("the group is closed")]
    Closed,
    #[error(transparent)]
    Endpoint(#[from] Error),
}

#[derive(Clone, Copy, Debug)]
enum Stop {
    Expelled(u64),
    Partitioned(u64),
    Failed,
}

impl Stop {
    fn error(self) -> GroupError {
        match self {
            Stop::Expelled(v) => GroupError::Expelled(v),
            Stop::Partitioned(v) => GroupError::Partitioned(v),
            Stop::Failed => GroupError::Closed,
        }
    }
}

struct State {
    /// Messages handed over by the application, not yet in the core.
    outbox: VecDeque<Bytes>,
    events: VecDeque<GroupEvent>,
    stopped: Option<Stop>,
    shutdown: bool,
    view: u64,
    members: Vec<u32>,
    /// Threads asleep on `space_cv`: a notify without sleepers is skipped
    /// (it costs a system call).
    send_waiters: usize,
}

struct Common {
    st: Mutex<State>,
    /// Signalled when the outbox drains or the group stops (senders wait).
    /// Receivers wait inside the endpoint instead (`Group::drive_here`).
    space_cv: Condvar,
    /// The application handed the driver something, or a turn ran in
    /// another thread (the receives a waiter watches may have changed):
    /// cut the wait short.
    kick: AtomicBool,
    /// `events` holds something or the group stopped: a receiving thread
    /// waiting inside the endpoint returns (read under the endpoint's
    /// lock, where `st` cannot be taken).
    has_events: AtomicBool,
    /// Application threads inside `recv` driving the group themselves
    /// (see "Who drives the core"), and when the last of them left (ns
    /// since `base`).
    app_drivers: AtomicUsize,
    app_left: AtomicU64,
    base: Instant,
    /// The driver thread sleeps on `idle_cv` (not inside the endpoint).
    parked: AtomicBool,
    idle_cv: Condvar,
}

impl Common {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every waiting thread looks again (the group stopped or closes).
    fn wake_all(&self) {
        self.space_cv.notify_all();
        self.idle_cv.notify_all();
    }

    /// Application threads drive the group now, or did less than
    /// [`HANDOFF`] ago: the driver thread stays out of their way.
    fn apps_drive(&self) -> bool {
        self.app_drivers.load(Ordering::Acquire) > 0
            || (self.base.elapsed().as_nanos() as u64).saturating_sub(self.app_left.load(Ordering::Acquire))
                < HANDOFF.as_nanos() as u64
    }

    /// The endpoint failed under a waiting thread: the group stops.
    fn fail(&self, ep: &Endpoint) {
        let mut st = self.lock();
        st.stopped.get_or_insert(Stop::Failed);
        drop(st);
        self.has_events.store(true, Ordering::Release);
        self.wake_all();
        ep.nudge();
    }
}

/// What to do after a turn.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Turn {
    /// Run another one at once.
    Again,
    /// Wait for an arrival, a kick or the tick.
    Wait,
    /// The group stopped or closes: no more turns.
    Stopped,
}

/// Waits inside the endpoint (its progress runs meanwhile) until one of
/// `ids` completed, the kick or `until`, and also: for an application
/// thread (`app`), events to return; for the driver thread, an
/// application thread that drives (it then parks). False if the endpoint
/// failed.
fn wait_in_endpoint(ep: &Endpoint, c: &Common, ids: &[ReqId], app: bool, until: Instant) -> bool {
    let mut ready = |g: &mut crate::shared::Inner| {
        c.kick.load(Ordering::Acquire)
            || if app { c.has_events.load(Ordering::Acquire) } else { c.app_drivers.load(Ordering::Acquire) > 0 }
            || (!g.done.is_empty() && ids.iter().any(|id| g.done.contains_key(id)))
    };
    ep.wait_for(&mut ready, until).is_ok()
}

/// The driver thread: runs the turns while no application thread does
/// (see "Who drives the core").
fn drive(state: Arc<Mutex<Driver>>, common: Arc<Common>, ep: Arc<Endpoint>, tick: Duration) {
    loop {
        if common.apps_drive() {
            let st = common.lock();
            if st.shutdown || st.stopped.is_some() {
                break;
            }
            // While an application thread drives it runs a turn at least
            // every tick: look again a tick later (no wake-up per
            // delivery); once none does, within the hand-off.
            let nap = if common.app_drivers.load(Ordering::Acquire) > 0 { tick } else { HANDOFF };
            common.parked.store(true, Ordering::Release);
            drop(common.idle_cv.wait_timeout(st, nap).unwrap_or_else(|e| e.into_inner()));
            common.parked.store(false, Ordering::Release);
            continue;
        }
        let mut d = state.lock().unwrap_or_else(|e| e.into_inner());
        let (next, produced) = d.turn();
        let ids = if next == Turn::Wait { d.wait_ids() } else { Vec::new() };
        drop(d);
        if produced && common.app_drivers.load(Ordering::Acquire) > 0 {
            ep.nudge();
        }
        match next {
            Turn::Stopped => break,
            Turn::Again => continue,
            Turn::Wait => {}
        }
        if !wait_in_endpoint(&ep, &common, &ids, false, Instant::now() + tick) {
            common.fail(&ep);
            break;
        }
    }
}

/// One member of an ordered multicast group; see the [module
/// documentation](self).
///
/// Create it on every member at about the same time (within the failure
/// timeout; a barrier before is the simple way): a member whose group is
/// not running yet looks dead to the others. The methods take `&self`, so
/// one thread may send while another receives.
pub struct Group {
    common: Arc<Common>,
    /// The core and everything around it; whoever holds it runs turns.
    state: Arc<Mutex<Driver>>,
    driver: Mutex<Option<JoinHandle<()>>>,
    tick: Duration,
    ep: Arc<Endpoint>,
    me: u32,
    sender: bool,
    max_message: usize,
    outbox_cap: usize,
}

impl Group {
    /// Joins group `opts.id` on `ep` and starts its driver thread.
    pub fn new(ep: Arc<Endpoint>, opts: GroupOptions) -> Result<Group, GroupError> {
        let size = ep.size();
        let me = ep.rank();
        let mut members: Vec<u32> = opts.members.clone().unwrap_or_else(|| (0..size).collect());
        members.sort_unstable();
        members.dedup();
        if let Some(m) = members.iter().find(|m| **m >= size) {
            return Err(GroupError::Config(format!("member {m} is not a rank of the job of {size}")));
        }
        let Some(me_idx) = members.iter().position(|m| *m == me) else {
            return Err(GroupError::Config(format!("rank {me} is not a member of the group")));
        };
        let idx = |r: u32| {
            members
                .iter()
                .position(|m| *m == r)
                .map(|i| i as u32)
                .ok_or_else(|| GroupError::Config(format!("sender {r} is not a member of the group")))
        };
        let senders = match &opts.senders {
            Senders::All => Senders::All,
            Senders::One(r) => Senders::One(idx(*r)?),
            Senders::List(l) => Senders::List(l.iter().map(|r| idx(*r)).collect::<Result<_, _>>()?),
        };
        let sender = match &opts.senders {
            Senders::All => true,
            Senders::One(r) => *r == me,
            Senders::List(l) => l.contains(&me),
        };
        if opts.max_message > u32::MAX as usize {
            return Err(GroupError::Config("max_message is above 4 GiB - 1".into()));
        }
        if opts.heartbeat_interval.is_zero() || opts.failure_timeout <= opts.heartbeat_interval {
            return Err(GroupError::Config("the failure timeout must be longer than the heartbeat interval".into()));
        }
        let cfg = multirail_group::GroupConfig {
            members: members.len() as u32,
            me: me_idx as u32,
            senders,
            window: opts.window,
            mode: opts.mode,
            failure_timeout: opts.failure_timeout,
            heartbeat_interval: opts.heartbeat_interval,
            partition_safety: opts.partition_safety,
            relay_min: opts.relay_min,
            chunk: opts.chunk,
        };
        let core = GroupCore::new(cfg).map_err(|e| GroupError::Config(format!("{e:?}")))?;
        let common = Arc::new(Common {
            st: Mutex::new(State {
                outbox: VecDeque::new(),
                events: VecDeque::new(),
                stopped: None,
                shutdown: false,
                view: 0,
                members: members.clone(),
                send_waiters: 0,
            }),
            space_cv: Condvar::new(),
            kick: AtomicBool::new(false),
            has_events: AtomicBool::new(false),
            app_drivers: AtomicUsize::new(0),
            app_left: AtomicU64::new(0),
            base: Instant::now(),
            parked: AtomicBool::new(false),
            idle_cv: Condvar::new(),
        });
        let max_frame = opts.max_message.min(opts.chunk) + DATA_OVERHEAD;
        let n = members.len();
        let tick = (opts.heartbeat_interval / 2).max(Duration::from_millis(1));
        let mut driver = Driver {
            ep: ep.clone(),
            common: common.clone(),
            core,
            ranks: members,
            me: me_idx,
            data_tag: GROUP_TAGS + 2 * u64::from(opts.id),
            ctrl_tag: GROUP_TAGS + 2 * u64::from(opts.id) + 1,
            data_frame: max_frame,
            ctrl_frame: 128 + 48 * n,
            posted_data: (POSTED_DATA_BYTES / max_frame).clamp(2, (opts.window as usize).clamp(2, MAX_POSTED_DATA)),
            lost: vec![false; n],
            heard: vec![0; n],
            heard_now: Vec::with_capacity(n),
            held: VecDeque::new(),
            spare: Vec::new(),
            chunk: opts.chunk,
            own_queue: vec![VecDeque::new(); n],
            own_inflight: vec![0; n],
            reassembled: VecDeque::new(),
            inbound: (0..n).map(|_| Inbound::default()).collect(),
            recvs: Vec::new(),
            sends: Vec::new(),
            framed: Vec::new(),
            frames: Vec::new(),
            t0: Instant::now(),
            finished: false,
        };
        driver.start();
        let state = Arc::new(Mutex::new(driver));
        let handle = {
            let (state, common, ep) = (state.clone(), common.clone(), ep.clone());
            std::thread::Builder::new()
                .name(format!("multirail-group-{}", opts.id))
                .spawn(move || drive(state, common, ep, tick))
                .map_err(Error::Io)?
        };
        Ok(Group {
            common,
            state,
            driver: Mutex::new(Some(handle)),
            tick,
            ep,
            me,
            sender,
            max_message: opts.max_message,
            outbox_cap: opts.window.max(1) as usize,
        })
    }

    /// The endpoint the group runs on.
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.ep
    }

    /// This member's endpoint rank.
    pub fn rank(&self) -> u32 {
        self.me
    }

    /// The current view's number and members (endpoint ranks), as the
    /// driver last installed it (events already queued may be older).
    pub fn view(&self) -> (u64, Vec<u32>) {
        let st = self.common.lock();
        (st.view, st.members.clone())
    }

    /// Multicasts `payload` to the group. Blocks while the send window is
    /// full: `window` own messages are undelivered at some member and
    /// `window` more wait in the group's queue. Returns once the message
    /// is queued; it is delivered (also here) through [`Group::recv`].
    pub fn ordered_send(&self, payload: Bytes) -> Result<(), GroupError> {
        self.send_until(payload, None)
    }

    /// [`Group::ordered_send`] giving up after `timeout` (the message is
    /// then not sent).
    pub fn ordered_send_timeout(&self, payload: Bytes, timeout: Duration) -> Result<(), GroupError> {
        self.send_until(payload, Some(Instant::now() + timeout))
    }

    fn send_until(&self, payload: Bytes, deadline: Option<Instant>) -> Result<(), GroupError> {
        if !self.sender {
            return Err(GroupError::NotASender);
        }
        if payload.len() > self.max_message {
            return Err(GroupError::TooLarge { len: payload.len(), max: self.max_message });
        }
        let mut st = self.common.lock();
        loop {
            if let Some(s) = st.stopped {
                return Err(s.error());
            }
            if st.shutdown {
                return Err(GroupError::Closed);
            }
            if st.outbox.len() < self.outbox_cap {
                break;
            }
            st = self.wait_space(st, deadline)?;
        }
        let first = st.outbox.is_empty();
        st.outbox.push_back(payload);
        drop(st);
        if first {
            self.send_now();
        }
        Ok(())
    }

    /// The outbox was empty: run a turn here if nobody else runs one, so
    /// that the message leaves now rather than after the driver wakes up;
    /// else kick the thread that drives.
    fn send_now(&self) {
        let c = &self.common;
        let mut d = match self.state.try_lock() {
            Ok(d) => d,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                c.kick.store(true, Ordering::Release);
                self.ep.nudge();
                return;
            }
        };
        let (next, produced) = d.turns();
        drop(d);
        // The receives a waiting thread watches may have been taken and
        // posted again: it looks again at its next wake-up; one waiting
        // for these events, or with turns left to run, wakes now.
        c.kick.store(true, Ordering::Release);
        if next == Turn::Again || (produced && c.app_drivers.load(Ordering::Acquire) > 0) {
            self.ep.nudge();
        }
    }

    /// The next delivery or view change; blocks until there is one.
    /// After the member stopped (excluded, partitioned), what was
    /// delivered before comes out first, then the error.
    pub fn recv(&self) -> Result<GroupEvent, GroupError> {
        self.recv_until(None)?.ok_or(GroupError::Timeout)
    }

    /// [`Group::recv`] waiting at most `timeout`: `Ok(None)` if nothing
    /// came.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Option<GroupEvent>, GroupError> {
        self.recv_until(Some(Instant::now() + timeout))
    }

    /// The next delivery or view change if there is one, without waiting.
    pub fn try_recv(&self) -> Result<Option<GroupEvent>, GroupError> {
        let mut st = self.common.lock();
        if let Some(e) = st.events.pop_front() {
            if st.events.is_empty() && st.stopped.is_none() {
                self.common.has_events.store(false, Ordering::Release);
            }
            return Ok(Some(e));
        }
        match st.stopped {
            Some(s) => Err(s.error()),
            None => Ok(None),
        }
    }

    fn recv_until(&self, deadline: Option<Instant>) -> Result<Option<GroupEvent>, GroupError> {
        loop {
            {
                let mut st = self.common.lock();
                if let Some(e) = st.events.pop_front() {
                    if st.events.is_empty() && st.stopped.is_none() {
                        self.common.has_events.store(false, Ordering::Release);
                    }
                    return Ok(Some(e));
                }
                if let Some(s) = st.stopped {
                    return Err(s.error());
                }
                if st.shutdown {
                    return Err(GroupError::Closed);
                }
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            let until = deadline.map_or(now + self.tick, |d| d.min(now + self.tick));
            self.drive_here(until);
        }
    }

    /// Drives the group from this (receiving) thread: runs turns, then
    /// waits inside the endpoint until an arrival, a kick, events or
    /// `until`. A delivery then wakes this thread only, instead of the
    /// driver thread and then this one.
    fn drive_here(&self, until: Instant) {
        let c = &self.common;
        c.app_drivers.fetch_add(1, Ordering::AcqRel);
        if !c.parked.load(Ordering::Acquire) {
            // Get the driver thread out of the endpoint: it parks.
            c.kick.store(true, Ordering::Release);
            self.ep.nudge();
        }
        let mut d = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (next, produced) = d.turns();
        let ids = d.wait_ids();
        drop(d);
        if next == Turn::Again {
            c.kick.store(true, Ordering::Release);
        }
        if produced && c.app_drivers.load(Ordering::Acquire) > 1 {
            // Another receiving thread waits in the endpoint.
            self.ep.nudge();
        }
        if next != Turn::Stopped
            && !c.has_events.load(Ordering::Acquire)
            && !wait_in_endpoint(&self.ep, c, &ids, true, until)
        {
            c.fail(&self.ep);
        }
        c.app_left.store(c.base.elapsed().as_nanos() as u64, Ordering::Release);
        c.app_drivers.fetch_sub(1, Ordering::AcqRel);
    }

    /// Sleeps on `space_cv`, counted as a sleeper.
    fn wait_space<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        deadline: Option<Instant>,
    ) -> Result<MutexGuard<'a, State>, GroupError> {
        let t = match deadline {
            None => Duration::from_millis(100),
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return Err(GroupError::Timeout);
                }
                (d - now).min(Duration::from_millis(100))
            }
        };
        st.send_waiters += 1;
        let mut st = self.common.space_cv.wait_timeout(st, t).unwrap_or_else(|e| e.into_inner()).0;
        st.send_waiters -= 1;
        Ok(st)
    }

    /// Leaves: stops the driver thread (calls blocked in other threads
    /// return [`GroupError::Closed`]). The group's receives stay posted on
    /// the endpoint until it closes (a later group on it needs another
    /// id). The others see its rows stop and exclude it unless they stop
    /// too: after the failure timeout once the endpoint is closed, after
    /// `ROWS_LATE_FACTOR` timeouts while it stays open (its channel is
    /// still heard). End a run with a barrier first.
    pub fn close(&self) {
        let handle = self.driver.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = handle {
            self.common.lock().shutdown = true;
            self.common.kick.store(true, Ordering::Release);
            self.common.has_events.store(true, Ordering::Release);
            self.common.idle_cv.notify_all();
            self.ep.nudge();
            let _ = h.join();
            self.common.wake_all();
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.close();
    }
}

#[derive(Clone, Copy)]
struct Posted {
    id: ReqId,
    /// Core rank of the peer.
    peer: u32,
    data: bool,
    /// Data receives: the order they were posted in for this peer, which
    /// is the order the peer's data messages fill them (a split frame's
    /// payload is the message after its head).
    seq: u64,
}

/// A data frame or chunk in bytes, as it goes to a peer: whole, or split in
/// head and payload (two messages, in this order).
#[derive(Clone)]
enum Wire {
    Whole(Bytes),
    Split(Bytes, Bytes),
}

/// Data messages from one peer, taken in the order they filled the
/// receives (completions may come in another), and the head of a split
/// frame whose payload is the next one.
#[derive(Default)]
struct Inbound {
    posted: u64,
    next: u64,
    early: std::collections::BTreeMap<u64, Bytes>,
    head: Option<Bytes>,
}

impl Inbound {
    /// Takes the data message that filled receive number `seq` and
    /// appends the frames it completes, in order, each with the bytes it
    /// came in: a message waits for those before it, and a split frame's
    /// head for its payload. An empty message (one that could not be
    /// received) is not a frame: it is reported as one that failed to
    /// decode, and so is a head waiting for it.
    fn take(&mut self, seq: u64, raw: Bytes, out: &mut Vec<(Result<Frame, String>, Wire)>) {
        self.early.insert(seq, raw);
        while let Some(raw) = self.early.remove(&self.next) {
            self.next += 1;
            if let Some(head) = self.head.take() {
                let f = Frame::decode_split(&head, raw.clone()).map_err(|e| e.to_string());
                out.push((f, Wire::Split(head, raw)));
            } else if Frame::is_head(&raw) {
                self.head = Some(raw);
            } else {
                out.push((Frame::decode(&raw).map_err(|e| e.to_string()), Wire::Whole(raw)));
            }
        }
    }
}

/// The driver thread's state: the core, the posted receives, the sends in
/// flight.
struct Driver {
    ep: Arc<Endpoint>,
    common: Arc<Common>,
    core: GroupCore,
    /// Endpoint rank of each core rank.
    ranks: Vec<u32>,
    me: usize,
    data_tag: u64,
    ctrl_tag: u64,
    data_frame: usize,
    ctrl_frame: usize,
    posted_data: usize,
    /// Core ranks reported lost to the core.
    lost: Vec<bool>,
    /// When the channel last heard from each core rank (endpoint clock,
    /// ns; see `Endpoint::last_heard`), as last told to the core.
    heard: Vec<u64>,
    heard_now: Vec<u64>,
    /// Received data frames, kept to take their buffers back once nothing
    /// else holds them (the payload delivered and dropped, the relay sent).
    held: VecDeque<Bytes>,
    /// Data frame buffers taken back, for the next receives: no new
    /// allocation, no zeroing, no page faults (a 100 MB buffer costs
    /// 25,600 of them).
    spare: Vec<BytesMut>,
    chunk: usize,
    /// Own data frames not yet handed to the endpoint, per peer, and own
    /// bytes handed to it and not yet sent ([`OWN_INFLIGHT_BYTES`]).
    own_queue: Vec<VecDeque<(u64, Wire)>>,
    own_inflight: Vec<usize>,
    /// Delivered payloads that came in chunks, kept to hand their buffers
    /// back to the core once the application drops them.
    reassembled: VecDeque<Bytes>,
    /// Per core rank: its data messages, in order.
    inbound: Vec<Inbound>,
    /// Receives posted, sends not finished.
    recvs: Vec<Posted>,
    sends: Vec<Sent>,
    /// Data frames and chunks already in bytes this turn, by (view,
    /// sender, index, offset): relayed ones as received (the core passes
    /// them on unchanged, so they go out without a new copy) and own ones
    /// once encoded (one encoding for every peer). The core sends a frame
    /// in the turn that receives or makes it, so the list is cleared every
    /// turn; a frame it sends later (one of the next view, held until the
    /// install) is encoded again. Kept between turns for its memory only,
    /// as is `frames` (those a turn's arrivals complete).
    framed: Vec<(FrameKey, Wire)>,
    frames: Vec<(Result<Frame, String>, Wire)>,
    t0: Instant,
    /// A turn stopped the group (or found it closing): no more turns.
    finished: bool,
}

impl Driver {
    fn post(&mut self, peer: u32, data: bool) -> Option<Posted> {
        let (tag, len) = if data { (self.data_tag, self.data_frame) } else { (self.ctrl_tag, self.ctrl_frame) };
        let buf = if data { self.spare.pop() } else { None };
        let buf = buf.unwrap_or_else(|| BytesMut::zeroed(len));
        let id = self.ep.irecv_exact(self.ranks[peer as usize], tag, buf).ok()?;
        let seq = if data {
            let inb = &mut self.inbound[peer as usize];
            inb.posted += 1;
            inb.posted - 1
        } else {
            0
        };
        Some(Posted { id, peer, data, seq })
    }

    fn take_data(&mut self, peer: u32, seq: u64, raw: Bytes, out: &mut Vec<(Result<Frame, String>, Wire)>) {
        self.inbound[peer as usize].take(seq, raw, out);
    }

    /// Takes back the buffers of data frames (received, or own once sent)
    /// and of reassembled messages that nobody holds any more: frames for
    /// the next receives and encodings, messages for the core to reassemble
    /// into. A received frame is a view of its buffer, which comes back
    /// whole (a receive overwrites what it reports; the bytes past it are
    /// never read); only an own encoding, cut to its length, is extended
    /// with zeros to a data frame again.
    fn reclaim(&mut self) {
        let keep = self.posted_data * self.ranks.len();
        let (spare, data_frame) = (&mut self.spare, self.data_frame);
        // Payloads the application keeps: stop watching the oldest.
        take_back(&mut self.held, 4 * keep, |mut m| {
            if m.capacity() >= data_frame && spare.len() < keep {
                m.resize(data_frame, 0);
                spare.push(m);
            }
        });
        let core = &mut self.core;
        take_back(&mut self.reassembled, 4 * self.ranks.len(), |m| core.recycle(m));
    }

    /// The bytes of own data frame `key`, made once for every peer: a
    /// large payload split from its head as it is ([`SPLIT_MIN`]), a small
    /// one encoded behind it into a receive buffer taken back (and taken
    /// back in turn once sent).
    fn own_frame(&mut self, framed: &mut Vec<(FrameKey, Wire)>, key: FrameKey, frame: &Frame) -> Wire {
        if let Some((_, w)) = framed.iter().find(|(k, _)| *k == key) {
            return w.clone();
        }
        let w = split(frame).unwrap_or_else(|| {
            let mut buf = self.spare.pop().unwrap_or_default();
            buf.clear();
            frame.encode_into(&mut buf);
            let b = buf.freeze();
            self.held.push_back(b.clone());
            Wire::Whole(b)
        });
        framed.push((key, w.clone()));
        w
    }

    /// Hands `wire` to the endpoint for core rank `to` (two messages if
    /// split); `own`: it is one of our own frames. False if the peer is
    /// gone.
    fn send_wire(&mut self, to: u32, wire: Wire, own: bool, sends: &mut Vec<Sent>) -> bool {
        let parts = match wire {
            Wire::Whole(b) => [Some(b), None],
            Wire::Split(h, p) => [Some(h), Some(p)],
        };
        for b in parts.into_iter().flatten() {
            let len = b.len();
            match self.ep.isend_reserved_later(self.ranks[to as usize], self.data_tag, b) {
                Ok(id) => {
                    let own = if own { len } else { 0 };
                    self.own_inflight[to as usize] += own;
                    sends.push(Sent { id, peer: to, own });
                }
                Err(_) => {
                    self.lose(to);
                    return false;
                }
            }
        }
        true
    }

    fn lose(&mut self, peer: u32) {
        if !std::mem::replace(&mut self.lost[peer as usize], true) {
            self.own_queue[peer as usize].clear();
            let inb = &mut self.inbound[peer as usize];
            inb.early.clear();
            inb.head = None;
            self.core.on_peer_lost(peer);
        }
    }

    /// Hands queued own data frames to the endpoint, each peer up to
    /// [`OWN_INFLIGHT_BYTES`] in flight; false if a peer turned out lost.
    fn pump(&mut self, sends: &mut Vec<Sent>) -> bool {
        let mut ok = true;
        for to in 0..self.ranks.len() {
            ok &= self.pump_to(to, sends);
        }
        ok
    }

    fn pump_to(&mut self, to: usize, sends: &mut Vec<Sent>) -> bool {
        // A lone sender has nobody to share its links with: no cap (a cap
        // cost it a fifth of its rate on the testbed, 2026-11-27).
        let cap = if self.core.senders().len() > 1 { OWN_INFLIGHT_BYTES } else { usize::MAX };
        while self.own_inflight[to] < cap
            && let Some((_, w)) = self.own_queue[to].pop_front()
        {
            if !self.send_wire(to as u32, w, true, sends) {
                return false;
            }
        }
        true
    }

    /// Posts the first receives: a window of data receives and a few
    /// control receives per peer.
    fn start(&mut self) {
        for j in 0..self.ranks.len() as u32 {
            if j as usize == self.me {
                continue;
            }
            for k in 0..self.posted_data + POSTED_CTRL {
                match self.post(j, k < self.posted_data) {
                    Some(p) => self.recvs.push(p),
                    None => self.lose(j),
                }
            }
        }
    }

    /// Turns back to back while one asks for another, at most
    /// [`APP_TURNS`] (an application thread then waits or returns): the
    /// last one's outcome, and whether any gave the application something.
    fn turns(&mut self) -> (Turn, bool) {
        let mut produced = false;
        for _ in 0..APP_TURNS {
            let (next, p) = self.turn();
            produced |= p;
            if next != Turn::Again {
                return (next, produced);
            }
        }
        (Turn::Again, produced)
    }

    /// One turn: the application's messages, arrivals, finished sends,
    /// time and failures into the core, then its effects out. Returns what
    /// to do next, and whether it gave the application something (events,
    /// a view, a stop).
    fn turn(&mut self) -> (Turn, bool) {
        if self.finished {
            return (Turn::Stopped, false);
        }
        let mut sends = std::mem::take(&mut self.sends);
        let mut framed = std::mem::take(&mut self.framed);
        let mut frames = std::mem::take(&mut self.frames);
        let r = self.turn_with(&mut sends, &mut framed, &mut frames);
        self.sends = sends;
        self.framed = framed;
        self.frames = frames;
        r
    }

    fn turn_with(
        &mut self,
        sends: &mut Vec<Sent>,
        framed: &mut Vec<(FrameKey, Wire)>,
        frames: &mut Vec<(Result<Frame, String>, Wire)>,
    ) -> (Turn, bool) {
        let mut again = false;
        // The application's messages, as far as the window allows.
        {
            let mut st = self.common.lock();
            if st.shutdown {
                self.finished = true;
                return (Turn::Stopped, false);
            }
            self.common.kick.store(false, Ordering::Release);
            let mut moved = false;
            while let Some(p) = st.outbox.front() {
                match self.core.send(p.clone()) {
                    Ok(_) => {
                        st.outbox.pop_front();
                        moved = true;
                    }
                    Err(multirail_group::SendError::TooLarge | multirail_group::SendError::NotASender) => {
                        // Checked by the caller; drop it rather than stall.
                        st.outbox.pop_front();
                    }
                    Err(_) => break,
                }
            }
            if moved && st.send_waiters > 0 {
                self.common.space_cv.notify_all();
            }
        }
        // Arrivals, taken out of the list last first (each swap_remove
        // moves an element that is not taken), then handled in order.
        let mut done = Vec::new();
        self.ep.take_completions(self.recvs.iter().map(|p| p.id), &mut done);
        let mut arrived: Vec<(Posted, Completion)> =
            done.into_iter().rev().map(|(i, c)| (self.recvs.swap_remove(i), c)).collect();
        arrived.reverse();
        for (p, c) in arrived {
            match c {
                Completion::Recv(Ok(st), buf) => {
                    // The frame is a view of the posted buffer; the buffer
                    // is taken back whole, at the length a receive needs,
                    // so that reusing it writes nothing (a head of a few
                    // bytes cut to its length and extended again zeroed a
                    // whole data frame: 6 % of the CPU in a 1 MB run).
                    let (whole, raw) = frame_view(buf, st.len as usize);
                    if p.data {
                        self.held.push_back(whole);
                        self.take_data(p.peer, p.seq, raw, frames);
                    } else {
                        frames.push((Frame::decode(&raw).map_err(|e| e.to_string()), Wire::Whole(raw)));
                    }
                }
                Completion::Recv(Err(RecvError::Truncated { status, buf_len }), _) => {
                    tracing::warn!(peer = status.peer, len = status.len, buf_len, "group frame too long, dropped");
                    if p.data {
                        // Its place in the peer's order is taken by
                        // nothing (it, and a head waiting for it, are
                        // dropped as undecodable), so the messages
                        // held behind it go on.
                        self.take_data(p.peer, p.seq, Bytes::new(), frames);
                    }
                }
                Completion::Recv(Err(_), _) | Completion::Send(_) => {
                    self.lose(p.peer);
                    continue;
                }
            }
            for (f, wire) in frames.drain(..) {
                match f {
                    Ok(f) => {
                        if let Some(key) = data_key(&f).filter(|_| is_relayed(&f)) {
                            framed.push((key, wire));
                        }
                        self.core.on_message(p.peer, f)
                    }
                    Err(e) => tracing::warn!(peer = self.ranks[p.peer as usize], "group frame dropped: {e}"),
                }
            }
            if !self.lost[p.peer as usize] {
                match self.post(p.peer, p.data) {
                    Some(n) => self.recvs.push(n),
                    None => self.lose(p.peer),
                }
            }
        }
        // Sends that finished (a failed one means the peer is gone).
        let mut done = Vec::new();
        self.ep.take_completions(sends.iter().map(|s| s.id), &mut done);
        for (i, c) in done.into_iter().rev() {
            let s = sends.swap_remove(i);
            self.own_inflight[s.peer as usize] -= s.own;
            if let Completion::Send(Err(_)) = c {
                self.lose(s.peer);
            }
        }
        // Members the channel heard from: alive, even if their rows
        // are queued behind large messages.
        self.ep.last_heard(&self.ranks, &mut self.heard_now);
        for (j, (&now, seen)) in self.heard_now.iter().zip(self.heard.iter_mut()).enumerate() {
            if now > *seen {
                *seen = now;
                self.core.on_alive(j as u32);
            }
        }
        self.core.on_tick(self.t0.elapsed());
        let effects = self.core.drain_effects();
        let mut events = Vec::new();
        let mut view = None;
        let mut stop = None;
        for e in effects {
            match e {
                Effect::Send { to, frame } => {
                    if self.lost[to as usize] {
                        continue;
                    }
                    let bytes = match data_key(&frame) {
                        Some(key) if key.1 == self.me as u32 => {
                            // Own: paced (see OWN_INFLIGHT_BYTES).
                            let wire = self.own_frame(framed, key, &frame);
                            self.own_queue[to as usize].push_back((key.0, wire));
                            if !self.pump_to(to as usize, sends) {
                                again = true;
                            }
                            continue;
                        }
                        Some(key) => {
                            // Passed on as received (see `framed`).
                            let wire = match framed.iter().find(|(k, _)| *k == key) {
                                Some((_, w)) => w.clone(),
                                None => split(&frame).unwrap_or_else(|| Wire::Whole(frame.encode())),
                            };
                            if !self.send_wire(to, wire, false, sends) {
                                again = true;
                            }
                            continue;
                        }
                        None => frame.encode(),
                    };
                    match self.ep.isend_reserved_later(self.ranks[to as usize], self.ctrl_tag, bytes) {
                        Ok(id) => sends.push(Sent { id, peer: to, own: 0 }),
                        Err(_) => {
                            self.lose(to);
                            again = true;
                        }
                    }
                }
                Effect::Deliver { view, sender, index, payload } => {
                    if payload.len() > self.chunk {
                        self.reassembled.push_back(payload.clone());
                    }
                    let sender = self.ranks[sender as usize];
                    events.push(GroupEvent::Message(Delivery { view, sender, index, payload }));
                }
                Effect::ViewChange { view_id, members } => {
                    let members: Vec<u32> = members.iter().map(|m| self.ranks[*m as usize]).collect();
                    view = Some((view_id, members.clone()));
                    events.push(GroupEvent::View { view: view_id, members });
                    // Frames of the views before are of no use to
                    // anybody now: every survivor holds what the cut
                    // delivers, and the rest is sent again.
                    for q in &mut self.own_queue {
                        q.retain(|(v, _)| *v >= view_id);
                    }
                    again = true;
                }
                Effect::Wedged { view_id, suspected } => {
                    tracing::info!(view_id, ?suspected, "group view change begins");
                }
                Effect::Expelled { view_id } => stop = Some(Stop::Expelled(view_id)),
                Effect::Partitioned { view_id } => stop = Some(Stop::Partitioned(view_id)),
            }
        }
        framed.clear();
        if !self.pump(sends) {
            again = true;
        }
        // What this turn sent to each peer leaves in one write.
        self.ep.flush_sends();
        self.reclaim();
        if self.core.is_stopped() && stop.is_none() {
            stop = Some(Stop::Failed);
        }
        let produced = !events.is_empty() || view.is_some() || stop.is_some();
        if produced {
            let mut st = self.common.lock();
            st.events.extend(events);
            self.common.has_events.store(true, Ordering::Release);
            if let Some((v, m)) = view {
                st.view = v;
                st.members = m;
            }
            let stopping = stop.is_some();
            if stopping {
                st.stopped = stop;
            }
            drop(st);
            // Receivers waiting inside the endpoint are woken by whoever
            // ran this turn (it knows whether it is one of them).
            if stopping {
                self.common.wake_all();
                self.ep.nudge();
            }
        }
        if stop.is_some() {
            self.finished = true;
            return (Turn::Stopped, produced);
        }
        // The window opened in this turn (rows said our messages were
        // delivered) while the application's messages wait: take them
        // now, not at the next tick.
        if self.core.can_send() && !self.common.lock().outbox.is_empty() {
            again = true;
        }
        (if again { Turn::Again } else { Turn::Wait }, produced)
    }

    /// What a wait after a turn watches besides the kick: arrivals, and
    /// own sends done while own frames wait for room.
    fn wait_ids(&self) -> Vec<ReqId> {
        let mut ids: Vec<ReqId> = self.recvs.iter().map(|p| p.id).collect();
        for (to, q) in self.own_queue.iter().enumerate() {
            if q.is_empty() {
                continue;
            }
            // Once half the budget is free, not at every send: a
            // turn per send would cost the CPU the relays need.
            let free = self.own_inflight[to].saturating_sub(OWN_INFLIGHT_BYTES / 2);
            let mut sum = 0;
            if let Some(s) = self.sends.iter().filter(|s| s.peer as usize == to && s.own > 0).find(|s| {
                sum += s.own;
                sum >= free
            }) {
                ids.push(s.id);
            }
        }
        ids
    }
}

/// Hands `put` the buffers of `list` nobody else holds any more and drops
/// them from it; then stops watching the oldest beyond `max`.
/// Only the oldest [`TAKE_BACK_LOOK`] are looked at, once per turn: they
/// are the ones most likely free, and a list of hundreds (a window of
/// small frames per peer) looked at whole in every turn cost more than the
/// buffers saved.
fn take_back(list: &mut VecDeque<Bytes>, max: usize, mut put: impl FnMut(BytesMut)) {
    let mut kept = Vec::new();
    for _ in 0..list.len().min(TAKE_BACK_LOOK) {
        let b = list.pop_front().expect("in range");
        if !b.is_unique() {
            kept.push(b);
        } else if let Ok(m) = b.try_into_mut() {
            put(m);
        }
    }
    for b in kept.into_iter().rev() {
        list.push_front(b);
    }
    while list.len() > max {
        list.pop_front();
    }
}

/// A receive buffer frozen whole, and the frame received into its first
/// `len` bytes as a view of it: once the view is dropped, the whole buffer
/// comes back ([`take_back`]) at the length a receive needs.
fn frame_view(buf: BytesMut, len: usize) -> (Bytes, Bytes) {
    let whole = buf.freeze();
    let frame = whole.slice(..len.min(whole.len()));
    (whole, frame)
}

/// A send handed to the endpoint; `own`: bytes of an own data frame.
struct Sent {
    id: ReqId,
    peer: u32,
    own: usize,
}

/// (view, sender, index, offset) of a data frame or chunk.
type FrameKey = (u64, u32, u64, u32);

/// `frame` split in head and payload if its payload is [`SPLIT_MIN`] bytes
/// or more (the payload as it is, no copy). A smaller frame costs no head.
fn split(frame: &Frame) -> Option<Wire> {
    match frame {
        Frame::Data { payload, .. } | Frame::Chunk { bytes: payload, .. } if payload.len() >= SPLIT_MIN => {
            frame.encode_head().map(|(h, p)| Wire::Split(h, p))
        }
        _ => None,
    }
}

/// The key of a data frame or chunk among the turn's frames in bytes.
fn data_key(f: &Frame) -> Option<FrameKey> {
    match f {
        Frame::Data { view, sender, index, .. } => Some((*view, *sender, *index, 0)),
        Frame::Chunk { view, sender, index, offset, .. } => Some((*view, *sender, *index, *offset)),
        Frame::Null { .. } | Frame::Row(_) => None,
    }
}

fn is_relayed(f: &Frame) -> bool {
    matches!(f, Frame::Data { relay: true, .. } | Frame::Chunk { relay: true, .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(index: u64, len: usize) -> Frame {
        Frame::Data { view: 0, sender: 1, index, payload: Bytes::from(vec![index as u8; len]), relay: true }
    }

    fn taken(out: &mut Vec<(Result<Frame, String>, Wire)>) -> Vec<Result<u64, ()>> {
        out.drain(..)
            .map(|(f, _)| match f {
                Ok(Frame::Data { index, payload, .. }) => {
                    assert!(payload.iter().all(|&b| b == index as u8));
                    Ok(index)
                }
                _ => Err(()),
            })
            .collect()
    }

    /// A peer's data messages become frames in the order they filled the
    /// receives, whatever order they complete in; a split frame's head
    /// waits for its payload, which is kept as it came.
    #[test]
    fn data_messages_are_taken_in_order_and_split_frames_joined() {
        let mut inb = Inbound::default();
        let mut out = Vec::new();
        let (head, payload) = data(1, SPLIT_MIN).encode_head().expect("a data frame");
        // Receives 0..4: whole frame 0, head and payload of frame 1, whole frame 2.
        inb.take(2, payload.clone(), &mut out);
        inb.take(3, data(2, 10).encode(), &mut out);
        assert!(out.is_empty(), "nothing before receive 0 has come");
        inb.take(1, head, &mut out);
        assert!(out.is_empty());
        inb.take(0, data(0, 10).encode(), &mut out);
        let joined = out.iter().find_map(|(_, w)| match w {
            Wire::Split(_, p) => Some(p.as_ptr()),
            Wire::Whole(_) => None,
        });
        assert_eq!(joined, Some(payload.as_ptr()), "the payload as it came, not a copy");
        assert_eq!(taken(&mut out), vec![Ok(0), Ok(1), Ok(2)]);
    }

    #[test]
    fn a_receive_buffer_comes_back_whole_once_its_frame_is_dropped() {
        let (whole, frame) = frame_view(BytesMut::from(&[7u8; 1000][..]), 40);
        assert_eq!(frame.len(), 40);
        let mut list = VecDeque::from([whole]);
        let mut back = Vec::new();
        // Still held through the frame: not taken back.
        take_back(&mut list, 8, |m| back.push(m));
        assert!(back.is_empty());
        assert_eq!(list.len(), 1);
        drop(frame);
        take_back(&mut list, 8, |m| back.push(m));
        assert!(list.is_empty());
        // At full length with its bytes as they were: nothing to write
        // before it is posted again.
        assert_eq!(back.len(), 1);
        assert_eq!(&back[0][..], &[7u8; 1000][..]);
    }

    /// A message that could not be received (empty) takes its place in the
    /// order: the head waiting for it is dropped with it, and the messages
    /// held behind it go on.
    #[test]
    fn a_message_not_received_releases_those_behind_it() {
        let mut inb = Inbound::default();
        let mut out = Vec::new();
        let (head, _) = data(0, SPLIT_MIN).encode_head().expect("a data frame");
        inb.take(0, head, &mut out);
        inb.take(2, data(1, 10).encode(), &mut out);
        inb.take(3, data(2, 10).encode(), &mut out);
        assert!(out.is_empty());
        inb.take(1, Bytes::new(), &mut out);
        assert_eq!(taken(&mut out), vec![Err(()), Ok(1), Ok(2)]);
    }
}
