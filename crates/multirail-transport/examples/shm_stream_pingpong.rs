//! The floor of the `shm` rail's byte stream, below the protocol: two
//! threads of this process ping-pong a 56-byte record (a 48-byte frame
//! header and an 8-byte payload, written as two slices like the rail
//! writes a small frame) through a [`ShmStream`] pair, spinning on `read`.
//! Prints the one-way time (round trip / 2) of each of 5 rounds.
//!
//! ```text
//! cargo run --release -p multirail-transport --example shm_stream_pingpong [ITERATIONS]
//! ```
//!
//! Set beside `bench/shm-floor.c` (one cache line each way, no ring) and
//! `multirail bench latency --rails shm --sizes 8` (the whole stack) it
//! tells what the ring and stream cost and what the layers above them do
//! (docs/benchmarks.md, thirty-fifth session). Bounded: ITERATIONS
//! (default 200 000) per round, and a read that waits 10 s fails.

use multirail_transport::shm::ShmStream;
use std::io::IoSlice;
use std::time::{Duration, Instant};

/// Longest a read waits for the other thread.
const STUCK: Duration = Duration::from_secs(10);
/// Round trips before the timed ones.
const WARMUP: usize = 1000;

fn read_exact(s: &mut ShmStream, buf: &mut [u8]) {
    let (mut got, since) = (0, Instant::now());
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => panic!("the other thread closed its stream"),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(since.elapsed() < STUCK, "no record from the other thread for {STUCK:?}");
                std::hint::spin_loop()
            }
            Err(e) => panic!("read: {e}"),
        }
    }
}

fn write_all(s: &mut ShmStream, header: &[u8], payload: &[u8]) {
    let n = s.write_vectored(&[IoSlice::new(header), IoSlice::new(payload)]).expect("write");
    assert_eq!(n, header.len() + payload.len(), "a 56-byte record fits the ring whole");
}

fn main() {
    let iters: usize = std::env::args().nth(1).map(|a| a.parse().expect("ITERATIONS: a number")).unwrap_or(200_000);
    for round in 0..5 {
        let (mut a, mut b) = ShmStream::pair(1 << 22).expect("a shm stream pair");
        let echo = std::thread::spawn(move || {
            let mut buf = [0u8; 56];
            for _ in 0..iters + WARMUP {
                read_exact(&mut b, &mut buf);
                write_all(&mut b, &buf[..48], &buf[48..]);
            }
        });
        let (header, payload, mut buf) = ([1u8; 48], [2u8; 8], [0u8; 56]);
        let mut start = Instant::now();
        for i in 0..iters + WARMUP {
            if i == WARMUP {
                start = Instant::now();
            }
            write_all(&mut a, &header, &payload);
            read_exact(&mut a, &mut buf);
            assert_eq!(buf[..48], header, "the record came back unchanged");
        }
        let one_way = start.elapsed().as_secs_f64() * 1e6 / iters as f64 / 2.0;
        echo.join().expect("the echo thread");
        println!("round {round}: one-way {one_way:.3} us");
    }
}
