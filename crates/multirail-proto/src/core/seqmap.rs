//! A map from message sequence numbers to values for keys that are dense
//! and mostly grow at the end and leave at the front: a peer's outgoing
//! messages (added at `next_seq`, released as the delivered prefix
//! grows). A deque of slots from the lowest key, so insert, lookup and
//! removal are arithmetic and allocate only when the deque grows, where a
//! `BTreeMap` walks and allocates nodes for every message.
//!
//! Memory is one slot per key between the lowest and the highest present
//! key; use it only where that span is bounded by what the owner itself
//! holds (its own messages in flight), never for keys a peer chooses.

use std::collections::VecDeque;

#[derive(Debug, Clone)]
pub struct SeqMap<V> {
    /// Key of `slots[0]`.
    base: u64,
    slots: VecDeque<Option<V>>,
    len: usize,
}

impl<V> Default for SeqMap<V> {
    fn default() -> Self {
        SeqMap { base: 0, slots: VecDeque::new(), len: 0 }
    }
}

impl<V> SeqMap<V> {
    pub fn new() -> SeqMap<V> {
        SeqMap::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn index(&self, k: u64) -> Option<usize> {
        let i = k.checked_sub(self.base)?;
        (i < self.slots.len() as u64).then_some(i as usize)
    }

    pub fn get(&self, k: &u64) -> Option<&V> {
        self.index(*k).and_then(|i| self.slots[i].as_ref())
    }

    pub fn get_mut(&mut self, k: &u64) -> Option<&mut V> {
        self.index(*k).and_then(|i| self.slots[i].as_mut())
    }

    /// Inserts `v` at `k`, returning the value that was there.
    pub fn insert(&mut self, k: u64, v: V) -> Option<V> {
        if self.slots.is_empty() {
            self.base = k;
        }
        if k < self.base {
            for _ in k..self.base {
                self.slots.push_front(None);
            }
            self.base = k;
        }
        let i = (k - self.base) as usize;
        while self.slots.len() <= i {
            self.slots.push_back(None);
        }
        let slot = &mut self.slots[i];
        if slot.is_some() {
            return slot.replace(v);
        }
        // Written in place: values are large, and every move is a copy.
        *slot = Some(v);
        self.len += 1;
        None
    }

    #[cfg(test)]
    pub fn remove(&mut self, k: &u64) -> Option<V> {
        let i = self.index(*k)?;
        let v = self.slots[i].take()?;
        self.len -= 1;
        self.trim();
        Some(v)
    }

    /// Drops the value at `k` where it is, without moving it out (values
    /// are large); returns whether there was one.
    pub fn discard(&mut self, k: &u64) -> bool {
        let Some(i) = self.index(*k) else { return false };
        if self.slots[i].is_none() {
            return false;
        }
        self.slots[i] = None;
        self.len -= 1;
        self.trim();
        true
    }

    /// Keeps the first and last slots occupied (empty: no slots). Empty
    /// slots are dropped in place: popping them one by one would copy
    /// each out.
    fn trim(&mut self) {
        let front = self.slots.iter().take_while(|s| s.is_none()).count();
        if front > 0 {
            self.slots.drain(..front);
            self.base += front as u64;
        }
        let back = self.slots.iter().rev().take_while(|s| s.is_none()).count();
        self.slots.truncate(self.slots.len() - back);
    }

    /// The lowest present key in `[from, to)`.
    pub fn first_in(&self, from: u64, to: u64) -> Option<u64> {
        let start = from.max(self.base);
        (start..to.min(self.base + self.slots.len() as u64)).find(|&k| self.slots[(k - self.base) as usize].is_some())
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, &V)> + '_ {
        let base = self.base;
        self.slots.iter().enumerate().filter_map(move |(i, v)| v.as_ref().map(|v| (base + i as u64, v)))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u64, &mut V)> + '_ {
        let base = self.base;
        self.slots.iter_mut().enumerate().filter_map(move |(i, v)| v.as_mut().map(|v| (base + i as u64, v)))
    }

    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.slots.iter().flatten()
    }
}

impl<V> IntoIterator for SeqMap<V> {
    type Item = (u64, V);
    type IntoIter = std::iter::FilterMap<
        std::iter::Enumerate<std::collections::vec_deque::IntoIter<Option<V>>>,
        Box<dyn FnMut((usize, Option<V>)) -> Option<(u64, V)>>,
    >;
    fn into_iter(self) -> Self::IntoIter {
        let base = self.base;
        self.slots.into_iter().enumerate().filter_map(Box::new(move |(i, v)| v.map(|v| (base + i as u64, v))))
    }
}

