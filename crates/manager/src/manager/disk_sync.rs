//! The G3 pool as the disk log's one eviction authority.
//!
//! The disk tier is log-structured: when it runs out of free regions it
//! reclaims a whole one. [`DiskSync`] is the disk tier's
//! [`ReclaimListener`]: it answers "still wanted?" from the G3 pool, and the
//! log re-inserts every block the pool holds, so a reclaim never takes a
//! block the pool still lists. It queues what the log dropped anyway: keys
//! it reports unwanted (`evicted`; should the pool hold one by the time the
//! manager drains them, that is counted as `reclaimed_by_disk`, which the
//! rule keeps at 0) and keys whose re-insertion failed (`lost`: the bytes
//! are gone, the pool must forget them). The manager drains both with its
//! events, so the pool never offers a block whose bytes are gone.

use kvtier_core::BlockHash;
use kvtier_disk::ReclaimListener;
use parking_lot::Mutex;

use crate::pool::BlockPool;

/// The G3 pool's view, handed to the disk tier.
pub(crate) struct DiskSync {
    pool: BlockPool,
    /// Keys the log dropped as unwanted, not yet checked against the pool.
    evicted: Mutex<Vec<BlockHash>>,
    /// Keys the pool wanted whose re-insertion failed, not yet taken out
    /// of the pool.
    lost: Mutex<Vec<BlockHash>>,
}

/// What the log dropped since the last drain.
pub(crate) struct Dropped {
    /// Reported unwanted.
    pub evicted: Vec<BlockHash>,
    /// Wanted, but not re-insertable.
    pub lost: Vec<BlockHash>,
}

impl DiskSync {
    pub(crate) fn new(pool: BlockPool) -> Self {
        Self {
            pool,
            evicted: Mutex::new(Vec::new()),
            lost: Mutex::new(Vec::new()),
        }
    }

    /// The keys the log dropped since the last call.
    pub(crate) fn take_dropped(&self) -> Dropped {
        Dropped {
            evicted: std::mem::take(&mut *self.evicted.lock()),
            lost: std::mem::take(&mut *self.lost.lock()),
        }
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

    fn lost(&self, keys: &[BlockHash]) {
        self.lost.lock().extend_from_slice(keys);
    }
}
