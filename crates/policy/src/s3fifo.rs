//! S3-FIFO (Yang et al., SOSP '23): a small FIFO (a tenth of the tier)
//! filters one-hit keys, a main FIFO with a small use counter holds the
//! rest, and a ghost FIFO remembers keys evicted from the small queue (at
//! most the tier's capacity).
//!
//! A new key enters the small queue, or the main queue when it is a ghost.
//! Eviction from the small queue moves a key used since it entered to the
//! main queue instead of evicting it; eviction from the main queue gives a
//! used key another round (its counter decremented). Uses are counted up
//! to 3, in the node's value.
//!
//! A key the tier may not evict now ([`Verdict::Skip`]: held, pinned, in
//! flight, or a parent under the leaf-first filter) keeps its place, so a
//! scan walks past such keys each time; under the leaf-first filter the
//! small queue holds mostly parents and that walk dominates (see
//! docs/benchmarks.md, "Trace replay speed"). Sending them round instead
//! made the order depend on every transient reason a tier has to skip a
//! key, and the optimizer stopped predicting the node.

use crate::lists::{Lists, Stopped};
use crate::{EvictionPolicy, PolicyKey, PolicyKind, Use, Verdict};

const SMALL: u32 = 0;
const MAIN: u32 = 1;
const GHOST: u32 = 2;
const MAX_USES: u64 = 3;

/// S3-FIFO.
#[derive(Debug)]
pub struct S3Fifo<K: PolicyKey> {
    capacity: usize,
    lists: Lists<K>,
}

impl<K: PolicyKey> S3Fifo<K> {
    /// S3-FIFO for a tier of `capacity` keys.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            lists: Lists::new(3),
        }
    }

    fn small_target(&self) -> usize {
        (self.capacity / 10).max(1)
    }

    /// Whether `key` sits in the main queue.
    pub fn in_main(&self, key: K) -> bool {
        self.lists.list_of(key) == Some(MAIN)
    }

    fn resident(&self, key: K) -> Option<u32> {
        self.lists
            .slot(key)
            .filter(|s| matches!(self.lists.list_at(*s), SMALL | MAIN))
    }

    /// Scans the small queue: used keys move to main, the first unused
    /// eligible one is evicted and remembered as a ghost.
    fn evict_small(
        &mut self,
        eligible: &mut dyn FnMut(K) -> Verdict,
    ) -> Result<Option<K>, Stopped> {
        let mut next = self.lists.oldest(SMALL);
        while let Some(slot) = next {
            next = self.lists.newer(slot);
            let key = self.lists.key(slot);
            match eligible(key) {
                Verdict::Skip => continue,
                Verdict::Stop => return Err(Stopped),
                Verdict::Evict => {}
            }
            if self.lists.value(slot) > 0 {
                self.lists.set_value(slot, 0);
                self.lists.move_newest(slot, MAIN);
                continue;
            }
            self.lists.move_newest(slot, GHOST);
            while self.lists.len(GHOST) > self.capacity {
                self.lists.pop_oldest(GHOST);
            }
            return Ok(Some(key));
        }
        Ok(None)
    }

    /// Scans the main queue: used keys get another round with one use
    /// less, the first unused eligible one is evicted. Terminates because
    /// every reinsertion lowers a counter.
    fn evict_main(&mut self, eligible: &mut dyn FnMut(K) -> Verdict) -> Result<Option<K>, Stopped> {
        let mut next = self.lists.oldest(MAIN);
        while let Some(slot) = next {
            // A key sent round again is met again after the keys newer
            // than it, or at once when it was the newest.
            next = self.lists.newer(slot);
            let key = self.lists.key(slot);
            match eligible(key) {
                Verdict::Skip => continue,
                Verdict::Stop => return Err(Stopped),
                Verdict::Evict => {}
            }
            let uses = self.lists.value(slot);
            if uses > 0 {
                self.lists.set_value(slot, uses - 1);
                self.lists.move_newest(slot, MAIN);
                next = next.or(Some(slot));
                continue;
            }
            self.lists.remove_slot(slot);
            return Ok(Some(key));
        }
        Ok(None)
    }
}

impl<K: PolicyKey> EvictionPolicy<K> for S3Fifo<K> {
    fn kind(&self) -> PolicyKind {
        PolicyKind::S3Fifo
    }

    fn insert(&mut self, key: K, _u: &Use) {
        let to = if self.lists.list_of(key) == Some(GHOST) {
            MAIN
        } else {
            SMALL
        };
        self.lists.push_newest(key, to, 0);
    }

    fn access(&mut self, key: K, _u: &Use) {
        if let Some(s) = self.resident(key) {
            let uses = (self.lists.value(s) + 1).min(MAX_USES);
            self.lists.set_value(s, uses);
        }
    }

    fn remove(&mut self, key: K) {
        if let Some(s) = self.resident(key) {
            self.lists.remove_slot(s);
        }
    }

    fn victim(&mut self, _now: u64, eligible: &mut dyn FnMut(K) -> Verdict) -> Option<K> {
        let small_first = self.lists.len(SMALL) >= self.small_target() || self.lists.len(MAIN) == 0;
        if small_first {
            match self.evict_small(eligible).ok()? {
                Some(k) => Some(k),
                None => self.evict_main(eligible).ok()?,
            }
        } else {
            match self.evict_main(eligible).ok()? {
                Some(k) => Some(k),
                None => self.evict_small(eligible).ok()?,
            }
        }
    }

    fn coldest(&self, visit: &mut dyn FnMut(K) -> Verdict) {
        let _ = [SMALL, MAIN]
            .iter()
            .any(|l| self.lists.visit_oldest(*l, visit));
    }

    fn contains(&self, key: K) -> bool {
        self.resident(key).is_some()
    }

    fn len(&self) -> usize {
        self.lists.len(SMALL) + self.lists.len(MAIN)
    }
}
