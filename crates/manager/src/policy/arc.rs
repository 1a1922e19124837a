//! Adaptive replacement cache (Megiddo and Modha, FAST '03).
//!
//! Resident blocks sit in `t1` (seen once since they entered) or `t2` (used
//! again); `b1` and `b2` remember the hashes recently evicted from each. A
//! block that comes back while remembered in `b1` says recency was
//! undervalued and grows `p`, the target size of `t1`; one remembered in
//! `b2` shrinks it. Eviction takes from `t1` while it is larger than `p`,
//! else from `t2`, falling back to the other list when the preferred one has
//! no eligible block. Ghost lists are capped at the tier's capacity each.

use kvtier_core::BlockHash;

use super::order::OrderedKeys;
use super::{EvictionPolicy, InsertInfo, PolicyKind};

/// ARC over block hashes.
#[derive(Debug)]
pub struct Arc {
    capacity: usize,
    /// Target size of `t1`.
    p: usize,
    t1: OrderedKeys,
    t2: OrderedKeys,
    b1: OrderedKeys,
    b2: OrderedKeys,
}

impl Arc {
    /// ARC for a tier of `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            p: 0,
            t1: OrderedKeys::default(),
            t2: OrderedKeys::default(),
            b1: OrderedKeys::default(),
            b2: OrderedKeys::default(),
        }
    }

    /// The current target size of the recency list.
    pub fn target_recent(&self) -> usize {
        self.p
    }

    fn remember(ghosts: &mut OrderedKeys, key: BlockHash, capacity: usize) {
        ghosts.push_newest(key);
        while ghosts.len() > capacity {
            ghosts.pop_oldest();
        }
    }
}

impl EvictionPolicy for Arc {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Arc
    }

    fn insert(&mut self, key: BlockHash, _info: InsertInfo) {
        if self.b1.remove(key) {
            let step = (self.b2.len() / (self.b1.len() + 1)).max(1);
            self.p = (self.p + step).min(self.capacity);
            self.t2.push_newest(key);
        } else if self.b2.remove(key) {
            let step = (self.b1.len() / (self.b2.len() + 1)).max(1);
            self.p = self.p.saturating_sub(step);
            self.t2.push_newest(key);
        } else {
            self.t1.push_newest(key);
        }
    }

    fn access(&mut self, key: BlockHash, _now: u64) {
        if self.t1.remove(key) || self.t2.contains(key) {
            self.t2.push_newest(key);
        }
    }

    fn remove(&mut self, key: BlockHash) {
        self.t1.remove(key);
        self.t2.remove(key);
    }

    fn victim(
        &mut self,
        _now: u64,
        eligible: &mut dyn FnMut(BlockHash) -> bool,
    ) -> Option<BlockHash> {
        let recent_first = self.t1.len() > self.p || self.t2.is_empty();
        let order = if recent_first {
            [true, false]
        } else {
            [false, true]
        };
        for from_t1 in order {
            let (list, ghosts) = if from_t1 {
                (&mut self.t1, &mut self.b1)
            } else {
                (&mut self.t2, &mut self.b2)
            };
            if let Some(key) = list.take_oldest_where(eligible) {
                Self::remember(ghosts, key, self.capacity);
                return Some(key);
            }
        }
        None
    }

    fn len(&self) -> usize {
        self.t1.len() + self.t2.len()
    }
}
