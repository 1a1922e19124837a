//! The node's own blocks in the metadata service: a real node and server,
//! real clients storing through the socket, a real metadata service. What
//! the service lists on the node's storage is exactly what the node holds,
//! through commits, evictions, removals on either side and restarts.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{keys, on_runtime, service_on, store};
use kvtier_backend::{NodeStoreBackend, NodeView, NodeViewConfig, NodeViewSink, PublishedBlock};
use kvtier_client::{AsyncClient, BlockHash};
use kvtier_meta::{
    BlockKey, DEFAULT_GROUP, Instance, LocationQuery, LocationSpecInfo, MemoryIndex, MetaService,
    StorageBackend,
};
use kvtier_node::NodeConfig as Config;
use kvtier_node::test_support::{namespace, small_config};
use kvtier_node::{Node, NodeServer};
use kvtier_protocol::{KeyMap, Namespace};

const NODE: &str = "node-1";
const STORAGE: &str = "node-node-1";

fn service() -> Arc<MetaService> {
    service_on(Arc::new(MemoryIndex::new()))
}

/// A node with its server and view, over `svc`.
struct Running {
    node: Arc<Node>,
    server: NodeServer,
    view: NodeView,
}

impl Running {
    async fn start(config: &Config, svc: &Arc<MetaService>) -> Self {
        // An arena of its own: the last run's may still be mapped by
        // tasks that have not yet let go of it.
        static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let mut config = config.clone();
        let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        config.memory.shm_name = format!("{}-{n}", config.memory.shm_name);
        let config = &config;
        let sink = NodeViewSink::new();
        let node = Node::open(config, vec![Arc::new(sink.clone())])
            .await
            .unwrap();
        let view = NodeView::start(&sink, node.clone(), svc.clone(), NodeViewConfig::new(NODE))
            .await
            .unwrap();
        let server = NodeServer::bind(node.clone(), &config.node_socket())
            .await
            .unwrap();
        Self { node, server, view }
    }

    async fn client(&self, config: &Config, ns: Namespace, instance: Option<&str>) -> AsyncClient {
        common::client(&self.node, config, ns, instance).await
    }

    async fn stop(self) {
        self.view.stop().await;
        self.server.shutdown().await;
        self.node.close().await.unwrap();
    }
}

/// Which of `keys` the service lists on the node's storage for
/// `instance`, each checked against the URI it gives.
async fn listed(svc: &MetaService, instance: &str, map: KeyMap, keys: &[BlockHash]) -> Vec<bool> {
    let meta_keys: Vec<BlockKey> = keys.iter().map(|k| BlockKey(k.0 as u64)).collect();
    let found = svc
        .get_cache_location(
            instance,
            &LocationQuery {
                mode: kvtier_meta::MatchMode::Keys,
                ..LocationQuery::prefix(meta_keys)
            },
        )
        .await
        .unwrap();
    keys.iter()
        .zip(found.locations)
        .map(|(k, loc)| {
            let Some(loc) = loc else { return false };
            assert_eq!(loc.storage, STORAGE);
            assert_eq!(loc.specs.len(), 1);
            let b = PublishedBlock::parse(NODE, &loc.specs[0].uri).expect("a published URI");
            assert_eq!(b.stored(), map.stored(*k), "the URI names the block");
            assert_eq!(b.client_key, k.0);
            true
        })
        .collect()
}

/// The service lists a key exactly when the node holds it.
async fn assert_mirrors(
    run: &Running,
    svc: &MetaService,
    instance: &str,
    ns: &Namespace,
    keys: &[BlockHash],
) {
    run.view.sync().await;
    let map = run.node.key_map(ns);
    let listed = listed(svc, instance, map, keys).await;
    for (k, l) in keys.iter().zip(listed) {
        assert_eq!(l, run.node.contains(map.stored(*k)), "key {k}");
    }
}

