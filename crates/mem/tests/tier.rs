//! Behaviour of the memory tier through its public API: storing, reading,
//! a full arena (no eviction), references, reservations, corruption, and a reference
//! model run against random operation sequences.

use std::sync::atomic::{AtomicU32, Ordering};

use kvtier_arena::{ArenaReader, MemError};
use kvtier_core::{BlockHash, BlockSums, Lookup};
use kvtier_mem::{MemoryTier, MemoryTierConfig, PutOutcome, Reserve};
use proptest::prelude::*;

const BLOCK: usize = 8192;
const LAYER: usize = 2048;

/// A shared-memory name no other test (or test process) uses.
fn unique_name(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "kvtier-mem-test-{}-{}-{tag}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn config(tag: &str, slots: u64) -> MemoryTierConfig {
    MemoryTierConfig {
        shm_name: unique_name(tag),
        capacity_bytes: slots * BLOCK as u64,
        block_bytes: BLOCK,
        layer_bytes: LAYER,
        hugepages: false,
        table_key: None,
        access_group: None,
    }
}

fn tier(tag: &str, slots: u64) -> MemoryTier {
    MemoryTier::create(config(tag, slots)).expect("create tier")
}

/// The bytes of block `k`: the same key always means the same bytes.
fn block(k: u128) -> Vec<u8> {
    let seed = (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..BLOCK as u64)
        .map(|i| (seed.wrapping_mul(i + 1) >> 29) as u8)
        .collect()
}

fn sums(k: u128) -> BlockSums {
    BlockSums::compute(BlockHash(k), LAYER, &block(k))
}

fn put(t: &MemoryTier, k: u128) -> PutOutcome {
    t.put(BlockHash(k), &block(k), &sums(k)).expect("put")
}

fn get(t: &MemoryTier, k: u128) -> Lookup {
    let mut out = vec![0u8; BLOCK];
    let r = t.get(BlockHash(k), &mut out);
    if r.is_hit() {
        assert_eq!(out, block(k), "hit with wrong bytes for {k}");
    }
    r
}

#[test]
fn put_get_round_trip_and_stats() {
    let t = tier("roundtrip", 4);
    assert_eq!(
        (t.capacity_blocks(), t.block_bytes(), t.slot_bytes()),
        (4, BLOCK, BLOCK)
    );
    assert!(t.is_empty());
    assert_eq!(put(&t, 1), PutOutcome::Stored);
    assert_eq!(put(&t, 1), PutOutcome::AlreadyPresent);
    assert_eq!(get(&t, 1), Lookup::Hit);
    assert_eq!(get(&t, 2), Lookup::Miss);
    assert!(t.contains(BlockHash(1)));
    assert_eq!((t.len(), t.free_blocks()), (1, 3));
    let s = t.stats();
    assert_eq!((s.hits, s.misses, s.puts, s.corrupt), (1, 1, 1, 0));
    assert_eq!((s.bytes_in, s.bytes_out), (BLOCK as u64, BLOCK as u64));
    assert_eq!((s.len, s.capacity), (1, 4));
    // The arena is slot-aligned for direct I/O.
    let (ptr, len) = t.arena();
    assert_eq!(ptr as usize % 4096, 0);
    assert_eq!(len, 4 * BLOCK);
    assert!(t.remove(BlockHash(1)));
    assert!(!t.remove(BlockHash(1)));
    assert_eq!(get(&t, 1), Lookup::Miss);
}

#[test]
fn wrong_inputs_change_nothing() {
    let t = tier("inputs", 2);
    let short = vec![0u8; BLOCK - 1];
    assert!(matches!(
        t.put(BlockHash(1), &short, &sums(1)),
        Err(MemError::WrongLength { expected: BLOCK, got })
            if got == BLOCK - 1
    ));
    let mut bad = sums(1);
    bad.layers.pop();
    assert!(matches!(
        t.put(BlockHash(1), &block(1), &bad),
        Err(MemError::BadSums { .. })
    ));
    let mut bad = sums(1);
    bad.block ^= 1;
    assert!(matches!(
        t.put(BlockHash(1), &block(1), &bad),
        Err(MemError::BadSums { .. })
    ));
    assert!(t.is_empty());
    assert_eq!(t.free_blocks(), 2);
    let mut small = vec![0u8; 10];
    put(&t, 1);
    assert_eq!(t.get(BlockHash(1), &mut small), Lookup::Miss);
}

