//! [`CommitObserver`]: how a component outside the node learns which
//! namespace a committed block belongs to (the stored key alone does not
//! say), so it can mirror the node's blocks elsewhere: `kvtier serve`
//! publishes them to the metadata service this way.

use kvtier_core::BlockHash;
use kvtier_protocol::Namespace;

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
/// the other without the namespace key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CommittedKey {
    /// The key the client named.
    pub client: BlockHash,
    /// The key the node stores the block under.
    pub stored: BlockHash,
}

/// Told of every block a session committed (it became readable in G2).
/// Called on the session's task after the commit: it must not block.
pub trait CommitObserver: Send + Sync {
    /// `blocks` were committed by a session of `ns`.
    fn committed(&self, ns: &SessionNamespace, blocks: &[CommittedKey]);
}
