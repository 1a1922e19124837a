//! kvtier's eviction policies: one implementation of each, shared by the
//! node's block manager (keys are block hashes) and the optimizer's replay
//! (dense ids), so the optimizer predicts what the node runs.
//!
//! A policy ranks the keys one tier holds; it owns no blocks and decides
//! nothing about safety. The tier tells it what happens
//! ([`insert`](EvictionPolicy::insert), [`access`](EvictionPolicy::access),
//! [`remove`](EvictionPolicy::remove)) and asks it for a
//! [`victim`](EvictionPolicy::victim) with a predicate that says which keys
//! may go right now (unreferenced, unpinned, not in flight). Leaves of the
//! prefix tree before their parents is a filter over any policy
//! ([`LeafFirst`]), not a policy of its own.
//!
//! Policies, one module each: [`Lru`], [`Lfu`], [`Arc`], [`S3Fifo`],
//! [`Ttl`], [`CostAware`], [`Slru`] (segmented LRU whose protected
//! share miniature simulations tune online) and [`HitDensity`] (hits per
//! slot learned online per reuse class and age); see their modules and
//! docs/optimizer.md. All but cost-aware cost O(1) per operation
//! (amortized for hit-density: one `key -> slot` lookup and a few stores);
//! a victim scan walks from the policy's first choice and stops at the
//! first key the predicate accepts. [`PolicyKind`] also names the optimizer-only policies
//! (random-LRU and Belady), which `kvtier-sim` implements on this trait.
//!
//! ```
//! use kvtier_policy::{EvictionPolicy, PolicyConfig, PolicyKind, Use, Verdict};
//!
//! let mut lru = PolicyConfig::of(PolicyKind::Lru).build::<u64>(2).unwrap();
//! lru.insert(1, &Use::at(0));
//! lru.insert(2, &Use::at(1));
//! lru.access(1, &Use::at(2));
//! assert_eq!(lru.victim(3, &mut |_| Verdict::Evict), Some(2));
//! ```

mod arc;
mod cost;
mod density;
mod key;
mod kind;
mod leaf;
mod lfu;
mod lists;
mod lru;
mod s3fifo;
mod slru;
mod ttl;

use std::fmt;

pub use arc::Arc;
pub use cost::{CostAware, CostModel};
pub use density::{CLASSES, DECAY as DENSITY_DECAY, HORIZON_FACTOR, HitDensity, PERIOD_DIVISOR};
pub use key::{DenseIndex, HashIndex, PolicyKey, SlotIndex};
pub use kind::{PolicyConfig, PolicyError, PolicyKind, UnknownPolicy};
pub use leaf::LeafFirst;
pub use lfu::Lfu;
pub use lru::Lru;
pub use s3fifo::S3Fifo;
pub use slru::{DECAY, GHOST_FACTOR, MINI_KEYS, SHARES, START_SHARE, Slru};
pub use ttl::Ttl;

/// What the tier knows about a use of a key (its insertion or an access).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Use {
    /// The tier's clock, milliseconds.
    pub now: u64,
    /// Position of the block in its sequence (0 for a first block), as far
    /// as the tier knows it. Cost-aware weighs it.
    pub depth: u32,
    /// When the key is next used, in the caller's units, if the caller
    /// knows (the optimizer's Belady); `u64::MAX` otherwise.
    pub next_use: u64,
}

impl Use {
    /// A use at `now` with nothing else known.
    pub const fn at(now: u64) -> Self {
        Self {
            now,
            depth: 0,
            next_use: u64::MAX,
        }
    }
}

/// A tier's answer about one candidate during a victim scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It may go: the policy evicts it.
    Evict,
    /// It may not go now: the scan goes on.
    Skip,
    /// End the scan without a victim (the tier bounds its scans).
    Stop,
}

impl From<bool> for Verdict {
    fn from(may_go: bool) -> Self {
        if may_go {
            Verdict::Evict
        } else {
            Verdict::Skip
        }
    }
}

/// An eviction policy for one tier.
///
/// Contract: `insert` only for a key the policy does not track; `access`
/// and `remove` for keys it may or may not track (unknown keys are
/// ignored). `victim` returns a tracked key for which `eligible` said
/// [`Verdict::Evict`] and stops tracking it, or `None` when no tracked key
/// is eligible or `eligible` said [`Verdict::Stop`]; it may ask about one
/// key more than once, and the policy may update its own state while it
/// scans (S3-FIFO's second chances, ARC's ghosts). `expired` reports without
/// removing.
pub trait EvictionPolicy<K: PolicyKey>: Send + fmt::Debug {
    /// The policy's kind.
    fn kind(&self) -> PolicyKind;
    /// A key enters the tier.
    fn insert(&mut self, key: K, u: &Use);
    /// A key of the tier is used (matched, acquired, hit).
    fn access(&mut self, key: K, u: &Use);
    /// A key leaves the tier without being chosen as a victim.
    fn remove(&mut self, key: K);
    /// Chooses and forgets the key to evict next among the eligible ones.
    fn victim(&mut self, now: u64, eligible: &mut dyn FnMut(K) -> Verdict) -> Option<K>;
    /// Visits the keys idle too long at `now`, oldest first (TTL only).
    fn expired(&self, _now: u64, _visit: &mut dyn FnMut(K)) {}
    /// Visits tracked keys without evicting, those the policy would give up
    /// first first, until `visit` answers [`Verdict::Stop`]: the exact
    /// victim order for LRU, TTL, LFU, SLRU and hit-density (until its next
    /// ranking); for ARC and S3-FIFO their lists'
    /// order (the preferred list first), which the adaptive state refines
    /// when it evicts; for cost-aware, least recently used first. The
    /// memory tier picks blocks to demote this way.
    fn coldest(&self, visit: &mut dyn FnMut(K) -> Verdict);
    /// Whether `key` is tracked.
    fn contains(&self, key: K) -> bool;
    /// Keys tracked.
    fn len(&self) -> usize;
    /// Whether no key is tracked.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
