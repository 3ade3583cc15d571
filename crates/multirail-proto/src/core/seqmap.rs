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
        let old = self.slots[i].replace(v);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub fn remove(&mut self, k: &u64) -> Option<V> {
        let i = self.index(*k)?;
        let v = self.slots[i].take()?;
        self.len -= 1;
        // Keep the first and last slots occupied (empty: no slots).
        while matches!(self.slots.front(), Some(None)) {
            self.slots.pop_front();
            self.base += 1;
        }
        while matches!(self.slots.back(), Some(None)) {
            self.slots.pop_back();
        }
        Some(v)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    proptest::proptest! {
        /// Behaves as a BTreeMap under inserts (mostly ascending, as
        /// sequence numbers are), removals anywhere and range lookups.
        #[test]
        fn matches_a_btreemap(ops in proptest::collection::vec((0u8..4, 0u64..48), 0..200)) {
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
