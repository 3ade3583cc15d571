//! A receive buffer that lends out disjoint pieces of itself.
//!
//! Rails write payload straight into the posted buffer, several rails at
//! once and without `unsafe`: the buffer is a `BytesMut` split into owned
//! pieces (`BytesMut::split_off`, O(1), same allocation). A rail borrows
//! the piece for one fragment (a lease), reads the payload into it and
//! gives it back; once every piece is home the buffer is joined again
//! (`BytesMut::unsplit`, O(1) for neighbours) and handed to the user.

use std::collections::BTreeMap;

use bytes::BytesMut;

#[derive(Debug)]
pub struct RecvBuffer {
    /// Pieces at home, by offset. Together with the leased pieces they
    /// tile `[0, len)`.
    home: BTreeMap<u64, BytesMut>,
    len: u64,
    leased: usize,
}

/// A piece of a [`RecvBuffer`] lent out for one fragment.
#[derive(Debug)]
pub struct Lease {
    pub offset: u64,
    pub buf: BytesMut,
}

impl RecvBuffer {
    pub fn new(buf: BytesMut) -> RecvBuffer {
        let len = buf.len() as u64;
        let mut home = BTreeMap::new();
        home.insert(0, buf);
        RecvBuffer { home, len, leased: 0 }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn leased(&self) -> usize {
        self.leased
    }

    /// Lends `[offset, offset + len)`. Returns `None` if any of it is out
    /// on another lease or beyond the buffer.
    pub fn lease(&mut self, offset: u64, len: u64) -> Option<Lease> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        let (&start, piece) = self.home.range(..=offset).next_back()?;
        if start + (piece.len() as u64) < end {
            return None;
        }
        let mut piece = self.home.remove(&start)?;
        let mut mid = piece.split_off((offset - start) as usize);
        if !piece.is_empty() {
            self.home.insert(start, piece);
        }
        let tail = mid.split_off(len as usize);
        if !tail.is_empty() {
            self.home.insert(end, tail);
        }
        self.leased += 1;
        Some(Lease { offset, buf: mid })
    }

    /// Takes a lease back (filled or not; the caller tracks which).
    pub fn give_back(&mut self, lease: Lease) {
        self.leased = self.leased.saturating_sub(1);
        if !lease.buf.is_empty() {
            self.home.insert(lease.offset, lease.buf);
        }
    }

    /// Read access to `[offset, offset + len)` if it is at home in one piece
    /// or across neighbouring pieces; copies into `out`.
    pub fn copy_out(&self, offset: u64, out: &mut [u8]) -> bool {
        let mut at = offset;
        let end = offset + out.len() as u64;
        while at < end {
            let Some((&s, p)) = self.home.range(..=at).next_back() else { return false };
            let pe = s + p.len() as u64;
            if pe <= at {
                return false;
            }
            let take = (pe.min(end) - at) as usize;
            let src = &p[(at - s) as usize..(at - s) as usize + take];
            out[(at - offset) as usize..(at - offset) as usize + take].copy_from_slice(src);
            at += take as u64;
        }
        true
    }

    /// Joins the pieces into one buffer. Only valid with no lease out.
    pub fn into_inner(mut self) -> BytesMut {
        debug_assert_eq!(self.leased, 0, "joining a buffer with pieces out on lease");
        let mut pieces = std::mem::take(&mut self.home).into_values();
        let mut whole = pieces.next().unwrap_or_default();
        for p in pieces {
            whole.unsplit(p);
        }
        whole
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_fill_join_is_zero_copy() {
        let v = vec![0u8; 1000];
        let base = v.as_ptr();
        let mut rb = RecvBuffer::new(BytesMut::from(bytes::Bytes::from(v)));
        let mut a = rb.lease(100, 200).unwrap();
        let mut b = rb.lease(600, 400).unwrap();
        assert!(rb.lease(150, 10).is_none(), "overlaps a lease");
        assert!(rb.lease(900, 200).is_none(), "beyond the end");
        let mut c = rb.lease(0, 100).unwrap();
        a.buf.fill(1);
        b.buf.fill(2);
        c.buf.fill(3);
        rb.give_back(b);
        rb.give_back(a);
        rb.give_back(c);
        let mut d = rb.lease(300, 300).unwrap();
        d.buf.fill(4);
        rb.give_back(d);
        assert_eq!(rb.leased(), 0);
        let whole = rb.into_inner();
        assert_eq!(whole.len(), 1000);
        assert_eq!(whole.as_ptr(), base, "same allocation");
        assert!(whole[..100].iter().all(|&x| x == 3));
        assert!(whole[100..300].iter().all(|&x| x == 1));
        assert!(whole[300..600].iter().all(|&x| x == 4));
        assert!(whole[600..].iter().all(|&x| x == 2));
    }

    #[test]
    fn copy_out_spans_pieces() {
        let mut rb = RecvBuffer::new(BytesMut::from(&(0u8..100).collect::<Vec<_>>()[..]));
        let l = rb.lease(40, 10).unwrap();
        rb.give_back(l);
        let mut out = [0u8; 30];
        assert!(rb.copy_out(30, &mut out));
        assert_eq!(out[0], 30);
        assert_eq!(out[29], 59);
        let l = rb.lease(40, 10).unwrap();
        assert!(!rb.copy_out(30, &mut out), "a piece is out");
        rb.give_back(l);
    }

    #[test]
    fn empty_buffer() {
        let mut rb = RecvBuffer::new(BytesMut::new());
        let l = rb.lease(0, 0).unwrap();
        rb.give_back(l);
        assert_eq!(rb.into_inner().len(), 0);
    }
}
