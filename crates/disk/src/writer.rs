//! The write path: slot reservation, region assembly, extent writes and the
//! per-directory reaper that acknowledges them.
//!
//! ```text
//! put_batch ──lock dir writer──> reserve slots in the open region (open / reclaim one if needed)
//!           ──> push a Ticket to the dir's reaper queue (still under the lock: queue order = reservation order)
//!           ──unlock──> copy headers + data into the region buffer (own slots only)
//!           ──> submit the new extent in ONE submission (ops of <= 128 KiB); hand the Completion to the ticket
//! reaper    ──> wait for the write ──> extent ok and its region header durable?
//!           ──> tier latched by a failed sync? not acknowledged (I12)
//!           ──> (last extent of a sealed region: fdatasync through the engine if `sync`;
//!                a failure latches the tier)
//!           ──> insert index entries ──> retire the extent ──> reply to put_batch
//! ```
//!
//! Acknowledgement rules (numbered as in `docs/disk-format.md`):
//! an index entry is inserted only after the extent's write completed (I1),
//! and only if the write that carried its region's header completed too
//! (I2): the reaper processes a directory's extents in reservation order and
//! the header is in a region's first extent, so its outcome is known by then.
//! Reaping on a thread of its own keeps acknowledgement independent of the
//! caller: a cancelled `put_batch` still has its extents retired and its
//! buffers released.

use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::{Arc, Weak};

use kvtier_core::BlockHash;
use kvtier_io::{BatchDone, Completion, DmaSource, IoBatch, IoKind, IoOp};
use tokio::sync::oneshot;

use crate::format::{REGION_HEADER_BYTES, RegionHeader, RegionLayout, SlotHeader, SlotSeal};
use crate::index::{Entry, Loc};
use crate::latch::state;
use crate::pool::RegionBuf;
use crate::region::Fill;
use crate::stats::add;
use crate::tier::{Dir, Shared};
use crate::{DiskError, Result};
use kvtier_tier::BlockPut;

/// The region currently taking writes in a directory.
pub(crate) struct OpenRegion {
    pub region: u32,
    pub generation: u64,
    pub buf: Arc<RegionBuf>,
    pub next_slot: u32,
}

/// A directory's allocation state, behind its async writer lock.
pub(crate) struct DirWriter {
    pub open: Option<OpenRegion>,
    /// Free regions, lowest index first.
    pub free: VecDeque<u32>,
    reaper: Option<mpsc::Sender<Ticket>>,
}

impl DirWriter {
    pub fn new(free: VecDeque<u32>) -> Self {
        DirWriter {
            open: None,
            free,
            reaper: None,
        }
    }

    /// Queues a ticket; `false` if the reaper is gone.
    pub fn send(&self, t: Ticket) -> bool {
        self.reaper.as_ref().is_some_and(|r| r.send(t).is_ok())
    }
}

/// What an extent carries, for its acknowledgement.
pub(crate) struct Extent {
    pub region: u32,
    pub start: u32,
    /// Key and block checksum of each slot from `start` on.
    pub blocks: Vec<(BlockHash, u64)>,
    pub has_header: bool,
    /// Written by reclaim's re-insertion (no caller waits).
    pub reinsert: bool,
    /// Of a re-insertion, the leading blocks re-inserted because the reclaim
    /// listener wanted them.
    pub retained: u32,
}

/// Where a reaper sends an extent's outcome.
type Reply = oneshot::Receiver<Outcome>;

/// Why an extent was not acknowledged.
#[derive(Debug, Clone)]
pub(crate) enum NotAcked {
    /// Its own write (or the final `fdatasync`) failed.
    Write(String),
    /// The write carrying its region's header failed, which latched the
    /// directory.
    DirFailed,
    /// A sync failed (its own, or an earlier one anywhere in the tier),
    /// which latched the tier (I12).
    SyncFailed(String),
}

/// An extent's outcome.
pub(crate) type Outcome = Result<(), NotAcked>;

/// An item in a reaper's queue.
pub(crate) enum Ticket {
    /// An extent: its write's completion arrives on `completion` once
    /// submitted; the outcome goes to `reply`.
    Extent {
        extent: Extent,
        completion: mpsc::Receiver<Completion>,
        reply: Option<oneshot::Sender<Outcome>>,
    },
    /// Replies once every earlier ticket is processed.
    Flush(oneshot::Sender<()>),
}

