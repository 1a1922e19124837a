//! The peer protocol's frames (docs/peer-protocol.md §1–§4): a `u32`
//! little-endian length, a `u8` type and a body. Decoding is total: any
//! byte string gives a [`Frame`] or a [`DecodeError`], never a panic, and
//! every count read from the wire is checked against its limit and against
//! the bytes present before anything is allocated for it (P3).

use kvtier_core::{BlockHash, BlockSums};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::{DecodeError, PeerError};

/// Bytes of the length prefix.
pub const LEN_BYTES: usize = 4;
/// The largest frame, counted without the length prefix: 64 MiB, room for
/// one block of up to ~64 MiB with its sums. A reply carries one block per
/// frame, so this bounds what one frame makes a reader buffer.
pub const MAX_FRAME: u32 = 64 << 20;
/// The largest handshake frame (`Hello`, `HelloOk`, `Refused`, `Proof`,
/// `Ready`) either side reads: before a peer has proved itself it cannot
/// make us buffer more than this.
pub const MAX_HANDSHAKE_FRAME: u32 = 8 << 10;
/// The largest request frame a server reads: a `Read` of [`MAX_KEYS`]
/// keys is about 16 KiB.
pub const MAX_REQUEST_FRAME: u32 = 64 << 10;
/// The most keys one `Read` may name.
pub const MAX_KEYS: usize = 1024;
/// The most layer sums one block may carry.
pub const MAX_LAYERS: usize = 4096;
/// The longest cluster or node name, in bytes.
pub const MAX_NAME: usize = 255;
/// The longest message text in `Refused` and `Error`, in bytes.
pub const MAX_TEXT: usize = 4096;
/// Bytes of a handshake nonce.
pub const NONCE_BYTES: usize = 32;
/// Bytes of a handshake proof (a keyed BLAKE3 hash).
pub const PROOF_BYTES: usize = 32;

/// A protocol version: peers of one major version understand each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    /// Incompatible changes.
    pub major: u16,
    /// Compatible additions.
    pub minor: u16,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The version this crate speaks.
pub const PEER_VERSION: Version = Version { major: 1, minor: 0 };

/// Which layers of each block a `Read` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerRange {
    /// Every layer: the whole block.
    All,
    /// Layers `start..end` (end exclusive, `start < end`).
    Span {
        /// The first layer.
        start: u32,
        /// One past the last layer.
        end: u32,
    },
}

/// `0x01` client -> server: open a connection (docs/peer-protocol.md §3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The client's protocol version.
    pub version: Version,
    /// The cluster the client belongs to.
    pub cluster: String,
    /// The client's node name.
    pub node: String,
    /// The client's fresh random challenge.
    pub nonce: [u8; NONCE_BYTES],
}

/// `0x02` server -> client: the server's challenge and its proof.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloOk {
    /// The server's protocol version.
    pub version: Version,
    /// The server's node name.
    pub node: String,
    /// The server's fresh random challenge.
    pub nonce: [u8; NONCE_BYTES],
    /// The server's proof of the cluster secret over the transcript.
    pub proof: [u8; PROOF_BYTES],
}

/// Defines a fieldless enum and its one-byte wire codes: encoding and
/// decoding read the one table, so they cannot disagree about a code.
macro_rules! wire_codes {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $code:expr),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $($(#[$vdoc])* $variant,)* }

        impl $name {
            /// Every variant, in code order.
            pub const ALL: &[$name] = &[$($name::$variant,)*];

            /// The variant's wire code.
            pub fn code(self) -> u8 {
                match self { $($name::$variant => $code,)* }
            }

            /// The variant with wire code `code`, if there is one.
            pub fn from_code(code: u8) -> Option<Self> {
                match code { $($code => Some($name::$variant),)* _ => None }
            }
        }
    };
}

wire_codes! {
    /// Why a server refused a connection.
    RefuseReason {
        /// Another major version.
        WrongVersion = 1,
        /// Another cluster name.
        WrongCluster = 2,
        /// The client's proof did not verify: another secret.
        BadProof = 3,
        /// The server is at its connection limit.
        Busy = 4,
    }
}

