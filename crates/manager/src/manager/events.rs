//! Pool events to published [`KvEvent`]s, and the tiers' bytes kept in
//! step with the pools.

use kvtier_core::BlockHash;

use crate::Tier;
use crate::events::{BlockLocation, BlockRemoved, BlockStored, KvEvent};
use crate::pool::{BlockPool, PoolEvent};

use super::BlockManager;

impl BlockManager {
    /// Drains every pool's stored / removed events (in order per tier),
    /// removes the bytes of blocks that left G3 or G4 from the disk or the
    /// remote store, and publishes the events. (G2's pool removes a
    /// block's arena bytes itself, as the block leaves it: `TierBytes`.)
    pub(crate) fn publish_events(&self) {
        let mut events = self.applying.lock();
        self.forget_reclaimed();
        let mut remote_gone = Vec::new();
        for pool in self.registry.pools() {
            events.clear();
            pool.drain_events_into(&mut events);
            if !events.is_empty() {
                self.apply_events(pool, &events, &mut remote_gone);
            }
        }
        events.clear();
        if !remote_gone.is_empty() {
            self.forget_remote(remote_gone);
        }
    }

    /// Applies one pool's drained events in one pass: one lock of the
    /// pool, the arena, the counters and the publisher for the lot.
    /// Blocks of G4 whose bytes go are added to `remote_gone`.
    fn apply_events(
        &self,
        pool: &BlockPool,
        events: &[PoolEvent],
        remote_gone: &mut Vec<BlockHash>,
    ) {
        let tier = pool.tier();
        let hashes: Vec<BlockHash> = events.iter().map(PoolEvent::hash).collect();
        let facts = pool.parents_and_presence(&hashes);
        let arena_slots = match (&self.tiers.memory, tier) {
            (Some(m), Tier::G2) => m.slots_of(&hashes),
            _ => Vec::new(),
        };
        let mut gone = Vec::new();
        let mut published = Vec::with_capacity(events.len());
        let (mut stored, mut removed) = (0, 0);
        for (i, (event, (parent_hash, presence))) in events.iter().zip(facts).enumerate() {
            let hash = event.hash();
            published.push(match event {
                PoolEvent::Stored { .. } => {
                    stored += 1;
                    let arena_slot = arena_slots.get(i).copied().flatten();
                    KvEvent::Stored(BlockStored {
                        block_hashes: vec![hash],
                        parent_hash,
                        tier,
                        bytes: self.geometry.block_bytes(),
                        location: self.location(pool, hash, arena_slot),
                        token_ids: None,
                        block_size: pool.tokens_per_block() as u32,
                    })
                }
                PoolEvent::Removed { .. } => {
                    removed += 1;
                    // The bytes go only if the pool does not hold (or
                    // receive) the block again by now: the pool is the
                    // authority, the arena and the disk follow it.
                    if presence.is_none() {
                        gone.push(hash);
                    }
                    KvEvent::Removed(BlockRemoved {
                        block_hashes: vec![hash],
                        tier,
                    })
                }
            });
        }
        self.forget_bytes(tier, gone, remote_gone);
        {
            let mut c = self.counters.lock();
            c.stored_events[tier.index()] += stored;
            c.removed_events[tier.index()] += removed;
        }
        self.publisher.emit_all(published);
    }

    /// Where a block stored in `pool`'s tier is, for its event (G2: its
    /// arena slot, looked up by the caller).
    fn location(
        &self,
        pool: &BlockPool,
        hash: BlockHash,
        arena_slot: Option<usize>,
    ) -> Option<BlockLocation> {
        match pool.tier() {
            Tier::G2 => arena_slot.map(|slot| BlockLocation::ArenaSlot { slot: slot as u64 }),
            Tier::G4 => self.tiers.remote.as_ref().map(|r| BlockLocation::Uri {
                uri: r.object_uri(hash),
            }),
            _ => None,
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
        let forget = |keys: Vec<BlockHash>| -> u64 {
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
    fn forget_remote(&self, keys: Vec<BlockHash>) {
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

    /// Drops the bytes of `gone`, blocks that left `tier` (G4's are
    /// deleted later, in the background: added to `remote_gone`).
    fn forget_bytes(&self, tier: Tier, gone: Vec<BlockHash>, remote_gone: &mut Vec<BlockHash>) {
        match tier {
            Tier::G3 => {
                if let Some(d) = &self.tiers.disk {
                    for hash in gone {
                        d.remove(hash);
                    }
                }
            }
            Tier::G4 => remote_gone.extend(gone),
            // The node has no G1 pool; G2's pool forgot the arena bytes
            // when the block left it.
            _ => {}
        }
    }
}
