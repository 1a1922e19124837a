//! [`DiskConfig`], the `[disk]` section, and [`DiskTierConfig`]: what a
//! [`DiskTier`](crate::DiskTier) is opened with.

use std::path::PathBuf;
use std::time::Duration;

use kvtier_core::{ByteSize, CoreError, Geometry, IoEngineKind, RegionEvictionKind};
use serde::{Deserialize, Serialize};

use crate::format::RegionLayout;

/// `[disk]`: the log-structured region store on local disks (G3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiskConfig {
    /// Directories, one per device; regions are placed round-robin. Empty
    /// means `<serve.data_dir>/disk`.
    pub dirs: Vec<PathBuf>,
    /// Bytes reserved in each directory.
    pub capacity_per_dir: ByteSize,
    /// Bytes per region (the unit of sequential writes and of eviction).
    pub region_size: ByteSize,
    /// I/O engine.
    pub io_engine: IoEngineKind,
    /// Operations in flight per device.
    pub queue_depth: u32,
    /// Threads of the pread/pwrite engine.
    pub psync_threads: u32,
    /// Register region and arena buffers with io_uring (needs memlock).
    pub register_buffers: bool,
    /// Region reclaim order.
    pub eviction: RegionEvictionKind,
    /// Re-insert blocks read since they were written when their region is
    /// reclaimed (they get a second life in a new region).
    pub reinsert_hot: bool,
    /// Seconds between index checkpoints (0 disables periodic ones; clean
    /// shutdown always writes one).
    pub checkpoint_interval_secs: u64,
    /// fdatasync after each region is sealed and before a checkpoint, so
    /// data survives power loss, not just a process crash.
    pub sync: bool,
    /// Write zeros over each data file when it is created, so later writes
    /// are overwrites and not the slower first writes into preallocated
    /// (unwritten) extents. Costs one pass over `capacity_per_dir` at
    /// creation, with progress in the log.
    pub prefill: bool,
    /// How new region lives store blocks: `"block"` (each block
    /// contiguous, the default) or `"layer"` (each layer of a region's
    /// blocks contiguous; needs layers of a multiple of 4096 bytes, else
    /// open fails). Choosing `"layer"` once makes the directories format
    /// v2, which older builds refuse.
    pub layout: RegionLayout,
    /// Largest write operation: an extent leaves in ops of at most this
    /// many bytes (a multiple of 4096, 4KiB to 64MiB). 128KiB suits memory
    /// in 4 KiB pages; with the arena in huge pages (`[memory] hugepages`)
    /// 1MiB writes 2 MiB blocks faster and with a third of the CPU
    /// (docs/benchmarks.md, "Huge pages").
    pub write_op_bytes: ByteSize,
}

/// [`DiskConfig::write_op_bytes`]'s default.
pub const DEFAULT_WRITE_OP_BYTES: u64 = 128 << 10;

impl Default for DiskConfig {
    fn default() -> Self {
        Self {
            dirs: Vec::new(),
            capacity_per_dir: ByteSize(4 << 30),
            region_size: ByteSize(64 << 20),
            io_engine: IoEngineKind::Auto,
            queue_depth: 32,
            psync_threads: 8,
            register_buffers: true,
            eviction: RegionEvictionKind::Fifo,
            reinsert_hot: true,
            checkpoint_interval_secs: 30,
            sync: true,
            prefill: true,
            layout: RegionLayout::Block,
            write_op_bytes: ByteSize(DEFAULT_WRITE_OP_BYTES),
        }
    }
}

impl DiskConfig {
    /// Checks values that parse but make no sense.
    pub fn validate(&self) -> kvtier_core::Result<()> {
        let bad = |m: &str| Err(CoreError::InvalidConfig(m.into()));
        if self.region_size.0 < 1 << 20 {
            return bad("disk.region_size must be at least 1MiB");
        }
        if self.capacity_per_dir.0 < self.region_size.0 * 2 {
            return bad("disk.capacity_per_dir must hold at least two regions");
        }
        if self.queue_depth == 0 || self.queue_depth > 4096 {
            return bad("disk.queue_depth must be in 1..=4096");
        }
        if self.psync_threads == 0 {
            return bad("disk.psync_threads must be positive");
        }
        if let Err(why) = check_write_op_bytes(self.write_op_bytes.0) {
            return bad(&format!("disk.write_op_bytes {why}"));
        }
        Ok(())
    }
}

