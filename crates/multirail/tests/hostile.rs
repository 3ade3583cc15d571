//! Hostile peers against real endpoints over loopback TCP.
//!
//! Most tests run a 3-rank job: ranks 0 and 1 are real [`Endpoint`]s
//! (threads of this process) exchanging verified messages the whole time,
//! and rank 2 is played by the test (the *intruder*): it joins through the
//! real bootstrap protocol (docs/protocol.md §2) with the job's key, so it
//! learns every rank's rail listener addresses, owns authenticated rails
//! to ranks 0 and 1, and can say anything on them or on new connections.
//! An endpoint must refuse bad handshakes with the right REJECT, end only
//! the offending connection with a typed error naming peer and rail, keep
//! serving its other rails and peers, and never grow memory without bound.
//!
//! The tests of this file run one at a time (they measure the process's
//! resident memory, and the machine is small).

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::*;
use multirail::{Builder, Bytes, BytesMut, Config, Endpoint, Error, Progress};
use multirail_proto::handshake::{ConnectorSent, HandshakeError, LocalHello};
use multirail_proto::wire::{FrameHeader, HelloKind, HelloRepr, Op, RejectReason};
use multirail_transport::handshake::{self as hs, HandshakeFailure};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const KEY: &[u8] = b"test-key";
const JOB: u64 = 0x5eed_0b57;
const NRAILS: usize = 2;
/// Handshake timeout of the ranks (short, so silent peers are refused soon).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// "This must not hang" bound for single waits.
const LONG: Duration = Duration::from_secs(30);
/// Traffic between ranks 0 and 1: eager and rendezvous, striped.
const SIZES: [usize; 5] = [0, 100, 20_000, 300_000, 2 << 20];

/// The address table's magic and the size of a row's host identity and
/// PID (docs/protocol.md §2).
const TABLE_MAGIC: u32 = 0x4d52_5450;
const HOST_ID: usize = 32;
const PID: usize = 4;

fn rank_config(progress: Progress) -> Config {
    let mut c = config(NRAILS, progress);
    c.key = Some(KEY.to_vec());
    c.job_id = JOB;
    c.handshake_timeout = HANDSHAKE_TIMEOUT;
    c
}

fn nonce() -> [u8; 32] {
    static N: AtomicU64 = AtomicU64::new(1);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&n.to_le_bytes());
    b[8..24].copy_from_slice(&t.to_le_bytes());
    b
}

/// What rank `rank` of our 3-rank job says in its HELLO on `rail`.
fn hello(rank: u32, rail: u16) -> LocalHello {
    LocalHello {
        job_id: JOB,
        rank,
        size: 3,
        rail_index: rail,
        rail_count: NRAILS as u16,
        bandwidth: 0,
        latency_ns: 0,
        max_frame: 16 << 20,
        credits: 8 << 20,
        nonce: nonce(),
        // Each connection the intruder opens is newer than the last, so an
        // endpoint gets to judge it (an older one is refused as superseded).
        generation: {
            static G: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
            G.fetch_add(1, Ordering::Relaxed)
        },
    }
}

fn hello_bytes(h: &LocalHello, key: &[u8]) -> [u8; HelloRepr::LEN] {
    ConnectorSent::start(h, key).1
}

// ----- coordination between ranks 0, 1 and the intruder -----

#[derive(Default)]
struct Ctl {
    /// Ranks 0 and 1 exchange messages: the attack may start.
    started: AtomicBool,
    /// The intruder is done attacking.
    attack_done: AtomicBool,
    /// Ranks that finished their checks, as bits (the intruder keeps its
    /// sockets open, and the ranks stay open, until both did).
    checked: AtomicUsize,
    /// A thread panicked: everybody stops waiting.
    aborted: AtomicBool,
}

impl Ctl {
    fn aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }
    fn done_checking(&self, rank: u32) {
        self.checked.fetch_or(1 << rank, Ordering::AcqRel);
    }
    fn all_checked(&self) -> bool {
        self.checked.load(Ordering::Acquire) == 0b11
    }
    /// Waits (bounded) for `cond`; false if it never held.
    fn wait(&self, what: &str, cond: impl Fn() -> bool) -> bool {
        let end = Instant::now() + Duration::from_secs(90);
        while !cond() {
            if self.aborted() || Instant::now() > end {
                eprintln!("gave up waiting for {what}");
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }
}

/// Sets `aborted` if the thread holding it panics.
struct AbortOnPanic<'a>(&'a Ctl);

impl Drop for AbortOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.aborted.store(true, Ordering::Release);
        }
    }
}

// ----- the intruder: rank 2, built from the bootstrap protocol -----

fn encode_row(addrs: &[SocketAddr]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&TABLE_MAGIC.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&(addrs.len() as u16).to_le_bytes());
    // Host identity and PID unknown (never "the same host"), no shm
    // listener.
    out.extend_from_slice(&[0u8; HOST_ID + PID]);
    let no_shm = SocketAddr::from(([0, 0, 0, 0], 0));
    for a in std::iter::once(&no_shm).chain(addrs) {
        match a.ip() {
            IpAddr::V4(v) => {
                out.push(4);
                out.extend_from_slice(&v.to_ipv6_mapped().octets());
            }
            IpAddr::V6(v) => {
                out.push(6);
                out.extend_from_slice(&v.octets());
            }
        }
        out.extend_from_slice(&a.port().to_le_bytes());
    }
    out
}

