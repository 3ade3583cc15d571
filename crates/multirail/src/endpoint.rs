//! The public endpoint: point-to-point messaging over every rail.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use multirail_proto::core::{Core, RailStats, ReqId, SendError, Status};
use multirail_proto::time::Time;
use multirail_transport::fault::FaultConfig;

use crate::bootstrap::{self, Me, Root, Row};
use crate::engine::Engine;
use crate::hosts::{HostId, Routes};
use crate::launch::{JobInfo, resolve};
use crate::shared::{Completion, Shared, Slot};
use crate::{Config, Error, Progress};

/// Tags at or above this value are reserved for multirail itself; a
/// receive with any tag does not match them.
pub const RESERVED_TAGS: u64 = multirail_proto::core::RESERVED_TAGS;
const BARRIER_TAG: u64 = u64::MAX - 1;

/// How long closing waits for every sent message to be acknowledged.
const CLOSE_DRAIN: Duration = Duration::from_secs(10);
/// Longest the rails of a closing endpoint take, together, to hand what
/// they were given to the peer ([`multirail_transport::Rail::close`]).
pub(crate) const CLOSE_LINGER: Duration = Duration::from_secs(1);
/// Longest a closing endpoint waits for the handshakes of incoming
/// connections still under way ([`crate::shared::Shared::wait_handshakes`];
/// a live peer's take a millisecond or so, a silent one's until the
/// handshake timeout).
const CLOSE_HANDSHAKES: Duration = Duration::from_millis(200);

/// Builds an [`Endpoint`]. Settings start from [`Config::default`] (or a
/// given config) and can be overridden one by one.
#[must_use]
pub struct Builder {
    cfg: Config,
    rank: u32,
    size: u32,
    root: Option<Root>,
    err: Option<Error>,
}

impl Builder {
    pub fn new(cfg: Config) -> Builder {
        Builder { cfg, rank: 0, size: 1, root: None, err: None }
    }
    fn set_err(mut self, e: Error) -> Builder {
        self.err.get_or_insert(e);
        self
    }
    /// Rails as in `MULTIRAIL_RAILS`: `tcp:127.0.0.1,tcp:eth1`.
    pub fn rails(mut self, rails: &str) -> Builder {
        match multirail_transport::RailSpec::parse_list(rails) {
            Ok(r) => self.cfg.rails = r,
            Err(e) => return self.set_err(Error::Config(e)),
        }
        self
    }
    /// Policy table as in `MULTIRAIL_POLICY`: `16K:single,*:adaptive`.
    pub fn policy(mut self, table: &str) -> Builder {
        match table.parse() {
            Ok(t) => self.cfg.proto.policy = t,
            Err(e) => return self.set_err(Error::Config(e)),
        }
        self
    }
    pub fn progress(mut self, p: Progress) -> Builder {
        self.cfg.progress = p;
        self
    }
    /// How long a waiting thread busy-polls before it sleeps, as
    /// `MULTIRAIL_SPIN_US`.
    pub fn spin(mut self, t: Duration) -> Builder {
        self.cfg.spin = t;
        self
    }
    pub fn eager_limit(mut self, bytes: u64) -> Builder {
        self.cfg.proto.eager_limit = bytes;
        self
    }
    pub fn unexpected_limit(mut self, bytes: u64) -> Builder {
        self.cfg.proto.unexpected_limit = bytes;
        self
    }
    pub fn chunk(mut self, bytes: u64) -> Builder {
        self.cfg.proto.chunk = bytes;
        self
    }
    pub fn checksum(mut self, on: bool) -> Builder {
        self.cfg.proto.checksum = on;
        self
    }
    /// How long a peer with work pending may stay silent on every rail
    /// before it is declared dead (`MULTIRAIL_PEER_TIMEOUT_MS`).
    pub fn peer_timeout(mut self, t: Duration) -> Builder {
        self.cfg.proto.peer_timeout = t;
        self
    }
    /// Floor of the retransmission timeout (`MULTIRAIL_RTO_MIN_MS`).
    pub fn rto_min(mut self, t: Duration) -> Builder {
        self.cfg.proto.rto_min = t;
        self
    }
    /// Open every rail to every peer at start (`MULTIRAIL_CONNECT=eager`)
    /// instead of when first needed.
    pub fn eager_connect(mut self, eager: bool) -> Builder {
        self.cfg.proto.eager_connect = eager;
        self
    }
    /// Whether ranks on one host talk over shared memory by themselves
    /// (`MULTIRAIL_SHM`; default [`ShmMode::Auto`](crate::ShmMode::Auto)).
    pub fn shm(mut self, mode: crate::ShmMode) -> Builder {
        self.cfg.shm = mode;
        self
    }
    /// Payloads of at least this many bytes cross a `shm` rail by single
    /// copy where the kernel allows it; `None`: always through the ring
    /// (`MULTIRAIL_SHM_CMA`; default `None`, see docs/rails/shm.md).
    pub fn shm_cma(mut self, min: Option<usize>) -> Builder {
        self.cfg.shm_cma = min;
        self
    }
    /// Which payloads cross an `ofi:` rail by RMA read
    /// (MULTIRAIL_OFI_RMA; default [`crate::OfiRma::Auto`]).
    pub fn ofi_rma(mut self, rma: crate::OfiRma) -> Builder {
        self.cfg.ofi_rma = rma;
        self
    }
    /// Whether ranks sleep by the side channel's doorbell on `ofi:tcp`
    /// rails that lend nothing (MULTIRAIL_OFI_WAIT: `auto` = true, the
    /// default; `fd` = false: on the CQ's wait fd).
    pub fn ofi_doorbell(mut self, on: bool) -> Builder {
        self.cfg.ofi_doorbell = on;
        self
    }
    /// When `ofi:` rails make their provider connections
    /// (MULTIRAIL_OFI_CONNECT): `Some(true)` at setup, `Some(false)` at
    /// the first message. `None` (the default) is decided from the ranks
    /// on this host only for an endpoint of a launched job
    /// ([`Endpoint::from_job`], [`crate::Config::ofi_connect`]); an
    /// endpoint built here does not know them, and connects at the first
    /// message unless a peer asks.
    pub fn ofi_connect(mut self, at_setup: Option<bool>) -> Builder {
        self.cfg.ofi_connect = at_setup;
        self
    }
    pub fn key(mut self, key: impl Into<Vec<u8>>) -> Builder {
        self.cfg.key = Some(key.into());
        self
    }
    pub fn job(mut self, id: u64) -> Builder {
        self.cfg.job_id = id;
        self
    }
    /// Injects faults into every connection of rail `rail`.
    pub fn fault(mut self, rail: usize, f: FaultConfig) -> Builder {
        if self.cfg.faults.len() <= rail {
            self.cfg.faults.resize(rail + 1, None);
        }
        self.cfg.faults[rail] = Some(f);
        self
    }
    /// This process is `rank` of `size`.
    pub fn rank(mut self, rank: u32, size: u32) -> Builder {
        self.rank = rank;
        self.size = size;
        self
    }
    /// Rank 0: accept the other ranks on this listener.
    pub fn root_listener(mut self, l: TcpListener) -> Builder {
        self.root = Some(Root::Listen(vec![l]));
        self
    }
    /// Ranks other than 0: meet rank 0 here.
    pub fn root(mut self, addr: SocketAddr) -> Builder {
        self.root = Some(Root::Connect(vec![addr]));
        self
    }
    /// Connects to every other rank and starts the progress engine.
    pub fn build(self) -> Result<Endpoint, Error> {
        if let Some(e) = self.err {
            return Err(e);
        }
        Endpoint::start(self.cfg, self.rank, self.size, self.root)
    }
}

