//! A deterministic network simulator for scenario tests: endpoints
//! ([`Core`]s) joined by simulated rails of given bandwidth and latency,
//! driven by a virtual clock that jumps to the next thing that happens.
//!
//! Each rail direction is a serial link: a frame occupies it for
//! `(header + payload) / bandwidth`, then arrives `latency` later, in
//! order. Like a socket, each link accepts frames while its backlog is
//! below `sockbuf` bytes. Rails can be killed and revived at any time.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use crate::core::{Config, Core, Event, PeerId, RailCaps, RailId, RecvError, ReqId, SendError, Status};
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

#[derive(Debug)]
struct Link {
    spec: LinkSpec,
    free_at: Time,
    up: bool,
    /// Frames are silently lost (a dead cable nobody noticed yet).
    black: bool,
    /// Drop every n-th data frame (0 = none).
    drop_every: u64,
    sent: u64,
    epoch: u64,
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
    arrivals: BinaryHeap<Reverse<Arrival>>,
    order: u64,
    /// Bytes a link accepts ahead of the wire (the socket buffer).
    pub sockbuf: u64,
    stuck: u32,
    /// Completed requests by (node, request).
    pub done: BTreeMap<(PeerId, ReqId), Done>,
    /// Other events by node (rail and peer failures).
    pub log: Vec<(PeerId, Event)>,
    /// Protocol errors that closed a rail: (node, from, rail, error).
    pub errors: Vec<(PeerId, PeerId, RailId, String)>,
}

impl Sim {
    /// `n` endpoints, every pair joined by one rail per entry of `rails`.
    pub fn new(n: u32, rails: &[LinkSpec], cfg: Config) -> Sim {
        let mut nodes: Vec<Core> = (0..n).map(|rank| Core::new(Config { rank, ..cfg.clone() })).collect();
        let mut links = BTreeMap::new();
        for a in 0..n {
            for b in 0..n {
                if a == b {
                    continue;
                }
                nodes[a as usize].add_peer(b, rails.len());
                for (r, spec) in rails.iter().enumerate() {
                    links.insert(
                        (a, b, r),
                        Link {
                            spec: *spec,
                            free_at: Time::ZERO,
                            up: true,
                            black: false,
                            drop_every: 0,
                            sent: 0,
                            epoch: 0,
                        },
                    );
                }
            }
        }
        let mut sim = Sim {
            now: Time::ZERO,
            nodes,
            links,
            arrivals: BinaryHeap::new(),
            order: 0,
            sockbuf: 256 << 10,
            stuck: 0,
            done: BTreeMap::new(),
            log: Vec::new(),
            errors: Vec::new(),
        };
        for a in 0..n {
            for b in 0..n {
                for r in 0..rails.len() {
                    if a != b {
                        sim.up(a, b, r);
                    }
                }
            }
        }
        sim
    }

    fn up(&mut self, a: PeerId, b: PeerId, r: RailId) {
        let credits = self.nodes[b as usize].config().unexpected_limit;
        let now = self.now;
        self.nodes[a as usize].rail_up(b, r, RailCaps::default(), credits, now);
    }

    /// Tells node `a` that rail `r` to `b` advertises `caps` (re-runs rail_up).
    pub fn set_caps(&mut self, a: PeerId, b: PeerId, r: RailId, caps: RailCaps) {
        let credits = self.nodes[b as usize].config().unexpected_limit;
        let now = self.now;
        self.nodes[a as usize].rail_up(b, r, caps, credits, now);
    }

