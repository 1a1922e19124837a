//! [`ClientConfig`]: where the daemon is and what this client stores.

use std::path::PathBuf;
use std::time::Duration;

use kvtier_protocol::{Namespace, WireGeometry};

use crate::error::{ClientError, Result};

/// How long a client waits for each answer by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything [`Client::connect`](crate::Client::connect) and
/// [`AsyncClient::connect`](crate::AsyncClient::connect) need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// The daemon's Unix socket (`kvtier serve`'s socket path).
    pub socket_path: PathBuf,
    /// What the daemon stores this client's blocks under; blocks of two
    /// namespaces never mix.
    pub namespace: Namespace,
    /// The block shape; the daemon refuses one that contradicts what the
    /// namespace holds, and the client checks the arena against it.
    pub geometry: WireGeometry,
    /// How long to wait for each reply, for each `wait_layer`, and for
    /// sending a request. A timeout leaves the connection unusable (the
    /// reply may still come), so it is a bound for a stuck daemon, not a
    /// latency target.
    pub timeout: Duration,
    /// The metadata-service instance the blocks belong to in the cluster
    /// view, when the daemon runs the metadata service (`None`: one the
    /// daemon derives from the namespace; docs/node-protocol.md §4.1).
    pub instance: Option<String>,
}

impl ClientConfig {
    /// A configuration with the default timeout.
    pub fn new(
        socket_path: impl Into<PathBuf>,
        namespace: Namespace,
        geometry: WireGeometry,
    ) -> Self {
        Self {
            socket_path: socket_path.into(),
            namespace,
            geometry,
            timeout: DEFAULT_TIMEOUT,
            instance: None,
        }
    }

    /// Names the metadata-service instance of the blocks. Default: none
    /// (the daemon derives one from the namespace).
    pub fn with_instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = Some(instance.into());
        self
    }

    /// Sets the timeout. Default: [`DEFAULT_TIMEOUT`] (10 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Refuses what cannot work, before anything is connected.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.timeout.is_zero() {
            return Err(ClientError::Config("the timeout must be positive".into()));
        }
        let g = &self.geometry;
        if g.layers == 0 || g.block_bytes == 0 || g.layer_bytes == 0 {
            return Err(ClientError::Config(format!(
                "empty geometry: {} layers, {} block bytes, {} layer bytes",
                g.layers, g.block_bytes, g.layer_bytes
            )));
        }
        Ok(())
    }
}
