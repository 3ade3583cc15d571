//! Deterministic simulation of a group: n cores, seeded random link delays,
//! rows that overtake data (and, in some runs, data that overtakes data on
//! another rail), random senders and sizes, members killed at random points.
//! Every frame goes through encode/decode.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashSet};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use multirail_group::{Effect, Frame, GroupConfig, GroupCore, Mode, Rank, SendError, Senders};

/// xorshift64*: small, seeded, good enough for schedules.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

#[derive(Clone, Debug)]
struct Params {
    n: u32,
    senders: Senders,
    mode: Mode,
    window: u32,
    max_size: usize,
    per_sender: u32,
    reorder_data: bool,
    /// (time in µs, rank) to kill.
    kills: Vec<(u64, Rank)>,
    /// Tell survivors through on_peer_lost (else only the timeout finds it).
    notify: bool,
    /// This long (µs) after a survivor first wedges, kill the member it
    /// sees leading the change (if one would stay alive).
    kill_leader_after: Option<u64>,
    /// One frame in a hundred takes 5 to 40 ms longer (rows too).
    spikes: bool,
    partition_safety: bool,
    /// From this time (µs) on, every frame to or from this rank is lost,
    /// but the member keeps running.
    silence: Option<(u64, Rank)>,
    /// At this time (µs) the silenced rank's links come back: what was
    /// sent to or from it meanwhile arrives then (TCP's retransmissions),
    /// instead of never.
    heal: Option<u64>,
    /// Instead of at a set time, the links come back this many µs (a
    /// range) after the silenced member stopped, as on the testbed, where
    /// the member brings its links up once it stopped: the survivors' own
    /// timeouts for it may not have run out yet.
    heal_on_stop: Option<(u64, u64)>,
    /// Each direction of the silenced member's link to each other member
    /// goes up to this many µs after the silence begins (a random offset
    /// per direction), as when its rails go down one after another, or its
    /// frames sat unread at a busy member: it then suspects the others one
    /// at a time, and they suspect it later than it suspects them.
    silence_skew: u64,
    /// Members allowed to stop (Expelled or Partitioned).
    may_stop: Vec<Rank>,
    /// Payloads of at least this many bytes go along the chain.
    relay_min: usize,
    /// Payloads longer than this go in chunks.
    chunk: usize,
}

const TICK_US: u64 = 1_000;
/// Arrival times from here on are frames held until a heal (see
/// `Params::heal_on_stop`).
const HELD: u64 = 1 << 60;
const TIMEOUT: Duration = Duration::from_millis(150);
const LIMIT_US: u64 = 30_000_000;

/// (arrival µs, tie-break, to, from, encoded frame)
type InFlight = (u64, u64, Rank, Rank, Vec<u8>);

struct Node {
    core: GroupCore,
    alive: bool,
    /// (view, sender, index, payload)
    delivered: Vec<(u64, Rank, u64, Bytes)>,
    seen: HashSet<(Rank, u32)>,
    /// View in which each own message was accepted by send().
    sent_in: Vec<u64>,
    views: Vec<(u64, Vec<Rank>)>,
    quota: u32,
    counter: u32,
    snapshot: (u64, Vec<u64>, u64, u64),
    max_buffered: usize,
}

struct Sim {
    p: Params,
    rng: Rng,
    now: u64,
    nodes: Vec<Node>,
    /// (arrival µs, tie-break, to, from, encoded frame)
    heap: BinaryHeap<Reverse<InFlight>>,
    tie: u64,
    /// Per (from, to): when the last data frame arrives (FIFO data).
    data_clock: BTreeMap<(Rank, Rank), u64>,
    /// (µs, to, lost rank) notifications of on_peer_lost.
    losses: Vec<(u64, Rank, Rank)>,
    frames: u64,
    /// Data frames sent per (from, to).
    data_links: BTreeMap<(Rank, Rank), u64>,
    bound: usize,
    stats: Stats,
    /// Per member `j`: when the frames from `j` to the silenced member
    /// stop (`skew[j]`) and those from it to `j` (`skew[n + j]`), after the
    /// silence begins (`Params::silence_skew`).
    skew: Vec<u64>,
}

