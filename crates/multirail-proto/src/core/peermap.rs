//! The core's peers by id. Peer ids are the job's ranks: small and dense,
//! so a peer is found by indexing, not by a tree walk (every message looks
//! its peer up several times on each side). Iteration is in increasing id,
//! as a `BTreeMap`'s, so nothing that walks the peers changes order.
//!
//! A slot is a pointer: ranks this one never talks to cost 8 bytes each.

use super::{Peer, PeerId};

#[derive(Default)]
pub(crate) struct PeerMap {
    slots: Vec<Option<Box<Peer>>>,
}

impl PeerMap {
    pub fn get(&self, id: &PeerId) -> Option<&Peer> {
        self.slots.get(*id as usize).and_then(|s| s.as_deref())
    }

    pub fn get_mut(&mut self, id: &PeerId) -> Option<&mut Peer> {
        self.slots.get_mut(*id as usize).and_then(|s| s.as_deref_mut())
    }

    pub fn contains_key(&self, id: &PeerId) -> bool {
        self.get(id).is_some()
    }

    /// Adds (or replaces) the peer `id`.
    pub fn insert(&mut self, id: PeerId, p: Peer) {
        let i = id as usize;
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        self.slots[i] = Some(Box::new(p));
    }

    /// The peers' ids, in increasing order.
    pub fn keys(&self) -> impl Iterator<Item = PeerId> + '_ {
        self.slots.iter().enumerate().filter(|(_, s)| s.is_some()).map(|(i, _)| i as PeerId)
    }

    pub fn values(&self) -> impl Iterator<Item = &Peer> + '_ {
        self.slots.iter().filter_map(|s| s.as_deref())
    }

    pub fn iter(&self) -> impl Iterator<Item = (PeerId, &Peer)> + '_ {
        self.slots.iter().enumerate().filter_map(|(i, s)| s.as_deref().map(|p| (i as PeerId, p)))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (PeerId, &mut Peer)> + '_ {
        self.slots.iter_mut().enumerate().filter_map(|(i, s)| s.as_deref_mut().map(|p| (i as PeerId, p)))
    }
}

impl std::ops::Index<&PeerId> for PeerMap {
    type Output = Peer;

    fn index(&self, id: &PeerId) -> &Peer {
        self.get(id).expect("no such peer")
    }
}

/// A set of peer ids that answers "already in?" by indexing: every
/// message adds its peer (almost always there already), while walks (the
/// timers) are rare and want increasing order, which the tree keeps.
#[derive(Default)]
pub(crate) struct ActiveSet {
    set: std::collections::BTreeSet<PeerId>,
    has: Vec<bool>,
}

impl ActiveSet {
    pub fn insert(&mut self, id: PeerId) {
        let i = id as usize;
        if self.has.get(i) == Some(&true) {
            return;
        }
        if self.has.len() <= i {
            self.has.resize(i + 1, false);
        }
        self.has[i] = true;
        self.set.insert(id);
    }

    pub fn remove(&mut self, id: &PeerId) {
        if let Some(h) = self.has.get_mut(*id as usize) {
            *h = false;
        }
        self.set.remove(id);
    }

    pub fn contains(&self, id: &PeerId) -> bool {
        self.has.get(*id as usize) == Some(&true)
    }

    pub fn extend(&mut self, ids: impl IntoIterator<Item = PeerId>) {
        for id in ids {
            self.insert(id);
        }
    }

    /// In increasing order.
    pub fn iter(&self) -> impl Iterator<Item = &PeerId> + '_ {
        self.set.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Config, Core};

    fn peer() -> Peer {
        let mut c = Core::new(Config::default());
        c.add_peer(0, 1);
        c.peers.slots.swap_remove(0).map(|b| *b).expect("added")
    }

    #[test]
    fn ids_come_back_in_increasing_order_and_gaps_are_absent() {
        let mut m = PeerMap::default();
        for id in [5, 0, 3] {
            m.insert(id, peer());
        }
        assert_eq!(m.keys().collect::<Vec<_>>(), vec![0, 3, 5]);
        assert_eq!(m.iter().map(|(id, _)| id).collect::<Vec<_>>(), vec![0, 3, 5]);
        assert_eq!(m.iter_mut().map(|(id, _)| id).collect::<Vec<_>>(), vec![0, 3, 5]);
        assert_eq!(m.values().count(), 3);
        assert!(m.contains_key(&3) && !m.contains_key(&4) && !m.contains_key(&6) && !m.contains_key(&u32::MAX));
        assert!(m.get_mut(&1).is_none());
    }

    #[test]
    fn the_active_set_answers_like_a_tree_set() {
        let mut a = ActiveSet::default();
        a.extend([4, 1]);
        a.insert(1);
        a.insert(7);
        assert_eq!(a.iter().copied().collect::<Vec<_>>(), vec![1, 4, 7]);
        a.remove(&4);
        a.remove(&9);
        assert!(a.contains(&1) && !a.contains(&4) && !a.contains(&9));
        a.insert(4);
        assert_eq!(a.iter().copied().collect::<Vec<_>>(), vec![1, 4, 7]);
    }
}
