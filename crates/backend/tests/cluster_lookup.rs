//! Cluster lookups: two real nodes, each with its server, node view and
//! cluster lookup, over one metadata service. A block stored through node
//! A's socket is found by node B's `Lookup` (the peer tier) with A's
//! authenticated location; locations of another namespace, another
//! cluster's key or B itself are not answered; with the metadata service
//! gone, B answers from its own tiers, without an error; A's peer server
//! gone, A's storage probes unhealthy and its locations leave B's answers.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use kvtier_backend::{
    BackendOptions, ClusterLookupConfig, ClusterNode, LocationKey, MetaClusterLookup, NodeView,
    NodeViewConfig, NodeViewSink, PeerIdentity, attach_backend,
};
use kvtier_client::{AsyncClient, BlockHash, ClientConfig};
use kvtier_core::{Tier, TierKind};
use kvtier_meta::{
    DEFAULT_GROUP, EvictionPolicy, Instance, InstanceGroup, LocationSpecInfo, MemoryIndex,
    MetaConfig, MetaIndex, MetaService,
};
use kvtier_node::NodeConfig as Config;
use kvtier_node::test_support::{namespace, small_config};
use kvtier_node::{
    ClusterLookup, CommittedKey, Node, NodeHost, NodePeer, NodeServer, PeerOptions,
    PeerSectionConfig, SessionNamespace,
};
use kvtier_protocol::{Namespace, WireGeometry};

const SECRET: [u8; 32] = [7; 32];

/// The cluster secret as a file `PeerOptions` accepts (mode 0600).
fn secret_file(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("cluster.secret");
    std::fs::write(&path, SECRET).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

fn service(index: Arc<dyn MetaIndex>) -> Arc<MetaService> {
    let svc = MetaService::new(index, MetaConfig::default()).unwrap();
    svc.put_group(InstanceGroup {
        name: DEFAULT_GROUP.into(),
        quota_bytes: 1 << 40,
        kind_quota_bytes: BTreeMap::new(),
        watermark: 0.9,
        eviction: EvictionPolicy::Lru,
        storages: vec![],
        max_instances: 16,
        ..Default::default()
    })
    .unwrap();
    Arc::new(svc)
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
            ..PeerSectionConfig::default()
        };
        let options = PeerOptions::from_config(&section).unwrap().unwrap();
        assert_eq!(options.advertise, None, "port 0 is no address to publish");
        let identity = options.server.identity.clone();
        let key = options.location_key.clone();
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
        let geometry = WireGeometry::from(self.node.geometry());
        let mut c = ClientConfig::new(self.config.node_socket(), ns, geometry);
        if let Some(i) = instance {
            c = c.with_instance(i);
        }
        AsyncClient::connect(c).await.unwrap()
    }

    async fn stop(self) {
        self.view.stop().await;
        self.peer.shutdown().await;
        self.server.shutdown().await;
        self.node.close().await.unwrap();
    }
}

async fn store(client: &mut AsyncClient, keys: &[BlockHash], len: usize) {
    let bytes: Vec<Vec<u8>> = keys.iter().map(|k| vec![k.0 as u8; len]).collect();
    let blocks: Vec<(BlockHash, &[u8])> =
        keys.iter().zip(&bytes).map(|(k, b)| (*k, &b[..])).collect();
    let outcomes = client.store(&blocks).await.unwrap();
    assert!(outcomes.iter().all(|o| o.is_stored()), "{outcomes:?}");
}

fn keys(r: std::ops::Range<u128>) -> Vec<BlockHash> {
    r.map(|k| BlockHash(k | (0xabcd << 64))).collect()
}