/// One process's end of the multi-rail channel to every other rank.
///
/// Methods, by group:
/// * about the job: [`rank`](Endpoint::rank), [`size`](Endpoint::size),
///   [`rail_names`](Endpoint::rail_names), [`rail_stats`](Endpoint::rail_stats);
/// * blocking: [`send`](Endpoint::send), [`recv`](Endpoint::recv),
///   [`barrier`](Endpoint::barrier);
/// * non-blocking: [`isend`](Endpoint::isend) and
///   [`irecv`](Endpoint::irecv) return requests to
///   [`test`](SendRequest::test) or [`wait`](SendRequest::wait) on, or to
///   pass to [`wait_all`](Endpoint::wait_all);
/// * [`close`](Endpoint::close) (also on drop): waits until everything sent
///   was delivered, then says goodbye on every rail.
///
/// Messages from one rank are matched in the order they were sent, however
/// their fragments travelled. `None` as source or tag matches any.
pub struct Endpoint {
    shared: Arc<Shared>,
    engine: Option<Engine>,
    rank: u32,
    size: u32,
    cfg: Config,
    /// The rails to each peer.
    routes: Arc<Routes>,
    /// The host of every rank (see [`Endpoint::hosts`]).
    host_of: Vec<u32>,
    /// Opens, accepts and replaces rail connections.
    connections: Option<crate::connections::Connections>,
}

fn now_plus(d: Option<Duration>) -> Option<Instant> {
    d.map(|d| Instant::now() + d)
}

impl Endpoint {
    pub fn builder() -> Builder {
        Builder::new(Config::default())
    }

    /// Everything from the environment: `MULTIRAIL_*` settings, and the
    /// rank, size and root from `MULTIRAIL_RANK/SIZE/ROOT` or the launcher
    /// (Open MPI, PMI, Slurm).
    pub fn from_env() -> Result<Endpoint, Error> {
        let cfg = Config::from_env()?;
        let job = JobInfo::from_env()?.ok_or_else(|| {
            Error::Config(
                "not started as part of a job: set MULTIRAIL_RANK, MULTIRAIL_SIZE and MULTIRAIL_ROOT, \
                 or launch with mpirun/srun (and MULTIRAIL_ROOT=host:port)"
                    .into(),
            )
        })?;
        Endpoint::from_job(cfg, &job)
    }

