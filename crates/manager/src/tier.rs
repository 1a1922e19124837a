//! The tiers of the hierarchy ([`Tier`], kvtier-core's), the node's
//! ordered list of configured tiers ([`TierList`]) and the paths blocks
//! move along ([`TransferPath`]).

use std::sync::Arc;

use kvtier_core::{Geometry, TierKind};
use kvtier_mem::MemoryTier;
use kvtier_tier::TierStore;
use serde::{Deserialize, Serialize};

use crate::transfer::TransferError;

/// The tier type is kvtier-core's, shared with the node protocol and the
/// Python binding; re-exported here because every seam of this crate is
/// keyed by it.
pub use kvtier_core::Tier;

/// A directed path a transfer takes, from one tier to another; the
/// transfer engine keeps one queue per path between its configured tiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TransferPath {
    /// The source tier.
    pub from: Tier,
    /// The destination tier.
    pub to: Tier,
}

impl TransferPath {
    /// The path from one tier to another, if blocks can move that way: two
    /// distinct tiers of the node (G1, the engine's own, is never one).
    pub fn between(from: Tier, to: Tier) -> Option<TransferPath> {
        (from != to && from != Tier::G1 && to != Tier::G1).then_some(TransferPath { from, to })
    }

    /// Whether the path reads toward a faster tier (an onboard), as
    /// opposed to an offload. The scheduler serves reads first.
    pub fn is_read(self) -> bool {
        self.to < self.from
    }

    /// Metric label: `{from}_to_{to}` (`g2_to_g3`, `g3_to_g2` ...).
    pub fn name(self) -> String {
        self.to_string()
    }
}

impl std::fmt::Display for TransferPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}_to_{}", self.from, self.to)
    }
}

/// The node's configured tiers, in order, fastest first: each a
/// [`TierStore`] at a [`Tier`] position. The top tier, at
/// [`TierList::TOP`], is the shared-memory arena; each tier registered
/// after it takes the next position. The transfer engine and the manager
/// share one list (the manager reads it from its engine).
///
/// The arena is also kept as its concrete [`MemoryTier`]: it is the one
/// tier the manager needs as more than a [`TierStore`], for the
/// engine-facing host API (reserving and committing slots engines fill
/// themselves, the slot offsets engines read). Every other tier is reached
/// through the trait only, so a new kind of tier is one crate implementing
/// [`TierStore`] and one registration (`kvtier-node`'s `Node::open`).
#[derive(Clone)]
pub struct TierList {
    geometry: Geometry,
    tiers: Vec<(Tier, Arc<dyn TierStore>)>,
    arena: Option<MemoryTier>,
}

impl std::fmt::Debug for TierList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TierList")
            .field("geometry", &self.geometry)
            .field("tiers", &self.kinds())
            .finish()
    }
}

impl TierList {
    /// The top tier's position, the arena's: position 1 (an engine's own
    /// device cache, G1, is position 0, in front of the node).
    pub const TOP: Tier = Tier::G2;

    /// The tiers for blocks of `geometry`: `arena` (if any) at
    /// [`TOP`](Self::TOP), then each of `below` at the next position. A
    /// tier storing blocks of another size, or more tiers than positions,
    /// is refused.
    pub fn new(
        geometry: Geometry,
        arena: Option<MemoryTier>,
        below: impl IntoIterator<Item = Arc<dyn TierStore>>,
    ) -> Result<Self, TransferError> {
        let mut list = Self {
            geometry,
            tiers: Vec::new(),
            arena: None,
        };
        if let Some(arena) = arena {
            list.push(Arc::new(arena.clone()))?;
            list.arena = Some(arena);
        }
        for store in below {
            list.push(store)?;
        }
        Ok(list)
    }

    /// Registers `store` at the next position; returns it.
    fn push(&mut self, store: Arc<dyn TierStore>) -> Result<Tier, TransferError> {
        if store.block_bytes() != self.geometry.block_bytes() {
            return Err(TransferError::GeometryMismatch {
                tier: store.kind().name(),
                detail: format!(
                    "{} B blocks vs {} B",
                    store.block_bytes(),
                    self.geometry.block_bytes()
                ),
            });
        }
        let next = match self.tiers.last() {
            Some((last, _)) => last.below(),
            None => Some(Self::TOP),
        };
        let tier = next.ok_or_else(|| {
            TransferError::InvalidConfig(format!("more than {} tiers", kvtier_core::MAX_TIERS - 1))
        })?;
        self.tiers.push((tier, store));
        Ok(tier)
    }

    /// The block geometry every tier stores.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// The store at `tier`, if one is registered there.
    pub fn store(&self, tier: Tier) -> Option<&Arc<dyn TierStore>> {
        self.tiers.iter().find(|(t, _)| *t == tier).map(|(_, s)| s)
    }

    /// The arena, the top tier, as its concrete type (for the host API).
    pub fn arena(&self) -> Option<&MemoryTier> {
        self.arena.as_ref()
    }

    /// Every registered tier with its store, fastest first.
    pub fn iter(&self) -> impl Iterator<Item = (Tier, &Arc<dyn TierStore>)> {
        self.tiers.iter().map(|(t, s)| (*t, s))
    }

    /// Every registered tier's position and kind, fastest first.
    pub fn kinds(&self) -> Vec<(Tier, TierKind)> {
        self.iter().map(|(t, s)| (t, s.kind())).collect()
    }

    /// Every path between two registered tiers.
    pub fn paths(&self) -> Vec<TransferPath> {
        let tiers: Vec<Tier> = self.iter().map(|(t, _)| t).collect();
        tiers
            .iter()
            .flat_map(|&from| tiers.iter().map(move |&to| (from, to)))
            .filter_map(|(from, to)| TransferPath::between(from, to))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_between_tiers() {
        let p = TransferPath::between(Tier::G2, Tier::G3).expect("a path");
        assert_eq!((p.from, p.to), (Tier::G2, Tier::G3));
        assert!(!p.is_read());
        let back = TransferPath::between(Tier::G4, Tier::G2).expect("a path");
        assert!(back.is_read());
        // G1 is the engine's, never the node's.
        for t in Tier::all() {
            assert_eq!(TransferPath::between(Tier::G1, t), None);
            assert_eq!(TransferPath::between(t, Tier::G1), None);
            assert_eq!(TransferPath::between(t, t), None);
        }
    }

    #[test]
    fn path_labels_name_both_ends() {
        let label = |from, to| TransferPath::between(from, to).expect("a path").name();
        assert_eq!(label(Tier::G2, Tier::G3), "g2_to_g3");
        assert_eq!(label(Tier::G3, Tier::G2), "g3_to_g2");
        assert_eq!(label(Tier::G3, Tier::G4), "g3_to_g4");
        assert_eq!(label(Tier::G4, Tier::G2), "g4_to_g2");
        let far = Tier::at(kvtier_core::MAX_TIERS - 1).expect("last position");
        assert_eq!(label(Tier::G2, far), "g2_to_g8");
    }
}
