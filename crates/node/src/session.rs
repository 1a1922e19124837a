//! One connection: the handshake, then batched requests until the client
//! leaves, with the leases of its reservations and pins. Everything a
//! session holds is dropped with it, so a client that disconnects or dies
//! leaves nothing reserved, pinned or half-visible.

use std::collections::{HashMap, HashSet};

use hashbrown::hash_map::Entry;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvtier_core::{BlockChecksum, BlockHash, BlockSums, Tier, TierKind};
use kvtier_manager::manager::{HostCommit, HostReservation, HostReserve, ManagerError, Onboarding};
use kvtier_manager::pool::ImmutableBlock;
use kvtier_mem::BlockRef;
use kvtier_protocol::{
    Ack, Commit, CommitOk, CommitResult, DecodeError, ErrorCode, Hello, HelloOk, KeyMap,
    KeysRequest, LayerReady, LoadOk, LoadResult, LookupOk, Message, OPENING_INTERVAL_MS, Opening,
    PROTOCOL_VERSION, ReserveOk, ReserveResult, Slot, StatsOk, TierInfo, WireGeometry,
};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::watch;

use crate::conn::{
    FrameReader, Limits, ReadFailure, Wait, WriteFailure, Writer, check_hello_strings, clip, error,
    request_frame_limit,
};
use crate::observer::{ClusterBlock, CommittedKey, PeerLocation, SessionNamespace, SharedLocation};
use crate::peer_load::{Fetched, Located, PeerStream};
use crate::stats::Counters;
use crate::{Node, NodeHost};

/// A value that lapses at `until` unless the client uses it first.
struct Leased<T> {
    value: T,
    until: Instant,
}

/// A block pinned for the client: the G2 pool handle keeps the manager
/// from evicting it, the arena reference keeps the slot from being reused.
struct Pin {
    block: ImmutableBlock,
    arena: BlockRef,
}

/// One key's pins, newest last. The first lives inline, so the usual
/// single pin of a key costs the session no allocation per key.
struct Pins<T = Pin> {
    first: Leased<T>,
    more: Vec<Leased<T>>,
}

impl<T> Pins<T> {
    fn new(pin: Leased<T>) -> Self {
        Self {
            first: pin,
            more: Vec::new(),
        }
    }

    fn len(&self) -> usize {
        1 + self.more.len()
    }

    /// Takes the newest pin unless it is the last one (then the caller
    /// removes the key's entry, which holds it).
    fn pop_extra(&mut self) -> Option<Leased<T>> {
        self.more.pop()
    }

    /// Drops the pins whose lease ended by `now` but the first, which
    /// the caller drops with the entry when it is the last; how many
    /// ended, and whether none is left.
    fn expire(&mut self, now: Instant) -> (u64, bool) {
        let n = self.len();
        self.more.retain(|p| p.until > now);
        if self.first.until <= now {
            if self.more.is_empty() {
                return (n as u64, true);
            }
            self.first = self.more.remove(0);
        }
        ((n - self.len()) as u64, false)
    }
}

/// Where a block of a `Load` is in the arena when the answer goes out.
enum Place {
    /// Published; the reference keeps it in its slot until pinned.
    Resident(BlockRef, Slot),
    /// Arriving from the disk or G4 layer by layer into this slot.
    Arriving(BlockHash, Slot),
}

impl Place {
    fn hash(&self) -> BlockHash {
        match self {
            Self::Resident(r, _) => r.key(),
            Self::Arriving(h, _) => *h,
        }
    }

    fn slot(&self) -> Slot {
        match self {
            Self::Resident(_, slot) | Self::Arriving(_, slot) => *slot,
        }
    }

    /// What `LoadOk` says of it: a resident block with the checksums the
    /// daemon holds for it (the client verifies against these, never
    /// against the slot table, which clients can write).
    fn answer(&self) -> LoadResult {
        match self {
            Self::Resident(r, slot) => LoadResult::Resident(*slot, r.sums_handle()),
            Self::Arriving(_, slot) => LoadResult::Arriving(*slot),
        }
    }

    /// The checksum of layer `layer`, once it is in place.
    fn layer_sum(&self, onboarding: &Onboarding, layer: u32) -> Option<u64> {
        match self {
            Self::Resident(r, _) => r.shared_sums().layers.get(layer as usize).copied(),
            Self::Arriving(h, _) => onboarding.landing_layer_sum(*h, layer),
        }
    }
}

/// Why a `Load` ended early.
enum LoadFailure {
    /// Writing to the client failed or timed out: the connection is done.
    Write(WriteFailure),
    /// The manager failed before the answer went out.
    BeforeAnswer(ManagerError),
    /// The manager failed after `LoadOk`.
    AfterAnswer(ManagerError),
}

/// Arena slot `slot` as the protocol names it.
fn arena_slot(memory: &kvtier_mem::MemoryTier, slot: usize) -> Slot {
    Slot {
        offset: memory.slot_offset(slot),
        len: memory.block_bytes() as u64,
    }
}

/// `LoadOk` with `found` for the leading keys of `n`, the rest misses.
fn load_ok(id: u64, n: usize, found: impl Iterator<Item = LoadResult>) -> Message {
    let mut results: Vec<LoadResult> = found.collect();
    results.resize(n, LoadResult::Miss);
    Message::LoadOk(LoadOk {
        request_id: id,
        results,
    })
}

fn layer_ready(request_id: u64, layer: u32, sums: impl Iterator<Item = u64>) -> Message {
    Message::LayerReady(LayerReady {
        request_id,
        layer,
        sums: sums.collect(),
    })
}

/// Client keys a [`KeyCache`] holds at most before it starts over.
const KEY_CACHE_MAX: usize = 4096;

/// The stored keys ([`KeyMap::stored`], a keyed BLAKE3 each: the largest
/// per-key cost of a request) of the client keys one session named lately.
/// A request mostly names the keys of the one before it (`Reserve`,
/// `Commit` and `Remove` of a batch; `Load` and `Release`), so most are
/// found here. One per session, filled from that session's own map only
/// (emptied when its `Hello` sets the map), so no namespace sees
/// another's keys. Bounded: emptied when full. Hashed with hashbrown's
/// seeded foldhash, not SipHash: the lookup is the cost this saves, and a
/// client that picks colliding keys slows only its own session.
#[derive(Default)]
struct KeyCache(hashbrown::HashMap<BlockHash, BlockHash>);