    /// An endpoint for `job` (from [`JobInfo::from_env`]) with settings `cfg`.
    pub fn from_job(mut cfg: Config, job: &JobInfo) -> Result<Endpoint, Error> {
        // The host's CPUs, not this rank's affinity: a launcher that pins
        // each rank to its own core leaves each one CPU to spin on.
        let cpus = crate::cpus::host();
        if cfg.spin_auto && !crate::cpus::may_spin(job.local_size, cpus) && !cfg.spin.is_zero() {
            tracing::info!(
                "{} ranks on this host, {cpus} CPUs (more than {} per CPU): waiting threads sleep at once (MULTIRAIL_SPIN_US overrides)",
                job.local_size.unwrap_or(0),
                crate::cpus::SPIN_RANKS_PER_CPU
            );
            cfg.spin = Duration::ZERO;
        }
        if cfg.ofi_connect.is_none() {
            // Crowded: a peer's first message may find this rank busy
            // elsewhere or asleep for long (docs/rails/ofi.md, Setup).
            cfg.ofi_connect = Some(!crate::cpus::may_spin(job.local_size, cpus));
        }
        let root = match (&job.root, job.size) {
            (_, 1) => None,
            (root, _) if job.pmix => match (multirail_pmix::Pmix::loadable(), root) {
                (Ok(()), _) => Some(Root::Pmix),
                // One node: meet at the derived loopback port instead.
                (Err(e), Some(r)) => {
                    tracing::warn!(
                        "{e}; the ranks meet at {r} instead (set MULTIRAIL_ROOT=host:port, or MULTIRAIL_PMIX_LIB to libpmix)"
                    );
                    Some(Self::root_of(&cfg, job, r)?)
                }
                (Err(e), None) => {
                    return Err(Error::Config(format!(
                        "{}: a PMIx launcher started the job, but {e}: set MULTIRAIL_PMIX_LIB=/path/to/libpmix.so, \
                         or MULTIRAIL_ROOT=host:port (an address of rank 0's host)",
                        job.source
                    )));
                }
            },
            (Some(r), _) => Some(Self::root_of(&cfg, job, r)?),
            (None, _) => {
                return Err(Error::Config(format!(
                    "{}: {} ranks{} need a meeting point: set MULTIRAIL_ROOT=host:port (an address of rank 0's \
                     host, reachable from every rank; several as host:port,host:port), or start the job with a \
                     PMIx launcher (mpirun, srun --mpi=pmix) with libpmix installed",
                    job.source,
                    job.size,
                    if job.multi_node == Some(true) { " on several hosts" } else { "" }
                )));
            }
        };
        Endpoint::start(cfg, job.rank, job.size, root)
    }

    /// Rank 0 listens at `r` (every address of the list); the others
    /// connect there.
    fn root_of(cfg: &Config, job: &JobInfo, r: &str) -> Result<Root, Error> {
        if job.rank != 0 {
            return Ok(Root::Connect(resolve(r)?));
        }
        let mut ls = Vec::new();
        for addr in resolve(r)? {
            let l = multirail_transport::tcp::listen(addr.ip(), addr.port(), &cfg.socket)
                .map_err(|e| Error::Setup(format!("rank 0 cannot listen on {addr} (MULTIRAIL_ROOT={r}): {e}")))?;
            ls.push(l);
        }
        Ok(Root::Listen(ls))
    }

    fn start(mut cfg: Config, rank: u32, size: u32, root: Option<Root>) -> Result<Endpoint, Error> {
        cfg.validate()?;
        if size == 0 || rank >= size || size > bootstrap::MAX_RANKS {
            return Err(Error::Config(format!("rank {rank} of a job of {size}")));
        }
        if cfg.key.is_none() && size > 1 {
            tracing::warn!("MULTIRAIL_KEY is not set: rails are not authenticated");
        }
        cfg.proto.rank = rank;
        let rails = cfg.rails.iter().map(|s| s.resolve().map_err(Error::Config)).collect::<Result<Vec<_>, _>>()?;
        let configured = Arc::new(cfg.clone());
        let boot =
            Me { cfg: configured.clone(), rank, size, rails, routes: Arc::new(Routes::uniform(cfg.rails.len(), size)) };
        let deadline = Instant::now() + cfg.setup_timeout;
        let mut listeners = bootstrap::bind_rails(&boot)?;
        let shm_listener = Self::shm_listener(&cfg);
        let mine = Row {
            host: HostId::local(),
            pid: std::process::id(),
            shm: shm_listener.as_ref().and_then(|l| l.local_addr().ok()),
            rails: listeners.iter().map(|l| l.local_addr()).collect::<Result<_, _>>()?,
        };
        let table = match (size, root) {
            (1, _) => vec![mine],
            (_, Some(Root::Listen(l))) if rank == 0 => bootstrap::gather(&boot, &l, mine, deadline)?,
            (_, Some(Root::Connect(a))) if rank != 0 => bootstrap::join(&boot, &a, mine, deadline)?,
            (_, Some(Root::Pmix)) => bootstrap::pmix_exchange(&boot, mine)?,
            _ => return Err(Error::Config("rank 0 needs a root listener, other ranks a root address".into())),
        };
        let hosts: Vec<_> = table.iter().map(bootstrap::Row::entry).collect();
        // Peers on this kernel in this PID namespace (other hosts of the
        // emulated cluster too): where they run can be looked up.
        let me_host = table[rank as usize].host;
        let table_pids: Vec<Option<u32>> = table
            .iter()
            .map(|row| (row.pid != 0 && me_host.same_kernel_and_pids(&row.host)).then_some(row.pid))
            .collect();
        let routes = Arc::new(Routes::plan(rank, &hosts, cfg.rails.len()));
        let host_of = crate::hosts::host_indices(&table.iter().map(|r| r.host).collect::<Vec<_>>());
        let mut rails = boot.rails;
        let addrs = Self::add_shm_rail(&mut cfg, &mut rails, &mut listeners, shm_listener, table, &routes)?;
        debug_assert_eq!(cfg.rails.len(), routes.rail_count());
        let cfg = Arc::new(cfg);
        let me = Me { cfg: cfg.clone(), rank, size, rails, routes: routes.clone() };
        let shared = Arc::new(Self::make_shared(&cfg, &routes, rank, size));
        shared.peer_cpus.watch_all(&table_pids);
        let engine = Engine::start(&shared, cfg.progress, cfg.spin)?;
        let connections = crate::connections::Connections::start(shared.clone(), me, listeners, addrs)?;
        let ep = Endpoint {
            shared,
            engine: Some(engine),
            rank,
            size,
            cfg: (*cfg).clone(),
            routes,
            host_of,
            connections: Some(connections),
        };
        if cfg.proto.eager_connect {
            ep.wait_connected(deadline)?;
        }
        Ok(ep)
    }