/// `0x03` server -> client: the handshake failed; the server closes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Why.
    pub reason: RefuseReason,
    /// Words for the operator.
    pub message: String,
}

wire_codes! {
    /// Why a server answered a request with `Error`.
    ErrorCode {
        /// The request was malformed; the server closes.
        Malformed = 1,
        /// A frame that has no place at this point of the conversation.
        Unexpected = 2,
        /// More keys than [`MAX_KEYS`].
        TooManyKeys = 3,
        /// The layer range is empty.
        BadRange = 4,
        /// The server cannot tell yet (or any longer) which blocks it
        /// holds (its node is not open, or closing): not an answer that it
        /// lacks them. The connection stays open.
        NotReady = 5,
    }
}

/// `0x7f` server -> client: a request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorReply {
    /// What failed.
    pub code: ErrorCode,
    /// Words for the operator.
    pub message: String,
}

/// `0x10` client -> server: read blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// Echoed in every reply frame of this request.
    pub req_id: u64,
    /// The layers wanted of every key.
    pub layers: LayerRange,
    /// The blocks, at most [`MAX_KEYS`].
    pub keys: Vec<BlockHash>,
}

/// A block's bytes for some of its layers, with its sums: what a
/// [`crate::BlockSource`] gives, what a `Block` frame carries, and what a
/// read returns once verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockData {
    /// Every layer sum and the combined sum, as the owner stored them
    /// (always all layers, so the reader can authenticate them, P6).
    pub sums: BlockSums,
    /// Bytes of one layer (the last may be shorter).
    pub layer_bytes: u32,
    /// The bytes of the layers asked, in layer order.
    pub bytes: Vec<u8>,
}

/// `0x11` server -> client: one key of a `Read`, in the request's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockReply {
    /// The request's id.
    pub req_id: u64,
    /// The key's position in the request.
    pub index: u32,
    /// The block, or `None` if the server does not hold it.
    pub found: Option<BlockData>,
}

/// Every frame of the protocol, with its type byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// `0x01` client -> server.
    Hello(Hello),
    /// `0x02` server -> client.
    HelloOk(HelloOk),
    /// `0x03` server -> client.
    Refused(Refused),
    /// `0x04` client -> server: the client's proof.
    Proof([u8; PROOF_BYTES]),
    /// `0x05` server -> client: authenticated; requests may follow.
    Ready,
    /// `0x10` client -> server.
    Read(Read),
    /// `0x11` server -> client.
    Block(BlockReply),
    /// `0x12` client -> server: a liveness probe.
    Ping(u64),
    /// `0x13` server -> client: the probe's token back.
    Pong(u64),
    /// `0x7f` server -> client.
    Error(ErrorReply),
}

impl Frame {
    /// The frame's name, as in errors and docs.
    pub fn name(&self) -> &'static str {
        match self {
            Frame::Hello(_) => "Hello",
            Frame::HelloOk(_) => "HelloOk",
            Frame::Refused(_) => "Refused",
            Frame::Proof(_) => "Proof",
            Frame::Ready => "Ready",
            Frame::Read(_) => "Read",
            Frame::Block(_) => "Block",
            Frame::Ping(_) => "Ping",
            Frame::Pong(_) => "Pong",
            Frame::Error(_) => "Error",
        }
    }

    /// The frame's bytes, length prefix included; fails if it would exceed
    /// [`MAX_FRAME`].
    pub fn encode(&self) -> Result<Vec<u8>, DecodeError> {
        let mut out = vec![0u8; LEN_BYTES];
        self.put(&mut out);
        set_length(out, 0)
    }

    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Frame::Hello(m) => put_hello(out, m),
            Frame::HelloOk(m) => put_hello_ok(out, m),
            Frame::Refused(m) => put_refused(out, m),
            Frame::Proof(p) => {
                out.push(0x04);
                out.extend_from_slice(p);
            }
            Frame::Ready => out.push(0x05),
            Frame::Read(m) => put_read(out, m),
            Frame::Block(m) => put_block(out, m),
            Frame::Ping(t) => put_token(out, 0x12, *t),
            Frame::Pong(t) => put_token(out, 0x13, *t),
            Frame::Error(m) => put_error(out, m),
        }
    }

    /// Decodes one frame from its type byte and body (the length prefix
    /// already stripped).
    pub fn decode(frame: &[u8]) -> Result<Frame, DecodeError> {
        let (&kind, body) = frame.split_first().ok_or(DecodeError::Empty)?;
        let name = type_name(kind).ok_or(DecodeError::UnknownType(kind))?;
        let mut c = Cursor::new(body, name);
        let out = match kind {
            0x01 => Frame::Hello(get_hello(&mut c)?),
            0x02 => Frame::HelloOk(get_hello_ok(&mut c)?),
            0x03 => Frame::Refused(get_refused(&mut c)?),
            0x04 => Frame::Proof(c.array()?),
            0x05 => Frame::Ready,
            0x10 => Frame::Read(get_read(&mut c)?),
            0x11 => Frame::Block(get_block(&mut c)?),
            0x12 => Frame::Ping(c.u64()?),
            0x13 => Frame::Pong(c.u64()?),
            _ => Frame::Error(get_error(&mut c)?),
        };
        c.finish()?;
        Ok(out)
    }
}

