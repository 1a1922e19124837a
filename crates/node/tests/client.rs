//! The client against a real node: `kvtier_node::Node` (arena, disk log,
//! block manager) behind a real `NodeServer` socket, in this process.
//! (Here rather than in kvtier-client, so the dev-dependency runs one way:
//! node tests use the client; the client's own tests need no node.)

use kvtier_client::{
    AsyncClient, BlockHash, BlockSource, Client, ClientConfig, ClientError, ErrorCode, Lookup,
    Namespace, StoreOutcome, Tier, TierInfo, TierKind, WireGeometry,
};
use kvtier_node::test_support::TestNode;

/// The node under test, on its own runtime; stopped when dropped.
struct Daemon {
    test: TestNode,
    _dir: tempfile::TempDir,
}

impl std::ops::Deref for Daemon {
    type Target = TestNode;
    fn deref(&self) -> &TestNode {
        &self.test
    }
}

impl Daemon {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = kvtier_node::test_support::small_config(dir.path(), 8);
        Self {
            test: TestNode::start(config, Vec::new()),
            _dir: dir,
        }
    }

    fn geometry(&self) -> WireGeometry {
        WireGeometry::from(self.node.geometry())
    }

    fn config(&self) -> ClientConfig {
        ClientConfig::new(self.socket(), namespace(), self.geometry())
    }

    fn block_bytes(&self) -> usize {
        self.node.geometry().block_bytes() as usize
    }

    fn layer_bytes(&self) -> usize {
        self.node.geometry().layer_bytes() as usize
    }

    fn hang_up(&mut self) {
        self.test.hang_up();
    }
}

fn namespace() -> Namespace {
    kvtier_node::test_support::namespace("test")
}

fn block(k: u128, len: usize) -> Vec<u8> {
    let seed = (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len as u64)
        .map(|i| (seed.wrapping_mul(i + 5) >> 33) as u8)
        .collect()
}

fn batch(blocks: &[(u128, Vec<u8>)]) -> Vec<(BlockHash, &[u8])> {
    blocks
        .iter()
        .map(|(k, b)| (BlockHash(*k), b.as_slice()))
        .collect()
}

fn keys(ks: &[u128]) -> Vec<BlockHash> {
    ks.iter().map(|k| BlockHash(*k)).collect()
}

#[test]
fn stores_and_loads_blocks_through_the_arena() {
    let daemon = Daemon::start();
    let (len, layer) = (daemon.block_bytes(), daemon.layer_bytes());
    let mut client = Client::connect(daemon.config()).expect("connect");
    assert_eq!(client.hello().shm_name, daemon.node.memory().shm_name());
    assert_eq!(client.arena().block_bytes(), len);
    // The node's tiers, as HelloOk announced them: the arena, the disk log.
    let tiers = [(Tier::G2, TierKind::Memory), (Tier::G3, TierKind::Disk)];
    assert_eq!(daemon.node.tier_list(), tiers);
    let announced: Vec<TierInfo> = tiers.map(|(tier, kind)| TierInfo { tier, kind }).into();
    assert_eq!(client.tiers(), announced);

    let blocks: Vec<(u128, Vec<u8>)> = (1..=3).map(|k| (k, block(k, len))).collect();
    let outcomes = client.store(&batch(&blocks)).unwrap();
    assert_eq!(outcomes, vec![StoreOutcome::Stored; 3]);
    assert_eq!(daemon.node.g2_blocks(), 3);
    let again = client.store(&batch(&blocks[..1])).unwrap();
    assert_eq!(again, vec![StoreOutcome::AlreadyStored]);
    assert_eq!(client.lookup(&keys(&[1, 2, 9, 3])).unwrap().len(), 2);

    let mut bufs = vec![vec![0u8; len]; 3];
    let mut dsts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    assert_eq!(client.load_into(&keys(&[1, 2, 3]), &mut dsts).unwrap(), 3);
    for (k, buf) in (1..=3).zip(&bufs) {
        assert_eq!(*buf, block(k, len));
    }
    // A miss ends the prefix.
    let mut dsts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    assert_eq!(client.load_into(&keys(&[1, 99, 3]), &mut dsts).unwrap(), 1);

    // Layer by layer, from a load held open.
    let load = client.load(&keys(&[3, 99])).unwrap();
    assert_eq!((load.prefix_len(), load.held_keys()), (1, keys(&[3])));
    client.wait_layer(&load, 1).unwrap();
    let mut part = vec![0u8; layer];
    assert_eq!(load.read_layer(0, 1, &mut part).unwrap(), Lookup::Hit);
    assert_eq!(part, block(3, len)[layer..2 * layer]);
    assert_eq!(load.read_layer(1, 1, &mut part).unwrap(), Lookup::Miss);
    client.release_load(load).unwrap();
}

