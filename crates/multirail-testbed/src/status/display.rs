//! The human-readable `status` table: a header line, one row per rail, one
//! row per host with its address on every rail.

use std::fmt;

use super::{HostRailStatus, Status};
use crate::names;
use crate::spec::Topology;

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let layout = match self.topology {
            Topology::Direct => "direct veth pairs".to_owned(),
            Topology::Switched => format!("one bridge per rail in netns {}", self.prefix.switch_netns()),
        };
        let cc = self.congestion_control().unwrap_or("differs per host");
        writeln!(
            f,
            "testbed {}: {} hosts, {} rails, {layout}, congestion control {cc}",
            self.prefix,
            self.hosts.len(),
            self.rails.len()
        )?;
        match self.bus {
            Some(bus) => writeln!(
                f,
                "multi-port: the rails of each host share a bus of {} (ifb `bus`), on top of each rail's rate",
                bus.rate
            )?,
            None => writeln!(f, "multi-HCA: each rail is its own link (no shared bus)")?,
        }
        writeln!(f)?;
        write_table(f, &self.rail_rows())?;
        writeln!(f)?;
        write_table(f, &self.host_rows())?;
        if !self.problems.is_empty() {
            writeln!(f, "\nproblems:")?;
            for problem in &self.problems {
                writeln!(f, "  - {problem}")?;
            }
        }
        Ok(())
    }
}

impl Status {
    fn rail_rows(&self) -> Vec<Vec<String>> {
        let header = ["RAIL", "SUBNET", "RATE", "BURST", "LATENCY"].map(String::from).to_vec();
        let rows = self.rails.iter().map(|rail| {
            let subnet = rail.subnet.map_or("-".into(), |s| s.to_string());
            let (rate, burst, latency) = match rail.shaping {
                Some(s) => (s.rate.to_string(), format!("{}B", s.burst_bytes), format_us(s.latency_us)),
                None => ("unshaped".into(), "-".into(), "-".into()),
            };
            vec![names::rail_ifname(rail.index), subnet, rate, burst, latency]
        });
        let bus = self.bus.map(|s| {
            vec![
                names::BUS_IFNAME.into(),
                "-".into(),
                s.rate.to_string(),
                format!("{}B", s.burst_bytes),
                format_us(s.latency_us),
            ]
        });
        std::iter::once(header).chain(rows).chain(bus).collect()
    }

    fn host_rows(&self) -> Vec<Vec<String>> {
        let mut header = vec!["HOST".to_owned(), "NETNS".to_owned()];
        header.extend((0..self.rails.len()).map(|r| names::rail_ifname(r).to_uppercase()));
        let rows = self.hosts.iter().map(|host| {
            let mut row = vec![host.name.clone(), host.netns.clone()];
            row.extend((0..self.rails.len()).map(|r| describe_host_rail(host.rail(r))));
            row
        });
        std::iter::once(header).chain(rows).collect()
    }
}

fn describe_host_rail(rail: Option<&HostRailStatus>) -> String {
    let Some(rail) = rail else {
        return "missing".into();
    };
    let addr = rail.addr.map_or("no address".into(), |a| a.to_string());
    match (rail.up, rail.carrier) {
        (false, _) => format!("{addr} (down)"),
        (true, false) => format!("{addr} (no carrier)"),
        (true, true) => addr,
    }
}

fn format_us(us: u64) -> String {
    if us.is_multiple_of(1000) { format!("{}ms", us / 1000) } else { format!("{us}us") }
}

/// Writes rows with columns padded to their widest cell.
fn write_table(f: &mut fmt::Formatter<'_>, rows: &[Vec<String>]) -> fmt::Result {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> =
        (0..columns).map(|c| rows.iter().filter_map(|row| row.get(c)).map(String::len).max().unwrap_or(0)).collect();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        writeln!(f, "{}", cells.join("  ").trim_end())?;
    }
    Ok(())
}
