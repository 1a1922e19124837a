//! Restart adoption: the blocks the arena (after a crash, see
//! `MemoryTier::adoption`), the disk log and the remote prefix still hold
//! when the manager starts are registered in the G2, G3 and G4 pools, so
//! lookups find them without the engine computing them again.

use std::collections::HashSet;

use kvtier_core::BlockHash;

use super::{BlockManager, ManagerError};
use crate::Tier;
use crate::placement::CascadeMode;
use crate::pool::BlockPool;

/// What [`BlockManager::adopt`] registered, per tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Adopted {
    /// Blocks of the arena (kept from a crashed owner's) now in the G2 pool.
    pub g2: usize,
    /// Blocks of the disk log now in the G3 pool.
    pub g3: usize,
    /// Objects under the remote prefix now in the G4 pool.
    pub g4: usize,
    /// Blocks found but not adopted: the pool was full, or the block was
    /// already registered. A G2 or G3 block not adopted is removed from
    /// the arena or the disk log, whose contents only the pool decides.
    pub skipped: usize,
}

impl BlockManager {
    /// Registers what the arena, the disk tier and the remote tier hold
    /// in their pools, as roots (neither keeps parent links): unpinned and
    /// unreferenced, so evicted and moved down like any other block. Call
    /// once, right after [`new`](Self::new), before serving. Publishes a
    /// stored event per adopted block, so the cluster's view learns what
    /// the node holds.
    ///
    /// In exclusive mode, a block adopted into G2 is not adopted from the
    /// disk log, whose copy is forgotten: the arena's copy was verified when
    /// the arena was adopted, while the log's may be the move down the crash
    /// cut short, which recovery accepts and only a read finds torn
    /// (docs/disk-format.md §12, case 2). Kept, that copy would let G2 drop
    /// its good one as "already below" when it makes room. In inclusive
    /// mode both stay: a committed block's copy below was written through
    /// before its commit was answered, so only a commit never answered can
    /// have a torn one, and the copies below are what the mode promises.
    pub async fn adopt(&self) -> Result<Adopted, ManagerError> {
        let mut adopted = Adopted::default();
        let mut in_g2 = HashSet::new();
        if let (Some(pool), Some(memory)) = (self.registry.pool(Tier::G2), &self.tiers.memory) {
            let (n, left) = adopt_into(pool, memory.keys());
            // The pool is the arena's only authority: a block it does not
            // know would hold its slot for good.
            for key in &left {
                memory.remove(*key);
            }
            in_g2.extend(memory.keys());
            adopted.g2 = n;
            adopted.skipped += left.len();
        }
        if let (Some(pool), Some(disk)) = (self.registry.pool(Tier::G3), &self.tiers.disk) {
            let exclusive = self.planner.config().mode == CascadeMode::Exclusive;
            let (above, keys): (Vec<BlockHash>, Vec<BlockHash>) = disk
                .keys()
                .into_iter()
                .partition(|k| exclusive && in_g2.contains(k));
            for key in above {
                disk.remove(key);
            }
            let (n, left) = adopt_into(pool, keys);
            // The pool is the log's only authority (docs/disk-format.md,
            // I22): a block it does not list would never be evicted, and
            // would count against the log's slack for good.
            for key in &left {
                disk.remove(*key);
            }
            adopted.g3 = n;
            adopted.skipped += left.len();
        }
        if let (Some(pool), Some(remote)) = (self.registry.pool(Tier::G4), &self.tiers.remote) {
            let keys = remote
                .list()
                .await
                .map_err(|e| ManagerError::Config(format!("listing the remote tier: {e}")))?;
            let (n, left) = adopt_into(pool, keys);
            adopted.g4 = n;
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
