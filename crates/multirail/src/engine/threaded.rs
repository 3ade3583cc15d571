//! One IO thread per rail, as the NPC'09 uDAPL study recommends for
//! several HCAs: thread `k` owns an epoll set with rail `k`'s connection to
//! every peer and a waker. Every IO thread runs the protocol timers that
//! are due when it wakes (a timer armed by its own work is seen on its
//! next turn).
//!
//! A thread waiting for a request does not just sleep until an IO thread
//! wakes from epoll and completes it (a thread wake-up costs tens of
//! microseconds): for `MULTIRAIL_SPIN_US` it runs the polled engine's loop
//! over every rail itself, and the IO threads keep out of its way: they
//! park instead of waiting in epoll (else every arriving message would
//! wake one of them as well, and on a busy machine they would take the
//! CPU from the spinning waiter). They also stay parked for [`HANDOFF`]
//! after a wait ends, as the application usually waits again soon, unless
//! output is queued for them. A waiter that stops spinning and sleeps
//! unparks them first.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::{Events, Poll, Token};

use super::polled::{self, PollState};
use super::{Done, Registration, sleep_for};
use crate::shared::{Shared, Wake};

const WAKE: Token = Token(usize::MAX);

/// After a wait ends, the IO threads stay parked this long (unless output
/// is queued for them): the application usually waits again soon.
const HANDOFF: Duration = Duration::from_millis(1);
/// How often a parked IO thread looks whether it is still not needed.
const IDLE_LOOK: Duration = Duration::from_millis(4);

/// Who runs the loop: the waiting threads (spinning), or the IO threads.
struct Gate {
    /// Waiting threads in their spinning phase (they run the loop).
    spinning: AtomicUsize,
    /// Waiting threads asleep (they need the IO threads).
    sleeping: AtomicUsize,
    last_wait: super::LastWait,
}

impl Gate {
    /// How long an IO thread may park now (`None`: it is needed).
    /// `woken`: output is queued for its rail.
    fn park_for(&self, woken: bool) -> Option<Duration> {
        if self.sleeping.load(Ordering::SeqCst) > 0 {
            return None;
        }
        if self.spinning.load(Ordering::SeqCst) > 0 {
            // The spinner takes every rail's queued output.
            return Some(IDLE_LOOK);
        }
        let since = self.last_wait.since();
        (!woken && since < HANDOFF).then(|| HANDOFF - since)
    }

    fn wait_ended(&self) {
        self.last_wait.mark();
    }
}

/// An IO thread's waker: an eventfd in its epoll set, or an unpark while
/// it is parked.
struct IoWaker {
    mio: mio::Waker,
    parked: AtomicBool,
    thread: OnceLock<std::thread::Thread>,
}

impl Wake for IoWaker {
    fn wake(&self) {
        if super::Running::runs(self) {
            return;
        }
        if self.parked.load(Ordering::SeqCst)
            && let Some(t) = self.thread.get()
        {
            t.unpark();
            return;
        }
        // A failed wake means the poll is gone (shutting down).
        let _ = self.mio.wake();
    }
}

/// The waiting threads' loop (one of them runs it at a time).
struct AppLoop {
    st: PollState,
    /// `Shared::conn_epoch` when every slot was last looked at.
    epoch: u64,
}

pub(crate) struct Threaded {
    threads: Vec<JoinHandle<()>>,
    wakers: Vec<Arc<IoWaker>>,
    app: Box<Mutex<AppLoop>>,
    gate: Arc<Gate>,
    spin: Duration,
}