/// What a run exercised, so that the tests can show they test something.
#[derive(Clone, Debug, Default)]
struct Stats {
    runs: u64,
    null_frames: u64,
    window_full: u64,
    wedged_refusals: u64,
    /// Installed views (counted once per run, at the first live member).
    view_changes: u64,
    /// Members killed while a survivor was wedged (a change under way).
    kills_during_change: u64,
    /// Kills of the member that was leading an ongoing change.
    leader_kills_during_change: u64,
    carried: u64,
    trim_deliveries: u64,
    stopped: u64,
    /// Rows of a silenced member that carried suspicions and reached a
    /// member that did not suspect it (yet).
    late_suspicion_rows: u64,
    data_frames: u64,
    /// Data frames passed on by a member that is not their sender.
    relayed: u64,
    /// Chunks of messages sent in chunks (among `data_frames`).
    chunk_frames: u64,
    /// Chunks passed on by a member that did not hold their whole message
    /// yet: the chain works in pipeline.
    passed_before_whole: u64,
    row_frames: u64,
    max_buffer_ratio: f64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.runs += o.runs;
        self.null_frames += o.null_frames;
        self.window_full += o.window_full;
        self.wedged_refusals += o.wedged_refusals;
        self.view_changes += o.view_changes;
        self.kills_during_change += o.kills_during_change;
        self.leader_kills_during_change += o.leader_kills_during_change;
        self.carried += o.carried;
        self.trim_deliveries += o.trim_deliveries;
        self.stopped += o.stopped;
        self.late_suspicion_rows += o.late_suspicion_rows;
        self.data_frames += o.data_frames;
        self.relayed += o.relayed;
        self.chunk_frames += o.chunk_frames;
        self.passed_before_whole += o.passed_before_whole;
        self.row_frames += o.row_frames;
        self.max_buffer_ratio = self.max_buffer_ratio.max(o.max_buffer_ratio);
    }
}

fn payload(origin: Rank, counter: u32, size: usize) -> Bytes {
    let mut v = vec![(counter as u8) ^ 0x5a; size.max(8)];
    v[..4].copy_from_slice(&origin.to_le_bytes());
    v[4..8].copy_from_slice(&counter.to_le_bytes());
    Bytes::from(v)
}

fn ident(p: &Bytes) -> (Rank, u32) {
    assert!(p.len() >= 8, "a null or a truncated message was delivered");
    let o = u32::from_le_bytes(p[..4].try_into().unwrap());
    let c = u32::from_le_bytes(p[4..8].try_into().unwrap());
    assert!(p[8..].iter().all(|b| *b == (c as u8) ^ 0x5a), "payload corrupted");
    (o, c)
}

impl Sim {
    fn new(p: Params, seed: u64) -> Sim {
        let declared: Vec<Rank> = match &p.senders {
            Senders::All => (0..p.n).collect(),
            Senders::One(r) => vec![*r],
            Senders::List(l) => l.clone(),
        };
        let nodes = (0..p.n)
            .map(|me| {
                let mut cfg = GroupConfig::new(p.n, me);
                cfg.senders = p.senders.clone();
                cfg.window = p.window;
                cfg.mode = p.mode;
                cfg.failure_timeout = TIMEOUT;
                cfg.heartbeat_interval = Duration::from_millis(5);
                cfg.partition_safety = p.partition_safety;
                cfg.relay_min = p.relay_min;
                cfg.chunk = p.chunk;
                Node {
                    core: GroupCore::new(cfg).unwrap(),
                    alive: true,
                    delivered: Vec::new(),
                    seen: HashSet::new(),
                    sent_in: Vec::new(),
                    views: Vec::new(),
                    quota: if declared.contains(&me) { p.per_sender } else { 0 },
                    counter: 0,
                    snapshot: (0, Vec::new(), 0, 0),
                    max_buffered: 0,
                }
            })
            .collect();
        // Drawn from their own generator, so that runs without a skew
        // stay as they were.
        let mut skew_rng = Rng::new(seed ^ 0x5eed);
        let skew = (0..2 * p.n).map(|_| if p.silence_skew > 0 { skew_rng.below(p.silence_skew) } else { 0 }).collect();
        // Receiving: at most `window` per sender; own: `window`; during a
        // view change, as much again of the next view, plus carried-over.
        let s = declared.len().max(1);
        let w = p.window as usize;
        let bound = if p.kills.is_empty() { s * w * p.max_size } else { (2 * s + 1) * w * p.max_size };
        Sim {
            rng: Rng::new(seed),
            p,
            now: 0,
            nodes,
            heap: BinaryHeap::new(),
            tie: 0,
            data_clock: BTreeMap::new(),
            losses: Vec::new(),
            frames: 0,
            data_links: BTreeMap::new(),
            bound,
            stats: Stats { runs: 1, ..Stats::default() },
            skew,
        }
    }

    fn schedule(&mut self, from: Rank, to: Rank, frame: Frame) {
        let mut not_before = 0;
        if let Some((t, r)) = self.p.silence
            && (from == r || to == r)
            && self.now >= t + self.skew[if from == r { self.p.n + to } else { from } as usize]
        {
            match self.p.heal {
                Some(h) if self.now < h => not_before = h,
                Some(_) => {}
                None if self.p.heal_on_stop.is_some() => not_before = HELD,
                None => return,
            }
        }
        let is_data = !matches!(frame, Frame::Row(_));
        match frame {
            Frame::Null { .. } => self.stats.null_frames += 1,
            Frame::Data { sender, relay, .. } => {
                self.stats.data_frames += 1;
                *self.data_links.entry((from, to)).or_insert(0) += 1;
                if sender != from {
                    assert!(relay, "{from} passed on a message of {sender} that was not for the chain");
                    self.stats.relayed += 1;
                }
            }
            Frame::Chunk { sender, index, relay, .. } => {
                self.stats.data_frames += 1;
                self.stats.chunk_frames += 1;
                *self.data_links.entry((from, to)).or_insert(0) += 1;
                if sender != from {
                    assert!(relay, "{from} passed on a chunk of {sender} that was not for the chain");
                    self.stats.relayed += 1;
                    if self.nodes[from as usize].core.num_received(sender).is_some_and(|n| n <= index) {
                        self.stats.passed_before_whole += 1;
                    }
                }
            }
            Frame::Row(_) => self.stats.row_frames += 1,
        }
        let bytes = frame.encode();
        // A rail of ~1 GB/s: a µs per KB on top of the latency.
        let size_us = bytes.len() as u64 / 1000;
        let mut at = self.now.max(not_before) + self.rng.range(20, 2_000) + size_us;
        if self.p.spikes && self.rng.chance(1, 100) {
            at += self.rng.range(5_000, 40_000);
        }
        if is_data && !self.p.reorder_data {
            let c = self.data_clock.entry((from, to)).or_insert(0);
            at = at.max(*c);
            *c = at;
        }
        self.tie += 1;
        self.heap.push(Reverse((at, self.tie, to, from, bytes.to_vec())));
    }

