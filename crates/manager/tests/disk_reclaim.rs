//! The G3 pool is the disk log's one eviction authority: the log reclaims
//! whole regions only to get space and re-inserts every block the pool
//! holds, so the disk index and the G3 pool hold the same keys after every
//! step, nothing the pool lists is ever dropped (`reclaimed_by_disk` 0),
//! and every G3 block the manager offers onboards with its exact bytes. A
//! G3 pool larger than the log can keep that way is refused, also after a
//! restart, which adopts exactly what the log holds
//! (docs/disk-format.md, I22-I25).

use std::path::Path;
use std::sync::Arc;

use kvtier_core::{BlockHash, Lookup};
use kvtier_disk::{DiskTier, RegionLayout};
use kvtier_io::{IoEngine, PsyncEngine};
use kvtier_manager::Tier;
use kvtier_manager::TierList;
use kvtier_manager::admission::AdmissionConfig;
use kvtier_manager::manager::{BlockManager, HostCommit, ManagerConfig, ManagerError};
use kvtier_manager::placement::{CascadeMode, HierarchyConfig, PlacementConfig};
use kvtier_manager::pool::PoolConfig;
use kvtier_manager::test_support::block_content;
use kvtier_mem::MemoryTier;
use kvtier_tier::TierStore;
use proptest::prelude::*;

#[path = "support/tiers.rs"]
#[allow(dead_code)]
mod tiers;
use tiers::{disk_in, geometry, memory};

/// 6 regions of 1 MiB, 51 slots of 16 KiB blocks each: the pool may hold
/// (6 - 2 open - 1) x 51 = 153 blocks.
const LOG_BYTES: u64 = 6 << 20;
/// Blocks of G2 above G3: small, so nearly every put moves a block down.
const G2_BLOCKS: usize = 4;

fn pool(blocks: usize) -> PoolConfig {
    PoolConfig {
        capacity_blocks: blocks,
        tokens_per_block: 16,
        high_watermark: 1.0,
        low_watermark: 1.0,
        ..PoolConfig::default()
    }
}

fn psync() -> Arc<dyn IoEngine> {
    Arc::new(PsyncEngine::new(2, 64).expect("psync engine"))
}

/// A node's manager: G2 over the arena, G3 of `g3` blocks over
/// `disk`, exclusive, admitting every block to G3.
fn node(
    memory: &MemoryTier,
    disk: &Arc<DiskTier>,
    g3: usize,
) -> Result<BlockManager, ManagerError> {
    let config = ManagerConfig {
        hierarchy: HierarchyConfig::none()
            .with(Tier::G2, Some(pool(G2_BLOCKS)))
            .with(Tier::G3, Some(pool(g3)))
            .with_placement(PlacementConfig {
                mode: CascadeMode::Exclusive,
                admission: AdmissionConfig {
                    min_reuses: 0,
                    ..AdmissionConfig::default()
                },
            }),
        ..ManagerConfig::default()
    };
    let tiers = TierList::new(
        geometry(),
        Some(memory.clone()),
        vec![disk.clone() as Arc<dyn TierStore>],
    )
    .expect("tiers");
    BlockManager::new(config, tiers, Vec::new())
}

fn open_disk(root: &Path) -> Arc<DiskTier> {
    disk_in(root, LOG_BYTES, psync(), RegionLayout::Block)
}

fn key(i: u32) -> BlockHash {
    BlockHash((u128::from(i) << 32) | 0xd15c)
}

async fn put(m: &BlockManager, k: BlockHash) {
    let len = geometry().block_bytes() as usize;
    let stored = m.put_host(k, &block_content(k, len)).await.expect("put");
    assert!(
        matches!(stored, Some(HostCommit::Stored | HostCommit::AlreadyStored)),
        "{k}: {stored:?}"
    );
}

/// Onboards `k` if a lookup offers it from G3: it must arrive, exact.
async fn onboard_if_in_g3(m: &BlockManager, memory: &MemoryTier, k: BlockHash) {
    if m.lookup(&[k]).count_in(Tier::G3) == 0 {
        return;
    }
    let onboarded = m
        .finish_onboard(m.begin_onboard(&[k]).await.expect("begin"))
        .await
        .expect("finish");
    assert!(onboarded.failed.is_empty(), "{k}: {:?}", onboarded.failed);
    assert_eq!(onboarded.blocks.len(), 1, "{k} did not arrive");
    drop(onboarded);
    let len = geometry().block_bytes() as usize;
    let mut out = vec![0u8; len];
    assert_eq!(memory.get(k, &mut out), Lookup::Hit);
    assert!(out == block_content(k, len), "{k} came back other bytes");
}