/// The peer tier a client of `m` is told of: after the node's own tiers.
fn peer_tier(client: &AsyncClient) -> Tier {
    let tiers = client.tiers();
    let last = tiers.last().expect("tiers");
    assert_eq!(last.kind, TierKind::Peer, "{tiers:?}");
    assert!(tiers[..tiers.len() - 1].iter().all(|t| t.tier < last.tier));
    last.tier
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
    lookup.lookup(&sns, &asked).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_stored_on_one_node_is_found_by_another() {
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let svc = service(Arc::new(MemoryIndex::new()));
    let a = Member::start("node-a", da.path(), &svc).await;
    let b = Member::start("node-b", db.path(), &svc).await;
    let len = a.node.geometry().block_bytes() as usize;
    let ns = namespace("llama");

    let mut on_a = a.client(ns.clone(), None).await;
    let stored = keys(0..4);
    store(&mut on_a, &stored, len).await;
    a.view.sync().await;

    // B holds the first block itself; the other three are A's.
    let mut on_b = b.client(ns.clone(), None).await;
    store(&mut on_b, &stored[..1], len).await;
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

    // Each location names A, its peer address, A's stored key and the
    // block's sum as A holds it.
    let found = located(&b, &b.lookup, &ns, None, &stored).await;
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

    // A's own lookup does not answer its own locations (it holds them).
    assert!(located(&a, &a.lookup, &ns, None, &stored).await.is_empty());

    // Another cluster's key: A's locations do not check out.
    let foreign = MetaClusterLookup::new(
        svc.clone(),
        LocationKey::from_secret(&[8; 32]),
        ClusterLookupConfig::new("node-b"),
    );
    assert!(located(&b, &foreign, &ns, None, &stored).await.is_empty());
    assert!(foreign.stats().rejected > 0);

    drop((on_a, on_b));
    b.stop().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_namespace_in_a_shared_instance_finds_nothing() {
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let svc = service(Arc::new(MemoryIndex::new()));
    let a = Member::start("node-a", da.path(), &svc).await;
    let b = Member::start("node-b", db.path(), &svc).await;
    let len = a.node.geometry().block_bytes() as usize;
    svc.register_instance(Instance {
        id: "shared".into(),
        group: DEFAULT_GROUP.into(),
        model: "llama".into(),
        block_size: 16,
        location_specs: vec![LocationSpecInfo {
            name: "tp0".into(),
            size: len as u64,
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
    let mut on_a = a.client(tenant("one"), Some("shared")).await;
    let stored = keys(0..3);
    store(&mut on_a, &stored, len).await;
    a.view.sync().await;

    // Tenant 1 on B finds them; tenant 2, naming the same instance and
    // keys, finds nothing: the locations are not made for its namespace.
    let mut one = b.client(tenant("one"), Some("shared")).await;
    let peer = peer_tier(&one);
    assert_eq!(one.lookup(&stored).await.unwrap(), [peer; 3]);
    let mut two = b.client(tenant("two"), Some("shared")).await;
    assert_eq!(two.lookup(&stored).await.unwrap(), []);
    assert!(b.lookup.stats().rejected > 0);

    drop((on_a, one, two));
    b.stop().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_metadata_service_lookups_answer_local_blocks() {
    let mut redis = kvtier_meta::test_support::RedisServer::start()
        .unwrap_or_else(|e| panic!("cannot start redis-server: {e}"));
    let index = kvtier_meta::RedisIndex::open(&redis.url(), Default::default()).unwrap();
    let svc = service(Arc::new(index));
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Member::start("node-a", da.path(), &svc).await;
    let b = Member::start("node-b", db.path(), &svc).await;
    let len = a.node.geometry().block_bytes() as usize;
    let ns = namespace("llama");
    let mut on_a = a.client(ns.clone(), None).await;
    let stored = keys(0..4);
    store(&mut on_a, &stored, len).await;
    a.view.sync().await;
    let mut on_b = b.client(ns.clone(), None).await;
    store(&mut on_b, &stored[..1], len).await;
    let peer = peer_tier(&on_b);
    assert_eq!(
        on_b.lookup(&stored).await.unwrap(),
        [Tier::G2, peer, peer, peer]
    );

    // The service's index is gone: B answers what it holds, no error,
    // and counts the failure (keys the service has not cached: it may
    // answer those it has from its own cache).
    redis.kill();
    let more = keys(20..23);
    store(&mut on_b, &more[..1], len).await;
    assert_eq!(on_b.lookup(&more).await.unwrap(), [Tier::G2]);
    assert_eq!(on_b.lookup(&more).await.unwrap(), [Tier::G2]);
    let s = b.lookup.stats();
    assert!(s.errors + s.timeouts >= 2, "{s:?}");

    drop((on_a, on_b));
    b.stop().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_peer_server_is_gone_leaves_the_answers() {
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let svc = service(Arc::new(MemoryIndex::new()));
    let a = Member::start("node-a", da.path(), &svc).await;
    let b = Member::start("node-b", db.path(), &svc).await;
    let len = a.node.geometry().block_bytes() as usize;
    let ns = namespace("llama");
    let mut on_a = a.client(ns.clone(), None).await;
    let stored = keys(0..3);
    store(&mut on_a, &stored, len).await;
    a.view.sync().await;

    // The service (B's, here) probes A's storage through A's peer server,
    // whose address A's view wrote into the storage's spec.
    let storage = svc
        .list_storages()
        .into_iter()
        .find(|s| s.name == "node-node-a")
        .expect("A's storage");
    assert_eq!(
        kvtier_backend::spec_peer(storage.spec.as_ref()),
        Some(a.peer.local_addr())
    );
    let options = BackendOptions {
        peer_identity: Some(b.identity.clone()),
        ..BackendOptions::default()
    };
    attach_backend(&svc, &storage, &options).unwrap();
    let probe = std::time::Duration::from_secs(5);
    assert!(!svc.check_backends(probe).await.contains(&storage.name));
    let mut on_b = b.client(ns.clone(), None).await;
    let peer = peer_tier(&on_b);
    assert_eq!(on_b.lookup(&stored).await.unwrap(), [peer; 3]);

    // A's peer server stops: the next probe finds A unhealthy, and B's
    // lookups no longer answer A's blocks.
    let addr = a.peer.local_addr();
    let a = stop_peer(a).await;
    assert!(svc.check_backends(probe).await.contains(&storage.name));
    b.lookup.clear_cache();
    assert_eq!(on_b.lookup(&stored).await.unwrap(), []);
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());

    drop((on_a, on_b));
    b.stop().await;
    a.view.stop().await;
    a.server.shutdown().await;
    a.node.close().await.unwrap();
}

/// `m` with its peer server shut down.
async fn stop_peer(m: Member) -> Stopped {
    m.peer.shutdown().await;
    Stopped {
        node: m.node,
        server: m.server,
        view: m.view,
    }
}

/// A member whose peer server is gone.
struct Stopped {
    node: Arc<Node>,
    server: NodeServer,
    view: NodeView,
}
