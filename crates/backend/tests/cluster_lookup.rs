//! Cluster lookups: two real nodes, each with its server, node view and
//! cluster lookup, over one metadata service. A block stored through node
//! A's socket is found by node B's `Lookup` (the peer tier) with A's
//! authenticated location; locations of another namespace, another
//! cluster's key or B itself are not answered; with the metadata service
//! gone, B answers from its own tiers, without an error; A's peer server
//! gone, A's storage probes unhealthy and its locations leave B's answers.
//! B's `Load` of A's blocks reads them from A's peer server into B's G2,
//! byte-exact; with A's peer server gone it answers misses. A location
//! whose block A no longer holds (A's own answer) is dropped from the
//! service by B's `Load`, and B's next `Lookup` does not answer it.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{keys, on_runtime, service_on, store};
use kvtier_backend::{
    BackendOptions, ClusterLookupConfig, ClusterNode, LocationKey, MetaClusterLookup, NodeView,
    NodeViewConfig, NodeViewSink, PeerIdentity, attach_backend,
};
use kvtier_client::{AsyncClient, BlockHash};
use kvtier_core::{Tier, TierKind};
use kvtier_meta::{
    BlockKey, DEFAULT_GROUP, Instance, LocationSpecInfo, MemoryIndex, MetaIndex, MetaService,
};
use kvtier_node::NodeConfig as Config;
use kvtier_node::test_support::{namespace, small_config};
use kvtier_node::{
    ClusterLookup, CommittedKey, Node, NodeHost, NodePeer, NodeServer, PeerOptions, PeerReader,
    PeerSectionConfig, SessionNamespace,
};
use kvtier_protocol::{
    Hello, KeysRequest, Message, Namespace, ProtocolVersion, TierInfo, WireGeometry, read_frame,
    write_frame,
};

const SECRET: [u8; 32] = [7; 32];

