//! A `Load` of blocks the cluster located (docs/peer-protocol.md §11)
//! against a real node, its real socket and client, and a real peer server
//! over blocks held in memory: the cluster lookup is a fixed map here, so
//! a location can point at a copy that is corrupt or a peer that never
//! answers. A block that does not come is a miss of the `Load`, never an
//! error, and leaves nothing behind in G2.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvtier_client::{Client, ClientConfig, WireGeometry};
use kvtier_core::{BlockHash, BlockSums, Lookup, TierKind};
use kvtier_node::test_support::{TestNode, namespace, small_config};
use kvtier_node::{
    ClusterBlock, ClusterLookup, CommittedKey, NodeStats, PeerLocation, PeerReader,
    SessionNamespace,
};
use kvtier_peer::{
    ClusterSecret, Identity, MemorySource, PeerPool, PeerServer, PoolConfig, ServerConfig,
    ServerHandle,
};
use kvtier_tier::BoxFuture;

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

/// A node whose cluster is `Fixed`, a peer "node-x" serving `source`, and
/// a client of the node.
struct Rig {
    test: TestNode,
    cluster: Arc<Fixed>,
    source: Arc<MemorySource>,
    peer: ServerHandle,
    client: Client,
    _dir: tempfile::TempDir,
}

impl Rig {
    /// A rig whose reads of peers end after `timeout`.
    fn start(timeout: Duration) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let test = TestNode::start(small_config(dir.path(), 4), Vec::new());
        let cluster = Arc::new(Fixed::default());
        let source = Arc::new(MemorySource::new());
        let peer = test.rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let config = ServerConfig::new(identity("node-x"));
            PeerServer::start(listener, config, source.clone()).unwrap()
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
            peer,
            client,
            _dir: dir,
        }
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
    /// must answer two misses; their keys.
    fn two_located_miss(&mut self, addr: SocketAddr) -> Vec<BlockHash> {
        let asked = keys(1..3);
        for &k in &asked {
            self.locate(k, addr, false);
        }
        assert_eq!(self.client.lookup(&asked).unwrap().len(), 2);
        let load = self.client.load(&asked).unwrap();
        assert_eq!(load.prefix_len(), 0, "{:?}", load.results());
        let s = self.stats();
        assert_eq!((s.peer_hits, s.peer_misses), (0, 2));
        asked
    }

    fn stats(&self) -> NodeStats {
        self.test.node.stats()
    }

    /// Whether the node holds client key `k` in any tier.
    fn holds(&self, k: BlockHash) -> bool {
        self.test.node.contains(self.client.key_map().stored(k))
    }
}

fn keys(ks: std::ops::Range<u128>) -> Vec<BlockHash> {
    ks.map(BlockHash).collect()
}

#[test]
fn a_corrupt_copy_ends_the_prefix_and_nothing_of_it_is_kept() {
    let mut rig = Rig::start(PATIENCE);
    let asked = keys(1..4);
    let addr = rig.peer.local_addr();
    rig.locate(asked[0], addr, false);
    rig.locate(asked[1], addr, true);
    rig.locate(asked[2], addr, false);
    let tiers = rig.client.lookup(&asked).unwrap();
    assert_eq!(tiers.len(), 3);

    let load = rig.client.load(&asked).unwrap();
    assert_eq!(load.prefix_len(), 1, "{:?}", load.results());
    rig.client.wait_layer(&load, load_layers(&rig) - 1).unwrap();
    let mut buf = vec![0u8; rig.block_bytes()];
    assert_eq!(load.read(0, &mut buf).unwrap(), Lookup::Hit);
    assert_eq!(buf, rig.bytes(asked[0]));
    let s = rig.stats();
    assert_eq!((s.peer_loads, s.peer_hits, s.peer_misses), (1, 1, 2));
    assert_eq!(s.load_misses, 2);
    let pool = rig.test.node.peer_reader().unwrap().pool().stats();
    // The third came verified in the same read, and was dropped: it no
    // longer continues a prefix.
    assert_eq!((pool[0].1.found, pool[0].1.corrupt), (2, 1), "{pool:?}");
    assert!(rig.holds(asked[0]));
    assert!(!rig.holds(asked[1]) && !rig.holds(asked[2]));
    rig.client.release_load(load).unwrap();
}

#[test]
fn a_peer_that_never_answers_is_a_miss_by_the_deadline() {
    let mut rig = Rig::start(SHORT);
    // Accepts connections (the kernel's backlog) and never says a word.
    let silent = rig
        .test
        .rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    rig.two_located_miss(silent.local_addr().unwrap());
    let pool = rig.test.node.peer_reader().unwrap().pool().stats();
    assert_eq!(pool[0].1.timeouts, 1, "{pool:?}");
    assert_eq!(rig.test.node.usage().0, 0, "no slot kept");
    drop(silent);
}

#[test]
fn without_room_in_g2_located_blocks_are_misses() {
    let mut rig = Rig::start(PATIENCE);
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
    let pool = rig.test.node.peer_reader().unwrap().pool().stats();
    assert!(pool.is_empty(), "{pool:?}");

    // Released, the room is there and the blocks come.
    rig.client.release_load(pinned).unwrap();
    assert_eq!(rig.client.lookup(&asked).unwrap().len(), 2);
    let load = rig.client.load(&asked).unwrap();
    assert_eq!(load.prefix_len(), 2, "{:?}", load.results());
}

fn load_layers(rig: &Rig) -> u32 {
    rig.test.node.geometry().layers
}
