//! Command-line definitions. Flags are parsed here and validated into
//! plans elsewhere (`bench::Plan`, `launch::Mode`). This file depends on
//! clap and multirail's defaults only: `tests/docs.rs` includes it to parse
//! the README's examples without running them.

use std::ffi::OsString;

use crate::placement::{Layout, Mapping};
use clap::{Args, Parser, Subcommand, ValueEnum};
use multirail_proto::units::format_size;

const ABOUT: &str =
    "Several network links as one fast, ordered, reliable message channel — and the tools to measure it.";

const LONG_ABOUT: &str = "\
multirail makes several network links (\"rails\": NICs, ports, TCP connections over
different interfaces) act as one ordered, reliable message channel between
processes, and measures interconnects the way HPC engineers do.

Start here:
  multirail info                       which rails this machine has
  multirail bench latency              OSU-style latency over two loopback rails
  multirail bench bw --compare policy='*:single' policy='*:adaptive'   one rail vs both
  multirail bench bw --sizes 1K:4M --plot bw.svg    the same numbers as a plot
  multirail model --rails 2 --link 2GB/s --nic 2GB/s --host 4GB/s   predicted bandwidth
  sudo multirail testbed up --rate 1gbit,3gbit    an emulated dual-rail cluster
  sudo multirail bench bw --testbed               ... measured on it

Settings can also come from MULTIRAIL_* environment variables (see the README).";

const EXIT_STATUS: &str = "\
Exit status:
  0  success
  1  bench: a payload check failed (--validate; the table shows Fail);
     testbed status: no testbed with that prefix
  2  any other error: a bad flag, value or MULTIRAIL_* variable, a rank
     that failed or was killed by a signal, a network or setup failure
  run and testbed exec end with the exit status of the first rank (or the
  command) that failed; one killed by a signal gives 2.";

/// The arguments as clap should see them: every `--compare` value is
/// attached (`--compare=policy=*:single`), so that the first word after
/// the configurations without a `=` (`bw`) is not taken as one more.
/// Everything after `--` is left alone (it belongs to another program).
pub fn split_compare(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut in_compare = false;
    let mut after_dashes = false;
    for a in args {
        let text = a.to_str().unwrap_or("");
        if after_dashes {
            out.push(a);
            continue;
        }
        if text == "--" {
            after_dashes = true;
            in_compare = false;
        } else if text == "--compare" {
            in_compare = true;
            continue;
        } else if in_compare && text.contains('=') && !text.starts_with('-') {
            out.push(OsString::from(format!("--compare={text}")));
            continue;
        } else {
            in_compare = text.starts_with("--compare=");
        }
        out.push(a);
    }
    if in_compare && !out.last().is_some_and(|a| a.to_str().is_some_and(|t| t.starts_with("--compare="))) {
        // `--compare` with no configuration after it: clap says so.
        out.push("--compare".into());
    }
    out
}

/// Parses this process's arguments (exits with clap's message and status 2
/// on a usage error).
pub fn parse() -> Cli {
    Cli::parse_from(split_compare(std::env::args_os()))
}

/// The log levels `--log` and MULTIRAIL_LOG take.
const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// `--log` / MULTIRAIL_LOG: a level, or comma-separated `TARGET=LEVEL`
/// directives (`warn,multirail=debug`). Anything else is refused rather
/// than read as a target name that matches nothing.
fn log_filter(s: &str) -> Result<String, String> {
    let directives: Vec<&str> = s.split(',').map(str::trim).filter(|d| !d.is_empty()).collect();
    let why = || {
        format!(
            "choose a level ({}) or per-module levels like warn,multirail=debug (also from MULTIRAIL_LOG)",
            LOG_LEVELS.join(", ")
        )
    };
    if directives.is_empty() {
        return Err(format!("no log level: {}", why()));
    }
    for d in directives {
        let (target, level) = d.rsplit_once('=').unwrap_or(("x", d));
        let target_ok = !target.is_empty() && target.chars().all(|c| c.is_ascii_alphanumeric() || "_:-".contains(c));
        if !target_ok || !LOG_LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
            return Err(format!("'{d}' is not a log level: {}", why()));
        }
    }
    Ok(s.to_string())
}

/// A `--compare` configuration must hold an assignment.
fn compare_config(s: &str) -> Result<String, String> {
    match s.contains('=') {
        true => Ok(s.to_string()),
        false => Err(format!("'{s}' is not a configuration: expected KEY=VALUE[;KEY=VALUE], e.g. policy=*:single")),
    }
}

