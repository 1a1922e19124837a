//! Region allocation and reclaim: opening a region for writing, choosing a
//! victim when none is free, dropping its entries and re-inserting the
//! blocks worth keeping.
//!
//! A victim is a `SEALED` region (every write finished) with no reader in
//! flight. The latch's `try_reclaim` both checks and excludes readers (see
//! [`crate::latch`]). Which one depends on who decides what the tier keeps:
//!
//! - With a [`ReclaimListener`] installed, the listener (the block manager's
//!   G3 pool) is the tier's one eviction authority and the log reclaims only
//!   to get space: the victim is the region with the fewest live blocks
//!   (still indexed at their slot there), ties broken by
//!   [`RegionEvictionKind`], skipping one whose every slot the listener still
//!   wants. *Every* live block the listener wants is read back, verified and
//!   written again as the first slots of the region's next life; the others
//!   (blocks it let go and whose removal has not reached the index yet) are
//!   dropped. The fewest-live choice rewrites the least and, with the slack
//!   `DiskTier::live_capacity_blocks` leaves, always finds a region with
//!   room (docs/disk-format.md, I22-I25).
//! - Without one, the log evicts by itself: FIFO takes the lowest
//!   generation (the oldest written), LRU the oldest last verified read (a
//!   region never read counts from when it was opened), and with
//!   `reinsert_hot` up to a quarter of a region of blocks read since they
//!   were written get a second life.
//!
//! The region's index entries (only those still pointing into it) are
//! dropped, the listener is told which were dropped (`evicted`: unwanted;
//! `lost`: wanted but not re-insertable), and the region reopens with a new
//! generation.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use kvtier_core::{BlockHash, RegionEvictionKind, block_checksum, combine_layer_checksums};
use kvtier_io::{AlignedBuf, IoBatch, IoKind, IoOp};

use crate::format::{Layout, RegionLayout, SlotHeader, SlotSeal};
use crate::latch::{Latch, state};
use crate::region::Fill;
use crate::stats::add;
use crate::tier::{Dir, Shared};
use crate::writer::{DirWriter, OpenRegion, Place};
use crate::{DiskError, Result};

/// A reclaim candidate: (region, generation, last read tick, live blocks).
pub(crate) type Candidate = (u32, u64, u64, u32);

/// Orders candidates best victim first: by `kind`, or, when `least_live`
/// (a listener decides what is kept), fewest live blocks first and `kind`
/// among equals.
pub(crate) fn order_victims(cands: &mut [Candidate], kind: RegionEvictionKind, least_live: bool) {
    let weight = |live: u32| if least_live { live } else { 0 };
    match kind {
        RegionEvictionKind::Fifo => cands.sort_unstable_by_key(|&(r, g, _, l)| (weight(l), g, r)),
        RegionEvictionKind::Lru => cands.sort_unstable_by_key(|&(r, g, t, l)| (weight(l), t, g, r)),
    }
}

/// The first candidate, in victim order, that `try_reclaim` accepts.
pub(crate) fn choose_victim(
    mut cands: Vec<Candidate>,
    kind: RegionEvictionKind,
    least_live: bool,
    mut try_reclaim: impl FnMut(u32) -> bool,
) -> Option<u32> {
    order_victims(&mut cands, kind, least_live);
    cands.into_iter().map(|c| c.0).find(|&r| try_reclaim(r))
}

/// The owner of the tier's contents: asked which blocks a reclaim must
/// keep, told which it dropped (kvtier-tier's, the one listener of every
/// tier that makes room on its own).
///
/// Install one with [`DiskTier::set_reclaim_listener`](crate::DiskTier::set_reclaim_listener).
/// The owner (the block manager's pool of the disk's tier) is then the
/// tier's one eviction authority: a reclaim re-inserts every block it wants
/// (read back, verified, rewritten), and drops only those it no longer
/// wants (`evicted`) or that could not be re-inserted (`lost`). Its methods
/// must not call back into the [`DiskTier`](crate::DiskTier) other than its
/// read-only queries [`contains`](crate::DiskTier::contains) and
/// [`location`](crate::DiskTier::location).
pub use kvtier_tier::ReclaimListener;

