//! The bounds of one connection (docs/node-protocol.md §7, I19-I22): a
//! [`FrameReader`] takes frames no larger than the connection may send yet,
//! within the handshake, frame and idle timeouts, and gives back the buffer
//! of a large frame once it is decoded; a [`Writer`] writes replies within
//! the write timeout, so a client that stops reading cannot hold the session
//! (and with it, its reservations and pins) for longer than that.

use std::io;
use std::time::Duration;

use kvtier_core::{BlockHash, BlockSums};
use kvtier_protocol::{
    Commit, CommitEntry, DecodeError, Error, ErrorCode, Hello, KeysRequest, LEN_BYTES, MAX_FRAME,
    Message,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::time::{Instant, timeout, timeout_at};

use crate::NodeOptions;

/// Bytes a frame buffer grows by at most per read (I4: a peer that declares
/// a large frame and sends nothing costs this), and what a buffer shrinks
/// back to after a larger frame.
pub(crate) const READ_CHUNK: usize = 64 << 10;

/// Largest frame a connection may send before its `Hello` is accepted,
/// length prefix included. A `Hello` whose strings are all at
/// [`HELLO_STRING_MAX`] is about 1.1 KiB.
pub const HELLO_FRAME_MAX: usize = 64 << 10;

/// Longest `Hello` string (model, dtype, tenant salt, instance), in bytes.
pub const HELLO_STRING_MAX: usize = 256;

/// Bytes of a log field taken from a client (the rest is cut).
const LOG_CHARS: usize = 64;

/// Largest request frame, length prefix included, that a client of blocks
/// of `layers` layers sends when it names at most `max_batch` keys: a
/// `Commit` of `max_batch` entries (one key, the block sum and one sum per
/// layer each), capped at the protocol's `MAX_FRAME`. Sessions refuse
/// larger frames after `Hello` (I21).
pub fn request_frame_limit(max_batch: usize, layers: u32) -> usize {
    let commit = |n: usize| {
        let entry = CommitEntry {
            key: BlockHash(0),
            sums: BlockSums {
                block: 0,
                layers: vec![0; layers as usize],
            },
        };
        frame_len(&Message::Commit(Commit {
            request_id: 0,
            entries: vec![entry; n],
        }))
    };
    let keys = |n: usize| {
        frame_len(&Message::Lookup(KeysRequest {
            request_id: 0,
            keys: vec![BlockHash(0); n],
        }))
    };
    // Encoded sizes grow by a fixed amount per entry, so two small frames
    // give the size of any batch without building it.
    let per = |f: &dyn Fn(usize) -> usize| {
        let (empty, one) = (f(0), f(1));
        empty.saturating_add(max_batch.saturating_mul(one.saturating_sub(empty)))
    };
    per(&commit)
        .max(per(&keys))
        .min(LEN_BYTES + MAX_FRAME as usize)
}

/// Bytes of `msg`'s frame; a frame over `MAX_FRAME` counts as the largest.
fn frame_len(msg: &Message) -> usize {
    let mut out = Vec::new();
    match msg.encode(&mut out) {
        Ok(()) => out.len(),
        Err(_) => LEN_BYTES + MAX_FRAME as usize,
    }
}

/// Why a `Hello` is refused before its namespace is looked at: a string
/// over [`HELLO_STRING_MAX`] bytes.
pub(crate) fn check_hello_strings(hello: &Hello) -> Result<(), String> {
    let ns = &hello.namespace;
    let fields = [
        ("model", ns.model.len()),
        ("dtype", ns.dtype.len()),
        ("tenant_salt", ns.tenant_salt.as_ref().map_or(0, Vec::len)),
        ("instance", hello.instance.as_ref().map_or(0, String::len)),
    ];
    match fields.iter().find(|(_, len)| *len > HELLO_STRING_MAX) {
        Some((name, len)) => Err(format!(
            "Hello's {name} is {len} bytes; at most {HELLO_STRING_MAX} are accepted"
        )),
        None => Ok(()),
    }
}

/// `s` cut to its first [`LOG_CHARS`] bytes (at a character boundary), for
/// logging a string a client chose.
pub(crate) fn clip(s: &str) -> &str {
    if s.len() <= LOG_CHARS {
        return s;
    }
    let end = (0..=LOG_CHARS)
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0);
    &s[..end]
}

/// A connection's timeouts and its frame limit after `Hello`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Largest frame after `Hello` ([`request_frame_limit`]).
    pub(crate) frame_after_hello: usize,
    /// Time from connect within which `Hello` must arrive.
    pub(crate) handshake: Duration,
    /// Time a frame may take from its first byte to its last.
    pub(crate) frame: Duration,
    /// Quiet time after which a connection holding nothing is closed.
    pub(crate) idle: Option<Duration>,
    /// Time one write may take.
    pub(crate) write: Duration,
}

