//! [`Client`]: the node protocol over a blocking `std` Unix socket.

use std::io::{self, BufReader};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use kvtier_arena::ArenaClient;
use kvtier_core::BlockHash;
use kvtier_protocol::{
    CommitEntry, CommitResult, Counter, FrameError, HelloOk, KeyMap, Message, ReserveResult, Tier,
    TierInfo, read_frame, write_frame,
};

use crate::config::ClientConfig;
use crate::error::{ClientError, Result};
use crate::load::Load;
use crate::session::{self, Call, Session};
use crate::store::{self, BlockSource, StoreOutcome};

/// A connection to the node daemon, blocking. See the crate docs.
///
/// Every call is one round trip with the whole batch (never one per
/// block) and takes `&mut self`: one request is in flight at a time. Any
/// error for which [`ClientError::is_fatal`] holds leaves the connection
/// unusable (later calls fail fast); [`connect`](Self::connect) again.
#[derive(Debug)]
pub struct Client {
    /// Buffered for reads (a `LoadOk` and its notifications often arrive
    /// together); writes go to the stream underneath, one frame each.
    stream: BufReader<UnixStream>,
    session: Session,
    arena: Arc<ArenaClient>,
    /// Client keys to the keys the daemon stores (and the arena shows)
    /// them under: the namespace's [`KeyMap`].
    key_map: KeyMap,
    hello: HelloOk,
    timeout: Duration,
}

