//! Least frequently used, ties broken by recency: the least recently used
//! of the least used blocks goes first. A block's count starts at 1 when it
//! enters the tier and is forgotten when it leaves.

use std::collections::{BTreeSet, HashMap};

use kvtier_core::BlockHash;

use super::{EvictionPolicy, InsertInfo, PolicyKind};

/// LFU over block hashes.
#[derive(Debug, Default)]
pub struct Lfu {
    next_seq: u64,
    /// `(uses, last-use sequence, key)`: the first eligible entry is the victim.
    order: BTreeSet<(u64, u64, BlockHash)>,
    entry: HashMap<BlockHash, (u64, u64)>,
}

impl Lfu {
    fn place(&mut self, key: BlockHash, uses: u64) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.insert((uses, seq, key));
        self.entry.insert(key, (uses, seq));
    }

    /// Uses counted for `key`, if tracked.
    pub fn uses(&self, key: BlockHash) -> Option<u64> {
        self.entry.get(&key).map(|e| e.0)
    }
}

impl EvictionPolicy for Lfu {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Lfu
    }

    fn insert(&mut self, key: BlockHash, _info: InsertInfo) {
        self.remove(key);
        self.place(key, 1);
    }

    fn access(&mut self, key: BlockHash, _now: u64) {
        if let Some((uses, seq)) = self.entry.remove(&key) {
            self.order.remove(&(uses, seq, key));
            self.place(key, uses.saturating_add(1));
        }
    }

    fn remove(&mut self, key: BlockHash) {
        if let Some((uses, seq)) = self.entry.remove(&key) {
            self.order.remove(&(uses, seq, key));
        }
    }

    fn victim(
        &mut self,
        _now: u64,
        eligible: &mut dyn FnMut(BlockHash) -> bool,
    ) -> Option<BlockHash> {
        let key = self.order.iter().map(|e| e.2).find(|k| eligible(*k))?;
        self.remove(key);
        Some(key)
    }

    fn len(&self) -> usize {
        self.entry.len()
    }
}