impl Limits {
    /// The limits of `options` for blocks of `layers` layers.
    pub(crate) fn of(options: &NodeOptions, layers: u32) -> Self {
        Self {
            frame_after_hello: request_frame_limit(options.max_batch, layers),
            handshake: options.handshake_timeout,
            frame: options.frame_timeout,
            idle: options.idle_timeout,
            write: options.write_timeout,
        }
    }
}

/// Which wait ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// No `Hello` within the handshake timeout.
    Handshake,
    /// A started frame did not complete within the frame timeout.
    Frame,
    /// No request within the idle timeout.
    Idle,
}

/// Why no message came.
#[derive(Debug)]
pub(crate) enum ReadFailure {
    /// The frame does not decode.
    Decode(DecodeError),
    /// The frame declares more bytes than this connection may send now.
    TooLarge {
        /// Bytes the frame declares, length prefix included.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The socket failed or ended inside a frame.
    Io(io::Error),
    /// A wait ran out.
    Timeout(Wait),
}

/// Reads a connection's frames within its limits. Cancel-safe: what was
/// read stays in the reader for the next call.
pub(crate) struct FrameReader {
    buf: Vec<u8>,
    limits: Limits,
    /// Largest frame accepted now: [`HELLO_FRAME_MAX`] until `Hello`.
    max_frame: usize,
    /// When `Hello` must have arrived by; `None` once it has.
    handshake_by: Option<Instant>,
    /// When the first byte of the frame in `buf` arrived (about).
    frame_since: Option<Instant>,
    /// When the connection last finished a request, or opened.
    quiet_since: Instant,
}

impl FrameReader {
    /// A reader for a connection that opened just now.
    pub(crate) fn new(limits: Limits) -> Self {
        let now = Instant::now();
        Self {
            buf: Vec::new(),
            limits,
            max_frame: HELLO_FRAME_MAX,
            handshake_by: Some(now + limits.handshake),
            frame_since: None,
            quiet_since: now,
        }
    }

    /// The handshake succeeded: no handshake deadline any more, and frames
    /// as large as a request of `manager.max_batch` keys.
    pub(crate) fn greeted(&mut self) {
        self.handshake_by = None;
        self.max_frame = self.limits.frame_after_hello;
    }

    /// The node's shape is known: frames after `Hello` may take
    /// `frame_after_hello` bytes ([`request_frame_limit`]).
    pub(crate) fn shaped(&mut self, frame_after_hello: usize) {
        self.limits.frame_after_hello = frame_after_hello;
    }

    /// A request was just served: the idle time counts from now, and so
    /// does the time of a frame that arrived in part meanwhile (the daemon
    /// was not reading it while it served the request).
    pub(crate) fn touch(&mut self) {
        let now = Instant::now();
        self.quiet_since = now;
        if self.frame_since.is_some() {
            self.frame_since = Some(now);
        }
    }

    /// Bytes the frame buffer holds on to.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// The next whole message, `None` at a clean end of stream.
    pub(crate) async fn next(
        &mut self,
        rd: &mut OwnedReadHalf,
    ) -> Result<Option<Message>, ReadFailure> {
        loop {
            let want = match self.decode()? {
                Ok(msg) => return Ok(Some(msg)),
                Err(needed) => needed,
            };
            self.buf
                .reserve(want.saturating_sub(self.buf.len()).min(READ_CHUNK));
            if self.read(rd).await? == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(ReadFailure::Io(io::ErrorKind::UnexpectedEof.into()));
            }
            self.frame_since.get_or_insert_with(Instant::now);
        }
    }

    /// The message at the front of the buffer, or the bytes it needs in
    /// all; a length prefix over the limit is refused before its body is
    /// read.
    fn decode(&mut self) -> Result<Result<Message, usize>, ReadFailure> {
        if let Some(prefix) = self.buf.first_chunk::<LEN_BYTES>() {
            let len = LEN_BYTES.saturating_add(u32::from_le_bytes(*prefix) as usize);
            // Past MAX_FRAME the decoder's own error says more (Oversized).
            if len > self.max_frame && len <= LEN_BYTES + MAX_FRAME as usize {
                let max = self.max_frame;
                return Err(ReadFailure::TooLarge { len, max });
            }
        }
        match Message::decode(&self.buf) {
            Ok((msg, used)) => {
                self.consumed(used);
                Ok(Ok(msg))
            }
            Err(DecodeError::Truncated { needed }) => Ok(Err(needed)),
            Err(e) => Err(ReadFailure::Decode(e)),
        }
    }

