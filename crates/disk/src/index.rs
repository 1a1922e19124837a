//! The in-memory index: block key -> where its slot is and its checksum.
//!
//! # Memory
//!
//! The bar is 64 bytes of RAM per block *including* hash-table overhead. An
//! entry is 32 bytes: the 128-bit key as two `u64` (so the tuple is 8-byte
//! aligned, not 16) and a value of two `u64`: the packed location and the
//! block checksum. hashbrown adds one control byte per bucket and keeps at
//! most 7/8 of its power-of-two buckets full, so a table sized naively can
//! land anywhere between 33 x 8/7 = 38 and 33 x 16/7 = 75 bytes per entry.
//! [`Index::with_capacity`] therefore chooses the *number* of shards (any
//! integer, not a power of two) so that each shard's share of the capacity,
//! plus a margin of four standard deviations for uneven hashing, sits just
//! under a power-of-two bucket count. Tables are sized once, for the tier's
//! slot count, and never grow in practice (a shard that overflows its margin
//! would grow, which costs memory but nothing else).
//!
//! # Packed location
//!
//! ```text
//! bit 63..56  dir      (8 bits: at most 255 directories)
//! bit 55..24  region   (32 bits)
//! bit 23..1   slot     (23 bits: at most 8M slots per region)
//! bit 0       hot      (read since written; drives re-insertion)
//! ```
//!
//! # Locking
//!
//! Each shard is a `parking_lot::Mutex` over a hashbrown map; a key's shard
//! is picked from a mixed fold of the key, and its bucket from a second,
//! independent mix, so shard choice and bucket choice do not correlate and
//! opaque ids that are small integers still spread.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};

use hashbrown::HashMap;
use kvtier_core::BlockHash;
use parking_lot::Mutex;

/// Where a block's slot is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Loc {
    /// Directory index.
    pub dir: u8,
    /// Region index in the directory's data file.
    pub region: u32,
    /// Slot index in the region.
    pub slot: u32,
}

/// One index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Where the slot is.
    pub loc: Loc,
    /// The block checksum.
    pub sum: u64,
    /// Whether the block was read since it was written.
    pub hot: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Packed {
    loc: u64,
    sum: u64,
}

impl Packed {
    fn pack(e: Entry) -> Self {
        debug_assert!(e.loc.slot < 1 << 23);
        Packed {
            loc: (e.loc.dir as u64) << 56
                | (e.loc.region as u64) << 24
                | ((e.loc.slot as u64) & 0x7f_ffff) << 1
                | e.hot as u64,
            sum: e.sum,
        }
    }
    fn unpack(self) -> Entry {
        Entry {
            loc: Loc {
                dir: (self.loc >> 56) as u8,
                region: (self.loc >> 24) as u32,
                slot: ((self.loc >> 1) & 0x7f_ffff) as u32,
            },
            sum: self.sum,
            hot: self.loc & 1 == 1,
        }
    }
    fn same_place(self, loc: Loc) -> bool {
        self.loc >> 1
            == Packed::pack(Entry {
                loc,
                sum: 0,
                hot: false,
            })
            .loc >> 1
    }
    fn in_region(self, dir: u8, region: u32) -> bool {
        self.loc >> 24 == ((dir as u64) << 32 | region as u64)
    }
}

/// splitmix64's finaliser: a cheap, well-mixing bijection on u64.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key as stored: two u64 so the entry is 8-byte aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct IKey([u64; 2]);

impl IKey {
    fn new(key: BlockHash) -> Self {
        IKey([key.0 as u64, (key.0 >> 64) as u64])
    }
    fn key(self) -> BlockHash {
        BlockHash((self.0[1] as u128) << 64 | self.0[0] as u128)
    }
}

impl Hash for IKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(mix(self.0[0] ^ self.0[1] ^ 0x5851_f42d_4c95_7f2d));
    }
}

/// A hasher that passes the single `u64` it is given through: keys are
/// hashes already and [`IKey`] mixes them.
#[derive(Default)]
struct PassHasher(u64);

impl Hasher for PassHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = mix(self.0 ^ *b as u64);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct PassBuild;

impl BuildHasher for PassBuild {
    type Hasher = PassHasher;
    fn build_hasher(&self) -> PassHasher {
        PassHasher(0)
    }
}

