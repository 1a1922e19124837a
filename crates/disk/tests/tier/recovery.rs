//! Restart: clean close, lost checkpoint, stale checkpoint, mismatched
//! formats, no space.

use kvtier_core::{Geometry, Lookup};
use kvtier_disk::{DiskError, DiskTier};

use crate::common::*;
use crate::{both_engines, both_layouts};

both_engines!(
    restart_keeps_blocks,
    restart_without_checkpoint_scans,
    a_full_scan_of_many_regions_finds_every_block,
    stale_checkpoint_still_finds_later_blocks,
    damaged_checkpoint_is_ignored,
    prefill_runs_only_when_the_data_file_is_created,
);

async fn prefill_runs_only_when_the_data_file_is_created(kind: Kind) {
    let (_t, d) = dirs(2);
    let g = geometry();
    let blocks = Blocks::range(&g, 13, 0..150);
    let prefilled = || {
        let mut c = config(d.clone(), 6 * REGION);
        c.prefill = true;
        c
    };
    {
        let tier = DiskTier::open(prefilled(), kind.engine()).unwrap();
        put_all(&tier, &blocks, 7).await;
        tier.close().await.unwrap();
    }
    // Without the checkpoint the reopen must scan the slots themselves: a
    // second prefill would have zeroed them and the scan would find none.
    for dir in &d {
        std::fs::remove_file(dir.join("kvtier-disk.index")).unwrap();
    }
    let tier = DiskTier::open(prefilled(), kind.engine()).unwrap();
    assert_eq!(tier.len(), 150);
    assert_eq!(tier.stats().recovered_from_scan, 150);
    check_all_hit(&tier, &blocks.keys).await;
}

async fn restart_keeps_blocks(kind: Kind) {
    let (_t, d) = dirs(2);
    let g = geometry();
    let blocks = Blocks::range(&g, 10, 0..300);
    {
        let tier = DiskTier::open(config(d.clone(), 8 * REGION), kind.engine()).unwrap();
        put_all(&tier, &blocks, 32).await;
        tier.close().await.unwrap();
    }
    let tier = DiskTier::open(config(d.clone(), 8 * REGION), kind.engine()).unwrap();
    assert_eq!(tier.len(), 300);
    let s = tier.stats();
    assert_eq!(s.recovered_from_checkpoint, 300);
    assert_eq!(s.recovered_from_scan, 0);
    check_all_hit(&tier, &blocks.keys).await;
    // New writes after a restart go to new regions and survive the next one.
    let more = Blocks::range(&g, 11, 0..100);
    put_all(&tier, &more, 10).await;
    tier.close().await.unwrap();
    drop(tier);
    let tier = DiskTier::open(config(d, 8 * REGION), kind.engine()).unwrap();
    assert_eq!(tier.len(), 400);
    check_all_hit(&tier, &blocks.keys).await;
    check_all_hit(&tier, &more.keys).await;
}

async fn restart_without_checkpoint_scans(kind: Kind) {
    let (_t, d) = dirs(2);
    let g = geometry();
    let blocks = Blocks::range(&g, 12, 0..200);
    {
        let tier = DiskTier::open(config(d.clone(), 8 * REGION), kind.engine()).unwrap();
        put_all(&tier, &blocks, 9).await;
        tier.close().await.unwrap();
    }
    for dir in &d {
        std::fs::remove_file(dir.join("kvtier-disk.index")).unwrap();
    }
    let tier = DiskTier::open(config(d, 8 * REGION), kind.engine()).unwrap();
    assert_eq!(tier.len(), 200);
    let s = tier.stats();
    assert_eq!(s.recovered_from_checkpoint, 0);
    assert_eq!(s.recovered_from_scan, 200);
    check_all_hit(&tier, &blocks.keys).await;
}

/// A scan of more regions than two of its batches hold: its buffers are
/// reused from batch to batch, and no block may be lost or taken from a
/// stale buffer.
async fn a_full_scan_of_many_regions_finds_every_block(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    // 80 regions of 51 slots (one scan read each, at most 32 per batch).
    let blocks = Blocks::range(&g, 13, 0..80 * 51);
    {
        let tier = DiskTier::open(config(d.clone(), 100 * REGION), kind.engine()).unwrap();
        put_all(&tier, &blocks, 64).await;
        tier.close().await.unwrap();
    }
    std::fs::remove_file(d[0].join("kvtier-disk.index")).unwrap();
    let tier = DiskTier::open(config(d, 100 * REGION), kind.engine()).unwrap();
    let s = tier.stats();
    assert_eq!(s.recovered_from_checkpoint, 0);
    assert_eq!(s.recovered_from_scan, blocks.keys.len() as u64);
    assert!(s.recovery_slots_scanned >= blocks.keys.len() as u64);
    check_all_hit(&tier, &blocks.keys).await;
}

