//! Onboarding a request's prefix to G2, the node's fastest tier: from the
//! disk or G4 layer by layer into arena slots reserved up front
//! ([`HostLanding`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use kvtier_core::BlockHash;

use super::{BlockManager, ManagerError};
use crate::TierList;
use crate::placement::{OnboardStep, OnboardStop};
use crate::pool::{BlockPool, ImmutableBlock, PoolError, Presence};
use crate::registry::PrefixMatch;
use crate::scheduler::LoadHandle;
use crate::transfer::{
    BlockFailure, BlockMove, BlockResult, HostLanding, Span, TransferHandle, TransferRequest,
};
use kvtier_mem::Reserve;

/// One source path's share of an onboarding.
enum OnboardLoad {
    /// One batch per layer, into host landings.
    Layered(LoadHandle),
    /// Whole blocks: every layer lands at once.
    Whole(TransferHandle),
}

impl OnboardLoad {
    fn blocks(&self) -> usize {
        match self {
            Self::Layered(l) => l.keys().len(),
            Self::Whole(t) => t.keys().len(),
        }
    }

    /// Each block's result for `layer`.
    async fn wait_layer(&self, layer: u32) -> Vec<(BlockHash, BlockResult)> {
        match self {
            Self::Layered(l) => l.wait_layer(layer).await.blocks,
            Self::Whole(t) => t.wait().await.blocks,
        }
    }

    /// Each block's first failure over every layer.
    async fn wait_all(self) -> BTreeMap<BlockHash, BlockFailure> {
        let mut worst = BTreeMap::new();
        let results: Vec<(BlockHash, BlockResult)> = match &self {
            Self::Layered(l) => l
                .wait_all()
                .await
                .into_iter()
                .flat_map(|o| o.blocks)
                .collect(),
            Self::Whole(t) => t.wait().await.blocks,
        };
        for (h, r) in results {
            if let Err(e) = r {
                worst.entry(h).or_insert(e);
            }
        }
        // Dropping a layered load ends its forward pass.
        worst
    }
}

/// An onboarding in progress: the matched prefix and one load per source
/// path. Wait for layers with [`wait_layer`](Self::wait_layer),
/// then hand it to [`BlockManager::finish_onboard`].
pub struct Onboarding {
    matched: PrefixMatch,
    /// The prefix the plan covers (it may stop early when G2 is full).
    planned: Vec<BlockHash>,
    /// Handles of the blocks already in the target tier, kept until
    /// finished.
    resident: Vec<ImmutableBlock>,
    /// Blocks another request is bringing to the target tier.
    pending: Vec<BlockHash>,
    /// The blocks arriving in G2 layer by layer.
    landings: HashMap<BlockHash, Arc<HostLanding>>,
    loads: Vec<OnboardLoad>,
}

impl std::fmt::Debug for Onboarding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Onboarding")
            .field("matched", &self.matched.len())
            .field("planned", &self.planned.len())
            .field("resident", &self.resident.len())
            .field("pending", &self.pending.len())
            .field("loads", &self.loads.len())
            .finish()
    }
}

impl Onboarding {
    /// The prefix found, with the tier each block came from.
    pub fn matched(&self) -> &PrefixMatch {
        &self.matched
    }

    /// Blocks the onboarding brings (or found) in the target tier, in
    /// request order.
    pub fn planned(&self) -> &[BlockHash] {
        &self.planned
    }

    /// The arena slot block `hash` arrives in, when this onboarding reads
    /// it from the disk or G4 into G2 layer by layer: known before its first
    /// layer lands, readable layer by layer after
    /// [`wait_layer`](Self::wait_layer).
    pub fn landing_slot(&self, hash: BlockHash) -> Option<usize> {
        self.landings.get(&hash).map(|l| l.slot())
    }

    /// The checksum of layer `layer` of block `hash` arriving in G2 layer
    /// by layer, once the layer's wait returned it as delivered.
    pub fn landing_layer_sum(&self, hash: BlockHash, layer: u32) -> Option<u64> {
        self.landings.get(&hash)?.layer_sum(layer)
    }

    /// Whether some block arrives in G2 layer by layer (has a
    /// [`landing_slot`](Self::landing_slot)).
    pub fn has_landings(&self) -> bool {
        !self.landings.is_empty()
    }

