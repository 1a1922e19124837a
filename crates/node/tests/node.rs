//! The node in one process: a real arena, disk log and manager behind a
//! real socket, driven by `kvtier-client`. What crosses tiers (G2 full,
//! blocks moved to the disk log and loaded back), what survives a restart
//! (adoption), and what a session's end releases.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use kvtier_client::{BlockHash, Client, ClientConfig, Namespace, StoreOutcome, Tier, TierKind};
use kvtier_manager::events::{BlockLocation, ChannelSink, EventSink, KvEvent};
use kvtier_node::NodeConfig as Config;
use kvtier_node::NodeServer;
use kvtier_node::test_support::TestNode;
use kvtier_protocol::{ReserveResult, WireGeometry};

/// The node under test with what the tests ask of it.
struct Daemon(TestNode);

impl std::ops::Deref for Daemon {
    type Target = TestNode;
    fn deref(&self) -> &TestNode {
        &self.0
    }
}

impl Daemon {
    fn start(config: Config) -> Self {
        Self::start_with_sinks(config, Vec::new())
    }

    fn start_with_sinks(config: Config, sinks: Vec<Arc<dyn EventSink>>) -> Self {
        Self(TestNode::start(config, sinks))
    }

    fn client(&self) -> Client {
        let geometry = WireGeometry::from(self.node.geometry());
        Client::connect(ClientConfig::new(self.socket(), namespace(), geometry)).expect("connect")
    }

    fn len(&self) -> usize {
        self.node.geometry().block_bytes() as usize
    }

    fn stop(self) -> Config {
        self.0.stop()
    }
}

fn namespace() -> Namespace {
    kvtier_node::test_support::namespace("node-test")
}

fn config(dir: &Path, dram_blocks: u64) -> Config {
    kvtier_node::test_support::small_config(dir, dram_blocks)
}

fn block(k: u128, len: usize) -> Vec<u8> {
    let seed = (k as u64).wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
    (0..len as u64)
        .map(|i| (seed.wrapping_mul(i + 11) >> 29) as u8)
        .collect()
}

fn store(client: &mut Client, ks: std::ops::Range<u128>, len: usize) -> Vec<StoreOutcome> {
    let blocks: Vec<(u128, Vec<u8>)> = ks.map(|k| (k, block(k, len))).collect();
    let batch: Vec<(BlockHash, &[u8])> = blocks
        .iter()
        .map(|(k, b)| (BlockHash(*k), b.as_slice()))
        .collect();
    client.store(&batch).expect("store")
}

/// Loads `ks` and checks every block of the prefix; returns its length.
fn load_exact(client: &mut Client, ks: std::ops::Range<u128>, len: usize) -> usize {
    let keys: Vec<BlockHash> = ks.clone().map(BlockHash).collect();
    let mut bufs = vec![vec![0u8; len]; keys.len()];
    let mut dsts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    let n = client.load_into(&keys, &mut dsts).expect("load");
    for (k, buf) in ks.zip(&bufs).take(n) {
        assert!(*buf == block(k, len), "block {k} came back different");
    }
    n
}

#[test]
fn a_full_g2_moves_blocks_to_disk_and_loads_bring_them_back() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(config(dir.path(), 4));
    // No remote store configured: the arena and the disk log.
    assert_eq!(
        daemon.node.tier_list(),
        [(Tier::G2, TierKind::Memory), (Tier::G3, TierKind::Disk)]
    );
    let len = daemon.len();
    let mut client = daemon.client();
    // Three times what the arena holds: each reserve makes room by moving
    // the coldest blocks to the disk log (the arena never evicts itself).
    for start in (0..12).step_by(4) {
        let got = store(&mut client, start..start + 4, len);
        assert_eq!(got, vec![StoreOutcome::Stored; 4], "batch at {start}");
    }
    assert_eq!(daemon.node.g2_blocks(), 4);
    let tiers = client
        .lookup(&(0..12).map(BlockHash).collect::<Vec<_>>())
        .unwrap();
    assert_eq!(tiers.len(), 12);
    assert!(tiers[..8].iter().all(|t| *t == Tier::G3), "{tiers:?}");
    // Loading the oldest blocks onboards them from disk into G2, verified.
    assert_eq!(load_exact(&mut client, 0..4, len), 4);
    assert_eq!(load_exact(&mut client, 0..12, len), 12 - 8);
}

