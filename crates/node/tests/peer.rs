//! The node's peer server (docs/peer-protocol.md §8) against a real node in
//! this process: blocks stored through the node's socket with the real
//! client, read back by a `PeerClient` over loopback TCP from G2, from G3
//! (moved down, or adopted after a restart), verified against the sums the
//! node holds; misses, refusals, and blocks removed while peers read.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kvtier_client::{Client, ClientConfig, WireGeometry};
use kvtier_core::{BlockHash, BlockSums, Tier};
use kvtier_node::test_support::{TestNode, namespace, small_config};
use kvtier_node::{HeldBlocks, HeldRead, NodeHost, NodePeer, PeerOptions, PeerSectionConfig};
use kvtier_peer::{
    BlockData, ClusterSecret, Expect, Identity, LayerRange, PeerClient, PeerError, ReadStats, Want,
};

const SECRET: [u8; 32] = [0x5a; 32];
const CLUSTER: &str = "test-cluster";
/// Bounds a failure; not a latency target.
const PATIENCE: Duration = Duration::from_secs(30);

/// A node in a temporary directory serving peers.
struct Rig {
    peer: Option<NodePeer>,
    host: Arc<NodeHost>,
    test: TestNode,
    dir: tempfile::TempDir,
}

impl Rig {
    fn start() -> Self {
        Self::start_with(|_, _| {})
    }