    /// The silenced member's links come back: what was held arrives from
    /// now on, in the order it was sent.
    fn heal_now(&mut self, lo: u64, hi: u64) {
        let at = self.now + self.rng.range(lo, hi);
        self.p.heal = Some(at);
        let retime = |t: u64| if t >= HELD { t - HELD + at } else { t };
        let flying = std::mem::take(&mut self.heap).into_vec();
        self.heap = flying
            .into_iter()
            .map(|Reverse(mut e)| {
                e.0 = retime(e.0);
                Reverse(e)
            })
            .collect();
        for c in self.data_clock.values_mut() {
            *c = retime(*c);
        }
    }

    fn handle(&mut self, who: Rank, effects: Vec<Effect>) {
        // Deliveries in the batch that installs a view are the ragged trim:
        // every member of the new view holds them, an excluded one need not.
        let installs: Option<Vec<Rank>> = effects.iter().find_map(|e| match e {
            Effect::ViewChange { members, .. } => Some(members.clone()),
            _ => None,
        });
        // Rows are coalesced: one per peer per turn at most.
        let mut rows_to = Vec::new();
        for e in &effects {
            if let Effect::Send { to, frame: Frame::Row(_) } = e {
                assert!(!rows_to.contains(to), "{who} sent two rows to {to} in one turn");
                rows_to.push(*to);
            }
        }
        for e in effects {
            match e {
                Effect::Send { to, frame } => {
                    assert!(to != who);
                    self.schedule(who, to, frame);
                }
                Effect::Deliver { view, sender, index, payload } => {
                    let id = ident(&payload);
                    assert_eq!(id.0, sender, "delivered under the wrong sender");
                    // Every member of the view still in it holds it (a dead
                    // one is frozen at its death, so it held it then).
                    for (j, n) in self.nodes.iter().enumerate() {
                        let held_by = installs.as_ref().is_none_or(|m| m.contains(&(j as Rank)));
                        if j as Rank != who && n.core.view_id() == view && held_by {
                            let got = n.core.num_received(sender).unwrap_or(0);
                            assert!(
                                got > index,
                                "{who} delivered ({sender},{index}) in view {view} but {j} holds only {got}"
                            );
                        }
                    }
                    if installs.is_some() {
                        self.stats.trim_deliveries += 1;
                    }
                    if view > self.nodes[id.0 as usize].sent_in[id.1 as usize] {
                        self.stats.carried += 1;
                    }
                    let recycle = self.rng.chance(1, 2);
                    let node = &mut self.nodes[who as usize];
                    assert!(node.seen.insert(id), "{who} delivered {id:?} twice");
                    // Half the payloads come back as buffers to reassemble
                    // into (with stale contents, which must not show).
                    if recycle {
                        node.core.recycle(BytesMut::from(&payload[..]));
                    }
                    node.delivered.push((view, sender, index, payload));
                }
                Effect::ViewChange { view_id, members } => {
                    self.nodes[who as usize].views.push((view_id, members));
                }
                Effect::Wedged { .. } => {}
                Effect::Expelled { view_id } | Effect::Partitioned { view_id } => {
                    assert!(self.p.may_stop.contains(&who), "{who} stopped in view {view_id}");
                    self.nodes[who as usize].alive = false;
                    self.stats.stopped += 1;
                    if let (Some((_, r)), Some((lo, hi)), None) = (self.p.silence, self.p.heal_on_stop, self.p.heal)
                        && r == who
                    {
                        self.heal_now(lo, hi);
                    }
                }
            }
        }
        let node = &mut self.nodes[who as usize];
        let c = &node.core;
        let counts: Vec<u64> = c.senders().iter().map(|s| c.num_received(*s).unwrap()).collect();
        let snap = (c.view_id(), counts, c.seq_num(), c.delivered());
        let old = &node.snapshot;
        assert!(snap.0 >= old.0, "view went back");
        if snap.0 == old.0 {
            assert!(snap.2 >= old.2 && snap.3 >= old.3, "counter went back");
            if snap.1.len() == old.1.len() {
                assert!(snap.1.iter().zip(&old.1).all(|(a, b)| a >= b), "num_received went back");
            }
        }
        node.snapshot = snap;
        let b = c.buffered_bytes();
        node.max_buffered = node.max_buffered.max(b);
        self.stats.max_buffer_ratio = self.stats.max_buffer_ratio.max(b as f64 / self.bound as f64);
        assert!(b <= self.bound, "{who} buffers {b} bytes, bound {}", self.bound);
    }

