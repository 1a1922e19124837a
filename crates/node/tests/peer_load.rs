//! A `Load` of blocks the cluster located (docs/peer-protocol.md §11)
//! against a real node, its real socket and client, and a real peer server
//! over blocks held in memory: the cluster lookup is a fixed map here, so
//! a location can point at a copy that is corrupt or a peer that never
//! answers. A block that does not come is a miss of the `Load`, never an
//! error, and leaves nothing behind in G2.
//!
//! The node streams a located run by default (`LoadOk` at once with the
//! reserved slots, a `LayerReady` per group of layers landed); the tests
//! of whole-block reads set the reader to whole blocks. The peer's source
//! is gated by layer, so a test can hold the stream between two groups.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvtier_client::{Client, ClientConfig, Load, LoadResult, WireGeometry};
use kvtier_core::{BlockHash, BlockSums, Lookup, TierKind};
use kvtier_node::test_support::{TestNode, namespace, small_config};
use kvtier_node::{
    ClusterBlock, ClusterLookup, CommittedKey, NodeStats, PeerLocation, PeerReader,
    SessionNamespace,
};
use kvtier_peer::{
    BlockData, BlockSource, ClusterSecret, Identity, LayerRange, MemorySource, PeerPool,
    PeerServer, PoolConfig, ServerConfig, ServerHandle,
};
use kvtier_tier::BoxFuture;
use tokio::sync::watch;

/// Layers of the rig's blocks: several groups of two (the reader's
/// default of four groups).
const LAYERS: u32 = 8;

const CLUSTER: &str = "test-cluster";
/// Bounds a read from a peer that answers; not a latency target (long,
/// so a paused or loaded machine does not turn a hit into a miss).
const PATIENCE: Duration = Duration::from_secs(30);
/// The deadline where the peer never answers: the read is a miss however
/// long it takes.
const SHORT: Duration = Duration::from_millis(300);

fn identity(node: &str) -> Identity {
    Identity {
        cluster: CLUSTER.into(),
        node: node.into(),
        secret: ClusterSecret::from_bytes([3; 32]),
    }
}

/// The cluster as a fixed map: this node's stored key -> where it is.
#[derive(Default)]
struct Fixed(Mutex<HashMap<BlockHash, PeerLocation>>);

impl ClusterLookup for Fixed {
    fn lookup<'a>(
        &'a self,
        _ns: &'a SessionNamespace,
        keys: &'a [CommittedKey],
    ) -> BoxFuture<'a, Vec<ClusterBlock>> {
        let map = self.0.lock().unwrap();
        let found = keys
            .iter()
            .map_while(|k| map.get(&k.stored).cloned().map(ClusterBlock::Peer))
            .collect();
        Box::pin(async move { found })
    }
}

/// A source that answers a read of layers past the gate's value only once
/// the gate lets them through (never, if it does not).
struct Gated {
    blocks: Arc<MemorySource>,
    gate: watch::Receiver<u32>,
}

impl BlockSource for Gated {
    fn read<'a>(
        &'a self,
        keys: &'a [BlockHash],
        layers: LayerRange,
    ) -> BoxFuture<'a, Vec<Option<BlockData>>> {
        let end = match layers {
            LayerRange::All => LAYERS,
            LayerRange::Span { end, .. } => end,
        };
        let mut gate = self.gate.clone();
        Box::pin(async move {
            // A closed gate (the rig dropped) answers nothing.
            if gate.wait_for(|&open| end <= open).await.is_err() {
                return vec![None; keys.len()];
            }
            self.blocks.read(keys, layers).await
        })
    }
}

/// A node whose cluster is `Fixed`, a peer "node-x" serving `source`
/// through a gate, and a client of the node.
struct Rig {
    test: TestNode,
    cluster: Arc<Fixed>,
    source: Arc<MemorySource>,
    /// How many leading layers the peer serves (all at the start).
    gate: watch::Sender<u32>,
    peer: ServerHandle,
    client: Client,
    _dir: tempfile::TempDir,
}

