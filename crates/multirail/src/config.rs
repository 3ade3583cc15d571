//! Configuration: a builder, and the `MULTIRAIL_*` environment variables
//! that fill it. Every variable is listed in the README; this module is the
//! one place that reads them.

use std::time::Duration;

use multirail_proto::core::Config as ProtoConfig;
use multirail_proto::sched::PolicyTable;
use multirail_proto::units::{format_size, parse_size};
use multirail_transport::RailSpec;
use multirail_transport::fault::FaultConfig;
use multirail_transport::tcp::SocketOptions;

use crate::Error;

/// The two loopback rails used when nothing else is configured.
pub const DEFAULT_RAILS: &str = "tcp:127.0.0.1,tcp:127.0.0.2";

/// Default of [`Config::coalesce`] (MULTIRAIL_COALESCE): an `isend` that
/// follows another within [`COALESCE_GAP`], with no wait since, leaves its
/// message queued, up to this many; the next wait (or the burst's next
/// write) writes them all in one `writev`. The first message of a burst is
/// written at once, so a lone message keeps its latency.
pub const DEFAULT_COALESCE: u32 = 32;
/// Only messages up to this size are coalesced. Measured side by side
/// (docs/benchmarks.md, 2026-11-25): on the 2 x 2 Gbit testbed 8 and
/// 16 KiB messages already fill the links and coalescing them gained
/// nothing (0.9-1.0 x); 64 KiB ones lost half their bandwidth on loopback.
pub const COALESCE_MAX_BYTES: usize = 4 << 10;
/// An `isend` this soon after the previous one is part of a burst.
pub const COALESCE_GAP: Duration = Duration::from_micros(20);

/// Default busy-poll time of a waiting thread (MULTIRAIL_SPIN_US).
pub const DEFAULT_SPIN_US: u64 = 200;

/// How rails are driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Progress {
    /// One IO thread per rail; waiting threads sleep until woken.
    Threaded,
    /// One epoll loop over all rails, run by the waiting thread itself
    /// (and by a background thread when nobody waits).
    Polled,
}

impl Progress {
    pub fn name(self) -> &'static str {
        match self {
            Progress::Threaded => "threaded",
            Progress::Polled => "polled",
        }
    }
}