/// Starts the reaper of directory `dir`.
pub(crate) fn start_reaper(shared: &Arc<Shared>, dir: u8) -> Result<()> {
    let (tx, rx) = mpsc::channel::<Ticket>();
    let weak = Arc::downgrade(shared);
    std::thread::Builder::new()
        .name(format!("kvtier-disk-reap{dir}"))
        .spawn(move || reaper_loop(weak, dir, rx))
        .map_err(|e| DiskError::io("kvtier-disk reaper thread", e))?;
    // The lock is uncontended at open.
    shared.dirs[dir as usize]
        .writer
        .try_lock()
        .map_err(|_| DiskError::InvalidConfig("writer busy at open".into()))?
        .reaper = Some(tx);
    Ok(())
}

fn reaper_loop(weak: Weak<Shared>, dir: u8, rx: mpsc::Receiver<Ticket>) {
    // Ends when every sender is gone: the tier was dropped.
    while let Ok(ticket) = rx.recv() {
        match ticket {
            Ticket::Flush(tx) => {
                let _ = tx.send(());
            }
            Ticket::Extent {
                extent,
                completion,
                reply,
            } => {
                // A disconnected channel means the write was never submitted
                // (the submitter panicked between reserving and submitting).
                let done = completion.recv().ok().map(Completion::wait);
                let outcome = match weak.upgrade() {
                    Some(shared) => retire(&shared, dir, extent, done),
                    None => Err(NotAcked::Write("the disk tier was dropped".to_owned())),
                };
                if let Some(r) = reply {
                    let _ = r.send(outcome);
                }
            }
        }
    }
}

/// Acknowledges (or fails) one finished extent. See the module docs.
fn retire(shared: &Shared, dir_idx: u8, ext: Extent, done: Option<BatchDone>) -> Outcome {
    let dir = &shared.dirs[dir_idx as usize];
    let region = &dir.regions[ext.region as usize];
    let mut outcome = match &done {
        Some(d) if !d.results.is_empty() => d.check().map_err(|e| NotAcked::Write(e.to_string())),
        Some(_) => Err(NotAcked::Write(
            "the I/O engine shut down mid-write".to_owned(),
        )),
        None => Err(NotAcked::Write("the write was never submitted".to_owned())),
    };
    let last = {
        let mut fill = region.fill.lock();
        if ext.has_header {
            fill.header_ok = Some(outcome.is_ok());
        } else if outcome.is_ok() && fill.header_ok != Some(true) {
            outcome = Err(NotAcked::DirFailed);
        }
        fill.sealed && fill.inflight.len() == 1
    };
    // Checked after the write finished, before anything is indexed: no
    // block is acknowledged once a sync has failed (I12).
    if outcome.is_ok()
        && let Some(why) = shared.latch.reason()
    {
        outcome = Err(NotAcked::SyncFailed(why.to_owned()));
    }
    if outcome.is_ok()
        && last
        && shared.cfg.sync
        && let Err(e) = shared.latch.sync(
            &*shared.engine,
            dir.file,
            IoKind::Fdatasync,
            &dir.data_path(),
        )
    {
        add(&shared.stats.io_errors, 1);
        dir.fail(&e.to_string());
        outcome = Err(NotAcked::SyncFailed(e.to_string()));
    }
    match &outcome {
        Ok(()) => {
            for (i, (key, sum)) in ext.blocks.iter().enumerate() {
                let entry = Entry {
                    loc: Loc {
                        dir: dir_idx,
                        region: ext.region,
                        slot: ext.start + i as u32,
                    },
                    sum: *sum,
                    hot: false,
                };
                shared.index.insert(*key, entry);
            }
            let n = ext.blocks.len() as u64;
            if ext.reinsert {
                add(&shared.stats.reinserted, n);
                add(&shared.stats.reclaim_retained, ext.retained as u64);
            } else {
                add(&shared.stats.puts, n);
                add(&shared.stats.put_bytes, n * shared.layout.block_bytes);
            }
        }
        Err(NotAcked::Write(why)) => {
            add(&shared.stats.io_errors, 1);
            dir.fail(why);
        }
        Err(NotAcked::DirFailed) => dir.fail("an earlier write of the region failed"),
        // Counted and logged where the sync failed.
        Err(NotAcked::SyncFailed(_)) => {}
    }
    if ext.reinsert && outcome.is_err() {
        // Their old copies are gone: the blocks are lost after all.
        crate::reclaim::report_lost(shared, ext.blocks.iter().map(|(k, _)| *k));
    }
    {
        let mut fill = region.fill.lock();
        if let Some(p) = fill.inflight.iter().position(|s| *s == ext.start) {
            fill.inflight.swap_remove(p);
        }
        if fill.sealed && fill.inflight.is_empty() && outcome.is_ok() {
            region.latch.set_state(state::SEALED);
        }
    }
    // Releases the buffer reference the write held.
    drop(done);
    dir.pool.wake();
    outcome
}

