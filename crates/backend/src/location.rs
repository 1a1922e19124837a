//! Authenticated node locations: what a cluster node adds to the URI of a
//! block it publishes so that another node may fetch it from it
//! (docs/meta-api.md §10.2).
//!
//! The metadata service keys a block by its 64-bit client key within an
//! instance, and engines may name their instance, so a location alone
//! proves nothing: a tenant naming another's instance, or anyone writing
//! locations through the meta API, could point a node at another tenant's
//! block by its stored key. A published location therefore carries a MAC
//! ([`location_mac`]) under a key only the cluster's nodes hold
//! ([`LocationKey`]), binding it to the exact namespace (salt and rank in
//! its digest), client key, stored key, block sum, node and peer address.
//! A node takes a location only if the MAC checks out for its own
//! session's namespace and the key it asked for.

use std::net::SocketAddr;

/// Bytes of a location MAC.
pub const MAC_BYTES: usize = 16;

/// Domain tag of every location MAC (NUL-terminated, so no other tag is a
/// prefix of it).
const MAC_TAG: &[u8] = b"kvtier-location-v1\0";

pub use kvtier_node::LocationKey;

/// Who publishes authenticated locations: the node's name, the address
/// peers reach its peer server at, and the cluster's location key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// The node's name (the authority of its URIs).
    pub node: String,
    /// Its peer server's address, as peers reach it.
    pub addr: SocketAddr,
    /// The cluster's location key.
    pub key: LocationKey,
}

/// What an authenticated location adds to a published block's URI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerFields {
    /// The block's combined checksum as the node holds it.
    pub sum: u64,
    /// The node's peer address.
    pub peer: SocketAddr,
    /// [`location_mac`] of the location.
    pub mac: [u8; MAC_BYTES],
}

/// What a location MAC covers.
#[derive(Debug, Clone, Copy)]
pub struct Located<'a> {
    /// The full namespace digest of the committing session
    /// (`Namespace::digest`).
    pub namespace: u128,
    /// The client key.
    pub client: u128,
    /// The key the node holds the block under.
    pub stored: u128,
    /// The block's combined checksum.
    pub sum: u64,
    /// The node's name.
    pub node: &'a str,
    /// Its peer address.
    pub peer: SocketAddr,
}

/// The first [`MAC_BYTES`] of BLAKE3-keyed(`key`, tag || namespace ||
/// client || stored || sum || len(node) || node || len(addr) || addr),
/// integers little-endian, lengths as `u64`.
pub fn location_mac(key: &LocationKey, l: &Located<'_>) -> [u8; MAC_BYTES] {
    let mut h = blake3::Hasher::new_keyed(key.as_bytes());
    h.update(MAC_TAG);
    h.update(&l.namespace.to_le_bytes());
    h.update(&l.client.to_le_bytes());
    h.update(&l.stored.to_le_bytes());
    h.update(&l.sum.to_le_bytes());
    let addr = l.peer.to_string();
    for s in [l.node, addr.as_str()] {
        h.update(&(s.len() as u64).to_le_bytes());
        h.update(s.as_bytes());
    }
    let mut mac = [0u8; MAC_BYTES];
    mac.copy_from_slice(&h.finalize().as_bytes()[..MAC_BYTES]);
    mac
}

/// Whether `mac` is `l`'s under `key`, compared in constant time.
pub fn verify_mac(key: &LocationKey, l: &Located<'_>, mac: &[u8; MAC_BYTES]) -> bool {
    let want = location_mac(key, l);
    // Constant time: fold every byte's difference.
    want.iter().zip(mac).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
}

impl ClusterNode {
    /// The fields this node publishes with a block of `namespace`.
    pub fn sign(&self, namespace: u128, client: u128, stored: u128, sum: u64) -> PeerFields {
        let l = Located {
            namespace,
            client,
            stored,
            sum,
            node: &self.node,
            peer: self.addr,
        };
        PeerFields {
            sum,
            peer: self.addr,
            mac: location_mac(&self.key, &l),
        }
    }
}
