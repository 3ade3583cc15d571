//! Two-host runs as a user starts them, with both processes on loopback:
//! `bench ... --server --port P` and `bench ... --connect 127.0.0.1:P`.
//! The server runs the client's test; settings that cannot be taken over
//! are refused on both sides naming both values; a rank with another rail
//! count hears why. Every run is bounded in time.

mod common;

use common::wait_bounded;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

fn multirail(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_multirail"));
    c.args(args)
        .env_remove("MULTIRAIL_RAILS")
        .env_remove("MULTIRAIL_LAUNCHED")
        .env_remove("MULTIRAIL_RANK")
        .env_remove("MULTIRAIL_ROOT")
        .env("MULTIRAIL_KEY", format!("two-hosts-{}", std::process::id()))
        .env("MULTIRAIL_SETUP_TIMEOUT", "30")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Runs a server and a client on a port that was free a moment ago. The
/// port can be taken in between (tests run in parallel): a server that
/// could not listen is started again on another port, a few times.
fn pair(server: &[&str], client: &[&str]) -> (Output, Output) {
    for _ in 0..5 {
        let port = std::net::TcpListener::bind("0.0.0.0:0").unwrap().local_addr().unwrap().port().to_string();
        let s = multirail(&[&["bench"], server, &["--server", "--port", &port]].concat()).spawn().unwrap();
        let addr = format!("127.0.0.1:{port}");
        let c = multirail(&[&["bench"], client, &["--connect", &addr]].concat()).spawn().unwrap();
        let c = wait_bounded(c, LIMIT, "client", || {});
        let s = wait_bounded(s, LIMIT, "server", || {});
        if String::from_utf8_lossy(&s.stderr).contains("Address already in use") {
            eprintln!("port {port} was taken meanwhile; again on another");
            continue;
        }
        return (s, c);
    }
    panic!("no free port for the server in 5 tries");
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn the_server_runs_the_clients_test_and_parameters() {
    let (s, c) = pair(&["latency", "--sizes", "8"], &["bw", "--sizes", "16", "--iterations", "3", "--warmup", "1"]);
    let (out, err) = (text(&s.stdout), text(&s.stderr));
    assert_eq!((s.status.code(), c.status.code()), (Some(0), Some(0)), "server: {err}\nclient: {}", text(&c.stderr));
    assert!(out.contains("Bandwidth Test") && !out.contains("Latency Test"), "the client's test: {out}");
    let sizes: Vec<&str> =
        out.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(sizes, ["16"], "the client's sizes: {out}");
    assert!(err.contains("running the client's test: `bw --sizes 16"), "the server says so: {err}");
}

#[test]
fn different_settings_are_refused_on_both_sides_naming_both_values() {
    let (s, c) = pair(&["bw", "--sizes", "8", "--policy", "*:stripe"], &["bw", "--sizes", "8", "--policy", "*:single"]);
    let why = "--policy: the client has *:single, this server *:stripe";
    let (serr, cerr) = (text(&s.stderr), text(&c.stderr));
    assert_eq!((s.status.code(), c.status.code()), (Some(2), Some(2)), "server: {serr}\nclient: {cerr}");
    assert!(serr.contains(why), "server: {serr}");
    assert!(cerr.contains("the server refused the run") && cerr.contains(why), "client: {cerr}");
}

#[test]
fn a_client_with_another_rail_count_hears_why() {
    let (s, c) = pair(&["latency", "--sizes", "8"], &["latency", "--sizes", "8", "--rails", "tcp:127.0.0.1"]);
    let (serr, cerr) = (text(&s.stderr), text(&c.stderr));
    assert_eq!((s.status.code(), c.status.code()), (Some(2), Some(2)), "server: {serr}\nclient: {cerr}");
    let why = "rank 1 has 1 rails, rank 0 has 2 (tcp:127.0.0.1,tcp:127.0.0.2): every rank needs the same number";
    assert!(cerr.contains("rank 0 refused this rank") && cerr.contains(why), "client: {cerr}");
    assert!(!cerr.contains("unexpected rank or rail index"), "client: {cerr}");
    assert!(serr.contains(why), "server: {serr}");
}