    fn tick(&mut self) {
        let now = self.now;
        if let Some(d) = self.p.kill_leader_after {
            let alive = self.nodes.iter().filter(|n| n.alive).count();
            if let Some(n) = self.nodes.iter().find(|n| n.alive && n.core.is_wedged()) {
                let sus: Vec<Rank> = n.core.suspected().collect();
                if let Some(l) = n.core.members().iter().find(|m| !sus.contains(m)) {
                    if alive >= 2 {
                        self.p.kills.push((now + d, *l));
                    }
                    self.p.kill_leader_after = None;
                }
            }
        }
        while let Some(pos) = self.p.kills.iter().position(|(t, _)| *t <= now) {
            let (_, r) = self.p.kills.remove(pos);
            if !self.nodes[r as usize].alive {
                continue;
            }
            let changing: Vec<&Node> = self.nodes.iter().filter(|n| n.alive && n.core.is_wedged()).collect();
            if !changing.is_empty() {
                self.stats.kills_during_change += 1;
                // The leader of a change is the lowest unsuspected member.
                if changing.iter().any(|n| {
                    let sus: Vec<Rank> = n.core.suspected().collect();
                    n.core.members().iter().find(|m| !sus.contains(m)) == Some(&r)
                }) {
                    self.stats.leader_kills_during_change += 1;
                }
            }
            self.nodes[r as usize].alive = false;
            // A crash loses some of what the victim had in flight, so the
            // survivors hold different prefixes of its messages.
            let flying = std::mem::take(&mut self.heap).into_vec();
            for Reverse(e) in flying {
                if e.3 != r || self.rng.chance(1, 2) {
                    self.heap.push(Reverse(e));
                }
            }
            if self.p.notify {
                for j in 0..self.p.n {
                    if j != r && self.rng.chance(3, 4) {
                        let at = now + self.rng.range(0, 100_000);
                        self.losses.push((at, j, r));
                    }
                }
            }
        }
        if let Some((t, r)) = self.p.silence
            && t <= now
            && t + TICK_US > now
            && self.p.notify
        {
            // The channel sees every rail between r and the others go.
            for j in 0..self.p.n {
                if j != r {
                    let at = now + self.rng.range(0, 100_000);
                    self.losses.push((at, j, r));
                    let at = now + self.rng.range(0, 100_000);
                    self.losses.push((at, r, j));
                }
            }
        }
        let due: Vec<(u64, Rank, Rank)> = self.losses.iter().copied().filter(|l| l.0 <= now).collect();
        self.losses.retain(|l| l.0 > now);
        for (_, to, lost) in due {
            if self.nodes[to as usize].alive {
                self.nodes[to as usize].core.on_peer_lost(lost);
            }
        }
        for who in 0..self.p.n {
            if !self.nodes[who as usize].alive {
                continue;
            }
            self.nodes[who as usize].core.on_tick(Duration::from_micros(now));
            // The application sends a few messages, sometimes.
            if self.nodes[who as usize].quota > 0 && self.rng.chance(1, 2) {
                for _ in 0..self.rng.range(1, 4) {
                    let node = &mut self.nodes[who as usize];
                    if node.quota == 0 {
                        break;
                    }
                    let size = 8 + self.rng.below(self.p.max_size as u64 - 7) as usize;
                    let node = &mut self.nodes[who as usize];
                    match node.core.send(payload(who, node.counter, size)) {
                        Ok(_) => {
                            let v = node.core.view_id();
                            node.sent_in.push(v);
                            node.counter += 1;
                            node.quota -= 1;
                        }
                        Err(SendError::WindowFull) => {
                            self.stats.window_full += 1;
                            break;
                        }
                        Err(SendError::Wedged) => {
                            self.stats.wedged_refusals += 1;
                            break;
                        }
                        Err(e) => panic!("{who}: send: {e:?}"),
                    }
                }
            }
            let eff = self.nodes[who as usize].core.drain_effects();
            self.handle(who, eff);
        }
    }

    fn done(&self) -> bool {
        let alive: Vec<&Node> = self.nodes.iter().filter(|n| n.alive).collect();
        if alive.iter().any(|n| n.quota > 0 || n.core.carried() > 0 || n.core.is_wedged()) {
            return false;
        }
        let view = alive[0].core.view_id();
        let live: Vec<Rank> = alive.iter().map(|n| n.core.me()).collect();
        if alive.iter().any(|n| n.core.view_id() != view || n.core.members() != &live[..]) {
            return false;
        }
        // Everything every live sender sent is delivered everywhere.
        let want: usize = alive.iter().map(|n| n.counter as usize).sum();
        alive.iter().all(|n| {
            let have = alive
                .iter()
                .map(|s| {
                    let me = s.core.me();
                    (0..s.counter).filter(|c| n.seen.contains(&(me, *c))).count()
                })
                .sum::<usize>();
            have == want
        })
    }