impl Rig {
    /// A rig whose reads of peers end after `timeout` and stream.
    fn start(timeout: Duration) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = small_config(dir.path(), 4);
        let geometry = config.geometry.as_mut().unwrap();
        geometry.layers = Some(LAYERS);
        let block = geometry.resolve().unwrap().block_bytes();
        config.memory.capacity = kvtier_core::ByteSize(4 * block);
        let test = TestNode::start(config, Vec::new());
        let cluster = Arc::new(Fixed::default());
        let source = Arc::new(MemorySource::new());
        let (gate, open) = watch::channel(u32::MAX);
        let gated = Arc::new(Gated {
            blocks: source.clone(),
            gate: open,
        });
        let peer = test.rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let config = ServerConfig::new(identity("node-x"));
            PeerServer::start(listener, config, gated).unwrap()
        });
        assert!(test.node.set_cluster_lookup(cluster.clone()));
        let pool = PeerPool::new(identity("node-b"), PoolConfig::default());
        let reader = PeerReader::new(pool, timeout);
        assert!(test.node.set_peer_reader(Arc::new(reader)));
        let geometry = WireGeometry::from(test.node.geometry());
        let config = ClientConfig::new(test.socket(), namespace("llama"), geometry);
        let client = Client::connect(config).unwrap();
        assert_eq!(client.tiers().last().unwrap().kind, TierKind::Peer);
        Self {
            test,
            cluster,
            source,
            gate,
            peer,
            client,
            _dir: dir,
        }
    }

    /// A rig whose reads of peers end after `timeout` and bring whole
    /// blocks before the `Load` answers.
    fn whole(timeout: Duration) -> Self {
        let rig = Self::start(timeout);
        rig.reader().set_layer_groups(0);
        rig
    }

    fn reader(&self) -> &PeerReader {
        self.test.node.peer_reader().unwrap()
    }

    /// Lets the peer serve layers `..open` only.
    fn open_until(&self, open: u32) {
        self.gate.send_replace(open);
    }

    fn block_bytes(&self) -> usize {
        self.test.node.geometry().block_bytes() as usize
    }

    fn layer_bytes(&self) -> u32 {
        self.test.node.geometry().layer_bytes() as u32
    }

    /// Client key `k`'s block, as the peer should hold it.
    fn bytes(&self, k: BlockHash) -> Vec<u8> {
        vec![k.0 as u8 ^ 0x5a; self.block_bytes()]
    }

    /// Puts client key `k`'s block at `addr` as node-x's key `k + 1000`,
    /// with `bytes` there (the right ones, or a corrupt copy under the
    /// right block's sums), and locates it there.
    fn locate(&self, k: BlockHash, addr: SocketAddr, corrupt: bool) {
        let theirs = BlockHash(k.0 + 1000);
        let lb = self.layer_bytes();
        let right = self.bytes(k);
        let sums = BlockSums::compute(theirs, lb as usize, &right);
        let mut held = right;
        if corrupt {
            held[7] ^= 1;
        }
        self.source.insert_with_sums(theirs, lb, held, sums.clone());
        let location = PeerLocation {
            node: "node-x".into(),
            addr,
            stored: theirs,
            sum: sums.block,
        };
        let ours = self.client.key_map().stored(k);
        self.cluster.0.lock().unwrap().insert(ours, location);
    }

    /// Locates two blocks at `addr`, looks them up and loads them, which
    /// must end in two misses; their keys.
    fn two_located_miss(&mut self, addr: SocketAddr) -> Vec<BlockHash> {
        let asked = keys(1..3);
        for &k in &asked {
            self.locate(k, addr, false);
        }
        assert_eq!(self.client.lookup(&asked).unwrap().len(), 2);
        let load = self.client.load(&asked).unwrap();
        assert_eq!(self.served(&asked, &load), 0, "{:?}", load.results());
        let s = self.stats();
        assert_eq!((s.peer_hits, s.peer_misses), (0, 2));
        self.client.release_load(load).unwrap();
        asked
    }

    /// Waits for `load`'s last layer, then reads its blocks in order: how
    /// many leading ones are hits, each exactly `asked`'s bytes. Every
    /// later one reads as a miss: nothing is served wrong or corrupt.
    fn served(&mut self, asked: &[BlockHash], load: &Load) -> usize {
        self.client.wait_layer(load, LAYERS - 1).unwrap();
        let mut buf = vec![0u8; self.block_bytes()];
        let mut hits = 0;
        while hits < asked.len() && load.read(hits, &mut buf).unwrap() == Lookup::Hit {
            assert!(buf == self.bytes(asked[hits]), "block {hits}");
            hits += 1;
        }
        for i in hits..asked.len() {
            assert_eq!(load.read(i, &mut buf).unwrap(), Lookup::Miss, "block {i}");
        }
        hits
    }

    /// Reads layer `layer` of `load`'s block `i` (the layer ready), which
    /// must be a hit with the bytes of `asked[i]`'s layer.
    fn layer_exact(&self, load: &Load, asked: &[BlockHash], i: usize, layer: u32) {
        let lb = self.layer_bytes() as usize;
        let mut buf = vec![0u8; lb];
        let got = load.read_layer(i, layer, &mut buf).unwrap();
        assert_eq!(got, Lookup::Hit, "block {i} layer {layer}");
        let at = layer as usize * lb;
        assert!(
            buf == self.bytes(asked[i])[at..at + lb],
            "block {i} layer {layer}"
        );
    }

    /// Whether every arena slot is free again (a round trip first, so the
    /// session finished the `Load` before this looks).
    fn arena_free(&mut self) -> bool {
        self.client.stats().unwrap();
        let memory = self.test.node.memory();
        memory.free_blocks() == memory.capacity_blocks()
    }

    fn stats(&self) -> NodeStats {
        self.test.node.stats()
    }

    /// Whether the node holds client key `k` in any tier.
    fn holds(&self, k: BlockHash) -> bool {
        self.test.node.contains(self.client.key_map().stored(k))
    }
}

