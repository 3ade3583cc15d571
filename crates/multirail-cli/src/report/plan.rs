//! What `multirail report` measures: per study a list of figures, per
//! figure a list of configurations, each the exact `multirail bench ...`
//! command line (and variables) that measures one line of the figure, and
//! the testbed it needs under `--testbed`. [`plan`] is a pure function of
//! the flags, so the commands are tested without running anything.

use serde::{Deserialize, Serialize};

use crate::cli::{ReportArgs, StudyName};

/// The testbed a configuration runs on (`multirail testbed up --prefix P
/// --rails N --rate R [--bus B]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestbedSpec {
    pub rails: usize,
    /// Every rail's rate, as `testbed up --rate` takes it: `2gbit`.
    pub rate: String,
    /// One shaped bus shared by all rails (`testbed up --bus RATE`), the
    /// "multi-port" setup; `None`: each rail its own shaped link.
    #[serde(default)]
    pub bus: Option<String>,
}

impl TestbedSpec {
    /// The `multirail testbed up` arguments (after `multirail`).
    pub fn up_argv(&self, prefix: &str) -> Vec<String> {
        let mut v: Vec<String> = ["testbed", "up", "--prefix", prefix].map(String::from).to_vec();
        v.extend(["--rails".into(), self.rails.to_string(), "--rate".into(), self.rate.clone()]);
        if let Some(b) = &self.bus {
            v.extend(["--bus".into(), b.clone()]);
        }
        v
    }

    /// `2 x 2gbit`, `2 x 2gbit sharing one 3gbit bus`, or with a rate per
    /// rail `1gbit + 3gbit`.
    pub fn describe(&self) -> String {
        let rails = if self.rate.contains(',') {
            self.rate.replace(',', " + ")
        } else {
            format!("{} x {}", self.rails, self.rate)
        };
        match &self.bus {
            Some(b) => format!("{rails} sharing one {b} bus"),
            None => rails,
        }
    }
}

/// One line of a figure: the child that measures it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    pub label: String,
    /// `multirail` arguments: `bench bw --json --quiet ...`.
    pub argv: Vec<String>,
    /// Variables set for the child.
    pub env: Vec<(String, String)>,
    /// The testbed it needs (with `--testbed`).
    pub testbed: Option<TestbedSpec>,
    /// How many times it runs; the figure shows the median per size.
    pub rounds: u32,
}

/// What a figure shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    Latency,
    Bw,
    Bibw,
    MbwMr,
    /// `bench cbr`: the four balance ratios.
    Cbr,
}

