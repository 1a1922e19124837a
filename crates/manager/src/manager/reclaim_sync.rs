//! A pool as the one eviction authority of a tier that makes room on its
//! own (the tier's `Reclaiming` facet; the disk log).
//!
//! The disk tier is log-structured: when it runs out of free regions it
//! reclaims a whole one. [`ReclaimSync`] is such a tier's
//! [`ReclaimListener`]: it answers "still wanted?" from the tier's pool, and
//! the log re-inserts every block the pool holds, so a reclaim never takes a
//! block the pool still lists. It queues what the log dropped anyway: keys
//! it reports unwanted (`evicted`; should the pool hold one by the time the
//! manager drains them, that is counted as `reclaimed_by_disk`, which the
//! rule keeps at 0) and keys whose re-insertion failed (`lost`: the bytes
//! are gone, the pool must forget them). The manager drains both with its
//! events, so the pool never offers a block whose bytes are gone.

use std::sync::Arc;

use kvtier_core::BlockHash;
use kvtier_tier::ReclaimListener;
use parking_lot::Mutex;

use crate::pool::BlockPool;
use crate::registry::Registry;
use crate::{Tier, TierList};

/// A pool's view, handed to its tier.
pub(crate) struct ReclaimSync {
    /// The tier (not its store: the store holds this listener).
    tier: Tier,
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

impl ReclaimSync {
    /// A listener for each tier of `tiers` that makes room on its own and
    /// has a pool in `registry`, installed in the tier.
    pub(crate) fn attach(registry: &Registry, tiers: &TierList) -> Vec<Arc<Self>> {
        let mut syncs = Vec::new();
        for (tier, store) in tiers.iter() {
            let (Some(r), Some(pool)) = (store.reclaiming(), registry.pool(tier)) else {
                continue;
            };
            let sync = Arc::new(Self {
                tier,
                pool: pool.clone(),
                evicted: Mutex::new(Vec::new()),
                lost: Mutex::new(Vec::new()),
            });
            r.set_reclaim_listener(sync.clone());
            syncs.push(sync);
        }
        syncs
    }

    /// The tier whose pool this is.
    pub(crate) fn tier(&self) -> Tier {
        self.tier
    }

    /// The keys the tier dropped since the last call.
    pub(crate) fn take_dropped(&self) -> Dropped {
        Dropped {
            evicted: std::mem::take(&mut *self.evicted.lock()),
            lost: std::mem::take(&mut *self.lost.lock()),
        }
    }
}

impl ReclaimListener for ReclaimSync {
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
