//! How much CPU a rank uses while it waits: rank 1 waits in `recv` for a
//! message rank 0 sends after `IDLE_SECS` (default 10) seconds, then both
//! print the CPU time their process used meanwhile (user + system, from
//! /proc/self/stat) as a share of one core.
//!
//! ```text
//! cargo build --release --example idle_wait
//! MULTIRAIL_RAILS=shm multirail run -n 2 -- target/release/examples/idle_wait
//! ```

use std::time::{Duration, Instant};

use multirail::Endpoint;

#[path = "../tests/common/cpu.rs"]
mod cpu;
use cpu::cpu_secs;

fn main() -> Result<(), multirail::Error> {
    let secs: u64 = std::env::var("IDLE_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let ep = Endpoint::from_env()?;
    let mut buf = [0u8; 8];
    // Warm the rails up first (connections are opened on first use).
    if ep.rank() == 0 {
        ep.send(1, 0, &buf)?;
    } else {
        ep.recv(Some(0), Some(0), &mut buf)?;
    }
    let (t, c) = (Instant::now(), cpu_secs());
    if ep.rank() == 0 {
        std::thread::sleep(Duration::from_secs(secs));
        ep.send(1, 1, &buf)?;
    } else {
        ep.recv(Some(0), Some(1), &mut buf)?;
    }
    let (wall, cpu) = (t.elapsed().as_secs_f64(), cpu_secs() - c);
    let what = if ep.rank() == 0 { "slept" } else { "waited in recv" };
    println!("rank {}: {what} {wall:.1} s, CPU {cpu:.2} s = {:.1}% of a core", ep.rank(), 100.0 * cpu / wall);
    ep.close()
}