/// The name of the frame with type byte `kind`, if there is one.
fn type_name(kind: u8) -> Option<&'static str> {
    Some(match kind {
        0x01 => "Hello",
        0x02 => "HelloOk",
        0x03 => "Refused",
        0x04 => "Proof",
        0x05 => "Ready",
        0x10 => "Read",
        0x11 => "Block",
        0x12 => "Ping",
        0x13 => "Pong",
        0x7f => "Error",
        _ => return None,
    })
}

/// Reads one frame of at most [`MAX_FRAME`] bytes; `Ok(None)` when the
/// stream ends cleanly before one starts.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Frame>, PeerError> {
    read_frame_up_to(r, MAX_FRAME).await
}

/// Reads one frame of at most `max` bytes (not counting the prefix); a
/// longer one is refused before its body is read or buffered.
pub async fn read_frame_up_to<R: AsyncRead + Unpin>(
    r: &mut R,
    max: u32,
) -> Result<Option<Frame>, PeerError> {
    let Some(len) = read_len(r, max).await? else {
        return Ok(None);
    };
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Ok(Some(Frame::decode(&body)?))
}

/// Reads a length prefix and checks it against `max` (and [`MAX_FRAME`]);
/// `Ok(None)` when the stream ends before the prefix starts (an end inside
/// it is an error).
pub(crate) async fn read_len<R: AsyncRead + Unpin>(
    r: &mut R,
    max: u32,
) -> Result<Option<usize>, PeerError> {
    let mut len = [0u8; LEN_BYTES];
    if r.read(&mut len[..1]).await? == 0 {
        return Ok(None);
    }
    r.read_exact(&mut len[1..]).await?;
    let len = u32::from_le_bytes(len) as usize;
    let max = max.min(MAX_FRAME) as usize;
    if len > max {
        return Err(DecodeError::Oversized { len, max }.into());
    }
    Ok(Some(len))
}

/// Writes one frame and flushes it.
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, frame: &Frame) -> Result<(), PeerError> {
    w.write_all(&frame.encode()?).await?;
    w.flush().await?;
    Ok(())
}

fn put_version(out: &mut Vec<u8>, v: Version) {
    out.extend_from_slice(&v.major.to_le_bytes());
    out.extend_from_slice(&v.minor.to_le_bytes());
}

/// Strings: a `u16` byte length, then UTF-8. Callers keep names and texts
/// within their limits; a longer one is cut at a character boundary so the
/// frame stays decodable.
fn put_str(out: &mut Vec<u8>, s: &str, max: usize) {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..end]);
}

fn put_hello(out: &mut Vec<u8>, m: &Hello) {
    out.push(0x01);
    put_version(out, m.version);
    put_str(out, &m.cluster, MAX_NAME);
    put_str(out, &m.node, MAX_NAME);
    out.extend_from_slice(&m.nonce);
}

fn put_hello_ok(out: &mut Vec<u8>, m: &HelloOk) {
    out.push(0x02);
    put_version(out, m.version);
    put_str(out, &m.node, MAX_NAME);
    out.extend_from_slice(&m.nonce);
    out.extend_from_slice(&m.proof);
}