/// Help of a multirail setting: what it is, its default and variable.
fn setting_help(what: &str, default: impl std::fmt::Display, var: &str) -> String {
    format!("{what} [default: {default}] [env: {var}]")
}

fn rails_help() -> String {
    setting_help(
        "Rails to other hosts, e.g. tcp:eth0,tcp:eth1, ofi:tcp:eth0 (libfabric; a build with --features ofi); \
         ranks of one host use shared memory (unless MULTIRAIL_SHM=off, or the list names shm); under --testbed, \
         interfaces are each host's own: tcp:rail0,tcp:rail1",
        multirail::DEFAULT_RAILS,
        "MULTIRAIL_RAILS",
    )
}

fn policy_help() -> String {
    setting_help(
        "Scheduling policy table by message size; policies: single, spread, round-robin, stripe, weighted, adaptive",
        multirail::Config::default().proto.policy,
        "MULTIRAIL_POLICY",
    )
}

fn progress_help() -> String {
    setting_help("Progress engine: polled or threaded", multirail::Config::default().progress, "MULTIRAIL_PROGRESS")
}

fn eager_limit_help() -> String {
    let d = multirail::Config::default().proto;
    setting_help(
        &format!(
            "Largest eager message, e.g. 64K; at most the unexpected limit ({}, MULTIRAIL_UNEXPECTED_LIMIT)",
            format_size(d.unexpected_limit)
        ),
        format_size(d.eager_limit),
        "MULTIRAIL_EAGER_LIMIT",
    )
}

fn chunk_help() -> String {
    setting_help(
        "Largest chunk per rail and frame, e.g. 64K",
        format_size(multirail::Config::default().proto.chunk),
        "MULTIRAIL_CHUNK",
    )
}

#[derive(Debug, Parser)]
#[command(
    name = "multirail",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = EXIT_STATUS,
    args_override_self = true
)]
pub struct Cli {
    /// Log level: off, error, warn, info, debug or trace, or per module
    /// (warn,multirail=debug).
    #[arg(long, global = true, env = "MULTIRAIL_LOG", default_value = "warn", value_parser = log_filter)]
    pub log: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the network interfaces and addresses usable as rails.
    Info {
        /// Print JSON Lines instead of a table: one object per interface,
        /// with the rail spec to use, then one for shm.
        #[arg(long)]
        json: bool,
    },
    /// Run an OSU-style benchmark over multirail.
    #[command(long_about = BENCH_ABOUT)]
    Bench(Box<BenchArgs>),
    /// Build, inspect and remove an emulated multi-rail cluster (network
    /// namespaces joined by shaped links; needs root).
    Testbed {
        #[command(subcommand)]
        command: TestbedCommand,
    },
    /// Launch N ranks of any program with the environment they need to meet
    /// (MULTIRAIL_RANK, MULTIRAIL_SIZE, MULTIRAIL_ROOT, MULTIRAIL_KEY, and
    /// MULTIRAIL_RAILS inside a testbed).
    Run(RunArgs),
    /// Predict multi-rail bandwidth from link, NIC-bus and host-bus rates
    /// (the NPC'09 uDAPL study's model).
    #[command(long_about = MODEL_ABOUT)]
    Model(ModelArgs),
    /// Re-run the seed studies (dual-rail, udapl, fdr-edr, cbr) and write
    /// an HTML page of figures, tables and readings.
    #[command(long_about = REPORT_ABOUT)]
    Report(ReportArgs),
    /// Print a shell completion script, e.g.
    /// `multirail completions bash > ~/.local/share/bash-completion/completions/multirail`.
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), made from these definitions:
    /// `multirail man > multirail.1; man ./multirail.1`.
    Man {
        /// A subcommand's page instead (bench, testbed, run, model, info):
        /// `multirail man bench > multirail-bench.1`.
        command: Option<String>,
    },
}

