//! Hit density: evict the key expected to earn the fewest hits per unit of
//! the space and time it would still occupy, learned online per class and
//! age (after Beckmann, Chen and Cidon, "LHD: Improving Cache Hit Rate by
//! Maximizing Hit Density", NSDI 2018), with ghosts so that reuse beyond
//! the tier's reach is learned too.
//!
//! **Lives, classes and ages.** A key's *life* runs from one use to the
//! next: it starts when the key enters the tier or is accessed, and ends
//! with its next use (a *reuse*) or when it is forgotten. Ages count the
//! new keys the tier has taken since the key's last use: not time, not
//! accesses, and not keys that come back (a request's prefix loaded from
//! below), so a request's repeated touches of its prefix (match, plan,
//! load) are one use, in whatever order the loads land, and the age is
//! what decides whether an LRU tier of a given size still holds the key. A key
//! is in [`CLASSES`] = 2 classes: never reused since it entered, or reused
//! (a key that comes back while remembered counts as reused). Ages fall in
//! octave buckets.
//!
//! **What it learns.** Per class and age bucket, two decayed counts: lives
//! that *reached* the bucket and lives that ended in it by a reuse. From
//! them, for a key of class `c` now at age bucket `b`, the expected reuses
//! still to come (reuses at buckets `>= b` over lives that reached `b`)
//! and the expected space-time still to spend (a life that passes through
//! a bucket spends its width, one that ends in it half): the *hit density*
//! is their ratio. A class whose keys come back soon has a high density
//! while young and a low one once past its usual reuse age; a class that
//! rarely comes back has a low density at every age.
//!
//! **Eviction.** Resident keys sit in one LRU list per (class, bucket);
//! every [`PERIOD_DIVISOR`]th of the capacity in new keys the lists are
//! ranked by density (no evidence counts as zero, older buckets first:
//! LRU until something is learned) and the counts decay by [`DECAY`].
//! The victim is the least recent eligible key of the lowest-ranked list
//! that has one. Every 8 new keys a sweep moves the keys whose age
//! crossed their bucket's end to the next bucket; each key crosses at most
//! 32 buckets in a life, so a use costs O(1) amortized list moves plus a
//! look at the 128 list heads per 8 new keys. A touch with no new key
//! since the last use only refreshes the key's place in its list, so a
//! request's keys end in the order of their last touch, as in LRU.
//!
//! **Ghosts.** An evicted key stays as a ghost (key, class and last use,
//! not resident) in the same (class, bucket) lists of its own, aging the
//! same way, until its age passes [`HORIZON_FACTOR`] times the capacity;
//! then its life ends without reuse. A ghost that is inserted again is a
//! reuse at its age. So the policy learns reuse at ages the tier cannot
//! hold (a conversation's next turn comes back after about 7,000 new
//! blocks on the shared conversation trace), instead of calling every
//! block it evicted too early "never reused". Ghosts are bounded by the
//! keys used within the horizon: at most the capacity plus twice the
//! horizon.
//!
//! Why it works on prefix-cache traffic, and where it does not help, with
//! the measured gap closed: docs/optimizer.md, "`hit-density`".

use crate::lists::Lists;
use crate::{EvictionPolicy, PolicyKey, PolicyKind, Use, Verdict};

/// Classes: never reused since it entered, or reused. More classes (by
/// reuse count) split the evidence thinner: four closed 6% of the gap at
/// synthetic 4,000 blocks against 12% with two, and the same elsewhere
/// within two points.
pub const CLASSES: usize = 2;

/// The class of a key not reused since it entered.
const FRESH: usize = 0;

/// The class of a key reused at least once (the last).
const REUSED: usize = CLASSES - 1;

/// Age buckets: octaves of the clock of new keys (bucket `b` holds ages
/// `2^b - 1 ..= 2^(b+1) - 2`), the last one open-ended.
const BUCKETS: usize = 32;

/// Lists per kind (resident or ghost).
const LISTS: u32 = (CLASSES * BUCKETS) as u32;