impl std::str::FromStr for Progress {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "threaded" | "thread" | "threads" => Ok(Progress::Threaded),
            "polled" | "poll" | "epoll" => Ok(Progress::Polled),
            _ => Err(format!("unknown progress engine '{s}' (choose threaded or polled)")),
        }
    }
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything an endpoint needs to know.
#[derive(Debug, Clone)]
pub struct Config {
    pub rails: Vec<RailSpec>,
    pub progress: Progress,
    /// How long a waiting thread busy-polls the rails before sleeping in
    /// epoll (trades CPU for latency; ZERO never spins).
    pub spin: Duration,
    /// `spin` was not set explicitly: with more than
    /// [`crate::cpus::SPIN_RANKS_PER_CPU`] ranks per CPU on this host,
    /// waiting threads do not spin at all (they would take the CPU the
    /// other ranks need).
    pub spin_auto: bool,
    /// Most messages a burst of `isend`s leaves unwritten before one
    /// vectored write carries them (MULTIRAIL_COALESCE; 0: every `isend`
    /// writes at once). See [`DEFAULT_COALESCE`].
    pub coalesce: u32,
    /// Protocol tunables (rank is set from the job).
    pub proto: ProtoConfig,
    pub socket: SocketOptions,
    /// Longest a HELLO exchange may take.
    pub handshake_timeout: Duration,
    /// Longest the whole job setup (all ranks meeting) may take
    /// (MULTIRAIL_SETUP_TIMEOUT).
    pub setup_timeout: Duration,
    /// A rank joining the root gives up once every attempt was refused
    /// (nothing listens) for this long; `None`: it keeps trying until
    /// `setup_timeout` (ranks a launcher starts may come before the root).
    pub root_refused_limit: Option<Duration>,
    /// Job key; `None` = unauthenticated empty key (a warning is logged).
    pub key: Option<Vec<u8>>,
    pub job_id: u64,
    /// Fault injection per rail index (tests and `bench --fail-rail`).
    pub faults: Vec<Option<FaultConfig>>,
    /// Bytes of each ring (one per direction) of a `shm` rail
    /// (MULTIRAIL_SHM_RING): a power of two from 64 KiB to 1 GiB.
    pub shm_ring: usize,
    /// Most bytes per `fi_send` of an `ofi:` rail, its 8-byte header
    /// included, 9 bytes to 64 KiB (MULTIRAIL_OFI_SEND); `None`: the
    /// provider's default (`OfiStream`'s `default_send`: through
    /// `tcp;ofi_rxm` rxm's eager limit, 16 KiB unless
    /// `FI_OFI_RXM_EAGER_LIMIT` is larger, at most 64 KiB; a whole 64 KiB
    /// buffer elsewhere; docs/rails/ofi.md).
    pub ofi_send: Option<usize>,
    /// Which payloads cross an `ofi:` rail by RMA read (MULTIRAIL_OFI_RMA,
    /// docs/rails/ofi.md).
    pub ofi_rma: OfiRma,
    /// How a rank waits on an `ofi:` rail (MULTIRAIL_OFI_WAIT): `auto`
    /// (true): through `tcp` with nothing lent, by notices and rings on the
    /// side channel, the CQ without a wait fd; elsewhere, and with `fd`
    /// (false), on the CQ's wait fd where the provider has one
    /// (docs/rails/ofi.md).
    pub ofi_doorbell: bool,
    /// When an `ofi:` rail's provider connections are made
    /// (MULTIRAIL_OFI_CONNECT): `Some(true)` (`setup`) by a first message
    /// each way while the rail is set up, `Some(false)` (`first`) by the
    /// first message of the job; `None` (`auto`): at setup where this host
    /// runs more than [`crate::cpus::SPIN_RANKS_PER_CPU`] ranks per CPU
    /// (decided in [`crate::Endpoint::from_job`]), else at the first
    /// message. Either side asking is enough (docs/rails/ofi.md, Setup).
    pub ofi_connect: Option<bool>,
    /// Payloads of at least this many bytes cross a `shm` rail by single
    /// copy (`process_vm_readv`) where the kernel allows it; `None`: never
    /// (MULTIRAIL_SHM_CMA: `off`, the default; `on` = 64K; or a size).
    pub shm_cma: Option<usize>,
    /// Whether ranks on the same host talk over shared memory by
    /// themselves (MULTIRAIL_SHM; see [`crate::ShmMode`]).
    pub shm: crate::ShmMode,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            rails: RailSpec::parse_list(DEFAULT_RAILS).expect("default rails parse"),
            progress: Progress::Polled,
            spin: Duration::from_micros(DEFAULT_SPIN_US),
            spin_auto: true,
            coalesce: DEFAULT_COALESCE,
            proto: ProtoConfig::default(),
            socket: SocketOptions { connect_timeout: Duration::from_millis(500), ..SocketOptions::default() },
            handshake_timeout: Duration::from_secs(10),
            setup_timeout: Duration::from_secs(60),
            root_refused_limit: None,
            key: None,
            job_id: 0,
            faults: Vec::new(),
            shm_ring: 4 << 20,
            ofi_send: None,
            ofi_rma: OfiRma::Auto,
            ofi_doorbell: true,
            ofi_connect: None,
            // Off: measured slower than the ring on an idle machine
            // (docs/rails/shm.md, "Single copy").
            shm_cma: None,
            shm: crate::ShmMode::Auto,
        }
    }
}

/// Why the eager limit may not exceed the unexpected limit (the end of
/// the error that says so, whichever setting the user typed).
pub const EAGER_ABOVE_UNEXPECTED: &str = "an eager message can arrive before its receive is posted, and a \
     receiver refuses one larger than the unexpected bytes it buffers per peer; lower the eager limit (larger \
     messages then use rendezvous) or raise MULTIRAIL_UNEXPECTED_LIMIT";

/// An on/off setting: `1`, `true`, `yes`, `on` or `0`, `false`, `no`,
/// `off`, in any case. Anything else is an error, never silently off.
pub fn parse_switch(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err("expected 1/0, true/false, yes/no or on/off".into()),
    }
}

/// `MULTIRAIL_SHM_CMA`: `on`/`auto` (64 KiB), `off`, or the
/// smallest payload to lend (`16K`).
/// The smallest payload an `ofi:` rail lends by default (MULTIRAIL_OFI_RMA).
pub const OFI_RMA_MIN: usize = 64 << 10;