fn read_table(s: &mut TcpStream) -> Vec<Vec<SocketAddr>> {
    let mut head = [0u8; 10];
    s.read_exact(&mut head).expect("table header");
    assert_eq!(u32::from_le_bytes(head[..4].try_into().unwrap()), TABLE_MAGIC, "table magic");
    let ranks = u32::from_le_bytes(head[4..8].try_into().unwrap()) as usize;
    let rails = u16::from_le_bytes(head[8..10].try_into().unwrap()) as usize;
    assert_eq!((ranks, rails), (3, NRAILS));
    let row = HOST_ID + PID + (1 + rails) * 19;
    let mut body = vec![0u8; ranks * row];
    s.read_exact(&mut body).expect("table body");
    let addrs: Vec<SocketAddr> = body
        .chunks_exact(row)
        .flat_map(|r| r[HOST_ID + PID + 19..].chunks_exact(19))
        .map(|e| {
            let ip = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(&e[1..17]).unwrap());
            let ip = if e[0] == 4 { IpAddr::V4(ip.to_ipv4_mapped().expect("mapped v4")) } else { IpAddr::V6(ip) };
            SocketAddr::new(ip, u16::from_le_bytes([e[17], e[18]]))
        })
        .collect();
    addrs.chunks(rails).map(<[SocketAddr]>::to_vec).collect()
}

struct Intruder {
    /// Every rank's rail listeners, by rank then rail.
    table: Vec<Vec<SocketAddr>>,
    /// Our authenticated rails, by rank (0, 1) then rail.
    conns: Vec<Vec<TcpStream>>,
    _listeners: Vec<TcpListener>,
}

impl Intruder {
    /// Joins the job at `root` as rank 2 and connects every rail to ranks
    /// 0 and 1, exactly as a real rank 2 would.
    fn join(root: SocketAddr, credits: u64) -> Intruder {
        let (_root, listeners, table) = Intruder::join_table(root);
        let mut conns = Vec::new();
        for j in 0..2u32 {
            let mut row = Vec::new();
            for (k, addr) in table[j as usize].iter().enumerate() {
                let mut c = TcpStream::connect(addr).expect("connect a rail");
                let mut h = hello(2, k as u16);
                h.credits = credits;
                let p = hs::connect(&mut c, &h, KEY, LONG).expect("rail handshake");
                assert_eq!((p.rank, p.rail_index), (j, k as u16));
                c.set_nodelay(true).unwrap();
                row.push(c);
            }
            conns.push(row);
        }
        Intruder { table, conns, _listeners: listeners }
    }

    /// Joins the job at `root` as rank 2 and returns the root connection,
    /// our rail listeners and the job's address table, without connecting
    /// any rail.
    fn join_table(root: SocketAddr) -> (TcpStream, Vec<TcpListener>, Vec<Vec<SocketAddr>>) {
        let mut s = TcpStream::connect(root).expect("connect to the root");
        let peer = hs::connect(&mut s, &hello(2, u16::MAX), KEY, LONG).expect("root handshake");
        assert_eq!(peer.rank, 0);
        let listeners: Vec<TcpListener> =
            (0..NRAILS).map(|k| TcpListener::bind(format!("127.0.0.{}:0", k + 1)).unwrap()).collect();
        let mine: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        s.write_all(&encode_row(&mine)).unwrap();
        s.set_read_timeout(Some(LONG)).unwrap();
        let table = read_table(&mut s);
        assert_eq!(table[2], mine);
        (s, listeners, table)
    }

    fn send_raw(&mut self, rank: usize, rail: usize, bytes: &[u8]) {
        self.conns[rank][rail].write_all(bytes).expect("intruder write");
    }

    fn send_frame(&mut self, rank: usize, rail: usize, h: &FrameHeader, payload: &[u8]) {
        let mut b = h.to_bytes().to_vec();
        b.extend_from_slice(payload);
        self.send_raw(rank, rail, &b);
    }

    fn send_eager(&mut self, rank: usize, rail: usize, seq: u64, tag: u64, bytes: &[u8]) {
        self.send_frame(rank, rail, &eager(seq, tag, bytes.len() as u64, 0, bytes.len() as u32), bytes);
    }

    /// True once the endpoint closed our connection (end of stream or
    /// reset), false if it stayed open for `limit`.
    fn closed_by_peer(&mut self, rank: usize, rail: usize, limit: Duration) -> bool {
        let s = &mut self.conns[rank][rail];
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let end = Instant::now() + limit;
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
                Err(_) => return true,
            }
            if Instant::now() > end {
                return false;
            }
        }
    }
}

fn hdr(op: Op, seq: u64, tag: u64, total: u64, offset: u64, len: u32) -> FrameHeader {
    let mut h = FrameHeader::new(op);
    h.seq = seq;
    h.tag = tag;
    h.total_len = total;
    h.offset = offset;
    h.frag_len = len;
    h
}

fn eager(seq: u64, tag: u64, total: u64, offset: u64, len: u32) -> FrameHeader {
    hdr(Op::Eager, seq, tag, total, offset, len)
}

// ----- what ranks 0 and 1 do -----

