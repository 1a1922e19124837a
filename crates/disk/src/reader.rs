//! The read path: whole blocks and layer ranges, all of a call in one I/O
//! batch, every byte verified.
//!
//! For each request the index entry is looked up and, under the same shard
//! lock, the region's reader count is raised ([`Index::pin`]); the count is
//! held by a [`ReaderPin`] that travels with the batch as an owner, so it is
//! released when the I/O is over even if the caller is cancelled. Targets
//! whose address, file offset and length suit direct I/O are read into
//! directly; others get an aligned bounce buffer and a copy. Layer reads
//! also read the slot header in the same batch and trust its layer sums only
//! if they combine to the index's block checksum.
//!
//! Any failure (I/O error, short read of a truncated file, checksum
//! mismatch, a header that does not verify) is [`Lookup::Corrupt`]: the
//! index entry is dropped (if it still points at the slot read) and counted.
//!
//! [`Index::pin`]: crate::index::Index::pin

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use kvtier_core::{BlockHash, BlockSums, Lookup, combine_layer_checksums, layer_checksum};
use kvtier_io::{AlignedBuf, BatchDone, DmaTarget, FileId, IoBatch, IoKind, IoOp};

use crate::format::{LifeFormat, RegionLayout, SlotHeader, SlotSeal, round_up};
use crate::index::Entry;
use crate::stats::add;
use crate::tier::Shared;

/// Holds a region's reader count while a read of it is in flight.
struct ReaderPin {
    shared: Arc<Shared>,
    dir: u8,
    region: u32,
}

impl Drop for ReaderPin {
    fn drop(&mut self) {
        if let Some(r) = self.shared.region(self.dir, self.region) {
            r.latch.exit();
        }
    }
}

/// Where a request's bytes land.
enum Dest<T> {
    /// Read straight into the target, owner `owner` of the batch.
    Direct { owner: usize },
    /// Read into bounce buffer `owner`; the wanted bytes start at `skip`.
    Bounce {
        owner: usize,
        skip: usize,
        target: T,
    },
}

/// A request that needs I/O.
struct Planned<T> {
    pos: usize,
    key: BlockHash,
    entry: Entry,
    /// The ops that read the wanted bytes (one, or one per layer piece of
    /// a layer-major life).
    data_ops: Range<usize>,
    /// How the slot's header is sealed, and the life's generation it must
    /// carry (I16).
    seal: SlotSeal,
    generation: u64,
    dest: Dest<T>,
    /// Op and owner index of the slot header read (layer reads whose
    /// layer sums were not cached).
    header: Option<(usize, usize)>,
    /// Cached, already authenticated layer sums (layer reads).
    cached_sums: Option<Arc<[u64]>>,
}