fn put_refused(out: &mut Vec<u8>, m: &Refused) {
    put_coded(out, 0x03, m.reason.code(), &m.message);
}

fn put_error(out: &mut Vec<u8>, m: &ErrorReply) {
    put_coded(out, 0x7f, m.code.code(), &m.message);
}

/// `Refused` and `Error` alike: a code, then words for the operator.
fn put_coded(out: &mut Vec<u8>, kind: u8, code: u8, message: &str) {
    out.push(kind);
    out.push(code);
    put_str(out, message, MAX_TEXT);
}

fn put_token(out: &mut Vec<u8>, kind: u8, token: u64) {
    out.push(kind);
    out.extend_from_slice(&token.to_le_bytes());
}

fn put_read(out: &mut Vec<u8>, m: &Read) {
    out.push(0x10);
    out.extend_from_slice(&m.req_id.to_le_bytes());
    match m.layers {
        LayerRange::All => out.push(0),
        LayerRange::Span { start, end } => {
            out.push(1);
            out.extend_from_slice(&start.to_le_bytes());
            out.extend_from_slice(&end.to_le_bytes());
        }
    }
    out.extend_from_slice(&(m.keys.len() as u32).to_le_bytes());
    for k in &m.keys {
        out.extend_from_slice(&k.to_le_bytes());
    }
}

/// The start of `reply`'s `Block` frame, length prefix included, up to
/// the block's bytes, which follow it on the wire: a server writes the two
/// together without copying the bytes into a frame. Fails as
/// [`Frame::encode`] would.
pub(crate) fn encode_block_head(reply: &BlockReply) -> Result<Vec<u8>, DecodeError> {
    let mut out = vec![0u8; LEN_BYTES];
    put_block_head(&mut out, reply);
    let bytes = reply.found.as_ref().map_or(0, |b| b.bytes.len());
    set_length(out, bytes)
}

/// Writes the body length of `out` (a frame after its length prefix, and
/// `more` bytes still to follow) into its prefix.
fn set_length(mut out: Vec<u8>, more: usize) -> Result<Vec<u8>, DecodeError> {
    let len = out.len() - LEN_BYTES + more;
    match u32::try_from(len) {
        Ok(len) if len <= MAX_FRAME => {
            out[..LEN_BYTES].copy_from_slice(&len.to_le_bytes());
            Ok(out)
        }
        _ => Err(DecodeError::Oversized {
            len,
            max: MAX_FRAME as usize,
        }),
    }
}

fn put_block(out: &mut Vec<u8>, m: &BlockReply) {
    put_block_head(out, m);
    // The bytes run to the end of the frame: their length is implied.
    if let Some(b) = &m.found {
        out.extend_from_slice(&b.bytes);
    }
}

/// A `Block` frame's body up to its bytes.
fn put_block_head(out: &mut Vec<u8>, m: &BlockReply) {
    out.push(0x11);
    out.extend_from_slice(&m.req_id.to_le_bytes());
    out.extend_from_slice(&m.index.to_le_bytes());
    let Some(b) = &m.found else {
        out.push(0);
        return;
    };
    out.push(1);
    out.extend_from_slice(&b.sums.block.to_le_bytes());
    out.extend_from_slice(&(b.sums.layers.len() as u32).to_le_bytes());
    for s in &b.sums.layers {
        out.extend_from_slice(&s.to_le_bytes());
    }
    out.extend_from_slice(&b.layer_bytes.to_le_bytes());
}

/// A cursor over one frame body; the frame name labels its errors.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    name: &'static str,
}

impl<'a> Cursor<'a> {
    /// A cursor over `buf`, a body of frame `name`.
    pub(crate) fn new(buf: &'a [u8], name: &'static str) -> Self {
        Self { buf, name }
    }

    pub(crate) fn bad(&self, reason: &'static str) -> DecodeError {
        DecodeError::Malformed {
            frame: self.name,
            reason,
        }
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(self.bad("body ends inside a field"));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        self.array().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        self.array().map(u64::from_le_bytes)
    }