/// Blocks whose layers lie in separate buffers, one per layer (as an
/// engine's per-layer KV tensors hold them): block `i` of layer `l` at
/// `layers[l][i * layer_bytes..]`.
struct PerLayer {
    keys: Vec<BlockHash>,
    layers: Vec<Vec<u8>>,
    layer_bytes: usize,
}

impl BlockSource for PerLayer {
    fn len(&self) -> usize {
        self.keys.len()
    }
    fn key(&self, i: usize) -> BlockHash {
        self.keys[i]
    }
    fn layer(&self, i: usize, layer: usize, _within: std::ops::Range<usize>) -> &[u8] {
        let at = i * self.layer_bytes;
        &self.layers[layer][at..at + self.layer_bytes]
    }
}

#[test]
fn blocks_are_stored_from_layers_that_lie_apart() {
    let daemon = Daemon::start();
    let (len, layer) = (daemon.block_bytes(), daemon.layer_bytes());
    let mut client = Client::connect(daemon.config()).expect("connect");
    let whole: Vec<Vec<u8>> = (1..=3).map(|k| block(k, len)).collect();
    let layers = len / layer;
    // Layer l of every block, one after the other.
    let per_layer: Vec<Vec<u8>> = (0..layers)
        .map(|l| {
            whole
                .iter()
                .flat_map(|b| b[l * layer..(l + 1) * layer].to_vec())
                .collect()
        })
        .collect();
    let src = PerLayer {
        keys: keys(&[1, 2, 3]),
        layers: per_layer,
        layer_bytes: layer,
    };
    assert_eq!(
        client.store_from(&src).unwrap(),
        vec![StoreOutcome::Stored; 3]
    );
    let mut bufs = vec![vec![0u8; len]; 3];
    let mut dsts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    assert_eq!(client.load_into(&keys(&[1, 2, 3]), &mut dsts).unwrap(), 3);
    assert_eq!(bufs, whole);

    // A layer of the wrong length fails the store and commits nothing;
    // its reservations are given back.
    let short = PerLayer {
        keys: keys(&[7, 8]),
        layers: vec![vec![0u8; layer]; layers],
        layer_bytes: layer / 2,
    };
    assert!(matches!(
        client.store_from(&short),
        Err(ClientError::Arena(_))
    ));
    assert!(client.lookup(&keys(&[7])).unwrap().is_empty());
    let stats: std::collections::HashMap<String, u64> = client
        .stats()
        .unwrap()
        .into_iter()
        .map(|c| (c.name, c.value))
        .collect();
    assert_eq!(stats["aborted"], 2, "{stats:?}");
}

#[test]
fn namespaces_never_share_blocks() {
    let daemon = Daemon::start();
    let len = daemon.block_bytes();
    let mut a = Client::connect(daemon.config()).unwrap();
    let mut other = daemon.config();
    other.namespace.tenant_salt = Some(b"tenant-b".to_vec());
    let mut b = Client::connect(other).unwrap();
    let blocks = vec![(5u128, block(5, len))];
    assert_eq!(
        a.store(&batch(&blocks)).unwrap(),
        vec![StoreOutcome::Stored]
    );
    assert!(b.lookup(&keys(&[5])).unwrap().is_empty());
    assert_eq!(
        b.store(&batch(&blocks)).unwrap(),
        vec![StoreOutcome::Stored]
    );
    assert_eq!(daemon.node.g2_blocks(), 2);
}