/// A block read back from a victim, to be written again.
pub(crate) struct HotBlock {
    key: BlockHash,
    /// The victim's slot it was read from.
    from_slot: u32,
    block_sum: u64,
    layer_sums: Vec<u64>,
    /// Re-inserted because the listener wants it (else only hot).
    pub retained: bool,
    /// The whole slot (header + data) as read.
    slot: AlignedBuf,
}

impl HotBlock {
    /// The block as a write.
    pub fn place<'a>(&'a self, l: &Layout) -> Place<'a> {
        let from = l.slot_header_bytes as usize;
        Place {
            key: self.key,
            data: &self.slot[from..from + l.block_bytes as usize],
            block_sum: self.block_sum,
            layer_sums: &self.layer_sums,
            // Read back into a buffer that goes when the write is queued:
            // copied.
            pinned: None,
        }
    }
}

/// Puts a region that is being reclaimed back to `SEALED` if the reclaim
/// is abandoned (an error, or the caller's future dropped mid-way).
struct ReclaimGuard<'a> {
    latch: &'a Latch,
    armed: bool,
}

impl Drop for ReclaimGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.latch.set_state(state::SEALED);
        }
    }
}

/// The listener installed, if any (cloned out, so it is never called with
/// the listener lock held).
fn listener(shared: &Shared) -> Option<Arc<dyn ReclaimListener>> {
    shared.reclaim_listener.read().clone()
}

/// Reports blocks whose re-insertion failed (the write failed, or could
/// not be queued) as lost: those of `keys` the index does not hold
/// (again). Counts them in `blocks_lost`.
pub(crate) fn report_lost(shared: &Shared, keys: impl IntoIterator<Item = BlockHash>) {
    let lost: Vec<BlockHash> = keys
        .into_iter()
        .filter(|k| !shared.index.contains(*k))
        .collect();
    if lost.is_empty() {
        return;
    }
    add(&shared.stats.blocks_lost, lost.len() as u64);
    if let Some(l) = listener(shared) {
        l.lost(&lost);
    }
}

/// Opens a region for writing in `dir` (a free one, else a reclaimed one);
/// returns the blocks to re-insert first. Call with the writer lock held.
pub(crate) async fn open_region(
    shared: &Shared,
    dir: &Dir,
    w: &mut DirWriter,
) -> Result<Vec<HotBlock>> {
    let buf = dir.pool.acquire().await;
    let (idx, hot) = match w.free.pop_front() {
        Some(r) => (r, Vec::new()),
        None => reclaim_one(shared, dir).await?,
    };
    let region = &dir.regions[idx as usize];
    let generation = shared.generation.fetch_add(1, Ordering::SeqCst) + 1;
    region.generation.store(generation, Ordering::Release);
    // Before OPEN: no reader or writer sees the life before its format (I13).
    region.set_format(shared.new_life_format(dir));
    region.last_read.store(
        shared.tick.fetch_add(1, Ordering::Relaxed) + 1,
        Ordering::Relaxed,
    );
    *region.fill.lock() = Fill {
        keys: Vec::with_capacity(shared.layout.slots_per_region as usize),
        ..Fill::default()
    };
    region.latch.set_state(state::OPEN);
    w.open = Some(OpenRegion {
        region: idx,
        generation,
        buf,
        next_slot: 0,
    });
    Ok(hot)
}