#[test]
fn a_corrupt_copy_ends_the_prefix_and_nothing_of_it_is_kept() {
    let mut rig = Rig::whole(PATIENCE);
    let asked = keys(1..4);
    let addr = rig.peer.local_addr();
    rig.locate(asked[0], addr, false);
    rig.locate(asked[1], addr, true);
    rig.locate(asked[2], addr, false);
    let tiers = rig.client.lookup(&asked).unwrap();
    assert_eq!(tiers.len(), 3);

    let load = rig.client.load(&asked).unwrap();
    assert_eq!(load.prefix_len(), 1, "{:?}", load.results());
    assert_eq!(rig.served(&asked, &load), 1);
    let s = rig.stats();
    assert_eq!((s.peer_loads, s.peer_hits, s.peer_misses), (1, 1, 2));
    assert_eq!(s.load_misses, 2);
    let pool = rig.reader().pool().stats();
    // The third came verified in the same read, and was dropped: it no
    // longer continues a prefix.
    assert_eq!((pool[0].1.found, pool[0].1.corrupt), (2, 1), "{pool:?}");
    assert!(rig.holds(asked[0]));
    assert!(!rig.holds(asked[1]) && !rig.holds(asked[2]));
    rig.client.release_load(load).unwrap();
}

#[test]
fn a_peer_that_never_answers_is_a_miss_by_the_deadline() {
    for whole in [true, false] {
        let mut rig = if whole {
            Rig::whole(SHORT)
        } else {
            Rig::start(SHORT)
        };
        // Accepts connections (the kernel's backlog) and never says a word.
        let silent = rig
            .test
            .rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        rig.two_located_miss(silent.local_addr().unwrap());
        let pool = rig.reader().pool().stats();
        assert_eq!(pool[0].1.timeouts, 1, "{pool:?}");
        assert_eq!(rig.test.node.usage().0, 0, "no slot kept");
        assert!(rig.arena_free());
        drop(silent);
    }
}

