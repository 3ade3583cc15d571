//! Single-copy transfers between processes: cross-memory attach (CMA).
//!
//! Through the ring a payload is copied twice: into the ring by the
//! writer, out of it by the reader. With CMA the writer *lends* the
//! payload instead: it writes only the frame header and a 16-byte
//! descriptor (the payload's address in its own memory and its length)
//! into the ring, and keeps the payload alive; the reader copies the bytes
//! straight from the writer's memory into the destination with one
//! `process_vm_readv(2)`, then counts the loan as returned in its ring's
//! consumer line (`lent_done`, [`super::ring::Consumer::lent_copied`]).
//! The writer frees lent payloads, oldest first, as that count grows.
//!
//! ## Who may read whom
//!
//! `process_vm_readv` needs ptrace access to the other process: same user,
//! and under Yama `ptrace_scope` 1 only an ancestor (or a process allowed
//! with `PR_SET_PTRACER`; we do not relax that for the user). Containers
//! may also put the peer in another PID namespace, where its PID means
//! nothing. So nothing is assumed: when a stream is set up each side
//! publishes its PID and the address of an 8-byte random probe, and each
//! side tries to read the other's probe. A side that reads the right value
//! answers `Y` ("I can read you"); only then does the other lend to it.
//! Either direction may be on or off.
//!
//! ## A loan withdrawn
//!
//! The writer drops its lent payloads when the stream ends, perhaps while
//! the reader is still copying (a rail failed, a process is exiting). It
//! first marks its ring closed, then (after a `SeqCst` fence) frees. The
//! reader, after each copy, fences and checks that flag: set, the bytes it
//! just copied may be garbage, and the copy is an error, never data. A
//! copy from memory already unmapped fails with `EFAULT`, the same error.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;

/// Payloads of at least this many bytes are lent with
/// `MULTIRAIL_SHM_CMA=on`.
pub const DEFAULT_MIN: usize = 64 << 10;

/// What each side sends the other after the segment is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offer {
    /// 1 if this side lends and reads (`MULTIRAIL_SHM_CMA` not `off`).
    pub enabled: bool,
    pub pid: u32,
    /// Address of the probe in the sender's memory.
    pub addr: u64,
    /// The probe's value.
    pub value: u64,
}

impl Offer {
    pub const LEN: usize = 24;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&u32::from(self.enabled).to_le_bytes());
        b[4..8].copy_from_slice(&self.pid.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16..24].copy_from_slice(&self.value.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; Self::LEN]) -> Offer {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Offer { enabled: u32_at(0) == 1, pid: u32_at(4), addr: u64_at(8), value: u64_at(16) }
    }
}

/// What the handshake decided for one end of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cma {
    /// The peer's PID, when we can read its memory.
    pub read_from: Option<i32>,
    /// The peer can read ours: lend it large payloads.
    pub lend: bool,
}

/// A random-ish 64-bit value (no need for a CSPRNG: it only tells a read
/// of the right process from a read of some other one).
fn probe_value() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id() as u64);
    h.finish() | 1
}

/// Runs the CMA handshake over the stream's Unix socket (blocking, with
/// the caller's timeouts): send our offer, read the peer's, probe, answer,
/// read the peer's answer. `enabled` false still runs it (and says no), so
/// both sides always speak the same protocol.
pub fn handshake(sock: &UnixStream, enabled: bool) -> io::Result<Cma> {
    let probe = Box::new(probe_value());
    let ours = Offer { enabled, pid: std::process::id(), addr: &*probe as *const u64 as u64, value: *probe };
    (&*sock).write_all(&ours.encode())?;
    let mut b = [0u8; Offer::LEN];
    (&*sock).read_exact(&mut b)?;
    let theirs = Offer::decode(&b);
    let read_from = (enabled && theirs.enabled && can_read(&theirs)).then_some(theirs.pid as i32);
    (&*sock).write_all(&[if read_from.is_some() { b'Y' } else { b'N' }])?;
    let mut verdict = [0u8; 1];
    (&*sock).read_exact(&mut verdict)?;
    // The peer has read our probe (or given up): it may go now.
    drop(probe);
    Ok(Cma { read_from, lend: enabled && verdict[0] == b'Y' })
}

