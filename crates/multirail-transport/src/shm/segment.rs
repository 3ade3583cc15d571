//! The shared segment: a `memfd` with a versioned header and two rings.
//!
//! One side [`create`](Segment::create)s it and sends its fd to the other
//! (see [`super::doorbell::send_fd`]), which [`open`](Segment::open)s it.
//! `open` trusts nothing in the file: the size comes from `fstat`, the
//! header is copied out and every field checked against that size before
//! any ring is touched, and the file must be sealed against shrinking so
//! the peer cannot truncate it under our mapping. Layout: see the
//! [module docs](super).

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use rustix::fs::{FileType, MemfdFlags, SealFlags};
use rustix::io::Errno;
use rustix::mm::{MapFlags, ProtFlags};

use super::ShmError;
use super::ring::{self, Consumer, KeepAlive, Producer, RING_ALIGN};

/// First bytes of every segment.
pub const MAGIC: [u8; 8] = *b"MRSHMSEG";
/// Layout version this code writes and reads.
pub const VERSION: u32 = 1;
/// Bytes of the segment header; ring 0 starts right after it.
pub const HEADER_LEN: usize = 128;
/// Largest segment we create or accept.
pub const MAX_SEGMENT_LEN: u64 = (HEADER_LEN + 2 * ring::ring_len(ring::MAX_CAPACITY)) as u64;

/// Byte ranges of the header fields.
mod field {
    use std::ops::Range;
    pub const MAGIC: Range<usize> = 0..8;
    pub const VERSION: Range<usize> = 8..12;
    pub const HEADER_LEN: Range<usize> = 12..16;
    pub const CAPACITY: Range<usize> = 16..24;
    pub const RING0: Range<usize> = 24..32;
    pub const RING1: Range<usize> = 32..40;
    pub const TOTAL_LEN: Range<usize> = 40..48;
    /// Atomic u32 in the live mapping, not part of the parsed header.
    pub const CLAIMS: usize = 48;
}

/// Which end of the segment a process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Made the segment; produces into ring 0, consumes ring 1.
    Creator,
    /// Received the segment's fd; produces into ring 1, consumes ring 0.
    Opener,
}

/// Why a segment was refused. All of these mean the peer (or whatever
/// sent us the fd) is broken; nothing of the segment was used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SegmentError {
    #[error("not a regular file")]
    NotAFile,
    #[error("{len} bytes is too short for a segment header")]
    TooSmall { len: u64 },
    #[error("{len} bytes is larger than any segment we accept")]
    TooLarge { len: u64 },
    #[error("bad magic bytes")]
    BadMagic,
    #[error("unsupported layout version {0} (we speak {VERSION})")]
    Version(u32),
    #[error("header length {0} (expected {HEADER_LEN})")]
    HeaderLen(u32),
    #[error("ring capacity {0} is not a power of two between 4 KiB and 1 GiB")]
    Capacity(u64),
    #[error(
        "ring {ring} at offset {offset} is misaligned, overlaps the header or the other ring, or ends past the segment"
    )]
    RingOffset { ring: usize, offset: u64 },
    #[error("header says {header} bytes but the file has {file}")]
    Length { header: u64, file: u64 },
    #[error("the segment is not sealed against shrinking")]
    NotSealed,
}

/// The parsed, validated segment header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Data bytes per ring.
    pub capacity: u64,
    /// Offsets of ring 0 (creator -> opener) and ring 1 (opener -> creator).
    pub rings: [u64; 2],
    /// Segment length.
    pub total_len: u64,
}

fn u32_at(b: &[u8], r: std::ops::Range<usize>) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[r]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], r: std::ops::Range<usize>) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[r]);
    u64::from_le_bytes(a)
}

impl SegmentHeader {
    /// The standard layout for rings of `capacity` bytes.
    pub fn for_capacity(capacity: usize) -> Result<SegmentHeader, ShmError> {
        if !ring::valid_capacity(capacity) {
            return Err(ring::RingError::BadCapacity(capacity).into());
        }
        let ring = ring::ring_len(capacity) as u64;
        let r0 = HEADER_LEN as u64;
        Ok(SegmentHeader { capacity: capacity as u64, rings: [r0, r0 + ring], total_len: r0 + 2 * ring })
    }

