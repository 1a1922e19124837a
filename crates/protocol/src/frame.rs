//! Frames: `u32` little-endian length, then a `u8` message type and the
//! body. The length counts the type byte and the body.

use std::io::{self, Read, Write};

use crate::message::*;
use crate::wire::{Reader, Wire};
use crate::{DecodeError, EncodeError, FrameError, MAX_FRAME};

/// Bytes of the length prefix.
pub const LEN_BYTES: usize = 4;

/// Every message of the protocol, with its type byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// `0x01` client -> daemon: open a session.
    Hello(Hello),
    /// `0x02` daemon -> client: session open.
    HelloOk(HelloOk),
    /// `0x03` daemon -> client: a request or the handshake failed.
    Error(Error),
    /// `0x04` daemon -> client (4.2): the node is still opening for this
    /// client's `Hello`; `HelloOk` or `Error` follows.
    Opening(Opening),
    /// `0x10` longest stored prefix of the keys.
    Lookup(KeysRequest),
    /// `0x11` reply to `Lookup`.
    LookupOk(LookupOk),
    /// `0x12` reserve arena slots to store the keys.
    Reserve(KeysRequest),
    /// `0x13` reply to `Reserve`.
    ReserveOk(ReserveOk),
    /// `0x14` make filled slots readable.
    Commit(Commit),
    /// `0x15` reply to `Commit`.
    CommitOk(CommitOk),
    /// `0x16` drop reservations without storing; replied with `Ack`.
    Abort(KeysRequest),
    /// `0x17` make the keys resident in G2 and pin them.
    Load(KeysRequest),
    /// `0x18` reply to `Load`.
    LoadOk(LoadOk),
    /// `0x19` notification: layers up to `layer` of a load are ready.
    LayerReady(LayerReady),
    /// `0x1a` unpin loaded keys; replied with `Ack`.
    Release(KeysRequest),
    /// `0x1b` remove the keys from every tier; replied with `Ack`.
    Remove(KeysRequest),
    /// `0x1c` ask for counters.
    Stats(Stats),
    /// `0x1d` reply to `Stats`.
    StatsOk(StatsOk),
    /// `0x1e` reply to `Abort`, `Release`, `Remove`.
    Ack(Ack),
}

/// Generates the type-byte table once, so encoding and decoding cannot
/// disagree about a code.
macro_rules! message_table {
    ($($variant:ident($body:ty) = $code:expr),* $(,)?) => {
        impl Message {
            /// The message type byte.
            pub fn type_byte(&self) -> u8 {
                match self { $( Message::$variant(_) => $code, )* }
            }

            /// The message's name, as in errors and docs.
            pub fn name(&self) -> &'static str {
                match self { $( Message::$variant(_) => stringify!($variant), )* }
            }

            fn put_body(&self, out: &mut Vec<u8>) {
                match self { $( Message::$variant(m) => m.put(out), )* }
            }

            fn get_body(kind: u8, body: &[u8]) -> Result<Self, DecodeError> {
                match kind {
                    $( $code => {
                        let mut r = Reader::new(body, stringify!($variant));
                        let m = <$body>::get(&mut r)?;
                        r.finish()?;
                        Ok(Message::$variant(m))
                    } )*
                    other => Err(DecodeError::UnknownType(other)),
                }
            }
        }
    };
}

message_table! {
    Hello(Hello) = 0x01,
    HelloOk(HelloOk) = 0x02,
    Error(Error) = 0x03,
    Opening(Opening) = 0x04,
    Lookup(KeysRequest) = 0x10,
    LookupOk(LookupOk) = 0x11,
    Reserve(KeysRequest) = 0x12,
    ReserveOk(ReserveOk) = 0x13,
    Commit(Commit) = 0x14,
    CommitOk(CommitOk) = 0x15,
    Abort(KeysRequest) = 0x16,
    Load(KeysRequest) = 0x17,
    LoadOk(LoadOk) = 0x18,
    LayerReady(LayerReady) = 0x19,
    Release(KeysRequest) = 0x1a,
    Remove(KeysRequest) = 0x1b,
    Stats(Stats) = 0x1c,
    StatsOk(StatsOk) = 0x1d,
    Ack(Ack) = 0x1e,
}