const MODEL_ABOUT: &str = "\
Predict multi-rail bandwidth with the model of Cai, Rendell and Strazdins
(NPC 2009, \"Non-threaded and Threaded Approaches to MultiRail Communication
with uDAPL\"):

  multi-HCA  (N NICs, one port each):  N × min(link, NIC bus, host bus)
  multi-port (one NIC with N ports):   min(N × link, NIC bus, host bus)

Rails of different speeds: --link 1gbit,3gbit (one rate per rail); then
multi-HCA = Σ min(link_i, NIC, host) and multi-port = min(Σ link_i, NIC, host).
A bus left out is no limit.

Rates are decimal (G = 10^9). Bits: 2gbit, 10Gbit/s, 500mbit. Bytes: 4GB/s,
500MB/s, 1.5GB/s (capital B and /s). Ambiguous forms (10Gbps, 10gb/s, 4GB)
are refused. Ki/Mi/Gi (1GiB/s, 8gibit) are binary.

Examples:
  multirail model --rails 2 --link 2GB/s --nic 2GB/s --host 4GB/s   NPC'09's DDR cluster
  multirail model --rails 2 --link 32gbit --nic 4GB/s --json          two QDR ports on one PCIe 2.0 x8 NIC
  multirail model --link 1gbit,3gbit                                  two unequal rails, no bus limit
  multirail bench bw --model                                          measured vs predicted, per size";

#[derive(Debug, Args)]
pub struct ModelArgs {
    /// Number of rails (default: how many --link rates are given).
    #[arg(long, value_name = "N")]
    pub rails: Option<usize>,
    /// Link rate of every rail, or one per rail: 2GB/s, 10gbit, 1gbit,3gbit.
    #[arg(long, value_name = "RATE[,RATE...]", required = true)]
    pub link: String,
    /// The NIC's bus (its PCIe link), e.g. 2GB/s. Default: no limit.
    #[arg(long, value_name = "RATE")]
    pub nic: Option<String>,
    /// The host's bus (the slot each NIC sits in), e.g. 4GB/s. Default: no limit.
    #[arg(long, value_name = "RATE")]
    pub host: Option<String>,
    /// One JSON object: the inputs and multi_hca, multi_port in bytes/s.
    #[arg(long)]
    pub json: bool,
}

const REPORT_ABOUT: &str = "\
Re-run the seed studies on your rails and write them up as one page.

Each study is a set of figures; each line of a figure is one child run of
`multirail bench TEST --json` (the page shows its exact command):

  dual-rail  one faster rail (3500mbit) vs two slower ones (2 x 2gbit) with
             *:single, MVAPICH2-style threshold striping (16K and 8K),
             *:round-robin and the default policy; bw, bibw, latency; where
             the cusp between eager and striping shows (dual-rail QDR vs FDR)
  udapl      --progress threaded vs polled on multi-HCA (each rail its own
             link) and, with --testbed, multi-port (rails sharing one shaped
             bus: testbed up --bus); the NPC'09 model beside each measurement
  fdr-edr    the OSU tables (latency, bw, bibw) of a slower (2 x 1gbit) vs a
             faster (2 x 3gbit) rail set
  cbr        the HotI'09 Communication Balance Ratios (bench cbr); with
             --testbed also mbw_mr of 4 ranks on 2 hosts, block vs cyclic
  peers      multirail on rail0 and on 2 x 2gbit beside Open MPI and UCX
             on rail0, on all rails and (Open MPI) with btl_tcp_links=2 and
             bandwidth hints, and iperf3: bw, bibw, latency, the 2-pair
             rate, and bw on unequal rails (1gbit + 3gbit); meant for
             --testbed --peers (what bench/compare.sh wraps). `all` runs it
             only with --peers

Without --testbed everything runs over loopback TCP rails on this host: rates
cannot be shaped, and the page says so. With --testbed (root) the report
brings up each emulated cluster itself (testbed up --prefix PREFIX), and
takes it down afterwards and on error; after Ctrl-C (or a kill) a watcher
process takes it down within a second or two.

Writes DIR/index.html (self-contained: inline SVG and CSS, no scripts),
DIR/results.json (the plan, every child's command, records and duration,
the machine) after every child, so Ctrl-C keeps what finished, and
DIR/fig-STUDY-N.svg. A child that fails is recorded with its stderr and the
report goes on. --from DIR/results.json renders the page again without
measuring.

Examples:
  multirail report --quick --study fdr-edr --out rpt      seconds, loopback
  multirail report --out rpt                               every study, 1:4M, medians of 3
  sudo multirail report --testbed --study dual-rail --out rpt
  sudo multirail report --testbed --peers --quick --out rpt   with iperf3, UCX, Open MPI
  sudo multirail report --testbed --study peers --peers --out rpt   what bench/compare.sh runs
  multirail report --from rpt/results.json --out rpt       render again";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StudyName {
    DualRail,
    Udapl,
    FdrEdr,
    Cbr,
    Peers,
    All,
}

