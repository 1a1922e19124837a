//! Placement: when blocks move between tiers, and which.
//!
//! The [`Planner`] decides and the transfer engine executes. Its plans are
//! lists of [`Move`]s, each holding the guards that keep the move safe: the
//! source [`OutgoingBlock`] (not evictable while copied) and the destination
//! [`IncomingBlock`] (not readable until filled). The engine copies the
//! bytes, then calls [`Move::complete`], or drops the move on failure, which
//! frees the destination slot and leaves the source where it was.
//!
//! - Offload ([`Planner::plan_offload`], between engine iterations): every
//!   tier above its high watermark gives up blocks, in its policy's order
//!   and leaves first, until it is down to its low watermark. Each goes to
//!   the tier directly below (G2 -> G3, -> G4 when configured); a
//!   block whose copy is already there (inclusive mode) leaves for free; a
//!   block the admission filter keeps out of G3, or with no tier below, is
//!   dropped.
//! - Write-through ([`Planner::plan_copy_down`], inclusive mode): copies of
//!   newly registered blocks to the tier below.
//! - Onboarding ([`Planner::plan_onboard`]): the prefix of a request brought
//!   to G2 from the fastest tier holding each block, deduplicated against
//!   blocks already in G2 or already on their way there.
//! - Admission ([`Planner::record_uses`]): counts uses for the filter.
//! - Expiry ([`Planner::expire`]): drops blocks the TTL policy reports idle.
//!
//! [`MoveHooks`] plugs planned moves into the transfer engine's in-flight
//! hooks, settling each move when the engine reports its block.

mod chain_order;
pub mod config;
pub mod engine_hooks;
pub mod offload;
pub mod onboard;

use std::fmt;

use kvtier_core::BlockHash;
use parking_lot::Mutex;

pub(crate) use chain_order::{ChainMoves, chain_ordered};
pub use config::{CascadeMode, HierarchyConfig, PlacementConfig};
pub use engine_hooks::MoveHooks;
pub use offload::OffloadPlan;
pub use onboard::{OnboardPlan, OnboardStep, OnboardStop};

use crate::admission::AdmissionFilter;
use crate::pool::{DefaultLock, ImmutableBlock, IncomingBlock, OutgoingBlock, PoolLock};
use crate::{Tier, TransferPath};

/// One block to copy from one tier to another, with its guards.
pub struct Move<L: PoolLock = DefaultLock> {
    /// The block.
    pub hash: BlockHash,
    /// Source tier.
    pub from: Tier,
    /// Destination tier.
    pub to: Tier,
    /// The transfer path (the queue of the transfer engine).
    pub path: TransferPath,
    /// The source, protected from eviction; removed on completion if the
    /// move is not a copy.
    pub source: OutgoingBlock<L>,
    /// The destination slot, unreadable until completion.
    pub destination: IncomingBlock<L>,
}

impl<L: PoolLock> Move<L> {
    /// Whether the source leaves its tier on completion.
    pub fn removes_source(&self) -> bool {
        self.source.removes_source()
    }

    /// The bytes arrived: the destination becomes readable, then the source
    /// is released (and removed, for a move). Returns a handle to the
    /// destination block.
    pub fn complete(self) -> ImmutableBlock<L> {
        // Destination first: the block is never absent from both tiers.
        let block = self.destination.finish();
        self.source.finish();
        block
    }
}

impl<L: PoolLock> fmt::Debug for Move<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Move")
            .field("hash", &self.hash)
            .field("from", &self.from)
            .field("to", &self.to)
            .field("path", &self.path)
            .field("source_slot", &self.source.slot())
            .field("destination_slot", &self.destination.slot())
            .field("removes_source", &self.removes_source())
            .finish()
    }
}

/// Plans offloads, write-through copies and onboards over a registry.
#[derive(Debug)]
pub struct Planner {
    config: PlacementConfig,
    admission: Mutex<AdmissionFilter>,
}

impl Planner {
    /// A planner with `config`.
    pub fn new(config: PlacementConfig) -> Self {
        let admission = Mutex::new(AdmissionFilter::new(&config.admission));
        Self { config, admission }
    }

    /// The placement rules.
    pub fn config(&self) -> &PlacementConfig {
        &self.config
    }

    /// Counts one use of each block of a request, for admission.
    pub fn record_uses(&self, hashes: &[BlockHash]) {
        let mut a = self.admission.lock();
        for h in hashes {
            a.record(*h);
        }
    }

    /// Whether `hash` may be written to `tier` (the filter guards the
    /// tier right below the top one only: G3, the disk log by default).
    pub fn admits(&self, tier: Tier, hash: BlockHash) -> bool {
        Some(tier) != crate::TierList::TOP.below() || self.admission.lock().admits(hash)
    }
}
