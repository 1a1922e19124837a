//! [`TierStore`] for [`MemoryTier`]: the arena as one tier among others,
//! with the in-place facet (lend resident bytes, reserve slots as read
//! targets). A thin adapter over the tier's own methods.

use std::ops::Range;

use kvtier_core::{BlockHash, BlockSums, Lookup, copy_layer_checksum};
use kvtier_io::DmaTarget;
use kvtier_tier::{
    BlockPut, BoxFuture, InPlaceTier, Lent, ReadDone, Reserved, Target, TierError, TierKind,
    TierStore,
};

use super::{MemoryTier, PutOutcome, Reserve, SlotReservation};
use kvtier_arena::MemError;

fn from_put(key: BlockHash, outcome: Result<PutOutcome, MemError>) -> Result<(), TierError> {
    match outcome {
        Ok(PutOutcome::Stored | PutOutcome::AlreadyPresent) => Ok(()),
        Ok(PutOutcome::Full) => Err(TierError::Full),
        Err(MemError::ChecksumMismatch { .. }) => Err(TierError::Corrupt { key }),
        Err(e) => Err(TierError::storage(TierKind::Memory, e)),
    }
}

impl MemoryTier {
    /// Layers per block.
    fn layer_count(&self) -> usize {
        self.block_bytes() / self.inner.layer_bytes().max(1)
    }

    /// Copies layers `layers` of `key` into `target`, verifying each layer
    /// as it copies; a block that fails is dropped and reported corrupt.
    fn read_one(&self, key: BlockHash, mut target: Target, layers: &Range<u32>) -> ReadDone {
        let layer_bytes = self.inner.layer_bytes();
        let want = layers.len() * layer_bytes;
        if layers.end as usize > self.layer_count() {
            return ReadDone::not_served(target, Lookup::Miss);
        }
        if target.len() != want {
            let got = target.len();
            return ReadDone::failed(
                target,
                TierError::WrongLength {
                    expected: want,
                    got,
                },
            );
        }
        let Some(r) = self.get_ref(key) else {
            return ReadDone::not_served(target, Lookup::Miss);
        };
        // SAFETY: the target's memory is valid for its length (DmaTarget)
        // and private to us while we hold it.
        let dst = unsafe { std::slice::from_raw_parts_mut(target.as_mut_ptr(), want) };
        for (i, layer) in layers.clone().enumerate() {
            let at = layer as usize * layer_bytes;
            let out = &mut dst[i * layer_bytes..(i + 1) * layer_bytes];
            // SAFETY: the reference keeps the slot's block_bytes bytes
            // unwritten; `at + layer_bytes` is inside the block; the target
            // is other memory.
            let sum = unsafe { copy_layer_checksum(r.as_ptr().add(at), out, key, layer) };
            if r.shared_sums().layers.get(layer as usize) != Some(&sum) {
                self.drop_corrupt(&r, layer as usize);
                return ReadDone::not_served(target, Lookup::Corrupt);
            }
        }
        ReadDone::hit(target, r.sums())
    }
}

impl TierStore for MemoryTier {
    fn kind(&self) -> TierKind {
        TierKind::Memory
    }

    fn block_bytes(&self) -> u64 {
        MemoryTier::block_bytes(self) as u64
    }

    fn capacity_blocks(&self) -> usize {
        MemoryTier::capacity_blocks(self)
    }

    fn len(&self) -> usize {
        MemoryTier::len(self)
    }

    fn contains(&self, key: BlockHash) -> bool {
        MemoryTier::contains(self, key)
    }

    fn remove<'a>(&'a self, keys: &'a [BlockHash]) -> BoxFuture<'a, usize> {
        let removed = self.remove_many(keys);
        Box::pin(async move { removed })
    }

    fn keys(&self) -> BoxFuture<'_, Vec<BlockHash>> {
        let keys = MemoryTier::keys(self);
        Box::pin(async move { keys })
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        let s = MemoryTier::stats(self);
        vec![
            ("hits", s.hits),
            ("misses", s.misses),
            ("corrupt", s.corrupt),
            ("puts", s.puts),
            ("bytes_in", s.bytes_in),
            ("bytes_out", s.bytes_out),
            ("len", s.len),
            ("capacity", s.capacity),
        ]
    }

    fn read_into(
        &self,
        reqs: Vec<(BlockHash, Target)>,
        layers: Option<Range<u32>>,
    ) -> BoxFuture<'_, Vec<ReadDone>> {
        let layers = layers.unwrap_or(0..self.layer_count() as u32);
        let done = reqs
            .into_iter()
            .map(|(key, target)| self.read_one(key, target, &layers))
            .collect();
        Box::pin(async move { done })
    }

    fn put_batch<'a>(
        &'a self,
        puts: &'a [BlockPut<'a>],
    ) -> BoxFuture<'a, Vec<Result<(), TierError>>> {
        let results = puts
            .iter()
            .map(|p| from_put(p.key, self.put(p.key, p.data, p.sums)))
            .collect();
        Box::pin(async move { results })
    }

    fn in_place(&self) -> Option<&dyn InPlaceTier> {
        Some(self)
    }
}

impl InPlaceTier for MemoryTier {
    fn lend(&self, keys: &[BlockHash]) -> Vec<Option<Lent>> {
        keys.iter()
            .map(|k| {
                self.get_ref(*k).map(|r| Lent {
                    sums: r.sums_handle(),
                    bytes: std::sync::Arc::new(r),
                })
            })
            .collect()
    }

    fn reserve(&self, keys: &[BlockHash]) -> Vec<Reserved> {
        self.reserve_many(keys.iter().copied())
            .into_iter()
            .map(|r| match r {
                Reserve::Reserved(slot) => Reserved::Slot(Box::new(slot)),
                Reserve::AlreadyPresent => Reserved::Present,
                Reserve::Full => Reserved::Full,
            })
            .collect()
    }

    fn commit(&self, slot: Target, sums: &BlockSums) -> Result<(), TierError> {
        let slot = slot
            .into_any()
            .downcast::<SlotReservation>()
            .map_err(|_| TierError::ForeignSlot)?;
        let key = slot.key();
        from_put(key, slot.commit_verified(sums))
    }
}