    /// Eager start: waits until every peer has at least one rail up (the
    /// others join when they can).
    fn wait_connected(&self, deadline: Instant) -> Result<(), Error> {
        let shared = &self.shared;
        // The first timer run asks for the connections.
        shared.with_core(|_, _| ());
        let peers: Vec<u32> = (0..self.size).filter(|&p| p != self.rank).collect();
        let mut ready = |g: &mut crate::shared::Inner| {
            peers.iter().all(|&p| (0..g.core.rail_count(p)).any(|r| g.core.is_rail_up(p, r)))
        };
        if self.engine()?.wait_until(shared, &mut ready, Some(deadline)) {
            return Ok(());
        }
        let g = shared.lock();
        let missing: Vec<u32> =
            peers.iter().copied().filter(|&p| !(0..g.core.rail_count(p)).any(|r| g.core.is_rail_up(p, r))).collect();
        Err(Error::Setup(format!("no rail to ranks {missing:?} came up within the setup timeout")))
    }

    /// After meeting: if any pair uses the automatic `shm` rail, it joins
    /// the job's rails (last; on every rank, so rail lists agree) with our
    /// listener for it, if we have one (without, no pair of ours uses it).
    /// Returns every rank's listener addresses by rail.
    fn add_shm_rail(
        cfg: &mut Config,
        rails: &mut Vec<multirail_transport::spec::Resolved>,
        listeners: &mut Vec<TcpListener>,
        shm_listener: Option<TcpListener>,
        table: bootstrap::Table,
        routes: &Routes,
    ) -> Result<crate::connections::Addrs, Error> {
        if routes.shm_rail().is_some() {
            let shm: multirail_transport::RailSpec = "shm".parse().map_err(Error::Config)?;
            rails.push(shm.resolve().map_err(Error::Config)?);
            cfg.rails.push(shm);
            listeners.extend(shm_listener);
        }
        let same: Vec<u32> = (0..table.len() as u32).filter(|&p| routes.same_host(p)).collect();
        if !same.is_empty() {
            tracing::info!("ranks {same:?} share this host: shared memory to them (MULTIRAIL_SHM=off: the rails)");
        }
        let unused = SocketAddr::from(([127, 0, 0, 1], 0));
        Ok(table
            .into_iter()
            .map(|r| r.rails.into_iter().chain(routes.shm_rail().map(|_| r.shm.unwrap_or(unused))).collect())
            .collect())
    }

    /// A listener for the automatic `shm` rail's setup connections, if
    /// this rank offers one (none where loopback is down: its same-host
    /// peers then use the rails).
    fn shm_listener(cfg: &Config) -> Option<TcpListener> {
        if !cfg.auto_shm() {
            return None;
        }
        multirail_transport::tcp::listen([127, 0, 0, 1].into(), 0, &cfg.socket)
            .inspect_err(|e| tracing::info!("no shared memory to ranks of this host: cannot listen on 127.0.0.1: {e}"))
            .ok()
    }

    /// The core and the slot grid: one slot per (peer, local rail), as
    /// wide as the peer with the most rails (a same-host peer has one, the
    /// `shm` rail; its other slots stay empty).
    fn make_shared(cfg: &Config, routes: &Routes, rank: u32, size: u32) -> Shared {
        let mut core = Core::new(cfg.proto.clone());
        let mut slots = Vec::new();
        for peer in (0..size).filter(|&p| p != rank) {
            let to = routes.rails_to(peer);
            core.add_peer(peer, to.len());
            for k in 0..routes.width() {
                let name = to.get(k).map_or_else(|| "unused".to_string(), |&g| cfg.rails[g].to_string());
                slots.push(Arc::new(Slot::new(peer, k, format!("{name} to rank {peer}"))));
            }
        }
        Shared::new(core, slots, rank)
    }

    // ----- about the job -----

    pub fn rank(&self) -> u32 {
        self.rank
    }
    pub fn size(&self) -> u32 {
        self.size
    }
    pub fn config(&self) -> &Config {
        &self.cfg
    }
    /// The job's rails, in index order: the configured ones, then `shm`
    /// if ranks of one host talk over shared memory by themselves
    /// (`MULTIRAIL_SHM=auto`).
    pub fn rail_names(&self) -> Vec<String> {
        self.cfg.rails.iter().map(|r| r.to_string()).collect()
    }
    /// The indices (into [`rail_names`](Endpoint::rail_names)) of the
    /// rails to `peer`, in the order of [`rail_stats`](Endpoint::rail_stats):
    /// just the `shm` rail for a peer on this host (with
    /// `MULTIRAIL_SHM=auto`), the configured rails for the others.
    pub fn rails_to(&self, peer: u32) -> Vec<usize> {
        if peer >= self.size || peer == self.rank { Vec::new() } else { self.routes.rails_to(peer) }
    }
    /// Where the ranks run: rank `r` is on host `hosts()[r]`, hosts
    /// numbered from 0 in order of their first rank. Ranks on one host
    /// share a kernel, network namespace and PID namespace (so two hosts of
    /// `multirail testbed` are two hosts).
    pub fn hosts(&self) -> &[u32] {
        &self.host_of
    }
    /// Per-rail byte counters and state for the rails to `peer`, in the
    /// order of [`rails_to`](Endpoint::rails_to).
    pub fn rail_stats(&self, peer: u32) -> Vec<RailStats> {
        self.shared.with_core(|c, now| c.rail_stats(peer, now))
    }
    /// Why rails failed so far: (peer, rail, reason).
    pub fn rail_errors(&self) -> Vec<(u32, usize, String)> {
        self.shared.lock().rail_errors.clone()
    }
    /// Bytes of unexpected eager data buffered for `peer` (bounded by
    /// `MULTIRAIL_UNEXPECTED_LIMIT`), for tests.
    #[doc(hidden)]
    pub fn unexpected_bytes(&self, peer: u32) -> u64 {
        self.shared.lock().core.unexpected_bytes(peer)
    }