/// The body of `get_batch` (`layers == None`) and `read_layers`.
pub(crate) async fn read<T: DmaTarget>(
    shared: &Arc<Shared>,
    reqs: Vec<(BlockHash, T)>,
    layers: Option<Range<u32>>,
) -> Vec<(T, Lookup, Option<BlockSums>)> {
    let l = &shared.layout;
    let n = reqs.len();
    let (range, want_len) = match &layers {
        None => (0..l.block_bytes, l.block_bytes),
        Some(r) => {
            if r.start >= r.end || r.end > l.layers {
                tracing::warn!(
                    ?r,
                    layers = l.layers,
                    "read_layers with an invalid layer range"
                );
                add(&shared.stats.misses, n as u64);
                return reqs
                    .into_iter()
                    .map(|(_, t)| (t, Lookup::Miss, None))
                    .collect();
            }
            let start = r.start as u64 * l.layer_bytes;
            let end = r.end as u64 * l.layer_bytes;
            (start..end, end - start)
        }
    };
    let mut out: Vec<Option<(T, Lookup, Option<BlockSums>)>> = (0..n).map(|_| None).collect();
    let mut planned: Vec<Planned<T>> = Vec::new();
    let mut batch = IoBatch::with_capacity(n * if layers.is_some() { 2 } else { 1 });
    let mut owners = 0usize;
    for (pos, (key, target)) in reqs.into_iter().enumerate() {
        if target.len() as u64 != want_len {
            tracing::warn!(%key, len = target.len(), want = want_len, "read target of the wrong length");
            add(&shared.stats.misses, 1);
            out[pos] = Some((target, Lookup::Miss, None));
            continue;
        }
        let entry = shared.index.pin(key, |e| {
            shared
                .region(e.loc.dir, e.loc.region)
                .is_some_and(|r| r.latch.try_enter())
        });
        let Some(entry) = entry else {
            add(&shared.stats.misses, 1);
            out[pos] = Some((target, Lookup::Miss, None));
            continue;
        };
        let dir = &shared.dirs[entry.loc.dir as usize];
        // Pinned: the life (and its format) cannot change under us (I13).
        let (format, generation) = shared
            .region(entry.loc.dir, entry.loc.region)
            .map_or((LifeFormat::V1, 0), |r| (r.format(), r.generation()));
        let first_layer = (range.start / l.layer_bytes) as u32;
        let data_ops = batch.len();
        let dest = match format.layout {
            RegionLayout::Block => {
                let off = l.data_offset(entry.loc.region, entry.loc.slot) + range.start;
                plan_contiguous(shared, &mut batch, &mut owners, dir.file, off, target)
            }
            RegionLayout::Layer => {
                let pieces = (want_len / l.layer_bytes) as u32;
                let offs = (first_layer..first_layer + pieces).map(|layer| {
                    l.piece_offset(format.layout, entry.loc.region, layer, entry.loc.slot)
                });
                plan_pieces(shared, &mut batch, &mut owners, dir.file, offs, target)
            }
        };
        let data_ops = data_ops..batch.len();
        let a = shared.align;
        let cached_sums = layers
            .as_ref()
            .and_then(|_| shared.layer_sums.get(key, entry.sum));
        let header = layers.as_ref().filter(|_| cached_sums.is_none()).map(|_| {
            let op = batch.len();
            let buf = AlignedBuf::zeroed(l.slot_header_bytes as usize, a.mem.max(4096));
            batch.read_owned(
                dir.file,
                l.header_offset(format.layout, entry.loc.region, entry.loc.slot),
                buf,
            );
            owners += 1;
            (op, owners - 1)
        });
        batch.keep_alive(ReaderPin {
            shared: shared.clone(),
            dir: entry.loc.dir,
            region: entry.loc.region,
        });
        owners += 1;
        planned.push(Planned {
            pos,
            key,
            entry,
            data_ops,
            seal: SlotSeal::of(format, dir.creation_id),
            generation,
            dest,
            header,
            cached_sums,
        });
    }
    if !planned.is_empty() {
        add(&shared.stats.read_ios, batch.len() as u64);
        let mut done = shared.engine.submit(batch).await;
        let complete = done.results.len() == done.ops.len() && !done.ops.is_empty();
        for p in planned {
            let result = finish(shared, &mut done, complete, p, &layers);
            if let Some((pos, t, lookup, sums)) = result {
                out[pos] = Some((t, lookup, sums));
            }
        }
        // Dropping `done` releases the reader pins.
        drop(done);
    }
    let results: Vec<(T, Lookup, Option<BlockSums>)> = out.into_iter().flatten().collect();
    if results.len() != n {
        tracing::error!(
            lost = n - results.len(),
            "the I/O engine lost read targets (it shut down mid-batch)"
        );
    }
    results
}

