//! The read path: whole blocks and layer ranges, all of a call in one I/O
//! batch (plus a second only to re-read, alone, the slots of a failed run
//! read), every byte verified.
//!
//! For each request the index entry is looked up and, under the same shard
//! lock, the region's reader count is raised ([`Index::pin`]); the count is
//! held by a [`ReaderPin`] that travels with the batch as an owner, so it is
//! released when the I/O is over even if the caller is cancelled. Targets
//! whose address, file offset and length suit direct I/O are read into
//! directly; others get an aligned bounce buffer and a copy. Layer reads
//! also read the slot header in the same batch and trust its layer sums only
//! if they combine to the index's block checksum. In layer-major lives,
//! adjacent slots are read together, one op per layer ([`runs`]).
//!
//! Any failure (I/O error, short read of a truncated file, checksum
//! mismatch, a header that does not verify) is [`Lookup::Corrupt`]: the
//! index entry is dropped (if it still points at the slot read) and counted.
//! A failed read shared by a run is nobody's fault yet: its slots are read
//! again alone, and that read decides (I17).
//!
//! [`Index::pin`]: crate::index::Index::pin

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use kvtier_core::{BlockHash, BlockSums, Lookup, combine_layer_checksums, layer_checksum};
use kvtier_io::{AlignedBuf, BatchDone, DmaTarget, FileId, IoBatch, IoKind, IoOp};

use crate::format::{LifeFormat, RegionLayout, SlotHeader, SlotSeal, round_up};
use crate::index::Entry;

mod runs;
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

/// Where a request's layer sums come from when they are not cached.
#[derive(Debug, Clone, Copy)]
enum HeaderAt {
    /// A read of its own: op and owner of the header buffer.
    Own { op: usize, owner: usize },
    /// The layer-0 read of its run (a data op of the request): the run's
    /// header buffer (an index into the pass's header buffers) and the
    /// header's offset in it.
    Run { buf: usize, at: usize },
}

/// A request that needs I/O.
struct Planned<T> {
    pos: usize,
    /// The ops that read the wanted bytes, as a range of the pass's op
    /// lists ([`Plan::data_ops`]): one op (block-major), or one per layer
    /// (layer-major), shared with the run's other slots.
    data_ops: Range<usize>,
    /// Whether a data op also reads other slots (a run): a failed read is
    /// then retried on its own rather than taken as this block's fault.
    in_run: bool,
    /// Whether every read of the wanted bytes was planned (a run read the
    /// engine's checks refused was not: the slot is then retried alone).
    planned: bool,
    /// Layer-major lives: the address the wanted bytes land at, in the
    /// target or its bounce buffer, in core order (an integer, so the plan
    /// stays `Send` across the submission).
    landing: Option<usize>,
    dest: Dest<T>,
    check: Check,
}

/// What a request's bytes are checked against.
struct Check {
    key: BlockHash,
    entry: Entry,
    /// How the slot's header is sealed, and the life's generation it must
    /// carry (I16).
    seal: SlotSeal,
    generation: u64,
    /// Where the slot header comes from (layer reads whose layer sums were
    /// not cached).
    header: Option<HeaderAt>,
    /// Cached, already authenticated layer sums (layer reads).
    cached_sums: Option<Arc<[u64]>>,
}

/// The batch of a pass as it is built.
struct Plan {
    batch: IoBatch,
    /// Owners given to the batch so far.
    owners: usize,
    /// Owner indices of the runs' header buffers.
    header_bufs: Vec<usize>,
    /// The requests' data ops, each request's a range of this (one list
    /// per pass rather than one per request).
    data_ops: Vec<usize>,
}

impl Plan {
    /// Records `ops` as one request's (or one run's) data ops.
    fn data_ops(&mut self, ops: impl IntoIterator<Item = usize>) -> Range<usize> {
        let start = self.data_ops.len();
        self.data_ops.extend(ops);
        start..self.data_ops.len()
    }

    /// Counts the owner just given to the batch; returns its index.
    fn owner(&mut self) -> usize {
        self.owners += 1;
        self.owners - 1
    }

    /// Adds a read of the slot header at file offset `offset` into a buffer
    /// of its own.
    fn read_header(&mut self, shared: &Shared, file: FileId, offset: u64) -> HeaderAt {
        let l = &shared.layout;
        let op = self.batch.len();
        let buf = AlignedBuf::zeroed(l.slot_header_bytes as usize, shared.align.mem.max(4096));
        self.batch.read_owned(file, offset, buf);
        HeaderAt::Own {
            op,
            owner: self.owner(),
        }
    }
}