    /// Makes progress (reads, writes, acknowledgements, timers) until
    /// `cond` holds or `timeout` passes; returns whether it held. For
    /// bindings that wait for something other than a request, such as a
    /// lent send buffer that multirail keeps until the peer acknowledged
    /// it (a send completes when written). `cond` is checked often: keep
    /// it cheap.
    pub fn progress_until(&self, mut cond: impl FnMut() -> bool, timeout: Option<Duration>) -> Result<bool, Error> {
        Ok(self.engine()?.wait_until(&self.shared, &mut |_| cond(), now_plus(timeout)))
    }

    /// How many times an IO thread of the threaded progress engine
    /// returned from epoll (a ready connection, a wake-up or a timer;
    /// always 0 with the polled engine). A diagnostic: while a thread
    /// waits, it runs the loop itself and the IO threads stay parked.
    #[doc(hidden)]
    pub fn io_thread_wakeups(&self) -> u64 {
        self.shared.io_wakeups.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many times the polled engine's loop slept until its timeout
    /// (the next timer, or the longest sleep) with nothing becoming ready.
    /// A diagnostic:
    /// a sleeping waiter is woken by what it waits for, not found by a
    /// timer.
    #[doc(hidden)]
    pub fn sleeps_timed_out(&self) -> u64 {
        self.shared.sleep_timeouts.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many times a spinning waiter gave its CPU away
    /// (`sched_yield`) because its wait had lasted longer than a message
    /// takes. A diagnostic.
    #[doc(hidden)]
    pub fn spin_yields(&self) -> u64 {
        self.shared.spin_yields.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many waits gave their CPU away between all their rounds (not
    /// only after 20 µs) because the peer they waited for (for a wait on
    /// any rank: one of at most 8 watched) last ran on the waiting
    /// thread's CPU: another process on this kernel, in this PID
    /// namespace. A diagnostic.
    #[doc(hidden)]
    pub fn peer_here_waits(&self) -> u64 {
        self.shared.peer_here_waits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many rounds a spinning wait of the polled engine skipped
    /// because every rail it reads said nothing was there (shared memory
    /// can tell cheaply; sockets cannot). A diagnostic.
    #[doc(hidden)]
    pub fn quiet_rounds(&self) -> u64 {
        self.shared.quiet_rounds.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether this `isend`'s message may stay queued (write coalescing):
    /// it follows another `isend` within `COALESCE_GAP` with no wait since,
    /// fewer than `coalesce` are queued, and the engine will run its loop
    /// soon (the application waited a moment ago, nobody sleeps in it).
    /// The `coalesce + 1`-th writes them all. The first `isend` after a
    /// wait (a ping-pong's every one) reads no clock: the core's reading,
    /// stored after the call, dates it for the next. `Some`: it may, and
    /// the clock reading it was judged by (the core's for it too: one
    /// reading per queued `isend`).
    fn coalesce(&self, engine: &Engine) -> Option<Time> {
        use std::sync::atomic::Ordering::Relaxed;
        let max = u64::from(self.cfg.coalesce);
        if max == 0 {
            return None;
        }
        let n = self.shared.burst.fetch_add(1, Relaxed);
        if n.is_multiple_of(max + 1) {
            return None;
        }
        let t = Instant::now();
        let now = self.shared.time_of(t);
        let gap = now.as_nanos().saturating_sub(self.shared.last_isend.load(Relaxed));
        (gap < crate::config::COALESCE_GAP.as_nanos() as u64 && engine.runs_soon(t)).then_some(now)
    }

    /// How many wake-ups the connections open now sent their peers
    /// (shared memory's doorbell writes). A diagnostic: a peer that spins
    /// while it waits needs none.
    #[doc(hidden)]
    pub fn wakeups_sent(&self) -> u64 {
        self.shared.wakeups_sent()
    }

    /// How many times this endpoint wrote to its rails (a `writev` that
    /// moved bytes, any number of frames). A diagnostic: a burst of small
    /// `isend`s leaves in a few writes (write coalescing,
    /// `MULTIRAIL_COALESCE`).
    #[doc(hidden)]
    pub fn rail_writes(&self) -> u64 {
        self.shared.writes.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn engine(&self) -> Result<&Engine, Error> {
        // Not `ok_or(Error::Shutdown)`: that builds the error and drops it on
        // every call, a few dozen instructions three times per message.
        match &self.engine {
            Some(e) => Ok(e),
            None => Err(Error::Shutdown),
        }
    }

    fn check_peer(&self, peer: u32) -> Result<(), Error> {
        if peer >= self.size || peer == self.rank { Err(Error::NoSuchPeer(peer)) } else { Ok(()) }
    }

    // ----- non-blocking -----

    /// Starts sending `data` (a `Vec<u8>`, `Bytes`, ...; no copy is made).
    pub fn isend(&self, peer: u32, tag: u64, data: impl Into<Bytes>) -> Result<SendRequest<'_>, Error> {
        if tag >= RESERVED_TAGS {
            return Err(Error::Config(format!("tag {tag:#x} is reserved (tags must be below 2^63)")));
        }
        self.isend_raw(peer, tag, data.into())
    }

    /// Queues the message in the core and marks its connections as having
    /// output without writing it (write coalescing): whoever runs the
    /// engine's loop next, or flushes, writes it with what follows.
    fn isend_deferred(&self, peer: u32, tag: u64, data: Bytes) -> (ReqId, Time) {
        self.queue_sends(None, |c, now| (c.isend(peer, tag, data, now), now))
    }

    /// [`Endpoint::isend_deferred`] for the application, at `now` (the
    /// clock reading `coalesce` took): a send that completes inside the
    /// call (the direct path) keeps its outcome in its request.
    fn isend_queued(
        &self,
        peer: u32,
        tag: u64,
        data: Bytes,
        now: Time,
    ) -> (ReqId, Time, Option<Result<(), SendError>>) {
        self.queue_sends(Some(now), |c, now| {
            let id = c.isend(peer, tag, data, now);
            (id, now, c.take_send_done(id))
        })
    }

    /// Runs `f` on the core (at `at`, or the clock's time) and marks the
    /// connections it gave output as deferred, unwritten.
    fn queue_sends<R>(&self, at: Option<Time>, f: impl FnOnce(&mut Core, Time) -> R) -> R {
        let (r, wake) = self.shared.with_core_deferred_at(at, f);
        for i in wake {
            self.shared.defer_slot(i);
        }
        r
    }

    fn isend_raw(&self, peer: u32, tag: u64, data: Bytes) -> Result<SendRequest<'_>, Error> {
        self.check_peer(peer)?;
        let engine = self.engine()?;
        let small = data.len() <= crate::config::COALESCE_MAX_BYTES;
        // A send that completes inside `isend` (the direct path) keeps
        // its outcome in the request, not in the shared map: its wait
        // takes no lock.
        let (id, now, early) = match small.then(|| self.coalesce(engine)).flatten() {
            Some(now) => self.isend_queued(peer, tag, data, now),
            None => self.shared.isend(peer, tag, data),
        };
        if small {
            self.shared.last_isend.store(now.as_nanos(), std::sync::atomic::Ordering::Relaxed);
        }
        Ok(SendRequest { ep: self, id, peer, early })
    }

    /// Posts a receive into `buf` (its length is the most it takes; no
    /// copy is made: fragments land in it from every rail).
    pub fn irecv(
        &self,
        src: Option<u32>,
        tag: Option<u64>,
        buf: impl Into<BytesMut>,
    ) -> Result<RecvRequest<'_>, Error> {
        if let Some(s) = src {
            self.check_peer(s)?;
        }
        self.engine()?;
        let buf = buf.into();
        let (id, wake) = self.shared.with_core_deferred(|c, now| c.irecv(src, tag, buf, now));
        self.shared.send_now_or_wake(wake);
        Ok(RecvRequest { ep: self, id, src })
    }

    /// Waits for request `id`, whose other end is rank `peer` (none: any).
    fn wait_id(&self, id: ReqId, peer: Option<u32>, timeout: Option<Duration>) -> Result<Completion, Error> {
        let engine = self.engine()?;
        let (c, awaits) = self.shared.take_or_await(id);
        if let Some(c) = c {
            return Ok(c);
        }
        // The check that ends the wait takes the completion (one lock).
        let mut got = None;
        let mut done = |g: &mut crate::shared::Inner| {
            got = got.take().or_else(|| if awaits { g.take_awaited(id) } else { g.done.remove(&id) });
            got.is_some()
        };
        if !engine.wait_for(&self.shared, &mut done, now_plus(timeout), peer) {
            if awaits {
                self.shared.end_await();
            }
            return Err(Error::Timeout);
        }
        Ok(got.expect("waited for it"))
    }

    /// Waits for every request.
    pub fn wait_all<'a>(&'a self, reqs: impl IntoIterator<Item = Request<'a>>) -> Vec<Result<Finished, Error>> {
        reqs.into_iter()
            .map(|r| match r {
                Request::Send(s) => s.wait().map(|()| Finished::Sent),
                Request::Recv(r) => r.wait().map(|(buf, st)| Finished::Received(buf, st)),
            })
            .collect()
    }

    // ----- blocking -----

    /// Sends a copy of `data`; returns once it is handed to the rails.
    pub fn send(&self, peer: u32, tag: u64, data: &[u8]) -> Result<(), Error> {
        self.isend(peer, tag, Bytes::copy_from_slice(data))?.wait()
    }

    /// Receives into `buf`; returns who sent what.
    pub fn recv(&self, src: Option<u32>, tag: Option<u64>, buf: &mut [u8]) -> Result<Status, Error> {
        let (got, st) = self.irecv(src, tag, BytesMut::zeroed(buf.len()))?.wait()?;
        buf[..st.len as usize].copy_from_slice(&got[..st.len as usize]);
        Ok(st)
    }

    /// Returns once every rank has called `barrier`. A binomial tree rooted
    /// at rank 0: each rank hears from its children, tells its parent,
    /// hears back and releases its children, so no rank handles more than
    /// log2(size) messages each way (and the job opens size - 1 pairs of
    /// connections for it, as a star would).
    pub fn barrier(&self) -> Result<(), Error> {
        let (r, n) = (self.rank, self.size);
        if n == 1 {
            return Ok(());
        }
        // Rank r's parent clears its lowest set bit; its children add each
        // smaller power of two.
        let low = if r == 0 { n.next_power_of_two() } else { r & r.wrapping_neg() };
        let children: Vec<u32> =
            (0..32).map(|k| 1u32 << k).take_while(|&b| b < low).map(|b| r + b).filter(|&c| c < n).collect();
        let arrived: Vec<Request> = children
            .iter()
            .map(|&c| self.irecv(Some(c), Some(BARRIER_TAG), BytesMut::new()).map(Request::from))
            .collect::<Result<_, _>>()?;
        for res in self.wait_all(arrived) {
            res?;
        }
        if r != 0 {
            let parent = r - low;
            self.isend_raw(parent, BARRIER_TAG, Bytes::new())?.wait()?;
            self.irecv(Some(parent), Some(BARRIER_TAG), BytesMut::new())?.wait()?;
        }
        let released: Vec<Request> = children
            .iter()
            .map(|&c| self.isend_raw(c, BARRIER_TAG, Bytes::new()).map(Request::from))
            .collect::<Result<_, _>>()?;
        for res in self.wait_all(released) {
            res?;
        }
        Ok(())
    }

    /// Stops a rail's connections to every peer as if the cable were
    /// pulled (for failover tests); they reconnect if configured to.
    pub fn kill_rail(&self, rail: usize) {
        for (i, s) in self.shared.slots.iter().enumerate() {
            if self.routes.global(s.peer, s.rail) == Some(rail) {
                if let Some(r) = s.lock_conn().as_mut() {
                    r.shutdown();
                }
                self.shared.wake_slot(i);
            }
        }
    }

    /// Waits until everything sent is acknowledged, says goodbye on every
    /// rail and stops the progress engine.
    pub fn close(mut self) -> Result<(), Error> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), Error> {
        let Some(mut engine) = self.engine.take() else { return Ok(()) };
        let shared = &self.shared;
        let mut quiet = |g: &mut crate::shared::Inner| g.core.is_quiescent();
        let drained = engine.wait_until(shared, &mut quiet, Some(Instant::now() + CLOSE_DRAIN));
        let unacked = if drained { Vec::new() } else { shared.with_core(|c, _| c.unacked_by_peer()) };
        shared.with_core(|c, now| c.close(now));
        let mut flushed =
            |g: &mut crate::shared::Inner| shared.slots.iter().all(|s| !g.core.has_transmit(s.peer, s.rail));
        engine.wait_until(shared, &mut flushed, Some(Instant::now() + Duration::from_secs(1)));
        engine.stop(shared);
        if let Some(mut c) = self.connections.take() {
            c.stop();
        }
        // Incoming connections whose handshake ends now get a CLOSE.
        shared.wait_handshakes(Instant::now() + CLOSE_HANDSHAKES);
        shared.close_parked(true);
        // Rails whose end can overtake their bytes (`ofi`: the end goes on
        // the side channel) make sure the CLOSE and acknowledgements just
        // flushed reach the peer first; together at most CLOSE_LINGER.
        let by = Instant::now() + CLOSE_LINGER;
        for s in &shared.slots {
            if let Some(mut r) = s.lock_conn().take() {
                let _ = r.flush();
                r.close(by);
            }
        }
        if drained {
            return Ok(());
        }
        let who: Vec<String> = unacked.iter().map(|(peer, n)| format!("{n} by rank {peer}")).collect();
        Err(Error::Setup(format!(
            "closed with messages not acknowledged by their peers after {CLOSE_DRAIN:?}: {}",
            who.join(", ")
        )))
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// What [`crate::group`] needs below the public API: sends and receives on
/// its reserved tags by request id, completions taken without blocking, and
/// a wait on a condition that an application thread can cut short.
impl Endpoint {
    /// Queues a message on a reserved tag without writing it: its frames
    /// wait for [`Endpoint::flush_sends`] (or the engine's next round), so
    /// that what one turn of the group's driver sends to a peer (a data
    /// frame and the row after it) leaves in one write.
    pub(crate) fn isend_reserved_later(&self, peer: u32, tag: u64, data: Bytes) -> Result<ReqId, Error> {
        self.check_peer(peer)?;
        self.engine()?;
        Ok(self.isend_deferred(peer, tag, data).0)
    }

    /// Writes what [`Endpoint::isend_reserved_later`] queued, one write per
    /// connection where it is free; the engine writes the rest.
    pub(crate) fn flush_sends(&self) {
        self.shared.flush_deferred_or_wake();
    }

    pub(crate) fn irecv_exact(&self, src: u32, tag: u64, buf: BytesMut) -> Result<ReqId, Error> {
        Ok(self.irecv(Some(src), Some(tag), buf)?.id)
    }

    /// When anything from each of `peers` last arrived, on any rail, in
    /// nanoseconds of the endpoint's clock (0: never); one lock for all.
    pub(crate) fn last_heard(&self, peers: &[u32], out: &mut Vec<u64>) {
        let g = self.shared.lock();
        out.clear();
        out.extend(peers.iter().map(|&p| g.core.last_heard(p).map_or(0, |t| t.as_nanos())));
    }

    /// The completions among `ids` that finished (taken: asked once), with
    /// their positions in `ids`, in that order; one lock for all.
    pub(crate) fn take_completions(&self, ids: impl Iterator<Item = ReqId>, out: &mut Vec<(usize, Completion)>) {
        let mut g = self.shared.lock();
        if g.done.is_empty() {
            return;
        }
        for (i, id) in ids.enumerate() {
            if let Some(c) = g.done.remove(&id) {
                out.push((i, c));
            }
        }
    }

    /// Makes progress until `done` (checked with the shared state locked)
    /// or `deadline`; returns `done`.
    pub(crate) fn wait_for(&self, done: &mut crate::engine::Done<'_>, deadline: Instant) -> Result<bool, Error> {
        Ok(self.engine()?.wait_until(&self.shared, done, Some(deadline)))
    }

    /// Wakes a thread inside [`Endpoint::wait_for`] so that it checks its
    /// condition again (something it watches outside the endpoint changed).
    pub(crate) fn nudge(&self) {
        if let Ok(e) = self.engine() {
            e.wake();
        }
        // Read under the lock: a waiter counts itself under it before it
        // sleeps.
        let g = self.shared.lock();
        let sleepers = self.shared.done_waiters.load(std::sync::atomic::Ordering::Acquire) > 0;
        drop(g);
        if sleepers {
            self.shared.done_cv.notify_all();
        }
    }
}

/// A send in progress.
#[must_use = "a request does nothing unless waited for or tested"]
pub struct SendRequest<'a> {
    ep: &'a Endpoint,
    id: ReqId,
    /// The destination (a wait for a peer that last ran on this thread's
    /// CPU yields from its first round: [`crate::cpus::PeerCpus`]).
    peer: u32,
    /// The outcome, when the send completed inside `isend` (it is then not
    /// in the shared map of completions).
    early: Option<Result<(), SendError>>,
}

impl SendRequest<'_> {
    /// True once the send completed (successfully or not).
    pub fn test(&self) -> bool {
        self.ep.shared.flush_deferred();
        self.early.is_some() || self.ep.shared.lock().done.contains_key(&self.id)
    }
    pub fn wait(self) -> Result<(), Error> {
        self.wait_timeout(None)
    }
    pub fn wait_timeout(self, t: Option<Duration>) -> Result<(), Error> {
        if let Some(r) = self.early {
            return r.map_err(Error::from);
        }
        match self.ep.wait_id(self.id, Some(self.peer), t)? {
            Completion::Send(r) => r.map_err(Error::from),
            Completion::Recv(..) => unreachable!("a send completes as a send"),
        }
    }
}

/// A receive in progress.
#[must_use = "a request does nothing unless waited for or tested"]
pub struct RecvRequest<'a> {
    ep: &'a Endpoint,
    id: ReqId,
    /// The source asked for (none: any).
    src: Option<u32>,
}

impl RecvRequest<'_> {
    pub fn test(&self) -> bool {
        self.ep.shared.flush_deferred();
        self.ep.shared.lock().done.contains_key(&self.id)
    }
    /// The filled buffer and what matched.
    pub fn wait(self) -> Result<(BytesMut, Status), Error> {
        let (buf, r) = self.wait_with_buffer(None)?;
        r.map(|st| (buf, st))
    }
    /// The buffer back whatever happened, and the outcome (truncation
    /// keeps the buffer usable).
    pub fn wait_with_buffer(self, t: Option<Duration>) -> Result<(BytesMut, Result<Status, Error>), Error> {
        match self.ep.wait_id(self.id, self.src, t)? {
            Completion::Recv(r, buf) => Ok((buf, r.map_err(Error::from))),
            Completion::Send(_) => unreachable!("a receive completes as a receive"),
        }
    }
}

