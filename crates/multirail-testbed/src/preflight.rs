//! Checks that the machine can host a testbed, before anything is created.
//!
//! Creating namespaces needs CAP_SYS_ADMIN (`ip netns add` mounts), links
//! and qdiscs need CAP_NET_ADMIN. The check reads the effective capability
//! set from `/proc/self/status` rather than comparing the uid with 0, so it
//! is right for capability-only setups and for root without capabilities
//! (containers). Whether the kernel has `tbf` shows only when the first
//! qdisc is added; `up` maps that failure to [`Error::TbfUnavailable`].

use crate::cmd::Tool;
use crate::error::{Error, Result};

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;

/// Runs every check `up`, `down`, `status` and `exec` need: privileges, then
/// `ip` and `tc`.
pub fn check() -> Result<()> {
    check_privileges()?;
    Tool::Ip.path()?;
    Tool::Tc.path()?;
    Ok(())
}

/// Fails with [`Error::NotRoot`] unless this process holds CAP_NET_ADMIN and
/// CAP_SYS_ADMIN.
pub fn check_privileges() -> Result<()> {
    // If /proc is unreadable the capability set is unknown; treat it as
    // empty, which gives the honest "needs root" message.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    privileges_from_status(&status)
}

/// The decision of [`check_privileges`] for a given `/proc/self/status` text.
pub fn privileges_from_status(status: &str) -> Result<()> {
    let caps = effective_caps(status).unwrap_or(0);
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    if has(CAP_NET_ADMIN) && has(CAP_SYS_ADMIN) { Ok(()) } else { Err(Error::NotRoot) }
}

/// The `CapEff:` bit mask of a `/proc/<pid>/status` text.
fn effective_caps(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(line.trim(), 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: &str = "Name:\tcat\nUid:\t0\t0\t0\t0\nCapEff:\t000001ffffffffff\n";
    const NOBODY: &str = "Name:\tcat\nUid:\t65534\t65534\t65534\t65534\nCapEff:\t0000000000000000\n";
    const NET_ADMIN_ONLY: &str = "CapEff:\t0000000000001000\n";

    #[test]
    fn root_passes() {
        assert!(privileges_from_status(ROOT).is_ok());
    }

    #[test]
    fn unprivileged_gets_a_clear_message() {
        let err = privileges_from_status(NOBODY).unwrap_err();
        assert!(matches!(err, Error::NotRoot));
        let text = err.to_string();
        assert!(text.starts_with("testbed needs root (CAP_NET_ADMIN"), "{text}");
        assert!(text.ends_with("run with sudo"), "{text}");
    }

    #[test]
    fn net_admin_alone_is_not_enough_for_namespaces() {
        assert!(privileges_from_status(NET_ADMIN_ONLY).is_err());
        assert!(privileges_from_status("no caps line").is_err());
    }
}
