//! `down`: removes every object of a prefix, found by name.
//!
//! For each namespace of the prefix (`{prefix}-host{i}`, `{prefix}-sw`): stop
//! the processes still running in it (a process would keep the namespace,
//! and with it the veths, alive after its name is gone), then delete it; the
//! kernel removes the interfaces and qdiscs inside with it. Then delete veth
//! and bridge links called `{prefix}-...` in the root namespace. `up` never
//! creates those, but older tools or hand-made experiments may have.
//!
//! Nothing is read from a state file, so `down` works after a crash, and a
//! second `down` finds nothing and succeeds.

use std::fmt;
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cmd::{self, Tool};
use crate::error::{Error, Result};
use crate::names::Prefix;
use crate::preflight;
use crate::system;

/// How long processes get to exit after SIGTERM, then after SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// What [`down`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DownReport {
    /// The prefix.
    pub prefix: String,
    /// Namespaces deleted.
    pub netns: Vec<String>,
    /// Root-namespace links deleted.
    pub links: Vec<String>,
    /// Processes that were still running inside the testbed and were stopped.
    pub stopped_pids: Vec<u32>,
}

impl DownReport {
    /// True if there was nothing to remove.
    pub fn is_empty(&self) -> bool {
        self.netns.is_empty() && self.links.is_empty()
    }
}

impl fmt::Display for DownReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return write!(f, "no testbed with prefix {}: nothing to remove", self.prefix);
        }
        write!(f, "removed testbed {}: namespaces {}", self.prefix, list_or_none(&self.netns))?;
        if !self.links.is_empty() {
            write!(f, "; root links {}", self.links.join(", "))?;
        }
        if !self.stopped_pids.is_empty() {
            write!(f, "; stopped {} process(es)", self.stopped_pids.len())?;
        }
        Ok(())
    }
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() { "none".into() } else { items.join(", ") }
}

/// Removes testbed `prefix`. Idempotent: succeeds with an empty report when
/// nothing exists.
pub fn down(prefix: &Prefix) -> Result<DownReport> {
    preflight::check()?;
    let mut report = DownReport { prefix: prefix.to_string(), ..DownReport::default() };
    for (name, _) in system::testbed_netns(prefix)? {
        report.stopped_pids.extend(stop_processes(&name)?);
        ignore_missing(cmd::ip(None, &["netns", "delete", &name]))?;
        report.netns.push(name);
    }
    for ifname in root_leftovers(prefix)? {
        ignore_missing(cmd::ip(None, &["link", "delete", "dev", &ifname]))?;
        report.links.push(ifname);
    }
    Ok(report)
}

/// Veth and bridge links called `{prefix}-...` in the root namespace.
pub(crate) fn root_leftovers(prefix: &Prefix) -> Result<Vec<String>> {
    Ok(system::links(None)?
        .into_iter()
        .filter(|link| prefix.owns_ifname(&link.ifname))
        .filter(|link| matches!(link.kind(), Some("veth" | "bridge")))
        .map(|link| link.ifname)
        .collect())
}

/// A concurrent `down` may have removed the object first; that is success.
fn ignore_missing(result: Result<String>) -> Result<()> {
    match result {
        Err(Error::CommandFailed { stderr, .. })
            if stderr.contains("No such file") || stderr.contains("Cannot find device") =>
        {
            Ok(())
        }
        other => other.map(drop),
    }
}

/// Stops every process in `netns`: SIGTERM, then SIGKILL for those still
/// there after [`STOP_GRACE`]. Returns the pids found.
fn stop_processes(netns: &str) -> Result<Vec<u32>> {
    let pids = netns_pids(netns)?;
    if pids.is_empty() {
        return Ok(pids);
    }
    for signal in ["-TERM", "-KILL"] {
        let left = netns_pids(netns)?;
        if left.is_empty() {
            break;
        }
        signal_pids(signal, &left)?;
        wait_until_empty(netns, STOP_GRACE)?;
    }
    Ok(pids)
}

fn netns_pids(netns: &str) -> Result<Vec<u32>> {
    let out = ignore_missing_text(cmd::ip(None, &["netns", "pids", netns]))?;
    Ok(out.split_whitespace().filter_map(|p| p.parse().ok()).collect())
}

fn ignore_missing_text(result: Result<String>) -> Result<String> {
    match result {
        Err(Error::CommandFailed { stderr, .. }) if stderr.contains("No such file") => Ok(String::new()),
        other => other,
    }
}

/// `kill SIGNAL PID...`. A process may exit between listing and signalling,
/// so a failing `kill` is not an error; what matters is checked afterwards.
fn signal_pids(signal: &str, pids: &[u32]) -> Result<()> {
    let mut kill = Tool::Kill.command()?;
    kill.arg(signal).args(pids.iter().map(u32::to_string));
    let _ = cmd::run(&mut kill);
    Ok(())
}

fn wait_until_empty(netns: &str, grace: Duration) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < grace {
        if netns_pids(netns)?.is_empty() {
            return Ok(());
        }
        sleep(Duration::from_millis(20));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_messages() {
        let empty = DownReport { prefix: "mr".into(), ..DownReport::default() };
        assert!(empty.is_empty());
        assert_eq!(empty.to_string(), "no testbed with prefix mr: nothing to remove");
        let full = DownReport {
            prefix: "mr".into(),
            netns: vec!["mr-host0".into(), "mr-host1".into()],
            links: vec![],
            stopped_pids: vec![42],
        };
        assert_eq!(full.to_string(), "removed testbed mr: namespaces mr-host0, mr-host1; stopped 1 process(es)");
    }

    #[test]
    fn missing_objects_are_not_errors() {
        let gone =
            |stderr: &str| Err(Error::CommandFailed { command: "ip".into(), code: Some(1), stderr: stderr.into() });
        assert!(
            ignore_missing(gone("Cannot remove namespace file \"/run/netns/mr-host0\": No such file or directory"))
                .is_ok()
        );
        assert!(ignore_missing(gone("Cannot find device \"mr-x\"")).is_ok());
        assert!(ignore_missing(gone("RTNETLINK answers: Operation not permitted")).is_err());
    }
}
