//! [`NodeStoreBackend`]: block parts kept in a kvtier node's own block
//! store (its G2 DRAM and G3 disk tiers), named
//! `kvtier://<node>/<instance>/<key hex>-<location hex>/<spec>`, the
//! instance id and spec name escaped (`kvtier_meta::path_safe`).
//!
//! Only the node this process runs on holds its blocks here: its [`Node`]
//! is handed in. Another node's storage ([`NodeStoreBackend::remote`])
//! takes no writes; its health is whether the node's peer server answers
//! a handshake under the cluster identity (the address is in the storage's
//! `spec`, [`peer_spec`]), so a node that died turns unhealthy and the
//! metadata service stops answering its locations.
//!
//! A node store manages its own space (it evicts), so `create` only names
//! the parts; the client puts each part into the store under
//! [`node_block_hash`] of its instance, spec and key.

use kvtier_core::BlockHash;
use kvtier_meta::{
    BackendError, BackendFuture, BackendUsage, BlockKey, CreateRequest, StorageBackend,
};
use std::sync::Arc;

use kvtier_node::{Node, NodeHost};
use kvtier_peer::{Identity, PeerClient};
use std::net::SocketAddr;
use std::time::Duration;
use xxhash_rust::xxh3::xxh3_128;

use crate::location::{MAC_BYTES, PeerFields};
use crate::uri::{Uri, bad};
use kvtier_meta::path_safe::{check_component, escape_component, part_path, unescape_component};

/// The store key of one block part: the metadata service keys blocks per
/// instance by a 64-bit [`BlockKey`], a node store by a 128-bit
/// [`BlockHash`]; each (instance, spec) pair is its own namespace
/// (`xxh3_128(instance || 0 || spec)`, see [`BlockHash::external_in`]).
pub fn node_block_hash(instance: &str, spec: &str, key: BlockKey) -> BlockHash {
    let mut ns = Vec::with_capacity(instance.len() + 1 + spec.len());
    ns.extend_from_slice(instance.as_bytes());
    ns.push(0);
    ns.extend_from_slice(spec.as_bytes());
    BlockHash::external_in(xxh3_128(&ns), u128::from(key.0))
}

/// A name as it appears in a part URI: escaped by this version (decoded
/// here), or written as it was by versions before names were escaped
/// (anything that is not an exact escape is such a raw name).
fn name_in_uri(component: &str) -> String {
    unescape_component(component).unwrap_or_else(|| component.to_owned())
}

/// A block a node published to the metadata service itself (its own
/// blocks, committed by its engines, not written through a write
/// session): `kvtier://<node>/<instance>/<client key>-<stored key>/<spec>`,
/// both 32 hex digits, instance and spec escaped. The URI alone names the
/// block: the node holds it under the stored key (a keyed hash of the
/// client key that only the node can compute, docs/node-protocol.md
/// §11.1), and its metadata-service key is the client key's low 64 bits.
/// A node of a cluster adds `?sum=<16 hex>&peer=<addr>&mac=<32 hex>`
/// ([`PeerFields`], docs/meta-api.md §10.2): what another node needs to
/// fetch and verify it, authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedBlock {
    /// The metadata-service instance.
    pub instance: String,
    /// The location spec (`tp<rank>`).
    pub spec: String,
    /// The key the engine stored the block under.
    pub client_key: u128,
    /// The key the node holds the block under.
    pub stored: u128,
    /// The authenticated peer fields, on a cluster node's location.
    pub peer: Option<PeerFields>,
}

impl PublishedBlock {
    /// The key the node holds the block under.
    pub fn stored(&self) -> BlockHash {
        BlockHash(self.stored)
    }

    /// The block's key in the metadata service: the client key's low 64
    /// bits (Tair KVCM keys are 64-bit).
    pub fn key(&self) -> BlockKey {
        BlockKey(self.client_key as u64)
    }

    /// Its URI on node `node`.
    pub fn uri(&self, node: &str) -> Result<String, BackendError> {
        let parts = [
            escape_component(&self.instance),
            format!("{:032x}-{:032x}", self.client_key, self.stored),
            escape_component(&self.spec),
        ];
        for p in &parts {
            check_component(p).map_err(|e| bad(&format!("kvtier://{node}/"), e.to_string()))?;
        }
        let query = self.peer.map_or(String::new(), |p| {
            format!("?sum={:016x}&peer={}&mac={}", p.sum, p.peer, hex(&p.mac))
        });
        Ok(format!("kvtier://{node}/{}{query}", parts.join("/")))
    }

    /// Parses a URI of node `node`: `None` unless it is a published block's.
    pub fn parse(node: &str, uri: &str) -> Option<Self> {
        match parse_part_uri(Some(node), uri).ok()?.1 {
            PartName::Published(p) => Some(p),
            PartName::Written { .. } => None,
        }
    }

    /// Parses a published block's URI of any node: the node and the block.
    pub fn parse_any(uri: &str) -> Option<(String, Self)> {
        match parse_part_uri(None, uri).ok()? {
            (node, PartName::Published(p)) => Some((node, p)),
            (_, PartName::Written { .. }) => None,
        }
    }
}

