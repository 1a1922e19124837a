//! Typed errors of the peer data plane.

use thiserror::Error;

use crate::frame::{ErrorCode, RefuseReason, Version};

/// Why a byte string is not a valid frame. The decoder never panics.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// A frame of length 0: no type byte.
    #[error("empty frame")]
    Empty,
    /// A frame longer than the limit where it was read (at most
    /// [`crate::MAX_FRAME`]); its body is not read.
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    Oversized {
        /// The declared (or encoded) length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A type byte that names no frame.
    #[error("unknown frame type {0:#04x}")]
    UnknownType(u8),
    /// The body does not parse as its frame type.
    #[error("malformed {frame} body: {reason}")]
    Malformed {
        /// The frame type being decoded.
        frame: &'static str,
        /// What was wrong.
        reason: &'static str,
    },
    /// The frame parsed with `count` bytes left over.
    #[error("{count} trailing bytes after a {frame} body")]
    Trailing {
        /// The frame type decoded.
        frame: &'static str,
        /// Bytes left unparsed.
        count: usize,
    },
}

/// Why a peer connection or request failed. A failed connection is not
/// used again (its stream may hold a late reply), so every variant but
/// [`PeerError::TooManyKeys`] and [`PeerError::Targets`] means: reconnect.
#[derive(Debug, Error)]
pub enum PeerError {
    /// The socket failed.
    #[error("peer i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The peer sent bytes that are not a valid frame.
    #[error("peer sent a bad frame: {0}")]
    Decode(#[from] DecodeError),
    /// The peer closed the connection.
    #[error("peer closed the connection")]
    Closed,
    /// The connect, handshake or request did not finish by its deadline.
    #[error("peer did not answer within the deadline")]
    Timeout,
    /// The server refused the handshake.
    #[error("peer refused the connection ({reason:?}): {message}")]
    Refused {
        /// Why, as the server said.
        reason: RefuseReason,
        /// The server's words.
        message: String,
    },
    /// The server's proof did not verify: it does not hold the cluster
    /// secret (or is not the node it claims to be).
    #[error("peer {node:?} failed authentication")]
    AuthFailed {
        /// The node name the server gave.
        node: String,
    },
    /// The server speaks another major version.
    #[error("peer speaks protocol {got}, this node {ours}")]
    WrongVersion {
        /// The server's version.
        got: Version,
        /// Ours.
        ours: Version,
    },
    /// The server answered a request with an error.
    #[error("peer error {code:?}: {message}")]
    Server {
        /// What failed.
        code: ErrorCode,
        /// The server's words.
        message: String,
    },
    /// A frame that has no place at this point of the conversation.
    #[error("peer sent {got} where {expected} was due")]
    Unexpected {
        /// The frame received.
        got: &'static str,
        /// What was due.
        expected: &'static str,
    },
    /// A request of more keys than [`crate::MAX_KEYS`] (nothing was sent;
    /// split the batch).
    #[error("{count} keys in one read; the limit is {}", crate::MAX_KEYS)]
    TooManyKeys {
        /// The keys asked.
        count: usize,
    },
    /// `read_into` was given another number of targets than keys
    /// (nothing was sent).
    #[error("{targets} targets for {wants} keys")]
    Targets {
        /// The keys asked.
        wants: usize,
        /// The targets given.
        targets: usize,
    },
    /// The connection failed earlier and cannot be used.
    #[error("the connection failed earlier; reconnect")]
    Broken,
    /// The pool skips this peer for now: it failed repeatedly and its
    /// backoff has not passed (nothing was sent).
    #[error("peer {node:?} is skipped after repeated failures")]
    Skipped {
        /// The peer's node name.
        node: String,
    },
    /// Every connection the pool may open to this peer stayed in use until
    /// the read's deadline (nothing was sent).
    #[error("every connection to peer {node:?} was busy until the deadline")]
    Busy {
        /// The peer's node name.
        node: String,
    },
    /// The server at the peer's address proved another node name.
    #[error("expected peer {expected:?} at its address, found {got:?}")]
    WrongNode {
        /// The node the pool was asked to read from.
        expected: String,
        /// The node that answered.
        got: String,
    },
}

/// Why a cluster secret could not be loaded.
#[derive(Debug, Error)]
pub enum SecretError {
    /// The file could not be opened or read.
    #[error("{op} the cluster secret {path}: {source}")]
    Io {
        /// What was attempted.
        op: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not one to trust, or not a secret.
    #[error("cluster secret {path} refused: {why}")]
    Refused {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        why: String,
    },
}
