//! Recovery at open: rebuild the index from checkpoints, region headers and
//! slot headers.
//!
//! Per directory:
//! 1. load `kvtier-disk.index` if it verifies and belongs to this directory
//!    (creation id, region count, slots per region); else ignore it;
//! 2. read every region header (batched); a region whose header does not
//!    verify or names another place or creation is free;
//! 3. for a region whose generation equals the checkpoint's, take the
//!    checkpoint's entries for it and scan slot headers from the
//!    checkpoint's `fill` on; for any other written region scan all of its
//!    slot headers (batched; small slots are read in runs of 1 MiB, the
//!    data between their headers included, rather than a read per header);
//! 4. accept a scanned slot only if its header verifies under the seal of
//!    its region's header version (v2: seeded by the creation id and the
//!    life's layout), names this place, has the region's generation and
//!    the geometry's data length. Headers are read only at `header(s)` of
//!    the layout the region header names (I15).
//!
//! Candidates from every directory then go into the index, the newest
//! (generation, slot) winning for a key seen twice. Data bytes are verified
//! lazily, on read. Every written region comes back `SEALED` (a new run
//! never appends to an old life); the generation counter resumes above
//! everything seen.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Instant;

use kvtier_core::BlockHash;
use kvtier_io::{AlignedBuf, Completion, IoBatch, IoKind, IoOp};

use crate::checkpoint::{Checkpoint, CkEntry};
use crate::format::{
    LifeFormat, REGION_HEADER_BYTES, RegionHeader, RegionLayout, SlotHeader, SlotSeal,
};
use crate::index::{Entry, Loc};
use crate::latch::state;
use crate::meta::{INDEX_FILE, read_optional};
use crate::region::Fill;
use crate::stats::add;
use crate::tier::{Dir, Shared};
use crate::{DiskError, Result};

/// Region-header reads (4 KiB each) per I/O batch.
const REGION_HEADER_BATCH: usize = 512;

/// Reads per I/O batch while scanning slot headers (two batches are in
/// flight, each read up to [`RUN_BYTES`]).
const SCAN_BATCH: usize = 32;

/// A block found on disk.
struct Found {
    key: BlockHash,
    slot: u32,
    region: u32,
    sum: u64,
}

/// Rebuilds the index and region states. Runs once, inside `open`.
pub(crate) fn recover(shared: &Shared) -> Result<()> {
    let t0 = Instant::now();
    let mut hwm = 0u64;
    let mut found_all: Vec<(u8, Vec<Found>)> = Vec::new();
    let mut from_ck = 0u64;
    let mut from_scan = 0u64;
    for dir in &shared.dirs {
        let ck = load_checkpoint(shared, dir);
        if let Some(c) = &ck {
            hwm = hwm.max(c.generation_hwm);
        }
        let gens = read_region_headers(shared, dir)?;
        let mut found = Vec::new();
        let mut scan: Vec<(u32, u32)> = Vec::new();
        let mut ck_entries: Vec<Vec<CkEntry>> = Vec::new();
        if let Some(c) = &ck {
            ck_entries.resize_with(gens.len(), Vec::new);
            for e in &c.entries {
                if let Some(v) = ck_entries.get_mut(e.region as usize) {
                    v.push(*e);
                }
            }
        }
        for (r, g) in gens.iter().enumerate() {
            let Some((g, _)) = *g else { continue };
            hwm = hwm.max(g);
            let mark = ck.as_ref().and_then(|c| c.regions.get(r)).copied();
            match mark {
                Some(m) if m.generation == g => {
                    for e in ck_entries.get(r).into_iter().flatten() {
                        if e.slot < shared.layout.slots_per_region {
                            found.push(Found {
                                key: e.key,
                                slot: e.slot,
                                region: r as u32,
                                sum: e.sum,
                            });
                            from_ck += 1;
                        }
                    }
                    scan.push((r as u32, m.fill.min(shared.layout.slots_per_region)));
                }
                _ => scan.push((r as u32, 0)),
            }
        }
        let before = found.len();
        scan_slots(shared, dir, &gens, &scan, &mut found)?;
        from_scan += (found.len() - before) as u64;
        // Region states and generations, before any entry goes in (the
        // newest-wins comparison reads them).
        let mut free = VecDeque::new();
        for (r, g) in gens.iter().enumerate() {
            let region = &dir.regions[r];
            match g {
                Some((g, format)) => {
                    region.generation.store(*g, Ordering::Release);
                    region.set_format(*format);
                    region.last_read.store(*g, Ordering::Relaxed);
                    *region.fill.lock() = Fill {
                        keys: Vec::new(),
                        inflight: Vec::new(),
                        sealed: true,
                        header_ok: Some(true),
                    };
                    region.latch.set_state(state::SEALED);
                    add(&shared.stats.recovery_regions, 1);
                }
                None => free.push_back(r as u32),
            }
        }
        dir.writer
            .try_lock()
            .map_err(|_| DiskError::InvalidConfig("writer busy during recovery".into()))?
            .free = free;
        found_all.push((dir.index, found));
    }
    shared.generation.store(hwm, Ordering::SeqCst);
    shared.tick.store(hwm, Ordering::SeqCst);
    for (d, found) in found_all {
        let dir = &shared.dirs[d as usize];
        for f in found {
            {
                let mut fill = dir.regions[f.region as usize].fill.lock();
                let at = f.slot as usize;
                if fill.keys.len() <= at {
                    fill.keys.resize(at + 1, BlockHash(0));
                }
                fill.keys[at] = f.key;
            }
            let entry = Entry {
                loc: Loc {
                    dir: d,
                    region: f.region,
                    slot: f.slot,
                },
                sum: f.sum,
                hot: false,
            };
            insert_newest(shared, f.key, entry);
        }
    }
    add(&shared.stats.recovered_from_checkpoint, from_ck);
    add(&shared.stats.recovered_from_scan, from_scan);
    tracing::info!(
        blocks = shared.index.len(),
        from_checkpoint = from_ck,
        from_scan,
        elapsed_ms = t0.elapsed().as_millis() as u64,
        "disk tier recovered"
    );
    Ok(())
}

