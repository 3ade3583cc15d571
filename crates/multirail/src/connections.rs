//! Opening, accepting and replacing rail connections.
//!
//! The protocol core decides *which* connections it wants and when
//! ([`multirail_proto::core::connect`]): a rail when a message first needs
//! it, a lost rail again (with backoff), a fresh connection for a rail
//! that stayed suspect. This module does the IO:
//!
//! * one **acceptor** thread waits on every rail listener at once (epoll;
//!   it sleeps until a connection arrives) and runs each handshake on a
//!   short-lived thread, at most [`MAX_HANDSHAKES`] at a time;
//! * one **connector** thread takes the core's requests
//!   ([`multirail_proto::core::Core::poll_connect`]) and runs each attempt
//!   on a short-lived thread (connect with a timeout, then the handshake),
//!   reporting success or failure back to the core.
//!
//! Either side of a pair may open a rail, so two connections for the same
//! rail can race (both ranks send first, or both replace a suspect rail).
//! Each connection carries a **generation**, proposed by its opener as one
//! more than the highest it has seen for that rail. Between two
//! connections, the higher generation wins, and at equal generations the
//! one opened by the lower rank wins ([`ConnId::beats`]). Both ends apply
//! the same rule to the same pair of connections, so both keep the same
//! one; an acceptor that already holds the winner refuses the loser during
//! its handshake (REJECT reason *superseded*).

use std::collections::VecDeque;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use mio::net::TcpListener as MioListener;
use mio::{Events, Interest, Poll, Token, Waker};
use multirail_proto::core::{ConnectFailure, ConnectRequest, RailCaps as CoreCaps};
use multirail_proto::handshake::HandshakeError;
use multirail_transport::fault::FaultRail;
use multirail_transport::tcp::{StreamRail, TcpRail};
use multirail_transport::{Rail, RailCaps};

use crate::bootstrap::{self, Conn, Me};
use crate::shared::Shared;

/// Handshakes in progress at once on the acceptor side (a peer that never
/// finishes its HELLO costs one of these until the handshake timeout).
pub const MAX_HANDSHAKES: usize = 64;
/// Connection attempts in progress at once.
pub const MAX_ATTEMPTS: usize = 64;

const WAKE: Token = Token(usize::MAX);

/// Every rank's rail listener addresses, by rank then (global) rail.
pub(crate) type Addrs = Vec<Vec<std::net::SocketAddr>>;

/// Which connection of a rail this is: see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnId {
    pub generation: u32,
    /// The rank that opened it.
    pub initiator: u32,
}

impl ConnId {
    /// True if `self` wins over `other` for the same rail.
    pub fn beats(&self, other: &ConnId) -> bool {
        self.generation > other.generation || (self.generation == other.generation && self.initiator < other.initiator)
    }
}

/// Requests from the core waiting for the connector thread.
#[derive(Default)]
pub(crate) struct ConnectQueue {
    q: Mutex<VecDeque<ConnectRequest>>,
    cv: Condvar,
}

impl ConnectQueue {
    pub fn push(&self, reqs: Vec<ConnectRequest>) {
        self.q.lock().unwrap_or_else(|e| e.into_inner()).extend(reqs);
        self.cv.notify_one();
    }