#[test]
fn creation_errors_are_clear() {
    let mut c = config("small", 1);
    c.capacity_bytes = BLOCK as u64 - 1;
    let e = MemoryTier::create(c).unwrap_err();
    assert!(matches!(e, MemError::CapacityTooSmall { .. }), "{e}");
    assert!(e.to_string().contains("smaller than one slot"));
    let mut c = config("name", 1);
    c.shm_name = "a/b".into();
    assert!(matches!(
        MemoryTier::create(c),
        Err(MemError::InvalidName { .. })
    ));
    // The name is taken while its owner lives, free once it is gone.
    let c = config("taken", 1);
    let t = MemoryTier::create(c.clone()).unwrap();
    assert!(matches!(
        MemoryTier::create(c.clone()),
        Err(MemError::InUse { .. })
    ));
    drop(t);
    assert!(MemoryTier::create(c).is_ok());
    // More than /dev/shm can hold (tmpfs refuses a range larger than the
    // whole file system before allocating anything).
    let mut c = config("huge", 1);
    c.capacity_bytes = 1 << 40;
    let e = MemoryTier::create(c).unwrap_err();
    assert!(matches!(e, MemError::ShmFull { .. }), "{e}");
}

#[test]
fn hugepages_fall_back_when_unavailable() {
    let mut c = config("hp", 4);
    c.hugepages = true;
    c.capacity_bytes = 4 << 21;
    let t = MemoryTier::create(c).unwrap();
    assert!(t.slot_bytes() == BLOCK || t.slot_bytes() == 2 << 20);
    assert_eq!(put(&t, 9), PutOutcome::Stored);
    assert_eq!(get(&t, 9), Lookup::Hit);
}

#[test]
fn file_is_removed_when_the_last_handle_drops() {
    let t = tier("unlink", 2);
    let path = t.shm_path().to_owned();
    assert!(path.exists());
    put(&t, 1);
    let r = t.get_ref(BlockHash(1)).unwrap();
    let clone = t.clone();
    drop(t);
    drop(clone);
    assert!(path.exists(), "a BlockRef still holds the arena");
    assert_eq!(&r[..], &block(1)[..]);
    drop(r);
    assert!(!path.exists());
}

/// The arena never evicts (its owner, the node's G2 pool, does): full
/// means full, whatever is resident, until the owner removes a block; a
/// referenced block that is removed keeps its slot until released.
#[test]
fn a_full_arena_answers_full_until_its_owner_removes() {
    let t = tier("full", 2);
    for k in 1..=2 {
        put(&t, k);
    }
    assert_eq!(put(&t, 3), PutOutcome::Full);
    assert!(matches!(t.reserve(BlockHash(3)).unwrap(), Reserve::Full));
    assert_eq!(t.len(), 2);
    assert!(t.contains(BlockHash(1)) && t.contains(BlockHash(2)));
    let held = t.get_ref(BlockHash(1)).unwrap();
    assert!(t.remove(BlockHash(1)));
    assert_eq!(put(&t, 3), PutOutcome::Full, "a referenced slot is reused");
    drop(held);
    assert_eq!(put(&t, 3), PutOutcome::Stored);
    assert_eq!(t.stats().len, 2);
}

#[test]
fn remove_while_referenced_defers_the_free() {
    let t = tier("defer", 2);
    put(&t, 1);
    let r = t.get_ref(BlockHash(1)).unwrap();
    let r2 = r.clone();
    assert!(t.remove(BlockHash(1)));
    assert!(!t.contains(BlockHash(1)));
    assert_eq!(t.free_blocks(), 1, "the removed block's slot is still held");
    // New blocks arrive; they must not land in the referenced slot.
    assert_eq!(put(&t, 2), PutOutcome::Stored);
    for k in 3..10 {
        assert_eq!(put(&t, k), PutOutcome::Full);
        t.remove(BlockHash(k - 1));
        assert_eq!(put(&t, k), PutOutcome::Stored);
    }
    assert_eq!(&r[..], &block(1)[..]);
    assert!(r.verify());
    assert_eq!(r.key(), BlockHash(1));
    assert_eq!(r.sums(), sums(1));
    drop(r);
    assert_eq!(&r2[..], &block(1)[..]);
    drop(r2);
    assert_eq!(t.free_blocks(), 1);
}