/// Reclaims one region of `dir`; returns it and the blocks to re-insert.
async fn reclaim_one(shared: &Shared, dir: &Dir) -> Result<(u32, Vec<HotBlock>)> {
    let listener = listener(shared);
    // The candidates are the regions sealed *before* live blocks are
    // counted: a region seals only after its last write is indexed, so its
    // count is then complete. Counted first, a region sealing during the
    // count would look emptier than it is and be taken, freshest blocks
    // and all (I23).
    let sealed: Vec<(u32, u64, u64)> = dir
        .regions
        .iter()
        .enumerate()
        .filter(|(_, r)| r.latch.state() == state::SEALED)
        .map(|(i, r)| {
            (
                i as u32,
                r.generation(),
                r.last_read.load(Ordering::Relaxed),
            )
        })
        .collect();
    // Only an owner's log orders by live blocks (one pass over the index).
    let live = match &listener {
        Some(_) => shared.index.live_per_region(dir.index, dir.regions.len()),
        None => vec![0; dir.regions.len()],
    };
    let cands: Vec<Candidate> = sealed
        .into_iter()
        .map(|(i, g, t)| (i, g, t, live[i as usize]))
        .collect();
    let mut kept = Kept::default();
    let victim = choose_victim(cands, shared.cfg.eviction, listener.is_some(), |r| {
        try_victim(shared, dir, r, listener.as_deref(), &mut kept)
    })
    .ok_or_else(|| DiskError::NoRegion {
        dir: dir.path.clone(),
    })?;
    let region = &dir.regions[victim as usize];
    let mut guard = ReclaimGuard {
        latch: &region.latch,
        armed: true,
    };
    let wanted_keys: hashbrown::HashSet<BlockHash> = kept.wanted.iter().map(|c| c.key).collect();
    let read_back = read_kept(shared, dir, victim, kept).await;
    // From here on no await: the entries go and the listener hears of it
    // before anyone else can take the writer lock.
    let (hot, evicted, lost) = drop_entries(shared, dir, victim, read_back, &wanted_keys);
    guard.armed = false;
    add(&shared.stats.regions_reclaimed, 1);
    add(&shared.stats.blocks_evicted, evicted.len() as u64);
    add(&shared.stats.blocks_lost, lost.len() as u64);
    if let Some(l) = &listener {
        l.evicted(&evicted);
        if !lost.is_empty() {
            l.lost(&lost);
        }
    }
    tracing::debug!(
        dir = %dir.path.display(),
        region = victim,
        evicted = evicted.len(),
        lost = lost.len(),
        reinserted = hot.len(),
        retained = hot.iter().filter(|h| h.retained).count(),
        "reclaimed region"
    );
    Ok((victim, hot))
}

/// Removes every index entry still pointing into `victim`; returns the
/// read-back blocks to re-insert (those still indexed at the very slot they
/// were read from), the unwanted keys dropped and the wanted ones lost.
fn drop_entries(
    shared: &Shared,
    dir: &Dir,
    victim: u32,
    read_back: Vec<HotBlock>,
    wanted: &hashbrown::HashSet<BlockHash>,
) -> (Vec<HotBlock>, Vec<BlockHash>, Vec<BlockHash>) {
    let keys = std::mem::take(&mut dir.regions[victim as usize].fill.lock().keys);
    let by_key: hashbrown::HashMap<BlockHash, usize> = read_back
        .iter()
        .enumerate()
        .map(|(i, h)| (h.key, i))
        .collect();
    let mut keep = vec![false; read_back.len()];
    let (mut evicted, mut lost) = (Vec::new(), Vec::new());
    for k in keys {
        let Some(e) = shared.index.remove_if_in_region(k, dir.index, victim) else {
            // Removed by a caller, or put again elsewhere: not ours to report.
            continue;
        };
        match by_key.get(&k) {
            // Still the copy that was read back and verified: re-insert it.
            Some(&i) if read_back[i].from_slot == e.loc.slot && read_back[i].block_sum == e.sum => {
                keep[i] = true;
            }
            _ if wanted.contains(&k) => lost.push(k),
            _ => evicted.push(k),
        }
    }
    let hot = read_back
        .into_iter()
        .zip(keep)
        .filter_map(|(h, k)| k.then_some(h))
        .collect();
    (hot, evicted, lost)
}