/// How long a ghost is remembered, in multiples of the tier's capacity
/// (new keys since its last use). Share of the LRU->Belady gap closed at
/// conversation 4,000 / 16,000 and synthetic 4,000 / 16,000 blocks: 2x
/// 18/18/8/21%, 4x 30/15/12/23%, 8x 30/13/12/23%, 16x 29/13/12/23%. 8x,
/// for the small tiers: at conversation 1,000 blocks 4x closes 9% and 8x
/// 22% (a conversation's turn returns after about 7,000 new blocks). An
/// absolute floor of 16,384 instead did as well on the shared traces but
/// cut the gap closed on the random traces at 50 blocks from 70% to 30%.
pub const HORIZON_FACTOR: u64 = 8;

/// The ranking is rebuilt, and the counts decay, every `capacity /
/// PERIOD_DIVISOR` new keys (at least every 16).
pub const PERIOD_DIVISOR: u64 = 16;

/// Factor the counts are multiplied by at each rebuild: evidence halves
/// every 350 periods, about 22 capacities of new keys.
pub const DECAY: f64 = 0.998;

/// New keys between two sweeps of the buckets.
const SWEEP_EVERY: u64 = 8;

/// The octave bucket of `age`.
fn bucket(age: u64) -> usize {
    let octave = 63 - (age + 1).leading_zeros() as usize;
    octave.min(BUCKETS - 1)
}

/// The first age of bucket `b`.
fn first_age(b: usize) -> u64 {
    (1u64 << b) - 1
}

/// The list of resident keys of `class` in bucket `b`; ghosts' lists
/// follow at `LISTS + ` the same number.
fn list_of(class: usize, b: usize) -> u32 {
    (class * BUCKETS + b) as u32
}

/// A node's value: the clock at the key's last use and its class.
fn pack(last: u64, class: usize) -> u64 {
    (last << 8) | class as u64
}

fn unpack(value: u64) -> (u64, usize) {
    (value >> 8, (value & 0xff) as usize)
}

/// The learned counts of one class, per age bucket.
#[derive(Debug, Clone, Copy)]
struct Counts {
    /// Lives that reached the bucket.
    reached: [f64; BUCKETS],
    /// Lives that ended in the bucket by a reuse.
    reused: [f64; BUCKETS],
}

impl Counts {
    const ZERO: Counts = Counts {
        reached: [0.0; BUCKETS],
        reused: [0.0; BUCKETS],
    };

    /// Hit density per bucket: reuses still to come over the space-time
    /// still to spend, for a life that has reached the bucket; 0 where
    /// nothing was seen.
    fn densities(&self) -> [f64; BUCKETS] {
        let (mut hits, mut time) = (0.0, 0.0);
        let mut d = [0.0; BUCKETS];
        for b in (0..BUCKETS).rev() {
            let width = if b + 1 < BUCKETS {
                (first_age(b + 1) - first_age(b)) as f64
            } else {
                first_age(b) as f64
            };
            let passed = if b + 1 < BUCKETS {
                self.reached[b + 1]
            } else {
                0.0
            };
            let ended = (self.reached[b] - passed).max(0.0);
            hits += self.reused[b];
            time += passed * width + ended * width * 0.5;
            d[b] = if time > 0.0 { hits / time } else { 0.0 };
        }
        d
    }

    fn decay(&mut self) {
        for x in self.reached.iter_mut().chain(self.reused.iter_mut()) {
            *x *= DECAY;
        }
    }
}

/// Hit density with two classes, octave age buckets and ghosts.
#[derive(Debug)]
pub struct HitDensity<K: PolicyKey> {
    capacity: u64,
    /// Resident lists `0..LISTS`, ghost lists `LISTS..2 * LISTS`.
    lists: Lists<K>,
    /// New keys inserted so far: the clock ages are counted in.
    clock: u64,
    counts: [Counts; CLASSES],
    /// Resident lists, lowest density first.
    ranking: Vec<u32>,
    /// Clock at the last ranking.
    ranked_at: u64,
    /// Clock at the last sweep.
    swept_at: u64,
    resident: usize,
}

impl<K: PolicyKey> HitDensity<K> {
    /// Hit density for a tier of `capacity` keys.
    pub fn new(capacity: usize) -> Self {
        let mut p = Self {
            capacity: capacity.max(1) as u64,
            lists: Lists::new(2 * LISTS as usize),
            clock: 0,
            counts: [Counts::ZERO; CLASSES],
            ranking: Vec::with_capacity(LISTS as usize),
            ranked_at: 0,
            swept_at: 0,
            resident: 0,
        };
        p.rank();
        p
    }

