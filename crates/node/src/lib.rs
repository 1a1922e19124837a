//! # kvtier-node
//!
//! The node daemon's core: one [`Node`] per host hosts the block manager
//! over the shared-memory arena (G2), the disk log (G3) and, when
//! configured, a remote tier (G4); a [`NodeServer`] lets every engine
//! process of the host use it through a Unix socket (the protocol of
//! `kvtier-protocol`, docs/node-protocol.md).
//!
//! The data never passes through the socket: a client reserves arena
//! slots, fills them through its own mapping of the arena and commits
//! them; it loads blocks by having them made resident in G2 and pinned,
//! then copies them out itself, verifying each against the checksums the
//! arena publishes. The daemon decides placement: the manager's G2 pool is
//! the arena's only eviction authority (the arena itself never evicts).
//!
//! Each connection is a session with leases: its reservations and pins
//! are dropped when it disconnects (or dies), and after
//! `manager.lease_secs` without a commit or release otherwise, so a
//! half-filled slot never becomes readable and a dead client never keeps
//! blocks pinned.
//!
//! Every connection is bounded (docs/node-protocol.md §7, I19-I24): writes
//! to it time out, so a client that stops reading is closed and loses what
//! it holds; `Hello`, each frame and idle time have timeouts; frames,
//! `Hello` strings, connections and pins per session are capped, each
//! refusal with a clear `Error`; and a full descriptor table pauses
//! accepting instead of spinning.
//!
//! The block shape is the configured `[geometry]`, else the one the data
//! directory keeps ([`shape`]), else the first engine's: a [`NodeHost`]
//! opens the node when that engine's `Hello` arrives and keeps its shape
//! for the next start.
//!
//! Who may reach what the node keeps is decided at start ([`access`]): the
//! data, disk and socket directories are refused if another user can write
//! them and made private otherwise; the socket and the arena are the
//! daemon's user's alone, or shared with `manager.access_group`.

pub mod access;
mod config;
mod conn;
mod error;
mod host;
mod metrics;
mod node;
mod observer;
mod own_file;
mod peer;
mod peer_load;
mod peer_source;
mod secret;
mod sections;
mod server;
mod session;
pub mod shape;
mod shared_load;
mod stats;
#[cfg(feature = "test-support")]
pub mod test_support;

pub use access::check_dirs;
pub use config::{NodeOptions, node_name};
pub use conn::{HELLO_FRAME_MAX, HELLO_STRING_MAX, request_frame_limit};
pub use error::NodeError;
pub use host::{NodeHost, OpenHook};
pub use node::{Node, remote_config};
pub use observer::{
    ClusterBlock, ClusterLookup, CommitObserver, CommittedKey, PeerLocation, SessionNamespace,
    SharedLocation,
};
pub use peer::{LocationKey, NodePeer, PeerOptions, SharedKeys};
pub use peer_load::{LAYER_GROUPS, PeerReader};
pub use peer_source::{HeldBlocks, HeldRead, NodeSource};
pub use sections::{
    ManagerSectionConfig, NodeConfig, PeerSectionConfig, ServeConfig, SharedG4SectionConfig,
};
pub use server::NodeServer;
pub use shared_load::SharedReader;
pub use stats::NodeStats;