/// Why `bytes` cannot be the largest write op, if it cannot.
pub(crate) fn check_write_op_bytes(bytes: u64) -> std::result::Result<(), String> {
    if !bytes.is_multiple_of(4096) || !(4096..=64 << 20).contains(&bytes) {
        return Err(format!(
            "must be a multiple of 4096 from 4KiB to 64MiB, not {bytes}"
        ));
    }
    Ok(())
}

/// Configuration of one disk tier. Build it from the `[disk]` section with
/// [`DiskTierConfig::new`], or field by field in tests.
#[derive(Debug, Clone)]
pub struct DiskTierConfig {
    /// Directories, one per device; regions are filled round-robin. At most
    /// 255. Their order is recorded on disk: keep it across restarts.
    pub dirs: Vec<PathBuf>,
    /// Bytes reserved (preallocated) in each directory; rounded down to whole
    /// regions.
    pub capacity_per_dir: u64,
    /// Bytes per region: the unit of sequential writing and of reclaim. A
    /// multiple of 4096 that holds at least one block slot.
    pub region_size: u64,
    /// The shape of the blocks stored.
    pub geometry: Geometry,
    /// Which sealed region is reclaimed when none is free.
    pub eviction: RegionEvictionKind,
    /// Re-insert blocks read since they were written when their region is
    /// reclaimed (at most a quarter of a region per reclaim, shared with,
    /// and after, the blocks a
    /// [`ReclaimListener`](crate::ReclaimListener) wants).
    pub reinsert_hot: bool,
    /// Interval of background index checkpoints; zero disables them (close
    /// always writes one).
    pub checkpoint_interval: Duration,
    /// `fdatasync` the data file when a region seals and before each
    /// checkpoint, so data survives power loss and not only a process crash.
    pub sync: bool,
    /// Offer region buffers to the engine for registered-buffer I/O.
    pub register_buffers: bool,
    /// Wipe directories whose format or shape does not match instead of
    /// refusing to open them.
    pub reset: bool,
    /// Region-sized write buffers per directory (at least 1; 2 lets one
    /// region fill while the previous one's writes finish). Default 2.
    pub buffers_per_dir: usize,
    /// Blocks whose verified per-layer checksums are kept in memory, so
    /// reading one layer after another of the same blocks reads each slot
    /// header once (about `16 + 8 x layers` bytes each, plus map overhead;
    /// 0 disables). Default 16384.
    pub layer_sums_cache: usize,
    /// Write zeros over a data file when it is created
    /// ([`kvtier_io::prefill`]), so that first writes run at overwrite
    /// speed.
    pub prefill: bool,
    /// Layout of new region lives ([`DiskConfig::layout`]).
    pub layout: RegionLayout,
    /// Largest write operation, in bytes ([`DiskConfig::write_op_bytes`];
    /// [`DEFAULT_WRITE_OP_BYTES`] unless memory is in huge pages).
    pub write_op_bytes: u64,
}

impl DiskTierConfig {
    /// The configuration of the `[disk]` section `cfg` for `dirs` (the
    /// resolved directories) and `geometry`.
    pub fn new(cfg: &DiskConfig, dirs: Vec<PathBuf>, geometry: Geometry) -> Self {
        DiskTierConfig {
            dirs,
            capacity_per_dir: cfg.capacity_per_dir.bytes(),
            region_size: cfg.region_size.bytes(),
            geometry,
            eviction: cfg.eviction,
            reinsert_hot: cfg.reinsert_hot,
            checkpoint_interval: Duration::from_secs(cfg.checkpoint_interval_secs),
            sync: cfg.sync,
            register_buffers: cfg.register_buffers,
            reset: false,
            buffers_per_dir: 2,
            layer_sums_cache: 16384,
            prefill: cfg.prefill,
            layout: cfg.layout,
            write_op_bytes: cfg.write_op_bytes.bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_op_bytes_is_a_sector_multiple_from_4k_to_64m() {
        let mut c = DiskConfig::default();
        assert!(c.validate().is_ok());
        for bad in [0, 1000, 4095, 4097, 128 << 20] {
            c.write_op_bytes = ByteSize(bad);
            assert!(c.validate().is_err(), "{bad}");
        }
        for good in [4096, 1 << 20, 64 << 20] {
            c.write_op_bytes = ByteSize(good);
            assert!(c.validate().is_ok(), "{good}");
        }
        let parsed: DiskConfig = toml::from_str("write_op_bytes = \"1MiB\"").unwrap();
        assert_eq!(parsed.write_op_bytes, ByteSize(1 << 20));
    }
}
