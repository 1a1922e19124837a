//! The manager's counters and their snapshot.

use std::time::Duration;

use serde::Serialize;

use crate::Tier;
use crate::pool::PoolStats;
use crate::scheduler::SchedulerStats;
use crate::transfer::PathStats;

/// Counters the manager keeps itself (the pools, engine and scheduler keep
/// theirs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    /// Blocks of looked-up prefixes served from each tier.
    pub hits: [u64; 4],
    /// Blocks asked for that no tier held (after the matched prefix).
    pub misses: u64,
    /// Blocks asked for in all.
    pub lookups: u64,
    /// Blocks the admission filter kept out of G3.
    pub admission_refusals: u64,
    /// Blocks that left the hierarchy from its last tier (or refused).
    pub dropped: u64,
    /// Of those, G3 blocks the disk log reclaimed under the pool.
    pub reclaimed_by_disk: u64,
    /// Of those, G3 blocks the pool held whose re-insertion failed.
    pub lost_by_disk: u64,
    /// Blocks moved down a tier on demand or by watermark.
    pub offloaded: [u64; 4],
    /// Onboarded blocks that failed to arrive (source lost or corrupt).
    pub onboard_failures: u64,
    /// Of those, blocks whose bytes failed verification.
    pub verify_failures: u64,
    /// Stored events published, per tier.
    pub stored_events: [u64; 4],
    /// Removed events published, per tier.
    pub removed_events: [u64; 4],
}

/// One tier's counters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TierStats {
    /// The tier.
    pub tier: Tier,
    /// Blocks of matched prefixes this tier served (the fastest holder).
    pub hits: u64,
    /// `hits` over all blocks looked up.
    pub hit_rate: f64,
    /// Blocks offloaded from this tier to the one below.
    pub offloaded: u64,
    /// Stored events published for the tier.
    pub stored_events: u64,
    /// Removed events published for the tier.
    pub removed_events: u64,
    /// The pool's own counters (capacity, occupancy, evictions, ...).
    pub pool: PoolStats,
}

/// A snapshot of everything the manager counts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ManagerStats {
    /// Per configured tier, fastest first.
    pub tiers: Vec<TierStats>,
    /// Blocks looked up in all.
    pub lookups: u64,
    /// Blocks looked up that no tier held (the prefix had ended).
    pub misses: u64,
    /// Blocks the admission filter kept out of G3.
    pub admission_refusals: u64,
    /// Blocks that left the hierarchy.
    pub dropped: u64,
    /// Of those, G3 blocks the pool held that the disk log dropped by its
    /// own choice when it reclaimed their region. Always 0: the log
    /// re-inserts every block the pool holds (docs/disk-format.md, I22);
    /// kept as the proof of that rule.
    pub reclaimed_by_disk: u64,
    /// Of those, G3 blocks the pool held that the disk log could not
    /// re-insert when it reclaimed their region (reading back failed, the
    /// copy failed verification, or the write failed): misses, not
    /// evictions.
    pub lost_by_disk: u64,
    /// Onboarded blocks that did not arrive.
    pub onboard_failures: u64,
    /// Blocks whose bytes failed verification on the way.
    pub verify_failures: u64,
    /// Per transfer path that carried anything: bytes, transfers, latency.
    pub paths: Vec<PathStats>,
    /// The scheduler's counters.
    pub scheduler: SchedulerStats,
    /// Time the consumer waited for layers (the GPU bubble).
    pub bubble: Duration,
}

impl ManagerStats {
    /// The counters of `tier`, if configured.
    pub fn tier(&self, tier: Tier) -> Option<&TierStats> {
        self.tiers.iter().find(|t| t.tier == tier)
    }

    /// Hits of all tiers together.
    pub fn hits(&self) -> u64 {
        self.tiers.iter().map(|t| t.hits).sum()
    }
}
