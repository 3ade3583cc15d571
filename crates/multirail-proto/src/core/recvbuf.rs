//! A receive buffer that lends out disjoint pieces of itself.
//!
//! Rails write payload straight into the posted buffer, several rails at
//! once and without `unsafe`: the buffer is a `BytesMut` split into owned
//! pieces (`BytesMut::split_off`, O(1), same allocation). A rail borrows
//! the piece for one fragment (a lease), reads the payload into it and
//! gives it back; once every piece is home the buffer is joined again
//! (`BytesMut::unsplit`, O(1) for neighbours) and handed to the user.
//!
//! A rail can go silent in the middle of a payload, holding its lease. When
//! the same fragment arrives again on another rail, the silent rail's
//! lease is *abandoned*: a fresh piece takes its place, and the old piece,
//! if it ever comes back, is dropped. The joined buffer is then a copy
//! (the pieces are no longer neighbours), which only happens after a
//! failure.

use std::collections::BTreeMap;

use bytes::BytesMut;

#[derive(Debug)]
pub struct RecvBuffer {
    /// The buffer in one piece, until the first lease (small messages are
    /// copied in and never split).
    whole: Option<BytesMut>,
    /// Pieces at home, by offset, once split. Together with the leased
    /// pieces they tile `[0, len)`.
    home: BTreeMap<u64, BytesMut>,
    /// Pieces out on lease, by offset.
    leases: BTreeMap<u64, LeaseInfo>,
    len: u64,
    next_id: u64,
}

#[derive(Debug, Clone, Copy)]
struct LeaseInfo {
    len: u64,
    id: u64,
    holder: usize,
}

/// A piece of a [`RecvBuffer`] lent out for one fragment.
#[derive(Debug)]
pub struct Lease {
    pub offset: u64,
    pub buf: BytesMut,
    id: u64,
}

impl RecvBuffer {
    pub fn new(buf: BytesMut) -> RecvBuffer {
        let len = buf.len() as u64;
        RecvBuffer { whole: Some(buf), home: BTreeMap::new(), leases: BTreeMap::new(), len, next_id: 0 }
    }