/// Whether an `ofi:` rail lends large payloads for the peer to read with
/// `fi_read` (MULTIRAIL_OFI_RMA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OfiRma {
    /// Payloads of [`OFI_RMA_MIN`] bytes and more, except through
    /// providers layered on sockets (`tcp`, `udp`): there a read request
    /// waits behind the bulk data going the other way on the same
    /// connection, and bidirectional traffic lost 27-33 % (two rails) and
    /// 42 % (one rail) on the 2 Gbit testbed (docs/benchmarks.md).
    Auto,
    /// Never; endpoints are opened without RMA.
    Off,
    /// Payloads of at least this many bytes, on every provider with RMA.
    From(usize),
}

/// Whether an `ofi:` rail through `provider` (as written in the rail spec)
/// that lends `lend` sleeps by the side channel's doorbell
/// ([`Config::ofi_doorbell`]): through `tcp` with nothing lent, where a CQ
/// wait fd costs every completion a signal through nested epoll sets
/// (without it: 8 B latency 0.84 x, message rate 1.02-1.14 x, bibw 0.96 x,
/// docs/benchmarks.md 2026-11-29). A rank that lends must wake when the peer reads from it,
/// which a doorbell rung by the peer's sends would not tell.
#[cfg_attr(not(feature = "ofi"), allow(dead_code))]
pub fn ofi_doorbell(enabled: bool, provider: &str, lend: Option<usize>) -> bool {
    enabled && lend.is_none() && provider.starts_with("tcp")
}

impl OfiRma {
    /// The smallest payload lent through `provider` (as written in the
    /// rail spec: `tcp`, `shm`, `verbs`...); `None`: none.
    pub fn lend_min(self, provider: &str) -> Option<usize> {
        match self {
            OfiRma::Off => None,
            OfiRma::From(n) => Some(n),
            OfiRma::Auto => {
                let sockets = ["tcp", "udp", "sockets"].iter().any(|p| provider.starts_with(p));
                (!sockets).then_some(OFI_RMA_MIN)
            }
        }
    }

    fn parse(v: &str) -> Result<OfiRma, String> {
        if v.trim().eq_ignore_ascii_case("auto") {
            return Ok(OfiRma::Auto);
        }
        match parse_lend(v, OFI_RMA_MIN) {
            Ok(Some(n)) => Ok(OfiRma::From(n)),
            Ok(None) => Ok(OfiRma::Off),
            Err(_) => Err("expected auto, on, off, or the smallest payload to lend (a size such as 64K)".into()),
        }
    }
}

fn parse_cma(v: &str) -> Result<Option<usize>, String> {
    parse_lend(v, multirail_transport::shm::cma::DEFAULT_MIN)
}

/// `auto`/`on` (= `default`), `off`, or the smallest payload lent.
fn parse_lend(v: &str, default: usize) -> Result<Option<usize>, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "auto" | "on" | "yes" | "true" | "1" => Ok(Some(default)),
        "off" | "no" | "false" | "0" => Ok(None),
        _ => match parse_size(v) {
            Ok(n) if n > 0 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
            _ => Err("expected auto, off, or the smallest payload to copy once (a size such as 64K)".into()),
        },
    }
}

/// Reads an environment variable, treating empty as unset.
pub(crate) fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn bad(name: &str, value: &str, why: impl std::fmt::Display) -> Error {
    Error::Config(format!("{name}={value}: {why}"))
}

fn env_size(name: &str) -> Result<Option<u64>, Error> {
    env(name).map(|v| parse_size(&v).map_err(|e| bad(name, &v, e))).transpose()
}

/// `30`, `30s` or `500ms`: a duration of at least 1 ms.
fn parse_seconds(v: &str) -> Result<Duration, &'static str> {
    let t = v.trim();
    let d = if let Some(ms) = t.strip_suffix("ms") {
        ms.trim().parse::<u64>().map(Duration::from_millis).ok()
    } else {
        t.strip_suffix('s').unwrap_or(t).trim().parse::<u64>().map(Duration::from_secs).ok()
    };
    d.filter(|d| !d.is_zero()).ok_or("expected seconds (60, 60s) or milliseconds (500ms), at least 1 ms")
}

