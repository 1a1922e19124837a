//! Writes and reads: round trips, duplicates, misaligned targets, layer
//! reads, wrong lengths, concurrency.

use kvtier_core::{BlockHash, BlockSums, Lookup};
use kvtier_disk::{DiskError, DiskTier};
use kvtier_io::AlignedBuf;
use kvtier_tier::BlockPut;

use crate::common::*;
use crate::{both_engines, both_layouts};

both_engines!(
    round_trip_over_two_dirs,
    misaligned_targets_are_bounced,
    layer_reads_return_exact_bytes_and_catch_a_bad_layer,
    wrong_lengths_are_refused,
    concurrent_puts_and_gets,
    odd_sizes_use_bounce_buffers,
    writes_leave_in_ops_of_at_most_write_op_bytes,
);

async fn odd_sizes_use_bounce_buffers(kind: Kind) {
    // 1000-byte layers: neither blocks nor layers are sector multiples.
    let (_t, d) = dirs(1);
    let g = kvtier_core::Geometry::raw(3, 3000).unwrap();
    let mut cfg = config(d.clone(), 4 * REGION);
    cfg.geometry = g;
    if layout() == kvtier_disk::RegionLayout::Layer {
        // Not eligible: layers must be whole sectors.
        let e = DiskTier::open(cfg, kind.engine()).unwrap_err();
        assert!(matches!(e, DiskError::InvalidConfig(_)), "{e}");
        return;
    }
    let tier = DiskTier::open(cfg.clone(), kind.engine()).unwrap();
    let blocks = Blocks::range(&g, 5, 0..300);
    put_all(&tier, &blocks, 64).await;
    check_all_hit(&tier, &blocks.keys).await;
    let reqs = blocks.keys[..50]
        .iter()
        .map(|k| (*k, AlignedBuf::zeroed(1000, 4096)))
        .collect();
    for ((buf, l), k) in tier
        .read_layers(reqs, 1..2)
        .await
        .into_iter()
        .zip(&blocks.keys)
    {
        assert_eq!(l, Lookup::Hit);
        assert!(buf[..] == content(*k, 3000)[1000..2000]);
    }
    tier.close().await.unwrap();
    drop(tier);
    let tier = DiskTier::open(cfg, kind.engine()).unwrap();
    check_all_hit(&tier, &blocks.keys).await;
}

async fn periodic_checkpoints_run_in_the_background() {
    let (_t, d) = dirs(1);
    let mut cfg = config(d.clone(), 2 * REGION);
    cfg.checkpoint_interval = std::time::Duration::from_millis(20);
    let tier = DiskTier::open(cfg.clone(), Kind::Psync.engine()).unwrap();
    let blocks = Blocks::range(&geometry(), 6, 0..30);
    put_all(&tier, &blocks, 30).await;
    let before = tier.stats().checkpoints;
    // Wait (bounded) for the thread to take one after the writes.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while tier.stats().checkpoints < before + 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "no periodic checkpoint"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // A second tier cannot open the directory while this one has it.
    let e = DiskTier::open(config(d.clone(), 2 * REGION), Kind::Psync.engine()).unwrap_err();
    assert!(matches!(e, kvtier_disk::DiskError::Locked { .. }), "{e}");
    // Close joins the checkpoint thread, so dropping the handle releases
    // the directory at once.
    tier.close().await.unwrap();
    drop(tier);
    let tier = DiskTier::open(config(d, 2 * REGION), Kind::Psync.engine()).unwrap();
    assert_eq!(tier.stats().recovered_from_checkpoint, 30);
}

async fn round_trip_over_two_dirs(kind: Kind) {
    let (_t, d) = dirs(2);
    let g = geometry();
    let tier = DiskTier::open(config(d, 8 * REGION), kind.engine()).unwrap();
    assert_eq!(tier.capacity_blocks(), 2 * 8 * 51);
    let blocks = Blocks::range(&g, 1, 0..150);
    put_all(&tier, &blocks, 16).await;
    assert_eq!(tier.len(), 150);
    check_all_hit(&tier, &blocks.keys).await;
    // Both directories took blocks.
    let dirs_used: std::collections::BTreeSet<u8> = blocks
        .keys
        .iter()
        .map(|k| tier.location(*k).unwrap().dir)
        .collect();
    assert_eq!(dirs_used.len(), 2);
    // Absent keys miss; present ones are not rewritten.
    let absent = get(&tier, &[key(99, 0)]).await;
    assert_eq!(absent[0].0, Lookup::Miss);
    let writes = tier.stats().write_ios;
    let again = tier.put_batch(&blocks.puts()[..10]).await;
    assert!(again.iter().all(|r| r.is_ok()));
    assert_eq!(tier.stats().write_ios, writes);
    assert_eq!(tier.stats().put_dups, 10);
    // Duplicates inside one batch are written once.
    let b2 = Blocks::range(&g, 2, 0..1);
    let p = b2.puts();
    let res = tier.put_batch(&[p[0], p[0], p[0]]).await;
    assert!(res.iter().all(|r| r.is_ok()));
    assert_eq!(tier.len(), 151);
    let s = tier.stats();
    assert_eq!(s.puts, 151);
    assert_eq!(s.hits, 150);
    assert_eq!(s.misses, 1);
    assert_eq!(s.corrupt, 0);
    if kind == Kind::Uring {
        // Region buffers were registered: writes used fixed buffers.
        assert!(tier.engine().stats().fixed_buffer_ops > 0);
    }
    // Remove and contains.
    assert!(tier.contains(blocks.keys[0]));
    assert!(tier.remove(blocks.keys[0]));
    assert!(!tier.remove(blocks.keys[0]));
    assert_eq!(get(&tier, &blocks.keys[..1]).await[0].0, Lookup::Miss);
    tier.close().await.unwrap();
    let closed = tier.put_batch(&b2.puts()).await;
    assert!(matches!(closed[0], Err(DiskError::Closed)));
    // Reads still work after close.
    check_all_hit(&tier, &blocks.keys[1..]).await;
}