/// Takes region `r` for reclaim if no reader is in it and reclaiming it
/// frees a slot (some live block is not wanted); fills `kept` with the
/// blocks to re-insert. A region whose every slot the listener wants is
/// put back: reclaiming it would only copy it onto itself.
fn try_victim(
    shared: &Shared,
    dir: &Dir,
    r: u32,
    listener: Option<&dyn ReclaimListener>,
    kept: &mut Kept,
) -> bool {
    let latch = &dir.regions[r as usize].latch;
    if !latch.try_reclaim() {
        return false;
    }
    let k = split_live(shared, dir, r, listener);
    if k.wanted.len() >= shared.layout.slots_per_region as usize {
        latch.set_state(state::SEALED);
        return false;
    }
    *kept = k;
    true
}

/// A live slot of a victim: still indexed there.
struct Live {
    slot: u32,
    key: BlockHash,
    sum: u64,
    hot: bool,
}

/// The live blocks of a victim worth keeping.
#[derive(Default)]
struct Kept {
    /// Those the listener wants, hot ones first (each group in slot
    /// order): every one is re-inserted.
    wanted: Vec<Live>,
    /// Without a listener, with `reinsert_hot`: those read since they were
    /// written, within a quarter region.
    hot_only: Vec<Live>,
}

/// Splits the live blocks of `victim` into those the listener wants and,
/// with no listener and `reinsert_hot`, the hot ones (within the budget of a
/// quarter region). The listener is asked with no lock held (the slot list
/// was copied).
fn split_live(
    shared: &Shared,
    dir: &Dir,
    victim: u32,
    listener: Option<&dyn ReclaimListener>,
) -> Kept {
    let mut k = Kept::default();
    for c in live_slots(shared, dir, victim) {
        match listener {
            Some(li) if li.retain(c.key) => k.wanted.push(c),
            Some(_) => {}
            None if shared.cfg.reinsert_hot && c.hot => k.hot_only.push(c),
            None => {}
        }
    }
    // Stable: hot wanted blocks first, each group in slot order.
    k.wanted.sort_by_key(|c| !c.hot);
    k.hot_only
        .truncate((shared.layout.slots_per_region / 4) as usize);
    k
}

/// Reads back the blocks `kept` chose from `victim`, verified. Blocks
/// failing verification are counted corrupt and left out (reclaim then
/// reports the wanted ones lost).
async fn read_kept(shared: &Shared, dir: &Dir, victim: u32, kept: Kept) -> Vec<HotBlock> {
    let l = &shared.layout;
    let region = &dir.regions[victim as usize];
    let generation = region.generation();
    let cands: Vec<(Live, bool)> = kept
        .wanted
        .into_iter()
        .map(|c| (c, true))
        .chain(kept.hot_only.into_iter().map(|c| (c, false)))
        .collect();
    tracing::trace!(victim, candidates = cands.len(), "re-insertion candidates");
    if cands.is_empty() {
        return Vec::new();
    }
    let format = region.format();
    let seal = SlotSeal::of(format, dir.creation_id);
    let mut batch = IoBatch::with_capacity(cands.len());
    for (c, _) in &cands {
        read_slot(l, &mut batch, dir, format.layout, (victim, c.slot));
    }
    add(&shared.stats.read_ios, batch.len() as u64);
    let mut done = shared.engine.submit(batch).await;
    let ops_per_slot = match format.layout {
        RegionLayout::Block => 1,
        RegionLayout::Layer => 1 + l.layers as usize,
    };
    let mut out = Vec::new();
    for (i, (c, retained)) in cands.iter().enumerate() {
        let key = c.key;
        let sum = c.sum;
        let ops = i * ops_per_slot..(i + 1) * ops_per_slot;
        if done.results.len() != cands.len() * ops_per_slot
            || ops.into_iter().any(|op| done.check_op(op).is_err())
        {
            continue;
        }
        let Some(slot) = done.take_owner::<AlignedBuf>(i) else {
            continue;
        };
        let hb = l.slot_header_bytes as usize;
        let Some(h) = SlotHeader::decode(&slot[..hb], l.layers, seal) else {
            add(&shared.stats.corrupt, 1);
            continue;
        };
        let data = &slot[hb..hb + l.block_bytes as usize];
        if h.key != key
            || h.generation != generation
            || h.block_sum != sum
            || combine_layer_checksums(key, &h.layer_sums) != sum
            || block_checksum(key, l.layer_bytes as usize, data) != sum
        {
            add(&shared.stats.corrupt, 1);
            continue;
        }
        out.push(HotBlock {
            key,
            from_slot: c.slot,
            block_sum: sum,
            layer_sums: h.layer_sums,
            retained: *retained,
            slot,
        });
    }
    out
}

