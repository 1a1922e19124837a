//! Configuration of the hierarchy: the tiers' pools and the placement rules.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Tier;
use crate::admission::AdmissionConfig;
use crate::pool::{BlockPool, Clock, PoolConfig, PoolError, PoolLock, wall_clock};
use crate::registry::Registry;

/// Whether a copy stays in the faster tier when a block moves down, and in
/// the slower one when it moves up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CascadeMode {
    /// Inclusive (write-through): a lower tier keeps a copy of what is
    /// above it; onboarding copies up, and evicting a block whose copy is
    /// below costs no transfer.
    Inclusive,
    /// Exclusive: a block lives in one tier; onboarding and offloading move
    /// it.
    #[default]
    Exclusive,
}

/// Placement rules.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlacementConfig {
    /// Inclusive or exclusive cascade. Default: exclusive.
    pub mode: CascadeMode,
    /// The admission filter in front of G3. Default: one reuse needed.
    pub admission: AdmissionConfig,
}

/// The tiers of one node and the placement rules between them: a pool
/// configuration per configured position of the tier list, fastest first.
/// G2, the top tier, is the fastest the node holds: an engine's GPU cache
/// (G1) lives in the engine, in front of the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HierarchyConfig {
    /// Each configured tier's pool, by position (`{"g2": {...}, "g3":
    /// {...}}`); blocks cascade to a position only when it is configured.
    /// Default: G2 (host memory, the top tier) with 4096 blocks.
    pub pools: BTreeMap<Tier, PoolConfig>,
    /// Placement rules.
    pub placement: PlacementConfig,
}

impl Default for HierarchyConfig {
    fn default() -> Self {
        Self::none().with(
            crate::TierList::TOP,
            PoolConfig {
                capacity_blocks: 4096,
                ..PoolConfig::default()
            },
        )
    }
}

impl HierarchyConfig {
    /// No tier configured; default placement rules.
    pub fn none() -> Self {
        Self {
            pools: BTreeMap::new(),
            placement: PlacementConfig::default(),
        }
    }

    /// With `pool` at `tier` (replacing any), or, given `None`, without a
    /// pool there.
    pub fn with(mut self, tier: Tier, pool: impl Into<Option<PoolConfig>>) -> Self {
        match pool.into() {
            Some(pool) => self.pools.insert(tier, pool),
            None => self.pools.remove(&tier),
        };
        self
    }

    /// With the placement rules `placement`.
    pub fn with_placement(mut self, placement: PlacementConfig) -> Self {
        self.placement = placement;
        self
    }

    /// The pool configuration of `tier`, if configured.
    pub fn tier(&self, tier: Tier) -> Option<&PoolConfig> {
        self.pools.get(&tier)
    }

    /// The pool configuration of `tier`, if configured, to change it.
    pub fn tier_mut(&mut self, tier: Tier) -> Option<&mut PoolConfig> {
        self.pools.get_mut(&tier)
    }

    /// Every configured tier and its pool configuration, fastest first.
    pub fn pools(&self) -> impl Iterator<Item = (Tier, &PoolConfig)> {
        self.pools.iter().map(|(t, c)| (*t, c))
    }

    /// Builds a registry with one pool per configured tier, each on a wall
    /// clock.
    pub fn build_registry<L: PoolLock>(&self) -> Result<Registry<L>, PoolError> {
        self.build_registry_on(wall_clock())
    }

    /// Builds a registry with one pool per configured tier, all on `clock`
    /// (a replay drives it with the trace's time, so idle times and TTLs
    /// are the trace's).
    pub fn build_registry_on<L: PoolLock>(&self, clock: Clock) -> Result<Registry<L>, PoolError> {
        let mut registry = Registry::new();
        for (tier, cfg) in self.pools() {
            registry = registry.with_pool(BlockPool::with_lock(tier, cfg.clone(), clock.clone())?);
        }
        Ok(registry)
    }
}
