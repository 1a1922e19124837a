//! [`Book`]: the owner's private bookkeeping of slots: which key lives where,
//! free slots, reference counts, pins, persistence, and the eviction order.
//!
//! Pure data: no shared memory, no locking. The tier keeps one `Book` behind
//! its lock and mirrors every visibility change into the shared slot table.
//!
//! A slot is in one of four states:
//!
//! ```text
//!            claim                publish
//!   Free ------------> Filling -------------> Resident
//!    ^  <------------     |                     |  |
//!    |     abandon        |                     |  | remove / evict
//!    |                    |                     |  v   (refs == 0)
//!    +--------------------+---------------------+--+---> Free
//!    |                                             |
//!    |   last ref released       remove (refs > 0) |
//!    +------------------------ Detached <----------+
//! ```
//!
//! Only `Resident` slots are in the index and the eviction policy. A
//! `Detached` slot was removed while a [`BlockRef`](crate::BlockRef) held
//! it: invisible, but not reusable until the last reference is released.

use std::collections::HashMap;
use std::sync::Arc;

use kvtier_core::{BlockHash, BlockSums};

use kvtier_policy::{EvictionPolicy, Use, Verdict};

/// The state of one slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    /// Holds nothing; on the free list.
    Free,
    /// Claimed by a put or a reservation that has not published yet.
    Filling,
    /// Holds a visible block.
    Resident,
    /// Holds a removed block that references still read.
    Detached,
}

/// What the book knows about one slot.
#[derive(Debug, Clone)]
struct SlotMeta {
    state: SlotState,
    key: BlockHash,
    /// Live [`BlockRef`](crate::BlockRef)s and in-flight copies.
    refs: u32,
    /// Counted pins; a pinned block is never evicted.
    pins: u32,
    /// A copy exists in a lower tier, so eviction loses nothing.
    persisted: bool,
    /// The checksums the block was stored with (private: shared memory can
    /// be scribbled on by other processes, this copy cannot).
    sums: Option<Arc<BlockSums>>,
}

impl SlotMeta {
    const FREE: Self = Self {
        state: SlotState::Free,
        key: BlockHash(0),
        refs: 0,
        pins: 0,
        persisted: false,
        sums: None,
    };

    fn evictable(&self) -> bool {
        self.state == SlotState::Resident && self.pins == 0 && self.refs == 0 && self.persisted
    }
}

/// The outcome of [`Book::claim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// `slot` is now `Filling` for the caller; `evicted` names the block
    /// evicted to make room, if one was.
    Slot {
        /// The claimed slot.
        slot: usize,
        /// The block evicted from it.
        evicted: Option<BlockHash>,
    },
    /// The key is already resident (and was touched).
    AlreadyPresent,
    /// No slot is free and no block may be evicted.
    Full,
}

/// A resident block handed out with a reference taken.
#[derive(Debug, Clone)]
pub(crate) struct Acquired {
    /// Its slot.
    pub slot: usize,
    /// Its key.
    pub key: BlockHash,
    /// Its checksums.
    pub sums: Arc<BlockSums>,
}

/// The owner's bookkeeping; see the module docs.
pub(crate) struct Book {
    index: HashMap<BlockHash, u32>,
    slots: Vec<SlotMeta>,
    /// Free slots, used last-in first-out (a recently freed slot is likely
    /// still in cache and mapped).
    free: Vec<u32>,
    /// The arena's eviction order over slots; `None` when its owner evicts
    /// (the node's block manager): no victim, no demotion candidate.
    policy: Option<Box<dyn EvictionPolicy<usize>>>,
    /// How many of the coldest blocks `claim` examines for a victim.
    scan_limit: usize,
    /// Resident blocks with at least one pin.
    pinned: usize,
}

impl Book {
    /// A book of `slots` free slots ordered by `policy`.
    pub(crate) fn new(
        slots: usize,
        policy: Option<Box<dyn EvictionPolicy<usize>>>,
        scan_limit: usize,
    ) -> Self {
        Self {
            index: HashMap::with_capacity(slots),
            slots: vec![SlotMeta::FREE; slots],
            // Reversed so slot 0 is handed out first.
            free: (0..slots as u32).rev().collect(),
            policy,
            scan_limit,
            pinned: 0,
        }
    }

