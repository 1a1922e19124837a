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
    /// `namespace.digest()`: a stored key is the client key XOR this.
    pub digest: u128,
    /// The metadata-service instance the client named, if any.
    pub instance: Option<String>,
}

/// Told of every block a session committed (it became readable in G2).
/// Called on the session's task after the commit: it must not block.
pub trait CommitObserver: Send + Sync {
    /// `stored` (the node's keys) were committed by a session of `ns`.
    fn committed(&self, ns: &SessionNamespace, stored: &[BlockHash]);
}
