//! The error type of `kvtier-client`.
//!
//! Expected outcomes are return values: a block not stored is a shorter
//! `lookup` prefix or a `LoadResult::Miss`, a block that fails verification
//! is a `Lookup::Corrupt` (and ends `load_into`'s prefix), a full daemon is
//! `StoreOutcome::NoSpace`. `ClientError` is for the connection failing,
//! the daemon refusing or misbehaving, and caller mistakes.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use kvtier_arena::MemError;
use kvtier_protocol::{DecodeError, EncodeError, ErrorCode, FrameError};
use thiserror::Error;

/// Result alias of `kvtier-client`.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// What can go wrong talking to the node daemon.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The configuration cannot work (a zero timeout, an empty geometry).
    #[error("invalid client configuration: {0}")]
    Config(String),
    /// The daemon's socket could not be connected.
    #[error(
        "cannot connect to the node daemon at {path}: {source} (is `kvtier serve` running, and may this user open its socket?)"
    )]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// Reading or writing the connection failed.
    #[error("i/o error on the node daemon connection: {0}")]
    Io(#[source] io::Error),
    /// The daemon did not answer within the configured timeout. The reply
    /// may still come, so the connection is no longer usable.
    #[error("no answer from the node daemon within {0:?}; connect again")]
    Timeout(Duration),
    /// The daemon closed the connection (it stopped or restarted).
    #[error("the node daemon closed the connection; connect again")]
    Disconnected,
    /// The daemon sent bytes that are not a frame of the protocol.
    #[error("the node daemon sent an invalid frame: {0}")]
    Protocol(#[from] DecodeError),
    /// The request does not fit in one frame; split the batch.
    #[error("request too large: {0}")]
    Encode(#[from] EncodeError),
    /// The daemon answered with an `Error` message.
    #[error("the node daemon refused the request ({}): {message}", code_name(*.code))]
    Refused {
        /// The protocol's error code (`ErrorCode::GEOMETRY_MISMATCH`, ...).
        code: ErrorCode,
        /// The daemon's explanation.
        message: String,
    },
    /// A reply named another request than the one in flight.
    #[error("the node daemon answered request {got} while request {expected} was in flight")]
    WrongRequestId {
        /// The request in flight.
        expected: u64,
        /// The request the reply named.
        got: u64,
    },
    /// The daemon sent a valid message that makes no sense here: a reply
    /// of the wrong type, the wrong number of results, a slot outside the
    /// arena, a notification for a request never sent.
    #[error("unexpected message from the node daemon: {what}")]
    Unexpected {
        /// What was wrong.
        what: String,
    },
    /// Mapping or using the shared-memory arena failed (or a buffer of the
    /// wrong size was handed in).
    #[error("arena: {0}")]
    Arena(#[from] MemError),
    /// The daemon's arena does not hold blocks of this client's geometry.
    #[error("the node daemon's arena does not fit this client: {what}")]
    WrongGeometry {
        /// Which size disagrees.
        what: String,
    },
    /// An earlier error left the connection unusable (a timeout, a
    /// protocol error, a refusal that closes the connection).
    #[error(
        "the node daemon connection is unusable after an earlier error ({cause}); connect again"
    )]
    Broken {
        /// The earlier error.
        cause: String,
    },
    /// A layer of a load was read before the daemon said it is ready.
    #[error("layer {layer} of load {request_id} is not ready; wait for it first")]
    NotReady {
        /// The load.
        request_id: u64,
        /// The layer asked for.
        layer: u32,
    },
    /// An index past the keys of a load.
    #[error("key index {index} is out of range: the load has {len} keys")]
    NoSuchKey {
        /// The index handed in.
        index: usize,
        /// Keys in the load.
        len: usize,
    },
    /// A batch and its buffers disagree in number.
    #[error("{got} buffers for {expected} blocks")]
    BufferCount {
        /// Blocks in the batch.
        expected: usize,
        /// Buffers handed in.
        got: usize,
    },
}

impl ClientError {
    /// Whether the connection cannot be used after this error: connect
    /// again. False for caller mistakes and for refusals the daemon
    /// answers without closing the connection (`UNEXPECTED`, `INTERNAL`).
    pub fn is_fatal(&self) -> bool {
        match self {
            Self::Connect { .. }
            | Self::Io(_)
            | Self::Timeout(_)
            | Self::Disconnected
            | Self::Protocol(_)
            | Self::WrongRequestId { .. }
            | Self::Unexpected { .. }
            | Self::Broken { .. } => true,
            // The daemon closes the connection after these (node-protocol.md §6).
            Self::Refused { code, .. } => matches!(
                *code,
                ErrorCode::BAD_FRAME
                    | ErrorCode::WRONG_VERSION
                    | ErrorCode::HANDSHAKE
                    | ErrorCode::GEOMETRY_MISMATCH
                    | ErrorCode::BUSY
            ),
            Self::Config(_)
            | Self::Encode(_)
            | Self::Arena(_)
            | Self::WrongGeometry { .. }
            | Self::NotReady { .. }
            | Self::NoSuchKey { .. }
            | Self::BufferCount { .. } => false,
        }
    }
}

impl From<FrameError> for ClientError {
    fn from(e: FrameError) -> Self {
        match e {
            FrameError::Io(e) => Self::from_io(e),
            FrameError::Decode(e) => Self::Protocol(e),
            FrameError::Encode(e) => Self::Encode(e),
        }
    }
}

impl ClientError {
    /// Classifies an error of the connection: the peer gone is
    /// [`Disconnected`](Self::Disconnected), anything else [`Io`](Self::Io).
    /// (Timeouts are recognised by the caller, who knows the duration.)
    pub(crate) fn from_io(e: io::Error) -> Self {
        use io::ErrorKind::*;
        match e.kind() {
            UnexpectedEof | BrokenPipe | ConnectionReset | ConnectionAborted | NotConnected => {
                Self::Disconnected
            }
            _ => Self::Io(e),
        }
    }
}

/// The name of a protocol error code, for messages.
fn code_name(code: ErrorCode) -> String {
    let name = match code {
        ErrorCode::BAD_FRAME => "BAD_FRAME",
        ErrorCode::WRONG_VERSION => "WRONG_VERSION",
        ErrorCode::HANDSHAKE => "HANDSHAKE",
        ErrorCode::GEOMETRY_MISMATCH => "GEOMETRY_MISMATCH",
        ErrorCode::UNEXPECTED => "UNEXPECTED",
        ErrorCode::INTERNAL => "INTERNAL",
        ErrorCode::BAD_REQUEST => "BAD_REQUEST",
        ErrorCode::BUSY => "BUSY",
        _ => return format!("code {}", code.0),
    };
    format!("{name}, code {}", code.0)
}
