//! Configuration of the hierarchy: the tiers' pools and the placement rules.

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

/// The tiers of one node and the placement rules between them. G2 is the
/// fastest: an engine's GPU cache (G1) lives in the engine, in front of the
/// node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HierarchyConfig {
    /// G2 (host memory), the top tier. Default: 4096 blocks.
    pub g2: Option<PoolConfig>,
    /// G3 (local disk). Default: none.
    pub g3: Option<PoolConfig>,
    /// G4 (remote); blocks cascade there only when configured. Default: none.
    pub g4: Option<PoolConfig>,
    /// Placement rules.
    pub placement: PlacementConfig,
}

impl Default for HierarchyConfig {
    fn default() -> Self {
        Self {
            g2: Some(PoolConfig {
                capacity_blocks: 4096,
                ..PoolConfig::default()
            }),
            g3: None,
            g4: None,
            placement: PlacementConfig::default(),
        }
    }
}

impl HierarchyConfig {
    /// The pool configuration of `tier`, if configured.
    pub fn tier(&self, tier: Tier) -> Option<&PoolConfig> {
        match tier {
            Tier::G1 => None,
            Tier::G2 => self.g2.as_ref(),
            Tier::G3 => self.g3.as_ref(),
            Tier::G4 => self.g4.as_ref(),
            _ => None,
        }
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
        for tier in Tier::all() {
            if let Some(cfg) = self.tier(tier) {
                registry =
                    registry.with_pool(BlockPool::with_lock(tier, cfg.clone(), clock.clone())?);
            }
        }
        Ok(registry)
    }
}
