//! Scheduling message bytes across rails.
//!
//! A [`Scheduler`] is built per peer by a [`SchedulerFactory`] from a
//! [`PolicyKind`]; the core keeps one per policy in the [`PolicyTable`] and
//! picks by message size. For each message the scheduler first makes a
//! [`Plan`] (`start`), then hands out [`Chunk`]s one at a time (`next`)
//! whenever the core has rails with room. Returning `None` from `next`
//! means "wait": the core asks again after the next acknowledgement, rail
//! event or new message. Chunks of one plan tile the message exactly once.
//!
//! Rail state comes in as [`RailView`]s that the core keeps up to date:
//! whether the rail is up, its bytes in flight (assigned, not yet
//! acknowledged), its window, and its measured throughput.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::time::Time;
use crate::units::{format_size, parse_size};

/// Throughput assumed for a rail nothing is known about (bytes/s). Only the
/// ratio between rails matters, so equal unknown rails split evenly.
pub const DEFAULT_RATE: f64 = 1.0e9;

/// How long a rail may go without a fresh throughput sample before the
/// adaptive scheduler sends it a probe chunk.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(100);

/// A rail's short window holds at least this many of the messages placed
/// against it, whatever its floor: a floor low enough to split 1 KiB
/// messages by acknowledgements (`Config::spread_split_min`) let only one
/// 16 KiB message at a time onto each rail (0.77 x on 2 x 2 Gbit).
pub const SHORT_WINDOW_MESSAGES: u64 = 4;

/// `spread`: a pair's preferred rail keeps whole messages while it has
/// less than this in flight; beyond, messages go to the rail predicted to
/// deliver them first.
pub const SPREAD_BACKLOG: u64 = 32 << 10;

/// The scheduler's view of one rail to one peer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RailView {
    pub up: bool,
    /// Bytes assigned to this rail and not yet acknowledged.
    pub inflight: u64,
    /// Bytes of `inflight` still ahead of the rail's link: less what it
    /// has carried since its last acknowledgement, at `rate` (acknowledged
    /// bytes come back in batches). What finish times are predicted from.
    pub undelivered: u64,
    /// Most bytes this rail may have in flight.
    pub window: u64,
    /// Most bytes in flight beyond which `spread` places no more small
    /// whole messages here (at most `window`).
    pub small_window: u64,
    /// Measured throughput in bytes/s: the largest sample of the last
    /// 250 ms, else of the last 10 s; 0 = none that recent.
    pub rate: f64,
    /// Bandwidth the rail advertises or was configured with (bytes/s), 0 = unknown.
    pub bandwidth: u64,
    /// Estimated one-way latency: half the smallest round trip beyond the
    /// time the bytes took to drain (not a fragment's own transmission).
    pub latency: Duration,
    /// When `rate` was last refreshed by a measurement.
    pub last_sample: Option<Time>,
    /// When a chunk was last assigned to this rail.
    pub last_used: Option<Time>,
}

impl RailView {
    pub fn has_room(&self) -> bool {
        self.up && self.inflight < self.window
    }
    /// Room for a whole message of `len` bytes in the short window, which
    /// holds at least [`SHORT_WINDOW_MESSAGES`] such messages.
    pub fn has_room_for_small(&self, len: u64) -> bool {
        self.up && self.inflight < self.small_window.max(SHORT_WINDOW_MESSAGES * len).min(self.window)
    }
    /// Throughput to plan with: measured, else advertised, else default.
    pub fn planning_rate(&self) -> f64 {
        if self.rate > 0.0 {
            self.rate
        } else if self.bandwidth > 0 {
            self.bandwidth as f64
        } else {
            DEFAULT_RATE
        }
    }
    /// Predicted time until `extra` more bytes assigned now would be delivered.
    pub fn predicted_finish(&self, extra: u64) -> f64 {
        self.latency.as_secs_f64() + (self.undelivered + extra) as f64 / self.planning_rate()
    }
    /// `len` more bytes were assigned to this rail.
    pub fn assign(&mut self, len: u64) {
        self.inflight += len;
        self.undelivered += len;
    }
    fn stale(&self, now: Time) -> bool {
        let last = match (self.last_sample, self.last_used) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        last.is_none_or(|t| now.since(t) > PROBE_INTERVAL)
    }
}

/// One contiguous piece of a message assigned to one rail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub rail: usize,
    pub offset: u64,
    pub len: u64,
}

/// A contiguous region of a message reserved for one rail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub rail: usize,
    pub next: u64,
    pub end: u64,
}

