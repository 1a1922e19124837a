//! Moving blocks down: room on demand (the cascade), write-through copies,
//! and handing planned moves to the scheduler.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use kvtier_core::BlockHash;

use super::BlockManager;
use crate::placement::{CascadeMode, ChainMoves, Move, chain_ordered};
use crate::pool::BlockPool;
use crate::transfer::{BlockMove, TransferHandle, TransferRequest};
use crate::{Tier, TransferPath};

/// Attempts of [`BlockManager::take_with_room`] before it settles for what
/// it got when concurrent callers keep taking the room made for it.
const ROOM_TRIES: usize = 4;

impl BlockManager {
    /// Frees slots in `tier` until `n` are free, if it can: the policy's
    /// victims (inactive, unpinned, leaves first) go to the tier below,
    /// which makes room the same way first; the last tier, and G3's
    /// admission filter, drop them. Waits for the copies. Returns the free
    /// slots after.
    pub fn make_room(
        &self,
        tier: Tier,
        n: usize,
    ) -> Pin<Box<dyn Future<Output = usize> + Send + '_>> {
        Box::pin(async move {
            let Some(pool) = self.registry.pool(tier) else {
                return 0;
            };
            let free = free_slots(pool);
            if free >= n {
                return free;
            }
            let leaving = pool.plan_leaving(n - free);
            let below = self.registry.below(tier);
            let Some((to, below_pool)) = below else {
                self.counters.lock().dropped += leaving.len() as u64;
                for l in leaving {
                    l.finish();
                }
                self.publish_events();
                return free_slots(pool);
            };
            let mut going = Vec::with_capacity(leaving.len());
            for l in leaving {
                if below_pool.presence(l.hash()).is_some() {
                    // Its copy is already there (or on its way): leave for free.
                    l.finish();
                } else if !self.planner.admits(to, l.hash()) {
                    let mut c = self.counters.lock();
                    c.admission_refusals += 1;
                    c.dropped += 1;
                    drop(c);
                    l.finish();
                } else {
                    going.push(l);
                }
            }
            if !going.is_empty() {
                self.make_room(to, going.len()).await;
            }
            // Root first: when the tier below cannot take them all, the
            // prefixes go down and the tails are dropped (a tail is no use
            // without its prefix); the replay places victims in this order.
            let hashes: Vec<BlockHash> = going.iter().map(|l| l.hash()).collect();
            let parents: Vec<Option<BlockHash>> = hashes
                .iter()
                .map(|h| pool.parent_of(*h).flatten())
                .collect();
            let going: Vec<_> = going.into_iter().zip(parents.iter().copied()).collect();
            let going = chain_ordered(going, &hashes, &parents, |_, _| true);
            let mut moves = ChainMoves::with_capacity(going.len());
            for (source, parent) in going {
                let hash = source.hash();
                let Some(path) = TransferPath::between(tier, to) else {
                    continue;
                };
                match below_pool.begin_incoming(hash, parent) {
                    Ok(destination) => {
                        let m = Move {
                            hash,
                            from: tier,
                            to,
                            path,
                            source,
                            destination,
                        };
                        moves.push(m, parent);
                    }
                    // No room below even now (what it holds is pinned or
                    // in flight): the block is dropped, as the last tier
                    // drops its victims, so this tier gets the room it was
                    // asked for (the replay models the same). Finishing
                    // removes it only if no one holds, pins or reads it.
                    Err(_) => {
                        self.counters.lock().dropped += 1;
                        source.finish();
                    }
                }
            }
            // Victims leave leaf first; the disk wants chains root first.
            let moves = moves.finish();
            self.counters.lock().offloaded[tier.index()] += moves.len() as u64;
            for h in self.submit_moves(moves) {
                h.wait().await;
            }
            self.publish_events();
            free_slots(pool)
        })
    }

    /// Makes room for `n` blocks in `tier` (when the manager makes room on
    /// demand) and runs `take`, which claims slots. A slot freed for the
    /// caller may be claimed by a concurrent one first (the pools do not
    /// evict by allocation, see
    /// [`PoolConfig::evict_on_allocate`](crate::pool::PoolConfig::evict_on_allocate)):
    /// while `short` says so of what `take` got, that is dropped (its
    /// guards undo it) and both run again, up to [`ROOM_TRIES`] times.
    pub(crate) async fn take_with_room<T>(
        &self,
        tier: Tier,
        n: usize,
        mut take: impl FnMut() -> T,
        short: impl Fn(&T) -> bool,
    ) -> T {
        let mut tries = 1;
        loop {
            if self.config.offload_on_demand && n > 0 {
                self.make_room(tier, n).await;
            }
            let got = take();
            if !self.config.offload_on_demand || tries >= ROOM_TRIES || !short(&got) {
                return got;
            }
            drop(got);
            tries += 1;
        }
    }

    /// Inclusive mode: copies `hashes` of `tier` to the tier below (making
    /// room there first) and waits for the copies. Nothing in exclusive
    /// mode.
    pub(crate) async fn copy_down(&self, tier: Tier, hashes: &[BlockHash]) {
        if self.planner.config().mode != CascadeMode::Inclusive || hashes.is_empty() {
            return;
        }
        let Some((to, _)) = self.registry.below(tier) else {
            return;
        };
        if self.config.offload_on_demand {
            self.make_room(to, hashes.len()).await;
        }
        let refused = hashes
            .iter()
            .filter(|h| !self.planner.admits(to, **h))
            .count();
        self.counters.lock().admission_refusals += refused as u64;
        let moves = self.planner.plan_copy_down(&self.registry, tier, hashes);
        for h in self.submit_moves(moves) {
            h.wait().await;
        }
        self.publish_events();
    }

    /// Stages `moves` in the hooks and submits one whole-block transfer per
    /// path through the scheduler (reads first, writes in slack).
    pub(crate) fn submit_moves(&self, moves: Vec<Move>) -> Vec<TransferHandle> {
        let mut by_path: BTreeMap<TransferPath, Vec<BlockMove>> = BTreeMap::new();
        for mv in moves {
            by_path
                .entry(mv.path)
                .or_default()
                .push(BlockMove::key(mv.hash));
            self.hooks.stage(mv);
        }
        by_path
            .into_iter()
            .map(|(path, blocks)| self.scheduler.submit(TransferRequest::blocks(path, blocks)))
            .collect()
    }
}

/// Free slots of `pool` without scanning them.
pub(crate) fn free_slots(pool: &BlockPool) -> usize {
    pool.config().capacity_blocks.saturating_sub(pool.used())
}
