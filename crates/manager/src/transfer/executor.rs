//! Executors: one batch of blocks along one path, over the real tiers.
//!
//! | path | source | destination | verification |
//! |---|---|---|---|
//! | `DeviceToHost` | `Device` download | reserved DRAM slot | against carried sums, or sums computed (block enters kvtier) |
//! | `HostToDevice` | DRAM `BlockRef` | `Device` upload | whole block or the layer's checksum, before the copy |
//! | `HostToDisk` | DRAM `BlockRef` | `DiskTier::put_batch` (one call) | carried sums written with it |
//! | `DiskToHost` | `get_batch_with_sums` (one call), or per layer `read_layers_with_sums` into a [`HostLanding`](super::HostLanding) | reserved DRAM slot | disk verifies every byte or layer; committed with those sums (by the layer that completes the block) |
//! | `DiskToDevice` | `get_batch` / `read_layers` (one call) | `Device` upload | disk verifies every byte or layer |
//! | `HostToRemote` | DRAM `BlockRef` | `RemoteTier::put_batch` (one call) | carried sums written with it |
//! | `DiskToRemote` | `get_batch_with_sums` (one call) | `RemoteTier::put_batch` (one call) | disk verifies; its sums written with it |
//! | `RemoteToHost` | `RemoteTier::get_batch` (one call), or per layer `read_layers` (ranged reads) into a [`HostLanding`](super::HostLanding) | reserved DRAM slot | remote tier verifies every byte or layer |
//! | `RemoteToDevice` | `get_batch` / `read_layers` (ranged reads) | `Device` upload | remote tier verifies every byte or layer |
//!
//! A block that fails anywhere is reported and never made visible at the
//! destination: DRAM reservations are dropped uncommitted, device uploads
//! are not issued.

use std::any::Any;
use std::sync::Arc;

use kvtier_arena::MemError;
use kvtier_core::{BlockHash, BlockSums, Geometry, Lookup, layer_checksum};
use kvtier_disk::{DiskPut, DiskTier};
use kvtier_io::{AlignedBuf, DmaSource, DmaTarget};
use kvtier_mem::{BlockRef, MemoryTier, PutOutcome, Reserve, SlotReservation};
use kvtier_remote::{RemoteError, RemotePut, RemoteRead, RemoteTier};

use super::landing::{HostLanding, LayerTarget};
use super::request::{BlockFailure, BlockMove, BlockResult};
use crate::device::{Device, Download, HostSink, HostSlice, HostSource, Span, Upload};
use crate::tier::TransferPath;

/// Alignment of bounce buffers for disk reads (direct I/O).
const BOUNCE_ALIGN: usize = 4096;

/// The tiers an engine moves bytes between; a path whose tiers are missing
/// fails its blocks as `Unsupported`.
#[derive(Clone, Default)]
pub struct Tiers {
    /// G1.
    pub device: Option<Arc<dyn Device>>,
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
            .field("device", &self.device.as_ref().map(|d| d.name().to_owned()))
            .field(
                "memory",
                &self.memory.as_ref().map(|m| m.shm_name().to_owned()),
            )
            .field("disk", &self.disk.is_some())
            .field("remote", &self.remote.as_ref().map(|r| r.url().to_owned()))
            .finish()
    }
}

/// A DRAM slot as a direct-I/O target (the disk reads straight into it).
struct SlotTarget(SlotReservation);

