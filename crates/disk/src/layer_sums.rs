//! [`LayerSumsCache`]: per-layer checksums of recently read blocks, so that
//! reading layer after layer of the same blocks (layer-wise loading) reads
//! each block's slot header once rather than once per layer.
//!
//! Why no invalidation is needed: the cache is keyed by (block key, block
//! checksum), and an entry is inserted only after its layer sums were read
//! from a slot header and found to combine to that block checksum. The layer
//! sums of a block are a function of its key and bytes, which the block
//! checksum pins down; wherever the block lives or moves, the same key and
//! checksum mean the same layer sums. Every layer read is still verified
//! against them.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use kvtier_core::{BlockHash, BlockHashHasher};
use parking_lot::Mutex;

/// A bounded FIFO cache of authenticated per-layer checksums.
pub(crate) struct LayerSumsCache {
    inner: Mutex<Inner>,
    capacity: usize,
}

#[derive(Default)]
struct Inner {
    /// Keys are hashes already: one multiply spreads them, for less than
    /// SipHash costs.
    map: HashMap<(BlockHash, u64), Arc<[u64]>, BuildHasherDefault<BlockHashHasher>>,
    order: VecDeque<(BlockHash, u64)>,
}

impl LayerSumsCache {
    /// A cache of at most `capacity` blocks (0 disables it).
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            capacity,
        }
    }

    /// The layer sums of block `key` whose block checksum is `block_sum`.
    pub fn get(&self, key: BlockHash, block_sum: u64) -> Option<Arc<[u64]>> {
        if self.capacity == 0 {
            return None;
        }
        self.inner.lock().map.get(&(key, block_sum)).cloned()
    }

    /// Remembers `sums`, which the caller has checked combine to `block_sum`.
    pub fn insert(&self, key: BlockHash, block_sum: u64, sums: Arc<[u64]>) {
        if self.capacity == 0 {
            return;
        }
        let mut g = self.inner.lock();
        if g.map.insert((key, block_sum), sums).is_none() {
            g.order.push_back((key, block_sum));
            while g.order.len() > self.capacity {
                if let Some(old) = g.order.pop_front() {
                    g.map.remove(&old);
                }
            }
        }
    }

    /// Blocks cached.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.inner.lock().map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_fifo_keyed_by_key_and_checksum() {
        let c = LayerSumsCache::new(2);
        c.insert(BlockHash(1), 10, Arc::from(vec![1u64, 2]));
        c.insert(BlockHash(2), 20, Arc::from(vec![3u64]));
        assert_eq!(c.get(BlockHash(1), 10).as_deref(), Some(&[1u64, 2][..]));
        // Same key, other checksum: a different block content, not a hit.
        assert!(c.get(BlockHash(1), 11).is_none());
        c.insert(BlockHash(3), 30, Arc::from(vec![4u64]));
        assert_eq!(c.len(), 2);
        assert!(c.get(BlockHash(1), 10).is_none(), "oldest entry evicted");
        assert!(c.get(BlockHash(3), 30).is_some());
        let off = LayerSumsCache::new(0);
        off.insert(BlockHash(1), 1, Arc::from(vec![1u64]));
        assert!(off.get(BlockHash(1), 1).is_none());
    }
}
