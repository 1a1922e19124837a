//! [`ServerConfig`]: where the four listeners bind and how requests are
//! admitted.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use kvtier_meta::leader::Elector;
use serde::{Deserialize, Serialize};

use crate::error::ServerError;

/// Default meta gRPC port (Tair KVCM `kvcm.service.rpc_port`).
pub const DEFAULT_META_GRPC_PORT: u16 = 6381;
/// Default meta HTTP port (`kvcm.service.http_port`).
pub const DEFAULT_META_HTTP_PORT: u16 = 6382;
/// Default admin gRPC port (`kvcm.service.admin_rpc_port`).
pub const DEFAULT_ADMIN_GRPC_PORT: u16 = 6491;
/// Default admin HTTP port (`kvcm.service.admin_http_port`).
pub const DEFAULT_ADMIN_HTTP_PORT: u16 = 6492;

/// How callers prove who they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthMode {
    /// Everything is open, as in Tair KVCM by default. Every call acts as an
    /// administrator.
    #[default]
    Disabled,
    /// Every request carries an API key (`Authorization: Bearer <key>` or
    /// `x-api-key: <key>`), checked with `MetaService::authenticate`.
    ApiKeys,
}

/// What a frontend that is not the leader does with the calls Tair KVCM
/// reserves for the leader (every meta call and most admin calls; see
/// [`crate::api::leader_only`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FollowerRequests {
    /// Serves them: every frontend of a shared index answers reads and
    /// writes, and only background work is the leader's (kvtier's
    /// default).
    #[default]
    Serve,
    /// Refuses them with `SERVER_NOT_LEADER` "Server is not leader", as
    /// Tair KVCM does, so clients go to the leader.
    Refuse,
}

/// More OpenMetrics text for `GET /metrics`, rendered at each scrape by
/// whoever embeds the server (the node daemon's figures under `kvtier
/// serve`): metric families only, without the final `# EOF`.
pub type ExtraMetrics = std::sync::Arc<dyn Fn() -> String + Send + Sync>;