fn env_ms(name: &str) -> Result<Option<Duration>, Error> {
    env(name)
        .map(|v| v.trim().parse::<u64>().map(Duration::from_millis).map_err(|_| bad(name, &v, "expected milliseconds")))
        .transpose()
}

fn env_us(name: &str) -> Result<Option<Duration>, Error> {
    env(name)
        .map(|v| v.trim().parse::<u64>().map(Duration::from_micros).map_err(|_| bad(name, &v, "expected microseconds")))
        .transpose()
}

impl Config {
    /// True if same-host pairs get the automatic `shm` rail: the mode is
    /// `auto` and the rail list does not name `shm` itself (then that list
    /// is used to every peer, as given).
    pub fn auto_shm(&self) -> bool {
        self.shm == crate::ShmMode::Auto && !self.rails.iter().any(RailSpec::is_shm)
    }

    /// Defaults overridden by the `MULTIRAIL_*` environment variables.
    pub fn from_env() -> Result<Config, Error> {
        let mut c = Config::default();
        c.apply_env()?;
        Ok(c)
    }

    /// Overrides fields from the `MULTIRAIL_*` environment variables and
    /// checks the result.
    pub fn apply_env(&mut self) -> Result<(), Error> {
        self.read_env()?;
        self.validate()
    }

