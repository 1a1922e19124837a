//! Typed errors of the wire layer.

use std::io;

use thiserror::Error;

use crate::ProtocolVersion;

/// Why a byte string is not a valid frame. Every decoding failure is one of
/// these; the decoder never panics.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The buffer ends before the frame does: wait for at least `needed`
    /// bytes in total (a lower bound while the length prefix is incomplete).
    #[error("truncated frame: need at least {needed} bytes")]
    Truncated {
        /// Bytes the buffer must hold before decoding can go on.
        needed: usize,
    },
    /// The length prefix declares more than [`crate::MAX_FRAME`] bytes; the
    /// body is neither read nor buffered.
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    Oversized {
        /// The declared length.
        len: u32,
        /// The limit, [`crate::MAX_FRAME`].
        max: u32,
    },
    /// The message type byte names no message of this protocol version.
    #[error("unknown message type {0:#04x}")]
    UnknownType(u8),
    /// The body does not parse as its message type: it ends early, a tag or
    /// count is out of range, or a string is not UTF-8. The text names what.
    #[error("malformed {message} body: {reason}")]
    Malformed {
        /// The message type being decoded.
        message: &'static str,
        /// What was wrong.
        reason: &'static str,
    },
    /// The message parsed but `count` bytes of its frame were left over.
    #[error("{count} trailing bytes after a {message} body")]
    TrailingBytes {
        /// The message type decoded.
        message: &'static str,
        /// Bytes left unparsed.
        count: usize,
    },
    /// A handshake message speaks another major version; the rest of its
    /// body is not interpreted, and the connection is to be closed.
    #[error("protocol version {got} is not supported (this side speaks {supported})")]
    WrongVersion {
        /// The version in the frame.
        got: ProtocolVersion,
        /// The version this crate speaks.
        supported: ProtocolVersion,
    },
}

/// Why a message could not be encoded.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EncodeError {
    /// The encoded frame would exceed [`crate::MAX_FRAME`]; split the batch.
    #[error("encoded frame of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// The length the frame would have had (type byte and body).
        len: usize,
        /// The limit, [`crate::MAX_FRAME`].
        max: u32,
    },
}

/// An error of [`crate::read_frame`] or [`crate::write_frame`].
#[derive(Debug, Error)]
pub enum FrameError {
    /// The stream failed or ended inside a frame.
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    /// The bytes read are not a valid frame.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The message to write cannot be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
}
