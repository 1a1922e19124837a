//! Restart adoption: the blocks the disk log and the remote prefix still
//! hold when the manager starts are registered in the G3 and G4 pools, so
//! lookups find them without the engine computing them again.

use kvtier_core::BlockHash;

use super::{BlockManager, ManagerError};
use crate::Tier;
use crate::pool::BlockPool;

/// What [`BlockManager::adopt`] registered, per tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Adopted {
    /// Blocks of the disk log now in the G3 pool.
    pub g3: usize,
    /// Objects under the remote prefix now in the G4 pool.
    pub g4: usize,
    /// Blocks found but not adopted: the pool was full, or the block was
    /// already registered.
    pub skipped: usize,
}

impl BlockManager {
    /// Registers what the disk tier and the remote tier hold in their
    /// pools, as roots (the log keeps no parent links). Call once, right
    /// after [`new`](Self::new), before serving. Publishes a stored event
    /// per adopted block, so the cluster's view learns what the node holds.
    pub async fn adopt(&self) -> Result<Adopted, ManagerError> {
        let mut adopted = Adopted::default();
        if let (Some(pool), Some(disk)) = (self.registry.pool(Tier::G3), &self.tiers.disk) {
            let (n, skipped) = adopt_into(pool, disk.keys());
            adopted.g3 = n;
            adopted.skipped += skipped;
        }
        if let (Some(pool), Some(remote)) = (self.registry.pool(Tier::G4), &self.tiers.remote) {
            let keys = remote
                .list()
                .await
                .map_err(|e| ManagerError::Config(format!("listing the remote tier: {e}")))?;
            let (n, skipped) = adopt_into(pool, keys);
            adopted.g4 = n;
            adopted.skipped += skipped;
        }
        self.publish_events();
        Ok(adopted)
    }
}

/// Registers `keys` in `pool` until it is full; returns (adopted, skipped).
fn adopt_into(pool: &BlockPool, keys: Vec<BlockHash>) -> (usize, usize) {
    let mut adopted = 0;
    for (i, key) in keys.iter().enumerate() {
        // Free slots only: adopting must not evict what it adopted.
        if super::room::free_slots(pool) == 0 {
            return (adopted, keys.len() - i);
        }
        if let Ok(incoming) = pool.begin_incoming(*key, None) {
            drop(incoming.finish());
            adopted += 1;
        }
    }
    (adopted, keys.len() - adopted)
}
