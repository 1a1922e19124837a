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
    Memory(#[from] kvtier_arena::MemError),
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
    /// The peer server's cluster secret (`peer.secret_file`) is missing,
    /// not private to the daemon's user, or not 32 bytes.
    #[error(transparent)]
    PeerSecret(#[from] kvtier_peer::SecretError),
    /// The peer server could not listen on `peer.listen`.
    #[error("peer.listen {addr}: {source}")]
    PeerListen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
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
    /// A socket owned by another user is at the socket path. It is not
    /// connected to (it may be an impostor's listener) nor removed (it is
    /// not ours).
    #[error(
        "{path}: a socket owned by uid {owner}, not by this daemon's user (uid {euid}); it is not trusted and left alone: have its owner or root remove it, or set manager.socket"
    )]
    ForeignSocket {
        /// The socket path.
        path: PathBuf,
        /// The socket file's owner.
        owner: u32,
        /// This process's effective uid.
        euid: u32,
    },
    /// A directory the daemon keeps its data or its socket in is owned by
    /// another user, or its group or others may write it: they could
    /// replace what the daemon reads back or what engines connect to.
    /// Nothing was created or changed.
    #[error(
        "{path}: {why} (owner uid {owner}, mode {mode:04o}); the node keeps its data and socket only in directories no other user can write. Fix: `chown {euid} {path} && chmod 0700 {path}` (as root if needed), or set serve.data_dir, disk.dirs or manager.socket to such a directory"
    )]
    UnsafeDir {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Its permission bits.
        mode: u32,
        /// This process's effective uid.
        euid: u32,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A directory of the node could not be created, or its mode or group
    /// set.
    #[error("{op} {path}: {source}")]
    Dir {
        /// What was attempted.
        op: &'static str,
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
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
    /// The shape file could not be read or written.
    #[error("{op} the node's shape file {path}: {source}")]
    ShapeFile {
        /// What was attempted.
        op: &'static str,
        /// The shape file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The shape file exists but cannot be trusted or used.
    #[error(
        "the node's shape file {path} cannot be used: {why}; it keeps the block shape of the data beside it: fix it, or move the data directory away to start afresh"
    )]
    BadShapeFile {
        /// The shape file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The configured `[geometry]` is not the shape the data directory
    /// keeps: its blocks have the kept shape.
    #[error(
        "the configured [geometry] ({configured}) is not the shape this data directory keeps in {path} ({kept}); its stored blocks have the kept shape: remove [geometry] to use it, or use another data directory (or move this one away) to start afresh with the configured one"
    )]
    ShapeConflict {
        /// The shape file.
        path: PathBuf,
        /// The configured shape, in human terms.
        configured: String,
        /// The kept shape, in human terms.
        kept: String,
    },
    /// [`Node::open`](crate::Node::open) was given no shape: no
    /// `[geometry]` is configured and none is kept.
    #[error(
        "no block shape: configure [geometry] (see `kvtier shape`), or start the daemon with NodeHost, which learns it from the first engine's Hello"
    )]
    NoShape,
    /// A background task of the node panicked or was cancelled.
    #[error("a node task stopped unexpectedly")]
    TaskLost,
}