impl Client {
    /// Connects to the daemon at `config.socket_path`, says `Hello` and
    /// maps the arena the daemon names, checking that it is the one
    /// announced and holds blocks of `config.geometry`. A refusal (wrong
    /// version, geometry mismatch) is [`ClientError::Refused`] with the
    /// daemon's code and message.
    pub fn connect(config: ClientConfig) -> Result<Self> {
        config.validate()?;
        let stream =
            UnixStream::connect(&config.socket_path).map_err(|source| ClientError::Connect {
                path: config.socket_path.clone(),
                source,
            })?;
        let timeout = config.timeout;
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| stream.set_write_timeout(Some(timeout)))
            .map_err(ClientError::Io)?;
        let mut stream = BufReader::new(stream);
        write_frame(stream.get_mut(), &session::hello(&config)).map_err(frame_err(timeout))?;
        let hello = loop {
            if let Some(ok) = session::hello_reply(recv(&mut stream, timeout)?)? {
                break ok;
            }
        };
        let arena = session::open_arena(&hello, &config.geometry)?;
        let key_map = KeyMap::new(hello.namespace_key);
        Ok(Self {
            stream,
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

    /// `Lookup`: the tier of each block of the longest stored prefix of
    /// `keys` (its length is the prefix length).
    pub fn lookup(&mut self, keys: &[BlockHash]) -> Result<Vec<Tier>> {
        let call = self.session.lookup(keys);
        self.run(call)
    }

    /// `Reserve`: one result per key; fill each `Slot` (see
    /// [`ArenaClient::fill`]) and [`commit`](Self::commit) or
    /// [`abort`](Self::abort). [`store`](Self::store) does all three.
    pub fn reserve(&mut self, keys: &[BlockHash]) -> Result<Vec<ReserveResult>> {
        let call = self.session.reserve(keys);
        self.run(call)
    }

    /// `Commit`: makes filled slots readable; one result per entry.
    pub fn commit(&mut self, entries: Vec<CommitEntry>) -> Result<Vec<CommitResult>> {
        let call = self.session.commit(entries);
        self.run(call)
    }

    /// `Abort`: gives reserved slots back unfilled.
    pub fn abort(&mut self, keys: &[BlockHash]) -> Result<()> {
        let call = self.session.abort(keys);
        self.run(call)
    }

    /// `Load`: pins the blocks in the arena for this client. Read them
    /// from the returned [`Load`] once [`wait_layer`](Self::wait_layer)
    /// says their layers are ready; then [`release_load`](Self::release_load).
    pub fn load(&mut self, keys: &[BlockHash]) -> Result<Load> {
        let (call, ready) = self.session.load(keys);
        let id = call.id;
        let results = self.run(call)?;
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

    /// Waits until layers `0..=layer` of every slot of `load` are ready
    /// (reading the daemon's `LayerReady` notifications; those for other
    /// loads are recorded on the way). Returns at once for a load without
    /// slots.
    pub fn wait_layer(&mut self, load: &Load, layer: u32) -> Result<()> {
        load.check_layer(layer)?;
        self.session.start()?;
        let out = self.wait(load, layer);
        self.session.settle(out)
    }

    /// `Release`: unpins loaded blocks.
    pub fn release(&mut self, keys: &[BlockHash]) -> Result<()> {
        let call = self.session.release(keys);
        self.run(call)
    }

    /// Releases every block `load` pinned.
    pub fn release_load(&mut self, load: Load) -> Result<()> {
        self.release(&load.held_keys())
    }

    /// `Remove`: drops the blocks from every tier.
    pub fn remove(&mut self, keys: &[BlockHash]) -> Result<()> {
        let call = self.session.remove(keys);
        self.run(call)
    }

    /// `Stats`: the daemon's counters.
    pub fn stats(&mut self) -> Result<Vec<Counter>> {
        let call = self.session.stats();
        self.run(call)
    }

    /// Stores blocks (each exactly the block size): one `Reserve` for the
    /// batch, each granted slot filled with a fused copy and checksum, one
    /// `Commit` with those checksums. If filling fails or panics, the
    /// reserved keys are aborted first. One outcome per block.
    pub fn store(&mut self, blocks: &[(BlockHash, &[u8])]) -> Result<Vec<StoreOutcome>> {
        store::check_blocks(&self.arena, blocks)?;
        self.store_from(blocks)
    }

    /// [`store`](Self::store) from blocks whose layers lie apart (an
    /// engine's per-layer KV tensors): each layer is copied from where
    /// `src` says. A layer of the wrong length fails the store, the
    /// reservations aborted.
    pub fn store_from(&mut self, src: &(impl BlockSource + ?Sized)) -> Result<Vec<StoreOutcome>> {
        if src.is_empty() {
            return Ok(Vec::new());
        }
        let results = self.reserve(&store::keys(src))?;
        let filled = match store::fill(&self.arena, self.key_map, src, &results) {
            Ok(filled) => filled,
            Err(failure) => {
                if let Err(e) = self.abort(&store::granted(src, &results)) {
                    tracing::warn!(error = %e, "cannot abort reservations after a failed fill");
                }
                return Err(failure.into_error());
            }
        };
        let committed = if filled.entries.is_empty() {
            Vec::new()
        } else {
            self.commit(filled.entries)?
        };
        Ok(store::outcomes(&results, &filled.indices, &committed))
    }

    /// Loads blocks into `dsts` (one buffer of the block size per key):
    /// one `Load`, a wait for every layer, a verified copy of each pinned
    /// block, one `Release`. Returns how many leading blocks were copied
    /// and verified; the first miss or failed verification ends the prefix
    /// (the buffers from there on hold nothing useful). A block that failed
    /// verification is then removed from the node (one `Remove`), so it
    /// can be stored again.
    pub fn load_into(&mut self, keys: &[BlockHash], dsts: &mut [&mut [u8]]) -> Result<usize> {
        store::check_buffers(&self.arena, keys, dsts)?;
        let load = self.load(keys)?;
        self.wait_layer(&load, self.arena.layers() as u32 - 1)?;
        let (n, corrupt) = load.read_prefix(dsts);
        self.release_load(load)?;
        if let Some(key) = corrupt {
            // A corrupt block is a miss for every reader of the namespace
            // and would block storing it again: remove it, so the next
            // store of the key puts good bytes there.
            self.remove(&[key])?;
        }
        Ok(n)
    }

    fn run<T>(&mut self, call: Call<T>) -> Result<T> {
        self.session.start()?;
        let out = self.exchange(call);
        self.session.settle(out)
    }

    fn exchange<T>(&mut self, call: Call<T>) -> Result<T> {
        write_frame(self.stream.get_mut(), &call.message).map_err(frame_err(self.timeout))?;
        loop {
            let msg = recv(&mut self.stream, self.timeout)?;
            if let Some(out) = self.session.accept(&call, msg)? {
                return Ok(out);
            }
        }
    }

    fn wait(&mut self, load: &Load, layer: u32) -> Result<()> {
        while !load.is_ready(layer) {
            let msg = recv(&mut self.stream, self.timeout)?;
            self.session.accept_notification(msg)?;
        }
        Ok(())
    }
}

/// Reads one message; the end of the stream is [`ClientError::Disconnected`].
fn recv(stream: &mut BufReader<UnixStream>, timeout: Duration) -> Result<Message> {
    read_frame(stream)
        .map_err(frame_err(timeout))?
        .ok_or(ClientError::Disconnected)
}

/// Classifies a frame error; a socket timeout shows up as `WouldBlock` or
/// `TimedOut`.
fn frame_err(timeout: Duration) -> impl Fn(FrameError) -> ClientError {
    move |e| match e {
        FrameError::Io(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            ClientError::Timeout(timeout)
        }
        e => e.into(),
    }
}