#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// Which study: dual-rail, udapl, fdr-edr, cbr, peers or all (the
    /// first four, and peers with --peers).
    #[arg(long, value_enum, default_value = "all")]
    pub study: StudyName,
    /// Run on emulated clusters brought up (and down) by the report (root);
    /// else over loopback TCP rails, unshaped.
    #[arg(long)]
    pub testbed: bool,
    /// Name prefix of the testbeds the report brings up (with --testbed).
    #[arg(long, default_value = "rpt")]
    pub prefix: String,
    /// Also measure other tools on the same rails (with --testbed, once per
    /// testbed, drawn in the figures and tables): iperf3, one TCP stream per
    /// rail, all at once (a flat line; --bidir for bibw); UCX ucx_perftest
    /// tag_bw and tag_lat over all rails (UCX_TLS=tcp) per size; Open MPI
    /// bench/mpi/mr_bw (-b for bibw) and mr_pingpong (ob1, tcp BTL over all
    /// rails; built with mpicc from the source tree). The peers study adds
    /// their rail variants. A tool that is missing is skipped with the
    /// reason.
    #[arg(long)]
    pub peers: bool,
    /// Few sizes (8, 64K, 1M), 5 iterations (latency: 100), 1 round: a
    /// smoke run.
    /// Default: sizes 1:4M with OSU's loop counts, median of 3 rounds.
    #[arg(long)]
    pub quick: bool,
    /// Directory of index.html, results.json and the figures (created).
    #[arg(long, value_name = "DIR")]
    pub out: std::path::PathBuf,
    /// Render the page from a recorded results.json; measure nothing.
    #[arg(long, value_name = "FILE")]
    pub from: Option<std::path::PathBuf>,
}

const BENCH_ABOUT: &str = "\
Run an OSU-style benchmark over multirail.

Tests (OSU semantics; MB = 10^6 bytes):
  latency    ping-pong between two ranks; one-way latency = round trip / 2
  bw         rank 0 sends windows of non-blocking messages, rank 1 replies per window
  bibw       both ranks send windows at once; both directions counted
  mbw_mr     N pairs run bw at once (--pairs N); aggregate MB/s and messages/s
  multi_lat  N pairs run latency at once; average latency
  cbr        latency, bw, bibw and mbw_mr intra-node (2 ranks, --rails shm) and
             inter-node (2 testbed hosts with --testbed, else loopback TCP),
             and per size HotI'09's balance ratios intra / inter.
             With --testbed --ranks-per-host 2 --mapping block|cyclic (4 ranks
             on 2 hosts) both sides run in the testbed: intra = ranks sharing
             a host over shm (latency/bw/bibw: ranks 0,1 in host0; mbw_mr: 2
             pairs, one in each host, at once), inter = ranks on two hosts
             (ranks 0,1 in host0,host1; mbw_mr: both pairs across the rails
             at once). The mapping says which of an application's pairs see
             which side: block keeps neighbours (0,1),(2,3) in a host and
             sends OSU's pairs (0,2),(1,3) across; cyclic the other way round
  group      --nodes N ranks form an ordered multicast group; --senders all|one
             send --count messages each (window -W); per node the delivered
             payload rate, the mean over nodes (GB/s = 10^9 B/s, as Derecho's
             bandwidth_test) and the latency from ordered_send to the
             sender's own delivery (median, p99)