    /// The class `key` is in, if tracked (resident or ghost): 0 never
    /// reused, 1 reused.
    pub fn class_of(&self, key: K) -> Option<usize> {
        self.lists.slot(key).map(|s| unpack(self.lists.value(s)).1)
    }

    /// Whether `key` is remembered as a ghost.
    pub fn is_ghost(&self, key: K) -> bool {
        self.lists
            .slot(key)
            .is_some_and(|s| self.lists.list_at(s) >= LISTS)
    }

    fn period(&self) -> u64 {
        (self.capacity / PERIOD_DIVISOR).max(16)
    }

    /// Ranks the resident lists by density and decays the counts.
    fn rank(&mut self) {
        let mut scored: Vec<(f64, usize, u32)> = Vec::with_capacity(LISTS as usize);
        for (class, counts) in self.counts.iter().enumerate() {
            for (b, d) in counts.densities().into_iter().enumerate() {
                scored.push((d, b, list_of(class, b)));
            }
        }
        // Equal densities (no evidence): the older bucket first.
        scored.sort_by(|x, y| x.0.total_cmp(&y.0).then(y.1.cmp(&x.1)));
        self.ranking.clear();
        self.ranking.extend(scored.into_iter().map(|(_, _, l)| l));
        self.counts.iter_mut().for_each(Counts::decay);
        self.ranked_at = self.clock;
    }

    /// Moves the keys whose age crossed their bucket's end to the bucket
    /// of their age, counting the buckets their lives reached; forgets
    /// ghosts past the horizon.
    fn sweep(&mut self) {
        let horizon = HORIZON_FACTOR * self.capacity;
        for base in [0, LISTS] {
            for class in 0..CLASSES {
                for b in 0..BUCKETS {
                    self.sweep_list(base, class, b, horizon);
                }
            }
        }
        self.swept_at = self.clock;
    }

    fn sweep_list(&mut self, base: u32, class: usize, b: usize, horizon: u64) {
        let list = base + list_of(class, b);
        while let Some(slot) = self.lists.oldest(list) {
            let age = self.clock - unpack(self.lists.value(slot)).0;
            if base == LISTS && age >= horizon {
                // A ghost's life ends unreused; the buckets it reached
                // were counted as it aged.
                self.lists.remove_slot(slot);
                continue;
            }
            let to = bucket(age);
            if to == b {
                break;
            }
            for k in b + 1..=to {
                self.counts[class].reached[k] += 1.0;
            }
            self.lists.move_newest(slot, base + list_of(class, to));
        }
    }

    /// Sweeps and ranks when due.
    fn tick(&mut self) {
        if self.clock - self.swept_at >= SWEEP_EVERY {
            self.sweep();
        }
        if self.clock - self.ranked_at >= self.period() {
            self.rank();
        }
    }

    /// Ends the life of the key last used at `last` in `class` by a reuse
    /// now (its next life is [`REUSED`]).
    fn count_reuse(&mut self, last: u64, class: usize) {
        self.counts[class].reused[bucket(self.clock - last)] += 1.0;
    }

    /// Starts a life of the key in `slot` now, in `class`, resident.
    fn start(&mut self, slot: u32, class: usize) {
        self.counts[class].reached[0] += 1.0;
        self.lists.set_value(slot, pack(self.clock, class));
        self.lists.move_newest(slot, list_of(class, 0));
    }
}

impl<K: PolicyKey> EvictionPolicy<K> for HitDensity<K> {
    fn kind(&self) -> PolicyKind {
        PolicyKind::HitDensity
    }

    fn insert(&mut self, key: K, _u: &Use) {
        let (slot, class) = match self.lists.slot(key) {
            Some(slot) if self.lists.list_at(slot) >= LISTS => {
                let (last, class) = unpack(self.lists.value(slot));
                self.count_reuse(last, class);
                (slot, REUSED)
            }
            _ => {
                // The clock counts new keys: this one is at the new time.
                self.clock += 1;
                (self.lists.push_newest(key, 0, 0), FRESH)
            }
        };
        self.resident += 1;
        self.start(slot, class);
        self.tick();
    }