    /// Blocks being read into the target tier by this onboarding.
    pub fn loading(&self) -> usize {
        self.loads.iter().map(OnboardLoad::blocks).sum()
    }

    /// Waits until layer `layer` of every block this onboarding reads is
    /// in the target tier (the time waited is the scheduler's bubble).
    /// Returns each block's result for the layer.
    pub async fn wait_layer(&self, layer: u32) -> Vec<(BlockHash, BlockResult)> {
        let mut out = Vec::new();
        for load in &self.loads {
            out.extend(load.wait_layer(layer).await);
        }
        out
    }
}

/// The outcome of an onboarding.
pub struct Onboarded {
    /// Handles in the target tier of the longest prefix now there, in
    /// request order. They keep the blocks from eviction until dropped.
    pub blocks: Vec<ImmutableBlock>,
    /// Blocks whose load failed (the source lost them or their bytes failed
    /// verification); the prefix ends before the first.
    pub failed: Vec<(BlockHash, BlockFailure)>,
}

impl std::fmt::Debug for Onboarded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Onboarded")
            .field("blocks", &self.blocks.len())
            .field("failed", &self.failed)
            .finish()
    }
}

impl BlockManager {
    /// Starts bringing the longest held prefix of `hashes` to the fastest
    /// configured tier (G2), with room made for the rest of the request's
    /// blocks too (the engine computes them next): matches the prefix
    /// (counting per-tier hits and the misses after it), records the uses
    /// for admission, protects the prefix, makes room in G2, and submits
    /// one load per source path (layer-wise into arena landings).
    pub async fn begin_onboard(&self, hashes: &[BlockHash]) -> Result<Onboarding, ManagerError> {
        let top = self.top()?;
        let target = top.tier();
        let matched = self.registry.match_prefix(hashes);
        {
            let mut c = self.counters.lock();
            c.lookups += hashes.len() as u64;
            c.misses += (hashes.len() - matched.len()) as u64;
            for b in &matched.blocks {
                c.hits[b.tier.index()] += 1;
            }
        }
        self.planner.record_uses(hashes);
        let prefix: Vec<BlockHash> = matched.blocks.iter().map(|b| b.hash).collect();
        // Protect the prefix while room is made: target blocks by handles,
        // lower copies by pins (dropped once the plan guards them).
        let in_target: Vec<BlockHash> = matched
            .blocks
            .iter()
            .filter(|b| b.tier == target)
            .map(|b| b.hash)
            .collect();
        let held = top.acquire_present(&in_target);
        let mut pinned = Vec::new();
        for b in matched.blocks.iter().filter(|b| b.tier != target) {
            if let Some(p) = self.registry.pool(b.tier)
                && p.pin(b.hash).is_ok()
            {
                pinned.push((b.tier, b.hash));
            }
        }
        let room = pinned.len() + hashes.len() - matched.len();
        let plan = self
            .take_with_room(
                target,
                room,
                || self.planner.plan_onboard(&self.registry, &prefix),
                |plan| {
                    matches!(
                        plan.stopped,
                        Some(OnboardStop::TargetFull(PoolError::Exhausted { .. }))
                    )
                },
            )
            .await;
        for (tier, hash) in pinned {
            if let Some(p) = self.registry.pool(tier) {
                // Unpinned before the copies run, so a move removes its
                // source on completion.
                let _ = p.unpin(hash);
            }
        }
        top.release_all(held);
        let mut planned = Vec::with_capacity(plan.steps.len());
        let mut resident = Vec::new();
        let mut pending = Vec::new();
        let mut landings = HashMap::new();
        let mut by_path: BTreeMap<_, Vec<BlockMove>> = BTreeMap::new();
        let mut moves = Vec::new();
        for step in plan.steps {
            planned.push(step.hash());
            match step {
                OnboardStep::Resident(b) => resident.push(b),
                OnboardStep::Pending(h) => pending.push(h),
                OnboardStep::Transfer(mv) => {
                    let block = if mv.to == TierList::TOP {
                        // Dropping the move when the arena has no slot
                        // frees its pool slot and keeps the source.
                        self.landing(mv.hash).inspect(|b| {
                            if let Some(l) = &b.landing {
                                landings.insert(mv.hash, l.clone());
                            }
                        })
                    } else {
                        Some(BlockMove::key(mv.hash))
                    };
                    if let Some(block) = block {
                        let layered = block.landing.is_some();
                        by_path.entry((mv.path, layered)).or_default().push(block);
                        moves.push(mv);
                    }
                }
            }
        }
        // The blocks arrive in the target tier fastest source first, each
        // source's in request order, whichever load finishes first: its
        // policy sees one order on every run, the one the replay models.
        moves.sort_by_key(|mv| mv.from.index());
        self.hooks.stage_ordered(moves);
        let loads = by_path
            .into_iter()
            .map(|((path, layered), blocks)| {
                if layered {
                    OnboardLoad::Layered(self.scheduler.load(path, blocks))
                } else {
                    let request = TransferRequest {
                        path,
                        span: Span::Block,
                        blocks,
                    };
                    OnboardLoad::Whole(self.scheduler.submit(request))
                }
            })
            .collect();
        Ok(Onboarding {
            matched,
            planned,
            resident,
            pending,
            landings,
            loads,
        })
    }