/// Scheduling state of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub len: u64,
    /// Largest chunk to hand out.
    pub chunk: u64,
    /// Sequential plans: first byte not yet assigned.
    pub next: u64,
    /// Sequential plans pinned to one rail (single, round-robin).
    pub rail: Option<usize>,
    /// Partitioned plans (stripe, weighted): one region per rail.
    pub parts: Vec<Part>,
    /// An empty message is one empty chunk; set once it is handed out.
    pub empty_done: bool,
    /// `spread`: the message, whose rail is picked at its first chunk.
    pub spread: Option<MessageInfo>,
}

impl Plan {
    fn sequential(len: u64, chunk: u64, rail: Option<usize>) -> Plan {
        Plan { len, chunk: chunk.max(1), next: 0, rail, parts: Vec::new(), empty_done: false, spread: None }
    }
    /// A plan whose one chunk, the whole message, went on `rail`.
    pub(crate) fn whole(len: u64, rail: usize) -> Plan {
        Plan { len, chunk: len.max(1), next: len, rail: Some(rail), parts: Vec::new(), empty_done: true, spread: None }
    }
    /// Bytes not yet assigned to any rail.
    pub fn remaining(&self) -> u64 {
        if self.parts.is_empty() { self.len - self.next } else { self.parts.iter().map(|p| p.end - p.next).sum() }
    }
    pub fn is_done(&self) -> bool {
        self.remaining() == 0 && (self.len > 0 || self.empty_done)
    }
    /// Takes up to `max` bytes (at least one) from the sequential cursor.
    fn take_seq(&mut self, rail: usize, max: u64) -> Chunk {
        if self.len == 0 {
            self.empty_done = true;
            return Chunk { rail, offset: 0, len: 0 };
        }
        let len = max.min(self.len - self.next).min(self.chunk).max(1);
        let c = Chunk { rail, offset: self.next, len };
        self.next += len;
        c
    }
}

/// What the scheduler knows about the message being planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageInfo {
    pub len: u64,
    /// Our rank and the peer's, for rank-based rail picks.
    pub rank: u32,
    pub peer: u32,
}

/// A rail-scheduling algorithm for the messages to one peer.
pub trait Scheduler: Send {
    fn kind(&self) -> PolicyKind;
    /// Makes the plan for a new message.
    fn start(&mut self, msg: &MessageInfo, rails: &[RailView], chunk: u64, now: Time) -> Plan;
    /// The next chunk of `plan`, or `None` to wait (or when done).
    fn next(&mut self, plan: &mut Plan, rails: &[RailView], now: Time) -> Option<Chunk>;
}

/// Builds schedulers.
pub trait SchedulerFactory: Send + Sync {
    fn build(&self, kind: PolicyKind) -> Box<dyn Scheduler>;
}

/// The built-in schedulers.
#[derive(Debug, Default, Clone, Copy)]
pub struct BuiltinSchedulers;

impl SchedulerFactory for BuiltinSchedulers {
    fn build(&self, kind: PolicyKind) -> Box<dyn Scheduler> {
        match kind {
            PolicyKind::Single => Box::new(Single),
            PolicyKind::RoundRobin => Box::new(RoundRobin { counter: 0 }),
            PolicyKind::Stripe => Box::new(Partitioned { weighted: false }),
            PolicyKind::Weighted => Box::new(Partitioned { weighted: true }),
            PolicyKind::Adaptive => Box::new(Adaptive),
            PolicyKind::Spread => Box::new(Spread),
        }
    }
}

/// Gives up rails without a measured rate the largest measured one, when
/// some have one: a rail that has not yet carried a backlog is not
/// assumed slower (nor, against [`DEFAULT_RATE`], much faster) than the
/// measured ones. Its first backlog corrects it.
pub fn assume_unmeasured_as_fast(rails: &mut [RailView]) {
    let best = rails.iter().filter(|r| r.up).map(|r| r.rate).fold(0.0, f64::max);
    if best > 0.0 {
        for r in rails.iter_mut().filter(|r| r.up && r.rate <= 0.0) {
            r.rate = best;
        }
    }
}

fn up_rails(rails: &[RailView]) -> Vec<usize> {
    rails.iter().enumerate().filter(|(_, r)| r.up).map(|(i, _)| i).collect()
}

/// The `(n mod up-rails)`-th up rail, without allocating.
fn nth_up(rails: &[RailView], n: usize) -> Option<usize> {
    nth_where(rails.iter().map(|r| r.up), n)
}

/// The index of the `(n mod k)`-th `true` of `up`, which has `k`: the
/// preferred rail of `single` and `spread` (over the rails' views here,
/// over the rails themselves on the core's direct path).
#[inline]
pub(crate) fn nth_where(up: impl Iterator<Item = bool> + Clone, n: usize) -> Option<usize> {
    let count = up.clone().filter(|&u| u).count();
    (count > 0).then(|| up.enumerate().filter(|&(_, u)| u).nth(n % count).map(|(i, _)| i)).flatten()
}