/// Plans the read of `len` contiguous bytes at file offset `off` into
/// `target`: one op, straight into it when address, offset and length suit
/// direct I/O, else into an aligned bounce buffer (block-major lives).
fn plan_contiguous<T: DmaTarget>(
    shared: &Shared,
    batch: &mut IoBatch,
    owners: &mut usize,
    file: FileId,
    off: u64,
    mut target: T,
) -> Dest<T> {
    let a = shared.align;
    let len = target.len() as u64;
    let direct = (target.as_mut_ptr() as usize).is_multiple_of(a.mem)
        && off.is_multiple_of(a.offset as u64)
        && len.is_multiple_of(a.offset as u64);
    *owners += 1;
    if direct {
        let op = IoOp {
            kind: IoKind::Read,
            file,
            offset: off,
            buf: target.as_mut_ptr(),
            len: len as u32,
        };
        // SAFETY: the target is valid for len() bytes at a stable address
        // (DmaTarget's contract) and is owned by the batch from here on.
        unsafe { batch.push(op) };
        batch.keep_alive(target);
        return Dest::Direct { owner: *owners - 1 };
    }
    let step = a.offset as u64;
    let from = off / step * step;
    let to = round_up(off + len, step);
    let buf = AlignedBuf::zeroed((to - from) as usize, a.mem.max(4096));
    batch.read_owned(file, from, buf);
    Dest::Bounce {
        owner: *owners - 1,
        skip: (off - from) as usize,
        target,
    }
}

/// Plans the read of consecutive layer pieces (one `layer_bytes` piece at
/// each of `offs`) into `target` in core order, one op per piece: into the
/// target itself when it suits direct I/O, else into a bounce buffer of the
/// target's length. Pieces are whole sectors (layer-major eligibility), so
/// offsets and lengths always suit direct I/O.
fn plan_pieces<T: DmaTarget>(
    shared: &Shared,
    batch: &mut IoBatch,
    owners: &mut usize,
    file: FileId,
    offs: impl Iterator<Item = u64>,
    mut target: T,
) -> Dest<T> {
    let a = shared.align;
    let p = shared.layout.layer_bytes;
    let direct =
        (target.as_mut_ptr() as usize).is_multiple_of(a.mem) && p.is_multiple_of(a.mem as u64);
    let mut bounce = (!direct).then(|| AlignedBuf::zeroed(target.len(), a.mem.max(4096)));
    let base = match &mut bounce {
        Some(b) => b.as_mut_ptr(),
        None => target.as_mut_ptr(),
    };
    for (i, offset) in offs.enumerate() {
        let op = IoOp {
            kind: IoKind::Read,
            file,
            offset,
            buf: base.wrapping_add(i * p as usize),
            len: p as u32,
        };
        // SAFETY: piece `i` lies inside the target or bounce buffer (the
        // caller sized it to the pieces), whose heap memory stays at its
        // address and is owned by the batch (kept alive below) until the
        // reads end.
        unsafe { batch.push(op) };
    }
    *owners += 1;
    match bounce {
        Some(b) => {
            batch.keep_alive(b);
            Dest::Bounce {
                owner: *owners - 1,
                skip: 0,
                target,
            }
        }
        None => {
            batch.keep_alive(target);
            Dest::Direct { owner: *owners - 1 }
        }
    }
}

