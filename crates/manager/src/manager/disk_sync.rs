//! Keeping the G3 pool and the disk log in step when the log reclaims a
//! region.
//!
//! The disk tier is log-structured: when it runs out of free regions it
//! reclaims a whole one, whatever the G3 pool's policy thinks of the blocks
//! in it. [`DiskSync`] is the disk tier's [`ReclaimListener`]: it answers
//! "still wanted?" from the G3 pool (wanted blocks are re-inserted first,
//! within the disk's re-insertion budget), and queues the keys the log
//! dropped anyway. The manager drains that queue with its events and takes
//! those blocks out of the G3 pool, so the pool never offers a block whose
//! bytes are gone.

use kvtier_core::BlockHash;
use kvtier_disk::ReclaimListener;
use parking_lot::Mutex;

use crate::pool::BlockPool;

/// The G3 pool's view, handed to the disk tier.
pub(crate) struct DiskSync {
    pool: BlockPool,
    /// Keys the log dropped, not yet taken out of the pool.
    evicted: Mutex<Vec<BlockHash>>,
}

impl DiskSync {
    pub(crate) fn new(pool: BlockPool) -> Self {
        Self {
            pool,
            evicted: Mutex::new(Vec::new()),
        }
    }

    /// The keys the log dropped since the last call.
    pub(crate) fn take_evicted(&self) -> Vec<BlockHash> {
        std::mem::take(&mut *self.evicted.lock())
    }
}

impl ReclaimListener for DiskSync {
    fn retain(&self, key: BlockHash) -> bool {
        // Held, pinned, in flight or merely resident: the pool still
        // counts on these bytes.
        self.pool.presence(key).is_some()
    }

    fn evicted(&self, keys: &[BlockHash]) {
        self.evicted.lock().extend_from_slice(keys);
    }
}