impl Metric {
    /// The `bench` test name.
    pub fn test(self) -> &'static str {
        match self {
            Metric::Latency => "latency",
            Metric::Bw => "bw",
            Metric::Bibw => "bibw",
            Metric::MbwMr => "mbw_mr",
            Metric::Cbr => "cbr",
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            Metric::Latency => "µs",
            Metric::Cbr => "intra / inter",
            _ => "MB/s",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    pub title: String,
    pub metric: Metric,
    pub configs: Vec<Config>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Study {
    /// `dual-rail`, `udapl`, `fdr-edr`, `cbr`.
    pub id: String,
    pub title: String,
    /// The seed study's question, one paragraph.
    pub question: String,
    /// Where it runs and what that means for the numbers.
    pub setup: String,
    pub figures: Vec<Figure>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub testbed: bool,
    pub quick: bool,
    pub prefix: String,
    pub studies: Vec<Study>,
}

/// The rate of the fast single rail of the dual-rail study, and of each of
/// the two slower rails.
pub const FAST_RAIL: &str = "3500mbit";
pub const SLOW_RAILS: &str = "2gbit";
/// The udapl study's rails and the bus they share in its multi-port half.
pub const UDAPL_RAILS: &str = "2gbit";
pub const UDAPL_BUS: &str = "3gbit";
/// The fdr-edr study's slower and faster rail sets (2 rails each).
pub const SLOWER_SET: &str = "1gbit";
pub const FASTER_SET: &str = "3gbit";
/// The peers study's rails (as bench/compare.sh's default), and its
/// unequal pair.
pub const PEER_RAILS: &str = "2gbit";
pub const UNEQUAL_RAILS: &str = "1gbit,3gbit";
/// The multi-pair message sizes of the peers study (and of Open MPI's
/// mr_mbw_mr beside it), without and with --quick.
pub const MBW_SIZES: &str = "8,512,4K,64K,1M";
pub const MBW_QUICK: &str = "8,64K";

/// Where a configuration's ranks run.
struct Where<'a> {
    args: &'a ReportArgs,
}

impl Where<'_> {
    /// Flags, variables and testbed of a run over `rails` rails at `rate`
    /// (testbed), or over as many loopback TCP rails (no shaping).
    fn rails(
        &self,
        rails: usize,
        rate: &str,
        bus: Option<&str>,
    ) -> (Vec<String>, Vec<(String, String)>, Option<TestbedSpec>) {
        if self.args.testbed {
            let spec = TestbedSpec { rails, rate: rate.into(), bus: bus.map(String::from) };
            (vec!["--testbed".into(), "--testbed-prefix".into(), self.args.prefix.clone()], vec![], Some(spec))
        } else {
            let list = vec!["tcp:127.0.0.1"; rails].join(",");
            // Ranks of one host would otherwise talk over shared memory.
            (vec!["--rails".into(), list], vec![("MULTIRAIL_SHM".into(), "off".into())], None)
        }
    }
}

/// Sizes and loop counts of every bench child. `--quick`: a ping-pong is
/// cheap, and 5 of them are noise; a window of 1 MiB messages is not.
fn loops(args: &ReportArgs, metric: Metric) -> Vec<String> {
    if args.quick && metric == Metric::Latency {
        ["--sizes", "8,64K,1M", "--iterations", "100", "--warmup", "10"].map(String::from).to_vec()
    } else if args.quick {
        ["--sizes", "8,64K,1M", "--iterations", "5", "--warmup", "1"].map(String::from).to_vec()
    } else {
        ["--sizes", "1:4M"].map(String::from).to_vec()
    }
}

fn rounds(args: &ReportArgs) -> u32 {
    if args.quick { 1 } else { 3 }
}

/// One bench child: `bench TEST --json --quiet WHERE LOOPS EXTRA`.
fn bench(
    args: &ReportArgs,
    label: impl Into<String>,
    metric: Metric,
    at: (Vec<String>, Vec<(String, String)>, Option<TestbedSpec>),
    extra: &[String],
) -> Config {
    let mut argv: Vec<String> = vec!["bench".into(), metric.test().into(), "--json".into(), "--quiet".into()];
    argv.extend(at.0);
    argv.extend(loops(args, metric));
    argv.extend(extra.iter().cloned());
    let rounds = if metric == Metric::Cbr { 1 } else { rounds(args) };
    Config { label: label.into(), argv, env: at.1, testbed: at.2, rounds }
}

fn words(w: &[&str]) -> Vec<String> {
    w.iter().map(|s| s.to_string()).collect()
}

const LOOPBACK: &str = "No --testbed: every rail is a TCP connection over loopback on this host (MULTIRAIL_SHM=off), \
                        so rates cannot be shaped: the rail rates named in the labels are what --testbed would use, \
                        not what was measured here. Read the figures for the shape of the curves, not for rates.";

fn setup(args: &ReportArgs, testbed_text: String) -> String {
    if args.testbed {
        format!(
            "--testbed: the report brought each emulated cluster up itself (multirail testbed up --prefix {}), \
             2 hosts in network namespaces joined by tbf-shaped veth rails; {testbed_text}",
            args.prefix
        )
    } else {
        LOOPBACK.into()
    }
}

