//! Progress engines: who reads and writes the rails.

pub mod polled;
pub mod threaded;

use std::cell::Cell;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};

use crate::shared::{Inner, Serviced, Shared, Wake};

/// What a wait waits for: checked with the shared state locked (it may
/// take what it found, such as a completion).
pub(crate) type Done<'a> = dyn FnMut(&mut Inner) -> bool + 'a;

/// Longest a driver sleeps with nothing to do (bounds timer slack).
pub const MAX_SLEEP: Duration = Duration::from_millis(100);

/// Timers are re-checked at least this often even when nothing happens
/// (an application call may have armed one, e.g. a delayed ACK).
pub(crate) const TIMER_RECHECK: Duration = Duration::from_millis(1);
/// After work, timers are re-checked at most this often (the shortest
/// protocol timer is the 1 ms acknowledgement delay).
pub(crate) const TIMER_AFTER_WORK: Duration = Duration::from_micros(200);

/// A spinning waiter gives its CPU away (`sched_yield`) between rounds
/// once it has waited this long and threads wait for a CPU
/// ([`crate::cpus::crowded`]): a message between two ranks takes a few
/// microseconds, so a longer wait may mean the peer it waits for shares
/// its CPU and cannot run while it spins. Two unpinned ranks on one CPU
/// otherwise took a whole spin (200 µs) per message (`bench latency
/// --sizes 8` fell into that in 3 to 5 of 12 short runs).
pub(crate) const YIELD_AFTER: Duration = Duration::from_micros(20);

/// How a wait that was not over at once spins.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SpinPlan {
    /// The wait's first clock reading plus [`YIELD_AFTER`]: from here on
    /// a round yields when CPUs are crowded (an instant, compared on every
    /// round; a duration since the start would be a subtraction each).
    pub yield_at: Instant,
    /// Spinning ends here (then the wait sleeps).
    pub until: Instant,
    /// The peer it waits for last ran on this thread's CPU: give the CPU
    /// away between all rounds, not only after [`YIELD_AFTER`].
    pub peer_here: bool,
}

impl SpinPlan {
    /// The plan of a wait that begins at `now`, spinning at most `spin`,
    /// for what rank `awaited` will send or take (none: unknown or any).
    /// A wait for a peer that last ran on this thread's CPU
    /// ([`crate::cpus::PeerCpus`]; for any rank, some watched one) yields
    /// from its first round: the peer cannot run while this thread spins.
    pub fn new(shared: &Shared, spin: Duration, awaited: Option<u32>, now: Instant) -> SpinPlan {
        let peer_here = !spin.is_zero()
            && match awaited {
                // Unless this thread moves to a free CPU instead.
                Some(p) => shared.peer_cpus.shares_cpu(p, now) && !shared.peer_cpus.move_away(p, shared.rank(), now),
                None => shared.peer_cpus.any_here(now),
            };
        if peer_here {
            shared.peer_here_waits.fetch_add(1, Ordering::Relaxed);
        }
        SpinPlan { yield_at: now + YIELD_AFTER, until: now + spin, peer_here }
    }
}

