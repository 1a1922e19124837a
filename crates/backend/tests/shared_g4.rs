//! The shared G4's writer: real nodes, a metadata service over a real
//! redis-server, and the shared G4 on a real S3 server (moto) or in a
//! shared directory (the test fails when redis-server or moto is not
//! installed). One scenario, run on each store: a block committed on
//! node A is written once per cluster, as a verified object under its
//! shared key, at the location the service's write session named; node B
//! committing the same blocks finds them present; A's removal of its own
//! copy deletes nothing; only the reclaimer, under the group's quota,
//! deletes objects; another tenant's blocks are other objects. In a
//! directory, every file is `0600` and every directory made `0700`.

#[allow(dead_code)] // not every helper is used here
mod common;

use std::sync::Arc;

use common::{keys, store};
use kvtier_backend::{BackendOptions, S3Options, SharedG4Writer, shared_block_key};
use kvtier_client::BlockHash;
use kvtier_meta::StorageKind;
use kvtier_meta::test_support::RedisServer;
use kvtier_meta::{BlockMask, LocationQuery, MatchMode, MetaConfig, MetaService, RedisIndex};
use kvtier_node::test_support::{namespace, small_config};
use kvtier_node::{Node, NodeConfig, SharedG4SectionConfig, SharedKeys};
use kvtier_peer::ClusterSecret;
use kvtier_protocol::Namespace;
use kvtier_remote::test_support::SharedStore;
use kvtier_remote::{ObjectBlocks, RemoteRead};

const BUCKET: &str = "shared";
const INSTANCE: &str = "kvtier-shared-g4";

struct Member {
    config: NodeConfig,
    node: Arc<Node>,
    server: kvtier_node::NodeServer,
    writer: SharedG4Writer,
    _dir: tempfile::TempDir,
}

impl Member {
    async fn start(svc: &Arc<MetaService>, store: &SharedStore) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = small_config(dir.path(), 16);
        config.manager.step_interval_ms = 3_600_000;
        let node = Node::open(&config, vec![]).await.unwrap();
        let keys = SharedKeys::of(&ClusterSecret::from_bytes([7; 32]));
        let writer = SharedG4Writer::start(
            node.clone(),
            svc.clone(),
            keys,
            &store.config(),
            SharedG4SectionConfig {
                url: store.url(),
                ..SharedG4SectionConfig::default()
            },
        )
        .await
        .unwrap();
        let server = kvtier_node::NodeServer::bind(node.clone(), &config.node_socket())
            .await
            .unwrap();
        Self {
            config,
            node,
            server,
            writer,
            _dir: dir,
        }
    }

    async fn stop(self) {
        self.writer.stop().await;
        self.server.shutdown().await;
        self.node.close().await.unwrap();
    }
}

/// A metadata service over `redis` that opens the storage of `store`.
fn service(redis: &RedisServer, store: &SharedStore) -> Arc<MetaService> {
    let index = RedisIndex::open(&redis.url(), Default::default()).unwrap();
    let opener = BackendOptions {
        s3: S3Options {
            endpoint: store.endpoint(),
            access_key_id: Some("testing".into()),
            secret_access_key: Some("testing".into()),
            allow_http: true,
            ..S3Options::default()
        },
        ..BackendOptions::default()
    };
    let config = MetaConfig {
        backend_opener: Some(Arc::new(opener)),
        ..MetaConfig::default()
    };
    Arc::new(MetaService::new(Arc::new(index), config).unwrap())
}

/// Block objects in the store.
async fn objects(store: &SharedStore) -> usize {
    store.objects().await.len()
}

fn salted(salt: &[u8]) -> Namespace {
    Namespace {
        tenant_salt: Some(salt.to_vec()),
        ..namespace("m")
    }
}