fn dual_rail(args: &ReportArgs) -> Study {
    let w = Where { args };
    let fast = format!("1 rail at {FAST_RAIL}");
    let two = format!("2 x {SLOW_RAILS}");
    let policies: [(String, Vec<String>); 5] = [
        (format!("{two}, *:single"), words(&["--policy", "*:single"])),
        (format!("{two}, 16K:single,*:stripe"), words(&["--policy", "16K:single,*:stripe"])),
        (format!("{two}, 8K:single,*:stripe"), words(&["--policy", "8K:single,*:stripe"])),
        (format!("{two}, *:round-robin"), words(&["--policy", "*:round-robin"])),
        (format!("{two}, default policy"), vec![]),
    ];
    let figures = [(Metric::Bw, "Bandwidth"), (Metric::Bibw, "Bi-directional bandwidth"), (Metric::Latency, "Latency")]
        .into_iter()
        .map(|(metric, name)| {
            let mut configs = vec![bench(
                args,
                format!("{fast}, *:single"),
                metric,
                w.rails(1, FAST_RAIL, None),
                &words(&["--policy", "*:single"]),
            )];
            configs.extend(
                policies
                    .iter()
                    .map(|(label, extra)| bench(args, label.clone(), metric, w.rails(2, SLOW_RAILS, None), extra)),
            );
            Figure { title: format!("{name}: one fast rail vs two slower ones"), metric, configs }
        })
        .collect();
    Study {
        id: "dual-rail".into(),
        title: "Dual-rail vs one faster rail (dual-rail QDR vs FDR)".into(),
        question: "Is a pair of slower rails an alternative to one faster rail? The dual-rail QDR vs FDR InfiniBand \
                   study measured one FDR rail against two QDR rails under MVAPICH2, whose default stripes messages \
                   above a threshold (8K/16K) across rails and sends smaller ones on one rail: two QDR rails beat \
                   FDR in bandwidth for large messages, but at the threshold the curve shows a cusp where eager \
                   messages end and striping starts, and latency favours the single faster rail. Here: the same \
                   comparison with multirail's policies, and whether its default removes the cusp."
            .into(),
        setup: setup(
            args,
            format!("the fast rail is a 1-rail testbed at {FAST_RAIL}, the pair a 2-rail testbed at {SLOW_RAILS} each"),
        ),
        figures,
    }
}

fn udapl(args: &ReportArgs) -> Study {
    let w = Where { args };
    let mut configs = Vec::new();
    for progress in ["threaded", "polled"] {
        let extra = words(&["--progress", progress, "--model"]);
        configs.push(bench(args, format!("multi-HCA, {progress}"), Metric::Bw, w.rails(2, UDAPL_RAILS, None), &extra));
    }
    if args.testbed {
        for progress in ["threaded", "polled"] {
            let extra = words(&["--progress", progress, "--model", "--nic", UDAPL_BUS]);
            configs.push(bench(
                args,
                format!("multi-port, {progress}"),
                Metric::Bw,
                w.rails(2, UDAPL_RAILS, Some(UDAPL_BUS)),
                &extra,
            ));
        }
    }
    let multi_port = if args.testbed {
        format!("multi-port: the same 2 rails sharing one shaped {UDAPL_BUS} bus (testbed up --bus {UDAPL_BUS})")
    } else {
        "multi-port (rails sharing one shaped bus) needs --testbed and `testbed up --bus`: not measured on loopback"
            .into()
    };
    Study {
        id: "udapl".into(),
        title: "Threaded vs non-threaded progress, multi-HCA vs multi-port (uDAPL, NPC'09)".into(),
        question: "Does a progress thread per rail pay, and how close does multi-rail bandwidth come to what the \
                   hardware allows? Cai, Rendell and Strazdins (NPC 2009) compared non-threaded and threaded \
                   multi-rail transfers over uDAPL on multi-HCA (one port per NIC) and multi-port (several ports \
                   of one NIC) setups, and predicted the bandwidth with a model: multi-HCA N x min(link, NIC bus, \
                   host bus), multi-port min(N x link, NIC bus, host bus). Here: --progress threaded vs polled, \
                   with the model's prediction (bench bw --model: link rates measured per rail) beside each \
                   measurement."
            .into(),
        setup: format!(
            "{} multi-HCA: 2 rails, each its own link ({UDAPL_RAILS} under --testbed); {multi_port}.",
            setup(args, String::new())
        ),
        figures: vec![Figure {
            title: "Bandwidth: threaded vs polled progress, with the model".into(),
            metric: Metric::Bw,
            configs,
        }],
    }
}