/// Either kind of request, for [`Endpoint::wait_all`].
pub enum Request<'a> {
    Send(SendRequest<'a>),
    Recv(RecvRequest<'a>),
}

impl<'a> From<SendRequest<'a>> for Request<'a> {
    fn from(r: SendRequest<'a>) -> Self {
        Request::Send(r)
    }
}
impl<'a> From<RecvRequest<'a>> for Request<'a> {
    fn from(r: RecvRequest<'a>) -> Self {
        Request::Recv(r)
    }
}

impl Request<'_> {
    /// Lets go of the borrow of the endpoint, for bindings (C, Python)
    /// that hold the endpoint and its requests as separate handles. The
    /// request keeps running; [`Endpoint::attach`] turns it back into a
    /// [`Request`] to test or wait on. A detached request never attached
    /// again leaves its completion with the endpoint until it closes.
    pub fn detach(self) -> Detached {
        let (ep, id, send, peer) = match self {
            Request::Send(r) => {
                // A completion kept in the request goes where an attached
                // request looks for it.
                if let Some(res) = r.early {
                    r.ep.shared.lock().done.insert(r.id, Completion::Send(res));
                }
                (r.ep, r.id, true, Some(r.peer))
            }
            Request::Recv(r) => (r.ep, r.id, false, r.src),
        };
        Detached { owner: Arc::as_ptr(&ep.shared) as usize, id, send, peer }
    }
}