/// Every policy a node runs, `slru` included, is accepted by name in
/// `[manager]`, starts a node and serves across G2 and the disk log.
#[test]
fn every_node_policy_starts_a_node_by_its_name() {
    for kind in kvtier_manager::policy::PolicyKind::NODE {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path(), 4);
        cfg.manager.policy = kind.name().to_owned();
        let daemon = Daemon::start(cfg);
        let len = daemon.len();
        let mut client = daemon.client();
        for start in (0..12).step_by(4) {
            let got = store(&mut client, start..start + 4, len);
            assert_eq!(
                got,
                vec![StoreOutcome::Stored; 4],
                "{kind} batch at {start}"
            );
        }
        assert_eq!(daemon.node.g2_blocks(), 4, "{kind}");
        assert_eq!(load_exact(&mut client, 8..12, len), 4, "{kind}");
        assert_eq!(load_exact(&mut client, 0..4, len), 4, "{kind}");
    }
}

#[test]
fn a_restart_adopts_what_the_disk_log_holds() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(config(dir.path(), 4));
    let len = daemon.len();
    let mut client = daemon.client();
    store(&mut client, 0..3, len);
    drop(client);
    let config = daemon.stop();
    // The clean stop moved G2 to the disk log and removed the arena: the
    // new node adopts the disk log's blocks, and no arena (adopting an
    // arena is for crashes, crates/cli/tests/node_crash.rs).
    let arena = Path::new("/dev/shm").join(&config.memory.shm_name);
    assert!(!arena.exists(), "a clean stop left {arena:?}");
    let daemon = Daemon::start(config);
    assert_eq!(daemon.node.adopted().in_tier(Tier::G3), 3);
    assert_eq!(daemon.node.adopted().in_tier(Tier::G2), 0);
    assert_eq!(daemon.node.memory().adoption(), None);
    let stats = daemon.node.stats();
    assert_eq!((stats.adopted_g2, stats.adopted_g3), (0, 3));
    let mut client = daemon.client();
    let tiers = client
        .lookup(&(0..3).map(BlockHash).collect::<Vec<_>>())
        .unwrap();
    assert_eq!(tiers, vec![Tier::G3; 3]);
    assert_eq!(load_exact(&mut client, 0..3, len), 3);
}

#[test]
fn a_session_that_ends_releases_its_reservations_and_pins() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(config(dir.path(), 4));
    let len = daemon.len();
    let mut writer = daemon.client();
    let mut other = daemon.client();
    let keys: Vec<BlockHash> = (100..102).map(BlockHash).collect();
    let granted = writer.reserve(&keys).unwrap();
    assert!(granted.iter().all(|r| matches!(r, ReserveResult::Slot(_))));
    // Stored once: a second writer is told someone else is storing it.
    assert_eq!(
        other.reserve(&keys).unwrap(),
        vec![ReserveResult::InFlightElsewhere; 2]
    );
    store(&mut other, 0..2, len);
    let load = other.load(&[BlockHash(0)]).unwrap();
    assert_eq!(load.prefix_len(), 1);
    drop(load);
    drop(writer);
    drop(other);
    daemon.wait_stats("the sessions to end", |s| s.sessions_open == 0);
    let s = daemon.node.stats();
    assert_eq!((s.aborted, s.released), (2, 1), "{s:?}");
    // Nothing half-written became readable; the keys can be stored again.
    let mut client = daemon.client();
    assert!(client.lookup(&keys).unwrap().is_empty());
    assert_eq!(
        store(&mut client, 100..102, len),
        vec![StoreOutcome::Stored; 2]
    );
    assert_eq!(load_exact(&mut client, 100..102, len), 2);
}