    /// A book of `slots` slots, ordered by `policy`, whose `resident`
    /// slots hold the blocks an adopted arena kept (slot, key, sums: each
    /// unpinned, unreferenced, not persisted). Of the free slots, those in
    /// `last` are handed out after every other: a client that was filling
    /// one when its owner died may still be writing it.
    pub(crate) fn adopting(
        slots: usize,
        policy: Option<Box<dyn EvictionPolicy<usize>>>,
        scan_limit: usize,
        resident: Vec<(usize, BlockHash, Arc<BlockSums>)>,
        last: &[usize],
    ) -> Self {
        let mut book = Self::new(slots, policy, scan_limit);
        for (slot, key, sums) in resident {
            book.slots[slot] = SlotMeta {
                state: SlotState::Resident,
                key,
                sums: Some(sums),
                ..SlotMeta::FREE
            };
            book.index.insert(key, slot as u32);
            if let Some(p) = &mut book.policy {
                p.insert(slot, &Use::at(0));
            }
        }
        let mut late = vec![false; slots];
        for &s in last {
            late[s] = true;
        }
        let free = |s: &u32| book.slots[*s as usize].state == SlotState::Free;
        // `claim` pops from the end: the late slots go first in the vector.
        let (mut order, rest): (Vec<u32>, Vec<u32>) = (0..slots as u32)
            .rev()
            .filter(free)
            .partition(|s| late[*s as usize]);
        order.extend(rest);
        book.free = order;
        book
    }

    /// Sets how many of the coldest blocks a claim examines for a victim.
    pub(crate) fn set_scan_limit(&mut self, limit: usize) {
        self.scan_limit = limit.max(1);
    }

    /// Claims a slot for `key`: a free one, else the policy's coldest
    /// evictable block's. A resident `key` is touched instead.
    pub(crate) fn claim(&mut self, key: BlockHash) -> Claim {
        if let Some(&slot) = self.index.get(&key) {
            self.touch(slot as usize);
            return Claim::AlreadyPresent;
        }
        let (slot, evicted) = match self.free.pop() {
            Some(slot) => (slot as usize, None),
            None => {
                let Some(victim) = self.victim(self.scan_limit) else {
                    return Claim::Full;
                };
                let key = self.slots[victim].key;
                self.unindex(victim);
                (victim, Some(key))
            }
        };
        self.slots[slot] = SlotMeta {
            state: SlotState::Filling,
            key,
            ..SlotMeta::FREE
        };
        Claim::Slot { slot, evicted }
    }

    /// Makes a `Filling` slot resident as `key`. Returns false (and frees the
    /// slot) when `key` became resident elsewhere meanwhile.
    pub(crate) fn publish(&mut self, slot: usize, key: BlockHash, sums: Arc<BlockSums>) -> bool {
        debug_assert_eq!(self.slots[slot].state, SlotState::Filling);
        if let Some(&there) = self.index.get(&key) {
            self.touch(there as usize);
            self.free_slot(slot);
            return false;
        }
        self.slots[slot] = SlotMeta {
            state: SlotState::Resident,
            key,
            sums: Some(sums),
            ..SlotMeta::FREE
        };
        self.index.insert(key, slot as u32);
        if let Some(p) = &mut self.policy {
            p.insert(slot, &Use::at(0));
        }
        true
    }

    /// Frees a `Filling` slot without publishing it.
    pub(crate) fn abandon(&mut self, slot: usize) {
        debug_assert_eq!(self.slots[slot].state, SlotState::Filling);
        self.free_slot(slot);
    }

    /// Takes a reference on resident `key` and touches it.
    pub(crate) fn acquire(&mut self, key: BlockHash) -> Option<Acquired> {
        let slot = *self.index.get(&key)? as usize;
        self.touch(slot);
        Some(self.take_ref(slot))
    }

