//! Working with one host of a running testbed: run commands in it, look up
//! its rail addresses, take a rail down and up again.
//!
//! Hosts are addressed by prefix and index; every function first checks
//! that the host's namespace exists, so a typo gives
//! [`Error::NoSuchHost`] instead of an `ip` message.

use std::ffi::{OsStr, OsString};
use std::net::Ipv4Addr;
use std::process::{Command, ExitStatus};

use crate::cmd;
use crate::error::{Error, Result};
use crate::names::{Prefix, rail_ifname};
use crate::preflight;
use crate::status::read_host;
use crate::system;

/// The full argument vector that runs `argv` inside `host`:
/// `["/usr/sbin/ip", "netns", "exec", "{prefix}-host{i}", argv...]`.
///
/// For CPU pinning, either put the pinning tool in `argv`
/// (`["taskset", "-c", "1", "iperf3", ...]`, pins the command only) or
/// prepend it to the result (pins `ip` too, which then execs the command).
pub fn host_argv<S: AsRef<OsStr>>(prefix: &Prefix, host: usize, argv: &[S]) -> Result<Vec<OsString>> {
    if argv.is_empty() {
        return Err(Error::EmptyCommand);
    }
    let netns = existing_host(prefix, host)?;
    cmd::netns_exec_argv(&netns, argv)
}

/// A [`Command`] that runs `argv` inside `host`, ready to configure (stdio,
/// environment) and spawn. The environment is inherited, as with
/// `ip netns exec`.
pub fn host_command<S: AsRef<OsStr>>(prefix: &Prefix, host: usize, argv: &[S]) -> Result<Command> {
    let full = host_argv(prefix, host, argv)?;
    // `full` starts with the path of `ip`, so index 0 exists.
    let mut command = Command::new(&full[0]);
    command.args(&full[1..]);
    Ok(command)
}

/// Runs `argv` inside `host` with inherited stdio and waits for it. Its exit
/// status is returned as is; a command that cannot be found inside the host
/// exits with 255 (`ip netns exec` reports it on stderr).
pub fn run_in_host<S: AsRef<OsStr>>(prefix: &Prefix, host: usize, argv: &[S]) -> Result<ExitStatus> {
    let mut command = host_command(prefix, host, argv)?;
    let rendered = cmd::render(&command);
    command.status().map_err(|source| Error::Spawn { command: rendered, source })
}

/// The IPv4 address of `host` on `rail`, read from the system.
pub fn host_rail_addr(prefix: &Prefix, host: usize, rail: usize) -> Result<Ipv4Addr> {
    existing_host(prefix, host)?;
    let status = read_host(prefix, host)?;
    status.rail(rail).and_then(|r| r.addr).ok_or_else(|| no_rail(prefix, host, rail))
}

/// The IPv4 addresses of `host` on all its rails, in rail order (index `r`
/// is the address on `rail{r}`). Fails if a rail in the middle is missing or
/// has no address.
pub fn host_rail_addrs(prefix: &Prefix, host: usize) -> Result<Vec<Ipv4Addr>> {
    existing_host(prefix, host)?;
    let status = read_host(prefix, host)?;
    (0..status.rails.last().map_or(0, |r| r.rail + 1))
        .map(|rail| status.rail(rail).and_then(|r| r.addr).ok_or_else(|| no_rail(prefix, host, rail)))
        .collect()
}

/// Takes `rail{rail}` of `host` administratively down (`up == false`) or
/// brings it back up, like unplugging and replugging a cable at that host.
/// Address and shaping stay configured, so bringing it up restores the rail
/// exactly.
pub fn set_rail_up(prefix: &Prefix, host: usize, rail: usize, up: bool) -> Result<()> {
    let netns = existing_host(prefix, host)?;
    let ifname = rail_ifname(rail);
    let state = if up { "up" } else { "down" };
    match cmd::ip(Some(&netns), &["link", "set", "dev", &ifname, state]) {
        Err(Error::CommandFailed { stderr, .. }) if stderr.contains("Cannot find device") => {
            Err(no_rail(prefix, host, rail))
        }
        other => other.map(drop),
    }
}

/// Checks privileges, tools and that the host's namespace exists; returns
/// its name.
fn existing_host(prefix: &Prefix, host: usize) -> Result<String> {
    preflight::check()?;
    let netns = prefix.host_netns(host);
    if system::list_netns()?.contains(&netns) {
        Ok(netns)
    } else {
        Err(Error::NoSuchHost { prefix: prefix.to_string(), host, netns })
    }
}

fn no_rail(prefix: &Prefix, host: usize, rail: usize) -> Error {
    Error::NoSuchRail { prefix: prefix.to_string(), host, rail }
}