async fn misaligned_targets_are_bounced(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let tier = DiskTier::open(config(d, 4 * REGION), kind.engine()).unwrap();
    let blocks = Blocks::range(&g, 3, 0..8);
    put_all(&tier, &blocks, 8).await;
    let len = g.block_bytes() as usize;
    let reqs = blocks
        .keys
        .iter()
        .map(|k| (*k, Misaligned::new(len)))
        .collect();
    let out = tier.get_batch(reqs).await;
    for ((t, l), k) in out.iter().zip(&blocks.keys) {
        assert_eq!(*l, Lookup::Hit);
        assert!(t.bytes() == content(*k, len));
    }
    // Layer reads into misaligned targets too (layer 1 starts 4 KiB in).
    let lb = g.layer_bytes() as usize;
    let reqs = vec![(blocks.keys[0], Misaligned::new(lb * 2))];
    let out = tier.read_layers(reqs, 1..3).await;
    assert_eq!(out[0].1, Lookup::Hit);
    assert!(out[0].0.bytes() == &content(blocks.keys[0], len)[lb..3 * lb]);
}

async fn layer_reads_return_exact_bytes_and_catch_a_bad_layer(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let tier = DiskTier::open(config(d.clone(), 4 * REGION), kind.engine()).unwrap();
    let blocks = Blocks::range(&g, 4, 0..6);
    put_all(&tier, &blocks, 6).await;
    let lb = g.layer_bytes() as usize;
    let len = g.block_bytes() as usize;
    for (a, b) in [(0u32, 1u32), (1, 3), (3, 4), (0, 4)] {
        let n = (b - a) as usize;
        let reqs = blocks
            .keys
            .iter()
            .map(|k| (*k, AlignedBuf::zeroed(n * lb, 4096)))
            .collect();
        for ((buf, l), k) in tier
            .read_layers(reqs, a..b)
            .await
            .into_iter()
            .zip(&blocks.keys)
        {
            assert_eq!(l, Lookup::Hit, "layers {a}..{b}");
            assert!(buf[..] == content(*k, len)[a as usize * lb..b as usize * lb]);
        }
    }
    // Corrupt layer 2 of block 0 on disk: layers 0..2 still verify, 2..3 not.
    let k = blocks.keys[0];
    let loc = tier.location(k).unwrap();
    let off = piece_offset(&tier, loc, 2, 100);
    let path = tier.data_file(0).unwrap();
    let orig = peek(&path, off, 1);
    poke(&path, off, &[orig[0] ^ 0x40]);
    let ok = tier
        .read_layers(vec![(k, AlignedBuf::zeroed(2 * lb, 4096))], 0..2)
        .await;
    assert_eq!(ok[0].1, Lookup::Hit);
    let bad = tier
        .read_layers(vec![(k, AlignedBuf::zeroed(lb, 4096))], 2..3)
        .await;
    assert_eq!(bad[0].1, Lookup::Corrupt);
    assert_eq!(tier.stats().corrupt, 1);
    assert!(!tier.contains(k));
    // A damaged slot header (its layer sums no longer verify): while the
    // block's layer sums are cached (authenticated when its layers were read
    // above) the header is not read again and the bytes, which are intact,
    // still verify against the cached sums.
    let k1 = blocks.keys[1];
    let loc = tier.location(k1).unwrap();
    let hoff = header_offset(&tier, loc) + 70;
    let orig = peek(&path, hoff, 1);
    poke(&path, hoff, &[orig[0] ^ 1]);
    let cached = tier
        .read_layers(vec![(k1, AlignedBuf::zeroed(lb, 4096))], 0..1)
        .await;
    assert_eq!(cached[0].1, Lookup::Hit);
    assert!(cached[0].0[..] == content(k1, len)[..lb]);
    // With the cache cold (a restart), the damaged header is read and caught.
    tier.close().await.unwrap();
    drop(tier);
    let tier = DiskTier::open(config(d, 4 * REGION), kind.engine()).unwrap();
    let bad = tier
        .read_layers(vec![(k1, AlignedBuf::zeroed(lb, 4096))], 0..1)
        .await;
    assert_eq!(bad[0].1, Lookup::Corrupt);
    // Invalid ranges are misses, not panics.
    let out = tier
        .read_layers(vec![(blocks.keys[2], AlignedBuf::zeroed(lb, 4096))], 4..5)
        .await;
    assert_eq!(out[0].1, Lookup::Miss);
}

