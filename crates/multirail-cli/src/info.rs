//! `multirail info`: the rails this machine could use.

use std::collections::BTreeMap;
use std::fs;

use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct Interface {
    pub name: String,
    /// What to write in --rails / MULTIRAIL_RAILS for it.
    pub rail_spec: String,
    pub addresses: Vec<String>,
    /// Link speed in Mbit/s from sysfs, when the driver reports one.
    pub speed_mbit: Option<u64>,
    pub mtu: Option<u64>,
    pub up: bool,
    pub loopback: bool,
}

fn sysfs_num(iface: &str, file: &str) -> Option<u64> {
    let s = fs::read_to_string(format!("/sys/class/net/{iface}/{file}")).ok()?;
    s.trim().parse::<i64>().ok().filter(|&v| v > 0).map(|v| v as u64)
}

fn is_up(iface: &str) -> bool {
    fs::read_to_string(format!("/sys/class/net/{iface}/operstate"))
        .map(|s| matches!(s.trim(), "up" | "unknown"))
        .unwrap_or(true)
}

pub fn interfaces() -> anyhow::Result<Vec<Interface>> {
    let mut by_name: BTreeMap<String, Interface> = BTreeMap::new();
    for a in if_addrs::get_if_addrs()? {
        let e = by_name.entry(a.name.clone()).or_insert_with(|| Interface {
            name: a.name.clone(),
            rail_spec: if a.is_loopback() { LOOPBACK_SPEC.to_string() } else { format!("tcp:{}", a.name) },
            addresses: Vec::new(),
            speed_mbit: sysfs_num(&a.name, "speed"),
            mtu: sysfs_num(&a.name, "mtu"),
            up: is_up(&a.name),
            loopback: a.is_loopback(),
        });
        e.addresses.push(a.ip().to_string());
    }
    Ok(by_name.into_values().collect())
}

/// The rail spec of the loopback interface: one of its addresses (any
/// 127.0.0.N is a rail of its own, which an interface name is not).
const LOOPBACK_SPEC: &str = "tcp:127.0.0.1";

/// The shared-memory rail as `info --json` shows it.
#[derive(Debug, Serialize)]
struct ShmLine {
    name: &'static str,
    rail_spec: &'static str,
    available: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    why_not: Option<String>,
}

pub fn run(json: bool) -> anyhow::Result<()> {
    let ifs = interfaces()?;
    // Shared memory needs a memfd segment (and abstract Unix sockets, which
    // Linux always has): try one.
    let shm_err = multirail_transport::shm::Segment::create(4096).err().map(|e| e.to_string());
    if json {
        // JSON Lines, as every --json: one object per rail candidate.
        let mut out = String::new();
        for i in &ifs {
            out.push_str(&multirail_perf::report::json::to_line(i));
        }
        let shm = ShmLine { name: "shm", rail_spec: "shm", available: shm_err.is_none(), why_not: shm_err };
        out.push_str(&multirail_perf::report::json::to_line(&shm));
        print!("{out}");
        return Ok(());
    }
    println!("{:<12} {:<6} {:>10} {:>6}  {:<40} rail spec", "interface", "state", "speed", "mtu", "addresses");
    for i in &ifs {
        let speed = i.speed_mbit.map_or("-".to_string(), |s| format!("{s} Mb/s"));
        let mtu = i.mtu.map_or("-".to_string(), |m| m.to_string());
        let spec = match i.loopback {
            true => format!("{} (any 127.0.0.N: emulated rails)", i.rail_spec),
            false => i.rail_spec.clone(),
        };
        println!(
            "{:<12} {:<6} {:>10} {:>6}  {:<40} {}",
            i.name,
            if i.up { "up" } else { "down" },
            speed,
            mtu,
            i.addresses.join(" "),
            spec
        );
    }
    let shm = shm_err.map_or("available".to_string(), |e| format!("unavailable: {e}"));
    println!(
        "{:<12} {:<6} {:>10} {:>6}  {:<40} shm",
        "(shm)",
        "",
        "",
        "",
        format!("shared memory, ranks on one host: {shm}")
    );
    for line in ofi_lines() {
        println!("{line}");
    }
    println!();
    println!(
        "Use them as MULTIRAIL_RAILS=tcp:IF1,tcp:IF2, shm,tcp:IF1 or ofi:tcp:IF1,ofi:tcp:IF2 (or --rails); default: {}",
        multirail::DEFAULT_RAILS
    );
    Ok(())
}

/// One line per libfabric provider and domain an `ofi:` rail can use, in
/// the table's columns, with the spec that selects it.
#[cfg(feature = "ofi")]
fn ofi_lines() -> Vec<String> {
    let row = |what: &str, spec: &str| format!("{:<12} {:<6} {:>10} {:>6}  {:<40} {spec}", "(ofi)", "", "", "", what);
    match multirail_transport::ofi::list_providers() {
        Ok(list) if list.is_empty() => vec![row("libfabric: no provider offers FI_EP_RDM here", "-")],
        Ok(list) => list
            .iter()
            .map(|p| row(&format!("libfabric {} domain {} ({})", p.provider, p.domain, p.fabric), &p.spec))
            .collect(),
        Err(e) => vec![row(&format!("libfabric: {e}"), "-")],
    }
}

#[cfg(not(feature = "ofi"))]
fn ofi_lines() -> Vec<String> {
    vec![format!(
        "{:<12} {:<6} {:>10} {:>6}  {:<40} -",
        "(ofi)", "", "", "", "libfabric: not built in (cargo build --release --features ofi)"
    )]
}

#[cfg(test)]
mod tests {
    #[test]
    fn ofi_providers_are_listed_with_their_specs_or_how_to_build_them() {
        let lines = super::ofi_lines().join("\n");
        if cfg!(feature = "ofi") {
            assert!(lines.contains("libfabric tcp;ofi_rxm domain") && lines.contains("ofi:tcp:"), "{lines}");
        } else {
            assert!(lines.contains("--features ofi"), "{lines}");
        }
    }

    #[test]
    fn lists_loopback() {
        let ifs = super::interfaces().unwrap();
        assert!(ifs.iter().any(|i| i.loopback && i.addresses.iter().any(|a| a == "127.0.0.1")));
    }
}
