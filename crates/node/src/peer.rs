//! The node's peer server: `[peer]` resolved ([`PeerOptions`]) and the
//! running server over the node's tiers ([`NodePeer`]), whose counters
//! join the node's `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kvtier_peer::{ClusterSecret, Identity, PeerServer, ServerConfig, ServerHandle, StatsHandle};
use kvtier_protocol::{KeyMap, Namespace, NamespaceKey, NodeSecret};

use crate::peer_source::{NodeSource, ServedCounters};
use crate::{NodeError, NodeHost, PeerSectionConfig};

/// `[peer]`, checked, with its secret read.
#[derive(Debug, Clone)]
pub struct PeerOptions {
    /// Where to listen.
    pub listen: SocketAddr,
    /// How the server runs: this node's identity and its limits.
    pub server: ServerConfig,
    /// Where other nodes reach the server, when `peer.advertise` says so;
    /// else see [`advertised`](Self::advertised).
    pub advertise: Option<SocketAddr>,
    /// The key of the cluster's location MACs, from the cluster secret.
    pub location_key: LocationKey,
    /// The keys of the cluster's shared G4, from the cluster secret.
    pub shared_keys: SharedKeys,
    /// How long a cluster lookup waits for the metadata service.
    pub lookup_timeout: Duration,
    /// How long a `Load` waits for the peers it reads blocks from.
    pub load_timeout: Duration,
}

/// The key a cluster's nodes make and check location MACs with
/// (docs/meta-api.md §10.2): `blake3::derive_key("kvtier location key
/// v1", cluster secret)`, so it never equals the peer handshake's key.
#[derive(Clone, PartialEq, Eq)]
pub struct LocationKey([u8; 32]);

impl std::fmt::Debug for LocationKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.write_str("LocationKey(..)")
    }
}

impl LocationKey {
    /// The key derivation's context: frozen (a new derivation takes a new
    /// context and a new location MAC version).
    const CONTEXT: &'static str = "kvtier location key v1";

    /// The location key of the cluster secret `secret`.
    pub fn of(secret: &ClusterSecret) -> Self {
        Self(secret.derive_key(Self::CONTEXT))
    }

    /// The location key of a cluster secret of these bytes.
    pub fn from_secret(secret: &[u8; 32]) -> Self {
        Self::of(&ClusterSecret::from_bytes(*secret))
    }

    /// The key's bytes, for a keyed hash.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

/// How the cluster keys a namespace's blocks in the shared G4
/// (docs/meta-api.md §10.3): a [`KeyMap`] of a namespace key derived, as a
/// node derives its own, from `blake3::derive_key("kvtier shared g4 key
/// v1", cluster secret)` instead of the node's secret. Every node of the
/// cluster derives the same shared key for one namespace (tenant salt and
/// rank included) and client key; nobody without the cluster secret can.
#[derive(Clone, PartialEq, Eq)]
pub struct SharedKeys(NodeSecret);

impl std::fmt::Debug for SharedKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.write_str("SharedKeys(..)")
    }
}

impl SharedKeys {
    /// The key derivation's context: frozen (a change orphans every shared
    /// object).
    const CONTEXT: &'static str = "kvtier shared g4 key v1";

    /// The shared keys of the cluster secret `secret`.
    pub fn of(secret: &ClusterSecret) -> Self {
        Self(NodeSecret::from_bytes(secret.derive_key(Self::CONTEXT)))
    }

    /// The map of namespace `ns`'s client keys to their shared keys.
    pub fn key_map(&self, ns: &Namespace) -> KeyMap {
        KeyMap::new(NamespaceKey::derive(&self.0, ns))
    }
}

/// `peer.advertise`, parsed; `None` when empty.
fn parse_advertise(advertise: &str) -> Result<Option<SocketAddr>, NodeError> {
    if advertise.is_empty() {
        return Ok(None);
    }
    advertise
        .parse()
        .map(Some)
        .map_err(|e| NodeError::Config(format!("peer.advertise {advertise:?}: {e}")))
}

impl PeerOptions {
    /// Whether other nodes can be told an address for this server:
    /// `peer.advertise` is set, or `listen` names one interface (a
    /// wildcard address says nothing about where the node is reached).
    pub fn can_advertise(&self) -> bool {
        self.advertise.is_some() || !self.listen.ip().is_unspecified()
    }

    /// The address peers reach the server at once it listens on `bound`:
    /// `peer.advertise`, else `bound` (the port `listen`'s 0 resolved to)
    /// unless `listen` is a wildcard address.
    pub fn advertised(&self, bound: SocketAddr) -> Option<SocketAddr> {
        self.advertise
            .or_else(|| (!self.listen.ip().is_unspecified()).then_some(bound))
    }
}