/// One request's outcome from a pass.
enum Outcome<T> {
    /// Decided: the target back, the lookup, and the block's sums on a hit.
    Done(usize, T, Lookup, Option<BlockSums>),
    /// A read shared with other slots failed: read this one again alone.
    Retry(usize, BlockHash, T),
}

/// The body of `get_batch` (`layers == None`) and `read_layers`, and of
/// their `_with_sums` forms (`want_sums`: hits come with the block's sums).
pub(crate) async fn read<T: DmaTarget>(
    shared: &Arc<Shared>,
    reqs: Vec<(BlockHash, T)>,
    layers: Option<Range<u32>>,
    want_sums: bool,
) -> Vec<(T, Lookup, Option<BlockSums>)> {
    let l = &shared.layout;
    let n = reqs.len();
    let range = match &layers {
        None => 0..l.layers,
        Some(r) if r.start < r.end && r.end <= l.layers => r.clone(),
        Some(r) => {
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
    };
    let pass = Pass {
        shared,
        layers: &layers,
        range,
        want_sums,
    };
    let mut out: Vec<Option<(T, Lookup, Option<BlockSums>)>> = (0..n).map(|_| None).collect();
    let mut retry = Vec::new();
    for outcome in pass.run(reqs.into_iter().enumerate().collect(), true).await {
        match outcome {
            Outcome::Done(pos, t, lookup, sums) => out[pos] = Some((t, lookup, sums)),
            Outcome::Retry(pos, key, t) => retry.push((pos, (key, t))),
        }
    }
    if !retry.is_empty() {
        add(&shared.stats.run_retries, retry.len() as u64);
        // Alone, a failed read is the block's own: no second retry.
        for outcome in pass.run(retry, false).await {
            if let Outcome::Done(pos, t, lookup, sums) = outcome {
                out[pos] = Some((t, lookup, sums));
            }
        }
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

/// One batch of reads of a call: what is read and how.
struct Pass<'a> {
    shared: &'a Arc<Shared>,
    /// The caller's layers (`None`: whole blocks).
    layers: &'a Option<Range<u32>>,
    /// The layers read: `layers`, or all of them.
    range: Range<u32>,
    /// Whether the caller keeps the blocks' sums.
    want_sums: bool,
}

impl Pass<'_> {
    /// Pins, plans, submits and verifies `reqs` (position in the call, key,
    /// target) in one batch. With `runs`, layer-major slots next to each
    /// other are read together (see [`runs`]).
    async fn run<T: DmaTarget>(
        &self,
        reqs: Vec<(usize, (BlockHash, T))>,
        runs: bool,
    ) -> Vec<Outcome<T>> {
        let shared = self.shared;
        let mut out = Vec::with_capacity(reqs.len());
        let mut plan = Plan {
            batch: IoBatch::with_capacity(reqs.len() * 2),
            owners: 0,
            header_bufs: Vec::new(),
            data_ops: Vec::new(),
        };
        let mut planned: Vec<Planned<T>> = Vec::new();
        for (pos, (key, target)) in reqs {
            match self.pin(&mut plan, pos, key, target) {
                Ok(p) => planned.push(p),
                Err(target) => {
                    add(&shared.stats.misses, 1);
                    out.push(Outcome::Done(pos, target, Lookup::Miss, None));
                }
            }
        }
        let want_headers = self.layers.is_some();
        runs::plan(
            shared,
            &mut plan,
            &mut planned,
            (&self.range, want_headers),
            runs,
        );
        if planned.is_empty() {
            return out;
        }
        add(&shared.stats.read_ios, plan.batch.len() as u64);
        let header_owners = std::mem::take(&mut plan.header_bufs);
        let data_ops = std::mem::take(&mut plan.data_ops);
        let mut done = shared.engine.submit(plan.batch).await;
        let complete = done.results.len() == done.ops.len() && !done.ops.is_empty();
        let headers: Vec<Option<AlignedBuf>> =
            header_owners.iter().map(|o| done.take_owner(*o)).collect();
        for p in planned {
            let read_ok = complete && p.planned && {
                let mut ops = data_ops[p.data_ops.clone()].iter();
                ops.all(|&op| done.check_op(op).is_ok())
            };
            out.extend(self.finish(&mut done, read_ok, &headers, p));
        }
        // Dropping `done` releases the reader pins.
        drop(done);
        out
    }

    /// Pins `key`'s entry and plans what needs no neighbours: a block-major
    /// read, a header read, the landing of a layer-major one. `Err` gives
    /// the target back for a miss (wrong length, not indexed).
    fn pin<T: DmaTarget>(
        &self,
        plan: &mut Plan,
        pos: usize,
        key: BlockHash,
        target: T,
    ) -> std::result::Result<Planned<T>, T> {
        let shared = self.shared;
        let l = &shared.layout;
        let want_len = match self.layers {
            None => l.block_bytes,
            Some(_) => (self.range.end - self.range.start) as u64 * l.layer_bytes,
        };
        if target.len() as u64 != want_len {
            tracing::warn!(%key, len = target.len(), want = want_len, "read target of the wrong length");
            return Err(target);
        }
        let Some(entry) = shared.index.pin(key, |e| {
            shared
                .region(e.loc.dir, e.loc.region)
                .is_some_and(|r| r.latch.try_enter())
        }) else {
            return Err(target);
        };
        let dir = &shared.dirs[entry.loc.dir as usize];
        // Pinned: the life (and its format) cannot change under us (I13).
        let (format, generation) = shared
            .region(entry.loc.dir, entry.loc.region)
            .map_or((LifeFormat::V1, 0), |r| (r.format(), r.generation()));
        let cached_sums = self
            .layers
            .as_ref()
            .and_then(|_| shared.layer_sums.get(key, entry.sum));
        let mut data_ops = 0..0;
        let mut header = None;
        let (dest, landing) = match format.layout {
            RegionLayout::Block => {
                let off = l.data_offset(entry.loc.region, entry.loc.slot)
                    + self.range.start as u64 * l.layer_bytes;
                data_ops = plan.data_ops([plan.batch.len()]);
                let dest = plan_contiguous(shared, plan, dir.file, off, target);
                if self.layers.is_some() && cached_sums.is_none() {
                    let at = l.slot_offset(entry.loc.region, entry.loc.slot);
                    header = Some(plan.read_header(shared, dir.file, at));
                }
                (dest, None)
            }
            // Ops and header reads come with the runs (`runs::plan`).
            RegionLayout::Layer => {
                let (dest, at) = land(shared, plan, target);
                (dest, Some(at))
            }
        };
        plan.batch.keep_alive(ReaderPin {
            shared: shared.clone(),
            dir: entry.loc.dir,
            region: entry.loc.region,
        });
        plan.owner();
        Ok(Planned {
            pos,
            data_ops,
            in_run: false,
            planned: true,
            landing,
            dest,
            check: Check {
                key,
                entry,
                seal: SlotSeal::of(format, dir.creation_id),
                generation,
                header,
                cached_sums,
            },
        })
    }

    /// Verifies one request's bytes (`data_ok`: its data ops all read in
    /// full) and decides its outcome (`None`: the engine lost the target).
    fn finish<T: DmaTarget>(
        &self,
        done: &mut BatchDone,
        data_ok: bool,
        headers: &[Option<AlignedBuf>],
        p: Planned<T>,
    ) -> Option<Outcome<T>> {
        let shared = self.shared;
        let c = p.check;
        let read_ok = data_ok
            && match c.header {
                Some(HeaderAt::Own { op, .. }) => done.check_op(op).is_ok(),
                _ => true,
            };
        let (mut target, bounce, skip) = match p.dest {
            Dest::Direct { owner } => (done.take_owner::<T>(owner)?, None, 0),
            Dest::Bounce {
                owner,
                skip,
                target,
            } => (target, done.take_owner::<AlignedBuf>(owner), skip),
        };
        if !read_ok && p.in_run {
            return Some(Outcome::Retry(p.pos, c.key, target));
        }
        let len = target.len();
        let sums = if read_ok {
            let bytes: &[u8] = match &bounce {
                Some(b) => &b[skip..skip + len],
                // SAFETY: the read into the target is finished and we own
                // the target again; DmaTarget guarantees len() valid bytes
                // at the pointer.
                None => unsafe { std::slice::from_raw_parts(target.as_mut_ptr(), len) },
            };
            self.verify(done, headers, &c, bytes)
        } else {
            None
        };
        let Some(sums) = sums else {
            shared.index.remove_if_at(c.key, c.entry.loc);
            add(&shared.stats.corrupt, 1);
            tracing::warn!(key = %c.key, dir = c.entry.loc.dir, region = c.entry.loc.region, slot = c.entry.loc.slot, "disk block failed verification; dropped");
            return Some(Outcome::Done(p.pos, target, Lookup::Corrupt, None));
        };
        if let Some(b) = &bounce {
            // SAFETY: as above; the target is ours and valid for `len`
            // bytes, and the bounce buffer is a distinct allocation.
            unsafe { std::ptr::copy_nonoverlapping(b[skip..].as_ptr(), target.as_mut_ptr(), len) };
        }
        if let Some(r) = shared.region(c.entry.loc.dir, c.entry.loc.region) {
            let t = shared.tick.fetch_add(1, Ordering::Relaxed) + 1;
            r.last_read.fetch_max(t, Ordering::Relaxed);
        }
        add(&shared.stats.hits, 1);
        Some(Outcome::Done(p.pos, target, Lookup::Hit, sums))
    }

    /// `None` if `bytes` fail verification, else the block's sums when the
    /// caller wants them: computed for a whole block, or the authenticated
    /// layer sums the layers matched.
    fn verify(
        &self,
        done: &mut BatchDone,
        headers: &[Option<AlignedBuf>],
        c: &Check,
        bytes: &[u8],
    ) -> Option<Option<BlockSums>> {
        let shared = self.shared;
        let l = &shared.layout;
        let Some(r) = self.layers else {
            let s = BlockSums::compute(c.key, l.layer_bytes as usize, bytes);
            return (s.block == c.entry.sum).then_some(Some(s));
        };
        let authentic = match &c.cached_sums {
            Some(cached) => cached.clone(),
            None => self.header_sums(done, headers, c)?,
        };
        if !layers_match(c.key, l.layer_bytes, &authentic, r, bytes) {
            return None;
        }
        // Copied only for a caller that keeps them (`*_with_sums`).
        let layers = self.want_sums.then(|| authentic.to_vec());
        if c.cached_sums.is_none() {
            shared.layer_sums.insert(c.key, c.entry.sum, authentic);
        }
        Some(layers.map(|layers| BlockSums {
            block: c.entry.sum,
            layers,
        }))
    }

    /// The authenticated layer sums of the request's slot header, read on
    /// its own or with its run's layer 0.
    fn header_sums(
        &self,
        done: &mut BatchDone,
        headers: &[Option<AlignedBuf>],
        c: &Check,
    ) -> Option<Arc<[u64]>> {
        let h = self.shared.layout.slot_header_bytes as usize;
        let authentic = |bytes: &[u8]| {
            header_layer_sums(
                self.shared,
                (c.key, &c.entry),
                (c.seal, c.generation),
                bytes,
            )
        };
        match c.header? {
            HeaderAt::Own { owner, .. } => done
                .take_owner::<AlignedBuf>(owner)
                .and_then(|b| authentic(&b)),
            HeaderAt::Run { buf, at } => headers
                .get(buf)?
                .as_ref()
                .and_then(|b| b.get(at..at + h))
                .and_then(authentic),
        }
    }
}

/// Plans the read of `target.len()` contiguous bytes at file offset `off`
/// (block-major lives): one op, straight into the target when address,
/// offset and length suit direct I/O, else into an aligned bounce buffer.
fn plan_contiguous<T: DmaTarget>(
    shared: &Shared,
    plan: &mut Plan,
    file: FileId,
    off: u64,
    mut target: T,
) -> Dest<T> {
    let a = shared.align;
    let len = target.len() as u64;
    let direct = (target.as_mut_ptr() as usize).is_multiple_of(a.mem)
        && off.is_multiple_of(a.offset as u64)
        && len.is_multiple_of(a.offset as u64);
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
        unsafe { plan.batch.push(op) };
        plan.batch.keep_alive(target);
        return Dest::Direct {
            owner: plan.owner(),
        };
    }
    let step = a.offset as u64;
    let from = off / step * step;
    let to = round_up(off + len, step);
    let buf = AlignedBuf::zeroed((to - from) as usize, a.mem.max(4096));
    plan.batch.read_owned(file, from, buf);
    Dest::Bounce {
        owner: plan.owner(),
        skip: (off - from) as usize,
        target,
    }
}

/// Where a layer-major request's pieces land, in core order: the target
/// itself when it suits direct I/O, else a bounce buffer of its length
/// (pieces are whole sectors, so their offsets and lengths always suit).
/// The batch owns the memory from here on; the ops come later.
fn land<T: DmaTarget>(shared: &Shared, plan: &mut Plan, mut target: T) -> (Dest<T>, usize) {
    let a = shared.align;
    let p = shared.layout.layer_bytes;
    let at = target.as_mut_ptr() as usize;
    if at.is_multiple_of(a.mem) && p.is_multiple_of(a.mem as u64) {
        plan.batch.keep_alive(target);
        let owner = plan.owner();
        return (Dest::Direct { owner }, at);
    }
    let mut bounce = AlignedBuf::zeroed(target.len(), a.mem.max(4096));
    let at = bounce.as_mut_ptr() as usize;
    plan.batch.keep_alive(bounce);
    let dest = Dest::Bounce {
        owner: plan.owner(),
        skip: 0,
        target,
    };
    (dest, at)
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