fn fdr_edr(args: &ReportArgs) -> Study {
    let w = Where { args };
    let figures = [(Metric::Latency, "Latency"), (Metric::Bw, "Bandwidth"), (Metric::Bibw, "Bi-directional bandwidth")]
        .into_iter()
        .map(|(metric, name)| Figure {
            title: format!("{name}: slower vs faster rail set"),
            metric,
            configs: vec![
                bench(args, format!("slower: 2 x {SLOWER_SET}"), metric, w.rails(2, SLOWER_SET, None), &[]),
                bench(args, format!("faster: 2 x {FASTER_SET}"), metric, w.rails(2, FASTER_SET, None), &[]),
            ],
        })
        .collect();
    Study {
        id: "fdr-edr".into(),
        title: "A slower vs a faster rail set (FDR vs EDR)".into(),
        question: "What does the faster interconnect buy? The FDR vs EDR InfiniBand study answered with the OSU \
                   micro-benchmarks' tables: latency, uni- and bi-directional bandwidth per message size, FDR \
                   (56 Gb/s) against EDR (100 Gb/s). Here: the same three tables for a slower and a faster set of \
                   two rails, and the ratio faster / slower per size."
            .into(),
        setup: setup(args, format!("slower: 2 rails at {SLOWER_SET}, faster: 2 rails at {FASTER_SET}")),
        figures,
    }
}

fn cbr(args: &ReportArgs) -> Study {
    let w = Where { args };
    // bench cbr keeps its inter-node side off shared memory itself: no
    // variables for it.
    let (flags, _, testbed) = w.rails(2, SLOW_RAILS, None);
    let config = bench(args, "CBR = intra / inter", Metric::Cbr, (flags, vec![], testbed), &[]);
    let mut figures = vec![Figure {
        title: "Balance ratios intra / inter per size".into(),
        metric: Metric::Cbr,
        configs: vec![config],
    }];
    if args.testbed {
        // 4 ranks on 2 hosts, 2 pairs (rank i with rank i + 2): block puts
        // both pairs across the hosts, cyclic both inside one host.
        let configs = ["block", "cyclic"]
            .into_iter()
            .map(|mapping| {
                let extra = words(&["--pairs", "2", "--ranks-per-host", "2", "--mapping", mapping]);
                bench(
                    args,
                    format!("4 ranks on 2 hosts, {mapping}"),
                    Metric::MbwMr,
                    w.rails(2, SLOW_RAILS, None),
                    &extra,
                )
            })
            .collect();
        figures.push(Figure {
            title: "Multi-pair bandwidth, 2 pairs of 4 ranks on 2 hosts: block vs cyclic".into(),
            metric: Metric::MbwMr,
            configs,
        });
    }
    Study {
        id: "cbr".into(),
        title: "Communication Balance Ratios (HotI'09, DDR/QDR)".into(),
        question: "Is the cluster balanced between intra-node and inter-node communication? Subramoni, Koop and \
                   Panda (HotI'09) defined the Communication Balance Ratios (latency, bandwidth, bi-directional \
                   and multi-pair bandwidth, each intra-node / inter-node) and used them to compare DDR and QDR \
                   InfiniBand on Intel platforms with block and cyclic process placement. Here: the four ratios of \
                   this host's shared memory against the rails, and (with --testbed) the multi-pair bandwidth of 4 \
                   ranks on 2 hosts placed block (both pairs across the hosts) vs cyclic (both pairs inside a \
                   host)."
            .into(),
        setup: if args.testbed {
            setup(args, format!("intra-node: 2 ranks over shared memory; inter-node: 2 hosts, 2 rails at {SLOW_RAILS}"))
        } else {
            "No --testbed: intra-node is 2 ranks over shared memory, inter-node 2 ranks on this same host over \
             two loopback TCP rails standing in for two nodes (bench cbr sets MULTIRAIL_SHM=off for that side). \
             Block vs cyclic placement needs --testbed (hosts to place ranks on)."
                .into()
        },
        figures,
    }
}