#[test]
fn reservations_are_invisible_until_committed() {
    let t = tier("reserve", 2);
    let Reserve::Reserved(mut res) = t.reserve(BlockHash(7)).unwrap() else {
        panic!("no reservation");
    };
    assert_eq!(res.as_mut_ptr() as usize % 4096, 0);
    assert_eq!(res.len(), BLOCK);
    assert!(!t.contains(BlockHash(7)));
    assert_eq!(get(&t, 7), Lookup::Miss);
    let reader = ArenaReader::open(t.shm_name()).unwrap();
    let mut out = vec![0u8; BLOCK];
    assert_eq!(reader.get(BlockHash(7), &mut out), Lookup::Miss);
    res.as_mut_slice().copy_from_slice(&block(7));
    assert_eq!(res.commit(&sums(7)).unwrap(), PutOutcome::Stored);
    assert_eq!(get(&t, 7), Lookup::Hit);
    assert_eq!(reader.get(BlockHash(7), &mut out), Lookup::Hit);
    assert_eq!(out, block(7));
    assert!(matches!(
        t.reserve(BlockHash(7)).unwrap(),
        Reserve::AlreadyPresent
    ));

    // Dropped uncommitted: the slot comes back.
    let Reserve::Reserved(res) = t.reserve(BlockHash(8)).unwrap() else {
        panic!()
    };
    assert_eq!(t.free_blocks(), 0);
    assert!(matches!(t.reserve(BlockHash(9)).unwrap(), Reserve::Full));
    drop(res);
    assert_eq!(t.free_blocks(), 1);

    // Wrong bytes: refused, counted, freed.
    let Reserve::Reserved(mut res) = t.reserve(BlockHash(8)).unwrap() else {
        panic!()
    };
    res.as_mut_slice().copy_from_slice(&block(9));
    assert!(matches!(
        res.commit(&sums(8)),
        Err(MemError::ChecksumMismatch { .. })
    ));
    assert!(!t.contains(BlockHash(8)));
    assert_eq!(t.free_blocks(), 1);
    assert_eq!(t.stats().corrupt, 1);

    // Two fills of one key: the second commit finds it present.
    let Reserve::Reserved(mut a) = t.reserve(BlockHash(8)).unwrap() else {
        panic!()
    };
    a.as_mut_slice().copy_from_slice(&block(8));
    assert_eq!(
        put(&t, 8),
        PutOutcome::Full,
        "one slot is reserved, the other resident"
    );
    t.remove(BlockHash(7));
    assert_eq!(put(&t, 8), PutOutcome::Stored);
    assert_eq!(a.commit(&sums(8)).unwrap(), PutOutcome::AlreadyPresent);
    assert_eq!(t.free_blocks(), 1);
}

#[test]
fn corrupted_shared_bytes_are_caught_counted_and_dropped() {
    let t = tier("corrupt", 4);
    for k in 1..=3 {
        put(&t, k);
    }
    let slot = t.get_ref(BlockHash(2)).unwrap().slot();
    let (arena, _) = t.arena();
    // SAFETY: the test pokes one byte of a resident slot of its own arena
    // (as a stray writer in another process could), with no copy in flight.
    unsafe { *arena.add(slot * t.slot_bytes() + 5000) ^= 0x40 };
    let reader = ArenaReader::open(t.shm_name()).unwrap();
    let mut out = vec![0u8; BLOCK];
    assert_eq!(reader.get(BlockHash(2), &mut out), Lookup::Corrupt);
    assert_eq!(reader.stats().corrupt, 1);
    let r = t.get_ref(BlockHash(2)).unwrap();
    assert!(!r.verify());
    drop(r);
    assert_eq!(get(&t, 2), Lookup::Corrupt);
    assert_eq!(t.stats().corrupt, 1);
    assert!(!t.contains(BlockHash(2)));
    assert_eq!(get(&t, 2), Lookup::Miss);
    assert_eq!(reader.get(BlockHash(2), &mut out), Lookup::Miss);
    assert_eq!(get(&t, 1), Lookup::Hit);
    assert_eq!(get(&t, 3), Lookup::Hit);
    // Once the owner is gone the reader says so, and what it still maps
    // stays verified.
    assert!(!reader.is_stale());
    drop(t);
    assert!(reader.is_stale());
    assert_eq!(reader.get(BlockHash(1), &mut out), Lookup::Hit);
    assert_eq!(out, block(1));
}

