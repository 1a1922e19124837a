//! Region reclaim: filling past capacity, FIFO and LRU order, re-insertion
//! of hot blocks, and a region with a reader in flight.

use std::sync::Arc;

use kvtier_core::{BlockHash, Lookup, RegionEvictionKind};
use kvtier_disk::DiskTier;
use kvtier_io::{AlignedBuf, GatedEngine, Held, IoEngine};

use crate::common::*;
use crate::{both_engines, both_layouts};

both_engines!(
    filling_past_capacity_reclaims_oldest_first,
    lru_keeps_the_region_that_was_read,
    reinsert_hot_keeps_read_blocks,
    a_region_with_a_reader_in_flight_is_not_reclaimed,
);

const SLOTS: usize = 51;

/// The indices of `keys` whose block sits in `region`.
fn in_region(tier: &DiskTier, keys: &[BlockHash], region: u32) -> Vec<usize> {
    (0..keys.len())
        .filter(|&i| tier.location(keys[i]).is_some_and(|l| l.region == region))
        .collect()
}

async fn filling_past_capacity_reclaims_oldest_first(kind: Kind) {
    let (_t, d) = dirs(2);
    let g = geometry();
    let tier = DiskTier::open(config(d.clone(), 4 * REGION), kind.engine()).unwrap();
    let cap = tier.capacity_blocks();
    assert_eq!(cap, 2 * 4 * SLOTS);
    let blocks = Blocks::range(&g, 30, 0..1000);
    for chunk in blocks.puts().chunks(25) {
        for r in tier.put_batch(chunk).await {
            r.unwrap();
        }
        assert!(tier.len() <= cap);
    }
    let s = tier.stats();
    assert!(s.regions_reclaimed >= 10, "{s:?}");
    assert_eq!(s.blocks_evicted as usize + tier.len(), 1000);
    // FIFO: what survives is a suffix of what was written.
    let present: Vec<bool> = blocks.keys.iter().map(|k| tier.contains(*k)).collect();
    let first = present.iter().position(|p| *p).unwrap();
    assert!(
        present[first..].iter().all(|p| *p),
        "survivors are not the newest"
    );
    assert!(1000 - first >= cap - 2 * SLOTS);
    assert_eq!(check_never_wrong(&tier, &blocks.keys).await, 1000 - first);
    // Reclaimed regions come back after a restart with their new contents.
    tier.close().await.unwrap();
    drop(tier);
    let tier = DiskTier::open(config(d, 4 * REGION), kind.engine()).unwrap();
    assert_eq!(tier.len(), 1000 - first);
    check_all_hit(&tier, &blocks.keys[first..]).await;
}

async fn lru_keeps_the_region_that_was_read(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let mut cfg = config(d, 4 * REGION);
    cfg.eviction = RegionEvictionKind::Lru;
    let tier = DiskTier::open(cfg, kind.engine()).unwrap();
    let blocks = Blocks::range(&g, 31, 0..(4 * SLOTS) as u64);
    put_all(&tier, &blocks, SLOTS).await;
    let r0 = in_region(&tier, &blocks.keys, 0);
    let r1 = in_region(&tier, &blocks.keys, 1);
    let r2 = in_region(&tier, &blocks.keys, 2);
    assert_eq!(r0.len(), SLOTS);
    let r0_keys: Vec<BlockHash> = r0.iter().map(|&i| blocks.keys[i]).collect();
    check_all_hit(&tier, &r0_keys).await;
    // One more region's worth: LRU takes region 1 (never read, oldest).
    let more = Blocks::range(&g, 32, 0..SLOTS as u64);
    put_all(&tier, &more, SLOTS).await;
    assert!(r0.iter().all(|&i| tier.contains(blocks.keys[i])));
    assert!(r1.iter().all(|&i| !tier.contains(blocks.keys[i])));
    assert!(r2.iter().all(|&i| tier.contains(blocks.keys[i])));
    let more2 = Blocks::range(&g, 33, 0..SLOTS as u64);
    put_all(&tier, &more2, SLOTS).await;
    assert!(r0.iter().all(|&i| tier.contains(blocks.keys[i])));
    assert!(r2.iter().all(|&i| !tier.contains(blocks.keys[i])));
    check_all_hit(&tier, &r0_keys).await;
}