    /// A node of `small_config` with 8 arena slots, changed by `change`.
    fn start_with(change: impl FnOnce(&mut kvtier_node::NodeConfig, &Path)) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = small_config(dir.path(), 8);
        change(&mut config, dir.path());
        Self::on(TestNode::start(config, Vec::new()), dir)
    }

    /// A peer server over `test`'s node, its secret in `dir`.
    fn on(test: TestNode, dir: tempfile::TempDir) -> Self {
        let secret = dir.path().join("cluster.secret");
        if !secret.exists() {
            write_private(&secret, &SECRET);
        }
        let options = PeerOptions::from_config(&section(&secret))
            .expect("peer options")
            .expect("a peer server is configured");
        let host = NodeHost::of(test.node.clone());
        let peer = test
            .rt
            .block_on(NodePeer::start(&host, options))
            .expect("start the peer server");
        Self {
            peer: Some(peer),
            host,
            test,
            dir,
        }
    }

    /// Stops the peer server and the node, then starts both again on the
    /// same data: the node adopts what its disk log holds.
    fn restart(self) -> Self {
        let Rig {
            peer,
            host,
            test,
            dir,
        } = self;
        if let Some(p) = peer {
            test.rt.block_on(p.shutdown());
        }
        // The last holder of the old node but the test's: its arena goes
        // once both are gone.
        drop(host);
        let config = test.stop();
        Self::on(TestNode::start(config, Vec::new()), dir)
    }

    fn addr(&self) -> std::net::SocketAddr {
        self.peer.as_ref().expect("serving").local_addr()
    }

    fn client(&self) -> Client {
        let geometry = WireGeometry::from(self.test.node.geometry());
        let config = ClientConfig::new(self.test.socket(), namespace("peer"), geometry);
        Client::connect(config).expect("connect to the node")
    }

    fn block_bytes(&self) -> usize {
        self.test.node.geometry().block_bytes() as usize
    }

    fn layer_bytes(&self) -> usize {
        self.test.node.geometry().layer_bytes() as usize
    }

    /// Reads `wants` as a peer of the cluster.
    fn read(&self, wants: &[Want], layers: LayerRange) -> (Vec<Option<BlockData>>, ReadStats) {
        self.test.rt.block_on(read_from(self.addr(), wants, layers))
    }

    /// The fastest tier holding stored key `key`, as the node's pools say.
    fn fastest(&self, key: BlockHash) -> Option<Tier> {
        self.test.node.manager().registry().residency(key).fastest()
    }

    /// Polls until `key` is held in `tier` and no faster one.
    fn wait_in(&self, key: BlockHash, tier: Tier) {
        let deadline = std::time::Instant::now() + PATIENCE;
        while self.fastest(key) != Some(tier) {
            assert!(
                std::time::Instant::now() < deadline,
                "block {key} never reached {tier}: {:?}",
                self.fastest(key)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The node's `/metrics` sample `line` (name and labels), as a number.
    fn metric(&self, line: &str) -> u64 {
        let text = self.host.metrics_text();
        text.lines()
            .find_map(|l| l.strip_prefix(line)?.strip_prefix(' '))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {line} in the metrics:\n{text}")) as u64
    }

    /// Polls until sample `line` reads `want`: the server counts what it
    /// sent after the write, which the reader may see first.
    fn wait_metric(&self, line: &str, want: u64) {
        let deadline = std::time::Instant::now() + PATIENCE;
        while self.metric(line) != want {
            assert!(
                std::time::Instant::now() < deadline,
                "{line} is {}, not {want}",
                self.metric(line)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn section(secret: &Path) -> PeerSectionConfig {
    PeerSectionConfig {
        listen: "127.0.0.1:0".into(),
        cluster: CLUSTER.into(),
        secret_file: secret.to_owned(),
        node_name: "node-a".into(),
        ..PeerSectionConfig::default()
    }
}

fn write_private(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .expect("create the secret");
    f.write_all(bytes).expect("write the secret");
}

fn reader(cluster: &str, secret: [u8; 32]) -> Identity {
    Identity {
        cluster: cluster.into(),
        node: "node-b".into(),
        secret: ClusterSecret::from_bytes(secret),
    }
}

async fn read_from(
    addr: std::net::SocketAddr,
    wants: &[Want],
    layers: LayerRange,
) -> (Vec<Option<BlockData>>, ReadStats) {
    let mut c = PeerClient::connect(addr, &reader(CLUSTER, SECRET), PATIENCE)
        .await
        .expect("connect as a peer");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let got = c.read(wants, layers, deadline).await.expect("read");
    (got, c.stats())
}

fn block(k: u128, len: usize) -> Vec<u8> {
    let seed = (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len as u64)
        .map(|i| (seed.wrapping_mul(i + 3) >> 29) as u8)
        .collect()
}

fn keys(ks: impl IntoIterator<Item = u128>) -> Vec<BlockHash> {
    ks.into_iter().map(BlockHash).collect()
}

/// Stores blocks `ks` through the node's socket; returns, per key, its
/// stored key (what peers name) and the sums the node holds for it (from
/// a `Load`'s answer: what a reader trusts).
fn store(rig: &Rig, client: &mut Client, ks: &[u128]) -> Vec<(BlockHash, BlockSums)> {
    let len = rig.block_bytes();
    let blocks: Vec<(BlockHash, Vec<u8>)> =
        ks.iter().map(|&k| (BlockHash(k), block(k, len))).collect();
    let batch: Vec<(BlockHash, &[u8])> = blocks.iter().map(|(k, b)| (*k, b.as_slice())).collect();
    client.store(&batch).expect("store");
    let load = client.load(&keys(ks.iter().copied())).expect("load");
    assert_eq!(
        load.prefix_len(),
        ks.len(),
        "every block stored is resident"
    );
    let map = client.key_map();
    let held: Vec<(BlockHash, BlockSums)> = ks
        .iter()
        .zip(load.results())
        .map(|(&k, r)| {
            let sums = r.sums().expect("a resident block's sums").clone();
            (map.stored(BlockHash(k)), sums)
        })
        .collect();
    client.release_load(load).expect("release");
    held
}

fn trusted(held: &[(BlockHash, BlockSums)]) -> Vec<Want> {
    held.iter()
        .map(|(key, sums)| Want {
            key: *key,
            expect: Expect::Checksum(sums.block),
        })
        .collect()
}

#[test]
fn a_peer_reads_stored_blocks_from_g2_then_from_g3() {
    let rig = Rig::start();
    let mut client = rig.client();
    let ks = [1u128, 2, 3, 4];
    let held = store(&rig, &mut client, &ks);
    for (key, _) in &held {
        assert_eq!(rig.fastest(*key), Some(Tier::G2));
    }
    let len = rig.block_bytes();

    // From G2, whole, with the sums the node holds; and a key not held.
    let mut wants = trusted(&held);
    let absent = client.key_map().stored(BlockHash(99));
    wants.push(Want {
        key: absent,
        expect: Expect::Consistent,
    });
    let (got, stats) = rig.read(&wants, LayerRange::All);
    for (k, got) in ks.iter().zip(&got) {
        let b = got.as_ref().expect("a block the node holds");
        assert_eq!(b.bytes, block(*k, len), "block {k} byte-exact from G2");
    }
    assert!(got[4].is_none(), "a key the node does not hold is a miss");
    assert_eq!((stats.found, stats.missing, stats.corrupt), (4, 1, 0));
    assert_eq!(
        rig.metric("kvtier_peer_served_blocks_total{tier=\"g2\"}"),
        4
    );
    rig.wait_metric("kvtier_peer_blocks_missing_total", 1);
    rig.wait_metric("kvtier_peer_bytes_sent_total", 4 * len as u64);

    // Eight new blocks fill the 8-slot arena: the first four move to G3.
    store(&rig, &mut client, &[11, 12, 13, 14, 15, 16, 17, 18]);
    for (key, _) in &held {
        rig.wait_in(*key, Tier::G3);
    }
    let (got, stats) = rig.read(&trusted(&held), LayerRange::All);
    for (k, got) in ks.iter().zip(&got) {
        let b = got.as_ref().expect("a block in G3");
        assert_eq!(b.bytes, block(*k, len), "block {k} byte-exact from G3");
    }
    assert_eq!(stats.corrupt, 0);
    assert_eq!(
        rig.metric("kvtier_peer_served_blocks_total{tier=\"g3\"}"),
        4
    );

    // One layer from G3: the span's bytes, authenticated by all the sums.
    let layer = rig.layer_bytes();
    let (got, _) = rig.read(&trusted(&held[..1]), LayerRange::Span { start: 1, end: 2 });
    let b = got[0].as_ref().expect("layer 1 from G3");
    assert_eq!(b.bytes, block(1, len)[layer..2 * layer]);
    // A peer read moves nothing: the blocks stay in G3.
    assert_eq!(rig.fastest(held[0].0), Some(Tier::G3));
}

#[test]
fn blocks_pushed_down_to_g4_are_served_from_there() {
    let rig = Rig::start_with(|c, dir| {
        let g4 = dir.join("g4");
        std::fs::create_dir_all(&g4).expect("the G4 directory");
        // 4 regions: a G3 pool of one region's slots (docs/disk-format.md,
        // I24), so a few dozen blocks overflow to G4.
        c.disk.capacity_per_dir = kvtier_core::ByteSize(4 << 20);
        c.manager.g4_url = format!("file://{}", g4.display());
        c.manager.g4_capacity_blocks = 1000;
    });
    let mut client = rig.client();
    let tracked: Vec<u128> = (1..=8).collect();
    let held = store(&rig, &mut client, &tracked);
    let len = rig.block_bytes();
    let filler: Vec<(BlockHash, Vec<u8>)> = (100..100 + (2 << 20) / len as u128 + 40)
        .map(|k| (BlockHash(k), block(k, len)))
        .collect();
    for chunk in filler.chunks(4) {
        let batch: Vec<(BlockHash, &[u8])> =
            chunk.iter().map(|(k, b)| (*k, b.as_slice())).collect();
        client.store(&batch).expect("store");
    }
    // The oldest blocks went furthest down.
    let in_g4: Vec<usize> = (0..held.len())
        .filter(|&i| rig.fastest(held[i].0) == Some(Tier::G4))
        .collect();
    assert!(!in_g4.is_empty(), "no tracked block reached G4");
    let wants: Vec<(BlockHash, BlockSums)> = in_g4.iter().map(|&i| held[i].clone()).collect();
    let (got, stats) = rig.read(&trusted(&wants), LayerRange::All);
    for (&i, got) in in_g4.iter().zip(&got) {
        let b = got.as_ref().expect("a block in G4");
        assert_eq!(
            b.bytes,
            block(tracked[i], len),
            "block {} from G4",
            tracked[i]
        );
    }
    assert_eq!(stats.corrupt, 0);
    let served = rig.metric("kvtier_peer_served_blocks_total{tier=\"g4\"}");
    assert_eq!(served, in_g4.len() as u64);
}

#[test]
fn a_restarted_node_serves_the_blocks_its_disk_log_kept() {
    let rig = Rig::start();
    let ks = [21u128, 22, 23];
    let held = store(&rig, &mut rig.client(), &ks);
    let rig = rig.restart();
    for (key, _) in &held {
        assert_eq!(rig.fastest(*key), Some(Tier::G3), "adopted from the log");
    }
    let (got, stats) = rig.read(&trusted(&held), LayerRange::All);
    let len = rig.block_bytes();
    for (k, got) in ks.iter().zip(&got) {
        assert_eq!(got.as_ref().expect("adopted").bytes, block(*k, len));
    }
    assert_eq!((stats.found, stats.corrupt), (3, 0));
}

#[test]
fn peers_without_the_cluster_secret_or_of_another_cluster_are_refused() {
    let rig = Rig::start();
    let connect = |id: Identity| {
        rig.test
            .rt
            .block_on(PeerClient::connect(rig.addr(), &id, PATIENCE))
            .expect_err("refused")
    };
    let wrong_secret = connect(reader(CLUSTER, [1; 32]));
    assert!(
        matches!(wrong_secret, PeerError::AuthFailed { .. }),
        "{wrong_secret:?}"
    );
    let other_cluster = connect(reader("another", SECRET));
    assert!(
        matches!(other_cluster, PeerError::Refused { .. }),
        "{other_cluster:?}"
    );
    rig.wait_metric("kvtier_peer_auth_failures_total", 1);
    assert_eq!(rig.metric("kvtier_peer_authenticated_total"), 0);
}

#[test]
fn a_block_held_for_a_peer_stays_through_a_remove_and_reads_exact() {
    let rig = Rig::start();
    let mut client = rig.client();
    let held = store(&rig, &mut client, &[31]);
    let key = held[0].0;
    let node = rig.test.node.clone();
    let taken = HeldBlocks::take(&node, &[key]);
    assert_eq!(taken.tiers(), vec![Some(Tier::G2)]);
    // The engine removes the block while a peer's read holds it: the
    // held copy stays, readable, until the read lets go.
    client.remove(&[BlockHash(31)]).expect("remove");
    assert_eq!(rig.fastest(key), Some(Tier::G2));
    let read = rig.test.rt.block_on(taken.read(LayerRange::All));
    match &read[..] {
        [HeldRead::Served(Tier::G2, b)] => {
            assert_eq!(b.bytes, block(31, rig.block_bytes()));
            assert_eq!(b.sums, held[0].1, "the sums the node stored");
        }
        other => panic!("the held block was not served: {other:?}"),
    }
    client.remove(&[BlockHash(31)]).expect("remove");
    assert_eq!(rig.fastest(key), None);
    let (got, _) = rig.read(&trusted(&held), LayerRange::All);
    assert!(got[0].is_none(), "a removed block is a miss");
}

#[test]
fn blocks_removed_and_stored_again_during_peer_reads_are_never_served_wrong() {
    let rig = Rig::start();
    let ks: Vec<u128> = (41..=44).collect();
    let held = store(&rig, &mut rig.client(), &ks);
    let len = rig.block_bytes();
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (stop, mut client) = (stop.clone(), rig.client());
        let ks = ks.clone();
        std::thread::spawn(move || {
            let blocks: Vec<(BlockHash, Vec<u8>)> =
                ks.iter().map(|&k| (BlockHash(k), block(k, len))).collect();
            let batch: Vec<(BlockHash, &[u8])> =
                blocks.iter().map(|(k, b)| (*k, b.as_slice())).collect();
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                client.remove(&keys(ks.iter().copied())).expect("remove");
                client.store(&batch).expect("store");
                rounds += 1;
            }
            rounds
        })
    };
    let (mut found, mut corrupt) = (0, 0);
    rig.test.rt.block_on(async {
        let mut c = PeerClient::connect(rig.addr(), &reader(CLUSTER, SECRET), PATIENCE)
            .await
            .expect("connect");
        for _ in 0..300 {
            let deadline = tokio::time::Instant::now() + PATIENCE;
            let got = c.read(&trusted(&held), LayerRange::All, deadline).await;
            for (k, b) in ks.iter().zip(got.expect("read")) {
                if let Some(b) = b {
                    assert_eq!(b.bytes, block(*k, len), "block {k} served wrong");
                }
            }
        }
        (found, corrupt) = (c.stats().found, c.stats().corrupt);
    });
    stop.store(true, Ordering::Relaxed);
    let rounds = churn.join().expect("the churn thread");
    assert!(rounds > 0, "the engine never removed a block");
    eprintln!("{rounds} remove/store rounds; {found} blocks found by 300 reads of 4");
    // The node never sent a block that failed the reader's verification.
    assert_eq!(corrupt, 0);
    assert_eq!(
        rig.metric("kvtier_peer_read_failures_total{tier=\"g2\"}"),
        0
    );
}

#[test]
fn a_missing_or_unsafe_secret_file_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing: PathBuf = dir.path().join("absent");
    let e = PeerOptions::from_config(&section(&missing)).expect_err("no secret file");
    assert!(e.to_string().contains("absent"), "{e}");
    let open = dir.path().join("open");
    std::fs::write(&open, SECRET).expect("write");
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .expect("chmod");
    let e = PeerOptions::from_config(&section(&open)).expect_err("a readable secret");
    assert!(e.to_string().contains("open"), "{e}");
    let off = PeerSectionConfig::default();
    assert!(PeerOptions::from_config(&off).expect("off").is_none());
}
