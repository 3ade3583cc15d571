//! One epoll loop over all rails. The thread that waits for a request runs
//! the loop itself (no hand-off between threads on the latency path); a
//! background thread runs it when nobody waits, so probes, ACKs and
//! rendezvous replies keep flowing while the application computes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::{Events, Poll, Token};

use super::{Done, MioWaker, Registration, sleep_for};
use crate::shared::Shared;

const WAKE: Token = Token(usize::MAX);

/// Direct reads while spinning only up to this many slots (peers x rails):
/// each costs a `read` per round, where `epoll_wait` covers any number.
const DIRECT_MAX_SLOTS: usize = 4;
/// A spinning loop still runs `epoll_wait` every this many rounds (for
/// events of slots that are not read directly, e.g. not yet connected).
const DIRECT_EPOLL_EVERY: u32 = 64;
/// A spinning round may be skipped ([`PollState::quiet_round`]) at most
/// this many times in a row: a full round (reads, the rails' own checks
/// for a dead peer, `epoll_wait` now and then) still comes that often.
const QUIET_MAX: u32 = 16;

/// After an application wait ends, the background thread keeps off the
/// loop this long (the application usually waits again soon).
const HANDOFF: Duration = Duration::from_millis(2);
/// How often the background thread looks whether an application thread
/// still runs the loop.
const IDLE_LOOK: Duration = Duration::from_millis(4);

pub(super) struct PollState {
    poll: Poll,
    events: Events,
    regs: Vec<Registration>,
    /// Slots whose read budget ran out.
    more: Vec<bool>,
    /// When timers (the core's, the rails') next need running; `None` =
    /// recompute. Cached so a busy-polling thread does not walk every rail's
    /// timers on every spin.
    next_timer: Option<Instant>,
    /// When timers last ran plus [`TIMER_AFTER_WORK`] (the earliest they
    /// run again after work; an instant, so each round compares rather
    /// than subtracts), and whether work was done since.
    timers_at: Option<Instant>,
    worked: bool,
    /// Slots epoll reported (kept to avoid an allocation per round).
    ready: Vec<usize>,
    /// Slots to look at first in the next round (scratch).
    todo: Vec<usize>,
    /// Slots whose read budget ran out (`more`), to service again.
    more_list: Vec<usize>,
    /// Slots that asked to be serviced again at a time (delayed or
    /// rate-limited frames of the fault-injecting rail): (when, slot).
    due: Vec<(Instant, usize)>,
    /// Slots whose rails are read on every round and armed before a sleep
    /// (shared memory: no readiness while we are awake), and membership.
    spin: Vec<usize>,
    is_spin: Vec<bool>,
    /// Few connections and a spinning waiter: every connected slot is read
    /// directly on every round, like shared memory, and a spinning round
    /// skips `epoll_wait` (most of the time): a message that arrives costs
    /// one `read` instead of `epoll_wait` + `read`.
    direct: bool,
    /// Spinning rounds since `epoll_wait` last ran.
    skipped: u32,
    /// Slots read directly because of `direct` (sockets, not shared
    /// memory): a spinning waiter takes them out of the epoll set
    /// ([`super::Registration::park`]); and the slots it took out.
    parkable: Vec<bool>,
    parked: Vec<usize>,
    /// Spinning rounds skipped in a row ([`PollState::quiet_round`]).
    quiet: u32,
}

use super::{TIMER_AFTER_WORK, TIMER_RECHECK};

impl PollState {
    /// The state of a loop over `n` slots that polls `poll`; `spins`: its
    /// runs are mostly spinning rounds (reads few connections directly).
    pub(super) fn new(poll: Poll, n: usize, spins: bool) -> PollState {
        PollState {
            poll,
            events: Events::with_capacity(64),
            regs: vec![Registration::default(); n],
            more: vec![false; n],
            next_timer: None,
            timers_at: None,
            worked: false,
            ready: Vec::new(),
            todo: Vec::new(),
            more_list: Vec::new(),
            due: Vec::new(),
            spin: Vec::new(),
            is_spin: vec![false; n],
            direct: spins && n <= DIRECT_MAX_SLOTS,
            skipped: 0,
            parkable: vec![false; n],
            parked: Vec::new(),
            quiet: 0,
        }
    }