/// Lower-case hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The peer fields of a published block's query, all three or none.
fn peer_fields(uri: &str, u: &Uri<'_>) -> Result<Option<PeerFields>, BackendError> {
    if u.query.is_empty() {
        return Ok(None);
    }
    if u.query.len() != 3 {
        return Err(bad(uri, "expected sum, peer and mac"));
    }
    let sum = u.param(uri, "sum")?;
    let sum = (sum.len() == 16)
        .then(|| u64::from_str_radix(sum, 16).ok())
        .flatten()
        .ok_or_else(|| bad(uri, "sum is not 16 hex digits"))?;
    let peer = u
        .param(uri, "peer")?
        .parse()
        .map_err(|_| bad(uri, "peer is not a socket address"))?;
    let mac = u.param(uri, "mac")?;
    let mut out = [0u8; MAC_BYTES];
    if mac.len() != 2 * MAC_BYTES || !mac.is_ascii() {
        return Err(bad(uri, "mac is not 32 hex digits"));
    }
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&mac[2 * i..2 * i + 2], 16)
            .map_err(|_| bad(uri, "mac is not 32 hex digits"))?;
    }
    Ok(Some(PeerFields {
        sum,
        peer,
        mac: out,
    }))
}

/// What a part URI of a node names.
enum PartName {
    /// A part written through a metadata-service write session.
    Written {
        instance: String,
        spec: String,
        key: BlockKey,
    },
    /// A block the node published itself.
    Published(PublishedBlock),
}

/// Splits `kvtier://<node>/<instance>/<a>-<b>/<spec>[?<peer fields>]`:
/// a written part's `<a>` is the 16-digit key and `<b>` the location id
/// (no query), a published block's both are 32 digits. With `node`, the
/// authority must be it.
fn parse_part_uri(node: Option<&str>, uri: &str) -> Result<(String, PartName), BackendError> {
    let u = Uri::parse(uri)?;
    if u.scheme != "kvtier" {
        return Err(bad(uri, "not a kvtier:// URI"));
    }
    if let Some(node) = node.filter(|n| u.authority != *n) {
        return Err(bad(uri, format!("not on node {node}")));
    }
    let authority = u.authority.to_owned();
    // /<instance>/<key>-<loc>/<spec>; an instance of an URI written
    // before names were escaped may contain '/'.
    let path = u.path.strip_prefix('/').unwrap_or(u.path);
    let mut it = path.rsplitn(3, '/');
    let (Some(spec), Some(key_loc), Some(instance)) = (it.next(), it.next(), it.next()) else {
        return Err(bad(uri, "expected /<instance>/<key>-<location>/<spec>"));
    };
    if spec.is_empty() || instance.is_empty() {
        return Err(bad(uri, "empty instance or spec"));
    }
    let (instance, spec) = (name_in_uri(instance), name_in_uri(spec));
    let (a, b) = key_loc
        .split_once('-')
        .ok_or_else(|| bad(uri, "expected <key hex>-<location hex>"))?;
    if a.len() == 32 && b.len() == 32 {
        let hex = |h: &str| u128::from_str_radix(h, 16).ok();
        let (Some(client_key), Some(stored)) = (hex(a), hex(b)) else {
            return Err(bad(uri, "expected <client key hex>-<stored key hex>"));
        };
        let peer = peer_fields(uri, &u)?;
        return Ok((
            authority,
            PartName::Published(PublishedBlock {
                instance,
                spec,
                client_key,
                stored,
                peer,
            }),
        ));
    }
    if !u.query.is_empty() {
        return Err(bad(uri, "unexpected query"));
    }
    let key = u64::from_str_radix(b, 16)
        .ok()
        .and_then(|_| u64::from_str_radix(a, 16).ok())
        .ok_or_else(|| bad(uri, "expected <key hex>-<location hex>"))?;
    Ok((
        authority,
        PartName::Written {
            instance,
            spec,
            key: BlockKey(key),
        },
    ))
}

/// The `spec` of a node's storage record: where its peer server is.
pub fn peer_spec(addr: SocketAddr) -> serde_json::Value {
    serde_json::json!({ "peer": addr.to_string() })
}

/// The peer address in a node storage's `spec`, if it has a valid one.
pub fn spec_peer(spec: Option<&serde_json::Value>) -> Option<SocketAddr> {
    spec?.get("peer")?.as_str()?.parse().ok()
}

/// How long a remote node's health probe may take to connect and finish
/// the handshake.
const PROBE_WITHIN: Duration = Duration::from_secs(2);

/// A storage on one kvtier node.
pub struct NodeStoreBackend {
    node: String,
    /// The node daemon's core when `node` is the local node (open once
    /// its block shape is known).
    local: Option<Arc<NodeHost>>,
    /// Another node's peer server and this node's cluster identity: what
    /// its health is probed with.
    peer: Option<(SocketAddr, Identity)>,
}

