//! The error type of `kvtier-io`.

use std::io;
use std::path::PathBuf;
use thiserror::Error;

/// Result alias of `kvtier-io`.
pub type Result<T, E = IoError> = std::result::Result<T, E>;

/// What can go wrong in the I/O layer.
#[derive(Debug, Error)]
pub enum IoError {
    /// The engine could not be created (io_uring refused, threads not spawned).
    #[error("cannot start the {engine} I/O engine: {source}")]
    EngineSetup {
        /// Engine name.
        engine: &'static str,
        /// The cause.
        source: io::Error,
    },
    /// A file could not be opened, sized or registered.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// Preallocation found the file system full.
    #[error("{path}: no space left to reserve {bytes} bytes")]
    NoSpace {
        /// The file.
        path: PathBuf,
        /// Bytes that could not be reserved.
        bytes: u64,
    },
    /// An operation failed in the kernel.
    #[error("{kind} of {len} bytes at offset {offset} failed: {source}")]
    Op {
        /// The operation ([`IoKind::name`](crate::IoKind::name)).
        kind: &'static str,
        /// Offset in the file.
        offset: u64,
        /// Bytes asked for.
        len: u32,
        /// The cause (errno).
        source: io::Error,
    },
    /// An operation transferred fewer bytes than asked (for reads: the file
    /// ends early, e.g. it was truncated).
    #[error("short {kind} at offset {offset}: {done} of {len} bytes")]
    Short {
        /// The operation ([`IoKind::name`](crate::IoKind::name)).
        kind: &'static str,
        /// Offset in the file.
        offset: u64,
        /// Bytes asked for.
        len: u32,
        /// Bytes transferred.
        done: u32,
    },
    /// A file id that is not (or no longer) registered.
    #[error("file id {id} is not registered with the I/O engine")]
    NotRegistered {
        /// The id.
        id: u32,
    },
    /// The engine does not implement an optional operation.
    #[error("the {engine} I/O engine does not support {what}")]
    Unsupported {
        /// Engine name.
        engine: &'static str,
        /// The operation.
        what: &'static str,
    },
    /// A vectored op was refused before it reached any engine (see
    /// [`IoBatch::push_vectored`](crate::IoBatch::push_vectored)); nothing
    /// was added to the batch.
    #[error("{kind} at offset {offset} refused: {reason}")]
    InvalidVectored {
        /// The operation ([`IoKind::name`](crate::IoKind::name)).
        kind: &'static str,
        /// Offset in the file.
        offset: u64,
        /// What is wrong with it.
        #[source]
        reason: crate::VectoredError,
    },
    /// The engine has shut down.
    #[error("the I/O engine has shut down")]
    Closed,
}