    /// A count of `size`-byte items, at most `max`, that must fit in what
    /// is left: checked before anything is allocated for it.
    fn count(&mut self, max: usize, size: usize) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(self.bad("count over its limit"));
        }
        if n * size > self.buf.len() {
            return Err(self.bad("count larger than the body"));
        }
        Ok(n)
    }

    fn str(&mut self, max: usize) -> Result<String, DecodeError> {
        let n = self.u16()? as usize;
        if n > max {
            return Err(self.bad("string over its limit"));
        }
        let raw = self.bytes(n)?;
        std::str::from_utf8(raw)
            .map(str::to_owned)
            .map_err(|_| self.bad("string is not UTF-8"))
    }

    fn version(&mut self) -> Result<Version, DecodeError> {
        Ok(Version {
            major: self.u16()?,
            minor: self.u16()?,
        })
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }

    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        match self.buf.len() {
            0 => Ok(()),
            count => Err(DecodeError::Trailing {
                frame: self.name,
                count,
            }),
        }
    }
}

fn get_hello(c: &mut Cursor<'_>) -> Result<Hello, DecodeError> {
    Ok(Hello {
        version: c.version()?,
        cluster: c.str(MAX_NAME)?,
        node: c.str(MAX_NAME)?,
        nonce: c.array()?,
    })
}

fn get_hello_ok(c: &mut Cursor<'_>) -> Result<HelloOk, DecodeError> {
    Ok(HelloOk {
        version: c.version()?,
        node: c.str(MAX_NAME)?,
        nonce: c.array()?,
        proof: c.array()?,
    })
}

fn get_refused(c: &mut Cursor<'_>) -> Result<Refused, DecodeError> {
    let (reason, message) = get_coded(c, RefuseReason::from_code)?;
    Ok(Refused { reason, message })
}

fn get_error(c: &mut Cursor<'_>) -> Result<ErrorReply, DecodeError> {
    let (code, message) = get_coded(c, ErrorCode::from_code)?;
    Ok(ErrorReply { code, message })
}

/// A code known to `from_code`, then words for the operator.
fn get_coded<T>(
    c: &mut Cursor<'_>,
    from_code: fn(u8) -> Option<T>,
) -> Result<(T, String), DecodeError> {
    let code = from_code(c.u8()?).ok_or_else(|| c.bad("unknown code"))?;
    Ok((code, c.str(MAX_TEXT)?))
}

fn get_read(c: &mut Cursor<'_>) -> Result<Read, DecodeError> {
    let req_id = c.u64()?;
    let layers = match c.u8()? {
        0 => LayerRange::All,
        1 => LayerRange::Span {
            start: c.u32()?,
            end: c.u32()?,
        },
        _ => return Err(c.bad("unknown layer range tag")),
    };
    let n = c.count(MAX_KEYS, 16)?;
    let mut keys = Vec::with_capacity(n);
    for _ in 0..n {
        keys.push(BlockHash::from_le_bytes(c.array()?));
    }
    Ok(Read {
        req_id,
        layers,
        keys,
    })
}

fn get_block(c: &mut Cursor<'_>) -> Result<BlockReply, DecodeError> {
    let head = get_block_head(c)?;
    let found = head.found.map(|(sums, layer_bytes)| BlockData {
        sums,
        layer_bytes,
        bytes: c.rest().to_vec(),
    });
    Ok(BlockReply {
        req_id: head.req_id,
        index: head.index,
        found,
    })
}

/// Bytes of a `Block` body before its sums: `req_id`, `index`, the tag.
pub(crate) const BLOCK_HEAD: usize = 8 + 4 + 1;
/// Bytes of a found block's fields before its layer sums: the block sum
/// and the layer count.
pub(crate) const FOUND_HEAD: usize = 8 + 4;

/// A `Block` body up to its bytes.
pub(crate) struct BlockHead {
    /// The request's id.
    pub req_id: u64,
    /// The key's position in the request.
    pub index: u32,
    /// The sums and layer size of a found block.
    pub found: Option<(BlockSums, u32)>,
}

