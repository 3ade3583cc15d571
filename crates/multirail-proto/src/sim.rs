//! A deterministic network simulator for scenario tests: endpoints
//! ([`Core`]s) joined by simulated rails of given bandwidth and latency,
//! driven by a virtual clock that jumps to the next thing that happens.
//!
//! Each rail direction is a serial link: a frame occupies it for
//! `(header + payload) / bandwidth`, then arrives `latency` later, in
//! order. Like a socket, each link accepts frames while its backlog is
//! below `sockbuf` bytes.
//!
//! The simulator is also the endpoints' driver: it opens the connections
//! their cores ask for ([`Core::poll_connect`]) after a round trip, or
//! fails the attempt (timeout, refusal) when the link or the peer cannot
//! answer. Failures it can stage, as they happen on real links:
//!
//! * [`Sim::kill`]: the connection resets (both ends are told); the link
//!   itself works, so the cores reconnect;
//! * [`Sim::cut`]: the connection resets and the link stays dead;
//! * [`Sim::link_down`] / [`Sim::link_up`]: a silent outage (a cable, a
//!   switch port, `ip link set down`). Nobody is told; frames are held, as
//!   TCP holds and retransmits them, and arrive after the link comes back
//!   (after TCP's backoff, half the outage); connection attempts time out;
//! * [`Sim::blackhole`]: a silent outage whose frames are lost for good;
//! * [`Sim::crash`]: a process dies: its connections reset and new ones are
//!   refused;
//! * [`Sim::pause`]: a process stops (SIGSTOP) and later continues.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use crate::core::{
    Config, ConnectFailure, Core, Event, PeerId, RailCaps, RailId, RecvError, ReqId, SendError, Status, Transmit,
};
use crate::time::Time;
use crate::wire::FrameHeader;

/// Deterministic test bytes: `len` bytes from a generator seeded with
/// `seed` (xorshift), so a receiver can check a payload without a copy of
/// it. Shared by the scenario and end-to-end tests.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Bandwidth and latency of one simulated rail (both directions).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkSpec {
    /// Bytes per second.
    pub bandwidth: f64,
    pub latency: Duration,
}

impl LinkSpec {
    pub fn gbit(gbit: f64, latency_us: u64) -> LinkSpec {
        LinkSpec { bandwidth: gbit * 1e9 / 8.0, latency: Duration::from_micros(latency_us) }
    }
}

/// How long a simulated connection attempt waits for an answer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// The physical state of a link (both directions of one rail of a pair).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phys {
    Up,
    /// Silently down since this time: frames are held.
    Silent(Time),
    /// Silently down, frames lost.
    Black,
}

#[derive(Debug)]
struct Link {
    spec: LinkSpec,
    free_at: Time,
    /// A connection exists (both ends believe the rail is up).
    connected: bool,
    /// Drop every n-th data frame (0 = none).
    drop_every: u64,
    sent: u64,
    /// Connection number: frames of an older connection are dropped.
    epoch: u64,
}

impl Link {
    /// Bytes accepted and not yet on the wire at `now`.
    fn backlog(&self, now: Time) -> f64 {
        self.free_at.as_nanos().saturating_sub(now.as_nanos()) as f64 * self.spec.bandwidth / 1e9
    }
}

/// What is on the wires: frames in flight, and a log of every frame put
/// on a link if asked for ([`Sim::log_wire`]).
#[derive(Default)]
struct Wire {
    arrivals: BinaryHeap<Reverse<Arrival>>,
    order: u64,
    /// Frames put on any link so far (every op).
    frames: u64,
    log: Option<Vec<WireFrame>>,
}

/// A frame put on a link: (from, to, rail, when, header, payload bytes).
pub type WireFrame = (PeerId, PeerId, RailId, Time, FrameHeader, usize);

