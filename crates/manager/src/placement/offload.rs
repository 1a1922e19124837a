//! Offload planning: watermarks, the cascade down the tiers, admission to
//! disk, and write-through copies.

use kvtier_core::BlockHash;

use super::{CascadeMode, ChainMoves, Move, Planner};
use crate::pool::{DefaultLock, OutgoingBlock, PoolError, PoolLock};
use crate::registry::Registry;
use crate::{Tier, TransferPath};

/// What one round of offload planning decided.
pub struct OffloadPlan<L: PoolLock = DefaultLock> {
    /// Copies to run; each source leaves its tier when its move completes.
    pub moves: Vec<Move<L>>,
    /// Blocks that left their tier at once because the tier below already
    /// holds them (or is receiving them): no transfer needed.
    pub already_below: Vec<(Tier, BlockHash)>,
    /// Blocks dropped from the hierarchy: nothing is configured below, or the
    /// admission filter keeps them out of G3.
    pub dropped: Vec<(Tier, BlockHash)>,
    /// Blocks that stay for now: the tier below had no room.
    pub deferred: Vec<(Tier, BlockHash)>,
}

impl<L: PoolLock> Default for OffloadPlan<L> {
    fn default() -> Self {
        Self {
            moves: Vec::new(),
            already_below: Vec::new(),
            dropped: Vec::new(),
            deferred: Vec::new(),
        }
    }
}

impl<L: PoolLock> std::fmt::Debug for OffloadPlan<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OffloadPlan")
            .field("moves", &self.moves)
            .field("already_below", &self.already_below)
            .field("dropped", &self.dropped)
            .field("deferred", &self.deferred)
            .finish()
    }
}

impl<L: PoolLock> OffloadPlan<L> {
    /// Whether the plan decided nothing.
    pub fn is_empty(&self) -> bool {
        self.moves.is_empty()
            && self.already_below.is_empty()
            && self.dropped.is_empty()
            && self.deferred.is_empty()
    }
}

impl Planner {
    /// Brings every tier above its high watermark down to its low one.
    ///
    /// Tiers are planned slowest first, so a lower tier sheds blocks before
    /// a faster one sends it more. Run it between engine iterations, so that
    /// allocations rarely have to evict.
    ///
    /// The moves come out chain-contiguous and root first (see
    /// `chain_order::ChainMoves`): a pool gives up leaves first, so a cold chain
    /// leaves leaf first, but the disk tier puts a batch on consecutive
    /// slots in order and a later prefix hit reads a run of them from the
    /// chain's first block.
    pub fn plan_offload<L: PoolLock>(&self, registry: &Registry<L>) -> OffloadPlan<L> {
        let mut plan = OffloadPlan::default();
        let mut moves = ChainMoves::with_capacity(0);
        let tiers: Vec<Tier> = registry.tiers().collect();
        for &tier in tiers.iter().rev() {
            let Some(pool) = registry.pool(tier) else {
                continue;
            };
            let config = pool.config();
            // Blocks already on their way out count as gone, so a second
            // round before the first completes does not plan them again.
            let used = pool.used_after_departures();
            if used <= config.high_blocks() {
                continue;
            }
            let excess = used - config.low_blocks();
            for leaving in pool.plan_leaving(excess) {
                self.route_down(registry, tier, leaving, &mut plan, &mut moves);
            }
        }
        plan.moves = moves.finish();
        plan
    }

    /// Drops the blocks each tier's policy reports expired (the TTL policy:
    /// idle for its `ttl_ms`), if nobody holds, pins or reads them. Copies in
    /// other tiers stay. Returns what was dropped.
    pub fn expire<L: PoolLock>(&self, registry: &Registry<L>) -> Vec<(Tier, BlockHash)> {
        let mut dropped = Vec::new();
        for pool in registry.pools() {
            for hash in pool.expired() {
                if pool.remove_inactive(hash) {
                    dropped.push((pool.tier(), hash));
                }
            }
        }
        dropped
    }

    /// Sends one leaving block to the tier below (a move added to `moves`),
    /// or lets it go (noted in `plan`).
    fn route_down<L: PoolLock>(
        &self,
        registry: &Registry<L>,
        tier: Tier,
        leaving: OutgoingBlock<L>,
        plan: &mut OffloadPlan<L>,
        moves: &mut ChainMoves<L>,
    ) {
        let hash = leaving.hash();
        let below = registry.below(tier);
        let Some((to, below_pool)) = below else {
            leaving.finish();
            plan.dropped.push((tier, hash));
            return;
        };
        if below_pool.presence(hash).is_some() {
            leaving.finish();
            plan.already_below.push((tier, hash));
            return;
        }
        if !self.admits(to, hash) {
            leaving.finish();
            plan.dropped.push((tier, hash));
            return;
        }
        let Some(path) = TransferPath::between(tier, to) else {
            plan.deferred.push((tier, hash));
            return;
        };
        let parent = leaving.pool().parent_of(hash).flatten();
        match below_pool.begin_incoming(hash, parent) {
            Ok(destination) => {
                let m = Move {
                    hash,
                    from: tier,
                    to,
                    path,
                    source: leaving,
                    destination,
                };
                moves.push(m, parent);
            }
            Err(PoolError::AlreadyResident(_) | PoolError::InFlight(_)) => {
                leaving.finish();
                plan.already_below.push((tier, hash));
            }
            Err(_) => {
                // Dropping the guard unfinished puts the block back.
                drop(leaving);
                plan.deferred.push((tier, hash));
            }
        }
    }

    /// Write-through (inclusive mode only): copies of the blocks `hashes`
    /// of `tier` to the tier below, skipping blocks already there, blocks
    /// the admission filter keeps out of G3, and blocks that are gone.
    /// Empty in exclusive mode, where a block lives in one tier. The moves
    /// come out chain-contiguous and root first, as in
    /// [`plan_offload`](Self::plan_offload).
    pub fn plan_copy_down<L: PoolLock>(
        &self,
        registry: &Registry<L>,
        tier: Tier,
        hashes: &[BlockHash],
    ) -> Vec<Move<L>> {
        let mut moves = ChainMoves::with_capacity(hashes.len());
        if self.config.mode != CascadeMode::Inclusive {
            return Vec::new();
        }
        let (Some(pool), Some((to, below_pool))) = (registry.pool(tier), registry.below(tier))
        else {
            return Vec::new();
        };
        let Some(path) = TransferPath::between(tier, to) else {
            return Vec::new();
        };
        for &hash in hashes {
            if below_pool.presence(hash).is_some() || !self.admits(to, hash) {
                continue;
            }
            let Ok(source) = pool.begin_outgoing(hash, false) else {
                continue;
            };
            let parent = pool.parent_of(hash).flatten();
            if let Ok(destination) = below_pool.begin_incoming(hash, parent) {
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
        }
        moves.finish()
    }
}
