//! The tiers of the KV cache hierarchy.
//!
//! A [`Tier`] is a position in an ordered list of tiers, fastest first, not
//! a fixed set: position 0 is the engine's own device cache (G1, which the
//! node never holds), and the node's configured tiers follow it in the
//! order its configuration gives them (by default the shared-memory arena,
//! then the disk log, then a remote store). A new kind of tier is one more
//! position, not a new variant here. Each position has a [`TierKind`],
//! which the node announces to its clients with the list and KV events
//! carry.
//!
//! The block manager keys its pools by the position, the node protocol
//! carries it as one byte (position + 1, so `G1` = 1, `G2` = 2 ...), and the
//! Python binding shows it as `"G2"` and so on.

/// The most tiers a hierarchy has, the engine's device cache included (a
/// set of tiers is one byte).
pub const MAX_TIERS: usize = 8;

/// Lower-case names of the positions, as used in configuration and
/// metrics.
const NAMES: [&str; MAX_TIERS] = ["g1", "g2", "g3", "g4", "g5", "g6", "g7", "g8"];

/// Upper-case names of the positions, as the wire's clients, the Python
/// binding and serialized reports show them.
const LABELS: [&str; MAX_TIERS] = ["G1", "G2", "G3", "G4", "G5", "G6", "G7", "G8"];

/// A level of the KV cache hierarchy: a position in the ordered list of
/// tiers, fastest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tier(u8);

impl Tier {
    /// Position 0: the engine's GPU HBM (reported by engines, never held by
    /// the node daemon).
    pub const G1: Tier = Tier(0);
    /// Position 1: the node's first tier (by default host DRAM, the
    /// shared-memory arena engines map).
    pub const G2: Tier = Tier(1);
    /// Position 2: the node's second configured tier (by default the disk
    /// log).
    pub const G3: Tier = Tier(2);
    /// Position 3: the node's third configured tier (by default a remote
    /// store).
    pub const G4: Tier = Tier(3);

    /// The tier at `index`, or `None` past [`MAX_TIERS`].
    pub const fn at(index: usize) -> Option<Tier> {
        if index < MAX_TIERS {
            Some(Tier(index as u8))
        } else {
            None
        }
    }

    /// Every position, fastest first.
    pub fn all() -> impl DoubleEndedIterator<Item = Tier> + Clone {
        (0..MAX_TIERS as u8).map(Tier)
    }

    /// Position in the list (0 is the engine's device cache).
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// The next position, where blocks evicted from this one cascade when it
    /// is configured.
    pub const fn below(self) -> Option<Tier> {
        Tier::at(self.index() + 1)
    }

    /// Lower-case name (`g1` ...), as used in configuration and metrics.
    pub fn name(self) -> &'static str {
        NAMES[self.index()]
    }

    /// Upper-case name (`G1` ...), as clients and reports show it.
    pub fn label(self) -> &'static str {
        LABELS[self.index()]
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Serialized as its upper-case name (`"G2"`), as the fixed tiers were.
impl serde::Serialize for Tier {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.label())
    }
}

impl<'de> serde::Deserialize<'de> for Tier {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

impl std::str::FromStr for Tier {
    type Err = String;

    /// `g2` or `G2` (any position up to [`MAX_TIERS`]).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        NAMES
            .iter()
            .position(|n| n.eq_ignore_ascii_case(s))
            .and_then(Tier::at)
            .ok_or_else(|| format!("unknown tier {s:?} (expected g1 ... g{MAX_TIERS})"))
    }
}

/// What kind of storage a tier is: how it is reached and shown (its name
/// in stats and metrics, the medium in KV events). The manager's behaviour
/// depends on the facets a tier's store offers, not on this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TierKind {
    /// An engine's own device memory (GPU HBM): G1, never held by the node.
    Device,
    /// Host memory: the shared-memory arena.
    Memory,
    /// Local disk: the log-structured region store.
    Disk,
    /// An object store or shared file system.
    Remote,
    /// Another node of the cluster: blocks the metadata service says a
    /// peer holds, fetched over the peer data plane. Listed after the
    /// node's own tiers, never in the manager's cascade.
    Peer,
}

impl TierKind {
    /// Every kind.
    pub const ALL: [TierKind; 5] = [
        TierKind::Device,
        TierKind::Memory,
        TierKind::Disk,
        TierKind::Remote,
        TierKind::Peer,
    ];

    /// A short lower-case name (`device`, `memory`, `disk`, `remote`,
    /// `peer`).
    pub fn name(self) -> &'static str {
        match self {
            TierKind::Device => "device",
            TierKind::Memory => "memory",
            TierKind::Disk => "disk",
            TierKind::Remote => "remote",
            TierKind::Peer => "peer",
        }
    }
}

impl std::fmt::Display for TierKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_index_and_cascade_agree() {
        let all: Vec<Tier> = Tier::all().collect();
        assert_eq!(all.len(), MAX_TIERS);
        for (i, t) in all.iter().enumerate() {
            assert_eq!(t.index(), i);
            assert_eq!(Tier::at(i), Some(*t));
            assert_eq!(t.below(), all.get(i + 1).copied());
            assert_eq!(t.to_string(), format!("g{}", i + 1));
        }
        assert_eq!(Tier::at(MAX_TIERS), None);
        assert!(Tier::G1 < Tier::G4);
        assert_eq!(
            [Tier::G1, Tier::G2, Tier::G3, Tier::G4].map(Tier::index),
            [0, 1, 2, 3]
        );
    }

    #[test]
    fn names_parse_back() {
        for t in Tier::all() {
            assert_eq!(t.name().parse::<Tier>(), Ok(t));
            assert_eq!(t.label().parse::<Tier>(), Ok(t));
            assert_eq!(t.label(), t.name().to_ascii_uppercase());
        }
        assert!("g0".parse::<Tier>().is_err());
        assert!("g9".parse::<Tier>().is_err());
        assert!("disk".parse::<Tier>().is_err());
    }
}