/// Next chunk of a plan pinned to `plan.rail`, moving to another up rail if
/// that one went down.
fn next_pinned(plan: &mut Plan, rails: &[RailView]) -> Option<Chunk> {
    if plan.is_done() {
        return None;
    }
    let rail = match plan.rail {
        Some(r) if rails.get(r).is_some_and(|r| r.up) => r,
        _ => {
            let r = least_loaded(rails)?;
            plan.rail = Some(r);
            r
        }
    };
    if !rails[rail].has_room() {
        return None;
    }
    Some(plan.take_seq(rail, u64::MAX))
}

/// The up rail that would finish one more byte first.
pub fn least_loaded(rails: &[RailView]) -> Option<usize> {
    rails
        .iter()
        .enumerate()
        .filter(|(_, r)| r.up)
        .min_by(|a, b| a.1.predicted_finish(1).total_cmp(&b.1.predicted_finish(1)))
        .map(|(i, _)| i)
}

/// Whole message on one rail, picked from the ranks so both directions of
/// a pair use the same rail and different pairs spread over rails.
struct Single;

impl Scheduler for Single {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Single
    }
    fn start(&mut self, msg: &MessageInfo, rails: &[RailView], chunk: u64, _now: Time) -> Plan {
        let rail = nth_up(rails, msg.rank as usize + msg.peer as usize);
        Plan::sequential(msg.len, chunk, rail)
    }
    fn next(&mut self, plan: &mut Plan, rails: &[RailView], _now: Time) -> Option<Chunk> {
        next_pinned(plan, rails)
    }
}

/// Whole messages alternate over the rails.
struct RoundRobin {
    counter: usize,
}

impl Scheduler for RoundRobin {
    fn kind(&self) -> PolicyKind {
        PolicyKind::RoundRobin
    }
    fn start(&mut self, msg: &MessageInfo, rails: &[RailView], chunk: u64, _now: Time) -> Plan {
        let rail = nth_up(rails, self.counter);
        self.counter = self.counter.wrapping_add(1);
        Plan::sequential(msg.len, chunk, rail)
    }
    fn next(&mut self, plan: &mut Plan, rails: &[RailView], _now: Time) -> Option<Chunk> {
        next_pinned(plan, rails)
    }
}

/// Whole messages on the pair's preferred rail (as `single`) while it is
/// nearly idle, so a lone small message keeps one rail's latency; once
/// [`SPREAD_BACKLOG`] bytes queue on it, each message goes whole to the
/// rail predicted to deliver it first among those with room in their
/// short window ([`RailView::small_window`]), so a stream of small
/// messages uses every rail (MVAPICH2's round-robin gets the bandwidth but
/// loses the latency; `single` the other way round). When every short
/// window is full the message waits, and goes to the first rail whose
/// acknowledgements free room: the split follows what each rail delivers,
/// which estimates taken from bursts of a few hundred microseconds do not
/// tell reliably.
struct Spread;

impl Spread {
    /// The rail for a message of `len` bytes given the rails' state now.
    fn pick(&self, msg: &MessageInfo, rails: &[RailView]) -> Option<usize> {
        let preferred = nth_up(rails, msg.rank as usize + msg.peer as usize);
        match preferred {
            Some(p) if rails[p].inflight < SPREAD_BACKLOG => Some(p),
            _ => rails
                .iter()
                .enumerate()
                .filter(|(_, r)| r.has_room_for_small(msg.len))
                .min_by(|a, b| {
                    let (fa, fb) = (a.1.predicted_finish(msg.len), b.1.predicted_finish(msg.len));
                    // Ties go to the preferred rail.
                    fa.total_cmp(&fb).then_with(|| (Some(b.0) == preferred).cmp(&(Some(a.0) == preferred)))
                })
                .map(|(i, _)| i),
        }
    }
}

impl Scheduler for Spread {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Spread
    }
    /// The rail is chosen when the message's first chunk is handed out,
    /// not here: a burst of messages starts before any of it is assigned,
    /// and each must see where the ones before it went.
    fn start(&mut self, msg: &MessageInfo, _rails: &[RailView], chunk: u64, _now: Time) -> Plan {
        let mut plan = Plan::sequential(msg.len, chunk, None);
        plan.spread = Some(*msg);
        plan
    }
    fn next(&mut self, plan: &mut Plan, rails: &[RailView], _now: Time) -> Option<Chunk> {
        if plan.rail.is_none() {
            let msg = plan.spread?;
            plan.rail = Some(self.pick(&msg, rails)?);
        }
        next_pinned(plan, rails)
    }
}

