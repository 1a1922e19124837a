//! What a [`BlockManager`](super::BlockManager) is built from, and why
//! building or running it can fail.

use crate::Tier;
use crate::block::BlockError;
use crate::events::{EventError, PublisherConfig};
use crate::placement::HierarchyConfig;
use crate::pool::PoolError;
use crate::scheduler::{SchedulerConfig, SchedulerError};
use crate::transfer::TransferError;

/// How the manager places, moves and announces blocks.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// The tiers' pools (capacity, watermarks, policy) and the placement
    /// rules (cascade mode, admission). The top tier (G2, the arena) is
    /// the tier blocks are onboarded to.
    pub hierarchy: HierarchyConfig,
    /// Make room on demand: when a tier has too few free slots for an
    /// onboard or a store, its policy's victims cascade to the tier below
    /// (and so on down) before the slots are taken, instead of being
    /// dropped by allocation. Default: true. With it off, only
    /// [`step`](super::BlockManager::step) moves blocks down.
    pub offload_on_demand: bool,
    /// Whether [`step`](super::BlockManager::step) waits for the offloads
    /// it starts (deterministic; benches and tests) rather than letting
    /// them run in the background. Default: false.
    pub step_waits: bool,
    /// Whether [`commit_host`](super::BlockManager::commit_host) hashes
    /// each client-filled slot against its sums before publishing it
    /// (one pass over the block in the manager's process). Off, only the
    /// sums' consistency is checked and readers, which verify every copy,
    /// are the only check. Default: true.
    pub verify_host_commits: bool,
    /// The I/O scheduler in front of the transfer engine.
    pub scheduler: SchedulerConfig,
    /// Batching of the events published to the sinks.
    pub events: PublisherConfig,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            hierarchy: HierarchyConfig::default(),
            offload_on_demand: true,
            step_waits: false,
            verify_host_commits: true,
            scheduler: SchedulerConfig::default(),
            events: PublisherConfig::default(),
        }
    }
}

/// Why the manager could not be built or could not carry out an operation.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// The configuration cannot work with the tiers given.
    #[error("invalid manager configuration: {0}")]
    Config(String),
    /// A pool refused (exhausted, bad configuration).
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// A block lifecycle transition was refused.
    #[error(transparent)]
    Block(#[from] BlockError),
    /// The memory tier (the top tier's arena) refused.
    #[error(transparent)]
    Memory(#[from] kvtier_arena::MemError),
    /// The transfer engine could not be built.
    #[error(transparent)]
    Transfer(#[from] TransferError),
    /// The scheduler could not be built.
    #[error(transparent)]
    Scheduler(#[from] SchedulerError),
    /// The event publisher could not be built.
    #[error(transparent)]
    Events(#[from] EventError),
    /// A pool may hold more blocks than its tier can keep while it makes
    /// room on its own (the disk log reclaiming regions:
    /// `Reclaiming::live_capacity_blocks`).
    #[error(
        "the {tier} pool holds {pool} blocks but its tier can keep at most {limit} \
         while it reclaims (a disk log: every slot but the regions open for \
         writing and one more): grow the tier or shrink the pool"
    )]
    PoolTooLarge {
        /// The tier.
        tier: Tier,
        /// The pool's capacity, blocks.
        pool: usize,
        /// The most the tier can keep, blocks.
        limit: usize,
    },
    /// A tier has no room for the blocks asked, even after offloading.
    #[error("tier {tier}: no room for {wanted} blocks")]
    NoRoom {
        /// The tier.
        tier: Tier,
        /// Blocks wanted.
        wanted: usize,
    },
}
