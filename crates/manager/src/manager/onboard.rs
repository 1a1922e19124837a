//! Onboarding a request's prefix to G1, layer by layer.

use std::collections::BTreeMap;

use kvtier_core::BlockHash;

use super::{BlockManager, ManagerError};
use crate::Tier;
use crate::placement::OnboardStep;
use crate::pool::{ImmutableBlock, Presence};
use crate::registry::PrefixMatch;
use crate::scheduler::LoadHandle;
use crate::transfer::{BlockFailure, BlockMove, BlockResult};

/// An onboarding in progress: the matched prefix and one layer-wise load
/// per source path. Wait for layers with [`wait_layer`](Self::wait_layer),
/// then hand it to [`BlockManager::finish_onboard`].
pub struct Onboarding {
    matched: PrefixMatch,
    /// The prefix the plan covers (it may stop early when G1 is full).
    planned: Vec<BlockHash>,
    /// Handles of the blocks already in G1, kept until finished.
    resident: Vec<ImmutableBlock>,
    /// Blocks another request is bringing to G1.
    pending: Vec<BlockHash>,
    loads: Vec<LoadHandle>,
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

    /// Blocks the onboarding brings (or found) in G1, in request order.
    pub fn planned(&self) -> &[BlockHash] {
        &self.planned
    }

    /// Blocks being read onto the device by this onboarding.
    pub fn loading(&self) -> usize {
        self.loads.iter().map(|l| l.keys().len()).sum()
    }

    /// Waits until layer `layer` of every block this onboarding reads is
    /// on the device (the time waited is the scheduler's bubble). Returns
    /// each block's result for the layer.
    pub async fn wait_layer(&self, layer: u32) -> Vec<(BlockHash, BlockResult)> {
        let mut out = Vec::new();
        for load in &self.loads {
            out.extend(load.wait_layer(layer).await.blocks);
        }
        out
    }
}

/// The outcome of an onboarding.
pub struct Onboarded {
    /// G1 handles of the longest prefix now on the device, in request
    /// order. They keep the blocks from eviction until dropped.
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
    /// Starts bringing the longest held prefix of `hashes` to G1, with room
    /// made for the rest of the request's blocks too (the engine computes
    /// them next): matches
    /// the prefix (counting per-tier hits and the misses after it), records
    /// the uses for admission, protects the prefix, makes room in G1, and
    /// submits one layer-wise load per source path.
    pub async fn begin_onboard(&self, hashes: &[BlockHash]) -> Result<Onboarding, ManagerError> {
        let g1 = self.g1()?;
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
        // Protect the prefix while room is made: G1 blocks by handles,
        // lower copies by pins (dropped once the plan guards them).
        let mut held = Vec::new();
        let mut pinned = Vec::new();
        for b in &matched.blocks {
            if b.tier == Tier::G1 {
                if let Some(h) = g1.acquire(b.hash) {
                    held.push(h);
                }
            } else if let Some(p) = self.registry.pool(b.tier)
                && p.pin(b.hash).is_ok()
            {
                pinned.push((b.tier, b.hash));
            }
        }
        if self.config.offload_on_demand {
            self.make_room(Tier::G1, pinned.len() + hashes.len() - matched.len())
                .await;
        }
        let plan = self.planner.plan_onboard(&self.registry, &prefix);
        for (tier, hash) in pinned {
            if let Some(p) = self.registry.pool(tier) {
                // Unpinned before the copies run, so a move removes its
                // source on completion.
                let _ = p.unpin(hash);
            }
        }
        drop(held);
        let mut planned = Vec::with_capacity(plan.steps.len());
        let mut resident = Vec::new();
        let mut pending = Vec::new();
        let mut by_path: BTreeMap<_, Vec<BlockMove>> = BTreeMap::new();
        for step in plan.steps {
            planned.push(step.hash());
            match step {
                OnboardStep::Resident(b) => resident.push(b),
                OnboardStep::Pending(h) => pending.push(h),
                OnboardStep::Transfer(mv) => {
                    if let Some(block) = self.block_move(&mv) {
                        by_path.entry(mv.path).or_default().push(block);
                        self.hooks.stage(mv);
                    }
                }
            }
        }
        let loads = by_path
            .into_iter()
            .map(|(path, blocks)| self.scheduler.load(path, blocks))
            .collect();
        Ok(Onboarding {
            matched,
            planned,
            resident,
            pending,
            loads,
        })
    }

    /// Waits for the rest of the onboarding (every layer, and blocks other
    /// requests were bringing) and returns G1 handles to the prefix that
    /// arrived. A block whose source lost it or whose bytes failed
    /// verification is forgotten by that source tier and counted.
    pub async fn finish_onboard(&self, onboarding: Onboarding) -> Result<Onboarded, ManagerError> {
        let g1 = self.g1()?;
        let Onboarding {
            planned,
            resident,
            pending,
            loads,
            ..
        } = onboarding;
        let mut failed: Vec<(BlockHash, BlockFailure)> = Vec::new();
        for load in loads {
            let layers = load.wait_all().await;
            let mut worst: BTreeMap<BlockHash, BlockFailure> = BTreeMap::new();
            for layer in layers {
                for (h, r) in layer.blocks {
                    if let Err(e) = r {
                        worst.entry(h).or_insert(e);
                    }
                }
            }
            failed.extend(worst);
            // Dropping the load ends its forward pass.
        }
        self.arrivals.notify_waiters();
        for hash in pending {
            self.wait_arrival(hash).await;
        }
        self.forget_lost(&failed);
        let mut blocks = Vec::with_capacity(planned.len());
        for hash in planned {
            match g1.acquire(hash) {
                Some(b) => blocks.push(b),
                None => break,
            }
        }
        drop(resident);
        self.publish_events();
        Ok(Onboarded { blocks, failed })
    }

    /// Waits until `hash` is no longer being filled into G1 (it arrived or
    /// its transfer failed).
    async fn wait_arrival(&self, hash: BlockHash) {
        let Some(g1) = self.registry.pool(Tier::G1) else {
            return;
        };
        loop {
            let notified = self.arrivals.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check, so a wake between the check and
            // the await is not lost.
            notified.as_mut().enable();
            if g1.presence(hash) != Some(Presence::Filling) {
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
        for (hash, e) in failed {
            if matches!(e, BlockFailure::Miss | BlockFailure::Corrupt) {
                for pool in self.registry.pools().filter(|p| p.tier() != Tier::G1) {
                    pool.remove_inactive(*hash);
                }
            }
        }
    }
}
