//! The disk log reclaims whole regions whatever the G3 pool thinks of the
//! blocks in them. With the manager's reclaim listener, the pool learns of
//! every block the log dropped (and the log re-inserts blocks the pool
//! still holds first), so every G3 block the manager offers onboards with
//! its exact bytes: no load fails as a miss.

use std::sync::Arc;

use kvtier_core::BlockHash;
use kvtier_io::PsyncEngine;
use kvtier_manager::Tier;
use kvtier_manager::device::{Device, HostDevice, HostDeviceOptions};
use kvtier_manager::manager::{BlockManager, ManagerConfig, ManagerTiers};
use kvtier_manager::placement::{CascadeMode, HierarchyConfig, PlacementConfig};
use kvtier_manager::pool::PoolConfig;
use kvtier_manager::test_support::block_content;

#[path = "support/tiers.rs"]
mod tiers;
use tiers::{disk, geometry, memory};

fn pool(blocks: usize) -> PoolConfig {
    PoolConfig {
        capacity_blocks: blocks,
        tokens_per_block: 16,
        high_watermark: 1.0,
        low_watermark: 1.0,
        ..PoolConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_forgets_what_the_disk_log_reclaimed_and_serves_the_rest() {
    let mut placement = PlacementConfig {
        mode: CascadeMode::Exclusive,
        ..PlacementConfig::default()
    };
    placement.admission.min_reuses = 0;
    let config = ManagerConfig {
        hierarchy: HierarchyConfig {
            g1: Some(pool(4)),
            g2: Some(pool(4)),
            // Far more than the log keeps live (3 regions of 1 MiB, about
            // 50 blocks of 16 KiB each): the log reclaims under the pool.
            g3: Some(pool(400)),
            g4: None,
            placement,
        },
        ..ManagerConfig::default()
    };
    let host = Arc::new(HostDevice::new(geometry(), 4, HostDeviceOptions::default()));
    let (_dir, disk) = disk(
        "kvtier-mgr-reclaim",
        3 << 20,
        Arc::new(PsyncEngine::new(2, 64).expect("psync engine")),
    );
    let m = BlockManager::new(
        config,
        ManagerTiers {
            geometry: *host.geometry(),
            device: Some(host.clone()),
            memory: Some(memory("reclaim", 8)),
            disk: Some(disk.clone()),
            remote: None,
        },
        Vec::new(),
    )
    .expect("manager");
    let len = geometry().block_bytes() as usize;
    let chains: Vec<Vec<BlockHash>> = (0..100u128)
        .map(|c| (0..4u128).map(|i| BlockHash((c << 32) | (i + 1))).collect())
        .collect();
    for keys in &chains {
        let blocks = keys.iter().map(|k| (*k, block_content(*k, len))).collect();
        drop(m.store_computed(None, blocks).await.expect("store"));
    }
    m.flush_events();
    let stats = m.stats();
    assert!(
        stats.reclaimed_by_disk > 0,
        "the log reclaimed under the pool: {stats:?}"
    );
    assert!(disk.stats().regions_reclaimed > 0);
    // Every block G3 still holds is on the disk...
    let g3 = m.pool(Tier::G3).expect("g3");
    let held: Vec<BlockHash> = chains
        .iter()
        .flatten()
        .copied()
        .filter(|h| g3.presence(*h).is_some())
        .collect();
    assert!(!held.is_empty());
    for h in &held {
        assert!(disk.contains(*h), "G3 holds {h} but the disk does not");
    }
    // ...and onboards with its bytes. Onboarding pushes blocks down again,
    // so the log keeps reclaiming: a block it dropped meanwhile is no
    // longer offered (a lookup miss), never a failed load.
    let mut onboarded_blocks = 0;
    for h in &held {
        if m.lookup(&[*h]).is_empty() {
            continue;
        }
        let onboarding = m.begin_onboard(&[*h]).await.expect("begin");
        let onboarded = m.finish_onboard(onboarding).await.expect("finish");
        assert!(onboarded.failed.is_empty(), "{h}: {:?}", onboarded.failed);
        let b = onboarded.blocks.first().expect("onboarded");
        let id = m.device_block(b.slot()).expect("device block");
        assert_eq!(host.read_block(id).expect("read"), block_content(*h, len));
        onboarded_blocks += 1;
    }
    assert!(
        onboarded_blocks > held.len() / 2,
        "{onboarded_blocks} of {}",
        held.len()
    );
    let after = m.stats();
    assert_eq!(after.onboard_failures, 0);
    assert_eq!(after.verify_failures, 0);
}
