//! The search cache: per (instance, block key) the serving location that
//! `get_cache_location` returns, in front of the index (Tair KVCM's LRU
//! search cache), so a warm prefix match costs a hash lookup and an `Arc`
//! clone per key instead of an index read and a deep clone.
//!
//! Layout: `SHARDS` shards, each a read-write lock over a hash map bounded
//! by entries. Eviction is CLOCK (second chance), an approximation of LRU
//! in which a hit only sets a flag, so lookups need the shared lock only;
//! a full shard evicts the first entry in insertion order whose flag is
//! clear, clearing flags as it passes. Only positive answers are cached: a
//! key without a serving location always goes to the index.
//!
//! Consistency within one process: every write path of the service calls
//! [`SearchCache::invalidate`] after its index change and before it
//! acknowledges. An invalidation removes the entry and bumps its shard's
//! epoch; a reader snapshots the epochs before it reads the index and fills
//! an entry only if its shard's epoch is unchanged, so a fill computed from
//! a record that a concurrent writer has since changed is dropped (or, if
//! it lands before the bump, removed by it). A cached answer is therefore
//! never staler than the index as seen by this process.
//!
//! Caveat: writes made by another process on a shared index (several
//! frontends on one Redis) are not seen here; there the cache should be
//! off (`search_cache_entries = 0`) or bounded by a short
//! `search_cache_ttl`, which is also how stale it may then be.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::RwLock;

use crate::model::{BlockKey, CacheLocation};

/// Number of shards: enough that concurrent writers rarely share one.
const SHARDS: usize = 64;

/// An instance's number in this cache. Removing an instance gives its name
/// a fresh number, which makes all its old entries unreachable at once
/// (CLOCK then ages them out).
type InstanceTag = u64;

/// Cache key: (instance tag, block key).
type Key = (InstanceTag, BlockKey);

/// Block keys are already hashes; one multiply-xorshift per word is enough
/// and far cheaper than SipHash on the hot path.
#[derive(Default, Clone, Copy)]
struct MixHasher(u64);

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = mix(self.0 ^ v);
    }
}

fn mix(v: u64) -> u64 {
    let x = v.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 29)
}

fn shard_of(key: &Key) -> usize {
    (mix(key.1.0 ^ key.0.rotate_left(32)) >> 58) as usize % SHARDS
}

/// One cached answer.
#[derive(Debug)]
struct Entry {
    location: Arc<CacheLocation>,
    /// CLOCK's reference flag, set by hits under the shared lock.
    referenced: AtomicBool,
    /// When the entry was filled (ms since the epoch), for the TTL.
    filled_ms: u64,
}

#[derive(Debug, Default)]
struct ShardMap {
    map: HashMap<Key, Entry, BuildHasherDefault<MixHasher>>,
    /// Keys in insertion order: CLOCK's circle. May hold keys that were
    /// invalidated since (skipped) or inserted twice (compacted when it
    /// grows past twice the capacity).
    ring: VecDeque<Key>,
}

#[derive(Debug, Default)]
struct Shard {
    inner: RwLock<ShardMap>,
    /// Bumped (under the write lock) by every invalidation in this shard.
    epoch: AtomicU64,
}

/// Epochs of all shards, taken before an index read; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct Epochs([u64; SHARDS]);

/// The cache. Disabled (every lookup misses, nothing is stored) when built
/// with 0 entries.
#[derive(Debug)]
pub(crate) struct SearchCache {
    shards: Box<[Shard]>,
    per_shard: usize,
    ttl_ms: Option<u64>,
    tags: RwLock<HashMap<String, InstanceTag>>,
    next_tag: AtomicU64,
}

impl SearchCache {
    /// A cache of at most about `entries` entries (rounded up to a multiple
    /// of the shard count); `ttl` bounds the age of an answer.
    pub(crate) fn new(entries: usize, ttl: Option<Duration>) -> Self {
        SearchCache {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            per_shard: entries.div_ceil(SHARDS),
            ttl_ms: ttl.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            tags: RwLock::new(HashMap::new()),
            next_tag: AtomicU64::new(0),
        }
    }

    /// Whether the cache stores anything.
    pub(crate) fn enabled(&self) -> bool {
        self.per_shard > 0
    }

    /// The tag of `instance`, made on first use.
    pub(crate) fn tag(&self, instance: &str) -> InstanceTag {
        if let Some(&t) = self.tags.read().get(instance) {
            return t;
        }
        *self
            .tags
            .write()
            .entry(instance.to_owned())
            .or_insert_with(|| self.next_tag.fetch_add(1, Ordering::Relaxed))
    }

