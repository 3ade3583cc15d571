//! How ranks meet. Rank 0 listens at the root address; every other rank
//! connects there (authenticated HELLO), sends the addresses of its rail
//! listeners and receives everybody's. That is all: rail connections are
//! opened later, when they are needed (`connections`), each with its own
//! HELLO naming rank, rail index and connection generation.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use multirail_proto::handshake::{HandshakeError, LocalHello, PeerHello};
use multirail_transport::handshake::{self, HandshakeFailure};
use multirail_transport::spec::Resolved;
use multirail_transport::tcp;

use crate::hosts::{HOST_ID_LEN, HostEntry, HostId, Routes};
use crate::{Config, Error};

/// Rail index used in the HELLO of the bootstrap connection.
pub const BOOT_RAIL: u16 = u16::MAX;
const TABLE_MAGIC: u32 = 0x4d52_5450; // "MRTP": rows with a host identity and a PID
/// Rank 0's refusal, sent instead of the table: a reason for the user.
const REFUSAL_MAGIC: u32 = 0x4d52_5445; // "MRTE"
/// Version of the refusal message.
const REFUSAL_VERSION: u16 = 1;
/// Longest refusal reason sent or read.
const MAX_REASON: usize = 4096;
const ENTRY: usize = 19;
/// Largest job the address table describes.
pub(crate) const MAX_RANKS: u32 = 1 << 16;
const MAX_RAILS: usize = 256;

/// An authenticated rail connection.
pub(crate) struct Conn {
    pub peer: u32,
    pub rail: usize,
    pub stream: TcpStream,
    pub hello: PeerHello,
}

/// One rank's row of the address table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    /// Where the rank runs ([`crate::hosts`]).
    pub host: HostId,
    /// Its process ID in its PID namespace (0: unknown): peers on the same
    /// kernel and PID namespace look up where it runs
    /// ([`crate::cpus::PeerCpus`]).
    pub pid: u32,
    /// Its listener for the automatic `shm` rail (none with
    /// `MULTIRAIL_SHM=off` or a rail list naming `shm`).
    pub shm: Option<SocketAddr>,
    /// Its rail listeners, in rail order.
    pub rails: Vec<SocketAddr>,
}

impl Row {
    pub fn entry(&self) -> HostEntry {
        HostEntry { id: self.host, shm: self.shm.is_some() }
    }
}

/// Every rank's row, in rank order.
pub(crate) type Table = Vec<Row>;

/// Where this rank meets the others.
pub enum Root {
    /// Rank 0: accept the others on these listeners (one per address, so
    /// the others can reach it over any rail).
    Listen(Vec<TcpListener>),
    /// Other ranks: connect to the first of these that answers.
    Connect(Vec<SocketAddr>),
    /// Every rank: publish and fetch addresses through the launcher's PMIx.
    Pmix,
}

/// The PMIx key under which each rank publishes its rail addresses.
pub(crate) const PMIX_KEY: &str = "multirail.rails";

/// What we know about ourselves, for setup and later reconnections.
#[derive(Clone)]
pub(crate) struct Me {
    pub cfg: std::sync::Arc<Config>,
    pub rank: u32,
    pub size: u32,
    pub rails: Vec<Resolved>,
    /// The rails to each peer (uniform while meeting).
    pub routes: std::sync::Arc<Routes>,
}

impl Me {
    pub fn key(&self) -> &[u8] {
        self.cfg.key.as_deref().unwrap_or(&[])
    }

    pub fn hello(&self, rail_index: u16) -> LocalHello {
        self.hello_gen(rail_index, 0)
    }

    /// A HELLO proposing connection generation `generation`.
    pub fn hello_gen(&self, rail_index: u16, generation: u32) -> LocalHello {
        let mut nonce = [0u8; 32];
        // getrandom only fails if the OS has no entropy source at all.
        getrandom::fill(&mut nonce).expect("OS random number generator");
        let spec = self.cfg.rails.get(rail_index as usize);
        LocalHello {
            job_id: self.cfg.job_id,
            rank: self.rank,
            size: self.size,
            rail_index,
            rail_count: self.cfg.rails.len() as u16,
            bandwidth: spec.and_then(|s| s.bandwidth).unwrap_or(0),
            latency_ns: 0,
            max_frame: self.cfg.proto.limits.max_frame,
            credits: self.cfg.proto.unexpected_limit,
            nonce,
            generation,
        }
    }

