//! The tiers of the KV cache hierarchy.
//!
//! One [`Tier`] names a level everywhere: the block manager keys its pools
//! by it, the node protocol carries it (`kvtier-protocol` encodes it as one
//! byte, `G1` = 1 ... `G4` = 4) and the Python binding shows it as `"G2"`
//! and so on.

use serde::{Deserialize, Serialize};

/// A level of the KV cache hierarchy, fastest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Tier {
    /// GPU HBM, owned by an engine (reported, never held by the node
    /// daemon).
    G1,
    /// Host DRAM: the shared-memory arena.
    G2,
    /// Local NVMe: the log-structured disk tier.
    G3,
    /// Remote: peers, object stores, shared file systems.
    G4,
}

impl Tier {
    /// Every tier, fastest first.
    pub const ALL: [Tier; 4] = [Tier::G1, Tier::G2, Tier::G3, Tier::G4];

    /// Position in [`Tier::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The next slower tier, where blocks evicted from this one cascade.
    pub fn below(self) -> Option<Tier> {
        match self {
            Tier::G1 => Some(Tier::G2),
            Tier::G2 => Some(Tier::G3),
            Tier::G3 => Some(Tier::G4),
            Tier::G4 => None,
        }
    }

    /// Lower-case name (`g1` ...), as used in configuration and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Tier::G1 => "g1",
            Tier::G2 => "g2",
            Tier::G3 => "g3",
            Tier::G4 => "g4",
        }
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_index_and_cascade_agree() {
        for (i, t) in Tier::ALL.into_iter().enumerate() {
            assert_eq!(t.index(), i);
            assert_eq!(t.below(), Tier::ALL.get(i + 1).copied());
            assert_eq!(t.to_string(), format!("g{}", i + 1));
        }
        assert!(Tier::G1 < Tier::G4);
    }
}