    fn run(&mut self) {
        self.advance(None);
        self.check();
        let first = self.nodes.iter().find(|n| n.alive).unwrap();
        self.stats.view_changes = first.views.len() as u64;
    }

    /// Runs until done, or until `until` µs if given (then without
    /// checking that it is done).
    fn advance(&mut self, until: Option<u64>) {
        let mut next_tick = 0;
        let mut steps = 0u64;
        loop {
            steps += 1;
            assert!(steps < 20_000_000, "step bound");
            let next_ev = self.heap.peek().map(|Reverse(e)| e.0);
            if next_ev.is_some_and(|t| t < next_tick) {
                let t = next_ev.unwrap();
                self.now = t;
                let mut touched = Vec::new();
                while let Some(Reverse(e)) = self.heap.peek() {
                    if e.0 != t {
                        break;
                    }
                    let Reverse((_, _, to, from, bytes)) = self.heap.pop().unwrap();
                    if !self.nodes[to as usize].alive {
                        continue;
                    }
                    self.frames += 1;
                    let f = Frame::decode(&Bytes::from(bytes)).expect("decode");
                    if let Frame::Row(r) = &f
                        && self.p.silence.is_some_and(|(_, s)| s == from)
                        && !r.suspected.is_empty()
                        && !self.nodes[to as usize].core.suspected().any(|j| j == from)
                    {
                        self.stats.late_suspicion_rows += 1;
                    }
                    self.nodes[to as usize].core.on_message(from, f);
                    if !touched.contains(&to) {
                        touched.push(to);
                    }
                }
                for who in touched {
                    let eff = self.nodes[who as usize].core.drain_effects();
                    self.handle(who, eff);
                }
            } else {
                self.now = next_tick;
                if until.is_some_and(|u| self.now >= u) {
                    return;
                }
                assert!(self.now < LIMIT_US, "no progress within the time limit: {}", self.state());
                self.tick();
                next_tick += TICK_US;
                if until.is_none() && self.p.kills.is_empty() && self.losses.is_empty() && self.done() {
                    return;
                }
            }
        }
    }

