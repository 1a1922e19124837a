//! Eviction policies of the manager's pools, behind one trait.
//!
//! A policy ranks the *registered* blocks of one tier, keyed by
//! [`BlockHash`]; it owns no blocks and decides nothing about safety. The
//! pool tells it what happens ([`EvictionPolicy::insert`], `access`,
//! `remove`) and asks it for a [`victim`](EvictionPolicy::victim) with a
//! predicate that says which blocks may go right now (unreferenced, unpinned,
//! not in flight, and in a first pass only leaves of the prefix tree), so
//! every policy gets leaves-before-parents and in-flight protection from the
//! pool for free.
//!
//! The replay simulator (`kvtier-sim`) has its own policies over dense ids
//! with a capacity-driven `insert`; the manager needs filtered victim
//! selection over hashes, so these are separate implementations, one module
//! each: [`lru`], [`lfu`], [`arc`], [`s3fifo`], [`ttl`] and [`cost`]
//! (cost-aware), sharing the ordered set in [`order`].

pub mod arc;
pub mod cost;
pub mod lfu;
pub mod lru;
pub mod order;
pub mod s3fifo;
pub mod ttl;

use std::fmt;
use std::str::FromStr;

use kvtier_core::BlockHash;
use serde::{Deserialize, Serialize};

pub use cost::CostModel;

/// What the pool knows about a block when it enters a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsertInfo {
    /// Time of insertion, in the pool's clock (milliseconds).
    pub now: u64,
    /// Position of the block in its sequence (0 for a first block), as far
    /// as the tier knows it: one more than the resident parent's depth.
    pub depth: u32,
}

/// An eviction policy for one tier.
///
/// Contract: `insert` only for a key the policy does not track, `access` and
/// `remove` for keys it may or may not track (unknown keys are ignored).
/// `victim` returns a tracked key for which `eligible` returned `true` and
/// stops tracking it, or `None` when no tracked key is eligible; `eligible`
/// may be called several times for one key and must not change its answer
/// during one call.
pub trait EvictionPolicy: Send + fmt::Debug {
    /// The policy's kind.
    fn kind(&self) -> PolicyKind;
    /// A block enters the tier.
    fn insert(&mut self, key: BlockHash, info: InsertInfo);
    /// A block of the tier is used (matched, acquired).
    fn access(&mut self, key: BlockHash, now: u64);
    /// A block leaves the tier without being chosen as a victim.
    fn remove(&mut self, key: BlockHash);
    /// Chooses and forgets the block to evict next among the eligible ones.
    fn victim(
        &mut self,
        now: u64,
        eligible: &mut dyn FnMut(BlockHash) -> bool,
    ) -> Option<BlockHash>;
    /// Blocks idle for too long at `now`, oldest first (TTL only).
    fn expired(&self, _now: u64) -> Vec<BlockHash> {
        Vec::new()
    }
    /// Blocks tracked.
    fn len(&self) -> usize;
    /// Whether no block is tracked.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The eviction policies the manager knows.
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
    S3Fifo,
    /// LRU that also reports blocks idle longer than `ttl_ms` as expired.
    Ttl,
    /// Lowest expected reuse times the cost of getting the block back.
    CostAware,
}

impl PolicyKind {
    /// Every policy, in a stable order.
    pub const ALL: [PolicyKind; 6] = [
        PolicyKind::Lru,
        PolicyKind::Lfu,
        PolicyKind::Arc,
        PolicyKind::S3Fifo,
        PolicyKind::Ttl,
        PolicyKind::CostAware,
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
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A policy name that is not one of [`PolicyKind::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown eviction policy {0:?} (expected lru, lfu, arc, s3-fifo, ttl or cost-aware)")]
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
                _ => None,
            })
            .ok_or_else(|| UnknownPolicy(s.to_owned()))
    }
}

/// A tier's policy choice and its parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// Which policy. Default: LRU.
    pub kind: PolicyKind,
    /// Idle time after which [`PolicyKind::Ttl`] reports a block expired,
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

    /// Builds the policy of a tier holding up to `capacity` blocks (ARC and
    /// S3-FIFO size their queues and ghosts from it).
    pub fn build(&self, capacity: usize) -> Box<dyn EvictionPolicy> {
        match self.kind {
            PolicyKind::Lru => Box::new(lru::Lru::default()),
            PolicyKind::Lfu => Box::new(lfu::Lfu::default()),
            PolicyKind::Arc => Box::new(arc::Arc::new(capacity)),
            PolicyKind::S3Fifo => Box::new(s3fifo::S3Fifo::new(capacity)),
            PolicyKind::Ttl => Box::new(ttl::Ttl::new(self.ttl_ms)),
            PolicyKind::CostAware => Box::new(cost::CostAware::new(self.cost.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in PolicyKind::ALL {
            assert_eq!(p.name().parse::<PolicyKind>(), Ok(p));
            assert_eq!(PolicyConfig::of(p).build(4).kind(), p);
        }
        assert_eq!("S3FIFO".parse::<PolicyKind>(), Ok(PolicyKind::S3Fifo));
        assert!("fifo".parse::<PolicyKind>().is_err());
    }
}