#[test]
fn a_corrupted_block_ends_the_verified_prefix() {
    let daemon = Daemon::start();
    let len = daemon.block_bytes();
    let mut client = Client::connect(daemon.config()).unwrap();
    let blocks: Vec<(u128, Vec<u8>)> = (1..=3).map(|k| (k, block(k, len))).collect();
    client.store(&batch(&blocks)).unwrap();
    let memory = daemon.node.memory();
    let stored = client.key_map().stored(BlockHash(2));
    let slot = memory.get_ref(stored).expect("resident").slot();
    let (arena, _) = memory.arena();
    // SAFETY: `arena()` starts at slot 0; one byte inside a resident slot, which
    // stays mapped while `memory` lives; no copy of it is in flight.
    unsafe { *arena.add(slot * memory.slot_bytes() + len - 1) ^= 1 };
    let mut bufs = vec![vec![0u8; len]; 3];
    let mut dsts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    assert_eq!(client.load_into(&keys(&[1, 2, 3]), &mut dsts).unwrap(), 1);
    // The client removed the corrupt block: storing it again puts good
    // bytes there, and the whole prefix reads back.
    assert_eq!(client.lookup(&keys(&[1, 2, 3])).unwrap().len(), 1);
    let again = client.store(&batch(&blocks[1..2])).unwrap();
    assert_eq!(again, vec![StoreOutcome::Stored]);
    let mut dsts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    assert_eq!(client.load_into(&keys(&[1, 2, 3]), &mut dsts).unwrap(), 3);
    assert_eq!(bufs[1], block(2, len));
}

#[test]
fn refusals_and_hang_ups_are_typed_errors() {
    let mut daemon = Daemon::start();
    let len = daemon.block_bytes();
    let mut wrong = daemon.config();
    wrong.geometry.layers *= 2;
    wrong.geometry.layer_bytes /= 2;
    let err = Client::connect(wrong).unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::Refused {
                code: ErrorCode::GEOMETRY_MISMATCH,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.is_fatal());

    let mut client = Client::connect(daemon.config()).unwrap();
    daemon.hang_up();
    let err = client.reserve(&keys(&[1])).unwrap_err();
    assert!(matches!(err, ClientError::Disconnected), "{err}");
    assert!(matches!(
        client.reserve(&keys(&[1])),
        Err(ClientError::Disconnected)
    ));
    // A new connection works.
    let mut client = Client::connect(daemon.config()).unwrap();
    assert_eq!(
        client.store(&[(BlockHash(4), &block(4, len)[..])]).unwrap(),
        vec![StoreOutcome::Stored]
    );
}

#[test]
fn the_async_client_makes_the_same_round_trips() {
    let daemon = Daemon::start();
    let len = daemon.block_bytes();
    let layers = daemon.geometry().layers;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut client = AsyncClient::connect(daemon.config()).await.unwrap();
        let announced: Vec<(Tier, TierKind)> =
            client.tiers().iter().map(|t| (t.tier, t.kind)).collect();
        assert_eq!(announced, daemon.node.tier_list());
        let blocks: Vec<(u128, Vec<u8>)> = (1..=2).map(|k| (k, block(k, len))).collect();
        let outcomes = client.store(&batch(&blocks)).await.unwrap();
        assert_eq!(outcomes, vec![StoreOutcome::Stored; 2]);
        let mut bufs = vec![vec![0u8; len]; 3];
        let mut dsts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
        let n = client
            .load_into(&keys(&[2, 1, 7]), &mut dsts)
            .await
            .unwrap();
        assert_eq!(n, 2);
        assert_eq!((&bufs[0], &bufs[1]), (&block(2, len), &block(1, len)));
        let load = client.load(&keys(&[1])).await.unwrap();
        client.wait_layer(&load, layers - 1).await.unwrap();
        let mut out = vec![0u8; len];
        assert_eq!(load.read(0, &mut out).unwrap(), Lookup::Hit);
        assert_eq!(out, block(1, len));
        client.release_load(load).await.unwrap();
    });
}