/// Adds the reads of one whole slot of `region` to `batch`, gathered as
/// `[header | block]` into one slot-sized buffer whatever the life's layout
/// (so [`HotBlock::place`] need not know it): one op block-major, the
/// header and one op per layer piece layer-major. The buffer is the
/// batch's owner `i` for the `i`-th slot added.
fn read_slot(
    l: &Layout,
    batch: &mut IoBatch,
    dir: &Dir,
    layout: RegionLayout,
    (region, slot): (u32, u32),
) {
    let mut buf = AlignedBuf::zeroed(l.slot_bytes as usize, 4096);
    if layout == RegionLayout::Block {
        batch.read_owned(dir.file, l.slot_offset(region, slot), buf);
        return;
    }
    let base = buf.as_mut_ptr();
    let mut push = |offset: u64, at: u64, len: u64| {
        let op = IoOp {
            kind: IoKind::Read,
            file: dir.file,
            offset,
            buf: base.wrapping_add(at as usize),
            len: len as u32,
        };
        // SAFETY: [at, at + len) lies inside `buf` (header then pieces of
        // a slot-sized buffer), whose heap memory the batch owns (below)
        // until the reads end.
        unsafe { batch.push(op) };
    };
    let h = l.slot_header_bytes;
    push(l.header_offset(layout, region, slot), 0, h);
    for layer in 0..l.layers {
        let at = h + layer as u64 * l.layer_bytes;
        push(
            l.piece_offset(layout, region, layer, slot),
            at,
            l.layer_bytes,
        );
    }
    batch.keep_alive(buf);
}