async fn wrong_lengths_are_refused(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let tier = DiskTier::open(config(d, 4 * REGION), kind.engine()).unwrap();
    let k = BlockHash(5);
    let short = vec![0u8; 100];
    let sums = BlockSums::compute(k, 25, &short);
    let r = tier
        .put_batch(&[BlockPut {
            key: k,
            data: &short,
            sums: &sums,
            pinned: None,
        }])
        .await;
    assert!(matches!(r[0], Err(DiskError::WrongLength { .. })));
    let full = content(k, g.block_bytes() as usize);
    let bad_sums = BlockSums {
        block: 0,
        layers: vec![1, 2],
    };
    let r = tier
        .put_batch(&[BlockPut {
            key: k,
            data: &full,
            sums: &bad_sums,
            pinned: None,
        }])
        .await;
    assert!(matches!(
        r[0],
        Err(DiskError::WrongLength {
            what: "layer checksums",
            ..
        })
    ));
    assert!(tier.is_empty());
    // A checksum that does not match the bytes is stored as given (carried,
    // not recomputed) and caught on read.
    let lying = BlockSums::compute(BlockHash(6), g.layer_bytes() as usize, &full);
    let r = tier
        .put_batch(&[BlockPut {
            key: k,
            data: &full,
            sums: &lying,
            pinned: None,
        }])
        .await;
    assert!(r[0].is_ok());
    assert_eq!(get(&tier, &[k]).await[0].0, Lookup::Corrupt);
    // A target of the wrong length is a miss.
    let out = tier
        .get_batch(vec![(k, AlignedBuf::zeroed(4096, 4096))])
        .await;
    assert_eq!(out[0].1, Lookup::Miss);
}

async fn concurrent_puts_and_gets(kind: Kind) {
    let (_t, d) = dirs(2);
    let g = geometry();
    let tier = DiskTier::open(config(d, 8 * REGION), kind.engine()).unwrap();
    let mut tasks = Vec::new();
    for t in 0..6u64 {
        let tier = tier.clone();
        tasks.push(tokio::spawn(async move {
            let blocks = Blocks::range(&geometry(), 100 + t, 0..60);
            for chunk in blocks.puts().chunks(7) {
                for r in tier.put_batch(chunk).await {
                    r.unwrap();
                }
                let keys: Vec<BlockHash> = chunk.iter().map(|p| p.key).collect();
                check_all_hit(&tier, &keys).await;
            }
            blocks.keys
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    assert_eq!(tier.len(), all.len());
    check_all_hit(&tier, &all).await;
    let _ = g;
}

both_layouts!(periodic_checkpoints_run_in_the_background);

async fn writes_leave_in_ops_of_at_most_write_op_bytes(kind: Kind) {
    let g = geometry();
    // One extent of 10 slots (4 KiB header + 16 KiB block each) at a
    // region's start, after the 4 KiB region header, copied into the region
    // buffer. Block-major it is one run of 204 KiB; layer-major, row 0 (84
    // KiB with the region header) and three rows of 40 KiB.
    let ceil = |n: u64, op: u64| n.div_ceil(op);
    let block_ops = |op| ceil(4096 + 10 * 20480, op);
    let layer_ops = |op| ceil(4096 + 10 * 8192, op) + 3 * ceil(10 * 4096, op);
    for op_bytes in [kvtier_disk::DEFAULT_WRITE_OP_BYTES, 8192, 4096] {
        let (_t, d) = dirs(1);
        let mut cfg = config(d, 4 * REGION);
        cfg.write_op_bytes = op_bytes;
        let tier = DiskTier::open(cfg, kind.engine()).unwrap();
        let blocks = Blocks::range(&g, 31, 0..10);
        let before = tier.stats().write_ios;
        put_all(&tier, &blocks, 10).await;
        let ops = tier.stats().write_ios - before;
        let want = match layout() {
            kvtier_disk::RegionLayout::Block => block_ops(op_bytes),
            kvtier_disk::RegionLayout::Layer => layer_ops(op_bytes),
        };
        assert_eq!(ops, want, "write_op_bytes {op_bytes}");
        check_all_hit(&tier, &blocks.keys).await;
    }
    // Not a multiple of 4096, or out of range: refused at open.
    for bad in [0, 1000, 128 << 20] {
        let (_t, d) = dirs(1);
        let mut cfg = config(d, 4 * REGION);
        cfg.write_op_bytes = bad;
        let e = DiskTier::open(cfg, kind.engine()).unwrap_err();
        assert!(matches!(e, DiskError::InvalidConfig(_)), "{e}");
    }
}
