//! The reclaim listener is the tier's one eviction authority: every block
//! it wants is re-inserted (hot ones first), the victim is the region with
//! the fewest live blocks, every block a reclaim drops is reported
//! (`evicted` if unwanted, `lost` if its re-insertion failed), and nothing
//! else is (explicit removals, keys put again elsewhere, re-inserted
//! blocks).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use kvtier_core::{BlockHash, Geometry, Lookup, RegionEvictionKind};
use kvtier_disk::{DiskTier, DiskTierConfig, ReclaimListener, RegionLayout};
use kvtier_io::{Fault, FaultyEngine, IoEngine, IoKind};
use proptest::prelude::*;

use crate::both_engines;
use crate::common::*;

both_engines!(
    wanted_blocks_survive_and_every_drop_is_reported,
    every_wanted_block_goes_back_hot_ones_first,
    the_region_with_the_fewest_live_blocks_goes_first,
    removed_and_moved_keys_are_not_reported,
    a_corrupt_wanted_block_is_lost_and_reported,
    a_failed_reinsertion_is_reported_lost,
);

const SLOTS: usize = 51;

/// One `evicted` call.
#[derive(Debug, Clone)]
struct Report {
    /// `retain` answers `true` since the previous report (this reclaim's).
    n_wanted: usize,
    /// The reported keys.
    keys: Vec<BlockHash>,
    /// How many of them were wanted when reported.
    wanted: usize,
}

/// Wants the keys in `want`; records every report.
#[derive(Default)]
struct Recorder {
    want: Mutex<HashSet<BlockHash>>,
    n_wanted: Mutex<usize>,
    reports: Mutex<Vec<Report>>,
    /// The tier, to check from inside `evicted` that reported keys are gone
    /// (taken out at the end of a test to break the cycle).
    tier: Mutex<Option<DiskTier>>,
    /// Reported keys the tier still held when reported.
    still_held: Mutex<Vec<BlockHash>>,
    /// Every `lost` call's keys.
    losses: Mutex<Vec<Vec<BlockHash>>>,
}

impl Recorder {
    fn wanting(keys: impl IntoIterator<Item = BlockHash>) -> Arc<Self> {
        let r = Arc::new(Recorder::default());
        r.want.lock().unwrap().extend(keys);
        r
    }

    fn install(self: &Arc<Self>, tier: &DiskTier) {
        *self.tier.lock().unwrap() = Some(tier.clone());
        tier.set_reclaim_listener(self.clone());
    }

    fn take_reports(&self) -> Vec<Report> {
        std::mem::take(&mut *self.reports.lock().unwrap())
    }

    fn take_losses(&self) -> Vec<Vec<BlockHash>> {
        std::mem::take(&mut *self.losses.lock().unwrap())
    }

    /// Breaks the listener -> tier cycle and checks the in-listener view.
    fn finish(&self) {
        self.tier.lock().unwrap().take();
        assert!(
            self.still_held.lock().unwrap().is_empty(),
            "reported keys still indexed when reported"
        );
    }
}

impl ReclaimListener for Recorder {
    fn retain(&self, key: BlockHash) -> bool {
        let w = self.want.lock().unwrap().contains(&key);
        if w {
            *self.n_wanted.lock().unwrap() += 1;
        }
        w
    }

    fn evicted(&self, keys: &[BlockHash]) {
        let n_wanted = std::mem::take(&mut *self.n_wanted.lock().unwrap());
        let wanted = {
            let want = self.want.lock().unwrap();
            keys.iter().filter(|k| want.contains(k)).count()
        };
        self.check_gone(keys);
        self.reports.lock().unwrap().push(Report {
            n_wanted,
            keys: keys.to_vec(),
            wanted,
        });
    }

    fn lost(&self, keys: &[BlockHash]) {
        assert!(!keys.is_empty(), "an empty loss reported");
        self.check_gone(keys);
        self.losses.lock().unwrap().push(keys.to_vec());
    }
}

impl Recorder {
    /// Notes reported keys the tier still holds.
    fn check_gone(&self, keys: &[BlockHash]) {
        if let Some(t) = self.tier.lock().unwrap().as_ref() {
            self.still_held
                .lock()
                .unwrap()
                .extend(keys.iter().filter(|k| t.contains(**k)));
        }
    }
}

/// The keys of `keys` whose block sits in `region`, in slot order.
fn in_region(tier: &DiskTier, keys: &[BlockHash], region: u32) -> Vec<BlockHash> {
    let mut v: Vec<(u32, BlockHash)> = keys
        .iter()
        .filter_map(|k| {
            let l = tier.location(*k)?;
            (l.region == region).then_some((l.slot, *k))
        })
        .collect();
    v.sort();
    v.into_iter().map(|(_, k)| k).collect()
}