/// Ranks 0 and 1 exchange verified messages of every size class, in
/// order, until 10 rounds after the attack ended. Rank 0 decides when
/// to stop (the last message's tag says so). Returns the rounds done.
fn traffic(ep: &Endpoint, ctl: &Ctl) -> u64 {
    let t0 = Instant::now();
    let mut round = 0u64;
    let mut after = 0;
    loop {
        assert!(round < 100_000 && t0.elapsed() < Duration::from_secs(120), "traffic did not end (round {round})");
        assert!(!ctl.aborted(), "another thread failed");
        let size = SIZES[round as usize % SIZES.len()];
        let there = pattern(round, size);
        let back = pattern(round | 1 << 40, size);
        if ep.rank() == 0 {
            if ctl.attack_done.load(Ordering::Acquire) {
                after += 1;
            }
            let last = after >= 10;
            let tag = round << 1 | last as u64;
            ep.isend(1, tag, there).unwrap().wait_timeout(Some(LONG)).expect("send to rank 1");
            let (buf, r) = ep
                .irecv(Some(1), Some(tag), BytesMut::zeroed(size))
                .unwrap()
                .wait_with_buffer(Some(LONG))
                .expect("reply from rank 1");
            let st = r.expect("reply from rank 1");
            assert_eq!(st.len as usize, size);
            assert!(buf[..size] == back[..], "round {round}: reply intact");
            if round == 3 {
                ctl.started.store(true, Ordering::Release);
            }
            round += 1;
            if last {
                return round;
            }
        } else {
            let max = *SIZES.iter().max().unwrap();
            let (buf, r) = ep
                .irecv(Some(0), None, BytesMut::zeroed(max))
                .unwrap()
                .wait_with_buffer(Some(LONG))
                .expect("message from rank 0");
            let st = r.expect("message from rank 0");
            assert_eq!(st.tag >> 1, round, "messages in order");
            assert_eq!(st.len as usize, size);
            assert!(buf[..size] == there[..], "round {round}: message intact");
            ep.isend(0, st.tag, back).unwrap().wait_timeout(Some(LONG)).expect("reply to rank 0");
            round += 1;
            if st.tag & 1 == 1 {
                return round;
            }
        }
    }
}

/// The rail events that are failures: a rail routed around for a while
/// (suspect, then answering again) is not one. On a loaded test machine a
/// peer that is slow to acknowledge can be suspected for a moment.
fn failures(ep: &Endpoint) -> Vec<(u32, usize, String)> {
    ep.rail_errors().into_iter().filter(|e| !e.2.starts_with("suspect") && e.2 != "answered again").collect()
}

/// What rank 0 must see from the intruder.
struct Expect {
    /// Messages from rank 2, in order: (tag, bytes).
    msgs: Vec<(u64, Vec<u8>)>,
    /// Rails to rank 2 that must have failed, with a piece of the reason.
    errors: Vec<(usize, &'static str)>,
}

/// Rank 0's checks once the traffic ended.
fn check_rank0(ep: &Endpoint, expect: &Expect) {
    for (i, (tag, bytes)) in expect.msgs.iter().enumerate() {
        let (buf, r) = ep
            .irecv(Some(2), None, BytesMut::zeroed(bytes.len() + 16))
            .unwrap()
            .wait_with_buffer(Some(LONG))
            .expect("message from rank 2");
        let st = r.expect("message from rank 2");
        assert_eq!((st.tag, st.len as usize), (*tag, bytes.len()), "message {i} from rank 2, in order");
        assert!(buf[..bytes.len()] == bytes[..], "message {i} from rank 2 intact");
    }
    let wanted = |errs: &[(u32, usize, String)]| {
        expect.errors.iter().all(|(rail, what)| errs.iter().any(|e| e.0 == 2 && e.1 == *rail && e.2.contains(what)))
    };
    let end = Instant::now() + LONG;
    while !wanted(&failures(ep)) {
        assert!(Instant::now() < end, "rank 0 never recorded {:?}; it has {:?}", expect.errors, ep.rail_errors());
        std::thread::sleep(Duration::from_millis(10));
    }
    let errs = failures(ep);
    for e in &errs {
        assert!(
            e.0 == 2 && expect.errors.iter().any(|(rail, what)| e.1 == *rail && e.2.contains(what)),
            "unexpected rail error on rank 0: {e:?} (all: {errs:?})"
        );
    }
    assert_eq!(errs.len(), expect.errors.len(), "one error per offending connection: {errs:?}");
    eprintln!("rank 0 rail errors: {errs:?}");
    assert!(ep.rail_stats(1).iter().all(|s| s.up), "rails to rank 1 untouched: {:?}", ep.rail_stats(1));
    for (k, s) in ep.rail_stats(2).iter().enumerate() {
        let failed = expect.errors.iter().any(|(r, _)| *r == k);
        assert_eq!(s.up, !failed, "rail {k} to rank 2: {s:?}");
    }
}

fn check_rank1(ep: &Endpoint) {
    assert!(failures(ep).is_empty(), "rank 1 saw no failure: {:?}", ep.rail_errors());
    assert!(ep.rail_stats(0).iter().chain(ep.rail_stats(2).iter()).all(|s| s.up));
}

/// Runs ranks 0 and 1 (rank 0 runs `r0`, rank 1 exchanges traffic and
/// checks it saw no failure) and the intruder, which joins, waits for the
/// traffic to start, runs `attack`, and keeps its sockets open until both
/// ranks finished their checks.
fn run(r0: impl FnOnce(&Endpoint, &Ctl) + Send, attack: impl FnOnce(&mut Intruder, &Ctl) + Send) {
    run_with(8 << 20, r0, attack)
}

/// [`run`], with the intruder granting `credits` of eager data to each rank.
fn run_with(credits: u64, r0: impl FnOnce(&Endpoint, &Ctl) + Send, attack: impl FnOnce(&mut Intruder, &Ctl) + Send) {
    let _serial = serial();
    let root = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = root.local_addr().unwrap();
    let ctl = Ctl::default();
    let ctl = &ctl;
    std::thread::scope(|s| {
        let h0 = s.spawn(move || {
            let _a = AbortOnPanic(ctl);
            let ep =
                Builder::new(rank_config(Progress::Polled)).rank(0, 3).root_listener(root).build().expect("rank 0");
            r0(&ep, ctl);
            ctl.done_checking(0);
            ctl.wait("rank 1's checks", || ctl.all_checked());
            ep.close().expect("rank 0 closes cleanly");
        });
        let h1 = s.spawn(move || {
            let _a = AbortOnPanic(ctl);
            let ep = Builder::new(rank_config(Progress::Threaded)).rank(1, 3).root(addr).build().expect("rank 1");
            let rounds = traffic(&ep, ctl);
            check_rank1(&ep);
            eprintln!("ranks 0 and 1 exchanged {rounds} rounds");
            ctl.done_checking(1);
            ctl.wait("rank 0's checks", || ctl.all_checked());
            ep.close().expect("rank 1 closes cleanly");
        });
        let hi = s.spawn(move || {
            let _a = AbortOnPanic(ctl);
            let mut intr = Intruder::join(addr, credits);
            if !ctl.wait("traffic", || ctl.started.load(Ordering::Acquire)) {
                return;
            }
            attack(&mut intr, ctl);
            ctl.attack_done.store(true, Ordering::Release);
            ctl.wait("the ranks' checks", || ctl.all_checked());
        });
        let results = [h0.join(), h1.join(), hi.join()];
        for (who, r) in ["rank 0", "rank 1", "intruder"].iter().zip(results) {
            if let Err(p) = r {
                std::panic::resume_unwind(Box::new(format!("{who} failed: {}", panic_text(&p))));
            }
        }
    });
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

/// Good messages from the intruder: tags 100.., sizes 0, 10, 5000.
fn good_msgs(n: usize) -> Vec<(u64, Vec<u8>)> {
    (0..n).map(|i| (100 + i as u64, pattern(1000 + i as u64, [0, 10, 5000][i % 3]))).collect()
}

// ----- handshake attacks on a rail listener -----

#[derive(Debug)]
#[allow(dead_code)] // fields are for the failure messages
enum Answer {
    Reject(RejectReason),
    Hello(HelloRepr),
    /// End of stream or reset before 120 bytes.
    Closed,
    Other(Vec<u8>),
}

/// Reads the acceptor's 120-byte answer (bounded by `LONG`).
fn answer(s: &mut TcpStream) -> Answer {
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let end = Instant::now() + LONG;
    let mut b = [0u8; HelloRepr::LEN];
    let mut got = 0;
    while got < b.len() {
        match s.read(&mut b[got..]) {
            Ok(0) => return if got == 0 { Answer::Closed } else { Answer::Other(b[..got].to_vec()) },
            Ok(n) => got += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                assert!(Instant::now() < end, "no answer within {LONG:?}");
            }
            Err(_) => return Answer::Closed,
        }
    }
    match HelloRepr::parse(&b) {
        Ok(h) if h.kind == HelloKind::Reject => Answer::Reject(RejectReason::from_u8(h.reason)),
        Ok(h) => Answer::Hello(h),
        Err(_) => Answer::Other(b.to_vec()),
    }
}

/// After a REJECT the acceptor closes, sending nothing else.
fn assert_closed(s: &mut TcpStream) {
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let end = Instant::now() + LONG;
    let mut b = [0u8; 256];
    loop {
        match s.read(&mut b) {
            Ok(0) => return,
            Ok(n) => panic!("{n} more bytes after the REJECT"),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                assert!(Instant::now() < end, "connection not closed after the REJECT");
            }
            Err(_) => return,
        }
    }
}

