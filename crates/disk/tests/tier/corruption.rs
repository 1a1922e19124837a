//! Damage on disk and from the engine: flipped bytes, a zeroed region, a
//! truncated file, injected bit flips and failed writes. Never wrong bytes.

use std::sync::Arc;

use kvtier_core::Lookup;
use kvtier_disk::{DiskError, DiskTier, RegionLayout};
use kvtier_io::{Fault, FaultyEngine, IoEngine, IoKind};

use crate::common::*;
use crate::{both_engines, both_layouts};

both_engines!(
    flipped_bytes_are_corrupt_never_served,
    zeroed_region_and_truncated_file,
    injected_bit_flips_are_caught,
    failed_writes_are_not_acknowledged_and_latch_the_dir,
);

async fn flipped_bytes_are_corrupt_never_served(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let blocks = Blocks::range(&g, 20, 0..40);
    let path;
    {
        let tier = DiskTier::open(config(d.clone(), 4 * REGION), kind.engine()).unwrap();
        put_all(&tier, &blocks, 40).await;
        path = tier.data_file(0).unwrap();
        // Flip one byte in the data of blocks 0..10 (at varying places).
        for (i, k) in blocks.keys[..10].iter().enumerate() {
            let loc = tier.location(*k).unwrap();
            let at = (i as u64 * 1601) % g.block_bytes();
            let (layer, byte) = (at / g.layer_bytes(), at % g.layer_bytes());
            let off = piece_offset(&tier, loc, layer as u32, byte);
            let b = peek(&path, off, 1);
            poke(&path, off, &[b[0] ^ 0x01]);
        }
        let out = get(&tier, &blocks.keys).await;
        for (i, (l, _)) in out.iter().enumerate() {
            assert_eq!(
                *l,
                if i < 10 { Lookup::Corrupt } else { Lookup::Hit },
                "block {i}"
            );
        }
        assert_eq!(tier.stats().corrupt, 10);
        // The corrupt ones were dropped: now plain misses.
        assert_eq!(tier.len(), 30);
        assert_eq!(get(&tier, &blocks.keys[..1]).await[0].0, Lookup::Miss);
        check_never_wrong(&tier, &blocks.keys).await;
        tier.close().await.unwrap();
    }
    // After a restart (checkpoint without them) and after a scan (they come
    // back from their slot headers), still never wrong bytes.
    let tier = DiskTier::open(config(d.clone(), 4 * REGION), kind.engine()).unwrap();
    assert_eq!(check_never_wrong(&tier, &blocks.keys).await, 30);
    drop(tier);
    std::fs::remove_file(d[0].join("kvtier-disk.index")).unwrap();
    let tier = DiskTier::open(config(d, 4 * REGION), kind.engine()).unwrap();
    assert_eq!(tier.len(), 40);
    assert_eq!(check_never_wrong(&tier, &blocks.keys).await, 30);
    assert_eq!(tier.stats().corrupt, 10);
}

async fn zeroed_region_and_truncated_file(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    // 51 slots per region: 120 blocks fill regions 0 and 1 and part of 2.
    let blocks = Blocks::range(&g, 21, 0..120);
    let tier = DiskTier::open(config(d.clone(), 4 * REGION), kind.engine()).unwrap();
    put_all(&tier, &blocks, 30).await;
    let path = tier.data_file(0).unwrap();
    let in_region = |r: u32| -> Vec<usize> {
        (0..120)
            .filter(|&i| tier.location(blocks.keys[i]).unwrap().region == r)
            .collect()
    };
    let r1 = in_region(1);
    let r2 = in_region(2);
    assert_eq!(r1.len(), 51);
    poke(&path, REGION, &vec![0u8; REGION as usize]);
    let out = get(&tier, &blocks.keys).await;
    for (i, (l, _)) in out.iter().enumerate() {
        let want = if r1.contains(&i) {
            Lookup::Corrupt
        } else {
            Lookup::Hit
        };
        assert_eq!(*l, want, "block {i}");
    }
    // Truncate the file in the middle of region 2's blocks (slot 9 of 18).
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let cut = match layout() {
        RegionLayout::Block => 2 * REGION + 4096 + 9 * 20480 + 8192,
        // Inside slot 9's last piece: the last row of region 2.
        RegionLayout::Layer => tier.layout().piece_offset(RegionLayout::Layer, 2, 3, 9) + 2048,
    };
    f.set_len(cut).unwrap();
    drop(f);
    let hits = check_never_wrong(&tier, &blocks.keys).await;
    assert_eq!(r2.len(), 18);
    assert_eq!(hits, 51 + 9, "{hits}");
    let corrupt = tier.stats().corrupt;
    assert!(corrupt > 51, "{corrupt}");
    assert!(r2.iter().any(|&i| !tier.contains(blocks.keys[i])));
    tier.close().await.unwrap();
    drop(tier);
    // Restart: the file is grown back (zeros), region 1 has no header.
    let tier = DiskTier::open(config(d.clone(), 4 * REGION), kind.engine()).unwrap();
    let hits = check_never_wrong(&tier, &blocks.keys).await;
    assert!(hits >= 51, "{hits}");
    for &i in &r1 {
        assert!(!tier.contains(blocks.keys[i]));
    }
    drop(tier);
    std::fs::remove_file(d[0].join("kvtier-disk.index")).unwrap();
    let tier = DiskTier::open(config(d, 4 * REGION), kind.engine()).unwrap();
    let hits = check_never_wrong(&tier, &blocks.keys).await;
    assert!(hits >= 51, "{hits}");
}