    /// Vets the identity a connecting peer claims.
    pub fn check(&self, p: &PeerHello, rail: u16) -> Result<(), String> {
        self.check_identity(p, rail)?;
        self.check_rail_count(p.rank, p.rail_count as usize)
    }

    /// Vets rank, size and rail index (not the rail count: at the root a
    /// different count is refused after the handshake, with a reason the
    /// joining rank reads, §2 of docs/protocol.md).
    fn check_identity(&self, p: &PeerHello, rail: u16) -> Result<(), String> {
        if p.size != self.size {
            return Err(format!("rank {} thinks the job has {} ranks, we have {}", p.rank, p.size, self.size));
        }
        if p.rank >= self.size || p.rank == self.rank {
            return Err(format!("rank {} is not a peer of rank {} in a job of {}", p.rank, self.rank, self.size));
        }
        if p.rail_index != rail {
            return Err(format!("rail {} arrived on the listener of rail {rail}", p.rail_index));
        }
        if rail != BOOT_RAIL && self.routes.local(p.rank, rail as usize).is_none() {
            return Err(format!(
                "rail {rail} is not a rail between ranks {} and {} (one host: shm only; other hosts: the network rails)",
                p.rank, self.rank
            ));
        }
        Ok(())
    }

    fn check_rail_count(&self, rank: u32, count: usize) -> Result<(), String> {
        let ours = self.cfg.rails.len();
        if count != ours {
            let names = self.cfg.rails.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
            return Err(format!(
                "rank {rank} has {count} rails, rank {} has {ours} ({names}): every rank needs the same number \
                 (--rails / MULTIRAIL_RAILS)",
                self.rank
            ));
        }
        Ok(())
    }
}

fn setup_err(e: impl std::fmt::Display) -> Error {
    Error::Setup(e.to_string())
}

fn encode_addr(a: &SocketAddr, out: &mut Vec<u8>) {
    let (fam, ip) = match a.ip() {
        IpAddr::V4(v) => (4u8, v.to_ipv6_mapped()),
        IpAddr::V6(v) => (6u8, v),
    };
    out.push(fam);
    out.extend_from_slice(&ip.octets());
    out.extend_from_slice(&a.port().to_le_bytes());
}

fn decode_addr(b: &[u8]) -> Result<SocketAddr, String> {
    let mut o = [0u8; 16];
    o.copy_from_slice(&b[1..17]);
    let v6 = Ipv6Addr::from(o);
    let ip = match b[0] {
        4 => IpAddr::V4(v6.to_ipv4_mapped().ok_or("bad IPv4 address in table")?),
        6 => IpAddr::V6(v6),
        f => return Err(format!("bad address family {f} in table")),
    };
    Ok(SocketAddr::new(ip, u16::from_le_bytes([b[17], b[18]])))
}

/// Bytes of one rank's row before its rail entries: host identity, PID
/// (u32), then the automatic `shm` rail's listener (port 0: none).
const ROW_HEAD: usize = HOST_ID_LEN + 4 + ENTRY;

/// Table wire format: magic, ranks (u32), rails (u16), then `ranks` rows
/// of host identity (32), PID (4), `shm` listener entry, and `rails` entries; an
/// entry is family (u8), IPv6 or mapped IPv4 (16), port (u16).
pub(crate) fn encode_table(t: &[Row], rails: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(10 + t.len() * (ROW_HEAD + rails * ENTRY));
    out.extend_from_slice(&TABLE_MAGIC.to_le_bytes());
    out.extend_from_slice(&(t.len() as u32).to_le_bytes());
    out.extend_from_slice(&(rails as u16).to_le_bytes());
    let none = SocketAddr::from(([0, 0, 0, 0], 0));
    for row in t {
        out.extend_from_slice(&row.host.0);
        out.extend_from_slice(&row.pid.to_le_bytes());
        encode_addr(row.shm.as_ref().unwrap_or(&none), &mut out);
        for a in &row.rails {
            encode_addr(a, &mut out);
        }
    }
    out
}

/// Refusal wire format: magic, version (u16), length (u32), then that many
/// bytes of UTF-8 reason (at most [`MAX_REASON`]).
fn encode_refusal(reason: &str) -> Vec<u8> {
    let mut text = reason.as_bytes();
    if text.len() > MAX_REASON {
        let mut end = MAX_REASON;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        text = &text[..end];
    }
    let mut out = Vec::with_capacity(10 + text.len());
    out.extend_from_slice(&REFUSAL_MAGIC.to_le_bytes());
    out.extend_from_slice(&REFUSAL_VERSION.to_le_bytes());
    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    out.extend_from_slice(text);
    out
}

