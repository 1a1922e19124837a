//! Restart adoption: the blocks the tiers still hold when the manager
//! starts (the arena after a crash, see `MemoryTier::adoption`; the disk
//! log; the objects under a remote prefix) are registered in their pools,
//! so lookups find them without the engine computing them again.

use std::collections::HashSet;

use kvtier_core::{BlockHash, MAX_TIERS};

use super::{BlockManager, ManagerError};
use crate::Tier;
use crate::placement::CascadeMode;
use crate::pool::BlockPool;

/// What [`BlockManager::adopt`] registered, per tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Adopted {
    /// Blocks now in each tier's pool, by position ([`in_tier`](Self::in_tier)).
    pub by_tier: [usize; MAX_TIERS],
    /// Blocks found but not adopted: the pool was full, or the block was
    /// already registered. Such a block is removed from a tier that
    /// indexes its blocks itself (the arena, the disk log), whose contents
    /// only the pool decides.
    pub skipped: usize,
}

impl Adopted {
    /// Blocks adopted into `tier`'s pool.
    pub fn in_tier(&self, tier: Tier) -> usize {
        self.by_tier[tier.index()]
    }
}

impl BlockManager {
    /// Registers what each tier holds in its pool, fastest tier first, as
    /// roots (no tier keeps parent links): unpinned and unreferenced, so
    /// evicted and moved down like any other block. Call once, right after
    /// [`new`](Self::new), before serving. Publishes a stored event per
    /// adopted block, so the cluster's view learns what the node holds.
    ///
    /// A tier that indexes its blocks itself ([`contains`] answers for
    /// them: the arena, the disk log) keeps only what its pool adopted;
    /// the rest is removed from it, as nothing else would ever evict it.
    ///
    /// In exclusive mode, a block adopted into a faster tier is not adopted
    /// from such a tier below, whose copy is forgotten: the arena's copy
    /// was verified when the arena was adopted, while the log's may be the
    /// move down the crash cut short, which recovery accepts and only a
    /// read finds torn (docs/disk-format.md §12, case 2). Kept, that copy
    /// would let the top tier drop its good one as "already below" when it
    /// makes room. In inclusive mode every copy stays: a committed block's
    /// copy below was written through before its commit was answered, so
    /// only a commit never answered can have a torn one, and the copies
    /// below are what the mode promises.
    ///
    /// [`contains`]: kvtier_tier::TierStore::contains
    pub async fn adopt(&self) -> Result<Adopted, ManagerError> {
        let mut adopted = Adopted::default();
        let exclusive = self.planner.config().mode == CascadeMode::Exclusive;
        let mut above: HashSet<BlockHash> = HashSet::new();
        for (tier, store) in self.tiers().iter() {
            let Some(pool) = self.registry.pool(tier) else {
                continue;
            };
            let (copies, keys): (Vec<BlockHash>, Vec<BlockHash>) = store
                .keys()
                .await
                .into_iter()
                .partition(|k| exclusive && above.contains(k) && store.contains(*k));
            store.remove(&copies).await;
            let (n, left) = adopt_into(pool, keys.clone());
            // The pool is the tier's only authority (for the disk log,
            // docs/disk-format.md, I22): a block it does not list would
            // hold its slot for good.
            let held: Vec<BlockHash> = left
                .iter()
                .copied()
                .filter(|k| store.contains(*k))
                .collect();
            store.remove(&held).await;
            let left: HashSet<BlockHash> = left.into_iter().collect();
            above.extend(keys.into_iter().filter(|k| !left.contains(k)));
            adopted.by_tier[tier.index()] = n;
            adopted.skipped += left.len();
        }
        self.publish_events();
        Ok(adopted)
    }
}

/// Registers `keys` in `pool` until it is full; returns how many it
/// registered and the keys it did not.
fn adopt_into(pool: &BlockPool, keys: Vec<BlockHash>) -> (usize, Vec<BlockHash>) {
    let mut adopted = 0;
    let mut left = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        // Free slots only: adopting must not evict what it adopted.
        if super::room::free_slots(pool) == 0 {
            left.extend_from_slice(&keys[i..]);
            break;
        }
        match pool.begin_incoming(*key, None) {
            Ok(incoming) => {
                drop(incoming.finish());
                adopted += 1;
            }
            Err(_) => left.push(*key),
        }
    }
    (adopted, left)
}
