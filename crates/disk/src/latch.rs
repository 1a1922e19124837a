//! [`Latch`]: the per-region protocol between readers and the reclaimer.
//!
//! A region is in one of four states: `FREE` (never written in this run, or
//! wiped), `OPEN` (taking writes), `SEALED` (full, every write finished) or
//! `RECLAIMING` (its entries are being dropped before it is reused). Readers
//! count themselves in `readers` for as long as their I/O on the region is in
//! flight.
//!
//! ```text
//! reader:    readers += 1 ; if state is RECLAIMING or FREE { readers -= 1; miss }
//!            ... read, verify ...  readers -= 1
//! reclaimer: CAS state SEALED -> RECLAIMING ; if readers != 0 { state = SEALED; pick another }
//! ```
//!
//! Both sides use sequentially consistent operations, so in the single total
//! order either the reader's increment comes first (the reclaimer sees it and
//! backs off) or the reclaimer's CAS does (the reader sees `RECLAIMING` and
//! backs off); never both proceed. The reader's increment happens while it
//! holds the index shard lock of the entry it found, and the reclaimer only
//! removes entries after winning, under the same locks; so an entry a reader
//! found cannot belong to a reclaimed-and-reused region.
//!
//! The latch is generic over its atomic so the shuttle test in this module
//! can run the real protocol under a randomised scheduler.

use std::sync::atomic::Ordering::SeqCst;

/// Region states.
pub mod state {
    /// Not written in this run.
    pub const FREE: u32 = 0;
    /// Taking writes.
    pub const OPEN: u32 = 1;
    /// Full and every write finished; readable and reclaimable.
    pub const SEALED: u32 = 2;
    /// Being reclaimed; readers back off.
    pub const RECLAIMING: u32 = 3;
}

/// The atomic operations the latch needs (std's and shuttle's `AtomicU32`).
pub trait Atom: Send + Sync {
    /// A new atomic holding `v`.
    fn new(v: u32) -> Self;
    /// Sequentially consistent load.
    fn get(&self) -> u32;
    /// Sequentially consistent store.
    fn set(&self, v: u32);
    /// Sequentially consistent add; returns the old value.
    fn add(&self, v: u32) -> u32;
    /// Sequentially consistent subtract; returns the old value.
    fn sub(&self, v: u32) -> u32;
    /// Sequentially consistent compare-and-swap.
    fn cas(&self, from: u32, to: u32) -> bool;
}

impl Atom for std::sync::atomic::AtomicU32 {
    fn new(v: u32) -> Self {
        std::sync::atomic::AtomicU32::new(v)
    }
    fn get(&self) -> u32 {
        self.load(SeqCst)
    }
    fn set(&self, v: u32) {
        self.store(v, SeqCst)
    }
    fn add(&self, v: u32) -> u32 {
        self.fetch_add(v, SeqCst)
    }
    fn sub(&self, v: u32) -> u32 {
        self.fetch_sub(v, SeqCst)
    }
    fn cas(&self, from: u32, to: u32) -> bool {
        self.compare_exchange(from, to, SeqCst, SeqCst).is_ok()
    }
}

/// The reader-count / reclaim latch of one region. See the [module docs](self).
#[derive(Debug)]
pub struct LatchOf<A: Atom> {
    state: A,
    readers: A,
}

/// The latch over std atomics, as the tier uses it.
pub type Latch = LatchOf<std::sync::atomic::AtomicU32>;

impl<A: Atom> LatchOf<A> {
    /// A latch in `state`.
    pub fn new(initial: u32) -> Self {
        LatchOf {
            state: A::new(initial),
            readers: A::new(0),
        }
    }

    /// The current state.
    pub fn state(&self) -> u32 {
        self.state.get()
    }

    /// Sets the state (the writer's transitions FREE/RECLAIMING -> OPEN ->
    /// SEALED, which no reader races with destructively).
    pub fn set_state(&self, s: u32) {
        self.state.set(s)
    }

    /// Readers in flight.
    pub fn readers(&self) -> u32 {
        self.readers.get()
    }

    /// Counts a reader in; `false` (and not counted) if the region is being
    /// reclaimed or free.
    pub fn try_enter(&self) -> bool {
        self.readers.add(1);
        match self.state.get() {
            state::OPEN | state::SEALED => true,
            _ => {
                self.readers.sub(1);
                false
            }
        }
    }