    /// Whether a spinning round at `now` would certainly do nothing, so
    /// the waiter may skip it: every slot is read directly and says it
    /// has nothing ([`Shared::quiet`]; only shared memory can tell, so
    /// socket rails always get their round), no slot was woken or has more
    /// to read or is due, no timer is due (nor the run of timers that
    /// follows work), and fewer than [`QUIET_MAX`] rounds were skipped in
    /// a row. An empty round of the full loop costs about 1000
    /// instructions; a skipped one about 300, this check about 100 of
    /// them (callgrind, 8 B ping-pong over `shm`).
    fn quiet_round(&self, shared: &Shared, now: Instant) -> bool {
        self.quiet < QUIET_MAX
            && self.direct
            && !self.timers_due(now)
            && self.more_list.is_empty()
            && self.due.is_empty()
            && !self.spin.is_empty()
            && !(0..shared.rail_count()).any(|r| shared.any_woken(r))
            && self.all_read_directly()
            && self.spin.iter().all(|&i| shared.quiet(i))
    }

    /// Timers are to run at `now`: one is due (or none is known yet), or
    /// work was done since they last ran and that was at least
    /// `TIMER_AFTER_WORK` ago (a busy loop does not walk every timer for
    /// every message).
    fn timers_due(&self, now: Instant) -> bool {
        let after_work = self.worked && self.timers_at.is_none_or(|t| now >= t);
        after_work || self.next_timer.is_none_or(|t| now >= t)
    }

    /// Every connected slot is read directly on each round (shared memory,
    /// or a socket a spinning waiter took out of the epoll set): epoll
    /// has nothing to tell but now and then.
    fn all_read_directly(&self) -> bool {
        (0..self.regs.len()).all(|i| self.is_spin[i] || !self.regs[i].registered())
    }
}

struct Loop {
    state: Mutex<PollState>,
    waker: Arc<MioWaker>,
    waiters: AtomicUsize,
    last_wait: super::LastWait,
}

pub(crate) struct Polled {
    lp: Arc<Loop>,
    /// How long a waiting thread polls without sleeping (busy-polls)
    /// before it blocks in epoll.
    spin: Duration,
    bg: Option<JoinHandle<()>>,
}

impl Polled {
    /// Gets whoever runs the loop out of its epoll wait.
    pub fn wake(&self) {
        let _ = self.lp.waker.0.wake();
    }

    pub fn start(shared: Arc<Shared>, spin: Duration) -> std::io::Result<Polled> {
        let poll = Poll::new()?;
        let waker = Arc::new(MioWaker(mio::Waker::new(poll.registry(), WAKE)?));
        for (i, s) in shared.slots.iter().enumerate() {
            *s.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(waker.clone());
            shared.wake_slot(i);
        }
        let n = shared.slots.len();
        let lp = Arc::new(Loop {
            state: Mutex::new(PollState::new(poll, n, !spin.is_zero())),
            waker,
            waiters: AtomicUsize::new(0),
            last_wait: super::LastWait::new(),
        });
        let (l2, sh) = (lp.clone(), shared.clone());
        let bg = std::thread::Builder::new().name("mr-progress".into()).spawn(move || background(&l2, &sh))?;
        Ok(Polled { lp, spin, bg: Some(bg) })
    }

    pub fn join(&mut self) {
        self.lp.waker.0.wake().ok();
        if let Some(t) = self.bg.take() {
            let _ = t.join();
        }
    }

    /// See [`super::Engine::runs_soon`]: nobody waits (a waiter may be
    /// asleep in epoll) and the background thread keeps off.
    pub fn runs_soon(&self, now: Instant) -> bool {
        let lp = &self.lp;
        let since = lp.last_wait.since_at(now);
        lp.waiters.load(Ordering::Acquire) == 0 && since < HANDOFF
    }

