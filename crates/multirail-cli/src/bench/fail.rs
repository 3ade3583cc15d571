//! `--fail-rail RAIL@TIME[:for=DURATION|forever][:side=host0|host1]`: take
//! a rail down during a run. In a testbed host the interface goes down
//! (`ip link set railN down`, in host0 or in host1): nothing tells TCP, so
//! multirail has to notice by itself. Elsewhere the fault-injecting rail
//! kills the rail's connections (and keeps killing reconnections until
//! DURATION is over). Rank 0 samples the bytes moved every millisecond and
//! reports the longest stall, the throughput while the rail was down, and
//! when the rail carried data again after it came back.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use multirail::{Config, Endpoint, FaultConfig, RailStats};

/// Set by the launcher for ranks inside testbed host N.
pub const TESTBED_HOST: &str = "MULTIRAIL_TESTBED_HOST";
/// Set by the launcher for ranks inside a testbed: its prefix.
pub const TESTBED_PREFIX: &str = "MULTIRAIL_TESTBED_PREFIX";
const SAMPLE: Duration = Duration::from_millis(1);
/// The throughput during an outage is measured from this long after the
/// failure (the time to notice it is the stall, reported apart).
const SETTLE: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FailPlan {
    pub rail: usize,
    pub at: Duration,
    /// `None`: down for the rest of the run.
    pub down_for: Option<Duration>,
    /// Testbed host whose interface goes down.
    pub side: usize,
}

/// `250ms`, `2s`, `1.5s`.
pub fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let t = s.trim();
    let (num, mult) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        bail!("'{s}': give a unit (ms or s), e.g. 500ms or 2s");
    };
    let v: f64 = num.trim().parse().with_context(|| format!("'{s}' is not a duration"))?;
    if !(v.is_finite() && v >= 0.0) {
        bail!("'{s}': duration out of range");
    }
    Ok(Duration::from_secs_f64(v * mult))
}

impl FailPlan {
    pub fn parse(s: &str) -> anyhow::Result<FailPlan> {
        let usage = || {
            format!(
                "--fail-rail {s}: expected RAIL@TIME[:for=DURATION|forever][:side=host0|host1], \
                 e.g. 1@2s:for=500ms or 1@300ms:for=forever:side=host1"
            )
        };
        let (rail, rest) = s.split_once('@').with_context(usage)?;
        let rail: usize = rail.trim().parse().with_context(usage)?;
        let mut parts = rest.split(':');
        let at = parse_duration(parts.next().unwrap_or_default()).with_context(usage)?;
        let mut plan = FailPlan { rail, at, down_for: None, side: 0 };
        for p in parts {
            match p.trim().split_once('=') {
                Some(("for", "forever")) => plan.down_for = None,
                Some(("for", d)) => plan.down_for = Some(parse_duration(d).with_context(usage)?),
                Some(("side", h)) => {
                    plan.side = match h.trim() {
                        "host0" | "0" => 0,
                        "host1" | "1" => 1,
                        _ => bail!("{}: side must be host0 or host1", usage()),
                    }
                }
                _ => bail!("{}", usage()),
            }
        }
        Ok(plan)
    }
}

/// Parses every `--fail-rail` and checks the plans against the job: `nrails`
/// rails, in a testbed or not. The launcher calls this before any rank
/// starts, so a bad value is said once.
pub fn parse_plans(given: &[String], nrails: usize, testbed: bool) -> anyhow::Result<Vec<FailPlan>> {
    let plans = given.iter().map(|s| FailPlan::parse(s)).collect::<anyhow::Result<Vec<_>>>()?;
    check_plans(&plans, nrails, testbed)?;
    Ok(plans)
}

fn check_plans(plans: &[FailPlan], nrails: usize, testbed: bool) -> anyhow::Result<()> {
    for (i, plan) in plans.iter().enumerate() {
        if plan.rail >= nrails {
            bail!("--fail-rail {}@...: there are only {nrails} rails (0 to {})", plan.rail, nrails.saturating_sub(1));
        }
        if plans[..i].iter().any(|p| p.rail == plan.rail) {
            bail!("--fail-rail: rail {} is given twice (one failure per rail)", plan.rail);
        }
        if !testbed && plan.side != 0 {
            bail!("--fail-rail ...:side=host{}: sides exist only in a testbed (--testbed)", plan.side);
        }
    }
    Ok(())
}

/// Takes testbed interface `rail{rail}` down or up (`ip link set`), in
/// host namespace `netns` or in the one this process runs in; a failure is
/// said on stderr, naming `flag`.
pub fn set_link(netns: Option<&str>, rail: usize, down: bool, flag: &str) {
    let state = if down { "down" } else { "up" };
    let dev = format!("rail{rail}");
    let mut args: Vec<&str> = Vec::new();
    if let Some(n) = netns {
        args.extend(["-n", n]);
    }
    args.extend(["link", "set", &dev, state]);
    let ok = std::process::Command::new("ip").args(&args).status().is_ok_and(|s| s.success());
    if !ok {
        eprintln!("multirail: {flag}: `ip {}` failed", args.join(" "));
    }
}

