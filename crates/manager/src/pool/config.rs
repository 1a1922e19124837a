//! Configuration of one tier's pool.

use serde::{Deserialize, Serialize};

use crate::policy::PolicyConfig;

/// A pool configuration that cannot work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PoolConfigError {
    /// A pool needs room for at least one block.
    #[error("capacity_blocks must be positive")]
    ZeroCapacity,
    /// A block needs at least one token.
    #[error("tokens_per_block must be positive")]
    ZeroBlockSize,
    /// Watermarks must satisfy `0 <= low <= high <= 1`.
    #[error("watermarks must satisfy 0 <= low ({low}) <= high ({high}) <= 1")]
    Watermarks {
        /// The low watermark given.
        low: f64,
        /// The high watermark given.
        high: f64,
    },
    /// The policy cannot run in a tier (an optimizer-only policy).
    #[error(transparent)]
    Policy(#[from] kvtier_policy::PolicyError),
}

/// Capacity, watermarks and eviction policy of one tier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// Blocks the tier holds. Default: 1024.
    pub capacity_blocks: usize,
    /// Tokens per block. Default: 16.
    pub tokens_per_block: usize,
    /// Fraction of capacity above which the placement planner offloads.
    /// Default: 0.9.
    pub high_watermark: f64,
    /// Fraction of capacity the planner offloads down to. Default: 0.75.
    pub low_watermark: f64,
    /// Eviction policy. Default: LRU.
    pub policy: PolicyConfig,
    /// Record stored / removed events for
    /// [`BlockPool::drain_events`](crate::pool::BlockPool::drain_events).
    /// Default: false, so a pool nobody drains does not grow a log.
    pub record_events: bool,
    /// Whether an allocation with no free slot evicts an inactive block
    /// (the policy's victim) to make one. Default: true. The block manager
    /// turns it off when it makes room itself
    /// ([`ManagerConfig::offload_on_demand`](crate::manager::ManagerConfig::offload_on_demand)):
    /// an eviction by allocation cannot cascade the victim to the tier
    /// below, so a block held nowhere else would be lost without a trace.
    pub evict_on_allocate: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            capacity_blocks: 1024,
            tokens_per_block: 16,
            high_watermark: 0.9,
            low_watermark: 0.75,
            policy: PolicyConfig::default(),
            record_events: false,
            evict_on_allocate: true,
        }
    }
}

impl PoolConfig {
    /// A configuration of `capacity_blocks` blocks of `tokens_per_block`
    /// tokens, defaults elsewhere.
    pub fn new(capacity_blocks: usize, tokens_per_block: usize) -> Self {
        Self {
            capacity_blocks,
            tokens_per_block,
            ..Self::default()
        }
    }

    /// Checks that the configuration can work.
    pub fn validate(&self) -> Result<(), PoolConfigError> {
        if self.capacity_blocks == 0 {
            return Err(PoolConfigError::ZeroCapacity);
        }
        if self.tokens_per_block == 0 {
            return Err(PoolConfigError::ZeroBlockSize);
        }
        let (low, high) = (self.low_watermark, self.high_watermark);
        if !(0.0..=1.0).contains(&low) || !(0.0..=1.0).contains(&high) || low > high {
            return Err(PoolConfigError::Watermarks { low, high });
        }
        if self.policy.kind.optimizer_only() {
            return Err(kvtier_policy::PolicyError::OptimizerOnly(self.policy.kind).into());
        }
        Ok(())
    }

    /// Blocks in use above which the tier is over its high watermark.
    pub fn high_blocks(&self) -> usize {
        (self.capacity_blocks as f64 * self.high_watermark).floor() as usize
    }

    /// Blocks in use the planner offloads down to.
    pub fn low_blocks(&self) -> usize {
        (self.capacity_blocks as f64 * self.low_watermark).floor() as usize
    }
}
