//! Bringing failed rails back. The rank that connected a rail at setup
//! (the higher rank) reconnects it with exponential backoff; the other
//! side keeps its rail listeners open and installs whatever authenticated
//! connection arrives. A rejoined rail re-enters the schedule at once.

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::bootstrap::{self, Me, Table};
use crate::endpoint::install;
use crate::shared::Shared;

/// How often the threads look at the rails.
const TICK: Duration = Duration::from_millis(20);
/// A rail that fails again within this time of reconnecting counts as
/// flapping: its backoff keeps growing instead of starting over.
const STABLE: Duration = Duration::from_secs(2);
/// Handshakes in progress at once per listener (a peer that never
/// finishes its HELLO costs one of these until the handshake timeout).
const MAX_HANDSHAKES: usize = 16;

pub(crate) struct Recovery {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Recovery {
    pub fn start(shared: Arc<Shared>, me: Me, listeners: Vec<TcpListener>, table: Table) -> std::io::Result<Recovery> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        if me.rank + 1 < me.size {
            for (k, l) in listeners.into_iter().enumerate() {
                let (sh, me, st) = (shared.clone(), me.clone(), stop.clone());
                threads.push(
                    std::thread::Builder::new()
                        .name(format!("mr-accept-{k}"))
                        .spawn(move || accept_loop(&sh, &me, k, l, &st))?,
                );
            }
        }
        if me.rank > 0 {
            let (sh, st) = (shared, stop.clone());
            threads.push(
                std::thread::Builder::new()
                    .name("mr-reconnect".into())
                    .spawn(move || reconnect_loop(&sh, &me, &table, &st))?,
            );
        }
        Ok(Recovery { stop, threads })
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Recovery {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(shared: &Arc<Shared>, me: &Me, k: usize, l: TcpListener, stop: &AtomicBool) {
    if let Err(e) = l.set_nonblocking(true) {
        tracing::error!("rail {k}: listener unusable, no reconnections: {e}");
        return;
    }
    let busy = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Acquire) {
        let (stream, from) = match l.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(TICK);
                continue;
            }
            Err(e) => {
                tracing::warn!("rail {k}: accept: {e}");
                std::thread::sleep(TICK);
                continue;
            }
        };
        if busy.load(Ordering::Acquire) >= MAX_HANDSHAKES {
            tracing::warn!("rail {k}: too many handshakes in progress; dropped a connection from {from}");
            continue;
        }
        busy.fetch_add(1, Ordering::AcqRel);
        let (sh, me, b) = (shared.clone(), me.clone(), busy.clone());
        let spawned = std::thread::Builder::new().name(format!("mr-hello-{k}")).spawn(move || {
            match bootstrap::accept_rail(&me, k, stream) {
                Ok(c) if sh.peer_wanted(c.peer) => {
                    let peer = c.peer;
                    match install(&sh, &me.cfg, c) {
                        Ok(()) => tracing::info!("rail {k} to rank {peer} rejoined"),
                        Err(e) => tracing::warn!("rail {k} to rank {peer}: {e}"),
                    }
                }
                Ok(c) => tracing::debug!("rail {k}: rank {} is gone; connection dropped", c.peer),
                Err(e) => tracing::warn!("rail {k}: refused a connection from {from}: {e}"),
            }
            b.fetch_sub(1, Ordering::AcqRel);
        });
        if spawned.is_err() {
            busy.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Reconnection state of one rail.
struct Backoff {
    /// When to try next (set once the rail is seen down).
    next: Option<Instant>,
    /// Current delay between attempts.
    delay: Duration,
    /// When the rail last came back up.
    since: Option<Instant>,
}

fn reconnect_loop(shared: &Arc<Shared>, me: &Me, table: &Table, stop: &AtomicBool) {
    let first = me.cfg.reconnect.unwrap_or(Duration::from_millis(100));
    let mut backoffs: HashMap<usize, Backoff> = HashMap::new();
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(TICK);
        for (i, s) in shared.slots.iter().enumerate() {
            if s.peer >= me.rank || !shared.peer_wanted(s.peer) {
                continue;
            }
            let now = Instant::now();
            let b = backoffs.entry(i).or_insert(Backoff { next: None, delay: first, since: None });
            if s.lock_conn().is_some() {
                if b.since.is_some_and(|t| now.duration_since(t) >= STABLE) {
                    *b = Backoff { next: None, delay: first, since: None };
                }
                continue;
            }
            // Down: schedule the next attempt, later each time it fails or flaps.
            let at = *b.next.get_or_insert_with(|| {
                let flapping = b.since.is_some_and(|t| now.duration_since(t) < STABLE);
                if flapping {
                    b.delay = (b.delay * 2).min(me.cfg.reconnect_max);
                }
                now + b.delay
            });
            if now < at {
                continue;
            }
            match bootstrap::connect_rail(me, s.peer, s.rail, table[s.peer as usize][s.rail]) {
                Ok(c) => match install(shared, &me.cfg, c) {
                    Ok(()) => {
                        tracing::info!("rail {} to rank {} reconnected", s.rail, s.peer);
                        b.next = None;
                        b.since = Some(Instant::now());
                    }
                    Err(e) => tracing::warn!("rail {} to rank {}: {e}", s.rail, s.peer),
                },
                Err(e) => {
                    b.delay = (b.delay * 2).min(me.cfg.reconnect_max);
                    b.next = Some(now + b.delay);
                    tracing::debug!("reconnect failed, next try in {:?}: {e}", b.delay);
                }
            }
        }
    }
}
