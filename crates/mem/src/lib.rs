//! # kvtier-mem
//!
//! The memory tier (G2): a fixed arena of aligned block slots in a
//! shared-memory file, `/dev/shm/<name>`, that every engine process on the
//! node can map to read blocks without a copy through kvtier.
//!
//! - [`MemoryTier`] is the owner: it creates the arena, stores blocks
//!   ([`put`](MemoryTier::put), or [`reserve`](MemoryTier::reserve) a slot
//!   and fill it in place by direct I/O, then
//!   [`commit`](SlotReservation::commit)), serves verified copies
//!   ([`get`](MemoryTier::get)) and zero-copy [`BlockRef`]s. It never
//!   evicts: a full arena answers full, and its owner (the node's G2 pool,
//!   which holds the eviction policy) removes blocks. A removed block's
//!   slot is reused only when the last [`BlockRef`] to it is dropped.
//! - Every other process maps the arena through `kvtier-arena`, which holds
//!   the shared format this crate writes and the views others map it by
//!   ([`ArenaReader`](kvtier_arena::ArenaReader) read-only,
//!   [`ArenaClient`](kvtier_arena::ArenaClient) filling reserved slots in place).
//! - [`MemoryTierConfig`] comes from the `[memory]` configuration and the
//!   model [`Geometry`](kvtier_core::Geometry).
//!
//! An owner given a [`TableKey`] authenticates every slot table entry it
//! publishes (a keyed BLAKE3 MAC), and after a crash the next owner with
//! the same key adopts the arena instead of replacing it, keeping exactly
//! the published blocks whose entries authenticate and whose bytes verify
//! ([`MemoryTier::adoption`], [`ArenaAdoption`]).
//!
//! Every block carries the [`BlockSums`](kvtier_core::BlockSums) it was
//! first stored with; every copy out of shared memory is hashed as it is
//! copied, and a block that fails is a miss, never an answer. The shared
//! layout and its invariants are in `docs/memory-arena.md`.
//!
//! ```
//! use kvtier_arena::ArenaReader;
//! use kvtier_core::{BlockHash, BlockSums, Lookup};
//! use kvtier_mem::{MemoryTier, MemoryTierConfig, PutOutcome};
//!
//! # fn main() -> Result<(), kvtier_arena::MemError> {
//! let tier = MemoryTier::create(MemoryTierConfig {
//!     shm_name: format!("kvtier-doc-{}", std::process::id()),
//!     capacity_bytes: 1 << 20,
//!     block_bytes: 8192,
//!     layer_bytes: 2048,
//!     hugepages: false,
//!     table_key: None,
//!     access_group: None,
//! })?;
//! let key = BlockHash(42);
//! let block = vec![7u8; 8192];
//! let sums = BlockSums::compute(key, 2048, &block);
//! assert_eq!(tier.put(key, &block, &sums)?, PutOutcome::Stored);
//!
//! let mut out = vec![0u8; 8192];
//! assert_eq!(tier.get(key, &mut out), Lookup::Hit);
//! assert_eq!(out, block);
//!
//! // Another process would do exactly this, by name.
//! let reader = ArenaReader::open(tier.shm_name())?;
//! assert_eq!(reader.get(key, &mut out), Lookup::Hit);
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod config;
mod mac;
mod shm;
mod tier;

pub use config::{MemoryConfig, MemoryTierConfig};
pub use mac::TableKey;
pub use tier::{
    ArenaAdoption, BlockRef, MemoryStats, MemoryTier, PutOutcome, Reserve, SlotReservation,
};
