//! Executors: one batch of blocks along one path, over the real tiers,
//! through their one trait ([`TierStore`], kvtier-tier) and its one move
//! rule:
//!
//! - **source bytes**: lent in place by a source with the in-place facet
//!   (the arena's `BlockRef`s, no copy), else a verified
//!   [`read_into`](TierStore::read_into) into the destination's reserved
//!   in-place slots (the arena: the read lands where the block will live; per
//!   layer into a [`HostLanding`](super::HostLanding)) or into bounce
//!   buffers;
//! - **destination**: the verified slot committed with the sums the read
//!   returned (the layer that completes a landing commits it), or a
//!   [`put_batch`](TierStore::put_batch) of the bytes with their sums (one
//!   call; a disk writes lent bytes straight from the arena).
//!
//! A block that fails anywhere is reported and never made visible at the
//! destination: reserved slots are dropped uncommitted.

use kvtier_arena::MemError;
use kvtier_core::{BlockHash, BlockSums, Geometry, Lookup};
use kvtier_io::AlignedBuf;
use kvtier_mem::PutOutcome;
use kvtier_tier::{BlockPut, InPlaceTier, Lent, ReadDone, Reserved, Target, TierError, TierStore};

use super::landing::{HostLanding, LayerTarget};
use super::request::{BlockFailure, BlockMove, BlockResult, Span};
use crate::tier::{TierList, TransferPath};

/// Alignment of bounce buffers for disk reads (direct I/O).
const BOUNCE_ALIGN: usize = 4096;

fn tier_err(e: impl std::fmt::Display) -> BlockFailure {
    BlockFailure::Tier(e.to_string())
}

fn from_put(outcome: Result<PutOutcome, MemError>) -> BlockResult {
    match outcome {
        Ok(PutOutcome::Stored | PutOutcome::AlreadyPresent) => Ok(()),
        Ok(PutOutcome::Full) => Err(BlockFailure::Full),
        Err(MemError::ChecksumMismatch { .. }) => Err(BlockFailure::Corrupt),
        Err(e) => Err(tier_err(e)),
    }
}

fn lookup_failure(l: Lookup) -> BlockFailure {
    match l {
        Lookup::Corrupt => BlockFailure::Corrupt,
        Lookup::Miss | Lookup::Hit => BlockFailure::Miss,
    }
}

/// Runs one batch; one result per block, in order.
pub(crate) async fn execute(
    tiers: &TierList,
    path: TransferPath,
    span: Span,
    blocks: &[BlockMove],
) -> Vec<BlockResult> {
    let (Some(from), Some(to)) = (tiers.store(path.from), tiers.store(path.to)) else {
        return vec![Err(BlockFailure::Unsupported(path)); blocks.len()];
    };
    let (from, to) = (from.as_ref(), to.as_ref());
    let geometry = tiers.geometry();
    if let Err(e) = check_span(geometry, path, to, span) {
        return vec![Err(e); blocks.len()];
    }
    match span {
        Span::Block => move_blocks(from, to, geometry, blocks).await,
        Span::Layer(layer) => read_landings(from, layer, blocks).await,
    }
}

/// Layer spans only make sense into host landings (layer-wise loading):
/// reads into a tier with the in-place facet.
fn check_span(
    geometry: &Geometry,
    path: TransferPath,
    to: &dyn TierStore,
    span: Span,
) -> Result<(), BlockFailure> {
    match span {
        Span::Block => Ok(()),
        Span::Layer(l) => {
            if !path.is_read() || to.in_place().is_none() {
                return Err(BlockFailure::InvalidRequest(format!(
                    "layer spans are for onboarding into host landings, not {path}"
                )));
            }
            if l >= geometry.layers {
                return Err(BlockFailure::InvalidRequest(format!(
                    "layer {l} of {}",
                    geometry.layers
                )));
            }
            Ok(())
        }
    }
}

fn no_landing() -> BlockFailure {
    BlockFailure::InvalidRequest("a layer read into host memory needs a landing slot".into())
}