    pub fn isend(&mut self, from: PeerId, to: PeerId, tag: u64, data: Bytes) -> ReqId {
        let now = self.now;
        let req = self.nodes[from as usize].isend(to, tag, data, now);
        self.collect();
        req
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

    /// Kills rail `r` between `a` and `b` (both directions); frames on the
    /// wire are lost; both ends are told with `reason`.
    pub fn kill(&mut self, a: PeerId, b: PeerId, r: RailId, reason: &str) {
        for (x, y) in [(a, b), (b, a)] {
            if let Some(l) = self.links.get_mut(&(x, y, r)) {
                l.up = false;
                l.epoch += 1;
            }
            let now = self.now;
            self.nodes[x as usize].rail_down(y, r, reason, now);
        }
        self.collect();
    }

    /// Makes rail `r` between `a` and `b` lose every frame from now on
    /// without telling either end: only heartbeats can notice.
    pub fn blackhole(&mut self, a: PeerId, b: PeerId, r: RailId) {
        for k in [(a, b, r), (b, a, r)] {
            if let Some(l) = self.links.get_mut(&k) {
                l.black = true;
                l.epoch += 1;
            }
        }
    }

    /// Makes rail `r` from `a` to `b` lose every `n`-th data frame while
    /// staying up (a misbehaving rail).
    pub fn lossy(&mut self, a: PeerId, b: PeerId, r: RailId, n: u64) {
        if let Some(l) = self.links.get_mut(&(a, b, r)) {
            l.drop_every = n;
        }
    }

    /// Brings rail `r` between `a` and `b` back (a fresh connection).
    pub fn revive(&mut self, a: PeerId, b: PeerId, r: RailId) {
        for (x, y) in [(a, b), (b, a)] {
            if let Some(l) = self.links.get_mut(&(x, y, r)) {
                l.up = true;
                l.black = false;
                l.free_at = self.now;
            }
            self.up(x, y, r);
        }
        self.collect();
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
                        // The endpoint gave up on the rail: close the connection.
                        down.push((i as PeerId, peer, rail, reason.clone()));
                        self.log.push((i as PeerId, Event::RailDown { peer, rail, reason }));
                    }
                    other => self.log.push((i as PeerId, other)),
                }
            }
        }
        for (a, b, r, reason) in down {
            if self.links.get(&(a, b, r)).is_some_and(|l| l.up) {
                self.kill(a, b, r, &format!("closed by peer: {reason}"));
            }
        }
    }

    /// Moves frames from the endpoints onto links with room.
    fn pump(&mut self) {
        let now = self.now;
        for (&(from, to, rail), link) in self.links.iter_mut() {
            if !link.up {
                continue;
            }
            let core = &mut self.nodes[from as usize];
            loop {
                let backlog = link.free_at.as_nanos().saturating_sub(now.as_nanos()) as f64 * link.spec.bandwidth / 1e9;
                if backlog >= self.sockbuf as f64 {
                    break;
                }
                let Some(t) = core.poll_transmit(to, rail, now) else { break };
                core.on_sent(to, rail, 1, now);
                if t.header.op.carries_data() && link.drop_every > 0 {
                    link.sent += 1;
                    if link.sent % link.drop_every == 0 {
                        continue;
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
        for n in self.nodes.iter_mut() {
            n.take_wakeups();
        }
    }

    fn deliver_due(&mut self) {
        while self.arrivals.peek().is_some_and(|Reverse(a)| a.at <= self.now) {
            let Reverse(a) = self.arrivals.pop().expect("peeked");
            let live = self.links.get(&(a.from, a.to, a.rail)).is_some_and(|l| l.up && !l.black && l.epoch == a.epoch);
            if !live {
                continue;
            }
            let now = self.now;
            if let Err(e) = self.nodes[a.to as usize].on_frame(a.from, a.rail, &a.header, &a.payload, now) {
                self.errors.push((a.to, a.from, a.rail, e.to_string()));
                self.kill(a.to, a.from, a.rail, &e.to_string());
            }
        }
    }

    /// When something next happens, if anything will.
    fn next_time(&self) -> Option<Time> {
        let mut t = self.arrivals.peek().map(|Reverse(a)| a.at);
        let mut at = |x: Time| t = Some(t.map_or(x, |y: Time| y.min(x)));
        for n in &self.nodes {
            if let Some(x) = n.poll_timeout() {
                at(x);
            }
        }
        for (&(from, to, rail), l) in &self.links {
            if l.up && self.nodes[from as usize].has_transmit(to, rail) && l.free_at > self.now {
                let drain = Duration::from_secs_f64(self.sockbuf as f64 / l.spec.bandwidth);
                let room_at = Time(l.free_at.as_nanos().saturating_sub(drain.as_nanos() as u64));
                at(room_at.max(Time(self.now.as_nanos() + 1)));
            }
        }
        t
    }

    /// One step: deliver, run timers, transmit, then advance the clock.
    /// Returns false when nothing is left to happen.
    pub fn step(&mut self) -> bool {
        self.deliver_due();
        let now = self.now;
        for n in self.nodes.iter_mut() {
            if n.poll_timeout().is_some_and(|t| t <= now) {
                n.handle_timeout(now);
            }
        }
        self.pump();
        self.collect();
        // Bytes streaming over a busy link keep it alive at the receiver.
        for (&(from, to, rail), l) in &self.links {
            if l.up && !l.black && l.free_at > now {
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
                self.now = self.now.max(t);
                true
            }
            None => false,
        }
    }

    /// Steps until `done(self)` holds; false if `limit` of virtual time
    /// passed first.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&Sim) -> bool) -> bool {
        let end = self.now + limit;
        loop {
            if done(self) {
                return true;
            }
            if self.now > end {
                return false;
            }
            if !self.step() && !done(self) {
                // Only heartbeats could be left; let time pass to them.
                return done(self);
            }
        }
    }

    /// Steps for `d` of virtual time.
    pub fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            if !self.step() {
                break;
            }
        }
    }
}