/// Takes rails down and up as planned.
pub struct Injector {
    plans: Vec<Armed>,
}

struct Armed {
    plan: FailPlan,
    switch: Arc<AtomicBool>,
    /// Testbed host namespace whose interface goes down.
    netns: Option<String>,
}

impl Injector {
    /// Before the endpoint is built: arms the fault-injecting rails (rank 0
    /// only; killing one end takes the connection down for both).
    pub fn prepare(plans: Vec<FailPlan>, cfg: &mut Config, rank: u32) -> anyhow::Result<Injector> {
        let testbed = std::env::var(TESTBED_PREFIX).ok().filter(|p| !p.is_empty());
        check_plans(&plans, cfg.rails.len(), testbed.is_some())?;
        let mut armed: Vec<Armed> = Vec::new();
        for plan in plans {
            let switch = Arc::new(AtomicBool::new(false));
            if rank == 0 && testbed.is_none() {
                if cfg.faults.len() <= plan.rail {
                    cfg.faults.resize(plan.rail + 1, None);
                }
                cfg.faults[plan.rail] = Some(FaultConfig { kill_switch: Some(switch.clone()), ..Default::default() });
            }
            let netns = match &testbed {
                Some(p) => Some(multirail_testbed::Prefix::new(p)?.host_netns(plan.side)),
                None => None,
            };
            armed.push(Armed { plan, switch, netns });
        }
        Ok(Injector { plans: armed })
    }

    /// Once the endpoint is up: every rail to fail must be one rank 0 and
    /// `peer` use (ranks of one host talk over shared memory alone).
    pub fn check_rails(&self, ep: &Endpoint, peer: u32) -> anyhow::Result<()> {
        let to = ep.rails_to(peer);
        for a in &self.plans {
            if to.get(a.plan.rail) != Some(&a.plan.rail) {
                let names = ep.rail_names();
                let used: Vec<&str> = to.iter().map(|&g| names[g].as_str()).collect();
                bail!(
                    "--fail-rail {}: ranks 0 and {peer} share a host and talk over {} only; to fail one of the \
                     configured rails, run them over those (MULTIRAIL_SHM=off)",
                    a.plan.rail,
                    used.join(",")
                );
            }
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }
}

impl Armed {
    fn set_down(&self, down: bool) {
        let Some(netns) = &self.netns else {
            self.switch.store(down, Ordering::Release);
            return;
        };
        set_link(Some(netns), self.plan.rail, down, "--fail-rail");
    }

