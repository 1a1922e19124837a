//! Pool events to published [`KvEvent`]s, and the tiers' bytes kept in
//! step with the pools.

use crate::Tier;
use crate::events::{BlockLocation, BlockRemoved, BlockStored, KvEvent};
use crate::pool::PoolEvent;

use super::BlockManager;

impl BlockManager {
    /// Drains every pool's stored / removed events (in order per tier),
    /// removes the bytes of blocks that left G2, G3 or G4 from the arena,
    /// the disk or the remote store, and publishes the events.
    pub(crate) fn publish_events(&self) {
        let _applying = self.applying.lock();
        self.forget_reclaimed();
        let mut remote_gone = Vec::new();
        for pool in self.registry.pools() {
            let tier = pool.tier();
            for event in pool.drain_events() {
                match event {
                    PoolEvent::Stored { hash, .. } => {
                        let parent_hash = pool.parent_of(hash).flatten();
                        let location = match tier {
                            Tier::G1 => pool
                                .slot_of(hash)
                                .and_then(|slot| self.device_block(slot))
                                .map(|id| BlockLocation::DeviceSlot {
                                    slot: u64::from(id.0),
                                }),
                            Tier::G2 => self.tiers.memory.as_ref().and_then(|m| {
                                m.get_ref(hash).map(|r| BlockLocation::ArenaSlot {
                                    slot: r.slot() as u64,
                                })
                            }),
                            Tier::G4 => self.tiers.remote.as_ref().map(|r| BlockLocation::Uri {
                                uri: r.object_uri(hash),
                            }),
                            Tier::G3 => None,
                        };
                        self.counters.lock().stored_events[tier.index()] += 1;
                        self.publisher.emit(KvEvent::Stored(BlockStored {
                            block_hashes: vec![hash],
                            parent_hash,
                            tier,
                            bytes: self.geometry.block_bytes(),
                            location,
                            token_ids: None,
                            block_size: pool.tokens_per_block() as u32,
                        }));
                    }
                    PoolEvent::Removed { hash, .. } => {
                        // The bytes go only if the pool does not hold (or
                        // receive) the block again by now: the pool is the
                        // authority, the arena and the disk follow it.
                        if pool.presence(hash).is_none() {
                            if tier == Tier::G4 {
                                remote_gone.push(hash);
                            } else {
                                self.forget_bytes(tier, hash);
                            }
                        }
                        self.counters.lock().removed_events[tier.index()] += 1;
                        self.publisher.emit(KvEvent::Removed(BlockRemoved {
                            block_hashes: vec![hash],
                            tier,
                        }));
                    }
                }
            }
        }
        if !remote_gone.is_empty() {
            self.forget_remote(remote_gone);
        }
    }

    /// Takes the blocks the disk log dropped in a region reclaim out of the
    /// G3 pool (unless they were written to the disk again since): those
    /// whose re-insertion failed (`lost_by_disk`) and, should the pool
    /// hold one, those the log dropped as unwanted (`reclaimed_by_disk`,
    /// 0 while the log re-inserts all the pool holds). A block held, pinned
    /// or in flight stays until its read fails as a miss.
    fn forget_reclaimed(&self) {
        let (Some(sync), Some(disk), Some(g3)) = (
            &self.disk_sync,
            &self.tiers.disk,
            self.registry.pool(Tier::G3),
        ) else {
            return;
        };
        let dropped = sync.take_dropped();
        let forget = |keys: Vec<kvtier_core::BlockHash>| -> u64 {
            keys.into_iter()
                .filter(|k| !disk.contains(*k) && g3.remove_inactive(*k))
                .count() as u64
        };
        let reclaimed = forget(dropped.evicted);
        let lost = forget(dropped.lost);
        if reclaimed + lost == 0 {
            return;
        }
        let mut c = self.counters.lock();
        c.reclaimed_by_disk += reclaimed;
        c.lost_by_disk += lost;
        c.dropped += reclaimed + lost;
    }

    /// Deletes the objects of blocks that left G4, in the background (a
    /// remote call must not stall the caller). A block stored into G4
    /// again before its delete runs keeps its object: each key is checked
    /// against the pool right before the delete is sent.
    fn forget_remote(&self, keys: Vec<kvtier_core::BlockHash>) {
        let (Some(remote), Some(pool)) = (self.tiers.remote.clone(), self.registry.pool(Tier::G4))
        else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                blocks = keys.len(),
                "no runtime to delete G4 objects; they stay behind"
            );
            return;
        };
        let pool = pool.clone();
        let task = runtime.spawn(async move {
            let keys: Vec<_> = keys
                .into_iter()
                .filter(|k| pool.presence(*k).is_none())
                .collect();
            for (key, res) in keys.iter().zip(remote.remove_batch(&keys).await) {
                if let Err(e) = res {
                    tracing::warn!(%key, error = %e, "deleting a G4 object failed");
                }
            }
        });
        let mut background = self.background.lock();
        background.retain(|t| !t.is_finished());
        background.push(task);
    }

    fn forget_bytes(&self, tier: Tier, hash: kvtier_core::BlockHash) {
        match tier {
            Tier::G2 => {
                if let Some(m) = &self.tiers.memory {
                    m.remove(hash);
                }
            }
            Tier::G3 => {
                if let Some(d) = &self.tiers.disk {
                    d.remove(hash);
                }
            }
            // G1's device blocks belong to the pool's slots for good.
            Tier::G1 | Tier::G4 => {}
        }
    }
}