async fn assert_all_miss(tier: &DiskTier, keys: &[BlockHash]) {
    for chunk in keys.chunks(64) {
        for ((l, _), k) in get(tier, chunk).await.into_iter().zip(chunk) {
            assert_eq!(l, Lookup::Miss, "{k} still readable");
        }
    }
}

async fn wanted_blocks_survive_and_every_drop_is_reported(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let mut cfg = config(d.clone(), 4 * REGION);
    // Without effect under a listener: only what it wants goes back.
    cfg.reinsert_hot = true;
    let tier = DiskTier::open(cfg, kind.engine()).unwrap();
    assert_eq!(tier.live_capacity_blocks(), SLOTS);
    let blocks = Blocks::range(&g, 60, 0..1000);
    // Every fifth of the first 250 blocks is wanted: 50, within what the
    // log can keep (one region's slots here), spread over the first
    // regions and carried along as the log wraps.
    let want: HashSet<BlockHash> = blocks.keys[..250].iter().copied().step_by(5).collect();
    let rec = Recorder::wanting(want.iter().copied());
    rec.install(&tier);
    let puts = blocks.puts();
    for (c, chunk) in puts.chunks(25).enumerate() {
        for r in tier.put_batch(chunk).await {
            r.unwrap();
        }
        // Read a few: hot, but unwanted ones still go.
        let hot: Vec<BlockHash> = chunk.iter().step_by(7).map(|p| p.key).collect();
        if c % 2 == 0 {
            check_all_hit(&tier, &hot).await;
        }
    }
    let reports = rec.take_reports();
    let s = tier.stats();
    assert!(s.regions_reclaimed >= 10, "{s:?}");
    assert_eq!(reports.len() as u64, s.regions_reclaimed);
    let mut evicted: HashSet<BlockHash> = HashSet::new();
    let mut retained = 0;
    for r in &reports {
        // No wanted block is ever dropped.
        assert_eq!(r.wanted, 0, "{r:?}");
        retained += r.n_wanted;
        for k in &r.keys {
            assert!(evicted.insert(*k), "{k} reported twice");
        }
    }
    assert!(rec.take_losses().is_empty());
    assert!(retained > 0, "no reclaim met a wanted block");
    assert_eq!(s.reclaim_retained, retained as u64);
    assert_eq!(s.reinserted, s.reclaim_retained, "{s:?}");
    assert_eq!(s.blocks_lost, 0);
    assert_eq!(s.blocks_evicted, evicted.len() as u64);
    assert_eq!(s.blocks_evicted as usize + tier.len(), 1000);
    // Reported: gone. Not reported: there, byte-exact (every wanted block
    // among them).
    let gone: Vec<BlockHash> = evicted.iter().copied().collect();
    assert_all_miss(&tier, &gone).await;
    let kept: Vec<BlockHash> = blocks
        .keys
        .iter()
        .copied()
        .filter(|k| !evicted.contains(k))
        .collect();
    assert!(want.iter().all(|k| kept.contains(k)));
    check_all_hit(&tier, &kept).await;
    rec.finish();
    // Re-inserted blocks survive a restart too.
    tier.close().await.unwrap();
    drop(tier);
    let tier = DiskTier::open(config(d, 4 * REGION), kind.engine()).unwrap();
    check_all_hit(&tier, &kept).await;
}

async fn every_wanted_block_goes_back_hot_ones_first(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let mut cfg = config(d, 4 * REGION);
    cfg.reinsert_hot = true;
    let tier = DiskTier::open(cfg, kind.engine()).unwrap();
    let blocks = Blocks::range(&g, 61, 0..(4 * SLOTS) as u64);
    put_all(&tier, &blocks, SLOTS).await;
    let r0 = in_region(&tier, &blocks.keys, 0);
    assert_eq!(r0.len(), SLOTS);
    // Wanted: slots 0..30 (more than the old quarter-region budget). Hot:
    // slots 20..40.
    let rec = Recorder::wanting(r0[..30].iter().copied());
    rec.install(&tier);
    check_all_hit(&tier, &r0[20..40]).await;
    let more = Blocks::range(&g, 62, 0..20);
    put_all(&tier, &more, 20).await;
    let s = tier.stats();
    // Every region equally live: the oldest goes (FIFO among equals).
    assert_eq!(s.regions_reclaimed, 1);
    // Kept: the 10 hot wanted ones, then the 20 cold wanted ones; the
    // merely hot ones go.
    let kept: Vec<BlockHash> = r0[20..30].iter().chain(&r0[..20]).copied().collect();
    assert_eq!(s.reclaim_retained, 30);
    assert_eq!(s.reinserted, 30);
    assert_eq!(s.blocks_evicted, (SLOTS - 30) as u64);
    let reports = rec.take_reports();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].keys, r0[30..].to_vec());
    assert_eq!((reports[0].n_wanted, reports[0].wanted), (30, 0));
    // Re-inserted in that order as the first slots of region 0's new life.
    for (i, k) in kept.iter().enumerate() {
        let l = tier.location(*k).unwrap();
        assert_eq!((l.region, l.slot), (0, i as u32));
    }
    check_all_hit(&tier, &kept).await;
    check_all_hit(&tier, &more.keys).await;
    assert_all_miss(&tier, &r0[30..]).await;
    rec.finish();
}