/// Between two rounds of a spinning wait: lets another thread of this CPU
/// run when the peer waited for is queued on it, or once the wait is long
/// and the machine has threads waiting for a CPU.
pub(crate) fn spin_pause(shared: &Shared, plan: &SpinPlan, now: Instant) {
    if plan.peer_here || (now >= plan.yield_at && crate::cpus::crowded(now)) {
        shared.spin_yields.fetch_add(1, Ordering::Relaxed);
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// When the application's last wait ended, readable from any thread: the
/// hand-off between a waiting thread and the engine's own threads is
/// timed from it.
pub(crate) struct LastWait {
    origin: Instant,
    /// Nanoseconds since `origin` when the last wait ended.
    at: AtomicU64,
}

impl LastWait {
    pub fn new() -> LastWait {
        LastWait { origin: Instant::now(), at: AtomicU64::new(0) }
    }

    /// A wait ends now.
    pub fn mark(&self) {
        self.mark_at(Instant::now());
    }

    /// A wait ends at `t`, a clock reading taken a moment ago (a spinning
    /// loop's last round: no second reading).
    pub fn mark_at(&self, t: Instant) {
        self.at.store(t.saturating_duration_since(self.origin).as_nanos() as u64, Ordering::Release);
    }

    /// Time since the last wait ended (since start if none has).
    pub fn since(&self) -> Duration {
        self.since_at(Instant::now())
    }

    /// [`LastWait::since`] as of `now`, a clock reading taken a moment ago.
    pub fn since_at(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.origin).saturating_sub(Duration::from_nanos(self.at.load(Ordering::Acquire)))
    }
}

pub(crate) struct MioWaker(pub mio::Waker);

thread_local! {
    /// The waker of the progress loop this thread is running, if any: such
    /// a thread looks at every slot's `wake_pending` before it sleeps, so
    /// waking its own loop (an eventfd write) would be wasted.
    static RUNNING: Cell<usize> = const { Cell::new(0) };
}

/// Marks this thread as running the loop of `waker` while it lives.
pub(crate) struct Running(usize);

/// [`RUNNING`] of a thread whose loop takes every rail's woken slots
/// before it sleeps (the threaded engine's spinning waiter): no waker
/// needs to be woken from it.
const RUNNING_ALL: usize = usize::MAX;

impl Running {
    pub fn enter<W>(waker: &W) -> Running {
        Running(RUNNING.replace(waker as *const W as usize))
    }

    /// This thread runs a loop over every rail (see [`RUNNING_ALL`]).
    pub fn enter_all() -> Running {
        Running(RUNNING.replace(RUNNING_ALL))
    }

    /// True if this thread runs the loop of `waker` (or of every rail), so
    /// waking it would be wasted.
    pub fn runs<W>(waker: &W) -> bool {
        let r = RUNNING.get();
        r == RUNNING_ALL || r == waker as *const W as usize
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.set(self.0);
    }
}

impl Wake for MioWaker {
    fn wake(&self) {
        if Running::runs(self) {
            return;
        }
        // A failed wake means the poll is gone (shutting down).
        let _ = self.0.wake();
    }
}

/// What a slot is registered with in one epoll set.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Registration {
    fd: Option<RawFd>,
    write: bool,
    /// The descriptor is out of the set while a spinning waiter reads it
    /// directly ([`Registration::park`]).
    parked: bool,
}

impl Registration {
    /// A descriptor is in the epoll set for this slot.
    pub fn registered(&self) -> bool {
        self.fd.is_some() && !self.parked
    }

    /// Takes the descriptor out of the epoll set while a spinning waiter
    /// reads it on every round: a socket in an epoll set costs every
    /// arriving segment a callback into epoll, inside the peer's send
    /// (measured on loopback: 8 B one-way 5.12 instead of 4.87 us).
    /// [`Registration::unpark`] puts it back before the loop sleeps.
    pub fn park(&mut self, registry: &Registry) {
        if let (Some(fd), false) = (self.fd, self.parked) {
            let _ = registry.deregister(&mut SourceFd(&fd));
            self.parked = true;
        }
    }

    /// Puts a parked descriptor back (epoll reports what arrived meanwhile
    /// at once: adding a ready descriptor queues its event).
    pub fn unpark(&mut self, registry: &Registry, token: Token) {
        if !std::mem::take(&mut self.parked) {
            return;
        }
        if let Some(fd) = self.fd {
            add(registry, fd, token, interest(self.write));
        }
    }

    /// Brings the registration of slot `i` in line with its connection.
    pub fn update(&mut self, registry: &Registry, token: Token, st: &Serviced) {
        let fd = st.fd;
        if self.parked {
            // Not in the set: only remember the connection (a new one is
            // added when the slot is unparked).
            self.parked = fd.is_some();
            self.fd = fd;
            self.write = st.want_write;
            return;
        }
        let interest = interest(st.want_write);
        match (self.fd, fd) {
            (Some(old), Some(new)) if old == new && self.write == st.want_write => {}
            (Some(old), Some(new)) if old == new => {
                if registry.reregister(&mut SourceFd(&new), token, interest).is_err() {
                    let _ = registry.register(&mut SourceFd(&new), token, interest);
                }
            }
            (old, Some(new)) => {
                if let Some(o) = old {
                    // The old socket may already be closed (and removed).
                    let _ = registry.deregister(&mut SourceFd(&o));
                }
                add(registry, new, token, interest);
            }
            (Some(o), None) => {
                let _ = registry.deregister(&mut SourceFd(&o));
            }
            (None, None) => {}
        }
        self.fd = fd;
        self.write = st.want_write;
    }
}