fn peers(args: &ReportArgs) -> Study {
    let w = Where { args };
    let two = format!("2 x {PEER_RAILS}");
    // One rail: the first of the same testbed (so the peers' rail0-only
    // runs share it), or one loopback rail.
    let one = || {
        if args.testbed {
            (w.rails(2, PEER_RAILS, None), words(&["--testbed-rails", "1"]))
        } else {
            (w.rails(1, PEER_RAILS, None), vec![])
        }
    };
    let mut figures: Vec<Figure> =
        [(Metric::Bw, "Bandwidth"), (Metric::Bibw, "Bi-directional bandwidth"), (Metric::Latency, "Latency")]
            .into_iter()
            .map(|(metric, name)| {
                let (at, extra) = one();
                Figure {
                    title: format!("{name}: multirail and the peers on {two}"),
                    metric,
                    configs: vec![
                        bench(args, format!("multirail, rail0 only of {two}"), metric, at, &extra),
                        bench(args, format!("multirail, {two}"), metric, w.rails(2, PEER_RAILS, None), &[]),
                    ],
                }
            })
            .collect();
    // Multi-pair: 4 ranks, ranks 0-1 send to ranks 2-3 (block: across the
    // hosts), at a few sizes: OSU's 100 windows of 64 per size.
    let (flags, env, testbed) = w.rails(2, PEER_RAILS, None);
    let mut argv = words(&["bench", "mbw_mr", "--json", "--quiet"]);
    argv.extend(flags);
    if args.quick {
        argv.extend(words(&["--sizes", MBW_QUICK, "--iterations", "5", "--warmup", "1"]));
    } else {
        argv.extend(words(&["--sizes", MBW_SIZES]));
    }
    argv.extend(words(&["--pairs", "2"]));
    if args.testbed {
        argv.extend(words(&["--ranks-per-host", "2", "--mapping", "block"]));
    }
    let label = if args.testbed { "multirail, 2 pairs across 2 hosts" } else { "multirail, 2 pairs" };
    figures.push(Figure {
        title: format!("Multi-pair bandwidth (message rate), 2 pairs on {two}"),
        metric: Metric::MbwMr,
        configs: vec![Config { label: label.into(), argv, env, testbed, rounds: rounds(args) }],
    });
    if args.testbed {
        figures.push(Figure {
            title: "Bandwidth on unequal rails, 1gbit + 3gbit".into(),
            metric: Metric::Bw,
            configs: vec![bench(args, "multirail, 1gbit + 3gbit", Metric::Bw, w.rails(2, UNEQUAL_RAILS, None), &[])],
        });
    }
    Study {
        id: super::peers::STUDY.into(),
        title: "multirail beside Open MPI, UCX and iperf3 (bench/compare.sh)".into(),
        question: "Does one multirail channel beat what the libraries HPC users already have, on the same rails? \
                   Open MPI's ob1 with its tcp BTL stripes large messages over every interface it is given (and \
                   can open several connections per interface, or weigh interfaces by hints), UCX's tcp \
                   transport spreads rendezvous over UCX_MAX_RNDV_RAILS, and iperf3's one stream per rail is the \
                   practical limit of the links. Here: bandwidth, bi-directional bandwidth, latency and the \
                   2-pair message rate of multirail on one rail and on all rails, against each of them on one \
                   rail and on all rails; then the same on two unequal rails."
            .into(),
        setup: if args.testbed {
            setup(
                args,
                format!(
                    "2 rails at {PEER_RAILS} (the one-rail lines use rail0 of the same testbed: \
                     bench --testbed-rails 1, UCX_NET_DEVICES=rail0, btl_tcp_if_include rail0), then 2 rails at \
                     1gbit and 3gbit; the peers run with --peers only"
                ),
            )
        } else {
            format!("{LOOPBACK} The peers need --testbed (an address per rail): with loopback only multirail runs.")
        },
        figures,
    }
}