/// What the shared G4 holds for `keys` of `ns`, read as a node would
/// (location from the service, object verified under the shared key):
/// the bytes, or `None`.
async fn shared_blocks(
    svc: &MetaService,
    reader: &ObjectBlocks,
    ns: &Namespace,
    keys: &[BlockHash],
) -> Vec<Option<Vec<u8>>> {
    let map = SharedKeys::of(&ClusterSecret::from_bytes([7; 32])).key_map(ns);
    let shared: Vec<BlockHash> = keys.iter().map(|&k| map.stored(k)).collect();
    let query = LocationQuery {
        keys: shared.iter().map(|&s| shared_block_key(s)).collect(),
        mode: MatchMode::Keys,
        mask: BlockMask::None,
    };
    let found = svc.get_cache_location(INSTANCE, &query).await.unwrap();
    let mut out = Vec::new();
    for (s, loc) in shared.iter().zip(found.locations) {
        let Some(loc) = loc else {
            out.push(None);
            continue;
        };
        let path = reader.path_of(&loc.specs[0].uri).expect("in the store");
        out.push(match reader.get(&path, *s).await {
            RemoteRead::Hit { bytes, .. } => Some(bytes.to_vec()),
            _ => None,
        });
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_s3_blocks_are_written_once_per_cluster_and_deleted_only_by_the_reclaimer() {
    written_once_deleted_by_the_reclaimer(SharedStore::s3(BUCKET), StorageKind::S3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_a_shared_directory_blocks_are_written_once_and_deleted_only_by_the_reclaimer() {
    let store = SharedStore::dir();
    written_once_deleted_by_the_reclaimer(store, StorageKind::FileObjects).await;
}

/// The scenario on `shared`, whose storage is of `kind`.
async fn written_once_deleted_by_the_reclaimer(shared: SharedStore, kind: StorageKind) {
    let redis = RedisServer::start().expect("redis-server");
    let svc = service(&redis, &shared);
    let a = Member::start(&svc, &shared).await;
    let b = Member::start(&svc, &shared).await;
    let storage = (svc.list_storages().into_iter())
        .find(|s| s.name == "kvtier-shared-g4")
        .unwrap();
    assert_eq!(
        (storage.kind, storage.uri.as_str()),
        (kind, shared.url().as_str())
    );
    let len = a.node.geometry().block_bytes() as usize;
    let reader = ObjectBlocks::open(&shared.config(), *a.node.geometry()).unwrap();
    let ns = salted(b"t1");
    let ks = keys(0..4);
    let want: Vec<Option<Vec<u8>>> = ks.iter().map(|k| Some(vec![k.0 as u8; len])).collect();

    // A commits: each block written once, byte-exact under its shared key.
    let mut on_a = common::client(&a.node, &a.config, ns.clone(), None).await;
    store(&mut on_a, &ks, len).await;
    a.writer.sync().await;
    let s = a.writer.stats();
    assert_eq!((s.queued, s.written, s.failed), (4, 4, 0), "{s:?}");
    assert_eq!(s.bytes, 4 * len as u64);
    assert_eq!(objects(&shared).await, 4);
    assert_eq!(shared_blocks(&svc, &reader, &ns, &ks).await, want);
    let private = shared.assert_private();
    assert!(private.is_none_or(|files| files == 4), "{private:?}");

    // B commits the same blocks: present, nothing written again.
    let mut on_b = common::client(&b.node, &b.config, ns.clone(), None).await;
    store(&mut on_b, &ks, len).await;
    b.writer.sync().await;
    let s = b.writer.stats();
    assert_eq!((s.queued, s.written, s.present), (4, 0, 4), "{s:?}");
    assert_eq!(objects(&shared).await, 4);

    // A's removal of its own copies deletes no shared object.
    on_a.remove(&ks).await.unwrap();
    assert_eq!(shared_blocks(&svc, &reader, &ns, &ks).await, want);
    assert_eq!(objects(&shared).await, 4);

    // Another tenant's blocks of the same client keys are other objects,
    // and the first tenant's shared keys do not find them.
    let other = salted(b"t2");
    let mut tenant = common::client(&b.node, &b.config, other.clone(), None).await;
    let theirs = keys(10..12);
    store(&mut tenant, &theirs, len).await;
    b.writer.sync().await;
    assert_eq!(objects(&shared).await, 6);
    assert_eq!(
        shared_blocks(&svc, &reader, &ns, &theirs).await,
        vec![None, None]
    );

    // The reclaimer, under a quota of two objects, deletes what it evicts.
    let mut group = svc
        .list_groups()
        .into_iter()
        .find(|g| g.name == "kvtier-shared-g4")
        .unwrap();
    let object = (len + kvtier_remote::format::header_len(a.node.geometry().layers)) as u64;
    group.quota_bytes = 2 * object;
    group.watermark = 1.0;
    svc.update_group(group).unwrap();
    let report = svc.reclaim_once().await;
    assert!(report.errors.is_empty(), "{report:?}");
    let left = objects(&shared).await;
    assert!(left <= 2, "{left} objects left");
    let private = shared.assert_private();
    assert!(private.is_none_or(|files| files == left), "{private:?}");
    let mut served = shared_blocks(&svc, &reader, &ns, &ks).await;
    served.extend(shared_blocks(&svc, &reader, &other, &theirs).await);
    assert_eq!(served.iter().flatten().count(), left, "{served:?}");

    drop((on_a, on_b, tenant));
    a.stop().await;
    b.stop().await;
    drop(redis);
}