/// Parses a `Block` body up to where its bytes start.
pub(crate) fn get_block_head(c: &mut Cursor<'_>) -> Result<BlockHead, DecodeError> {
    let req_id = c.u64()?;
    let index = c.u32()?;
    let found = match c.u8()? {
        0 => None,
        1 => {
            let block = c.u64()?;
            let n = c.count(MAX_LAYERS, 8)?;
            let layers = (0..n).map(|_| c.u64()).collect::<Result<_, _>>()?;
            Some((BlockSums { block, layers }, c.u32()?))
        }
        _ => return Err(c.bad("block tag is neither 0 nor 1")),
    };
    Ok(BlockHead {
        req_id,
        index,
        found,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn name() -> impl Strategy<Value = String> {
        "[a-zé-]{0,40}"
    }

    fn version() -> impl Strategy<Value = Version> {
        (any::<u16>(), any::<u16>()).prop_map(|(major, minor)| Version { major, minor })
    }

    fn range() -> impl Strategy<Value = LayerRange> {
        prop_oneof![
            Just(LayerRange::All),
            (any::<u32>(), any::<u32>()).prop_map(|(start, end)| LayerRange::Span { start, end }),
        ]
    }

    fn data() -> impl Strategy<Value = Option<BlockData>> {
        proptest::option::of(
            (
                any::<u64>(),
                prop::collection::vec(any::<u64>(), 0..8),
                any::<u32>(),
                prop::collection::vec(any::<u8>(), 0..64),
            )
                .prop_map(|(block, layers, layer_bytes, bytes)| BlockData {
                    sums: BlockSums { block, layers },
                    layer_bytes,
                    bytes,
                }),
        )
    }

    fn handshake() -> impl Strategy<Value = Frame> {
        prop_oneof![
            (version(), name(), name(), any::<[u8; 32]>()).prop_map(
                |(version, cluster, node, nonce)| {
                    Frame::Hello(Hello {
                        version,
                        cluster,
                        node,
                        nonce,
                    })
                }
            ),
            (version(), name(), any::<[u8; 32]>(), any::<[u8; 32]>()).prop_map(
                |(version, node, nonce, proof)| Frame::HelloOk(HelloOk {
                    version,
                    node,
                    nonce,
                    proof
                })
            ),
            (prop::sample::select(RefuseReason::ALL), name())
                .prop_map(|(reason, message)| Frame::Refused(Refused { reason, message })),
            any::<[u8; 32]>().prop_map(Frame::Proof),
            Just(Frame::Ready),
        ]
    }

    fn request() -> impl Strategy<Value = Frame> {
        prop_oneof![
            (
                any::<u64>(),
                range(),
                prop::collection::vec(any::<u128>(), 0..20)
            )
                .prop_map(|(req_id, layers, keys)| Frame::Read(Read {
                    req_id,
                    layers,
                    keys: keys.into_iter().map(BlockHash).collect()
                })),
            (any::<u64>(), any::<u32>(), data()).prop_map(|(req_id, index, found)| {
                Frame::Block(BlockReply {
                    req_id,
                    index,
                    found,
                })
            }),
            any::<u64>().prop_map(Frame::Ping),
            any::<u64>().prop_map(Frame::Pong),
            (prop::sample::select(ErrorCode::ALL), name())
                .prop_map(|(code, message)| Frame::Error(ErrorReply { code, message })),
        ]
    }

    fn frame() -> impl Strategy<Value = Frame> {
        prop_oneof![handshake(), request()]
    }

    proptest! {
        #[test]
        fn every_frame_round_trips(f in frame()) {
            let bytes = f.encode().unwrap();
            let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
            prop_assert_eq!(len, bytes.len() - LEN_BYTES);
            prop_assert_eq!(Frame::decode(&bytes[LEN_BYTES..]).unwrap(), f);
        }

        /// A server writes a block frame as its head and then the block's
        /// bytes: together they are exactly the frame's encoding.
        #[test]
        fn a_block_head_and_its_bytes_are_the_frame(
            req_id in any::<u64>(), index in any::<u32>(), found in data(),
        ) {
            let reply = BlockReply { req_id, index, found };
            let mut split = encode_block_head(&reply).unwrap();
            split.extend_from_slice(reply.found.as_ref().map_or(&[][..], |b| &b.bytes));
            prop_assert_eq!(split, Frame::Block(reply).encode().unwrap());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = Frame::decode(&bytes);
        }

        /// Bytes that start as a valid frame and then go wrong (cut, a byte
        /// changed) are the likeliest bad input; they decode or fail cleanly.
        #[test]
        fn damaged_frames_never_panic(f in frame(), cut in any::<usize>(), at in any::<usize>(), x in any::<u8>()) {
            let mut bytes = f.encode().unwrap().split_off(LEN_BYTES);
            let i = at % bytes.len();
            bytes[i] ^= x;
            let _ = Frame::decode(&bytes);
            bytes.truncate(cut % (bytes.len() + 1));
            let _ = Frame::decode(&bytes);
        }
    }

    /// Reads `bytes` as one reply into a target of `target_len` bytes.
    fn read_into(
        bytes: &[u8],
        target: &mut [u8],
    ) -> Result<Option<crate::incoming::Incoming>, PeerError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut r = bytes;
        rt.block_on(crate::incoming::read_reply_into(&mut r, target))
    }

    proptest! {
        /// The landing reader agrees with the whole-frame decoder: a
        /// block's bytes land in a target of their length, and are skipped
        /// (the stream staying at the next frame) for any other length.
        #[test]
        fn landing_agrees_with_decoding(f in frame(), other_len in 0usize..80, next in any::<u64>()) {
            use crate::incoming::Incoming;
            let mut bytes = f.encode().unwrap();
            bytes.extend(Frame::Pong(next).encode().unwrap());
            let exact = match &f {
                Frame::Block(BlockReply { found: Some(d), .. }) => d.bytes.len(),
                _ => 0,
            };
            for len in [exact, other_len] {
                let mut target = vec![0u8; len];
                let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
                let mut r = &bytes[..];
                let got = rt.block_on(crate::incoming::read_reply_into(&mut r, &mut target)).unwrap().unwrap();
                match (got, &f) {
                    (Incoming::Block { head, landed }, Frame::Block(b)) => {
                        prop_assert_eq!((head.req_id, head.index), (b.req_id, b.index));
                        let want = b.found.as_ref().map(|d| (d.sums.clone(), d.layer_bytes));
                        prop_assert_eq!(head.found, want);
                        prop_assert_eq!(landed, b.found.is_some() && len == exact);
                        if landed {
                            prop_assert_eq!(&target, &b.found.as_ref().unwrap().bytes);
                        }
                    }
                    (Incoming::Other(got), _) => prop_assert_eq!(&got, &f),
                    (Incoming::Block { .. }, _) => prop_assert!(false, "a Block from {:?}", f),
                }
                let after = rt.block_on(read_frame(&mut r)).unwrap();
                prop_assert_eq!(after, Some(Frame::Pong(next)));
            }
        }

        #[test]
        fn landing_arbitrary_bytes_never_panics(
            bytes in prop::collection::vec(any::<u8>(), 0..300),
            len in 0usize..64,
        ) {
            let _ = read_into(&bytes, &mut vec![0u8; len]);
        }

        #[test]
        fn landing_damaged_blocks_never_panics(
            f in request(), at in any::<usize>(), x in any::<u8>(), len in 0usize..64,
        ) {
            let mut bytes = f.encode().unwrap();
            let i = at % bytes.len();
            bytes[i] ^= x;
            let _ = read_into(&bytes, &mut vec![0u8; len]);
        }
    }

    #[test]
    fn a_key_count_over_the_limit_is_refused_before_allocation() {
        let mut body = vec![0x10];
        body.extend_from_slice(&7u64.to_le_bytes());
        body.push(0);
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Frame::decode(&body),
            Err(DecodeError::Malformed {
                reason: "count over its limit",
                ..
            })
        ));
    }

    #[tokio::test]
    async fn an_oversized_length_is_refused_before_its_body() {
        let mut bytes: &[u8] = &(MAX_FRAME + 1).to_le_bytes();
        let got = read_frame(&mut bytes).await;
        assert!(matches!(
            got,
            Err(PeerError::Decode(DecodeError::Oversized { .. }))
        ));
    }
}
