//! Helpers for end-to-end tests: a job of N ranks as threads of this
//! process, over real TCP loopback rails (after multirail's own
//! `tests/common`).
#![allow(dead_code)]

use std::net::TcpListener;
use std::time::Duration;

use multirail::{Builder, Config, Endpoint, Progress, ShmMode};

/// `n` loopback rails: 127.0.0.1, 127.0.0.2, ...
pub fn rails(n: usize) -> String {
    (1..=n).map(|i| format!("tcp:127.0.0.{i}")).collect::<Vec<_>>().join(",")
}

/// A builder for `nrails` loopback TCP rails with a test key (the ranks
/// share a host: automatic shared memory is off).
pub fn builder(nrails: usize, progress: Progress) -> Builder {
    let c = Config {
        progress,
        shm: ShmMode::Off,
        key: Some(b"test-key".to_vec()),
        setup_timeout: Duration::from_secs(20),
        ..Default::default()
    };
    Builder::new(c).rails(&rails(nrails))
}

/// Runs `f(endpoint)` on `n` ranks (threads) and returns their results.
pub fn job<T: Send>(n: u32, make: impl Fn(u32) -> Builder + Sync, f: impl Fn(Endpoint) -> T + Sync) -> Vec<T> {
    let root = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = root.local_addr().unwrap();
    let mut root = Some(root);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let b = make(r).rank(r, n);
                let b = if r == 0 { b.root_listener(root.take().unwrap()) } else { b.root(addr) };
                let f = &f;
                s.spawn(move || f(b.build().expect("endpoint")))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank panicked")).collect()
    })
}
