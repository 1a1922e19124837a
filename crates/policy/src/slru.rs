//! Segmented LRU (after Karedla, Love and Wherry, IEEE Computer 1994) whose
//! protected share is chosen online by miniature simulations (after
//! Waldspurger et al., "Cache Modeling and Optimization using Miniature
//! Simulations", USENIX ATC 2017), sized for prefix-cache traffic.
//!
//! A key enters the **probation** segment; a use while it sits there
//! promotes it to the **protected** segment, which holds at most the
//! current protected share of the tier. When a promotion overfills it, the
//! protected segment's least recent key drops back to the newest end of
//! probation (it keeps its chance there instead of leaving). Victims come
//! from the oldest end of probation, then of protected, and are
//! *remembered*: the last [`GHOST_FACTOR`] x capacity keys evicted stay as
//! ghosts (keys only, not resident), and a ghost inserted again enters
//! protected directly, as ARC's history lists do (Megiddo and Modha, FAST
//! '03): a block evicted before its reuse is known reused when it comes
//! back. All three are LRU lists over one slab, so every operation is
//! O(1). A share of 0 is LRU plus that second-chance admission.
//!
//! **The share.** Six miniature SLRUs, one per share of [`SHARES`], run
//! beside the tier on a hashed sample of its keys (every key when the tier
//! holds fewer than `2 ×` [`MINI_KEYS`]; otherwise one in `capacity /
//! MINI_KEYS`, each miniature holding the tier's capacity scaled by the
//! same factor). Each counts its misses, decayed by [`DECAY`] at every
//! decision; after each window of as many sampled uses as a miniature
//! holds, the tier takes the share of the miniature with the fewest
//! (ties to the smaller share, so to LRU). It starts at
//! [`START_SHARE`]. Memory: the tier's keys plus `GHOST_FACTOR ×` as many
//! ghosts, and at most `6 × (1 + GHOST_FACTOR) × 2 ×` [`MINI_KEYS`]
//! sampled keys and ghosts in the miniatures; a sampled use costs six O(1)
//! updates and a hash, a decision six comparisons.
//!
//! Why, from the shared Mooncake traces (512-token blocks):
//!
//! - most blocks a request brings are one-off tails: 76% of the new
//!   blocks of the conversation trace and 58% of the synthetic one are
//!   never used again, so a block used once should go before one that has
//!   been reused (a reused block is used again with probability 0.42 on
//!   the conversation trace, against 0.24 for a block seen once);
//! - but the second use is far away (median reuse distance 384 requests,
//!   about 7,000 distinct blocks, on the conversation trace): a new turn
//!   of a conversation re-sends the whole previous prompt minutes later.
//!   Any protected segment shortens the life of a block seen once, which
//!   is what a conversation's next turn needs. A fixed 30% share beats LRU
//!   from 1,000 to 16,000 blocks but falls below it at 32,000 on the
//!   conversation trace, and no fixed share is above LRU everywhere (20%
//!   is below LRU at conversation 32,000, 15% at synthetic 2,000). The
//!   miniatures find, per trace and capacity, when protection pays;
//! - a small tier has evicted a turn's blocks by the time the next turn
//!   re-sends them, so without memory every return looks new. Remembered,
//!   the returning prefix enters protected and holds there for the turns
//!   after it, while one-off tails (never back) pass through probation:
//!   this took the gap closed at conversation 4,000 blocks from 3% to 28%.
//!
//! With the replay's leaves-first filter, prefix-tree position comes on
//! top for free: a shared prefix stays while any resident block extends it.

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};

use crate::lists::{Lists, Stopped};
use crate::{EvictionPolicy, PolicyKey, PolicyKind, Use, Verdict};

const PROBATION: u32 = 0;
const PROTECTED: u32 = 1;
/// Keys evicted from either segment, remembered (not resident) for
/// [`GHOST_FACTOR`] times the tier's capacity.
const GHOST: u32 = 2;

/// How many evicted keys, in multiples of the tier's capacity, are
/// remembered: a key that comes back while remembered enters protected.
/// Conversation turns come back after about 7,000 distinct blocks, beyond
/// a small tier: at conversation 4,000 blocks 1x closed 16% of the
/// LRU->Belady gap, 2x 24%, 4x 28%, 8x 27%, 16x 25% (longer memories
/// protect conversations that have ended); on the synthetic trace 2x to 8x
/// are within a point of each other.
pub const GHOST_FACTOR: usize = 4;

