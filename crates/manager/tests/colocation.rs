//! Co-location by the manager (design/layer-stripe.md, step 5): a round's
//! G2 -> G3 moves reach the disk chain by chain, root first, so a prefix
//! later sits on adjacent slots and a layer of it reads as one run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kvtier_core::{BlockHash, BlockSums, Lookup};
use kvtier_disk::{DiskTier, RegionLayout};
use kvtier_io::PsyncEngine;
use kvtier_manager::Tier;
use kvtier_manager::TierList;
use kvtier_manager::admission::AdmissionConfig;
use kvtier_manager::manager::{BlockManager, ManagerConfig};
use kvtier_manager::placement::{CascadeMode, HierarchyConfig, PlacementConfig};
use kvtier_manager::pool::{Clock, PoolConfig};
use kvtier_manager::test_support::block_content;
use kvtier_mem::{MemoryTier, MemoryTierConfig};
use kvtier_tier::TierStore;

#[path = "support/tiers.rs"]
// Shared with other tests; this one needs a node arena and a layout.
#[allow(dead_code)]
mod tiers;
use tiers::{disk_with, geometry};

/// G2 slots: room for two 16-block chains.
const G2_BLOCKS: usize = 32;

fn pool(blocks: usize, high: f64) -> PoolConfig {
    PoolConfig {
        capacity_blocks: blocks,
        tokens_per_block: 16,
        high_watermark: high,
        low_watermark: 0.0,
        ..PoolConfig::default()
    }
}

/// A node's manager: G2 on an arena that `step` empties into
/// G3, a disk tier of `layout`. The pools' clock ticks once per reading,
/// so the LRU order is the order blocks arrive in, without ties.
fn rig(layout: RegionLayout) -> (BlockManager, Arc<DiskTier>, tempfile::TempDir) {
    static ARENAS: AtomicU64 = AtomicU64::new(0);
    let g = geometry();
    let memory = MemoryTier::create(MemoryTierConfig {
        shm_name: format!(
            "kvtier-mgr-coloc-{}-{}",
            std::process::id(),
            ARENAS.fetch_add(1, Ordering::Relaxed)
        ),
        capacity_bytes: G2_BLOCKS as u64 * g.block_bytes(),
        block_bytes: g.block_bytes() as usize,
        layer_bytes: g.layer_bytes() as usize,
        hugepages: false,
        table_key: None,
        access_group: None,
    })
    .expect("memory tier in /dev/shm");
    // 9 regions: room for G3's 256 blocks and the log's slack
    // (docs/disk-format.md, I24).
    let (dir, disk) = disk_with(
        "kvtier-mgr-coloc",
        9 << 20,
        Arc::new(PsyncEngine::new(2, 64).expect("psync engine")),
        layout,
    );
    let config = ManagerConfig {
        // Any block above the first is above the high watermark: one
        // step moves them all down.
        hierarchy: HierarchyConfig::none()
            .with(Tier::G2, Some(pool(G2_BLOCKS, 0.01)))
            .with(Tier::G3, Some(pool(256, 1.0)))
            .with_placement(PlacementConfig {
                mode: CascadeMode::Exclusive,
                admission: AdmissionConfig {
                    min_reuses: 0,
                    ..AdmissionConfig::default()
                },
            }),
        step_waits: true,
        ..ManagerConfig::default()
    };
    let tick = Arc::new(AtomicU64::new(0));
    let clock: Clock = Arc::new(move || tick.fetch_add(1, Ordering::Relaxed));
    let tiers =
        TierList::new(g, Some(memory), vec![disk.clone() as Arc<dyn TierStore>]).expect("tiers");
    let manager = BlockManager::with_pool_clock(config, tiers, Vec::new(), clock).expect("manager");
    (manager, disk, dir)
}

fn chain(seed: u128, n: usize) -> Vec<BlockHash> {
    (0..n as u128)
        .map(|i| BlockHash((seed << 32) | (i + 1)))
        .collect()
}

