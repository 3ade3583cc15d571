//! Helpers shared by the integration tests that run whole jobs.

use std::io::Read;
use std::process::{Child, Output};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Waits for `child` (stdout and stderr piped) at most `limit`, calling
/// `sample` every 50 ms meanwhile. A child still running then is killed
/// and the test fails, saying what hung and what it printed on stderr.
/// The pipes are drained on threads, so a chatty child cannot block, and
/// read for at most 20 s after the end: a grandchild still holding them
/// (a stopped rank, a lingering daemon) cannot block this either.
pub fn wait_bounded(mut child: Child, limit: Duration, what: &str, mut sample: impl FnMut()) -> Output {
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout piped")));
    let err = drain(Box::new(child.stderr.take().expect("stderr piped")));
    let take = |h: JoinHandle<Vec<u8>>| {
        let t = Instant::now() + Duration::from_secs(20);
        while !h.is_finished() && Instant::now() < t {
            std::thread::sleep(Duration::from_millis(20));
        }
        if h.is_finished() { h.join().unwrap_or_default() } else { Vec::new() }
    };
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for the child") {
            break st;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            let e = String::from_utf8_lossy(&take(err)).into_owned();
            panic!("{what}: still running after {limit:?}, killed (a hang); stderr:\n{e}");
        }
        sample();
        std::thread::sleep(Duration::from_millis(50));
    };
    Output { status, stdout: take(out), stderr: take(err) }
}