/// The studies `--study` selects, in the order of the page.
pub fn plan(args: &ReportArgs) -> Plan {
    let all = args.study == StudyName::All;
    let mut studies = Vec::new();
    if all || args.study == StudyName::DualRail {
        studies.push(dual_rail(args));
    }
    if all || args.study == StudyName::Udapl {
        studies.push(udapl(args));
    }
    if all || args.study == StudyName::FdrEdr {
        studies.push(fdr_edr(args));
    }
    if all || args.study == StudyName::Cbr {
        studies.push(cbr(args));
    }
    // `all` takes the peers study only with --peers: without the peers it
    // would repeat the other studies' lines.
    if (all && args.peers) || args.study == StudyName::Peers {
        studies.push(peers(args));
    }
    Plan { testbed: args.testbed, quick: args.quick, prefix: args.prefix.clone(), studies }
}

/// `multirail report --out /tmp/x EXTRA...` parsed, for the report's
/// tests.
#[cfg(test)]
pub fn test_args(extra: &[&str]) -> ReportArgs {
    use clap::Parser;
    let mut argv = vec!["multirail", "report", "--out", "/tmp/x"];
    argv.extend_from_slice(extra);
    match crate::cli::Cli::parse_from(argv).command {
        crate::cli::Command::Report(a) => a,
        _ => unreachable!(),
    }
}

#[cfg(test)]
mod tests {
    use super::test_args as args;
    use super::*;

