//! A set of block hashes kept in insertion order, oldest first.
//!
//! The building block of every list-shaped policy: LRU's recency list,
//! ARC's four lists, S3-FIFO's three queues. Each key carries a sequence
//! number from a counter; a `BTreeMap` by sequence gives the order and a
//! `HashMap` by key finds an entry, so pushing, touching and removing cost
//! `O(log n)` and a victim scan walks from the oldest end, skipping keys the
//! pool says may not go.

use std::collections::{BTreeMap, HashMap};

use kvtier_core::BlockHash;

/// Hashes in the order they were last pushed or touched.
#[derive(Debug, Default, Clone)]
pub struct OrderedKeys {
    next_seq: u64,
    by_seq: BTreeMap<u64, BlockHash>,
    seq_of: HashMap<BlockHash, u64>,
}

impl OrderedKeys {
    /// Adds `key` as the newest, or makes it the newest if present.
    pub fn push_newest(&mut self, key: BlockHash) {
        self.remove(key);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.by_seq.insert(seq, key);
        self.seq_of.insert(key, seq);
    }

    /// Takes `key` out; whether it was present.
    pub fn remove(&mut self, key: BlockHash) -> bool {
        match self.seq_of.remove(&key) {
            Some(seq) => {
                self.by_seq.remove(&seq);
                true
            }
            None => false,
        }
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: BlockHash) -> bool {
        self.seq_of.contains_key(&key)
    }

    /// Takes the oldest key out.
    pub fn pop_oldest(&mut self) -> Option<BlockHash> {
        let (_, key) = self.by_seq.pop_first()?;
        self.seq_of.remove(&key);
        Some(key)
    }

    /// Keys, oldest first.
    pub fn iter_oldest(&self) -> impl Iterator<Item = BlockHash> + '_ {
        self.by_seq.values().copied()
    }

    /// The oldest key whose sequence is at least `from`, with the sequence
    /// to resume after it; lets a scan continue while the set changes.
    pub fn next_from(&self, from: u64) -> Option<(u64, BlockHash)> {
        self.by_seq.range(from..).next().map(|(s, k)| (*s, *k))
    }

    /// Removes and returns the oldest key for which `eligible` holds.
    pub fn take_oldest_where(
        &mut self,
        eligible: &mut dyn FnMut(BlockHash) -> bool,
    ) -> Option<BlockHash> {
        let key = self.iter_oldest().find(|k| eligible(*k))?;
        self.remove(key);
        Some(key)
    }

    /// Keys present.
    pub fn len(&self) -> usize {
        self.seq_of.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.seq_of.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_and_touches() {
        let k = |i| BlockHash(i);
        let mut o = OrderedKeys::default();
        for i in 0..4 {
            o.push_newest(k(i));
        }
        o.push_newest(k(1));
        assert_eq!(
            o.iter_oldest().collect::<Vec<_>>(),
            [k(0), k(2), k(3), k(1)]
        );
        assert_eq!(o.take_oldest_where(&mut |h| h.0 % 2 == 1), Some(k(3)));
        assert_eq!(o.pop_oldest(), Some(k(0)));
        assert_eq!(o.len(), 2);
        assert!(!o.remove(k(9)));
    }
}
