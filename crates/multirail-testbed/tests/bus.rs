//! The multi-port layout (`up --bus`): 2 hosts x 2 rails at 2gbit whose
//! rails share a bus of 2gbit per host. Checks with `ip` and `tc` that the
//! bus, its shaping and the redirect of every rail are in place, that the
//! rails still connect, and that `down` removes it all. Skipped (with the
//! reason printed) without root, iproute2, tbf, or the kernel's ifb /
//! clsact / u32 / mirred. The throughput effect is measured outside the
//! unit tests (docs/testbed.md, "Multi-port layout").

mod common;

use common::*;
use multirail_testbed::{Spec, parse_rates};

fn bus_spec() -> Spec {
    Spec {
        hosts: 2,
        rails: 2,
        rates: parse_rates("2gbit").unwrap(),
        bus: Some("2gbit".parse().unwrap()),
        ..Spec::default()
    }
}

fn text(out: std::process::Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn bus_is_built_shaped_and_removed() {
    let Some(tb) = up_or_skip("bus_is_built_shaped_and_removed", bus_spec()) else {
        return;
    };
    assert!(tb.status.problems.is_empty(), "{:?}", tb.status.problems);
    assert_eq!(tb.status.bus.map(|s| s.rate.to_string()).as_deref(), Some("2gbit"));
    for host in 0..2 {
        let link = text(output_in(&tb.prefix, host, &["ip", "-d", "link", "show", "dev", "bus"]));
        assert!(link.contains("ifb"), "host{host}: {link}");
        assert!(link.contains(",UP"), "host{host}: {link}");
        let qdisc = text(output_in(&tb.prefix, host, &["tc", "qdisc", "show", "dev", "bus"]));
        assert!(qdisc.contains("tbf") && qdisc.contains("rate 2Gbit"), "host{host}: {qdisc}");
        for rail in ["rail0", "rail1"] {
            // The rail keeps its own link shaping...
            let own = text(output_in(&tb.prefix, host, &["tc", "qdisc", "show", "dev", rail, "root"]));
            assert!(own.contains("tbf") && own.contains("rate 2Gbit"), "host{host} {rail}: {own}");
            // ... and all it sends goes through the bus first.
            let filter = text(output_in(&tb.prefix, host, &["tc", "filter", "show", "dev", rail, "egress"]));
            assert!(filter.contains("Egress Redirect to device bus"), "host{host} {rail}: {filter}");
        }
        let status = tb.status.host(host).unwrap().bus.clone().expect("host has a bus");
        assert_eq!(status.rails, [0, 1]);
    }
    // The rails still connect host to host, each on its own subnet.
    if have("python3") {
        let _server = start_probe_server(&tb.prefix, 1);
        let targets: Vec<String> = tb.status.rail_addrs(1).unwrap().iter().map(ToString::to_string).collect();
        for (rail, target) in targets.iter().enumerate() {
            let got = probe(&tb.prefix, 0, Some(&format!("rail{rail}")), std::slice::from_ref(target));
            assert_eq!(got, [Probe::Ok(target.clone())], "rail{rail} through the bus");
        }
    } else {
        eprintln!("bus_is_built_shaped_and_removed: python3 not found, connectivity not probed");
    }
    let prefix = tb.prefix.clone();
    drop(tb);
    assert_gone(&prefix);
}

#[test]
fn without_bus_there_is_none() {
    let spec = Spec { bus: None, ..bus_spec() };
    let Some(tb) = up_or_skip("without_bus_there_is_none", spec) else {
        return;
    };
    assert_eq!(tb.status.bus, None);
    assert!(tb.status.hosts.iter().all(|h| h.bus.is_none()));
    let out = output_in(&tb.prefix, 0, &["ip", "link", "show", "dev", "bus"]);
    assert!(!out.status.success(), "no bus device in the multi-HCA layout");
}
