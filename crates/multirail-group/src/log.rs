//! What a member holds of one sender's messages in the current view.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;

/// A data message (`len == 1`, `payload` set) or a run of nulls.
#[derive(Debug)]
pub(crate) struct Entry {
    pub start: u64,
    pub len: u64,
    pub payload: Option<Bytes>,
}

/// One sender's messages: a contiguous received prefix (`contig`, Derecho's
/// `num_received`, as a count) whose undelivered tail is `inorder`, and the
/// entries that arrived past a gap (`ahead`).
#[derive(Debug, Default)]
pub(crate) struct SenderLog {
    pub contig: u64,
    inorder: VecDeque<Entry>,
    ahead: BTreeMap<u64, Entry>,
    /// Payload bytes held (in `inorder` and `ahead`).
    pub bytes: usize,
}

impl SenderLog {
    /// Records an entry; false if it is a duplicate or overlaps one held.
    pub fn insert(&mut self, e: Entry) -> bool {
        let Some(end) = e.start.checked_add(e.len) else {
            return false;
        };
        if e.len == 0 || e.start < self.contig {
            return false;
        }
        if let Some((_, prev)) = self.ahead.range(..=e.start).next_back()
            && prev.start + prev.len > e.start
        {
            return false;
        }
        if let Some((&next, _)) = self.ahead.range(e.start..).next()
            && end > next
        {
            return false;
        }
        self.bytes += e.payload.as_ref().map_or(0, |p| p.len());
        if e.start == self.contig {
            self.contig = end;
            self.inorder.push_back(e);
            while let Some(n) = self.ahead.remove(&self.contig) {
                self.contig += n.len;
                self.inorder.push_back(n);
            }
        } else {
            self.ahead.insert(e.start, e);
        }
        true
    }

    /// Message `index` (data or null) is held.
    pub fn holds(&self, index: u64) -> bool {
        if index < self.contig {
            return true;
        }
        self.ahead.range(..=index).next_back().is_some_and(|(_, e)| e.start + e.len > index)
    }

    /// Consumes message `index`, which must be the lowest undelivered one:
    /// `Some(Some(payload))` for data, `Some(None)` for a null, `None` if it
    /// is not held in order.
    pub fn take(&mut self, index: u64) -> Option<Option<Bytes>> {
        let front = self.inorder.front_mut()?;
        if front.start != index {
            return None;
        }
        if front.payload.is_some() {
            let e = self.inorder.pop_front()?;
            let p = e.payload?;
            self.bytes -= p.len();
            return Some(Some(p));
        }
        front.start += 1;
        front.len -= 1;
        if front.len == 0 {
            self.inorder.pop_front();
        }
        Some(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(i: u64) -> Entry {
        Entry { start: i, len: 1, payload: Some(Bytes::from(vec![i as u8; 3])) }
    }

    #[test]
    fn prefix_grows_over_gaps_and_nulls() {
        let mut l = SenderLog::default();
        assert!(l.insert(data(2)));
        assert_eq!(l.contig, 0);
        assert!(l.insert(Entry { start: 0, len: 2, payload: None }));
        assert_eq!(l.contig, 3);
        assert!(!l.insert(data(1)), "inside a held run");
        assert!(!l.insert(data(2)), "duplicate");
        assert_eq!(l.take(0), Some(None));
        assert_eq!(l.take(1), Some(None));
        assert_eq!(l.take(2).unwrap().unwrap().len(), 3);
        assert_eq!(l.take(3), None);
        assert_eq!(l.bytes, 0);
    }

    #[test]
    fn overlapping_runs_rejected() {
        let mut l = SenderLog::default();
        assert!(l.insert(Entry { start: 5, len: 5, payload: None }));
        assert!(!l.insert(Entry { start: 3, len: 3, payload: None }));
        assert!(!l.insert(Entry { start: 7, len: 1, payload: None }));
        assert!(!l.insert(Entry { start: u64::MAX, len: 2, payload: None }));
        assert!(l.insert(Entry { start: 0, len: 5, payload: None }));
        assert_eq!(l.contig, 10);
    }
}