async fn injected_bit_flips_are_caught(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let faulty = Arc::new(FaultyEngine::new(kind.engine(), vec![]));
    let engine: Arc<dyn IoEngine> = faulty.clone();
    let tier = DiskTier::open(config(d, 4 * REGION), engine).unwrap();
    let blocks = Blocks::range(&g, 22, 0..60);
    put_all(&tier, &blocks, 20).await;
    // Every third block gets one flipped read (a block is one read
    // block-major, one per layer layer-major). Blocks are read one by one,
    // so no read carries two blocks (runs: `runs.rs`).
    let per_block = match layout() {
        RegionLayout::Block => 1,
        RegionLayout::Layer => g.layers as u64,
    };
    faulty.set_faults(vec![Fault::FlipBits {
        every: 3 * per_block,
    }]);
    let hits = check_never_wrong_by(&tier, &blocks.keys, 1).await;
    assert_eq!(hits, 40);
    assert_eq!(tier.stats().corrupt, 20);
    // Short reads (as from a truncated file) are caught too.
    faulty.set_faults(vec![Fault::ShortReads {
        every: 2 * per_block,
    }]);
    let hits = check_never_wrong_by(&tier, &blocks.keys, 1).await;
    assert_eq!(hits, 20);
    assert_eq!(tier.stats().corrupt, 40);
    // Layer reads: flipped layer bytes or a flipped header are caught.
    faulty.set_faults(vec![Fault::FlipBits { every: 1 }]);
    let lb = g.layer_bytes() as usize;
    let survivors: Vec<_> = blocks
        .keys
        .iter()
        .copied()
        .filter(|k| tier.contains(*k))
        .collect();
    let reqs = survivors
        .iter()
        .map(|k| (*k, kvtier_io::AlignedBuf::zeroed(lb, 4096)))
        .collect();
    for (_, l) in tier.read_layers(reqs, 1..2).await {
        assert_eq!(l, Lookup::Corrupt);
    }
    assert!(tier.is_empty());
}

async fn failed_writes_are_not_acknowledged_and_latch_the_dir(kind: Kind) {
    let (_t, d) = dirs(2);
    let g = geometry();
    let faulty = Arc::new(FaultyEngine::new(kind.engine(), vec![]));
    let engine: Arc<dyn IoEngine> = faulty.clone();
    let tier = DiskTier::open(config(d, 8 * REGION), engine).unwrap();
    let good = Blocks::range(&g, 23, 0..40);
    put_all(&tier, &good, 10).await;
    // Every write fails from now on: the next batch fails and latches the
    // directory it went to; the one after goes to the other directory and
    // fails too; then every put is refused.
    faulty.set_faults(vec![Fault::FailOps {
        kind: Some(IoKind::Write),
        errno: libc::EIO,
        every: 1,
    }]);
    let bad = Blocks::range(&g, 24, 0..30);
    let puts = bad.puts();
    let r = tier.put_batch(&puts[..10]).await;
    assert!(
        r.iter()
            .all(|r| matches!(r, Err(DiskError::WriteFailed { .. }))),
        "{r:?}"
    );
    assert_eq!(tier.stats().failed_dirs, 1);
    let r = tier.put_batch(&puts[10..20]).await;
    assert!(r.iter().all(|r| r.is_err()));
    assert_eq!(tier.stats().failed_dirs, 2);
    let r = tier.put_batch(&puts[20..]).await;
    assert!(r.iter().all(|r| matches!(r, Err(DiskError::AllDirsFailed))));
    for k in &bad.keys {
        assert!(!tier.contains(*k));
    }
    // Reads still work; nothing acknowledged was lost.
    faulty.set_faults(vec![]);
    check_all_hit(&tier, &good.keys).await;
    assert!(tier.stats().io_errors >= 2);
}

async fn a_failing_dir_does_not_stop_the_others() {
    let (_t, d) = dirs(2);
    let g = geometry();
    // Fail one write in a hundred: some batches fail and latch their
    // directory; everything acknowledged reads back.
    let faulty = Arc::new(FaultyEngine::new(
        Kind::Psync.engine(),
        vec![Fault::FailOps {
            kind: Some(IoKind::Write),
            errno: libc::ENOSPC,
            every: 7,
        }],
    ));
    let engine: Arc<dyn IoEngine> = faulty.clone();
    let tier = DiskTier::open(config(d, 8 * REGION), engine).unwrap();
    let blocks = Blocks::range(&g, 25, 0..120);
    let mut acked = Vec::new();
    for chunk in blocks.puts().chunks(5) {
        for (r, p) in tier.put_batch(chunk).await.into_iter().zip(chunk) {
            if r.is_ok() {
                acked.push(p.key);
            }
        }
    }
    assert!(tier.stats().failed_dirs >= 1);
    assert!(!acked.is_empty());
    faulty.set_faults(vec![]);
    check_all_hit(&tier, &acked).await;
}

both_layouts!(a_failing_dir_does_not_stop_the_others);