    /// Overrides fields from the `MULTIRAIL_*` environment variables,
    /// checking each value on its own (quoted as typed) but not their
    /// combination: a launcher applies its flags on top, then calls
    /// [`Config::validate`].
    pub fn read_env(&mut self) -> Result<(), Error> {
        if let Some(v) = env("MULTIRAIL_RAILS") {
            self.rails = RailSpec::parse_list(&v).map_err(|e| bad("MULTIRAIL_RAILS", &v, e))?;
        }
        if let Some(v) = env("MULTIRAIL_PROGRESS") {
            self.progress = v.parse().map_err(|e| bad("MULTIRAIL_PROGRESS", &v, e))?;
        }
        if let Some(v) = env("MULTIRAIL_SPIN_US") {
            let us: u64 = v.trim().parse().map_err(|_| bad("MULTIRAIL_SPIN_US", &v, "expected microseconds"))?;
            self.spin = Duration::from_micros(us);
            self.spin_auto = false;
        }
        if let Some(v) = env("MULTIRAIL_COALESCE") {
            self.coalesce = v
                .trim()
                .parse()
                .map_err(|_| bad("MULTIRAIL_COALESCE", &v, "expected a number of messages (0: off)"))?;
        }
        if let Some(v) = env("MULTIRAIL_POLICY") {
            self.proto.policy = v.parse::<PolicyTable>().map_err(|e| bad("MULTIRAIL_POLICY", &v, e))?;
        }
        if let Some(v) = env_size("MULTIRAIL_EAGER_LIMIT")? {
            self.proto.eager_limit = v;
        }
        if let Some(v) = env_size("MULTIRAIL_UNEXPECTED_LIMIT")? {
            self.proto.unexpected_limit = v;
        }
        if let Some(v) = env("MULTIRAIL_CHUNK") {
            self.proto.chunk = self.parse_chunk(&v).map_err(|e| bad("MULTIRAIL_CHUNK", &v, e))?;
        }
        if let Some(v) = env_size("MULTIRAIL_RAIL_WINDOW")? {
            self.proto.rail_window = v;
        }
        if let Some(v) = env_size("MULTIRAIL_RAIL_WINDOW_MIN")? {
            self.proto.rail_window_min = v;
        }
        if let Some(v) = env_size("MULTIRAIL_ACK_BYTES")? {
            self.proto.ack_bytes = v;
        }
        if let Some(d) = env_us("MULTIRAIL_RAIL_WINDOW_US")? {
            self.proto.rail_window_time = d;
        }
        if let Some(d) = env_us("MULTIRAIL_SPREAD_WINDOW_US")? {
            self.proto.spread_window_time = d;
        }
        if let Some(v) = env_size("MULTIRAIL_SPREAD_WINDOW_MIN")? {
            self.proto.spread_window_min = v;
        }
        if let Some(v) = env_size("MULTIRAIL_SPREAD_SPLIT_MIN")? {
            self.proto.spread_split_min = v;
        }
        if let Some(v) = env("MULTIRAIL_ACK_REQUEST") {
            self.proto.ack_request_div =
                v.trim().parse().map_err(|_| bad("MULTIRAIL_ACK_REQUEST", &v, "expected a whole number (0 = off)"))?;
        }
        if let Some(v) = env_size("MULTIRAIL_NOTSENT_LOWAT")? {
            self.socket.notsent_lowat = (v > 0).then_some(v.min(u32::MAX as u64) as u32);
        }
        if let Some(v) = env_size("MULTIRAIL_SOCKBUF")? {
            self.socket.buffer = Some(v as usize);
        }
        if env("MULTIRAIL_HEARTBEAT_MS").is_some() {
            return Err(Error::Config(
                "MULTIRAIL_HEARTBEAT_MS is gone: idle rails send nothing now. Rails are probed when they owe an \
                 answer (MULTIRAIL_PROBE_MS), routed around after a retransmission timeout (MULTIRAIL_RTO_MIN_MS), \
                 and a peer silent for MULTIRAIL_PEER_TIMEOUT_MS is declared dead"
                    .into(),
            ));
        }
        if let Some(d) = env_ms("MULTIRAIL_RTO_MIN_MS")? {
            self.proto.rto_min = d;
        }
        if let Some(d) = env_ms("MULTIRAIL_PROBE_MS")? {
            self.proto.probe_interval = d;
        }
        if let Some(d) = env_ms("MULTIRAIL_PEER_TIMEOUT_MS")? {
            self.proto.peer_timeout = d;
        }
        if let Some(d) = env_ms("MULTIRAIL_REPLACE_AFTER_MS")? {
            self.proto.replace_after = d;
        }
        if let Some(v) = env("MULTIRAIL_SETUP_TIMEOUT") {
            self.setup_timeout = parse_seconds(&v).map_err(|e| bad("MULTIRAIL_SETUP_TIMEOUT", &v, e))?;
        }
        if let Some(d) = env_ms("MULTIRAIL_CONNECT_TIMEOUT_MS")? {
            self.socket.connect_timeout = d;
        }
        if let Some(v) = env("MULTIRAIL_CONNECT") {
            self.proto.eager_connect = match v.trim().to_ascii_lowercase().as_str() {
                "eager" | "mesh" => true,
                "lazy" | "on-demand" | "ondemand" => false,
                _ => {
                    return Err(bad(
                        "MULTIRAIL_CONNECT",
                        &v,
                        "choose lazy (on first use) or eager (every rail at start)",
                    ));
                }
            };
        }
        if let Some(v) = env("MULTIRAIL_CHECKSUM") {
            self.proto.checksum = parse_switch(&v).map_err(|e| bad("MULTIRAIL_CHECKSUM", &v, e))?;
        }
        if let Some(v) = env("MULTIRAIL_DIRECT") {
            self.proto.direct_eager = parse_switch(&v).map_err(|e| bad("MULTIRAIL_DIRECT", &v, e))?;
        }
        if let Some(v) = env("MULTIRAIL_KEY") {
            self.key = Some(v.into_bytes());
        }
        if let Some(v) = env("MULTIRAIL_JOB") {
            self.job_id = parse_job(&v).map_err(|e| bad("MULTIRAIL_JOB", &v, e))?;
        }
        if let Some(v) = env_size("MULTIRAIL_SHM_RING")? {
            self.shm_ring = usize::try_from(v).unwrap_or(usize::MAX);
        }
        if let Some(v) = env_size("MULTIRAIL_OFI_SEND")? {
            if !(9..=64 << 10).contains(&v) {
                let why = "give a size from 9 bytes (the 8-byte header and 1 byte of data) to 64K";
                return Err(bad("MULTIRAIL_OFI_SEND", &v.to_string(), why));
            }
            self.ofi_send = Some(v as usize);
        }
        if let Some(v) = env("MULTIRAIL_OFI_RMA") {
            self.ofi_rma = OfiRma::parse(&v).map_err(|e| bad("MULTIRAIL_OFI_RMA", &v, e))?;
        }
        if let Some(v) = env("MULTIRAIL_OFI_WAIT") {
            self.ofi_doorbell = match v.trim().to_ascii_lowercase().as_str() {
                "auto" => true,
                "fd" => false,
                _ => return Err(bad("MULTIRAIL_OFI_WAIT", &v, "expected auto or fd")),
            };
        }
        if let Some(v) = env("MULTIRAIL_OFI_CONNECT") {
            self.ofi_connect = match v.trim().to_ascii_lowercase().as_str() {
                "auto" => None,
                "setup" => Some(true),
                "first" => Some(false),
                _ => return Err(bad("MULTIRAIL_OFI_CONNECT", &v, "expected auto, setup or first")),
            };
        }
        if let Some(v) = env("MULTIRAIL_SHM_CMA") {
            self.shm_cma = parse_cma(&v).map_err(|e| bad("MULTIRAIL_SHM_CMA", &v, e))?;
        }
        if let Some(v) = env("MULTIRAIL_SHM") {
            self.shm = v.parse().map_err(|e| bad("MULTIRAIL_SHM", &v, e))?;
        }
        if let Some(v) = env("MULTIRAIL_FAULTS") {
            self.faults = parse_faults(&v).map_err(|e| bad("MULTIRAIL_FAULTS", &v, e))?;
        }
        Ok(())
    }