/// Puts chains `a` and `b` in G2 with their parent links, interleaved and
/// leaf first (`a[n-1], b[n-1], a[n-2], ...`): the LRU policy then gives
/// them up in that order, each leaf before its parent, alternating chains.
fn fill_interleaved(m: &BlockManager, a: &[BlockHash], b: &[BlockHash]) {
    let g = geometry();
    let (block_bytes, layer_bytes) = (g.block_bytes() as usize, g.layer_bytes() as usize);
    let memory = m.tiers().arena().cloned().expect("memory tier");
    let g2 = m.pool(Tier::G2).expect("g2");
    for i in (0..a.len()).rev() {
        for c in [a, b] {
            let key = c[i];
            let bytes = block_content(key, block_bytes);
            let sums = BlockSums::compute(key, layer_bytes, &bytes);
            memory.put(key, &bytes, &sums).expect("arena put");
            let parent = i.checked_sub(1).map(|p| c[p]);
            drop(g2.begin_incoming(key, parent).expect("g2 slot").finish());
        }
    }
}

/// Each chain's blocks sit on adjacent slots of one region, root first.
fn assert_colocated(disk: &DiskTier, c: &[BlockHash]) {
    let locs: Vec<_> = c
        .iter()
        .map(|k| disk.location(*k).expect("on disk"))
        .collect();
    for (i, w) in locs.windows(2).enumerate() {
        assert!(
            w[1].dir == w[0].dir && w[1].region == w[0].region && w[1].slot == w[0].slot + 1,
            "block {} of the chain is not on the slot after block {}: {locs:?}",
            i + 1,
            i
        );
    }
}

/// Two chains planned leaf first and interleaved reach `put_batch` root
/// first, chain after chain: each on adjacent slots in root-to-leaf order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offloaded_chains_are_written_root_first_and_contiguous() {
    let (m, disk, _dir) = rig(RegionLayout::Block);
    let (a, b) = (chain(1, 4), chain(2, 4));
    fill_interleaved(&m, &a, &b);
    assert_eq!(m.step().await, 8);
    assert_eq!(disk.stats().puts, 8);
    assert_colocated(&disk, &a);
    assert_colocated(&disk, &b);
}

/// A 16-block prefix offloaded (interleaved with another chain) to a
/// layer-major disk tier comes back with one read op per layer: the
/// chain's slots form one run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_onboarded_from_layer_major_disk_reads_one_op_per_layer() {
    let (m, disk, _dir) = rig(RegionLayout::Layer);
    let (a, b) = (chain(3, 16), chain(4, 16));
    fill_interleaved(&m, &a, &b);
    assert_eq!(m.step().await, 32);
    assert!(m.pool(Tier::G2).expect("g2").used() == 0);
    let before = disk.stats();

    let onboarding = m.begin_onboard(&a).await.expect("begin");
    assert_eq!(onboarding.loading(), 16);
    let onboarded = m.finish_onboard(onboarding).await.expect("finish");
    assert_eq!(onboarded.blocks.len(), 16, "failed: {:?}", onboarded.failed);

    let after = disk.stats();
    let layers = u64::from(geometry().layers);
    assert_eq!(after.read_ios - before.read_ios, layers, "{after:?}");
    assert_eq!(after.read_runs - before.read_runs, layers, "{after:?}");
    // A hit per block and layer read.
    assert_eq!(after.hits - before.hits, 16 * layers);

    let memory = m.tiers().arena().cloned().expect("memory tier");
    let block_bytes = geometry().block_bytes() as usize;
    let mut got = vec![0u8; block_bytes];
    for key in &a {
        assert_eq!(memory.get(*key, &mut got), Lookup::Hit, "{key}");
        assert!(
            got == block_content(*key, block_bytes),
            "{key}: bytes differ"
        );
    }
}