async fn reinsert_hot_keeps_read_blocks(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let mut cfg = config(d, 4 * REGION);
    cfg.reinsert_hot = true;
    let tier = DiskTier::open(cfg, kind.engine()).unwrap();
    let blocks = Blocks::range(&g, 34, 0..(4 * SLOTS) as u64);
    put_all(&tier, &blocks, SLOTS).await;
    let r0 = in_region(&tier, &blocks.keys, 0);
    let hot: Vec<BlockHash> = r0[..5].iter().map(|&i| blocks.keys[i]).collect();
    let cold: Vec<BlockHash> = r0[5..].iter().map(|&i| blocks.keys[i]).collect();
    check_all_hit(&tier, &hot).await;
    let more = Blocks::range(&g, 35, 0..20);
    put_all(&tier, &more, 20).await;
    let s = tier.stats();
    assert_eq!(s.regions_reclaimed, 1);
    assert_eq!(s.reinserted, 5);
    for k in &cold {
        assert!(!tier.contains(*k));
    }
    check_all_hit(&tier, &hot).await;
    check_all_hit(&tier, &more.keys).await;
    // The hot blocks live in the region's new life now, and survive a restart.
    assert!(hot.iter().all(|k| tier.location(*k).unwrap().region == 0));
    tier.close().await.unwrap();
}

async fn a_region_with_a_reader_in_flight_is_not_reclaimed(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let gate = Arc::new(GatedEngine::new(kind.engine()));
    let engine: Arc<dyn IoEngine> = gate.clone();
    let tier = DiskTier::open(config(d, 4 * REGION), engine).unwrap();
    let blocks = Blocks::range(&g, 36, 0..(4 * SLOTS) as u64);
    put_all(&tier, &blocks, SLOTS).await;
    let r0 = in_region(&tier, &blocks.keys, 0);
    let r1 = in_region(&tier, &blocks.keys, 1);
    let k0 = blocks.keys[r0[0]];
    gate.hold(Held::Reads);
    let reader = {
        let tier = tier.clone();
        tokio::spawn(async move {
            let len = tier.geometry().block_bytes() as usize;
            tier.get_batch(vec![(k0, AlignedBuf::zeroed(len, 4096))])
                .await
        })
    };
    // The read is submitted (region 0 pinned) and held.
    gate.wait_held(1).await;
    gate.stop_holding(Held::Reads);
    // FIFO would take region 0; its reader makes reclaim take region 1.
    let more = Blocks::range(&g, 37, 0..10);
    put_all(&tier, &more, 10).await;
    assert!(r0.iter().all(|&i| tier.contains(blocks.keys[i])));
    assert!(r1.iter().all(|&i| !tier.contains(blocks.keys[i])));
    gate.open();
    let out = reader.await.unwrap();
    assert_eq!(out[0].1, Lookup::Hit);
    assert!(out[0].0[..] == content(k0, g.block_bytes() as usize));
    // With the reader gone, region 0 is the next victim.
    let more2 = Blocks::range(&g, 38, 0..(SLOTS as u64));
    put_all(&tier, &more2, SLOTS).await;
    assert!(r0.iter().all(|&i| !tier.contains(blocks.keys[i])));
    check_all_hit(&tier, &more.keys).await;
}

async fn no_reclaimable_region_refuses_the_put_without_losing_anything() {
    // One region, full, with a reader in flight: nothing can be reclaimed.
    let (_t, d) = dirs(1);
    let g = geometry();
    let gate = Arc::new(GatedEngine::new(Kind::Psync.engine()));
    let engine: Arc<dyn IoEngine> = gate.clone();
    let tier = DiskTier::open(config(d, REGION), engine).unwrap();
    let blocks = Blocks::range(&g, 39, 0..SLOTS as u64);
    put_all(&tier, &blocks, SLOTS).await;
    gate.hold(Held::Reads);
    let reader = {
        let tier = tier.clone();
        let k = blocks.keys[0];
        tokio::spawn(async move {
            let len = tier.geometry().block_bytes() as usize;
            tier.get_batch(vec![(k, AlignedBuf::zeroed(len, 4096))])
                .await
        })
    };
    gate.wait_held(1).await;
    let more = Blocks::range(&g, 40, 0..3);
    let r = tier.put_batch(&more.puts()).await;
    assert!(
        r.iter()
            .all(|r| matches!(r, Err(kvtier_disk::DiskError::NoRegion { .. }))),
        "{r:?}"
    );
    gate.open();
    assert_eq!(reader.await.unwrap()[0].1, Lookup::Hit);
    check_all_hit(&tier, &blocks.keys).await;
    // With the reader gone the region is reclaimed and the put succeeds.
    put_all(&tier, &more, 3).await;
    check_all_hit(&tier, &more.keys).await;
}

both_layouts!(no_reclaimable_region_refuses_the_put_without_losing_anything);