async fn the_region_with_the_fewest_live_blocks_goes_first(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let tier = DiskTier::open(config(d, 4 * REGION), kind.engine()).unwrap();
    let blocks = Blocks::range(&g, 71, 0..(4 * SLOTS) as u64);
    put_all(&tier, &blocks, SLOTS).await;
    let r2 = in_region(&tier, &blocks.keys, 2);
    let r1 = in_region(&tier, &blocks.keys, 1);
    // Region 2 keeps 10 live blocks, region 1 keeps 20, region 0 all.
    for k in r2[10..].iter().chain(&r1[20..]) {
        assert!(tier.remove(*k));
    }
    let all: HashSet<BlockHash> = blocks.keys.iter().copied().collect();
    let rec = Recorder::wanting(all.iter().copied());
    rec.install(&tier);
    put_all(&tier, &Blocks::range(&g, 72, 0..10), 10).await;
    let s = tier.stats();
    assert_eq!(s.regions_reclaimed, 1);
    assert_eq!(s.reinserted, 10);
    assert!(
        r2[..10]
            .iter()
            .all(|k| tier.location(*k).unwrap().region == 2)
    );
    // Region 1 (20 live) goes next. Then every region holds 51 live
    // blocks; the oldest two (0 and 3) only wanted ones, so reclaiming
    // them would free nothing: they are passed over for region 2, whose
    // new blocks nobody wants.
    let r0 = in_region(&tier, &blocks.keys, 0);
    put_all(&tier, &Blocks::range(&g, 73, 0..(2 * SLOTS) as u64), SLOTS).await;
    let s = tier.stats();
    assert_eq!(s.regions_reclaimed, 3);
    assert_eq!(s.reinserted, 10 + 20 + 10);
    assert_eq!(s.blocks_evicted, (SLOTS - 10) as u64);
    assert_eq!(in_region(&tier, &blocks.keys, 0), r0);
    check_all_hit(&tier, &r0).await;
    check_all_hit(&tier, &r1[..20]).await;
    check_all_hit(&tier, &r2[..10]).await;
    assert!(rec.take_reports().iter().all(|r| r.wanted == 0));
    rec.finish();
}

async fn removed_and_moved_keys_are_not_reported(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let tier = DiskTier::open(config(d, 4 * REGION), kind.engine()).unwrap();
    let rec = Recorder::wanting([]);
    rec.install(&tier);
    // Three regions full and a fourth open.
    let blocks = Blocks::range(&g, 64, 0..(3 * SLOTS + 10) as u64);
    put_all(&tier, &blocks, SLOTS).await;
    let r0 = in_region(&tier, &blocks.keys, 0);
    assert_eq!(r0.len(), SLOTS);
    // Removed explicitly.
    let removed = &r0[..8];
    for k in removed {
        assert!(tier.remove(*k));
    }
    // Removed and put again: now in region 3.
    let moved = &r0[8..12];
    for k in moved {
        assert!(tier.remove(*k));
    }
    let again = Blocks::new(&g, moved.to_vec());
    put_all(&tier, &again, 4).await;
    assert!(moved.iter().all(|k| tier.location(*k).unwrap().region == 3));
    assert!(rec.take_reports().is_empty());
    // Fill region 3 and reclaim region 0 (the fewest live blocks).
    let more = Blocks::range(&g, 65, 0..(SLOTS - 10 - 4 + 5) as u64);
    put_all(&tier, &more, 64).await;
    assert_eq!(tier.stats().regions_reclaimed, 1);
    let reports = rec.take_reports();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].keys, r0[12..].to_vec());
    assert_eq!(tier.stats().blocks_evicted, (SLOTS - 12) as u64);
    assert_all_miss(&tier, removed).await;
    assert_all_miss(&tier, &r0[12..]).await;
    check_all_hit(&tier, moved).await;
    rec.finish();
}