/// Splits the message into one region per up rail, equal (`stripe`) or
/// proportional to bandwidth (`weighted`), fixed when the message starts.
struct Partitioned {
    weighted: bool,
}

/// Splits `len` in proportion to `weights`; the parts sum to `len` exactly.
pub fn split_proportional(len: u64, weights: &[f64]) -> Vec<u64> {
    let total: f64 = weights.iter().sum();
    if weights.is_empty() {
        return Vec::new();
    }
    if total <= 0.0 || !total.is_finite() {
        return split_proportional(len, &vec![1.0; weights.len()]);
    }
    let mut out: Vec<u64> = weights.iter().map(|w| ((len as f64) * w / total).floor() as u64).collect();
    let assigned: u64 = out.iter().sum();
    // Hand out the rounding remainder, largest weight first.
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
    let mut left = len.saturating_sub(assigned);
    for &i in order.iter().cycle() {
        if left == 0 {
            break;
        }
        out[i] += 1;
        left -= 1;
    }
    out
}

impl Scheduler for Partitioned {
    fn kind(&self) -> PolicyKind {
        if self.weighted { PolicyKind::Weighted } else { PolicyKind::Stripe }
    }
    fn start(&mut self, msg: &MessageInfo, rails: &[RailView], chunk: u64, _now: Time) -> Plan {
        let up = up_rails(rails);
        let mut plan = Plan::sequential(msg.len, chunk, None);
        if up.is_empty() || msg.len == 0 {
            // Nothing to split: fall back to a sequential plan on any rail.
            plan.rail = up.first().copied();
            return plan;
        }
        let weights: Vec<f64> =
            up.iter().map(|&i| if self.weighted { weight_of(&rails[i], rails) } else { 1.0 }).collect();
        let sizes = split_proportional(msg.len, &weights);
        let mut at = 0;
        for (&rail, &size) in up.iter().zip(&sizes) {
            if size > 0 {
                plan.parts.push(Part { rail, next: at, end: at + size });
            }
            at += size;
        }
        plan.next = plan.len;
        plan
    }
    fn next(&mut self, plan: &mut Plan, rails: &[RailView], _now: Time) -> Option<Chunk> {
        if plan.parts.is_empty() {
            return next_pinned(plan, rails);
        }
        // Parts of downed rails move to the least loaded up rail.
        let fallback = least_loaded(rails);
        for p in plan.parts.iter_mut() {
            if p.next < p.end && !rails.get(p.rail).is_some_and(|r| r.up) {
                p.rail = fallback?;
            }
        }
        let chunk = plan.chunk;
        // Serve the part whose rail has room and is least loaded.
        let best = plan
            .parts
            .iter_mut()
            .filter(|p| p.next < p.end && rails[p.rail].has_room())
            .min_by(|a, b| rails[a.rail].predicted_finish(0).total_cmp(&rails[b.rail].predicted_finish(0)))?;
        let len = (best.end - best.next).min(chunk);
        let c = Chunk { rail: best.rail, offset: best.next, len };
        best.next += len;
        Some(c)
    }
}

/// Weight of a rail for the weighted policy: advertised bandwidth when every
/// up rail advertises one, else measured throughput when every up rail has
/// one, else equal.
fn weight_of(r: &RailView, all: &[RailView]) -> f64 {
    let ups = all.iter().filter(|r| r.up);
    if ups.clone().all(|r| r.bandwidth > 0) {
        r.bandwidth as f64
    } else if ups.clone().all(|r| r.rate > 0.0) {
        r.rate
    } else {
        1.0
    }
}

/// Each next chunk goes to the rail predicted to deliver it first, from
/// measured throughput and bytes in flight. Near the end of a message the
/// chunk shrinks to the rail's fair share of what is left, so all rails
/// finish together. Rails without a recent measurement get a probe chunk.
struct Adaptive;

/// Smallest chunk the adaptive tail split hands out.
const MIN_TAIL_CHUNK: u64 = 4096;

impl Adaptive {
    /// Water-filling: the time `t` at which all rails would finish if the
    /// `remaining` bytes were spread optimally, given what is in flight.
    fn fill_level(rails: &[RailView], remaining: u64) -> f64 {
        let ups: Vec<&RailView> = rails.iter().filter(|r| r.up).collect();
        let (mut lo, mut hi) = (0.0f64, 1.0f64);
        let capacity = |t: f64| -> f64 {
            ups.iter()
                .map(|r| (r.planning_rate() * (t - r.latency.as_secs_f64()) - r.undelivered as f64).max(0.0))
                .sum()
        };
        while capacity(hi) < remaining as f64 && hi < 1.0e6 {
            hi *= 2.0;
        }
        for _ in 0..50 {
            let mid = 0.5 * (lo + hi);
            if capacity(mid) < remaining as f64 { lo = mid } else { hi = mid }
        }
        hi
    }
}

