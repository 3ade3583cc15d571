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
    let mut events = Events::with_capacity(64);
    let mut regs = vec![Registration::default(); mine.len()];
    // The same connections in the waiting threads' set (reading only).
    let mut app_regs = vec![Registration::default(); mine.len()];
    let mut more = vec![false; mine.len()];
    let mut ready = Vec::new();
    while !shared.shutdown.load(Ordering::Acquire) {
        let next_timer = shared.run_timers();
        let mut busy = false;
        let mut deadline: Option<Instant> = None;
        for (j, &i) in mine.iter().enumerate() {
            if more[j] || ready.contains(&j) || shared.slots[i].wake_pending.load(Ordering::Acquire) {
                let st = shared.service(i);
                regs[j].update(poll.registry(), Token(j), &st);
                app_regs[j].update(app, Token(i), &Serviced { want_write: false, ..st });
                more[j] = st.more;
                busy |= st.more;
                deadline = match (deadline, st.deadline) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
        ready.clear();
        if busy || mine.iter().any(|&i| shared.slots[i].wake_pending.load(Ordering::Acquire)) {
            continue;
        }
        let timeout = sleep_for([next_timer, deadline]);
        if let Err(e) = poll.poll(&mut events, Some(timeout)) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::error!("epoll failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        ready.extend(events.iter().map(|e| e.token().0).filter(|&j| j < mine.len()));
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
