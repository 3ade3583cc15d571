//! `multirail testbed ...`, and where ranks go when they run in a testbed.

use anyhow::{Context, bail};
use multirail_testbed::{self as tb, Prefix, Spec};

use crate::cli::TestbedCommand;
use crate::placement::Layout;

pub fn run(cmd: TestbedCommand) -> anyhow::Result<i32> {
    match cmd {
        TestbedCommand::Up { hosts, rails, rate, bus, prefix } => {
            let spec = Spec {
                prefix: prefix.parse()?,
                hosts,
                rails,
                rates: tb::parse_rates(&rate).with_context(|| format!("--rate {rate}"))?,
                bus: bus.as_deref().map(parse_bus).transpose()?,
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

/// `--bus RATE`: one rate (a list is refused: the bus is one per host).
fn parse_bus(text: &str) -> anyhow::Result<tb::Rate> {
    if text.contains(',') {
        bail!("--bus {text}: give one rate, the bus every host's rails share (e.g. --bus 2gbit)");
    }
    text.trim().parse().with_context(|| format!("--bus {text}"))
}

fn prefix_flag(p: &Prefix) -> String {
    if *p == Prefix::default() { String::new() } else { format!(" --prefix {}", p.as_str()) }
}

/// Where one rank runs in a testbed.
pub struct HostPlacement {
    /// The testbed host (`host{i}`).
    pub host: u32,
    pub netns: String,
    /// `MULTIRAIL_RAILS` for this host: `tcp:10.77.0.1,tcp:10.77.1.1`.
    pub rails: String,
}

/// Each rank's host (by [`Layout`]), its namespace and rails, and the root
/// addresses.
pub struct Placement {
    /// By rank.
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

/// Places `ranks` ranks in the testbed `prefix` by `layout` (None when not
/// asked).
pub fn placement(enabled: bool, prefix: &str, ranks: u32, layout: Layout) -> anyhow::Result<Option<Placement>> {
    if !enabled {
        return Ok(None);
    }
    let p: Prefix = prefix.parse()?;
    let st =
        tb::status(&p)?.with_context(|| format!("no testbed '{prefix}': create one with `multirail testbed up`"))?;
    let need = layout.hosts(ranks);
    if (need as usize) > st.hosts.len() {
        bail!(
            "{ranks} ranks at {} per host need {need} testbed hosts, testbed '{prefix}' has {} \
             (testbed up --hosts {need}, or more --ranks-per-host)",
            layout.per_host,
            st.hosts.len()
        );
    }
    let mut hosts = Vec::new();
    for rank in 0..ranks {
        let h = layout.host_of(rank, ranks);
        let addrs = st.rail_addrs(h as usize).with_context(|| format!("host{h} lacks an address on some rail"))?;
        let rails = addrs.iter().map(|a| format!("tcp:{a}")).collect::<Vec<_>>().join(",");
        hosts.push(HostPlacement { host: h, netns: p.host_netns(h as usize), rails });
    }
    tracing::info!("testbed '{prefix}': {} ({:?})", layout.describe(ranks), layout.mapping);
    let root_ips: Vec<String> = st
        .rail_addrs(layout.host_of(0, ranks) as usize)
        .context("rank 0's host lacks an address on some rail")?
        .iter()
        .map(|a| a.to_string())
        .collect();
    Ok(Some(Placement { hosts, root_ips }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_takes_one_rate() {
        assert_eq!(parse_bus("2gbit").unwrap().to_string(), "2gbit");
        assert_eq!(parse_bus("250MB/s").unwrap().to_string(), "2gbit");
        let list = parse_bus("1gbit,2gbit").unwrap_err().to_string();
        assert!(list.contains("give one rate"), "{list}");
        let junk = format!("{:#}", parse_bus("fast").unwrap_err());
        assert!(junk.starts_with("--bus fast: invalid rate `fast`"), "{junk}");
    }
}
