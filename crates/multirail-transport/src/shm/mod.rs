//! # Shared-memory byte streams between processes on one host
//!
//! The building blocks of the `shm` rail: a non-blocking, ordered,
//! reliable byte stream between two processes, carried by two byte rings
//! in one shared memory segment, with a Unix socket for wake-ups, fd
//! passing and peer-death detection.
//!
//! * [`ring`]: a single-producer/single-consumer byte ring over memory it
//!   does not own, with the wake protocol ("eventcount") below;
//! * [`segment`]: a `memfd` segment holding a versioned header and two
//!   rings (one per direction), created by one side and opened, after
//!   validation, by the other;
//! * [`doorbell`]: passing the segment's fd over a `UnixStream`
//!   (`SCM_RIGHTS`), and one-byte wake-ups over the same socket;
//! * [`stream`]: [`ShmStream`], all three tied into a byte stream with
//!   `io::Read`/`io::Write`, `WouldBlock` when empty/full, and an fd for
//!   epoll.
//!
//! ## Segment layout (version 1)
//!
//! All integers little-endian; everything is an offset from the start of
//! the segment, never a pointer, so the two processes may map it at
//! different addresses.
//!
//! ```text
//! offset 0     segment header (128 bytes)
//!                0  magic        8 bytes  "MRSHMSEG"
//!                8  version      u32      1
//!               12  header_len   u32      128
//!               16  capacity     u64      data bytes per ring (power of two, 4 KiB..=1 GiB)
//!               24  ring[0]      u64      offset of the creator -> opener ring
//!               32  ring[1]      u64      offset of the opener -> creator ring
//!               40  total_len    u64      segment length = file size
//!               48  claims       u32      atomic; bit 0 creator's, bit 1 opener's endpoints taken
//! offset 128   ring 0  (384 + capacity bytes)
//! then         ring 1  (384 + capacity bytes)
//!
//! ring, at a 128-byte aligned offset:
//!      0  producer's line (128 B): head u64 (bytes ever written), producer_closed u32
//!    128  consumer's line (128 B): tail u64 (bytes ever read),    consumer_closed u32,
//!                                   at +16 lent_done u64 (lent payloads copied, see [`cma`])
//!    256  wake line       (128 B): consumer_wake u32, producer_wake u32
//!    384  data area, `capacity` bytes; stream byte n is at data[n % capacity]
//! ```
//!
//! Lines are 128 bytes (two cache lines) so that the producer's and the
//! consumer's counters never share a cache line, even with the
//! adjacent-line prefetcher. Each side writes only its own line, plus the
//! wake line when it goes to sleep or takes a wake request.
//!
//! ## Wake protocol (no lost wake-ups)
//!
//! A side that cannot go on (consumer: ring empty; producer: ring full)
//! may sleep in `poll`/`epoll` on the doorbell socket. To sleep safely:
//!
//! 1. **arm**: store 1 into its wake flag (`consumer_wake` or
//!    `producer_wake`), then a `SeqCst` fence;
//! 2. **re-check** the ring (load the other side's counter); if it can go
//!    on now (data / space / closed), withdraw the flag and do not sleep
//!    ([`ring::Consumer::arm`] and [`ring::Producer::arm_for_space`]
//!    return `true`);
//! 3. otherwise sleep until the doorbell socket is readable.
//!
//! The other side, after changing the ring (publishing `head` or `tail`
//! with a `Release` store): a `SeqCst` fence, then load the wake flag; if
//! set, clear it (`swap`) and ring the doorbell
//! ([`ring::Producer::take_consumer_wake`],
//! [`ring::Consumer::take_producer_wake`]).
//!
//! Why no wake-up is lost: this is the store-buffering (Dekker) pattern.
//! The sleeper does *store flag; fence; load counter*, the waker does
//! *store counter; fence; load flag*. With a `SeqCst` fence between the
//! store and the load on both sides, the two fences are ordered one before
//! the other in the single total order of `SeqCst` operations, and
//! whichever comes second sees the store made before the first. So either
//! the sleeper sees the new counter (and does not sleep), or the waker
//! sees the flag (and rings), or both (a spurious wake-up, harmless).
//! Never neither. A byte written to the doorbell stays in the socket
//! until read, so a wake-up rung between the re-check and the sleep is
//! not lost either: the socket is already readable when the sleeper polls.
//!
//! The doorbell bytes carry no meaning but "look at the rings again"; one
//! socket carries both directions' wake-ups. Its reader must drain it
//! *before* arming (never between arming and sleeping), which
//! [`ShmStream::arm_for_sleep`] does.
//!
//! ## Close and peer death
//!
//! A clean close sets the producer's `closed` flag (with `Release`, after
//! its last `head`) and shuts the socket down. The reader drains what is
//! in the ring, then sees end of stream. A peer that dies without closing
//! closes its socket too (the kernel does it), so the doorbell reports
//! EOF at once while the `closed` flag is unset: that is an error, not end
//! of stream.
//!
//! ## Nothing left behind
//!
//! The segment is a `memfd` (an anonymous file) passed by fd over the
//! socket: it has no name in any file system, and the kernel frees it
//! when the last fd and mapping are gone, including after a crash. Only
//! if `memfd_create` is unavailable (very old kernels, seccomp filters)
//! is a file created in `/dev/shm` and unlinked at once, before its fd is
//! sent; a crash between those two calls would leave it behind.
//!
//! ## Trust
//!
//! The peer is a process of the same job (it passed the authenticated
//! HELLO), but bugs happen: every header field is validated against the
//! file size before use, the segment must be sealed against shrinking
//! (so it cannot be truncated under us, which would be a `SIGBUS`), and
//! ring counters are checked on every load. A peer can still send us
//! garbage bytes or stop making progress; it cannot make us read or write
//! outside the segment.