    /// Returns when the rail went down and came back up.
    fn drive(&self, t0: Instant, stop: &AtomicBool) -> (Option<Duration>, Option<Duration>) {
        let wait = |until: Duration| {
            while t0.elapsed() < until && !stop.load(Ordering::Acquire) {
                std::thread::sleep(SAMPLE);
            }
            !stop.load(Ordering::Acquire)
        };
        if !wait(self.plan.at) {
            return (None, None);
        }
        self.set_down(true);
        let down = Some(t0.elapsed());
        let Some(d) = self.plan.down_for else { return (down, None) };
        wait(self.plan.at + d);
        self.set_down(false);
        (down, Some(t0.elapsed()))
    }
}

/// One sample: time, bytes moved on every rail, and per rail its bytes
/// and whether it is usable (up, not suspect).
type Sample = (Duration, u64, Vec<(u64, bool)>);

impl Injector {
    /// Runs `work` while failing rails on schedule and sampling the bytes
    /// `ep` moves to and from `peer`.
    pub fn watch<R>(&self, ep: &Endpoint, peer: u32, work: impl FnOnce() -> R) -> (R, FailReport) {
        let stop = AtomicBool::new(false);
        let before = ep.rail_stats(peer);
        let t0 = Instant::now();
        let mut events: Vec<(Option<Duration>, Option<Duration>)> = Vec::new();
        let mut samples: Vec<Sample> = Vec::new();
        let r = std::thread::scope(|s| {
            let timers: Vec<_> = self.plans.iter().map(|a| s.spawn(|| a.drive(t0, &stop))).collect();
            let sampler = s.spawn(|| {
                let mut v = Vec::new();
                while !stop.load(Ordering::Acquire) {
                    let st = ep.rail_stats(peer);
                    let moved: u64 = st.iter().map(|r| r.tx_bytes + r.rx_bytes).sum();
                    let per = st.iter().map(|r| (r.tx_bytes + r.rx_bytes, r.up && !r.suspect)).collect();
                    v.push((t0.elapsed(), moved, per));
                    std::thread::sleep(SAMPLE);
                }
                v
            });
            let r = work();
            stop.store(true, Ordering::Release);
            events = timers.into_iter().map(|t| t.join().unwrap_or_default()).collect();
            samples = sampler.join().unwrap_or_default();
            r
        });
        // The run's counters, read before a rail lost for good comes back:
        // once its link is up again, the peer (done, maybe gone) answers
        // the retransmissions with a reset, a loud failure that belongs to
        // the cleanup, not to the run.
        let (after, errors) = (ep.rail_stats(peer), ep.rail_errors());
        for (a, e) in self.plans.iter().zip(&events) {
            if e.0.is_some() && e.1.is_none() {
                // A rail stays down only for the run, not after it.
                a.set_down(false);
            }
        }
        let first_down = events.iter().filter_map(|e| e.0).min();
        let first_up = events.iter().filter_map(|e| e.1).min();
        let failures = self
            .plans
            .iter()
            .zip(&events)
            .map(|(a, &(down_at, up_at))| Failure {
                plan: a.plan,
                down_at,
                up_at,
                rejoined_after: rejoined(&samples, a.plan.rail, up_at),
            })
            .collect();
        let report = FailReport {
            failures,
            stall: longest_stall(&samples, first_down),
            outage_rate: outage_rate(&samples, first_down, first_up),
            before,
            after,
            errors,
        };
        (r, report)
    }
}

/// The longest time without any byte delivered, starting at or after the
/// failure.
fn longest_stall(samples: &[Sample], from: Option<Duration>) -> Option<Duration> {
    let from = from?;
    let mut best = Duration::ZERO;
    let mut since: Option<Duration> = None;
    for w in samples.windows(2) {
        let ((t0, b0), (t1, b1)) = ((w[0].0, w[0].1), (w[1].0, w[1].1));
        if t1 < from {
            continue;
        }
        if b1 == b0 {
            let start = *since.get_or_insert(t0.max(from));
            best = best.max(t1 - start);
        } else {
            since = None;
        }
    }
    Some(best)
}

/// Bytes per second moved while the rail was down, from [`SETTLE`] after
/// the failure to its end (or the last byte of the run); `None` if that is
/// shorter than 100 ms.
fn outage_rate(samples: &[Sample], down: Option<Duration>, up: Option<Duration>) -> Option<f64> {
    let from = down? + SETTLE;
    let until = up.unwrap_or(Duration::MAX);
    let inside: Vec<&Sample> = samples.iter().filter(|s| s.0 >= from && s.0 <= until).collect();
    let first = inside.first()?;
    // Up to the sample where the last byte moved: the run's idle end
    // (results, closing) is not the outage's doing.
    let end_total = inside.last()?.1;
    let last = inside.iter().find(|s| s.1 == end_total)?;
    let span = last.0.checked_sub(first.0)?;
    (span >= Duration::from_millis(100)).then(|| (last.1 - first.1) as f64 / span.as_secs_f64())
}

/// How long after the link came back `rail` carried data again.
fn rejoined(samples: &[Sample], rail: usize, up: Option<Duration>) -> Option<Duration> {
    let up = up?;
    let at = |s: &Sample| s.2.get(rail).copied().unwrap_or((0, false));
    let base = at(samples.iter().find(|s| s.0 >= up)?).0;
    samples.iter().find(|s| s.0 >= up && at(s).1 && at(s).0 > base).map(|s| s.0 - up)
}

/// One planned failure and what came of it.
struct Failure {
    plan: FailPlan,
    down_at: Option<Duration>,
    up_at: Option<Duration>,
    rejoined_after: Option<Duration>,
}

/// What happened around the failures.
pub struct FailReport {
    failures: Vec<Failure>,
    /// From the first failure on.
    stall: Option<Duration>,
    /// From the first failure to the first recovery (or the end).
    outage_rate: Option<f64>,
    before: Vec<RailStats>,
    after: Vec<RailStats>,
    errors: Vec<(u32, usize, String)>,
}

impl fmt::Display for FailReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
        for x in &self.failures {
            let rail = x.plan.rail;
            let side = if x.plan.side == 0 { String::new() } else { format!(" (in host{})", x.plan.side) };
            match (x.down_at, x.up_at) {
                (None, _) => {
                    writeln!(f, "# fail-rail: the run ended before rail {rail} was to fail at {}", ms(x.plan.at))?
                }
                (Some(t), Some(u)) => {
                    writeln!(f, "# fail-rail: rail {rail}{side} down at {}, back up at {}", ms(t), ms(u))?
                }
                (Some(t), None) => {
                    writeln!(f, "# fail-rail: rail {rail}{side} down at {}, down for the rest of the run", ms(t))?
                }
            }
            match (x.up_at, x.rejoined_after) {
                (Some(_), Some(d)) => {
                    writeln!(f, "# fail-rail: rail {rail} carried data again {} after it came back", ms(d))?
                }
                (Some(_), None) => writeln!(f, "# fail-rail: rail {rail} carried no data after it came back")?,
                _ => {}
            }
        }
        if let Some(s) = self.stall {
            writeln!(f, "# fail-rail: longest delivery stall after the failure: {}", ms(s))?;
        }
        if let Some(r) = self.outage_rate {
            writeln!(f, "# fail-rail: throughput during the outage: {:.1} MB/s", r / 1e6)?;
        }
        writeln!(
            f,
            "# {:<5} {:>16} {:>16} {:>6} {:>6} {:>6} {:>8}",
            "rail", "MB before", "MB during run", "retx", "lost", "downs", "suspects"
        )?;
        for (i, (b, a)) in self.before.iter().zip(&self.after).enumerate() {
            let mb = |s: &RailStats| (s.tx_bytes + s.rx_bytes) as f64 / 1e6;
            writeln!(
                f,
                "# {:<5} {:>16.1} {:>16.1} {:>6} {:>6} {:>6} {:>8}",
                i,
                mb(b),
                mb(a) - mb(b),
                a.retransmits - b.retransmits,
                a.lost - b.lost,
                a.downs - b.downs,
                a.suspects - b.suspects
            )?;
        }
        for (peer, rail, why) in &self.errors {
            writeln!(f, "# rail {rail} to rank {peer}: {why}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_plans() {
        let p = FailPlan::parse("1@2s:for=500ms").unwrap();
        assert_eq!(
            (p.rail, p.at, p.down_for, p.side),
            (1, Duration::from_secs(2), Some(Duration::from_millis(500)), 0)
        );
        let p = FailPlan::parse("0@1.5s").unwrap();
        assert_eq!((p.rail, p.at, p.down_for), (0, Duration::from_millis(1500), None));
        let p = FailPlan::parse("1@300ms:for=forever:side=host1").unwrap();
        assert_eq!((p.down_for, p.side), (None, 1));
        let p = FailPlan::parse("1@300ms:side=host1:for=3s").unwrap();
        assert_eq!((p.down_for, p.side), (Some(Duration::from_secs(3)), 1));
        assert!(FailPlan::parse("1").is_err());
        assert!(FailPlan::parse("x@1s").is_err());
        assert!(FailPlan::parse("1@1s:500ms").is_err());
        assert!(FailPlan::parse("1@2").is_err());
        assert!(FailPlan::parse("1@1s:side=host2").is_err());
        let e = FailPlan::parse("1@1s:for=abc").unwrap_err();
        assert!(format!("{e:#}").contains("--fail-rail"), "{e:#}");
    }

    fn sample(ms: u64, total: u64, rail: u64, usable: bool) -> Sample {
        (Duration::from_millis(ms), total, vec![(0, true), (rail, usable)])
    }

    #[test]
    fn stalls_rates_and_rejoins() {
        let ms = Duration::from_millis;
        let s: Vec<Sample> = [(0, 0), (1, 10), (2, 10), (3, 10), (4, 20), (5, 20), (6, 30)]
            .iter()
            .map(|&(t, b)| sample(t, b, 0, true))
            .collect();
        assert_eq!(longest_stall(&s, Some(ms(0))), Some(ms(3) - ms(1)));
        assert_eq!(longest_stall(&s, Some(ms(4))), Some(ms(1)));
        assert_eq!(longest_stall(&s, None), None);
        // Down at 0, 1 MB per ms from the settling time on, up at 500.
        let s: Vec<Sample> = (0..1000u64).map(|t| sample(t, t * 1_000_000, 7, t >= 650)).collect();
        let r = outage_rate(&s, Some(ms(0)), Some(ms(500))).unwrap();
        assert!((r - 1e9).abs() < 1e6, "{r}");
        assert_eq!(outage_rate(&s, Some(ms(0)), Some(ms(250))), None, "too short to tell");
        // Down for good; bytes stop at 600 and the run idles until 999: the
        // idle end does not count.
        let s: Vec<Sample> = (0..1000u64).map(|t| sample(t, t.min(600) * 1_000_000, 7, false)).collect();
        let r = outage_rate(&s, Some(ms(0)), None).unwrap();
        assert!((r - 1e9).abs() < 1e6, "{r}");
        // The rail's bytes grow again at 700 while usable from 650.
        let s: Vec<Sample> = (0..1000u64).map(|t| sample(t, t, if t >= 700 { t } else { 5 }, t >= 650)).collect();
        assert_eq!(rejoined(&s, 1, Some(ms(500))), Some(ms(200)));
        assert_eq!(rejoined(&s, 1, None), None);
    }
}