impl Scheduler for Adaptive {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Adaptive
    }
    fn start(&mut self, msg: &MessageInfo, _rails: &[RailView], chunk: u64, _now: Time) -> Plan {
        Plan::sequential(msg.len, chunk, None)
    }
    fn next(&mut self, plan: &mut Plan, rails: &[RailView], now: Time) -> Option<Chunk> {
        if plan.is_done() {
            return None;
        }
        let remaining = plan.len - plan.next;
        if remaining == 0 {
            let r = least_loaded(rails).filter(|&r| rails[r].has_room())?;
            return Some(plan.take_seq(r, 0));
        }
        let c = remaining.min(plan.chunk);
        // A stale rail with room gets a probe, unless it is the only one.
        if rails.iter().filter(|r| r.up).count() > 1
            && let Some(i) = rails.iter().position(|r| r.has_room() && r.stale(now))
        {
            return Some(plan.take_seq(i, c));
        }
        let best = rails
            .iter()
            .enumerate()
            .filter(|(_, r)| r.up)
            .min_by(|a, b| a.1.predicted_finish(c).total_cmp(&b.1.predicted_finish(c)))
            .map(|(i, _)| i)?;
        if !rails[best].has_room() {
            return None;
        }
        let mut len = c;
        if remaining <= plan.chunk * rails.len() as u64 {
            // Tail: give this rail its share of the remainder, not more.
            let t = Self::fill_level(rails, remaining);
            let r = &rails[best];
            let share = r.planning_rate() * (t - r.latency.as_secs_f64()) - r.undelivered as f64;
            // Whole cache lines, so an even split of an even size is exact.
            let share = (((share.max(0.0) / 64.0).round() as u64) * 64).max(MIN_TAIL_CHUNK);
            len = len.min(share);
        }
        Some(plan.take_seq(best, len))
    }
}

/// A scheduling policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    Single,
    RoundRobin,
    Stripe,
    Weighted,
    Adaptive,
    Spread,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 6] = [
        PolicyKind::Single,
        PolicyKind::RoundRobin,
        PolicyKind::Stripe,
        PolicyKind::Weighted,
        PolicyKind::Adaptive,
        PolicyKind::Spread,
    ];
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Single => "single",
            PolicyKind::RoundRobin => "round-robin",
            PolicyKind::Stripe => "stripe",
            PolicyKind::Weighted => "weighted",
            PolicyKind::Adaptive => "adaptive",
            PolicyKind::Spread => "spread",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        PolicyKind::ALL
            .into_iter()
            .find(|k| {
                k.name() == t
                    || (t == "rr" && *k == PolicyKind::RoundRobin)
                    || (t == "roundrobin" && *k == PolicyKind::RoundRobin)
            })
            .ok_or_else(|| {
                format!("unknown policy '{s}' (choose single, spread, round-robin, stripe, weighted or adaptive)")
            })
    }
}

/// Policy per message size: `16K:single,*:adaptive` means messages of at
/// most 16 KiB use `single` and all larger ones `adaptive`. A bare policy
/// name means `*:name`. Tiers must have increasing sizes and end with `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyTable {
    /// (largest size, policy); `None` = any size.
    pub tiers: Vec<(Option<u64>, PolicyKind)>,
}

impl PolicyTable {
    pub fn uniform(kind: PolicyKind) -> PolicyTable {
        PolicyTable { tiers: vec![(None, kind)] }
    }
    /// The policy for a message of `len` bytes.
    pub fn lookup(&self, len: u64) -> PolicyKind {
        self.tiers
            .iter()
            .find(|(max, _)| max.is_none_or(|m| len <= m))
            .or(self.tiers.last())
            .map(|t| t.1)
            .unwrap_or(PolicyKind::Single)
    }
    /// Index of the tier used for `len`.
    pub fn tier_of(&self, len: u64) -> usize {
        self.tiers
            .iter()
            .position(|(max, _)| max.is_none_or(|m| len <= m))
            .unwrap_or(self.tiers.len().saturating_sub(1))
    }
}

impl Default for PolicyTable {
    /// Small messages keep one rail's latency, and streams of them spread
    /// over every rail; larger messages are split over every rail.
    fn default() -> Self {
        "16K:spread,*:adaptive".parse().expect("default policy table parses")
    }
}