#[test]
fn leases_lapse_for_a_client_that_stays_connected() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), 4);
    c.manager.lease_secs = 1;
    c.manager.write_timeout_ms = 500;
    let daemon = Daemon::start(c);
    let mut client = daemon.client();
    let granted = client.reserve(&[BlockHash(7)]).unwrap();
    assert!(matches!(granted[0], ReserveResult::Slot(_)));
    daemon.wait_stats("the lease to lapse", |s| s.leases_expired == 1);
    // A late commit names no reservation, and the slot went back: another
    // reservation of the key succeeds.
    let len = daemon.len();
    let stored = client.key_map().stored(BlockHash(7));
    let layer = daemon.node.geometry().layer_bytes() as usize;
    let sums = kvtier_core::BlockSums::compute(stored, layer, &block(7, len));
    let late = client
        .commit(vec![kvtier_protocol::CommitEntry {
            key: BlockHash(7),
            sums,
        }])
        .unwrap();
    assert_eq!(late, vec![kvtier_protocol::CommitResult::NotReserved]);
    let mut other = daemon.client();
    assert!(matches!(
        other.reserve(&[BlockHash(7)]).unwrap()[0],
        ReserveResult::Slot(_)
    ));
}

#[test]
fn a_client_of_another_geometry_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(config(dir.path(), 4));
    let mut geometry = WireGeometry::from(daemon.node.geometry());
    geometry.block_bytes *= 2;
    geometry.layer_bytes *= 2;
    let config = ClientConfig::new(daemon.socket(), namespace(), geometry);
    assert!(Client::connect(config).is_err());
    assert_eq!(daemon.node.stats().handshake_refusals, 1);
}

#[test]
fn a_live_socket_is_refused_and_a_stale_one_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(config(dir.path(), 4));
    let socket = daemon.socket();
    let second = daemon
        .rt
        .block_on(NodeServer::bind(daemon.node.clone(), &socket));
    assert!(
        matches!(second, Err(kvtier_node::NodeError::SocketInUse { .. })),
        "{second:?}"
    );
    let config = daemon.stop();
    assert!(!socket.exists(), "shutdown removes the socket");
    // A socket file nobody listens on (a daemon that was killed).
    let stale = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    drop(stale);
    assert!(socket.exists());
    let stale_ino = std::fs::metadata(&socket).unwrap().ino();
    let daemon = Daemon::start(config);
    let mut client = daemon.client();
    assert!(client.lookup(&[BlockHash(1)]).unwrap().is_empty());
    let meta = std::fs::metadata(&socket).unwrap();
    assert_ne!(meta.ino(), stale_ino, "the stale socket was replaced");
    assert_eq!(meta.mode() & 0o7777, 0o600);
    // Bound in a staging directory and renamed: nothing of it is left.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        !names.iter().any(|n| n.starts_with(".b")),
        "a staging directory was left: {names:?}"
    );
}

/// Opens a node on `config` and binds its socket, which must be refused;
/// returns why.
fn refused_bind(config: &Config) -> kvtier_node::NodeError {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let node = kvtier_node::Node::open(config, Vec::new())
            .await
            .expect("open the node");
        let e = NodeServer::bind(node.clone(), &config.node_socket())
            .await
            .expect_err("the bind must be refused");
        node.close().await.expect("close the node");
        e
    })
}

/// Gives `path` (not following a link) to uid and gid 65534, as another
/// local user's file would be. Only root may: CI runs the tests as root,
/// and elsewhere this test fails rather than pass without checking.
fn give_to_another_user(path: &Path) {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test must run as root to make a socket of another user (CI runs as root)"
    );
    std::os::unix::fs::lchown(path, Some(65534), Some(65534)).unwrap();
}