/// This process's PID, if it may read its own memory with
/// `process_vm_readv` (both ends of a stream in one process).
pub fn self_readable() -> Option<i32> {
    let probe = probe_value();
    let me = Offer { enabled: true, pid: std::process::id(), addr: &probe as *const u64 as u64, value: probe };
    can_read(&me).then_some(me.pid as i32)
}

/// Whether `offer`'s probe reads back right from its process.
fn can_read(offer: &Offer) -> bool {
    let Ok(pid) = i32::try_from(offer.pid) else { return false };
    let mut got = [0u8; 8];
    read_from(pid, offer.addr, &mut got).is_ok() && u64::from_le_bytes(got) == offer.value
}

/// Copies `dst.len()` bytes from address `addr` of process `pid` into
/// `dst` (several calls if the kernel copies less at once).
pub fn read_from(pid: i32, addr: u64, dst: &mut [u8]) -> io::Result<()> {
    let mut done = 0usize;
    // Ends: every round copies at least one byte or returns.
    while done < dst.len() {
        let left = dst.len() - done;
        let local = libc::iovec { iov_base: dst[done..].as_mut_ptr().cast(), iov_len: left };
        let remote = libc::iovec { iov_base: (addr as usize + done) as *mut libc::c_void, iov_len: left };
        // SAFETY: `local` describes `left` writable bytes of `dst`, which
        // we borrow mutably for the call; `remote` is only an address in
        // the other process, which the kernel checks (EFAULT if unmapped)
        // and never dereferences in ours.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "process_vm_readv copied nothing"));
        }
        done += n as usize;
    }
    Ok(())
}

/// The descriptor that replaces a lent payload in the ring: address and
/// length, little-endian.
pub const DESCRIPTOR_LEN: usize = 16;

pub fn descriptor(addr: u64, len: u64) -> [u8; DESCRIPTOR_LEN] {
    let mut b = [0u8; DESCRIPTOR_LEN];
    b[..8].copy_from_slice(&addr.to_le_bytes());
    b[8..].copy_from_slice(&len.to_le_bytes());
    b
}

pub fn parse_descriptor(b: &[u8]) -> (u64, u64) {
    let addr = u64::from_le_bytes(b[..8].try_into().expect("descriptor"));
    let len = u64::from_le_bytes(b[8..16].try_into().expect("descriptor"));
    (addr, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_round_trip() {
        let o = Offer { enabled: true, pid: 4242, addr: 0x7fff_0000_1234, value: 0xdead_beef_0bad_f00d };
        assert_eq!(Offer::decode(&o.encode()), o);
        let off = Offer { enabled: false, ..o };
        assert_eq!(Offer::decode(&off.encode()), off);
        assert_eq!(parse_descriptor(&descriptor(7, 1 << 20)), (7, 1 << 20));
    }

    #[test]
    fn a_process_reads_itself_and_a_wrong_address_is_an_error() {
        let src: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let me = std::process::id() as i32;
        match read_from(me, src.as_ptr() as u64, &mut dst) {
            Ok(()) => assert_eq!(dst, src),
            // Seccomp filters (some containers) forbid the call: nothing to test.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) || e.raw_os_error() == Some(libc::ENOSYS) => {
                eprintln!("skipped: process_vm_readv is not allowed here ({e})");
                return;
            }
            Err(e) => panic!("{e}"),
        }
        let e = read_from(me, 8, &mut dst[..8]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
    }

    #[test]
    fn the_handshake_agrees_both_ways_and_off_means_off() {
        for (a_on, b_on) in [(true, true), (true, false), (false, true)] {
            let (a, b) = UnixStream::pair().unwrap();
            let t = std::thread::spawn(move || handshake(&b, b_on).unwrap());
            let ca = handshake(&a, a_on).unwrap();
            let cb = t.join().unwrap();
            if a_on && b_on && ca.read_from.is_none() {
                eprintln!("skipped: process_vm_readv is not allowed here");
                continue;
            }
            let both = a_on && b_on;
            assert_eq!(ca.lend, both);
            assert_eq!(cb.lend, both);
            assert_eq!(ca.read_from.is_some(), both);
            assert_eq!(cb.read_from.is_some(), both);
        }
    }
}