How ranks start:
  (default)          --local: the peer processes are started on this machine
  --server [--port]  this process is rank 0 and waits for the client
  --connect H:P      this process is rank 1 and joins the server at H:P
  under mpirun/srun  rank and size from the launcher; ranks meet through PMIx
                     (Open MPI's mpirun) or at MULTIRAIL_ROOT=host:port[,host:port]
  --testbed          rank i runs in host i of the emulated cluster; with
                     --ranks-per-host K --mapping block|cyclic, K ranks share a
                     host (and talk over shared memory)

Examples:
  MULTIRAIL_SHM=off multirail bench latency --sizes 8 --rails tcp:127.0.0.1
  multirail bench latency --sizes 8 --compare env:MULTIRAIL_SHM=auto env:MULTIRAIL_SHM=off
  multirail bench bw --sizes 1K:4M --rail-stats
  multirail bench latency -m 8:1M -i 1000 -x 100 -f    OSU's flags: sizes, loops, full format
  multirail bench bw --sizes 1M,4M --compare policy=single policy=stripe policy=adaptive
  MULTIRAIL_SHM=off multirail bench bw --validate --fail-rail 1@2s:for=1s
  multirail bench latency --sizes 1:1M --plot latency.svg
  multirail bench bw --sizes 4K:4M --compare policy=*:single policy=*:adaptive --plot bw.png
  multirail bench bw --sizes 64K:4M --model                 measured vs the NPC'09 model
  multirail bench bw --model --link 10gbit --nic 2GB/s      ... from given rates
  multirail bench cbr --sizes 8,64K,1M --plot cbr.svg       balance ratios, shm vs loopback
  sudo multirail bench cbr --testbed                        ... shm vs the testbed's rails
  sudo multirail bench cbr --testbed --ranks-per-host 2 --mapping cyclic   4 ranks on 2 hosts
  multirail bench group --nodes 3 --senders all --sizes 10K,1M -W 16 --count 200 --validate
  multirail run -n 3 -- multirail bench group --senders one --unordered   ... under the launcher";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum TestName {
    Latency,
    Bw,
    Bibw,
    MbwMr,
    MultiLat,
    /// The HotI'09 Communication Balance Ratios (latency, bw, bibw, mbw_mr
    /// intra-node / inter-node).
    Cbr,
    /// Ordered multicast in a group of --nodes ranks (Derecho's
    /// bandwidth_test): delivered GB/s per node and send-to-own-delivery
    /// latency.
    Group,
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Which benchmark.
    #[arg(value_enum)]
    pub test: TestName,

    // ----- how ranks start -----
    /// Start the peer ranks on this machine (the default).
    #[arg(long, help_heading = "Ranks", conflicts_with_all = ["server", "connect", "testbed"])]
    pub local: bool,
    /// Be rank 0 of a two-host run and wait for `--connect`.
    #[arg(long, help_heading = "Ranks", conflicts_with_all = ["connect", "testbed"])]
    pub server: bool,
    /// Port for --server.
    #[arg(long, default_value_t = 18515, help_heading = "Ranks")]
    pub port: u16,
    /// Be rank 1 and join the server at HOST:PORT.
    #[arg(long, value_name = "HOST:PORT", help_heading = "Ranks", conflicts_with = "testbed")]
    pub connect: Option<String>,
    /// Run rank i inside host i of the emulated testbed, over its rails.
    #[arg(long, help_heading = "Ranks")]
    pub testbed: bool,
    /// Name prefix of the testbed to use.
    #[arg(long, default_value = "mr", help_heading = "Ranks")]
    pub testbed_prefix: String,
    /// Use only the first N rails of the testbed (e.g. 1 for a single-rail baseline).
    #[arg(long, value_name = "N", help_heading = "Ranks")]
    pub testbed_rails: Option<usize>,
    /// Ranks per testbed host (with --testbed): ranks of one host talk over
    /// shared memory, the others over the testbed's rails.
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..),
          requires = "testbed", help_heading = "Ranks")]
    pub ranks_per_host: u32,
    /// How ranks fill the testbed hosts (with --testbed): block (ranks
    /// 0..K-1 on host0, K..2K-1 on host1, ...; the default) or cyclic (rank
    /// i on host i mod hosts). In `bench cbr` (with --ranks-per-host 2) it
    /// switches to HotI'09's 4-ranks-on-2-hosts variant: see `bench cbr`
    /// in `multirail help bench`.
    #[arg(long, value_enum, requires = "testbed", help_heading = "Ranks")]
    pub mapping: Option<Mapping>,
    /// Pin local ranks to CPUs: `none`, `auto` (rank i on the i-th usable
    /// CPU) or a list `0,1` (at most one CPU per rank; a shorter list is
    /// reused in turn).
    #[arg(long, default_value = "none", help_heading = "Ranks")]
    pub pin: String,

    #[arg(long, help = rails_help(), help_heading = "multirail")]
    pub rails: Option<String>,
    #[arg(long, help = policy_help(), help_heading = "multirail")]
    pub policy: Option<String>,
    #[arg(long, help = progress_help(), help_heading = "multirail")]
    pub progress: Option<String>,
    #[arg(long, help = eager_limit_help(), help_heading = "multirail")]
    pub eager_limit: Option<String>,
    #[arg(long, help = chunk_help(), help_heading = "multirail")]
    pub chunk: Option<String>,
    /// Checksum every payload (CRC32C) [default: off] [env: MULTIRAIL_CHECKSUM=1]
    #[arg(long, help_heading = "multirail")]
    pub checksum: bool,

    // ----- benchmark -----
    /// Message sizes: 8 (only 8) | 1K:4M (doubling) | 8,64K,1M. Default: OSU's.
    #[arg(long, help_heading = "Benchmark", conflicts_with = "message_size")]
    pub sizes: Option<String>,
    /// OSU's -m [MIN:]MAX: sizes doubling from MIN to MAX, e.g. -m 8 (up
    /// to 8 from OSU's smallest: 0 for latency tests, else 1), -m 8:1M,
    /// -m 1K: (up to OSU's largest, 4M).
    #[arg(short = 'm', long, value_name = "[MIN:]MAX", help_heading = "Benchmark")]
    pub message_size: Option<String>,
    /// Timed iterations per size (OSU's -i; default: OSU's, by size).
    #[arg(short = 'i', long, help_heading = "Benchmark")]
    pub iterations: Option<u64>,
    /// Untimed warm-up iterations per size (OSU's -x; default: OSU's).
    #[arg(short = 'x', long, help_heading = "Benchmark")]
    pub warmup: Option<u64>,
    /// Messages per window (bw, bibw, mbw_mr; OSU's -W).
    #[arg(short = 'W', long, default_value_t = 64, help_heading = "Benchmark")]
    pub window: u32,
    /// Rank pairs (mbw_mr, multi_lat).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..), help_heading = "Benchmark")]
    pub pairs: u32,
    /// The receiver checks every byte of every message; a mismatch exits non-zero.
    /// (group: also every member's delivery order.)
    #[arg(long, help_heading = "Benchmark")]
    pub validate: bool,
    /// (group) Ranks in the group, started locally or in testbed hosts
    /// 0..N-1 (under a launcher: the job's size).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..), help_heading = "Benchmark")]
    pub nodes: u32,
    /// (group) Who sends: all, one (rank 0), or a list of ranks (0,2).
    #[arg(long, default_value = "all", help_heading = "Benchmark")]
    pub senders: String,
    /// (group) Messages per sender and size (default: about 200 MB per
    /// sender, 100 to 10000 messages).
    #[arg(long, help_heading = "Benchmark")]
    pub count: Option<u64>,
    /// (group) Per-sender FIFO only, no order across senders.
    #[arg(long, help_heading = "Benchmark")]
    pub unordered: bool,
    /// (group) Light load: each sender hands the group its next message
    /// only once its previous one was delivered back to it (one message of
    /// its own in the group at a time), so the latency is the group's
    /// own, without waiting in the window or the queue. Compare it with
    /// twice the point-to-point `bench latency` (a round trip).
    #[arg(long, help_heading = "Benchmark")]
    pub light: bool,
    /// (group) Payloads of at least SIZE travel along the chain of members
    /// (sender -> next rank -> ... round to the rank before the sender), so
    /// the sender's links carry each once; smaller ones go from the sender
    /// to every member. `off`: never relay. Default 64K.
    #[arg(long, value_name = "SIZE|off", help_heading = "Benchmark")]
    pub relay_min: Option<String>,
    /// (group) Payloads longer than SIZE travel in group chunks of SIZE,
    /// each passed on along the chain as soon as it arrives (pipelined
    /// instead of store-and-forward); members copy the chunks into one
    /// buffer per message. `off`: whole messages. Default 1M. (Not
    /// `--chunk`, the channel's striping unit.)
    #[arg(long, value_name = "SIZE|off", help_heading = "Benchmark")]
    pub relay_chunk: Option<String>,
    /// (group) A member fails mid-run: RANK@TIME[:silence], e.g. 2@1s or
    /// 0@500ms:silence. Without `:silence` its process ends at TIME
    /// without closing anything (a crash: the kernel closes its
    /// connections); with it, every rail of its testbed host goes down
    /// (`ip link set down`, silent) while it keeps running, and comes back
    /// once it stopped. The others must install one view without it and
    /// deliver everything of the senders left; the row, the validation
    /// and the hashes are theirs. One size; `:silence` needs --testbed.
    #[arg(long, value_name = "RANK@TIME[:silence]", help_heading = "Benchmark")]
    pub fail_member: Option<String>,
    /// Take a rail down during the run: RAIL@TIME[:for=DURATION|forever][:side=host0|host1],
    /// e.g. 1@2s:for=500ms. With --testbed the interface goes down in the
    /// given host (`ip link set`, silent); elsewhere its connections are
    /// killed. Reports the longest stall, the throughput during the outage
    /// and when the rail carried data again.
    #[arg(long, value_name = "RAIL@TIME[:for=D][:side=H]", help_heading = "Benchmark")]
    pub fail_rail: Vec<String>,

    // ----- comparison -----
    /// Compare configurations side by side (medians over rounds, ratio to
    /// the first): e.g. --compare policy=*:single policy=*:adaptive. Keys:
    /// policy, rails, progress, eager-limit, chunk, window, testbed-rails,
    /// and env:NAME=VALUE (an environment variable for the ranks). The
    /// first word without a `=` after them is the test:
    /// `bench --compare policy=*:single policy=*:stripe bw`.
    #[arg(
        long,
        num_args = 1..,
        value_parser = compare_config,
        value_name = "KEY=VALUE[;KEY=VALUE]",
        help_heading = "Comparison"
    )]
    pub compare: Vec<String>,
    /// Rounds per configuration in --compare.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..), help_heading = "Comparison")]
    pub rounds: u32,

    // ----- model -----
    /// (bw) Print beside each size the bandwidth the NPC'09 model predicts
    /// (multi-HCA and multi-port) and measured/predicted. Link rates: each
    /// rail's single-rail bandwidth, measured first by one bw run per rail
    /// at the largest size of --sizes with the same loop counts (needs a
    /// local or --testbed run), unless --link is given. The ranks use the
    /// configured rails, also on one host (no automatic shared memory).
    /// The model is asymptotic: expect ratios well below 1 at small sizes.
    #[arg(long, help_heading = "Model", conflicts_with_all = ["compare", "fail_rail"])]
    pub model: bool,
    /// Link rate for --model instead of measuring it: every rail, or one
    /// per rail (2gbit, 10Gbit/s, 1.25GB/s, 1gbit,3gbit).
    #[arg(long, value_name = "RATE[,RATE...]", help_heading = "Model", requires = "model")]
    pub link: Option<String>,
    /// NIC bus rate for --model (default: no limit), e.g. 2GB/s.
    #[arg(long, value_name = "RATE", help_heading = "Model", requires = "model")]
    pub nic: Option<String>,
    /// Host bus rate for --model (default: no limit), e.g. 4GB/s.
    #[arg(long, value_name = "RATE", help_heading = "Model", requires = "model")]
    pub host: Option<String>,
    /// Internal: the rails' measured single-rail rates in bytes/s, passed by
    /// the launcher to rank 0 after the calibration runs.
    #[arg(long, hide = true)]
    pub model_links: Option<String>,

    // ----- output -----
    /// Also draw the results against message size into FILE.svg or
    /// FILE.png (one line per --compare configuration); written with
    /// --json and --csv too.
    #[arg(long, value_name = "FILE.svg|FILE.png", help_heading = "Output")]
    pub plot: Option<std::path::PathBuf>,
    /// One JSON object per line instead of the OSU table (the last of
    /// --json and --csv wins).
    #[arg(long, help_heading = "Output", overrides_with = "csv")]
    pub json: bool,
    /// CSV instead of the OSU table.
    #[arg(long, help_heading = "Output", overrides_with = "json")]
    pub csv: bool,
    /// Add per-rail bytes and shares as extra columns.
    #[arg(long, help_heading = "Output")]
    pub rail_stats: bool,
    /// OSU's -f (full format), latency tests: min and max latency and
    /// iterations beside the average, then the P50/P90/P99 latencies
    /// (OSU's -z columns).
    #[arg(short = 'f', long, help_heading = "Output")]
    pub full: bool,
    /// No progress bar and no notes on stderr.
    #[arg(long, short, help_heading = "Output")]
    pub quiet: bool,

    // ----- internal -----
    /// Internal: this run is one of several a launcher makes (a --compare
    /// round, a --model calibration); the launcher plots and models.
    #[arg(long, hide = true)]
    pub sub_run: bool,
    /// Internal: use only rail K of the configured (or testbed) rails.
    #[arg(long, hide = true, value_name = "K")]
    pub only_rail: Option<usize>,
}

