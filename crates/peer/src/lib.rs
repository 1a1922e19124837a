//! # kvtier-peer
//!
//! The node-to-node data plane: one `kvtier serve` daemon reads blocks,
//! whole or a range of their layers, from another daemon of its cluster,
//! over TCP (docs/peer-protocol.md).
//!
//! - [`PeerServer`] accepts peers on a `TcpListener`, authenticates each
//!   ([`Identity`], [`ClusterSecret`]) and answers their reads from a
//!   [`BlockSource`] (the node's tiers; [`MemorySource`] holds blocks in a
//!   map).
//! - [`PeerClient`] connects, authenticates both ways and reads, into
//!   owned buffers ([`PeerClient::read`]) or straight into the caller's
//!   ([`PeerClient::read_into`]); each block is verified ([`Expect`],
//!   [`verify`]) before it is returned, and one that fails is a miss.
//!   Every request has a deadline.
//! - [`PeerHealth`] says when a peer that keeps failing is to be skipped.
//! - [`PeerPool`] is the reader a daemon keeps for all its peers: bounded,
//!   reused connections per peer (those idle too long closed in the
//!   background), health-based skipping of a peer that fails or sends
//!   blocks failing verification, per-peer [`PeerStats`].
//! - [`frame`] is the wire format: total decoding, bounded allocation.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use kvtier_core::{BlockHash, BlockSums};
//! use kvtier_peer::*;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let id = |node: &str| Identity {
//!     cluster: "prod".into(),
//!     node: node.into(),
//!     secret: ClusterSecret::from_bytes([9; 32]),
//! };
//! let source = Arc::new(MemorySource::new());
//! source.insert(BlockHash(1), 8, b"layer-0:layer-1:".to_vec());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let server = PeerServer::start(listener, ServerConfig::new(id("a")), source)?;
//!
//! let mut client = PeerClient::connect(server.local_addr(), &id("b"), Duration::from_secs(5)).await?;
//! let want = Want { key: BlockHash(1), expect: Expect::Consistent };
//! let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
//! let got = client.read(&[want], LayerRange::Span { start: 1, end: 2 }, deadline).await?;
//! assert_eq!(got[0].as_ref().unwrap().bytes, b"layer-1:");
//! server.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod auth;
mod client;
mod error;
pub mod frame;
mod health;
mod incoming;
mod pool;
mod server;
mod source;
mod stats;
mod verify;

pub use auth::{ClusterSecret, Role, SECRET_BYTES, Transcript};
pub use client::{Identity, PeerClient, ReadStats, Want};
pub use error::{DecodeError, PeerError, SecretError};
pub use frame::{BlockData, LayerRange, MAX_FRAME, MAX_KEYS, PEER_VERSION};
pub use health::{HealthPolicy, PeerHealth};
pub use pool::{LATENCY_BOUNDS_US, PeerAddr, PeerPool, PeerStats, PoolConfig, ReadOutcome};
pub use server::{PeerServer, ServerConfig, ServerHandle};
pub use source::{BlockSource, MemorySource, resolve_layers, slice_layers};
pub use stats::{ServerStats, StatsHandle};
pub use verify::{Expect, verify};