/// A request without its endpoint borrow (see [`Request::detach`]).
#[derive(Debug)]
#[must_use = "a request does nothing unless attached and waited for or tested"]
pub struct Detached {
    /// Which endpoint it belongs to (its shared state's address).
    owner: usize,
    id: ReqId,
    send: bool,
    /// The request's other end (none: any source).
    peer: Option<u32>,
}

impl Detached {
    /// A send (rather than a receive).
    pub fn is_send(&self) -> bool {
        self.send
    }
}

impl Endpoint {
    /// The request `d` detached from this endpoint, back in hand. A
    /// request of another endpoint is refused.
    pub fn attach(&self, d: Detached) -> Result<Request<'_>, Error> {
        if d.owner != Arc::as_ptr(&self.shared) as usize {
            return Err(Error::Config("the request belongs to another endpoint".into()));
        }
        Ok(match (d.send, d.peer) {
            (true, Some(peer)) => Request::Send(SendRequest { ep: self, id: d.id, peer, early: None }),
            (true, None) => unreachable!("a detached send keeps its destination"),
            (false, src) => Request::Recv(RecvRequest { ep: self, id: d.id, src }),
        })
    }
}

/// A finished request from [`Endpoint::wait_all`].
#[derive(Debug)]
pub enum Finished {
    Sent,
    Received(BytesMut, Status),
}