impl FromStr for PolicyTable {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut tiers = Vec::new();
        for item in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (size, name) = match item.split_once(':') {
                Some((a, b)) => (a.trim(), b.trim()),
                None => ("*", item),
            };
            let max = if size == "*" { None } else { Some(parse_size(size)?) };
            let kind: PolicyKind = name.parse()?;
            if let Some((prev, _)) = tiers.last() {
                match (prev, max) {
                    (None, _) => return Err(format!("policy '{s}': nothing may follow the '*' tier")),
                    (Some(p), Some(m)) if m <= *p => {
                        return Err(format!(
                            "policy '{s}': tier sizes must increase ({} after {})",
                            format_size(m),
                            format_size(*p)
                        ));
                    }
                    _ => {}
                }
            }
            tiers.push((max, kind));
        }
        match tiers.last() {
            None => Err("empty policy table (example: 16K:single,*:adaptive)".into()),
            Some((Some(_), _)) => Err(format!("policy '{s}' must end with a '*:POLICY' tier for the largest messages")),
            Some((None, _)) => Ok(PolicyTable { tiers }),
        }
    }
}

impl fmt::Display for PolicyTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (max, kind)) in self.tiers.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match max {
                Some(m) => write!(f, "{}:{}", format_size(*m), kind)?,
                None => write!(f, "*:{kind}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rail(rate: f64) -> RailView {
        RailView {
            up: true,
            inflight: 0,
            undelivered: 0,
            window: u64::MAX,
            small_window: u64::MAX,
            rate,
            bandwidth: 0,
            latency: Duration::ZERO,
            last_sample: Some(Time::ZERO),
            last_used: Some(Time::ZERO),
        }
    }

    /// Runs a plan to completion with unlimited windows, charging each
    /// chunk to its rail, and returns the chunks.
    fn drain(kind: PolicyKind, len: u64, chunk: u64, rails: &mut [RailView]) -> Vec<Chunk> {
        let mut s = BuiltinSchedulers.build(kind);
        let msg = MessageInfo { len, rank: 0, peer: 1 };
        let mut plan = s.start(&msg, rails, chunk, Time::ZERO);
        let mut out = Vec::new();
        while let Some(c) = s.next(&mut plan, rails, Time::ZERO) {
            rails[c.rail].assign(c.len);
            out.push(c);
            assert!(out.len() < 100_000, "plan does not terminate");
        }
        assert!(plan.is_done());
        out
    }

    fn assert_tiles(chunks: &[Chunk], len: u64) {
        let mut v: Vec<(u64, u64)> = chunks.iter().map(|c| (c.offset, c.len)).collect();
        v.sort();
        let mut at = 0;
        for (o, l) in v {
            assert_eq!(o, at, "gap or overlap at {o}");
            at += l;
        }
        assert_eq!(at, len);
    }

    #[test]
    fn every_policy_tiles_every_size() {
        for kind in PolicyKind::ALL {
            for len in [0u64, 1, 7, 4096, 65537, 1 << 20, (4 << 20) + 3] {
                for n in 1..=4 {
                    let mut rails: Vec<RailView> = (0..n).map(|i| rail(1e9 * (i + 1) as f64)).collect();
                    let chunks = drain(kind, len, 64 << 10, &mut rails);
                    assert_tiles(&chunks, len);
                    if len == 0 {
                        assert_eq!(chunks.len(), 1, "{kind}: an empty message is one empty chunk");
                    }
                    assert!(chunks.iter().all(|c| c.len <= 64 << 10));
                }
            }
        }
    }

    #[test]
    fn single_and_round_robin_use_one_rail_per_message() {
        let mut rails = vec![rail(1e9), rail(1e9)];
        let c = drain(PolicyKind::Single, 1 << 20, 64 << 10, &mut rails);
        assert!(c.iter().all(|c| c.rail == 1), "rank 0 + peer 1 picks rail 1");
        let mut s = BuiltinSchedulers.build(PolicyKind::RoundRobin);
        let msg = MessageInfo { len: 10, rank: 0, peer: 1 };
        let picks: Vec<usize> = (0..4)
            .map(|_| {
                let mut p = s.start(&msg, &rails, 1 << 20, Time::ZERO);
                s.next(&mut p, &rails, Time::ZERO).unwrap().rail
            })
            .collect();
        assert_eq!(picks, vec![0, 1, 0, 1]);
    }

    #[test]
    fn stripe_splits_equally() {
        let mut rails = vec![rail(1e9), rail(3e9), rail(1e9)];
        let chunks = drain(PolicyKind::Stripe, 3 << 20, 64 << 10, &mut rails);
        for r in 0..3 {
            let bytes: u64 = chunks.iter().filter(|c| c.rail == r).map(|c| c.len).sum();
            assert_eq!(bytes, 1 << 20);
        }
    }

