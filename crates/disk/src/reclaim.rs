//! Region allocation and reclaim: opening a region for writing, choosing a
//! victim when none is free, dropping its entries and re-inserting its hot
//! blocks.
//!
//! A victim is a `SEALED` region (every write finished) with no reader in
//! flight, chosen by [`RegionEvictionKind`]: FIFO takes the lowest
//! generation (the oldest written), LRU the oldest last verified read (a
//! region never read counts from when it was opened). The latch's
//! `try_reclaim` both checks and excludes readers (see [`crate::latch`]).
//! Then, with `reinsert_hot`, up to a quarter of a region of blocks read
//! since they were written are read back, verified, and written again as the
//! first slots of the region's next life; the region's index entries (only
//! those still pointing into it) are dropped; and the region reopens with a
//! new generation.

use std::sync::atomic::Ordering;

use kvtier_core::{BlockHash, RegionEvictionKind, block_checksum, combine_layer_checksums};
use kvtier_io::{AlignedBuf, IoBatch};

use crate::format::{Layout, SlotHeader};
use crate::latch::{Latch, state};
use crate::region::Fill;
use crate::stats::add;
use crate::tier::{Dir, Shared};
use crate::writer::{DirWriter, OpenRegion, Place};
use crate::{DiskError, Result};

/// A reclaim candidate: (region, generation, last read tick).
pub(crate) type Candidate = (u32, u64, u64);

/// Orders candidates best victim first.
pub(crate) fn order_victims(cands: &mut [Candidate], kind: RegionEvictionKind) {
    match kind {
        RegionEvictionKind::Fifo => cands.sort_unstable_by_key(|&(r, g, _)| (g, r)),
        RegionEvictionKind::Lru => cands.sort_unstable_by_key(|&(r, g, t)| (t, g, r)),
    }
}

/// The first candidate, in victim order, that `try_reclaim` accepts.
pub(crate) fn choose_victim(
    mut cands: Vec<Candidate>,
    kind: RegionEvictionKind,
    mut try_reclaim: impl FnMut(u32) -> bool,
) -> Option<u32> {
    order_victims(&mut cands, kind);
    cands.into_iter().map(|c| c.0).find(|&r| try_reclaim(r))
}

/// A hot block read back from a victim, to be written again.
pub(crate) struct HotBlock {
    key: BlockHash,
    block_sum: u64,
    layer_sums: Vec<u64>,
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

/// Opens a region for writing in `dir` (a free one, else a reclaimed one);
/// returns the hot blocks to write first. Call with the writer lock held.
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

/// Reclaims one region of `dir`; returns it and its hot blocks.
async fn reclaim_one(shared: &Shared, dir: &Dir) -> Result<(u32, Vec<HotBlock>)> {
    let cands: Vec<Candidate> = dir
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
    let victim = choose_victim(cands, shared.cfg.eviction, |r| {
        dir.regions[r as usize].latch.try_reclaim()
    })
    .ok_or_else(|| DiskError::NoRegion {
        dir: dir.path.clone(),
    })?;
    let region = &dir.regions[victim as usize];
    let mut guard = ReclaimGuard {
        latch: &region.latch,
        armed: true,
    };
    let hot = if shared.cfg.reinsert_hot {
        read_hot(shared, dir, victim).await
    } else {
        Vec::new()
    };
    let keys = std::mem::take(&mut region.fill.lock().keys);
    let mut evicted = 0u64;
    for k in keys {
        if shared
            .index
            .remove_if_in_region(k, dir.index, victim)
            .is_some()
        {
            evicted += 1;
        }
    }
    guard.armed = false;
    add(&shared.stats.regions_reclaimed, 1);
    add(&shared.stats.blocks_evicted, evicted);
    tracing::debug!(dir = %dir.path.display(), region = victim, evicted, hot = hot.len(), "reclaimed region");
    Ok((victim, hot))
}

/// Reads back and verifies the blocks of `victim` read since they were
/// written (at most a quarter of a region).
async fn read_hot(shared: &Shared, dir: &Dir, victim: u32) -> Vec<HotBlock> {
    let l = &shared.layout;
    let budget = (l.slots_per_region / 4) as usize;
    let region = &dir.regions[victim as usize];
    let generation = region.generation();
    let hot: Vec<(u32, BlockHash, u64)> = {
        let fill = region.fill.lock();
        fill.keys
            .iter()
            .enumerate()
            .filter_map(|(slot, &k)| {
                let e = shared.index.get(k)?;
                let here =
                    e.loc.dir == dir.index && e.loc.region == victim && e.loc.slot == slot as u32;
                (here && e.hot).then_some((slot as u32, k, e.sum))
            })
            .take(budget)
            .collect()
    };
    if hot.is_empty() {
        return Vec::new();
    }
    let mut batch = IoBatch::with_capacity(hot.len());
    for &(slot, _, _) in &hot {
        let buf = AlignedBuf::zeroed(l.slot_bytes as usize, 4096);
        batch.read_owned(dir.file, l.slot_offset(victim, slot), buf);
    }
    add(&shared.stats.read_ios, hot.len() as u64);
    let mut done = shared.engine.submit(batch).await;
    let mut out = Vec::new();
    for (i, &(_, key, sum)) in hot.iter().enumerate() {
        if done.results.len() != hot.len() || done.check_op(i).is_err() {
            continue;
        }
        let Some(slot) = done.take_owner::<AlignedBuf>(i) else {
            continue;
        };
        let hb = l.slot_header_bytes as usize;
        let Some(h) = SlotHeader::decode(&slot[..hb], l.layers) else {
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
            block_sum: sum,
            layer_sums: h.layer_sums,
            slot,
        });
    }
    out
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
                                .map(|r| (r, gens[r as usize], last[r as usize]))
                                .collect();
                            choose_victim(cands, kind, |r| latches[r as usize].try_reclaim())
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