/// A tier's refusal as a block failure.
fn failure(e: TierError) -> BlockFailure {
    match e {
        TierError::Full => BlockFailure::Full,
        TierError::Corrupt { .. } => BlockFailure::Corrupt,
        TierError::Storage { source, .. } => BlockFailure::Tier(source.to_string()),
        e @ (TierError::ForeignSlot | TierError::WrongLength { .. }) => tier_err(e),
    }
}

/// A read's target and the sums its bytes were verified against, or why
/// the block failed.
fn verified(done: ReadDone) -> Result<(Target, BlockSums), BlockFailure> {
    if let Some(e) = done.error {
        return Err(failure(e));
    }
    match (done.lookup, done.sums) {
        (Lookup::Hit, Some(sums)) => Ok((done.target, sums)),
        (Lookup::Hit, None) => Err(BlockFailure::Tier("a hit without checksums".into())),
        (other, _) => Err(lookup_failure(other)),
    }
}

/// Whole blocks from `from` to `to` by the one move rule.
async fn move_blocks(
    from: &dyn TierStore,
    to: &dyn TierStore,
    geometry: &Geometry,
    blocks: &[BlockMove],
) -> Vec<BlockResult> {
    let keys: Vec<BlockHash> = blocks.iter().map(|b| b.key).collect();
    if let Some(source) = from.in_place() {
        return put_lent(source, to, &keys).await;
    }
    let mut results: Vec<BlockResult> = vec![Err(BlockFailure::Abandoned); blocks.len()];
    let slots = to.in_place();
    let (reqs, which) = match slots {
        Some(dst) => reserved_targets(dst, &keys, &mut results),
        None => bounce_targets(&keys, geometry.block_bytes() as usize),
    };
    if reqs.is_empty() {
        return results;
    }
    // One read of the source; every byte verified by it.
    let mut hits = Vec::new();
    for (done, i) in from.read_into(reqs, None).await.into_iter().zip(which) {
        match verified(done) {
            Ok((target, sums)) => hits.push((i, target, sums)),
            Err(f) => results[i] = Err(f),
        }
    }
    match slots {
        // The source verified these very slot bytes against `sums`.
        Some(dst) => {
            for (i, slot, sums) in hits {
                results[i] = dst.commit(slot, &sums).map_err(failure);
            }
        }
        None => put_bounced(to, &keys, hits, &mut results).await,
    }
    results
}

/// The source's resident blocks, lent in place, written to `to` in one
/// batch with the sums they were stored with; a block not resident is a
/// miss.
async fn put_lent(
    source: &dyn InPlaceTier,
    to: &dyn TierStore,
    keys: &[BlockHash],
) -> Vec<BlockResult> {
    let mut results: Vec<BlockResult> = vec![Err(BlockFailure::Abandoned); keys.len()];
    let mut lent: Vec<(usize, Lent)> = Vec::new();
    for (i, l) in source.lend(keys).into_iter().enumerate() {
        match l {
            Some(l) => lent.push((i, l)),
            None => results[i] = Err(BlockFailure::Miss),
        }
    }
    if lent.is_empty() {
        return results;
    }
    let puts: Vec<BlockPut<'_>> = lent
        .iter()
        .map(|(i, l)| BlockPut {
            key: keys[*i],
            data: l.bytes.bytes(),
            sums: &l.sums,
            pinned: Some(&l.bytes),
        })
        .collect();
    let written = to.put_batch(&puts).await;
    for ((i, _), res) in lent.iter().zip(written) {
        results[*i] = res.map_err(failure);
    }
    results
}

/// A reserved in-place slot per key as a read target, and the keys'
/// indices; a key already held is done, a full tier fails it.
fn reserved_targets(
    dst: &dyn InPlaceTier,
    keys: &[BlockHash],
    results: &mut [BlockResult],
) -> (Vec<(BlockHash, Target)>, Vec<usize>) {
    let mut reqs = Vec::new();
    let mut which = Vec::new();
    for (i, r) in dst.reserve(keys).into_iter().enumerate() {
        match r {
            Reserved::Slot(slot) => {
                reqs.push((keys[i], slot));
                which.push(i);
            }
            Reserved::Present => results[i] = Ok(()),
            Reserved::Full => results[i] = Err(BlockFailure::Full),
        }
    }
    (reqs, which)
}

