//! Adaptive replacement cache (Megiddo and Modha, FAST '03).
//!
//! Resident keys sit in `T1` (seen once since they entered) or `T2` (used
//! again); `B1` and `B2` remember the keys recently evicted from each (at
//! most the tier's capacity each). A key that comes back while remembered
//! in `B1` says recency was undervalued and grows `p`, the target size of
//! `T1`; one remembered in `B2` shrinks it, by `max(|other ghost| / |own
//! ghost|, 1)` as in the paper. Eviction takes from `T1` while it is larger
//! than `p` (or `T2` is empty), else from `T2`, falling back to the other
//! list when the preferred one has no eligible key. A key removed without
//! eviction (promoted to a faster tier) leaves no ghost.

use crate::lists::Lists;
use crate::{EvictionPolicy, PolicyKey, PolicyKind, Use, Verdict};

const T1: u32 = 0;
const T2: u32 = 1;
const B1: u32 = 2;
const B2: u32 = 3;

/// ARC.
#[derive(Debug)]
pub struct Arc<K: PolicyKey> {
    capacity: usize,
    /// Target size of `T1`.
    p: usize,
    lists: Lists<K>,
}

impl<K: PolicyKey> Arc<K> {
    /// ARC for a tier of `capacity` keys.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            p: 0,
            lists: Lists::new(4),
        }
    }

    /// The current target size of the recency list.
    pub fn target_recent(&self) -> usize {
        self.p
    }

    fn resident(&self, key: K) -> Option<u32> {
        self.lists
            .slot(key)
            .filter(|s| matches!(self.lists.list_at(*s), T1 | T2))
    }

    /// Evicts the oldest eligible key of `from` into the ghost list `ghost`.
    fn take(
        &mut self,
        from: u32,
        ghost: u32,
        eligible: &mut dyn FnMut(K) -> Verdict,
    ) -> Result<Option<K>, crate::lists::Stopped> {
        let Some(slot) = self.lists.find_oldest(from, eligible)? else {
            return Ok(None);
        };
        let key = self.lists.key(slot);
        self.lists.move_newest(slot, ghost);
        while self.lists.len(ghost) > self.capacity {
            self.lists.pop_oldest(ghost);
        }
        Ok(Some(key))
    }
}

impl<K: PolicyKey> EvictionPolicy<K> for Arc<K> {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Arc
    }

    fn insert(&mut self, key: K, _u: &Use) {
        let (b1, b2) = (self.lists.len(B1), self.lists.len(B2));
        match self.lists.list_of(key) {
            Some(B1) => {
                self.p = (self.p + (b2 / b1).max(1)).min(self.capacity);
                self.lists.push_newest(key, T2, 0);
            }
            Some(B2) => {
                self.p = self.p.saturating_sub((b1 / b2).max(1));
                self.lists.push_newest(key, T2, 0);
            }
            _ => {
                self.lists.push_newest(key, T1, 0);
            }
        }
    }

    fn access(&mut self, key: K, _u: &Use) {
        if let Some(s) = self.resident(key) {
            self.lists.move_newest(s, T2);
        }
    }

    fn remove(&mut self, key: K) {
        if let Some(s) = self.resident(key) {
            self.lists.remove_slot(s);
        }
    }

    fn victim(&mut self, _now: u64, eligible: &mut dyn FnMut(K) -> Verdict) -> Option<K> {
        let recent_first = self.lists.len(T1) > self.p || self.lists.len(T2) == 0;
        let order = if recent_first {
            [(T1, B1), (T2, B2)]
        } else {
            [(T2, B2), (T1, B1)]
        };
        for (from, ghost) in order {
            if let Some(key) = self.take(from, ghost, eligible).ok()? {
                return Some(key);
            }
        }
        None
    }

    fn coldest(&self, visit: &mut dyn FnMut(K) -> Verdict) {
        let first = if self.lists.len(T1) > self.p || self.lists.len(T2) == 0 {
            [T1, T2]
        } else {
            [T2, T1]
        };
        let _ = first.iter().any(|l| self.lists.visit_oldest(*l, visit));
    }

    fn contains(&self, key: K) -> bool {
        self.resident(key).is_some()
    }

    fn len(&self) -> usize {
        self.lists.len(T1) + self.lists.len(T2)
    }
}