#[derive(Debug, Subcommand)]
pub enum TestbedCommand {
    /// Create the hosts and rails.
    Up {
        /// Number of hosts (host0 .. hostN-1).
        #[arg(long, default_value_t = 2)]
        hosts: usize,
        /// Number of rails (rail0 .. railR-1 in every host).
        #[arg(long, default_value_t = 2)]
        rails: usize,
        /// Rate of every rail, or one per rail: 2gbit, 1gbit,3gbit or
        /// 250MB/s (bits: kbit, mbit, gbit, kibit...; bytes: MB/s, GB/s,
        /// GiB/s...; the README's "Rates").
        #[arg(long, default_value = "2gbit")]
        rate: String,
        /// The "multi-port" layout: the rails of each host also share one
        /// shaped bus of RATE (one NIC with several ports in one PCIe slot),
        /// on top of each rail's --rate. Without it each rail is its own
        /// link ("multi-HCA"). Same rate syntax as --rate, one value.
        #[arg(long, value_name = "RATE")]
        bus: Option<String>,
        /// Prefix of everything created (namespaces, links).
        #[arg(long, default_value = "mr")]
        prefix: String,
    },
    /// Remove everything the testbed made (safe to repeat; exits 0 when
    /// there was nothing to remove).
    Down {
        /// Prefix of the testbed to remove (as given to `testbed up`).
        #[arg(long, default_value = "mr")]
        prefix: String,
    },
    /// Show hosts, rails, addresses and rates (exits 1 when there is no
    /// testbed with this prefix).
    Status {
        /// Prefix of the testbed to show (as given to `testbed up`).
        #[arg(long, default_value = "mr")]
        prefix: String,
        /// Print the status as one JSON object on one line.
        #[arg(long)]
        json: bool,
    },
    /// Run a command inside a host: multirail testbed exec host0 -- ip addr
    /// (exits with the command's status).
    Exec {
        /// The host: host0, host1, ... (or its number).
        host: String,
        /// Prefix of the testbed (as given to `testbed up`).
        #[arg(long, default_value = "mr")]
        prefix: String,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Number of ranks.
    #[arg(short = 'n', long = "np", default_value_t = 2)]
    pub np: u32,
    /// Run rank i in testbed host i (or as --ranks-per-host and --mapping
    /// say), with MULTIRAIL_RAILS set to its host's rails.
    #[arg(long)]
    pub testbed: bool,
    /// Name prefix of the testbed to use (with --testbed).
    #[arg(long, default_value = "mr")]
    pub testbed_prefix: String,
    /// Ranks per testbed host (with --testbed): ranks of one host talk over
    /// shared memory, the others over the testbed's rails.
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..),
          requires = "testbed")]
    pub ranks_per_host: u32,
    /// How ranks fill the testbed hosts (with --testbed): block (ranks
    /// 0..K-1 on host0, K..2K-1 on host1, ...) or cyclic (rank i on host
    /// i mod hosts).
    #[arg(long, value_enum, default_value = "block", requires = "testbed")]
    pub mapping: Mapping,
    /// Pin ranks to CPUs: `none`, `auto` (rank i on the i-th usable CPU) or a
    /// list `0,1` (at most one CPU per rank; a shorter list is reused in turn).
    #[arg(long, default_value = "none")]
    pub pin: String,
    /// The rails of every rank (sets MULTIRAIL_RAILS for them), e.g.
    /// tcp:eth0,tcp:eth1 or ofi:tcp:eth0,ofi:tcp:eth1. With --testbed,
    /// interfaces are each host's own, resolved by each rank inside its
    /// host (tcp:rail0,tcp:rail1); the default there is the host's rail
    /// addresses.
    #[arg(long, value_name = "SPEC")]
    pub rails: Option<String>,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    pub cmd: Vec<String>,
}

impl BenchArgs {
    /// Where ranks go in a testbed.
    pub fn layout(&self) -> Layout {
        Layout { per_host: self.ranks_per_host, mapping: self.mapping.unwrap_or_default() }
    }
}

impl RunArgs {
    /// Where ranks go in a testbed.
    pub fn layout(&self) -> Layout {
        Layout { per_host: self.ranks_per_host, mapping: self.mapping }
    }
}
