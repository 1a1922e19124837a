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
    /// Region reclaim order; under an owner's reclaim listener (the node's
    /// G3 pool) it only breaks ties between regions with as many live
    /// blocks.
    pub eviction: RegionEvictionKind,
    /// Without a reclaim listener: re-insert blocks read since they were
    /// written when their region is reclaimed (they get a second life in a
    /// new region). Under one, every block it wants is re-inserted and no
    /// other.
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
    /// many bytes (a multiple of 4096, 4KiB to 64MiB), or `"auto"` (the
    /// default): [`HUGE_PAGE_WRITE_OP_BYTES`] when the arena blocks are
    /// written from is in huge pages, else [`DEFAULT_WRITE_OP_BYTES`]
    /// (see [`WriteOpBytes::resolve`]).
    pub write_op_bytes: WriteOpBytes,
}

/// The largest write op for memory in 4 KiB pages. Larger ops lost
/// bandwidth there (a 1 MiB op of such memory is 256 segments, past what
/// many devices take in one request; docs/benchmarks.md, "Huge pages").
pub const DEFAULT_WRITE_OP_BYTES: u64 = 128 << 10;

/// The largest write op for memory in huge pages: 1 MiB ops wrote 2 MiB
/// blocks faster than 128 KiB ones and with a third of the CPU
/// (docs/benchmarks.md, "Huge pages").
pub const HUGE_PAGE_WRITE_OP_BYTES: u64 = 1 << 20;

/// [`DiskConfig::write_op_bytes`]: chosen from the memory's page size, or
/// set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteOpBytes {
    /// By the page size of the memory written from (`"auto"`).
    #[default]
    Auto,
    /// This many bytes.
    Set(ByteSize),
}

impl WriteOpBytes {
    /// The op size for writes from memory in pages of `page_bytes`: a set
    /// size as it is; `Auto` gives [`HUGE_PAGE_WRITE_OP_BYTES`] for pages
    /// of 2 MiB or more, else [`DEFAULT_WRITE_OP_BYTES`].
    pub fn resolve(self, page_bytes: usize) -> u64 {
        match self {
            WriteOpBytes::Set(b) => b.bytes(),
            WriteOpBytes::Auto if page_bytes >= 2 << 20 => HUGE_PAGE_WRITE_OP_BYTES,
            WriteOpBytes::Auto => DEFAULT_WRITE_OP_BYTES,
        }
    }
}

impl Serialize for WriteOpBytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            WriteOpBytes::Auto => s.serialize_str("auto"),
            WriteOpBytes::Set(b) => b.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for WriteOpBytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(WriteOpBytes::Set(ByteSize(n))),
            Raw::S(s) if s == "auto" => Ok(WriteOpBytes::Auto),
            Raw::S(s) => s
                .parse()
                .map(WriteOpBytes::Set)
                .map_err(|e| serde::de::Error::custom(format!("{e} (or \"auto\")"))),
        }
    }
}

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
            write_op_bytes: WriteOpBytes::Auto,
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
        if let WriteOpBytes::Set(b) = self.write_op_bytes
            && let Err(why) = check_write_op_bytes(b.bytes())
        {
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
    /// Which sealed region is reclaimed when none is free; under a
    /// [`ReclaimListener`](crate::ReclaimListener), which of the regions
    /// with the fewest live blocks.
    pub eviction: RegionEvictionKind,
    /// Without a [`ReclaimListener`](crate::ReclaimListener): re-insert
    /// blocks read since they were written when their region is reclaimed
    /// (at most a quarter of a region per reclaim). Under one, every block
    /// it wants is re-inserted and no other.
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
    /// Largest write operation, in bytes ([`DiskConfig::write_op_bytes`]
    /// resolved for the memory written from).
    pub write_op_bytes: u64,
}

impl DiskTierConfig {
    /// The configuration of the `[disk]` section `cfg` for `dirs` (the
    /// resolved directories) and `geometry`, writing blocks from memory in
    /// pages of `page_bytes` (the arena's).
    pub fn new(
        cfg: &DiskConfig,
        dirs: Vec<PathBuf>,
        geometry: Geometry,
        page_bytes: usize,
    ) -> Self {
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
            write_op_bytes: cfg.write_op_bytes.resolve(page_bytes),
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
            c.write_op_bytes = WriteOpBytes::Set(ByteSize(bad));
            assert!(c.validate().is_err(), "{bad}");
        }
        for good in [4096, 1 << 20, 64 << 20] {
            c.write_op_bytes = WriteOpBytes::Set(ByteSize(good));
            assert!(c.validate().is_ok(), "{good}");
        }
        let parsed: DiskConfig = toml::from_str("write_op_bytes = \"1MiB\"").unwrap();
        assert_eq!(parsed.write_op_bytes, WriteOpBytes::Set(ByteSize(1 << 20)));
        let parsed: DiskConfig = toml::from_str("write_op_bytes = 65536").unwrap();
        assert_eq!(parsed.write_op_bytes, WriteOpBytes::Set(ByteSize(64 << 10)));
        let err = toml::from_str::<DiskConfig>("write_op_bytes = \"big\"").unwrap_err();
        assert!(err.to_string().contains("auto"), "{err}");
    }

    #[test]
    fn auto_write_op_bytes_follow_the_page_size_and_a_set_size_wins() {
        let parsed: DiskConfig = toml::from_str("write_op_bytes = \"auto\"").unwrap();
        assert_eq!(parsed.write_op_bytes, WriteOpBytes::Auto);
        assert_eq!(DiskConfig::default().write_op_bytes, WriteOpBytes::Auto);
        let auto = WriteOpBytes::Auto;
        assert_eq!(auto.resolve(4096), DEFAULT_WRITE_OP_BYTES);
        assert_eq!(auto.resolve(2 << 20), HUGE_PAGE_WRITE_OP_BYTES);
        let set = WriteOpBytes::Set(ByteSize(256 << 10));
        assert_eq!(set.resolve(4096), 256 << 10);
        assert_eq!(set.resolve(2 << 20), 256 << 10);
        let geometry = Geometry::raw(4, 16 << 10).unwrap();
        let huge = DiskTierConfig::new(&parsed, Vec::new(), geometry, 2 << 20);
        assert_eq!(huge.write_op_bytes, HUGE_PAGE_WRITE_OP_BYTES);
        // Written back as it was read.
        let text = toml::to_string(&parsed).unwrap();
        assert!(text.contains("write_op_bytes = \"auto\""), "{text}");
    }
}