    #[test]
    fn weighted_follows_bandwidth() {
        let mut rails = vec![rail(0.0), rail(0.0)];
        rails[0].bandwidth = 125_000_000;
        rails[1].bandwidth = 375_000_000;
        let chunks = drain(PolicyKind::Weighted, 4 << 20, 64 << 10, &mut rails);
        let r0: u64 = chunks.iter().filter(|c| c.rail == 0).map(|c| c.len).sum();
        assert_eq!(r0, 1 << 20, "a quarter of the bytes on the 1/4-bandwidth rail");
    }

    #[test]
    fn adaptive_balances_finish_times_on_unequal_rails() {
        let mut rails = vec![rail(1.25e8), rail(3.75e8)];
        let chunks = drain(PolicyKind::Adaptive, 4 << 20, 64 << 10, &mut rails);
        let t0 = rails[0].inflight as f64 / 1.25e8;
        let t1 = rails[1].inflight as f64 / 3.75e8;
        assert!((t0 - t1).abs() < 0.0005, "finish times {t0} vs {t1}");
        assert_tiles(&chunks, 4 << 20);
    }

    #[test]
    fn adaptive_plans_a_tail_from_undelivered_bytes_not_unacknowledged_ones() {
        // Two equal rails, each 768 KiB from done; rail 0's last 256 KiB
        // have gone out but their acknowledgement is not back yet.
        let mut rails = vec![rail(2.5e8), rail(2.5e8)];
        rails[0].inflight = 1 << 20;
        rails[0].undelivered = 768 << 10;
        rails[1].assign(768 << 10);
        let chunks = drain(PolicyKind::Adaptive, 512 << 10, 256 << 10, &mut rails);
        let r0: u64 = chunks.iter().filter(|c| c.rail == 0).map(|c| c.len).sum();
        // From `inflight`, rail 0 would get 128 KiB and finish 0.5 ms
        // before rail 1.
        assert_eq!(r0, 256 << 10, "an even split: {chunks:?}");
        assert_eq!(chunks.len(), 2, "one piece each: {chunks:?}");
        assert_eq!(rails[0].undelivered, rails[1].undelivered);
        // The rail predicted to finish first is the one with fewer bytes
        // ahead, not fewer unacknowledged.
        let mut rails = vec![rail(2.5e8), rail(2.5e8)];
        rails[0].inflight = 1 << 20;
        rails[0].undelivered = 256 << 10;
        rails[1].assign(512 << 10);
        assert_eq!(least_loaded(&rails), Some(0));
    }

    #[test]
    fn unmeasured_rails_are_assumed_as_fast_as_the_fastest_measured() {
        let mut rails = vec![rail(2e8), rail(0.0), rail(3e8), rail(0.0)];
        rails[3].up = false;
        assume_unmeasured_as_fast(&mut rails);
        let rates: Vec<f64> = rails.iter().map(|r| r.rate).collect();
        assert_eq!(rates, vec![2e8, 3e8, 3e8, 0.0], "the down rail is left alone");
        // With nothing measured, nothing changes (equal default rates).
        let mut rails = vec![rail(0.0), rail(0.0)];
        assume_unmeasured_as_fast(&mut rails);
        assert!(rails.iter().all(|r| r.rate == 0.0));
        // Without the rule an unmeasured rail counts as 1 GB/s against a
        // measured 200 MB/s and takes nearly all of a lone message.
        let mut rails = vec![rail(2e8), rail(0.0)];
        assume_unmeasured_as_fast(&mut rails);
        let chunks = drain(PolicyKind::Adaptive, 256 << 10, 256 << 10, &mut rails);
        let r1: u64 = chunks.iter().filter(|c| c.rail == 1).map(|c| c.len).sum();
        assert_eq!(r1, 128 << 10, "an even split");
    }

    #[test]
    fn adaptive_waits_for_the_best_rail() {
        let mut rails = vec![rail(1e8), rail(1e9)];
        rails[1].assign(1 << 20);
        rails[1].window = 1 << 20; // full
        let mut s = BuiltinSchedulers.build(PolicyKind::Adaptive);
        let msg = MessageInfo { len: 64 << 10, rank: 0, peer: 1 };
        let mut p = s.start(&msg, &rails, 64 << 10, Time::ZERO);
        // Rail 1 finishes 1 MiB + 64K at 1 GB/s (1.1 ms) before rail 0 does
        // 64K at 100 MB/s (0.65 ms)? No: rail 0 wins here.
        assert_eq!(s.next(&mut p, &rails, Time::ZERO).map(|c| c.rail), Some(0));
        let mut rails2 = rails.clone();
        rails2[0].rate = 1e7; // 6.5 ms for rail 0: waiting for rail 1 is better
        let mut p = s.start(&msg, &rails2, 64 << 10, Time::ZERO);
        assert_eq!(s.next(&mut p, &rails2, Time::ZERO), None);
    }

