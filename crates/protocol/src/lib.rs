//! # kvtier-protocol
//!
//! The wire layer of the node protocol: what engine processes and the
//! `kvtier serve` daemon say to each other over a local socket. Block bytes
//! never travel here; they move through the shared-memory arena, and these
//! messages hand out and take back arena slots.
//!
//! A frame is a `u32` little-endian length, a `u8` message type and the
//! body ([`Message`]). Decoding is total: every byte string gives a message
//! or a typed [`DecodeError`], never a panic, and allocates in proportion
//! to the frame (a declared count is checked against the bytes present).
//! The layouts, version rules and numbered invariants are in
//! `docs/node-protocol.md`.
//!
//! ```
//! use kvtier_core::BlockHash;
//! use kvtier_protocol::{KeysRequest, Message};
//!
//! let msg = Message::Lookup(KeysRequest { request_id: 7, keys: vec![BlockHash(1), BlockHash(2)] });
//! let frame = msg.to_frame()?;
//! assert_eq!(frame.len(), 4 + 1 + 8 + 4 + 2 * 16);
//! assert_eq!(Message::from_frame(&frame)?, msg);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod frame;
mod keys;
mod message;
mod wire;

pub use error::{DecodeError, EncodeError, FrameError};
pub use frame::{LEN_BYTES, Message, read_frame, write_frame};
pub use keys::{KEY_BYTES, KeyMap, NamespaceKey, NodeSecret};
pub use kvtier_core::TierKind;
pub use message::{
    Ack, Commit, CommitEntry, CommitOk, CommitResult, Counter, Error, ErrorCode, Hello, HelloOk,
    KeysRequest, LayerReady, LoadOk, LoadResult, LookupOk, Namespace, OPENING_INTERVAL_MS, Opening,
    ProtocolVersion, ReserveOk, ReserveResult, Slot, Stats, StatsOk, Tier, TierInfo, WireGeometry,
};

/// The largest frame, counted without the length prefix (type byte and
/// body): 16 MiB. Large enough for a batch of a million keys, small enough
/// that a buffered frame costs a daemon little.
pub const MAX_FRAME: u32 = 16 << 20;

/// The version this crate speaks.
pub const PROTOCOL_VERSION: ProtocolVersion = ProtocolVersion { major: 4, minor: 2 };