    /// Parses a chunk size (MULTIRAIL_CHUNK, `--chunk`): from 1 byte to
    /// the largest frame. The error says why, without naming the setting.
    pub fn parse_chunk(&self, text: &str) -> Result<u64, String> {
        let v = parse_size(text)?;
        let max = self.proto.limits.max_frame as u64;
        match v {
            0 => Err("must be at least 1 byte".into()),
            v if v > max => Err(format!("exceeds the largest frame ({})", format_size(max))),
            v => Ok(v),
        }
    }

    /// Checks the combination of settings.
    pub fn validate(&self) -> Result<(), Error> {
        let p = &self.proto;
        if self.rails.is_empty() {
            return Err(Error::Config("no rails configured".into()));
        }
        if p.chunk == 0 {
            return Err(Error::Config("MULTIRAIL_CHUNK must be at least 1 byte".into()));
        }
        if !cfg!(feature = "ofi")
            && let Some(r) = self.rails.iter().find(|r| matches!(r.local, multirail_transport::spec::Local::Ofi { .. }))
        {
            return Err(Error::Config(format!(
                "rail '{r}': this multirail was built without libfabric support; rebuild with \
                     `cargo build --release --features ofi` (needs libfabric-dev)"
            )));
        }
        if !self.shm_ring.is_power_of_two() || !(64 << 10..=1 << 30).contains(&self.shm_ring) {
            return Err(Error::Config(format!(
                "MULTIRAIL_SHM_RING={}: give a power of two from 64K to 1G",
                self.shm_ring
            )));
        }
        if p.chunk > p.limits.max_frame as u64 {
            return Err(Error::Config(format!(
                "MULTIRAIL_CHUNK={} exceeds the largest frame ({} bytes)",
                p.chunk, p.limits.max_frame
            )));
        }
        if p.eager_limit > p.unexpected_limit {
            return Err(Error::Config(format!(
                "MULTIRAIL_EAGER_LIMIT ({}) is above MULTIRAIL_UNEXPECTED_LIMIT ({}): {EAGER_ABOVE_UNEXPECTED}",
                format_size(p.eager_limit),
                format_size(p.unexpected_limit)
            )));
        }
        if p.rail_window < p.chunk {
            return Err(Error::Config("MULTIRAIL_RAIL_WINDOW must be at least MULTIRAIL_CHUNK".into()));
        }
        if p.rto_min.is_zero() || p.probe_interval.is_zero() || self.socket.connect_timeout.is_zero() {
            return Err(Error::Config(
                "MULTIRAIL_RTO_MIN_MS, MULTIRAIL_PROBE_MS and MULTIRAIL_CONNECT_TIMEOUT_MS must be at least 1 ms"
                    .into(),
            ));
        }
        if p.peer_timeout < p.probe_interval * 4 {
            return Err(Error::Config(format!(
                "MULTIRAIL_PEER_TIMEOUT_MS ({} ms) must be at least 4 x MULTIRAIL_PROBE_MS ({} ms): \
                 a live peer must have time to answer probes",
                p.peer_timeout.as_millis(),
                p.probe_interval.as_millis()
            )));
        }
        Ok(())
    }
}