impl Threaded {
    pub fn start(shared: Arc<Shared>, spin: Duration) -> std::io::Result<Threaded> {
        let rails = shared.slots.iter().map(|s| s.rail + 1).max().unwrap_or(0);
        let n = shared.slots.len();
        let gate = Arc::new(Gate {
            spinning: AtomicUsize::new(0),
            sleeping: AtomicUsize::new(0),
            last_wait: super::LastWait::new(),
        });
        let mut threads = Vec::new();
        let mut wakers = Vec::new();
        for k in 0..rails.max(1) {
            let mine: Vec<usize> = (0..n).filter(|&i| shared.slots[i].rail == k).collect();
            let poll = Poll::new()?;
            let waker = Arc::new(IoWaker {
                mio: mio::Waker::new(poll.registry(), WAKE)?,
                parked: AtomicBool::new(false),
                thread: OnceLock::new(),
            });
            for &i in &mine {
                *shared.slots[i].waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(waker.clone());
            }
            let sh = shared.clone();
            let name = format!("mr-rail-{k}");
            let (w, g) = (waker.clone(), gate.clone());
            let t = std::thread::Builder::new().name(name).spawn(move || rail_loop(&sh, &mine, poll, &w, &g))?;
            let _ = waker.thread.set(t.thread().clone());
            threads.push(t);
            wakers.push(waker);
        }
        let app = AppLoop { st: PollState::new(Poll::new()?, n, true), epoch: u64::MAX };
        Ok(Threaded { threads, wakers, app: Box::new(Mutex::new(app)), gate, spin })
    }

    /// See [`super::Engine::runs_soon`]: the IO threads are parked in
    /// the hand-off and will look at queued output when it ends.
    pub fn runs_soon(&self, now: Instant) -> bool {
        let g = &self.gate;
        let since = g.last_wait.since_at(now);
        g.spinning.load(Ordering::SeqCst) == 0 && g.sleeping.load(Ordering::SeqCst) == 0 && since < HANDOFF
    }

    /// Waits until `done` (checked with the shared state locked) or
    /// `deadline`: runs the loop itself for the spin time, then sleeps
    /// until the IO threads complete something.
    pub fn wait_until(
        &self,
        shared: &Shared,
        done: &mut Done<'_>,
        deadline: Option<Instant>,
        awaited: Option<u32>,
    ) -> bool {
        // Decided once the wait is found not done at once.
        let mut plan = None;
        self.gate.spinning.fetch_add(1, Ordering::SeqCst);
        let spun = loop {
            if done(&mut shared.lock()) {
                break Some(true);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                break Some(done(&mut shared.lock()));
            }
            let plan = *plan.get_or_insert_with(|| super::SpinPlan::new(shared, self.spin, awaited, now));
            if now >= plan.until {
                break None;
            }
            if let Ok(mut app) = self.app.try_lock() {
                let app = &mut *app;
                let epoch = shared.conn_epoch.load(Ordering::Acquire);
                if epoch != app.epoch {
                    // New connections: look at every slot (registers them).
                    app.epoch = epoch;
                    for i in 0..shared.slots.len() {
                        polled::service(shared, &mut app.st, i, Some(now));
                    }
                }
                let _running = super::Running::enter_all();
                polled::progress(shared, &mut app.st, Duration::ZERO, now);
            }
            super::spin_pause(shared, &plan, now);
        };
        if let Some(r) = spun {
            self.gate.wait_ended();
            self.gate.spinning.fetch_sub(1, Ordering::SeqCst);
            return r;
        }
        // Sleep: the IO threads must run the loop now.
        self.gate.sleeping.fetch_add(1, Ordering::SeqCst);
        self.gate.spinning.fetch_sub(1, Ordering::SeqCst);
        for w in &self.wakers {
            if let Some(t) = w.thread.get() {
                t.unpark();
            }
        }
        let r = sleep_until(shared, done, deadline);
        self.gate.wait_ended();
        self.gate.sleeping.fetch_sub(1, Ordering::SeqCst);
        r
    }

