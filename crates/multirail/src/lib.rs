//! # multirail — several network links as one message channel
//!
//! Two or more processes exchange tagged messages over several rails
//! (TCP connections over different interfaces or addresses, shared memory
//! between ranks of one host) at once:
//! small messages keep one rail's latency, large ones are split across all
//! rails in proportion to what each delivers, everything arrives in order,
//! and a rail that dies is routed around.
//!
//! ```no_run
//! use multirail::Endpoint;
//! // Rank and size from MULTIRAIL_RANK/SIZE/ROOT or mpirun/srun.
//! let ep = Endpoint::from_env()?;
//! if ep.rank() == 0 {
//!     ep.send(1, 7, b"hello")?;
//! } else {
//!     let mut buf = [0u8; 64];
//!     let st = ep.recv(Some(0), Some(7), &mut buf)?;
//!     assert_eq!(&buf[..st.len as usize], b"hello");
//! }
//! # Ok::<(), multirail::Error>(())
//! ```
//!
//! Layers: [`multirail_proto`] (the sans-IO protocol core) and
//! [`multirail_transport`] (rails) below; this crate owns sockets, threads
//! and the clock: configuration ([`Config`], `MULTIRAIL_*` variables),
//! bootstrap (ranks meeting), the progress engines ([`Progress`]) and the
//! [`Endpoint`] API.

#![forbid(unsafe_code)]

mod bootstrap;
mod config;
mod connections;
pub mod cpus;
mod endpoint;
mod engine;
mod error;
pub mod group;
mod hosts;
mod launch;
mod ofi_setup;
mod shared;
mod shm_setup;

pub use bytes::{Bytes, BytesMut};
pub use config::{
    Config, DEFAULT_RAILS, DEFAULT_SPIN_US, EAGER_ABOVE_UNEXPECTED, OFI_RMA_MIN, OfiRma, Progress, parse_job,
    parse_switch,
};
pub use endpoint::{Builder, Detached, Endpoint, Finished, RESERVED_TAGS, RecvRequest, Request, SendRequest};
pub use error::Error;
pub use group::{Delivery, Group, GroupError, GroupEvent, GroupOptions};
pub use hosts::ShmMode;
pub use launch::{JobInfo, free_root_port};
pub use multirail_proto::core::{RailStats, Status};
pub use multirail_proto::sched::{PolicyKind, PolicyTable};
pub use multirail_transport::fault::FaultConfig;

/// Generates a random job key (hex), for launchers that pass it to ranks.
pub fn generate_key() -> String {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("OS random number generator");
    b.iter().map(|x| format!("{x:02x}")).collect()
}
