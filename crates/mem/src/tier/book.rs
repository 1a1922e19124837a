//! [`Book`]: the owner's private bookkeeping of slots: which key lives where,
//! free slots, reference counts and each block's checksums.
//!
//! Pure data: no shared memory, no locking. The tier keeps one `Book` behind
//! its lock and mirrors every visibility change into the shared slot table.
//! It has no eviction: which blocks stay is its owner's decision (the
//! node's G2 pool), so a full book answers full and only the owner removes.
//!
//! A slot is in one of four states:
//!
//! ```text
//!            claim                publish
//!   Free ------------> Filling -------------> Resident
//!    ^  <------------     |                     |  |
//!    |     abandon        |                     |  | remove
//!    |                    |                     |  v   (refs == 0)
//!    +--------------------+---------------------+--+---> Free
//!    |                                             |
//!    |   last ref released       remove (refs > 0) |
//!    +------------------------ Detached <----------+
//! ```
//!
//! Only `Resident` slots are in the index. A `Detached` slot was removed
//! while a [`BlockRef`](crate::BlockRef) held it: invisible, but not
//! reusable until the last reference is released.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use kvtier_core::{BlockHash, BlockSums};

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
    /// The checksums the block was stored with (private: shared memory can
    /// be scribbled on by other processes, this copy cannot).
    sums: Option<Arc<BlockSums>>,
}

impl SlotMeta {
    const FREE: Self = Self {
        state: SlotState::Free,
        key: BlockHash(0),
        refs: 0,
        sums: None,
    };
}

/// The outcome of [`Book::claim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// This slot is now `Filling` for the caller.
    Slot(usize),
    /// The key is already resident.
    AlreadyPresent,
    /// No slot is free.
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
}

impl Book {
    /// A book of `slots` free slots.
    pub(crate) fn new(slots: usize) -> Self {
        Self {
            index: HashMap::with_capacity(slots),
            slots: vec![SlotMeta::FREE; slots],
            // Reversed so slot 0 is handed out first.
            free: (0..slots as u32).rev().collect(),
        }
    }

