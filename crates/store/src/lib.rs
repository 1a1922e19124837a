//! # kvtier-store
//!
//! One [`Store`] over the node's memory tier (G2, [`kvtier_mem::MemoryTier`])
//! and disk tier (G3, [`kvtier_disk::DiskTier`]).
//!
//! - [`Store::put`] lands a block in DRAM and returns once it is readable.
//!   Its checksums are computed here, once, and travel with the block.
//! - When free DRAM slots fall below the low watermark, a background task
//!   *demotes* the coldest blocks: writes them behind to disk in batches and
//!   only then lets DRAM evict them, so a block is never in neither tier
//!   because of a failed or slow write ([`demote`]).
//! - [`Store::get`] serves from DRAM, else reads from disk straight into a
//!   reserved DRAM slot (promotion) and serves from there. Every byte is
//!   verified by the tier it comes from; a block that fails is a miss.
//! - [`Store::close`] stops the demoter, writes every DRAM-only block to disk
//!   and checkpoints the disk index, so a restart finds them.
//!
//! Counters ([`StoreStats`]) count hits and misses per tier, bytes, I/Os,
//! errors and checksum failures.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kvtier_store::StoreError> {
//! use kvtier_core::{BlockHash, Config};
//! let store = kvtier_store::Store::open(&Config::default()).await?;
//! let block = vec![7u8; store.geometry().block_bytes() as usize];
//! store.put(BlockHash(1), &block).await?;
//! let mut out = vec![0u8; block.len()];
//! assert!(store.get(BlockHash(1), &mut out).await?.is_some());
//! store.close().await?;
//! # Ok(()) }
//! ```

pub mod demote;
mod error;
mod read_target;
mod stats;
mod store;

pub use error::StoreError;
pub use stats::{StoreCounters, StoreStats};
pub use store::{Store, StoreOptions, Tier};
