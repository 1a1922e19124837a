//! The crate's error type: failures to start or run the listeners.
//! Request-level failures never surface here; they are answered on the wire.

/// Errors of [`crate::MetaServer`].
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A listener could not be bound.
    #[error("cannot bind {what} listener on {addr}: {source}")]
    Bind {
        /// Which listener (`meta http`, `admin grpc`, ...).
        what: &'static str,
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Authentication is off and a listener is reachable from other hosts,
    /// without `allow_unauthenticated_remote`.
    #[error(
        "refusing to serve the {what} listener on {addr} without authentication: \
         anyone who can reach it could administer this server. Turn on API keys \
         (auth), bind a loopback address, or accept the exposure explicitly \
         (allow_unauthenticated_remote; meta.allow_unauthenticated_remote in kvtier's configuration)"
    )]
    UnauthenticatedRemote {
        /// Which listener (`meta http`, `admin grpc`, ...).
        what: &'static str,
        /// The address asked for.
        addr: std::net::SocketAddr,
    },
    /// The configuration is inconsistent.
    #[error("invalid server configuration: {0}")]
    Config(String),
    /// A listener task failed.
    #[error("{what} listener failed: {reason}")]
    Serve {
        /// Which listener.
        what: &'static str,
        /// What went wrong.
        reason: String,
    },
}

/// Result alias.
pub type Result<T, E = ServerError> = std::result::Result<T, E>;