    /// Drops a decoded frame. A buffer grown for a large frame shrinks
    /// back, so a quiet connection does not keep its largest frame's
    /// memory.
    fn consumed(&mut self, used: usize) {
        self.buf.drain(..used);
        let now = Instant::now();
        self.frame_since = (!self.buf.is_empty()).then_some(now);
        self.quiet_since = now;
        if self.buf.capacity() > READ_CHUNK && self.buf.len() <= READ_CHUNK {
            self.buf.shrink_to(READ_CHUNK);
        }
    }

    /// Reads what the socket has, within the wait that applies now.
    async fn read(&mut self, rd: &mut OwnedReadHalf) -> Result<usize, ReadFailure> {
        let deadline = self.deadline();
        let read = rd.read_buf(&mut self.buf);
        let n = match deadline {
            Some((at, wait)) => timeout_at(at, read)
                .await
                .map_err(|_| ReadFailure::Timeout(wait))?,
            None => read.await,
        };
        n.map_err(ReadFailure::Io)
    }

    /// The earliest deadline that applies: the frame's once it started,
    /// the handshake's until `Hello`, else the idle one.
    fn deadline(&self) -> Option<(Instant, Wait)> {
        let frame = self
            .frame_since
            .map(|t| (t + self.limits.frame, Wait::Frame));
        let handshake = self.handshake_by.map(|t| (t, Wait::Handshake));
        let idle = match (frame, handshake, self.limits.idle) {
            (None, None, Some(idle)) => Some((self.quiet_since + idle, Wait::Idle)),
            _ => None,
        };
        [frame, handshake, idle]
            .into_iter()
            .flatten()
            .min_by_key(|(at, _)| *at)
    }
}

/// Why a reply did not go out; either way the connection is done.
#[derive(Debug)]
pub(crate) enum WriteFailure {
    /// The socket failed (the client left).
    Io(io::Error),
    /// The client did not take the bytes within the write timeout.
    TimedOut,
}

/// Writes replies, each write within the write timeout (I19).
pub(crate) struct Writer {
    wr: OwnedWriteHalf,
    timeout: Duration,
    /// The frames of the replies being written, kept between requests:
    /// a reply is encoded without allocating (or growing) a buffer each
    /// time. Shrinks back to [`READ_CHUNK`] after a larger reply.
    out: Vec<u8>,
}

impl Writer {
    /// A writer whose writes may each take `timeout`.
    pub(crate) fn new(wr: OwnedWriteHalf, timeout: Duration) -> Self {
        Self {
            wr,
            timeout,
            out: Vec::new(),
        }
    }

    /// Writes `replies` as one buffer.
    pub(crate) async fn send(&mut self, replies: &[Message]) -> Result<(), WriteFailure> {
        if replies.is_empty() {
            return Ok(());
        }
        self.out.clear();
        encode_replies(replies, &mut self.out);
        let sent = match timeout(self.timeout, self.wr.write_all(&self.out)).await {
            Ok(written) => written.map_err(WriteFailure::Io),
            Err(_) => Err(WriteFailure::TimedOut),
        };
        if self.out.capacity() > READ_CHUNK {
            self.out = Vec::new();
        }
        sent
    }

    /// Bytes the reply buffer holds on to.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.out.capacity()
    }
}

/// `replies` as consecutive frames, appended to `out`.
fn encode_replies(replies: &[Message], out: &mut Vec<u8>) {
    for r in replies {
        if let Err(e) = r.encode(out) {
            // Only a reply over MAX_FRAME can fail; requests are bounded by
            // manager.max_batch, so this is a daemon bug: say so.
            tracing::error!(error = %e, reply = r.name(), "a reply did not encode");
            error(0, ErrorCode::INTERNAL, e.to_string())
                .encode(out)
                .ok();
        }
    }
}