type Shard = HashMap<IKey, Packed, PassBuild>;

/// The buckets hashbrown allocates for `cap` entries (its
/// `capacity_to_buckets`).
fn buckets_for(cap: usize) -> usize {
    if cap < 4 {
        4
    } else if cap < 8 {
        8
    } else {
        (cap.saturating_mul(8) / 7).next_power_of_two()
    }
}

/// Entries a shard reserves when it expects `mean`: four standard deviations
/// of a binomial share plus a little, so overflow (and growth) is rare.
fn shard_capacity(mean: f64) -> usize {
    (mean + 4.0 * mean.sqrt() + 8.0).ceil() as usize
}

/// Chooses `(shards, capacity per shard)` for `n` entries, minimising the
/// buckets allocated. Shard counts between 16 and 1024.
fn plan(n: usize) -> (usize, usize) {
    let mut best = (16, shard_capacity(n as f64 / 16.0));
    let mut best_buckets = usize::MAX;
    for s in 16..=1024usize {
        let cap = shard_capacity(n as f64 / s as f64);
        let buckets = s.saturating_mul(buckets_for(cap));
        if buckets < best_buckets {
            best = (s, cap);
            best_buckets = buckets;
        }
    }
    best
}

/// The sharded index. See the [module docs](self).
pub struct Index {
    shards: Box<[Mutex<Shard>]>,
    len: AtomicUsize,
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index")
            .field("shards", &self.shards.len())
            .field("len", &self.len())
            .finish()
    }
}

impl Index {
    /// An index sized for `n` entries.
    pub fn with_capacity(n: usize) -> Self {
        let (shards, cap) = plan(n);
        Index {
            shards: (0..shards)
                .map(|_| Mutex::new(Shard::with_capacity_and_hasher(cap, PassBuild)))
                .collect(),
            len: AtomicUsize::new(0),
        }
    }

    fn shard(&self, key: BlockHash) -> &Mutex<Shard> {
        let h = mix(key.fold64() ^ 0x9e37_79b9_7f4a_7c15);
        let i = ((h as u128 * self.shards.len() as u128) >> 64) as usize;
        &self.shards[i]
    }

    /// Number of shards.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The entry of `key`.
    pub fn get(&self, key: BlockHash) -> Option<Entry> {
        self.shard(key)
            .lock()
            .get(&IKey::new(key))
            .map(|p| p.unpack())
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: BlockHash) -> bool {
        self.shard(key).lock().contains_key(&IKey::new(key))
    }

    /// Looks `key` up and, still holding its shard's lock, lets `admit`
    /// decide whether the lookup counts (the reader pins the region there,
    /// so a reclaim that removes entries under the same lock cannot slip in
    /// between). An admitted entry is marked hot. Returns the entry as it
    /// was before marking.
    pub fn pin(&self, key: BlockHash, admit: impl FnOnce(&Entry) -> bool) -> Option<Entry> {
        let mut shard = self.shard(key).lock();
        let p = shard.get_mut(&IKey::new(key))?;
        let e = p.unpack();
        if !admit(&e) {
            return None;
        }
        p.loc |= 1;
        Some(e)
    }

    /// Inserts or replaces `key`'s entry; returns the previous one.
    pub fn insert(&self, key: BlockHash, entry: Entry) -> Option<Entry> {
        let mut shard = self.shard(key).lock();
        let old = shard.insert(IKey::new(key), Packed::pack(entry));
        if old.is_none() {
            self.len.fetch_add(1, Ordering::Relaxed);
        }
        old.map(Packed::unpack)
    }

    /// Inserts `key` unless it is present; returns whether it inserted.
    pub fn insert_if_absent(&self, key: BlockHash, entry: Entry) -> bool {
        let mut shard = self.shard(key).lock();
        match shard.entry(IKey::new(key)) {
            hashbrown::hash_map::Entry::Occupied(_) => false,
            hashbrown::hash_map::Entry::Vacant(v) => {
                v.insert(Packed::pack(entry));
                self.len.fetch_add(1, Ordering::Relaxed);
                true
            }
        }
    }