/// Fault injection per rail, for testing and demonstrations:
/// `RAIL:KEY=VALUE,...;RAIL:...` with keys `drop` and `corrupt`
/// (probabilities per data frame), `delay` (e.g. `2ms`), `rate` (e.g.
/// `500mbit`), `kill_after` (bytes, e.g. `10M`) and `seed`.
/// Example: `1:rate=1gbit;0:corrupt=0.001,seed=3`.
pub fn parse_faults(s: &str) -> Result<Vec<Option<FaultConfig>>, String> {
    let mut out: Vec<Option<FaultConfig>> = Vec::new();
    for item in s.split(';').map(str::trim).filter(|x| !x.is_empty()) {
        let (rail, kvs) = item.split_once(':').ok_or_else(|| format!("'{item}': expected RAIL:KEY=VALUE,..."))?;
        let rail: usize = rail.trim().parse().map_err(|_| format!("'{rail}' is not a rail index"))?;
        let mut f = FaultConfig::default();
        for kv in kvs.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| format!("'{kv}': expected KEY=VALUE"))?;
            let prob = |v: &str| -> Result<f64, String> {
                v.parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(|| format!("{k}={v}: a probability between 0 and 1"))
            };
            match k.trim() {
                "drop" => f.drop = prob(v)?,
                "corrupt" => f.corrupt = prob(v)?,
                "delay" => f.delay = parse_ms(v)?,
                "rate" => f.rate = Some(multirail_transport::spec::parse_rate(v)?),
                "kill_after" => f.kill_after_bytes = Some(parse_size(v)?),
                "seed" => f.seed = v.parse().map_err(|_| format!("seed={v}: not a number"))?,
                other => return Err(format!("unknown fault '{other}' (drop, corrupt, delay, rate, kill_after, seed)")),
            }
        }
        if out.len() <= rail {
            out.resize(rail + 1, None);
        }
        out[rail] = Some(f);
    }
    Ok(out)
}

fn parse_ms(v: &str) -> Result<Duration, String> {
    let t = v.trim();
    let (n, scale) = match t.strip_suffix("ms") {
        Some(n) => (n, 1e-3),
        None => (t.strip_suffix("us").ok_or_else(|| format!("'{v}': give ms or us, e.g. 2ms"))?, 1e-6),
    };
    let x: f64 = n.trim().parse().map_err(|_| format!("'{v}' is not a duration"))?;
    if !(x.is_finite() && x >= 0.0) {
        return Err(format!("'{v}': out of range"));
    }
    Ok(Duration::from_secs_f64(x * scale))
}

/// A job id: decimal, `0x` hex, or any other string (hashed).
pub fn parse_job(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if let Some(h) = t.strip_prefix("0x") {
        return u64::from_str_radix(h, 16).map_err(|e| e.to_string());
    }
    if let Ok(n) = t.parse() {
        return Ok(n);
    }
    // FNV-1a: stable across machines and versions.
    Ok(t.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3)))
}

#[cfg(test)]
mod tests {

    #[test]
    fn single_copy_threshold_parses() {
        assert_eq!(parse_cma("auto"), Ok(Some(64 << 10)));
        assert_eq!(parse_cma("OFF"), Ok(None));
        assert_eq!(parse_cma("16K"), Ok(Some(16 << 10)));
        assert!(parse_cma("0K").is_err() && parse_cma("fast").unwrap_err().contains("auto, off"));
        assert_eq!(OfiRma::parse("Auto"), Ok(OfiRma::Auto));
        assert_eq!(OfiRma::parse("on"), Ok(OfiRma::From(OFI_RMA_MIN)));
        assert_eq!(OfiRma::parse("off"), Ok(OfiRma::Off));
        assert_eq!(OfiRma::parse("1M"), Ok(OfiRma::From(1 << 20)));
        assert!(OfiRma::parse("fast").unwrap_err().contains("auto, on, off"));
        assert_eq!(OfiRma::Auto.lend_min("tcp"), None, "not through sockets by default");
        assert_eq!(OfiRma::Auto.lend_min("shm"), Some(OFI_RMA_MIN));
        assert_eq!(OfiRma::Auto.lend_min("verbs"), Some(OFI_RMA_MIN));
        assert_eq!(OfiRma::From(4096).lend_min("tcp"), Some(4096));
        assert_eq!(OfiRma::Off.lend_min("shm"), None);
    }