    pub fn wait_until(
        &self,
        shared: &Shared,
        done: &mut Done<'_>,
        deadline: Option<Instant>,
        awaited: Option<u32>,
    ) -> bool {
        let lp = &self.lp;
        lp.waiters.fetch_add(1, Ordering::AcqRel);
        // One clock reading per round, taken after `done` said no (a wait
        // that is over at once reads none); the round's progress and the
        // end of the wait use it too.
        let mut plan = None;
        let mut last = None;
        // Rounds skipped, counted for `Endpoint::quiet_rounds` when the
        // wait ends (not an atomic add per round).
        let mut quiet = 0;
        let r = loop {
            if done(&mut shared.lock()) {
                break true;
            }
            let now = Instant::now();
            last = Some(now);
            let plan = *plan.get_or_insert_with(|| super::SpinPlan::new(shared, self.spin, awaited, now));
            let spin_until = plan.until;
            if deadline.is_some_and(|d| now >= d) {
                break done(&mut shared.lock());
            }
            match lp.state.try_lock() {
                Ok(mut st) if now < spin_until && st.quiet_round(shared, now) => {
                    st.quiet += 1;
                    drop(st);
                    quiet += 1;
                    super::spin_pause(shared, &plan, now);
                }
                Ok(mut st) => {
                    st.quiet = 0;
                    let cap = if now < spin_until {
                        Duration::ZERO
                    } else {
                        deadline.map_or(Duration::from_millis(10), |d| (d - now).min(Duration::from_millis(10)))
                    };
                    {
                        let _running = super::Running::enter::<MioWaker>(&lp.waker);
                        progress(shared, &mut st, cap, now);
                    }
                    if cap.is_zero() {
                        drop(st);
                        super::spin_pause(shared, &plan, now);
                    }
                }
                Err(_) => {
                    // Another thread runs the loop: get it out of epoll
                    // and wait for its completions.
                    lp.waker.0.wake().ok();
                    let mut g = shared.lock();
                    if !done(&mut g) {
                        drop(shared.wait_done(g, Duration::from_micros(200)));
                    }
                }
            }
        };
        if quiet > 0 {
            shared.quiet_rounds.fetch_add(quiet, Ordering::Relaxed);
        }
        match last {
            Some(t) => lp.last_wait.mark_at(t),
            None => lp.last_wait.mark(),
        }
        lp.waiters.fetch_sub(1, Ordering::AcqRel);
        r
    }
}

fn background(lp: &Loop, shared: &Shared) {
    while !shared.shutdown.load(Ordering::Acquire) {
        let since = lp.last_wait.since();
        if lp.waiters.load(Ordering::Acquire) > 0 {
            // An application thread runs the loop. Look again now and
            // then (each look is a wake-up; with many ranks per core they
            // add up).
            std::thread::sleep(IDLE_LOOK);
            continue;
        }
        if since < HANDOFF {
            std::thread::sleep(HANDOFF - since);
            continue;
        }
        let Ok(mut st) = lp.state.lock() else { return };
        {
            let _running = super::Running::enter::<MioWaker>(&lp.waker);
            progress(shared, &mut st, super::MAX_SLEEP, Instant::now());
        }
        drop(st);
        if lp.waiters.load(Ordering::Acquire) > 0 && shared.done_waiters.load(Ordering::Acquire) > 0 {
            // Let the waiting thread take the loop.
            shared.done_cv.notify_all();
        }
    }
}