/// A set of sequence numbers kept sorted in a vector: the messages with
/// chunks left to schedule. It holds a few entries (bounded by the
/// messages in flight) and changes on every message, so a `BTreeSet`'s
/// node allocated and freed per message costs more than shifting a few
/// words; the vector keeps its capacity.
#[derive(Debug, Clone, Default)]
pub struct SeqSet {
    seqs: Vec<u64>,
}

impl SeqSet {
    pub fn insert(&mut self, k: u64) -> bool {
        // Usually the largest (messages start in order).
        if self.seqs.last().is_none_or(|&l| l < k) {
            self.seqs.push(k);
            return true;
        }
        match self.seqs.binary_search(&k) {
            Ok(_) => false,
            Err(i) => {
                self.seqs.insert(i, k);
                true
            }
        }
    }

    pub fn remove(&mut self, k: &u64) -> bool {
        match self.seqs.binary_search(k) {
            Ok(i) => {
                self.seqs.remove(i);
                true
            }
            Err(_) => false,
        }
    }

    pub fn first(&self) -> Option<u64> {
        self.seqs.first().copied()
    }

    /// The smallest member above `k`.
    pub fn next_after(&self, k: u64) -> Option<u64> {
        let i = self.seqs.partition_point(|&s| s <= k);
        self.seqs.get(i).copied()
    }

    pub fn clear(&mut self) {
        self.seqs.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    proptest::proptest! {
        #[test]
        fn seqset_matches_a_btreeset(ops in proptest::collection::vec((0u8..3, 0u64..40), 0..200)) {
            let mut m = SeqSet::default();
            let mut b = std::collections::BTreeSet::new();
            for (op, x) in ops {
                match op {
                    0 => proptest::prop_assert_eq!(m.insert(x), b.insert(x)),
                    1 => proptest::prop_assert_eq!(m.remove(&x), b.remove(&x)),
                    _ => proptest::prop_assert_eq!(m.next_after(x), b.range(x + 1..).next().copied()),
                }
                proptest::prop_assert_eq!(m.first(), b.first().copied());
            }
            m.clear();
            proptest::prop_assert_eq!(m.first(), None);
        }

        /// Behaves as a BTreeMap under inserts (mostly ascending, as
        /// sequence numbers are), removals anywhere and range lookups.
        #[test]
        fn matches_a_btreemap(ops in proptest::collection::vec((0u8..5, 0u64..48), 0..200)) {
            let mut m = SeqMap::new();
            let mut b = BTreeMap::new();
            let mut next = 0u64;
            for (op, x) in ops {
                match op {
                    0 | 1 => {
                        // Ascending keys, sometimes with gaps or from below.
                        let k = if op == 0 { next } else { x };
                        next = next.max(k) + 1;
                        proptest::prop_assert_eq!(m.insert(k, k * 10), b.insert(k, k * 10));
                    }
                    2 => proptest::prop_assert_eq!(m.remove(&x), b.remove(&x)),
                    3 => proptest::prop_assert_eq!(m.discard(&x), b.remove(&x).is_some()),
                    _ => {
                        let want = b.range(x..x + 5).next().map(|(k, _)| *k);
                        proptest::prop_assert_eq!(m.first_in(x, x + 5), want);
                    }
                }
                proptest::prop_assert_eq!(m.len(), b.len());
                proptest::prop_assert_eq!(m.is_empty(), b.is_empty());
                let mine: Vec<(u64, u64)> = m.iter().map(|(k, v)| (k, *v)).collect();
                let theirs: Vec<(u64, u64)> = b.iter().map(|(k, v)| (*k, *v)).collect();
                proptest::prop_assert_eq!(&mine, &theirs);
                for k in 0..60 {
                    proptest::prop_assert_eq!(m.get(&k), b.get(&k));
                }
                // Slots span only the present keys.
                proptest::prop_assert!(m.slots.len() as u64 <= b.keys().next_back().map_or(0, |l| l + 1 - b.keys().next().copied().unwrap_or(0)));
            }
            let all: Vec<(u64, u64)> = m.into_iter().collect();
            proptest::prop_assert_eq!(all, b.into_iter().collect::<Vec<_>>());
        }
    }
}
