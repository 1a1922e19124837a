//! The node's peer server: `[peer]` resolved ([`PeerOptions`]) and the
//! running server over the node's tiers ([`NodePeer`]), whose counters
//! join the node's `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kvtier_peer::{ClusterSecret, Identity, PeerServer, ServerConfig, ServerHandle, StatsHandle};

use crate::peer_source::{NodeSource, ServedCounters};
use crate::{NodeError, NodeHost, PeerSectionConfig};

/// `[peer]`, checked, with its secret read.
#[derive(Debug, Clone)]
pub struct PeerOptions {
    /// Where to listen.
    pub listen: SocketAddr,
    /// How the server runs: this node's identity and its limits.
    pub server: ServerConfig,
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
        Ok(Some(Self { listen, server }))
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