/// A socket of another user at the path, dead or live, is an impostor's:
/// the daemon neither connects to it nor removes it.
#[test]
fn a_socket_of_another_user_is_never_trusted_nor_removed() {
    use std::io::ErrorKind;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 4);
    let socket = config.node_socket();
    // A live listener of another user: an impostor waiting for engines.
    let impostor = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    impostor.set_nonblocking(true).unwrap();
    give_to_another_user(&socket);
    let ino = std::fs::metadata(&socket).unwrap().ino();
    let e = refused_bind(&config);
    assert!(
        matches!(
            e,
            kvtier_node::NodeError::ForeignSocket { owner: 65534, .. }
        ),
        "{e}"
    );
    let text = e.to_string();
    assert!(
        text.contains(&socket.display().to_string()) && text.contains("uid 65534"),
        "{text}"
    );
    assert_eq!(
        std::fs::metadata(&socket).unwrap().ino(),
        ino,
        "left in place"
    );
    match impostor.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the daemon connected to the impostor: {other:?}"),
    }
    // Nobody listens on it any more: still another user's, still refused.
    drop(impostor);
    let e = refused_bind(&config);
    assert!(
        matches!(e, kvtier_node::NodeError::ForeignSocket { .. }),
        "{e}"
    );
    assert_eq!(
        std::fs::metadata(&socket).unwrap().ino(),
        ino,
        "left in place"
    );
}

#[test]
fn stores_and_moves_are_published_with_tier_and_location() {
    let dir = tempfile::tempdir().unwrap();
    let (sink, mut batches) = ChannelSink::new(1024);
    let daemon = Daemon::start_with_sinks(config(dir.path(), 2), vec![Arc::new(sink)]);
    let len = daemon.len();
    let mut client = daemon.client();
    // Four blocks through a two-slot arena: two end in G2, two moved to G3.
    store(&mut client, 0..2, len);
    store(&mut client, 2..4, len);
    daemon.node.manager().flush_events();
    let mut stored = Vec::new();
    let mut removed = Vec::new();
    while let Ok(batch) = batches.try_recv() {
        for event in &batch.events {
            match event {
                KvEvent::Stored(s) => stored.push((s.tier, s.location.clone())),
                KvEvent::Removed(r) => removed.push(r.tier),
                _ => {}
            }
        }
    }
    let g2: Vec<_> = stored.iter().filter(|(t, _)| *t == Tier::G2).collect();
    let g3 = stored.iter().filter(|(t, _)| *t == Tier::G3).count();
    assert_eq!((g2.len(), g3), (4, 2), "{stored:?}");
    assert!(
        g2.iter()
            .all(|(_, l)| matches!(l, Some(BlockLocation::ArenaSlot { .. }))),
        "{g2:?}"
    );
    assert_eq!(removed, vec![Tier::G2; 2]);
}

/// With `manager.g4_url`, blocks the disk log has no room for cascade to
/// G4 (a directory here) instead of being reclaimed by the log, load back
/// exact from there, and a restart adopts the objects under the prefix.
#[test]
fn g4_below_the_disk_log_takes_its_overflow_and_is_adopted() {
    let dir = tempfile::tempdir().unwrap();
    let g4 = dir.path().join("g4");
    std::fs::create_dir_all(&g4).unwrap();
    let mut c = config(dir.path(), 2);
    // 4 regions: a G3 pool of one region's slots (docs/disk-format.md, I24).
    c.disk.capacity_per_dir = kvtier_core::ByteSize(4 << 20);
    c.manager.g4_url = format!("file://{}", g4.display());
    c.manager.g4_capacity_blocks = 1000;
    // The background step races the stores' on-demand room making: a slot
    // one frees may be taken by the other, which must then wait, never
    // evict a block that has no copy below (a block was lost that way).
    c.manager.step_interval_ms = 20;
    let daemon = Daemon::start(c);
    // Registered in order: the arena, the disk log, then the remote store.
    assert_eq!(
        daemon.node.tier_list(),
        [
            (Tier::G2, TierKind::Memory),
            (Tier::G3, TierKind::Disk),
            (Tier::G4, TierKind::Remote)
        ]
    );
    let len = daemon.len();
    let disk_blocks = (2 << 20) / len as u128;
    let n = disk_blocks + 40;
    let mut client = daemon.client();
    // The remote store follows the disk log in the node's tier list.
    let kinds: Vec<(Tier, TierKind)> = client.tiers().iter().map(|t| (t.tier, t.kind)).collect();
    let want = [
        (Tier::G2, TierKind::Memory),
        (Tier::G3, TierKind::Disk),
        (Tier::G4, TierKind::Remote),
    ];
    assert_eq!(
        (kinds.as_slice(), daemon.node.tier_list()),
        (&want[..], want.to_vec())
    );
    for start in (0..n).step_by(2) {
        let got = store(&mut client, start..start + 2, len);
        assert_eq!(got, vec![StoreOutcome::Stored; 2], "batch at {start}");
    }
    let keys: Vec<BlockHash> = (0..n).map(BlockHash).collect();
    let tiers = client.lookup(&keys).unwrap();
    assert_eq!(tiers.len() as u128, n, "every block is held somewhere");
    let in_g4 = tiers.iter().filter(|t| **t == Tier::G4).count();
    assert!(in_g4 > 0, "nothing reached G4: {tiers:?}");
    // The oldest blocks went furthest down; they load back exact.
    assert_eq!(load_exact(&mut client, 0..2, len), 2);
    drop(client);
    let config = daemon.stop();
    let daemon = Daemon::start(config);
    assert!(
        daemon.node.adopted().in_tier(Tier::G4) > 0,
        "{:?}",
        daemon.node.adopted()
    );
    let mut client = daemon.client();
    let tiers = client.lookup(&keys).unwrap();
    assert!(tiers.contains(&Tier::G4), "{tiers:?}");
    let first_g4 = tiers.iter().position(|t| *t == Tier::G4).unwrap() as u128;
    // From G4 too, the layers arrive (and are read) one by one.
    let layers = daemon.node.geometry().layers;
    read_layer_by_layer(&mut client, first_g4..first_g4 + 2, len, layers);
    let remote = daemon
        .node
        .manager()
        .stats()
        .paths
        .into_iter()
        .find(|p| {
            p.path
                == kvtier_manager::TransferPath {
                    from: Tier::G4,
                    to: Tier::G2,
                }
        })
        .expect("blocks came from G4");
    assert_eq!(
        remote.transfers,
        u64::from(layers),
        "one ranged read batch per layer"
    );
}

