//! End-to-end over real loopback TCP and shared memory: 1, 2 and 4 rails,
//! both progress engines, random sizes from 0 B to 16 MiB, payloads
//! verified, many messages in flight. One suite, run per rail set.

mod common;

use common::*;
use multirail::{Builder, BytesMut, Endpoint, Finished, Progress, Request};

fn exchange(nrails: usize, progress: Progress, policy: &str, seed: u64, count: usize) {
    exchange_on(&rails(nrails), progress, policy, seed, count)
}

fn exchange_on(rail_list: &str, progress: Progress, policy: &str, seed: u64, count: usize) {
    let nrails = rail_list.split(',').count();
    let mut rng = Rng(seed);
    let sizes: Vec<usize> = (0..count)
        .map(|_| match rng.below(5) {
            0 => 0,
            1 => rng.below(100) as usize,
            2 => rng.below(100_000) as usize,
            3 => rng.below(2 << 20) as usize,
            _ => (rng.below(16 << 20) + 1) as usize,
        })
        .collect();
    let sizes = &sizes;
    job(
        2,
        |_| Endpoint::builder().policy(policy).progress(progress).rails(rail_list).key("k"),
        |ep| {
            if ep.rank() == 0 {
                // Everything in flight at once.
                let reqs: Vec<Request> = sizes
                    .iter()
                    .enumerate()
                    .map(|(i, &n)| ep.isend(1, i as u64, pattern(i as u64, n)).unwrap().into())
                    .collect();
                for r in ep.wait_all(reqs) {
                    r.unwrap();
                }
            } else {
                let reqs: Vec<Request> =
                    sizes.iter().map(|&n| ep.irecv(Some(0), None, BytesMut::zeroed(n)).unwrap().into()).collect();
                for (i, r) in ep.wait_all(reqs).into_iter().enumerate() {
                    let Finished::Received(buf, st) = r.unwrap() else { panic!() };
                    assert_eq!(st.tag, i as u64, "in order");
                    assert_eq!(st.len as usize, sizes[i]);
                    assert!(buf[..] == pattern(i as u64, sizes[i])[..], "payload {i} ({} bytes)", sizes[i]);
                }
                let stats = ep.rail_stats(0);
                assert_eq!(stats.len(), nrails);
                if nrails > 1 && policy.contains("stripe") {
                    assert!(stats.iter().all(|s| s.rx_bytes > 0), "all rails used: {stats:?}");
                }
            }
            ep.close().unwrap();
        },
    );
}

#[test]
fn one_rail_both_engines() {
    exchange(1, Progress::Polled, "16K:single,*:adaptive", 1, 40);
    exchange(1, Progress::Threaded, "16K:single,*:adaptive", 2, 40);
}

#[test]
fn two_rails_every_policy_polled() {
    for (i, p) in ["*:single", "*:round-robin", "*:stripe", "*:weighted", "16K:single,*:adaptive"].iter().enumerate() {
        exchange(2, Progress::Polled, p, 10 + i as u64, 25);
    }
}

#[test]
fn two_rails_every_policy_threaded() {
    for (i, p) in ["*:single", "*:round-robin", "*:stripe", "*:weighted", "16K:single,*:adaptive"].iter().enumerate() {
        exchange(2, Progress::Threaded, p, 20 + i as u64, 25);
    }
}

#[test]
fn shm_rail_both_engines() {
    exchange_on("shm", Progress::Polled, "16K:single,*:adaptive", 40, 40);
    exchange_on("shm", Progress::Threaded, "16K:single,*:adaptive", 41, 40);
}

#[test]
fn shm_and_tcp_every_policy() {
    for (i, p) in ["*:single", "*:round-robin", "*:stripe", "*:weighted", "16K:spread,*:adaptive"].iter().enumerate() {
        exchange_on("shm,tcp:127.0.0.1", Progress::Polled, p, 50 + i as u64, 25);
    }
    exchange_on("tcp:127.0.0.1,shm", Progress::Threaded, "16K:spread,*:adaptive", 60, 25);
}

#[test]
fn four_rails_both_engines() {
    exchange(4, Progress::Polled, "*:stripe", 30, 40);
    exchange(4, Progress::Threaded, "4K:single,*:adaptive", 31, 40);
}

