//! One IO thread per rail. Each thread owns an epoll set with its rail's
//! socket and a waker; application threads sleep on a condition variable
//! until the IO threads complete their requests.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::{Events, Poll, Token};

use super::{MioWaker, Registration, sleep_for};
use crate::shared::Shared;

const WAKE: Token = Token(usize::MAX);
const RAIL: Token = Token(0);

pub(crate) struct Threaded {
    threads: Vec<JoinHandle<()>>,
}

impl Threaded {
    pub fn start(shared: Arc<Shared>) -> std::io::Result<Threaded> {
        let mut threads = Vec::new();
        for i in 0..shared.slots.len() {
            let poll = Poll::new()?;
            let waker = Arc::new(MioWaker(mio::Waker::new(poll.registry(), WAKE)?));
            *shared.slots[i].waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(waker);
            let sh = shared.clone();
            let name = format!("mr-rail-{}.{}", shared.slots[i].peer, shared.slots[i].rail);
            threads.push(std::thread::Builder::new().name(name).spawn(move || rail_loop(&sh, i, poll))?);
        }
        Ok(Threaded { threads })
    }

    pub fn join(&mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn rail_loop(shared: &Shared, i: usize, mut poll: Poll) {
    let mut events = Events::with_capacity(8);
    let mut reg = Registration::default();
    while !shared.shutdown.load(Ordering::Acquire) {
        let timers = shared.run_timers();
        let st = shared.service(i);
        reg.update(poll.registry(), RAIL, shared, i, &st);
        if st.more || shared.slots[i].wake_pending.load(Ordering::Acquire) {
            continue;
        }
        let timeout = sleep_for([timers, st.deadline]);
        if let Err(e) = poll.poll(&mut events, Some(timeout)) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::error!("epoll failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Sleeps until `done()` (checked whenever requests complete) or `deadline`.
pub(crate) fn wait_until(shared: &Shared, done: &mut dyn FnMut() -> bool, deadline: Option<Instant>) -> bool {
    loop {
        if done() {
            return true;
        }
        let g = shared.lock();
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            drop(g);
            return done();
        }
        // Bounded so a completion signalled between `done()` and the wait
        // costs at most this long.
        let t = deadline.map_or(Duration::from_millis(5), |d| (d - now).min(Duration::from_millis(5)));
        drop(shared.done_cv.wait_timeout(g, t));
    }
}
