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
                threads.push(std::thread::Builder::new().name(format!("mr-accept-{k}")).spawn(move || accept_loop(&sh, &me, k, l, &st))?);
            }
        }
        if me.rank > 0 {
            let (sh, st) = (shared, stop.clone());
            threads.push(std::thread::Builder::new().name("mr-reconnect".into()).spawn(move || reconnect_loop(&sh, &me, &table, &st))?);
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

fn reconnect_loop(shared: &Arc<Shared>, me: &Me, table: &Table, stop: &AtomicBool) {
    let first = me.cfg.reconnect.unwrap_or(Duration::from_millis(100));
    // slot -> (next attempt, current backoff)
    let mut plan: HashMap<usize, (Instant, Duration)> = HashMap::new();
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(TICK);
        for (i, s) in shared.slots.iter().enumerate() {
            if s.peer >= me.rank || s.lock_conn().is_some() {
                plan.remove(&i);
                continue;
            }
            if !shared.peer_wanted(s.peer) {
                continue;
            }
            let now = Instant::now();
            let (at, backoff) = plan.entry(i).or_insert((now + first, first));
            if now < *at {
                continue;
            }
            match bootstrap::connect_rail(me, s.peer, s.rail, table[s.peer as usize][s.rail]) {
                Ok(c) => match install(shared, &me.cfg, c) {
                    Ok(()) => {
                        tracing::info!("rail {} to rank {} reconnected", s.rail, s.peer);
                        plan.remove(&i);
                    }
                    Err(e) => tracing::warn!("rail {} to rank {}: {e}", s.rail, s.peer),
                },
                Err(e) => {
                    tracing::debug!("reconnect failed, next try in {:?}: {e}", *backoff * 2);
                    *backoff = (*backoff * 2).min(me.cfg.reconnect_max);
                    *at = now + *backoff;
                }
            }
        }
    }
}