impl Wire {
    /// Puts frame `t` on `link` (from, to, rail) at `now`: it arrives
    /// after the frames ahead of it and the link's latency, or is dropped
    /// by a lossy link.
    fn put(&mut self, link: &mut Link, (from, to, rail): (PeerId, PeerId, RailId), now: Time, t: Transmit) {
        self.frames += 1;
        if let Some(log) = &mut self.log {
            log.push((from, to, rail, now, t.header, t.payload.len()));
        }
        if t.header.op.carries_data() && link.drop_every > 0 {
            link.sent += 1;
            if link.sent.is_multiple_of(link.drop_every) {
                return;
            }
        }
        let size = (FrameHeader::LEN + t.payload.len()) as f64;
        let start = link.free_at.max(now);
        link.free_at = start + Duration::from_secs_f64(size / link.spec.bandwidth);
        self.order += 1;
        self.arrivals.push(Reverse(Arrival {
            at: link.free_at + link.spec.latency,
            order: self.order,
            to,
            from,
            rail,
            epoch: link.epoch,
            header: t.header,
            payload: t.payload,
        }));
    }
}

#[derive(Debug)]
struct Arrival {
    at: Time,
    order: u64,
    to: PeerId,
    from: PeerId,
    rail: RailId,
    epoch: u64,
    header: FrameHeader,
    payload: Bytes,
}

impl PartialEq for Arrival {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.order) == (o.at, o.order)
    }
}
impl Eq for Arrival {}
impl PartialOrd for Arrival {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Arrival {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(o.at, o.order))
    }
}

/// A connection attempt in progress.
#[derive(Debug, Clone, Copy)]
struct Attempt {
    at: Time,
    from: PeerId,
    to: PeerId,
    rail: RailId,
    outcome: Option<ConnectFailure>,
}

/// A completed request as seen by a test.
#[derive(Debug)]
pub enum Done {
    Send(Result<(), SendError>),
    Recv(Result<Status, RecvError>, BytesMut),
}

/// The simulated network.
pub struct Sim {
    pub now: Time,
    pub nodes: Vec<Core>,
    links: BTreeMap<(PeerId, PeerId, RailId), Link>,
    phys: BTreeMap<(PeerId, PeerId, RailId), Phys>,
    wire: Wire,
    /// Frames that reached a silently-down link, by link, in order.
    held: BTreeMap<(PeerId, PeerId, RailId), Vec<Arrival>>,
    /// Frames that arrived where their receiver does not read now (see
    /// [`Sim::stop_reading`]), by (receiver, sender, rail), in order.
    unread: BTreeMap<(PeerId, PeerId, RailId), Vec<Arrival>>,
    attempts: Vec<Attempt>,
    crashed: Vec<bool>,
    paused_until: Vec<Time>,
    /// Bytes a link accepts ahead of the wire (the socket buffer).
    pub sockbuf: u64,
    stuck: u32,
    /// Completed requests by (node, request).
    pub done: BTreeMap<(PeerId, ReqId), Done>,
    /// Other events by node (rail and peer news).
    pub log: Vec<(PeerId, Event)>,
    /// Protocol errors that closed a rail: (node, from, rail, error).
    pub errors: Vec<(PeerId, PeerId, RailId, String)>,
    /// Connections established: (from, to, rail, time).
    pub connects: Vec<(PeerId, PeerId, RailId, Time)>,
    /// Sends take [`Core::isend_now`] where it applies and the link has
    /// room, as the endpoint's `isend` does: the frame goes on the link
    /// within the call.
    pub send_now: bool,
    steps: u64,
    /// The clock does not advance past this (set by `run_for`/`run_until`).
    horizon: Time,
}

fn key(a: PeerId, b: PeerId, r: RailId) -> (PeerId, PeerId, RailId) {
    (a.min(b), a.max(b), r)
}

impl Sim {
    /// `n` endpoints, every pair joined by one connected rail per entry of
    /// `rails` (as after an eager start).
    pub fn new(n: u32, rails: &[LinkSpec], cfg: Config) -> Sim {
        let mut sim = Sim::unconnected(n, rails, cfg);
        for a in 0..n {
            for b in a + 1..n {
                for r in 0..rails.len() {
                    sim.establish(a, b, r);
                }
            }
        }
        sim.connects.clear();
        sim
    }