    #[test]
    fn adaptive_probes_stale_rails() {
        let mut rails = vec![rail(1e7), rail(1e9)];
        rails[0].last_sample = None;
        rails[0].last_used = None;
        let mut s = BuiltinSchedulers.build(PolicyKind::Adaptive);
        let msg = MessageInfo { len: 1 << 20, rank: 0, peer: 1 };
        let now = Time::ZERO + Duration::from_secs(1);
        let mut p = s.start(&msg, &rails, 64 << 10, now);
        assert_eq!(s.next(&mut p, &rails, now).map(|c| c.rail), Some(0));
    }

    #[test]
    fn spread_keeps_the_preferred_rail_while_idle_and_spreads_a_backlog() {
        let mut rails = vec![rail(1e9), rail(1e9)];
        let mut s = BuiltinSchedulers.build(PolicyKind::Spread);
        let msg = MessageInfo { len: 4096, rank: 0, peer: 1 };
        // Idle: the preferred rail ((0 + 1) % 2 = 1), every time.
        for _ in 0..3 {
            let mut p = s.start(&msg, &rails, 64 << 10, Time::ZERO);
            assert_eq!(s.next(&mut p, &rails, Time::ZERO).map(|c| c.rail), Some(1));
        }
        // A stream: whole messages land on both rails, evenly, even when
        // the whole burst starts before any chunk is handed out.
        let mut on = [0u64; 2];
        let mut plans: Vec<Plan> = (0..64).map(|_| s.start(&msg, &rails, 64 << 10, Time::ZERO)).collect();
        for p in plans.iter_mut() {
            let c = s.next(p, &rails, Time::ZERO).unwrap();
            assert_eq!((c.offset, c.len), (0, 4096), "whole messages");
            rails[c.rail].assign(c.len);
            on[c.rail] += c.len;
        }
        assert!(on[0] > 100_000 && on[1] > 100_000, "both rails used: {on:?}");
        assert!(on[0].abs_diff(on[1]) <= SPREAD_BACKLOG + 4096, "evenly: {on:?}");
    }

    #[test]
    fn plans_survive_a_rail_going_down() {
        for kind in PolicyKind::ALL {
            let mut rails = vec![rail(1e9), rail(1e9)];
            let mut s = BuiltinSchedulers.build(kind);
            let msg = MessageInfo { len: 1 << 20, rank: 1, peer: 0 };
            let mut plan = s.start(&msg, &rails, 64 << 10, Time::ZERO);
            let mut chunks = vec![s.next(&mut plan, &rails, Time::ZERO).unwrap()];
            rails[1].up = false;
            while let Some(c) = s.next(&mut plan, &rails, Time::ZERO) {
                assert_eq!(c.rail, 0, "{kind}: nothing goes to a down rail");
                chunks.push(c);
            }
            assert_tiles(&chunks, 1 << 20);
        }
    }

    #[test]
    fn split_proportional_is_exact() {
        assert_eq!(split_proportional(10, &[1.0, 1.0, 1.0]), vec![4, 3, 3]);
        assert_eq!(split_proportional(7, &[0.0, 0.0]), vec![4, 3]);
        assert_eq!(split_proportional(100, &[1.0, 3.0]), vec![25, 75]);
    }

    #[test]
    fn policy_table_parse() {
        let t: PolicyTable = "16K:single,*:adaptive".parse().unwrap();
        assert_eq!(t.lookup(0), PolicyKind::Single);
        assert_eq!(PolicyTable::default().to_string(), "16K:spread,*:adaptive");
        assert_eq!(t.lookup(16384), PolicyKind::Single);
        assert_eq!(t.lookup(16385), PolicyKind::Adaptive);
        assert_eq!(t.to_string(), "16K:single,*:adaptive");
        let t: PolicyTable = "stripe".parse().unwrap();
        assert_eq!(t.lookup(1), PolicyKind::Stripe);
        // No floor: a 1-byte threshold is honoured.
        let t: PolicyTable = "1:single,*:stripe".parse().unwrap();
        assert_eq!(t.lookup(2), PolicyKind::Stripe);
        assert!("16K:single".parse::<PolicyTable>().is_err());
        assert!("".parse::<PolicyTable>().is_err());
        assert!("*:single,16K:stripe".parse::<PolicyTable>().is_err());
        assert!("64K:single,16K:stripe,*:adaptive".parse::<PolicyTable>().is_err());
        assert!("16K:fastest,*:stripe".parse::<PolicyTable>().unwrap_err().contains("unknown policy"));
        assert_eq!("rr".parse::<PolicyKind>(), Ok(PolicyKind::RoundRobin));
    }
}
