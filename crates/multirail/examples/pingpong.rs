//! A minimal two-rank program: ping-pong latency and windowed bandwidth.
//!
//! Run two processes (here both on this machine, over two loopback rails):
//! ```text
//! MULTIRAIL_RANK=0 MULTIRAIL_SIZE=2 MULTIRAIL_ROOT=127.0.0.1:7000 cargo run --release --example pingpong &
//! MULTIRAIL_RANK=1 MULTIRAIL_SIZE=2 MULTIRAIL_ROOT=127.0.0.1:7000 cargo run --release --example pingpong
//! ```
//! `multirail bench` does this properly; this file shows the API.

use std::time::Instant;

use multirail::{Bytes, BytesMut, Endpoint};

fn main() -> Result<(), multirail::Error> {
    let ep = Endpoint::from_env()?;
    let peer = 1 - ep.rank();
    // Latency: 8-byte ping-pong.
    let iters = 10_000;
    let mut buf = [0u8; 8];
    ep.barrier()?;
    let t = Instant::now();
    for _ in 0..iters {
        if ep.rank() == 0 {
            ep.send(peer, 1, &buf)?;
            ep.recv(Some(peer), Some(1), &mut buf)?;
        } else {
            ep.recv(Some(peer), Some(1), &mut buf)?;
            ep.send(peer, 1, &buf)?;
        }
    }
    if ep.rank() == 0 {
        println!("8 B latency: {:.2} us", t.elapsed().as_secs_f64() * 1e6 / iters as f64 / 2.0);
    }
    // Bandwidth: windows of 64 messages of 1 MiB and 4 MiB.
    for size in [1usize << 20, 4 << 20] {
        let data = Bytes::from(vec![7u8; size]);
        // Receive buffers are allocated once and reused, as MPI codes do.
        let mut bufs: Vec<BytesMut> = (0..64).map(|_| BytesMut::zeroed(size)).collect();
        let windows = 10;
        ep.barrier()?;
        let t = Instant::now();
        for _ in 0..windows {
            if ep.rank() == 0 {
                let reqs: Vec<_> =
                    (0..64).map(|_| ep.isend(peer, 2, data.clone()).map(Into::into)).collect::<Result<_, _>>()?;
                for r in ep.wait_all(reqs) {
                    r?;
                }
                ep.recv(Some(peer), Some(3), &mut [0u8; 4])?;
            } else {
                let reqs: Vec<_> = bufs
                    .drain(..)
                    .map(|b| ep.irecv(Some(peer), Some(2), b).map(Into::into))
                    .collect::<Result<_, _>>()?;
                for r in ep.wait_all(reqs) {
                    if let multirail::Finished::Received(b, _) = r? {
                        bufs.push(b);
                    }
                }
                ep.send(peer, 3, &[0u8; 4])?;
            }
        }
        if ep.rank() == 0 {
            let mbs = (windows * 64 * size) as f64 / t.elapsed().as_secs_f64() / 1e6;
            println!("{} MiB bandwidth: {mbs:.0} MB/s", size >> 20);
        }
    }
    ep.close()
}