    fn take_ref(&mut self, slot: usize) -> Acquired {
        let m = &mut self.slots[slot];
        m.refs += 1;
        Acquired {
            slot,
            key: m.key,
            // Resident and detached slots always have sums; empty ones would
            // fail every verification, which is the safe way to be wrong.
            sums: m.sums.clone().unwrap_or_else(|| {
                Arc::new(BlockSums {
                    block: 0,
                    layers: Vec::new(),
                })
            }),
        }
    }

    /// Takes another reference on a slot already referenced.
    pub(crate) fn add_ref(&mut self, slot: usize) {
        debug_assert!(self.slots[slot].refs > 0);
        self.slots[slot].refs += 1;
    }

    /// Drops a reference; frees a `Detached` slot on its last one. Returns
    /// whether the slot was freed.
    pub(crate) fn release(&mut self, slot: usize) -> bool {
        let m = &mut self.slots[slot];
        debug_assert!(m.refs > 0);
        m.refs = m.refs.saturating_sub(1);
        if m.refs == 0 && m.state == SlotState::Detached {
            self.free_slot(slot);
            return true;
        }
        false
    }

    /// Makes resident `key` invisible. Its slot is freed now, or when its
    /// last reference goes. Returns the slot (whose shared entry the caller
    /// clears).
    pub(crate) fn remove(&mut self, key: BlockHash) -> Option<usize> {
        let slot = *self.index.get(&key)? as usize;
        self.unindex(slot);
        if self.slots[slot].refs == 0 {
            self.free_slot(slot);
        } else {
            let m = &mut self.slots[slot];
            m.state = SlotState::Detached;
            m.pins = 0;
            m.persisted = false;
        }
        Some(slot)
    }

    /// [`remove`](Self::remove), only if `key` still lives in `slot`.
    pub(crate) fn remove_if_in(&mut self, key: BlockHash, slot: usize) -> bool {
        self.index.get(&key) == Some(&(slot as u32)) && self.remove(key).is_some()
    }

    /// Takes a pin on resident `key`.
    pub(crate) fn pin(&mut self, key: BlockHash) -> bool {
        let Some(m) = self.resident_mut(key) else {
            return false;
        };
        m.pins += 1;
        if m.pins == 1 {
            self.pinned += 1;
        }
        true
    }

    /// Drops a pin on resident `key`; false if it is not resident or not
    /// pinned.
    pub(crate) fn unpin(&mut self, key: BlockHash) -> bool {
        let Some(m) = self.resident_mut(key) else {
            return false;
        };
        if m.pins == 0 {
            return false;
        }
        m.pins -= 1;
        if m.pins == 0 {
            self.pinned -= 1;
        }
        true
    }

    /// Records whether resident `key` has a copy in a lower tier.
    pub(crate) fn set_persisted(&mut self, key: BlockHash, persisted: bool) -> bool {
        match self.resident_mut(key) {
            Some(m) => {
                m.persisted = persisted;
                true
            }
            None => false,
        }
    }

    /// Up to `max` resident blocks that are neither persisted nor pinned,
    /// coldest first, each with a reference taken.
    pub(crate) fn demotion_candidates(&mut self, max: usize) -> Vec<Acquired> {
        let mut picked: Vec<usize> = Vec::new();
        if max == 0 {
            return Vec::new();
        }
        let slots = &self.slots;
        if let Some(p) = &self.policy {
            p.coldest(&mut |s| {
                let m = &slots[s];
                if m.state == SlotState::Resident && !m.persisted && m.pins == 0 {
                    picked.push(s);
                }
                if picked.len() >= max {
                    Verdict::Stop
                } else {
                    Verdict::Skip
                }
            });
        }
        picked.into_iter().map(|s| self.take_ref(s)).collect()
    }

    /// Evicts up to `n` evictable blocks, coldest first. Returns their slots
    /// and keys.
    pub(crate) fn evict(&mut self, n: usize) -> Vec<(usize, BlockHash)> {
        let mut victims = Vec::new();
        if n == 0 {
            return victims;
        }
        while victims.len() < n {
            let Some(slot) = self.victim(usize::MAX) else {
                break;
            };
            victims.push((slot, self.slots[slot].key));
            self.unindex(slot);
            self.free_slot(slot);
        }
        victims
    }

