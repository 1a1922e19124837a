//! [`AsyncClient`]: the node protocol over a tokio Unix socket.
//!
//! Frames are encoded with `Message::to_frame` and decoded with
//! `Message::decode` from a receive buffer that grows as bytes arrive; the
//! request/reply matching is the [`Session`] that the blocking
//! [`Client`](crate::Client) uses too.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kvtier_arena::ArenaClient;
use kvtier_core::BlockHash;
use kvtier_protocol::{
    CommitEntry, CommitResult, Counter, DecodeError, HelloOk, KeyMap, Message, ReserveResult, Tier,
    TierInfo,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::config::ClientConfig;
use crate::error::{ClientError, Result};
use crate::load::Load;
use crate::session::{self, Call, Session};
use crate::store::{self, BlockSource, StoreOutcome};

/// The most the receive buffer grows by in one read: a frame announcing a
/// large length costs memory only as its bytes arrive.
const READ_CHUNK: usize = 64 << 10;

/// A connection to the node daemon on tokio. The same calls as
/// [`Client`](crate::Client), with the same round trips and checks.
///
/// A call whose future is dropped after sending its request (a `select!`
/// or timeout around it) leaves its answer on the way, so the connection
/// is then unusable ([`ClientError::Broken`]): connect again. Filling and
/// reading arena slots are memory copies done inline (no blocking I/O).
#[derive(Debug)]
pub struct AsyncClient {
    conn: Conn,
    session: Session,
    arena: Arc<ArenaClient>,
    /// Client keys to the keys the daemon stores (and the arena shows)
    /// them under: the namespace's [`KeyMap`].
    key_map: KeyMap,
    hello: HelloOk,
    timeout: Duration,
}

/// The socket and what was received but not yet decoded.
#[derive(Debug)]
struct Conn {
    stream: UnixStream,
    buf: Vec<u8>,
}

impl AsyncClient {
    /// Connects, says `Hello` and maps the arena; as
    /// [`Client::connect`](crate::Client::connect). Needs a tokio runtime
    /// with time enabled (for the timeout).
    pub async fn connect(config: ClientConfig) -> Result<Self> {
        config.validate()?;
        let timeout = config.timeout;
        let path = &config.socket_path;
        let stream = within(timeout, async {
            UnixStream::connect(path)
                .await
                .map_err(|source| ClientError::Connect {
                    path: path.clone(),
                    source,
                })
        })
        .await?;
        let mut conn = Conn {
            stream,
            buf: Vec::new(),
        };
        within(timeout, conn.send(&session::hello(&config))).await?;
        let hello = loop {
            let msg = within(timeout, conn.recv()).await?;
            if let Some(ok) = session::hello_reply(msg)? {
                break ok;
            }
        };
        // Opening and mapping a /dev/shm file does not block on a device.
        let arena = session::open_arena(&hello, &config.geometry)?;
        let key_map = KeyMap::new(hello.namespace_key);
        Ok(Self {
            conn,
            session: Session::new(config.geometry.layers, &hello.tiers),
            arena,
            key_map,
            hello,
            timeout,
        })
    }

    /// The daemon's `HelloOk`: session id, arena name and sizes.
    pub fn hello(&self) -> &HelloOk {
        &self.hello
    }

    /// The node's tiers, fastest first, with their kinds (from `HelloOk`):
    /// every tier [`lookup`](Self::lookup) names is one of them.
    pub fn tiers(&self) -> &[TierInfo] {
        &self.hello.tiers
    }

    /// How this session's keys map to the keys the arena shows its blocks
    /// under (from the namespace key in `HelloOk`): what a caller filling
    /// or reading slots itself seeds checksums with.
    pub fn key_map(&self) -> KeyMap {
        self.key_map
    }

    /// The mapped arena.
    pub fn arena(&self) -> &ArenaClient {
        &self.arena
    }

    /// `Lookup`; see [`Client::lookup`](crate::Client::lookup).
    pub async fn lookup(&mut self, keys: &[BlockHash]) -> Result<Vec<Tier>> {
        let call = self.session.lookup(keys);
        self.run(call).await
    }

    /// `Reserve`; see [`Client::reserve`](crate::Client::reserve).
    pub async fn reserve(&mut self, keys: &[BlockHash]) -> Result<Vec<ReserveResult>> {
        let call = self.session.reserve(keys);
        self.run(call).await
    }

    /// `Commit`; see [`Client::commit`](crate::Client::commit).
    pub async fn commit(&mut self, entries: Vec<CommitEntry>) -> Result<Vec<CommitResult>> {
        let call = self.session.commit(entries);
        self.run(call).await
    }

    /// `Abort`; see [`Client::abort`](crate::Client::abort).
    pub async fn abort(&mut self, keys: &[BlockHash]) -> Result<()> {
        let call = self.session.abort(keys);
        self.run(call).await
    }

    /// `Load`; see [`Client::load`](crate::Client::load).
    pub async fn load(&mut self, keys: &[BlockHash]) -> Result<Load> {
        let (call, ready) = self.session.load(keys);
        let id = call.id;
        let results = self.run(call).await?;
        let load = Load::new(
            id,
            keys,
            self.key_map,
            results,
            ready,
            Arc::clone(&self.arena),
        );
        self.session.settle(load)
    }

    /// Waits for layers `0..=layer` of `load`; see
    /// [`Client::wait_layer`](crate::Client::wait_layer).
    pub async fn wait_layer(&mut self, load: &Load, layer: u32) -> Result<()> {
        load.check_layer(layer)?;
        self.session.start()?;
        let wait = self.conn.wait(&mut self.session, load, layer);
        let out = within(self.timeout, wait).await;
        self.session.settle(out)
    }

    /// `Release`; see [`Client::release`](crate::Client::release).
    pub async fn release(&mut self, keys: &[BlockHash]) -> Result<()> {
        let call = self.session.release(keys);
        self.run(call).await
    }

    /// Releases every block `load` pinned.
    pub async fn release_load(&mut self, load: Load) -> Result<()> {
        self.release(&load.held_keys()).await
    }

    /// `Remove`; see [`Client::remove`](crate::Client::remove).
    pub async fn remove(&mut self, keys: &[BlockHash]) -> Result<()> {
        let call = self.session.remove(keys);
        self.run(call).await
    }

    /// `Stats`; see [`Client::stats`](crate::Client::stats).
    pub async fn stats(&mut self) -> Result<Vec<Counter>> {
        let call = self.session.stats();
        self.run(call).await
    }

    /// Reserve, fill, commit; see [`Client::store`](crate::Client::store).
    pub async fn store(&mut self, blocks: &[(BlockHash, &[u8])]) -> Result<Vec<StoreOutcome>> {
        store::check_blocks(&self.arena, blocks)?;
        self.store_from(blocks).await
    }

    /// See [`Client::store_from`](crate::Client::store_from).
    pub async fn store_from(
        &mut self,
        src: &(impl BlockSource + Sync + ?Sized),
    ) -> Result<Vec<StoreOutcome>> {
        if src.is_empty() {
            return Ok(Vec::new());
        }
        let results = self.reserve(&store::keys(src)).await?;
        let filled = match store::fill(&self.arena, self.key_map, src, &results) {
            Ok(filled) => filled,
            Err(failure) => {
                if let Err(e) = self.abort(&store::granted(src, &results)).await {
                    tracing::warn!(error = %e, "cannot abort reservations after a failed fill");
                }
                return Err(failure.into_error());
            }
        };
        let committed = if filled.entries.is_empty() {
            Vec::new()
        } else {
            self.commit(filled.entries).await?
        };
        Ok(store::outcomes(&results, &filled.indices, &committed))
    }

    /// Load, wait, read verified, release; see
    /// [`Client::load_into`](crate::Client::load_into).
    pub async fn load_into(&mut self, keys: &[BlockHash], dsts: &mut [&mut [u8]]) -> Result<usize> {
        store::check_buffers(&self.arena, keys, dsts)?;
        let load = self.load(keys).await?;
        self.wait_layer(&load, self.arena.layers() as u32 - 1)
            .await?;
        let (n, corrupt) = load.read_prefix(dsts);
        self.release_load(load).await?;
        if let Some(key) = corrupt {
            // A corrupt block is a miss for every reader of the namespace
            // and would block storing it again: remove it, so the next
            // store of the key puts good bytes there.
            self.remove(&[key]).await?;
        }
        Ok(n)
    }

    async fn run<T>(&mut self, call: Call<T>) -> Result<T> {
        self.session.start()?;
        let exchange = self.conn.exchange(&mut self.session, call);
        let out = within(self.timeout, exchange).await;
        self.session.settle(out)
    }
}

impl Conn {
    async fn exchange<T>(&mut self, session: &mut Session, call: Call<T>) -> Result<T> {
        self.send(&call.message).await?;
        loop {
            let msg = self.recv().await?;
            if let Some(out) = session.accept(&call, msg)? {
                return Ok(out);
            }
        }
    }

    async fn wait(&mut self, session: &mut Session, load: &Load, layer: u32) -> Result<()> {
        while !load.is_ready(layer) {
            let msg = self.recv().await?;
            session.accept_notification(msg)?;
        }
        Ok(())
    }

    async fn send(&mut self, msg: &Message) -> Result<()> {
        let frame = msg.to_frame()?;
        self.stream
            .write_all(&frame)
            .await
            .map_err(ClientError::from_io)
    }

    /// Reads one message; the end of the stream is
    /// [`ClientError::Disconnected`].
    async fn recv(&mut self) -> Result<Message> {
        loop {
            match Message::decode(&self.buf) {
                Ok((msg, used)) => {
                    self.buf.drain(..used);
                    return Ok(msg);
                }
                Err(DecodeError::Truncated { needed }) => {
                    let want = needed.saturating_sub(self.buf.len()).clamp(1, READ_CHUNK);
                    self.buf.reserve(want);
                    let n = self
                        .stream
                        .read_buf(&mut self.buf)
                        .await
                        .map_err(ClientError::from_io)?;
                    if n == 0 {
                        return Err(ClientError::Disconnected);
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Runs `fut`, or fails with [`ClientError::Timeout`] after `timeout`.
async fn within<T>(timeout: Duration, fut: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(timeout, fut)
        .await
        .unwrap_or(Err(ClientError::Timeout(timeout)))
}
