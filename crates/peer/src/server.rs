//! The serving side: [`PeerServer`] accepts peers on a TCP listener,
//! authenticates each, and answers their reads from a [`BlockSource`]
//! (docs/peer-protocol.md §4–§6).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Buf;
use kvtier_core::BlockHash;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, oneshot};
use tokio::task::{JoinHandle, JoinSet};

use crate::auth::{Role, Transcript, nonce};
use crate::client::Identity;
use crate::error::PeerError;
use crate::frame::{
    BlockReply, ErrorCode, ErrorReply, Frame, Hello, HelloOk, LayerRange, MAX_HANDSHAKE_FRAME,
    MAX_REQUEST_FRAME, PEER_VERSION, Read, RefuseReason, Refused, encode_block_head,
    read_frame_up_to, write_frame,
};
use crate::source::BlockSource;
use crate::stats::{Counters, StatsHandle};

/// Keys a server asks its source for at once: bounds the block bytes one
/// connection holds to this many blocks.
const SOURCE_BATCH: usize = 8;

/// Busy refusals in progress at once; peers past this are dropped.
const BUSY_REFUSALS: usize = 16;

/// How long a busy refusal waits for its peer to close.
const BUSY_LINGER: Duration = Duration::from_secs(1);

/// How a [`PeerServer`] runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// This node, as it proves itself to peers.
    pub identity: Identity,
    /// Connections served at once; more are refused `Busy`. Default: 256.
    pub max_connections: usize,
    /// Time a peer has to finish the handshake. Default: 5 s.
    pub handshake_timeout: Duration,
    /// Time one reply frame may take to write: a peer that stops reading
    /// is dropped, rather than holding its connection and the blocks
    /// being sent. Default: 30 s.
    pub write_timeout: Duration,
}

impl ServerConfig {
    /// The default of [`max_connections`](Self::max_connections).
    pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
    /// The default of [`handshake_timeout`](Self::handshake_timeout).
    pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
    /// The default of [`write_timeout`](Self::write_timeout).
    pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

    /// The defaults for `identity`.
    pub fn new(identity: Identity) -> Self {
        Self {
            identity,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            handshake_timeout: Self::DEFAULT_HANDSHAKE_TIMEOUT,
            write_timeout: Self::DEFAULT_WRITE_TIMEOUT,
        }
    }
}

/// The peer data plane's server.
#[derive(Debug)]
pub struct PeerServer;

/// A running server: its address, and the way to stop it. Dropping the
/// handle stops the server too.
#[derive(Debug)]
pub struct ServerHandle {
    addr: SocketAddr,
    stats: StatsHandle,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl ServerHandle {
    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's counters, readable after it stopped too.
    pub fn stats(&self) -> StatsHandle {
        self.stats.clone()
    }

    /// Stops accepting and closes every connection (a read in progress
    /// ends: its client sees the stream close), then returns.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        // The task owns every connection (a JoinSet): aborting it ends them.
        self.task.abort();
    }
}

impl PeerServer {
    /// Serves `source` on `listener` in a new task until the handle is
    /// shut down or dropped.
    pub fn start(
        listener: TcpListener,
        config: ServerConfig,
        source: Arc<dyn BlockSource>,
    ) -> std::io::Result<ServerHandle> {
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel();
        let stats = StatsHandle::default();
        let task = tokio::spawn(Self::serve(
            listener,
            config,
            source,
            stats.clone(),
            async {
                let _ = stopped.await;
            },
        ));
        Ok(ServerHandle {
            addr,
            stats,
            stop: Some(stop),
            task,
        })
    }

    /// Serves `source` on `listener` until `shutdown` completes; then every
    /// connection is closed. Counts into `stats`.
    pub async fn serve(
        listener: TcpListener,
        config: ServerConfig,
        source: Arc<dyn BlockSource>,
        stats: StatsHandle,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let gate = Gate {
            slots: Arc::new(Semaphore::new(config.max_connections)),
            refusals: Arc::new(Semaphore::new(BUSY_REFUSALS)),
            config: Arc::new(config),
            source,
            counters: stats.0,
        };
        // Dropping the set when this returns aborts every connection.
        let mut connections = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                accepted = listener.accept() => match accepted {
                    Ok((stream, from)) => gate.admit(&mut connections, stream, from),
                    Err(e) => accept_failed(e).await,
                },
            }
        }
    }
}

/// What an accepted connection goes through: a connection slot, or else a
/// refusal slot, or else nothing.
struct Gate {
    config: Arc<ServerConfig>,
    source: Arc<dyn BlockSource>,
    /// One permit per connection served (`max_connections`).
    slots: Arc<Semaphore>,
    /// One permit per busy refusal in progress.
    refusals: Arc<Semaphore>,
    counters: Arc<Counters>,
}

