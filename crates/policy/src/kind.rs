//! The policies' names and a tier's policy configuration.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{
    Arc, CostAware, CostModel, EvictionPolicy, HitDensity, Lfu, Lru, PolicyKey, S3Fifo, Slru, Ttl,
};

/// Every eviction policy kvtier knows, under one spelling each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// Least recently used.
    #[default]
    Lru,
    /// Least frequently used, ties by recency.
    Lfu,
    /// Adaptive replacement cache (recency and frequency lists with ghosts).
    Arc,
    /// S3-FIFO: small, main and ghost FIFO queues.
    #[serde(alias = "s3fifo")]
    S3Fifo,
    /// LRU that also reports keys idle longer than `ttl_ms` as expired.
    Ttl,
    /// Lowest expected reuse times the cost of getting the block back.
    CostAware,
    /// Segmented LRU: probation for blocks used once, a protected segment
    /// for reused ones (and for evicted ones that come back while
    /// remembered) whose share of the tier (0 to 90%) miniature simulations
    /// pick online.
    Slru,
    /// Hit density learned online per reuse class and age.
    HitDensity,
    /// Optimizer only: sample 5 random keys, evict the least recent.
    RandomLru,
    /// Optimizer only: Belady's optimum, the key used farthest in the future.
    Belady,
    /// Optimizer only: LRU, but keys never used again go first (a perfect
    /// reuse predictor, knowing the future): the bound of policies that
    /// predict *whether* a block returns, not *when*.
    OracleLru,
    /// Optimizer only: as [`PolicyKind::OracleLru`], but `hit-density`
    /// orders the keys that are used again: the bound of `hit-density`
    /// given a perfect reuse predictor.
    OracleHitDensity,
}

impl PolicyKind {
    /// Every policy, in a stable order.
    pub const ALL: [PolicyKind; 12] = [
        PolicyKind::Lru,
        PolicyKind::Lfu,
        PolicyKind::Arc,
        PolicyKind::S3Fifo,
        PolicyKind::Ttl,
        PolicyKind::CostAware,
        PolicyKind::Slru,
        PolicyKind::HitDensity,
        PolicyKind::RandomLru,
        PolicyKind::Belady,
        PolicyKind::OracleLru,
        PolicyKind::OracleHitDensity,
    ];

    /// The policies the node runs (and this crate builds).
    pub const NODE: [PolicyKind; 8] = [
        PolicyKind::Lru,
        PolicyKind::Lfu,
        PolicyKind::Arc,
        PolicyKind::S3Fifo,
        PolicyKind::Ttl,
        PolicyKind::CostAware,
        PolicyKind::Slru,
        PolicyKind::HitDensity,
    ];