    fn remove_where(&self, key: BlockHash, pred: impl FnOnce(Packed) -> bool) -> Option<Entry> {
        let mut shard = self.shard(key).lock();
        let ik = IKey::new(key);
        let p = *shard.get(&ik)?;
        if !pred(p) {
            return None;
        }
        shard.remove(&ik);
        self.len.fetch_sub(1, Ordering::Relaxed);
        Some(p.unpack())
    }

    /// Removes `key`; returns its entry.
    pub fn remove(&self, key: BlockHash) -> Option<Entry> {
        self.remove_where(key, |_| true)
    }

    /// Removes `key` only if its entry still points at `loc` (a newer copy
    /// elsewhere is kept).
    pub fn remove_if_at(&self, key: BlockHash, loc: Loc) -> Option<Entry> {
        self.remove_where(key, |p| p.same_place(loc))
    }

    /// Removes `key` only if its entry points into `region` of `dir`.
    pub fn remove_if_in_region(&self, key: BlockHash, dir: u8, region: u32) -> Option<Entry> {
        self.remove_where(key, |p| p.in_region(dir, region))
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every entry of directory `dir`, shard by shard (each shard is a
    /// consistent snapshot; the whole is not, which the checkpoint protocol
    /// allows for).
    pub fn entries_of_dir(&self, dir: u8) -> Vec<(BlockHash, Entry)> {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            let s = s.lock();
            out.extend(
                s.iter()
                    .map(|(k, p)| (k.key(), p.unpack()))
                    .filter(|(_, e)| e.loc.dir == dir),
            );
        }
        out
    }

    /// Entries per region of directory `dir`, for a directory of `regions`
    /// regions: the live blocks reclaim weighs when it picks a victim.
    pub fn live_per_region(&self, dir: u8, regions: usize) -> Vec<u32> {
        let mut live = vec![0u32; regions];
        for s in self.shards.iter() {
            for p in s.lock().values() {
                let e = p.unpack();
                if e.loc.dir == dir
                    && let Some(n) = live.get_mut(e.loc.region as usize)
                {
                    *n += 1;
                }
            }
        }
        live
    }

    /// Bytes of RAM the index holds: every shard's table allocation plus the
    /// shard array.
    pub fn memory_bytes(&self) -> usize {
        let tables: usize = self.shards.iter().map(|s| s.lock().allocation_size()).sum();
        tables + std::mem::size_of_val(&*self.shards) + std::mem::size_of::<Self>()
    }

    /// Bytes of one stored entry (key + value), for documentation and tests.
    pub const ENTRY_BYTES: usize = std::mem::size_of::<(IKey, Packed)>();
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap as Model;

    fn e(dir: u8, region: u32, slot: u32, sum: u64) -> Entry {
        Entry {
            loc: Loc { dir, region, slot },
            sum,
            hot: false,
        }
    }

    #[test]
    fn entry_is_32_bytes_and_packs_losslessly() {
        assert_eq!(Index::ENTRY_BYTES, 32);
        for x in [
            e(0, 0, 0, 0),
            e(255, u32::MAX, (1 << 23) - 1, u64::MAX),
            Entry {
                hot: true,
                ..e(7, 123_456, 4321, 99)
            },
        ] {
            assert_eq!(Packed::pack(x).unpack(), x);
        }
    }

    #[test]
    fn at_most_64_bytes_per_block_at_full_capacity() {
        for n in [10_000usize, 100_000, 1_000_000, 3_000_000] {
            let idx = Index::with_capacity(n);
            let before = idx.memory_bytes();
            for i in 0..n as u128 {
                let k = BlockHash(i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835) ^ i);
                idx.insert(
                    k,
                    e((i % 4) as u8, (i / 31) as u32, (i % 31) as u32, i as u64),
                );
            }
            assert_eq!(idx.len(), n);
            let bytes = idx.memory_bytes();
            // Pre-sized: no shard grew.
            assert_eq!(bytes, before, "index grew at n = {n}");
            let per = bytes as f64 / n as f64;
            assert!(per <= 64.0, "{per} bytes per block at n = {n}");
        }
    }