/// The slots of `victim` whose key is still indexed at that very slot, in
/// slot order. Takes the region's slot lock and, inside it, index shard
/// locks one at a time (the order the rest of the tier uses).
fn live_slots(shared: &Shared, dir: &Dir, victim: u32) -> Vec<Live> {
    let region = &dir.regions[victim as usize];
    let fill = region.fill.lock();
    fill.keys
        .iter()
        .enumerate()
        .filter_map(|(slot, &k)| {
            let e = shared.index.get(k)?;
            let here =
                e.loc.dir == dir.index && e.loc.region == victim && e.loc.slot == slot as u32;
            here.then_some(Live {
                slot: slot as u32,
                key: k,
                sum: e.sum,
                hot: e.hot,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    #[derive(Debug, Clone)]
    enum Op {
        /// Allocate a region (free first, then reclaim).
        Alloc,
        /// A verified read of a region.
        Read(u32),
        /// A reader enters / leaves a region.
        Pin(u32),
        Unpin(u32),
    }

    fn op(n: u32) -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => Just(Op::Alloc),
            2 => (0..n).prop_map(Op::Read),
            1 => (0..n).prop_map(Op::Pin),
            1 => (0..n).prop_map(Op::Unpin),
        ]
    }

    #[test]
    fn an_owner_s_log_reclaims_the_region_with_the_fewest_live_blocks() {
        // (region, generation, last read, live)
        let cands = vec![(0, 1, 9, 30), (1, 2, 1, 5), (2, 3, 5, 5), (3, 4, 0, 40)];
        for (kind, first) in [(RegionEvictionKind::Fifo, 1), (RegionEvictionKind::Lru, 1)] {
            assert_eq!(
                choose_victim(cands.clone(), kind, true, |_| true),
                Some(first)
            );
        }
        // Ties on live blocks go by the policy: LRU takes the least read.
        let tied = vec![(0, 1, 9, 5), (1, 2, 1, 5)];
        assert_eq!(
            choose_victim(tied.clone(), RegionEvictionKind::Lru, true, |_| true),
            Some(1)
        );
        assert_eq!(
            choose_victim(tied, RegionEvictionKind::Fifo, true, |_| true),
            Some(0)
        );
        // A region refused (a reader, or every slot wanted) passes to the next.
        assert_eq!(
            choose_victim(cands.clone(), RegionEvictionKind::Fifo, true, |r| r != 1),
            Some(2)
        );
        // Without an owner the policy alone decides.
        assert_eq!(
            choose_victim(cands, RegionEvictionKind::Fifo, false, |_| true),
            Some(0)
        );
    }

    proptest! {
        /// Regions come free-first in index order, then by the policy's
        /// order, never one with a reader, and generations only grow.
        #[test]
        fn allocation_follows_the_policy(
            n in 1u32..8,
            lru in any::<bool>(),
            ops in proptest::collection::vec(op(8), 1..80),
        ) {
            let kind = if lru { RegionEvictionKind::Lru } else { RegionEvictionKind::Fifo };
            let latches: Vec<Latch> = (0..n).map(|_| Latch::new(state::FREE)).collect();
            let mut free: std::collections::VecDeque<u32> = (0..n).collect();
            let mut gens = vec![0u64; n as usize];
            let mut last = vec![0u64; n as usize];
            let mut pins: BTreeMap<u32, u32> = BTreeMap::new();
            let mut clock = 0u64;
            let mut next_gen = 0u64;
            for o in ops {
                match o {
                    Op::Alloc => {
                        let expect_free = free.front().copied();
                        let got = if let Some(r) = free.pop_front() {
                            Some(r)
                        } else {
                            let cands = (0..n)
                                .filter(|&r| latches[r as usize].state() == state::SEALED)
                                .map(|r| (r, gens[r as usize], last[r as usize], 0))
                                .collect();
                            choose_victim(cands, kind, false, |r| latches[r as usize].try_reclaim())
                        };
                        // The model: free first; else the unpinned sealed
                        // region with the smallest policy key.
                        let model = expect_free.or_else(|| {
                            (0..n)
                                .filter(|r| pins.get(r).copied().unwrap_or(0) == 0)
                                .min_by_key(|&r| {
                                    let (g, t) = (gens[r as usize], last[r as usize]);
                                    if lru { (t, g, r) } else { (g, 0, r) }
                                })
                        });
                        prop_assert_eq!(got, model);
                        if let Some(r) = got {
                            next_gen += 1;
                            clock += 1;
                            prop_assert!(next_gen > gens[r as usize]);
                            gens[r as usize] = next_gen;
                            last[r as usize] = clock;
                            // Written and sealed at once in this model.
                            latches[r as usize].set_state(state::OPEN);
                            latches[r as usize].set_state(state::SEALED);
                        }
                    }
                    Op::Read(r) if r < n && latches[r as usize].try_enter() => {
                        clock += 1;
                        last[r as usize] = clock;
                        latches[r as usize].exit();
                    }
                    Op::Pin(r) if r < n && latches[r as usize].try_enter() => {
                        *pins.entry(r).or_default() += 1;
                    }
                    Op::Unpin(r) if r < n => {
                        if let Some(c) = pins.get_mut(&r).filter(|c| **c > 0) {
                            *c -= 1;
                            latches[r as usize].exit();
                        }
                    }
                    _ => {}
                }
                let pinned: BTreeSet<u32> = pins.iter().filter(|(_, c)| **c > 0).map(|(r, _)| *r).collect();
                for r in pinned {
                    prop_assert_ne!(latches[r as usize].state(), state::RECLAIMING);
                }
            }
        }
    }
}