#[test]
fn without_room_in_g2_located_blocks_are_misses() {
    for whole in [true, false] {
        let mut rig = if whole {
            Rig::whole(PATIENCE)
        } else {
            Rig::start(PATIENCE)
        };
        // Every arena slot pinned by this client.
        let slots = rig.test.node.memory().capacity_blocks() as u128;
        let local = keys(100..100 + slots);
        let bytes: Vec<Vec<u8>> = local.iter().map(|&k| rig.bytes(k)).collect();
        let batch: Vec<(BlockHash, &[u8])> = local
            .iter()
            .copied()
            .zip(bytes.iter().map(|b| &b[..]))
            .collect();
        rig.client.store(&batch).unwrap();
        let pinned = rig.client.load(&local).unwrap();
        assert_eq!(pinned.prefix_len(), local.len());

        let asked = rig.two_located_miss(rig.peer.local_addr());
        // Nothing was read: the slots were refused first.
        let pool = rig.reader().pool().stats();
        assert!(pool.is_empty(), "{pool:?}");

        // Released, the room is there and the blocks come.
        rig.client.release_load(pinned).unwrap();
        assert_eq!(rig.client.lookup(&asked).unwrap().len(), 2);
        let load = rig.client.load(&asked).unwrap();
        assert_eq!(rig.served(&asked, &load), 2, "{:?}", load.results());
    }
}

/// A `Load` of a resident prefix and three blocks on a peer answers the
/// peer's blocks `Arriving` in their reserved slots at once, then their
/// layers as they land: with the peer holding back layers 2 and up, layers
/// 0 and 1 of every block are ready and exact; once it serves the rest,
/// every layer and every whole block is. The blocks are committed and
/// published as brought blocks; released and removed, every slot is free.
#[test]
fn a_peer_run_streams_layer_by_layer_and_exact() {
    let mut rig = Rig::start(PATIENCE);
    let asked = keys(1..5);
    let own = rig.bytes(asked[0]);
    rig.client.store(&[(asked[0], &own[..])]).unwrap();
    let addr = rig.peer.local_addr();
    for &k in &asked[1..] {
        rig.locate(k, addr, false);
    }
    assert_eq!(rig.client.lookup(&asked).unwrap().len(), 4);
    rig.open_until(2);

    let load = rig.client.load(&asked).unwrap();
    assert!(matches!(load.results()[0], LoadResult::Resident(..)));
    assert!(
        (load.results()[1..].iter()).all(|r| matches!(r, LoadResult::Arriving(_))),
        "{:?}",
        load.results()
    );
    rig.client.wait_layer(&load, 1).unwrap();
    for layer in 0..2 {
        for i in 0..asked.len() {
            rig.layer_exact(&load, &asked, i, layer);
        }
    }
    assert!(!load.is_ready(2), "layer 2 is held back by the peer");
    assert!(
        !rig.holds(asked[1]),
        "nothing is committed before its last layer"
    );

    rig.open_until(u32::MAX);
    for layer in 2..LAYERS {
        rig.client.wait_layer(&load, layer).unwrap();
        for i in 0..asked.len() {
            rig.layer_exact(&load, &asked, i, layer);
        }
    }
    assert_eq!(rig.served(&asked, &load), 4);
    let s = rig.stats();
    assert_eq!((s.peer_loads, s.peer_hits, s.peer_misses), (1, 3, 0));
    assert_eq!(s.loaded, 4);
    assert!(asked.iter().all(|&k| rig.holds(k)));
    let pool = rig.reader().pool().stats();
    assert_eq!(pool[0].1.reads, 4, "one read per group of two layers");

    rig.client.release_load(load).unwrap();
    rig.client.remove(&asked).unwrap();
    assert!(rig.arena_free(), "every slot free after release and remove");
}