    /// Writes the header (claims zero).
    pub fn emit(&self, buf: &mut [u8; HEADER_LEN]) {
        buf.fill(0);
        buf[field::MAGIC].copy_from_slice(&MAGIC);
        buf[field::VERSION].copy_from_slice(&VERSION.to_le_bytes());
        buf[field::HEADER_LEN].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        buf[field::CAPACITY].copy_from_slice(&self.capacity.to_le_bytes());
        buf[field::RING0].copy_from_slice(&self.rings[0].to_le_bytes());
        buf[field::RING1].copy_from_slice(&self.rings[1].to_le_bytes());
        buf[field::TOTAL_LEN].copy_from_slice(&self.total_len.to_le_bytes());
    }

    /// Parses and validates a header read from a file of `file_len` bytes.
    /// On success every ring lies inside the file, aligned, apart from the
    /// header and from the other ring.
    pub fn parse(buf: &[u8; HEADER_LEN], file_len: u64) -> Result<SegmentHeader, SegmentError> {
        if buf[field::MAGIC] != MAGIC {
            return Err(SegmentError::BadMagic);
        }
        let version = u32_at(buf, field::VERSION);
        if version != VERSION {
            return Err(SegmentError::Version(version));
        }
        let header_len = u32_at(buf, field::HEADER_LEN);
        if header_len as usize != HEADER_LEN {
            return Err(SegmentError::HeaderLen(header_len));
        }
        let capacity = u64_at(buf, field::CAPACITY);
        if usize::try_from(capacity).map_or(true, |c| !ring::valid_capacity(c)) {
            return Err(SegmentError::Capacity(capacity));
        }
        let total_len = u64_at(buf, field::TOTAL_LEN);
        if total_len != file_len {
            return Err(SegmentError::Length { header: total_len, file: file_len });
        }
        let ring_len = ring::ring_len(capacity as usize) as u64;
        let rings = [u64_at(buf, field::RING0), u64_at(buf, field::RING1)];
        for (i, &off) in rings.iter().enumerate() {
            let bad = off % RING_ALIGN as u64 != 0
                || off < HEADER_LEN as u64
                || off.checked_add(ring_len).is_none_or(|end| end > total_len);
            if bad {
                return Err(SegmentError::RingOffset { ring: i, offset: off });
            }
        }
        // Both rings are in range, so these additions cannot overflow.
        if rings[0] < rings[1] + ring_len && rings[1] < rings[0] + ring_len {
            return Err(SegmentError::RingOffset { ring: 1, offset: rings[1] });
        }
        Ok(SegmentHeader { capacity, rings, total_len })
    }
}

/// A shared mapping, unmapped on drop.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; Mapping itself only unmaps
// it, and every access goes through ring handles or atomics.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd`, read-write, shared.
    fn new(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping at an address the kernel picks: it
        // replaces nothing of ours. The caller checked that the file has
        // at least `len` bytes (and, for a peer's file, that it cannot
        // shrink), so touching the mapping cannot fault.
        let p = unsafe {
            rustix::mm::mmap(ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, fd, 0)?
        };
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Mapping { ptr, len })
    }

    fn claims(&self) -> &AtomicU32 {
        // SAFETY: offset 48 is inside the header (the mapping is at least
        // HEADER_LEN bytes) and 4-aligned (mappings are page-aligned); the
        // word is only accessed atomically once the segment is shared.
        unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(field::CLAIMS).cast::<u32>()) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we mapped exactly this range, and the last ring handle
        // (each holds an Arc of us) is gone.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Where a segment's memory comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backing {
    /// `memfd_create`: anonymous, sealed.
    Memfd,
    /// A file in /dev/shm, unlinked at once: no seals.
    DevShm,
}

/// A mapped shared segment. Dropping it unmaps nothing the rings still
/// use: each ring handle keeps the mapping alive.
pub struct Segment {
    map: Arc<Mapping>,
    fd: OwnedFd,
    header: SegmentHeader,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment").field("header", &self.header).field("addr", &self.map.ptr).finish()
    }
}

static DEVSHM_SEQ: AtomicU64 = AtomicU64::new(0);

