//! S3-FIFO (Yang et al., SOSP '23): a small FIFO (a tenth of the tier)
//! filters one-hit blocks, a main FIFO with a small use counter holds the
//! rest, and a ghost FIFO remembers hashes evicted from the small queue.
//!
//! A new block enters the small queue, or the main queue when its hash is
//! a ghost. Eviction from the small queue moves a block used since it
//! entered to the main queue instead of evicting it; eviction from the main
//! queue gives a used block another round (its counter decremented). Uses
//! are counted up to 3.

use std::collections::HashMap;

use kvtier_core::BlockHash;

use super::order::OrderedKeys;
use super::{EvictionPolicy, InsertInfo, PolicyKind};

const MAX_USES: u8 = 3;

/// S3-FIFO over block hashes.
#[derive(Debug)]
pub struct S3Fifo {
    capacity: usize,
    small: OrderedKeys,
    main: OrderedKeys,
    ghost: OrderedKeys,
    uses: HashMap<BlockHash, u8>,
}

impl S3Fifo {
    /// S3-FIFO for a tier of `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            small: OrderedKeys::default(),
            main: OrderedKeys::default(),
            ghost: OrderedKeys::default(),
            uses: HashMap::new(),
        }
    }

    fn small_target(&self) -> usize {
        (self.capacity / 10).max(1)
    }

    /// Whether `key` sits in the main queue.
    pub fn in_main(&self, key: BlockHash) -> bool {
        self.main.contains(key)
    }

    /// Scans the small queue: used blocks move to main, the first unused
    /// eligible one is evicted and remembered as a ghost.
    fn evict_small(&mut self, eligible: &mut dyn FnMut(BlockHash) -> bool) -> Option<BlockHash> {
        let mut from = 0;
        while let Some((seq, key)) = self.small.next_from(from) {
            from = seq + 1;
            if !eligible(key) {
                continue;
            }
            if self.uses.get(&key).copied().unwrap_or(0) > 0 {
                self.small.remove(key);
                self.uses.insert(key, 0);
                self.main.push_newest(key);
                continue;
            }
            self.small.remove(key);
            self.uses.remove(&key);
            self.ghost.push_newest(key);
            while self.ghost.len() > self.capacity {
                self.ghost.pop_oldest();
            }
            return Some(key);
        }
        None
    }

    /// Scans the main queue: used blocks get another round with one use
    /// less, the first unused eligible one is evicted. Terminates because
    /// every reinsertion lowers a counter.
    fn evict_main(&mut self, eligible: &mut dyn FnMut(BlockHash) -> bool) -> Option<BlockHash> {
        let mut from = 0;
        while let Some((seq, key)) = self.main.next_from(from) {
            from = seq + 1;
            if !eligible(key) {
                continue;
            }
            let uses = self.uses.get(&key).copied().unwrap_or(0);
            if uses > 0 {
                self.uses.insert(key, uses - 1);
                self.main.push_newest(key);
                continue;
            }
            self.main.remove(key);
            self.uses.remove(&key);
            return Some(key);
        }
        None
    }
}

impl EvictionPolicy for S3Fifo {
    fn kind(&self) -> PolicyKind {
        PolicyKind::S3Fifo
    }

    fn insert(&mut self, key: BlockHash, _info: InsertInfo) {
        self.uses.insert(key, 0);
        if self.ghost.remove(key) {
            self.main.push_newest(key);
        } else {
            self.small.push_newest(key);
        }
    }

    fn access(&mut self, key: BlockHash, _now: u64) {
        if let Some(u) = self.uses.get_mut(&key) {
            *u = (*u + 1).min(MAX_USES);
        }
    }

    fn remove(&mut self, key: BlockHash) {
        self.small.remove(key);
        self.main.remove(key);
        self.uses.remove(&key);
    }

    fn victim(
        &mut self,
        _now: u64,
        eligible: &mut dyn FnMut(BlockHash) -> bool,
    ) -> Option<BlockHash> {
        if self.small.len() >= self.small_target() || self.main.is_empty() {
            self.evict_small(eligible)
                .or_else(|| self.evict_main(eligible))
        } else {
            self.evict_main(eligible)
                .or_else(|| self.evict_small(eligible))
        }
    }

    fn len(&self) -> usize {
        self.small.len() + self.main.len()
    }
}
