//! Eviction policies for the replay.
//!
//! Every policy works on **dense block ids**: the replay interns each
//! `(instance, prefix key)` once per access, and a policy keeps its state in
//! flat vectors indexed by id (intrusive lists over a slab, see `list`), so
//! an access costs one hash lookup in the replay and a few array stores here,
//! and nothing is allocated per access. One policy instance serves one tier;
//! the replay owns residency (which tier holds a block) and calls
//! `Policy::hit` for a block this tier holds, `Policy::insert` for one it
//! does not, and `Policy::remove` when a block is promoted out of it.
//!
//! Policies, one module each: [`PolicyKind::Lru`] (`lru`), `lfu`, `arc`,
//! `s3fifo`, `random_lru`, `leaf_lru`, `ttl` and `belady`.

use std::str::FromStr;

mod arc;
mod belady;
mod leaf_lru;
mod lfu;
pub(crate) mod list;
mod lru;
mod random_lru;
mod s3fifo;
mod ttl;

pub use random_lru::SAMPLES as RANDOM_LRU_SAMPLES;

use serde::{Deserialize, Serialize};

/// The eviction policies the replay knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// Least recently used.
    Lru,
    /// Least frequently used, ties by recency.
    Lfu,
    /// Adaptive replacement cache.
    Arc,
    /// S3-FIFO: small, main and ghost queues.
    S3Fifo,
    /// Sample 5 random resident blocks, evict the least recent of them.
    RandomLru,
    /// LRU that evicts leaves of the prefix tree before their parents.
    LeafLru,
    /// Drops blocks idle longer than `ttl_ms`; LRU when full.
    Ttl,
    /// Belady's optimum: evict the block used farthest in the future.
    Belady,
}

impl PolicyKind {
    /// Every policy, in a stable order.
    pub const ALL: [PolicyKind; 8] = [
        PolicyKind::Lru,
        PolicyKind::Lfu,
        PolicyKind::Arc,
        PolicyKind::S3Fifo,
        PolicyKind::RandomLru,
        PolicyKind::LeafLru,
        PolicyKind::Ttl,
        PolicyKind::Belady,
    ];

    /// The policy's name as accepted by [`FromStr`].
    pub const fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::Lfu => "lfu",
            PolicyKind::Arc => "arc",
            PolicyKind::S3Fifo => "s3fifo",
            PolicyKind::RandomLru => "random-lru",
            PolicyKind::LeafLru => "leaf-lru",
            PolicyKind::Ttl => "ttl",
            PolicyKind::Belady => "belady",
        }
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A policy name that is not one of [`PolicyKind::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown eviction policy {0:?} (expected one of lru, lfu, arc, s3fifo, random-lru, leaf-lru, ttl, belady)"
)]
pub struct UnknownPolicy(pub String);

impl FromStr for PolicyKind {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        PolicyKind::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(t))
            .or(match t.to_ascii_lowercase().as_str() {
                "s3-fifo" => Some(PolicyKind::S3Fifo),
                "random_lru" | "randomlru" => Some(PolicyKind::RandomLru),
                "leaf_lru" | "leaflru" => Some(PolicyKind::LeafLru),
                "opt" | "min" => Some(PolicyKind::Belady),
                _ => None,
            })
            .ok_or_else(|| UnknownPolicy(s.to_owned()))
    }
}

/// One block access as a policy sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Access {
    /// Dense id of the block.
    pub id: u32,
    /// Dense id of its parent in the prefix tree (`list::NIL` for a first
    /// block).
    pub parent: u32,
    /// Trace time of the request, milliseconds.
    pub now_ms: u64,
    /// Position of the block's next access (`u64::MAX`: never); only
    /// computed for Belady, 0 otherwise.
    pub next_use: u64,
}

/// An eviction policy for one tier.
///
/// Contract: `hit` only for a block the tier holds, `insert` only for one it
/// does not; `insert` may evict any block, the inserted one included, and
/// pushes every block it evicts onto `evicted`; after it returns the tier
/// holds at most its capacity. `remove` takes a held block out without an
/// eviction (promotion to a faster tier). `expire` pushes blocks dropped for
/// age at `now_ms`. `end_request` sees a request's ids once all were applied.
pub(crate) trait Policy {
    /// A use of a held block.
    fn hit(&mut self, a: &Access);
    /// A block the tier does not hold comes in.
    fn insert(&mut self, a: &Access, evicted: &mut Vec<u32>);
    /// A held block leaves without being evicted.
    fn remove(&mut self, id: u32);
    /// Drops blocks too old at `now_ms` (TTL only).
    fn expire(&mut self, _now_ms: u64, _dropped: &mut Vec<u32>) {}
    /// Called after every block of a request was applied, in request order.
    fn end_request(&mut self, _ids: &[u32]) {}
    /// Blocks held.
    fn len(&self) -> usize;
}

/// Builds the policy of one tier. `ttl_ms: None` makes [`PolicyKind::Ttl`]
/// plain LRU (nothing expires).
pub(crate) fn build(
    kind: PolicyKind,
    capacity: u64,
    ttl_ms: Option<u64>,
    seed: u64,
) -> Box<dyn Policy> {
    match kind {
        PolicyKind::Lru => Box::new(lru::Lru::new(capacity)),
        PolicyKind::Lfu => Box::new(lfu::Lfu::new(capacity)),
        PolicyKind::Arc => Box::new(arc::Arc::new(capacity)),
        PolicyKind::S3Fifo => Box::new(s3fifo::S3Fifo::new(capacity)),
        PolicyKind::RandomLru => Box::new(random_lru::RandomLru::new(capacity, seed)),
        PolicyKind::LeafLru => Box::new(leaf_lru::LeafLru::new(capacity)),
        PolicyKind::Ttl => Box::new(ttl::Ttl::new(capacity, ttl_ms.unwrap_or(u64::MAX))),
        PolicyKind::Belady => Box::new(belady::Belady::new(capacity)),
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
        assert_eq!("S3-FIFO".parse::<PolicyKind>(), Ok(PolicyKind::S3Fifo));
        assert!("fifo".parse::<PolicyKind>().is_err());
    }
}