    fn study<'a>(p: &'a Plan, id: &str) -> &'a Study {
        p.studies.iter().find(|s| s.id == id).unwrap()
    }

    fn argv(c: &Config) -> String {
        c.argv.join(" ")
    }

    #[test]
    fn all_studies_by_default_in_page_order() {
        let p = plan(&args(&[]));
        let ids: Vec<&str> = p.studies.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["dual-rail", "udapl", "fdr-edr", "cbr"]);
        let p = plan(&args(&["--study", "fdr-edr"]));
        assert_eq!(p.studies.len(), 1);
        assert_eq!(p.studies[0].id, "fdr-edr");
    }

    #[test]
    fn dual_rail_on_loopback() {
        let p = plan(&args(&["--study", "dual-rail", "--quick"]));
        let s = study(&p, "dual-rail");
        let metrics: Vec<Metric> = s.figures.iter().map(|f| f.metric).collect();
        assert_eq!(metrics, [Metric::Bw, Metric::Bibw, Metric::Latency]);
        let bw = &s.figures[0].configs;
        assert_eq!(bw.len(), 6);
        assert_eq!(
            argv(&bw[0]),
            "bench bw --json --quiet --rails tcp:127.0.0.1 --sizes 8,64K,1M --iterations 5 --warmup 1 --policy *:single"
        );
        assert_eq!(
            argv(&bw[2]),
            "bench bw --json --quiet --rails tcp:127.0.0.1,tcp:127.0.0.1 --sizes 8,64K,1M --iterations 5 --warmup 1 \
             --policy 16K:single,*:stripe"
        );
        assert!(argv(&bw[3]).ends_with("--policy 8K:single,*:stripe"));
        assert!(argv(&bw[4]).ends_with("--policy *:round-robin"));
        assert!(!argv(&bw[5]).contains("--policy"), "the default policy: {}", argv(&bw[5]));
        assert!(bw.iter().all(|c| c.env == [("MULTIRAIL_SHM".to_string(), "off".to_string())] && c.testbed.is_none()));
        assert!(bw.iter().all(|c| c.rounds == 1));
        assert!(s.setup.contains("rates cannot be shaped"));
        assert_eq!(
            argv(&s.figures[2].configs[1]),
            "bench latency --json --quiet --rails tcp:127.0.0.1,tcp:127.0.0.1 --sizes 8,64K,1M --iterations 100 \
             --warmup 10 --policy *:single"
        );
    }

    #[test]
    fn dual_rail_on_testbeds() {
        let p = plan(&args(&["--study", "dual-rail", "--testbed", "--prefix", "tb"]));
        let bw = &study(&p, "dual-rail").figures[0].configs;
        assert_eq!(
            argv(&bw[0]),
            "bench bw --json --quiet --testbed --testbed-prefix tb --sizes 1:4M --policy *:single"
        );
        let fast = bw[0].testbed.as_ref().unwrap();
        assert_eq!(fast.up_argv("tb").join(" "), "testbed up --prefix tb --rails 1 --rate 3500mbit");
        let two = bw[1].testbed.as_ref().unwrap();
        assert_eq!(two.up_argv("tb").join(" "), "testbed up --prefix tb --rails 2 --rate 2gbit");
        assert!(bw.iter().all(|c| c.env.is_empty() && c.rounds == 3));
    }

    #[test]
    fn udapl_threaded_and_polled_with_the_model() {
        let p = plan(&args(&["--study", "udapl", "--quick"]));
        let cfgs = &study(&p, "udapl").figures[0].configs;
        let labels: Vec<&str> = cfgs.iter().map(|c| c.label.as_str()).collect();
        assert_eq!(labels, ["multi-HCA, threaded", "multi-HCA, polled"]);
        assert!(argv(&cfgs[0]).ends_with("--progress threaded --model"), "{}", argv(&cfgs[0]));
        assert!(study(&p, "udapl").setup.contains("needs --testbed"));

        let p = plan(&args(&["--study", "udapl", "--testbed"]));
        let cfgs = &study(&p, "udapl").figures[0].configs;
        assert_eq!(cfgs.len(), 4);
        assert_eq!(cfgs[2].label, "multi-port, threaded");
        assert!(argv(&cfgs[3]).ends_with("--progress polled --model --nic 3gbit"), "{}", argv(&cfgs[3]));
        assert_eq!(
            cfgs[2].testbed.as_ref().unwrap().up_argv("rpt").join(" "),
            "testbed up --prefix rpt --rails 2 --rate 2gbit --bus 3gbit"
        );
        assert_eq!(cfgs[0].testbed.as_ref().unwrap().bus, None);
    }

    #[test]
    fn fdr_edr_osu_tables_for_two_rail_sets() {
        let p = plan(&args(&["--study", "fdr-edr", "--testbed"]));
        let s = study(&p, "fdr-edr");
        assert_eq!(s.figures.iter().map(|f| f.metric).collect::<Vec<_>>(), [Metric::Latency, Metric::Bw, Metric::Bibw]);
        for f in &s.figures {
            let rates: Vec<&str> = f.configs.iter().map(|c| c.testbed.as_ref().unwrap().rate.as_str()).collect();
            assert_eq!(rates, ["1gbit", "3gbit"]);
        }
        assert_eq!(
            argv(&s.figures[2].configs[1]),
            "bench bibw --json --quiet --testbed --testbed-prefix rpt --sizes 1:4M"
        );
    }

    #[test]
    fn cbr_runs_bench_cbr_once() {
        let p = plan(&args(&["--study", "cbr", "--quick"]));
        let c = &study(&p, "cbr").figures[0].configs[0];
        assert_eq!(
            argv(c),
            "bench cbr --json --quiet --rails tcp:127.0.0.1,tcp:127.0.0.1 --sizes 8,64K,1M --iterations 5 --warmup 1"
        );
        assert!(c.env.is_empty(), "bench cbr sets MULTIRAIL_SHM=off for its inter-node side itself");
        assert_eq!(c.rounds, 1);
        let p = plan(&args(&["--study", "cbr", "--testbed"]));
        let c = &study(&p, "cbr").figures[0].configs[0];
        assert_eq!(argv(c), "bench cbr --json --quiet --testbed --testbed-prefix rpt --sizes 1:4M");
        assert_eq!(c.rounds, 1);
        let placement = &study(&p, "cbr").figures[1];
        assert_eq!(placement.metric, Metric::MbwMr);
        assert_eq!(
            argv(&placement.configs[1]),
            "bench mbw_mr --json --quiet --testbed --testbed-prefix rpt --sizes 1:4M --pairs 2 --ranks-per-host 2 \
             --mapping cyclic"
        );
        assert_eq!(
            placement.configs[0].testbed.as_ref().unwrap().up_argv("rpt").join(" "),
            "testbed up --prefix rpt --rails 2 --rate 2gbit"
        );
        // No placement on loopback: one host.
        assert_eq!(study(&plan(&args(&["--study", "cbr"])), "cbr").figures.len(), 1);
    }

    #[test]
    fn peers_study_on_the_testbed_and_only_with_peers_in_all() {
        let p = plan(&args(&["--study", "peers", "--testbed"]));
        let s = study(&p, "peers");
        let metrics: Vec<Metric> = s.figures.iter().map(|f| f.metric).collect();
        assert_eq!(metrics, [Metric::Bw, Metric::Bibw, Metric::Latency, Metric::MbwMr, Metric::Bw]);
        let bw = &s.figures[0].configs;
        assert_eq!(
            argv(&bw[0]),
            "bench bw --json --quiet --testbed --testbed-prefix rpt --sizes 1:4M --testbed-rails 1"
        );
        assert_eq!(bw[0].testbed, bw[1].testbed, "one rail is rail0 of the same testbed");
        assert_eq!(
            argv(&s.figures[3].configs[0]),
            "bench mbw_mr --json --quiet --testbed --testbed-prefix rpt --sizes 8,512,4K,64K,1M --pairs 2 \
             --ranks-per-host 2 --mapping block"
        );
        let unequal = s.figures[4].configs[0].testbed.as_ref().unwrap();
        assert_eq!(unequal.rate, "1gbit,3gbit");
        assert_eq!(unequal.describe(), "1gbit + 3gbit");
        assert_eq!(bw[1].testbed.as_ref().unwrap().describe(), "2 x 2gbit");
        // Loopback: one rail is one loopback rail; no unequal rails.
        let p = plan(&args(&["--study", "peers", "--quick"]));
        let s = study(&p, "peers");
        assert_eq!(s.figures.len(), 4);
        assert!(
            argv(&s.figures[0].configs[0]).contains("--rails tcp:127.0.0.1 "),
            "{}",
            argv(&s.figures[0].configs[0])
        );
        assert!(argv(&s.figures[3].configs[0]).contains("--sizes 8,64K --iterations 5 --warmup 1 --pairs 2"));
        // `all`: the peers study with --peers only.
        assert!(!plan(&args(&[])).studies.iter().any(|s| s.id == "peers"));
        assert_eq!(plan(&args(&["--peers"])).studies.last().unwrap().id, "peers");
    }

    #[test]
    fn quick_is_smaller() {
        let count = |p: &Plan| -> u32 {
            p.studies.iter().flat_map(|s| &s.figures).flat_map(|f| &f.configs).map(|c| c.rounds).sum()
        };
        let full = plan(&args(&[]));
        let quick = plan(&args(&["--quick"]));
        assert!(count(&quick) * 2 < count(&full), "{} vs {}", count(&quick), count(&full));
        let c = &study(&full, "fdr-edr").figures[0].configs[0];
        assert!(argv(c).contains("--sizes 1:4M") && !argv(c).contains("--iterations"));
    }
}
