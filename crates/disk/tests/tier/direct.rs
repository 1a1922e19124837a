//! Writes straight from pinned bytes (`BlockPut::pinned`): no copy into the
//! region buffer where the source suits direct I/O, a copy where it does
//! not, and the same bytes on disk either way.

use std::sync::Arc;

use kvtier_disk::DiskTier;
use kvtier_io::{AlignedBuf, DmaSource};
use kvtier_tier::BlockPut;

use crate::both_engines;
use crate::common::*;

both_engines!(pinned_blocks_are_written_without_a_copy_and_read_back_exactly,);

/// Bytes one past the start of an aligned buffer: never fit for direct I/O.
struct Shifted(AlignedBuf, usize);

// SAFETY: a view into an AlignedBuf nobody writes; its heap memory does not
// move.
unsafe impl DmaSource for Shifted {
    fn bytes(&self) -> &[u8] {
        &self.0[1..1 + self.1]
    }
}

fn aligned_copy(bytes: &[u8]) -> Arc<dyn DmaSource> {
    let mut b = AlignedBuf::zeroed(bytes.len(), 4096);
    b.copy_from_slice(bytes);
    Arc::new(b)
}

async fn pinned_blocks_are_written_without_a_copy_and_read_back_exactly(kind: Kind) {
    let (_t, d) = dirs(1);
    let cfg = config(d, 8 * REGION);
    let g = geometry();
    let len = g.block_bytes() as usize;
    let tier = DiskTier::open(cfg.clone(), kind.engine()).unwrap();
    // More than a region's worth, so extents cross regions (and carry
    // region headers), mixing direct and copied slots in one extent.
    let blocks = Blocks::range(&g, 41, 0..120);
    let sources: Vec<Arc<dyn DmaSource>> = blocks
        .keys
        .iter()
        .zip(&blocks.data)
        .enumerate()
        .map(|(i, (_, data))| match i % 4 {
            // Misaligned: copied.
            3 => {
                let mut b = AlignedBuf::zeroed(len + 1, 4096);
                b[1..].copy_from_slice(data);
                Arc::new(Shifted(b, len)) as Arc<dyn DmaSource>
            }
            _ => aligned_copy(data),
        })
        .collect();
    // A source whose bytes are not `data` is ignored: `data` is what the
    // caller vouched for with its checksums.
    let decoy = aligned_copy(&vec![0xEE; len]);
    let puts: Vec<BlockPut<'_>> = (0..blocks.keys.len())
        .map(|i| {
            let (data, pinned) = match i % 4 {
                0 | 3 => (sources[i].bytes(), Some(&sources[i])),
                1 => (&blocks.data[i][..], None),
                _ => (&blocks.data[i][..], Some(&decoy)),
            };
            BlockPut {
                key: blocks.keys[i],
                data,
                sums: &blocks.sums[i],
                pinned,
            }
        })
        .collect();
    for chunk in puts.chunks(7) {
        for r in tier.put_batch(chunk).await {
            r.unwrap();
        }
    }
    let direct = puts.iter().enumerate().filter(|(i, _)| i % 4 == 0).count();
    assert_eq!(tier.stats().direct_writes, direct as u64);
    check_all_hit(&tier, &blocks.keys).await;
    // The write holds its sources only until it is acknowledged.
    drop(puts);
    assert!(sources.iter().all(|s| Arc::strong_count(s) == 1));
    // And what is on disk survives a restart, slot headers included.
    tier.close().await.unwrap();
    drop(tier);
    let tier = DiskTier::open(cfg, kind.engine()).unwrap();
    check_all_hit(&tier, &blocks.keys).await;
}