    /// `n` endpoints with no connection yet: rails are opened when the
    /// cores ask for them.
    pub fn unconnected(n: u32, rails: &[LinkSpec], cfg: Config) -> Sim {
        let mut nodes: Vec<Core> = (0..n).map(|rank| Core::new(Config { rank, ..cfg.clone() })).collect();
        let mut links = BTreeMap::new();
        let mut phys = BTreeMap::new();
        for a in 0..n {
            for b in 0..n {
                if a == b {
                    continue;
                }
                nodes[a as usize].add_peer(b, rails.len());
                for (r, spec) in rails.iter().enumerate() {
                    links.insert(
                        (a, b, r),
                        Link { spec: *spec, free_at: Time::ZERO, connected: false, drop_every: 0, sent: 0, epoch: 0 },
                    );
                    phys.insert(key(a, b, r), Phys::Up);
                }
            }
        }
        Sim {
            now: Time::ZERO,
            nodes,
            links,
            phys,
            wire: Wire::default(),
            held: BTreeMap::new(),
            unread: BTreeMap::new(),
            attempts: Vec::new(),
            crashed: vec![false; n as usize],
            paused_until: vec![Time::ZERO; n as usize],
            sockbuf: 256 << 10,
            stuck: 0,
            done: BTreeMap::new(),
            log: Vec::new(),
            errors: Vec::new(),
            connects: Vec::new(),
            send_now: false,
            steps: 0,
            horizon: Time(u64::MAX),
        }
    }

    /// A new connection for rail `r` between `a` and `b`: both ends are
    /// told (replacing any connection they had); frames of the old one
    /// still on the way are lost.
    fn establish(&mut self, a: PeerId, b: PeerId, r: RailId) {
        for (x, y) in [(a, b), (b, a)] {
            if let Some(l) = self.links.get_mut(&(x, y, r)) {
                l.connected = true;
                l.epoch += 1;
                l.free_at = self.now;
            }
        }
        self.held.remove(&(a, b, r));
        self.held.remove(&(b, a, r));
        // A link made lossy (`Sim::lossy`) says so, as a rail with
        // injected faults does.
        let may_lose =
            [(a, b), (b, a)].iter().any(|&(x, y)| self.links.get(&(x, y, r)).is_some_and(|l| l.drop_every > 0));
        for (x, y) in [(a, b), (b, a)] {
            let credits = self.nodes[y as usize].config().unexpected_limit;
            let now = self.now;
            self.nodes[x as usize].rail_up(y, r, RailCaps { may_lose, ..RailCaps::default() }, credits, now);
        }
        self.connects.push((a, b, r, self.now));
        self.collect();
    }

    /// Tells node `a` that rail `r` to `b` advertises `caps` (re-runs rail_up).
    pub fn set_caps(&mut self, a: PeerId, b: PeerId, r: RailId, caps: RailCaps) {
        let credits = self.nodes[b as usize].config().unexpected_limit;
        let now = self.now;
        self.nodes[a as usize].rail_up(b, r, caps, credits, now);
    }

    pub fn isend(&mut self, from: PeerId, to: PeerId, tag: u64, data: Bytes) -> ReqId {
        let now = self.now;
        let data = match self.send_now_step(from, to, tag, data) {
            Ok(req) => return req,
            Err(data) => data,
        };
        let req = self.nodes[from as usize].isend(to, tag, data, now);
        self.collect();
        req
    }

    /// The step of [`Sim::isend`] with [`Sim::send_now`]: the message goes
    /// on its link now if `Core::isend_now` takes it and the link is up
    /// with room (the endpoint's connection free with nothing queued).
    fn send_now_step(&mut self, from: PeerId, to: PeerId, tag: u64, data: Bytes) -> Result<ReqId, Bytes> {
        let now = self.now;
        if !self.send_now || self.crashed[from as usize] || self.paused_until[from as usize] > now {
            return Err(data);
        }
        let (links, sockbuf) = (&mut self.links, self.sockbuf as f64);
        let core = &mut self.nodes[from as usize];
        let (req, t, rail, link) = core.isend_now(to, tag, data, now, |rail| {
            let link = links.get_mut(&(from, to, rail))?;
            (link.connected && link.backlog(now) < sockbuf).then_some(link)
        })?;
        core.on_sent(to, rail, 1, now);
        self.wire.put(link, (from, to, rail), now, t);
        self.done.insert((from, req), Done::Send(Ok(())));
        self.collect();
        Ok(req)
    }