    /// Snapshot of the shard epochs; take it before reading the index.
    pub(crate) fn epochs(&self) -> Epochs {
        let mut e = [0u64; SHARDS];
        for (slot, shard) in e.iter_mut().zip(self.shards.iter()) {
            *slot = shard.epoch.load(Ordering::Acquire);
        }
        Epochs(e)
    }

    /// Looks up `keys[i]` for every `i` in `wanted` and stores hits in
    /// `out[i]`; returns the positions that missed, in order.
    pub(crate) fn lookup(
        &self,
        tag: InstanceTag,
        keys: &[BlockKey],
        wanted: &[usize],
        now_ms: u64,
        out: &mut [Option<Arc<CacheLocation>>],
    ) -> Vec<usize> {
        if !self.enabled() {
            return wanted.to_vec();
        }
        let mut misses = Vec::new();
        if wanted.len() < SHARDS {
            for &i in wanted {
                let shard = self.shards[shard_of(&(tag, keys[i]))].inner.read();
                match self.probe(&shard, (tag, keys[i]), now_ms) {
                    Some(loc) => out[i] = Some(loc.clone()),
                    None => misses.push(i),
                }
            }
        } else {
            // A big batch takes every shard's shared lock once (in shard
            // order; writers hold one shard at a time, so no cycle) rather
            // than one lock per key.
            let guards: Vec<_> = self.shards.iter().map(|s| s.inner.read()).collect();
            for &i in wanted {
                let k = (tag, keys[i]);
                match self.probe(&guards[shard_of(&k)], k, now_ms) {
                    Some(loc) => out[i] = Some(loc.clone()),
                    None => misses.push(i),
                }
            }
        }
        misses
    }