/// A block to place: borrowed from the caller or owned by reclaim.
pub(crate) struct Place<'a> {
    pub key: BlockHash,
    pub data: &'a [u8],
    pub block_sum: u64,
    pub layer_sums: &'a [u64],
    /// `data` kept in place by its owner; written from directly when
    /// [`Place::direct_source`] allows.
    pub pinned: Option<&'a Arc<dyn DmaSource>>,
}

impl Place<'_> {
    /// The source to write this block's bytes from without a copy: its
    /// pinned bytes, if they are `data` and suit direct I/O as a slot's
    /// whole data area (aligned address, no padding after the block).
    fn direct_source(
        &self,
        l: &crate::format::Layout,
        mem_align: usize,
    ) -> Option<&Arc<dyn DmaSource>> {
        self.pinned.filter(|p| {
            let b = p.bytes();
            std::ptr::eq(b.as_ptr(), self.data.as_ptr())
                && b.len() == self.data.len()
                && (b.as_ptr() as usize).is_multiple_of(mem_align)
                && l.block_bytes == l.slot_bytes - l.slot_header_bytes
        })
    }
}

/// Slots reserved in an open region, not yet written.
struct Reservation {
    region: u32,
    generation: u64,
    buf: Arc<RegionBuf>,
    start: u32,
    count: u32,
    has_header: bool,
    completion_tx: mpsc::Sender<Completion>,
}

/// Reserves up to `blocks.len()` slots in `dir`'s open region and queues
/// their ticket. `reinsert`: written by reclaim, the first `retained` of
/// them for the reclaim listener. Call with the writer lock held.
fn reserve(
    shared: &Shared,
    dir: &Dir,
    w: &mut DirWriter,
    blocks: &[(BlockHash, u64)],
    reinsert: bool,
    retained: u32,
) -> Result<(Reservation, Reply)> {
    let spr = shared.layout.slots_per_region;
    let Some(open) = w.open.as_mut() else {
        return Err(DiskError::InvalidConfig("no open region".into()));
    };
    let start = open.next_slot;
    let count = (spr - start).min(blocks.len() as u32);
    open.next_slot += count;
    let region = &dir.regions[open.region as usize];
    let (completion_tx, completion_rx) = mpsc::channel();
    let (reply_tx, reply_rx) = oneshot::channel();
    let res = Reservation {
        region: open.region,
        generation: open.generation,
        buf: open.buf.clone(),
        start,
        count,
        has_header: start == 0,
        completion_tx,
    };
    let sealed = open.next_slot == spr;
    {
        let mut fill: parking_lot::MutexGuard<'_, Fill> = region.fill.lock();
        fill.keys
            .extend(blocks[..count as usize].iter().map(|(k, _)| *k));
        fill.inflight.push(start);
        fill.sealed = sealed;
    }
    let ticket = Ticket::Extent {
        extent: Extent {
            region: res.region,
            start,
            blocks: blocks[..count as usize].to_vec(),
            has_header: res.has_header,
            reinsert,
            retained,
        },
        completion: completion_rx,
        reply: Some(reply_tx),
    };
    if sealed {
        w.open = None;
    }
    if !w.send(ticket) {
        return Err(DiskError::Closed);
    }
    Ok((res, reply_rx))
}

/// The extent as runs of (offset in the region, memory, length): the region
/// buffer's bytes, or a block's own pinned bytes. A run extends the previous
/// one when both its file offset and its memory continue it.
#[derive(Default)]
struct Runs(Vec<(u64, *const u8, u64)>);

