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

/// How often a waiter reads again where a local peer last ran (between,
/// it answers from its last reading). Unpinned ranks move between CPUs
/// now and then; a stale answer costs at most this long of the wrong
/// choice (a sleep where a spin would have done, or today's spin).
const PEER_CPU_RECHECK: std::time::Duration = std::time::Duration::from_millis(1);

/// Where the processes of this host's peers last ran, for how a wait
/// spins (`engine::SpinPlan`).
///
/// A waiter whose peer last ran on the waiter's own CPU waits for a
/// process that cannot run while it spins: the peer is queued behind it
/// (pinned there, or put there by the scheduler). Such a wait gives its
/// CPU away (`sched_yield`) between all its rounds, instead of spinning
/// its first 20 µs before it does; a wait for a peer elsewhere spins as
/// before. Measured on this 2-CPU machine with 4 ranks (`bench multi_lat
/// --pairs 2 --sizes 8 --rails shm`, docs/benchmarks.md, 2026-12-02):
/// pairs sharing a CPU (`--pin 0,1,0,1`) took 23.5 µs spinning first,
/// 4.5 sleeping at once and 3.3 yielding at once; pairs across the CPUs
/// (`--pin 0,0,1,1`) 1.6 spinning first, and sleeping at once whenever a
/// same-CPU rank was waited for (`mbw_mr`'s barrier) halved `mbw_mr`
/// there, while yielding kept it.
///
/// The reading is `/proc/PID/stat`'s `processor` field: the CPU the
/// peer's main thread last ran on. A peer whose messages come from
/// another of its threads is judged by its main thread (a wrong answer
/// costs a yield or a spin, never a message). Peers in this very process
/// (threads posing as ranks) are not watched.
///
/// Two unpinned ranks the scheduler put on one CPU while another is free
/// (it places a woken task beside its waker; ranks that yield to each
/// other look busy and cache-hot, so it takes its time to part them) are
/// parted by the ranks themselves: [`PeerCpus::move_away`].
pub(crate) struct PeerCpus {
    peers: Vec<std::sync::Mutex<Option<PeerCpu>>>,
    /// The ranks watched, in rank order (set once, at setup).
    watched: std::sync::OnceLock<Vec<u32>>,
    /// Before this instant this process does not move itself again (see
    /// [`PeerCpus::move_away`]).
    next_move: std::sync::Mutex<Option<std::time::Instant>>,
}

/// A rank moves itself off a shared CPU at most this often (a move is
/// two system calls and a migration; not timed here): if the scheduler keeps
/// putting the two ranks together, they mostly yield to each other as
/// before, and do not fight it.
const MOVE_EVERY: std::time::Duration = std::time::Duration::from_millis(2);

/// Most watched peers a wait for any rank looks at: each is read again
/// every [`PEER_CPU_RECHECK`] while waits come, so a larger job's
/// wildcard waits keep the old rule (spin first) rather than pay for many
/// readings.
const ANY_MAX: usize = 8;

struct PeerCpu {
    pid: u32,
    /// `/proc/PID/stat`, opened at the first look (none: not yet, or it
    /// could not be; then `failed`).
    stat: Option<std::fs::File>,
    failed: bool,
    /// When the next reading is due (none: at the first look). An
    /// instant, compared on every wait (a time since some origin would be
    /// a subtraction on each).
    next_read: Option<std::time::Instant>,
    /// The CPU it last ran on, at the last reading.
    cpu: Option<u32>,
    /// Whether the last answer was "it last ran on this thread's CPU"
    /// (logged when it changes).
    shared: bool,
}

impl PeerCpus {
    /// For a job of `size` ranks; no peer is watched yet.
    pub fn new(size: usize) -> PeerCpus {
        PeerCpus {
            peers: (0..size).map(|_| std::sync::Mutex::new(None)).collect(),
            watched: std::sync::OnceLock::new(),
            next_move: std::sync::Mutex::new(None),
        }
    }

    /// Watches every rank `r` with `pids[r]` (a process on this kernel and
    /// in this PID namespace, from the address table). Our own PID is
    /// ignored (ranks that are threads of this process). Once; later calls
    /// do nothing.
    pub fn watch_all(&self, pids: &[Option<u32>]) {
        let me = std::process::id();
        let mut list = Vec::new();
        for (r, pid) in pids.iter().enumerate() {
            let (Some(pid), Some(slot)) = (*pid, self.peers.get(r)) else { continue };
            if pid == me {
                continue;
            }
            if let Ok(mut g) = slot.lock() {
                *g = Some(PeerCpu { pid, stat: None, failed: false, next_read: None, cpu: None, shared: false });
                list.push(r as u32);
            }
        }
        let _ = self.watched.set(list);
    }

    /// Whether some watched rank (if at most [`ANY_MAX`] are) last ran on
    /// the CPU this thread runs on: a wait for any rank.
    pub fn any_here(&self, now: std::time::Instant) -> bool {
        let Some(w) = self.watched.get() else { return false };
        w.len() <= ANY_MAX && w.iter().any(|&p| self.shares_cpu(p, now))
    }