    /// A use of resident `slot`.
    fn touch(&mut self, slot: usize) {
        if let Some(p) = &mut self.policy {
            p.access(slot, &Use::at(0));
        }
    }

    /// The policy's coldest evictable slot among the first `scan_limit` it
    /// offers, taken out of the policy (the caller unindexes it). Bounding
    /// the scan keeps a claim O(1) when many cold blocks are pinned or not
    /// yet persisted; a block past the bound is not found and the arena
    /// answers full.
    fn victim(&mut self, scan_limit: usize) -> Option<usize> {
        let slots = &self.slots;
        let mut scans_left = scan_limit;
        self.policy.as_mut()?.victim(0, &mut |s| {
            if scans_left == 0 {
                return Verdict::Stop;
            }
            scans_left -= 1;
            slots.get(s).is_some_and(SlotMeta::evictable).into()
        })
    }

    /// Whether `key` is resident.
    pub(crate) fn contains(&self, key: BlockHash) -> bool {
        self.index.contains_key(&key)
    }

    /// The slot of resident `key` (not a use).
    pub(crate) fn slot_of(&self, key: BlockHash) -> Option<usize> {
        self.index.get(&key).map(|s| *s as usize)
    }

    /// Resident keys, in no particular order.
    pub(crate) fn keys(&self) -> Vec<BlockHash> {
        self.index.keys().copied().collect()
    }

    /// Number of resident blocks.
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// Number of free slots.
    pub(crate) fn free_len(&self) -> usize {
        self.free.len()
    }

    /// Resident blocks with at least one pin.
    pub(crate) fn pinned(&self) -> usize {
        self.pinned
    }

    /// The state of `slot` (for tests and assertions).
    #[cfg(test)]
    pub(crate) fn state(&self, slot: usize) -> SlotState {
        self.slots[slot].state
    }

    fn resident_mut(&mut self, key: BlockHash) -> Option<&mut SlotMeta> {
        let slot = *self.index.get(&key)? as usize;
        Some(&mut self.slots[slot])
    }

    /// Takes resident `slot` out of the index and the policy.
    fn unindex(&mut self, slot: usize) {
        let m = &self.slots[slot];
        debug_assert_eq!(m.state, SlotState::Resident);
        if m.pins > 0 {
            self.pinned -= 1;
        }
        self.index.remove(&m.key);
        if let Some(p) = &mut self.policy {
            p.remove(slot);
        }
    }