/// Remembers `key`, evicted, as the newest ghost; forgets the oldest
/// beyond `cap`.
fn remember<K: PolicyKey>(lists: &mut Lists<K>, key: K, cap: usize) {
    lists.push_newest(key, GHOST, 0);
    while lists.len(GHOST) > cap {
        lists.pop_oldest(GHOST);
    }
}

/// The protected shares the miniatures try, in percent of the tier. 0 is
/// LRU. With ghosts, the conversation trace wants large shares at small
/// capacities (a returning turn goes straight to protected, so probation
/// only has to hold a turn's new tail) and small ones at large capacities;
/// the sweep from 0 to 90 lets the miniatures find either.
pub const SHARES: [usize; 6] = [0, 15, 30, 50, 70, 90];

/// The protected share, in percent, before the first decision.
pub const START_SHARE: usize = 30;

/// Keys a miniature aims to hold: the sample rate is one key in
/// `capacity / MINI_KEYS` (all keys below `2 × MINI_KEYS`).
pub const MINI_KEYS: usize = 4000;

/// Factor the miniatures' miss counts are multiplied by at each decision:
/// the evidence of about the last 20 windows counts.
pub const DECAY: f64 = 0.95;

/// Moves `slot` to the newest end of protected, then demotes protected's
/// oldest keys to probation's newest end while it holds more than `cap`.
fn promote<K: PolicyKey>(lists: &mut Lists<K>, slot: u32, cap: usize) {
    lists.move_newest(slot, PROTECTED);
    demote(lists, cap);
}

/// Demotes protected's oldest keys to probation while it holds more than
/// `cap`.
fn demote<K: PolicyKey>(lists: &mut Lists<K>, cap: usize) {
    while lists.len(PROTECTED) > cap {
        match lists.oldest(PROTECTED) {
            Some(old) => lists.move_newest(old, PROBATION),
            None => break,
        }
    }
}

/// A miniature SLRU over the sampled keys: it holds keys only, and counts
/// the misses it would have had.
#[derive(Debug)]
struct Mini<K: PolicyKey> {
    capacity: usize,
    protected_cap: usize,
    lists: Lists<K>,
    misses: f64,
}

impl<K: PolicyKey> Mini<K> {
    fn new(capacity: usize, share: usize) -> Self {
        Self {
            capacity,
            protected_cap: capacity * share / 100,
            lists: Lists::new(3),
            misses: 0.0,
        }
    }

    /// A use of `key`: a hit promotes it; a miss admits it (to protected
    /// if remembered, else to probation) and evicts the miniature's own
    /// victim, remembered, when full.
    fn use_key(&mut self, key: K) {
        match self.lists.slot(key) {
            Some(slot) if self.lists.list_at(slot) != GHOST => {
                promote(&mut self.lists, slot, self.protected_cap);
                return;
            }
            Some(slot) => promote(&mut self.lists, slot, self.protected_cap),
            None => {
                self.lists.push_newest(key, PROBATION, 0);
            }
        }
        self.misses += 1.0;
        if self.lists.len(PROBATION) + self.lists.len(PROTECTED) > self.capacity {
            let from = if self.lists.len(PROBATION) > 0 {
                PROBATION
            } else {
                PROTECTED
            };
            if let Some(k) = self.lists.pop_oldest(from) {
                remember(&mut self.lists, k, GHOST_FACTOR * self.capacity);
            }
        }
    }
}

/// The miniatures, the sample and the window.
#[derive(Debug)]
struct Tuner<K: PolicyKey> {
    /// One key in `every` is sampled.
    every: u64,
    /// Sampled uses between two decisions.
    window: usize,
    /// Sampled uses since the last decision.
    seen: usize,
    /// One per share of [`SHARES`].
    minis: Vec<Mini<K>>,
}

impl<K: PolicyKey> Tuner<K> {
    fn new(capacity: usize) -> Self {
        let every = (capacity / MINI_KEYS).max(1);
        let keys = (capacity / every).max(1);
        Self {
            every: every as u64,
            window: keys,
            seen: 0,
            minis: SHARES.iter().map(|&s| Mini::new(keys, s)).collect(),
        }
    }

    /// Whether `key` is in the sample (a fixed hash, so one key always is
    /// or never is).
    fn sampled(&self, key: K) -> bool {
        self.every == 1
            || BuildHasherDefault::<DefaultHasher>::default().hash_one(key) % self.every == 0
    }

