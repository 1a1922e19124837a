//! Pool events to published [`KvEvent`]s, and the tiers' bytes kept in
//! step with the pools.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use kvtier_core::BlockHash;
use kvtier_tier::BoxFuture;

use crate::events::{BlockLocation, BlockRemoved, BlockStored, KvEvent};
use crate::pool::{BlockPool, PoolEvent, Presence};
use crate::{Tier, TierList};

use super::BlockManager;

impl BlockManager {
    /// Drains every pool's stored / removed events (in order per tier),
    /// removes the bytes of blocks that left a tier from its store, and
    /// publishes the events (built only while the publisher has a sink:
    /// otherwise nothing would read them). The top pool removes a block's
    /// arena bytes itself, as the block leaves it (`TierBytes`).
    pub(crate) fn publish_events(&self) {
        let mut events = self.applying.lock();
        self.forget_reclaimed();
        for pool in self.registry.pools() {
            events.clear();
            pool.drain_events_into(&mut events);
            if !events.is_empty() {
                self.apply_events(pool, &events);
            }
        }
        events.clear();
    }

    /// Applies one pool's drained events in one pass: one lock of the
    /// pool, the arena, the counters and the publisher for the lot.
    fn apply_events(&self, pool: &BlockPool, events: &[PoolEvent]) {
        let tier = pool.tier();
        let stored = events
            .iter()
            .filter(|e| matches!(e, PoolEvent::Stored { .. }))
            .count() as u64;
        self.count_events(tier, stored, events.len() as u64 - stored);
        let publish = !self.publisher.sinks().is_empty();
        // The top tier has no bytes to forget here; with no sink either,
        // nothing is left to do.
        if tier == TierList::TOP && !publish {
            return;
        }
        let hashes: Vec<BlockHash> = events.iter().map(PoolEvent::hash).collect();
        let facts = pool.parents_and_presence(&hashes);
        // The bytes go only if the pool does not hold (or receive) the
        // block again by now: the pool is the authority, the tiers' stores
        // follow it.
        let gone = events
            .iter()
            .zip(&facts)
            .filter(|(e, (_, presence))| {
                matches!(e, PoolEvent::Removed { .. }) && presence.is_none()
            })
            .map(|(e, _)| e.hash())
            .collect();
        self.forget_bytes(pool, gone);
        if publish {
            self.publisher
                .emit_all(self.kv_events(pool, events, &hashes, facts));
        }
    }

    /// The published form of one pool's events (`facts`: each block's
    /// parent and presence, in order).
    fn kv_events(
        &self,
        pool: &BlockPool,
        events: &[PoolEvent],
        hashes: &[BlockHash],
        facts: Vec<(Option<BlockHash>, Option<Presence>)>,
    ) -> Vec<KvEvent> {
        let tier = pool.tier();
        // Every pool has a store (`BlockManager::new` checks it).
        let Some(kind) = self.tiers().store(tier).map(|s| s.kind()) else {
            return Vec::new();
        };
        let arena_slots = match self.tiers().arena() {
            Some(m) if tier == TierList::TOP => m.slots_of(hashes),
            _ => Vec::new(),
        };
        let events = events.iter().zip(facts).enumerate();
        events
            .map(|(i, (event, (parent_hash, _)))| {
                let hash = event.hash();
                match event {
                    PoolEvent::Stored { .. } => KvEvent::Stored(BlockStored {
                        block_hashes: vec![hash],
                        parent_hash,
                        tier,
                        kind,
                        bytes: self.geometry.block_bytes(),
                        location: self.location(tier, hash, arena_slots.get(i).copied().flatten()),
                        token_ids: None,
                        block_size: pool.tokens_per_block() as u32,
                    }),
                    PoolEvent::Removed { .. } => KvEvent::Removed(BlockRemoved {
                        block_hashes: vec![hash],
                        tier,
                        kind,
                    }),
                }
            })
            .collect()
    }

    /// Counts `stored` and `removed` events of `tier` in the stats.
    fn count_events(&self, tier: Tier, stored: u64, removed: u64) {
        let mut c = self.counters.lock();
        c.stored_events[tier.index()] += stored;
        c.removed_events[tier.index()] += removed;
    }

    /// Where a block stored in `tier` is, for its event: the top tier's
    /// arena slot (looked up by the caller), or the URI the tier's store
    /// gives others to find it by (a remote store's object).
    fn location(
        &self,
        tier: Tier,
        hash: BlockHash,
        arena_slot: Option<usize>,
    ) -> Option<BlockLocation> {
        if tier == TierList::TOP {
            return arena_slot.map(|slot| BlockLocation::ArenaSlot { slot: slot as u64 });
        }
        let uri = self.tiers().store(tier)?.uri(hash)?;
        Some(BlockLocation::Uri { uri })
    }

    /// Takes the blocks a tier that makes room on its own (the disk log)
    /// dropped out of its pool (unless they were written to the tier again
    /// since): those whose re-insertion failed (`lost_by_disk`) and, should
    /// the pool hold one, those the tier dropped as unwanted
    /// (`reclaimed_by_disk`, 0 while the log re-inserts all the pool
    /// holds). A block held, pinned or in flight stays until its read fails
    /// as a miss.
    fn forget_reclaimed(&self) {
        for sync in &self.reclaim_syncs {
            let (Some(pool), Some(store)) = (
                self.registry.pool(sync.tier()),
                self.tiers().store(sync.tier()),
            ) else {
                continue;
            };
            let dropped = sync.take_dropped();
            let forget = |keys: Vec<BlockHash>| -> u64 {
                keys.into_iter()
                    .filter(|k| !store.contains(*k) && pool.remove_inactive(*k))
                    .count() as u64
            };
            let reclaimed = forget(dropped.evicted);
            let lost = forget(dropped.lost);
            if reclaimed + lost == 0 {
                continue;
            }
            let mut c = self.counters.lock();
            c.reclaimed_by_disk += reclaimed;
            c.lost_by_disk += lost;
            c.dropped += reclaimed + lost;
        }
    }

    /// Removes `gone`, blocks that left `pool`'s tier, from the tier's
    /// store. A block stored into the tier again before its removal runs
    /// keeps its bytes: each key is checked against the pool right before
    /// the removal. A store that removes at once (the disk log's index) is
    /// done before this returns; one that answers later (a remote store's
    /// deletes) must not stall the caller and finishes in the background.
    /// (The top pool forgot the arena's bytes as each block left it.)
    fn forget_bytes(&self, pool: &BlockPool, gone: Vec<BlockHash>) {
        let tier = pool.tier();
        if gone.is_empty() || tier == TierList::TOP {
            return;
        }
        let Some(store) = self.tiers().store(tier).map(Arc::clone) else {
            return;
        };
        let pool = pool.clone();
        let mut removal: BoxFuture<'static, ()> = Box::pin(async move {
            let keys: Vec<BlockHash> = gone
                .into_iter()
                .filter(|k| pool.presence(*k).is_none())
                .collect();
            store.remove(&keys).await;
        });
        if removal
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            == Poll::Ready(())
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(%tier, "no runtime to remove blocks that left the tier; they stay behind");
            return;
        };
        let mut background = self.background.lock();
        background.retain(|t| !t.is_finished());
        background.push(runtime.spawn(removal));
    }
}
