//! # kvtier-manager
//!
//! The node block manager (Dynamo KVBM semantics, Tutti's I/O scheduler):
//! one pool of blocks per tier (G2 host DRAM, G3 disk, G4 remote; an
//! engine's GPU cache, G1, lives in the engine in front of the node), the
//! block lifecycle `Reset -> Partial -> Complete -> Registered` behind RAII
//! handles, a registry that deduplicates by block hash,
//! placement (eviction policies, watermarks, cascade offload, admission),
//! a transfer engine with one queue per path, the slack-aware I/O
//! scheduler with layer-wise loading, and stored / removed events.
//!
//! The manager does not know the server or the socket; the tiers' bytes
//! live behind kvtier-tier's `TierStore` trait (`kvtier-mem`'s arena,
//! `kvtier-disk`'s log, `kvtier-remote`'s object store), held as one
//! ordered [`TierList`] and reached through the [`Tier`]-keyed seams of
//! this crate. G2 is the
//! fastest tier: engine processes fill and read its arena slots themselves
//! ([`manager::HostReservation`]).

pub mod admission;
pub mod block;
pub mod events;
pub mod manager;
pub mod placement;
pub use kvtier_policy as policy;
pub mod pool;
pub mod registry;
pub mod scheduler;
#[cfg(feature = "test-support")]
pub mod test_support;
pub mod tier;
pub mod transfer;

pub use tier::{Tier, TierList, TransferPath};
