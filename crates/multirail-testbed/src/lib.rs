//! Emulated multi-rail cluster on one Linux box.
//!
//! This crate is the layer under `multirail testbed up|down|status|exec` and
//! `bench --testbed`: it turns one machine into N hosts joined by R shaped
//! links ("rails"), so dual-rail against single-fast-rail experiments run
//! without a cluster. It drives `ip` and `tc` (iproute2); it needs root and
//! the kernel's `tbf` qdisc, and says exactly which is missing if not.
//!
//! # What `up` builds
//!
//! * Host `i` is the network namespace `{prefix}-host{i}` (default prefix
//!   `mr`), with loopback up and interfaces named exactly `rail0` ..
//!   `rail{R-1}`.
//! * Rail `r` is its own subnet: `10.77.r.0/24`, host `i` is `10.77.r.(i+1)`
//!   (base configurable, see [`Addressing`]). Hosts answer ARP only on the
//!   rail that owns the address, so the rails are separate links.
//! * Two hosts: one veth pair per rail, host to host. More hosts: one bridge
//!   per rail (`br-rail{r}`) in the namespace `{prefix}-sw`, a veth from
//!   every host to it. Nothing is created in the root namespace.
//! * Every egress of a rail (both veth ends; with a switch, the switch ports
//!   too) gets a `tbf` at the rail's rate, so both directions are shaped. The
//!   burst and queue length are chosen so one TCP stream reaches the rate
//!   (see [`Shaping`] and `docs/testbed.md`).
//! * With [`Spec::bus`] (`testbed up --bus RATE`, the "multi-port" layout
//!   of the uDAPL NPC'09 study), each host also gets an `ifb` device `bus`
//!   shaped at that rate, and every rail's egress is redirected through it
//!   before the rail's own `tbf`: the rails of a host share one bus, like
//!   the ports of one NIC in one PCIe slot. Without it ("multi-HCA") each
//!   rail is its own link.
//!
//! # API
//!
//! Lifecycle, each discovering the testbed by name (no state file, so they
//! work after a crash):
//!
//! * [`up`]`(&Spec) -> Status`: all or nothing; fails with
//!   [`Error::AlreadyExists`] if the prefix is taken.
//! * [`down`]`(&Prefix) -> DownReport`: idempotent.
//! * [`status`]`(&Prefix) -> Option<Status>`: serde-serializable, `Display`
//!   is a table.
//!
//! Using a host:
//!
//! * [`host_command`] / [`host_argv`] / [`run_in_host`]: run a command inside
//!   a host (`ip netns exec`).
//! * [`host_rail_addr`] / [`host_rail_addrs`] (or [`Status::addr`] /
//!   [`Status::rail_addrs`]): a host's addresses in rail order, e.g. to build
//!   `MULTIRAIL_RAILS=tcp:10.77.0.1,tcp:10.77.1.1`.
//! * [`set_rail_up`]: take a rail down at one host and back up, for failover
//!   tests.
//!
//! Values: [`Spec`], [`Prefix`], [`Rate`] (tc syntax: `2gbit`), [`Shaping`],
//! [`Addressing`]; names in [`names`].
//!
//! ```no_run
//! use multirail_testbed::{Spec, Prefix, parse_rates, up, down, host_command};
//!
//! # fn main() -> Result<(), multirail_testbed::Error> {
//! let spec = Spec { rails: 2, rates: parse_rates("1gbit,3gbit")?, ..Spec::default() };
//! let status = up(&spec)?;
//! println!("{status}");
//! let rails = status.rail_addrs(1).expect("host1 has an address on every rail");
//! let server = host_command(&spec.prefix, 1, &["iperf3", "-s", "-1"])?.spawn();
//! # let _ = (rails, server);
//! down(&Prefix::default())?;
//! # Ok(()) }
//! ```
//!
//! # Errors
//!
//! One [`Error`] enum, by category: environment (no root, no `ip`/`tc`, no
//! tbf: [`Error::is_environment`]), bad input, wrong state, failed command.
//! Every failed command's error carries its command line and stderr.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod addr;
mod cmd;
mod down;
mod error;
mod host;
pub mod names;
mod preflight;
mod rate;
mod shaping;
mod spec;
mod status;
mod system;
mod up;

pub use addr::{Addressing, DEFAULT_SUBNET_BASE, Ipv4Net, MAX_HOSTS, MAX_RAILS, RAIL_PREFIX_LEN};
pub use down::{DownReport, down};
pub use error::{Error, Result};
pub use host::{host_argv, host_command, host_rail_addr, host_rail_addrs, run_in_host, set_rail_up};
pub use names::{DEFAULT_PREFIX, Prefix, parse_host};
pub use preflight::{check as check_environment, check_privileges, privileges_from_status};
pub use rate::{Rate, format_rates, parse_rates};
pub use shaping::{BURST_BASE_BYTES, BURST_JITTER_US, LATENCY_US, Shaping};
pub use spec::{DEFAULT_HOSTS, DEFAULT_RAILS, DEFAULT_RATE, MIN_RATE, Spec, Topology};
pub use status::{HostBusStatus, HostRailStatus, HostStatus, RailStatus, Status, status};
pub use up::up;