    /// The live entry for `k`, marked referenced (CLOCK's hit).
    fn probe<'a>(
        &self,
        shard: &'a ShardMap,
        k: Key,
        now_ms: u64,
    ) -> Option<&'a Arc<CacheLocation>> {
        let e = shard.map.get(&k)?;
        if self.expired(e, now_ms) {
            return None;
        }
        // Read before writing: a hot entry's line is not dirtied per hit.
        if !e.referenced.load(Ordering::Relaxed) {
            e.referenced.store(true, Ordering::Relaxed);
        }
        Some(&e.location)
    }

    fn expired(&self, e: &Entry, now_ms: u64) -> bool {
        self.ttl_ms
            .is_some_and(|ttl| now_ms.saturating_sub(e.filled_ms) > ttl)
    }

    /// Stores answers read from the index after `epochs` was taken; an
    /// answer whose shard saw an invalidation since is dropped. Takes each
    /// shard's write lock once.
    pub(crate) fn fill(
        &self,
        tag: InstanceTag,
        epochs: &Epochs,
        now_ms: u64,
        answers: Vec<(BlockKey, Arc<CacheLocation>)>,
    ) {
        if !self.enabled() || answers.is_empty() {
            return;
        }
        let mut by_shard: Vec<(usize, Key, Arc<CacheLocation>)> = answers
            .into_iter()
            .map(|(key, loc)| {
                let k = (tag, key);
                (shard_of(&k), k, loc)
            })
            .collect();
        by_shard.sort_unstable_by_key(|(s, _, _)| *s);
        let mut rest = by_shard.as_mut_slice();
        while let Some(&(s, _, _)) = rest.first() {
            let n = rest.iter().take_while(|(t, _, _)| *t == s).count();
            let (run, tail) = rest.split_at_mut(n);
            rest = tail;
            let shard = &self.shards[s];
            let mut inner = shard.inner.write();
            // Read under the write lock: invalidations bump it under the
            // same lock, so the comparison cannot interleave with one.
            if shard.epoch.load(Ordering::Acquire) != epochs.0[s] {
                continue;
            }
            for (_, k, loc) in run.iter() {
                inner.insert(*k, loc.clone(), now_ms, self.per_shard);
            }
        }
    }

    /// Forgets `keys` of `instance`; call after changing their records and
    /// before acknowledging the change.
    pub(crate) fn invalidate(&self, instance: &str, keys: &[BlockKey]) {
        if !self.enabled() {
            return;
        }
        let Some(tag) = self.tags.read().get(instance).copied() else {
            // No reader ever made a tag, so nothing is cached; and a reader
            // that makes one after this point reads the index after it too
            // (it makes the tag before its epoch snapshot and index read),
            // so it sees this change.
            return;
        };
        for &key in keys {
            let k = (tag, key);
            let shard = &self.shards[shard_of(&k)];
            let mut inner = shard.inner.write();
            inner.map.remove(&k);
            shard.epoch.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Forgets every entry of `instance` (instance removal): its name gets a
    /// fresh tag, so old entries can no longer be found, and fills in flight
    /// under the old tag land where no lookup looks.
    pub(crate) fn invalidate_instance(&self, instance: &str) {
        let mut tags = self.tags.write();
        if let Some(t) = tags.get_mut(instance) {
            *t = self.next_tag.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Entries held (for tests and metrics).
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.inner.read().map.len()).sum()
    }
}

impl ShardMap {
    fn insert(&mut self, k: Key, location: Arc<CacheLocation>, now_ms: u64, cap: usize) {
        let entry = Entry {
            location,
            referenced: AtomicBool::new(false),
            filled_ms: now_ms,
        };
        if self.map.insert(k, entry).is_some() {
            // Replaced in place: it keeps its place on the circle.
            return;
        }
        self.ring.push_back(k);
        while self.map.len() > cap {
            self.evict_one();
        }
        if self.ring.len() > cap.saturating_mul(2).max(16) {
            let map = &self.map;
            self.ring.retain(|k| map.contains_key(k));
        }
    }

    /// CLOCK: advance the hand (the ring's front) past referenced entries,
    /// clearing their flags, and evict the first unreferenced one.
    fn evict_one(&mut self) {
        // Two turns at most: after one, every flag passed is clear.
        let bound = self.ring.len().saturating_mul(2);
        for _ in 0..bound {
            let Some(k) = self.ring.pop_front() else {
                return;
            };
            let Some(e) = self.map.get(&k) else {
                continue; // invalidated since: not on the circle any more
            };
            if e.referenced.swap(false, Ordering::Relaxed) {
                self.ring.push_back(k);
            } else {
                self.map.remove(&k);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LocationId, LocationStatus, StorageKind};

    fn loc(id: u64) -> Arc<CacheLocation> {
        Arc::new(CacheLocation {
            id: LocationId(id),
            storage: "s".into(),
            kind: StorageKind::FilePool,
            status: LocationStatus::Serving,
            specs: Vec::new(),
        })
    }

    fn get(c: &SearchCache, inst: &str, k: u64, now: u64) -> Option<u64> {
        let mut out = vec![None];
        c.lookup(c.tag(inst), &[BlockKey(k)], &[0], now, &mut out);
        out[0].take().map(|l| l.id.0)
    }

    #[test]
    fn fill_lookup_invalidate() {
        let c = SearchCache::new(1024, None);
        let t = c.tag("a");
        let e = c.epochs();
        c.fill(
            t,
            &e,
            0,
            vec![(BlockKey(1), loc(10)), (BlockKey(2), loc(20))],
        );
        assert_eq!(get(&c, "a", 1, 0), Some(10));
        assert_eq!(get(&c, "b", 1, 0), None);
        c.invalidate("a", &[BlockKey(1)]);
        assert_eq!(get(&c, "a", 1, 0), None);
        assert_eq!(get(&c, "a", 2, 0), Some(20));
        c.invalidate_instance("a");
        assert_eq!(get(&c, "a", 2, 0), None);
    }

    #[test]
    fn fill_after_invalidation_is_dropped() {
        let c = SearchCache::new(1024, None);
        let t = c.tag("a");
        let e = c.epochs();
        c.invalidate("a", &[BlockKey(1)]);
        c.fill(t, &e, 0, vec![(BlockKey(1), loc(10))]);
        assert_eq!(get(&c, "a", 1, 0), None);
    }

    #[test]
    fn ttl_expires() {
        let c = SearchCache::new(1024, Some(Duration::from_millis(5)));
        let t = c.tag("a");
        c.fill(t, &c.epochs(), 100, vec![(BlockKey(1), loc(10))]);
        assert_eq!(get(&c, "a", 1, 105), Some(10));
        assert_eq!(get(&c, "a", 1, 106), None);
    }

    #[test]
    fn bounded_and_clock_keeps_referenced() {
        let c = SearchCache::new(SHARDS * 4, None);
        let t = c.tag("a");
        c.fill(t, &c.epochs(), 0, vec![(BlockKey(0), loc(0))]);
        for k in 1..10_000u64 {
            // Key 0 is read between fills, so CLOCK keeps giving it a
            // second chance.
            assert_eq!(get(&c, "a", 0, 0), Some(0), "after {k} fills");
            c.fill(t, &c.epochs(), 0, vec![(BlockKey(k), loc(k))]);
        }
        assert!(c.len() <= SHARDS * 4);
    }

    #[test]
    fn disabled_stores_nothing() {
        let c = SearchCache::new(0, None);
        let t = c.tag("a");
        c.fill(t, &c.epochs(), 0, vec![(BlockKey(1), loc(10))]);
        assert_eq!(get(&c, "a", 1, 0), None);
        assert_eq!(c.len(), 0);
    }
}