async fn a_corrupt_wanted_block_is_lost_and_reported(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let tier = DiskTier::open(config(d, 4 * REGION), kind.engine()).unwrap();
    let blocks = Blocks::range(&g, 66, 0..(4 * SLOTS) as u64);
    put_all(&tier, &blocks, SLOTS).await;
    let r0 = in_region(&tier, &blocks.keys, 0);
    let wanted = &r0[..6];
    let rec = Recorder::wanting(wanted.iter().copied());
    rec.install(&tier);
    let path = tier.data_file(0).unwrap();
    let l = *tier.layout();
    // Flip a data byte of wanted block 1 and a slot header byte (its key)
    // of wanted block 4.
    let off = l.piece_offset(layout(), 0, 0, 1) + 777;
    let b = peek(&path, off, 1);
    poke(&path, off, &[b[0] ^ 0x10]);
    let off = l.header_offset(layout(), 0, 4) + 20;
    let b = peek(&path, off, 1);
    poke(&path, off, &[b[0] ^ 0x01]);
    let more = Blocks::range(&g, 67, 0..10);
    put_all(&tier, &more, 10).await;
    let s = tier.stats();
    assert_eq!(s.regions_reclaimed, 1);
    assert_eq!(s.corrupt, 2);
    assert_eq!(s.reclaim_retained, 4);
    assert_eq!(s.blocks_evicted, (SLOTS - 6) as u64);
    assert_eq!(s.blocks_lost, 2);
    let reports = rec.take_reports();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].keys, r0[6..].to_vec());
    assert_eq!(rec.take_losses(), vec![vec![r0[1], r0[4]]]);
    assert_all_miss(&tier, &[r0[1], r0[4]]).await;
    let good: Vec<BlockHash> = [0, 2, 3, 5].iter().map(|&i| r0[i]).collect();
    check_all_hit(&tier, &good).await;
    // Re-inserted from their verified copies: region 0's new life.
    assert!(good.iter().all(|k| tier.location(*k).unwrap().region == 0));
    rec.finish();
}

async fn a_failed_reinsertion_is_reported_lost(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let faulty = Arc::new(FaultyEngine::new(kind.engine(), vec![]));
    let engine: Arc<dyn IoEngine> = faulty.clone();
    let tier = DiskTier::open(config(d, 4 * REGION), engine).unwrap();
    let blocks = Blocks::range(&g, 69, 0..(4 * SLOTS) as u64);
    put_all(&tier, &blocks, SLOTS).await;
    let r0 = in_region(&tier, &blocks.keys, 0);
    let rec = Recorder::wanting(r0[..5].iter().copied());
    rec.install(&tier);
    // The reclaim reads back fine; the write re-inserting them fails.
    faulty.set_faults(vec![Fault::FailOps {
        kind: Some(IoKind::Write),
        errno: libc::EIO,
        every: 1,
    }]);
    let more = Blocks::range(&g, 70, 0..10);
    let r = tier.put_batch(&more.puts()).await;
    assert!(r.iter().all(|r| r.is_err()), "{r:?}");
    faulty.set_faults(vec![]);
    let reports = rec.take_reports();
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!(reports[0].keys, r0[5..].to_vec());
    assert_eq!(rec.take_losses(), vec![r0[..5].to_vec()]);
    let s = tier.stats();
    assert_eq!(s.reclaim_retained, 0);
    assert_eq!(s.blocks_evicted, (SLOTS - 5) as u64);
    assert_eq!(s.blocks_lost, 5);
    assert_all_miss(&tier, &r0).await;
    rec.finish();
}

// ---------------------------------------------------------------------
// Property: nothing vanishes unreported.

/// 2 layers of 4 KiB: 8 KiB blocks in 12 KiB slots; 128 KiB regions hold
/// 10 slots; 6 regions, so the listener may want 30 blocks
/// ((6 - 2 open - 1) x 10).
fn small_config(
    dir: std::path::PathBuf,
    eviction: RegionEvictionKind,
    hot: bool,
) -> DiskTierConfig {
    let mut c = config(vec![dir], 6 * SMALL_REGION);
    c.geometry = small_geometry();
    c.region_size = SMALL_REGION;
    c.eviction = eviction;
    c.reinsert_hot = hot;
    c.register_buffers = false;
    c
}

const SMALL_REGION: u64 = 128 << 10;

fn small_geometry() -> Geometry {
    Geometry::raw(2, 8 << 10).expect("geometry")
}

#[derive(Debug, Clone)]
enum Op {
    Put(Vec<u8>),
    Remove(u8),
    Want(u8, bool),
    Read(u8),
}

