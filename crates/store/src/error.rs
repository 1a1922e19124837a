//! The error type of `kvtier-store`.

use thiserror::Error;

/// What can go wrong in the store.
#[derive(Debug, Error)]
pub enum StoreError {
    /// A block's length does not match the geometry.
    #[error("block is {got} bytes; the geometry needs {want}")]
    WrongLength {
        /// Bytes given.
        got: usize,
        /// Bytes per block.
        want: usize,
    },
    /// DRAM has no slot to free: every block is pinned, in use, or could not
    /// be written to disk.
    #[error("memory tier full: every block is pinned, in use or not yet on disk")]
    Full,
    /// The store was closed.
    #[error("the store is closed")]
    Closed,
    /// Invalid configuration.
    #[error(transparent)]
    Config(#[from] kvtier_core::CoreError),
    /// The memory tier failed.
    #[error("memory tier: {0}")]
    Memory(#[from] kvtier_mem::MemError),
    /// The disk tier failed.
    #[error("disk tier: {0}")]
    Disk(#[from] kvtier_disk::DiskError),
    /// The I/O engine could not be built.
    #[error("I/O engine: {0}")]
    Io(#[from] kvtier_io::IoError),
}
