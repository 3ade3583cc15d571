//! `--fail-rail RAIL@TIME[:for=DURATION]`: take a rail down during a run.
//! In a testbed host the interface goes down (`ip link set railN down`);
//! elsewhere the fault-injecting rail kills the rail's connections (and
//! keeps killing reconnections until DURATION is over). Rank 0 samples the
//! bytes delivered every millisecond and reports the longest stall.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use multirail::{Config, Endpoint, FaultConfig, RailStats};

/// Set by the launcher for ranks inside testbed host N.
pub const TESTBED_HOST: &str = "MULTIRAIL_TESTBED_HOST";
const SAMPLE: Duration = Duration::from_millis(1);

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FailPlan {
    pub rail: usize,
    pub at: Duration,
    pub down_for: Option<Duration>,
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
        let usage = || format!("--fail-rail {s}: expected RAIL@TIME[:for=DURATION], e.g. 1@2s:for=500ms");
        let (rail, rest) = s.split_once('@').with_context(usage)?;
        let rail: usize = rail.trim().parse().with_context(usage)?;
        let (at, down_for) = match rest.split_once(':') {
            Some((a, f)) => {
                let d = f.trim().strip_prefix("for=").with_context(usage)?;
                (parse_duration(a)?, Some(parse_duration(d)?))
            }
            None => (parse_duration(rest)?, None),
        };
        Ok(FailPlan { rail, at, down_for })
    }

    /// Before the endpoint is built: arms the fault-injecting rail (rank 0
    /// only; killing one end takes the connection down for both).
    pub fn prepare(self, cfg: &mut Config, rank: u32) -> anyhow::Result<Injector> {
        if self.rail >= cfg.rails.len() {
            bail!("--fail-rail {}: there are only {} rails", self.rail, cfg.rails.len());
        }
        let switch = Arc::new(AtomicBool::new(false));
        let testbed = std::env::var_os(TESTBED_HOST).is_some();
        if rank == 0 && !testbed {
            if cfg.faults.len() <= self.rail {
                cfg.faults.resize(self.rail + 1, None);
            }
            cfg.faults[self.rail] = Some(FaultConfig { kill_switch: Some(switch.clone()), ..Default::default() });
        }
        Ok(Injector { plan: self, switch, testbed })
    }
}

/// Takes the rail down and up.
pub struct Injector {
    plan: FailPlan,
    switch: Arc<AtomicBool>,
    testbed: bool,
}

impl Injector {
    fn set_down(&self, down: bool) {
        if !self.testbed {
            self.switch.store(down, Ordering::Release);
            return;
        }
        let state = if down { "down" } else { "up" };
        let dev = format!("rail{}", self.plan.rail);
        let ok =
            std::process::Command::new("ip").args(["link", "set", &dev, state]).status().is_ok_and(|s| s.success());
        if !ok {
            eprintln!("multirail: --fail-rail: `ip link set {dev} {state}` failed");
        }
    }

    /// Runs `work` while failing the rail on schedule and sampling the
    /// bytes `ep` moves to and from `peer`.
    pub fn watch<R>(&self, ep: &Endpoint, peer: u32, work: impl FnOnce() -> R) -> (R, FailReport) {
        let stop = AtomicBool::new(false);
        let before = ep.rail_stats(peer);
        let t0 = Instant::now();
        let mut events: (Option<Duration>, Option<Duration>) = (None, None);
        let mut samples: Vec<(Duration, u64)> = Vec::new();
        let r = std::thread::scope(|s| {
            let timer = s.spawn(|| self.drive(t0, &stop));
            let sampler = s.spawn(|| {
                let mut v = Vec::new();
                while !stop.load(Ordering::Acquire) {
                    let moved: u64 = ep.rail_stats(peer).iter().map(|r| r.tx_bytes + r.rx_bytes).sum();
                    v.push((t0.elapsed(), moved));
                    std::thread::sleep(SAMPLE);
                }
                v
            });
            let r = work();
            stop.store(true, Ordering::Release);
            events = timer.join().unwrap_or_default();
            samples = sampler.join().unwrap_or_default();
            r
        });
        if events.0.is_some() && events.1.is_none() && self.plan.down_for.is_none() {
            self.set_down(false);
        }
        let report = FailReport {
            plan: self.plan,
            down_at: events.0,
            up_at: events.1,
            stall: longest_stall(&samples, events.0),
            before,
            after: ep.rail_stats(peer),
            errors: ep.rail_errors(),
        };
        (r, report)
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

/// The longest time without any byte delivered, starting at or after the
/// failure.
fn longest_stall(samples: &[(Duration, u64)], from: Option<Duration>) -> Option<Duration> {
    let from = from?;
    let mut best = Duration::ZERO;
    let mut since: Option<Duration> = None;
    for w in samples.windows(2) {
        let ((t0, b0), (t1, b1)) = (w[0], w[1]);
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

/// What happened around the failure.
pub struct FailReport {
    plan: FailPlan,
    down_at: Option<Duration>,
    up_at: Option<Duration>,
    stall: Option<Duration>,
    before: Vec<RailStats>,
    after: Vec<RailStats>,
    errors: Vec<(u32, usize, String)>,
}

impl fmt::Display for FailReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
        match self.down_at {
            None => writeln!(
                f,
                "# fail-rail: the run ended before rail {} was to fail at {}",
                self.plan.rail,
                ms(self.plan.at)
            )?,
            Some(t) => {
                write!(f, "# fail-rail: rail {} down at {}", self.plan.rail, ms(t))?;
                match self.up_at {
                    Some(u) => writeln!(f, ", back up at {}", ms(u))?,
                    None => writeln!(f, ", down for the rest of the run")?,
                }
                if let Some(s) = self.stall {
                    writeln!(f, "# fail-rail: longest delivery stall after the failure: {}", ms(s))?;
                }
            }
        }
        writeln!(
            f,
            "# {:<5} {:>16} {:>16} {:>6} {:>6} {:>6}",
            "rail", "MB before", "MB during run", "retx", "lost", "downs"
        )?;
        for (i, (b, a)) in self.before.iter().zip(&self.after).enumerate() {
            let mb = |s: &RailStats| (s.tx_bytes + s.rx_bytes) as f64 / 1e6;
            writeln!(
                f,
                "# {:<5} {:>16.1} {:>16.1} {:>6} {:>6} {:>6}",
                i,
                mb(b),
                mb(a) - mb(b),
                a.retransmits - b.retransmits,
                a.lost - b.lost,
                a.downs - b.downs
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
        assert_eq!((p.rail, p.at, p.down_for), (1, Duration::from_secs(2), Some(Duration::from_millis(500))));
        let p = FailPlan::parse("0@1.5s").unwrap();
        assert_eq!((p.rail, p.at, p.down_for), (0, Duration::from_millis(1500), None));
        assert!(FailPlan::parse("1").is_err());
        assert!(FailPlan::parse("x@1s").is_err());
        assert!(FailPlan::parse("1@1s:500ms").is_err());
        assert!(FailPlan::parse("1@2").is_err());
    }

    #[test]
    fn stalls() {
        let ms = Duration::from_millis;
        let s = vec![(ms(0), 0), (ms(1), 10), (ms(2), 10), (ms(3), 10), (ms(4), 20), (ms(5), 20), (ms(6), 30)];
        assert_eq!(longest_stall(&s, Some(ms(0))), Some(ms(3) - ms(1)));
        assert_eq!(longest_stall(&s, Some(ms(4))), Some(ms(1)));
        assert_eq!(longest_stall(&s, None), None);
    }
}