/// Connects to `addr`, sends `bytes`, expects a REJECT with `want`.
fn refused_with(addr: SocketAddr, bytes: &[u8], want: RejectReason) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(bytes).unwrap();
    match answer(&mut s) {
        Answer::Reject(r) => assert_eq!(r, want, "REJECT reason"),
        other => panic!("expected REJECT {want:?}, got {other:?}"),
    }
    assert_closed(&mut s);
}

/// Runs a handshake attack on rank 0's rail-1 listener while ranks 0 and
/// 1 talk; afterwards the intruder's own rails still carry its messages.
fn handshake_attack(attack: impl FnOnce(SocketAddr) + Send) {
    let msgs = good_msgs(4);
    let expect = Expect { msgs: msgs.clone(), errors: vec![] };
    run(
        |ep, ctl| {
            traffic(ep, ctl);
            check_rank0(ep, &expect);
        },
        |intr, _| {
            attack(intr.table[0][1]);
            // Our legitimate rails were not disturbed: messages on both.
            for (i, (tag, b)) in msgs.iter().enumerate() {
                intr.send_eager(0, i % NRAILS, i as u64, *tag, b);
            }
        },
    );
}

#[test]
fn handshake_wrong_key() {
    handshake_attack(wrong_key_attack);
}

/// A rail connection to `addr` without the job's key: refused at HELLO.
fn wrong_key_attack(addr: SocketAddr) {
    // With the library: the acceptor's proof does not verify with our
    // key, so we give up before AUTH.
    let mut s = TcpStream::connect(addr).unwrap();
    let e = hs::connect(&mut s, &hello(2, 1), b"not-the-key", LONG).unwrap_err();
    assert!(matches!(e, HandshakeFailure::Refused(HandshakeError::BadKey)), "{e}");
    drop(s);
    // By hand: a forged AUTH is refused with reason *key*, and does
    // not replace our real rail 1 (no "replaced" error on rank 0).
    let mut s = TcpStream::connect(addr).unwrap();
    let mine = hello_bytes(&hello(2, 1), b"not-the-key");
    s.write_all(&mine).unwrap();
    let Answer::Hello(reply) = answer(&mut s) else { panic!("expected the acceptor's HELLO") };
    let (state, _) = ConnectorSent::start(&hello(2, 1), b"not-the-key");
    assert!(matches!(state.on_reply(&reply.to_bytes()), Err(HandshakeError::BadKey)));
    let mut auth = HelloRepr::parse(&mine).unwrap();
    auth.kind = HelloKind::Auth;
    auth.proof = [0x42; 32];
    s.write_all(&auth.to_bytes()).unwrap();
    match answer(&mut s) {
        Answer::Reject(r) => assert_eq!(r, RejectReason::Key),
        other => panic!("expected REJECT key, got {other:?}"),
    }
    // Nothing after the REJECT: no libfabric address on an `ofi` rail.
    assert_closed(&mut s);
}