    /// The name accepted by [`FromStr`] and used in configuration.
    pub const fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::Lfu => "lfu",
            PolicyKind::Arc => "arc",
            PolicyKind::S3Fifo => "s3-fifo",
            PolicyKind::Ttl => "ttl",
            PolicyKind::CostAware => "cost-aware",
            PolicyKind::Slru => "slru",
            PolicyKind::HitDensity => "hit-density",
            PolicyKind::RandomLru => "random-lru",
            PolicyKind::Belady => "belady",
            PolicyKind::OracleLru => "oracle-lru",
            PolicyKind::OracleHitDensity => "oracle-hit-density",
        }
    }

    /// Whether only the optimizer runs it (random-LRU needs no list;
    /// Belady and the oracles need the future).
    pub const fn optimizer_only(self) -> bool {
        matches!(self, PolicyKind::RandomLru) || self.needs_future()
    }

    /// Whether it needs every block's next use, so the whole trace.
    pub const fn needs_future(self) -> bool {
        matches!(
            self,
            PolicyKind::Belady | PolicyKind::OracleLru | PolicyKind::OracleHitDensity
        )
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A policy name that is not one of [`PolicyKind::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown eviction policy {0:?} (expected one of lru, lfu, arc, s3-fifo, ttl, cost-aware, slru, hit-density, random-lru, belady, oracle-lru, oracle-hit-density; leaf-first is not a policy but a filter every tier applies)"
)]
pub struct UnknownPolicy(pub String);

impl FromStr for PolicyKind {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase().replace('_', "-");
        PolicyKind::ALL
            .into_iter()
            .find(|p| p.name() == t)
            .or(match t.as_str() {
                "s3fifo" => Some(PolicyKind::S3Fifo),
                "cost" | "costaware" => Some(PolicyKind::CostAware),
                "randomlru" => Some(PolicyKind::RandomLru),
                "opt" | "min" => Some(PolicyKind::Belady),
                "oracle" => Some(PolicyKind::OracleLru),
                _ => None,
            })
            .ok_or_else(|| UnknownPolicy(s.to_owned()))
    }
}

/// Why a policy could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The policy exists only in the optimizer.
    #[error(
        "eviction policy {0} runs only in the optimizer (kvtier replay); a tier runs one of lru, lfu, arc, s3-fifo, ttl, cost-aware, slru, hit-density"
    )]
    OptimizerOnly(PolicyKind),
}

/// A tier's policy choice and its parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// Which policy. Default: LRU.
    pub kind: PolicyKind,
    /// Idle time after which [`PolicyKind::Ttl`] reports a key expired,
    /// milliseconds. Default: 10 minutes.
    pub ttl_ms: u64,
    /// Costs [`PolicyKind::CostAware`] weighs. Default: [`CostModel::default`].
    pub cost: CostModel,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            kind: PolicyKind::Lru,
            ttl_ms: 600_000,
            cost: CostModel::default(),
        }
    }
}

impl PolicyConfig {
    /// A configuration of `kind` with default parameters.
    pub fn of(kind: PolicyKind) -> Self {
        Self {
            kind,
            ..Self::default()
        }
    }

    /// Builds the policy of a tier holding up to `capacity` keys (ARC,
    /// S3-FIFO and SLRU size their queues and ghosts from it).
    pub fn build<K: PolicyKey>(
        &self,
        capacity: usize,
    ) -> Result<Box<dyn EvictionPolicy<K>>, PolicyError> {
        Ok(match self.kind {
            PolicyKind::Lru => Box::new(Lru::default()),
            PolicyKind::Lfu => Box::new(Lfu::default()),
            PolicyKind::Arc => Box::new(Arc::new(capacity)),
            PolicyKind::S3Fifo => Box::new(S3Fifo::new(capacity)),
            PolicyKind::Ttl => Box::new(Ttl::new(self.ttl_ms)),
            PolicyKind::CostAware => Box::new(CostAware::new(self.cost.clone())),
            PolicyKind::Slru => Box::new(Slru::new(capacity)),
            PolicyKind::HitDensity => Box::new(HitDensity::new(capacity)),
            k @ (PolicyKind::RandomLru
            | PolicyKind::Belady
            | PolicyKind::OracleLru
            | PolicyKind::OracleHitDensity) => {
                return Err(PolicyError::OptimizerOnly(k));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in PolicyKind::ALL {
            assert_eq!(p.name().parse::<PolicyKind>(), Ok(p));
            assert_eq!(p.to_string(), p.name());
        }
        for p in PolicyKind::NODE {
            assert_eq!(PolicyConfig::of(p).build::<u64>(4).map(|b| b.kind()), Ok(p));
        }
        assert_eq!("S3FIFO".parse::<PolicyKind>(), Ok(PolicyKind::S3Fifo));
        assert_eq!("s3fifo".parse::<PolicyKind>(), Ok(PolicyKind::S3Fifo));
        assert!("fifo".parse::<PolicyKind>().is_err());
        assert!("leaf-lru".parse::<PolicyKind>().is_err());
        assert_eq!(
            PolicyConfig::of(PolicyKind::Belady).build::<u64>(4).err(),
            Some(PolicyError::OptimizerOnly(PolicyKind::Belady))
        );
    }
}