impl std::fmt::Debug for NodeStoreBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeStoreBackend")
            .field("node", &self.node)
            .field("local", &self.local.is_some())
            .field("peer", &self.peer.as_ref().map(|(a, _)| a))
            .finish()
    }
}

/// One parsed part URI.
#[derive(Debug)]
struct Part {
    hash: BlockHash,
}

impl NodeStoreBackend {
    /// The backend of the local node `node`, over its blocks.
    pub fn local(node: impl Into<String>, store: Arc<Node>) -> Self {
        Self::local_host(node, NodeHost::of(store))
    }

    /// The backend of the local node `node` of `host`, whose node may
    /// still wait for its block shape (until then every call is
    /// [`BackendError::Unavailable`]).
    pub fn local_host(node: impl Into<String>, host: Arc<NodeHost>) -> Self {
        NodeStoreBackend {
            node: node.into(),
            local: Some(host),
            peer: None,
        }
    }

    /// The backend of another node: no writes, no reads through the
    /// service; healthy while its peer server at `peer` answers a handshake
    /// made as the identity given (without one: always unavailable).
    pub fn remote(node: impl Into<String>, peer: Option<(SocketAddr, Identity)>) -> Self {
        NodeStoreBackend {
            node: node.into(),
            local: None,
            peer,
        }
    }

    /// Whether the remote node's peer server answers a handshake.
    async fn probe_peer(&self) -> Result<(), BackendError> {
        let Some((addr, me)) = &self.peer else {
            return Err(BackendError::Unavailable(format!(
                "node {} has no peer address known to this node's cluster",
                self.node
            )));
        };
        PeerClient::connect(*addr, me, PROBE_WITHIN)
            .await
            .map(drop)
            .map_err(|e| BackendError::Unavailable(format!("node {} at {addr}: {e}", self.node)))
    }

    /// The node this backend stores on.
    pub fn node(&self) -> &str {
        &self.node
    }

    fn store(&self) -> Result<&Node, BackendError> {
        let Some(host) = &self.local else {
            return Err(BackendError::Unavailable(format!(
                "no data plane to node {} yet",
                self.node
            )));
        };
        host.node().map(|n| &**n).ok_or_else(|| {
            BackendError::Unavailable(format!(
                "node {} has no block shape yet (no engine has connected)",
                self.node
            ))
        })
    }

    /// `kvtier://<node>/<rel>`, `rel` from [`part_path`] (instance and
    /// spec escaped).
    fn uri(&self, r: &CreateRequest) -> Result<String, BackendError> {
        let rel = part_path(&r.instance, r.key, r.location, &r.spec)
            .map_err(|e| bad(&format!("kvtier://{}/", self.node), e.to_string()))?;
        Ok(format!("kvtier://{}/{rel}", self.node))
    }

    fn parse(&self, uri: &str) -> Result<Part, BackendError> {
        let (_, name) = parse_part_uri(Some(&self.node), uri)?;
        Ok(Part {
            hash: match name {
                PartName::Written {
                    instance,
                    spec,
                    key,
                } => node_block_hash(&instance, &spec, key),
                PartName::Published(p) => p.stored(),
            },
        })
    }

    fn check_open(store: &Node) -> Result<(), BackendError> {
        if store.is_closed() {
            return Err(BackendError::Unavailable("node store is closed".into()));
        }
        Ok(())
    }
}

impl StorageBackend for NodeStoreBackend {
    fn create<'a>(
        &'a self,
        requests: &'a [CreateRequest],
    ) -> BackendFuture<'a, Result<Vec<String>, BackendError>> {
        Box::pin(async move {
            Self::check_open(self.store()?)?;
            requests.iter().map(|r| self.uri(r)).collect()
        })
    }

    fn delete<'a>(
        &'a self,
        uris: &'a [String],
    ) -> BackendFuture<'a, Vec<Result<(), BackendError>>> {
        Box::pin(async move {
            uris.iter()
                .map(|u| {
                    let store = self.store()?;
                    let part = self.parse(u)?;
                    store.manager().remove(&[part.hash]);
                    Ok(())
                })
                .collect()
        })
    }

    fn exist<'a>(
        &'a self,
        uris: &'a [String],
    ) -> BackendFuture<'a, Result<Vec<bool>, BackendError>> {
        Box::pin(async move {
            let store = self.store()?;
            uris.iter()
                .map(|u| Ok(store.contains(self.parse(u)?.hash)))
                .collect()
        })
    }

    fn usage(&self) -> BackendFuture<'_, Result<BackendUsage, BackendError>> {
        Box::pin(async move {
            let store = self.store()?;
            let (blocks, capacity) = store.usage();
            let block = store.geometry().block_bytes();
            Ok(BackendUsage {
                used_bytes: blocks * block,
                capacity_bytes: Some(capacity * block),
                objects: blocks,
            })
        })
    }

    fn health(&self) -> BackendFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            if self.local.is_none() {
                return self.probe_peer().await;
            }
            Self::check_open(self.store()?)
        })
    }
}