#[test]
fn blocking_ping_pong_and_any_source() {
    for progress in [Progress::Polled, Progress::Threaded] {
        job(
            3,
            |_| Endpoint::builder().progress(progress).key("k"),
            |ep| {
                let me = ep.rank();
                if me == 0 {
                    let mut seen = [false; 3];
                    for _ in 0..2 {
                        let mut buf = [0u8; 16];
                        let st = ep.recv(None, None, &mut buf).unwrap();
                        assert_eq!(&buf[..st.len as usize], format!("hi from {}", st.peer).as_bytes());
                        seen[st.peer as usize] = true;
                        ep.send(st.peer, 9, b"ack").unwrap();
                    }
                    assert!(seen[1] && seen[2]);
                } else {
                    ep.send(0, 1, format!("hi from {me}").as_bytes()).unwrap();
                    let mut buf = [0u8; 3];
                    ep.recv(Some(0), Some(9), &mut buf).unwrap();
                    assert_eq!(&buf, b"ack");
                }
                for i in 0..200u32 {
                    // Ping-pong between 1 and 2 under any-source matching.
                    match me {
                        1 => {
                            ep.send(2, 5, &i.to_le_bytes()).unwrap();
                            let mut b = [0u8; 4];
                            ep.recv(Some(2), Some(5), &mut b).unwrap();
                            assert_eq!(u32::from_le_bytes(b), i + 1);
                        }
                        2 => {
                            let mut b = [0u8; 4];
                            ep.recv(None, Some(5), &mut b).unwrap();
                            ep.send(1, 5, &(u32::from_le_bytes(b) + 1).to_le_bytes()).unwrap();
                        }
                        _ => break,
                    }
                }
                ep.barrier().unwrap();
            },
        );
    }
}

#[test]
fn truncation_is_a_receive_error_and_the_buffer_comes_back() {
    job(
        2,
        |_| Endpoint::builder().key("k"),
        |ep| {
            if ep.rank() == 0 {
                ep.send(1, 1, &[1u8; 100]).unwrap();
                ep.send(1, 2, &vec![2u8; 1 << 20]).unwrap();
                ep.send(1, 3, b"after").unwrap();
            } else {
                let (buf, r) = ep.irecv(Some(0), None, BytesMut::zeroed(10)).unwrap().wait_with_buffer(None).unwrap();
                assert_eq!(buf.len(), 10);
                assert!(matches!(r, Err(multirail::Error::Truncated { buf_len: 10, .. })), "{r:?}");
                let mut small = vec![0u8; 1000];
                let e = ep.recv(Some(0), None, &mut small).unwrap_err();
                assert!(e.to_string().contains("does not fit"), "{e}");
                let mut b = [0u8; 5];
                ep.recv(Some(0), None, &mut b).unwrap();
                assert_eq!(&b, b"after");
            }
        },
    );
}

/// Both ranks send first, at once, so both open the same rails at the
/// same time: the two ends must settle on one connection per rail without
/// any rail failing (regression: the losing connection was closed while
/// the other end still used it, which it took for a failure).
#[test]
fn simultaneous_first_sends_settle_on_one_connection_per_rail() {
    for round in 0..8 {
        let results = job(
            2,
            |_| Builder::new(config(2, Progress::Polled)).policy("*:stripe"),
            |ep| {
                let peer = 1 - ep.rank();
                let s = ep.isend(peer, 1, pattern(round, 300_000)).unwrap();
                let (buf, st) = ep.irecv(Some(peer), Some(1), BytesMut::zeroed(300_000)).unwrap().wait().unwrap();
                s.wait().unwrap();
                assert_eq!(st.len, 300_000);
                assert!(buf[..] == pattern(round, 300_000)[..]);
                ep.barrier().unwrap();
                ep.rail_errors()
            },
        );
        for (rank, errs) in results.iter().enumerate() {
            assert!(
                errs.iter().all(|e| e.2.starts_with("suspect") || e.2 == "answered again"),
                "round {round}, rank {rank}: {errs:?}"
            );
        }
    }
}

/// Detached requests (for the C and Python bindings) complete like the
/// others once attached again, and an endpoint refuses another's request.
#[test]
fn detached_requests_complete_after_attach() {
    let out = job(
        2,
        |_| Endpoint::builder().rails(&rails(2)).key("k"),
        |ep| {
            let peer = 1 - ep.rank();
            let s = Request::from(ep.isend(peer, 5, pattern(1, 300_000)).unwrap()).detach();
            let r = Request::from(ep.irecv(Some(peer), Some(5), BytesMut::zeroed(300_000)).unwrap()).detach();
            assert!(s.is_send() && !r.is_send());
            let got = ep.wait_all([ep.attach(s).unwrap(), ep.attach(r).unwrap()]);
            let Some(Ok(Finished::Received(buf, st))) = got.into_iter().nth(1) else { panic!("no receive") };
            assert_eq!(st.len, 300_000);
            assert!(buf[..] == pattern(1, 300_000)[..]);
            let d = Request::from(ep.irecv(Some(peer), Some(6), BytesMut::new()).unwrap()).detach();
            ep.send(peer, 6, b"").unwrap();
            (ep, d)
        },
    );
    // Rank 0's request handed to rank 1's endpoint: refused.
    let mut out = out.into_iter();
    let (ep0, d0) = out.next().unwrap();
    let (ep1, d1) = out.next().unwrap();
    let err = ep1.attach(d0).err().expect("another endpoint's request");
    assert!(err.to_string().contains("another endpoint"), "{err}");
    let Request::Recv(r) = ep1.attach(d1).unwrap() else { panic!("a receive") };
    r.wait().unwrap();
    drop((ep0, ep1));
}