    pub fn join(&mut self) {
        for w in &self.wakers {
            if let Some(t) = w.thread.get() {
                t.unpark();
            }
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn rail_loop(shared: &Shared, mine: &[usize], mut poll: Poll, waker: &IoWaker, gate: &Gate) {
    let _running = super::Running::enter::<IoWaker>(waker);
    let Some(&first) = mine.first() else { return };
    let rail = shared.slots[first].rail;
    let rails = shared.rail_count();
    let mut events = Events::with_capacity(64);
    let mut regs = vec![Registration::default(); mine.len()];
    let mut more = vec![false; mine.len()];
    // Slots whose rails are polled by spinning (shared memory, libfabric):
    // armed before every sleep, since nothing makes their fd readable
    // otherwise. Not a rail that asks to be looked at by a deadline
    // instead (libfabric without a wait fd, whose arm refuses a sleep
    // 1024 times in a row: an idle IO thread would spin).
    let mut spin = vec![false; mine.len()];
    // Slots (by position in `mine`) to look at: ready, woken, with more
    // to read, or due (held frames of the fault-injecting rail).
    let mut todo: Vec<usize> = Vec::new();
    let mut woken: Vec<usize> = Vec::new();
    let mut due: Vec<(Instant, usize)> = Vec::new();
    let mut next_timer: Option<Instant> = None;
    // When timers last ran plus TIMER_AFTER_WORK.
    let mut timers_at: Option<Instant> = None;
    let mut worked = false;
    while !shared.shutdown.load(Ordering::Acquire) {
        if let Some(t) = gate.park_for(shared.any_woken(rail)) {
            // Announce the park before looking again: a wake after the
            // look sees `parked` and unparks (the token is kept).
            waker.parked.store(true, Ordering::SeqCst);
            if let Some(t) = gate.park_for(shared.any_woken(rail)).map(|u| u.min(t)) {
                std::thread::park_timeout(t);
            }
            waker.parked.store(false, Ordering::SeqCst);
            // A waiter ran the loop meanwhile: look at every slot (its
            // registration here may be stale).
            todo.extend(0..mine.len());
            next_timer = None;
            continue;
        }
        // Timers when due; after work at most every TIMER_AFTER_WORK (as
        // the polled engine does), not on every turn of the loop.
        let now = Instant::now();
        let after_work = worked && timers_at.is_none_or(|t| now >= t);
        if after_work || next_timer.is_none_or(|t| now >= t) {
            next_timer = shared.run_timers().map(|t| t.min(now + super::TIMER_RECHECK));
            timers_at = Some(now + super::TIMER_AFTER_WORK);
            worked = false;
        }
        shared.take_woken(rail, &mut woken);
        // Slot i of this rail is at position i / rails of `mine`.
        todo.extend(woken.drain(..).map(|i| i / rails));
        todo.extend((0..mine.len()).filter(|&j| more[j]));
        todo.extend(due.iter().filter(|&&(d, _)| d <= now).map(|&(_, j)| j));
        due.retain(|&(d, _)| d > now);
        todo.sort_unstable();
        todo.dedup();
        let mut busy = false;
        for &j in &todo {
            let i = mine[j];
            let st = shared.service(i);
            worked = true;
            regs[j].update(poll.registry(), Token(j), &st);
            more[j] = st.more;
            spin[j] = st.spin && st.deadline.is_none();
            busy |= st.more;
            due.retain(|&(_, x)| x != j);
            if let Some(d) = st.deadline {
                due.push((d, j));
            }
        }
        todo.clear();
        if busy || shared.any_woken(rail) {
            continue;
        }
        let next_due = due.iter().map(|&(d, _)| d).min();
        let timeout = sleep_for([next_timer, next_due]);
        // Spin-polled rails ask for a wake-up before the sleep; one that
        // has something already (or is in another thread's hands) is
        // looked at again instead.
        if !timeout.is_zero() {
            todo.extend((0..mine.len()).filter(|&j| spin[j] && shared.arm(mine[j])));
            if !todo.is_empty() {
                continue;
            }
        }
        if let Err(e) = poll.poll(&mut events, Some(timeout))
            && e.kind() != std::io::ErrorKind::Interrupted
        {
            tracing::error!("epoll failed: {e}");
            std::thread::sleep(Duration::from_millis(10));
        }
        shared.io_wakeups.fetch_add(1, Ordering::Relaxed);
        todo.extend(events.iter().map(|e| e.token().0).filter(|&j| j < mine.len()));
    }
}

/// Sleeps until `done` (checked whenever requests complete) or `deadline`.
fn sleep_until(shared: &Shared, done: &mut Done<'_>, deadline: Option<Instant>) -> bool {
    let mut g = shared.lock();
    loop {
        if done(&mut g) {
            return true;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return false;
        }
        // Bounded, as a backstop.
        let t = deadline.map_or(Duration::from_millis(50), |d| (d - now).min(Duration::from_millis(50)));
        g = shared.wait_done(g, t);
    }
}