    /// A use of `key`; the share the tier should take when a window ends.
    fn observe(&mut self, key: K) -> Option<usize> {
        if !self.sampled(key) {
            return None;
        }
        for m in &mut self.minis {
            m.use_key(key);
        }
        self.seen += 1;
        if self.seen < self.window {
            return None;
        }
        self.seen = 0;
        let mut best = 0;
        for (i, m) in self.minis.iter().enumerate() {
            if m.misses < self.minis[best].misses {
                best = i;
            }
        }
        for m in &mut self.minis {
            m.misses *= DECAY;
        }
        Some(SHARES[best])
    }
}

/// Segmented LRU with a protected share tuned online.
#[derive(Debug)]
pub struct Slru<K: PolicyKey> {
    capacity: usize,
    /// Most keys in the protected segment now.
    protected_cap: usize,
    lists: Lists<K>,
    tuner: Tuner<K>,
}

impl<K: PolicyKey> Slru<K> {
    /// SLRU for a tier of `capacity` keys.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            capacity,
            protected_cap: capacity * START_SHARE / 100,
            lists: Lists::new(3),
            tuner: Tuner::new(capacity),
        }
    }

    /// Whether `key` sits in the protected segment.
    pub fn is_protected(&self, key: K) -> bool {
        self.lists.list_of(key) == Some(PROTECTED)
    }

    /// The protected segment's current bound, in keys.
    pub fn protected_cap(&self) -> usize {
        self.protected_cap
    }

    /// Feeds a use of `key` to the tuner and applies its decision.
    fn observe(&mut self, key: K) {
        if let Some(share) = self.tuner.observe(key) {
            self.protected_cap = self.capacity * share / 100;
            demote(&mut self.lists, self.protected_cap);
        }
    }

    /// The oldest eligible key of `list`, taken out and remembered.
    fn take(
        &mut self,
        list: u32,
        eligible: &mut dyn FnMut(K) -> Verdict,
    ) -> Result<Option<K>, Stopped> {
        let Some(slot) = self.lists.find_oldest(list, eligible)? else {
            return Ok(None);
        };
        let key = self.lists.key(slot);
        self.lists.remove_slot(slot);
        remember(&mut self.lists, key, GHOST_FACTOR * self.capacity);
        Ok(Some(key))
    }
}

impl<K: PolicyKey> EvictionPolicy<K> for Slru<K> {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Slru
    }

    fn insert(&mut self, key: K, _u: &Use) {
        match self.lists.slot(key) {
            // Evicted and back while remembered: it is reused.
            Some(slot) if self.lists.list_at(slot) == GHOST => {
                promote(&mut self.lists, slot, self.protected_cap)
            }
            _ => {
                self.lists.push_newest(key, PROBATION, 0);
            }
        }
        self.observe(key);
    }

    fn access(&mut self, key: K, _u: &Use) {
        let Some(slot) = self
            .lists
            .slot(key)
            .filter(|s| self.lists.list_at(*s) != GHOST)
        else {
            return;
        };
        // Demote rather than evict: the protected segment only bounds how
        // much of the tier reuse may claim.
        promote(&mut self.lists, slot, self.protected_cap);
        self.observe(key);
    }

    fn remove(&mut self, key: K) {
        // Removed without eviction (moved to another tier): no ghost, and
        // a ghost stays one.
        if let Some(slot) = self.lists.slot(key)
            && self.lists.list_at(slot) != GHOST
        {
            self.lists.remove_slot(slot);
        }
    }

    fn victim(&mut self, _now: u64, eligible: &mut dyn FnMut(K) -> Verdict) -> Option<K> {
        for list in [PROBATION, PROTECTED] {
            if let Some(key) = self.take(list, eligible).ok()? {
                return Some(key);
            }
        }
        None
    }

    fn coldest(&self, visit: &mut dyn FnMut(K) -> Verdict) {
        let _ = [PROBATION, PROTECTED]
            .iter()
            .any(|l| self.lists.visit_oldest(*l, visit));
    }

    fn contains(&self, key: K) -> bool {
        self.lists
            .slot(key)
            .is_some_and(|s| self.lists.list_at(s) != GHOST)
    }

    fn len(&self) -> usize {
        self.lists.len(PROBATION) + self.lists.len(PROTECTED)
    }
}