    #[test]
    fn ofi_rails_sleep_by_the_doorbell_through_tcp_when_nothing_is_lent() {
        assert!(ofi_doorbell(true, "tcp", None));
        assert!(!ofi_doorbell(true, "tcp", Some(OFI_RMA_MIN)), "a lender must wake for the peer's reads");
        assert!(!ofi_doorbell(true, "shm", None), "shm keeps its polling");
        assert!(!ofi_doorbell(true, "verbs", None));
        assert!(!ofi_doorbell(false, "tcp", None), "MULTIRAIL_OFI_WAIT=fd");
        assert!(Config::default().ofi_doorbell);
    }

    #[test]
    fn setup_timeout_in_seconds_or_milliseconds() {
        assert_eq!(parse_seconds("60"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_seconds(" 5s "), Ok(Duration::from_secs(5)));
        assert_eq!(parse_seconds("500ms"), Ok(Duration::from_millis(500)));
        for bad in ["", "0", "0ms", "abc", "-1", "1.5s", "5m"] {
            assert!(parse_seconds(bad).is_err(), "{bad}");
        }
    }

    use super::*;

    #[test]
    fn defaults_are_valid() {
        Config::default().validate().unwrap();
        assert_eq!(Config::default().rails.len(), 2);
    }

    #[test]
    fn progress_parse() {
        assert_eq!("threaded".parse::<Progress>(), Ok(Progress::Threaded));
        assert_eq!("EPOLL".parse::<Progress>(), Ok(Progress::Polled));
        assert!("fast".parse::<Progress>().is_err());
    }

    #[test]
    fn job_ids() {
        assert_eq!(parse_job("42"), Ok(42));
        assert_eq!(parse_job("0xff"), Ok(255));
        assert_eq!(parse_job("slurm-123"), parse_job("slurm-123"));
        assert_ne!(parse_job("a"), parse_job("b"));
    }

    #[test]
    fn faults() {
        let f = parse_faults("1:rate=1gbit,delay=2ms;0:corrupt=0.5,seed=3,kill_after=1M").unwrap();
        assert_eq!(f.len(), 2);
        let (f0, f1) = (f[0].as_ref().unwrap(), f[1].as_ref().unwrap());
        assert_eq!((f0.corrupt, f0.seed, f0.kill_after_bytes), (0.5, 3, Some(1 << 20)));
        assert_eq!((f1.rate, f1.delay), (Some(125_000_000), Duration::from_millis(2)));
        assert!(parse_faults("1:corrupt=2").is_err());
        assert!(parse_faults("x:drop=0.1").is_err());
        assert!(parse_faults("1:melt=1").unwrap_err().contains("unknown fault"));
        assert!(parse_faults("1:delay=5").is_err());
    }

    #[test]
    fn liveness_knobs_are_checked() {
        let mut c = Config::default();
        c.proto.peer_timeout = Duration::from_millis(100);
        assert!(c.validate().unwrap_err().to_string().contains("PEER_TIMEOUT"));
        let mut c = Config::default();
        c.proto.rto_min = Duration::ZERO;
        assert!(c.validate().is_err());
    }

    #[test]
    fn switches_are_strict() {
        for on in ["1", "TRUE", "Yes", "on"] {
            assert_eq!(parse_switch(on), Ok(true), "{on}");
        }
        for off in ["0", "false", "NO", "Off"] {
            assert_eq!(parse_switch(off), Ok(false), "{off}");
        }
        for bad in ["2", "enabled", "", "y"] {
            assert!(parse_switch(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn chunk_is_checked_where_it_is_parsed() {
        let c = Config::default();
        assert_eq!(c.parse_chunk("64K"), Ok(64 << 10));
        assert!(c.parse_chunk("0").unwrap_err().contains("at least 1 byte"));
        assert!(c.parse_chunk("1T").unwrap_err().contains("largest frame"));
    }

    #[test]
    fn eager_limit_above_unexpected_limit_is_refused() {
        let mut c = Config::default();
        c.proto.eager_limit = 1 << 40;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("MULTIRAIL_EAGER_LIMIT (1T)") && e.contains("MULTIRAIL_UNEXPECTED_LIMIT (8M)"), "{e}");
    }

    #[test]
    fn invalid_combinations() {
        let mut c = Config::default();
        c.proto.chunk = 0;
        assert!(c.validate().is_err());
        let mut c = Config::default();
        c.proto.rail_window = 1;
        assert!(c.validate().is_err());
    }
}
