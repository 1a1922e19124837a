//! Keys and how a policy finds its entry for one.
//!
//! Every policy keeps its entries in a slab of nodes addressed by a `u32`
//! slot (see `lists`), and needs `key -> slot`. The block manager's keys are
//! 128-bit block hashes, found through a hash map; the optimizer's are
//! dense `u32` ids handed out by its replay, and the memory tier's are slot
//! indices, both found through a flat vector. [`PolicyKey`] picks the map
//! for each key type, so one implementation of each policy serves all
//! three without a hash lookup where none is needed.

use std::fmt::Debug;
use std::hash::Hash;

use kvtier_core::BlockHash;

/// No slot.
pub(crate) const NIL: u32 = u32::MAX;

/// A key a policy can rank.
pub trait PolicyKey: Copy + Eq + Hash + Debug + Send + 'static {
    /// The `key -> slot` map used for this key type.
    type Index: SlotIndex<Self>;
}

/// Finds the slot of a key.
pub trait SlotIndex<K>: Default + Debug + Send {
    /// The slot of `key`, if it has one.
    fn get(&self, key: K) -> Option<u32>;
    /// Records that `key` lives in `slot`.
    fn set(&mut self, key: K, slot: u32);
    /// Forgets `key`.
    fn clear(&mut self, key: K);
}

/// A hash map from key to slot, for sparse keys such as block hashes.
#[derive(Debug)]
pub struct HashIndex<K>(hashbrown::HashMap<K, u32>);

impl<K: Eq + Hash> PartialEq for HashIndex<K> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl<K> Default for HashIndex<K> {
    fn default() -> Self {
        Self(hashbrown::HashMap::new())
    }
}

impl<K: Eq + Hash + Copy + Debug + Send> SlotIndex<K> for HashIndex<K> {
    #[inline]
    fn get(&self, key: K) -> Option<u32> {
        self.0.get(&key).copied()
    }

    #[inline]
    fn set(&mut self, key: K, slot: u32) {
        self.0.insert(key, slot);
    }

    #[inline]
    fn clear(&mut self, key: K) {
        self.0.remove(&key);
    }
}

/// A vector indexed by the key itself, for dense keys (replay ids): a
/// lookup is one load.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DenseIndex(Vec<u32>);

impl DenseIndex {
    #[inline]
    fn at(&self, i: usize) -> Option<u32> {
        self.0.get(i).copied().filter(|s| *s != NIL)
    }

    #[inline]
    fn put(&mut self, i: usize, slot: u32) {
        if self.0.len() <= i {
            let n = (i + 1).max(self.0.len() * 2).max(1024);
            self.0.resize(n, NIL);
        }
        self.0[i] = slot;
    }
}

impl SlotIndex<u32> for DenseIndex {
    #[inline]
    fn get(&self, key: u32) -> Option<u32> {
        self.at(key as usize)
    }

    #[inline]
    fn set(&mut self, key: u32, slot: u32) {
        self.put(key as usize, slot);
    }

    #[inline]
    fn clear(&mut self, key: u32) {
        if let Some(s) = self.0.get_mut(key as usize) {
            *s = NIL;
        }
    }
}

impl SlotIndex<usize> for DenseIndex {
    #[inline]
    fn get(&self, key: usize) -> Option<u32> {
        self.at(key)
    }

    #[inline]
    fn set(&mut self, key: usize, slot: u32) {
        self.put(key, slot);
    }

    #[inline]
    fn clear(&mut self, key: usize) {
        if let Some(s) = self.0.get_mut(key) {
            *s = NIL;
        }
    }
}

impl PolicyKey for BlockHash {
    type Index = HashIndex<BlockHash>;
}

impl PolicyKey for u128 {
    type Index = HashIndex<u128>;
}

impl PolicyKey for u64 {
    type Index = HashIndex<u64>;
}

impl PolicyKey for u32 {
    type Index = DenseIndex;
}

impl PolicyKey for usize {
    type Index = DenseIndex;
}
