//! The disk tier through the [`TierStore`] trait object: round trips of
//! whole blocks and layer ranges, a block damaged on disk never read as a
//! hit, keys and remove.

use std::sync::Arc;

use kvtier_disk::DiskTier;
use kvtier_tier::conformance::{self, TestBlock};
use kvtier_tier::{TierKind, TierStore};

use crate::both_engines;
use crate::common::*;

both_engines!(round_trip_keys_and_remove, a_damaged_block_is_never_a_hit);

fn blocks(n: u64) -> Vec<TestBlock> {
    let g = geometry();
    conformance::blocks(3, n, g.layers as usize, g.layer_bytes() as usize)
}

async fn round_trip_keys_and_remove(kind: Kind) {
    let (_t, d) = dirs(1);
    let store: Arc<dyn TierStore> =
        Arc::new(DiskTier::open(config(d, 4 * REGION), kind.engine()).unwrap());
    assert_eq!(store.kind(), TierKind::Disk);
    let b = blocks(12);
    conformance::put_all(&*store, &b).await;
    assert_eq!(store.len(), 12);
    let layer = geometry().layer_bytes() as usize;
    conformance::check_round_trip(&*store, &b, layer, 1..3).await;
    conformance::check_wrong_length_never_hit(&*store, &b[0]).await;
    assert!(store.contains(b[0].key), "the block is kept");
    conformance::check_keys_and_remove(&*store, &b).await;
}

async fn a_damaged_block_is_never_a_hit(kind: Kind) {
    let (_t, d) = dirs(1);
    let tier = Arc::new(DiskTier::open(config(d, 4 * REGION), kind.engine()).unwrap());
    let store: Arc<dyn TierStore> = tier.clone();
    let b = blocks(6);
    conformance::put_all(&*store, &b).await;
    let path = tier.data_file(0).unwrap();
    for damaged in &b[..2] {
        let off = piece_offset(&tier, tier.location(damaged.key).unwrap(), 1, 3);
        let byte = peek(&path, off, 1)[0];
        poke(&path, off, &[byte ^ 0x01]);
    }
    conformance::check_damaged_never_hit(&*store, &b[..2], &b[2..]).await;
    assert!(!store.contains(b[0].key), "the corrupt block was dropped");
}