/// Inserts `entry` unless the key already has a newer one.
fn insert_newest(shared: &Shared, key: BlockHash, entry: Entry) {
    let order = |e: &Entry| {
        let g = shared
            .region(e.loc.dir, e.loc.region)
            .map_or(0, |r| r.generation());
        (g, e.loc.slot, e.loc.dir)
    };
    if let Some(old) = shared.index.get(key)
        && order(&old) >= order(&entry)
    {
        return;
    }
    shared.index.insert(key, entry);
}

/// The directory's checkpoint, if present, intact and its own.
fn load_checkpoint(shared: &Shared, dir: &Dir) -> Option<Checkpoint> {
    let path = dir.path.join(INDEX_FILE);
    let bytes = match read_optional(&path) {
        Ok(b) => b?,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read checkpoint; scanning instead");
            return None;
        }
    };
    let ck = Checkpoint::decode(&bytes);
    let ok = ck.as_ref().is_some_and(|c| {
        c.dir == dir.index as u32
            && c.creation_id == dir.creation_id
            && c.regions.len() == dir.regions.len()
            && c.slots_per_region == shared.layout.slots_per_region
    });
    if !ok {
        tracing::warn!(path = %path.display(), "checkpoint damaged or foreign; scanning instead");
        return None;
    }
    ck
}

/// A written region's generation and life format, by region index.
type Lives = Vec<Option<(u64, LifeFormat)>>;

/// The generation and format of every region whose header verifies and is
/// ours.
fn read_region_headers(shared: &Shared, dir: &Dir) -> Result<Lives> {
    let l = &shared.layout;
    let n = dir.regions.len();
    let mut gens = vec![None; n];
    for chunk_start in (0..n).step_by(REGION_HEADER_BATCH) {
        let chunk_end = (chunk_start + REGION_HEADER_BATCH).min(n);
        let mut batch = IoBatch::with_capacity(chunk_end - chunk_start);
        for r in chunk_start..chunk_end {
            let buf = AlignedBuf::zeroed(REGION_HEADER_BYTES as usize, 4096);
            batch.read_owned(dir.file, l.region_offset(r as u32), buf);
        }
        add(&shared.stats.read_ios, (chunk_end - chunk_start) as u64);
        let mut done = shared.engine.submit(batch).wait();
        for (i, r) in (chunk_start..chunk_end).enumerate() {
            if done.results.len() <= i || done.check_op(i).is_err() {
                continue;
            }
            let Some(buf) = done.take_owner::<AlignedBuf>(i) else {
                continue;
            };
            let Some(h) = RegionHeader::decode(&buf) else {
                continue;
            };
            if h.dir == dir.index as u32
                && h.region == r as u32
                && h.creation_id == dir.creation_id
                && h.slots == l.slots_per_region
                && h.slot_size == l.slot_bytes
                && h.generation > 0
                && (h.format.layout == RegionLayout::Block || l.layer_eligible())
            {
                gens[r] = Some((h.generation, h.format));
            }
        }
    }
    Ok(gens)
}