impl Runs {
    fn push(&mut self, off: u64, ptr: *const u8, len: u64) {
        match self.0.last_mut() {
            Some((o, p, n)) if *o + *n == off && p.wrapping_add(*n as usize) == ptr => *n += len,
            _ => self.0.push((off, ptr, len)),
        }
    }
}

/// Copies the reserved blocks (and the region header, for a region's first
/// extent) into the buffer and submits its writes in one batch, placed as
/// the region's life is laid out. No await: a reservation is always
/// submitted (or its ticket's channel dropped) before the caller can be
/// cancelled.
fn fill_and_submit(shared: &Shared, dir: &Dir, res: Reservation, places: &[Place<'_>]) {
    let l = &shared.layout;
    let format = dir.regions[res.region as usize].format();
    if res.has_header {
        // SAFETY: the first reservation of a region owns its header sector.
        let h = unsafe { res.buf.range_mut(0, REGION_HEADER_BYTES as usize) };
        h.fill(0);
        RegionHeader {
            dir: dir.index as u32,
            region: res.region,
            slots: l.slots_per_region,
            generation: res.generation,
            creation_id: dir.creation_id,
            slot_size: l.slot_bytes,
            format,
        }
        .encode(h);
    }
    let mut batch = IoBatch::new();
    let mut runs = Runs::default();
    if res.has_header {
        runs.push(0, res.buf.ptr_at(0), REGION_HEADER_BYTES);
    }
    let seal = SlotSeal::of(format, dir.creation_id);
    for (i, p) in places.iter().enumerate().take(res.count as usize) {
        let slot = res.start + i as u32;
        encode_slot_header(shared, dir, &res, format.layout, seal, (slot, p));
        let direct = p.direct_source(l, shared.align.mem);
        if let Some(source) = direct {
            batch.keep_alive(source.clone());
            add(&shared.stats.direct_writes, 1);
        }
        match format.layout {
            RegionLayout::Block => place_block_major(l, &res, slot, p, direct, &mut runs),
            RegionLayout::Layer => place_layer_major(l, &res, slot, p, direct, &mut runs),
        }
    }
    let mut runs = runs.0;
    if format.layout == RegionLayout::Block {
        debug_assert_eq!(
            runs.first().map(|r| r.0),
            Some(if res.has_header {
                0
            } else {
                l.slot_in_region(res.start)
            })
        );
        debug_assert_eq!(
            runs.last().map(|r| r.0 + r.2),
            Some(l.slot_in_region(res.start + res.count))
        );
    } else {
        // Rows in file order, so neighbouring pieces of copied blocks (which
        // lie next to each other in the buffer too) merge into one run.
        runs = merge_sorted(runs);
    }
    let op_bytes = shared.cfg.write_op_bytes;
    push_runs(
        &mut batch,
        dir,
        (l.region_offset(res.region), op_bytes),
        runs,
    );
    batch.keep_alive(res.buf.clone());
    let ops = batch.len() as u64;
    add(&shared.stats.write_ios, ops);
    let completion = shared.engine.submit(batch);
    // The reaper holds the receiver until the tier is dropped.
    let _ = res.completion_tx.send(completion);
}

/// Zeroes the header sectors of `slot` in the buffer and encodes its header
/// there, at `header(slot)` of the life's layout.
fn encode_slot_header(
    shared: &Shared,
    dir: &Dir,
    res: &Reservation,
    layout: RegionLayout,
    seal: SlotSeal,
    (slot, p): (u32, &Place<'_>),
) {
    let l = &shared.layout;
    let off = l.header_in_region(layout, slot) as usize;
    // SAFETY: slots [start, start + count) were reserved for this call under
    // the writer lock, their headers lie in ranges of their own (I14), and
    // the buffer is not being written from.
    let head = unsafe { res.buf.range_mut(off, l.slot_header_bytes as usize) };
    head.fill(0);
    SlotHeader::encode_into(
        head,
        seal,
        p.key,
        p.block_sum,
        res.generation,
        (dir.index as u32, res.region, slot),
        l.block_bytes,
        p.layer_sums,
    );
}

/// Block-major: the slot's header and data as one run (the data from the
/// pinned source when there is one, else copied into the buffer).
fn place_block_major(
    l: &crate::format::Layout,
    res: &Reservation,
    slot: u32,
    p: &Place<'_>,
    direct: Option<&Arc<dyn DmaSource>>,
    runs: &mut Runs,
) {
    let off = l.slot_in_region(slot);
    let buf_at = res.buf.ptr_at(off as usize);
    match direct {
        Some(source) => {
            runs.push(off, buf_at, l.slot_header_bytes);
            runs.push(
                off + l.slot_header_bytes,
                source.bytes().as_ptr(),
                l.block_bytes,
            );
        }
        None => {
            let data_off = (off + l.slot_header_bytes) as usize;
            let data_len = (l.slot_bytes - l.slot_header_bytes) as usize;
            // SAFETY: the slot was reserved for this call (see above).
            let data = unsafe { res.buf.range_mut(data_off, data_len) };
            let (block, pad) = data.split_at_mut(l.block_bytes as usize);
            block.copy_from_slice(p.data);
            pad.fill(0);
            runs.push(off, buf_at, l.slot_bytes);
        }
    }
}

/// Layer-major: the header, then each layer piece at its row position
/// (from the pinned source when there is one, never copied; else copied
/// into the buffer at the same position).
fn place_layer_major(
    l: &crate::format::Layout,
    res: &Reservation,
    slot: u32,
    p: &Place<'_>,
    direct: Option<&Arc<dyn DmaSource>>,
    runs: &mut Runs,
) {
    let kind = RegionLayout::Layer;
    let h = l.header_in_region(kind, slot);
    runs.push(h, res.buf.ptr_at(h as usize), l.slot_header_bytes);
    let pb = l.layer_bytes as usize;
    for layer in 0..l.layers {
        let off = l.piece_in_region(kind, layer, slot);
        let piece = layer as usize * pb;
        let ptr = match direct {
            Some(source) => source.bytes()[piece..].as_ptr(),
            None => {
                // SAFETY: the piece belongs to the reserved slot (I14).
                let dst = unsafe { res.buf.range_mut(off as usize, pb) };
                dst.copy_from_slice(&p.data[piece..piece + pb]);
                res.buf.ptr_at(off as usize)
            }
        };
        runs.push(off, ptr, l.layer_bytes);
    }
}

/// Sorts runs by file offset and merges those that continue each other in
/// both the file and memory.
fn merge_sorted(mut runs: Vec<(u64, *const u8, u64)>) -> Vec<(u64, *const u8, u64)> {
    runs.sort_unstable_by_key(|r| r.0);
    let mut out = Runs::default();
    for (off, ptr, len) in runs {
        out.push(off, ptr, len);
    }
    out.0
}

/// Adds the writes of `runs` (offset in the region at `region_start`,
/// memory, length) to `batch`. One submission, but each run is cut into ops
/// of at most `write_op_bytes` (the tier's configuration): devices (NVMe,
/// virtio) serve several moderate writes in parallel faster than one huge
/// one. The caller keeps every run's memory alive in the batch.
fn push_runs(
    batch: &mut IoBatch,
    dir: &Dir,
    (region_start, op_bytes): (u64, u64),
    runs: Vec<(u64, *const u8, u64)>,
) {
    for (off, ptr, len) in runs {
        let mut done = 0;
        while done < len {
            let n = op_bytes.min(len - done);
            let op = IoOp {
                kind: IoKind::Write,
                file: dir.file,
                offset: region_start + off + done,
                buf: ptr.wrapping_add(done as usize).cast_mut(),
                len: n as u32,
            };
            // SAFETY: the range lies inside the region buffer or a pinned
            // source, both of which the batch keeps alive (the caller's
            // keep_alive). Nobody writes the buffer's range until the buffer
            // is idle again, which needs this batch's reference gone, i.e.
            // the write finished; nobody writes a pinned source while it
            // lives (DmaSource's contract). A write only reads the memory.
            unsafe { batch.push(op) };
            done += n;
        }
    }
}

/// One extent placed by [`place_locked`]: how many blocks of the run it
/// took, where its outcome arrives, and its reservation if it still has to
/// be filled and submitted (by [`submit_placed`], outside the lock).
pub(crate) struct Placed {
    pub count: usize,
    pub reply: Reply,
    pending: Option<Reservation>,
}

/// Reserves slots for `places` in `dir` under the writer lock held by the
/// caller. The copies and submissions are left to [`submit_placed`], which
/// the caller runs right after releasing the lock, so concurrent writers
/// copy in parallel; reservation order alone fixes the order in which the
/// reaper acknowledges extents.
///
/// Cancellation: a reservation dropped unsubmitted reads as a failed write
/// to the reaper, so none may be pending across an `.await`. Here the only
/// await is opening a region, and anything reserved before it is submitted
/// first (under the lock; rare, a call normally reserves once); the caller
/// calls `submit_placed` with no await in between.
pub(crate) async fn place_locked(
    shared: &Shared,
    dir: &Dir,
    w: &mut DirWriter,
    places: &[Place<'_>],
    reinsert: bool,
) -> Result<Vec<Placed>> {
    let mut out: Vec<Placed> = Vec::new();
    let mut i = 0;
    while i < places.len() {
        let blocks: Vec<(BlockHash, u64)> =
            places[i..].iter().map(|p| (p.key, p.block_sum)).collect();
        if w.open.is_none() {
            submit_placed(shared, dir, &mut out, places);
            let hot = crate::reclaim::open_region(shared, dir, w).await?;
            if !hot.is_empty() {
                let keep: Vec<Place<'_>> = hot.iter().map(|h| h.place(&shared.layout)).collect();
                let hb: Vec<(BlockHash, u64)> = keep.iter().map(|p| (p.key, p.block_sum)).collect();
                let retained = hot.iter().filter(|h| h.retained).count() as u32;
                // Fits: reclaim re-inserts fewer blocks than a region has
                // slots (the reaper reports them lost if the write fails).
                match reserve(shared, dir, w, &hb, true, retained) {
                    Ok((res, _ignored_reply)) => fill_and_submit(shared, dir, res, &keep),
                    Err(e) => {
                        crate::reclaim::report_lost(shared, hb.iter().map(|(k, _)| *k));
                        return Err(e);
                    }
                }
            }
        }
        let (res, reply) = reserve(shared, dir, w, &blocks, reinsert, 0)?;
        let count = res.count as usize;
        out.push(Placed {
            count,
            reply,
            pending: Some(res),
        });
        i += count;
    }
    Ok(out)
}

/// Fills and submits every still-pending reservation of `placed` (which
/// cover `places` in order). Synchronous by design; see [`place_locked`].
pub(crate) fn submit_placed(
    shared: &Shared,
    dir: &Dir,
    placed: &mut [Placed],
    places: &[Place<'_>],
) {
    let mut at = 0;
    for p in placed {
        if let Some(res) = p.pending.take() {
            fill_and_submit(shared, dir, res, &places[at..at + p.count]);
        }
        at += p.count;
    }
}

/// The body of [`DiskTier::put_batch`](crate::DiskTier::put_batch).
pub(crate) async fn put_batch(shared: &Arc<Shared>, blocks: &[BlockPut<'_>]) -> Vec<Result<()>> {
    let mut results: Vec<Option<Result<()>>> = (0..blocks.len()).map(|_| None).collect();
    let Some(_guard) = shared.enter_put() else {
        add(&shared.stats.put_errors, blocks.len() as u64);
        return blocks.iter().map(|_| Err(DiskError::Closed)).collect();
    };
    // Latched after a failed sync: nothing more is written (I12).
    if let Some(why) = shared.latch.reason() {
        add(&shared.stats.put_errors, blocks.len() as u64);
        let refused = || DiskError::SyncFailed {
            reason: why.to_owned(),
        };
        return blocks.iter().map(|_| Err(refused())).collect();
    }
    let l = &shared.layout;
    // Validate, skip present keys and duplicates inside the batch.
    let mut first_of: hashbrown::HashMap<BlockHash, usize> = hashbrown::HashMap::new();
    let mut dup_of: Vec<(usize, usize)> = Vec::new();
    let mut todo: Vec<usize> = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        if b.data.len() as u64 != l.block_bytes {
            results[i] = Some(Err(DiskError::WrongLength {
                key: b.key,
                what: "bytes",
                found: b.data.len() as u64,
                expected: l.block_bytes,
            }));
        } else if b.sums.layers.len() as u64 != l.layers as u64 {
            results[i] = Some(Err(DiskError::WrongLength {
                key: b.key,
                what: "layer checksums",
                found: b.sums.layers.len() as u64,
                expected: l.layers as u64,
            }));
        } else if let Some(&j) = first_of.get(&b.key) {
            dup_of.push((i, j));
        } else if shared.index.contains(b.key) {
            add(&shared.stats.put_dups, 1);
            results[i] = Some(Ok(()));
        } else {
            first_of.insert(b.key, i);
            todo.push(i);
        }
    }
    let places: Vec<Place<'_>> = todo
        .iter()
        .map(|&i| Place {
            key: blocks[i].key,
            data: blocks[i].data,
            block_sum: blocks[i].sums.block,
            layer_sums: &blocks[i].sums.layers,
            pinned: blocks[i].pinned,
        })
        .collect();
    // Place them, a directory at a time, round-robin.
    let mut pending: Vec<(Vec<usize>, &Dir, Reply)> = Vec::new();
    let mut next = 0;
    let mut tried_dirs = 0;
    while next < places.len() {
        let Some(dir) = pick_dir(shared) else {
            for &i in &todo[next..] {
                results[i] = Some(Err(DiskError::AllDirsFailed));
            }
            break;
        };
        let mut w = dir.writer.lock().await;
        if dir.failed.load(std::sync::atomic::Ordering::SeqCst) {
            continue;
        }
        // Fill at most the rest of the open region (or one new region) per
        // turn, then move on to the next directory.
        let room = match &w.open {
            Some(o) => (shared.layout.slots_per_region - o.next_slot) as usize,
            None => shared.layout.slots_per_region as usize,
        };
        let take = room.min(places.len() - next);
        let run = &places[next..next + take];
        match place_locked(shared, dir, &mut w, run, false).await {
            Ok(mut extents) => {
                // Copy and submit outside the lock (no await in between).
                drop(w);
                submit_placed(shared, dir, &mut extents, run);
                let mut at = next;
                for e in extents {
                    pending.push((todo[at..at + e.count].to_vec(), dir, e.reply));
                    at += e.count;
                }
                next += take;
                tried_dirs = 0;
            }
            Err(e) => {
                // No region could be had here (or the reaper is gone): try
                // the other directories before giving up on these blocks.
                tried_dirs += 1;
                if tried_dirs >= shared.dirs.len() {
                    let msg = e.to_string();
                    for &i in &todo[next..] {
                        results[i] = Some(Err(match &e {
                            DiskError::NoRegion { dir } => DiskError::NoRegion { dir: dir.clone() },
                            DiskError::Closed => DiskError::Closed,
                            _ => DiskError::WriteFailed {
                                dir: dir.path.clone(),
                                key: blocks[i].key,
                                reason: msg.clone(),
                            },
                        }));
                    }
                    break;
                }
            }
        }
    }
    for (idxs, dir, rx) in pending {
        let outcome = rx
            .await
            .unwrap_or_else(|_| Err(NotAcked::Write("the disk tier was dropped".to_owned())));
        for i in idxs {
            results[i] = Some(outcome.clone().map_err(|e| match e {
                NotAcked::Write(reason) => DiskError::WriteFailed {
                    dir: dir.path.clone(),
                    key: blocks[i].key,
                    reason,
                },
                NotAcked::DirFailed => DiskError::DirFailed {
                    dir: dir.path.clone(),
                },
                NotAcked::SyncFailed(reason) => DiskError::SyncFailed { reason },
            }));
        }
    }
    for (i, j) in dup_of {
        results[i] = Some(match &results[j] {
            Some(Ok(())) => Ok(()),
            _ => Err(DiskError::WriteFailed {
                dir: shared.dirs[0].path.clone(),
                key: blocks[i].key,
                reason: "an earlier copy of the block in the batch failed".into(),
            }),
        });
    }
    results
        .into_iter()
        .map(|r| {
            let r = r.unwrap_or(Err(DiskError::AllDirsFailed));
            if r.is_err() {
                add(&shared.stats.put_errors, 1);
            }
            r
        })
        .collect()
}

/// The next directory that takes writes, round-robin.
fn pick_dir(shared: &Shared) -> Option<&Dir> {
    let n = shared.dirs.len();
    let start = shared.rr.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    (0..n)
        .map(|i| &shared.dirs[(start + i) % n])
        .find(|d| !d.failed.load(std::sync::atomic::Ordering::SeqCst))
}
