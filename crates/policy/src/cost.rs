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
//! the tier below costs at most the restore transfer. The eligible key of
//! lowest value goes first (ties: the least recently used). A victim scan
//! walks every tracked key, `O(n)`: the values change with time, so no
//! order can be kept between scans. The one policy here that is not O(1).

use serde::{Deserialize, Serialize};

use crate::lists::Lists;
use crate::{EvictionPolicy, PolicyKey, PolicyKind, Use, Verdict};

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

/// What the policy keeps per key, by slot.
#[derive(Debug, Clone, Copy, Default)]
struct Stats {
    uses: u64,
    last_use: u64,
    depth: u32,
}

/// The cost-aware policy. Its one list is in order of last use, so a scan
/// meets ties least recent first.
#[derive(Debug)]
pub struct CostAware<K: PolicyKey> {
    model: CostModel,
    lists: Lists<K>,
    stats: Vec<Stats>,
}

const RECENCY: u32 = 0;

impl<K: PolicyKey> CostAware<K> {
    /// A policy weighing `model`.
    pub fn new(model: CostModel) -> Self {
        Self {
            model,
            lists: Lists::new(1),
            stats: Vec::new(),
        }
    }

    fn set_stats(&mut self, slot: u32, s: Stats) {
        let i = slot as usize;
        if self.stats.len() <= i {
            self.stats.resize(i + 1, Stats::default());
        }
        self.stats[i] = s;
    }
}

impl<K: PolicyKey> EvictionPolicy<K> for CostAware<K> {
    fn kind(&self) -> PolicyKind {
        PolicyKind::CostAware
    }

    fn insert(&mut self, key: K, u: &Use) {
        let slot = self.lists.push_newest(key, RECENCY, 0);
        let stats = Stats {
            uses: 1,
            last_use: u.now,
            depth: u.depth,
        };
        self.set_stats(slot, stats);
    }

    fn access(&mut self, key: K, u: &Use) {
        if let Some(slot) = self.lists.slot(key) {
            let s = &mut self.stats[slot as usize];
            s.uses = s.uses.saturating_add(1);
            s.last_use = s.last_use.max(u.now);
            self.lists.move_newest(slot, RECENCY);
        }
    }

    fn remove(&mut self, key: K) {
        self.lists.remove(key);
    }

    fn victim(&mut self, now: u64, eligible: &mut dyn FnMut(K) -> Verdict) -> Option<K> {
        let mut best: Option<(f64, u32)> = None;
        for (slot, key) in self.lists.iter_oldest(RECENCY) {
            let s = self.stats[slot as usize];
            let value = self
                .model
                .value(s.uses, now.saturating_sub(s.last_use), s.depth);
            // Strictly lower only: the first of equal values is the least
            // recently used.
            if best.is_some_and(|(v, _)| value >= v) {
                continue;
            }
            match eligible(key) {
                Verdict::Evict => best = Some((value, slot)),
                Verdict::Skip => {}
                Verdict::Stop => break,
            }
        }
        let (_, slot) = best?;
        let key = self.lists.key(slot);
        self.lists.remove_slot(slot);
        Some(key)
    }

    fn coldest(&self, visit: &mut dyn FnMut(K) -> Verdict) {
        self.lists.visit_oldest(RECENCY, visit);
    }

    fn contains(&self, key: K) -> bool {
        self.lists.slot(key).is_some()
    }

    fn len(&self) -> usize {
        self.lists.len(RECENCY)
    }
}