/// The G3 pool and the disk index hold exactly the same keys (of
/// `universe`, and in number), and the log dropped nothing the pool held.
fn assert_one_book(m: &BlockManager, disk: &DiskTier, universe: &[BlockHash]) {
    m.flush_events();
    let g3 = m.pool(Tier::G3).expect("g3");
    for k in universe {
        assert_eq!(
            g3.presence(*k).is_some(),
            disk.contains(*k),
            "{k}: the G3 pool and the disk index disagree"
        );
    }
    assert_eq!(
        g3.used(),
        disk.len(),
        "the disk holds keys the pool does not"
    );
    let s = m.stats();
    assert_eq!(s.reclaimed_by_disk, 0, "{s:?}");
    assert_eq!(s.lost_by_disk, 0, "{s:?}");
    assert_eq!(s.onboard_failures, 0, "{s:?}");
    assert_eq!(disk.stats().blocks_lost, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_g3_pool_larger_than_the_log_keeps_is_refused() {
    let t = tempfile::tempdir_in("/tmp").expect("tempdir");
    let disk = open_disk(t.path());
    let limit = disk.live_capacity_blocks();
    assert_eq!(limit, 3 * disk.layout().slots_per_region as usize);
    let arena = memory("reclaim-refuse", 8);
    match node(&arena, &disk, limit + 1) {
        Err(ManagerError::PoolTooLarge {
            tier: Tier::G3,
            pool,
            limit: l,
        }) => {
            assert_eq!((pool, l), (limit + 1, limit));
        }
        other => panic!("not refused: {:?}", other.map(|_| ())),
    }
    assert!(node(&arena, &disk, limit).is_ok());
}

/// The log wraps several times under a full pool; every block the pool
/// holds stays readable (the regions holding some are reclaimed with them
/// re-inserted), every one the pool let go leaves the index, and every G3
/// block offered onboards exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_wraps_under_a_full_pool_and_drops_nothing_it_holds() {
    let t = tempfile::tempdir_in("/tmp").expect("tempdir");
    let disk = open_disk(t.path());
    let arena = memory("reclaim-wrap", 8);
    let m = node(&arena, &disk, disk.live_capacity_blocks()).expect("manager");
    let universe: Vec<BlockHash> = (0..1200).map(key).collect();
    for (i, k) in universe.iter().enumerate() {
        put(&m, *k).await;
        // Every other block leaves once it is on disk: every region ends up
        // half live, so the log must reclaim regions holding blocks the
        // pool holds (under an LRU pool in exclusive mode G3 ages in write
        // order, and regions would otherwise die whole).
        if i >= 16 && i % 2 == 0 {
            m.remove(&[universe[i - 16]]);
        }
        // Now and then bring an older block back up (a hit moves it out of
        // G3; it goes down again later, into a newer region).
        if i % 7 == 1 {
            onboard_if_in_g3(&m, &arena, universe[i / 2]).await;
        }
        if i % 50 == 0 {
            assert_one_book(&m, &disk, &universe);
        }
    }
    assert_one_book(&m, &disk, &universe);
    let s = disk.stats();
    let regions = s.capacity_blocks / u64::from(disk.layout().slots_per_region);
    assert!(
        s.regions_reclaimed >= 3 * regions,
        "the log did not wrap: {s:?}"
    );
    assert!(
        s.reclaim_retained > 0,
        "no reclaim found a block the pool holds: {s:?}"
    );
    assert_eq!(
        s.reinserted, s.reclaim_retained,
        "only what the pool holds: {s:?}"
    );
    assert_eq!(
        m.pool(Tier::G3).expect("g3").used(),
        disk.live_capacity_blocks(),
        "the pool filled up"
    );
    for k in &universe {
        onboard_if_in_g3(&m, &arena, *k).await;
    }
    assert_one_book(&m, &disk, &universe);
}

/// A restart adopts exactly what the log holds, within the G3 pool: a
/// smaller pool takes what fits and the log forgets the rest; a pool the
/// log cannot keep is refused as at first start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_adopts_the_log_and_keeps_one_book() {
    let t = tempfile::tempdir_in("/tmp").expect("tempdir");
    let universe: Vec<BlockHash> = (0..600).map(key).collect();
    let limit = {
        let disk = open_disk(t.path());
        let limit = disk.live_capacity_blocks();
        let arena = memory("reclaim-restart-a", 8);
        let m = node(&arena, &disk, limit).expect("manager");
        for k in &universe {
            put(&m, *k).await;
        }
        assert_one_book(&m, &disk, &universe);
        assert!(disk.stats().regions_reclaimed > 0);
        drop(m);
        disk.close().await.expect("close");
        limit
    };
    // Same pool: everything the log kept comes back, and the log keeps
    // working under it.
    let held = {
        let disk = open_disk(t.path());
        let arena = memory("reclaim-restart-b", 8);
        let m = node(&arena, &disk, limit).expect("manager");
        let adopted = m.adopt().await.expect("adopt");
        assert_eq!(
            (adopted.in_tier(Tier::G3), adopted.skipped),
            (disk.len(), 0)
        );
        assert!(adopted.in_tier(Tier::G3) > 0);
        assert_one_book(&m, &disk, &universe);
        let more: Vec<BlockHash> = (600..900).map(key).collect();
        for k in &more {
            put(&m, *k).await;
        }
        let all: Vec<BlockHash> = universe.iter().chain(&more).copied().collect();
        assert_one_book(&m, &disk, &all);
        for k in all.iter().step_by(5) {
            onboard_if_in_g3(&m, &arena, *k).await;
        }
        assert_one_book(&m, &disk, &all);
        drop(m);
        disk.close().await.expect("close");
        all
    };
    // A smaller pool: it adopts what fits, the log forgets the rest.
    {
        let disk = open_disk(t.path());
        let before = disk.len();
        let arena = memory("reclaim-restart-c", 8);
        let m = node(&arena, &disk, 40).expect("manager");
        let adopted = m.adopt().await.expect("adopt");
        assert_eq!(
            (adopted.in_tier(Tier::G3), adopted.skipped),
            (40, before - 40)
        );
        assert_one_book(&m, &disk, &held);
        drop(m);
        // A pool the log cannot keep: refused.
        assert!(matches!(
            node(&arena, &disk, limit + 1),
            Err(ManagerError::PoolTooLarge { .. })
        ));
        disk.close().await.expect("close");
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Store a block (it lands in G2 and pushes one down).
    Put(u16),
    /// Bring a block up from G3 if a lookup offers it there.
    Onboard(u16),
    /// Drop a block from every tier.
    Remove(u16),
}

const KEYS: u16 = 320;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..KEYS).prop_map(Op::Put),
        2 => (0..KEYS).prop_map(Op::Onboard),
        1 => (0..KEYS).prop_map(Op::Remove),
    ]
}

fn run_ops(ops: Vec<Op>, g3: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let t = tempfile::tempdir_in("/tmp").expect("tempdir");
        let disk = open_disk(t.path());
        let arena = memory("reclaim-prop", 8);
        let m = node(&arena, &disk, g3).expect("manager");
        let universe: Vec<BlockHash> = (0..u32::from(KEYS)).map(key).collect();
        for o in ops {
            match o {
                Op::Put(i) => put(&m, universe[i as usize]).await,
                Op::Onboard(i) => onboard_if_in_g3(&m, &arena, universe[i as usize]).await,
                Op::Remove(i) => {
                    m.remove(&[universe[i as usize]]);
                }
            }
            assert_one_book(&m, &disk, &universe);
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    /// After every step of a random stream of stores, hits and removals,
    /// the disk index and the G3 pool hold the same keys, whatever the
    /// pool's size within the log's limit.
    #[test]
    fn the_disk_index_and_the_g3_pool_hold_the_same_keys(
        ops in proptest::collection::vec(op(), 1..500),
        g3 in 16usize..=153,
    ) {
        run_ops(ops, g3);
    }
}