    /// A book of `slots` slots whose `resident` slots hold the blocks an
    /// adopted arena kept (slot, key, sums: each unreferenced). Of the free
    /// slots, those in `last` are handed out after every other: a client
    /// that was filling one when its owner died may still be writing it.
    pub(crate) fn adopting(
        slots: usize,
        resident: Vec<(usize, BlockHash, Arc<BlockSums>)>,
        last: &[usize],
    ) -> Self {
        let mut book = Self::new(slots);
        for (slot, key, sums) in resident {
            book.slots[slot] = SlotMeta {
                state: SlotState::Resident,
                key,
                sums: Some(sums),
                ..SlotMeta::FREE
            };
            book.index.insert(key, slot as u32);
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

    /// Claims a free slot for `key`, unless `key` is resident or no slot is
    /// free.
    pub(crate) fn claim(&mut self, key: BlockHash) -> Claim {
        if self.index.contains_key(&key) {
            return Claim::AlreadyPresent;
        }
        let Some(slot) = self.free.pop() else {
            return Claim::Full;
        };
        let slot = slot as usize;
        self.slots[slot] = SlotMeta {
            state: SlotState::Filling,
            key,
            ..SlotMeta::FREE
        };
        Claim::Slot(slot)
    }

    /// Makes a `Filling` slot resident as `key`. Returns false (and frees the
    /// slot) when `key` became resident elsewhere meanwhile.
    pub(crate) fn publish(&mut self, slot: usize, key: BlockHash, sums: Arc<BlockSums>) -> bool {
        debug_assert_eq!(self.slots[slot].state, SlotState::Filling);
        // One hash lookup: mapped here, or found mapped already.
        let fresh = match self.index.entry(key) {
            Entry::Occupied(_) => false,
            Entry::Vacant(e) => {
                e.insert(slot as u32);
                true
            }
        };
        if !fresh {
            self.free_slot(slot);
            return false;
        }
        self.slots[slot] = SlotMeta {
            state: SlotState::Resident,
            key,
            sums: Some(sums),
            ..SlotMeta::FREE
        };
        true
    }

    /// Frees a `Filling` slot without publishing it.
    pub(crate) fn abandon(&mut self, slot: usize) {
        debug_assert_eq!(self.slots[slot].state, SlotState::Filling);
        self.free_slot(slot);
    }

    /// Takes a reference on resident `key`.
    pub(crate) fn acquire(&mut self, key: BlockHash) -> Option<Acquired> {
        let slot = *self.index.get(&key)? as usize;
        let m = &mut self.slots[slot];
        m.refs += 1;
        Some(Acquired {
            slot,
            key: m.key,
            // Resident slots always have sums; empty ones would fail every
            // verification, which is the safe way to be wrong.
            sums: m.sums.clone().unwrap_or_else(|| {
                Arc::new(BlockSums {
                    block: 0,
                    layers: Vec::new(),
                })
            }),
        })
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
        let slot = self.index.remove(&key)? as usize;
        if self.slots[slot].refs == 0 {
            self.free_slot(slot);
        } else {
            self.slots[slot].state = SlotState::Detached;
        }
        Some(slot)
    }

    /// [`remove`](Self::remove), only if `key` still lives in `slot`.
    pub(crate) fn remove_if_in(&mut self, key: BlockHash, slot: usize) -> bool {
        self.index.get(&key) == Some(&(slot as u32)) && self.remove(key).is_some()
    }

    /// Whether `key` is resident.
    pub(crate) fn contains(&self, key: BlockHash) -> bool {
        self.index.contains_key(&key)
    }

    /// The slot of resident `key`.
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

    /// The state of `slot` (for tests and assertions).
    #[cfg(test)]
    pub(crate) fn state(&self, slot: usize) -> SlotState {
        self.slots[slot].state
    }

    fn free_slot(&mut self, slot: usize) {
        self.slots[slot] = SlotMeta::FREE;
        self.free.push(slot as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sums() -> Arc<BlockSums> {
        Arc::new(BlockSums {
            block: 0,
            layers: vec![],
        })
    }

    fn fill(b: &mut Book, k: u128) -> usize {
        let Claim::Slot(slot) = b.claim(BlockHash(k)) else {
            panic!("no slot for {k}");
        };
        assert!(b.publish(slot, BlockHash(k), sums()));
        slot
    }

    #[test]
    fn detached_slots_wait_for_their_last_reference() {
        let mut b = Book::new(2);
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
        let resident = vec![(1, BlockHash(10), sums()), (3, BlockHash(30), sums())];
        let mut b = Book::adopting(5, resident, &[0]);
        assert_eq!((b.len(), b.free_len()), (2, 3));
        assert!(b.contains(BlockHash(10)) && b.contains(BlockHash(30)));
        assert_eq!(b.state(3), SlotState::Resident);
        let claimed: Vec<usize> = (100..103)
            .map(|k| match b.claim(BlockHash(k)) {
                Claim::Slot(slot) => slot,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(claimed, vec![2, 4, 0]);
        // Adopted blocks are ordinary residents: their owner removes them.
        assert_eq!(b.remove(BlockHash(10)), Some(1));
        assert_eq!(b.state(1), SlotState::Free);
    }

    #[test]
    fn racing_publish_of_one_key_keeps_the_first() {
        let mut b = Book::new(2);
        let Claim::Slot(s1) = b.claim(BlockHash(5)) else {
            panic!()
        };
        let Claim::Slot(s2) = b.claim(BlockHash(5)) else {
            panic!()
        };
        assert!(b.publish(s1, BlockHash(5), sums()));
        assert!(!b.publish(s2, BlockHash(5), sums()));
        assert_eq!((b.len(), b.free_len()), (1, 1));
    }

    #[test]
    fn a_full_book_answers_full_until_its_owner_removes() {
        let mut b = Book::new(2);
        fill(&mut b, 1);
        fill(&mut b, 2);
        assert_eq!(b.claim(BlockHash(3)), Claim::Full);
        assert_eq!(b.claim(BlockHash(2)), Claim::AlreadyPresent);
        assert!(b.contains(BlockHash(1)) && b.contains(BlockHash(2)));
        b.remove(BlockHash(2));
        assert!(matches!(b.claim(BlockHash(3)), Claim::Slot(_)));
    }

    /// One step of the property test.
    #[derive(Debug, Clone)]
    enum Op {
        Claim(u8),
        Publish(usize),
        Abandon(usize),
        Acquire(u8),
        Release(usize),
        Remove(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..8).prop_map(Op::Claim),
            (0usize..8).prop_map(Op::Publish),
            (0usize..8).prop_map(Op::Abandon),
            (0u8..8).prop_map(Op::Acquire),
            (0usize..8).prop_map(Op::Release),
            (0u8..8).prop_map(Op::Remove),
        ]
    }

    /// The model: fills in flight, resident keys, and references held
    /// (slot, key, still resident when taken).
    #[derive(Default)]
    struct Model {
        filling: Vec<(usize, BlockHash)>,
        resident: HashMap<BlockHash, usize>,
        refs: Vec<usize>,
    }

    impl Model {
        /// Slots neither free in the model's eyes: filling, resident or
        /// held by a reference.
        fn busy(&self) -> std::collections::HashSet<usize> {
            let mut busy: std::collections::HashSet<usize> =
                self.filling.iter().map(|(s, _)| *s).collect();
            busy.extend(self.resident.values().copied());
            busy.extend(self.refs.iter().copied());
            busy
        }
    }

    proptest! {
        /// Against a model: a claim succeeds exactly when the key is not
        /// resident and a slot is free; a slot is never handed out while it
        /// is filling, resident or referenced; every slot is accounted for.
        #[test]
        fn the_book_never_reuses_a_busy_slot(ops in prop::collection::vec(op(), 1..200)) {
            const SLOTS: usize = 4;
            let mut b = Book::new(SLOTS);
            let mut m = Model::default();
            for op in ops {
                match op {
                    Op::Claim(k) => {
                        let key = BlockHash(u128::from(k));
                        let busy = m.busy();
                        match b.claim(key) {
                            Claim::Slot(s) => {
                                prop_assert!(!m.resident.contains_key(&key));
                                prop_assert!(!busy.contains(&s), "slot {s} handed out twice");
                                m.filling.push((s, key));
                            }
                            Claim::AlreadyPresent => prop_assert!(m.resident.contains_key(&key)),
                            Claim::Full => {
                                prop_assert!(!m.resident.contains_key(&key));
                                prop_assert_eq!(busy.len(), SLOTS);
                            }
                        }
                    }
                    Op::Publish(i) if i < m.filling.len() => {
                        let (s, key) = m.filling.remove(i);
                        let want = !m.resident.contains_key(&key);
                        prop_assert_eq!(b.publish(s, key, sums()), want);
                        if want {
                            m.resident.insert(key, s);
                        }
                    }
                    Op::Abandon(i) if i < m.filling.len() => {
                        let (s, _) = m.filling.remove(i);
                        b.abandon(s);
                    }
                    Op::Acquire(k) => {
                        let key = BlockHash(u128::from(k));
                        let got = b.acquire(key).map(|a| a.slot);
                        prop_assert_eq!(got, m.resident.get(&key).copied());
                        m.refs.extend(got);
                    }
                    Op::Release(i) if i < m.refs.len() => {
                        let s = m.refs.remove(i);
                        let freed = b.release(s);
                        let still = m.refs.contains(&s) || m.resident.values().any(|r| *r == s);
                        prop_assert_eq!(freed, !still);
                    }
                    Op::Remove(k) => {
                        let key = BlockHash(u128::from(k));
                        prop_assert_eq!(b.remove(key), m.resident.remove(&key));
                    }
                    _ => {}
                }
                prop_assert_eq!(b.len(), m.resident.len());
                prop_assert_eq!(b.free_len(), SLOTS - m.busy().len());
            }
        }
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
                let book = SArc::new(SMutex::new(Book::new(1)));
                let data = SArc::new([AtomicU64::new(0), AtomicU64::new(0)]);
                // Block 1 is resident; its bytes are [1, 1].
                {
                    let mut b = book.lock().unwrap();
                    let s = fill(&mut b, 1);
                    assert_eq!(s, 0);
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
                            if let Claim::Slot(slot) = claim {
                                for w in data.iter() {
                                    w.store(k, Relaxed);
                                }
                                let mut b = book.lock().unwrap();
                                assert!(b.publish(slot, BlockHash(k as u128), sums()));
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