    /// Puts what the cores have queued on the links with room, at the
    /// current time, with no delivery or timer first: what the endpoint's
    /// `isend` does when its connection is free.
    pub fn flush(&mut self) {
        self.pump();
        self.collect();
    }

    /// Frames put on any link so far (every op).
    pub fn frames(&self) -> u64 {
        self.wire.frames
    }

    /// Starts keeping a log of every frame put on a link.
    pub fn log_wire(&mut self) {
        self.wire.log = Some(Vec::new());
    }

    /// The frames put on links since [`Sim::log_wire`], in order.
    pub fn wire_log(&self) -> &[WireFrame] {
        self.wire.log.as_deref().unwrap_or(&[])
    }

    pub fn irecv(&mut self, node: PeerId, src: Option<PeerId>, tag: Option<u64>, len: usize) -> ReqId {
        let now = self.now;
        let req = self.nodes[node as usize].irecv(src, tag, BytesMut::zeroed(len), now);
        self.collect();
        req
    }

    pub fn is_done(&self, node: PeerId, req: ReqId) -> bool {
        self.done.contains_key(&(node, req))
    }

    pub fn take(&mut self, node: PeerId, req: ReqId) -> Option<Done> {
        self.done.remove(&(node, req))
    }

    /// The connection of rail `r` between `a` and `b` resets (both ends
    /// are told with `reason`); frames on the wire are lost. The link
    /// works: the endpoints reconnect when they want to.
    pub fn kill(&mut self, a: PeerId, b: PeerId, r: RailId, reason: &str) {
        for (x, y) in [(a, b), (b, a)] {
            if let Some(l) = self.links.get_mut(&(x, y, r)) {
                l.connected = false;
                l.epoch += 1;
            }
            let now = self.now;
            if !self.crashed[x as usize] {
                self.nodes[x as usize].rail_down(y, r, reason, now);
            }
        }
        self.held.remove(&(a, b, r));
        self.held.remove(&(b, a, r));
        self.collect();
    }

    /// The connection of rail `r` between `a` and `b` resets and the link
    /// stays dead (a pulled cable the NIC reports): both ends are told,
    /// and reconnection attempts time out until [`Sim::link_up`].
    pub fn cut(&mut self, a: PeerId, b: PeerId, r: RailId, reason: &str) {
        self.phys.insert(key(a, b, r), Phys::Black);
        self.kill(a, b, r, reason);
    }

    /// Rail `r` between `a` and `b` stops carrying anything, silently:
    /// frames are held (TCP retransmits them once the link is back) and
    /// connection attempts time out.
    pub fn link_down(&mut self, a: PeerId, b: PeerId, r: RailId) {
        let now = self.now;
        self.phys.insert(key(a, b, r), Phys::Silent(now));
    }

    /// Like [`Sim::link_down`], but what was on the link and what is sent
    /// to it is lost for good.
    pub fn blackhole(&mut self, a: PeerId, b: PeerId, r: RailId) {
        self.phys.insert(key(a, b, r), Phys::Black);
        for (x, y) in [(a, b), (b, a)] {
            if let Some(l) = self.links.get_mut(&(x, y, r)) {
                l.epoch += 1;
            }
        }
        self.held.remove(&(a, b, r));
        self.held.remove(&(b, a, r));
    }

    /// The silent outage of rail `r` between `a` and `b` ends. Held frames
    /// of the surviving connection arrive after TCP's backoff (half the
    /// outage, at most 10 s), in order.
    pub fn link_up(&mut self, a: PeerId, b: PeerId, r: RailId) {
        let prev = self.phys.insert(key(a, b, r), Phys::Up);
        let backoff = match prev {
            Some(Phys::Silent(since)) => (self.now.since(since) / 2).min(Duration::from_secs(10)),
            _ => Duration::ZERO,
        };
        for k in [(a, b, r), (b, a, r)] {
            let Some(frames) = self.held.remove(&k) else { continue };
            let lat = self.links[&k].spec.latency;
            for (i, mut f) in frames.into_iter().enumerate() {
                f.at = self.now + backoff + lat + Duration::from_nanos(i as u64);
                self.wire.arrivals.push(Reverse(f));
            }
        }
    }