/// Settings of a [`crate::MetaServer`].
#[derive(Clone)]
pub struct ServerConfig {
    /// Meta service over HTTP/JSON. Default `127.0.0.1:6382`.
    pub meta_http: SocketAddr,
    /// Meta service over gRPC. Default `127.0.0.1:6381`.
    pub meta_grpc: SocketAddr,
    /// Admin service over HTTP/JSON (also `/metrics`). Default `127.0.0.1:6492`.
    pub admin_http: SocketAddr,
    /// Admin service over gRPC. Default `127.0.0.1:6491`.
    pub admin_grpc: SocketAddr,
    /// Authentication. Default [`AuthMode::Disabled`].
    pub auth: AuthMode,
    /// Whether the server may start with [`AuthMode::Disabled`] on a
    /// listener that is not a loopback address, where anyone who can reach
    /// it is an administrator. Default false: such a configuration is
    /// refused ([`ServerConfig::check_exposure`]); true starts it with a
    /// warning in the log.
    pub allow_unauthenticated_remote: bool,
    /// Largest request body (HTTP) or message (gRPC) accepted; larger ones
    /// are refused with 413 / `OUT_OF_RANGE` before any work is done.
    /// Default 64 MiB. (The number of keys per request is capped separately
    /// by `MetaConfig::max_keys`.)
    pub max_body_bytes: usize,
    /// A request still running after this long is answered with a timeout
    /// (HTTP 504, gRPC `CANCELLED`/`DEADLINE_EXCEEDED`). Default 30 s.
    pub request_timeout: Duration,
    /// Node id reported by `GetClusterInfo` / `GetManagerClusterInfo` when
    /// the server makes its own election (no [`ServerConfig::elector`]);
    /// with one, the elector's id. Default `"kvtier-meta-0"`.
    pub node_id: String,
    /// Host name advertised to clients in cluster info (the bound IP when
    /// empty). Default empty.
    pub advertise_host: String,
    /// Whether the server runs the service's write-session reaper, so
    /// unfinished writes are reclaimed after their timeout. Default true.
    /// Ignored with a shared ledger, whose sessions the leader reaps
    /// (`MetaService::spawn_leader_work`).
    pub run_reaper: bool,
    /// Families appended to `GET /metrics`. Default none.
    pub extra_metrics: Option<ExtraMetrics>,
    /// This frontend's leader election; its node id is the one cluster
    /// info reports. Default none: the server elects itself, as
    /// [`ServerConfig::node_id`], over an in-memory lease (a single
    /// frontend, always the leader once started, as Tair KVCM with its
    /// memory lock).
    pub elector: Option<Arc<Elector>>,
    /// What a follower does with leader-only calls. Default
    /// [`FollowerRequests::Serve`].
    pub follower_requests: FollowerRequests,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("meta_http", &self.meta_http)
            .field("meta_grpc", &self.meta_grpc)
            .field("admin_http", &self.admin_http)
            .field("admin_grpc", &self.admin_grpc)
            .field("auth", &self.auth)
            .field(
                "allow_unauthenticated_remote",
                &self.allow_unauthenticated_remote,
            )
            .field("max_body_bytes", &self.max_body_bytes)
            .field("request_timeout", &self.request_timeout)
            .field("node_id", &self.node_id)
            .field("advertise_host", &self.advertise_host)
            .field("run_reaper", &self.run_reaper)
            .field("extra_metrics", &self.extra_metrics.is_some())
            .field("elector", &self.elector.as_ref().map(|e| e.node_id()))
            .field("follower_requests", &self.follower_requests)
            .finish()
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        // Loopback: an unauthenticated server is reachable from this host
        // only until an operator binds it elsewhere on purpose.
        let local = |port| SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        ServerConfig {
            meta_http: local(DEFAULT_META_HTTP_PORT),
            meta_grpc: local(DEFAULT_META_GRPC_PORT),
            admin_http: local(DEFAULT_ADMIN_HTTP_PORT),
            admin_grpc: local(DEFAULT_ADMIN_GRPC_PORT),
            auth: AuthMode::Disabled,
            allow_unauthenticated_remote: false,
            max_body_bytes: 64 << 20,
            request_timeout: Duration::from_secs(30),
            node_id: "kvtier-meta-0".into(),
            advertise_host: String::new(),
            run_reaper: true,
            extra_metrics: None,
            elector: None,
            follower_requests: FollowerRequests::Serve,
        }
    }
}

impl ServerConfig {
    /// All four listeners on `127.0.0.1` with OS-chosen ports: for tests.
    pub fn localhost_ephemeral() -> Self {
        let local = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        ServerConfig {
            meta_http: local,
            meta_grpc: local,
            admin_http: local,
            admin_grpc: local,
            ..ServerConfig::default()
        }
    }

    /// The listeners (by name) bound to an address other hosts may reach:
    /// anything but a loopback address (`0.0.0.0` and `::` included).
    pub fn remote_listeners(&self) -> Vec<(&'static str, SocketAddr)> {
        [
            ("meta http", self.meta_http),
            ("meta grpc", self.meta_grpc),
            ("admin http", self.admin_http),
            ("admin grpc", self.admin_grpc),
        ]
        .into_iter()
        .filter(|(_, a)| !a.ip().is_loopback())
        .collect()
    }

    /// Refuses a server that would be open to other hosts: authentication
    /// off on a non-loopback listener, unless
    /// [`ServerConfig::allow_unauthenticated_remote`] accepts it.
    pub fn check_exposure(&self) -> Result<(), ServerError> {
        let remote = self.remote_listeners();
        match remote.first() {
            Some((what, addr))
                if self.auth == AuthMode::Disabled && !self.allow_unauthenticated_remote =>
            {
                Err(ServerError::UnauthenticatedRemote { what, addr: *addr })
            }
            _ => Ok(()),
        }
    }
}