/// What a slot's descriptor is watched for: reading, and writing while
/// bytes wait for room in the socket.
fn interest(write: bool) -> Interest {
    if write { Interest::READABLE | Interest::WRITABLE } else { Interest::READABLE }
}

/// Adds `fd` to the epoll set (or, if epoll still holds it, changes its
/// registration).
fn add(registry: &Registry, fd: RawFd, token: Token, interest: Interest) {
    if registry.register(&mut SourceFd(&fd), token, interest).is_err() {
        let _ = registry.reregister(&mut SourceFd(&fd), token, interest);
    }
}

/// Time to sleep until the earliest of `deadlines` (at most [`MAX_SLEEP`]).
pub(crate) fn sleep_for(deadlines: impl IntoIterator<Item = Option<Instant>>) -> Duration {
    let now = Instant::now();
    deadlines.into_iter().flatten().map(|d| d.saturating_duration_since(now)).fold(MAX_SLEEP, Duration::min)
}

/// The running engine.
pub(crate) enum Engine {
    Threaded(threaded::Threaded),
    Polled(polled::Polled),
}

impl Engine {
    pub fn start(shared: &Arc<Shared>, progress: crate::Progress, spin: Duration) -> std::io::Result<Engine> {
        Ok(match progress {
            crate::Progress::Threaded => Engine::Threaded(threaded::Threaded::start(shared.clone(), spin)?),
            crate::Progress::Polled => Engine::Polled(polled::Polled::start(shared.clone(), spin)?),
        })
    }

    /// Blocks until `done` (checked with the shared state locked) or
    /// `deadline`; returns `done`.
    pub fn wait_until(&self, shared: &Shared, done: &mut Done<'_>, deadline: Option<Instant>) -> bool {
        self.wait_for(shared, done, deadline, None)
    }

    /// [`Engine::wait_until`] for what rank `awaited` will send or take
    /// (none: unknown, or any rank): a wait for a peer that last ran on
    /// this thread's CPU yields between all its rounds ([`SpinPlan`]).
    pub fn wait_for(
        &self,
        shared: &Shared,
        done: &mut Done<'_>,
        deadline: Option<Instant>,
        awaited: Option<u32>,
    ) -> bool {
        // A wait ends a burst of `isend`s: what they left is written now
        // (also when what it waits for is done already).
        if shared.burst.load(Ordering::Relaxed) > 0 && shared.burst.swap(0, Ordering::Relaxed) > 0 {
            shared.flush_deferred();
        }
        match self {
            Engine::Threaded(t) => t.wait_until(shared, done, deadline, awaited),
            Engine::Polled(p) => p.wait_until(shared, done, deadline, awaited),
        }
    }

    /// True if the loop will run soon without being woken: an application
    /// wait ended a moment ago (within the hand-off, while the background
    /// keeps off) and no thread sleeps in the engine. Output queued
    /// without a wake-up is then written within the hand-off at worst.
    /// `now`: a clock reading the caller took a moment ago.
    pub fn runs_soon(&self, now: Instant) -> bool {
        match self {
            Engine::Threaded(t) => t.runs_soon(now),
            Engine::Polled(p) => p.runs_soon(now),
        }
    }

    /// Gets a waiter out of the polled loop's epoll wait (the threaded
    /// engine's waiters sleep on `done_cv`, which the caller notifies).
    pub fn wake(&self) {
        if let Engine::Polled(p) = self {
            p.wake();
        }
    }

    pub fn stop(&mut self, shared: &Shared) {
        shared.shutdown.store(true, std::sync::atomic::Ordering::Release);
        for i in 0..shared.slots.len() {
            shared.wake_slot(i);
        }
        match self {
            Engine::Threaded(t) => t.join(),
            Engine::Polled(p) => p.join(),
        }
    }
}