// SAFETY: a reservation owns its slot exclusively until committed or
// dropped, and the slot's address is fixed inside the shared-memory mapping,
// which the reservation keeps alive (it holds the tier).
unsafe impl DmaTarget for SlotTarget {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
    fn len(&self) -> usize {
        self.0.len()
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
        TransferPath::DeviceToHost => match (&tiers.device, &tiers.memory) {
            (Some(d), Some(m)) => device_to_host(d.as_ref(), m, geometry, blocks).await,
            _ => unsupported(),
        },
        TransferPath::HostToDevice => match (&tiers.memory, &tiers.device) {
            (Some(m), Some(d)) => host_to_device(m, d.as_ref(), geometry, span, blocks).await,
            _ => unsupported(),
        },
        TransferPath::HostToDisk => match (&tiers.memory, &tiers.disk) {
            (Some(m), Some(disk)) => host_to_disk(m, disk, blocks).await,
            _ => unsupported(),
        },
        TransferPath::DiskToHost => match (&tiers.disk, &tiers.memory, span) {
            (Some(disk), Some(m), Span::Block) => disk_to_host(disk, m, blocks).await,
            (Some(disk), Some(_), Span::Layer(l)) => disk_to_landings(disk, l, blocks).await,
            _ => unsupported(),
        },
        TransferPath::DiskToDevice => match (&tiers.disk, &tiers.device) {
            (Some(disk), Some(d)) => disk_to_device(disk, d.as_ref(), geometry, span, blocks).await,
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
        TransferPath::RemoteToDevice => match (&tiers.remote, &tiers.device) {
            (Some(r), Some(d)) => remote_to_device(r, d.as_ref(), span, blocks).await,
            _ => unsupported(),
        },
    }
}

/// Layer spans only make sense onto the device (layer-wise loading).
fn check_span(geometry: &Geometry, path: TransferPath, span: Span) -> Result<(), BlockFailure> {
    match span {
        Span::Block => Ok(()),
        Span::Layer(l) => {
            if !path.to_device() && !path.lands_in_host() {
                return Err(BlockFailure::InvalidRequest(format!(
                    "layer spans are for onboarding to the device or into host landings, not {}",
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

fn no_device_block() -> BlockFailure {
    BlockFailure::InvalidRequest("no device block given".into())
}

async fn device_to_host(
    device: &dyn Device,
    memory: &MemoryTier,
    geometry: &Geometry,
    blocks: &[BlockMove],
) -> Vec<BlockResult> {
    let mut results: Vec<BlockResult> = vec![Err(BlockFailure::Abandoned); blocks.len()];
    let mut copies = Vec::new();
    let mut which = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        let Some(src) = b.device else {
            results[i] = Err(no_device_block());
            continue;
        };
        if let Some(slot) = reserve_slot(memory, b.key, &mut results[i]) {
            copies.push(Download {
                src,
                dst: Box::new(slot) as Box<dyn HostSink>,
            });
            which.push(i);
        }
    }
    if copies.is_empty() {
        return results;
    }
    match device.download(Span::Block, copies).await {
        Err(e) => {
            for i in which {
                results[i] = Err(BlockFailure::Device(e.to_string()));
            }
        }
        Ok(done) => {
            for ((sink, copied), i) in done.into_iter().zip(which) {
                results[i] = match copied {
                    Err(e) => Err(BlockFailure::Device(e.to_string())),
                    Ok(()) => commit_download(sink, &blocks[i], geometry),
                };
            }
        }
    }
    results
}

/// Commits a downloaded block: verified against the sums it carries, or
/// hashed now when it is new to kvtier.
fn commit_download(sink: Box<dyn HostSink>, block: &BlockMove, geometry: &Geometry) -> BlockResult {
    let any: Box<dyn Any> = sink;
    let slot = any
        .downcast::<SlotReservation>()
        .map_err(|_| BlockFailure::Device("device returned a foreign buffer".into()))?;
    match &block.sums {
        Some(sums) => from_put(slot.commit(sums)),
        None => {
            let sums =
                BlockSums::compute(block.key, geometry.layer_bytes() as usize, slot.as_slice());
            from_put(slot.commit_verified(&sums))
        }
    }
}

async fn host_to_device(
    memory: &MemoryTier,
    device: &dyn Device,
    geometry: &Geometry,
    span: Span,
    blocks: &[BlockMove],
) -> Vec<BlockResult> {
    let mut results: Vec<BlockResult> = vec![Err(BlockFailure::Abandoned); blocks.len()];
    let mut copies = Vec::new();
    let mut which = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        let Some(dst) = b.device else {
            results[i] = Err(no_device_block());
            continue;
        };
        let Some(block) = memory.get_ref(b.key) else {
            results[i] = Err(BlockFailure::Miss);
            continue;
        };
        // A caller's sums that differ from the stored ones mean a different
        // block under this key: never deliver it.
        if b.sums
            .as_ref()
            .is_some_and(|s| s.block != block.shared_sums().block)
        {
            results[i] = Err(BlockFailure::Corrupt);
            continue;
        }
        let src: Result<Box<dyn HostSource>, BlockFailure> = match span {
            Span::Block => {
                if block.verify() {
                    Ok(Box::new(block))
                } else {
                    Err(BlockFailure::Corrupt)
                }
            }
            Span::Layer(l) => {
                let range = geometry.layer_range(l);
                let range = range.start as usize..range.end as usize;
                let intact = block
                    .get(range.clone())
                    .zip(block.shared_sums().layers.get(l as usize))
                    .is_some_and(|(bytes, want)| layer_checksum(b.key, l, bytes) == *want);
                match (intact, HostSlice::new(block, range)) {
                    (true, Some(slice)) => Ok(Box::new(slice)),
                    _ => Err(BlockFailure::Corrupt),
                }
            }
        };
        match src {
            Ok(src) => {
                copies.push(Upload { dst, src });
                which.push(i);
            }
            Err(e) => {
                // The DRAM copy is bad: drop it so nobody else reads it.
                memory.remove(b.key);
                results[i] = Err(e);
            }
        }
    }
    upload(device, span, copies, which, &mut results).await;
    results
}

/// Uploads `copies` (for blocks `which`) and records their results.
async fn upload(
    device: &dyn Device,
    span: Span,
    copies: Vec<Upload<Box<dyn HostSource>>>,
    which: Vec<usize>,
    results: &mut [BlockResult],
) {
    if copies.is_empty() {
        return;
    }
    match device.upload(span, copies).await {
        Err(e) => {
            for i in which {
                results[i] = Err(BlockFailure::Device(e.to_string()));
            }
        }
        Ok(done) => {
            for ((_, copied), i) in done.into_iter().zip(which) {
                results[i] = copied.map_err(|e| BlockFailure::Device(e.to_string()));
            }
        }
    }
}

/// A DRAM block's bytes as the source of a disk write.
struct SlotBytes(BlockRef);

// SAFETY: while a BlockRef lives its slot is neither reused nor written
// (BlockRef's contract), and the arena stays mapped while any reference to
// it does: the bytes stay where they are, unchanged.
unsafe impl DmaSource for SlotBytes {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
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
        .map(|r| Arc::new(SlotBytes(r.clone())) as Arc<dyn DmaSource>)
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
            reqs.push((b.key, SlotTarget(slot)));
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
                from_put(target.0.commit_verified(&sums))
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

async fn disk_to_device(
    disk: &DiskTier,
    device: &dyn Device,
    geometry: &Geometry,
    span: Span,
    blocks: &[BlockMove],
) -> Vec<BlockResult> {
    let mut results: Vec<BlockResult> = vec![Err(BlockFailure::Abandoned); blocks.len()];
    let len = span.bytes(geometry) as usize;
    let mut reqs = Vec::new();
    let mut dsts = Vec::new();
    let mut which = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        let Some(dst) = b.device else {
            results[i] = Err(no_device_block());
            continue;
        };
        reqs.push((b.key, AlignedBuf::zeroed(len, BOUNCE_ALIGN)));
        dsts.push(dst);
        which.push(i);
    }
    if reqs.is_empty() {
        return results;
    }
    // One disk submission per batch: the whole blocks, or this one layer of
    // every block (Tutti: one control step per layer, not per block).
    let read = match span {
        Span::Block => disk.get_batch(reqs).await,
        Span::Layer(l) => disk.read_layers(reqs, l..l + 1).await,
    };
    let mut copies = Vec::new();
    let mut uploading = Vec::new();
    for (((buf, lookup), dst), i) in read.into_iter().zip(dsts).zip(which) {
        if lookup.is_hit() {
            copies.push(Upload {
                dst,
                src: Box::new(buf) as Box<dyn HostSource>,
            });
            uploading.push(i);
        } else {
            results[i] = Err(lookup_failure(lookup));
        }
    }
    upload(device, span, copies, uploading, &mut results).await;
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

async fn remote_to_device(
    remote: &RemoteTier,
    device: &dyn Device,
    span: Span,
    blocks: &[BlockMove],
) -> Vec<BlockResult> {
    let mut results: Vec<BlockResult> = vec![Err(BlockFailure::Abandoned); blocks.len()];
    let mut keys = Vec::new();
    let mut dsts = Vec::new();
    let mut which = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        let Some(dst) = b.device else {
            results[i] = Err(no_device_block());
            continue;
        };
        keys.push(b.key);
        dsts.push(dst);
        which.push(i);
    }
    if keys.is_empty() {
        return results;
    }
    // One remote batch: whole objects, or one ranged read of this layer per
    // object; the remote tier verifies every byte it returns.
    let read = match span {
        Span::Block => remote.get_batch(&keys).await,
        Span::Layer(l) => remote.read_layers(&keys, l..l + 1).await,
    };
    let mut copies = Vec::new();
    let mut uploading = Vec::new();
    for ((got, dst), i) in read.into_iter().zip(dsts).zip(which) {
        match got {
            RemoteRead::Hit { bytes, .. } => {
                copies.push(Upload {
                    dst,
                    src: Box::new(bytes) as Box<dyn HostSource>,
                });
                uploading.push(i);
            }
            other => results[i] = Err(remote_failure(other)),
        }
    }
    upload(device, span, copies, uploading, &mut results).await;
    results
}
