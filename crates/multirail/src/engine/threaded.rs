//! One IO thread per rail, as the NPC'09 uDAPL study recommends for
//! several HCAs: thread `k` owns an epoll set with rail `k`'s connection to
//! every peer and a waker. Every IO thread runs the protocol timers that
//! are due when it wakes (a timer armed by its own work is seen on its
//! next turn).
//!
//! A thread waiting for a request does not just sleep until an IO thread
//! wakes from epoll and completes it (a thread wake-up costs tens of
//! microseconds): for `MULTIRAIL_SPIN_US` it polls a second epoll set, which
//! the IO threads keep registered with every connection, and reads what
//! arrives itself when the connection is free. Then it sleeps on a
//! condition variable.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::{Events, Poll, Token};

use super::{MioWaker, Registration, sleep_for};
use crate::shared::{Inner, Serviced, Shared};

const WAKE: Token = Token(usize::MAX);

pub(crate) struct Threaded {
    threads: Vec<JoinHandle<()>>,
    /// The waiting threads' epoll set (one of them polls it at a time).
    app: Mutex<(Poll, Events)>,
    spin: Duration,
}

impl Threaded {
    pub fn start(shared: Arc<Shared>, spin: Duration) -> std::io::Result<Threaded> {
        let rails = shared.slots.iter().map(|s| s.rail + 1).max().unwrap_or(0);
        let app = Poll::new()?;
        let mut threads = Vec::new();
        for k in 0..rails.max(1) {
            let mine: Vec<usize> = (0..shared.slots.len()).filter(|&i| shared.slots[i].rail == k).collect();
            let poll = Poll::new()?;
            let waker = Arc::new(MioWaker(mio::Waker::new(poll.registry(), WAKE)?));
            for &i in &mine {
                *shared.slots[i].waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(waker.clone());
            }
            let sh = shared.clone();
            let name = format!("mr-rail-{k}");
            let w = waker.clone();
            let app_registry = app.registry().try_clone()?;
            threads.push(
                std::thread::Builder::new().name(name).spawn(move || rail_loop(&sh, &mine, poll, w, &app_registry))?,
            );
        }
        Ok(Threaded { threads, app: Mutex::new((app, Events::with_capacity(64))), spin })
    }

    /// Waits until `done` (checked with the shared state locked) or
    /// `deadline`: polls the connections itself for the spin time, then
    /// sleeps until the IO threads complete something.
    pub fn wait_until(&self, shared: &Shared, done: &mut dyn FnMut(&Inner) -> bool, deadline: Option<Instant>) -> bool {
        let spin_until = Instant::now() + self.spin;
        loop {
            if done(&shared.lock()) {
                return true;
            }
            let now = Instant::now();
            if now >= spin_until || deadline.is_some_and(|d| now >= d) {
                break;
            }
            let Ok(mut app) = self.app.try_lock() else {
                std::hint::spin_loop();
                continue;
            };
            let (poll, events) = &mut *app;
            if poll.poll(events, Some(Duration::ZERO)).is_err() {
                break;
            }
            for e in events.iter() {
                shared.service_if_free(e.token().0);
            }
        }
        sleep_until(shared, done, deadline)
    }

    pub fn join(&mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn rail_loop(shared: &Shared, mine: &[usize], mut poll: Poll, waker: Arc<MioWaker>, app: &mio::Registry) {
    let _running = super::Running::enter(&waker);
    let Some(&first) = mine.first() else { return };
    let rail = shared.slots[first].rail;
    let rails = shared.rail_count();
    let mut events = Events::with_capacity(64);
    let mut regs = vec![Registration::default(); mine.len()];
    // The same connections in the waiting threads' set (reading only).
    let mut app_regs = vec![Registration::default(); mine.len()];
    let mut more = vec![false; mine.len()];
    // Slots (by position in `mine`) to look at: ready, woken, with more
    // to read, or due (held frames of the fault-injecting rail).
    let mut todo: Vec<usize> = Vec::new();
    let mut woken: Vec<usize> = Vec::new();
    let mut due: Vec<(Instant, usize)> = Vec::new();
    let mut next_timer: Option<Instant> = None;
    let mut timers_at: Option<Instant> = None;
    let mut worked = false;
    while !shared.shutdown.load(Ordering::Acquire) {
        // Timers when due; after work at most every TIMER_AFTER_WORK (as
        // the polled engine does), not on every turn of the loop.
        let now = Instant::now();
        let after_work = worked && timers_at.is_none_or(|t| now.duration_since(t) >= super::TIMER_AFTER_WORK);
        if after_work || next_timer.is_none_or(|t| now >= t) {
            next_timer = shared.run_timers().map(|t| t.min(now + super::TIMER_RECHECK));
            timers_at = Some(now);
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
            app_regs[j].update(app, Token(i), &Serviced { want_write: false, ..st });
            more[j] = st.more;
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
        if let Err(e) = poll.poll(&mut events, Some(timeout)) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::error!("epoll failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        todo.extend(events.iter().map(|e| e.token().0).filter(|&j| j < mine.len()));
    }
}

/// Sleeps until `done` (checked whenever requests complete) or `deadline`.
fn sleep_until(shared: &Shared, done: &mut dyn FnMut(&Inner) -> bool, deadline: Option<Instant>) -> bool {
    let mut g = shared.lock();
    loop {
        if done(&g) {
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
