//! Least recently used: a use makes a key the newest; the oldest eligible
//! key goes first.

use crate::lists::Lists;
use crate::{EvictionPolicy, PolicyKey, PolicyKind, Use, Verdict};

const RECENCY: u32 = 0;

/// LRU.
#[derive(Debug)]
pub struct Lru<K: PolicyKey> {
    lists: Lists<K>,
}

impl<K: PolicyKey> Default for Lru<K> {
    fn default() -> Self {
        Self {
            lists: Lists::new(1),
        }
    }
}

impl<K: PolicyKey> EvictionPolicy<K> for Lru<K> {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Lru
    }

    fn insert(&mut self, key: K, _u: &Use) {
        self.lists.push_newest(key, RECENCY, 0);
    }

    fn access(&mut self, key: K, _u: &Use) {
        if let Some(s) = self.lists.slot(key) {
            self.lists.move_newest(s, RECENCY);
        }
    }

    fn remove(&mut self, key: K) {
        self.lists.remove(key);
    }

    fn victim(&mut self, _now: u64, eligible: &mut dyn FnMut(K) -> Verdict) -> Option<K> {
        self.lists.take_oldest(RECENCY, eligible)
    }

    fn coldest(&self, visit: &mut dyn FnMut(K) -> Verdict) {
        self.lists.visit_oldest(RECENCY, visit);
    }

    fn contains(&self, key: K) -> bool {
        self.lists.slot(key).is_some()
    }

    fn len(&self) -> usize {
        self.lists.len(RECENCY)
    }
}