    #[test]
    fn small_integer_keys_spread_over_shards() {
        let idx = Index::with_capacity(100_000);
        let mut counts = vec![0usize; idx.shard_count()];
        for i in 0..100_000u128 {
            let s = idx.shard(BlockHash(i)) as *const _;
            let pos = idx.shards.iter().position(|x| std::ptr::eq(x, s)).unwrap();
            counts[pos] += 1;
        }
        let mean = 100_000 / idx.shard_count();
        assert!(counts.iter().all(|&c| c > mean / 2 && c < mean * 2));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8, u8, u32, u32, u64),
        InsertIfAbsent(u8, u8, u32, u32),
        Remove(u8),
        RemoveIfAt(u8, u8, u32, u32),
        RemoveIfInRegion(u8, u8, u32),
        Pin(u8, bool),
        Get(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        let k = 0u8..24;
        prop_oneof![
            (k.clone(), 0u8..3, 0u32..4, 0u32..4, any::<u64>())
                .prop_map(|(k, d, r, s, c)| Op::Insert(k, d, r, s, c)),
            (k.clone(), 0u8..3, 0u32..4, 0u32..4)
                .prop_map(|(k, d, r, s)| Op::InsertIfAbsent(k, d, r, s)),
            k.clone().prop_map(Op::Remove),
            (k.clone(), 0u8..3, 0u32..4, 0u32..4)
                .prop_map(|(k, d, r, s)| Op::RemoveIfAt(k, d, r, s)),
            (k.clone(), 0u8..3, 0u32..4).prop_map(|(k, d, r)| Op::RemoveIfInRegion(k, d, r)),
            (k.clone(), any::<bool>()).prop_map(|(k, a)| Op::Pin(k, a)),
            k.prop_map(Op::Get),
        ]
    }

    fn key(k: u8) -> BlockHash {
        // High and low halves both vary, and some keys share a fold.
        BlockHash((k as u128) << 64 | (k / 2) as u128)
    }

    proptest! {
        #[test]
        fn index_matches_a_hashmap_model(ops in proptest::collection::vec(op(), 1..200)) {
            let idx = Index::with_capacity(64);
            let mut model: Model<u8, Entry> = Model::new();
            for o in ops {
                match o {
                    Op::Insert(k, d, r, s, c) => {
                        let got = idx.insert(key(k), e(d, r, s, c));
                        prop_assert_eq!(got, model.insert(k, e(d, r, s, c)));
                    }
                    Op::InsertIfAbsent(k, d, r, s) => {
                        let ins = idx.insert_if_absent(key(k), e(d, r, s, 1));
                        prop_assert_eq!(ins, !model.contains_key(&k));
                        model.entry(k).or_insert(e(d, r, s, 1));
                    }
                    Op::Remove(k) => prop_assert_eq!(idx.remove(key(k)), model.remove(&k)),
                    Op::RemoveIfAt(k, d, r, s) => {
                        let loc = Loc { dir: d, region: r, slot: s };
                        let want = match model.get(&k) {
                            Some(x) if x.loc == loc => model.remove(&k),
                            _ => None,
                        };
                        prop_assert_eq!(idx.remove_if_at(key(k), loc), want);
                    }
                    Op::RemoveIfInRegion(k, d, r) => {
                        let want = match model.get(&k) {
                            Some(x) if x.loc.dir == d && x.loc.region == r => model.remove(&k),
                            _ => None,
                        };
                        prop_assert_eq!(idx.remove_if_in_region(key(k), d, r), want);
                    }
                    Op::Pin(k, admit) => {
                        let got = idx.pin(key(k), |_| admit);
                        let want = match model.get_mut(&k) {
                            Some(x) if admit => {
                                let before = *x;
                                x.hot = true;
                                Some(before)
                            }
                            _ => None,
                        };
                        prop_assert_eq!(got, want);
                    }
                    Op::Get(k) => prop_assert_eq!(idx.get(key(k)), model.get(&k).copied()),
                }
                prop_assert_eq!(idx.len(), model.len());
            }
            for d in 0..3u8 {
                let mut got = idx.entries_of_dir(d);
                got.sort_by_key(|(k, _)| *k);
                let mut want: Vec<_> = model
                    .iter()
                    .filter(|(_, x)| x.loc.dir == d)
                    .map(|(k, x)| (key(*k), *x))
                    .collect();
                want.sort_by_key(|(k, _)| *k);
                prop_assert_eq!(got, want);
            }
        }
    }
}
