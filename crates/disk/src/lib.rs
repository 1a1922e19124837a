//! # kvtier-disk
//!
//! The disk tier (G3): a log-structured region store over one or more
//! directories (one per device), written sequentially with direct I/O,
//! indexed in memory, checkpointed, recovered after crashes and verified on
//! every read. `docs/disk-format.md` describes the bytes on disk, the
//! write/acknowledge protocol, recovery and the crash cases.
//!
//! ## Main types
//!
//! - [`DiskTier`] is the tier: [`open`](DiskTier::open) it with a
//!   [`DiskTierConfig`] and an [`IoEngine`](kvtier_io::IoEngine) (io_uring or
//!   the pread/pwrite pool), then [`put_batch`](DiskTier::put_batch)
//!   [`BlockPut`](kvtier_tier::BlockPut)s (kvtier-tier's), and [`get_batch`](DiskTier::get_batch) /
//!   [`read_layers`](DiskTier::read_layers) into any
//!   [`DmaTarget`](kvtier_io::DmaTarget). Reads answer a
//!   [`Lookup`](kvtier_core::Lookup) per block: `Hit` (bytes verified),
//!   `Miss`, or `Corrupt` (bytes failed verification; dropped and counted;
//!   never served).
//! - Each directory holds a lock file, a meta file, a preallocated data file of
//!   fixed-size *regions*, and an index checkpoint. A region is a header
//!   plus block *slots* (slot header with the carried checksums, then the
//!   block's bytes). Each region life is block-major (a block, or one of
//!   its layers, is one contiguous read) or, with
//!   [`RegionLayout::Layer`], layer-major (layer `l` of all the region's
//!   slots is one contiguous row; format v2). See [`format`](mod@format).
//! - The in-memory [`index::Index`] maps a block key to its slot and block
//!   checksum in 32 bytes (about 40 bytes per block with table overhead),
//!   sharded under `parking_lot` mutexes.
//! - Writes fill the open region's buffer and write each appended extent
//!   with one operation; a per-directory reaper thread acknowledges extents
//!   in reservation order once written (module `writer`).
//! - When no region is free, one is reclaimed, never while a reader holds
//!   it (the latch in module `latch`). Under a [`ReclaimListener`] (the
//!   owner, the tier's one eviction authority) the region with the fewest
//!   live blocks goes and every block the listener still wants is
//!   re-inserted; the listener is told which blocks were dropped. On its
//!   own the tier reclaims FIFO or LRU, optionally re-inserting blocks read
//!   since they were written (module `reclaim`).
//! - Checkpoints (module `checkpoint`) and recovery (module `recover`)
//!   rebuild the index at open.
//! - Every device operation goes through the engine, syncs and checkpoint
//!   writes included, so a fault-injecting engine reaches them all; the
//!   first failed sync latches the whole tier (module `durability`): no
//!   later put or checkpoint is acknowledged until it is reopened.
//! - [`DiskStats`] are the counters; [`DiskError`] the one error type.
//!
//! ```no_run
//! use std::sync::Arc;
//! use kvtier_core::{BlockHash, BlockSums, Geometry, Lookup, RegionEvictionKind};
//! use kvtier_disk::{DiskTier, DiskTierConfig};
//! use kvtier_tier::BlockPut;
//! use kvtier_io::{AlignedBuf, PsyncEngine};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let geometry = Geometry::raw(4, 64 << 10)?;
//! let cfg = DiskTierConfig {
//!     dirs: vec!["/var/lib/kvtier/disk0".into()],
//!     capacity_per_dir: 64 << 20,
//!     region_size: 4 << 20,
//!     geometry,
//!     eviction: RegionEvictionKind::Fifo,
//!     reinsert_hot: true,
//!     checkpoint_interval: std::time::Duration::from_secs(30),
//!     sync: true,
//!     register_buffers: false,
//!     reset: false,
//!     buffers_per_dir: 2,
//!     layer_sums_cache: 16384,
//!     write_op_bytes: kvtier_disk::DEFAULT_WRITE_OP_BYTES,
//!     layout: kvtier_disk::RegionLayout::Block,
//!     prefill: true,
//! };
//! let tier = DiskTier::open(cfg, Arc::new(PsyncEngine::new(4, 32)?))?;
//! let key = BlockHash(7);
//! let data = vec![1u8; 64 << 10];
//! let sums = BlockSums::compute(key, 16 << 10, &data); // once, when the block enters kvtier
//! tier.put_batch(&[BlockPut { key, data: &data, sums: &sums, pinned: None }]).await[0].as_ref().unwrap();
//! let out = tier.get_batch(vec![(key, AlignedBuf::zeroed(64 << 10, 4096))]).await;
//! assert_eq!(out[0].1, Lookup::Hit);
//! tier.close().await?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

pub mod checkpoint;
mod config;
mod durability;
mod error;
pub mod format;
pub mod index;
pub mod latch;
mod layer_sums;
pub mod meta;
mod pool;
mod reader;
mod reclaim;
mod recover;
mod region;
mod stats;
mod store;
mod tier;
mod writer;

pub use config::{
    DEFAULT_WRITE_OP_BYTES, DiskConfig, DiskTierConfig, HUGE_PAGE_WRITE_OP_BYTES, WriteOpBytes,
};
pub use error::{DiskError, Result};
pub use format::RegionLayout;
pub use reclaim::ReclaimListener;
pub use stats::DiskStats;
pub use tier::DiskTier;
