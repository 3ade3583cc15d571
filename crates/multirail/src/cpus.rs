//! How many CPUs a rank has, and how many the host has.
//!
//! A waiting thread spins only when the ranks on a host do not outnumber
//! its CPUs. The host's count is not the rank's affinity: a launcher that
//! pins each rank to its own core (`multirail --pin`, `mpirun`'s default
//! binding) leaves every rank one CPU, and the ranks still have a core
//! each to spin on.

/// The CPUs this process may run on: its affinity mask as the kernel
/// reports it in /proc/self/status (what sched_getaffinity returns),
/// else `0..available_parallelism`.
pub fn usable() -> Vec<usize> {
    let from_proc = std::fs::read_to_string("/proc/self/status").ok().and_then(|st| {
        st.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).and_then(|l| parse_list(l.trim()))
    });
    from_proc.unwrap_or_else(|| (0..available()).collect())
}

/// The CPUs of the host the job may use: the online CPUs, at most the
/// cgroup's CPU quota (a container limited to 2 CPUs has 2, however many
/// the machine has). Not this process's affinity. Falls back to
/// [`std::thread::available_parallelism`] where /sys cannot be read.
pub fn host() -> usize {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| parse_list(s.trim()))
        .map(|v| v.len());
    let quota = cgroup_quota();
    match (online, quota) {
        (Some(n), Some(q)) => n.min(q).max(1),
        (Some(n), None) => n,
        (None, _) => available(),
    }
}

fn available() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The cgroup v2 CPU quota of this process, in whole CPUs (rounded up);
/// `None` when there is none or it cannot be read.
fn cgroup_quota() -> Option<usize> {
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cg.lines().find_map(|l| l.strip_prefix("0::"))?.trim();
    let file = format!("/sys/fs/cgroup{}/cpu.max", path.trim_end_matches('/'));
    quota_of(&std::fs::read_to_string(file).ok()?)
}

/// `cpu.max` contents (`QUOTA PERIOD` or `max PERIOD`) in whole CPUs.
fn quota_of(s: &str) -> Option<usize> {
    let mut it = s.split_whitespace();
    let (q, p) = (it.next()?, it.next()?);
    let (q, p): (u64, u64) = (q.parse().ok()?, p.parse().ok()?);
    (p > 0).then(|| q.div_ceil(p).max(1) as usize)
}

/// `0-3,8,10-11` (the kernel's CPU list format).
pub fn parse_list(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
        out.extend(a..=b);
    }
    (!out.is_empty()).then_some(out)
}

/// The kernel's CPU list format back from a sorted list: `0-3,8`.
pub fn format_list(cpus: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if i == j { cpus[i].to_string() } else { format!("{}-{}", cpus[i], cpus[j]) });
        i = j + 1;
    }
    parts.join(",")
}

/// Most ranks per CPU of a host whose waiting threads still spin.
///
/// Up to two, a spinning wait that gives its CPU away between rounds
/// ([`crowded`]) lets the peer that shares the CPU run and answer sooner
/// than a sleep and a wake-up would: 4 ranks on 2 CPUs, `shm`, spinning
/// against sleeping at once, gave 8 B latency (`multi_lat --pairs 2`)
/// 3.4 against 16.6 µs and message rate (`mbw_mr --pairs 2`) 1.45-1.51 x;
/// at 3 ranks per CPU the rate was even (1.005 x), at 4 and 16 spinning
/// lost (0.87 and 0.70 x), every rank's yields taking the CPU from the
/// one with work (docs/benchmarks.md, 2026-11-29, twenty-fourth session).
/// Where the peer shares the waiter's CPU, a wait still spins its first
/// 20 µs before it yields, so such a pair's latency is about that (some
/// runs of 4 ranks on 2 CPUs: 22-31 µs against 2.1-3.5 µs); yielding
/// sooner cost every other run more (at once: 11 µs in all of them).
pub const SPIN_RANKS_PER_CPU: usize = 2;

/// Whether threads waiting in `local_ranks` ranks on a host of
/// `host_cpus` CPUs may spin: not when there are more than
/// [`SPIN_RANKS_PER_CPU`] per CPU (each spinning rank would take the CPU
/// from the ones it waits for).
pub fn may_spin(local_ranks: Option<u32>, host_cpus: usize) -> bool {
    local_ranks.is_none_or(|l| l as usize <= SPIN_RANKS_PER_CPU * host_cpus)
}

/// How often [`crowded`] reads the run queue again (between, it answers
/// from its last reading).
const CROWD_RECHECK: std::time::Duration = std::time::Duration::from_millis(1);

