//! [`DiskTierConfig`]: what a [`DiskTier`](crate::DiskTier) is opened with.

use std::path::PathBuf;
use std::time::Duration;

use kvtier_core::{DiskConfig, Geometry, RegionEvictionKind};

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
        }
    }
}
