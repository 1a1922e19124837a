//! # kvtier-backend
//!
//! Data storage backends for the metadata service, each a
//! [`kvtier_meta::StorageBackend`]:
//!
//! - [`FilePool`]: block parts packed into a few large preallocated files
//!   on a local or shared file system (NFS, 3FS), extents of 4 KiB
//!   multiples from a per-file [`ExtentAllocator`];
//! - [`NodeStoreBackend`]: block parts in a kvtier node's own block store
//!   (`kvtier://node/...`), local node only for now, and [`NodeView`], which
//!   publishes the node's own blocks to the metadata service;
//! - [`ObjectBackend`]: one object per block part, in an S3-compatible
//!   store or as files in a shared directory;
//! - [`SharedG4Writer`]: writes the node's committed blocks to the
//!   cluster's shared G4 through the service's two-phase write.
//!
//! [`open_backend`] picks one by a storage's kind and URI;
//! [`attach_backend`] also restores its state from the metadata service and
//! attaches it (the startup path). URI formats,
//! allocation, persistence and health checks: `docs/storage-backends.md`.

pub mod allocator;
pub mod cluster;
pub mod file_pool;
pub mod location;
pub mod node_store;
pub mod node_view;
pub mod objects;
pub mod registry;
pub mod shared_g4;
mod uri;

pub use allocator::{Extent, ExtentAllocator, ReserveError};
pub use cluster::{ClusterLookupConfig, ClusterLookupStats, MetaClusterLookup, SharedLookup};
pub use file_pool::{EXTENT_ALIGN, FilePool, FilePoolOptions, PoolSpaceError, RestoreSummary};
/// A node's cluster identity (its peer server's), as
/// [`BackendOptions::peer_identity`] takes it.
pub use kvtier_peer::Identity as PeerIdentity;
pub use location::{ClusterNode, LocationKey, PeerFields};
pub use node_store::{NodeStoreBackend, PublishedBlock, node_block_hash, peer_spec, spec_peer};
pub use node_view::{NodeView, NodeViewConfig, NodeViewError, NodeViewSink, NodeViewStats};
pub use objects::{ObjectBackend, S3Options};
pub use registry::{AttachError, BackendOptions, attach_backend, open_backend, open_file_pool};
pub use shared_g4::{SHARED_SPEC, SharedG4Error, SharedG4Stats, SharedG4Writer, shared_block_key};