/// A load of blocks the disk log holds answers their arena slots at once
/// and then one `LayerReady` per layer, each with the layer's checksums:
/// the client reads layer 0 of every block (verified against those) before
/// it waits for the last layer, then the whole blocks, exact.
#[test]
fn a_load_from_the_disk_log_is_readable_layer_by_layer() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(config(dir.path(), 4));
    let len = daemon.len();
    let layers = daemon.node.geometry().layers;
    assert!(layers > 1, "the test needs blocks of several layers");
    let mut client = daemon.client();
    store(&mut client, 0..3, len);
    drop(client);
    let daemon = Daemon::start(daemon.stop());
    assert_eq!(
        daemon.node.adopted().in_tier(Tier::G3),
        3,
        "every block is on the disk only"
    );
    let mut client = daemon.client();
    read_layer_by_layer(&mut client, 0..3, len, layers);
    assert_eq!(daemon.node.stats().loaded, 3);
}

/// Loads `ks` (every one held), reads each layer of each block as soon as
/// its `LayerReady` came, verified and exact, then the whole blocks.
fn read_layer_by_layer(client: &mut Client, ks: std::ops::Range<u128>, len: usize, layers: u32) {
    let layer_bytes = len / layers as usize;
    let keys: Vec<BlockHash> = ks.clone().map(BlockHash).collect();
    let load = client.load(&keys).expect("load");
    assert_eq!(load.prefix_len(), keys.len());
    for layer in 0..layers {
        client.wait_layer(&load, layer).expect("wait for the layer");
        for (i, k) in ks.clone().enumerate() {
            let mut dst = vec![0u8; layer_bytes];
            let got = load.read_layer(i, layer, &mut dst).expect("read");
            assert_eq!(got, kvtier_core::Lookup::Hit, "block {k} layer {layer}");
            let at = layer as usize * layer_bytes;
            assert!(
                dst == block(k, len)[at..at + layer_bytes],
                "block {k} layer {layer}"
            );
        }
    }
    for (i, k) in ks.enumerate() {
        let mut whole = vec![0u8; len];
        assert_eq!(
            load.read(i, &mut whole).expect("read"),
            kvtier_core::Lookup::Hit
        );
        assert!(whole == block(k, len), "block {k}");
    }
    client.release_load(load).expect("release");
}