/// An `ofi` rail's side channel is authenticated like a TCP rail: a
/// connection without the key is refused at HELLO, before the endpoint
/// sends its libfabric address, while ranks 0 and 1 exchange verified
/// traffic over `ofi:tcp` on two loopback addresses.
#[cfg(feature = "ofi")]
#[test]
fn ofi_rail_wrong_key_is_refused_before_its_address() {
    let _serial = serial();
    let root = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = root.local_addr().unwrap();
    let ofi_config = |p| {
        let mut c = rank_config(p);
        c.rails = multirail_transport::RailSpec::parse_list("ofi:tcp:127.0.0.1,ofi:tcp:127.0.0.2").unwrap();
        c
    };
    let ctl = Ctl::default();
    let (ctl, root, ofi_config) = (&ctl, &root, &ofi_config);
    std::thread::scope(|s| {
        let ranks: Vec<_> = (0..2u32)
            .map(|rank| {
                s.spawn(move || {
                    let _a = AbortOnPanic(ctl);
                    let b = Builder::new(ofi_config(Progress::Polled)).rank(rank, 3);
                    let ep = if rank == 0 { b.root_listener(root.try_clone().unwrap()) } else { b.root(addr) };
                    let ep = ep.build().expect("rank");
                    traffic(&ep, ctl);
                    assert!(failures(&ep).is_empty(), "rank {rank}: {:?}", ep.rail_errors());
                    assert!(
                        ep.rail_stats(1 - rank).iter().all(|s| s.up && s.rx_bytes > 0),
                        "{:?}",
                        ep.rail_stats(1 - rank)
                    );
                    ctl.done_checking(rank);
                    ctl.wait("the other rank's checks", || ctl.all_checked());
                    ep.close().expect("closes cleanly");
                })
            })
            .collect();
        let intruder = s.spawn(move || {
            let _a = AbortOnPanic(ctl);
            let (_root, _listeners, table) = Intruder::join_table(addr);
            if ctl.wait("traffic", || ctl.started.load(Ordering::Acquire)) {
                wrong_key_attack(table[0][1]);
                ctl.attack_done.store(true, Ordering::Release);
                ctl.wait("the ranks' checks", || ctl.all_checked());
            }
        });
        for h in ranks.into_iter().chain([intruder]) {
            if let Err(p) = h.join() {
                std::panic::resume_unwind(Box::new(panic_text(&p)));
            }
        }
    });
}

#[test]
fn handshake_wrong_job() {
    handshake_attack(|addr| {
        let mut h = hello(2, 1);
        h.job_id = JOB + 1;
        refused_with(addr, &hello_bytes(&h, KEY), RejectReason::Job);
        // The library connector reports it too.
        let mut s = TcpStream::connect(addr).unwrap();
        let e = hs::connect(&mut s, &h, KEY, LONG).unwrap_err();
        assert!(matches!(e, HandshakeFailure::Refused(HandshakeError::Rejected(RejectReason::Job))), "{e}");
    });
}

#[test]
fn handshake_wrong_protocol_version() {
    handshake_attack(|addr| {
        for version in [0u16, 1, 2, 3, 4, 6, 0xffff] {
            let mut b = hello_bytes(&hello(2, 1), KEY);
            b[8..10].copy_from_slice(&version.to_le_bytes());
            refused_with(addr, &b, RejectReason::Version);
        }
    });
}

#[test]
fn handshake_garbage_instead_of_hello() {
    handshake_attack(|addr| {
        let mut http = b"GET / HTTP/1.1\r\nHost: multirail\r\n\r\n".to_vec();
        http.resize(HelloRepr::LEN, b'.');
        refused_with(addr, &http, RejectReason::Malformed);
        refused_with(addr, &[0u8; HelloRepr::LEN], RejectReason::Malformed);
        // A well-formed message of the wrong kind first (AUTH, REJECT).
        let mut b = hello_bytes(&hello(2, 1), KEY);
        b[10] = HelloKind::Auth as u8;
        refused_with(addr, &b, RejectReason::Malformed);
        b[10] = 77;
        refused_with(addr, &b, RejectReason::Malformed);
        // More garbage than a HELLO: refused (the REJECT may be lost to
        // the reset that closing with unread bytes causes), nothing read.
        let mut s = TcpStream::connect(addr).unwrap();
        let _ = s.write_all(&vec![0xa5; 1 << 20]);
        match answer(&mut s) {
            Answer::Reject(r) => assert_eq!(r, RejectReason::Malformed),
            Answer::Closed => {}
            other => panic!("expected REJECT malformed or a close, got {other:?}"),
        }
        // Less than a HELLO, then end of stream: just closed.
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"MRAILHLO").unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(matches!(answer(&mut s), Answer::Closed));
    });
}