/// Largest slot whose headers a scan reads in runs (with the data between
/// them) rather than one read per header. With small slots the data in
/// between costs less than the extra operations: 4 KiB blocks in 8 KiB
/// slots read 128 headers per 1 MiB run instead of 128 reads.
const RUN_SLOT_MAX: u64 = 64 << 10;

/// Bytes per read in a run scan.
const RUN_BYTES: u64 = 1 << 20;

/// One read of a scan: the headers of slots `first..first + count` of
/// `region` (and, for several, the bytes between them), laid out as
/// `layout`.
#[derive(Clone, Copy)]
struct ScanRead {
    region: u32,
    layout: RegionLayout,
    first: u32,
    count: u32,
}

/// Bytes from one slot header to the next in a life of layout `kind`:
/// `H + D` block-major, `H + P` layer-major (headers share row 0 with the
/// layer-0 pieces).
fn header_stride(shared: &Shared, kind: RegionLayout) -> u64 {
    let l = &shared.layout;
    l.header_in_region(kind, 1) - l.header_in_region(kind, 0)
}

/// The reads that cover slot headers `[from, slots)` of each `(region,
/// from)`: one per header, or runs of several slots when headers lie
/// close together.
fn scan_reads(shared: &Shared, gens: &Lives, scan: &[(u32, u32)]) -> Vec<ScanRead> {
    let l = &shared.layout;
    let mut reads = Vec::new();
    for &(region, from) in scan {
        let Some((_, format)) = gens.get(region as usize).copied().flatten() else {
            continue;
        };
        let layout = format.layout;
        let stride = header_stride(shared, layout);
        let per_read = if stride <= RUN_SLOT_MAX {
            (RUN_BYTES / stride).max(1) as u32
        } else {
            1
        };
        let mut first = from;
        while first < l.slots_per_region {
            let count = per_read.min(l.slots_per_region - first);
            reads.push(ScanRead {
                region,
                layout,
                first,
                count,
            });
            first += count;
        }
    }
    reads
}

/// Reads the slot headers `[from, slots)` of each `(region, from)` and
/// collects the slots that verify.
///
/// Two batches of [`SCAN_BATCH`] reads are in flight at a time, each into
/// one buffer that is reused for the whole scan: memory stays at two
/// buffers however large the disk, and the buffers are huge pages where
/// the kernel has them, so a 1 MiB read is one device segment rather than
/// 256 (docs/benchmarks.md, "Huge pages"). Each read gets the span of the
/// scan's longest read, so scans of large slots (one 4 KiB header per
/// read) keep small buffers.
fn scan_slots(
    shared: &Shared,
    dir: &Dir,
    gens: &Lives,
    scan: &[(u32, u32)],
    found: &mut Vec<Found>,
) -> Result<()> {
    let reads = scan_reads(shared, gens, scan);
    let span = reads
        .iter()
        .map(|r| read_len(shared, r))
        .max()
        .unwrap_or(0)
        .next_multiple_of(4096) as usize;
    let buf_bytes = span * SCAN_BATCH.min(reads.len());
    let mut spare: Vec<AlignedBuf> = Vec::new();
    let mut in_flight: VecDeque<(&[ScanRead], Completion)> = VecDeque::new();
    for chunk in reads.chunks(SCAN_BATCH) {
        let buf = spare
            .pop()
            .unwrap_or_else(|| AlignedBuf::zeroed_huge(buf_bytes));
        in_flight.push_back((chunk, submit_scan(shared, dir, (chunk, span), buf)));
        if in_flight.len() == 2
            && let Some((chunk, completion)) = in_flight.pop_front()
        {
            let done = collect_scan(shared, dir, gens, (chunk, span), completion, found);
            spare.extend(done);
        }
    }
    while let Some((chunk, completion)) = in_flight.pop_front() {
        collect_scan(shared, dir, gens, (chunk, span), completion, found);
    }
    Ok(())
}

