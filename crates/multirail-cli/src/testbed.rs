//! `multirail testbed ...`, and where ranks go when they run in a testbed.

use anyhow::{Context, bail};
use multirail_testbed::{self as tb, Prefix, Spec};

use crate::cli::TestbedCommand;

pub fn run(cmd: TestbedCommand) -> anyhow::Result<i32> {
    match cmd {
        TestbedCommand::Up { hosts, rails, rate, prefix } => {
            let spec = Spec {
                prefix: prefix.parse()?,
                hosts,
                rails,
                rates: tb::parse_rates(&rate).with_context(|| format!("--rate {rate}"))?,
                ..Spec::default()
            };
            let status = tb::up(&spec)?;
            println!("{status}");
            println!("Run ranks in it with `multirail bench ... --testbed` or `multirail run --testbed -- CMD`;");
            println!("remove it with `multirail testbed down{}`.", prefix_flag(&spec.prefix));
            Ok(0)
        }
        TestbedCommand::Down { prefix } => {
            let report = tb::down(&prefix.parse()?)?;
            if report.is_empty() {
                println!("nothing to remove for prefix '{prefix}'");
            } else {
                println!("{report}");
            }
            Ok(0)
        }
        TestbedCommand::Status { prefix, json } => {
            let p: Prefix = prefix.parse()?;
            match tb::status(&p)? {
                Some(st) if json => print!("{}", multirail_perf::report::json::to_line(&st)),
                Some(st) => println!("{st}"),
                None => {
                    eprintln!("no testbed with prefix '{prefix}' (create one with `multirail testbed up`)");
                    return Ok(1);
                }
            }
            Ok(0)
        }
        TestbedCommand::Exec { host, prefix, cmd } => {
            let st = tb::run_in_host(&prefix.parse()?, tb::parse_host(&host)?, &cmd)?;
            if let Some(sig) = std::os::unix::process::ExitStatusExt::signal(&st) {
                eprintln!("multirail: {} was killed by signal {sig} ({})", cmd[0], crate::launch::signal_name(sig));
            }
            Ok(crate::launch::exit_code(st))
        }
    }
}

fn prefix_flag(p: &Prefix) -> String {
    if *p == Prefix::default() { String::new() } else { format!(" --prefix {}", p.as_str()) }
}

/// Where one rank runs in a testbed.
pub struct HostPlacement {
    pub netns: String,
    /// `MULTIRAIL_RAILS` for this host: `tcp:10.77.0.1,tcp:10.77.1.1`.
    pub rails: String,
}

/// Rank i in host i: the namespaces, rails and the root addresses.
pub struct Placement {
    pub hosts: Vec<HostPlacement>,
    /// Rank 0's address on every rail, where ranks meet (a rail that is
    /// down does not keep the job from starting).
    pub root_ips: Vec<String>,
}

impl Placement {
    /// `MULTIRAIL_ROOT` for this placement: every rail's address, one port.
    pub fn root(&self, port: u16) -> String {
        self.root_ips.iter().map(|ip| format!("{ip}:{port}")).collect::<Vec<_>>().join(",")
    }
}

/// Places `ranks` ranks in the testbed `prefix` (None when not asked).
pub fn placement(enabled: bool, prefix: &str, ranks: u32) -> anyhow::Result<Option<Placement>> {
    if !enabled {
        return Ok(None);
    }
    let p: Prefix = prefix.parse()?;
    let st =
        tb::status(&p)?.with_context(|| format!("no testbed '{prefix}': create one with `multirail testbed up`"))?;
    if (ranks as usize) > st.hosts.len() {
        bail!(
            "{ranks} ranks need {ranks} testbed hosts, testbed '{prefix}' has {} (testbed up --hosts {ranks})",
            st.hosts.len()
        );
    }
    let mut hosts = Vec::new();
    for h in 0..ranks as usize {
        let addrs = st.rail_addrs(h).with_context(|| format!("host{h} lacks an address on some rail"))?;
        let rails = addrs.iter().map(|a| format!("tcp:{a}")).collect::<Vec<_>>().join(",");
        hosts.push(HostPlacement { netns: p.host_netns(h), rails });
    }
    let root_ips: Vec<String> =
        st.rail_addrs(0).context("host0 lacks an address on some rail")?.iter().map(|a| a.to_string()).collect();
    Ok(Some(Placement { hosts, root_ips }))
}
