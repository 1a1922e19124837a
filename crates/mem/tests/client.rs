//! [`ArenaClient`] against an owner [`MemoryTier`] in the same process, as
//! the node daemon and an engine use them: the owner reserves a slot and
//! names it by its file offset, the client fills it and hands back the
//! checksums, the owner commits them, and the client reads the block back,
//! verified.

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicU32, Ordering};

use kvtier_arena::{ArenaClient, ArenaReader, MemError};
use kvtier_core::{BlockHash, BlockSums, Lookup, layer_checksum};
use kvtier_mem::{MemoryTier, MemoryTierConfig, PutOutcome, Reserve};
use proptest::prelude::*;

/// Not a multiple of the layer size (the last layer is shorter) nor of the
/// page size (slots carry padding).
const BLOCK: usize = 10_000;
const LAYER: usize = 3_000;
const LAYERS: usize = 4;

fn tier_with(block: usize, layer: usize, slots: u64) -> MemoryTier {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let slot_bytes = block.next_multiple_of(4096) as u64;
    MemoryTier::create(MemoryTierConfig {
        shm_name: format!(
            "kvtier-mem-client-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ),
        capacity_bytes: slots * slot_bytes,
        block_bytes: block,
        layer_bytes: layer,
        hugepages: false,
        table_key: None,
        access_group: None,
    })
    .expect("create tier")
}

fn tier() -> MemoryTier {
    tier_with(BLOCK, LAYER, 4)
}

fn block(k: u128, len: usize) -> Vec<u8> {
    let seed = (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len as u64)
        .map(|i| (seed.wrapping_mul(i + 3) >> 27) as u8)
        .collect()
}

/// Reserves a slot for `key` and returns it with the client's index for
/// it, found the way a client finds it: from the file offset.
fn reserve(
    t: &MemoryTier,
    c: &ArenaClient,
    key: BlockHash,
) -> (kvtier_mem::SlotReservation, usize) {
    let Reserve::Reserved(r) = t.reserve(key).expect("reserve") else {
        panic!("no slot reserved for {key}");
    };
    let slot = c
        .slot_at(t.slot_offset(r.slot()), t.block_bytes() as u64)
        .expect("the owner's offset names a slot");
    assert_eq!(slot, r.slot());
    (r, slot)
}

/// The checksums of block `k`: what the daemon holds for it and sends.
fn sums_of(k: u128) -> BlockSums {
    BlockSums::compute(BlockHash(k), LAYER, &block(k, BLOCK))
}

/// Stores block `k` through the client; returns its slot.
fn store(t: &MemoryTier, c: &ArenaClient, k: u128) -> usize {
    let key = BlockHash(k);
    let (r, slot) = reserve(t, c, key);
    // SAFETY: the owner reserved `slot` for us just now; nothing else in
    // this test touches it until the commit.
    let sums = unsafe { c.fill(slot, key, &block(k, BLOCK)) }.expect("fill");
    assert_eq!(r.commit(&sums).expect("commit"), PutOutcome::Stored);
    slot
}

#[test]
fn a_client_fills_a_reserved_slot_and_reads_it_back() {
    let t = tier();
    let c = ArenaClient::open(t.shm_name()).expect("open");
    assert_eq!(
        (c.block_bytes(), c.layer_bytes(), c.layers(), c.slot_bytes()),
        (BLOCK, LAYER, LAYERS, 12_288)
    );
    assert_eq!((c.file_bytes(), c.capacity_blocks()), (t.file_bytes(), 4));
    assert_eq!(c.owner_pid(), std::process::id());
    assert!(!c.is_stale());

    let key = BlockHash(7);
    let (r, slot) = reserve(&t, &c, key);
    // SAFETY: reserved for us; nothing else touches it until the commit.
    let sums = unsafe { c.fill(slot, key, &block(7, BLOCK)) }.unwrap();
    assert_eq!(sums, BlockSums::compute(key, LAYER, &block(7, BLOCK)));
    // Not published before the commit.
    let table = ArenaReader::open(t.shm_name()).expect("open read-only");
    let mut dst = vec![0u8; BLOCK];
    assert_eq!(table.get(key, &mut dst), Lookup::Miss);
    // The owner's strict commit hashes the slot again: the client's bytes
    // and sums agree.
    assert_eq!(r.commit(&sums).unwrap(), PutOutcome::Stored);
    assert_eq!(table.get(key, &mut dst), Lookup::Hit);

    assert_eq!(
        c.read(slot, key, &sums.layers, &mut dst).unwrap(),
        Lookup::Hit
    );
    assert_eq!(dst, block(7, BLOCK));
    for (layer, want) in block(7, BLOCK).chunks(LAYER).enumerate() {
        let mut part = vec![0u8; c.layer_len(layer).unwrap()];
        assert_eq!(
            c.read_layer(slot, key, layer, sums.layers[layer], &mut part)
                .unwrap(),
            Lookup::Hit
        );
        assert_eq!(part, want);
    }
    assert_eq!(t.get(key, &mut dst), Lookup::Hit);
}

#[test]
fn layer_by_layer_fills_give_the_block_sums() {
    let t = tier();
    let c = ArenaClient::open(t.shm_name()).unwrap();
    let key = BlockHash(u128::MAX - 3);
    let data = block(key.0, BLOCK);
    let (r, slot) = reserve(&t, &c, key);
    // Layers may arrive in any order.
    let mut layer_sums = vec![0; LAYERS];
    for layer in (0..LAYERS).rev() {
        let part = &data[layer * LAYER..((layer + 1) * LAYER).min(BLOCK)];
        // SAFETY: reserved for us; nothing else touches it until the commit.
        layer_sums[layer] = unsafe { c.fill_layer(slot, key, layer, part) }.unwrap();
        assert_eq!(layer_sums[layer], layer_checksum(key, layer as u32, part));
    }
    let sums = c.block_sums(key, layer_sums).unwrap();
    assert_eq!(sums, BlockSums::compute(key, LAYER, &data));
    assert_eq!(r.commit(&sums).unwrap(), PutOutcome::Stored);
    let mut dst = vec![0u8; BLOCK];
    assert_eq!(
        c.read(slot, key, &sums.layers, &mut dst).unwrap(),
        Lookup::Hit
    );
    assert_eq!(dst, data);
}

#[test]
fn a_corrupted_byte_is_corrupt_and_never_served() {
    let t = tier();
    let c = ArenaClient::open(t.shm_name()).unwrap();
    let slot = store(&t, &c, 5);
    let (arena, _) = t.arena();
    // SAFETY: one byte of layer 2 of a resident slot of our own arena; no
    // copy is in flight.
    unsafe { *arena.add(slot * t.slot_bytes() + 2 * LAYER + 17) ^= 0x40 };
    let key = BlockHash(5);
    let sums = sums_of(5);
    let mut dst = vec![0u8; BLOCK];
    assert_eq!(
        c.read(slot, key, &sums.layers, &mut dst).unwrap(),
        Lookup::Corrupt
    );
    let mut part = vec![0u8; LAYER];
    assert_eq!(
        c.read_layer(slot, key, 2, sums.layers[2], &mut part)
            .unwrap(),
        Lookup::Corrupt
    );
    // The other layers are intact and still served on their own.
    assert_eq!(
        c.read_layer(slot, key, 1, sums.layers[1], &mut part)
            .unwrap(),
        Lookup::Hit
    );
    assert_eq!(part, block(5, BLOCK)[LAYER..2 * LAYER]);
}

/// A read checks the copy against the checksums it is given, seeded by
/// the key it is given: a slot holding another block, an empty slot, or
/// another block's checksums never read as a hit.
#[test]
fn a_wrong_key_wrong_sums_or_an_empty_slot_is_never_a_hit() {
    let t = tier();
    let c = ArenaClient::open(t.shm_name()).unwrap();
    let slot = store(&t, &c, 1);
    let other = store(&t, &c, 2);
    let mut dst = vec![0u8; BLOCK];
    let mut part = vec![0u8; LAYER];
    let (one, two) = (sums_of(1), sums_of(2));
    let corrupt = |got: kvtier_arena::Result<Lookup>| assert_eq!(got.unwrap(), Lookup::Corrupt);
    corrupt(c.read(slot, BlockHash(2), &two.layers, &mut dst));
    corrupt(c.read(slot, BlockHash(1), &two.layers, &mut dst));
    corrupt(c.read(other, BlockHash(1), &one.layers, &mut dst));
    corrupt(c.read(slot, BlockHash(1), &one.layers[..LAYERS - 1], &mut dst));
    corrupt(c.read_layer(slot, BlockHash(2), 0, two.layers[0], &mut part));
    let empty = (0..4).find(|&s| s != slot && s != other).unwrap();
    corrupt(c.read(empty, BlockHash(1), &one.layers, &mut dst));
    assert_eq!(
        c.read(slot, BlockHash(1), &one.layers, &mut dst).unwrap(),
        Lookup::Hit
    );
}

#[test]
fn ranges_that_are_not_slots_are_refused() {
    let t = tier();
    let c = ArenaClient::open(t.shm_name()).unwrap();
    let len = BLOCK as u64;
    let first = t.slot_offset(0);
    let end = t.file_bytes();
    for (offset, len) in [
        (0, len),
        (4096, len),
        (first - 1, len),
        (first + 8, len),
        (t.slot_offset(1) - 4096, len),
        (end, len),
        (t.slot_offset(usize::MAX), len),
        (first, len + 1),
        (first, 0),
        (first, t.slot_bytes() as u64),
    ] {
        assert!(
            matches!(c.slot_at(offset, len), Err(MemError::BadSlot { .. })),
            "{offset}+{len}"
        );
    }
    let key = BlockHash(3);
    let data = block(3, BLOCK);
    let mut dst = vec![0u8; BLOCK];
    // Every refusal comes before a byte is written, so no slot needs to be
    // reserved for these calls.
    // SAFETY: each call fails its checks and writes nothing.
    unsafe {
        assert!(matches!(
            c.fill(4, key, &data),
            Err(MemError::NoSuchSlot { slot: 4, slots: 4 })
        ));
        assert!(matches!(
            c.fill(0, key, &data[1..]),
            Err(MemError::WrongLength { .. })
        ));
        assert!(matches!(
            c.fill_layer(0, key, LAYERS, &data[..1000]),
            Err(MemError::NoSuchLayer { .. })
        ));
        assert!(matches!(
            c.fill_layer(0, key, 3, &data[..LAYER]),
            Err(MemError::WrongLayerLength {
                layer: 3,
                expected: 1000,
                ..
            })
        ));
    }
    let sums = sums_of(3);
    assert!(matches!(
        c.read(4, key, &sums.layers, &mut dst),
        Err(MemError::NoSuchSlot { .. })
    ));
    assert!(matches!(
        c.read(0, key, &sums.layers, &mut dst[1..]),
        Err(MemError::WrongLength { .. })
    ));
    assert!(matches!(
        c.read_layer(0, key, 9, 0, &mut dst),
        Err(MemError::NoSuchLayer { .. })
    ));
    assert!(matches!(
        c.block_sums(key, vec![1, 2]),
        Err(MemError::BadSums { .. })
    ));
}

#[test]
fn the_arena_is_private_unless_a_group_is_named_and_only_an_arena_opens() {
    use std::os::unix::fs::MetadataExt;
    let t = tier();
    let meta = std::fs::metadata(t.shm_path()).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
    // A group of engine processes: another group than ours where we may
    // give the file to one (as root), else our own (a member may).
    let group = if rustix::process::geteuid().is_root() {
        65534
    } else {
        rustix::process::getegid().as_raw()
    };
    let shared = MemoryTier::create(MemoryTierConfig {
        shm_name: format!("kvtier-mem-client-group-{}", std::process::id()),
        capacity_bytes: 4096 * 4,
        block_bytes: 4096,
        layer_bytes: 4096,
        hugepages: false,
        table_key: None,
        access_group: Some(group),
    })
    .expect("create tier");
    let meta = std::fs::metadata(shared.shm_path()).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o660);
    assert_eq!(meta.gid(), group);
    let missing = format!("kvtier-mem-client-missing-{}", std::process::id());
    assert!(matches!(
        ArenaClient::open(&missing),
        Err(MemError::Io { op: "open", .. })
    ));
    assert!(matches!(
        ArenaClient::open("a/b"),
        Err(MemError::InvalidName { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// The fused copy-and-hash of `fill` gives exactly the checksums of
    /// `BlockSums::compute`, for any block and layer size, and leaves
    /// exactly the block's bytes in the slot.
    #[test]
    fn fill_sums_equal_block_sums_compute(
        block_bytes in 1usize..20_000,
        layer_frac in 0.0f64..1.0,
        k in any::<u128>(),
        seed in any::<u64>(),
    ) {
        let layer_bytes = ((block_bytes as f64 * layer_frac) as usize).max(1);
        let t = tier_with(block_bytes, layer_bytes, 1);
        let c = ArenaClient::open(t.shm_name()).unwrap();
        let key = BlockHash(k);
        let data: Vec<u8> = (0..block_bytes as u64)
            .map(|i| (seed.wrapping_add(i).wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as u8)
            .collect();
        let (r, slot) = reserve(&t, &c, key);
        // SAFETY: reserved for us; nothing else touches it until the commit.
        let sums = unsafe { c.fill(slot, key, &data) }.unwrap();
        prop_assert_eq!(&sums, &BlockSums::compute(key, layer_bytes, &data));
        prop_assert_eq!(r.commit(&sums).unwrap(), PutOutcome::Stored);
        let mut dst = vec![0u8; block_bytes];
        prop_assert_eq!(c.read(slot, key, &sums.layers, &mut dst).unwrap(), Lookup::Hit);
        prop_assert_eq!(dst, data);
    }
}