impl KeyCache {
    /// The stored key of client key `key` under `keys`.
    fn stored(&mut self, keys: &KeyMap, key: BlockHash) -> BlockHash {
        if let Some(stored) = self.0.get(&key) {
            return *stored;
        }
        if self.0.len() >= KEY_CACHE_MAX {
            self.0.clear();
        }
        let stored = keys.stored(key);
        self.0.insert(key, stored);
        stored
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// Peer locations a session remembers at most; past it, the expired ones
/// go, then all (a `Lookup` locates them again).
const LOCATED_MAX: usize = 4096;

/// The first protocol minor that knows the `peer` tier kind (code 5): the
/// peer tier is listed only to clients that announced it (section 5 of
/// docs/node-protocol.md).
const PEER_KIND_MINOR: u16 = 1;

/// The first protocol minor that knows `Opening` (type `0x04`): sent only
/// to clients that announced it (section 5 of docs/node-protocol.md).
const OPENING_MINOR: u16 = 2;

/// What the session loop does after a message.
enum Next {
    Continue,
    Close,
}

/// Serves one connection of `host`. Before the node's shape is known the
/// first frame is read here: a valid `Hello` opens the node with its shape
/// ([`NodeHost`]), or waits for the `Hello` that does, then the session
/// goes on as any other, from that `Hello`.
pub(crate) async fn serve_host(
    host: Arc<NodeHost>,
    stream: UnixStream,
    id: u64,
    mut stop: watch::Receiver<bool>,
) {
    if let Some(node) = host.node() {
        return serve(node.clone(), stream, id, stop).await;
    }
    let (mut rd, wr) = stream.into_split();
    // The frame limit after `Hello` depends on the shape: set below.
    let limits = Limits::of(host.options(), 1);
    let mut reader = FrameReader::new(limits);
    let mut wr = Writer::new(wr, limits.write);
    let read = tokio::select! {
        read = reader.next(&mut rd) => read,
        _ = stop.changed() => return,
    };
    let hello = match first_hello(&host, read) {
        Ok(hello) => hello,
        Err(refusal) => {
            if let Some((code, why)) = refusal {
                let _ = wr.send(&[error(0, code, why)]).await;
            }
            return;
        }
    };
    let Some(opened) = open_for(&host, &hello, &mut wr, &mut stop).await else {
        return;
    };
    let node = match opened {
        Ok(node) => node,
        Err((code, why)) => {
            Counters::add(&host.counters.handshake_refusals, 1);
            tracing::warn!(session = id, model = clip(&hello.namespace.model), reason = %why, "refused a node client");
            let _ = wr.send(&[error(0, code, why)]).await;
            return;
        }
    };
    reader.shaped(request_frame_limit(
        node.options().max_batch,
        node.geometry().layers,
    ));
    let conn = Conn {
        session: Session::new(node, id),
        reader,
        wr,
    };
    run(conn, rd, Some(Message::Hello(hello)), stop).await;
}

/// The node for `hello` ([`NodeHost::node_for`]), telling a 4.2 client
/// every [`OPENING_INTERVAL_MS`] that it is still opening (`Opening`), so
/// that a slow open (a new disk tier's data file written through) does
/// not look like a stuck daemon. A client that leaves meanwhile does not
/// cancel the open: the next engine finds the node open. `None` if the
/// server stops first.
async fn open_for(
    host: &NodeHost,
    hello: &Hello,
    wr: &mut Writer,
    stop: &mut watch::Receiver<bool>,
) -> Option<Result<Arc<Node>, (ErrorCode, String)>> {
    let start = Instant::now();
    let mut tell = hello.protocol_version.minor >= OPENING_MINOR;
    let every = Duration::from_millis(OPENING_INTERVAL_MS);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    // A stalled runtime sends one late `Opening`, not a burst (I29).
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let open = host.node_for(hello);
    tokio::pin!(open);
    loop {
        tokio::select! {
            opened = &mut open => return Some(opened),
            _ = ticks.tick(), if tell => {
                let elapsed_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
                // A client that stopped reading or left gets no more; the
                // open goes on.
                tell = wr.send(&[Message::Opening(Opening { elapsed_ms })]).await.is_ok();
            }
            _ = stop.changed() => return None,
        }
    }
}

/// The first frame of a connection the node has no shape for yet: a
/// `Hello` fit to set the shape, else the code and reason of the `Error`
/// to answer (`None`: the client left).
fn first_hello(
    host: &NodeHost,
    read: Result<Option<Message>, ReadFailure>,
) -> Result<Hello, Option<(ErrorCode, String)>> {
    let c = &host.counters;
    let (counter, code, why) = match read {
        Ok(Some(Message::Hello(hello))) => {
            match check_hello_strings(&hello).and_then(|()| check_rank(&hello)) {
                Ok(()) => return Ok(hello),
                Err(why) => (Some(&c.handshake_refusals), ErrorCode::HANDSHAKE, why),
            }
        }
        Ok(Some(msg)) => (
            None,
            ErrorCode::HANDSHAKE,
            format!("{} before Hello", msg.name()),
        ),
        Ok(None) | Err(ReadFailure::Io(_)) => return Err(None),
        Err(ReadFailure::Timeout(Wait::Frame)) => (
            Some(&c.frame_timeouts),
            ErrorCode::BAD_FRAME,
            format!(
                "a frame took longer than {:?}",
                host.options().frame_timeout
            ),
        ),
        Err(ReadFailure::Timeout(_)) => (
            Some(&c.handshake_timeouts),
            ErrorCode::HANDSHAKE,
            format!(
                "no Hello within {:?} of connecting",
                host.options().handshake_timeout
            ),
        ),
        Err(ReadFailure::Decode(e)) => {
            let code = match e {
                DecodeError::WrongVersion { .. } => ErrorCode::WRONG_VERSION,
                _ => ErrorCode::BAD_FRAME,
            };
            (Some(&c.bad_frames), code, e.to_string())
        }
        Err(ReadFailure::TooLarge { len, max }) => (
            Some(&c.bad_frames),
            ErrorCode::BAD_FRAME,
            format!("a frame of {len} bytes; before Hello a frame may take at most {max}"),
        ),
    };
    if let Some(counter) = counter {
        Counters::add(counter, 1);
    }
    Err(Some((code, why)))
}

/// Serves one connection until the client leaves, a frame does not decode,
/// a bound is passed (docs/node-protocol.md §7), or the server stops.
pub(crate) async fn serve(
    node: Arc<Node>,
    stream: UnixStream,
    id: u64,
    stop: watch::Receiver<bool>,
) {
    let limits = Limits::of(node.options(), node.geometry().layers);
    let (rd, wr) = stream.into_split();
    let conn = Conn {
        session: Session::new(node, id),
        reader: FrameReader::new(limits),
        wr: Writer::new(wr, limits.write),
    };
    run(conn, rd, None, stop).await;
}

/// Serves `first`, if any, then what the reader gives, until the session
/// ends; then drops what it holds.
async fn run(
    mut conn: Conn,
    mut rd: OwnedReadHalf,
    first: Option<Message>,
    mut stop: watch::Receiver<bool>,
) {
    let mut sweep = tokio::time::interval(sweep_period(conn.session.node.options().lease));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next = match first {
        Some(msg) => conn.on_message(msg).await,
        None => Next::Continue,
    };
    while let Next::Continue = next {
        next = tokio::select! {
            read = conn.reader.next(&mut rd) => conn.on_read(read).await,
            _ = sweep.tick() => {
                conn.session.expire(Instant::now());
                Next::Continue
            }
            _ = stop.changed() => Next::Close,
        };
    }
    conn.session.close();
}

/// A `Hello`'s tensor-parallel rank must be below its size.
fn check_rank(hello: &Hello) -> Result<(), String> {
    let ns = &hello.namespace;
    if ns.tp_size == 0 || ns.tp_rank >= ns.tp_size {
        return Err(format!(
            "tensor-parallel rank {} of {} is not a rank",
            ns.tp_rank, ns.tp_size
        ));
    }
    Ok(())
}

/// How often leases are checked: a quarter of their life, at least 10 ms.
fn sweep_period(lease: Duration) -> Duration {
    (lease / 4).max(Duration::from_millis(10))
}

/// A session with its connection's reader and writer.
struct Conn {
    session: Session,
    reader: FrameReader,
    wr: Writer,
}

impl Conn {
    /// Serves what the reader gave.
    async fn on_read(&mut self, read: Result<Option<Message>, ReadFailure>) -> Next {
        match read {
            Ok(Some(msg)) => self.on_message(msg).await,
            Ok(None) => Next::Close,
            Err(failure) => self.on_read_failure(failure).await,
        }
    }

    /// Serves one message and sends its replies.
    async fn on_message(&mut self, msg: Message) -> Next {
        let sent = match msg {
            Message::Load(r) if self.session.keys.is_some() => self
                .session
                .stream_load(r, &mut self.wr)
                .await
                .map(|()| Next::Continue),
            msg => {
                let (replies, next) = self.session.handle(msg).await;
                self.wr.send(&replies).await.map(|()| next)
            }
        };
        if self.session.keys.is_some() {
            self.reader.greeted();
        }
        self.reader.touch();
        // Leases lapse on time even while requests keep the reader busy.
        self.session.expire_if_due(Instant::now());
        sent.unwrap_or_else(|failure| {
            self.session.write_failed(failure);
            Next::Close
        })
    }

    /// Ends the connection on a read that failed, with an `Error` when the
    /// client should learn why; an idle timeout ends only a session that
    /// holds nothing.
    async fn on_read_failure(&mut self, failure: ReadFailure) -> Next {
        let reply = match failure {
            ReadFailure::Io(e) => {
                tracing::info!(session = self.session.id, error = %e, "node connection lost");
                return Next::Close;
            }
            ReadFailure::Timeout(Wait::Idle) if !self.session.holds_nothing() => {
                // Its leases lapse first; it is looked at again then.
                self.reader.touch();
                return Next::Continue;
            }
            ReadFailure::Timeout(wait) => match self.session.timed_out(wait) {
                Some(reply) => reply,
                None => return Next::Close,
            },
            ReadFailure::Decode(e) => self.session.bad_frame(e),
            ReadFailure::TooLarge { len, max } => self.session.too_large(len, max),
        };
        // The connection closes whether or not the client takes the reply.
        let _ = self.wr.send(&[reply]).await;
        Next::Close
    }
}

/// How many leading blocks of `located` are located alike (on peers, or
/// in the shared G4): at least one unless `located` is empty.
fn run_of(located: &[(BlockHash, ClusterBlock)]) -> usize {
    let shared = |l: &ClusterBlock| matches!(l, ClusterBlock::Shared(_));
    let Some((_, first)) = located.first() else {
        return 0;
    };
    located
        .iter()
        .take_while(|(_, l)| shared(l) == shared(first))
        .count()
}

/// A run's peer locations and shared ones (one of the two is empty).
#[allow(clippy::type_complexity)]
fn split_run(
    run: &[(BlockHash, ClusterBlock)],
) -> (
    Vec<(BlockHash, PeerLocation)>,
    Vec<(BlockHash, SharedLocation)>,
) {
    let (mut peers, mut shared) = (Vec::new(), Vec::new());
    for (k, l) in run {
        match l {
            ClusterBlock::Peer(p) => peers.push((*k, p.clone())),
            ClusterBlock::Shared(s) => shared.push((*k, s.clone())),
        }
    }
    (peers, shared)
}

struct Session {
    node: Arc<Node>,
    id: u64,
    /// Set by a successful `Hello`.
    keys: Option<KeyMap>,
    /// What the `Hello` declared, for the node's commit observer.
    namespace: Option<Arc<SessionNamespace>>,
    /// Stored keys of the client keys named lately.
    key_cache: KeyCache,
    /// Where the session's `HelloOk` put the peer tier, if it listed one.
    peer_tier: Option<Tier>,
    /// Where it put the shared G4's tier, if it listed one.
    shared_tier: Option<Tier>,
    /// Blocks the session's lookups found on other nodes or in the shared
    /// G4, by this node's stored key, each for one lease: what a `Load` of
    /// them fetches.
    located: HashMap<BlockHash, Leased<ClusterBlock>>,
    /// The nodes this session brought blocks from (each logged once).
    peers_named: HashSet<String>,
    /// The session's reservations and pins, by stored key. Hashed with
    /// hashbrown's seeded foldhash rather than SipHash, as [`KeyCache`]
    /// is: every key of a `Reserve`, `Commit`, `Load` and `Release` is
    /// hashed here, and stored keys are keyed BLAKE3, which a client
    /// cannot pick to collide.
    reservations: hashbrown::HashMap<BlockHash, Leased<HostReservation>>,
    pins: hashbrown::HashMap<BlockHash, Pins>,
    /// Pins held, every key's together (the pin cap's count).
    pinned: usize,
    /// When leases are next looked at between requests.
    next_sweep: Instant,
    /// Why the daemon ends the connection, when it does: said in the one
    /// line logged at the close.
    ending: Option<String>,
}

impl Session {
    fn new(node: Arc<Node>, id: u64) -> Self {
        Self {
            node,
            id,
            keys: None,
            namespace: None,
            key_cache: KeyCache::default(),
            peer_tier: None,
            shared_tier: None,
            located: HashMap::new(),
            peers_named: HashSet::new(),
            reservations: hashbrown::HashMap::new(),
            pins: hashbrown::HashMap::new(),
            pinned: 0,
            next_sweep: Instant::now(),
            ending: None,
        }
    }

    /// Whether the session holds no reservation and no pin.
    fn holds_nothing(&self) -> bool {
        self.reservations.is_empty() && self.pins.is_empty()
    }

    /// Counts a wait that ran out and says why the connection ends; the
    /// `Error` to send, if the client should learn why.
    fn timed_out(&mut self, wait: Wait) -> Option<Message> {
        let c = &self.node.counters;
        let o = self.node.options();
        let (counter, why, code) = match wait {
            Wait::Handshake => (
                &c.handshake_timeouts,
                format!("no Hello within {:?} of connecting", o.handshake_timeout),
                Some(ErrorCode::HANDSHAKE),
            ),
            Wait::Frame => (
                &c.frame_timeouts,
                format!("a frame took longer than {:?}", o.frame_timeout),
                Some(ErrorCode::BAD_FRAME),
            ),
            Wait::Idle => (
                &c.idle_closed,
                format!(
                    "idle for {:?} holding nothing",
                    o.idle_timeout.unwrap_or_default()
                ),
                None,
            ),
        };
        Counters::add(counter, 1);
        let reply = code.map(|code| error(0, code, why.clone()));
        self.ending = Some(why);
        reply
    }

    /// Counts a frame that did not decode; the `Error` that answers it.
    fn bad_frame(&mut self, e: DecodeError) -> Message {
        Counters::add(&self.counters().bad_frames, 1);
        let code = match e {
            DecodeError::WrongVersion { .. } => ErrorCode::WRONG_VERSION,
            _ => ErrorCode::BAD_FRAME,
        };
        self.ending = Some(format!("a bad frame: {e}"));
        error(0, code, e.to_string())
    }

    /// Counts a frame over the connection's limit; the `Error` that
    /// answers it.
    fn too_large(&mut self, len: usize, max: usize) -> Message {
        Counters::add(&self.counters().bad_frames, 1);
        let stage = if self.keys.is_some() {
            "requests of manager.max_batch keys take"
        } else {
            "before Hello a frame may take"
        };
        let m = format!("a frame of {len} bytes; {stage} at most {max}");
        self.ending = Some(m.clone());
        error(0, ErrorCode::BAD_FRAME, m)
    }

    /// Notes why a write ended the connection.
    fn write_failed(&mut self, failure: WriteFailure) {
        self.ending = Some(match failure {
            WriteFailure::TimedOut => {
                Counters::add(&self.counters().write_timeouts, 1);
                let t = self.node.options().write_timeout;
                format!("the client took no reply bytes for {t:?} (manager.write_timeout_ms)")
            }
            WriteFailure::Io(e) => format!("writing failed: {e}"),
        });
    }

    /// Runs the lease sweep if it is due (between requests, so a client
    /// that keeps the reader busy cannot hold it off).
    fn expire_if_due(&mut self, now: Instant) {
        if now >= self.next_sweep {
            self.expire(now);
        }
    }

    fn counters(&self) -> &Counters {
        &self.node.counters
    }

    /// Serves one message; the replies to send and whether to go on.
    async fn handle(&mut self, msg: Message) -> (Vec<Message>, Next) {
        let Some(keys) = self.keys else {
            return self.handshake(msg);
        };
        Counters::add(&self.counters().requests, 1);
        let reply = match msg {
            Message::Hello(_) => {
                let m = "a second Hello on one connection".to_owned();
                return (vec![error(0, ErrorCode::HANDSHAKE, m)], Next::Close);
            }
            Message::Lookup(r) => self.lookup(r, keys).await,
            Message::Reserve(r) => self.with_batch(r, keys, Self::reserve).await,
            Message::Commit(c) => self.commit(c, keys).await,
            Message::Abort(r) => self.with_batch(r, keys, Self::abort).await,
            // Answered as it progresses: `serve` calls `stream_load`.
            Message::Load(r) => {
                let m = format!("Load {} reached the batch handler", r.request_id);
                vec![error(r.request_id, ErrorCode::INTERNAL, m)]
            }
            Message::Release(r) => self.with_batch(r, keys, Self::release).await,
            Message::Remove(r) => self.with_batch(r, keys, Self::remove).await,
            Message::Stats(s) => vec![Message::StatsOk(StatsOk {
                request_id: s.request_id,
                counters: self.node.stats().counters(),
            })],
            other => {
                let m = format!("{} is not a request", other.name());
                vec![error(0, ErrorCode::UNEXPECTED, m)]
            }
        };
        (reply, Next::Continue)
    }

    fn handshake(&mut self, msg: Message) -> (Vec<Message>, Next) {
        let Message::Hello(hello) = msg else {
            let m = format!("{} before Hello", msg.name());
            return (vec![error(0, ErrorCode::HANDSHAKE, m)], Next::Close);
        };
        if let Err(why) = check_hello_strings(&hello) {
            Counters::add(&self.counters().handshake_refusals, 1);
            tracing::warn!(session = self.id, model = clip(&hello.namespace.model), reason = %why, "refused a node client");
            return (vec![error(0, ErrorCode::HANDSHAKE, why)], Next::Close);
        }
        if let Err(why) = self.check_hello(&hello) {
            Counters::add(&self.counters().handshake_refusals, 1);
            tracing::warn!(session = self.id, model = clip(&hello.namespace.model), reason = %why, "refused a node client");
            return (
                vec![error(0, ErrorCode::GEOMETRY_MISMATCH, why)],
                Next::Close,
            );
        }
        let keys = self.node.key_map(&hello.namespace);
        self.keys = Some(keys);
        self.key_cache.clear();
        self.namespace = Some(Arc::new(SessionNamespace {
            namespace: hello.namespace.clone(),
            instance: hello.instance.clone(),
        }));
        Counters::add(&self.counters().sessions_opened, 1);
        Counters::add(&self.counters().sessions_open, 1);
        let ns = &hello.namespace;
        tracing::info!(
            session = self.id,
            model = clip(&ns.model),
            tp_rank = ns.tp_rank,
            tp_size = ns.tp_size,
            "node client connected"
        );
        let mut tiers: Vec<TierInfo> = (self.node.tier_list().into_iter())
            .map(|(tier, kind)| TierInfo { tier, kind })
            .collect();
        self.peer_tier = self
            .node
            .peer_tier()
            .filter(|_| hello.protocol_version.minor >= PEER_KIND_MINOR);
        if let Some(tier) = self.peer_tier {
            tiers.push(TierInfo {
                tier,
                kind: TierKind::Peer,
            });
        }
        self.shared_tier = self.node.shared_tier().filter(|_| self.peer_tier.is_some());
        if let Some(tier) = self.shared_tier {
            tiers.push(TierInfo {
                tier,
                kind: TierKind::Remote,
            });
        }
        let memory = self.node.memory();
        let ok = HelloOk {
            protocol_version: PROTOCOL_VERSION,
            session_id: self.id,
            shm_name: memory.shm_name().to_owned(),
            arena_len: memory.file_bytes(),
            slot_size: memory.slot_bytes() as u64,
            namespace_key: keys.key(),
            tiers,
        };
        (vec![Message::HelloOk(ok)], Next::Continue)
    }

    /// Why the node cannot hold this client's blocks, if it cannot: its
    /// geometry must be the node's, whose arena slots and disk slots are
    /// sized for one block shape. The refusal names both shapes.
    fn check_hello(&self, hello: &Hello) -> Result<(), String> {
        let node = WireGeometry::from(self.node.geometry());
        let tokens = self.node.geometry().tokens_per_block;
        if hello.geometry != node || hello.namespace.block_size_tokens != tokens {
            return Err(format!(
                "this engine's blocks are {}; this node holds blocks of {}. A node holds one block shape: start another daemon (its own data directory and socket) for this engine",
                crate::shape::describe_hello(hello),
                self.node.shape().describe()
            ));
        }
        check_rank(hello)
    }

    /// `BAD_REQUEST` for a batch of more than `manager.max_batch` keys.
    fn refuse_oversized(&self, request_id: u64, keys: usize) -> Option<Vec<Message>> {
        let max = self.node.options().max_batch;
        (keys > max).then(|| {
            let m = format!("{keys} keys in one request; manager.max_batch is {max}");
            vec![error(request_id, ErrorCode::BAD_REQUEST, m)]
        })
    }

    /// Checks the batch size, maps the keys to stored keys and runs `op`.
    async fn with_batch<F>(&mut self, r: KeysRequest, keys: KeyMap, op: F) -> Vec<Message>
    where
        F: AsyncFnOnce(&mut Self, u64, Vec<BlockHash>) -> Result<Vec<Message>, ManagerError>,
    {
        if let Some(refused) = self.refuse_oversized(r.request_id, r.keys.len()) {
            return refused;
        }
        let stored: Vec<BlockHash> = r
            .keys
            .iter()
            .map(|k| self.key_cache.stored(&keys, *k))
            .collect();
        match op(self, r.request_id, stored).await {
            Ok(replies) => replies,
            Err(e) => vec![error(r.request_id, ErrorCode::INTERNAL, e.to_string())],
        }
    }

    /// The longest prefix of the keys the node holds, each with its tier;
    /// past it, when the session lists the peer tier, the prefix the
    /// cluster holds (remembered for a `Load`).
    async fn lookup(&mut self, r: KeysRequest, keys: KeyMap) -> Vec<Message> {
        if let Some(refused) = self.refuse_oversized(r.request_id, r.keys.len()) {
            return refused;
        }
        Counters::add(&self.counters().lookups, r.keys.len() as u64);
        let stored: Vec<BlockHash> = r
            .keys
            .iter()
            .map(|k| self.key_cache.stored(&keys, *k))
            .collect();
        let found = self.node.manager().lookup(&stored);
        let mut tiers: Vec<Tier> = found.blocks.iter().map(|b| b.tier).collect();
        let local = tiers.len();
        if local < stored.len() {
            let rest: Vec<CommittedKey> = (r.keys[local..].iter().zip(&stored[local..]))
                .map(|(&client, &stored)| CommittedKey {
                    client,
                    stored,
                    sum: 0,
                })
                .collect();
            tiers.extend(self.cluster_prefix(&rest).await);
        }
        vec![Message::LookupOk(LookupOk {
            request_id: r.request_id,
            tiers,
        })]
    }

    /// The tier for each key of the prefix of `rest` the cluster holds
    /// (the peer tier, or the shared G4's), when the session lists the
    /// peer tier; each location is remembered for one lease.
    async fn cluster_prefix(&mut self, rest: &[CommittedKey]) -> Vec<Tier> {
        let (Some(_), Some(cluster), Some(ns)) = (
            self.peer_tier,
            self.node.cluster_lookup().cloned(),
            self.namespace.clone(),
        ) else {
            return Vec::new();
        };
        let c = &self.node.counters;
        Counters::add(&c.cluster_lookups, 1);
        let located = cluster.lookup(&ns, rest).await;
        let tiers: Vec<Tier> = located
            .iter()
            .take(rest.len())
            .map_while(|l| self.tier_of(l))
            .collect();
        if tiers.is_empty() {
            Counters::add(&c.cluster_misses, 1);
            return Vec::new();
        }
        Counters::add(&c.cluster_hits, tiers.len() as u64);
        self.remember(rest.iter().map(|k| k.stored).zip(located).take(tiers.len()));
        tiers
    }

    /// The tier the session was told blocks at `located` are in.
    fn tier_of(&self, located: &ClusterBlock) -> Option<Tier> {
        match located {
            ClusterBlock::Peer(_) => self.peer_tier,
            ClusterBlock::Shared(_) => self.shared_tier,
        }
    }

    /// Remembers where the cluster holds these blocks, for one lease.
    fn remember(&mut self, located: impl Iterator<Item = (BlockHash, ClusterBlock)>) {
        let now = Instant::now();
        let until = now + self.node.options().lease;
        for (key, value) in located {
            if self.located.len() >= LOCATED_MAX {
                self.located.retain(|_, l| l.until > now);
            }
            if self.located.len() >= LOCATED_MAX {
                self.located.clear();
            }
            self.located.insert(key, Leased { value, until });
        }
    }

    /// Where the session's last lookups found `key` in the cluster, while
    /// their lease lasts.
    fn located(&self, key: BlockHash) -> Option<&ClusterBlock> {
        self.located
            .get(&key)
            .filter(|l| l.until > Instant::now())
            .map(|l| &l.value)
    }

    /// Brings the blocks of `keys` that continue the node's own prefix and
    /// that the session's lookups located in the cluster into G2: from the
    /// nodes that hold them (within `peer.load_timeout_ms`) or the shared
    /// G4, run by run, so the `Load` that follows finds them local. What
    /// does not come is a miss of that `Load` from there on, never an
    /// error. `clients` are the client keys of `keys`; the commit observer
    /// is told of the blocks brought, as of a commit.
    async fn bring_located(&mut self, clients: &[BlockHash], keys: &[BlockHash]) {
        if self.located.is_empty() {
            return;
        }
        let local = self.node.manager().lookup(keys).len().min(keys.len());
        let wanted = self.located_from(&keys[local..]);
        let mut sums: Vec<BlockChecksum> = Vec::with_capacity(wanted.len());
        while sums.len() < wanted.len() {
            let at = sums.len();
            let run = run_of(&wanted[at..]);
            let got = (self.bring_run(&wanted[at..at + run], &clients[local + at..])).await;
            let complete = got.len() == run;
            sums.extend(got);
            if !complete {
                break;
            }
        }
        let stored: Vec<BlockHash> = wanted.iter().map(|(k, _)| *k).collect();
        self.brought(&clients[local..], &stored, &sums);
    }

    /// The leading `keys` the session's lookups located in the cluster,
    /// with where.
    fn located_from(&self, keys: &[BlockHash]) -> Vec<(BlockHash, ClusterBlock)> {
        keys.iter()
            .map_while(|&k| self.located(k).map(|l| (k, l.clone())))
            .collect()
    }

    /// Forgets where the cluster held the leading `stored` keys, now in G2
    /// with block sums `sums`, and tells the commit observer of them as
    /// of a commit. `clients` are their client keys.
    fn brought(&mut self, clients: &[BlockHash], stored: &[BlockHash], sums: &[BlockChecksum]) {
        for key in &stored[..sums.len()] {
            self.located.remove(key);
        }
        if let Some((observer, ns)) = self.node.commit_observer().zip(self.namespace.as_ref())
            && !sums.is_empty()
        {
            let committed: Vec<CommittedKey> = (clients.iter().zip(stored))
                .zip(sums)
                .map(|((&client, &stored), &sum)| CommittedKey {
                    client,
                    stored,
                    sum,
                })
                .collect();
            observer.committed(ns, &committed);
        }
    }

    /// Brings one run of blocks located alike (all on peers, or all in the
    /// shared G4), counted: the sums of the leading ones brought. `clients`
    /// are the client keys of the run, in order.
    async fn bring_run(
        &mut self,
        run: &[(BlockHash, ClusterBlock)],
        clients: &[BlockHash],
    ) -> Vec<BlockChecksum> {
        let manager = self.node.manager();
        let c = &self.node.counters;
        let (peers, shared) = split_run(run);
        if !peers.is_empty() {
            let Some(reader) = self.node.peer_reader().cloned() else {
                return Vec::new();
            };
            let fetched = crate::peer_load::fetch(manager, &reader, &peers).await;
            self.count_peers(&peers, clients, &fetched).await;
            return fetched.sums;
        }
        let Some(reader) = self.node.shared_reader().cloned() else {
            return Vec::new();
        };
        let fetched = crate::shared_load::fetch(manager, &reader, &shared).await;
        let brought = fetched.sums.len();
        Counters::add(&c.shared_g4_hits, brought as u64);
        Counters::add(&c.shared_g4_misses, (shared.len() - brought) as u64);
        Counters::add(&c.shared_g4_bytes, fetched.bytes);
        tracing::debug!(
            session = self.id,
            located = shared.len(),
            brought,
            "a prefix from the shared G4"
        );
        fetched.sums
    }

    /// Counts and logs a read of `peers` from the nodes holding them, and
    /// reports the blocks their node answered it does not hold.
    async fn count_peers(&mut self, peers: &[Located], clients: &[BlockHash], fetched: &Fetched) {
        let brought = fetched.sums.len();
        let c = &self.node.counters;
        Counters::add(&c.peer_loads, 1);
        Counters::add(&c.peer_hits, brought as u64);
        Counters::add(&c.peer_misses, (peers.len() - brought) as u64);
        Counters::add(&c.peer_bytes, fetched.bytes);
        self.log_peers(&peers[..brought]);
        self.report_missing(peers, clients, &fetched.missing).await;
    }

    /// The node's own prefix of `keys` and the blocks after it the
    /// session located on peers, when a `Load` streams them
    /// ([`load_from_peers`](Self::load_from_peers)): the prefix all in G2
    /// (none arriving from the disk), every located block after it on a
    /// peer (none in the shared G4, read whole), and the node's reader
    /// streaming.
    fn peers_to_stream(&self, keys: &[BlockHash]) -> Option<(usize, Vec<Located>)> {
        let reader = self.node.peer_reader()?;
        if self.located.is_empty() || reader.layer_groups() == 0 {
            return None;
        }
        let local = self.node.manager().lookup(keys).len().min(keys.len());
        let memory = self.node.memory();
        if !keys[..local].iter().all(|&k| memory.contains(k)) {
            return None;
        }
        let (peers, shared) = split_run(&self.located_from(&keys[local..]));
        (!peers.is_empty() && shared.is_empty()).then_some((local, peers))
    }

    /// `Load` of the node's own prefix (in G2) followed by `peers`, the
    /// blocks the session located on other nodes, streamed
    /// (docs/peer-protocol.md §11): the prefix pinned, `LoadOk` at once
    /// with it and the slots reserved for the peers' blocks (`Arriving`),
    /// one `LayerReady` per layer as the peers' groups of layers land, the
    /// last after the commit, naming exactly the blocks committed and
    /// pinned. A block that failed is left out from the next `LayerReady`
    /// on; its slot is freed only after the last one.
    async fn load_from_peers(
        &mut self,
        id: u64,
        clients: &[BlockHash],
        keys: &[BlockHash],
        (local, peers): (usize, Vec<Located>),
        wr: &mut Writer,
    ) -> Result<(), LoadFailure> {
        let node = self.node.clone();
        let manager = node.manager();
        let onboarding =
            (manager.begin_onboard(&keys[..local]).await).map_err(LoadFailure::BeforeAnswer)?;
        let onboarded =
            (manager.finish_onboard(onboarding).await).map_err(LoadFailure::BeforeAnswer)?;
        let resident = self.pin(onboarded.blocks, &[]);
        let (Some(reader), true) = (node.peer_reader(), resident.len() == local) else {
            return self.answer_whole(id, keys.len(), resident, wr).await;
        };
        let mut stream = PeerStream::start(manager, reader, &peers).await;
        if stream.done() {
            // No slot reserved: nothing to stream, the peers' blocks miss.
            let (fetched, _) = stream.finish(manager).await;
            self.count_peers(&peers, &clients[local..], &fetched).await;
            return self.answer_whole(id, keys.len(), resident, wr).await;
        }
        let slots: Vec<Slot> = (stream.arena_slots())
            .map(|s| arena_slot(node.memory(), s))
            .collect();
        let found = (resident.iter())
            .map(|(slot, sums)| LoadResult::Resident(*slot, sums.clone()))
            .chain(slots.iter().map(|s| LoadResult::Arriving(*s)));
        let answer = load_ok(id, keys.len(), found);
        wr.send(&[answer]).await.map_err(LoadFailure::Write)?;
        let top = node.geometry().layers.saturating_sub(1);
        while !stream.done() {
            let ready: Vec<Message> = (stream.next(reader).await)
                .filter(|&l| l < top)
                .map(|l| {
                    let own = resident.iter().map(|(_, s)| last_sum(s, l));
                    layer_ready(id, l, own.chain(stream.layer_sums(l)))
                })
                .collect();
            wr.send(&ready).await.map_err(LoadFailure::Write)?;
        }
        let (fetched, failed) = stream.finish(manager).await;
        self.count_peers(&peers, &clients[local..], &fetched).await;
        let stored: Vec<BlockHash> = peers.iter().map(|(k, _)| *k).collect();
        self.brought(&clients[local..], &stored, &fetched.sums);
        let onboarding = (manager.begin_onboard(&stored[..fetched.sums.len()]).await)
            .map_err(LoadFailure::AfterAnswer)?;
        let onboarded =
            (manager.finish_onboard(onboarding).await).map_err(LoadFailure::AfterAnswer)?;
        let mut pinned = resident;
        pinned.extend(self.pin(onboarded.blocks, &slots));
        self.count_load(pinned.len(), keys.len());
        if !(pinned.is_empty() && slots.is_empty()) {
            let last = pinned.iter().map(|(_, sums)| last_sum(sums, top));
            let last = layer_ready(id, top, last);
            wr.send(&[last]).await.map_err(LoadFailure::Write)?;
        }
        // Only now that no answer names them: the failed blocks' slots.
        drop(failed);
        Ok(())
    }

    /// Forgets the locations of `peers` at `missing` (their node answered
    /// it does not hold them) and reports them to the cluster lookup, so
    /// the next `Lookup` asks the cluster again (docs/meta-api.md §10.4).
    async fn report_missing(
        &mut self,
        peers: &[(BlockHash, PeerLocation)],
        clients: &[BlockHash],
        missing: &[usize],
    ) {
        let gone: Vec<(BlockHash, PeerLocation)> = (missing.iter())
            .filter_map(|&i| Some((*clients.get(i)?, peers.get(i)?)))
            .map(|(client, (stored, at))| {
                self.located.remove(stored);
                (client, at.clone())
            })
            .collect();
        if let (false, Some(cluster), Some(ns)) = (
            gone.is_empty(),
            self.node.cluster_lookup().cloned(),
            self.namespace.as_ref(),
        ) {
            cluster.missing(ns, &gone).await;
        }
    }

    /// Logs, once per session, each node blocks were brought from.
    fn log_peers(&mut self, brought: &[(BlockHash, PeerLocation)]) {
        for (_, location) in brought {
            if self.peers_named.insert(location.node.clone()) {
                tracing::info!(session = self.id, node = %location.node, addr = %location.addr, "loading blocks from a peer node");
            }
        }
    }

    async fn reserve(
        &mut self,
        id: u64,
        keys: Vec<BlockHash>,
    ) -> Result<Vec<Message>, ManagerError> {
        let granted = self.node.manager().reserve_host(&keys).await?;
        let until = Instant::now() + self.node.options().lease;
        let memory = self.node.memory().clone();
        let mut results = Vec::with_capacity(granted.len());
        self.reservations.reserve(granted.len());
        for (key, g) in keys.into_iter().zip(granted) {
            results.push(match g {
                HostReserve::Reserved(value) => {
                    let slot = Slot {
                        offset: memory.slot_offset(value.arena_slot()),
                        len: memory.block_bytes() as u64,
                    };
                    self.reservations.insert(key, Leased { value, until });
                    ReserveResult::Slot(slot)
                }
                HostReserve::AlreadyStored => ReserveResult::AlreadyStored,
                HostReserve::InFlight => ReserveResult::InFlightElsewhere,
                HostReserve::NoSpace => ReserveResult::NoSpace,
            });
        }
        self.count_reserved(&results);
        Ok(vec![Message::ReserveOk(ReserveOk {
            request_id: id,
            results,
        })])
    }

    /// Adds a `Reserve`'s answers to the node's counters, one add per
    /// counter and request: the counters are cache lines every session's
    /// thread writes.
    fn count_reserved(&self, results: &[ReserveResult]) {
        let n = reserve_tally(results);
        let c = &self.node.counters;
        let counters = [
            &c.reserved,
            &c.reserve_already_stored,
            &c.reserve_in_flight,
            &c.reserve_no_space,
        ];
        for (counter, n) in counters.into_iter().zip(n) {
            if n > 0 {
                Counters::add(counter, n);
            }
        }
    }

    async fn commit(&mut self, c: Commit, keys: KeyMap) -> Vec<Message> {
        if let Some(refused) = self.refuse_oversized(c.request_id, c.entries.len()) {
            return refused;
        }
        let mut results = vec![CommitResult::NotReserved; c.entries.len()];
        let mut batch = Vec::with_capacity(c.entries.len());
        let mut positions = Vec::with_capacity(c.entries.len());
        for (i, entry) in c.entries.into_iter().enumerate() {
            let key = self.key_cache.stored(&keys, entry.key);
            if let Some(r) = self.reservations.remove(&key) {
                let sum = entry.sums.block;
                batch.push((r.value, entry.sums));
                positions.push((
                    i,
                    CommittedKey {
                        client: entry.key,
                        stored: key,
                        sum,
                    },
                ));
            }
        }
        let done = self.node.manager().commit_host(batch).await;
        let counters = &self.node.counters;
        // The stored keys are collected only for an observer to tell.
        let observer = self.node.commit_observer().zip(self.namespace.as_ref());
        let mut stored = Vec::new();
        let mut committed = 0;
        for ((i, key), outcome) in positions.into_iter().zip(done) {
            results[i] = match outcome {
                HostCommit::Stored => {
                    committed += 1;
                    if observer.is_some() {
                        stored.push(key);
                    }
                    CommitResult::Stored
                }
                HostCommit::AlreadyStored => CommitResult::AlreadyStored,
                HostCommit::BadChecksum => {
                    Counters::add(&counters.commit_bad_checksum, 1);
                    CommitResult::BadChecksum
                }
            };
        }
        // One add per request: the counters are shared by every session.
        Counters::add(&counters.committed, committed);
        if let Some((observer, ns)) = observer
            && !stored.is_empty()
        {
            observer.committed(ns, &stored);
        }
        vec![Message::CommitOk(CommitOk {
            request_id: c.request_id,
            results,
        })]
    }

    async fn abort(&mut self, id: u64, keys: Vec<BlockHash>) -> Result<Vec<Message>, ManagerError> {
        let dropped = keys
            .iter()
            .filter(|k| self.reservations.remove(*k).is_some())
            .count();
        Counters::add(&self.counters().aborted, dropped as u64);
        Ok(vec![ack(id)])
    }

    /// `Load`, answered as it progresses (so the replies go straight to
    /// `wr`): see [`load`](Self::load). A write that fails is returned (the
    /// connection is gone); a manager failure before `LoadOk` is an error
    /// reply, after it closes the connection (the client would otherwise
    /// wait for layers that never come).
    async fn stream_load(&mut self, r: KeysRequest, wr: &mut Writer) -> Result<(), WriteFailure> {
        let Some(keys) = self.keys else {
            let m = "Load before Hello".to_owned();
            return wr.send(&[error(0, ErrorCode::HANDSHAKE, m)]).await;
        };
        Counters::add(&self.counters().requests, 1);
        let refused = self
            .refuse_oversized(r.request_id, r.keys.len())
            .or_else(|| self.refuse_over_pin_cap(r.request_id, r.keys.len()));
        if let Some(refused) = refused {
            return wr.send(&refused).await;
        }
        let stored: Vec<BlockHash> = r
            .keys
            .iter()
            .map(|k| self.key_cache.stored(&keys, *k))
            .collect();
        let loaded = match self.peers_to_stream(&stored) {
            Some(run) => (self.load_from_peers(r.request_id, &r.keys, &stored, run, wr)).await,
            None => {
                self.bring_located(&r.keys, &stored).await;
                self.load(r.request_id, stored, wr).await
            }
        };
        match loaded {
            Ok(()) => Ok(()),
            Err(LoadFailure::Write(e)) => Err(e),
            Err(LoadFailure::BeforeAnswer(e)) => {
                let m = e.to_string();
                wr.send(&[error(r.request_id, ErrorCode::INTERNAL, m)])
                    .await
            }
            Err(LoadFailure::AfterAnswer(e)) => {
                tracing::error!(session = self.id, error = %e, "a load failed after its answer; closing the connection");
                Err(WriteFailure::Io(std::io::Error::other(e.to_string())))
            }
        }
    }

    /// `BAD_REQUEST` for a `Load` that could take the session past
    /// `manager.max_pins_per_session` (every key it names could be pinned).
    fn refuse_over_pin_cap(&self, request_id: u64, keys: usize) -> Option<Vec<Message>> {
        let max = self.node.options().max_pins_per_session;
        (self.pinned + keys > max).then(|| {
            Counters::add(&self.counters().pin_cap_refusals, 1);
            let m = format!(
                "a Load of {keys} keys could pin more than manager.max_pins_per_session ({max}) with the {} this session holds; release some first",
                self.pinned
            );
            vec![error(request_id, ErrorCode::BAD_REQUEST, m)]
        })
    }

    /// Brings the longest stored prefix of `keys` to G2 and pins it for the
    /// client; the rest are misses. When some block of the prefix arrives
    /// from the disk or G4 and every other is resident (slots known up
    /// front), the answer streams ([`load_streamed`](Self::load_streamed));
    /// otherwise (all resident, or a block brought by another client) it
    /// waits for the whole prefix ([`load_whole`](Self::load_whole)).
    async fn load(
        &mut self,
        id: u64,
        keys: Vec<BlockHash>,
        wr: &mut Writer,
    ) -> Result<(), LoadFailure> {
        let onboarding = self
            .node
            .manager()
            .begin_onboard(&keys)
            .await
            .map_err(LoadFailure::BeforeAnswer)?;
        // Nothing arrives layer by layer (every block resident, or brought
        // by another client): no places to look up.
        if !onboarding.has_landings() {
            return self.load_whole(id, keys.len(), onboarding, wr).await;
        }
        let places = self.places(&onboarding);
        let arriving = places.iter().any(|p| matches!(p, Place::Arriving(..)));
        if arriving && places.len() == onboarding.planned().len() {
            self.load_streamed(id, keys.len(), onboarding, places, wr)
                .await
        } else {
            drop(places);
            self.load_whole(id, keys.len(), onboarding, wr).await
        }
    }

    /// Where each block of the onboarding's prefix is, up to the first
    /// whose slot is not known yet.
    fn places(&self, onboarding: &Onboarding) -> Vec<Place> {
        let memory = self.node.memory();
        let mut places = Vec::with_capacity(onboarding.planned().len());
        for &hash in onboarding.planned() {
            let place = match onboarding.landing_slot(hash) {
                Some(slot) => Place::Arriving(hash, arena_slot(memory, slot)),
                None => match memory.get_ref(hash) {
                    Some(r) => {
                        let slot = arena_slot(memory, r.slot());
                        Place::Resident(r, slot)
                    }
                    None => break,
                },
            };
            places.push(place);
        }
        places
    }

    /// Waits for the whole prefix, then answers `LoadOk` and one
    /// `LayerReady` for the last layer in one write.
    async fn load_whole(
        &mut self,
        id: u64,
        asked: usize,
        onboarding: Onboarding,
        wr: &mut Writer,
    ) -> Result<(), LoadFailure> {
        let onboarded = self
            .node
            .manager()
            .finish_onboard(onboarding)
            .await
            .map_err(LoadFailure::BeforeAnswer)?;
        let pinned = self.pin(onboarded.blocks, &[]);
        self.answer_whole(id, asked, pinned, wr).await
    }

    /// Answers a `Load` of `asked` keys whose `pinned` blocks are all in
    /// G2: `LoadOk`, and one `LayerReady` for the last layer, in one write.
    async fn answer_whole(
        &mut self,
        id: u64,
        asked: usize,
        pinned: Vec<(Slot, Arc<BlockSums>)>,
        wr: &mut Writer,
    ) -> Result<(), LoadFailure> {
        let last = self.node.geometry().layers.saturating_sub(1);
        let last_sums: Vec<u64> = pinned
            .iter()
            .map(|(_, sums)| last_sum(sums, last))
            .collect();
        let found = pinned
            .into_iter()
            .map(|(slot, sums)| LoadResult::Resident(slot, sums));
        self.count_load(last_sums.len(), asked);
        let mut replies = vec![load_ok(id, asked, found)];
        if !last_sums.is_empty() {
            replies.push(layer_ready(id, last, last_sums.into_iter()));
        }
        wr.send(&replies).await.map_err(LoadFailure::Write)
    }

    /// Answers `LoadOk` at once, then one `LayerReady` per layer as the
    /// layers land, each with the layer's checksums of the slots still
    /// good; the last layer publishes the arriving blocks, which are pinned
    /// in the slots announced.
    async fn load_streamed(
        &mut self,
        id: u64,
        asked: usize,
        onboarding: Onboarding,
        places: Vec<Place>,
        wr: &mut Writer,
    ) -> Result<(), LoadFailure> {
        let slots: Vec<Slot> = places.iter().map(Place::slot).collect();
        let answer = load_ok(id, asked, places.iter().map(Place::answer));
        wr.send(&[answer]).await.map_err(LoadFailure::Write)?;
        let layers = self.node.geometry().layers;
        let mut good = places.len();
        for layer in 0..layers.saturating_sub(1) {
            for (hash, result) in onboarding.wait_layer(layer).await {
                if result.is_err()
                    && let Some(i) = places.iter().position(|p| p.hash() == hash)
                {
                    good = good.min(i);
                }
            }
            let sums: Vec<u64> = places[..good]
                .iter()
                .map_while(|p| p.layer_sum(&onboarding, layer))
                .collect();
            good = sums.len();
            let ready = layer_ready(id, layer, sums.into_iter());
            wr.send(&[ready]).await.map_err(LoadFailure::Write)?;
        }
        let onboarded = self
            .node
            .manager()
            .finish_onboard(onboarding)
            .await
            .map_err(LoadFailure::AfterAnswer)?;
        let mut blocks = onboarded.blocks;
        blocks.truncate(good);
        let pinned = self.pin(blocks, &slots);
        self.count_load(pinned.len(), asked);
        let top = layers.saturating_sub(1);
        let last = layer_ready(id, top, pinned.iter().map(|(_, sums)| last_sum(sums, top)));
        wr.send(&[last]).await.map_err(LoadFailure::Write)
    }

    /// Pins `blocks` for the client, in order, while the arena shows each
    /// (in `slots[i]` when given); returns each pinned block's slot and
    /// checksums.
    fn pin(&mut self, blocks: Vec<ImmutableBlock>, slots: &[Slot]) -> Vec<(Slot, Arc<BlockSums>)> {
        let memory = self.node.memory();
        let layers = self.node.geometry().layers as usize;
        let until = Instant::now() + self.node.options().lease;
        // The prefix ends at the first block the arena cannot show.
        let refs = memory.get_refs_prefix(blocks.iter().map(ImmutableBlock::hash));
        let mut out = Vec::with_capacity(refs.len());
        for (i, (block, arena)) in blocks.into_iter().zip(refs).enumerate() {
            let slot = arena_slot(memory, arena.slot());
            if slots.get(i).is_some_and(|announced| *announced != slot) {
                break;
            }
            if arena.shared_sums().layers.len() != layers {
                break;
            }
            out.push((slot, arena.sums_handle()));
            let pin = Pin { block, arena };
            let leased = Leased { value: pin, until };
            match self.pins.entry(leased.value.block.hash()) {
                Entry::Occupied(mut e) => e.get_mut().more.push(leased),
                Entry::Vacant(e) => {
                    e.insert(Pins::new(leased));
                }
            }
            self.pinned += 1;
        }
        out
    }

    fn count_load(&self, found: usize, asked: usize) {
        let c = self.counters();
        Counters::add(&c.loaded, found as u64);
        Counters::add(&c.load_misses, (asked - found) as u64);
    }

    async fn release(
        &mut self,
        id: u64,
        keys: Vec<BlockHash>,
    ) -> Result<Vec<Message>, ManagerError> {
        let mut blocks = Vec::with_capacity(keys.len());
        let mut refs = Vec::with_capacity(keys.len());
        for key in &keys {
            let pin = match self.pins.get_mut(key).map(Pins::pop_extra) {
                Some(Some(extra)) => extra,
                Some(None) => match self.pins.remove(key) {
                    Some(last) => last.first,
                    None => continue,
                },
                None => continue,
            };
            blocks.push(pin.value.block);
            refs.push(pin.value.arena);
        }
        let released = blocks.len() as u64;
        // The pool's references first, then the arena's, as a pin drops;
        // each under one lock for the lot.
        if let Some(pool) = blocks.first().map(|b| b.pool().clone()) {
            pool.release_all(blocks);
        }
        BlockRef::release_all(refs);
        self.pinned -= released as usize;
        Counters::add(&self.counters().released, released);
        Ok(vec![ack(id)])
    }

    async fn remove(
        &mut self,
        id: u64,
        keys: Vec<BlockHash>,
    ) -> Result<Vec<Message>, ManagerError> {
        let dropped = self.node.manager().remove(&keys);
        Counters::add(&self.counters().removed, dropped as u64);
        Ok(vec![ack(id)])
    }

    /// Drops the reservations and pins whose lease ran out.
    fn expire(&mut self, now: Instant) {
        self.next_sweep = now + sweep_period(self.node.options().lease);
        let before = self.reservations.len();
        self.reservations.retain(|_, r| r.until > now);
        self.located.retain(|_, l| l.until > now);
        let aborted = (before - self.reservations.len()) as u64;
        let mut released = 0u64;
        self.pins.retain(|_, pins| {
            let (gone, empty) = pins.expire(now);
            released += gone;
            !empty
        });
        self.pinned -= released as usize;
        if aborted + released > 0 {
            let c = self.counters();
            Counters::add(&c.aborted, aborted);
            Counters::add(&c.released, released);
            Counters::add(&c.leases_expired, aborted + released);
            tracing::warn!(
                session = self.id,
                reservations = aborted,
                pins = released,
                "client leases expired"
            );
        }
    }

    /// Drops everything the session holds.
    fn close(mut self) {
        let aborted = self.reservations.len() as u64;
        let released: u64 = self.pins.values().map(|p| p.len() as u64).sum();
        self.reservations.clear();
        self.pins.clear();
        let c = &self.node.counters;
        Counters::add(&c.aborted, aborted);
        Counters::add(&c.released, released);
        let why = self.ending.as_deref();
        if self.keys.is_some() {
            Counters::sub(&c.sessions_open, 1);
        }
        match (self.keys.is_some(), why) {
            (true, None) => tracing::info!(
                session = self.id,
                reservations_dropped = aborted,
                pins_dropped = released,
                "node client left"
            ),
            (true, Some(why)) => tracing::warn!(
                session = self.id,
                reservations_dropped = aborted,
                pins_dropped = released,
                reason = why,
                "closed a node connection"
            ),
            (false, Some(why)) => tracing::warn!(
                session = self.id,
                reason = why,
                "closed a node connection before its handshake"
            ),
            (false, None) => {}
        }
    }
}

/// Layer `layer`'s checksum in `sums` (`pin` keeps only blocks with every
/// layer's).
/// How many of a `Reserve`'s answers are slots, already stored, in flight
/// elsewhere and without room, in that order (the wire's tag order).
fn reserve_tally(results: &[ReserveResult]) -> [u64; 4] {
    let mut n = [0u64; 4];
    for r in results {
        n[match r {
            ReserveResult::Slot(_) => 0,
            ReserveResult::AlreadyStored => 1,
            ReserveResult::InFlightElsewhere => 2,
            ReserveResult::NoSpace => 3,
        }] += 1;
    }
    n
}

fn last_sum(sums: &BlockSums, layer: u32) -> u64 {
    sums.layers.get(layer as usize).copied().unwrap_or(0)
}

fn ack(request_id: u64) -> Message {
    Message::Ack(Ack { request_id })
}

#[cfg(test)]
mod pins_tests {
    use super::{Leased, Pins};
    use proptest::prelude::*;
    use std::time::{Duration, Instant};

    /// A step on one key's pins: pin (lease length), release, or a sweep
    /// at a time.
    #[derive(Debug, Clone)]
    enum Step {
        Pin(u8),
        Release,
        Expire(u8),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            any::<u8>().prop_map(Step::Pin),
            Just(Step::Release),
            any::<u8>().prop_map(Step::Expire),
        ]
    }

    fn ids(p: &Option<Pins<u32>>) -> Vec<u32> {
        p.as_ref().map_or(Vec::new(), |p| {
            std::iter::once(&p.first)
                .chain(&p.more)
                .map(|l| l.value)
                .collect()
        })
    }

    proptest! {
        /// The inline first pin changes nothing: the pins are a stack
        /// (release takes the newest) from which a sweep drops the ended
        /// ones in order, as the `Vec` it replaced.
        #[test]
        fn pins_behave_as_a_vec(steps in proptest::collection::vec(step(), 0..64)) {
            let t0 = Instant::now();
            let at = |s: u8| t0 + Duration::from_secs(u64::from(s));
            let mut model: Vec<Leased<u32>> = Vec::new();
            let mut pins: Option<Pins<u32>> = None;
            for (id, s) in (0u32..).zip(steps) {
                match s {
                    Step::Pin(until) => {
                        model.push(Leased { value: id, until: at(until) });
                        let leased = Leased { value: id, until: at(until) };
                        match pins.as_mut() {
                            Some(p) => p.more.push(leased),
                            None => pins = Some(Pins::new(leased)),
                        }
                    }
                    Step::Release => {
                        let want = model.pop().map(|l| l.value);
                        let got = match pins.as_mut().map(Pins::pop_extra) {
                            Some(Some(extra)) => Some(extra.value),
                            Some(None) => pins.take().map(|p| p.first.value),
                            None => None,
                        };
                        prop_assert_eq!(got, want);
                    }
                    Step::Expire(now) => {
                        let n = model.len();
                        model.retain(|l| l.until > at(now));
                        let (gone, empty) = pins.as_mut().map_or((0, true), |p| p.expire(at(now)));
                        if empty {
                            pins = None;
                        }
                        prop_assert_eq!(gone, (n - model.len()) as u64);
                    }
                }
                let want: Vec<u32> = model.iter().map(|l| l.value).collect();
                prop_assert_eq!(ids(&pins), want);
                prop_assert_eq!(pins.as_ref().map_or(0, Pins::len), model.len());
            }
        }
    }
}

#[cfg(test)]
mod tally_tests {
    use super::reserve_tally;
    use kvtier_protocol::{ReserveResult, Slot};
    use proptest::prelude::*;

    fn result() -> impl Strategy<Value = ReserveResult> {
        prop_oneof![
            (any::<u64>(), any::<u64>())
                .prop_map(|(offset, len)| ReserveResult::Slot(Slot { offset, len })),
            Just(ReserveResult::AlreadyStored),
            Just(ReserveResult::InFlightElsewhere),
            Just(ReserveResult::NoSpace),
        ]
    }

    proptest! {
        /// The per-request tally counts each answer once, under its kind:
        /// what the per-key adds it replaced summed to.
        #[test]
        fn the_tally_counts_each_answer_under_its_kind(
            results in proptest::collection::vec(result(), 0..200)
        ) {
            let count = |f: fn(&ReserveResult) -> bool| results.iter().filter(|r| f(r)).count() as u64;
            let expected = [
                count(|r| matches!(r, ReserveResult::Slot(_))),
                count(|r| matches!(r, ReserveResult::AlreadyStored)),
                count(|r| matches!(r, ReserveResult::InFlightElsewhere)),
                count(|r| matches!(r, ReserveResult::NoSpace)),
            ];
            prop_assert_eq!(reserve_tally(&results), expected);
        }
    }
}
