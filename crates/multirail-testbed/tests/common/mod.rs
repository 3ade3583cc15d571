//! Shared helpers of the testbed integration tests.
//!
//! Every test that needs root, `ip`, `tc` or the tbf qdisc calls
//! [`up_or_skip`] (or [`env_or_skip`]), which prints why and returns `None`
//! when the machine cannot host a testbed. Each test uses its own prefix
//! ([`unique_prefix`]), so tests run in parallel and never touch other
//! testbeds, and holds a [`Testbed`] guard that calls `down` when dropped,
//! also when the test panics.

#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use multirail_testbed::{Prefix, Spec, Status, check_environment, down, host_command, up};

/// A prefix no other test (in this or any other process) uses:
/// `mrt{pid in hex}_{n}`, at most 12 characters. `MULTIRAIL_TEST_PREFIX`
/// replaces `mrt` (a short lowercase word, e.g. `bz`) where a machine's
/// testbed names are shared out among several users.
pub fn unique_prefix() -> Prefix {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let stem = std::env::var("MULTIRAIL_TEST_PREFIX").unwrap_or_else(|_| "mrt".into());
    Prefix::new(&format!("{stem}{:x}_{n}", std::process::id())).expect("pid and counter make a valid prefix")
}

/// A running testbed that is torn down when dropped.
pub struct Testbed {
    pub prefix: Prefix,
    pub status: Status,
}

impl Drop for Testbed {
    fn drop(&mut self) {
        if let Err(e) = down(&self.prefix) {
            eprintln!("cleanup of testbed {} failed: {e}", self.prefix);
        }
    }
}

/// True if this machine can host testbeds; otherwise prints why `test` is
/// skipped.
pub fn env_or_skip(test: &str) -> bool {
    match check_environment() {
        Ok(()) => true,
        Err(e) => {
            eprintln!("skipping {test}: {e}");
            false
        }
    }
}

/// Brings up `spec` under a fresh prefix, or prints why `test` is skipped
/// and returns `None` (no root, no iproute2, no tbf).
pub fn up_or_skip(test: &str, spec: Spec) -> Option<Testbed> {
    if !env_or_skip(test) {
        return None;
    }
    let spec = Spec { prefix: unique_prefix(), ..spec };
    match up(&spec) {
        Ok(status) => Some(Testbed { prefix: spec.prefix, status }),
        Err(e) if e.is_environment() => {
            eprintln!("skipping {test}: {e}");
            None
        }
        Err(e) => panic!("up({spec:?}) failed: {e}"),
    }
}

/// True if `program` is on `PATH` (or in an sbin directory).
pub fn have(program: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).chain(["/usr/sbin", "/sbin"].map(PathBuf::from)).any(|dir| dir.join(program).is_file())
}

/// Kills and reaps the child when dropped, so no server outlives its test.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits up to `limit` for the child to exit.
pub fn wait_with_timeout(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Runs `argv` in `host` and returns its output (any exit status).
pub fn output_in<S: AsRef<OsStr>>(prefix: &Prefix, host: usize, argv: &[S]) -> Output {
    let mut command = host_command(prefix, host, argv).expect("host exists");
    command.stdin(Stdio::null()).output().expect("ip netns exec runs")
}

/// Names of all network namespaces.
pub fn netns_names() -> Vec<String> {
    json_names(&["-j", "netns", "list"], "name")
}

/// Names of all links in the root namespace.
pub fn root_links() -> Vec<String> {
    json_names(&["-j", "link", "show"], "ifname")
}

fn json_names(args: &[&str], key: &str) -> Vec<String> {
    let out = Command::new("ip").args(args).output().expect("ip runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let text = if text.trim().is_empty() { "[]" } else { text.trim() };
    let value: serde_json::Value = serde_json::from_str(text).expect("ip -j prints JSON");
    let entries = value.as_array().cloned().unwrap_or_default();
    entries.iter().filter_map(|e| e[key].as_str().map(str::to_owned)).collect()
}

/// `tc qdisc show` of the root namespace, one line per qdisc.
pub fn root_qdiscs() -> Vec<String> {
    let out = Command::new("tc").args(["qdisc", "show"]).output().expect("tc runs");
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}

/// Asserts that nothing of `prefix` exists: no namespace, no root link.
pub fn assert_gone(prefix: &Prefix) {
    let dash = format!("{prefix}-");
    let netns: Vec<_> = netns_names().into_iter().filter(|n| n.starts_with(&dash)).collect();
    assert!(netns.is_empty(), "namespaces left behind: {netns:?}");
    let links: Vec<_> = root_links().into_iter().filter(|n| n.starts_with(&dash)).collect();
    assert!(links.is_empty(), "root links left behind: {links:?}");
}

/// A tiny TCP server and client in Python, used to probe connectivity.
///
/// `server PORT`: accepts connections for 30 s at most, answers each with
/// the local address it was reached on; prints `ready` once listening.
/// `client PORT DEV ADDR...`: for each address, connects (bound to `DEV`
/// unless `-`, with a 2 s timeout) and prints `ok ADDR LOCAL` or
/// `fail ADDR ERROR`.
const PROBE: &str = r#"
import socket, sys, time
mode, port = sys.argv[1], int(sys.argv[2])
if mode == "server":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(64)
    print("ready", flush=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        s.settimeout(max(0.1, deadline - time.time()))
        try:
            c, _ = s.accept()
        except OSError:
            break
        c.sendall(c.getsockname()[0].encode())
        c.close()
else:
    dev = sys.argv[3]
    for addr in sys.argv[4:]:
        c = socket.socket()
        c.settimeout(2)
        if dev != "-":
            c.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, dev.encode())
        try:
            c.connect((addr, port))
            print("ok", addr, c.recv(64).decode(), flush=True)
        except OSError as e:
            print("fail", addr, type(e).__name__, flush=True)
        c.close()
"#;

/// Port the probe server listens on (each testbed has its own namespaces).
pub const PROBE_PORT: &str = "5399";

/// Starts the probe server in `host` and waits until it listens.
pub fn start_probe_server(prefix: &Prefix, host: usize) -> ChildGuard {
    let argv = ["timeout", "40", "python3", "-c", PROBE, "server", PROBE_PORT];
    let mut command = host_command(prefix, host, &argv).expect("host exists");
    command.stdin(Stdio::null()).stdout(Stdio::piped());
    let mut guard = ChildGuard(command.spawn().expect("python3 starts"));
    let stdout = guard.0.stdout.take().expect("stdout is piped");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("read server output");
    assert_eq!(line.trim(), "ready", "probe server did not start");
    guard
}

/// Result of one probe connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Probe {
    /// Connected; the server saw this local address.
    Ok(String),
    /// Failed with this Python exception name.
    Fail(String),
}

/// Connects from `host` to each of `addrs`, bound to `dev` if given.
pub fn probe(prefix: &Prefix, host: usize, dev: Option<&str>, addrs: &[String]) -> Vec<Probe> {
    let mut argv = vec!["timeout", "30", "python3", "-c", PROBE, "client", PROBE_PORT, dev.unwrap_or("-")];
    argv.extend(addrs.iter().map(String::as_str));
    let out = output_in(prefix, host, &argv);
    assert!(out.status.success(), "probe client failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["ok", _, local] => Probe::Ok((*local).to_owned()),
                ["fail", _, error] => Probe::Fail((*error).to_owned()),
                _ => panic!("unexpected probe output {line:?}"),
            }
        })
        .collect()
}
