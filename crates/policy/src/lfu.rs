//! Least frequently used, ties broken by recency: the least recently used
//! of the least used keys goes first. A key's count starts at 1 when it
//! enters the tier and is forgotten when it leaves.
//!
//! O(1) per operation (Shah, Mitra and Matani's LFU): keys with the same
//! count share a bucket, a list whose order is the order of their last
//! use, and the buckets form a chain by ascending count. A use moves a key
//! to the bucket of the next count, creating it beside its own if needed;
//! an empty bucket leaves the chain. A victim scan walks the buckets from
//! the lowest count, each from its oldest key.

use crate::key::NIL;
use crate::lists::Lists;
use crate::{EvictionPolicy, PolicyKey, PolicyKind, Use, Verdict};

/// One bucket: its count and its neighbours in the chain (list numbers).
#[derive(Debug, Clone, Copy)]
struct Bucket {
    count: u64,
    lower: u32,
    higher: u32,
}

/// LFU.
#[derive(Debug)]
pub struct Lfu<K: PolicyKey> {
    lists: Lists<K>,
    /// By list number.
    buckets: Vec<Bucket>,
    lowest: u32,
    len: usize,
}

impl<K: PolicyKey> Default for Lfu<K> {
    fn default() -> Self {
        Self {
            lists: Lists::new(0),
            buckets: Vec::new(),
            lowest: NIL,
            len: 0,
        }
    }
}

impl<K: PolicyKey> Lfu<K> {
    /// Uses counted for `key`, if tracked.
    pub fn uses(&self, key: K) -> Option<u64> {
        self.lists
            .list_of(key)
            .map(|b| self.buckets[b as usize].count)
    }

    /// A new empty bucket for `count` between `lower` and `higher`.
    fn open(&mut self, count: u64, lower: u32, higher: u32) -> u32 {
        let b = self.lists.add_list();
        let bucket = Bucket {
            count,
            lower,
            higher,
        };
        match self.buckets.get_mut(b as usize) {
            Some(slot) => *slot = bucket,
            None => self.buckets.push(bucket),
        }
        if lower == NIL {
            self.lowest = b;
        } else {
            self.buckets[lower as usize].higher = b;
        }
        if higher != NIL {
            self.buckets[higher as usize].lower = b;
        }
        b
    }

    /// Takes bucket `b` out of the chain if it is empty.
    fn close_if_empty(&mut self, b: u32) {
        if self.lists.len(b) > 0 {
            return;
        }
        let Bucket { lower, higher, .. } = self.buckets[b as usize];
        if lower == NIL {
            self.lowest = higher;
        } else {
            self.buckets[lower as usize].higher = higher;
        }
        if higher != NIL {
            self.buckets[higher as usize].lower = lower;
        }
        self.lists.drop_list(b);
    }

    fn take_out(&mut self, slot: u32) {
        let b = self.lists.list_at(slot);
        self.lists.remove_slot(slot);
        self.len -= 1;
        self.close_if_empty(b);
    }
}

impl<K: PolicyKey> EvictionPolicy<K> for Lfu<K> {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Lfu
    }

    fn insert(&mut self, key: K, _u: &Use) {
        if self.contains(key) {
            self.remove(key);
        }
        let first = if self.lowest != NIL && self.buckets[self.lowest as usize].count == 1 {
            self.lowest
        } else {
            self.open(1, NIL, self.lowest)
        };
        self.lists.push_newest(key, first, 0);
        self.len += 1;
    }

    fn access(&mut self, key: K, _u: &Use) {
        let Some(slot) = self.lists.slot(key) else {
            return;
        };
        let b = self.lists.list_at(slot);
        let Bucket { count, higher, .. } = self.buckets[b as usize];
        let next = count.saturating_add(1);
        let to = if higher != NIL && self.buckets[higher as usize].count == next {
            higher
        } else if next == count {
            b
        } else {
            self.open(next, b, higher)
        };
        self.lists.move_newest(slot, to);
        self.close_if_empty(b);
    }

    fn remove(&mut self, key: K) {
        if let Some(slot) = self.lists.slot(key) {
            self.take_out(slot);
        }
    }

    fn victim(&mut self, _now: u64, eligible: &mut dyn FnMut(K) -> Verdict) -> Option<K> {
        let mut b = self.lowest;
        while b != NIL {
            if let Some(slot) = self.lists.find_oldest(b, eligible).ok()? {
                let key = self.lists.key(slot);
                self.take_out(slot);
                return Some(key);
            }
            b = self.buckets[b as usize].higher;
        }
        None
    }

    fn coldest(&self, visit: &mut dyn FnMut(K) -> Verdict) {
        let mut b = self.lowest;
        while b != NIL && !self.lists.visit_oldest(b, visit) {
            b = self.buckets[b as usize].higher;
        }
    }

    fn contains(&self, key: K) -> bool {
        self.lists.slot(key).is_some()
    }

    fn len(&self) -> usize {
        self.len
    }
}