impl Gate {
    /// Serves `stream` in `connections` if a slot is free, else refuses it.
    fn admit(&self, connections: &mut JoinSet<()>, stream: TcpStream, from: SocketAddr) {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            let (config, source) = (self.config.clone(), self.source.clone());
            Counters::add(&self.counters.accepted, 1);
            // Moved into the task, so the connection is counted closed
            // however the task ends: aborted at shutdown, even unpolled.
            let closed = Closed(self.counters.clone());
            connections.spawn(async move {
                connection(stream, from, &config, &*source, &closed.0).await;
                drop(permit);
                drop(closed);
            });
            return;
        }
        Counters::add(&self.counters.refused, 1);
        if let Ok(permit) = self.refusals.clone().try_acquire_owned() {
            connections.spawn(async move {
                refuse_busy(stream, from).await;
                drop(permit);
            });
        }
        // Else the stream drops here: closed without a word.
    }
}

/// Counts a connection closed when dropped.
struct Closed(Arc<Counters>);

impl Drop for Closed {
    fn drop(&mut self) {
        Counters::add(&self.0.closed, 1);
    }
}

/// Tells a peer over the connection limit so, then waits briefly for it
/// to close: closing a socket with its `Hello` unread would reset the
/// connection, and a reset can discard the refusal before the peer reads
/// it. Refusals hold a slot of their own (a few), so a flood of peers is
/// dropped without a word rather than queued.
async fn refuse_busy(mut stream: TcpStream, from: SocketAddr) {
    tracing::warn!(%from, "peer connection refused: at the connection limit");
    let message = "the node is at its peer connection limit".to_owned();
    let _ = refuse(&mut stream, (RefuseReason::Busy, message)).await;
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 1024];
    let drain = async { while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {} };
    let _ = tokio::time::timeout(BUSY_LINGER, drain).await;
}