/// A peer that sends one block's layer 5 corrupt: layers 0-3 of every
/// block were announced (and read exact); from the group of layers 4-5 on
/// that block and the one after it are misses of every `LayerReady`, never
/// served, never committed; the block before it comes whole.
#[test]
fn a_layer_corrupt_mid_stream_ends_the_prefix_from_there_on() {
    let mut rig = Rig::start(PATIENCE);
    let asked = keys(1..4);
    let addr = rig.peer.local_addr();
    for &k in &asked {
        rig.locate(k, addr, false);
    }
    // Block 1's layer 5, changed under its right sums.
    let theirs = BlockHash(asked[1].0 + 1000);
    let lb = rig.layer_bytes();
    let right = rig.bytes(asked[1]);
    let sums = BlockSums::compute(theirs, lb as usize, &right);
    let mut held = right;
    held[5 * lb as usize + 3] ^= 1;
    rig.source.insert_with_sums(theirs, lb, held, sums);
    assert_eq!(rig.client.lookup(&asked).unwrap().len(), 3);
    rig.open_until(4);

    let load = rig.client.load(&asked).unwrap();
    assert_eq!(load.prefix_len(), 3, "{:?}", load.results());
    rig.client.wait_layer(&load, 3).unwrap();
    for i in 0..asked.len() {
        rig.layer_exact(&load, &asked, i, 3);
    }
    rig.open_until(u32::MAX);
    rig.client.wait_layer(&load, 4).unwrap();
    let mut buf = vec![0u8; lb as usize];
    for i in 1..asked.len() {
        for layer in [0, 4] {
            let got = load.read_layer(i, layer, &mut buf).unwrap();
            assert_eq!(got, Lookup::Miss, "block {i} layer {layer}");
        }
    }
    rig.layer_exact(&load, &asked, 0, 4);
    assert_eq!(rig.served(&asked, &load), 1);
    let s = rig.stats();
    assert_eq!((s.peer_loads, s.peer_hits, s.peer_misses), (1, 1, 2));
    assert!(rig.holds(asked[0]));
    assert!(!rig.holds(asked[1]) && !rig.holds(asked[2]));
    let pool = rig.reader().pool().stats();
    assert_eq!(pool[0].1.corrupt, 1, "{pool:?}");
    rig.client.release_load(load).unwrap();
    rig.client.remove(&asked).unwrap();
    assert!(rig.arena_free(), "the failed blocks' slots are free");
}

/// A peer that stops answering mid-stream (layers 4 and up never come):
/// the layers announced before stay readable until the deadline, then
/// every block of the run is a miss, the `Load` ends (no hang) and no
/// slot stays taken.
#[test]
fn a_peer_that_stops_mid_stream_is_a_miss_by_the_deadline() {
    let mut rig = Rig::start(SHORT);
    let asked = keys(1..3);
    let addr = rig.peer.local_addr();
    for &k in &asked {
        rig.locate(k, addr, false);
    }
    assert_eq!(rig.client.lookup(&asked).unwrap().len(), 2);
    rig.open_until(4);
    let load = rig.client.load(&asked).unwrap();
    assert_eq!(load.prefix_len(), 2, "{:?}", load.results());
    assert_eq!(rig.served(&asked, &load), 0);
    let s = rig.stats();
    assert_eq!((s.peer_hits, s.peer_misses), (0, 2));
    let pool = rig.reader().pool().stats();
    assert_eq!(pool[0].1.timeouts, 1, "{pool:?}");
    assert!(!rig.holds(asked[0]) && !rig.holds(asked[1]));
    rig.client.release_load(load).unwrap();
    assert!(rig.arena_free(), "no slot kept");
}

fn keys(ks: std::ops::Range<u128>) -> Vec<BlockHash> {
    ks.map(BlockHash).collect()
}
