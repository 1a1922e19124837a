//! # kvtier-client
//!
//! The engine side of the node protocol: an engine process (vLLM, SGLang,
//! TensorRT-LLM worker) talks to the `kvtier serve` daemon over its Unix
//! socket and moves KV blocks through the daemon's shared-memory arena
//! itself, so each block is copied exactly once each way.
//!
//! - [`Client`] (blocking, `std`) and [`AsyncClient`] (tokio) make the
//!   same calls, each one round trip carrying a whole batch: `lookup`,
//!   `reserve`, `commit`, `abort`, `load` (then `wait_layer` for the
//!   daemon's `LayerReady` notifications), `release`, `remove`, `stats`.
//!   Both are thin transports over one sans-io core that builds requests,
//!   hands out request ids and matches answers (a reply naming another
//!   request, of the wrong type or size, is a typed error).
//! - [`Client::store`] reserves slots, fills each with a fused copy and
//!   checksum ([`ArenaClient::fill`](kvtier_arena::ArenaClient::fill)) and
//!   commits the checksums; [`Client::load_into`] loads, waits for every
//!   layer, copies each block out verified against the checksums the
//!   daemon published, and releases. A block that fails verification is a
//!   miss: the verified prefix ends there.
//! - A [`Load`] holds one `Load`'s answer: which keys are pinned where,
//!   how many layers are ready; it reads blocks or single layers.
//! - [`ClientConfig`] says where the socket is, the [`Namespace`] the blocks
//!   belong to and their [`WireGeometry`]; [`ClientError`] is every failure
//!   ([`ClientError::is_fatal`] ones mean: connect again).
//!
//! What each call sends and checks is in `docs/node-protocol.md`,
//! "Client library".
//!
//! ```no_run
//! use std::path::PathBuf;
//! use kvtier_client::{BlockHash, Client, ClientConfig, Namespace, WireGeometry};
//!
//! # fn main() -> Result<(), kvtier_client::ClientError> {
//! let namespace = Namespace {
//!     model: "llama3-8b".into(),
//!     dtype: "bf16".into(),
//!     layout_version: 1,
//!     block_size_tokens: 16,
//!     tp_rank: 0,
//!     tp_size: 1,
//!     tenant_salt: None,
//! };
//! let geometry = WireGeometry { layers: 32, block_bytes: 2 << 20, layer_bytes: 64 << 10 };
//! let mut client = Client::connect(ClientConfig::new(
//!     PathBuf::from("/run/kvtier/node.sock"),
//!     namespace,
//!     geometry,
//! ))?;
//!
//! // Store two blocks: one Reserve, two fused copy + checksum, one Commit.
//! let blocks = [vec![1u8; 2 << 20], vec![2u8; 2 << 20]];
//! let keys = [BlockHash(11), BlockHash(12)];
//! let batch: Vec<(BlockHash, &[u8])> = keys.iter().copied().zip(blocks.iter().map(|b| &b[..])).collect();
//! let outcomes = client.store(&batch)?;
//! assert!(outcomes.iter().all(|o| o.is_stored()));
//!
//! // Load them back: one Load, the LayerReady notifications, verified
//! // copies, one Release. `n` is the verified prefix.
//! let mut a = vec![0u8; 2 << 20];
//! let mut b = vec![0u8; 2 << 20];
//! let n = client.load_into(&keys, &mut [&mut a[..], &mut b[..]])?;
//! assert_eq!(n, 2);
//!
//! // Layer by layer: start computing on layer 0 while the rest arrives.
//! let load = client.load(&keys)?;
//! client.wait_layer(&load, 0)?;
//! let mut layer0 = vec![0u8; 64 << 10];
//! load.read_layer(0, 0, &mut layer0)?;
//! client.release_load(load)?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod asynchronous;
mod blocking;
mod config;
mod error;
mod load;
mod session;
mod store;

pub use asynchronous::AsyncClient;
pub use blocking::Client;
pub use config::{ClientConfig, DEFAULT_TIMEOUT};
pub use error::{ClientError, Result};
pub use load::Load;
pub use store::{BlockSource, StoreOutcome};

pub use kvtier_core::{BlockHash, BlockSums, Lookup};
pub use kvtier_protocol::{
    CommitEntry, CommitResult, Counter, ErrorCode, HelloOk, LoadResult, Namespace, ReserveResult,
    Slot, Tier, TierInfo, TierKind, WireGeometry,
};