    /// The next request, waiting for one; `None` once `stop` is set (the
    /// setter calls [`ConnectQueue::stop`], which wakes this wait).
    fn pop(&self, stop: &AtomicBool) -> Option<ConnectRequest> {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if stop.load(Ordering::Acquire) {
                return None;
            }
            if let Some(r) = q.pop_front() {
                return Some(r);
            }
            q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Sets `stop` and wakes a thread waiting in [`ConnectQueue::pop`].
    /// The flag is set with the queue locked: a `pop` that looked at it
    /// before is waiting by then (it holds the lock from its look to its
    /// wait), so the notification cannot fall between the two. (Until
    /// 2026-12-03 `pop` woke every 200 ms to look, and every
    /// `Endpoint::close` waited for that.)
    pub fn stop(&self, stop: &AtomicBool) {
        let _q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        stop.store(true, Ordering::Release);
        self.cv.notify_all();
    }
}

/// The acceptor and connector threads of an endpoint.
pub(crate) struct Connections {
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    /// Whose connect queue the connector thread waits on.
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Connections {
    pub fn start(
        shared: Arc<Shared>,
        me: Me,
        listeners: Vec<TcpListener>,
        table: Addrs,
    ) -> std::io::Result<Connections> {
        let stop = Arc::new(AtomicBool::new(false));
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
        let mut mio_listeners = Vec::new();
        for (k, l) in listeners.into_iter().enumerate() {
            l.set_nonblocking(true)?;
            let mut ml = MioListener::from_std(l);
            poll.registry().register(&mut ml, Token(k), Interest::READABLE)?;
            mio_listeners.push(ml);
        }
        let mut threads = Vec::new();
        let (sh, m, st) = (shared.clone(), me.clone(), stop.clone());
        threads.push(
            std::thread::Builder::new()
                .name("mr-accept".into())
                .spawn(move || accept_loop(&sh, &m, poll, mio_listeners, &st))?,
        );
        let (sh, st) = (shared.clone(), stop.clone());
        threads.push(
            std::thread::Builder::new().name("mr-connect".into()).spawn(move || connect_loop(&sh, &me, &table, &st))?,
        );
        Ok(Connections { stop, waker, shared, threads })
    }

    pub fn stop(&mut self) {
        self.shared.connect_q.stop(&self.stop);
        let _ = self.waker.wake();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Connections {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A counter of running helper threads, released when the guard drops.
struct Slots(Arc<AtomicUsize>);

impl Slots {
    fn take(counter: &Arc<AtomicUsize>, max: usize) -> Option<Slots> {
        let n = counter.fetch_add(1, Ordering::AcqRel);
        if n >= max {
            counter.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Slots(counter.clone()))
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn accept_loop(shared: &Arc<Shared>, me: &Me, mut poll: Poll, listeners: Vec<MioListener>, stop: &AtomicBool) {
    let mut events = Events::with_capacity(64);
    // Counted in `Shared` too: a closing endpoint waits for them.
    let busy = shared.handshakes.clone();
    while !stop.load(Ordering::Acquire) {
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::error!("rail listeners: {e}; no more incoming connections");
                return;
            }
            continue;
        }
        for ev in events.iter() {
            let k = ev.token().0;
            let Some(l) = listeners.get(k) else { continue };
            // Edge-triggered: take every pending connection.
            loop {
                let (stream, from) = match l.accept() {
                    Ok(x) => x,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        tracing::warn!("rail {k}: accept: {e}");
                        break;
                    }
                };
                let Some(slot) = Slots::take(&busy, MAX_HANDSHAKES) else {
                    tracing::warn!("rail {k}: too many handshakes in progress; dropped a connection from {from}");
                    continue;
                };
                let stream = std::net::TcpStream::from(std::os::fd::OwnedFd::from(stream));
                let (sh, m) = (shared.clone(), me.clone());
                let spawned = std::thread::Builder::new().name(format!("mr-hello-{k}")).spawn(move || {
                    let _slot = slot;
                    accept_one(&sh, &m, k, stream, from);
                });
                if let Err(e) = spawned {
                    tracing::warn!("rail {k}: cannot start a handshake thread: {e}");
                }
            }
        }
    }
}

/// Runs the handshake of one incoming connection and installs it.
fn accept_one(shared: &Shared, me: &Me, k: usize, stream: std::net::TcpStream, from: std::net::SocketAddr) {
    let admit = |p: &multirail_proto::handshake::PeerHello| -> Result<(), HandshakeError> {
        let Some(i) = me.routes.local(p.rank, k).and_then(|l| shared.slot_of(p.rank, l)) else { return Ok(()) };
        let s = &shared.slots[i];
        let candidate = ConnId { generation: p.generation, initiator: p.rank };
        match *s.lock_id() {
            Some(cur) if !candidate.beats(&cur) => Err(HandshakeError::Superseded),
            _ => Ok(()),
        }
    };
    match bootstrap::accept_rail(me, k, stream, admit) {
        // Also while closing: the peer may hold it up already, and
        // `install` ends it with a CLOSE (dropped, it would read as a
        // failed rail there).
        Ok(c) if shared.takes_connection(c.peer) => {
            let (peer, id) = (c.peer, ConnId { generation: c.hello.generation, initiator: c.peer });
            match adopt(shared, me, c, id) {
                Ok(true) => tracing::info!(
                    "rail {k} to rank {peer}: connection from rank {peer} (generation {})",
                    id.generation
                ),
                Ok(false) => tracing::debug!("rail {k} to rank {peer}: a newer connection exists; dropped this one"),
                Err(e) => tracing::warn!("rail {k} to rank {peer}: {e}"),
            }
        }
        Ok(c) => tracing::debug!("rail {k}: rank {} is gone; connection dropped", c.peer),
        Err(e) => tracing::debug!("rail {k}: refused a connection from {from}: {e}"),
    }
}

fn connect_loop(shared: &Arc<Shared>, me: &Me, table: &Addrs, stop: &AtomicBool) {
    let busy = Arc::new(AtomicUsize::new(0));
    while let Some(req) = shared.connect_q.pop(stop) {
        let slot = loop {
            if let Some(s) = Slots::take(&busy, MAX_ATTEMPTS) {
                break s;
            }
            if stop.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let Some(addr) = me.routes.global(req.peer, req.rail).map(|g| table[req.peer as usize][g]) else {
            shared
                .with_core(|c, now| c.connect_failed(req.peer, req.rail, ConnectFailure::Refused, "no such rail", now));
            continue;
        };
        let (sh, m) = (shared.clone(), me.clone());
        let spawned = std::thread::Builder::new().name("mr-dial".into()).spawn(move || {
            let _slot = slot;
            attempt(&sh, &m, req, addr);
        });
        if let Err(e) = spawned {
            tracing::warn!("cannot start a connection thread: {e}");
            shared
                .with_core(|c, now| c.connect_failed(req.peer, req.rail, ConnectFailure::Transient, "no thread", now));
        }
    }
}

/// One connection attempt the core asked for.
fn attempt(shared: &Shared, me: &Me, req: ConnectRequest, addr: std::net::SocketAddr) {
    let Some(i) = shared.slot_of(req.peer, req.rail) else { return };
    // Generations only grow through authenticated peers (`install`), so
    // one that reaches the top stays there rather than wrapping around.
    let generation = shared.slots[i].max_gen.load(Ordering::Acquire).saturating_add(1);
    let (peer, rail) = (req.peer, req.rail);
    let Some(global) = me.routes.global(peer, rail) else { return };
    match bootstrap::connect_rail(me, peer, global, addr, generation) {
        // Closing by now, `install` ends it with a CLOSE (the peer may
        // have installed it).
        Ok(c) => match adopt(shared, me, c, ConnId { generation, initiator: me.rank }) {
            Ok(true) => {
                let what = if req.replace { "replaced a suspect connection" } else { "connected" };
                tracing::info!("rail {global} to rank {peer}: {what} (generation {generation})");
            }
            Ok(false) => {
                tracing::debug!("rail {global} to rank {peer}: a newer connection exists; ours dropped");
                shared.with_core(|c, now| {
                    c.connect_failed(peer, rail, ConnectFailure::Transient, "superseded by another connection", now)
                });
            }
            Err(e) => shared.with_core(|c, now| c.connect_failed(peer, rail, ConnectFailure::Transient, &e, now)),
        },
        Err(e) => {
            tracing::debug!("{}", e.message);
            let how = if e.refused { ConnectFailure::Refused } else { ConnectFailure::Transient };
            shared.with_core(|c, now| c.connect_failed(peer, rail, how, &e.message, now));
        }
    }
}

/// Wraps an authenticated connection (of global rail `c.rail`) in a rail
/// and installs it, unless a better connection for the same rail is
/// there. Returns whether it was installed.
pub(crate) fn adopt(shared: &Shared, me: &Me, c: Conn, id: ConnId) -> Result<bool, String> {
    let cfg = &me.cfg;
    let spec = &cfg.rails[c.rail];
    let bandwidth = spec.bandwidth.unwrap_or(c.hello.bandwidth);
    let peer_addr = c.stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let caps = RailCaps {
        name: format!("{spec} -> {peer_addr}"),
        bandwidth,
        latency: Duration::ZERO,
        max_frame: cfg.proto.limits.max_frame.min(c.hello.max_frame),
    };
    let host_local = spec.is_shm()
        || matches!((c.stream.local_addr(), c.stream.peer_addr()), (Ok(l), Ok(p)) if stays_in_host(l.ip(), p.ip()));
    let fault = cfg.faults.get(c.rail).cloned().flatten();
    // Injected losses or corruption: only the general path finds those.
    let may_lose = fault.as_ref().is_some_and(|f| f.drop > 0.0 || f.corrupt > 0.0);
    // What the rail holds by itself: its window's floor (the shm ring).
    let mut buffer = 0;
    let rail: Box<dyn Rail> = if spec.is_shm() {
        // The peer opened the connection exactly when its rank is the
        // initiator; the opener creates the segment.
        let stream = if id.initiator == c.peer {
            crate::shm_setup::accept(c.stream, cfg.handshake_timeout, cfg.shm_cma)
        } else {
            crate::shm_setup::connect(c.stream, cfg.handshake_timeout, cfg.shm_ring, cfg.shm_cma)
        }
        .map_err(|e| format!("shm rail {} to rank {}: {e}", c.rail, c.peer))?;
        let caps = RailCaps { name: format!("shm -> rank {}", c.peer), ..caps };
        buffer = stream.capacity() as u64;
        let shm = StreamRail::over(stream, caps, cfg.proto.limits);
        match fault {
            Some(f) => Box::new(FaultRail::new(shm, f)),
            None => Box::new(shm),
        }
    } else if matches!(spec.local, multirail_transport::spec::Local::Ofi { .. }) {
        let rail_err = |e: String| format!("rail {} ({spec}) to rank {}: {e}", c.rail, c.peer);
        let target = spec
            .resolve()
            .map(|r| spec.ofi_target(&r))
            .map_err(rail_err)?
            .ok_or_else(|| rail_err("not an ofi rail".into()))?;
        crate::ofi_setup::open(c.stream, &target, cfg, caps, fault).map_err(rail_err)?
    } else {
        let tcp = TcpRail::new(c.stream, caps, cfg.proto.limits).map_err(|e| e.to_string())?;
        match fault {
            Some(f) => Box::new(FaultRail::new(tcp, f)),
            None => Box::new(tcp),
        }
    };
    let i = me
        .routes
        .local(c.peer, c.rail)
        .and_then(|l| shared.slot_of(c.peer, l))
        .ok_or(format!("no rail {} to rank {}", c.rail, c.peer))?;
    let core_caps = CoreCaps { bandwidth, latency: Duration::ZERO, host_local, buffer, may_lose };
    Ok(shared.install(i, rail, id, core_caps, c.hello.credits))
}

/// Whether a connection never leaves this host: it goes to a loopback
/// address, or from one of the host's addresses to itself (the kernel
/// carries that over `lo` too; so do ranks sharing a testbed host).
fn stays_in_host(local: std::net::IpAddr, peer: std::net::IpAddr) -> bool {
    // A dual-stack socket shows IPv4 peers as ::ffff:a.b.c.d.
    let (local, peer) = (local.to_canonical(), peer.to_canonical());
    peer.is_loopback() || local == peer
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connector thread waiting for requests ends as soon as it is told
    /// to stop, whether it was waiting already or not yet (`pop` has no
    /// timeout to fall back on: without the wake-up it would wait for
    /// good, and this test would fail at its bound).
    #[test]
    fn a_waiting_connector_is_woken_by_stop() {
        for wait_first in [true, false] {
            let q = Arc::new(ConnectQueue::default());
            let stop = Arc::new(AtomicBool::new(false));
            let (tx, rx) = std::sync::mpsc::channel();
            let (q2, stop2) = (q.clone(), stop.clone());
            let t = std::thread::spawn(move || tx.send(q2.pop(&stop2).is_none()).unwrap());
            if wait_first {
                // Most likely waiting in `pop` by now (either order must work).
                std::thread::sleep(Duration::from_millis(20));
            }
            q.stop(&stop);
            let ended = rx.recv_timeout(Duration::from_secs(20));
            assert_eq!(ended, Ok(true), "pop returned None after stop (waiting first: {wait_first})");
            t.join().unwrap();
        }
    }

    /// Whatever order two ends see two connections in, they keep the same.
    #[test]
    fn both_ends_keep_the_same_connection() {
        let ids = [
            ConnId { generation: 1, initiator: 0 },
            ConnId { generation: 1, initiator: 1 },
            ConnId { generation: 2, initiator: 1 },
            ConnId { generation: 2, initiator: 0 },
            ConnId { generation: 3, initiator: 1 },
        ];
        let keep = |order: &[ConnId]| {
            let mut cur: Option<ConnId> = None;
            for id in order {
                if cur.is_none_or(|c| id.beats(&c)) {
                    cur = Some(*id);
                }
            }
            cur
        };
        for a in 0..ids.len() {
            for b in 0..ids.len() {
                if a != b {
                    let (x, y) = (ids[a], ids[b]);
                    assert_eq!(keep(&[x, y]), keep(&[y, x]), "{x:?} vs {y:?}");
                }
            }
        }
        let mut all = ids.to_vec();
        let want = keep(&all);
        all.reverse();
        assert_eq!(keep(&all), want);
        assert_eq!(want, Some(ConnId { generation: 3, initiator: 1 }));
        assert!(ConnId { generation: 1, initiator: 0 }.beats(&ConnId { generation: 1, initiator: 1 }));
        assert!(!ConnId { generation: 1, initiator: 1 }.beats(&ConnId { generation: 1, initiator: 1 }), "not itself");
    }

    #[test]
    fn a_connection_stays_in_the_host_over_loopback_or_from_an_address_to_itself() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert!(stays_in_host(ip("127.0.0.1"), ip("127.0.0.2")));
        assert!(stays_in_host(ip("::1"), ip("::1")));
        assert!(stays_in_host(ip("::ffff:10.9.0.1"), ip("::ffff:127.0.0.1")), "IPv4 on a dual-stack socket");
        assert!(stays_in_host(ip("10.9.0.1"), ip("10.9.0.1")), "ranks sharing a host's address");
        assert!(!stays_in_host(ip("10.9.0.1"), ip("10.9.0.2")), "another host");
        assert!(!stays_in_host(ip("fd00::1"), ip("fd00::2")));
    }
}