/// The reason of a refusal whose 10-byte head was read.
fn read_refusal(s: &mut impl Read, head: &[u8; 10]) -> String {
    let len = u32::from_le_bytes([head[6], head[7], head[8], head[9]]) as usize;
    let mut text = vec![0u8; len.min(MAX_REASON)];
    match s.read_exact(&mut text) {
        Ok(()) => String::from_utf8_lossy(&text).into_owned(),
        Err(e) => format!("(its reason could not be read: {e})"),
    }
}

fn decode_row(b: &[u8]) -> Result<Row, String> {
    let mut host = [0u8; HOST_ID_LEN];
    host.copy_from_slice(&b[..HOST_ID_LEN]);
    let pid = u32::from_le_bytes([b[HOST_ID_LEN], b[HOST_ID_LEN + 1], b[HOST_ID_LEN + 2], b[HOST_ID_LEN + 3]]);
    let shm = Some(decode_addr(&b[HOST_ID_LEN + 4..ROW_HEAD])?).filter(|a| a.port() != 0);
    let rails = b[ROW_HEAD..].chunks_exact(ENTRY).map(decode_addr).collect::<Result<_, _>>()?;
    Ok(Row { host: HostId(host), pid, shm, rails })
}

/// Reads a table from a stream, refusing anything beyond the bounds.
pub(crate) fn read_table(s: &mut impl Read, max_ranks: u32, rails: usize) -> Result<Table, String> {
    let (t, nr) = read_any_table(s, max_ranks)?;
    if nr != rails {
        return Err(format!("address table of {} ranks x {nr} rails (expected {rails} rails)", t.len()));
    }
    Ok(t)
}

/// Reads a table of any rail count (at most [`MAX_RAILS`]); a refusal
/// from rank 0 in its place is an error carrying rank 0's reason.
fn read_any_table(s: &mut impl Read, max_ranks: u32) -> Result<(Table, usize), String> {
    let mut head = [0u8; 10];
    s.read_exact(&mut head).map_err(|e| format!("reading address table: {e}"))?;
    let magic = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let ranks = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let nr = u16::from_le_bytes([head[8], head[9]]) as usize;
    if magic == REFUSAL_MAGIC {
        return Err(format!("rank 0 refused this rank: {}", read_refusal(s, &head)));
    }
    if magic != TABLE_MAGIC {
        return Err("not an address table (of this protocol version)".into());
    }
    if ranks == 0 || ranks > max_ranks || nr == 0 || nr > MAX_RAILS {
        return Err(format!(
            "address table of {ranks} ranks x {nr} rails (expected at most {max_ranks} x {MAX_RAILS})"
        ));
    }
    let row = ROW_HEAD + nr * ENTRY;
    let mut body = vec![0u8; ranks as usize * row];
    s.read_exact(&mut body).map_err(|e| format!("reading address table: {e}"))?;
    Ok((body.chunks_exact(row).map(decode_row).collect::<Result<_, _>>()?, nr))
}

/// Rank 0 gives up: every rank that joined hears why (rather than a
/// closed connection), and so does the user of rank 0.
fn refuse_all(joined: Vec<TcpStream>, reason: String) -> Error {
    let bytes = encode_refusal(&reason);
    for mut s in joined {
        let _ = s.write_all(&bytes);
    }
    setup_err(reason)
}

/// Binds one listener per rail on its local address.
pub(crate) fn bind_rails(me: &Me) -> Result<Vec<TcpListener>, Error> {
    me.rails
        .iter()
        .enumerate()
        .map(|(k, r)| {
            tcp::listen(r.ip, 0, &me.cfg.socket)
                .map_err(|e| setup_err(format!("rail {k} ({}): cannot listen on {}: {e}", me.cfg.rails[k], r.ip)))
        })
        .collect()
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))
}

