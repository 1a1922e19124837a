//! What a [`BlockManager`](super::BlockManager) is built from, and why
//! building or running it can fail.

use std::sync::Arc;

use kvtier_core::Geometry;
use kvtier_disk::DiskTier;
use kvtier_mem::MemoryTier;
use kvtier_remote::RemoteTier;

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
    /// rules (cascade mode, admission). G2, the fastest, is the tier
    /// blocks are onboarded to.
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

/// The storage behind the tiers: G2's shared-memory arena, G3's disk tier
/// and G4's remote tier. A pool configured without its
/// storage is an error. Every tier stores blocks of `geometry`.
#[derive(Clone)]
pub struct ManagerTiers {
    /// The block geometry shared by every tier.
    pub geometry: Geometry,
    /// G2, the top tier (engines keep their own device cache in front of
    /// it).
    pub memory: Option<MemoryTier>,
    /// G3.
    pub disk: Option<Arc<DiskTier>>,
    /// G4: an object store or shared file system. Its pool owns every
    /// block object under the tier's prefix (give each node its own).
    pub remote: Option<Arc<RemoteTier>>,
}

impl std::fmt::Debug for ManagerTiers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagerTiers")
            .field("geometry", &self.geometry)
            .field("memory", &self.memory.is_some())
            .field("disk", &self.disk.is_some())
            .field("remote", &self.remote.as_ref().map(|r| r.url().to_owned()))
            .finish()
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
    /// The memory tier (G2's arena) refused.
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
    /// The G3 pool may hold more blocks than the disk log can keep while it
    /// reclaims regions (`DiskTier::live_capacity_blocks`).
    #[error(
        "the G3 pool holds {pool} blocks but its disk log can keep at most {limit} \
         (every slot but the regions open for writing and one more): \
         grow the disk or shrink the pool"
    )]
    G3PoolTooLarge {
        /// The G3 pool's capacity, blocks.
        pool: usize,
        /// The most the disk log can keep, blocks.
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