fn create_devshm() -> io::Result<OwnedFd> {
    let mut last = None;
    for _ in 0..16 {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let path =
            format!("/dev/shm/multirail-{}-{}-{nanos}", std::process::id(), DEVSHM_SEQ.fetch_add(1, Ordering::Relaxed));
        match OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path) {
            Ok(f) => {
                std::fs::remove_file(&path)?;
                return Ok(f.into());
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free /dev/shm name")))
}

fn memfd() -> Result<OwnedFd, Errno> {
    rustix::fs::memfd_create("multirail-shm", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
}

/// Whether this host gives us sealable memfds (probed once).
fn memfd_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| memfd().is_ok())
}

/// `memfd_create` errors after which /dev/shm is tried.
fn memfd_unsupported(e: Errno) -> bool {
    matches!(e, Errno::NOSYS | Errno::PERM | Errno::ACCESS | Errno::INVAL)
}

impl Segment {
    /// Creates a segment with two rings of `ring_capacity` data bytes each
    /// (a power of two, 4 KiB..=1 GiB) in a `memfd`, sealed against
    /// growing and shrinking. Falls back to an unlinked file in /dev/shm
    /// if `memfd_create` is unavailable.
    pub fn create(ring_capacity: usize) -> Result<Segment, ShmError> {
        let header = SegmentHeader::for_capacity(ring_capacity)?;
        let (fd, backing) = match memfd() {
            Ok(fd) => (fd, Backing::Memfd),
            Err(e) if memfd_unsupported(e) => (create_devshm()?, Backing::DevShm),
            Err(e) => return Err(io::Error::from(e).into()),
        };
        Segment::init(fd, backing, header)
    }

    fn init(fd: OwnedFd, backing: Backing, header: SegmentHeader) -> Result<Segment, ShmError> {
        rustix::fs::ftruncate(&fd, header.total_len).map_err(io::Error::from)?;
        if backing == Backing::Memfd {
            rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
                .map_err(io::Error::from)?;
        }
        let map = Mapping::new(fd.as_fd(), header.total_len as usize)?;
        let mut buf = [0u8; HEADER_LEN];
        header.emit(&mut buf);
        // SAFETY: the mapping has at least HEADER_LEN bytes (total_len is
        // larger) and nobody else has the fd yet. The rings are zero: a
        // freshly truncated file reads as zeros.
        unsafe { ptr::copy_nonoverlapping(buf.as_ptr(), map.ptr.as_ptr(), HEADER_LEN) };
        Ok(Segment { map: Arc::new(map), fd, header })
    }

    /// Maps a segment received from a peer, after validating it: a
    /// regular file, no larger than [`MAX_SEGMENT_LEN`], sealed against
    /// shrinking (unless this host has no memfd at all, where the creator
    /// had to use an unsealable /dev/shm file), and a header that
    /// [`SegmentHeader::parse`] accepts for the file's size.
    pub fn open(fd: OwnedFd) -> Result<Segment, ShmError> {
        Segment::open_inner(fd, !memfd_available())
    }

    /// Like [`open`](Self::open), but accepts a segment that is not sealed
    /// against shrinking. Only for peers that are trusted not to truncate
    /// the file: a truncated mapping kills this process with `SIGBUS`.
    pub fn open_unsealed(fd: OwnedFd) -> Result<Segment, ShmError> {
        Segment::open_inner(fd, true)
    }

    fn open_inner(fd: OwnedFd, allow_unsealed: bool) -> Result<Segment, ShmError> {
        let st = rustix::fs::fstat(&fd).map_err(io::Error::from)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(SegmentError::NotAFile.into());
        }
        let len = u64::try_from(st.st_size).map_err(|_| SegmentError::TooSmall { len: 0 })?;
        if len < HEADER_LEN as u64 {
            return Err(SegmentError::TooSmall { len }.into());
        }
        if len > MAX_SEGMENT_LEN {
            return Err(SegmentError::TooLarge { len }.into());
        }
        let sealed = match rustix::fs::fcntl_get_seals(&fd) {
            Ok(s) => s.contains(SealFlags::SHRINK),
            Err(Errno::INVAL) => false,
            Err(e) => return Err(io::Error::from(e).into()),
        };
        if !sealed && !allow_unsealed {
            return Err(SegmentError::NotSealed.into());
        }
        let map = Mapping::new(fd.as_fd(), len as usize)?;
        let mut buf = [0u8; HEADER_LEN];
        // SAFETY: the file has `len >= HEADER_LEN` bytes and cannot shrink
        // (sealed) or is trusted not to (unsealed, caller's choice), so the
        // first HEADER_LEN bytes of the mapping are readable. A peer
        // writing them concurrently would only give us garbage to reject.
        unsafe { ptr::copy_nonoverlapping(map.ptr.as_ptr(), buf.as_mut_ptr(), HEADER_LEN) };
        let header = SegmentHeader::parse(&buf, len)?;
        Ok(Segment { map: Arc::new(map), fd, header })
    }

    /// The segment's fd, to send to the peer.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The validated header.
    pub fn header(&self) -> &SegmentHeader {
        &self.header
    }

    /// Address of this process's mapping (for tests and logs).
    pub fn addr(&self) -> usize {
        self.map.ptr.as_ptr() as usize
    }

    /// This side's ends: the producer of the ring towards the peer and the
    /// consumer of the ring from it. Each side can be taken once per
    /// segment, across all mappings and processes (a claim bit in the
    /// header); both keep the mapping alive.
    pub fn endpoints(&self, side: Side) -> Result<(Producer, Consumer), ShmError> {
        let (bit, tx, rx) = match side {
            Side::Creator => (1, 0, 1),
            Side::Opener => (2, 1, 0),
        };
        if self.map.claims().fetch_or(bit, Ordering::AcqRel) & bit != 0 {
            return Err(ShmError::SideTaken(side));
        }
        let keep: KeepAlive = self.map.clone();
        let cap = self.header.capacity as usize;
        let base = self.map.ptr.as_ptr();
        // SAFETY: `parse` (or `for_capacity`) checked that both rings are
        // 128-aligned ring_len(cap)-byte ranges inside the mapping, apart
        // from each other and the header; the mapping lives as long as
        // `keep`; the claim bit makes these the only producer of ring `tx`
        // and consumer of ring `rx`; a fresh segment's rings are zero.
        unsafe {
            let p = Producer::new(base.add(self.header.rings[tx] as usize), cap, keep.clone())?;
            let c = Consumer::new(base.add(self.header.rings[rx] as usize), cap, keep)?;
            Ok((p, c))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::IoSlice;
    use std::os::unix::fs::FileExt;

    const CAP: usize = 4096;

    fn valid_image() -> Vec<u8> {
        let h = SegmentHeader::for_capacity(CAP).unwrap();
        let mut buf = [0u8; HEADER_LEN];
        h.emit(&mut buf);
        let mut img = vec![0u8; h.total_len as usize];
        img[..HEADER_LEN].copy_from_slice(&buf);
        img
    }

    fn parse_img(img: &[u8]) -> Result<SegmentHeader, SegmentError> {
        let buf: &[u8; HEADER_LEN] = img[..HEADER_LEN].try_into().unwrap();
        SegmentHeader::parse(buf, img.len() as u64)
    }

    fn put_u64(img: &mut [u8], r: std::ops::Range<usize>, v: u64) {
        img[r].copy_from_slice(&v.to_le_bytes());
    }

    #[test]
    fn header_round_trips() {
        let img = valid_image();
        let h = parse_img(&img).unwrap();
        assert_eq!(h, SegmentHeader::for_capacity(CAP).unwrap());
        assert_eq!(h.rings, [128, 128 + 384 + 4096]);
        assert_eq!(h.total_len, 128 + 2 * (384 + 4096));
        let mut again = [0u8; HEADER_LEN];
        h.emit(&mut again);
        assert_eq!(&again[..], &img[..HEADER_LEN]);
    }

    #[test]
    fn every_bad_field_is_refused() {
        let ok = valid_image();
        let total = ok.len() as u64;
        type Mutation = Box<dyn Fn(&mut Vec<u8>)>;
        let cases: Vec<(Mutation, SegmentError)> = vec![
            (Box::new(|i| i[0] = b'X'), SegmentError::BadMagic),
            (Box::new(|i| i[field::VERSION].copy_from_slice(&2u32.to_le_bytes())), SegmentError::Version(2)),
            (Box::new(|i| i[field::HEADER_LEN].copy_from_slice(&64u32.to_le_bytes())), SegmentError::HeaderLen(64)),
            (Box::new(|i| put_u64(i, field::CAPACITY, 5000)), SegmentError::Capacity(5000)),
            (Box::new(|i| put_u64(i, field::CAPACITY, 1 << 40)), SegmentError::Capacity(1 << 40)),
            (Box::new(|i| put_u64(i, field::CAPACITY, 8192)), SegmentError::RingOffset { ring: 1, offset: 4608 }),
            (Box::new(|i| put_u64(i, field::RING0, 0)), SegmentError::RingOffset { ring: 0, offset: 0 }),
            (Box::new(|i| put_u64(i, field::RING0, 136)), SegmentError::RingOffset { ring: 0, offset: 136 }),
            (Box::new(|i| put_u64(i, field::RING1, 4608 + 128)), SegmentError::RingOffset { ring: 1, offset: 4736 }),
            (
                Box::new(|i| put_u64(i, field::RING1, u64::MAX - 127)),
                SegmentError::RingOffset { ring: 1, offset: u64::MAX - 127 },
            ),
            (Box::new(|i| put_u64(i, field::RING1, 128)), SegmentError::RingOffset { ring: 1, offset: 128 }),
            (Box::new(|i| put_u64(i, field::RING1, 256)), SegmentError::RingOffset { ring: 1, offset: 256 }),
            (
                Box::new(move |i| put_u64(i, field::TOTAL_LEN, total + 1)),
                SegmentError::Length { header: total + 1, file: total },
            ),
            (Box::new(|i| i.truncate(i.len() - 1)), SegmentError::Length { header: total, file: total - 1 }),
        ];
        for (n, (mutate, want)) in cases.into_iter().enumerate() {
            let mut img = ok.clone();
            mutate(&mut img);
            assert_eq!(parse_img(&img), Err(want), "case {n}");
        }
    }

    /// A sealed memfd holding `img`.
    fn sealed_memfd(img: &[u8]) -> OwnedFd {
        let fd = memfd().unwrap();
        let f = std::fs::File::from(fd);
        f.write_all_at(img, 0).unwrap();
        f.set_len(img.len() as u64).unwrap();
        rustix::fs::fcntl_add_seals(&f, SealFlags::SHRINK | SealFlags::GROW).unwrap();
        f.into()
    }

    fn open_err(fd: OwnedFd) -> SegmentError {
        match Segment::open(fd) {
            Err(ShmError::Segment(e)) => e,
            other => panic!("expected a segment error, got {other:?}"),
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn open_refuses_bad_files() {
        let ok = valid_image();
        assert!(Segment::open(sealed_memfd(&ok)).is_ok());
        assert_eq!(open_err(sealed_memfd(&ok[..64])), SegmentError::TooSmall { len: 64 });
        assert_eq!(open_err(sealed_memfd(&[])), SegmentError::TooSmall { len: 0 });
        let cut = &ok[..ok.len() - 4096];
        assert_eq!(
            open_err(sealed_memfd(cut)),
            SegmentError::Length { header: ok.len() as u64, file: cut.len() as u64 }
        );
        let mut bad = ok.clone();
        bad[3] ^= 1;
        assert_eq!(open_err(sealed_memfd(&bad)), SegmentError::BadMagic);
        let mut bad = ok.clone();
        bad[field::VERSION].copy_from_slice(&7u32.to_le_bytes());
        assert_eq!(open_err(sealed_memfd(&bad)), SegmentError::Version(7));
        let mut bad = ok.clone();
        put_u64(&mut bad, field::RING1, ok.len() as u64);
        assert_eq!(open_err(sealed_memfd(&bad)), SegmentError::RingOffset { ring: 1, offset: ok.len() as u64 });

        // Not sealed against shrinking: the peer could SIGBUS us.
        let f = std::fs::File::from(memfd().unwrap());
        f.write_all_at(&ok, 0).unwrap();
        assert_eq!(open_err(f.into()), SegmentError::NotSealed);
        // Not a file at all.
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(open_err(a.into()), SegmentError::NotAFile);
        // Claims a size beyond what we accept (sparse, costs nothing).
        let f = std::fs::File::from(memfd().unwrap());
        f.set_len(MAX_SEGMENT_LEN + 1).unwrap();
        assert_eq!(open_err(f.into()), SegmentError::TooLarge { len: MAX_SEGMENT_LEN + 1 });
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn created_segment_is_a_sealed_memfd() {
        let seg = Segment::create(64 << 10).unwrap();
        assert_eq!(seg.header().capacity, 64 << 10);
        let seals = rustix::fs::fcntl_get_seals(seg.fd()).unwrap();
        assert!(seals.contains(SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL));
        assert!(rustix::fs::ftruncate(seg.fd(), 4096).is_err(), "cannot shrink");
        assert!(matches!(Segment::create(5000), Err(ShmError::Ring(ring::RingError::BadCapacity(5000)))));
    }

    /// The same memfd mapped twice, at two addresses, as two processes
    /// would: data goes both ways between the mappings.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn two_mappings_of_one_memfd_talk() {
        let a = Segment::create(CAP).unwrap();
        let b = Segment::open(a.fd().try_clone_to_owned().unwrap()).unwrap();
        assert_ne!(a.addr(), b.addr());
        assert_eq!(a.header(), b.header());
        let (mut a_tx, mut a_rx) = a.endpoints(Side::Creator).unwrap();
        let (mut b_tx, mut b_rx) = b.endpoints(Side::Opener).unwrap();
        drop((a, b)); // the handles keep the mappings
        let mut out = vec![0u8; 10_000];
        for round in 0..20u8 {
            let msg = vec![round; 3000];
            assert_eq!(a_tx.write_vectored(&[IoSlice::new(&msg[..1000]), IoSlice::new(&msg[1000..])]).unwrap(), 3000);
            assert_eq!(b_rx.read(&mut out).unwrap(), 3000);
            assert!(out[..3000].iter().all(|&x| x == round));
            assert_eq!(b_tx.write(&msg[..2999]).unwrap(), 2999);
            assert_eq!(a_rx.read(&mut out).unwrap(), 2999);
            assert!(out[..2999].iter().all(|&x| x == round));
        }
        drop(a_tx);
        assert!(b_rx.is_producer_closed());
        assert!(!a_rx.is_producer_closed());
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn each_side_is_taken_once_across_mappings() {
        let a = Segment::create(CAP).unwrap();
        let b = Segment::open(a.fd().try_clone_to_owned().unwrap()).unwrap();
        let _creator = a.endpoints(Side::Creator).unwrap();
        assert!(matches!(a.endpoints(Side::Creator), Err(ShmError::SideTaken(Side::Creator))));
        assert!(matches!(b.endpoints(Side::Creator), Err(ShmError::SideTaken(Side::Creator))));
        let _opener = b.endpoints(Side::Opener).unwrap();
        assert!(matches!(a.endpoints(Side::Opener), Err(ShmError::SideTaken(Side::Opener))));
    }

    /// The /dev/shm fallback leaves no name behind and works, but only
    /// `open_unsealed` accepts it where memfds exist.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn devshm_fallback_is_unlinked() {
        if !std::path::Path::new("/dev/shm").is_dir() {
            eprintln!("no /dev/shm: skipped");
            return;
        }
        let fd = create_devshm().unwrap();
        assert_eq!(rustix::fs::fstat(&fd).unwrap().st_nlink, 0, "unlinked at once");
        let a = Segment::init(fd, Backing::DevShm, SegmentHeader::for_capacity(CAP).unwrap()).unwrap();
        let dup = || a.fd().try_clone_to_owned().unwrap();
        assert!(matches!(Segment::open(dup()), Err(ShmError::Segment(SegmentError::NotSealed))));
        let b = Segment::open_unsealed(dup()).unwrap();
        let (mut tx, _rx) = a.endpoints(Side::Creator).unwrap();
        let (_tx, mut rx) = b.endpoints(Side::Opener).unwrap();
        tx.write(b"fallback").unwrap();
        let mut out = [0u8; 8];
        assert_eq!(rx.read(&mut out).unwrap(), 8);
        assert_eq!(&out, b"fallback");
    }
}