impl Message {
    /// Appends this message as one frame to `out`. On error `out` is left
    /// as it was.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let start = out.len();
        out.extend_from_slice(&[0; LEN_BYTES]);
        out.push(self.type_byte());
        self.put_body(out);
        let len = out.len() - start - LEN_BYTES;
        match u32::try_from(len) {
            Ok(len32) if len32 <= MAX_FRAME => {
                out[start..start + LEN_BYTES].copy_from_slice(&len32.to_le_bytes());
                Ok(())
            }
            _ => {
                out.truncate(start);
                Err(EncodeError::TooLarge {
                    len,
                    max: MAX_FRAME,
                })
            }
        }
    }

    /// This message as one frame.
    pub fn to_frame(&self) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::new();
        self.encode(&mut out)?;
        Ok(out)
    }

    /// Decodes the frame at the start of `buf`, returning the message and
    /// the bytes it took; bytes after the frame are left for the next call.
    /// `Truncated` means: read more and call again.
    pub fn decode(buf: &[u8]) -> Result<(Self, usize), DecodeError> {
        let len = frame_len(buf)?;
        let total = LEN_BYTES + len;
        if buf.len() < total {
            return Err(DecodeError::Truncated { needed: total });
        }
        let msg = Self::from_payload(&buf[LEN_BYTES..total])?;
        Ok((msg, total))
    }

    /// Decodes a buffer that must hold exactly one frame.
    pub fn from_frame(buf: &[u8]) -> Result<Self, DecodeError> {
        let (msg, used) = Self::decode(buf)?;
        if used != buf.len() {
            return Err(DecodeError::TrailingBytes {
                message: msg.name(),
                count: buf.len() - used,
            });
        }
        Ok(msg)
    }

    /// Decodes a frame's payload: the type byte and the body.
    fn from_payload(payload: &[u8]) -> Result<Self, DecodeError> {
        match payload.split_first() {
            Some((&kind, body)) => Self::get_body(kind, body),
            None => Err(DecodeError::Malformed {
                message: "frame",
                reason: "length 0: no type byte",
            }),
        }
    }
}

/// Reads and checks the length prefix: `Truncated` while it is incomplete,
/// `Oversized` past [`MAX_FRAME`], before any body byte is looked at (I1).
fn frame_len(buf: &[u8]) -> Result<usize, DecodeError> {
    let Some(prefix) = buf.first_chunk::<LEN_BYTES>() else {
        return Err(DecodeError::Truncated { needed: LEN_BYTES });
    };
    check_len(u32::from_le_bytes(*prefix))
}

fn check_len(len: u32) -> Result<usize, DecodeError> {
    if len > MAX_FRAME {
        return Err(DecodeError::Oversized {
            len,
            max: MAX_FRAME,
        });
    }
    // MAX_FRAME fits in usize on every target this crate builds for.
    Ok(len as usize)
}

/// Bytes [`read_frame`] buffers before the first body byte arrives.
const READ_CHUNK: usize = 64 << 10;

/// Reads one frame from a stream. `Ok(None)` is a clean end of stream
/// between frames; an end inside a frame is an `Io` error (`UnexpectedEof`).
/// The declared length is checked before the body is read (I1), and the
/// buffer grows with the bytes that arrive (I4), so a peer that declares a
/// large frame and sends nothing costs 64 KiB.
pub fn read_frame(r: &mut impl Read) -> Result<Option<Message>, FrameError> {
    let mut prefix = [0u8; LEN_BYTES];
    if !read_prefix(r, &mut prefix)? {
        return Ok(None);
    }
    let len = check_len(u32::from_le_bytes(prefix))?;
    let payload = read_payload(r, len)?;
    Ok(Some(Message::from_payload(&payload)?))
}

/// Reads exactly `len` bytes, doubling the buffer (from [`READ_CHUNK`], up
/// to `len`) only after the previous part has been filled.
fn read_payload(r: &mut impl Read, len: usize) -> io::Result<Vec<u8>> {
    let mut payload = Vec::new();
    while payload.len() < len {
        let start = payload.len();
        let step = start.max(READ_CHUNK).min(len - start);
        payload.reserve_exact(step);
        payload.resize(start + step, 0);
        r.read_exact(&mut payload[start..])?;
    }
    Ok(payload)
}

/// Fills `prefix`; `false` if the stream ended before its first byte.
fn read_prefix(r: &mut impl Read, prefix: &mut [u8; LEN_BYTES]) -> io::Result<bool> {
    let mut got = 0;
    while got < LEN_BYTES {
        match r.read(&mut prefix[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Writes `msg` as one frame with a single `write_all`, so frames from one
/// writer never interleave with partial frames.
pub fn write_frame(w: &mut impl Write, msg: &Message) -> Result<(), FrameError> {
    let frame = msg.to_frame()?;
    w.write_all(&frame)?;
    Ok(())
}