    fn access(&mut self, key: K, _u: &Use) {
        let Some(slot) = self.lists.slot(key) else {
            return;
        };
        let (last, class) = unpack(self.lists.value(slot));
        if self.lists.list_at(slot) >= LISTS {
            return; // a ghost is not resident
        }
        if last == self.clock {
            // No new key since: the same use (a request touches its prefix
            // more than once), which only refreshes its recency, so the
            // last touch orders a request's keys as in LRU.
            self.lists.move_newest(slot, list_of(class, 0));
            return;
        }
        self.count_reuse(last, class);
        self.start(slot, REUSED);
    }

    fn remove(&mut self, key: K) {
        // Left without eviction (moved to another tier): no ghost; a ghost
        // stays one.
        if let Some(slot) = self.lists.slot(key)
            && self.lists.list_at(slot) < LISTS
        {
            self.lists.remove_slot(slot);
            self.resident -= 1;
        }
    }

    fn victim(&mut self, _now: u64, eligible: &mut dyn FnMut(K) -> Verdict) -> Option<K> {
        for i in 0..self.ranking.len() {
            let list = self.ranking[i];
            let Some(slot) = self.lists.find_oldest(list, eligible).ok()? else {
                continue;
            };
            self.lists.move_newest(slot, LISTS + list);
            self.resident -= 1;
            return Some(self.lists.key(slot));
        }
        None
    }

    fn coldest(&self, visit: &mut dyn FnMut(K) -> Verdict) {
        let _ = self
            .ranking
            .iter()
            .any(|l| self.lists.visit_oldest(*l, visit));
    }

    fn contains(&self, key: K) -> bool {
        self.lists
            .slot(key)
            .is_some_and(|s| self.lists.list_at(s) < LISTS)
    }

    fn len(&self) -> usize {
        self.resident
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_octaves_of_age() {
        for b in 0..BUCKETS - 1 {
            assert_eq!(bucket(first_age(b)), b);
            assert_eq!(bucket(first_age(b + 1) - 1), b);
        }
        assert_eq!(bucket(u64::MAX - 1), BUCKETS - 1);
    }

    #[test]
    fn a_ghost_is_forgotten_once_its_age_passes_the_horizon() {
        // A tier of 64: every new key evicts the oldest (nothing is reused,
        // so the order is LRU), remembered.
        let cap = 64;
        let horizon = HORIZON_FACTOR * cap;
        let mut p = HitDensity::<u64>::new(cap as usize);
        let insert = |p: &mut HitDensity<u64>, k: u64| {
            if p.len() == cap as usize {
                assert!(p.victim(0, &mut |_| Verdict::Evict).is_some());
            }
            p.insert(k, &Use::at(0));
        };
        insert(&mut p, 0);
        // Key 0's age is the count of new keys since: it stays remembered
        // below the horizon, and a sweep (every 8 new keys) forgets it
        // once its age has reached it.
        for k in 1..horizon {
            insert(&mut p, k);
        }
        assert!(p.is_ghost(0));
        for k in horizon..horizon + SWEEP_EVERY {
            insert(&mut p, k);
        }
        assert!(!p.is_ghost(0) && p.class_of(0).is_none());
        // Younger ghosts stay, and one coming back is a reuse.
        assert!(p.is_ghost(horizon - cap));
        insert(&mut p, horizon - cap);
        assert_eq!(p.class_of(horizon - cap), Some(1));
    }

    #[test]
    fn density_is_reuse_over_remaining_time() {
        // Every life reaches bucket 3 (ages 7..14), half are reused there;
        // the other half reach bucket 4 and end in it unreused.
        let mut c = Counts::ZERO;
        for b in 0..=3 {
            c.reached[b] = 10.0;
        }
        c.reached[4] = 5.0;
        c.reused[3] = 5.0;
        let d = c.densities();
        // At bucket 4: no reuse to come.
        assert_eq!(d[4], 0.0);
        // At bucket 3: 5 reuses over the time still to spend: 5 lives
        // pass it (x 8) and spend half of bucket 4 (x 8), 5 end in it (x 4).
        assert!((d[3] - 5.0 / 100.0).abs() < 1e-12);
        // Younger buckets add the time still to wait, so density falls.
        assert!(d[0] < d[3] && d[2] < d[3]);
        assert_eq!(Counts::ZERO.densities(), [0.0; BUCKETS]);
    }
}