async fn stale_checkpoint_still_finds_later_blocks(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let early = Blocks::range(&g, 13, 0..70);
    let late = Blocks::range(&g, 14, 0..90);
    {
        let tier = DiskTier::open(config(d.clone(), 8 * REGION), kind.engine()).unwrap();
        put_all(&tier, &early, 10).await;
        tier.checkpoint().await.unwrap();
        put_all(&tier, &late, 10).await;
        // No close: the checkpoint is stale, as after a crash.
    }
    let tier = DiskTier::open(config(d, 8 * REGION), kind.engine()).unwrap();
    assert_eq!(tier.len(), 160);
    let s = tier.stats();
    assert_eq!(s.recovered_from_checkpoint, 70);
    assert_eq!(s.recovered_from_scan, 90);
    // Only the partly filled region (and those after it) were scanned.
    assert!(s.recovery_slots_scanned < 8 * 51);
    check_all_hit(&tier, &early.keys).await;
    check_all_hit(&tier, &late.keys).await;
}

async fn damaged_checkpoint_is_ignored(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let blocks = Blocks::range(&g, 15, 0..60);
    {
        let tier = DiskTier::open(config(d.clone(), 4 * REGION), kind.engine()).unwrap();
        put_all(&tier, &blocks, 20).await;
        tier.close().await.unwrap();
    }
    let p = d[0].join("kvtier-disk.index");
    let mut b = std::fs::read(&p).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0xff;
    std::fs::write(&p, b).unwrap();
    let tier = DiskTier::open(config(d, 4 * REGION), kind.engine()).unwrap();
    assert_eq!(tier.stats().recovered_from_checkpoint, 0);
    check_all_hit(&tier, &blocks.keys).await;
}

async fn mismatched_geometry_is_refused_or_reset() {
    let (_t, d) = dirs(1);
    {
        let tier = DiskTier::open(config(d.clone(), 4 * REGION), Kind::Psync.engine()).unwrap();
        put_all(&tier, &Blocks::range(&geometry(), 16, 0..5), 5).await;
        tier.close().await.unwrap();
    }
    let mut cfg = config(d.clone(), 4 * REGION);
    cfg.geometry = Geometry::raw(2, 16 << 10).unwrap();
    let e = DiskTier::open(cfg.clone(), Kind::Psync.engine()).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, DiskError::FormatMismatch { .. }), "{msg}");
    assert!(
        msg.contains(&d[0].display().to_string()) && msg.contains("layers"),
        "{msg}"
    );
    let mut other_size = config(d.clone(), 4 * REGION);
    other_size.region_size = 2 * REGION;
    let msg = DiskTier::open(other_size, Kind::Psync.engine())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("region size"), "{msg}");
    cfg.reset = true;
    let tier = DiskTier::open(cfg, Kind::Psync.engine()).unwrap();
    assert!(tier.is_empty());
}

async fn preallocation_beyond_the_disk_is_a_clear_no_space_error() {
    let (_t, d) = dirs(1);
    let cfg = config(d.clone(), 1 << 50);
    match DiskTier::open(cfg, Kind::Psync.engine()) {
        Err(e @ DiskError::NoSpace { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("no space left in") && msg.contains(&d[0].display().to_string()),
                "{msg}"
            );
        }
        Err(e @ DiskError::Io { .. }) => {
            // EFBIG on file systems whose files cannot be that large.
            eprintln!("refused with {e}");
        }
        other => panic!("expected NoSpace, got {other:?}"),
    }
}

async fn removed_blocks_are_gone_after_a_clean_restart() {
    let (_t, d) = dirs(1);
    let g = geometry();
    let blocks = Blocks::range(&g, 17, 0..20);
    {
        let tier = DiskTier::open(config(d.clone(), 4 * REGION), Kind::Psync.engine()).unwrap();
        put_all(&tier, &blocks, 20).await;
        assert!(tier.remove(blocks.keys[3]));
        tier.close().await.unwrap();
    }
    let tier = DiskTier::open(config(d, 4 * REGION), Kind::Psync.engine()).unwrap();
    assert_eq!(tier.len(), 19);
    assert_eq!(get(&tier, &blocks.keys[3..4]).await[0].0, Lookup::Miss);
}

both_layouts!(
    mismatched_geometry_is_refused_or_reset,
    preallocation_beyond_the_disk_is_a_clear_no_space_error,
    removed_blocks_are_gone_after_a_clean_restart
);