/// What [`crowded`] needs, found once per process.
struct Crowd {
    /// `/proc/loadavg`, kept open (read again from offset 0).
    loadavg: Option<std::fs::File>,
    /// The host's CPUs ([`host`]).
    cpus: usize,
    /// The process may run on one CPU only (pinned): another thread that
    /// needs this CPU may be the peer a waiter waits for, and the machine
    /// wide count cannot tell.
    pinned_to_one: bool,
    origin: std::time::Instant,
    /// Nanoseconds since `origin` of the last reading plus one (0: none).
    read_at: std::sync::atomic::AtomicU64,
    last: std::sync::atomic::AtomicBool,
}

/// Whether a thread that has spun for a while should give its CPU away
/// (`sched_yield`): when other threads wait for a CPU, one of them may be
/// the peer it waits for. True when the process is pinned to one CPU, or
/// when more threads are runnable on the machine than it has CPUs
/// (`/proc/loadavg`'s running count, read at most every millisecond;
/// true when it cannot be read). With a CPU per spinning rank and nothing
/// else to run, a yield only costs: on the testbed, 8 B latency's p99
/// fell from 18-35 us to 15-26 us and its mean by about 10 % without it
/// (docs/benchmarks.md, 2026-11-28).
pub(crate) fn crowded(now: std::time::Instant) -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    static CROWD: std::sync::OnceLock<Crowd> = std::sync::OnceLock::new();
    let c = CROWD.get_or_init(|| Crowd {
        loadavg: std::fs::File::open("/proc/loadavg").ok(),
        cpus: host(),
        pinned_to_one: usable().len() == 1,
        origin: std::time::Instant::now(),
        read_at: std::sync::atomic::AtomicU64::new(0),
        last: std::sync::atomic::AtomicBool::new(true),
    });
    if c.pinned_to_one {
        return true;
    }
    let t = now.saturating_duration_since(c.origin).as_nanos() as u64 + 1;
    let at = c.read_at.load(Relaxed);
    if at != 0 && t.saturating_sub(at) < CROWD_RECHECK.as_nanos() as u64 {
        return c.last.load(Relaxed);
    }
    c.read_at.store(t, Relaxed);
    let mut buf = [0u8; 128];
    let running = c.loadavg.as_ref().and_then(|f| {
        let n = std::os::unix::fs::FileExt::read_at(f, &mut buf, 0).ok()?;
        runnable_of(std::str::from_utf8(&buf[..n]).ok()?)
    });
    let v = running.is_none_or(|r| r > c.cpus);
    c.last.store(v, Relaxed);
    v
}

/// The number of runnable threads in `/proc/loadavg` contents
/// (`0.52 0.58 0.59 3/456 12345`: the 3).
fn runnable_of(s: &str) -> Option<usize> {
    s.split_whitespace().nth(3)?.split_once('/')?.0.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runnable_count_of_loadavg() {
        assert_eq!(runnable_of("0.52 0.58 0.59 3/456 12345\n"), Some(3));
        assert_eq!(runnable_of("1.00 2.00 3.00 17/1024 99"), Some(17));
        assert_eq!(runnable_of("0.52 0.58 0.59"), None);
        assert_eq!(runnable_of("a b c x/y z"), None);
        // This machine's file parses, and counts at least this thread.
        let real = std::fs::read_to_string("/proc/loadavg").unwrap();
        assert!(runnable_of(&real).is_some_and(|n| n >= 1), "{real}");
    }

    #[test]
    fn cpu_lists_both_ways() {
        assert_eq!(parse_list("0-3,8,10-11"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse_list(""), None);
        assert_eq!(parse_list("x"), None);
        assert_eq!(format_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
    }

    #[test]
    fn cgroup_quotas_in_whole_cpus() {
        assert_eq!(quota_of("max 100000\n"), None);
        assert_eq!(quota_of("200000 100000\n"), Some(2));
        assert_eq!(quota_of("150000 100000"), Some(2));
        assert_eq!(quota_of("5000 100000"), Some(1));
        assert_eq!(quota_of("100000 0"), None);
    }

    #[test]
    fn the_host_counts_at_least_the_cpus_this_process_may_use() {
        // The affinity mask is a subset of the online CPUs; a quota may
        // lower the count, but never below what the process can use at
        // once unless the quota says so.
        let q = cgroup_quota();
        let usable = usable().len();
        assert!(host() >= usable.min(q.unwrap_or(usize::MAX)), "host {} usable {usable} quota {q:?}", host());
    }

    #[test]
    fn ranks_spin_unless_more_than_two_share_a_cpu() {
        assert!(may_spin(None, 1));
        assert!(may_spin(Some(2), 2), "two ranks pinned to a core each on two CPUs spin");
        assert!(may_spin(Some(4), 2), "two ranks per CPU spin (and yield)");
        assert!(!may_spin(Some(5), 2));
        assert!(!may_spin(Some(64), 2));
    }
}
