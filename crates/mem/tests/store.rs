//! The memory tier through the [`TierStore`] trait object: round trips,
//! a damaged slot never read as a hit, keys and remove, and the in-place
//! facet (lend, reserve as a read target, commit).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use kvtier_core::{BlockHash, Lookup};
use kvtier_mem::{MemoryTier, MemoryTierConfig};
use kvtier_tier::conformance::{self, TestBlock};
use kvtier_tier::{Reserved, TierKind, TierStore};

const LAYERS: usize = 4;
const LAYER: usize = 4096;

fn tier(tag: &str, slots: u64) -> Arc<MemoryTier> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let cfg = MemoryTierConfig {
        shm_name: format!(
            "kvtier-mem-store-{}-{}-{tag}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ),
        capacity_bytes: slots * (LAYERS * LAYER) as u64,
        block_bytes: LAYERS * LAYER,
        layer_bytes: LAYER,
        hugepages: false,
        table_key: None,
        access_group: None,
    };
    Arc::new(MemoryTier::create(cfg).expect("create tier"))
}

fn blocks(n: u64) -> Vec<TestBlock> {
    conformance::blocks(2, n, LAYERS, LAYER)
}

#[tokio::test]
async fn round_trip_keys_and_remove() {
    let t = tier("rt", 16);
    let store: Arc<dyn TierStore> = t.clone();
    assert_eq!(store.kind(), TierKind::Memory);
    assert_eq!(store.capacity_blocks(), 16);
    let b = blocks(8);
    conformance::put_all(&*store, &b).await;
    assert_eq!(store.len(), 8);
    conformance::check_round_trip(&*store, &b, LAYER, 1..3).await;
    conformance::check_wrong_length_fails(&*store, &b[0]).await;
    conformance::check_keys_and_remove(&*store, &b).await;
    assert!(store.stats().contains(&("len", 4)));
}

#[tokio::test]
async fn a_damaged_slot_is_never_a_hit() {
    let t = tier("damage", 8);
    let store: Arc<dyn TierStore> = t.clone();
    let b = blocks(4);
    conformance::put_all(&*store, &b).await;
    let slot = t.get_ref(b[0].key).expect("resident").slot();
    let (arena, _) = t.arena();
    // SAFETY: the test flips one byte of a resident slot of its own arena
    // (as a stray writer could), with no copy in flight.
    unsafe { *arena.add(slot * t.slot_bytes() + LAYER + 7) ^= 0x40 };
    conformance::check_damaged_never_hit(&*store, &b[..1], &b[1..]).await;
    assert!(!store.contains(b[0].key), "the corrupt block was dropped");
}

#[tokio::test]
async fn in_place_lend_reserve_and_commit() {
    let t = tier("inplace", 8);
    let store: Arc<dyn TierStore> = t.clone();
    let b = blocks(2);
    conformance::put_all(&*store, &b[..1]).await;
    let facet = store.in_place().expect("the arena lends in place");
    let lent = facet.lend(&[b[0].key, b[1].key]);
    let first = lent[0].as_ref().expect("resident block lent");
    assert!(first.bytes.bytes() == b[0].data && *first.sums == b[0].sums);
    assert!(lent[1].is_none());
    // Reserve a slot for the second block, read the first block's bytes
    // into it through another tier's read path (here: a copy), commit.
    let mut reserved = facet.reserve(&[b[1].key, b[0].key]);
    assert!(matches!(reserved[1], Reserved::Present));
    let Reserved::Slot(mut slot) = reserved.swap_remove(0) else {
        panic!("a free slot")
    };
    assert!(!store.contains(b[1].key), "invisible before commit");
    // SAFETY: the reserved slot is ours and `len()` bytes long.
    let dst = unsafe { std::slice::from_raw_parts_mut(slot.as_mut_ptr(), slot.len()) };
    dst.copy_from_slice(&b[1].data);
    facet.commit(slot, &b[1].sums).expect("commit");
    conformance::check_round_trip(&*store, &b, LAYER, 0..1).await;
    // A target that is not one of the arena's slots is refused.
    let foreign = Box::new(kvtier_io::AlignedBuf::zeroed(LAYER * LAYERS, 4096));
    assert!(facet.commit(foreign, &b[0].sums).is_err());
    let miss = conformance::read(&*store, &[BlockHash(99)], None, LAYER * LAYERS).await;
    assert_eq!(miss[0].0, Lookup::Miss);
}