#[test]
fn handshake_wrong_identity() {
    handshake_attack(|addr| {
        type Variant = (&'static str, fn(&mut LocalHello));
        let variants: [Variant; 6] = [
            ("rank 0 itself", |h| h.rank = 0),
            ("a rank beyond the job", |h| h.rank = 7),
            ("another job size", |h| h.size = 4),
            ("another rail index", |h| h.rail_index = 0),
            ("the bootstrap rail index", |h| h.rail_index = u16::MAX),
            ("another rail count", |h| h.rail_count = 3),
        ];
        for (what, f) in variants {
            let mut h = hello(2, 1);
            f(&mut h);
            eprintln!("identity: {what}");
            refused_with(addr, &hello_bytes(&h, KEY), RejectReason::Identity);
        }
    });
}

#[test]
fn handshake_silent_peer_times_out() {
    handshake_attack(|addr| {
        // Connect and say nothing: refused with reason *timeout* after the
        // handshake timeout (2 s here), then closed.
        let mut s = TcpStream::connect(addr).unwrap();
        let t = Instant::now();
        match answer(&mut s) {
            Answer::Reject(r) => assert_eq!(r, RejectReason::Timeout),
            other => panic!("expected REJECT timeout, got {other:?}"),
        }
        eprintln!("silent peer refused after {:?}", t.elapsed());
        assert_closed(&mut s);
    });
}

/// Regression: the handshake timeout applied to each read, not to the
/// whole HELLO, so a peer dripping one byte at a time held a handshake
/// slot (of 16 per listener) for as long as it liked.
#[test]
fn handshake_slow_drip_hello_times_out() {
    handshake_attack(|addr| {
        let b = hello_bytes(&hello(2, 1), KEY);
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let t = Instant::now();
        let mut sent = 0;
        let mut buf = [0u8; HelloRepr::LEN];
        let mut got = 0;
        // 1 byte per 100 ms: the whole HELLO would take 12 s.
        let outcome = loop {
            if sent < b.len() {
                if s.write_all(&b[sent..sent + 1]).is_err() {
                    break "closed";
                }
                sent += 1;
            }
            match s.read(&mut buf[got..]) {
                Ok(0) => break "closed",
                Ok(n) => {
                    got += n;
                    if got == buf.len() {
                        break "answered";
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
                Err(_) => break "closed",
            }
            assert!(t.elapsed() < LONG, "no answer at all");
        };
        eprintln!("slow drip: {outcome} after {sent} bytes and {:?}", t.elapsed());
        assert!(sent < b.len(), "the acceptor waited for a HELLO dripping for {:?}", t.elapsed());
        if outcome == "answered" {
            let h = HelloRepr::parse(&buf).expect("a handshake message");
            assert_eq!((h.kind, RejectReason::from_u8(h.reason)), (HelloKind::Reject, RejectReason::Timeout));
        }
    });
}

// ----- protocol violations on an authenticated rail -----

/// The intruder breaks the protocol on its rail 1 to rank 0 with
/// `violate` (which may first send messages rank 0 will complete, listed
/// in `first`); rank 0 must close exactly that connection with an error
/// containing `reason`, while the intruder's rail 0 keeps carrying its
/// messages (from seq `next_seq` on) and ranks 0 and 1 keep talking.
fn violation(
    reason: &'static str,
    first: Vec<(u64, Vec<u8>)>,
    next_seq: u64,
    violate: impl FnOnce(&mut Intruder) + Send,
) {
    let good = good_msgs(3);
    let mut msgs = first;
    msgs.extend(good.iter().cloned());
    let expect = Expect { msgs, errors: vec![(1, reason)] };
    run(
        |ep, ctl| {
            traffic(ep, ctl);
            check_rank0(ep, &expect);
        },
        |intr, _| {
            violate(intr);
            assert!(intr.closed_by_peer(0, 1, LONG), "rank 0 closed the offending connection");
            for (i, (tag, b)) in good.iter().enumerate() {
                intr.send_eager(0, 0, next_seq + i as u64, *tag, b);
            }
        },
    );
}

#[test]
fn rail_malformed_frame_header() {
    violation("malformed frame: unsupported protocol version 9", vec![], 0, |intr| {
        let mut b = FrameHeader::new(Op::Heartbeat).to_bytes();
        b[0] = 9;
        intr.send_raw(0, 1, &b);
    });
}

#[test]
fn rail_impossible_length() {
    violation("malformed frame: frame payload of 16777217 bytes exceeds the limit of 16777216", vec![], 0, |intr| {
        intr.send_frame(0, 1, &eager(0, 1, 1 << 30, 0, (16 << 20) + 1), &[]);
    });
}

#[test]
fn rail_fragment_outside_its_message() {
    violation("malformed frame: fragment 18446744073709551610+10 lies outside", vec![], 0, |intr| {
        intr.send_frame(0, 1, &hdr(Op::Data, 0, 1, 100, u64::MAX - 5, 10), &[]);
    });
}

#[test]
fn rail_unknown_op() {
    violation("malformed frame: unknown op 99", vec![], 0, |intr| {
        let mut b = FrameHeader::new(Op::Heartbeat).to_bytes();
        b[1] = 99;
        intr.send_raw(0, 1, &b);
    });
}

#[test]
fn rail_data_for_a_message_never_announced() {
    violation("protocol violation: DATA for message 5, which was never announced or accepted", vec![], 0, |intr| {
        intr.send_frame(0, 1, &hdr(Op::Data, 5, 1, 100, 0, 100), &[7; 100]);
    });
}

#[test]
fn rail_duplicate_fragment_with_different_bytes() {
    let a = pattern(77, 200);
    let first = vec![(50, a.clone())];
    violation(
        "protocol violation: duplicate fragment of message 0 at offset 0 has different bytes",
        first,
        1,
        move |intr| {
            intr.send_frame(0, 1, &eager(0, 50, 200, 0, 100), &a[..100]);
            let mut other = a[..100].to_vec();
            other[99] ^= 1;
            intr.send_frame(0, 1, &eager(0, 50, 200, 0, 100), &other);
            // Once rank 0 dropped rail 1, the first copy stands; the rest of
            // the message comes on rail 0 and completes it.
            assert!(intr.closed_by_peer(0, 1, LONG));
            intr.send_frame(0, 0, &eager(0, 50, 200, 100, 100), &a[100..]);
        },
    );
}

// ----- peers that do not keep up -----

/// Rank 0 hands 64 MiB to rank 1, which does not call recv for a while:
/// the sends stay pending (nothing errors), rank 1 buffers no more than
/// it granted, and resident memory grows by no more than the unexpected
/// buffer (plus a generous allowance) beyond the data itself. Then rank 1
/// receives everything, in order, intact.
#[test]
fn peer_that_does_not_receive() {
    let _serial = serial();
    const MSG: usize = 64 << 10; // below the eager limit: eager while credit lasts
    const N: usize = 1024; // 64 MiB
    let limit = Config::default().proto.unexpected_limit;
    let go = AtomicBool::new(false);
    let failed = AtomicBool::new(false);
    job(
        2,
        |r| Builder::new(config(2, if r == 0 { Progress::Polled } else { Progress::Threaded })),
        |ep| {
            let _a = scopeguard(&failed);
            if ep.rank() == 0 {
                let rss0 = rss_bytes();
                let data: Vec<Bytes> = (0..N).map(|i| Bytes::from(pattern(i as u64, MSG))).collect();
                let rss_data = rss_bytes();
                let reqs: Vec<_> =
                    data.iter().enumerate().map(|(i, d)| ep.isend(1, i as u64, d.clone()).unwrap()).collect();
                drop(data);
                // Let it settle with rank 1 not receiving (heartbeats flow,
                // nothing may time out).
                let mut max = rss_bytes();
                for _ in 0..40 {
                    std::thread::sleep(Duration::from_millis(50));
                    max = max.max(rss_bytes());
                }
                let done = reqs.iter().filter(|r| r.test()).count();
                eprintln!(
                    "RSS before data {:.1} MiB, with data {:.1} MiB, max while stalled {:.1} MiB; {done} of {N} sends complete",
                    mib(rss0),
                    mib(rss_data),
                    mib(max)
                );
                assert!(failures(&ep).is_empty(), "{:?}", ep.rail_errors());
                assert!(done as u64 <= limit / MSG as u64, "only what fits rank 1's credit went out: {done}");
                assert!(!reqs.last().unwrap().test(), "the rest waits");
                let allowance = limit + (64 << 20);
                assert!(
                    max.saturating_sub(rss_data) <= allowance,
                    "memory grew by {:.1} MiB beyond the data (allowed {:.1} MiB)",
                    mib(max - rss_data),
                    mib(allowance)
                );
                go.store(true, Ordering::Release);
                for r in reqs {
                    r.wait_timeout(Some(LONG)).expect("send completes once rank 1 receives");
                }
            } else {
                let end = Instant::now() + Duration::from_secs(60);
                while !go.load(Ordering::Acquire) {
                    assert!(ep.unexpected_bytes(0) <= limit);
                    assert!(!failed.load(Ordering::Acquire) && Instant::now() < end, "rank 0 failed");
                    std::thread::sleep(Duration::from_millis(10));
                }
                for batch in (0..N).step_by(64) {
                    let reqs: Vec<_> =
                        (batch..batch + 64).map(|_| ep.irecv(Some(0), None, BytesMut::zeroed(MSG)).unwrap()).collect();
                    for (j, r) in reqs.into_iter().enumerate() {
                        let i = batch + j;
                        let (buf, r) = r.wait_with_buffer(Some(LONG)).expect("no timeout");
                        let st = r.expect("receive");
                        assert_eq!(st.tag, i as u64, "in order");
                        assert!(buf[..] == pattern(i as u64, MSG)[..], "message {i} intact");
                    }
                }
                assert!(failures(&ep).is_empty(), "{:?}", ep.rail_errors());
            }
            ep.close().expect("closes cleanly");
        },
    );
}

/// Sets the flag if the thread panics.
struct FlagOnPanic<'a>(&'a AtomicBool);

impl Drop for FlagOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Release);
        }
    }
}

