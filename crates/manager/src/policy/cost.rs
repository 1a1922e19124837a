//! Cost-aware eviction: keep the blocks whose loss would cost the most.
//!
//! A block's value in a tier is its expected reuse rate times what a reuse
//! would cost if the block were gone from the tier:
//!
//! ```text
//! reuse_rate = uses / (1 + idle_ms / half_life_ms)
//! miss_cost  = min(recompute_us(depth), restore_us)
//! recompute_us(depth) = recompute_us_per_block * (1 + depth * attention_growth)
//! value      = reuse_rate * miss_cost
//! ```
//!
//! Recomputing a block costs more the deeper it sits in its sequence
//! (attention over a longer prefix), and a block that can be restored from
//! the tier below costs at most the restore transfer. The eligible block of
//! lowest value goes first (ties: the least recently used). A victim scan
//! walks every tracked block, `O(n)`: the values change with time, so no
//! order can be kept between scans.

use std::collections::HashMap;

use kvtier_core::BlockHash;
use serde::{Deserialize, Serialize};

use super::{EvictionPolicy, InsertInfo, PolicyKind};

/// The costs the cost-aware policy weighs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CostModel {
    /// Prefill time of one block at the start of a sequence, microseconds.
    /// Default: 2000.
    pub recompute_us_per_block: f64,
    /// Extra recompute cost per block of prefix before it, as a fraction of
    /// `recompute_us_per_block`. Default: 0.01.
    pub attention_growth: f64,
    /// Time to bring the block back from the tier below, microseconds
    /// (`f64::INFINITY` when nothing is below). Default: 200 (a PCIe copy).
    pub restore_us: f64,
    /// Idle time that halves a block's reuse rate, milliseconds.
    /// Default: 60000.
    pub half_life_ms: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        Self {
            recompute_us_per_block: 2000.0,
            attention_growth: 0.01,
            restore_us: 200.0,
            half_life_ms: 60_000.0,
        }
    }
}

impl CostModel {
    /// What losing a block at `depth` costs on its next use, microseconds.
    pub fn miss_cost_us(&self, depth: u32) -> f64 {
        let recompute =
            self.recompute_us_per_block * (1.0 + f64::from(depth) * self.attention_growth);
        recompute.min(self.restore_us)
    }

    /// The value of keeping a block used `uses` times, idle for `idle_ms`.
    pub fn value(&self, uses: u64, idle_ms: u64, depth: u32) -> f64 {
        let half_life = self.half_life_ms.max(1.0);
        let rate = uses as f64 / (1.0 + idle_ms as f64 / half_life);
        rate * self.miss_cost_us(depth)
    }
}

#[derive(Debug, Clone, Copy)]
struct Stats {
    uses: u64,
    last_use: u64,
    seq: u64,
    depth: u32,
}

/// The cost-aware policy.
#[derive(Debug)]
pub struct CostAware {
    model: CostModel,
    next_seq: u64,
    stats: HashMap<BlockHash, Stats>,
}

impl CostAware {
    /// A policy weighing `model`.
    pub fn new(model: CostModel) -> Self {
        Self {
            model,
            next_seq: 0,
            stats: HashMap::new(),
        }
    }

    fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }
}

impl EvictionPolicy for CostAware {
    fn kind(&self) -> PolicyKind {
        PolicyKind::CostAware
    }

    fn insert(&mut self, key: BlockHash, info: InsertInfo) {
        let seq = self.seq();
        self.stats.insert(
            key,
            Stats {
                uses: 1,
                last_use: info.now,
                seq,
                depth: info.depth,
            },
        );
    }

    fn access(&mut self, key: BlockHash, now: u64) {
        let seq = self.seq();
        if let Some(s) = self.stats.get_mut(&key) {
            s.uses = s.uses.saturating_add(1);
            s.last_use = s.last_use.max(now);
            s.seq = seq;
        }
    }

    fn remove(&mut self, key: BlockHash) {
        self.stats.remove(&key);
    }

    fn victim(
        &mut self,
        now: u64,
        eligible: &mut dyn FnMut(BlockHash) -> bool,
    ) -> Option<BlockHash> {
        let mut best: Option<(f64, u64, BlockHash)> = None;
        for (key, s) in &self.stats {
            let value = self
                .model
                .value(s.uses, now.saturating_sub(s.last_use), s.depth);
            let better = best.is_none_or(|(v, seq, _)| value < v || (value == v && s.seq < seq));
            if better && eligible(*key) {
                best = Some((value, s.seq, *key));
            }
        }
        let (_, _, key) = best?;
        self.stats.remove(&key);
        Some(key)
    }

    fn len(&self) -> usize {
        self.stats.len()
    }
}
