//! # multirail-proto — the sans-IO protocol core
//!
//! This crate is the bottom layer of multirail. It holds everything about
//! the protocol that can be decided without touching the operating system:
//!
//! * [`wire`]: the byte formats (HELLO, frame header, ACK payload) as
//!   parse/emit pairs that never panic on any input;
//! * [`handshake`]: the authenticated rail handshake as typed states;
//! * [`sched`]: the rail schedulers (single, round-robin, stripe, weighted,
//!   adaptive) and the size-tiered policy table;
//! * [`core`]: the per-endpoint state machine: message sequencing, tag
//!   matching in MPI non-overtaking order, eager and rendezvous protocols,
//!   reassembly by offset, acknowledgements, flow control and rail failover.
//!
//! It does no IO: no sockets, no threads, no clock reads, no OS randomness.
//! Time and bytes come in as arguments; frames to send and events come out.
//! That makes every protocol behaviour testable deterministically with
//! simulated rails and a virtual clock (see `tests/`).

#![forbid(unsafe_code)]

pub mod core;
pub mod handshake;
pub mod sched;
pub mod sim;
pub mod time;
pub mod units;
pub mod wire;

pub use time::Time;