    /// Makes rail `r` from `a` to `b` lose every `n`-th data frame while
    /// staying up (a misbehaving rail). Connections made after this call
    /// advertise it (`RailCaps::may_lose`); call it before the rail
    /// connects (`Sim::unconnected`) for the first one to.
    pub fn lossy(&mut self, a: PeerId, b: PeerId, r: RailId, n: u64) {
        if let Some(l) = self.links.get_mut(&(a, b, r)) {
            l.drop_every = n;
        }
    }

    /// Brings rail `r` between `a` and `b` back at once, with a fresh
    /// connection.
    pub fn revive(&mut self, a: PeerId, b: PeerId, r: RailId) {
        self.phys.insert(key(a, b, r), Phys::Up);
        self.establish(a, b, r);
    }

    /// Process `node` dies: its peers' connections to it reset, and new
    /// connections to it are refused. It takes no further part.
    pub fn crash(&mut self, node: PeerId) {
        self.crashed[node as usize] = true;
        let peers: Vec<(PeerId, RailId)> =
            self.links.keys().filter(|(a, _, _)| *a == node).map(|(_, b, r)| (*b, *r)).collect();
        for (b, r) in peers {
            if self.links[&(b, node, r)].connected {
                self.kill(b, node, r, "connection reset by peer");
            }
        }
    }

    /// Process `node` stops (SIGSTOP) for `d`: it reads, writes and times
    /// nothing meanwhile; frames for it wait (its kernel still takes them).
    pub fn pause(&mut self, node: PeerId, d: Duration) {
        self.paused_until[node as usize] = self.now + d;
    }

    /// `node` leaves what arrives from `from` on rail `r` unread (its
    /// socket keeps it) until [`Sim::read_again`]: an engine that reads
    /// that rail's socket later in its round than it runs its timers, or a
    /// receiver behind on one connection. Nothing is lost.
    pub fn stop_reading(&mut self, node: PeerId, from: PeerId, r: RailId) {
        self.unread.entry((node, from, r)).or_default();
    }

    /// `node` reads rail `r` from `from` again: what waited is taken now,
    /// in order.
    pub fn read_again(&mut self, node: PeerId, from: PeerId, r: RailId) {
        for (i, mut f) in self.unread.remove(&(node, from, r)).unwrap_or_default().into_iter().enumerate() {
            f.at = self.now + Duration::from_nanos(i as u64);
            self.wire.arrivals.push(Reverse(f));
        }
    }

    fn paused(&self, node: PeerId) -> bool {
        self.crashed[node as usize] || self.paused_until[node as usize] > self.now
    }

    fn collect(&mut self) {
        let mut down = Vec::new();
        for (i, n) in self.nodes.iter_mut().enumerate() {
            while let Some(e) = n.poll_event() {
                match e {
                    Event::SendDone { req, result } => {
                        self.done.insert((i as PeerId, req), Done::Send(result));
                    }
                    Event::RecvDone { req, result, buf } => {
                        self.done.insert((i as PeerId, req), Done::Recv(result, buf));
                    }
                    Event::RailDown { peer, rail, reason } => {
                        // The endpoint gave up on the connection: close it.
                        down.push((i as PeerId, peer, rail, reason.clone()));
                        self.log.push((i as PeerId, Event::RailDown { peer, rail, reason }));
                    }
                    other => self.log.push((i as PeerId, other)),
                }
            }
        }
        for (a, b, r, reason) in down {
            if self.links.get(&(a, b, r)).is_some_and(|l| l.connected) {
                self.kill(a, b, r, &format!("closed by peer: {reason}"));
            }
        }
    }

    /// Starts the connection attempts the cores ask for.
    fn open_connections(&mut self) {
        let now = self.now;
        for a in 0..self.nodes.len() as PeerId {
            if self.paused(a) {
                continue;
            }
            while let Some(req) = self.nodes[a as usize].poll_connect(now) {
                let (b, r) = (req.peer, req.rail);
                let rtt = self.links[&(a, b, r)].spec.latency * 2;
                let attempt = match self.phys[&key(a, b, r)] {
                    _ if self.crashed[b as usize] => {
                        Attempt { at: now + rtt, from: a, to: b, rail: r, outcome: Some(ConnectFailure::Refused) }
                    }
                    Phys::Up => {
                        // The handshake needs the peer's process to run.
                        let at = (now + rtt * 2).max(self.paused_until[b as usize] + rtt);
                        Attempt { at, from: a, to: b, rail: r, outcome: None }
                    }
                    Phys::Silent(_) | Phys::Black => Attempt {
                        at: now + CONNECT_TIMEOUT,
                        from: a,
                        to: b,
                        rail: r,
                        outcome: Some(ConnectFailure::Transient),
                    },
                };
                self.attempts.push(attempt);
            }
        }
    }