/// Bytes of read `r`: from its first slot's header to the end of its last
/// one's.
fn read_len(shared: &Shared, r: &ScanRead) -> u64 {
    (r.count as u64 - 1) * header_stride(shared, r.layout) + shared.layout.slot_header_bytes
}

/// Submits `chunk`'s reads into `buf`, read `i` at `i * span` (`span` is at
/// least the longest read of the scan).
fn submit_scan(
    shared: &Shared,
    dir: &Dir,
    (chunk, span): (&[ScanRead], usize),
    mut buf: AlignedBuf,
) -> Completion {
    let l = &shared.layout;
    let mut batch = IoBatch::with_capacity(chunk.len());
    for (i, r) in chunk.iter().enumerate() {
        let len = read_len(shared, r);
        debug_assert!(len as usize <= span);
        let op = IoOp {
            kind: IoKind::Read,
            file: dir.file,
            offset: l.header_offset(r.layout, r.region, r.first),
            // SAFETY: `i * span + len` is within the buffer of at least
            // `SCAN_BATCH * span` bytes (chunks are at most that many, and
            // `len <= span`).
            buf: unsafe { buf.as_mut_ptr().add(i * span) },
            len: len as u32,
        };
        // SAFETY: the batch owns the buffer (below) until every read ends,
        // and the reads' ranges are disjoint.
        unsafe { batch.push(op) };
    }
    batch.keep_alive(buf);
    let slots: u64 = chunk.iter().map(|r| r.count as u64).sum();
    add(&shared.stats.read_ios, chunk.len() as u64);
    add(&shared.stats.recovery_slots_scanned, slots);
    shared.engine.submit(batch)
}

/// Waits for `chunk`'s reads and collects the slots that verify; gives the
/// buffer back for the next batch.
fn collect_scan(
    shared: &Shared,
    dir: &Dir,
    gens: &Lives,
    (chunk, span): (&[ScanRead], usize),
    completion: Completion,
    found: &mut Vec<Found>,
) -> Option<AlignedBuf> {
    let l = &shared.layout;
    let mut done = completion.wait();
    let buf = done.take_owner::<AlignedBuf>(0)?;
    for (i, r) in chunk.iter().enumerate() {
        // A failed or short read is skipped: its bytes are not what the
        // disk holds (they may be an earlier batch's).
        if done.results.len() <= i || done.check_op(i).is_err() {
            continue;
        }
        let Some((generation, format)) = gens.get(r.region as usize).copied().flatten() else {
            continue;
        };
        let seal = SlotSeal::of(format, dir.creation_id);
        let stride = header_stride(shared, r.layout);
        let base = i * span;
        for k in 0..r.count {
            let at = base + (k as u64 * stride) as usize;
            let header = &buf[at..at + l.slot_header_bytes as usize];
            let place = (dir.index, r.region, r.first + k);
            if let Some(f) = accept(shared, header, place, (generation, seal)) {
                found.push(f);
            }
        }
    }
    Some(buf)
}

/// The block a scanned slot header names, if the header verifies under its
/// life's seal, names this very place (`(dir, region, slot)`), has the
/// region's generation and the geometry's data length, and its layer sums
/// combine to its block sum.
fn accept(
    shared: &Shared,
    header: &[u8],
    (dir, region, slot): (u8, u32, u32),
    (generation, seal): (u64, SlotSeal),
) -> Option<Found> {
    let l = &shared.layout;
    let h = SlotHeader::decode(header, l.layers, seal)?;
    let ok = h.generation == generation
        && h.dir == dir as u32
        && h.region == region
        && h.slot == slot
        && h.data_len == l.block_bytes
        && kvtier_core::combine_layer_checksums(h.key, &h.layer_sums) == h.block_sum;
    ok.then_some(Found {
        key: h.key,
        slot,
        region,
        sum: h.block_sum,
    })
}
