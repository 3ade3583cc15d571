//! Setting up an `ofi` rail over its authenticated TCP connection.
//!
//! Like a `shm` rail, an `ofi:` rail is opened, accepted, authenticated
//! (HELLO with the job key), raced and replaced exactly like a TCP rail.
//! Once authenticated, both sides open an RDM endpoint of the rail's
//! libfabric provider, swap `fi_getname` addresses over that connection,
//! insert the peer's into the endpoint's address vector, post their
//! receives and say "ready" (see `multirail_transport::ofi`). The TCP
//! connection then stays open as the side channel: its end tells that the
//! peer is gone. A peer without the key never gets this far, so it never
//! learns the endpoint's address.

use std::net::TcpStream;

use multirail_transport::fault::FaultConfig;
use multirail_transport::spec::OfiTarget;
use multirail_transport::{Rail, RailCaps};

use crate::Config;

/// The rail over `ctl`, which has passed HELLO.
#[cfg(feature = "ofi")]
pub(crate) fn open(
    ctl: TcpStream,
    target: &OfiTarget,
    cfg: &Config,
    caps: RailCaps,
    fault: Option<FaultConfig>,
) -> Result<Box<dyn Rail>, String> {
    use multirail_transport::fault::FaultRail;
    use multirail_transport::ofi::OfiStream;
    use multirail_transport::tcp::StreamRail;

    let lend = cfg.ofi_rma.lend_min(&target.provider);
    let doorbell = crate::config::ofi_doorbell(cfg.ofi_doorbell, &target.provider, lend);
    // The peer passed HELLO, so it runs; what it does next, opening its
    // endpoint, took up to 9 s per rail with 64 ranks on this 2-core
    // machine (2026-11-29), so it gets the job setup's time, not HELLO's.
    let wait = cfg.handshake_timeout.max(cfg.setup_timeout);
    let connect = cfg.ofi_connect.unwrap_or(false);
    let stream = OfiStream::over_side_channel(target, ctl, wait, cfg.ofi_send, lend, doorbell, connect)?;
    tracing::debug!("{}: {}", caps.name, stream.describe());
    let rail = StreamRail::over(stream, caps, cfg.proto.limits);
    Ok(match fault {
        Some(f) => Box::new(FaultRail::new(rail, f)),
        None => Box::new(rail),
    })
}

/// Without the `ofi` feature, [`Config::validate`] refuses `ofi:` rails
/// before any connection; this is never reached.
#[cfg(not(feature = "ofi"))]
pub(crate) fn open(
    _ctl: TcpStream,
    target: &OfiTarget,
    _cfg: &Config,
    _caps: RailCaps,
    _fault: Option<FaultConfig>,
) -> Result<Box<dyn Rail>, String> {
    Err(format!("ofi:{}: built without the `ofi` feature", target.provider))
}
