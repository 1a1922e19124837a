//! Real tiers for the manager's integration tests: a shared-memory arena
//! in /dev/shm and a disk tier in a temporary directory under /tmp (not
//! tmpfs, so O_DIRECT alignment is real).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kvtier_core::{Geometry, RegionEvictionKind};
use kvtier_disk::{DiskTier, DiskTierConfig};
use kvtier_io::IoEngine;
use kvtier_mem::{MemoryTier, MemoryTierConfig};

/// 4 layers of 4 KiB: 16 KiB blocks.
pub fn geometry() -> Geometry {
    Geometry::raw(4, 16 << 10).expect("geometry")
}

/// A fresh arena of `blocks` slots, named uniquely per process and call.
/// It never evicts by itself: the G2 pool is its only eviction authority.
pub fn memory(tag: &str, blocks: u64) -> MemoryTier {
    MemoryTier::create(arena_config(tag, blocks)).expect("memory tier in /dev/shm")
}

fn arena_config(tag: &str, blocks: u64) -> MemoryTierConfig {
    static N: AtomicU64 = AtomicU64::new(0);
    let g = geometry();
    MemoryTierConfig {
        shm_name: format!(
            "kvtier-mgr-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ),
        capacity_bytes: blocks * g.block_bytes(),
        block_bytes: g.block_bytes() as usize,
        layer_bytes: g.layer_bytes() as usize,
        hugepages: false,
        table_key: None,
        access_group: None,
    }
}

/// A disk tier of `capacity` bytes in 1 MiB block-major regions over
/// `engine`.
pub fn disk(
    prefix: &str,
    capacity: u64,
    engine: Arc<dyn IoEngine>,
) -> (tempfile::TempDir, Arc<DiskTier>) {
    disk_with(prefix, capacity, engine, kvtier_disk::RegionLayout::Block)
}

/// [`disk`] with the regions' `layout`.
pub fn disk_with(
    prefix: &str,
    capacity: u64,
    engine: Arc<dyn IoEngine>,
    layout: kvtier_disk::RegionLayout,
) -> (tempfile::TempDir, Arc<DiskTier>) {
    let t = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .expect("tempdir");
    let tier = disk_in(t.path(), capacity, engine, layout);
    (t, tier)
}

/// Opens (or, after a restart, recovers) the disk tier [`disk_with`] keeps
/// under `root`.
pub fn disk_in(
    root: &std::path::Path,
    capacity: u64,
    engine: Arc<dyn IoEngine>,
    layout: kvtier_disk::RegionLayout,
) -> Arc<DiskTier> {
    let cfg = DiskTierConfig {
        dirs: vec![root.join("d0")],
        capacity_per_dir: capacity,
        region_size: 1 << 20,
        geometry: geometry(),
        eviction: RegionEvictionKind::Fifo,
        reinsert_hot: false,
        checkpoint_interval: Duration::ZERO,
        sync: false,
        register_buffers: false,
        reset: false,
        buffers_per_dir: 2,
        layer_sums_cache: 1024,
        write_op_bytes: kvtier_disk::DEFAULT_WRITE_OP_BYTES,
        layout,
        prefill: false,
    };
    Arc::new(DiskTier::open(cfg, engine).expect("disk tier"))
}

/// The tiers in order, as a node registers them: `memory` (if any) at the
/// top, then each of `below` at the next position.
pub fn list(
    memory: Option<&MemoryTier>,
    below: Vec<Arc<dyn kvtier_tier::TierStore>>,
) -> kvtier_manager::TierList {
    kvtier_manager::TierList::new(geometry(), memory.cloned(), below).expect("tier list")
}
