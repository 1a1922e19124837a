//! Least recently used: a use makes a block the newest; the oldest eligible
//! block goes first.

use kvtier_core::BlockHash;

use super::order::OrderedKeys;
use super::{EvictionPolicy, InsertInfo, PolicyKind};

/// LRU over block hashes.
#[derive(Debug, Default)]
pub struct Lru {
    recency: OrderedKeys,
}

impl EvictionPolicy for Lru {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Lru
    }

    fn insert(&mut self, key: BlockHash, _info: InsertInfo) {
        self.recency.push_newest(key);
    }

    fn access(&mut self, key: BlockHash, _now: u64) {
        if self.recency.contains(key) {
            self.recency.push_newest(key);
        }
    }

    fn remove(&mut self, key: BlockHash) {
        self.recency.remove(key);
    }

    fn victim(
        &mut self,
        _now: u64,
        eligible: &mut dyn FnMut(BlockHash) -> bool,
    ) -> Option<BlockHash> {
        self.recency.take_oldest_where(eligible)
    }

    fn len(&self) -> usize {
        self.recency.len()
    }
}