/// Writers keep replacing blocks while readers read through `get`,
/// `get_ref` and an `ArenaReader`: no read ever returns bytes of another
/// block, and every referenced block stays intact.
#[test]
fn concurrent_readers_and_writers_never_see_wrong_bytes() {
    let t = tier("stress", 6);
    let reader = ArenaReader::open(t.shm_name()).unwrap();
    let keys: Vec<u128> = (1..=16).collect();
    std::thread::scope(|s| {
        for w in 0..2u128 {
            let t = t.clone();
            let keys = keys.clone();
            s.spawn(move || {
                for i in 0..1500usize {
                    let k = keys[(i * 7 + w as usize * 3) % keys.len()];
                    match i % 3 {
                        0 | 2 => {
                            put(&t, k);
                        }
                        _ => {
                            t.remove(BlockHash(k));
                        }
                    }
                }
            });
        }
        let t2 = t.clone();
        let keys2 = keys.clone();
        s.spawn(move || {
            let mut held = Vec::new();
            for i in 0..3000usize {
                let k = keys2[(i * 5) % keys2.len()];
                assert_ne!(get(&t2, k), Lookup::Corrupt);
                if let Some(r) = t2.get_ref(BlockHash(k)) {
                    held.push(r);
                }
                if held.len() > 3 {
                    let r = held.remove(0);
                    assert_eq!(&r[..], &block(r.key().0)[..]);
                }
            }
        });
        s.spawn(|| {
            let mut out = vec![0u8; BLOCK];
            for i in 0..3000usize {
                let k = keys[(i * 3) % keys.len()];
                match reader.get(BlockHash(k), &mut out) {
                    Lookup::Hit => assert_eq!(out, block(k)),
                    Lookup::Miss => {}
                    Lookup::Corrupt => panic!("reader saw corruption without any"),
                }
            }
        });
    });
    assert_eq!(t.stats().corrupt, 0);
    assert_eq!(t.len() + t.free_blocks(), t.capacity_blocks());
}

// ---------------------------------------------------------------------------
// Reference model.

/// One operation of a random sequence.
#[derive(Debug, Clone)]
enum Op {
    Put(u128),
    Get(u128),
    GetRef(u128),
    DropRef(usize),
    Remove(u128),
}

fn op() -> impl Strategy<Value = Op> {
    let k = 0u128..10;
    prop_oneof![
        4 => k.clone().prop_map(Op::Put),
        3 => k.clone().prop_map(Op::Get),
        2 => k.clone().prop_map(Op::GetRef),
        2 => any::<usize>().prop_map(Op::DropRef),
        3 => k.prop_map(Op::Remove),
    ]
}

/// The straightforward model: the resident blocks, each with a unique
/// instance number so references to a removed block can be told from
/// references to a later copy of its key.
#[derive(Default)]
struct Model {
    capacity: usize,
    resident: Vec<Entry>,
    /// Instance numbers of live references.
    refs: Vec<u64>,
    next_instance: u64,
}

#[derive(Clone)]
struct Entry {
    key: u128,
    instance: u64,
}

impl Model {
    fn find(&self, k: u128) -> Option<usize> {
        self.resident.iter().position(|e| e.key == k)
    }

    /// Slots in use: resident blocks plus removed ones still referenced.
    fn used(&self) -> usize {
        let mut detached: Vec<u64> = self
            .refs
            .iter()
            .copied()
            .filter(|i| !self.resident.iter().any(|e| e.instance == *i))
            .collect();
        detached.sort_unstable();
        detached.dedup();
        self.resident.len() + detached.len()
    }

    /// A put: present, full (the arena never evicts), or stored.
    fn put(&mut self, k: u128) -> PutOutcome {
        if self.find(k).is_some() {
            return PutOutcome::AlreadyPresent;
        }
        if self.used() == self.capacity {
            return PutOutcome::Full;
        }
        self.next_instance += 1;
        self.resident.push(Entry {
            key: k,
            instance: self.next_instance,
        });
        PutOutcome::Stored
    }
}