/// A small node whose background step never runs within a test: room is
/// made on demand by stores only, so what the node holds changes only
/// while the test stores, never between a sync and its check.
fn config(dir: &Path) -> Config {
    let mut c = small_config(dir, 8);
    c.manager.step_interval_ms = 3_600_000;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_blocks_are_listed_while_the_node_holds_them() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let svc = service();
    let run = Running::start(&config, &svc).await;
    let len = run.node.geometry().block_bytes() as usize;

    // A client that names no instance publishes to the derived one.
    let ns = namespace("llama");
    let derived = kvtier_backend::node_view::derived_instance(&ns);
    let mut a = run.client(&config, ns.clone(), None).await;
    let first = keys(0..3);
    store(&mut a, &first, len).await;
    run.view.sync().await;
    assert_eq!(
        listed(&svc, &derived, run.node.key_map(&ns), &first).await,
        [true; 3]
    );
    let inst = svc.get_instance_info(&derived).await.unwrap();
    // In the node's own group, which no reclaimer pressure reaches.
    assert_eq!(inst.group, "node-node-1");
    assert_eq!(
        (inst.model.as_str(), inst.location_specs.len()),
        ("llama", 1)
    );

    // One that names an instance publishes there, under its rank's spec.
    svc.register_instance(Instance {
        id: "llama-prod".into(),
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
    let ns_b = namespace("llama-b");
    let mut b = run.client(&config, ns_b.clone(), Some("llama-prod")).await;
    let second = keys(10..12);
    store(&mut b, &second, len).await;
    assert_mirrors(&run, &svc, "llama-prod", &ns_b, &second).await;
    assert_eq!(
        listed(&svc, "llama-prod", run.node.key_map(&ns_b), &second).await,
        [true; 2]
    );

    // A removal through the node unpublishes.
    a.remove(&first[..1]).await.unwrap();
    assert_mirrors(&run, &svc, &derived, &ns, &first).await;
    assert_eq!(
        listed(&svc, &derived, run.node.key_map(&ns), &first).await,
        [false, true, true]
    );

    // A removal through the service deletes from the node, through the
    // node store backend of the same storage.
    let backend = Arc::new(NodeStoreBackend::local(NODE, run.node.clone()));
    svc.attach_backend(STORAGE, backend as Arc<dyn StorageBackend>)
        .unwrap();
    svc.remove_cache(&derived, &[BlockKey(first[1].0 as u64)])
        .await
        .unwrap();
    svc.wait_released().await;
    assert!(!run.node.contains(run.node.key_map(&ns).stored(first[1])));
    assert_mirrors(&run, &svc, &derived, &ns, &first).await;
    assert_eq!(
        listed(&svc, &derived, run.node.key_map(&ns), &first).await,
        [false, false, true]
    );

    // Blocks the node evicts out of every tier are unpublished: far more
    // than the arena and the disk log hold.
    let many = keys(100..700);
    // Batches smaller than the arena, so each finds room.
    for chunk in many.chunks(4) {
        store(&mut a, chunk, len).await;
    }
    assert_mirrors(&run, &svc, &derived, &ns, &many).await;
    let held = listed(&svc, &derived, run.node.key_map(&ns), &many).await;
    assert!(
        held.iter().any(|h| *h) && held.iter().any(|h| !*h),
        "some evicted, some held"
    );
    assert!(run.view.stats().unpublished > 0);
    assert_eq!(run.view.stats().failures, 0);
    run.stop().await;
}

#[test]
fn a_restart_keeps_what_the_node_adopts_and_drops_what_it_lost() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let svc = service();
    let ns = namespace("llama");
    let derived = kvtier_backend::node_view::derived_instance(&ns);
    let stored = keys(0..6);
    on_runtime(async {
        let run = Running::start(&config, &svc).await;
        let len = run.node.geometry().block_bytes() as usize;
        let mut c = run.client(&config, ns.clone(), None).await;
        store(&mut c, &stored, len).await;
        run.view.sync().await;
        drop(c);
        run.stop().await;
    });
    // A clean stop moves G2 to the disk log: the restart adopts it all.
    on_runtime(async {
        let run = Running::start(&config, &svc).await;
        assert_mirrors(&run, &svc, &derived, &ns, &stored).await;
        assert_eq!(
            listed(&svc, &derived, run.node.key_map(&ns), &stored).await,
            [true; 6]
        );
        run.stop().await;
    });
    // A node that comes back without its disk log holds none of them.
    std::fs::remove_dir_all(dir.path().join("disk")).unwrap();
    on_runtime(async {
        let run = Running::start(&config, &svc).await;
        assert_mirrors(&run, &svc, &derived, &ns, &stored).await;
        assert_eq!(
            listed(&svc, &derived, run.node.key_map(&ns), &stored).await,
            [false; 6]
        );
        assert_eq!(run.view.stats().unpublished, 6);
        run.stop().await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_of_another_node_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let svc = service();
    svc.add_storage(kvtier_meta::Storage {
        name: STORAGE.into(),
        kind: kvtier_meta::StorageKind::KvtierNode,
        uri: "kvtier://node-2".into(),
        enabled: true,
        health: kvtier_meta::StorageHealth::Healthy,
        spec: None,
    })
    .unwrap();
    let sink = NodeViewSink::new();
    let node = Node::open(&config, vec![Arc::new(sink.clone())])
        .await
        .unwrap();
    let err = NodeView::start(&sink, node.clone(), svc, NodeViewConfig::new(NODE))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("kvtier://node-2"), "{err}");
    node.close().await.unwrap();
}
