//! [`NodeError`]: why the node could not start, serve or stop.

use std::path::PathBuf;

/// Why the node could not start, serve or stop.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The `[manager]` section (or a section it builds on) cannot work.
    #[error("invalid node configuration: {0}")]
    Config(String),
    /// The configuration did not resolve.
    #[error(transparent)]
    Core(#[from] kvtier_core::CoreError),
    /// The arena could not be created.
    #[error(transparent)]
    Memory(#[from] kvtier_mem::MemError),
    /// The disk tier could not be opened or closed.
    #[error(transparent)]
    Disk(#[from] kvtier_disk::DiskError),
    /// The I/O engine could not start.
    #[error(transparent)]
    Io(#[from] kvtier_io::IoError),
    /// The remote tier could not be opened.
    #[error(transparent)]
    Remote(#[from] kvtier_remote::RemoteError),
    /// The block manager refused.
    #[error(transparent)]
    Manager(#[from] kvtier_manager::manager::ManagerError),
    /// The event publisher could not start.
    #[error(transparent)]
    Events(#[from] kvtier_manager::events::EventError),
    /// A network event sink (NATS, ZMQ) could not connect or bind.
    #[error(transparent)]
    EventSink(#[from] kvtier_events::SinkError),
    /// Another live daemon answers on the socket path.
    #[error("{path}: another kvtier daemon is serving on this socket")]
    SocketInUse {
        /// The socket path.
        path: PathBuf,
    },
    /// Something other than a socket exists at the socket path; it is left
    /// alone.
    #[error("{path}: exists and is not a socket; remove it or set manager.socket")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// A file system call on the socket path failed.
    #[error("{op} {path}: {source}")]
    Socket {
        /// What was attempted.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The secret file could not be read or made.
    #[error("{op} the node secret {path}: {source}")]
    Secret {
        /// What was attempted.
        op: &'static str,
        /// The secret file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The secret file exists but cannot be trusted or used.
    #[error("the node secret {path} cannot be used: {why}")]
    BadSecret {
        /// The secret file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// A background task of the node panicked or was cancelled.
    #[error("a node task stopped unexpectedly")]
    TaskLost,
}