    /// A move of `hash` from the disk or G4 into an arena slot reserved
    /// now, so its layers can land (and be read) one by one; a whole-block
    /// move when the arena already shows the block (the transfer then
    /// finds it there and only the pool registers it; the G2 pool removes
    /// arena bytes as blocks leave it, so this is not expected); `None`
    /// when the arena has no slot.
    fn landing(&self, hash: BlockHash) -> Option<BlockMove> {
        let memory = self.tiers().arena()?;
        match memory.reserve(hash) {
            Ok(Reserve::Reserved(slot)) => Some(BlockMove::landing(HostLanding::new(
                slot,
                self.geometry.layers,
            ))),
            Ok(Reserve::AlreadyPresent) => Some(BlockMove::key(hash)),
            Ok(Reserve::Full) | Err(_) => None,
        }
    }

    /// Waits for the rest of the onboarding (every layer, and blocks other
    /// requests were bringing) and returns handles in the target tier to
    /// the prefix that arrived. A block whose source lost it or whose bytes failed
    /// verification is forgotten by that source tier and counted.
    pub async fn finish_onboard(&self, onboarding: Onboarding) -> Result<Onboarded, ManagerError> {
        let top = self.top()?;
        let Onboarding {
            planned,
            resident,
            pending,
            loads,
            ..
        } = onboarding;
        let mut failed: Vec<(BlockHash, BlockFailure)> = Vec::new();
        for load in loads {
            failed.extend(load.wait_all().await);
        }
        self.arrivals.notify_waiters();
        for hash in pending {
            self.wait_arrival(hash).await;
        }
        self.forget_lost(&failed);
        let blocks = top.acquire_prefix(&planned);
        top.release_all(resident);
        self.publish_events();
        Ok(Onboarded { blocks, failed })
    }

    /// Waits until `hash` is no longer being filled into the target tier
    /// (it arrived or its transfer failed).
    async fn wait_arrival(&self, hash: BlockHash) {
        let Ok(top) = self.top() else {
            return;
        };
        loop {
            let notified = self.arrivals.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check, so a wake between the check and
            // the await is not lost.
            notified.as_mut().enable();
            if top.presence(hash) != Some(Presence::Filling) {
                return;
            }
            notified.await;
        }
    }

    /// Drops from the lower tiers the blocks whose load found them missing
    /// or corrupt, so the next lookup does not offer them again.
    fn forget_lost(&self, failed: &[(BlockHash, BlockFailure)]) {
        if failed.is_empty() {
            return;
        }
        let mut c = self.counters.lock();
        c.onboard_failures += failed.len() as u64;
        c.verify_failures += failed
            .iter()
            .filter(|(_, e)| *e == BlockFailure::Corrupt)
            .count() as u64;
        drop(c);
        let top = self.top().ok().map(BlockPool::tier);
        for (hash, e) in failed {
            if matches!(e, BlockFailure::Miss | BlockFailure::Corrupt) {
                for pool in self.registry.pools().filter(|p| Some(p.tier()) != top) {
                    pool.remove_inactive(*hash);
                }
            }
        }
    }
}