    /// Counts a reader out.
    pub fn exit(&self) {
        self.readers.sub(1);
    }

    /// Moves SEALED -> RECLAIMING if no reader is in; `false` leaves the
    /// region as it was.
    pub fn try_reclaim(&self) -> bool {
        if !self.state.cas(state::SEALED, state::RECLAIMING) {
            return false;
        }
        if self.readers.get() != 0 {
            self.state.set(state::SEALED);
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_blocks_reclaim_and_reclaim_blocks_reader() {
        let l = Latch::new(state::SEALED);
        assert!(l.try_enter());
        assert!(!l.try_reclaim());
        assert_eq!(l.state(), state::SEALED);
        l.exit();
        assert!(l.try_reclaim());
        assert!(!l.try_enter());
        assert_eq!(l.readers(), 0);
        l.set_state(state::OPEN);
        assert!(l.try_enter());
        // An open region is never reclaimed.
        assert!(!l.try_reclaim());
        l.exit();
        assert!(!Latch::new(state::FREE).try_enter());
    }

    mod shuttle_tests {
        use super::super::*;
        use shuttle::sync::atomic::{AtomicU32, AtomicU64};
        use shuttle::sync::{Arc, Mutex};
        use std::collections::HashMap;

        impl Atom for AtomicU32 {
            fn new(v: u32) -> Self {
                AtomicU32::new(v)
            }
            fn get(&self) -> u32 {
                self.load(SeqCst)
            }
            fn set(&self, v: u32) {
                self.store(v, SeqCst)
            }
            fn add(&self, v: u32) -> u32 {
                self.fetch_add(v, SeqCst)
            }
            fn sub(&self, v: u32) -> u32 {
                self.fetch_sub(v, SeqCst)
            }
            fn cas(&self, from: u32, to: u32) -> bool {
                self.compare_exchange(from, to, SeqCst, SeqCst).is_ok()
            }
        }

        /// One region with two slots, an index shard and the "disk": each
        /// slot holds the generation of the life that wrote it. Readers pin
        /// through the index under its lock, as `Index::pin` does, and check
        /// that what they read belongs to the life their entry names. The
        /// reclaimer wins the latch, drops entries under the lock, rewrites
        /// the slots with a new generation, re-inserts and reseals.
        fn scenario() {
            let latch = Arc::new(LatchOf::<AtomicU32>::new(state::SEALED));
            let index: Arc<Mutex<HashMap<u32, u64>>> =
                Arc::new(Mutex::new([(0u32, 1u64), (1, 1)].into_iter().collect()));
            let disk = Arc::new([AtomicU64::new(1), AtomicU64::new(1)]);
            let mut handles = Vec::new();
            for r in 0..2u32 {
                let (latch, index, disk) = (latch.clone(), index.clone(), disk.clone());
                handles.push(shuttle::thread::spawn(move || {
                    for _ in 0..2 {
                        let pinned = {
                            let idx = index.lock().unwrap();
                            match idx.get(&r) {
                                Some(&g) if latch.try_enter() => Some(g),
                                _ => None,
                            }
                        };
                        if let Some(g) = pinned {
                            shuttle::thread::yield_now();
                            let seen = disk[r as usize].load(SeqCst);
                            assert_eq!(seen, g, "read slot rewritten under a reader");
                            latch.exit();
                        }
                    }
                }));
            }
            {
                let (latch, index, disk) = (latch.clone(), index.clone(), disk.clone());
                handles.push(shuttle::thread::spawn(move || {
                    for g in 2..4u64 {
                        if !latch.try_reclaim() {
                            continue;
                        }
                        index.lock().unwrap().clear();
                        latch.set_state(state::OPEN);
                        for d in disk.iter() {
                            d.store(g, SeqCst);
                        }
                        let mut idx = index.lock().unwrap();
                        idx.insert(0, g);
                        idx.insert(1, g);
                        drop(idx);
                        latch.set_state(state::SEALED);
                    }
                }));
            }
            for h in handles {
                h.join().unwrap();
            }
            assert_eq!(latch.readers(), 0);
        }

        #[test]
        fn shuttle_readers_never_see_a_reclaimed_slot() {
            shuttle::check_random(scenario, 3000);
        }

        #[test]
        fn shuttle_pct_readers_never_see_a_reclaimed_slot() {
            shuttle::check_pct(scenario, 2000, 3);
        }
    }
}