fn op() -> impl Strategy<Value = Op> {
    let id = 0u8..48;
    prop_oneof![
        4 => proptest::collection::vec(id.clone(), 1..8).prop_map(Op::Put),
        1 => id.clone().prop_map(Op::Remove),
        2 => (id.clone(), any::<bool>()).prop_map(|(i, w)| Op::Want(i, w)),
        2 => id.prop_map(Op::Read),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Live,
    Removed,
    Evicted,
}

fn run_ops(ops: Vec<Op>, lru: bool, hot: bool, layout: RegionLayout) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(with_layout(layout, async move {
        let (_t, d) = dirs(1);
        let g = small_geometry();
        let kind = if lru {
            RegionEvictionKind::Lru
        } else {
            RegionEvictionKind::Fifo
        };
        let tier = DiskTier::open(small_config(d[0].clone(), kind, hot), Kind::Psync.engine())
            .expect("open");
        let cap = tier.live_capacity_blocks();
        let rec = Recorder::wanting([]);
        rec.install(&tier);
        let all = Blocks::range(&g, 68, 0..48);
        let len = g.block_bytes() as usize;
        let mut st: HashMap<BlockHash, St> = HashMap::new();
        let mut reported = 0u64;
        for o in ops {
            match o {
                Op::Put(ids) => {
                    let b = Blocks::new(&g, ids.iter().map(|&i| all.keys[i as usize]).collect());
                    for (r, k) in tier.put_batch(&b.puts()).await.into_iter().zip(&b.keys) {
                        prop_assert!(r.is_ok(), "put {k}: {r:?}");
                        st.insert(*k, St::Live);
                    }
                }
                Op::Remove(i) => {
                    let k = all.keys[i as usize];
                    let was_live = st.get(&k) == Some(&St::Live);
                    prop_assert_eq!(tier.remove(k), was_live, "remove {}", k);
                    if was_live {
                        st.insert(k, St::Removed);
                    }
                }
                Op::Want(i, w) => {
                    let k = all.keys[i as usize];
                    let mut want = rec.want.lock().unwrap();
                    // Within what the log can keep: then no put fails and
                    // no wanted block is dropped.
                    if w && want.len() < cap {
                        want.insert(k);
                    } else {
                        want.remove(&k);
                    }
                }
                Op::Read(i) => {
                    let k = all.keys[i as usize];
                    let (l, bytes) = get(&tier, &[k]).await.remove(0);
                    if st.get(&k) == Some(&St::Live) {
                        prop_assert_eq!(l, Lookup::Hit, "live {} not readable", k);
                        prop_assert!(bytes == content(k, len), "wrong bytes for {}", k);
                    } else {
                        prop_assert_eq!(l, Lookup::Miss);
                    }
                }
            }
            for r in rec.take_reports() {
                prop_assert_eq!(r.wanted, 0, "a wanted block dropped: {:?}", r);
                for k in r.keys {
                    prop_assert_eq!(st.get(&k), Some(&St::Live), "{} reported but not live", k);
                    st.insert(k, St::Evicted);
                    reported += 1;
                }
            }
        }
        // Every key ever put: readable (exact) or reported or removed.
        let live = st.values().filter(|s| **s == St::Live).count();
        prop_assert_eq!(tier.len(), live);
        for (k, s) in &st {
            let (l, bytes) = get(&tier, &[*k]).await.remove(0);
            if *s == St::Live {
                prop_assert_eq!(l, Lookup::Hit, "{} vanished unreported", k);
                prop_assert!(bytes == content(*k, len));
            } else {
                prop_assert_eq!(l, Lookup::Miss);
            }
        }
        let s = tier.stats();
        prop_assert_eq!(s.blocks_evicted, reported);
        prop_assert_eq!(s.corrupt, 0);
        prop_assert_eq!(s.blocks_lost, 0);
        prop_assert!(rec.take_losses().is_empty());
        // Under a listener, only what it wants goes back, `reinsert_hot`
        // or not.
        prop_assert_eq!(s.reinserted, s.reclaim_retained);
        rec.finish();
        Ok(())
    }))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Whatever is put, read, removed and wanted, every block is readable
    /// exactly, or was removed, or was reported unwanted; none the
    /// listener wants is dropped.
    #[test]
    fn nothing_vanishes_unreported(
        ops in proptest::collection::vec(op(), 1..100),
        lru in any::<bool>(),
        hot in any::<bool>(),
        layer in any::<bool>(),
    ) {
        let layout = if layer { RegionLayout::Layer } else { RegionLayout::Block };
        run_ops(ops, lru, hot, layout)?;
    }
}