    /// Moves the one piece into `home` (before the first lease).
    fn split_mode(&mut self) {
        if let Some(w) = self.whole.take() {
            self.home.insert(0, w);
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Pieces out on lease.
    pub fn leased(&self) -> usize {
        self.leases.len()
    }

    /// Lends `[offset, offset + len)` to `holder` (a rail). Returns `None`
    /// if any of it is out on another lease or beyond the buffer.
    pub fn lease(&mut self, offset: u64, len: u64, holder: usize) -> Option<Lease> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        self.split_mode();
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
        self.next_id += 1;
        let id = self.next_id;
        if len > 0 {
            self.leases.insert(offset, LeaseInfo { len, id, holder });
        } else {
            // An empty piece: nothing to join later, but count it as out.
            self.leases.insert(offset, LeaseInfo { len: 0, id, holder });
        }
        Some(Lease { offset, buf: mid, id })
    }

    /// Who holds exactly `[offset, offset + len)` on lease, if anyone.
    pub fn holder(&self, offset: u64, len: u64) -> Option<usize> {
        self.leases.get(&offset).filter(|l| l.len == len).map(|l| l.holder)
    }

    /// Gives up the lease at `offset`: a fresh piece takes its place at
    /// home; the old piece is dropped if it ever comes back.
    pub fn abandon(&mut self, offset: u64) {
        if let Some(l) = self.leases.remove(&offset)
            && l.len > 0
        {
            self.home.insert(offset, BytesMut::zeroed(l.len as usize));
        }
    }

    /// Takes a lease back (filled or not; the caller tracks which).
    /// Returns false for an abandoned lease, whose bytes must not be used.
    pub fn give_back(&mut self, lease: Lease) -> bool {
        match self.leases.get(&lease.offset) {
            Some(l) if l.id == lease.id => {
                self.leases.remove(&lease.offset);
                if !lease.buf.is_empty() {
                    self.home.insert(lease.offset, lease.buf);
                }
                true
            }
            _ => false,
        }
    }

    /// Copies `data` to `offset` if that range is at home in one piece
    /// (not on lease); returns whether it did.
    pub fn copy_in(&mut self, offset: u64, data: &[u8]) -> bool {
        let Some(end) = offset.checked_add(data.len() as u64) else { return false };
        if let Some(w) = self.whole.as_mut() {
            if end > self.len {
                return false;
            }
            w[offset as usize..end as usize].copy_from_slice(data);
            return true;
        }
        let Some((&s, p)) = self.home.range_mut(..=offset).next_back() else { return false };
        if s + (p.len() as u64) < end || end > self.len {
            return false;
        }
        let at = (offset - s) as usize;
        p[at..at + data.len()].copy_from_slice(data);
        true
    }

    /// Read access to `[offset, offset + len)` if it is at home in one piece
    /// or across neighbouring pieces; copies into `out`.
    pub fn copy_out(&self, offset: u64, out: &mut [u8]) -> bool {
        let mut at = offset;
        let end = offset + out.len() as u64;
        if let Some(w) = &self.whole {
            if end > self.len {
                return false;
            }
            out.copy_from_slice(&w[offset as usize..end as usize]);
            return true;
        }
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
        debug_assert!(self.leases.is_empty(), "joining a buffer with pieces out on lease");
        if let Some(w) = self.whole.take() {
            return w;
        }
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
        let mut a = rb.lease(100, 200, 0).unwrap();
        let mut b = rb.lease(600, 400, 1).unwrap();
        assert!(rb.lease(150, 10, 2).is_none(), "overlaps a lease");
        assert!(rb.lease(900, 200, 2).is_none(), "beyond the end");
        let mut c = rb.lease(0, 100, 0).unwrap();
        a.buf.fill(1);
        b.buf.fill(2);
        c.buf.fill(3);
        rb.give_back(b);
        rb.give_back(a);
        rb.give_back(c);
        let mut d = rb.lease(300, 300, 0).unwrap();
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
        let l = rb.lease(40, 10, 0).unwrap();
        rb.give_back(l);
        let mut out = [0u8; 30];
        assert!(rb.copy_out(30, &mut out));
        assert_eq!(out[0], 30);
        assert_eq!(out[29], 59);
        let l = rb.lease(40, 10, 0).unwrap();
        assert!(!rb.copy_out(30, &mut out), "a piece is out");
        rb.give_back(l);
    }

    #[test]
    fn an_abandoned_lease_is_replaced_and_its_bytes_ignored() {
        let mut rb = RecvBuffer::new(BytesMut::from(&[7u8; 100][..]));
        let mut stuck = rb.lease(20, 30, 1).unwrap();
        assert_eq!(rb.holder(20, 30), Some(1));
        assert!(rb.lease(20, 30, 0).is_none(), "still out");
        rb.abandon(20);
        let mut again = rb.lease(20, 30, 0).unwrap();
        again.buf.fill(9);
        assert!(rb.give_back(again));
        stuck.buf.fill(1);
        assert!(!rb.give_back(stuck), "the abandoned piece is refused");
        assert_eq!(rb.leased(), 0);
        let whole = rb.into_inner();
        assert_eq!(whole.len(), 100);
        assert!(whole[..20].iter().all(|&x| x == 7));
        assert!(whole[20..50].iter().all(|&x| x == 9), "the fresh piece's bytes, not the stale ones");
        assert!(whole[50..].iter().all(|&x| x == 7));
    }

    #[test]
    fn copy_in_only_where_at_home() {
        let mut rb = RecvBuffer::new(BytesMut::zeroed(100));
        assert!(rb.copy_in(10, &[1; 20]));
        let l = rb.lease(50, 10, 0).unwrap();
        assert!(!rb.copy_in(45, &[2; 10]), "overlaps the lease");
        assert!(!rb.copy_in(95, &[2; 10]), "beyond the end");
        rb.give_back(l);
        let whole = rb.into_inner();
        assert!(whole[10..30].iter().all(|&x| x == 1) && whole[..10].iter().all(|&x| x == 0));
    }

    #[test]
    fn empty_buffer() {
        let mut rb = RecvBuffer::new(BytesMut::new());
        let l = rb.lease(0, 0, 0).unwrap();
        rb.give_back(l);
        assert_eq!(rb.into_inner().len(), 0);
    }
}