fn run_model(capacity: usize, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let t = tier("model", capacity as u64);
    let mut m = Model {
        capacity,
        ..Model::default()
    };
    let mut held: Vec<kvtier_mem::BlockRef> = Vec::new();
    for op in ops {
        match op {
            Op::Put(k) => prop_assert_eq!(put(&t, k), m.put(k)),
            Op::Get(k) => {
                let want = match m.find(k) {
                    Some(_) => Lookup::Hit,
                    None => Lookup::Miss,
                };
                prop_assert_eq!(get(&t, k), want);
            }
            Op::GetRef(k) => {
                let r = t.get_ref(BlockHash(k));
                match m.find(k) {
                    Some(i) => {
                        m.refs.push(m.resident[i].instance);
                        held.push(r.expect("model says resident"));
                    }
                    None => prop_assert!(r.is_none()),
                }
            }
            Op::DropRef(i) => {
                if !held.is_empty() {
                    let i = i % held.len();
                    held.remove(i);
                    m.refs.remove(i);
                }
            }
            Op::Remove(k) => {
                let want = m.find(k).map(|i| m.resident.remove(i)).is_some();
                prop_assert_eq!(t.remove(BlockHash(k)), want);
            }
        }
        // Invariants after every step.
        prop_assert_eq!(t.len(), m.resident.len());
        prop_assert_eq!(t.free_blocks(), capacity - m.used());
        prop_assert!(t.len() <= t.capacity_blocks());
        for k in 0..10 {
            prop_assert_eq!(t.contains(BlockHash(k)), m.find(k).is_some(), "key {}", k);
        }
        for r in &held {
            prop_assert_eq!(&r[..], &block(r.key().0)[..]);
        }
    }
    drop(held);
    prop_assert_eq!(t.len() + t.free_blocks(), capacity);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn tier_matches_the_reference_model(
        capacity in 1usize..6,
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        run_model(capacity, ops)?;
    }
}

#[test]
fn commit_verified_publishes_but_still_refuses_inconsistent_sums() {
    let t = tier("commitv", 4);
    let Reserve::Reserved(mut r) = t.reserve(BlockHash(7)).unwrap() else {
        panic!("expected a reservation");
    };
    r.as_mut_slice().copy_from_slice(&block(7));
    // Sums whose layer checksums do not combine to the block checksum are
    // refused without publishing.
    let mut bad = sums(7);
    bad.block ^= 1;
    assert!(matches!(
        r.commit_verified(&bad),
        Err(MemError::BadSums { .. })
    ));
    assert!(!t.contains(BlockHash(7)));

    let Reserve::Reserved(mut r) = t.reserve(BlockHash(7)).unwrap() else {
        panic!("expected a reservation");
    };
    r.as_mut_slice().copy_from_slice(&block(7));
    assert_eq!(r.commit_verified(&sums(7)).unwrap(), PutOutcome::Stored);
    assert_eq!(get(&t, 7), Lookup::Hit);
}

/// The batch calls of the node's control path (`reserve_many`,
/// `SlotReservation::commit_all`, `get_refs_prefix`, `BlockRef::release_all`,
/// `remove_many`) keep the single calls' rules: a verified commit refuses
/// bytes that do not match, inconsistent sums are refused either way, a
/// released slot is reused only once the last reference is gone.
#[test]
fn batch_calls_keep_the_single_calls_rules() {
    let t = tier("batch", 4);
    let granted = t.reserve_many([1, 2, 3].map(BlockHash));
    let mut slots = Vec::new();
    for (k, r) in [1u128, 2, 3].into_iter().zip(granted) {
        let Reserve::Reserved(mut slot) = r else {
            panic!("block {k} not reserved: {r:?}");
        };
        slot.as_mut_slice().copy_from_slice(&block(k));
        slots.push(slot);
    }
    // Block 2's bytes do not match its sums; block 3's sums are another
    // key's.
    slots[1].as_mut_slice()[0] ^= 0xff;
    let batch = slots.into_iter().zip([sums(1), sums(2), sums(4)]).collect();
    let out = kvtier_mem::SlotReservation::commit_all(batch, true);
    assert!(matches!(out[0], Ok(PutOutcome::Stored)), "{out:?}");
    assert!(
        matches!(out[1], Err(MemError::ChecksumMismatch { .. })),
        "{out:?}"
    );
    assert!(matches!(out[2], Err(MemError::BadSums { .. })), "{out:?}");
    assert_eq!(get(&t, 1), Lookup::Hit);
    assert_eq!(t.len(), 1, "only the good block is visible");
    assert_eq!(t.free_blocks(), 3, "the refused slots are free again");

    assert_eq!(put(&t, 5), PutOutcome::Stored);
    let refs = t.get_refs_prefix([1, 5, 9, 1].map(BlockHash));
    assert_eq!(
        refs.iter().map(|r| r.key()).collect::<Vec<_>>(),
        vec![BlockHash(1), BlockHash(5)],
        "the prefix ends at the first block not resident"
    );
    assert_eq!(t.remove_many(&[1, 5, 9].map(BlockHash)), 2);
    assert_eq!(t.free_blocks(), 2, "referenced slots stay taken");
    assert!(
        refs.iter().all(|r| r.verify()),
        "a held slot keeps its bytes"
    );
    kvtier_mem::BlockRef::release_all(refs);
    assert_eq!(t.free_blocks(), 4, "released under one lock: reusable");
}
