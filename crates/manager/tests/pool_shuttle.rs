//! Shuttle tests of `BlockPool` under concurrency: the real pool, its lock
//! swapped for `shuttle::sync::Mutex` through the `PoolLock` seam, so
//! shuttle's randomized scheduler explores interleavings of allocate,
//! register, acquire, drop and eviction.
//!
//! Properties checked: no slot is handed to a mutable handle while another
//! mutable handle or a live reference holds it; eviction never takes a
//! referenced, pinned or in-flight block; the pool's invariants hold after
//! every run; a pool that is its tier's only book (G2 over the arena)
//! forgets a block's bytes in the same step as it lets the block go, so a
//! reservation never finds the arena holding a block its pool gave up.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use kvtier_core::BlockHash;
use kvtier_manager::Tier;
use kvtier_manager::pool::{
    BlockPool, PoolConfig, PoolLock, PoolState, Presence, SlotId, TierBytes, wall_clock,
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

/// The arena's book as the G2 pool sees it, modelled for shuttle (the real
/// one sits behind a `parking_lot` lock shuttle cannot schedule): resident
/// keys, each copy an instance; references per instance; slots being
/// filled. A removed instance still referenced keeps its slot (Detached).
#[derive(Default)]
struct ArenaModel {
    resident: HashMap<BlockHash, u64>,
    refs: HashMap<u64, usize>,
    filling: usize,
    next: u64,
}

/// What a reservation of the model arena answered.
#[derive(Debug, PartialEq)]
enum ModelReserve {
    Reserved,
    AlreadyPresent,
    Full,
}

impl ArenaModel {
    /// Slots in use: resident, filling, and removed copies still read.
    fn used(&self) -> usize {
        let live: HashSet<u64> = self.resident.values().copied().collect();
        let detached = self
            .refs
            .iter()
            .filter(|(i, n)| **n > 0 && !live.contains(i))
            .count();
        self.resident.len() + self.filling + detached
    }

    fn reserve(&mut self, key: BlockHash, capacity: usize) -> ModelReserve {
        if self.resident.contains_key(&key) {
            return ModelReserve::AlreadyPresent;
        }
        if self.used() >= capacity {
            return ModelReserve::Full;
        }
        self.filling += 1;
        ModelReserve::Reserved
    }

    fn publish(&mut self, key: BlockHash) {
        self.filling -= 1;
        self.next += 1;
        self.resident.insert(key, self.next);
    }

    /// Whether any removed copy is still referenced (the only reason a
    /// reservation the pool granted may find the arena full).
    fn detached(&self) -> bool {
        let live: HashSet<u64> = self.resident.values().copied().collect();
        self.refs.iter().any(|(i, n)| *n > 0 && !live.contains(i))
    }
}

struct ShuttleArena(Mutex<ArenaModel>);

impl TierBytes for ShuttleArena {
    fn forget(&self, hash: BlockHash) {
        self.0.lock().unwrap().resident.remove(&hash);
    }
}

const ARENA_SLOTS: usize = 1;

/// A node's load of `key` into G2: a pool slot, then an arena slot, filled
/// and published, then the pool registers it.
fn load(pool: &Pool, arena: &ShuttleArena, key: BlockHash) {
    let Ok(incoming) = pool.begin_incoming(key, None) else {
        return;
    };
    let (answer, detached) = {
        let mut a = arena.0.lock().unwrap();
        let detached = a.detached();
        (a.reserve(key, ARENA_SLOTS), detached)
    };
    match answer {
        ModelReserve::Reserved => {
            arena.0.lock().unwrap().publish(key);
            drop(incoming.finish());
        }
        ModelReserve::Full => {
            assert!(detached, "the pool granted a slot the arena does not have");
        }
        ModelReserve::AlreadyPresent => {
            panic!("the arena still holds {key} after its pool gave it up")
        }
    }
}

/// A reader of `key`: a pool handle, then an arena reference, held while
/// the pool lets the block go, then released.
fn read(pool: &Pool, arena: &ShuttleArena, key: BlockHash) {
    let Some(handle) = pool.acquire(key) else {
        return;
    };
    let instance = {
        let mut a = arena.0.lock().unwrap();
        let i = *a
            .resident
            .get(&key)
            .expect("the pool holds a block the arena lost");
        *a.refs.entry(i).or_insert(0) += 1;
        i
    };
    drop(handle);
    thread::yield_now();
    *arena.0.lock().unwrap().refs.get_mut(&instance).unwrap() -= 1;
}

/// G2's pool and the arena move in one step: a reader holding a block, a
/// load of another block that evicts it, and a reload of the same block
/// race; no reservation the pool granted finds the old copy still in the
/// arena, a pool handle always has its arena copy, and at the end the
/// arena holds exactly what the pool does.
#[test]
fn the_g2_pool_and_the_arena_let_blocks_go_in_one_step() {
    shuttle::check_random(
        || {
            let pool: Pool =
                BlockPool::with_lock(Tier::G2, PoolConfig::new(ARENA_SLOTS, 1), wall_clock())
                    .unwrap();
            let arena = Arc::new(ShuttleArena(Mutex::new(ArenaModel::default())));
            pool.attach_bytes(arena.clone());
            load(&pool, &arena, BlockHash(1));
            let threads: Vec<_> = [
                (true, BlockHash(2)),
                (true, BlockHash(1)),
                (false, BlockHash(1)),
            ]
            .into_iter()
            .map(|(loads, key)| {
                let (p, a) = (pool.clone(), arena.clone());
                thread::spawn(move || {
                    if loads {
                        load(&p, &a, key);
                    } else {
                        read(&p, &a, key);
                    }
                })
            })
            .collect();
            for t in threads {
                t.join().unwrap();
            }
            pool.check_invariants().unwrap();
            let a = arena.0.lock().unwrap();
            for key in [BlockHash(1), BlockHash(2)] {
                assert_eq!(
                    a.resident.contains_key(&key),
                    pool.is_readable(key),
                    "arena and pool disagree on {key}"
                );
            }
        },
        1000,
    );
}
