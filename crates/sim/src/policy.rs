//! Eviction policies for the replay: the node's own, from `kvtier-policy`
//! (so the optimizer predicts what the node runs), and those only the
//! optimizer runs, implemented here on the same trait: random-LRU
//! (`random_lru`), Belady's bound (`belady`) and the bounds of reuse
//! prediction (`oracle`: `oracle-lru`, `oracle-hit-density`).
//!
//! The replay keys blocks by dense `u32` ids, which `kvtier-policy` finds
//! through a flat vector: no hash lookup beyond the replay's own interning.

mod belady;
mod oracle;
mod random_lru;

use kvtier_policy::{EvictionPolicy, PolicyConfig};

pub use kvtier_policy::{PolicyKind, UnknownPolicy};
pub use random_lru::SAMPLES as RANDOM_LRU_SAMPLES;

/// No block: the parent of a first block.
pub(crate) const NIL: u32 = u32::MAX;

/// Builds the policy of one tier of `capacity` blocks. `ttl_ms: None` makes
/// [`PolicyKind::Ttl`] plain LRU (nothing expires).
pub(crate) fn build(
    kind: PolicyKind,
    capacity: u64,
    ttl_ms: Option<u64>,
    seed: u64,
) -> Box<dyn EvictionPolicy<u32>> {
    match kind {
        PolicyKind::RandomLru => Box::new(random_lru::RandomLru::new(seed)),
        PolicyKind::Belady => Box::new(belady::Belady::default()),
        PolicyKind::OracleLru => Box::new(oracle::Oracle::lru()),
        PolicyKind::OracleHitDensity => Box::new(oracle::Oracle::hit_density(
            usize::try_from(capacity).unwrap_or(usize::MAX),
        )),
        node => {
            let config = PolicyConfig {
                ttl_ms: ttl_ms.unwrap_or(u64::MAX),
                ..PolicyConfig::of(node)
            };
            match config.build(usize::try_from(capacity).unwrap_or(usize::MAX)) {
                Ok(p) => p,
                // Only the three above are optimizer-only.
                Err(_) => Box::new(kvtier_policy::Lru::default()),
            }
        }
    }
}