/// Rank 0: waits for every other rank, then sends everyone the table.
pub(crate) fn gather(me: &Me, listeners: &[TcpListener], mine: Row, deadline: Instant) -> Result<Table, Error> {
    let n = me.size as usize;
    let mut table: Vec<Option<Row>> = vec![None; n];
    table[0] = Some(mine);
    let mut joined: Vec<TcpStream> = Vec::new();
    for l in listeners {
        l.set_nonblocking(true)?;
    }
    let mut turn = 0;
    while joined.len() + 1 < n {
        turn += 1;
        let accepted = listeners.iter().find_map(|l| match l.accept() {
            Ok(x) => Some(Ok(x)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Err(e) => Some(Err(e)),
        });
        let (mut s, from) = match accepted {
            Some(x) => x?,
            None => {
                if Instant::now() >= deadline {
                    let missing: Vec<usize> = (0..n).filter(|&r| table[r].is_none()).collect();
                    let at: Vec<String> =
                        listeners.iter().filter_map(|l| l.local_addr().ok()).map(|a| a.to_string()).collect();
                    return Err(setup_err(format!(
                        "ranks {missing:?} did not join at {} within the setup timeout",
                        at.join(", ")
                    )));
                }
                // Sleep little at first (ranks start together), more later.
                std::thread::sleep(Duration::from_millis(if turn < 1000 { 1 } else { 10 }));
                continue;
            }
        };
        s.set_nonblocking(false)?;
        let taken: Vec<bool> = table.iter().map(Option::is_some).collect();
        let check = |p: &PeerHello| {
            me.check_identity(p, BOOT_RAIL).map_err(HandshakeError::Identity)?;
            if taken[p.rank as usize] {
                Err(HandshakeError::Identity(format!("rank {} joined twice", p.rank)))
            } else {
                Ok(())
            }
        };
        let peer = match handshake::accept(&mut s, &me.hello(BOOT_RAIL), me.key(), me.cfg.handshake_timeout, check) {
            Ok(p) => p,
            Err(e) => {
                // A stranger or a broken peer: refuse it, keep waiting.
                tracing::warn!("refused a connection from {from} at the root: {e}");
                continue;
            }
        };
        s.set_read_timeout(Some(remaining(deadline).min(me.cfg.handshake_timeout)))?;
        let row = read_any_table(&mut s, 1);
        let (row, count) = match row {
            Ok(r) => r,
            Err(e) => return Err(refuse_all(joined, format!("rank {} sent no address table: {e}", peer.rank))),
        };
        if let Err(why) = me.check_rail_count(peer.rank, count) {
            // Its row was read whole: closing now sends no reset that
            // could overtake the reason.
            joined.push(s);
            return Err(refuse_all(joined, why));
        }
        table[peer.rank as usize] = row.into_iter().next();
        joined.push(s);
    }
    let table: Table = table.into_iter().map(|r| r.expect("every rank joined")).collect();
    let bytes = encode_table(&table, me.cfg.rails.len());
    for mut s in joined {
        s.write_all(&bytes)?;
    }
    Ok(table)
}

/// Other ranks: join at the root (the first of its addresses that
/// answers, trying each in turn) and learn the table.
pub(crate) fn join(me: &Me, roots: &[SocketAddr], mine: Row, deadline: Instant) -> Result<Table, Error> {
    let mut turn = 0usize;
    let all = || roots.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", ");
    // Since when every attempt was refused (nothing listens there).
    let mut refused_since: Option<Instant> = None;
    let mut said = Instant::now();
    let (mut s, root) = loop {
        let root = roots[turn % roots.len()];
        turn += 1;
        match TcpStream::connect_timeout(&root, remaining(deadline).min(Duration::from_secs(2))) {
            Ok(s) => break (s, root),
            Err(e) if Instant::now() >= deadline => {
                return Err(setup_err(format!(
                    "cannot reach the root (rank 0) at {} within the setup timeout ({:?}, MULTIRAIL_SETUP_TIMEOUT): {e}",
                    all(),
                    me.cfg.setup_timeout
                )));
            }
            Err(e) => {
                if e.kind() == std::io::ErrorKind::ConnectionRefused {
                    let since = *refused_since.get_or_insert_with(Instant::now);
                    if me.cfg.root_refused_limit.is_some_and(|l| since.elapsed() >= l) {
                        return Err(setup_err(format!(
                            "nothing listens at {} (connection refused for {:?}): start rank 0 (the server) first",
                            all(),
                            since.elapsed()
                        )));
                    }
                } else {
                    refused_since = None;
                }
                if said.elapsed() >= Duration::from_secs(5) {
                    said = Instant::now();
                    tracing::info!("still waiting for the root (rank 0) at {}: {e}", all());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    let peer = handshake::connect(&mut s, &me.hello(BOOT_RAIL), me.key(), me.cfg.handshake_timeout)
        .map_err(|e| setup_err(format!("root at {root}: {e}")))?;
    if peer.rank != 0 {
        return Err(setup_err(format!("the root at {root} says it is rank {}, not 0", peer.rank)));
    }
    s.write_all(&encode_table(&[mine], me.cfg.rails.len()))?;
    s.set_read_timeout(Some(remaining(deadline)))?;
    let t = read_table(&mut s, me.size, me.cfg.rails.len()).map_err(|e| setup_err(format!("root at {root}: {e}")))?;
    if t.len() != me.size as usize {
        return Err(setup_err(format!("the root sent {} ranks, the job has {}", t.len(), me.size)));
    }
    // Loopback rails cannot join hosts: say so instead of connecting to
    // ourselves.
    let own_host = root.ip().is_loopback();
    if let Some((r, a)) = t
        .iter()
        .enumerate()
        .flat_map(|(r, row)| row.rails.iter().map(move |a| (r, a)))
        .find(|(_, a)| a.ip().is_loopback())
        && !own_host
    {
        return Err(setup_err(format!(
            "rank {r} offers a loopback rail ({a}), unreachable from another host: \
                 set --rails / MULTIRAIL_RAILS on every host to the interfaces that connect them (see `multirail info`)"
        )));
    }
    Ok(t)
}

/// Why a rail connection attempt failed.
#[derive(Debug)]
pub(crate) struct ConnectError {
    /// Nothing listens there or the peer refused us for good: its process
    /// is gone (or another job took its place).
    pub refused: bool,
    pub message: String,
}

/// Every rank publishes its row of the address table through the
/// launcher's PMIx server (put, commit, fence) and fetches everyone's: no
/// meeting point of our own.
pub(crate) fn pmix_exchange(me: &Me, mine: Row) -> Result<Table, Error> {
    use multirail_pmix::Pmix;
    let pmix_err = |what: &str, e: multirail_pmix::PmixError| {
        setup_err(format!("PMIx wire-up: {what}: {e} (set MULTIRAIL_ROOT=host:port to meet without PMIx)"))
    };
    let rails = me.cfg.rails.len();
    let p = Pmix::init().map_err(|e| pmix_err("init", e))?;
    if p.rank() != me.rank {
        return Err(setup_err(format!("PMIx says this is rank {}, the launcher said {}", p.rank(), me.rank)));
    }
    let size = p.size().map_err(|e| pmix_err("job size", e))?;
    tracing::info!("wire-up through PMIx (namespace {}, {size} ranks)", p.namespace());
    if size != me.size {
        return Err(setup_err(format!("PMIx says the job has {size} ranks, the launcher said {}", me.size)));
    }
    p.put(PMIX_KEY, &encode_table(&[mine], rails)).map_err(|e| pmix_err("put", e))?;
    p.commit().map_err(|e| pmix_err("commit", e))?;
    p.fence().map_err(|e| pmix_err("fence", e))?;
    let mut table = Vec::with_capacity(size as usize);
    for r in 0..size {
        let b = p.get(r, PMIX_KEY).map_err(|e| pmix_err(&format!("rank {r}'s addresses"), e))?;
        let row = read_table(&mut &b[..], 1, rails).map_err(|e| setup_err(format!("rank {r} via PMIx: {e}")))?;
        table.push(row.into_iter().next().ok_or_else(|| setup_err(format!("rank {r} via PMIx: an empty row")))?);
    }
    Ok(table)
}

/// Connects rail `k` to `peer` at `addr`, proposing connection generation
/// `generation`, and authenticates it.
pub(crate) fn connect_rail(
    me: &Me,
    peer: u32,
    k: usize,
    addr: SocketAddr,
    generation: u32,
) -> Result<Conn, ConnectError> {
    use multirail_proto::wire::RejectReason;
    let local = &me.rails[k];
    let mut stream =
        tcp::connect(local.ip, local.iface.as_deref(), addr, &me.cfg.socket).map_err(|e| ConnectError {
            refused: e.kind() == std::io::ErrorKind::ConnectionRefused,
            message: format!("rail {k} to rank {peer}: connect {} -> {addr}: {e}", local.ip),
        })?;
    let hello = handshake::connect(&mut stream, &me.hello_gen(k as u16, generation), me.key(), me.cfg.handshake_timeout)
        .map_err(|e| {
            let refused = matches!(
                &e,
                HandshakeFailure::Refused(HandshakeError::Rejected(r)) if *r != RejectReason::Superseded && *r != RejectReason::Timeout
            ) || matches!(&e, HandshakeFailure::Refused(HandshakeError::BadKey | HandshakeError::WrongJob { .. }));
            ConnectError { refused, message: format!("rail {k} to rank {peer} at {addr}: {e}") }
        })?;
    if hello.rank != peer {
        return Err(ConnectError {
            refused: true,
            message: format!("rail {k}: {addr} answered as rank {}, expected rank {peer}", hello.rank),
        });
    }
    Ok(Conn { peer, rail: k, stream, hello })
}

/// Accepts one rail connection on listener `k` and authenticates it;
/// `admit` vets the (not yet authenticated) HELLO beyond the job's rules:
/// the connection generation.
pub(crate) fn accept_rail(
    me: &Me,
    k: usize,
    mut stream: TcpStream,
    admit: impl FnOnce(&PeerHello) -> Result<(), HandshakeError>,
) -> Result<Conn, HandshakeFailure> {
    stream.set_nonblocking(false)?;
    tcp::tune(&stream, &me.cfg.socket)?;
    let hello = handshake::accept(&mut stream, &me.hello(k as u16), me.key(), me.cfg.handshake_timeout, |p| {
        me.check(p, k as u16).map_err(HandshakeError::Identity)?;
        admit(p)
    })?;
    Ok(Conn { peer: hello.rank, rail: k, stream, hello })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_roundtrip_and_bounds() {
        let t: Table = vec![
            Row {
                host: HostId::from_parts([7; 16], 1, 2),
                pid: 4242,
                shm: Some("127.0.0.1:4000".parse().unwrap()),
                rails: vec!["127.0.0.1:5000".parse().unwrap(), "[::1]:6000".parse().unwrap()],
            },
            Row {
                host: HostId::default(),
                pid: 0,
                shm: None,
                rails: vec!["10.0.0.2:1".parse().unwrap(), "10.1.0.2:65535".parse().unwrap()],
            },
        ];
        let b = encode_table(&t, 2);
        assert_eq!(read_table(&mut &b[..], 2, 2).unwrap(), t);
        assert!(read_table(&mut &b[..], 1, 2).is_err(), "more ranks than allowed");
        assert!(read_table(&mut &b[..], 2, 3).is_err(), "rail count mismatch");
        assert!(read_table(&mut &b[..b.len() - 1], 2, 2).is_err(), "truncated");
        let mut bad = b.clone();
        bad[10 + HOST_ID_LEN + 4 + ENTRY] = 9;
        assert!(read_table(&mut &bad[..], 2, 2).is_err(), "bad family");
        let mut huge = b.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(read_table(&mut &huge[..], MAX_RANKS, 2).is_err(), "no allocation from a claimed size");
        for (magic, what) in [(0x4d52_5442u32, "MRTB"), (0x4d52_5448, "MRTH, without PIDs")] {
            let mut old = b.clone();
            old[..4].copy_from_slice(&magic.to_le_bytes());
            assert!(read_table(&mut &old[..], 2, 2).unwrap_err().contains("protocol version"), "{what}");
        }
    }

    #[test]
    fn a_refusal_in_place_of_the_table_carries_its_reason() {
        let b = encode_refusal("rank 1 has 1 rails, rank 0 has 2");
        assert_eq!(&b[..4], b"ETRM", "magic MRTE, little-endian");
        let e = read_table(&mut &b[..], 2, 2).unwrap_err();
        assert_eq!(e, "rank 0 refused this rank: rank 1 has 1 rails, rank 0 has 2");
        let long = "é".repeat(MAX_REASON);
        let b = encode_refusal(&long);
        assert!(b.len() <= 10 + MAX_REASON, "bounded");
        assert!(read_table(&mut &b[..], 2, 2).unwrap_err().ends_with('é'), "cut at a character boundary");
        // A claimed length beyond the bound reads no more than the bound.
        let mut huge = encode_refusal("x");
        huge[6..10].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(read_table(&mut &huge[..], 2, 2).unwrap_err().contains("could not be read"));
    }
}
