//! Pool events to published [`KvEvent`]s, and the tiers' bytes kept in
//! step with the pools.

use crate::Tier;
use crate::events::{BlockLocation, BlockRemoved, BlockStored, KvEvent};
use crate::pool::PoolEvent;

use super::BlockManager;

impl BlockManager {
    /// Drains every pool's stored / removed events (in order per tier),
    /// removes the bytes of blocks that left G2 or G3 from the arena or the
    /// disk, and publishes the events.
    pub(crate) fn publish_events(&self) {
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
                            _ => None,
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
                            self.forget_bytes(tier, hash);
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