    /// Whether rank `peer` last ran on the CPU this thread runs on (at
    /// `now`, a clock reading taken a moment ago). False when the peer is
    /// not watched, when its reading is taken by another thread this
    /// moment, or when anything cannot be read.
    pub fn shares_cpu(&self, peer: u32, now: std::time::Instant) -> bool {
        let Some(slot) = self.peers.get(peer as usize) else { return false };
        let Ok(mut g) = slot.try_lock() else { return false };
        let Some(w) = g.as_mut().filter(|w| !w.failed) else { return false };
        let Some(mine) = multirail_transport::shm::current_cpu() else { return false };
        if w.next_read.is_none_or(|t| now >= t) {
            w.next_read = Some(now + PEER_CPU_RECHECK);
            if w.stat.is_none() {
                w.stat = std::fs::File::open(format!("/proc/{}/stat", w.pid)).ok();
                w.failed = w.stat.is_none();
            }
            let mut buf = [0u8; 1024];
            w.cpu = w.stat.as_ref().and_then(|f| {
                let n = std::os::unix::fs::FileExt::read_at(f, &mut buf, 0).ok()?;
                processor_of(std::str::from_utf8(&buf[..n]).ok()?)
            });
        }
        let shared = w.cpu == Some(mine);
        if shared != w.shared {
            w.shared = shared;
            if shared {
                tracing::debug!(
                    "rank {peer} (pid {}) last ran on this thread's CPU {mine}: waits for it yield the CPU from their first round",
                    w.pid
                );
            } else {
                tracing::debug!(
                    "rank {peer} (pid {}) runs on another CPU than this thread's: waits for it spin first",
                    w.pid
                );
            }
        }
        shared
    }

    /// Rank `me`'s waiting thread found rank `peer` on its own CPU
    /// ([`PeerCpus::shares_cpu`] said so at `now`): if another CPU this
    /// thread may use is free of watched peers and the host has no more
    /// runnable threads than CPUs ([`crowded`] says no), the thread moves
    /// there ([`multirail_transport::shm::move_to_cpu`]; its affinity is
    /// given back at once, so this is not pinning). Only the higher rank
    /// of the two moves (both moving would land them together again), at
    /// most every [`MOVE_EVERY`] per process. True if it moved: the wait
    /// may spin.
    pub fn move_away(&self, peer: u32, me: u32, now: std::time::Instant) -> bool {
        if me < peer {
            return false;
        }
        let Ok(mut next) = self.next_move.try_lock() else { return false };
        // (A crowded host is no reason to wait MOVE_EVERY before the next
        // look.)
        if next.is_some_and(|t| now < t) || crowded(now) {
            return false;
        }
        *next = Some(now + MOVE_EVERY);
        drop(next);
        let Some(mine) = multirail_transport::shm::current_cpu() else { return false };
        // Where the watched peers last ran (as last read; the one waited
        // for is on `mine`).
        let taken: Vec<u32> =
            self.peers.iter().filter_map(|p| p.try_lock().ok().and_then(|g| g.as_ref().and_then(|w| w.cpu))).collect();
        let Some(to) = free_cpu(&usable(), mine, &taken) else { return false };
        match multirail_transport::shm::move_to_cpu(to) {
            Ok(Some(to)) => {
                tracing::debug!("rank {peer} and this thread shared CPU {mine}: moved this thread to CPU {to}");
                true
            }
            Ok(None) => false,
            Err(e) => {
                tracing::debug!("could not move off CPU {mine}: {e}");
                false
            }
        }
    }
}

/// A CPU of `usable` other than `mine` where no watched peer last ran
/// (`taken`), the lowest such; none if every usable CPU is taken.
fn free_cpu(usable: &[usize], mine: u32, taken: &[u32]) -> Option<u32> {
    usable.iter().map(|&c| c as u32).find(|&c| c != mine && !taken.contains(&c))
}

