//! [`DiskError`]: the one error type of `kvtier-disk`.
//!
//! Expected outcomes are not errors: a block that is absent or fails
//! verification is a [`Lookup`](kvtier_core::Lookup) (`Miss` / `Corrupt`).
//! Errors are what a caller must act on: a refused configuration, a
//! directory that cannot be used, a write that was not acknowledged.

use std::path::PathBuf;

use thiserror::Error;

/// Result alias of `kvtier-disk`.
pub type Result<T, E = DiskError> = std::result::Result<T, E>;

/// What can go wrong in the disk tier. Every variant that concerns a file or
/// directory names it.
#[derive(Debug, Error)]
pub enum DiskError {
    /// A file system call on a tier file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// An I/O-engine operation failed (registration, a write, a read).
    #[error("{path}: {source}")]
    Engine {
        /// The data file the operation was on.
        path: PathBuf,
        /// The cause.
        source: kvtier_io::IoError,
    },
    /// Preallocating the data file found the file system full.
    #[error("no space left in {dir} to reserve {bytes} bytes")]
    NoSpace {
        /// The directory.
        dir: PathBuf,
        /// Bytes that could not be reserved.
        bytes: u64,
    },
    /// A directory holds a tier written with another format or shape. Set
    /// `reset` in the configuration to wipe it instead.
    #[error(
        "{dir}: existing disk tier has {field} = {found}, configuration wants {expected} (set reset to wipe it)"
    )]
    FormatMismatch {
        /// The directory.
        dir: PathBuf,
        /// The field that differs.
        field: &'static str,
        /// The value on disk.
        found: String,
        /// The value the configuration asks for.
        expected: String,
    },
    /// A tier file exists but cannot be parsed (bad magic, bad checksum).
    #[error("{path}: {reason}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The configuration cannot describe a working tier.
    #[error("invalid disk tier configuration: {0}")]
    InvalidConfig(String),
    /// The directory failed an earlier write and takes no more writes (its
    /// data is still read).
    #[error("{dir}: directory failed an earlier write and is read-only until restart")]
    DirFailed {
        /// The directory.
        dir: PathBuf,
    },
    /// A sync (`fdatasync` of a data file, or of a checkpoint or meta file
    /// or its directory) failed earlier in this run. The durability of what
    /// was written since the previous sync is unknown, so the whole tier is
    /// latched: every later put and checkpoint is refused until it is
    /// reopened (reads go on, verified as always). The blocks whose
    /// acknowledgement waited for the failed sync get it too.
    #[error(
        "the disk tier is latched after a failed sync ({reason}); writes and checkpoints are refused until restart"
    )]
    SyncFailed {
        /// The failed sync: its file and error.
        reason: String,
    },
    /// Every directory has failed; nothing can be written.
    #[error("every disk tier directory has failed; writes are refused")]
    AllDirsFailed,
    /// No region of the directory is free or reclaimable right now (every
    /// one is being written, read or reclaimed).
    #[error("{dir}: no region can be reclaimed now (all are being written or read)")]
    NoRegion {
        /// The directory.
        dir: PathBuf,
    },
    /// Another tier (in this or another process) has the directory open.
    #[error("{dir} is in use by another disk tier (its lock file is held)")]
    Locked {
        /// The directory.
        dir: PathBuf,
    },
    /// The tier was closed.
    #[error("the disk tier is closed")]
    Closed,
    /// A block's bytes or checksums do not match the geometry.
    #[error("block {key} has {found} {what}, the geometry needs {expected}")]
    WrongLength {
        /// The block.
        key: kvtier_core::BlockHash,
        /// "bytes" or "layer checksums".
        what: &'static str,
        /// What was given.
        found: u64,
        /// What the geometry needs.
        expected: u64,
    },
    /// The write of a block did not complete (I/O error, short write, an
    /// earlier part of its region failed). The block was not acknowledged.
    #[error("{dir}: write of block {key} failed: {reason}")]
    WriteFailed {
        /// The directory.
        dir: PathBuf,
        /// The block.
        key: kvtier_core::BlockHash,
        /// The cause.
        reason: String,
    },
}

impl DiskError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DiskError::Io {
            path: path.into(),
            source,
        }
    }
}