/// The cluster secret as a file `PeerOptions` accepts (mode 0600).
fn secret_file(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("cluster.secret");
    std::fs::write(&path, SECRET).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// A node of the cluster: its server, peer server, view and cluster
/// lookup.
struct Member {
    config: Config,
    node: Arc<Node>,
    server: NodeServer,
    peer: NodePeer,
    identity: PeerIdentity,
    view: NodeView,
    lookup: Arc<MetaClusterLookup>,
}

impl Member {
    async fn start(name: &'static str, dir: &Path, svc: &Arc<MetaService>) -> Self {
        let mut config = small_config(dir, 8);
        config.manager.step_interval_ms = 3_600_000;
        let sink = NodeViewSink::new();
        let node = Node::open(&config, vec![Arc::new(sink.clone())])
            .await
            .unwrap();
        let section = PeerSectionConfig {
            listen: "127.0.0.1:0".into(),
            cluster: "test".into(),
            secret_file: secret_file(dir),
            node_name: name.into(),
            // Long: a loaded machine must not turn a hit into a miss.
            load_timeout_ms: 30_000,
            ..PeerSectionConfig::default()
        };
        let options = PeerOptions::from_config(&section).unwrap().unwrap();
        assert_eq!(options.advertise, None, "port 0 is no address to publish");
        let identity = options.server.identity.clone();
        let key = options.location_key.clone();
        assert!(node.set_peer_reader(Arc::new(PeerReader::from_options(&options))));
        assert_eq!(key, LocationKey::from_secret(&SECRET));
        let peer = NodePeer::start(&NodeHost::of(node.clone()), options)
            .await
            .unwrap();
        let view_config = NodeViewConfig {
            cluster: Some(ClusterNode {
                node: name.into(),
                addr: peer.local_addr(),
                key: key.clone(),
            }),
            ..NodeViewConfig::new(name)
        };
        let view = NodeView::start(&sink, node.clone(), svc.clone(), view_config)
            .await
            .unwrap();
        let lookup = Arc::new(MetaClusterLookup::new(
            svc.clone(),
            key,
            ClusterLookupConfig::new(name),
        ));
        assert!(node.set_cluster_lookup(lookup.clone()));
        let server = NodeServer::bind(node.clone(), &config.node_socket())
            .await
            .unwrap();
        Self {
            config,
            node,
            server,
            peer,
            identity,
            view,
            lookup,
        }
    }

    async fn client(&self, ns: Namespace, instance: Option<&str>) -> AsyncClient {
        common::client(&self.node, &self.config, ns, instance).await
    }

    async fn stop(self) {
        self.view.stop().await;
        self.peer.shutdown().await;
        self.server.shutdown().await;
        self.node.close().await.unwrap();
    }
}

/// Nodes A and B of one cluster over one metadata service.
struct Pair {
    svc: Arc<MetaService>,
    a: Member,
    b: Member,
    /// Bytes per block.
    len: usize,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

impl Pair {
    async fn start(index: Arc<dyn MetaIndex>) -> Self {
        let svc = service_on(index);
        let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let a = Member::start("node-a", dirs.0.path(), &svc).await;
        let b = Member::start("node-b", dirs.1.path(), &svc).await;
        let len = a.node.geometry().block_bytes() as usize;
        Self {
            svc,
            a,
            b,
            len,
            _dirs: dirs,
        }
    }

    /// Stores `keys` through A's socket for `ns` and publishes them; the
    /// client that stored them.
    async fn stored_on_a(
        &self,
        ns: Namespace,
        instance: Option<&str>,
        keys: &[BlockHash],
    ) -> AsyncClient {
        let mut on_a = self.a.client(ns, instance).await;
        store(&mut on_a, keys, self.len).await;
        self.a.view.sync().await;
        on_a
    }

    /// Stores `stored` on A and the first of them on B; A's client and
    /// B's, whose `Lookup` answered B's own block, then A's as the peer
    /// tier.
    async fn first_on_b(&self, ns: &Namespace, stored: &[BlockHash]) -> (AsyncClient, AsyncClient) {
        let on_a = self.stored_on_a(ns.clone(), None, stored).await;
        let mut on_b = self.b.client(ns.clone(), None).await;
        store(&mut on_b, &stored[..1], self.len).await;
        let peer = peer_tier(&on_b);
        let mut want = vec![peer; stored.len()];
        want[0] = Tier::G2;
        assert_eq!(on_b.lookup(stored).await.unwrap(), want);
        (on_a, on_b)
    }

    async fn stop(self) {
        self.b.stop().await;
        self.a.stop().await;
    }
}

/// The peer tier a client of `m` is told of: after the node's own tiers.
fn peer_tier(client: &AsyncClient) -> Tier {
    let tiers = client.tiers();
    let last = tiers.last().expect("tiers");
    assert_eq!(last.kind, TierKind::Peer, "{tiers:?}");
    assert!(tiers[..tiers.len() - 1].iter().all(|t| t.tier < last.tier));
    last.tier
}

/// What a client speaking protocol 4.0 is told by `m`: the tiers of its
/// `HelloOk`, and the tiers `LookupOk` answers for `keys`.
async fn old_client(m: &Member, ns: Namespace, keys: Vec<BlockHash>) -> (Vec<TierInfo>, Vec<Tier>) {
    let socket = m.config.node_socket();
    let geometry = WireGeometry::from(m.node.geometry());
    let talk = move || {
        let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
        let hello = Message::Hello(Hello {
            protocol_version: ProtocolVersion { major: 4, minor: 0 },
            namespace: ns,
            geometry,
            instance: None,
        });
        write_frame(&mut s, &hello).unwrap();
        let Some(Message::HelloOk(ok)) = read_frame(&mut s).unwrap() else {
            panic!("no HelloOk");
        };
        let lookup = Message::Lookup(KeysRequest {
            request_id: 1,
            keys,
        });
        write_frame(&mut s, &lookup).unwrap();
        let Some(Message::LookupOk(found)) = read_frame(&mut s).unwrap() else {
            panic!("no LookupOk");
        };
        (ok.tiers, found.tiers)
    };
    tokio::task::spawn_blocking(talk).await.unwrap()
}

/// What `m`'s cluster lookup answers for `keys` of a session of `ns`.
async fn located(
    m: &Member,
    lookup: &MetaClusterLookup,
    ns: &Namespace,
    instance: Option<&str>,
    keys: &[BlockHash],
) -> Vec<kvtier_node::PeerLocation> {
    let map = m.node.key_map(ns);
    let asked: Vec<CommittedKey> = keys
        .iter()
        .map(|&client| CommittedKey {
            client,
            stored: map.stored(client),
            sum: 0,
        })
        .collect();
    let sns = SessionNamespace {
        namespace: ns.clone(),
        instance: instance.map(str::to_owned),
    };
    (lookup.lookup(&sns, &asked).await.into_iter())
        .map(|l| match l {
            kvtier_node::ClusterBlock::Peer(p) => p,
            other => panic!("no shared G4 here: {other:?}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_stored_on_one_node_is_found_by_another() {
    let p = Pair::start(Arc::new(MemoryIndex::new())).await;
    let (a, b) = (&p.a, &p.b);
    let ns = namespace("llama");
    let stored = keys(0..4);
    let on_a = p.stored_on_a(ns.clone(), None, &stored).await;

    // B holds the first block itself; the other three are A's.
    let mut on_b = b.client(ns.clone(), None).await;
    store(&mut on_b, &stored[..1], p.len).await;
    let peer = peer_tier(&on_b);
    let mut asked = stored.clone();
    asked.push(keys(9..10)[0]);
    let tiers = on_b.lookup(&asked).await.unwrap();
    assert_eq!(
        tiers,
        [Tier::G2, peer, peer, peer],
        "held, A's, then nothing"
    );
    let stats = b.node.stats();
    assert_eq!((stats.cluster_lookups, stats.cluster_hits), (1, 3));
    // B publishes its own copy into the instance A registered.
    b.view.sync().await;
    assert_eq!(b.view.stats().failures, 0, "{:?}", b.view.stats());

    // Each location names A, its peer address, A's stored key and the
    // block's sum as A holds it.
    let found = located(b, &b.lookup, &ns, None, &stored).await;
    assert_eq!(found.len(), 4);
    let map_a = a.node.key_map(&ns);
    for (k, loc) in stored.iter().zip(&found) {
        assert_eq!(
            (loc.node.as_str(), loc.addr),
            ("node-a", a.peer.local_addr())
        );
        assert_eq!(loc.stored, map_a.stored(*k));
        let held = a.node.memory().get_ref(loc.stored).expect("in A's arena");
        assert_eq!(loc.sum, held.shared_sums().block);
    }

    // A 4.0 client (before the peer kind) is not told of the peer tier,
    // and its lookups answer B's own prefix only.
    let (tiers, found) = old_client(b, ns.clone(), asked.clone()).await;
    assert!(tiers.iter().all(|t| t.kind != TierKind::Peer), "{tiers:?}");
    assert_eq!(found, [Tier::G2]);

    // A's own lookup does not answer its own locations (it holds them).
    assert!(located(a, &a.lookup, &ns, None, &stored).await.is_empty());

    // Another cluster's key: A's locations do not check out.
    let foreign = MetaClusterLookup::new(
        p.svc.clone(),
        LocationKey::from_secret(&[8; 32]),
        ClusterLookupConfig::new("node-b"),
    );
    assert!(located(b, &foreign, &ns, None, &stored).await.is_empty());
    assert!(foreign.stats().rejected > 0);

    drop((on_a, on_b));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_namespace_in_a_shared_instance_finds_nothing() {
    let p = Pair::start(Arc::new(MemoryIndex::new())).await;
    p.svc
        .register_instance(Instance {
            id: "shared".into(),
            group: DEFAULT_GROUP.into(),
            model: "llama".into(),
            block_size: 16,
            location_specs: vec![LocationSpecInfo {
                name: "tp0".into(),
                size: p.len as u64,
            }],
            spec_groups: vec![],
        })
        .await
        .unwrap();
    // Tenant 1 stores on A into the instance both name.
    let tenant = |salt: &str| Namespace {
        tenant_salt: Some(salt.into()),
        ..namespace("llama")
    };
    let stored = keys(0..3);
    let on_a = p.stored_on_a(tenant("one"), Some("shared"), &stored).await;

    // Tenant 1 on B finds them; tenant 2, naming the same instance and
    // keys, finds nothing: the locations are not made for its namespace.
    let mut one = p.b.client(tenant("one"), Some("shared")).await;
    let peer = peer_tier(&one);
    assert_eq!(one.lookup(&stored).await.unwrap(), [peer; 3]);
    let mut two = p.b.client(tenant("two"), Some("shared")).await;
    assert_eq!(two.lookup(&stored).await.unwrap(), []);
    assert!(p.b.lookup.stats().rejected > 0);

    drop((on_a, one, two));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_metadata_service_lookups_answer_local_blocks() {
    let mut redis = kvtier_meta::test_support::RedisServer::start()
        .unwrap_or_else(|e| panic!("cannot start redis-server: {e}"));
    let index = kvtier_meta::RedisIndex::open(&redis.url(), Default::default()).unwrap();
    let p = Pair::start(Arc::new(index)).await;
    let ns = namespace("llama");
    let stored = keys(0..4);
    let (on_a, mut on_b) = p.first_on_b(&ns, &stored).await;

    // The service's index is gone: B answers what it holds, no error,
    // and counts the failure (keys the service has not cached: it may
    // answer those it has from its own cache).
    redis.kill();
    let more = keys(20..23);
    store(&mut on_b, &more[..1], p.len).await;
    assert_eq!(on_b.lookup(&more).await.unwrap(), [Tier::G2]);
    assert_eq!(on_b.lookup(&more).await.unwrap(), [Tier::G2]);
    let s = p.b.lookup.stats();
    assert!(s.errors + s.timeouts >= 2, "{s:?}");

    drop((on_a, on_b));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_peer_server_is_gone_leaves_the_answers() {
    let p = Pair::start(Arc::new(MemoryIndex::new())).await;
    let ns = namespace("llama");
    let stored = keys(0..3);
    let on_a = p.stored_on_a(ns.clone(), None, &stored).await;

    // The service (B's, here) probes A's storage through A's peer server,
    // whose address A's view wrote into the storage's spec.
    let storage = p
        .svc
        .list_storages()
        .into_iter()
        .find(|s| s.name == "node-node-a")
        .expect("A's storage");
    let addr = p.a.peer.local_addr();
    assert_eq!(kvtier_backend::spec_peer(storage.spec.as_ref()), Some(addr));
    let options = BackendOptions {
        peer_identity: Some(p.b.identity.clone()),
        ..BackendOptions::default()
    };
    attach_backend(&p.svc, &storage, &options).unwrap();
    let probe = std::time::Duration::from_secs(5);
    assert!(!p.svc.check_backends(probe).await.contains(&storage.name));
    let mut on_b = p.b.client(ns.clone(), None).await;
    let peer = peer_tier(&on_b);
    assert_eq!(on_b.lookup(&stored).await.unwrap(), [peer; 3]);

    // A's peer server stops: the next probe finds A unhealthy, and B's
    // lookups no longer answer A's blocks.
    // (Taken apart: A's peer server stops while A runs on.)
    let Pair {
        svc, a, b, _dirs, ..
    } = p;
    a.peer.shutdown().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    assert!(svc.check_backends(probe).await.contains(&storage.name));
    b.lookup.clear_cache();
    assert_eq!(on_b.lookup(&stored).await.unwrap(), []);

    drop((on_a, on_b));
    b.stop().await;
    a.view.stop().await;
    a.server.shutdown().await;
    a.node.close().await.unwrap();
}

/// Loads `keys` through `client`, reads every block (all must be pinned),
/// verified against the `LoadOk` sums, and checks each holds its key's
/// bytes (as `store` wrote them); the load, to release.
async fn check_loaded(
    client: &mut AsyncClient,
    keys: &[BlockHash],
    len: usize,
) -> kvtier_client::Load {
    let load = client.load(keys).await.unwrap();
    assert_eq!(load.prefix_len(), keys.len(), "{:?}", load.results());
    let last = client.arena().layers() as u32 - 1;
    client.wait_layer(&load, last).await.unwrap();
    let mut buf = vec![0u8; len];
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(load.read(i, &mut buf).unwrap(), kvtier_core::Lookup::Hit);
        assert!(buf.iter().all(|&b| b == k.0 as u8), "block {i} differs");
    }
    load
}

/// Waits for `load`'s last layer (a `Load` of located blocks streams
/// them: its slots come at once, a block that fails is left out of the
/// later `LayerReady`s) and reads its blocks in order: how many leading
/// ones are hits; every later one reads as a miss.
async fn settled(client: &mut AsyncClient, load: &kvtier_client::Load, len: usize) -> usize {
    let last = client.arena().layers() as u32 - 1;
    client.wait_layer(load, last).await.unwrap();
    let mut buf = vec![0u8; len];
    let hit = |i| load.read(i, &mut buf).unwrap();
    let lookups: Vec<kvtier_core::Lookup> = (0..load.len()).map(hit).collect();
    let hits = lookups
        .iter()
        .take_while(|l| **l == kvtier_core::Lookup::Hit)
        .count();
    assert!(
        lookups[hits..]
            .iter()
            .all(|l| *l == kvtier_core::Lookup::Miss),
        "{lookups:?}"
    );
    hits
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_found_on_another_node_is_loaded_from_it() {
    let p = Pair::start(Arc::new(MemoryIndex::new())).await;
    let ns = namespace("llama");
    let stored = keys(0..4);
    // B holds the first block; its Load brings A's three after it.
    let (on_a, mut on_b) = p.first_on_b(&ns, &stored).await;
    let load = check_loaded(&mut on_b, &stored, p.len).await;
    let s = p.b.node.stats();
    assert_eq!((s.peer_loads, s.peer_hits, s.peer_misses), (1, 3, 0));
    assert_eq!(s.peer_bytes, 3 * p.len as u64);
    // Streamed: each of the three found once per group of layers.
    let reader = p.b.node.peer_reader().unwrap();
    let groups = u64::from(reader.layer_groups().min(p.b.node.geometry().layers));
    let pool = reader.pool().stats();
    assert_eq!(pool.len(), 1);
    assert_eq!(
        (pool[0].0.node.as_str(), pool[0].1.found),
        ("node-a", 3 * groups)
    );
    let metrics = p.b.node.metrics_text();
    let found = format!(
        "kvtier_peer_reader_found_total{{peer=\"node-a\"}} {}\n",
        3 * groups
    );
    assert!(metrics.contains(&found), "{metrics}");
    assert!(
        metrics.contains("kvtier_node_peer_hits_total 3\n"),
        "{metrics}"
    );
    on_b.release_load(load).await.unwrap();
    // B publishes the copies it brought, as blocks committed on it.
    p.b.view.sync().await;
    let v = p.b.view.stats();
    assert_eq!((v.published, v.failures), (4, 0), "{v:?}");

    // B holds them now: its own tier answers, and a second client's Load
    // reads them from B alone.
    assert_eq!(on_b.lookup(&stored).await.unwrap(), [Tier::G2; 4]);
    let mut again = p.b.client(ns.clone(), None).await;
    let load = check_loaded(&mut again, &stored, p.len).await;
    assert_eq!(p.b.node.stats().peer_loads, 1);

    drop((on_a, on_b, again, load));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_from_a_peer_that_is_gone_misses() {
    let p = Pair::start(Arc::new(MemoryIndex::new())).await;
    let ns = namespace("llama");
    let stored = keys(0..3);
    let on_a = p.stored_on_a(ns.clone(), None, &stored).await;
    let mut on_b = p.b.client(ns.clone(), None).await;
    let peer = peer_tier(&on_b);
    assert_eq!(on_b.lookup(&stored).await.unwrap(), [peer; 3]);

    // A's peer server stops between B's Lookup and its Load.
    let Pair { a, b, _dirs, .. } = p;
    a.peer.shutdown().await;
    let load = on_b.load(&stored).await.unwrap();
    let len = b.node.geometry().block_bytes() as usize;
    assert_eq!(settled(&mut on_b, &load, len).await, 0);
    // A round trip: the session finished the Load.
    on_b.release_load(load).await.unwrap();
    let s = b.node.stats();
    assert_eq!((s.peer_loads, s.peer_hits, s.peer_misses), (1, 0, 3));
    assert_eq!(s.load_misses, 3);
    // Nothing of it stayed: no block, no reservation.
    assert_eq!(b.node.usage().0, 0);
    let pool = b.node.peer_reader().unwrap().pool().stats();
    assert_eq!(pool[0].1.failures, 1, "{:?}", pool[0].1);
    // A dead peer is its health, not its locations' word: none reported.
    assert_eq!(b.lookup.stats().reported, 0);
    // The session goes on.
    store(
        &mut on_b,
        &stored[..1],
        b.node.geometry().block_bytes() as usize,
    )
    .await;
    assert_eq!(on_b.lookup(&stored[..1]).await.unwrap(), [Tier::G2]);

    drop((on_a, on_b));
    b.stop().await;
    a.view.stop().await;
    a.server.shutdown().await;
    a.node.close().await.unwrap();
}

/// Which of `keys` `index` lists a location of on `storage`, in
/// instance `instance`.
fn listed_on(
    index: &dyn MetaIndex,
    instance: &str,
    storage: &str,
    keys: &[BlockHash],
) -> Vec<bool> {
    let asked: Vec<BlockKey> = keys.iter().map(|k| BlockKey(k.0 as u64)).collect();
    (index.get(instance, &asked).unwrap().into_iter())
        .map(|m| m.is_some_and(|m| m.locations.iter().any(|l| l.storage == storage)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_location_whose_block_is_gone_is_dropped_by_the_load() {
    let redis = kvtier_meta::test_support::RedisServer::start()
        .unwrap_or_else(|e| panic!("cannot start redis-server: {e}"));
    let index = kvtier_meta::RedisIndex::open(&redis.url(), Default::default()).unwrap();
    let index: Arc<dyn MetaIndex> = Arc::new(index);
    let p = Pair::start(index.clone()).await;
    let ns = namespace("llama");
    let stored = keys(0..3);
    let mut on_a = p.stored_on_a(ns.clone(), Some("mine"), &stored).await;
    let storage = "node-node-a";
    assert_eq!(
        listed_on(index.as_ref(), "mine", storage, &stored),
        [true; 3]
    );

    // A drops its last two blocks with its view stopped: their locations
    // stay listed, stale.
    p.a.view.stop().await;
    on_a.remove(&stored[1..]).await.unwrap();
    assert_eq!(
        listed_on(index.as_ref(), "mine", storage, &stored),
        [true; 3]
    );

    // B's Lookup answers all three from A; its Load brings the first, and
    // A's answer that it lacks the others drops exactly those locations.
    let mut on_b = p.b.client(ns.clone(), Some("mine")).await;
    let peer = peer_tier(&on_b);
    assert_eq!(on_b.lookup(&stored).await.unwrap(), [peer; 3]);
    let load = on_b.load(&stored).await.unwrap();
    assert_eq!(settled(&mut on_b, &load, p.len).await, 1);
    let s = p.b.node.stats();
    assert_eq!((s.peer_hits, s.peer_misses), (1, 2));
    assert_eq!(p.b.lookup.stats().reported, 2);
    let metrics = p.b.lookup.metrics_text();
    assert!(
        metrics.contains("kvtier_node_cluster_lookup_reported_total 2\n"),
        "{metrics}"
    );
    assert_eq!(
        listed_on(index.as_ref(), "mine", storage, &stored),
        [true, false, false]
    );

    // The next Lookup (the cache forgot them too) answers B's copy of the
    // first block and nothing of the others.
    assert_eq!(on_b.lookup(&stored).await.unwrap(), [Tier::G2]);
    let mut again = p.b.client(ns.clone(), Some("mine")).await;
    assert_eq!(again.lookup(&stored).await.unwrap(), [Tier::G2]);

    on_b.release_load(load).await.unwrap();
    drop((on_a, on_b, again));
    p.stop().await;
    drop(redis);
}

#[test]
fn a_restart_on_another_port_republishes_adopted_blocks_at_the_new_address() {
    let index: Arc<dyn MetaIndex> = Arc::new(MemoryIndex::new());
    let svc = service_on(index.clone());
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let ns = namespace("llama");
    let stored = keys(0..3);
    let storage = "node-node-a";
    let old = on_runtime(async {
        let a = Member::start("node-a", dirs.0.path(), &svc).await;
        let len = a.node.geometry().block_bytes() as usize;
        let mut c = a.client(ns.clone(), Some("mine")).await;
        store(&mut c, &stored, len).await;
        a.view.sync().await;
        drop(c);
        let old = a.peer.local_addr();
        a.stop().await;
        old
    });
    assert_eq!(
        listed_on(index.as_ref(), "mine", storage, &stored),
        [true; 3]
    );
    on_runtime(async {
        // A comes back on another port and adopts its blocks (a clean stop
        // moved them to its disk log): their locations name the old
        // address and a MAC A cannot make anew, so they are unpublished.
        let a = Member::start("node-a", dirs.0.path(), &svc).await;
        assert_ne!(a.peer.local_addr(), old);
        a.view.sync().await;
        assert_eq!(a.view.stats().unpublished, 3, "{:?}", a.view.stats());
        assert_eq!(
            listed_on(index.as_ref(), "mine", storage, &stored),
            [false; 3]
        );
        let map = a.node.key_map(&ns);
        assert!(stored.iter().all(|&k| a.node.contains(map.stored(k))));

        // B is never sent to the old address: it finds nothing.
        let b = Member::start("node-b", dirs.1.path(), &svc).await;
        let mut on_b = b.client(ns.clone(), Some("mine")).await;
        assert_eq!(on_b.lookup(&stored).await.unwrap(), []);

        // A session of their namespace commits another block: A finds the
        // namespace its adopted blocks were stored in (its key map makes
        // their stored keys), signs them for the new address and
        // publishes them again; B loads them all from there.
        let len = a.node.geometry().block_bytes() as usize;
        let mut c = a.client(ns.clone(), Some("mine")).await;
        store(&mut c, &keys(9..10), len).await;
        a.view.sync().await;
        assert_eq!(
            listed_on(index.as_ref(), "mine", storage, &stored),
            [true; 3]
        );
        b.lookup.clear_cache();
        let found = located(&b, &b.lookup, &ns, Some("mine"), &stored).await;
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found.iter().all(|l| l.addr == a.peer.local_addr()));
        let peer = peer_tier(&on_b);
        assert_eq!(on_b.lookup(&stored).await.unwrap(), [peer; 3]);
        let load = check_loaded(&mut on_b, &stored, len).await;
        assert_eq!(b.node.stats().peer_hits, 3);

        on_b.release_load(load).await.unwrap();
        drop((c, on_b));
        b.stop().await;
        a.stop().await;
    });
}