pub mod cma;
pub mod doorbell;
pub mod ring;
pub mod segment;
pub mod stream;

use std::io;

pub use doorbell::{Doorbell, DoorbellError, recv_fd, send_fd};
pub use ring::{Consumer, Producer, RingError};
pub use segment::{Segment, SegmentError, SegmentHeader, Side};
pub use stream::ShmStream;

/// Errors of the shared-memory building blocks.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// A system call failed.
    #[error("shared memory: {0}")]
    Io(#[from] io::Error),
    /// The peer gave us a segment we refuse.
    #[error("invalid shared segment: {0}")]
    Segment(#[from] SegmentError),
    /// A ring is misused (API) or corrupt (peer).
    #[error("shared ring: {0}")]
    Ring(#[from] RingError),
    /// The fd-passing message is not what the protocol expects.
    #[error("bad fd-passing message: {0}")]
    FdMessage(String),
    /// API misuse: this side's endpoints were taken already (in this or
    /// another mapping of the segment).
    #[error("the {0:?} side's endpoints of this segment are already taken")]
    SideTaken(Side),
}

impl From<ShmError> for io::Error {
    fn from(e: ShmError) -> io::Error {
        match e {
            ShmError::Io(e) => e,
            ShmError::SideTaken(_) | ShmError::Ring(RingError::BadCapacity(_) | RingError::Misaligned) => {
                io::Error::new(io::ErrorKind::InvalidInput, e)
            }
            other => io::Error::new(io::ErrorKind::InvalidData, other),
        }
    }
}

/// The CPU the calling thread runs on now (`sched_getcpu(3)`: glibc reads
/// it from the thread's rseq area or the vDSO, without a system call), if
/// the kernel tells.
pub fn current_cpu() -> Option<u32> {
    // SAFETY: sched_getcpu takes no arguments and touches no memory of ours.
    let c = unsafe { libc::sched_getcpu() };
    u32::try_from(c).ok()
}

/// Moves the calling thread to `cpu` now, then gives it back every CPU it
/// was allowed before (`sched_setaffinity(2)` twice): the scheduler keeps
/// it there until it has a reason to move it, and is not bound to.
/// Returns the CPU the thread ran on while `cpu` was the only one it could
/// use (`cpu`, as the kernel guarantees); none, and nothing changes, when
/// `cpu` is not among the CPUs the thread may use (a rank pinned by its
/// launcher stays pinned).
pub fn move_to_cpu(cpu: u32) -> io::Result<Option<u32>> {
    let cpu = cpu as usize;
    if cpu >= libc::CPU_SETSIZE as usize {
        return Ok(None);
    }
    // SAFETY: cpu_set_t is plain bits; all zeros is the empty set.
    let mut old: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `old` is a valid cpu_set_t of the size passed; pid 0 is the
    // calling thread.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut old) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `cpu` is below CPU_SETSIZE (checked above).
    if !unsafe { libc::CPU_ISSET(cpu, &old) } {
        return Ok(None);
    }
    // SAFETY: as for `old`.
    let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut one) };
    // SAFETY: valid sets of the size passed, for the calling thread. The
    // kernel moves the thread to `cpu` before the first call returns.
    let moved = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one) } == 0;
    let err = (!moved).then(io::Error::last_os_error);
    let ran_on = current_cpu();
    // SAFETY: as above; restores the mask read at the start.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &old) } != 0 {
        return Err(io::Error::last_os_error());
    }
    match err {
        Some(e) => Err(e),
        None => Ok(ran_on),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This thread's affinity, as /proc/thread-self/status lists it.
    fn allowed() -> String {
        let st = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        st.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_string()
    }

    /// A move lands the thread on the CPU asked for and leaves its
    /// affinity as it was; a CPU it may not use changes nothing.
    #[test]
    fn a_thread_moves_to_a_cpu_and_keeps_its_affinity() {
        std::thread::spawn(|| {
            let before = allowed();
            let here = current_cpu().expect("sched_getcpu");
            // A CPU this thread may not use: past every CPU there is.
            assert_eq!(move_to_cpu(libc::CPU_SETSIZE as u32 - 1).unwrap(), None);
            assert_eq!(move_to_cpu(u32::MAX).unwrap(), None);
            assert_eq!(allowed(), before);
            // SAFETY: a zeroed cpu_set_t is empty; sched_getaffinity fills
            // it for this thread.
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            assert_eq!(unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) }, 0);
            // SAFETY: every `c` is below CPU_SETSIZE.
            let Some(other) =
                (0..libc::CPU_SETSIZE as u32).find(|&c| c != here && unsafe { libc::CPU_ISSET(c as usize, &set) })
            else {
                eprintln!("SKIPPED: this thread may use one CPU only");
                return;
            };
            assert_eq!(move_to_cpu(other).unwrap(), Some(other), "moved from {here}");
            assert_eq!(allowed(), before, "the affinity is given back");
        })
        .join()
        .unwrap();
    }
}
