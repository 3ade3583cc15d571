//! A message's fragments by offset. Most messages are one fragment (small
//! messages, and chunks of a large one are few), so they live inline, in
//! offset order, found by binary search; chunks are usually added in
//! increasing offset order, which appends.

use std::ops::Range;

use smallvec::SmallVec;

use super::send::Frag;

#[derive(Debug, Default)]
pub(crate) struct FragMap {
    v: SmallVec<[(u64, Frag); 1]>,
}

impl FragMap {
    fn find(&self, offset: u64) -> Result<usize, usize> {
        match self.v.last() {
            Some(&(last, _)) if last < offset => Err(self.v.len()),
            None => Err(0),
            _ => self.v.binary_search_by_key(&offset, |&(o, _)| o),
        }
    }

    pub fn get(&self, offset: &u64) -> Option<&Frag> {
        self.find(*offset).ok().map(|i| &self.v[i].1)
    }

    pub fn get_mut(&mut self, offset: &u64) -> Option<&mut Frag> {
        self.find(*offset).ok().map(|i| &mut self.v[i].1)
    }

    /// Adds (or replaces) the fragment at `offset`.
    pub fn insert(&mut self, offset: u64, f: Frag) {
        match self.find(offset) {
            Ok(i) => self.v[i].1 = f,
            Err(i) => self.v.insert(i, (offset, f)),
        }
    }

    pub fn values(&self) -> impl Iterator<Item = &Frag> {
        self.v.iter().map(|(_, f)| f)
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut Frag> {
        self.v.iter_mut().map(|(_, f)| f)
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&u64, &mut Frag)> {
        self.v.iter_mut().map(|(o, f)| (&*o, f))
    }

    /// Fragments whose offset lies in `r`, in offset order.
    pub fn range_mut(&mut self, r: Range<u64>) -> impl Iterator<Item = (&u64, &mut Frag)> {
        let start = self.v.partition_point(|&(o, _)| o < r.start);
        let end = self.v.partition_point(|&(o, _)| o < r.end).max(start);
        self.v[start..end].iter_mut().map(|(o, f)| (&*o, f))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::core::send::FragState;

    fn frag(len: u32) -> Frag {
        Frag {
            len,
            rail: 0,
            state: FragState::Queued,
            ever_written: false,
            retransmit: false,
            stamp: Default::default(),
        }
    }

    proptest! {
        /// Behaves as the ordered map it replaces, whatever the order of
        /// insertion and the lookups.
        #[test]
        fn same_as_an_ordered_map(
            inserts in proptest::collection::vec((0u64..64, 1u32..100), 0..40),
            lookups in proptest::collection::vec(0u64..70, 0..20),
            range in (0u64..70, 0u64..70),
        ) {
            let mut ours = FragMap::default();
            let mut model = BTreeMap::new();
            for &(off, len) in &inserts {
                ours.insert(off, frag(len));
                model.insert(off, len);
            }
            for off in &lookups {
                prop_assert_eq!(ours.get(off).map(|f| f.len), model.get(off).copied());
                if let Some(f) = ours.get_mut(off) {
                    f.len += 1;
                    *model.get_mut(off).unwrap() += 1;
                }
            }
            let all: Vec<(u64, u32)> = ours.iter_mut().map(|(o, f)| (*o, f.len)).collect();
            prop_assert_eq!(&all, &model.iter().map(|(o, l)| (*o, *l)).collect::<Vec<_>>());
            prop_assert_eq!(ours.values().count(), model.len());
            let (a, b) = range;
            let got: Vec<u64> = ours.range_mut(a..b).map(|(o, _)| *o).collect();
            let want: Vec<u64> = if a < b { model.range(a..b).map(|(o, _)| *o).collect() } else { vec![] };
            prop_assert_eq!(got, want);
        }
    }
}