/// The CPU a `/proc/PID/stat` line says the task last ran on (field 39,
/// `processor`). The command name (field 2) is in parentheses and may
/// itself hold spaces and parentheses: fields are counted after the last
/// `)`, where field 3 (the state) begins.
fn processor_of(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(39 - 3)?.parse().ok()
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
    fn the_processor_field_of_a_stat_line() {
        // Fields 3.. after the name: state, then 35 more, then processor.
        let tail: Vec<String> = (4..=38).map(|i| i.to_string()).collect();
        let line = format!("4242 (a (b) c) S {} 7 0 0\n", tail.join(" "));
        assert_eq!(processor_of(&line), Some(7));
        assert_eq!(processor_of("4242 (x) S 1 2 3"), None, "too short");
        assert_eq!(processor_of("no parenthesis"), None);
        // This process's own line parses, and names a CPU that exists.
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        let cpu = processor_of(&own).expect("own stat parses");
        assert!((cpu as usize) < 4096, "{own}");
    }

    /// A peer process pinned to one CPU is seen there: sharing with a
    /// thread pinned to that CPU, not with one pinned elsewhere.
    #[test]
    fn a_watched_peer_is_seen_on_the_cpu_it_is_pinned_to() {
        use std::process::Command;
        if Command::new("taskset").arg("--version").output().is_err() {
            eprintln!("SKIPPED: taskset is not installed (util-linux)");
            return;
        }
        let usable = usable();
        // This thread, pinned from outside (`taskset -p` on its TID).
        let tid = std::fs::read_link("/proc/thread-self").unwrap();
        let tid = tid.file_name().unwrap().to_str().unwrap().to_string();
        let pin_self = |cpu: usize| {
            let ok = Command::new("taskset").args(["-p", "-c", &cpu.to_string(), &tid]).output().unwrap();
            assert!(ok.status.success(), "taskset -p: {}", String::from_utf8_lossy(&ok.stderr));
            std::thread::yield_now();
            assert_eq!(multirail_transport::shm::current_cpu(), Some(cpu as u32), "pinned to {cpu}");
        };
        // A child that runs on `cpu`, then sleeps there.
        let spawn = |cpu: usize| {
            let c = Command::new("taskset").args(["-c", &cpu.to_string(), "sleep", "30"]).spawn().unwrap();
            let t0 = std::time::Instant::now();
            // taskset execs sleep in the same process: wait until it has.
            while std::fs::read_to_string(format!("/proc/{}/comm", c.id())).unwrap_or_default().trim() != "sleep" {
                assert!(t0.elapsed() < std::time::Duration::from_secs(10), "the child never ran sleep");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            c
        };
        let later = || std::time::Instant::now() + PEER_CPU_RECHECK * 2;
        let mut children = vec![spawn(usable[0])];
        let pcs = PeerCpus::new(3);
        // Rank 2 runs on another CPU, where there is one.
        let second = usable.get(1).map(|&c| spawn(c));
        pcs.watch_all(&[None, Some(children[0].id()), second.as_ref().map(|c| c.id())]);
        pin_self(usable[0]);
        assert!(pcs.shares_cpu(1, later()), "peer and thread on CPU {}", usable[0]);
        if let (Some(&other), Some(second)) = (usable.get(1), second) {
            children.push(second);
            assert!(pcs.any_here(later()), "rank 1 is here");
            assert!(!pcs.shares_cpu(2, later()), "peer on {other}, thread on {}", usable[0]);
            // The thread moves: the answers follow at the next reading.
            pin_self(other);
            let t = later() + PEER_CPU_RECHECK * 2;
            assert!(!pcs.shares_cpu(1, t), "peer on {}, thread on {other}", usable[0]);
            assert!(pcs.shares_cpu(2, t), "both on {other}");
        } else {
            eprintln!("one usable CPU: the case of a peer elsewhere is not checked");
        }
        for mut c in children {
            c.kill().ok();
            c.wait().ok();
        }
        // Let the test harness's thread go anywhere again.
        let all = format_list(&usable);
        Command::new("taskset").args(["-p", "-c", &all, &tid]).output().unwrap();
        // Unwatched peers, and our own process, never share.
        let own = PeerCpus::new(2);
        own.watch_all(&[None, Some(std::process::id())]);
        assert!(!own.shares_cpu(1, later()) && !own.any_here(later()));
        assert!(!own.shares_cpu(0, later()));
        assert!(!own.shares_cpu(9, later()));
    }

    /// A rank moves to the lowest usable CPU that is neither its own nor
    /// where a watched peer last ran; with none such it stays.
    #[test]
    fn a_free_cpu_is_one_no_watched_peer_and_not_this_thread_is_on() {
        assert_eq!(free_cpu(&[0, 1], 0, &[0]), Some(1));
        assert_eq!(free_cpu(&[0, 1], 1, &[1]), Some(0));
        assert_eq!(free_cpu(&[0, 1, 2, 3], 1, &[1, 0, 2]), Some(3));
        assert_eq!(free_cpu(&[0, 1], 0, &[0, 1]), None, "every other CPU holds a peer");
        assert_eq!(free_cpu(&[4], 4, &[4]), None, "pinned: one usable CPU");
        assert_eq!(free_cpu(&[], 0, &[]), None);
    }

    /// Of two ranks on one CPU only the higher one moves (both moving
    /// would land them together again), and a process tries at most
    /// every MOVE_EVERY: the lower rank and a second try within that time
    /// do not move, whatever the machine's load.
    #[test]
    fn only_the_higher_rank_moves_and_not_twice_within_move_every() {
        let pcs = PeerCpus::new(3);
        let now = std::time::Instant::now();
        assert!(!pcs.move_away(2, 1, now), "rank 1 waits for rank 2: the higher rank moves");
        // A try just happened (as if it had moved): the next is refused.
        *pcs.next_move.lock().unwrap() = Some(now + MOVE_EVERY);
        assert!(!pcs.move_away(1, 2, now + MOVE_EVERY / 2));
        assert_eq!(*pcs.next_move.lock().unwrap(), Some(now + MOVE_EVERY), "no new try was made");
    }

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
