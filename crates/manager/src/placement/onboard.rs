//! Onboarding planning: bring a request's prefix to the fastest configured
//! tier (G2, the node's top tier).

use kvtier_core::BlockHash;

use super::{CascadeMode, Move, Planner};
use crate::TransferPath;
use crate::pool::{DefaultLock, ImmutableBlock, PoolError, PoolLock, Presence};
use crate::registry::Registry;

/// What onboarding does for one block of the prefix.
pub enum OnboardStep<L: PoolLock = DefaultLock> {
    /// Already in the target tier; the handle keeps it there.
    Resident(ImmutableBlock<L>),
    /// Already on its way to the target tier (another request's transfer);
    /// wait for it instead of copying it twice.
    Pending(BlockHash),
    /// Copy it to the target tier.
    Transfer(Move<L>),
}

impl<L: PoolLock> OnboardStep<L> {
    /// The block the step is about.
    pub fn hash(&self) -> BlockHash {
        match self {
            OnboardStep::Resident(b) => b.hash(),
            OnboardStep::Pending(h) => *h,
            OnboardStep::Transfer(m) => m.hash,
        }
    }
}

impl<L: PoolLock> std::fmt::Debug for OnboardStep<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OnboardStep::Resident(b) => f.debug_tuple("Resident").field(b).finish(),
            OnboardStep::Pending(h) => f.debug_tuple("Pending").field(h).finish(),
            OnboardStep::Transfer(m) => f.debug_tuple("Transfer").field(m).finish(),
        }
    }
}

/// Why an onboarding plan covers fewer blocks than asked.
#[derive(Debug, Clone, PartialEq)]
pub enum OnboardStop {
    /// No tier holds this block (the prefix ends here).
    Missing(BlockHash),
    /// The target tier has no free or evictable slot left.
    TargetFull(PoolError),
    /// No tier is configured.
    NoTier,
}

/// The plan to bring a prefix to the target tier, one step per block in
/// request order.
pub struct OnboardPlan<L: PoolLock = DefaultLock> {
    /// The steps, in request order.
    pub steps: Vec<OnboardStep<L>>,
    /// Why the plan stopped early, if it did.
    pub stopped: Option<OnboardStop>,
}

impl<L: PoolLock> std::fmt::Debug for OnboardPlan<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnboardPlan")
            .field("steps", &self.steps)
            .field("stopped", &self.stopped)
            .finish()
    }
}

impl<L: PoolLock> OnboardPlan<L> {
    /// The transfers of the plan.
    pub fn transfers(&self) -> impl Iterator<Item = &Move<L>> {
        self.steps.iter().filter_map(|s| match s {
            OnboardStep::Transfer(m) => Some(m),
            _ => None,
        })
    }
}

impl Planner {
    /// Plans bringing the longest available prefix of `hashes` to the
    /// fastest configured tier (the target, G2): blocks in the
    /// target are acquired, blocks already in flight to it are shared, and
    /// each other block is copied from the fastest tier holding it (moved,
    /// in exclusive mode). Stops at the first block no tier holds or when
    /// the target is full.
    pub fn plan_onboard<L: PoolLock>(
        &self,
        registry: &Registry<L>,
        hashes: &[BlockHash],
    ) -> OnboardPlan<L> {
        let mut plan = OnboardPlan {
            steps: Vec::with_capacity(hashes.len()),
            stopped: None,
        };
        let Some(top) = registry.pools().next() else {
            plan.stopped = Some(OnboardStop::NoTier);
            return plan;
        };
        let target = top.tier();
        let moves_source = self.config.mode == CascadeMode::Exclusive;
        // The leading run already in the target tier, under one lock.
        let resident = top.acquire_prefix(hashes);
        let rest = &hashes[resident.len()..];
        plan.steps
            .extend(resident.into_iter().map(OnboardStep::Resident));
        for &hash in rest {
            if let Some(block) = top.acquire(hash) {
                plan.steps.push(OnboardStep::Resident(block));
                continue;
            }
            if top.presence(hash) == Some(Presence::Filling) {
                plan.steps.push(OnboardStep::Pending(hash));
                continue;
            }
            // The fastest lower tier that still holds it once marked.
            let source = registry
                .pools()
                .filter(|p| p.tier() != target)
                .find_map(|p| p.begin_outgoing(hash, moves_source).ok());
            let Some(source) = source else {
                plan.stopped = Some(OnboardStop::Missing(hash));
                break;
            };
            let from = source.pool().tier();
            let Some(path) = TransferPath::between(from, target) else {
                plan.stopped = Some(OnboardStop::Missing(hash));
                break;
            };
            let parent = source.pool().parent_of(hash).flatten();
            match top.begin_incoming(hash, parent) {
                Ok(destination) => plan.steps.push(OnboardStep::Transfer(Move {
                    hash,
                    from,
                    to: target,
                    path,
                    source,
                    destination,
                })),
                Err(PoolError::InFlight(_)) => plan.steps.push(OnboardStep::Pending(hash)),
                Err(PoolError::AlreadyResident(_)) => match top.acquire(hash) {
                    Some(block) => plan.steps.push(OnboardStep::Resident(block)),
                    None => plan.steps.push(OnboardStep::Pending(hash)),
                },
                Err(e) => {
                    plan.stopped = Some(OnboardStop::TargetFull(e));
                    break;
                }
            }
        }
        plan
    }
}
