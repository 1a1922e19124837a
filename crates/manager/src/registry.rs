//! Which tiers hold which blocks, and prefix matching across tiers.
//!
//! A [`Registry`] holds the pool of every configured tier. Each pool
//! deduplicates by hash within its tier (registering a hash it holds returns
//! the existing block); the registry answers across tiers: in which tiers a
//! hash is resident ([`Registry::residency`]) and, for a request's chain of
//! hashes, the longest prefix held anywhere with the fastest tier holding
//! each block ([`Registry::match_prefix`]). Blocks still being transferred
//! into a tier do not count as resident there.

use std::fmt;

use kvtier_core::{BlockHash, MAX_TIERS};
use serde::{Deserialize, Serialize};

use crate::Tier;
use crate::pool::{BlockPool, DefaultLock, PoolLock, Presence};

/// A set of tiers.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TierSet(u8);

impl TierSet {
    /// The empty set.
    pub const EMPTY: TierSet = TierSet(0);

    /// Adds `tier`.
    pub fn insert(&mut self, tier: Tier) {
        self.0 |= 1 << tier.index();
    }

    /// Whether `tier` is in the set.
    pub fn contains(self, tier: Tier) -> bool {
        self.0 & (1 << tier.index()) != 0
    }

    /// The fastest tier in the set.
    pub fn fastest(self) -> Option<Tier> {
        self.iter().next()
    }

    /// The tiers, fastest first.
    pub fn iter(self) -> impl Iterator<Item = Tier> {
        Tier::all().filter(move |t| self.contains(*t))
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl FromIterator<Tier> for TierSet {
    fn from_iter<I: IntoIterator<Item = Tier>>(iter: I) -> Self {
        let mut s = TierSet::EMPTY;
        for t in iter {
            s.insert(t);
        }
        s
    }
}

impl fmt::Debug for TierSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// One block of a matched prefix and the fastest tier holding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MatchedBlock {
    /// The block.
    pub hash: BlockHash,
    /// The fastest tier where it is registered and readable.
    pub tier: Tier,
}

/// The longest prefix of a request's blocks held somewhere in the hierarchy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefixMatch {
    /// The matched blocks, in request order.
    pub blocks: Vec<MatchedBlock>,
}

impl PrefixMatch {
    /// Blocks matched.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether nothing matched.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Matched blocks served from `tier`.
    pub fn count_in(&self, tier: Tier) -> usize {
        self.blocks.iter().filter(|b| b.tier == tier).count()
    }
}

/// The pools of the configured tiers.
pub struct Registry<L: PoolLock = DefaultLock> {
    pools: [Option<BlockPool<L>>; MAX_TIERS],
}

impl<L: PoolLock> Default for Registry<L> {
    fn default() -> Self {
        Self {
            pools: std::array::from_fn(|_| None),
        }
    }
}

impl<L: PoolLock> fmt::Debug for Registry<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("tiers", &self.tiers().collect::<Vec<_>>())
            .finish()
    }
}

impl<L: PoolLock> Registry<L> {
    /// A registry of no tiers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the pool of its tier.
    pub fn with_pool(mut self, pool: BlockPool<L>) -> Self {
        let i = pool.tier().index();
        self.pools[i] = Some(pool);
        self
    }

    /// The pool of `tier`, if configured.
    pub fn pool(&self, tier: Tier) -> Option<&BlockPool<L>> {
        self.pools[tier.index()].as_ref()
    }

    /// The configured tiers, fastest first.
    pub fn tiers(&self) -> impl Iterator<Item = Tier> + '_ {
        Tier::all().filter(|t| self.pools[t.index()].is_some())
    }

    /// The next configured tier below `tier` and its pool: where `tier`'s
    /// evicted blocks cascade (G2 -> G4 when no G3 is configured).
    pub fn below(&self, tier: Tier) -> Option<(Tier, &BlockPool<L>)> {
        Tier::all()
            .filter(|t| *t > tier)
            .find_map(|t| self.pool(t).map(|p| (t, p)))
    }

    /// The configured pools, fastest first.
    pub fn pools(&self) -> impl Iterator<Item = &BlockPool<L>> {
        self.pools.iter().flatten()
    }

    /// The tiers where `hash` is registered and readable.
    pub fn residency(&self, hash: BlockHash) -> TierSet {
        self.pools()
            .filter(|p| p.presence(hash) == Some(Presence::Ready))
            .map(|p| p.tier())
            .collect()
    }

    /// For each of `hashes`, the fastest tier where it is registered and
    /// readable (one lock per pool for all).
    pub fn fastest_ready(&self, hashes: &[BlockHash]) -> Vec<Option<Tier>> {
        let mut fastest: Vec<Option<Tier>> = vec![None; hashes.len()];
        // A slower tier may fill a gap a faster one left, so every pool sees
        // every block not found yet.
        for pool in self.pools() {
            pool.fill_ready(hashes, &mut fastest);
        }
        fastest
    }

    /// The tiers `hash` is being transferred into.
    pub fn in_flight(&self, hash: BlockHash) -> TierSet {
        self.pools()
            .filter(|p| p.presence(hash) == Some(Presence::Filling))
            .map(|p| p.tier())
            .collect()
    }

    /// The longest prefix of `hashes` registered and readable in some tier,
    /// with the fastest such tier for each block. Takes each pool's lock
    /// once. Does not count as a use of the blocks.
    pub fn match_prefix(&self, hashes: &[BlockHash]) -> PrefixMatch {
        let fastest = self.fastest_ready(hashes);
        let blocks = hashes
            .iter()
            .zip(fastest)
            .map_while(|(h, t)| t.map(|tier| MatchedBlock { hash: *h, tier }))
            .collect();
        PrefixMatch { blocks }
    }
}