    /// Completes the connection attempts due now.
    fn finish_attempts(&mut self) {
        let now = self.now;
        let (due, later): (Vec<Attempt>, Vec<Attempt>) = self.attempts.drain(..).partition(|a| a.at <= now);
        self.attempts = later;
        for a in due {
            if self.crashed[a.from as usize] {
                continue;
            }
            // The link may have failed while the attempt ran.
            let outcome = match (a.outcome, self.phys[&key(a.from, a.to, a.rail)]) {
                (None, Phys::Up) if !self.crashed[a.to as usize] => None,
                (None, _) if self.crashed[a.to as usize] => Some(ConnectFailure::Refused),
                (None, _) => Some(ConnectFailure::Transient),
                (o, _) => o,
            };
            match outcome {
                None => self.establish(a.from, a.to, a.rail),
                Some(how) => {
                    let why = match how {
                        ConnectFailure::Refused => "connection refused",
                        ConnectFailure::Transient => "connection timed out",
                    };
                    self.nodes[a.from as usize].connect_failed(a.to, a.rail, how, why, now);
                    self.collect();
                }
            }
        }
    }

    /// Moves frames from the endpoints onto links with room.
    fn pump(&mut self) {
        let now = self.now;
        for (&(from, to, rail), link) in self.links.iter_mut() {
            if !link.connected || self.crashed[from as usize] || self.paused_until[from as usize] > now {
                continue;
            }
            let core = &mut self.nodes[from as usize];
            loop {
                if link.backlog(now) >= self.sockbuf as f64 {
                    break;
                }
                let Some(t) = core.poll_transmit(to, rail, now) else { break };
                core.on_sent(to, rail, 1, now);
                self.wire.put(link, (from, to, rail), now, t);
            }
        }
        for n in self.nodes.iter_mut() {
            n.take_wakeups();
        }
    }

    fn deliver_due(&mut self) {
        let mut waiting = Vec::new();
        while self.wire.arrivals.peek().is_some_and(|Reverse(a)| a.at <= self.now) {
            let Reverse(a) = self.wire.arrivals.pop().expect("peeked");
            let k = (a.from, a.to, a.rail);
            let Some(l) = self.links.get(&k) else { continue };
            if !l.connected || l.epoch != a.epoch || self.crashed[a.to as usize] {
                continue;
            }
            match self.phys[&key(a.from, a.to, a.rail)] {
                Phys::Black => continue,
                Phys::Silent(_) => {
                    self.held.entry(k).or_default().push(a);
                    continue;
                }
                Phys::Up => {}
            }
            if let Some(q) = self.unread.get_mut(&(a.to, a.from, a.rail)) {
                q.push(a);
                continue;
            }
            if self.paused_until[a.to as usize] > self.now {
                // Its kernel keeps the bytes until it runs again.
                waiting.push(a);
                continue;
            }
            let now = self.now;
            if let Err(e) = self.nodes[a.to as usize].on_frame(a.from, a.rail, &a.header, &a.payload, now) {
                self.errors.push((a.to, a.from, a.rail, e.to_string()));
                self.kill(a.to, a.from, a.rail, &e.to_string());
            }
        }
        for mut a in waiting {
            a.at = self.paused_until[a.to as usize];
            self.wire.arrivals.push(Reverse(a));
        }
    }

