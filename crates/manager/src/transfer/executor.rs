//! Executors: one batch of blocks along one path, over the real tiers.
//!
//! | path | source | destination | verification |
//! |---|---|---|---|
//! | `HostToDisk` | DRAM `BlockRef` | `DiskTier::put_batch` (one call) | carried sums written with it |
//! | `DiskToHost` | `get_batch_with_sums` (one call), or per layer `read_layers_with_sums` into a [`HostLanding`](super::HostLanding) | reserved DRAM slot | disk verifies every byte or layer; committed with those sums (by the layer that completes the block) |
//! | `HostToRemote` | DRAM `BlockRef` | `RemoteTier::put_batch` (one call) | carried sums written with it |
//! | `DiskToRemote` | `get_batch_with_sums` (one call) | `RemoteTier::put_batch` (one call) | disk verifies; its sums written with it |
//! | `RemoteToHost` | `RemoteTier::get_batch` (one call), or per layer `read_layers` (ranged reads) into a [`HostLanding`](super::HostLanding) | reserved DRAM slot | remote tier verifies every byte or layer |
//!
//! A block that fails anywhere is reported and never made visible at the
//! destination: DRAM reservations are dropped uncommitted.

use std::sync::Arc;

use kvtier_arena::MemError;
use kvtier_core::{BlockHash, BlockSums, Geometry, Lookup};
use kvtier_disk::{DiskPut, DiskTier};
use kvtier_io::{AlignedBuf, DmaSource};
use kvtier_mem::{BlockRef, MemoryTier, PutOutcome, Reserve, SlotReservation};
use kvtier_remote::{RemoteError, RemotePut, RemoteRead, RemoteTier};

use super::landing::{HostLanding, LayerTarget};
use super::request::{BlockFailure, BlockMove, BlockResult, Span};
use crate::tier::TransferPath;

/// Alignment of bounce buffers for disk reads (direct I/O).
const BOUNCE_ALIGN: usize = 4096;

/// The tiers an engine moves bytes between; a path whose tiers are missing
/// fails its blocks as `Unsupported`.
#[derive(Clone, Default)]
pub struct Tiers {
    /// G2.
    pub memory: Option<MemoryTier>,
    /// G3.
    pub disk: Option<Arc<DiskTier>>,
    /// G4.
    pub remote: Option<Arc<RemoteTier>>,
}

impl std::fmt::Debug for Tiers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tiers")
            .field(
                "memory",
                &self.memory.as_ref().map(|m| m.shm_name().to_owned()),
            )
            .field("disk", &self.disk.is_some())
            .field("remote", &self.remote.as_ref().map(|r| r.url().to_owned()))
            .finish()
    }
}

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

/// A DRAM slot reserved for `key`, or `None` with `result` set: `Ok` when
/// the block is already in DRAM, else why no slot could be had.
fn reserve_slot(
    memory: &MemoryTier,
    key: BlockHash,
    result: &mut BlockResult,
) -> Option<SlotReservation> {
    match memory.reserve(key) {
        Ok(Reserve::Reserved(slot)) => return Some(slot),
        Ok(Reserve::AlreadyPresent) => *result = Ok(()),
        Ok(Reserve::Full) => *result = Err(BlockFailure::Full),
        Err(e) => *result = Err(tier_err(e)),
    }
    None
}

/// The DRAM copies of `blocks` and their indices; a block DRAM does not
/// hold is a `Miss` in `results`.
fn dram_blocks(
    memory: &MemoryTier,
    blocks: &[BlockMove],
    results: &mut [BlockResult],
) -> (Vec<BlockRef>, Vec<usize>) {
    let mut refs = Vec::new();
    let mut which = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        match memory.get_ref(b.key) {
            Some(r) => {
                refs.push(r);
                which.push(i);
            }
            None => results[i] = Err(BlockFailure::Miss),
        }
    }
    (refs, which)
}