/// An `Error` reply.
pub(crate) fn error(request_id: u64, code: ErrorCode, message: String) -> Message {
    Message::Error(Error {
        request_id,
        code,
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            frame_after_hello: request_frame_limit(4096, 2),
            handshake: Duration::from_secs(10),
            frame: Duration::from_secs(10),
            idle: None,
            write: Duration::from_secs(5),
        }
    }

    fn big_commit(entries: usize) -> Vec<u8> {
        let entry = CommitEntry {
            key: BlockHash(7),
            sums: BlockSums {
                block: 1,
                layers: vec![2, 3],
            },
        };
        let msg = Message::Commit(Commit {
            request_id: 1,
            entries: vec![entry; entries],
        });
        msg.to_frame().unwrap_or_default()
    }

    #[test]
    fn the_frame_limit_fits_the_largest_batch_exactly() {
        let limit = request_frame_limit(4096, 2);
        assert_eq!(limit, big_commit(4096).len());
        assert!(big_commit(4097).len() > limit);
        assert_eq!(
            request_frame_limit(usize::MAX, 2),
            LEN_BYTES + MAX_FRAME as usize
        );
    }

    #[test]
    fn log_fields_are_cut_at_a_character_boundary() {
        assert_eq!(clip("short"), "short");
        let long = "é".repeat(100);
        let cut = clip(&long);
        assert!(cut.len() <= LOG_CHARS && cut.len() >= LOG_CHARS - 1);
        assert!(long.starts_with(cut));
    }

    /// After a large frame the buffer goes back to [`READ_CHUNK`].
    #[tokio::test]
    async fn the_buffer_of_a_large_frame_is_given_back() {
        let (a, mut b) = tokio::net::UnixStream::pair().expect("a socket pair");
        let (mut rd, _wr) = a.into_split();
        let mut reader = FrameReader::new(limits());
        reader.greeted();
        let big = big_commit(4096);
        assert!(big.len() > 2 * READ_CHUNK);
        let sender = tokio::spawn(async move {
            b.write_all(&big).await.expect("send the frame");
            b
        });
        let msg = reader.next(&mut rd).await.expect("a frame");
        assert!(matches!(msg, Some(Message::Commit(c)) if c.entries.len() == 4096));
        assert!(reader.capacity() <= READ_CHUNK, "{}", reader.capacity());
        drop(sender.await);
    }

    #[tokio::test]
    async fn a_frame_over_the_limit_is_refused_from_its_prefix() {
        let (a, mut b) = tokio::net::UnixStream::pair().expect("a socket pair");
        let (mut rd, _wr) = a.into_split();
        let mut reader = FrameReader::new(limits());
        let prefix = (HELLO_FRAME_MAX as u32).to_le_bytes();
        b.write_all(&prefix).await.expect("send the prefix");
        let got = reader.next(&mut rd).await;
        assert!(
            matches!(got, Err(ReadFailure::TooLarge { len, max: HELLO_FRAME_MAX }) if len == HELLO_FRAME_MAX + LEN_BYTES),
            "{got:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_times_out_at_the_handshake_then_a_slow_frame() {
        let (a, mut b) = tokio::net::UnixStream::pair().expect("a socket pair");
        let (mut rd, _wr) = a.into_split();
        let mut reader = FrameReader::new(limits());
        let got = reader.next(&mut rd).await;
        assert!(
            matches!(got, Err(ReadFailure::Timeout(Wait::Handshake))),
            "{got:?}"
        );
        reader.greeted();
        b.write_all(&[9, 0, 0]).await.expect("part of a prefix");
        let got = reader.next(&mut rd).await;
        assert!(
            matches!(got, Err(ReadFailure::Timeout(Wait::Frame))),
            "{got:?}"
        );
    }

    fn reply(i: usize, len: usize) -> Message {
        if len == 0 {
            return Message::Ack(kvtier_protocol::Ack {
                request_id: i as u64,
            });
        }
        error(i as u64, ErrorCode::BAD_REQUEST, "x".repeat(len))
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]
        /// The writer's buffer kept between sends writes exactly the
        /// frames a fresh buffer would, whatever the sizes before, and
        /// holds at most [`READ_CHUNK`] between sends.
        #[test]
        fn a_reused_reply_buffer_writes_the_same_frames(
            batches in proptest::collection::vec(
                proptest::collection::vec(
                    proptest::prop_oneof![0usize..64, 0usize..3 * READ_CHUNK],
                    0..4,
                ),
                1..8,
            )
        ) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async {
                let (a, mut b) = tokio::net::UnixStream::pair().expect("a socket pair");
                let (_rd, wr) = a.into_split();
                let mut writer = Writer::new(wr, Duration::from_secs(5));
                for (n, lens) in batches.iter().enumerate() {
                    let replies: Vec<Message> =
                        lens.iter().map(|&len| reply(n, len)).collect();
                    let mut expected = Vec::new();
                    for r in &replies {
                        expected.extend(r.to_frame().expect("a frame"));
                    }
                    let reader = tokio::spawn(async move {
                        let mut got = vec![0u8; expected.len()];
                        tokio::io::AsyncReadExt::read_exact(&mut b, &mut got)
                            .await
                            .expect("the frames");
                        (b, got == expected)
                    });
                    writer.send(&replies).await.expect("sent");
                    let (back, same) = reader.await.expect("the reader");
                    b = back;
                    proptest::prop_assert!(same, "batch {} differs", n);
                    proptest::prop_assert!(writer.capacity() <= READ_CHUNK);
                }
                Ok(())
            })?;
        }
    }
}