    /// When something next happens, if anything will.
    fn next_time(&self) -> Option<Time> {
        let mut t = self.wire.arrivals.peek().map(|Reverse(a)| a.at);
        let mut at = |x: Time| t = Some(t.map_or(x, |y: Time| y.min(x)));
        for (i, n) in self.nodes.iter().enumerate() {
            if self.crashed[i] {
                continue;
            }
            if let Some(x) = n.poll_timeout() {
                at(x.max(self.paused_until[i]));
            }
        }
        for a in &self.attempts {
            at(a.at);
        }
        for (&(from, to, rail), l) in &self.links {
            if l.connected && self.nodes[from as usize].has_transmit(to, rail) && l.free_at > self.now {
                let drain = Duration::from_secs_f64(self.sockbuf as f64 / l.spec.bandwidth);
                let room_at = Time(l.free_at.as_nanos().saturating_sub(drain.as_nanos() as u64));
                at(room_at.max(Time(self.now.as_nanos() + 1)));
            }
        }
        t
    }

    /// One step: deliver, run timers, connect, transmit, then advance the
    /// clock. Returns false when nothing is left to happen. Every few steps
    /// the cores' bookkeeping is checked ([`Core::check_invariants`]).
    pub fn step(&mut self) -> bool {
        self.steps += 1;
        if self.steps.is_multiple_of(16) {
            for (i, n) in self.nodes.iter().enumerate() {
                if let Err(e) = n.check_invariants() {
                    panic!("node {i} at {:?}: {e}", self.now);
                }
            }
        }
        self.deliver_due();
        self.finish_attempts();
        let now = self.now;
        for (i, n) in self.nodes.iter_mut().enumerate() {
            if self.crashed[i] || self.paused_until[i] > now {
                continue;
            }
            if n.poll_timeout().is_some_and(|t| t <= now) {
                n.handle_timeout(now);
            }
        }
        self.collect();
        self.open_connections();
        self.pump();
        self.collect();
        // Bytes streaming over a busy link keep it alive at the receiver.
        for (&(from, to, rail), l) in &self.links {
            let flowing = l.connected && self.phys[&key(from, to, rail)] == Phys::Up && l.free_at > now;
            let read = !self.unread.contains_key(&(to, from, rail));
            if flowing && read && !self.crashed[to as usize] && self.paused_until[to as usize] <= now {
                self.nodes[to as usize].rail_activity(from, rail, now);
            }
        }
        match self.next_time() {
            Some(t) => {
                if t <= self.now {
                    self.stuck += 1;
                    assert!(self.stuck < 10_000, "an endpoint keeps asking for a timer in the past");
                } else {
                    self.stuck = 0;
                }
                self.now = self.now.max(t.min(self.horizon));
                true
            }
            None => false,
        }
    }

    /// One step that does not move the clock past `horizon`.
    pub fn step_to(&mut self, horizon: Time) -> bool {
        let capped = horizon.min(self.horizon);
        let saved = std::mem::replace(&mut self.horizon, capped);
        let r = self.step();
        self.horizon = saved;
        r
    }

    /// Steps until `done(self)` or the clock reaches `horizon`.
    fn run_to(&mut self, horizon: Time, done: &mut dyn FnMut(&Sim) -> bool) -> bool {
        let saved = std::mem::replace(&mut self.horizon, horizon);
        let r = loop {
            if done(self) {
                break true;
            }
            if self.now >= horizon {
                break false;
            }
            let before = self.now;
            if !self.step() && !done(self) {
                self.now = horizon;
                break done(self);
            }
            if self.now == before && self.now == horizon {
                break done(self);
            }
        };
        self.horizon = saved;
        r
    }

    /// Steps until `done(self)` holds; false if `limit` of virtual time
    /// passed first.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&Sim) -> bool) -> bool {
        let end = self.now + limit;
        self.run_to(end, &mut done)
    }

    /// As [`Sim::run_until`], but the clock moves at most `step` at a
    /// time, so when `done` holds `now` is within `step` of when it became
    /// true (`run_until` may jump on to the next event, a timer perhaps,
    /// before it looks): for measuring how long something took.
    pub fn run_until_within(&mut self, limit: Duration, step: Duration, mut done: impl FnMut(&Sim) -> bool) -> bool {
        let end = self.now + limit;
        while !done(self) && self.now < end {
            let slice = step.min(end.since(self.now));
            self.run_until(slice, &mut done);
        }
        done(self)
    }

    /// Steps for `d` of virtual time.
    pub fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        self.run_to(end, &mut |_| false);
    }
}