fn scopeguard(f: &AtomicBool) -> FlagOnPanic<'_> {
    FlagOnPanic(f)
}

/// A peer that stops reading its sockets altogether (the intruder): rank
/// 0 hands it 64 MiB. Rank 0's memory stays bounded by the data it was
/// given, the sends wait (no error while the peer is alive), traffic with
/// rank 1 is not held up, and when the stuck peer finally goes away the
/// pending sends fail with an error instead of hanging.
#[test]
fn peer_whose_sockets_stop_reading() {
    // Eager-sized messages, and the peer grants credit for all of them, so
    // rank 0 really tries to push all 64 MiB into sockets nobody reads.
    const MSG: usize = 64 << 10;
    const N: usize = 1024;
    run_with(
        1 << 30,
        |ep, ctl| {
            let rss0 = rss_bytes();
            let data: Vec<Bytes> = (0..N).map(|i| Bytes::from(pattern(i as u64, MSG - i % 7))).collect();
            let rss_data = rss_bytes();
            let stuck: Vec<_> =
                data.iter().enumerate().map(|(i, d)| ep.isend(2, i as u64, d.clone()).unwrap()).collect();
            drop(data);
            let rounds = traffic(ep, ctl);
            let rss_max = rss_bytes();
            eprintln!(
                "RSS before data {:.1} MiB, with data {:.1} MiB, after {rounds} rounds with rank 1 {:.1} MiB",
                mib(rss0),
                mib(rss_data),
                mib(rss_max)
            );
            assert!(rss_max.saturating_sub(rss_data) <= 128 << 20, "memory grew by {:.1} MiB", mib(rss_max - rss_data));
            // Its rails owe acknowledgements they never send: they are
            // routed around (suspect), not failed. Nothing fails with rank
            // 1 either; under a loaded CI run (debug build, tests in
            // parallel) one of its rails was once suspected for 300 ms and
            // answered again (cause not found in 19 local runs): that is
            // the rail routed around while slow, allowed, and printed.
            let errs = ep.rail_errors();
            let routed = |e: &(u32, usize, String)| e.2.starts_with("suspect") || e.2 == "answered again";
            assert!(
                errs.iter().all(|e| (e.0 == 2 && e.2.starts_with("suspect")) || (e.0 == 1 && routed(e))),
                "{errs:?}"
            );
            let slow: Vec<_> = errs.iter().filter(|e| e.0 == 1).collect();
            if !slow.is_empty() {
                eprintln!("rank 1's rails were routed around while slow: {slow:?}");
            }
            assert!(!stuck.last().unwrap().test(), "sends to the stuck peer wait");
            assert!(ep.rail_stats(1).iter().all(|s| s.up));
            ctl.done_checking(0);
            // The intruder now disconnects: the waiting sends fail.
            for (i, r) in stuck.into_iter().enumerate() {
                match r.wait_timeout(Some(LONG)) {
                    Ok(()) => {}
                    Err(Error::PeerFailed(f)) => assert_eq!(f.peer, 2, "send {i}"),
                    Err(e) => panic!("send {i} to the stuck peer: {e}"),
                }
            }
        },
        |_intr, _| {
            // Stay stuck for a while with traffic going on.
            std::thread::sleep(Duration::from_millis(1500));
        },
    );
}