/// One round: service rails that need it, then wait for readiness (at
/// most `cap`), then service what became ready and run timers. `now`: a
/// clock reading the caller took just before (timers are judged by it; a
/// spinning waiter reads the clock once per round, not twice).
pub(super) fn progress(shared: &Shared, st: &mut PollState, cap: Duration, now: Instant) {
    let n = shared.slots.len();
    let mut busy = false;
    // Slots with more to read, then slots woken for output.
    let mut todo = std::mem::take(&mut st.todo);
    todo.clear();
    todo.append(&mut st.more_list);
    for r in 0..shared.rail_count() {
        shared.take_woken(r, &mut todo);
    }
    // A round that received frames does not sleep: they may be what the
    // waiter waits for, and only the caller checks that. (Without this, a
    // waiter that read its message from a shared-memory ring here, in the
    // round that ends in a sleep, slept on until the next timer: with the
    // spin off, 8 B shm ping-pong took 185 us instead of 20.)
    for &i in &todo {
        if st.more[i] || shared.slots[i].wake_pending.load(Ordering::Acquire) {
            busy |= service(shared, st, i, Some(now));
            busy |= st.more[i];
            st.worked = true;
        }
    }
    // Rails without readiness while we are awake: look at each.
    // (Not counted as work: an empty ring is the common case.)
    // (A slot whose connection failed leaves the list as it is serviced.)
    let mut k = 0;
    while let Some(&i) = st.spin.get(k) {
        busy |= service(shared, st, i, Some(now));
        busy |= st.more[i];
        if st.spin.get(k) == Some(&i) {
            k += 1;
        }
    }
    // Timers run when due; after work (which may have armed an earlier
    // one) at most every TIMER_AFTER_WORK, so a busy loop does not walk
    // every timer for every message.
    if st.timers_due(now) {
        let timers = shared.run_timers();
        st.next_timer = Some(now + sleep_for([timers]).min(TIMER_RECHECK));
        st.timers_at = Some(now + TIMER_AFTER_WORK);
        st.worked = false;
    }
    // Rails that asked to be looked at again by now (held frames of the
    // fault-injecting rail).
    if st.due.iter().any(|&(d, _)| d <= now) {
        let due: Vec<usize> = st.due.iter().filter(|&&(d, _)| d <= now).map(|&(_, i)| i).collect();
        st.due.retain(|&(d, _)| d > now);
        for i in due {
            service(shared, st, i, None);
        }
    }
    let next_due = st.due.iter().map(|&(d, _)| d).min();
    // Output queued meanwhile (this thread does not wake itself): no sleep.
    let pending = (0..shared.rail_count()).any(|r| shared.any_woken(r));
    let timeout = if busy || pending {
        Duration::ZERO
    } else {
        [st.next_timer, next_due]
            .into_iter()
            .flatten()
            .map(|t| t.saturating_duration_since(now))
            .fold(cap, Duration::min)
    };
    // Before sleeping, spin-polled rails must ask for a wake-up; one
    // that has something already cancels the sleep.
    let timeout = if !timeout.is_zero() && st.spin.iter().any(|&i| shared.arm(i)) { Duration::ZERO } else { timeout };
    st.todo = todo;
    if !timeout.is_zero() {
        // Sockets a spinning waiter took out of the set go back in first.
        let PollState { poll, regs, parked, .. } = &mut *st;
        for i in parked.drain(..) {
            regs[i].unpark(poll.registry(), Token(i));
        }
    } else if cap.is_zero() && st.direct {
        // A spinning waiter reads these on every round: out of the set.
        for i in 0..n {
            if st.parkable[i] && st.regs[i].registered() {
                st.regs[i].park(st.poll.registry());
                st.parked.push(i);
            }
        }
    }
    // Spinning with every connected slot read directly (above): nothing
    // for epoll to tell, except now and then.
    if timeout.is_zero() && st.direct && st.skipped < DIRECT_EPOLL_EVERY && st.all_read_directly() {
        st.skipped += 1;
        return;
    }
    st.skipped = 0;
    let PollState { poll, events, ready, .. } = st;
    if let Err(e) = poll.poll(events, Some(timeout)) {
        if e.kind() != std::io::ErrorKind::Interrupted {
            tracing::error!("epoll failed: {e}");
        }
        return;
    }
    if !timeout.is_zero() && events.is_empty() {
        shared.sleep_timeouts.fetch_add(1, Ordering::Relaxed);
    }
    ready.clear();
    ready.extend(events.iter().map(|e| e.token().0).filter(|&t| t < n));
    for r in 0..shared.rail_count() {
        shared.take_woken(r, ready);
    }
    for k in 0..st.ready.len() {
        let i = st.ready[k];
        // After `epoll_wait`, which may have slept: the clock anew.
        service(shared, st, i, None);
        st.worked = true;
    }
}

/// Services slot `i`; true if frames arrived. `at`: the round's clock
/// reading, if it was taken a moment ago ([`Shared::service_at`]).
pub(super) fn service(shared: &Shared, st: &mut PollState, i: usize, at: Option<Instant>) -> bool {
    let s = shared.service_at(i, at);
    if s.more && !st.more[i] {
        st.more_list.push(i);
    }
    st.more[i] = s.more;
    st.due.retain(|&(_, j)| j != i);
    if let Some(d) = s.deadline {
        st.due.push((d, i));
    }
    // A socket read directly as well: while the waiter spins, reading it
    // is cheaper than asking epoll first (see `PollState::direct`).
    st.parkable[i] = st.direct && !s.spin && s.fd.is_some();
    let spin = s.spin || st.parkable[i];
    if spin != st.is_spin[i] {
        st.is_spin[i] = spin;
        if spin {
            st.spin.push(i);
        } else {
            st.spin.retain(|&j| j != i);
        }
    }
    st.regs[i].update(st.poll.registry(), Token(i), &s);
    s.received
}