    fn state(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                format!(
                    "[alive {} view {} members {:?} wedged {} quota {} carried {} delivered {} seq {} counts {:?}]",
                    n.alive,
                    n.core.view_id(),
                    n.core.members(),
                    n.core.is_wedged(),
                    n.quota,
                    n.core.carried(),
                    n.delivered.len(),
                    n.core.seq_num(),
                    n.snapshot.1
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn check(&self) {
        let alive: Vec<&Node> = self.nodes.iter().filter(|n| n.alive).collect();
        let first = alive[0];
        let key = |d: &(u64, Rank, u64, Bytes)| (d.0, d.1, d.2, ident(&d.3));
        let seq = |n: &Node| n.delivered.iter().map(key).collect::<Vec<_>>();
        let s0 = seq(first);
        for n in &alive {
            assert_eq!(n.views, first.views, "views differ");
        }
        match self.p.mode {
            Mode::Ordered => {
                for n in &alive {
                    assert_eq!(seq(n), s0, "delivered sequences differ");
                }
                for n in self.nodes.iter().filter(|n| !n.alive) {
                    let s = seq(n);
                    assert_eq!(&s0[..s.len()], &s[..], "a dead member's sequence is not a prefix");
                }
            }
            Mode::Unordered => {
                // Per view, the same set; per sender, the same order.
                let split = |n: &Node| {
                    let mut m: BTreeMap<(u64, Rank), Vec<_>> = BTreeMap::new();
                    for d in n.delivered.iter().map(key) {
                        m.entry((d.0, d.1)).or_default().push(d);
                    }
                    m
                };
                let m0 = split(first);
                for n in &alive {
                    assert_eq!(split(n), m0, "per-sender sequences differ");
                }
                for n in self.nodes.iter().filter(|n| !n.alive) {
                    for (k, v) in split(n) {
                        let w = m0.get(&k).expect("a dead member delivered what survivors did not");
                        assert_eq!(&w[..v.len()], &v[..]);
                    }
                }
            }
        }
        // Per origin, counters in FIFO order (resends keep the order).
        for n in &alive {
            let mut last: BTreeMap<Rank, u32> = BTreeMap::new();
            for d in &n.delivered {
                let (o, c) = ident(&d.3);
                if let Some(l) = last.insert(o, c) {
                    assert!(c > l, "origin {o}: {c} after {l}");
                }
            }
        }
        // Without kills, nothing is lost at all.
        if self.nodes.iter().all(|n| n.alive) {
            let total: u32 = self.nodes.iter().map(|n| n.counter).sum();
            assert_eq!(first.delivered.len() as u32, total);
            assert!(first.views.is_empty());
        }
    }
}

fn random_params(rng: &mut Rng, kills: bool) -> Params {
    let n = rng.range(3, 5) as u32;
    let senders = match rng.below(3) {
        0 => Senders::All,
        1 => Senders::One(rng.below(n as u64) as u32),
        _ => {
            let mut l: Vec<Rank> = (0..n).filter(|_| rng.chance(1, 2)).collect();
            if l.is_empty() {
                l.push(0);
            }
            Senders::List(l)
        }
    };
    let mode = if rng.chance(1, 4) { Mode::Unordered } else { Mode::Ordered };
    let mut p = Params {
        n,
        senders,
        mode,
        window: rng.range(1, 8) as u32,
        max_size: rng.range(8, 3000) as usize,
        per_sender: rng.range(5, 60) as u32,
        reorder_data: rng.chance(1, 2),
        kills: Vec::new(),
        notify: rng.chance(1, 2),
        kill_leader_after: None,
        spikes: rng.chance(1, 2),
        partition_safety: false,
        silence: None,
        heal: None,
        heal_on_stop: None,
        silence_skew: 0,
        may_stop: Vec::new(),
        relay_min: 0,
        chunk: usize::MAX,
    };
    // Relaying: off, on for every message, or from a random size.
    p.relay_min = match rng.below(3) {
        0 => usize::MAX,
        1 => 0,
        _ => rng.range(8, p.max_size as u64) as usize,
    };
    // Chunks: none, many small ones, or a few.
    p.chunk = match rng.below(3) {
        0 => usize::MAX,
        1 => rng.range(1, 64) as usize,
        _ => rng.range(8, p.max_size as u64) as usize,
    };
    if kills {
        let t = rng.range(1_000, 60_000);
        let victim = rng.below(n as u64) as Rank;
        p.kills.push((t, victim));
        // Sometimes kill the member that leads the change (the lowest
        // survivor) while it is under way, keeping at least two alive.
        if rng.chance(1, 2) {
            p.kill_leader_after = Some(rng.range(0, 8_000));
        } else if rng.chance(1, 3) && n >= 4 {
            let other = (0..n).rev().find(|r| *r != victim).unwrap();
            p.kills.push((t + rng.range(0, 300_000), other));
            if n == 5 && rng.chance(1, 2) {
                let third = (0..n).find(|r| *r != victim && *r != other).unwrap();
                p.kills.push((t + rng.range(0, 300_000), third));
            }
        }
    }
    // One death always leaves a majority: then partition safety is on.
    p.partition_safety = p.kills.len() <= 1 && p.kill_leader_after.is_none();
    p
}

fn run_seed(seed: u64, kills: bool) -> Stats {
    let mut rng = Rng::new(seed ^ 0xabcdef);
    let p = random_params(&mut rng, kills);
    simulate(p, seed).stats
}

/// Runs one simulation; if it panics, says which seed and parameters
/// before passing the panic on.
fn simulate(p: Params, seed: u64) -> Sim {
    let desc = format!("seed {seed} {p:?}");
    match std::panic::catch_unwind(|| {
        let mut sim = Sim::new(p, seed);
        sim.run();
        sim
    }) {
        Ok(sim) => sim,
        Err(e) => {
            eprintln!("FAILED {desc}");
            std::panic::resume_unwind(e)
        }
    }
}

/// Seeds per randomized test: 200, or `GROUP_SIM_SEEDS`.
fn seeds() -> u64 {
    std::env::var("GROUP_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(200)
}

#[test]
fn many_seeds_no_failures() {
    let mut st = Stats::default();
    for seed in 0..seeds() {
        st.add(&run_seed(seed, false));
    }
    eprintln!("{st:?}");
    assert_eq!(st.view_changes, 0);
    assert!(st.null_frames > 1000, "nulls exercised");
    assert!(st.relayed > 1000, "relaying exercised");
    assert!(st.window_full > 1000, "full windows exercised");
    assert!(st.max_buffer_ratio > 0.3, "the bound is not vacuous");
    assert!(st.chunk_frames > 10_000, "chunks exercised");
    assert!(st.passed_before_whole > 1000, "chunks passed on before their message is whole");
}

#[test]
fn many_seeds_with_kills() {
    let mut st = Stats::default();
    for seed in 1_000_000..1_000_000 + seeds() {
        st.add(&run_seed(seed, true));
    }
    eprintln!("{st:?}");
    assert!(st.view_changes >= 200);
    assert!(st.kills_during_change >= 20, "kills during a change");
    assert!(st.leader_kills_during_change >= 10, "leader killed mid-change");
    assert!(st.trim_deliveries > 100, "ragged trims deliver something");
    assert!(st.carried > 0, "own messages delivered in a later view");
    assert!(st.wedged_refusals > 0);
    assert!(st.relayed > 1000, "relaying exercised");
    assert!(st.chunk_frames > 10_000, "chunks exercised");
    assert!(st.passed_before_whole > 1000, "chunks passed on before their message is whole");
}

#[test]
fn all_senders_ordered_three_members() {
    let p = Params {
        n: 3,
        senders: Senders::All,
        mode: Mode::Ordered,
        window: 4,
        max_size: 100,
        per_sender: 50,
        reorder_data: true,
        kills: Vec::new(),
        notify: false,
        kill_leader_after: None,
        spikes: false,
        partition_safety: true,
        silence: None,
        heal: None,
        heal_on_stop: None,
        silence_skew: 0,
        may_stop: Vec::new(),
        relay_min: 50,
        chunk: 30,
    };
    let mut sim = Sim::new(p, 7);
    sim.run();
    assert_eq!(sim.nodes[0].delivered.len(), 150);
}

#[test]
fn kill_leader_during_change() {
    let mut st = Stats::default();
    for seed in 0..100u64 {
        let mut rng = Rng::new(seed + 77);
        let n = rng.range(3, 5) as u32;
        let p = Params {
            n,
            senders: Senders::All,
            mode: if seed % 5 == 4 { Mode::Unordered } else { Mode::Ordered },
            window: rng.range(1, 6) as u32,
            max_size: 200,
            per_sender: 40,
            reorder_data: seed % 2 == 0,
            kills: vec![(rng.range(2_000, 40_000), rng.below(n as u64) as Rank)],
            notify: seed % 3 != 0,
            kill_leader_after: Some(rng.range(0, 1_500)),
            spikes: seed % 4 == 1,
            partition_safety: false,
            silence: None,
            heal: None,
            heal_on_stop: None,
            silence_skew: 0,
            may_stop: Vec::new(),
            relay_min: [0, 100, usize::MAX][seed as usize % 3],
            chunk: [usize::MAX, 37, 64][seed as usize / 3 % 3],
        };
        let sim = simulate(p, seed);
        // Everybody left agrees on a view of exactly the living.
        let live: Vec<Rank> = (0..n).filter(|r| sim.nodes[*r as usize].alive).collect();
        assert_eq!(live.len(), n as usize - 2);
        for r in &live {
            assert_eq!(sim.nodes[*r as usize].core.members(), &live[..]);
        }
        st.add(&sim.stats);
    }
    eprintln!("{st:?}");
    assert!(st.leader_kills_during_change >= 80, "{st:?}");
}

fn quiet(n: u32) -> Params {
    Params {
        n,
        senders: Senders::All,
        mode: Mode::Ordered,
        window: 4,
        max_size: 300,
        per_sender: 40,
        reorder_data: false,
        kills: Vec::new(),
        notify: false,
        kill_leader_after: None,
        spikes: false,
        partition_safety: true,
        silence: None,
        heal: None,
        heal_on_stop: None,
        silence_skew: 0,
        may_stop: Vec::new(),
        relay_min: 150,
        chunk: usize::MAX,
    }
}

/// A quiet group of 3 or 4 members (drawn from `rng`, as is the window)
/// in which member `r` goes silent at `t`, in the first 50 ms, and may
/// stop; spikes and relaying vary with `seed`. Returns (params, r, t).
fn silenced_group(rng: &mut Rng, seed: u64) -> (Params, Rank, u64) {
    let n = rng.range(3, 5) as u32;
    let r = rng.below(n as u64) as Rank;
    let mut p = quiet(n);
    p.window = rng.range(1, 6) as u32;
    p.spikes = seed.is_multiple_of(3);
    p.relay_min = [0, 150, usize::MAX][seed as usize % 3];
    let t = rng.range(1_000, 50_000);
    p.silence = Some((t, r));
    p.may_stop = vec![r];
    (p, r, t)
}

/// The silenced member `r` stopped without installing a view, and every
/// other member installed the view without it.
fn assert_the_rest_went_on_without(sim: &Sim, r: Rank) {
    assert!(!sim.nodes[r as usize].alive, "the silenced member did not stop");
    assert!(sim.nodes[r as usize].views.is_empty(), "the silenced member installed a view");
    let live: Vec<Rank> = (0..sim.p.n).filter(|j| *j != r).collect();
    for j in &live {
        assert_eq!(sim.nodes[*j as usize].core.members(), &live[..]);
    }
}

/// All rails of a member go silent while it keeps running: the others
/// exclude it and go on; it finds itself in a minority and stops instead of
/// installing a view of its own; what it delivered is a prefix of theirs.
#[test]
fn silenced_member_stops_and_the_rest_go_on() {
    let mut st = Stats::default();
    for seed in 0..100u64 {
        let mut rng = Rng::new(seed + 4242);
        let (mut p, r, t) = silenced_group(&mut rng, seed);
        p.mode = if seed % 4 == 3 { Mode::Unordered } else { Mode::Ordered };
        p.reorder_data = seed % 2 == 0;
        p.notify = seed % 5 < 3;
        p.chunk = [usize::MAX, 40, 100][seed as usize / 3 % 3];
        // Half the time its links come back after it stopped, and what it
        // sent while silent (its suspicions of everybody) arrives.
        let heal = (seed % 2 == 0).then(|| t + rng.range(1_000_000, 3_000_000));
        p.heal = heal;
        let mut sim = simulate(p, seed);
        if let Some(h) = heal {
            // Past the heal: the survivors take in the stopped member's
            // late frames and must neither stop (`handle` asserts it) nor
            // change their view.
            sim.advance(Some(h + 1_000_000));
        }
        assert_the_rest_went_on_without(&sim, r);
        st.add(&sim.stats);
    }
    eprintln!("{st:?}");
    assert_eq!(st.stopped, 100);
}

/// The silenced member's links come back just after it stopped, as they
/// do on the testbed: it suspected the others one by one (each when its
/// timeout ran out), and its rows with some of those suspicions can reach
/// a survivor whose own timeout for it has not run out yet. The survivors
/// must not take them in (they stopped each other: partition safety), but
/// exclude the silenced member and go on.
#[test]
fn a_member_that_heals_as_it_stops_does_not_take_the_others_down() {
    let mut st = Stats::default();
    for seed in 0..200u64 {
        let mut rng = Rng::new(seed + 977);
        let (mut p, r, _) = silenced_group(&mut rng, seed);
        p.heal_on_stop = Some((0, 3_000));
        p.silence_skew = 30_000;
        let mut sim = simulate(p, seed);
        // The survivors can finish before the silenced member's last
        // timeout ran out: let it run out, and its late frames arrive.
        let now = sim.now;
        sim.advance(Some(now + 1_000_000));
        assert_the_rest_went_on_without(&sim, r);
        st.add(&sim.stats);
    }
    eprintln!("{st:?}");
    assert_eq!(st.stopped, 200);
    // The race the test is about happened, often.
    assert!(st.late_suspicion_rows >= 50, "{st:?}");
}

/// With partition safety, a member of 3 that loses both others at once
/// stops (Partitioned) rather than carry on alone.
#[test]
fn lone_survivor_of_three_stops_with_partition_safety() {
    for seed in 0..20u64 {
        let mut p = quiet(3);
        p.kills = vec![(10_000 + seed * 500, 0), (10_000 + seed * 500, 2)];
        p.notify = seed % 2 == 0;
        p.may_stop = vec![1];
        let mut sim = Sim::new(p, seed);
        sim.advance(Some(2_000_000));
        assert!(sim.nodes[1].core.is_stopped());
        assert!(sim.nodes[1].views.is_empty());
        assert_eq!(sim.stats.stopped, 1);
    }
}

/// One sender of four relaying every message: each link of the chain
/// 0 -> 1 -> 2 -> 3 carries each message once, no other link carries any,
/// and everybody delivers all of them. Without relaying the sender sends
/// each message three times.
#[test]
fn one_sender_relays_each_message_once_along_the_chain() {
    for relay_min in [0, usize::MAX] {
        let mut p = quiet(4);
        p.senders = Senders::One(0);
        p.relay_min = relay_min;
        p.max_size = 200;
        let sim = simulate(p, 11);
        for n in &sim.nodes {
            assert_eq!(n.delivered.len(), 40);
        }
        let links: Vec<((Rank, Rank), u64)> = sim.data_links.iter().map(|(k, v)| (*k, *v)).collect();
        if relay_min == 0 {
            assert_eq!(links, vec![((0, 1), 40), ((1, 2), 40), ((2, 3), 40)]);
            assert_eq!(sim.stats.relayed, 80);
        } else {
            assert_eq!(links, vec![((0, 1), 40), ((0, 2), 40), ((0, 3), 40)]);
            assert_eq!(sim.stats.relayed, 0);
        }
    }
}

/// One sender of four, every message relayed in chunks of 10 bytes: each
/// link of the chain carries every chunk once, members pass chunks on
/// before they hold the whole message (the chain works in pipeline), and
/// everybody delivers every message intact (`handle` checks each payload).
/// Without relaying the sender sends each chunk three times.
#[test]
fn chunks_travel_the_chain_in_pipeline() {
    for relay_min in [0, usize::MAX] {
        let mut p = quiet(4);
        p.senders = Senders::One(0);
        p.relay_min = relay_min;
        p.chunk = 10;
        p.max_size = 200;
        let sim = simulate(p, 12);
        for n in &sim.nodes {
            assert_eq!(n.delivered.len(), 40);
        }
        // The chunks of one message: ceil(len / 10).
        let chunks: u64 = sim.nodes[1].delivered.iter().map(|d| d.3.len().div_ceil(10) as u64).sum();
        assert!(chunks > 200, "{chunks} chunks");
        assert_eq!(sim.stats.chunk_frames, sim.stats.data_frames);
        let links: Vec<((Rank, Rank), u64)> = sim.data_links.iter().map(|(k, v)| (*k, *v)).collect();
        if relay_min == 0 {
            assert_eq!(links, vec![((0, 1), chunks), ((1, 2), chunks), ((2, 3), chunks)]);
            assert_eq!(sim.stats.relayed, 2 * chunks);
            // Without pipelining none would be (a member passed a message on
            // once it held all of it).
            assert!(sim.stats.passed_before_whole * 4 > sim.stats.relayed, "{:?}", sim.stats);
        } else {
            assert_eq!(links, vec![((0, 1), chunks), ((0, 2), chunks), ((0, 3), chunks)]);
            assert_eq!(sim.stats.relayed, 0);
        }
    }
}