/// A remote write's outcome as a block result.
fn remote_put_result(res: Result<(), RemoteError>) -> BlockResult {
    match res {
        Ok(()) => Ok(()),
        Err(RemoteError::Corrupt) => Err(BlockFailure::Corrupt),
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
    tiers: &Tiers,
    geometry: &Geometry,
    path: TransferPath,
    span: Span,
    blocks: &[BlockMove],
) -> Vec<BlockResult> {
    if let Err(e) = check_span(geometry, path, span) {
        return vec![Err(e); blocks.len()];
    }
    let unsupported = || vec![Err(BlockFailure::Unsupported(path.name())); blocks.len()];
    match path {
        TransferPath::HostToDisk => match (&tiers.memory, &tiers.disk) {
            (Some(m), Some(disk)) => host_to_disk(m, disk, blocks).await,
            _ => unsupported(),
        },
        TransferPath::DiskToHost => match (&tiers.disk, &tiers.memory, span) {
            (Some(disk), Some(m), Span::Block) => disk_to_host(disk, m, blocks).await,
            (Some(disk), Some(_), Span::Layer(l)) => disk_to_landings(disk, l, blocks).await,
            _ => unsupported(),
        },
        TransferPath::HostToRemote => match (&tiers.memory, &tiers.remote) {
            (Some(m), Some(r)) => host_to_remote(m, r, blocks).await,
            _ => unsupported(),
        },
        TransferPath::DiskToRemote => match (&tiers.disk, &tiers.remote) {
            (Some(disk), Some(r)) => disk_to_remote(disk, r, blocks).await,
            _ => unsupported(),
        },
        TransferPath::RemoteToHost => match (&tiers.remote, &tiers.memory, span) {
            (Some(r), Some(m), Span::Block) => remote_to_host(r, m, blocks).await,
            (Some(r), Some(_), Span::Layer(l)) => remote_to_landings(r, l, blocks).await,
            _ => unsupported(),
        },
    }
}

/// Layer spans only make sense into host landings (layer-wise loading).
fn check_span(geometry: &Geometry, path: TransferPath, span: Span) -> Result<(), BlockFailure> {
    match span {
        Span::Block => Ok(()),
        Span::Layer(l) => {
            if !path.lands_in_host() {
                return Err(BlockFailure::InvalidRequest(format!(
                    "layer spans are for onboarding into host landings, not {}",
                    path.name()
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

async fn host_to_disk(
    memory: &MemoryTier,
    disk: &DiskTier,
    blocks: &[BlockMove],
) -> Vec<BlockResult> {
    let mut results: Vec<BlockResult> = vec![Err(BlockFailure::Abandoned); blocks.len()];
    let (refs, which) = dram_blocks(memory, blocks, &mut results);
    if refs.is_empty() {
        return results;
    }
    // One disk submission for the whole batch, written straight from the
    // DRAM slots (no copy; the writes hold the slots until they finish)
    // with the checksums they were stored with.
    let pinned: Vec<Arc<dyn DmaSource>> = refs
        .iter()
        .map(|r| Arc::new(r.clone()) as Arc<dyn DmaSource>)
        .collect();
    let puts: Vec<DiskPut<'_>> = refs
        .iter()
        .zip(&pinned)
        .map(|(r, p)| DiskPut {
            key: r.key(),
            data: r,
            sums: r.shared_sums(),
            pinned: Some(p),
        })
        .collect();
    let written = disk.put_batch(&puts).await;
    for (i, res) in which.into_iter().zip(written) {
        results[i] = res.map_err(tier_err);
    }
    results
}

async fn disk_to_host(
    disk: &DiskTier,
    memory: &MemoryTier,
    blocks: &[BlockMove],
) -> Vec<BlockResult> {
    let mut results: Vec<BlockResult> = vec![Err(BlockFailure::Abandoned); blocks.len()];
    let mut reqs = Vec::new();
    let mut which = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        if let Some(slot) = reserve_slot(memory, b.key, &mut results[i]) {
            reqs.push((b.key, slot));
            which.push(i);
        }
    }
    if reqs.is_empty() {
        return results;
    }
    // One disk submission; every byte verified by the disk tier.
    let read = disk.get_batch_with_sums(reqs).await;
    for ((target, lookup, sums), i) in read.into_iter().zip(which) {
        results[i] = match (lookup, sums) {
            (Lookup::Hit, Some(sums)) => {
                // The disk tier verified these very slot bytes against sums.
                from_put(target.commit_verified(&sums))
            }
            (Lookup::Hit, None) => Err(BlockFailure::Tier("disk hit without checksums".into())),
            (other, _) => Err(lookup_failure(other)),
        };
    }
    results
}

/// The results to fill, each block's key and layer target, and the
/// blocks' indices; a block without a landing fails.
fn landing_targets(
    blocks: &[BlockMove],
    layer: u32,
) -> (Vec<BlockResult>, Vec<(BlockHash, LayerTarget)>, Vec<usize>) {
    let mut results: Vec<BlockResult> = vec![Err(BlockFailure::Abandoned); blocks.len()];
    let mut reqs = Vec::new();
    let mut which = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        match b.landing.as_ref().and_then(|l| l.layer_target(layer)) {
            Some(target) => {
                reqs.push((b.key, target));
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
fn land(landing: &HostLanding, target: LayerTarget, sums: &BlockSums) -> BlockResult {
    match landing.landed(target, sums) {
        None => Ok(()),
        Some(published) => from_put(published),
    }
}

/// Layer `layer` of blocks landing in reserved arena slots: one disk
/// submission reading each layer straight into its slot range, verified
/// against the block's authenticated layer sums; the layer that completes
/// a block publishes it.
async fn disk_to_landings(disk: &DiskTier, layer: u32, blocks: &[BlockMove]) -> Vec<BlockResult> {
    let (mut results, reqs, which) = landing_targets(blocks, layer);
    if reqs.is_empty() {
        return results;
    }
    let read = disk.read_layers_with_sums(reqs, layer..layer + 1).await;
    for ((target, lookup, sums), i) in read.into_iter().zip(which) {
        let Some(landing) = blocks[i].landing.as_ref() else {
            continue;
        };
        results[i] = match (lookup, sums) {
            (Lookup::Hit, Some(sums)) => land(landing, target, &sums),
            (Lookup::Hit, None) => Err(BlockFailure::Tier("disk hit without checksums".into())),
            (other, _) => Err(lookup_failure(other)),
        };
    }
    results
}

async fn host_to_remote(
    memory: &MemoryTier,
    remote: &RemoteTier,
    blocks: &[BlockMove],
) -> Vec<BlockResult> {
    let mut results: Vec<BlockResult> = vec![Err(BlockFailure::Abandoned); blocks.len()];
    let (refs, which) = dram_blocks(memory, blocks, &mut results);
    if refs.is_empty() {
        return results;
    }
    let puts: Vec<RemotePut<'_>> = refs
        .iter()
        .map(|r| RemotePut {
            key: r.key(),
            data: r,
            sums: r.shared_sums(),
        })
        .collect();
    let written = remote.put_batch(&puts).await;
    for (i, res) in which.iter().zip(written) {
        results[*i] = remote_put_result(res);
    }
    results
}

async fn disk_to_remote(
    disk: &DiskTier,
    remote: &RemoteTier,
    blocks: &[BlockMove],
) -> Vec<BlockResult> {
    let mut results: Vec<BlockResult> = vec![Err(BlockFailure::Abandoned); blocks.len()];
    let len = disk.geometry().block_bytes() as usize;
    let reqs: Vec<(BlockHash, AlignedBuf)> = blocks
        .iter()
        .map(|b| (b.key, AlignedBuf::zeroed(len, BOUNCE_ALIGN)))
        .collect();
    if reqs.is_empty() {
        return results;
    }
    // One disk submission; every byte verified by the disk tier, then one
    // remote batch with the sums the disk verified them against.
    let read = disk.get_batch_with_sums(reqs).await;
    let mut hits = Vec::new();
    for ((buf, lookup, sums), i) in read.into_iter().zip(0..) {
        match (lookup, sums) {
            (Lookup::Hit, Some(sums)) => hits.push((i, buf, sums)),
            (Lookup::Hit, None) => {
                results[i] = Err(BlockFailure::Tier("disk hit without checksums".into()))
            }
            (other, _) => results[i] = Err(lookup_failure(other)),
        }
    }
    let puts: Vec<RemotePut<'_>> = hits
        .iter()
        .map(|(i, buf, sums)| RemotePut {
            key: blocks[*i].key,
            data: buf,
            sums,
        })
        .collect();
    let written = remote.put_batch(&puts).await;
    for ((i, _, _), res) in hits.iter().zip(written) {
        results[*i] = remote_put_result(res);
    }
    results
}

fn remote_failure(read: RemoteRead) -> BlockFailure {
    match read {
        RemoteRead::Hit { .. } => BlockFailure::Tier("unexpected remote hit".into()),
        RemoteRead::Miss => BlockFailure::Miss,
        RemoteRead::Corrupt => BlockFailure::Corrupt,
        RemoteRead::Failed(e) => tier_err(e),
    }
}

/// Layer `layer` of blocks landing in reserved arena slots from G4: one
/// ranged read per object (verified by the remote tier against the
/// authenticated header), copied into the slot's layer range; the layer
/// that completes a block publishes it.
async fn remote_to_landings(
    remote: &RemoteTier,
    layer: u32,
    blocks: &[BlockMove],
) -> Vec<BlockResult> {
    let (mut results, reqs, which) = landing_targets(blocks, layer);
    if reqs.is_empty() {
        return results;
    }
    let (keys, targets): (Vec<BlockHash>, Vec<LayerTarget>) = reqs.into_iter().unzip();
    let read = remote.read_layers(&keys, layer..layer + 1).await;
    for ((got, mut target), i) in read.into_iter().zip(targets).zip(which) {
        let Some(landing) = blocks[i].landing.as_ref() else {
            continue;
        };
        results[i] = match got {
            RemoteRead::Hit { bytes, sums } if target.fill(&bytes) => land(landing, target, &sums),
            RemoteRead::Hit { bytes, .. } => Err(BlockFailure::Tier(format!(
                "a remote layer of {} bytes for a slot layer of another size",
                bytes.len()
            ))),
            other => Err(remote_failure(other)),
        };
    }
    results
}

async fn remote_to_host(
    remote: &RemoteTier,
    memory: &MemoryTier,
    blocks: &[BlockMove],
) -> Vec<BlockResult> {
    let mut results: Vec<BlockResult> = vec![Err(BlockFailure::Abandoned); blocks.len()];
    let mut slots = Vec::new();
    let mut which = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        if let Some(slot) = reserve_slot(memory, b.key, &mut results[i]) {
            slots.push(slot);
            which.push(i);
        }
    }
    if slots.is_empty() {
        return results;
    }
    let keys: Vec<BlockHash> = which.iter().map(|&i| blocks[i].key).collect();
    let read = remote.get_batch(&keys).await;
    for ((mut slot, got), i) in slots.into_iter().zip(read).zip(which) {
        results[i] = match got {
            RemoteRead::Hit { bytes, sums } => {
                if bytes.len() != slot.len() {
                    Err(BlockFailure::Tier(format!(
                        "remote block of {} bytes, a slot holds {}",
                        bytes.len(),
                        slot.len()
                    )))
                } else {
                    slot.as_mut_slice().copy_from_slice(&bytes);
                    // The remote tier verified these bytes against `sums`.
                    from_put(slot.commit_verified(&sums))
                }
            }
            other => Err(remote_failure(other)),
        };
    }
    results
}
