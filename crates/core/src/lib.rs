//! # kvtier-core
//!
//! The vocabulary every other kvtier crate speaks. Nothing here performs I/O
//! or needs an async runtime.
//!
//! - [`BlockHash`] is the 128-bit identity of a KV block. It is either a
//!   *chained* hash built by [`HashChain`] from token ids and a [`Salt`], or an
//!   opaque *external* id handed to us by an engine or a trace
//!   ([`BlockHash::external`]). Both are first-class: every tier keys blocks by
//!   `BlockHash` and never looks inside it.
//! - [`Geometry`] turns a model's shape (layers, KV heads, head dim, dtype,
//!   tokens per block, tensor-parallel rank) into bytes per *object* (one
//!   layer's K or V of one block) and per block; [`ModelPreset`] names a few
//!   real models.
//! - [`Layout`] says how many blocks sit in one buffer (fully contiguous or
//!   layer-separate) and computes object offsets.
//! - [`HeadShards`] cuts a block into per-KV-head-range objects, *head
//!   shards*, keyed so that engines at any tensor-parallel size share them
//!   ([`shard`]).
//! - [`checksum`] is the block checksum every tier stores and verifies.
//! - [`Tier`] is a position in the ordered list of tiers (G1 the engine's
//!   device cache, then the node's configured tiers), the one tier type of
//!   the block manager, the wire and the binding; [`TierKind`] says what
//!   storage a position is.
//! - [`config`] is the machinery of the TOML configuration with `KVTIER_*`
//!   environment overrides ([`ByteSize`], `[geometry]`); each section's
//!   type lives in the crate that uses it.
//!
//! ```
//! use kvtier_core::{HashChain, ModelPreset, Salt};
//!
//! let geometry = ModelPreset::Llama3_8B.geometry(16);
//! assert_eq!(geometry.block_bytes(), 2 << 20); // 2 MiB per 16-token block
//!
//! let salt = Salt::for_geometry("meta-llama/Meta-Llama-3-8B", &geometry);
//! let mut chain = HashChain::new(&salt, 16);
//! let tokens: Vec<u32> = (0..40).collect();
//! let hashes = chain.extend(&tokens);
//! assert_eq!(hashes.len(), 2); // two full blocks; 8 tokens wait for more
//! ```

pub mod block_map;
pub mod chain_order;
pub mod checksum;
pub mod config;
pub mod error;
pub mod geometry;
pub mod hash;
pub mod layout;
pub mod lookup;
pub mod shard;
pub mod tier;

pub use block_map::{BlockHashHasher, BlockHashMap};
pub use checksum::{
    BlockChecksum, BlockSums, block_checksum, combine_layer_checksums, copy_layer_checksum,
    layer_checksum, layer_checksums,
};
pub use config::{ByteSize, GeometryConfig, GeometryDocument, IoEngineKind, RegionEvictionKind};
pub use error::{CoreError, Result};
pub use geometry::{Attention, Dtype, Geometry, KvPart, ModelPreset};
pub use hash::{BlockHash, HashChain, Salt};
pub use layout::Layout;
pub use lookup::Lookup;
pub use shard::{HeadShards, SHARED_TP_RANK, SHARED_TP_SIZE, blocks_in_prefix, virtual_block_ids};
pub use tier::{MAX_TIERS, Tier, TierKind};