/// Verifies one request's bytes and decides its outcome, with the block's
/// checksums: computed while verifying a whole block, or the authenticated
/// ones a layer read was verified against.
fn finish<T: DmaTarget>(
    shared: &Shared,
    done: &mut BatchDone,
    complete: bool,
    p: Planned<T>,
    layers: &Option<Range<u32>>,
) -> Option<(usize, T, Lookup, Option<BlockSums>)> {
    let l = &shared.layout;
    let read_ok = complete
        && p.data_ops.clone().all(|op| done.check_op(op).is_ok())
        && p.header.is_none_or(|(op, _)| done.check_op(op).is_ok());
    let (mut target, bounce, skip) = match p.dest {
        Dest::Direct { owner } => (done.take_owner::<T>(owner)?, None, 0),
        Dest::Bounce {
            owner,
            skip,
            target,
        } => (target, done.take_owner::<AlignedBuf>(owner), skip),
    };
    let len = target.len();
    let mut sums = None;
    let verified = read_ok && {
        let bytes: &[u8] = match &bounce {
            Some(b) => &b[skip..skip + len],
            // SAFETY: the read into the target is finished and we own the
            // target again; DmaTarget guarantees len() valid bytes at the
            // pointer.
            None => unsafe { std::slice::from_raw_parts(target.as_mut_ptr(), len) },
        };
        match layers {
            None => {
                let s = BlockSums::compute(p.key, l.layer_bytes as usize, bytes);
                let ok = s.block == p.entry.sum;
                sums = ok.then_some(s);
                ok
            }
            Some(r) => {
                let authentic = match &p.cached_sums {
                    Some(cached) => Some(cached.clone()),
                    None => p
                        .header
                        .and_then(|(_, owner)| done.take_owner::<AlignedBuf>(owner))
                        .and_then(|h| {
                            header_layer_sums(shared, (p.key, &p.entry), (p.seal, p.generation), &h)
                        }),
                };
                match authentic {
                    Some(layer_sums)
                        if layers_match(p.key, l.layer_bytes, &layer_sums, r, bytes) =>
                    {
                        sums = Some(BlockSums {
                            block: p.entry.sum,
                            layers: layer_sums.to_vec(),
                        });
                        if p.cached_sums.is_none() {
                            shared.layer_sums.insert(p.key, p.entry.sum, layer_sums);
                        }
                        true
                    }
                    _ => false,
                }
            }
        }
    };
    if !verified {
        shared.index.remove_if_at(p.key, p.entry.loc);
        add(&shared.stats.corrupt, 1);
        tracing::warn!(key = %p.key, dir = p.entry.loc.dir, region = p.entry.loc.region, slot = p.entry.loc.slot, "disk block failed verification; dropped");
        return Some((p.pos, target, Lookup::Corrupt, None));
    }
    if let Some(b) = &bounce {
        // SAFETY: as above; the target is ours and valid for `len` bytes,
        // and the bounce buffer is a distinct allocation.
        unsafe { std::ptr::copy_nonoverlapping(b[skip..].as_ptr(), target.as_mut_ptr(), len) };
    }
    if let Some(r) = shared.region(p.entry.loc.dir, p.entry.loc.region) {
        let t = shared.tick.fetch_add(1, Ordering::Relaxed) + 1;
        r.last_read.fetch_max(t, Ordering::Relaxed);
    }
    add(&shared.stats.hits, 1);
    Some((p.pos, target, Lookup::Hit, sums))
}

/// The layer sums of a slot header, if the header verifies under its life's
/// seal, belongs to the key at this very place (directory, region, slot) in
/// the region's current life, and its sums combine to the indexed block
/// checksum (which authenticates them; I16).
fn header_layer_sums(
    shared: &Shared,
    (key, entry): (BlockHash, &Entry),
    (seal, generation): (SlotSeal, u64),
    header: &[u8],
) -> Option<Arc<[u64]>> {
    let l = &shared.layout;
    let h = SlotHeader::decode(header, l.layers, seal)?;
    let ok = h.key == key
        && h.dir == entry.loc.dir as u32
        && h.region == entry.loc.region
        && h.slot == entry.loc.slot
        && h.generation == generation
        && h.data_len == l.block_bytes
        && h.block_sum == entry.sum
        && combine_layer_checksums(key, &h.layer_sums) == entry.sum;
    ok.then(|| Arc::from(h.layer_sums))
}

/// Whether `bytes` (layers `r` of block `key`) match the authenticated
/// layer sums.
fn layers_match(
    key: BlockHash,
    layer_bytes: u64,
    sums: &[u64],
    r: &Range<u32>,
    bytes: &[u8],
) -> bool {
    bytes
        .chunks(layer_bytes as usize)
        .zip(r.clone())
        .all(|(chunk, layer)| {
            sums.get(layer as usize)
                .is_some_and(|s| layer_checksum(key, layer, chunk) == *s)
        })
}
