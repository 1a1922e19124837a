//! Shuttle tests of `BlockPool` under concurrency: the real pool, its lock
//! swapped for `shuttle::sync::Mutex` through the `PoolLock` seam, so
//! shuttle's randomized scheduler explores interleavings of allocate,
//! register, acquire, drop and eviction.
//!
//! Properties checked: no slot is handed to a mutable handle while another
//! mutable handle or a live reference holds it; eviction never takes a
//! referenced, pinned or in-flight block; the pool's invariants hold after
//! every run.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use kvtier_core::BlockHash;
use kvtier_manager::Tier;
use kvtier_manager::pool::{
    BlockPool, PoolConfig, PoolLock, PoolState, Presence, SlotId, wall_clock,
};
use shuttle::sync::Mutex;
use shuttle::thread;

struct ShuttleLock(Mutex<PoolState>);

impl PoolLock for ShuttleLock {
    fn new(state: PoolState) -> Self {
        ShuttleLock(Mutex::new(state))
    }

    fn with<R>(&self, f: impl FnOnce(&mut PoolState) -> R) -> R {
        let mut guard = self.0.lock().unwrap();
        f(&mut guard)
    }
}

type Pool = BlockPool<ShuttleLock>;

fn pool(capacity: usize) -> Pool {
    BlockPool::with_lock(Tier::G1, PoolConfig::new(capacity, 1), wall_clock()).unwrap()
}

/// What the test knows is held: slots of live mutable handles, and slots
/// with live references. Entries are added after the pool granted them and
/// removed before the pool is told, so they never claim more than the pool
/// grants.
#[derive(Default)]
struct Held {
    mutable: HashSet<SlotId>,
    referenced: HashMap<SlotId, usize>,
}

fn worker(pool: Pool, held: Arc<Mutex<Held>>, ids: Vec<u128>) {
    for id in ids {
        let Ok(mut block) = pool.allocate() else {
            continue;
        };
        let slot = block.slot();
        {
            let mut h = held.lock().unwrap();
            assert!(
                h.mutable.insert(slot),
                "slot {slot} handed to two mutable handles"
            );
            assert!(
                !h.referenced.contains_key(&slot),
                "slot {slot} handed out while referenced"
            );
        }
        block.complete_external(BlockHash(id), None).unwrap();
        held.lock().unwrap().mutable.remove(&slot);
        let Ok(registered) = block.register() else {
            continue;
        };
        *held
            .lock()
            .unwrap()
            .referenced
            .entry(registered.slot())
            .or_insert(0) += 1;
        // Another holder of a possibly shared block.
        let again = pool.acquire(BlockHash(id));
        if let Some(a) = &again {
            assert_eq!(a.slot(), registered.slot(), "one hash, one slot");
        }
        {
            let mut h = held.lock().unwrap();
            let n = h.referenced.get_mut(&registered.slot()).unwrap();
            *n -= 1;
            if *n == 0 {
                h.referenced.remove(&registered.slot());
            }
        }
        drop(again);
        drop(registered);
    }
}

#[test]
fn concurrent_allocate_register_drop_evict() {
    shuttle::check_random(
        || {
            let pool = pool(3);
            let held = Arc::new(Mutex::new(Held::default()));
            let handles: Vec<_> = [vec![1, 2, 3], vec![2, 4, 1], vec![5, 1, 6]]
                .into_iter()
                .map(|ids| {
                    let (p, h) = (pool.clone(), held.clone());
                    thread::spawn(move || worker(p, h, ids))
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            pool.check_invariants().unwrap();
            let s = pool.stats();
            assert_eq!((s.mutable, s.active), (0, 0), "every handle was dropped");
            assert_eq!(s.free + s.inactive, 3);
        },
        300,
    );
}

#[test]
fn eviction_spares_referenced_pinned_and_in_flight_blocks() {
    shuttle::check_random(
        || {
            let pool = pool(5);
            let register = |id: u128| {
                let mut b = pool.allocate().unwrap();
                b.complete_external(BlockHash(id), None).unwrap();
                b.register().unwrap()
            };
            let referenced = register(1);
            drop(register(2));
            pool.pin(BlockHash(2)).unwrap();
            drop(register(3));
            let outgoing = pool.begin_outgoing(BlockHash(3), true).unwrap();
            let incoming = pool.begin_incoming(BlockHash(4), None).unwrap();
            // One free slot left; the churn below fights over it.
            let churn: Vec<_> = (0..2u128)
                .map(|t| {
                    let p = pool.clone();
                    thread::spawn(move || {
                        for i in 0..3 {
                            if let Ok(mut b) = p.allocate() {
                                b.complete_external(BlockHash(100 + 10 * t + i), None)
                                    .unwrap();
                                drop(b.register());
                            }
                        }
                    })
                })
                .collect();
            let checker = {
                let p = pool.clone();
                thread::spawn(move || {
                    for _ in 0..3 {
                        assert!(p.is_readable(BlockHash(1)), "referenced block evicted");
                        assert!(p.is_readable(BlockHash(2)), "pinned block evicted");
                        assert!(p.is_readable(BlockHash(3)), "in-flight source evicted");
                        assert_eq!(p.presence(BlockHash(4)), Some(Presence::Filling));
                        thread::yield_now();
                    }
                    outgoing.finish();
                    incoming.finish()
                })
            };
            for h in churn {
                h.join().unwrap();
            }
            let landed = checker.join().unwrap();
            assert!(pool.is_readable(BlockHash(1)) && pool.is_readable(BlockHash(2)));
            assert!(
                !pool.is_readable(BlockHash(3)),
                "the finished move removed its source"
            );
            assert!(pool.is_readable(landed.hash()));
            drop(referenced);
            pool.check_invariants().unwrap();
        },
        300,
    );
}

#[test]
fn planned_departures_race_with_readers_and_allocation() {
    shuttle::check_random(
        || {
            let pool = pool(4);
            for id in 1..=4u128 {
                let mut b = pool.allocate().unwrap();
                b.complete_external(BlockHash(id), None).unwrap();
                drop(b.register().unwrap());
            }
            let mover = {
                let p = pool.clone();
                thread::spawn(move || {
                    let leaving = p.plan_leaving(2);
                    let mut ok = true;
                    for l in leaving {
                        // Alternate success and failure of the copies.
                        if ok {
                            l.finish();
                        }
                        ok = !ok;
                    }
                })
            };
            let reader = {
                let p = pool.clone();
                thread::spawn(move || {
                    for id in 1..=4u128 {
                        if let Some(b) = p.acquire(BlockHash(id)) {
                            thread::yield_now();
                            assert!(p.is_readable(b.hash()), "held block {id} removed");
                        }
                    }
                })
            };
            let allocator = {
                let p = pool.clone();
                thread::spawn(move || {
                    if let Ok(mut b) = p.allocate() {
                        b.complete_external(BlockHash(9), None).unwrap();
                        drop(b.register());
                    }
                })
            };
            for t in [mover, reader, allocator] {
                t.join().unwrap();
            }
            pool.check_invariants().unwrap();
            let s = pool.stats();
            assert_eq!(s.active + s.mutable + s.incoming, 0);
            // At most one block leaves by the move and one by eviction, and
            // the allocator registers one whenever it evicted.
            assert!(s.inactive >= 3, "{s:?}");
        },
        300,
    );
}