/// Rank 1 floods rank 0 with 10 000 small messages rank 0 does not
/// receive yet: rank 0 buffers at most its unexpected limit, the flood
/// waits at rank 1 (only what fits the credit completes), and once rank
/// 0 receives, all 10 000 arrive in order, intact.
#[test]
fn peer_flooding_unexpected_messages() {
    let _serial = serial();
    const N: usize = 10_000;
    const LEN: usize = 1000;
    const LIMIT: u64 = 256 << 10;
    let filled = AtomicBool::new(false);
    let issued = AtomicBool::new(false);
    let failed = AtomicBool::new(false);
    job(
        2,
        |r| Builder::new(config(2, if r == 0 { Progress::Threaded } else { Progress::Polled })).unexpected_limit(LIMIT),
        |ep| {
            let _a = scopeguard(&failed);
            let end = Instant::now() + Duration::from_secs(60);
            if ep.rank() == 1 {
                let reqs: Vec<_> = (0..N).map(|i| ep.isend(0, i as u64, pattern(i as u64, LEN)).unwrap()).collect();
                while !filled.load(Ordering::Acquire) {
                    assert!(!failed.load(Ordering::Acquire) && Instant::now() < end, "rank 0 failed");
                    std::thread::sleep(Duration::from_millis(5));
                }
                let done = reqs.iter().filter(|r| r.test()).count();
                eprintln!("{done} of {N} flood messages complete before rank 0 receives");
                assert!(done as u64 <= LIMIT / (LEN as u64 + 64), "only what fits the credit: {done}");
                assert!(!reqs.last().unwrap().test(), "the flood waits");
                issued.store(true, Ordering::Release);
                for r in reqs {
                    r.wait_timeout(Some(LONG)).expect("flood message sent");
                }
            } else {
                let mut max = 0;
                loop {
                    let u = ep.unexpected_bytes(1);
                    assert!(u <= LIMIT, "rank 0 buffers {u} > {LIMIT}");
                    max = max.max(u);
                    if u + LEN as u64 + 64 > LIMIT {
                        filled.store(true, Ordering::Release);
                    }
                    if issued.load(Ordering::Acquire) {
                        break;
                    }
                    assert!(
                        !failed.load(Ordering::Acquire) && Instant::now() < end,
                        "flood never filled the credit ({u})"
                    );
                    std::thread::sleep(Duration::from_millis(2));
                }
                eprintln!("rank 0 buffered at most {max} bytes (limit {LIMIT})");
                for batch in (0..N).step_by(500) {
                    let reqs: Vec<_> =
                        (batch..batch + 500).map(|_| ep.irecv(Some(1), None, BytesMut::zeroed(LEN)).unwrap()).collect();
                    for (j, r) in reqs.into_iter().enumerate() {
                        let i = batch + j;
                        let (buf, r) = r.wait_with_buffer(Some(LONG)).expect("no timeout");
                        let st = r.expect("receive");
                        assert_eq!((st.tag, st.len as usize), (i as u64, LEN), "in order");
                        assert!(buf[..] == pattern(i as u64, LEN)[..], "message {i} intact");
                    }
                    assert!(ep.unexpected_bytes(1) <= LIMIT);
                }
            }
            assert!(failures(&ep).is_empty(), "{:?}", ep.rail_errors());
            ep.close().expect("closes cleanly");
        },
    );
}
