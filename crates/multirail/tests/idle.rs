//! An idle rank does not burn a core (issue 10): a rank waiting in `recv`
//! for a message that comes seconds later spins briefly, then sleeps until
//! the message (or a timer) wakes it. Measured as the CPU time of the
//! whole process (both ranks, every thread) over the wait, for each rail
//! kind and progress engine, one configuration after the other (a
//! process-wide figure: nothing else may run in this test binary).
//!
//! The bound is loose on purpose: a waiter that never sleeps uses a whole
//! core (100 %), the measured figure is 2-5 % of a core on this project's
//! machines (`crates/multirail/examples/idle_wait.rs` measures one rank
//! alone, per process, for docs/benchmarks.md).

mod common;

use common::{cpu_secs, job};
use multirail::{Endpoint, Progress, ShmMode};
use std::time::{Duration, Instant};

/// How long rank 1 waits in `recv`.
const IDLE: Duration = Duration::from_secs(2);
/// Most of a core the two ranks may use together while rank 1 waits.
const MAX_SHARE: f64 = 0.25;

#[test]
fn a_rank_waiting_in_recv_sleeps_instead_of_spinning() {
    for (rails, shm) in [("shm", ShmMode::Auto), ("tcp:127.0.0.1", ShmMode::Off)] {
        for progress in [Progress::Polled, Progress::Threaded] {
            let shares = job(
                2,
                |_| Endpoint::builder().rails(rails).shm(shm).progress(progress).key("k"),
                |ep| {
                    let mut buf = [0u8; 8];
                    // Connections open on first use: open this one first.
                    if ep.rank() == 0 {
                        ep.send(1, 0, &buf).unwrap();
                    } else {
                        ep.recv(Some(0), Some(0), &mut buf).unwrap();
                    }
                    ep.barrier().unwrap();
                    let (t, c) = (Instant::now(), cpu_secs());
                    if ep.rank() == 0 {
                        std::thread::sleep(IDLE);
                        ep.send(1, 1, b"wake up!").unwrap();
                    } else {
                        let st = ep.recv(Some(0), Some(1), &mut buf).unwrap();
                        assert_eq!(&buf[..st.len as usize], b"wake up!");
                    }
                    let share = (cpu_secs() - c) / t.elapsed().as_secs_f64();
                    assert!(ep.rails_to(1 - ep.rank()).len() == 1, "one rail: {:?}", ep.rail_names());
                    assert_eq!(
                        ep.rail_names()[ep.rails_to(1 - ep.rank())[0]].split(':').next(),
                        rails.split(':').next()
                    );
                    ep.barrier().unwrap();
                    ep.close().unwrap();
                    share
                },
            );
            // Rank 1's window holds the whole wait and rank 0's sleep.
            let share = shares[1];
            eprintln!("{rails}, {progress:?}: the process used {:.1} % of a core while rank 1 waited", share * 100.0);
            assert!(
                share < MAX_SHARE,
                "{rails}, {progress:?}: {:.1} % of a core while rank 1 waited {IDLE:?} in recv (at most {:.0} %)",
                share * 100.0,
                MAX_SHARE * 100.0
            );
        }
    }
}
