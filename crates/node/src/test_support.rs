//! Small real nodes for tests (feature `test-support`): an arena in
//! /dev/shm named per process and call, a disk log in a directory the
//! caller owns, geometry `tiny` (2 layers, 16 KiB blocks of 16 tokens).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use kvtier_core::{ByteSize, Config, IoEngineKind};

/// A configuration for a node under `dir` with `dram_blocks` arena slots
/// and a 4 MiB disk log of 1 MiB regions (psync, no fsync), socket
/// `<dir>/node.sock`.
pub fn small_config(dir: &Path, dram_blocks: u64) -> Config {
    static N: AtomicU64 = AtomicU64::new(0);
    let mut c = Config::default();
    c.geometry.preset = Some("tiny".into());
    c.geometry.tokens_per_block = 16;
    let block = c.geometry.resolve().map_or(16 << 10, |g| g.block_bytes());
    c.memory.capacity = ByteSize(dram_blocks * block);
    c.memory.shm_name = format!(
        "kvtier-node-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    c.disk.capacity_per_dir = ByteSize(4 << 20);
    c.disk.region_size = ByteSize(1 << 20);
    c.disk.io_engine = IoEngineKind::Psync;
    c.disk.register_buffers = false;
    c.disk.sync = false;
    c.disk.checkpoint_interval_secs = 0;
    c.serve.data_dir = dir.to_owned();
    c.manager.lease_secs = 30;
    c
}
