//! A set of disjoint half-open byte ranges, merged as they are inserted.

use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// The only range, when there is exactly one: most sets (a message's
    /// received bytes, the delivered prefix) never hold more, and keeping
    /// it inline spares an allocation per message. Invariant: `Some`
    /// exactly when the set holds one range, and then `map` is empty, so
    /// equal sets compare equal.
    one: Option<(u64, u64)>,
    /// start -> end, disjoint and non-adjacent, when there are two or more.
    map: BTreeMap<u64, u64>,
    total: u64,
}

impl RangeSet {
    pub fn new() -> RangeSet {
        RangeSet::default()
    }

    /// Sum of the lengths of all ranges.
    pub fn covered(&self) -> u64 {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.one.is_none() && self.map.is_empty()
    }

    /// True if any byte of `[start, end)` is in the set.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        if start >= end {
            return false;
        }
        if let Some((s, e)) = self.one {
            return s < end && e > start;
        }
        // The last range starting before `end` is the only candidate.
        self.map.range(..end).next_back().is_some_and(|(_, &e)| e > start)
    }

    /// True if every byte of `[start, end)` is in the set.
    pub fn contains(&self, start: u64, end: u64) -> bool {
        if start >= end {
            return true;
        }
        if let Some((s, e)) = self.one {
            return s <= start && e >= end;
        }
        self.map.range(..=start).next_back().is_some_and(|(_, &e)| e >= end)
    }

    /// Adds `[start, end)`; returns how many bytes were new.
    pub fn insert(&mut self, start: u64, end: u64) -> u64 {
        if start >= end {
            return 0;
        }
        match self.one {
            None if self.map.is_empty() => {
                self.one = Some((start, end));
                self.total = end - start;
                return end - start;
            }
            // Overlapping or touching the only range: it grows in place.
            Some((s, e)) if start <= e && end >= s => {
                let (ns, ne) = (s.min(start), e.max(end));
                let added = (ne - ns) - (e - s);
                self.one = Some((ns, ne));
                self.total += added;
                return added;
            }
            Some((s, e)) => {
                self.one = None;
                self.map.insert(s, e);
            }
            None => {}
        }
        let added = self.map_insert(start, end);
        self.settle();
        added
    }

    fn map_insert(&mut self, start: u64, end: u64) -> u64 {
        // Fast paths: at or after the last range (sets mostly grow at
        // their end: delivered messages, bytes of a stream).
        match self.map.last_key_value().map(|(&s, &e)| (s, e)) {
            None => {
                self.map.insert(start, end);
                self.total += end - start;
                return end - start;
            }
            Some((_, le)) if start > le => {
                self.map.insert(start, end);
                self.total += end - start;
                return end - start;
            }
            Some((ls, le)) if start >= ls => {
                if end <= le {
                    return 0;
                }
                self.map.insert(ls, end);
                self.total += end - le;
                return end - le;
            }
            _ => {}
        }
        let (mut s, mut e) = (start, end);
        let mut removed = 0;
        // Merge with every range that overlaps or touches [s, e).
        let touching: Vec<(u64, u64)> =
            self.map.range(..=e).rev().take_while(|(_, re)| **re >= s).map(|(a, b)| (*a, *b)).collect();
        for (rs, re) in touching {
            self.map.remove(&rs);
            removed += re - rs;
            s = s.min(rs);
            e = e.max(re);
        }
        self.map.insert(s, e);
        let added = (e - s) - removed;
        self.total += added;
        added
    }

    /// Keeps the invariant: a lone range lives in `one`.
    fn settle(&mut self) {
        if self.map.len() == 1 {
            self.one = self.map.pop_first();
        }
    }

    /// Removes `[start, end)` from the set.
    pub fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        if let Some((s, e)) = self.one {
            if s >= end || e <= start {
                return;
            }
            self.one = None;
            self.total = 0;
            // What is left of the only range: up to two pieces.
            for (a, b) in [(s, start.min(e)), (end.max(s), e)] {
                if a < b {
                    self.map.insert(a, b);
                    self.total += b - a;
                }
            }
            self.settle();
            return;
        }
        let hits: Vec<(u64, u64)> =
            self.map.range(..end).rev().take_while(|(_, re)| **re > start).map(|(a, b)| (*a, *b)).collect();
        for (rs, re) in hits {
            self.map.remove(&rs);
            self.total -= re - rs;
            if rs < start {
                self.map.insert(rs, start);
                self.total += start - rs;
            }
            if re > end {
                self.map.insert(end, re);
                self.total += re - end;
            }
        }
        self.settle();
    }

    /// End of the range starting at 0, i.e. the first value not in the
    /// set when the set starts at 0 (else 0).
    pub fn prefix(&self) -> u64 {
        match self.one.or_else(|| self.map.first_key_value().map(|(&s, &e)| (s, e))) {
            Some((0, e)) => e,
            _ => 0,
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.one.into_iter().chain(self.map.iter().map(|(a, b)| (*a, *b)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_merges() {
        let mut r = RangeSet::new();
        assert_eq!(r.insert(10, 20), 10);
        assert_eq!(r.insert(30, 40), 10);
        assert_eq!(r.insert(20, 30), 10);
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(10, 40)]);
        assert_eq!(r.insert(5, 45), 10);
        assert_eq!(r.covered(), 40);
        assert_eq!(r.insert(15, 25), 0);
        assert!(r.contains(5, 45));
        assert!(!r.contains(4, 6));
        assert!(r.overlaps(44, 50));
        assert!(!r.overlaps(45, 50));
        assert_eq!(r.prefix(), 0, "does not start at 0");
        r.insert(0, 5);
        assert_eq!(r.prefix(), 45);
    }

    #[test]
    fn remove_splits() {
        let mut r = RangeSet::new();
        r.insert(0, 100);
        r.remove(10, 20);
        r.remove(90, 200);
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(0, 10), (20, 90)]);
        assert_eq!(r.covered(), 80);
        r.remove(0, 100);
        assert!(r.is_empty());
        assert_eq!(r.covered(), 0);
    }

    proptest::proptest! {
        #[test]
        fn matches_a_bitmap(ops in proptest::collection::vec((0u64..64, 0u64..64, proptest::bool::ANY), 0..40)) {
            let mut r = RangeSet::new();
            let mut bits = [false; 128];
            for (a, l, add) in ops {
                let (s, e) = (a, a + l);
                if add { r.insert(s, e); } else { r.remove(s, e); }
                for b in &mut bits[s as usize..e as usize] { *b = add; }
                let want = bits.iter().filter(|b| **b).count() as u64;
                proptest::prop_assert_eq!(r.covered(), want);
                for i in 0..128u64 {
                    proptest::prop_assert_eq!(r.contains(i, i + 1), bits[i as usize]);
                    proptest::prop_assert_eq!(r.overlaps(i, i + 1), bits[i as usize]);
                }
                // The same set built from its ranges compares equal (one
                // representation per set), and its ranges are disjoint,
                // sorted and not touching.
                let ranges: Vec<(u64, u64)> = r.iter().collect();
                proptest::prop_assert!(ranges.windows(2).all(|w| w[0].1 < w[1].0));
                let mut again = RangeSet::new();
                for &(s, e) in ranges.iter().rev() { again.insert(s, e); }
                proptest::prop_assert_eq!(&again, &r);
                proptest::prop_assert_eq!(r.is_empty(), want == 0);
            }
        }
    }
}
