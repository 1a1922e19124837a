//! [`CommitObserver`]: how a component outside the node learns which
//! namespace a committed block belongs to (the stored key alone does not
//! say), so it can mirror the node's blocks elsewhere: `kvtier serve`
//! publishes them to the metadata service this way. [`ClusterLookup`] is
//! the other direction: how the node learns which of a session's keys
//! other nodes of the cluster hold, so its `Lookup` can answer them.

use std::net::SocketAddr;
use std::sync::Arc;

use kvtier_core::{BlockChecksum, BlockHash};
use kvtier_protocol::Namespace;
use kvtier_tier::BoxFuture;

/// What a session declared in its `Hello` about its blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionNamespace {
    /// The namespace of every block of the session.
    pub namespace: Namespace,
    /// The metadata-service instance the client named, if any.
    pub instance: Option<String>,
}

/// A committed block's two keys: the client's, and the one the node holds
/// it under (a keyed hash of the client's; the one cannot be computed from
/// the other without the namespace key), and its combined checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CommittedKey {
    /// The key the client named.
    pub client: BlockHash,
    /// The key the node stores the block under.
    pub stored: BlockHash,
    /// The block's combined checksum (`BlockSums::block`), as the commit
    /// verified it against the bytes: what a peer reading the block checks
    /// it against. 0 where it is not known (a key asked for, not
    /// committed).
    pub sum: BlockChecksum,
}

/// Told of every block a session committed (it became readable in G2).
/// Called on the session's task after the commit: it must not block.
pub trait CommitObserver: Send + Sync {
    /// `blocks` were committed by a session of `ns`.
    fn committed(&self, ns: &SessionNamespace, blocks: &[CommittedKey]);
}

/// The node's observers, told in the order they were added.
#[derive(Default)]
pub(crate) struct CommitObservers(parking_lot::RwLock<Vec<Arc<dyn CommitObserver>>>);

impl CommitObservers {
    pub(crate) fn add(&self, observer: Arc<dyn CommitObserver>) {
        self.0.write().push(observer);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.read().is_empty()
    }
}

impl CommitObserver for CommitObservers {
    fn committed(&self, ns: &SessionNamespace, blocks: &[CommittedKey]) {
        for o in self.0.read().iter() {
            o.committed(ns, blocks);
        }
    }
}

/// Where another node of the cluster holds a block: what a later `Load`
/// fetches it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerLocation {
    /// The node's name.
    pub node: String,
    /// Its peer server's address.
    pub addr: SocketAddr,
    /// The key that node holds the block under (its own keyed hash of the
    /// client key, not this node's).
    pub stored: BlockHash,
    /// The block's combined checksum, which the bytes read from the peer
    /// must match.
    pub sum: BlockChecksum,
}

/// Where the cluster's shared G4 holds a block (docs/meta-api.md §10.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedLocation {
    /// The object's URI in the shared store, as the write session named it.
    pub uri: String,
    /// The block's shared key, which the object's header must name and
    /// its sums are keyed by.
    pub shared: BlockHash,
}

/// Where the cluster holds one block: on another node, or in the shared
/// G4.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterBlock {
    /// In another node's tiers, read through its peer server.
    Peer(PeerLocation),
    /// In the cluster's shared G4, read from the store.
    Shared(SharedLocation),
}

/// Finds blocks on the other nodes of the cluster. Installed on the node by
/// `kvtier serve` ([`Node::set_cluster_lookup`](crate::Node::set_cluster_lookup))
/// when it has a metadata service and a cluster identity; the session's
/// `Lookup` asks it for the keys past the node's own prefix.
pub trait ClusterLookup: Send + Sync {
    /// Where the cluster holds the longest prefix of `keys` (each a client
    /// key with this node's stored key for it; `sum` is 0): one entry per
    /// key of the prefix, at most `keys.len()`, none for this node's own
    /// locations; another node's location is preferred to the shared G4's
    /// (a peer's DRAM or disk is faster than an object store). Bounded in time by the implementation: an unreachable
    /// metadata service answers an empty prefix, never an error.
    fn lookup<'a>(
        &'a self,
        ns: &'a SessionNamespace,
        keys: &'a [CommittedKey],
    ) -> BoxFuture<'a, Vec<ClusterBlock>>;

    /// The node holding each of `gone` (a client key of a session of `ns`
    /// and where this node's lookup located it) answered, over its
    /// authenticated peer connection, that it does not hold it: the
    /// location is stale. The implementation forgets it and has the
    /// service drop that one location, so the next lookup asks again and
    /// no node reads it anew. Not for a peer that is down, late or sent a
    /// corrupt block: those are the peer's health, not the location's.
    /// Bounded in time; by default nothing is done.
    fn missing<'a>(
        &'a self,
        ns: &'a SessionNamespace,
        gone: &'a [(BlockHash, PeerLocation)],
    ) -> BoxFuture<'a, ()> {
        let _ = (ns, gone);
        Box::pin(async {})
    }
}