    fn free_slot(&mut self, slot: usize) {
        self.slots[slot] = SlotMeta::FREE;
        self.free.push(slot as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_policy::{PolicyConfig, PolicyKind};

    fn sums() -> Arc<BlockSums> {
        Arc::new(BlockSums {
            block: 0,
            layers: vec![],
        })
    }

    fn book(n: usize) -> Book {
        let lru = PolicyConfig::of(PolicyKind::Lru).build::<usize>(n).unwrap();
        Book::new(n, Some(lru), usize::MAX)
    }

    fn fill(b: &mut Book, k: u128) -> usize {
        let Claim::Slot { slot, .. } = b.claim(BlockHash(k)) else {
            panic!("no slot for {k}");
        };
        assert!(b.publish(slot, BlockHash(k), sums()));
        slot
    }

    #[test]
    fn detached_slots_wait_for_their_last_reference() {
        let mut b = book(2);
        let s = fill(&mut b, 1);
        let a = b.acquire(BlockHash(1)).unwrap();
        b.add_ref(a.slot);
        assert_eq!(b.remove(BlockHash(1)), Some(s));
        assert_eq!(b.state(s), SlotState::Detached);
        assert!(!b.contains(BlockHash(1)));
        assert_eq!(b.free_len(), 1);
        assert!(!b.release(s));
        assert!(b.release(s));
        assert_eq!(b.state(s), SlotState::Free);
        assert_eq!(b.free_len(), 2);
    }

    #[test]
    fn an_adopted_book_holds_its_blocks_and_hands_late_slots_out_last() {
        let lru = PolicyConfig::of(PolicyKind::Lru).build::<usize>(5).unwrap();
        let resident = vec![(1, BlockHash(10), sums()), (3, BlockHash(30), sums())];
        let mut b = Book::adopting(5, Some(lru), usize::MAX, resident, &[0]);
        assert_eq!((b.len(), b.free_len()), (2, 3));
        assert!(b.contains(BlockHash(10)) && b.contains(BlockHash(30)));
        assert_eq!(b.state(3), SlotState::Resident);
        let claimed: Vec<usize> = (100..103)
            .map(|k| match b.claim(BlockHash(k)) {
                Claim::Slot { slot, .. } => slot,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(claimed, vec![2, 4, 0]);
        // Adopted blocks are ordinary residents: persisted, they go.
        b.set_persisted(BlockHash(10), true);
        assert_eq!(b.evict(5), vec![(1, BlockHash(10))]);
    }

    #[test]
    fn racing_publish_of_one_key_keeps_the_first() {
        let mut b = book(2);
        let Claim::Slot { slot: s1, .. } = b.claim(BlockHash(5)) else {
            panic!()
        };
        let Claim::Slot { slot: s2, .. } = b.claim(BlockHash(5)) else {
            panic!()
        };
        assert!(b.publish(s1, BlockHash(5), sums()));
        assert!(!b.publish(s2, BlockHash(5), sums()));
        assert_eq!((b.len(), b.free_len()), (1, 1));
    }

    #[test]
    fn claim_evicts_only_evictable_blocks() {
        let mut b = book(2);
        fill(&mut b, 1);
        fill(&mut b, 2);
        assert_eq!(b.claim(BlockHash(3)), Claim::Full);
        b.set_persisted(BlockHash(2), true);
        b.set_persisted(BlockHash(1), true);
        b.pin(BlockHash(1));
        assert!(matches!(
            b.claim(BlockHash(3)),
            Claim::Slot {
                evicted: Some(BlockHash(2)),
                ..
            }
        ));
        assert_eq!(b.pinned(), 1);
    }

    /// The tier's discipline under every interleaving shuttle tries: the
    /// book changes under a mutex, slot bytes are read and written outside
    /// it. A reader holding a reference must never see its slot rewritten,
    /// however removals and new fills race with it. One slot, so any reuse
    /// would have to be of the reader's slot.
    #[test]
    fn shuttle_a_referenced_slot_is_never_rewritten() {
        use shuttle::sync::atomic::AtomicU64;
        use shuttle::sync::{Arc as SArc, Mutex as SMutex};
        use std::sync::atomic::Ordering::Relaxed;

        shuttle::check_random(
            || {
                let book = SArc::new(SMutex::new(book(1)));
                let data = SArc::new([AtomicU64::new(0), AtomicU64::new(0)]);
                // Block 1 is resident and evictable; its bytes are [1, 1].
                {
                    let mut b = book.lock().unwrap();
                    let s = fill(&mut b, 1);
                    assert_eq!(s, 0);
                    b.set_persisted(BlockHash(1), true);
                }
                data[0].store(1, Relaxed);
                data[1].store(1, Relaxed);
                let writer = {
                    let (book, data) = (SArc::clone(&book), SArc::clone(&data));
                    shuttle::thread::spawn(move || {
                        for k in 2..4u64 {
                            let claim = {
                                let mut b = book.lock().unwrap();
                                b.remove(BlockHash(k as u128 - 1));
                                b.claim(BlockHash(k as u128))
                            };
                            if let Claim::Slot { slot, .. } = claim {
                                for w in data.iter() {
                                    w.store(k, Relaxed);
                                }
                                let mut b = book.lock().unwrap();
                                assert!(b.publish(slot, BlockHash(k as u128), sums()));
                                b.set_persisted(BlockHash(k as u128), true);
                            }
                        }
                    })
                };
                let held = book.lock().unwrap().acquire(BlockHash(1));
                if let Some(a) = held {
                    let seen = [data[0].load(Relaxed), data[1].load(Relaxed)];
                    assert_eq!(seen, [1, 1], "a referenced slot was rewritten");
                    book.lock().unwrap().release(a.slot);
                }
                writer.join().unwrap();
                let b = book.lock().unwrap();
                assert_eq!(b.len() + b.free_len(), 1);
            },
            3000,
        );
    }
}