/// A bounce buffer of `len` bytes per key (aligned for direct I/O).
fn bounce_targets(keys: &[BlockHash], len: usize) -> (Vec<(BlockHash, Target)>, Vec<usize>) {
    let reqs = keys
        .iter()
        .map(|k| {
            (
                *k,
                Box::new(AlignedBuf::zeroed(len, BOUNCE_ALIGN)) as Target,
            )
        })
        .collect();
    (reqs, (0..keys.len()).collect())
}

/// Verified blocks in bounce buffers written to `to` in one batch with
/// the sums the source verified them against.
async fn put_bounced(
    to: &dyn TierStore,
    keys: &[BlockHash],
    hits: Vec<(usize, Target, BlockSums)>,
    results: &mut [BlockResult],
) {
    let mut bufs = Vec::with_capacity(hits.len());
    for (i, target, sums) in hits {
        match target.into_any().downcast::<AlignedBuf>() {
            Ok(buf) => bufs.push((i, buf, sums)),
            Err(_) => {
                results[i] = Err(BlockFailure::Tier(
                    "a bounce buffer came back as another target".into(),
                ))
            }
        }
    }
    let puts: Vec<BlockPut<'_>> = bufs
        .iter()
        .map(|(i, buf, sums)| BlockPut {
            key: keys[*i],
            data: buf,
            sums,
            pinned: None,
        })
        .collect();
    let written = to.put_batch(&puts).await;
    for ((i, ..), res) in bufs.iter().zip(written) {
        results[*i] = res.map_err(failure);
    }
}

/// The results to fill, each block's key and layer target, and the
/// blocks' indices; a block without a landing fails.
fn landing_targets(
    blocks: &[BlockMove],
    layer: u32,
) -> (Vec<BlockResult>, Vec<(BlockHash, Target)>, Vec<usize>) {
    let mut results: Vec<BlockResult> = vec![Err(BlockFailure::Abandoned); blocks.len()];
    let mut reqs = Vec::new();
    let mut which = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        match b.landing.as_ref().and_then(|l| l.layer_target(layer)) {
            Some(target) => {
                reqs.push((b.key, Box::new(target) as Target));
                which.push(i);
            }
            None => results[i] = Err(no_landing()),
        }
    }
    (results, reqs, which)
}

/// A verified layer in place in `landing`'s slot: `Ok` while layers are
/// missing, the publish's outcome for the layer that completes the block.
/// (A failed layer's target is just dropped: the block never completes.)
fn land(landing: &HostLanding, target: Target, sums: &BlockSums) -> BlockResult {
    let target = target
        .into_any()
        .downcast::<LayerTarget>()
        .map_err(|_| BlockFailure::Tier("a landing came back as another target".into()))?;
    match landing.landed(*target, sums) {
        None => Ok(()),
        Some(published) => from_put(published),
    }
}

/// Layer `layer` of blocks landing in reserved arena slots: one read of
/// the source putting each layer straight into its slot range, verified
/// against the block's authenticated layer sums; the layer that completes
/// a block publishes it.
async fn read_landings(from: &dyn TierStore, layer: u32, blocks: &[BlockMove]) -> Vec<BlockResult> {
    let (mut results, reqs, which) = landing_targets(blocks, layer);
    if reqs.is_empty() {
        return results;
    }
    let read = from.read_into(reqs, Some(layer..layer + 1)).await;
    for (done, i) in read.into_iter().zip(which) {
        let Some(landing) = blocks[i].landing.as_ref() else {
            continue;
        };
        results[i] = verified(done).and_then(|(target, sums)| land(landing, target, &sums));
    }
    results
}
