//! [`RemoteError`]: the one error type of `kvtier-remote`.
//!
//! Expected read outcomes are not errors: an absent block is
//! [`RemoteRead::Miss`](crate::RemoteRead::Miss), a block that fails
//! verification is [`RemoteRead::Corrupt`](crate::RemoteRead::Corrupt).
//! Errors are what a caller must act on: a configuration that cannot work, a
//! block it handed over that does not match its checksums, a store that does
//! not answer or refuses.

use kvtier_core::BlockHash;
use thiserror::Error;

/// What can go wrong in the remote tier.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RemoteError {
    /// The tier URL cannot be used.
    #[error("bad remote tier URL {url:?}: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The configuration cannot describe a working tier (or the store client
    /// could not be built from it).
    #[error("invalid remote tier configuration: {0}")]
    Config(String),
    /// A block handed to `put_batch` does not match its checksums (or its
    /// checksums do not match each other). Nothing was written.
    #[error("block data does not match its checksums")]
    Corrupt,
    /// A block's bytes or checksums do not match the geometry.
    #[error("block {key} has {found} {what}, the geometry needs {expected}")]
    WrongLength {
        /// The block.
        key: BlockHash,
        /// "bytes" or "layer checksums".
        what: &'static str,
        /// What was given.
        found: u64,
        /// What the geometry needs.
        expected: u64,
    },
    /// A layer range outside the geometry (or empty).
    #[error("layer range {start}..{end} is not a non-empty range within {layers} layers")]
    BadRange {
        /// First layer asked for.
        start: u32,
        /// One past the last layer asked for.
        end: u32,
        /// Layers of the geometry.
        layers: u32,
    },
    /// The store did not answer in time, the connection failed, or it
    /// answered with a server error (retries included). Worth retrying later.
    #[error("remote store unavailable: {0}")]
    Unavailable(String),
    /// The store refused the request for good (permission denied, not
    /// authenticated, unsupported operation, invalid path).
    #[error("remote store refused the request: {0}")]
    Rejected(String),
}

impl RemoteError {
    /// Maps an `object_store` error (other than `NotFound`, which callers
    /// treat as a miss) to a tier error.
    pub(crate) fn from_store(op: &str, e: object_store::Error) -> Self {
        use object_store::Error as E;
        match e {
            E::PermissionDenied { .. }
            | E::Unauthenticated { .. }
            | E::NotSupported { .. }
            | E::NotImplemented
            | E::InvalidPath { .. }
            | E::UnknownConfigurationKey { .. } => RemoteError::Rejected(format!("{op}: {e}")),
            other => RemoteError::Unavailable(format!("{op}: {other}")),
        }
    }
}
