//! Helpers for end-to-end tests: a job of N ranks as threads of this
//! process, over real TCP loopback rails.
#![allow(dead_code)]

use std::net::TcpListener;
use std::time::Duration;

use multirail::{Builder, Config, Endpoint, Progress, ShmMode};

#[allow(unused_imports)]
pub use multirail_proto::sim::pattern;

mod cpu;
#[allow(unused_imports)]
pub use cpu::cpu_secs;

pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `n` loopback rails: 127.0.0.1, 127.0.0.2, ...
pub fn rails(n: usize) -> String {
    (1..=n).map(|i| format!("tcp:127.0.0.{i}")).collect::<Vec<_>>().join(",")
}

/// `nrails` loopback TCP rails between every pair: the ranks are threads
/// of one process, on one host, so automatic shared memory is off.
pub fn config(nrails: usize, progress: Progress) -> Config {
    Config {
        rails: multirail_transport::RailSpec::parse_list(&rails(nrails)).unwrap(),
        shm: ShmMode::Off,
        progress,
        key: Some(b"test-key".to_vec()),
        setup_timeout: Duration::from_secs(20),
        ..Config::default()
    }
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

/// Resident memory of this process in bytes (`/proc/self/statm`, second
/// field, in pages; the page size comes from `/proc/self/smaps`).
pub fn rss_bytes() -> u64 {
    static PAGE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let page = *PAGE.get_or_init(|| {
        std::fs::read_to_string("/proc/self/smaps")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("KernelPageSize:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .map_or(4096, |kb| kb * 1024)
    });
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("resident pages in statm");
    pages * page
}

pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}