impl PeerOptions {
    /// The options of `section`, `None` when no peer server is configured
    /// (`listen` empty). Reads the cluster secret: a missing, unsafe or
    /// malformed file is an error naming it.
    pub fn from_config(section: &PeerSectionConfig) -> Result<Option<Self>, NodeError> {
        if !section.enabled() {
            return Ok(None);
        }
        section.validate()?;
        let listen = section
            .listen
            .parse()
            .map_err(|e| NodeError::Config(format!("peer.listen {:?}: {e}", section.listen)))?;
        let secret = ClusterSecret::from_file(&section.secret_file)?;
        let location_key = LocationKey::of(&secret);
        let shared_keys = SharedKeys::of(&secret);
        let node = match section.node_name.as_str() {
            "" => crate::node_name(),
            name => name.to_owned(),
        };
        let identity = Identity {
            cluster: section.cluster.clone(),
            node,
            secret,
        };
        let server = ServerConfig {
            max_connections: section.max_connections,
            handshake_timeout: Duration::from_millis(section.handshake_timeout_ms),
            write_timeout: Duration::from_millis(section.write_timeout_ms),
            ..ServerConfig::new(identity)
        };
        Ok(Some(Self {
            listen,
            server,
            advertise: parse_advertise(&section.advertise)?,
            location_key,
            shared_keys,
            lookup_timeout: Duration::from_millis(section.lookup_timeout_ms),
            load_timeout: Duration::from_millis(section.load_timeout_ms),
        }))
    }
}

/// What the node's metrics read of its peer server.
#[derive(Debug, Clone)]
pub(crate) struct PeerMetrics {
    pub(crate) server: StatsHandle,
    pub(crate) served: Arc<ServedCounters>,
}

/// A running peer server over a host's node; stopped by
/// [`shutdown`](Self::shutdown) (or when dropped).
#[derive(Debug)]
pub struct NodePeer {
    handle: ServerHandle,
}

impl NodePeer {
    /// Listens on `options.listen` and serves `host`'s tiers to peers of
    /// the cluster; the server's counters join the host's metrics. One
    /// peer server per host. Must run inside a tokio runtime.
    pub async fn start(host: &Arc<NodeHost>, options: PeerOptions) -> Result<Self, NodeError> {
        let listener = tokio::net::TcpListener::bind(options.listen)
            .await
            .map_err(|source| NodeError::PeerListen {
                addr: options.listen,
                source,
            })?;
        let served = Arc::new(ServedCounters::default());
        let source = Arc::new(NodeSource::new(host.clone(), served.clone()));
        let (cluster, node) = (
            options.server.identity.cluster.clone(),
            options.server.identity.node.clone(),
        );
        let handle = PeerServer::start(listener, options.server, source).map_err(|source| {
            NodeError::PeerListen {
                addr: options.listen,
                source,
            }
        })?;
        let metrics = PeerMetrics {
            server: handle.stats(),
            served,
        };
        if !host.set_peer_metrics(metrics) {
            return Err(NodeError::Config(
                "a peer server is already running for this node".into(),
            ));
        }
        tracing::info!(addr = %handle.local_addr(), %cluster, %node, "peer server listening");
        Ok(Self { handle })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.handle.local_addr()
    }

    /// The server's counters.
    pub fn stats(&self) -> kvtier_peer::ServerStats {
        self.handle.stats().snapshot()
    }

    /// Stops accepting and closes every peer connection (the blocks their
    /// reads held are let go), then returns.
    pub async fn shutdown(self) {
        self.handle.shutdown().await;
    }
}

#[cfg(test)]
mod shared_key_tests {
    use super::*;
    use kvtier_core::BlockHash;

    fn ns(salt: &[u8]) -> Namespace {
        Namespace {
            model: "m".into(),
            dtype: "bf16".into(),
            layout_version: 1,
            block_size_tokens: 16,
            tp_rank: 0,
            tp_size: 1,
            tenant_salt: Some(salt.to_vec()),
        }
    }

    /// Every holder of the cluster secret derives one shared key per
    /// (namespace, client key); another cluster, another tenant, or a
    /// node's own stored-key map never does.
    #[test]
    fn shared_keys_are_the_clusters_per_namespace() {
        let key = BlockHash(42);
        let a = SharedKeys::of(&ClusterSecret::from_bytes([1; 32]));
        let b = SharedKeys::of(&ClusterSecret::from_bytes([1; 32]));
        let other = SharedKeys::of(&ClusterSecret::from_bytes([2; 32]));
        let shared = a.key_map(&ns(b"t1")).stored(key);
        assert_eq!(shared, b.key_map(&ns(b"t1")).stored(key));
        assert_ne!(shared, other.key_map(&ns(b"t1")).stored(key));
        assert_ne!(shared, a.key_map(&ns(b"t2")).stored(key));
        let node = NodeSecret::from_bytes([1; 32]);
        let own = KeyMap::new(NamespaceKey::derive(&node, &ns(b"t1"))).stored(key);
        assert_ne!(shared, own, "the cluster secret is not used as is");
        assert_eq!(format!("{a:?}"), "SharedKeys(..)");
    }
}
