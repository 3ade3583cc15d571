//! Every rail connects its hosts, and only its own subnet. Uses a tiny
//! Python TCP probe run inside the hosts; skipped without root/iproute2/tbf
//! or python3.

mod common;

use common::*;
use multirail_testbed::{Spec, parse_rates, set_rail_up};

fn spec(hosts: usize, rails: usize) -> Spec {
    Spec { hosts, rails, rates: parse_rates("1gbit").unwrap(), ..Spec::default() }
}

fn have_python(test: &str) -> bool {
    let found = have("python3");
    if !found {
        eprintln!("skipping {test}: python3 not found");
    }
    found
}

fn addrs(tb: &Testbed, host: usize) -> Vec<String> {
    tb.status.rail_addrs(host).unwrap().iter().map(ToString::to_string).collect()
}

/// Host `from` reaches every rail address of host `to`, and the server sees
/// the connection arrive on the address that was dialled.
fn assert_reaches_every_rail(tb: &Testbed, from: usize, to: usize) {
    let targets = addrs(tb, to);
    let results = probe(&tb.prefix, from, None, &targets);
    let expected: Vec<Probe> = targets.iter().map(|a| Probe::Ok(a.clone())).collect();
    assert_eq!(results, expected, "host{from} -> host{to}");
}

/// Bound to `rail0`, host `from` cannot reach host `to`'s addresses on the
/// other rails: they are other subnets, and hosts answer ARP only on the
/// rail that owns the address.
fn assert_rail0_reaches_only_rail0(tb: &Testbed, from: usize, to: usize) {
    let targets = addrs(tb, to);
    let results = probe(&tb.prefix, from, Some("rail0"), &targets);
    assert_eq!(results[0], Probe::Ok(targets[0].clone()), "rail0 itself works");
    for (addr, result) in targets.iter().zip(&results).skip(1) {
        assert!(matches!(result, Probe::Fail(_)), "{addr} reached through rail0: {result:?}");
    }
}

#[test]
fn two_hosts_reach_each_other_on_every_rail_and_only_there() {
    if !have_python("two_hosts_connectivity") {
        return;
    }
    let Some(tb) = up_or_skip("two_hosts_connectivity", spec(2, 3)) else {
        return;
    };
    let _server = start_probe_server(&tb.prefix, 1);
    assert_reaches_every_rail(&tb, 0, 1);
    assert_rail0_reaches_only_rail0(&tb, 0, 1);
}

#[test]
fn switched_hosts_reach_each_other_on_every_rail_and_only_there() {
    if !have_python("switched_connectivity") {
        return;
    }
    let Some(tb) = up_or_skip("switched_connectivity", spec(3, 2)) else {
        return;
    };
    let _server1 = start_probe_server(&tb.prefix, 1);
    let _server2 = start_probe_server(&tb.prefix, 2);
    assert_reaches_every_rail(&tb, 0, 1);
    assert_reaches_every_rail(&tb, 0, 2);
    assert_rail0_reaches_only_rail0(&tb, 0, 2);
}

#[test]
fn a_rail_taken_down_is_unreachable_until_brought_back() {
    if !have_python("rail_failover") {
        return;
    }
    let Some(tb) = up_or_skip("rail_failover", spec(2, 2)) else {
        return;
    };
    let _server = start_probe_server(&tb.prefix, 1);
    let targets = addrs(&tb, 1);
    set_rail_up(&tb.prefix, 0, 1, false).unwrap();
    let results = probe(&tb.prefix, 0, None, &targets);
    assert_eq!(results[0], Probe::Ok(targets[0].clone()), "rail0 unaffected");
    assert!(matches!(results[1], Probe::Fail(_)), "rail1 is down: {results:?}");
    set_rail_up(&tb.prefix, 0, 1, true).unwrap();
    assert_reaches_every_rail(&tb, 0, 1);
}
