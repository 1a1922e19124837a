//! [`TierStore`] for [`DiskTier`]: the disk log as one tier among others.
//! A thin adapter over the tier's own methods (reads straight into the
//! caller's targets, verified; writes copied into the region buffer).

use std::ops::Range;

use kvtier_core::{BlockHash, Lookup};
use std::sync::Arc;

use kvtier_tier::{
    BlockPut, BoxFuture, ReadDone, ReclaimListener, Reclaiming, Target, TierError, TierKind,
    TierStore,
};

use crate::DiskTier;

/// The log reclaims whole regions on its own: its owner's pool decides
/// which blocks a reclaim keeps.
impl Reclaiming for DiskTier {
    fn set_reclaim_listener(&self, listener: Arc<dyn ReclaimListener>) {
        DiskTier::set_reclaim_listener(self, listener)
    }

    fn live_capacity_blocks(&self) -> usize {
        DiskTier::live_capacity_blocks(self)
    }
}

impl TierStore for DiskTier {
    fn kind(&self) -> TierKind {
        TierKind::Disk
    }

    fn block_bytes(&self) -> u64 {
        self.geometry().block_bytes()
    }

    fn reclaiming(&self) -> Option<&dyn Reclaiming> {
        Some(self)
    }

    fn capacity_blocks(&self) -> usize {
        DiskTier::capacity_blocks(self)
    }

    fn len(&self) -> usize {
        DiskTier::len(self)
    }

    fn contains(&self, key: BlockHash) -> bool {
        DiskTier::contains(self, key)
    }

    fn remove<'a>(&'a self, keys: &'a [BlockHash]) -> BoxFuture<'a, usize> {
        let removed = keys.iter().filter(|k| DiskTier::remove(self, **k)).count();
        Box::pin(async move { removed })
    }

    fn keys(&self) -> BoxFuture<'_, Vec<BlockHash>> {
        let keys = DiskTier::keys(self);
        Box::pin(async move { keys })
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        let s = DiskTier::stats(self);
        vec![
            ("puts", s.puts),
            ("put_bytes", s.put_bytes),
            ("put_dups", s.put_dups),
            ("put_errors", s.put_errors),
            ("hits", s.hits),
            ("misses", s.misses),
            ("corrupt", s.corrupt),
            ("read_ios", s.read_ios),
            ("write_ios", s.write_ios),
            ("io_errors", s.io_errors),
            ("regions_reclaimed", s.regions_reclaimed),
            ("blocks_evicted", s.blocks_evicted),
        ]
    }

    fn read_into(
        &self,
        reqs: Vec<(BlockHash, Target)>,
        layers: Option<Range<u32>>,
    ) -> BoxFuture<'_, Vec<ReadDone>> {
        Box::pin(async move {
            let done = match layers {
                None => self.get_batch_with_sums(reqs).await,
                Some(layers) => self.read_layers_with_sums(reqs, layers).await,
            };
            done.into_iter()
                .map(|(target, lookup, sums)| match sums {
                    Some(sums) if lookup == Lookup::Hit => ReadDone::hit(target, sums),
                    _ => ReadDone::not_served(target, lookup),
                })
                .collect()
        })
    }

    fn put_batch<'a>(
        &'a self,
        puts: &'a [BlockPut<'a>],
    ) -> BoxFuture<'a, Vec<Result<(), TierError>>> {
        Box::pin(async move {
            TierError::storage_all(TierKind::Disk, DiskTier::put_batch(self, puts).await)
        })
    }
}