/// An accept error (out of file descriptors, mostly) is logged and waited
/// out briefly, so the loop does not spin while it lasts.
async fn accept_failed(e: std::io::Error) {
    tracing::warn!(error = %e, "accepting a peer connection failed");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// One peer connection: the handshake within its deadline, then requests
/// one at a time until the peer closes or errs.
async fn connection(
    mut stream: TcpStream,
    from: SocketAddr,
    config: &ServerConfig,
    source: &dyn BlockSource,
    counters: &Counters,
) {
    let _ = stream.set_nodelay(true);
    let shook = tokio::time::timeout(config.handshake_timeout, handshake(&mut stream, config));
    let peer = match shook.await {
        Ok(Ok(peer)) => peer,
        Ok(Err(e)) => {
            let failures = match &e {
                PeerError::Refused { .. } => &counters.auth_failures,
                _ => &counters.handshake_failures,
            };
            Counters::add(failures, 1);
            return tracing::info!(%from, error = %e, "peer handshake failed");
        }
        Err(_) => {
            Counters::add(&counters.handshake_failures, 1);
            return tracing::info!(%from, "peer handshake timed out");
        }
    };
    Counters::add(&counters.authenticated, 1);
    tracing::debug!(%from, %peer, "peer connected");
    if let Err(e) = requests(&mut stream, source, config.write_timeout, counters).await {
        tracing::info!(%from, %peer, error = %e, "peer connection closed on an error");
    }
}

/// The server's half of the handshake; returns the client's node name
/// once it has proved it holds the secret.
async fn handshake(stream: &mut TcpStream, config: &ServerConfig) -> Result<String, PeerError> {
    let hello = match read_frame_up_to(stream, MAX_HANDSHAKE_FRAME).await? {
        Some(Frame::Hello(h)) => h,
        Some(other) => return Err(reply_unexpected(stream, &other, "Hello").await),
        None => return Err(PeerError::Closed),
    };
    let me = &config.identity;
    if let Some(refusal) = check_hello(&hello, me) {
        return Err(refuse(stream, refusal).await);
    }
    let ours = nonce();
    let t = Transcript {
        cluster: &me.cluster,
        client: &hello.node,
        server: &me.node,
        client_nonce: &hello.nonce,
        server_nonce: &ours,
    };
    let ok = HelloOk {
        version: PEER_VERSION,
        node: me.node.clone(),
        nonce: ours,
        proof: t.proof(&me.secret, Role::Server),
    };
    write_frame(stream, &Frame::HelloOk(ok)).await?;
    let proof = match read_frame_up_to(stream, MAX_HANDSHAKE_FRAME).await? {
        Some(Frame::Proof(p)) => p,
        Some(other) => return Err(reply_unexpected(stream, &other, "Proof").await),
        None => return Err(PeerError::Closed),
    };
    if !t.verify(&me.secret, Role::Client, &proof) {
        let why = format!(
            "node {:?} failed authentication (another cluster secret?)",
            hello.node
        );
        return Err(refuse(stream, (RefuseReason::BadProof, why)).await);
    }
    write_frame(stream, &Frame::Ready).await?;
    Ok(hello.node)
}

/// Why a `Hello` is refused before any proof, if it is.
fn check_hello(hello: &Hello, me: &Identity) -> Option<(RefuseReason, String)> {
    if hello.version.major != PEER_VERSION.major {
        let why = format!("protocol {} is not {}", hello.version, PEER_VERSION);
        return Some((RefuseReason::WrongVersion, why));
    }
    if hello.cluster != me.cluster {
        let why = format!("cluster {:?} is not {:?}", hello.cluster, me.cluster);
        return Some((RefuseReason::WrongCluster, why));
    }
    None
}

/// Sends `Refused` (best effort: the connection closes anyway) and returns
/// the error that closes it.
async fn refuse(stream: &mut TcpStream, (reason, message): (RefuseReason, String)) -> PeerError {
    let frame = Frame::Refused(Refused {
        reason,
        message: message.clone(),
    });
    let _ = write_frame(stream, &frame).await;
    PeerError::Refused { reason, message }
}

/// Sends an `Error` (best effort) for a frame out of place and returns the
/// error that closes the connection.
async fn reply_unexpected(
    stream: &mut TcpStream,
    got: &Frame,
    expected: &'static str,
) -> PeerError {
    let message = format!("{} where {expected} was due", got.name());
    send_error(stream, ErrorCode::Unexpected, message).await;
    PeerError::Unexpected {
        got: got.name(),
        expected,
    }
}

async fn send_error(stream: &mut TcpStream, code: ErrorCode, message: String) {
    let _ = write_frame(stream, &Frame::Error(ErrorReply { code, message })).await;
}

/// Serves requests until the peer closes (`Ok`) or sends something that
/// ends the connection (`Err`, after an `Error` frame where one helps).
async fn requests(
    stream: &mut TcpStream,
    source: &dyn BlockSource,
    write_timeout: Duration,
    counters: &Counters,
) -> Result<(), PeerError> {
    loop {
        let frame = match read_frame_up_to(stream, MAX_REQUEST_FRAME).await {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(()),
            Err(PeerError::Decode(e)) => {
                send_error(stream, ErrorCode::Malformed, e.to_string()).await;
                return Err(e.into());
            }
            Err(e) => return Err(e),
        };
        match frame {
            Frame::Ping(token) => write_frame(stream, &Frame::Pong(token)).await?,
            Frame::Read(read) => serve_read(stream, source, read, write_timeout, counters).await?,
            other => return Err(reply_unexpected(stream, &other, "Read or Ping").await),
        }
    }
}

/// Answers one `Read`: a `Block` frame per key, in order, read from the
/// source a few keys at a time.
async fn serve_read(
    stream: &mut TcpStream,
    source: &dyn BlockSource,
    read: Read,
    write_timeout: Duration,
    counters: &Counters,
) -> Result<(), PeerError> {
    Counters::add(&counters.reads, 1);
    if let LayerRange::Span { start, end } = read.layers
        && start >= end
    {
        let message = format!("empty layer range {start}..{end}");
        send_error(stream, ErrorCode::BadRange, message).await;
        return Ok(());
    }
    if !source.ready() {
        let message = "the node cannot tell which blocks it holds yet".to_owned();
        send_error(stream, ErrorCode::NotReady, message).await;
        return Ok(());
    }
    for (n, keys) in read.keys.chunks(SOURCE_BATCH).enumerate() {
        let first = n * SOURCE_BATCH;
        let mut blocks = source.read(keys, read.layers).await.into_iter();
        for (i, key) in keys.iter().enumerate() {
            let reply = BlockReply {
                req_id: read.req_id,
                index: (first + i) as u32,
                found: blocks.next().flatten(),
            };
            let sent = write_block(stream, reply, *key, write_timeout).await?;
            match sent {
                Some(bytes) => {
                    Counters::add(&counters.blocks_sent, 1);
                    Counters::add(&counters.bytes_sent, bytes as u64);
                }
                None => Counters::add(&counters.blocks_missing, 1),
            }
        }
    }
    Ok(())
}

/// Writes one `Block` frame within `write_timeout`: its head, then the
/// block's bytes from the source's buffer, in one vectored write (no copy
/// into a frame). A block too large for a frame goes as a miss. Returns
/// the block bytes sent, `None` for a miss.
async fn write_block(
    stream: &mut TcpStream,
    mut reply: BlockReply,
    key: BlockHash,
    write_timeout: Duration,
) -> Result<Option<usize>, PeerError> {
    let head = match encode_block_head(&reply) {
        Ok(head) => head,
        Err(_) => {
            tracing::warn!(%key, "a block too large for a peer frame was sent as a miss");
            reply.found = None;
            encode_block_head(&reply)?
        }
    };
    let bytes: &[u8] = reply.found.as_ref().map_or(&[], |b| &b.bytes);
    let sent = reply.found.as_ref().map(|b| b.bytes.len());
    let mut frame = Buf::chain(head.as_slice(), bytes);
    match tokio::time::timeout(write_timeout, stream.write_all_buf(&mut frame)).await {
        Ok(written) => written.map(|()| sent).map_err(PeerError::from),
        Err(_) => Err(PeerError::Timeout),
    }
}
