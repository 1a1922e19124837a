//! A file pool on a full file system under the metadata service, on a real
//! tmpfs filled to the last byte: it keeps serving what it holds while
//! taking no new writes, and a finish refused while the disk is full goes
//! through once space is freed. (The embedded index on a full disk:
//! `crates/meta/tests/enospc.rs`.)

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvtier_backend::{FilePool, FilePoolOptions};
use kvtier_meta::test_support::Tmpfs;
use kvtier_meta::*;

/// Size of every test file system.
const FS_BYTES: u64 = 8 << 20;

/// How long writes may take to resume once space is freed (the index
/// retries at most every 5 s).
const RESUME_WITHIN: Duration = Duration::from_secs(30);

fn mount() -> Tmpfs {
    Tmpfs::mount(FS_BYTES).expect("a tmpfs to fill (these tests need root)")
}

fn health_of(svc: &MetaService, name: &str) -> StorageHealth {
    svc.list_storages()
        .into_iter()
        .find(|s| s.name == name)
        .map(|s| s.health)
        .expect("storage listed")
}

/// Group `g` on storage `storage` and instance `i` (one 4 KiB part).
async fn group_and_instance(svc: &MetaService, storage: &str) {
    svc.put_group(InstanceGroup {
        name: "g".into(),
        quota_bytes: 1 << 40,
        kind_quota_bytes: BTreeMap::new(),
        watermark: 0.9,
        eviction: EvictionPolicy::Lru,
        storages: vec![storage.into()],
        max_instances: 4,
        ..Default::default()
    })
    .expect("group");
    svc.register_instance(Instance {
        id: "i".into(),
        group: "g".into(),
        model: "m".into(),
        block_size: 16,
        location_specs: vec![LocationSpecInfo {
            name: "tp0".into(),
            size: 4096,
        }],
        spec_groups: vec![],
    })
    .await
    .expect("instance");
}

/// A service over a memory index with one file-pool storage `pool` in
/// `dir` (the backend attached), group `g` on it and instance `i`.
async fn pool_service(dir: &std::path::Path) -> Arc<MetaService> {
    let svc =
        MetaService::new(Arc::new(MemoryIndex::new()), MetaConfig::default()).expect("service");
    svc.put_storage(Storage {
        name: "pool".into(),
        kind: StorageKind::FilePool,
        uri: format!("file://{}", dir.display()),
        enabled: true,
        health: StorageHealth::Healthy,
        spec: None,
    })
    .expect("storage");
    group_and_instance(&svc, "pool").await;
    let opts = FilePoolOptions {
        file_size: 1 << 20,
        files: 2,
        preallocate: true,
        probe_timeout: Duration::from_secs(5),
    };
    let pool = FilePool::open(dir.to_path_buf(), &opts).expect("pool");
    svc.attach_backend("pool", Arc::new(pool)).expect("attach");
    Arc::new(svc)
}

fn keys(r: std::ops::Range<u64>) -> Vec<BlockKey> {
    r.map(BlockKey).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_pool_on_a_full_disk_serves_what_it_holds_and_takes_no_writes() {
    let fs = mount();
    let svc = pool_service(&fs.path().join("pool")).await;
    let g = svc
        .start_write_cache("i", &keys(0..2))
        .await
        .expect("grant");
    svc.finish_write_cache("i", g.session, &[true; 2])
        .await
        .expect("finish");
    let probe = Duration::from_secs(5);
    assert!(svc.check_backends(probe).await.is_empty());

    fs.fill().expect("fill the file system");
    assert!(
        svc.check_backends(probe).await.is_empty(),
        "a full pool is not a broken one"
    );
    assert_eq!(health_of(&svc, "pool"), StorageHealth::Full);
    let hit = svc
        .get_cache_location("i", &LocationQuery::prefix(keys(0..2)))
        .await
        .expect("read");
    assert_eq!(hit.matched, 2, "blocks on a full pool are served");
    assert_eq!(svc.backend_stats().unhealthy_skips, 0);
    let err = svc.start_write_cache("i", &keys(5..6)).await.unwrap_err();
    assert!(matches!(err, MetaError::NoAvailableStorage { .. }), "{err}");
    // Not mistaken for a failing storage.
    assert!(err.to_string().contains("\"pool\" is full"), "{err}");
    let report = svc.check_health().await;
    assert!(!report.healthy);
    let reason = report.reason.expect("a reason");
    assert!(reason.contains("pool full"), "{reason}");

    fs.free().expect("free the filler");
    assert!(svc.check_backends(probe).await.is_empty());
    assert_eq!(health_of(&svc, "pool"), StorageHealth::Healthy);
    assert!(svc.check_health().await.healthy);
    let g = svc
        .start_write_cache("i", &keys(5..6))
        .await
        .expect("grant");
    assert_eq!(g.blocks.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_refused_on_a_full_disk_can_be_retried_once_freed() {
    let fs = mount();
    let index = Arc::new(RedbIndex::open(fs.path().join("meta.redb"), 1 << 20).expect("open"));
    let svc = MetaService::new(index, MetaConfig::default()).expect("service");
    svc.put_storage(Storage {
        name: "s3".into(),
        kind: StorageKind::S3,
        uri: "s3://bucket/kv".into(),
        enabled: true,
        health: StorageHealth::Healthy,
        spec: None,
    })
    .expect("storage");
    group_and_instance(&svc, "s3").await;
    let open = svc
        .start_write_cache("i", &keys(0..4))
        .await
        .expect("grant");

    fs.fill().expect("fill the file system");
    let mut next = 100;
    let refused = loop {
        assert!(next < 10_100, "no write was refused on a full disk");
        match svc.start_write_cache("i", &keys(next..next + 1)).await {
            Ok(g) => {
                svc.finish_write_cache("i", g.session, &[false]).await.ok();
            }
            Err(e) => break e,
        }
        next += 1;
    };
    assert_eq!(refused.code(), "STORE_UNWRITABLE", "{refused}");
    let err = svc
        .finish_write_cache("i", open.session, &[true; 4])
        .await
        .unwrap_err();
    assert_eq!(err.code(), "STORE_UNWRITABLE", "{err}");

    // The session was kept: finishing it again works once there is room.
    fs.free().expect("free the filler");
    let deadline = Instant::now() + RESUME_WITHIN;
    let done = loop {
        match svc.finish_write_cache("i", open.session, &[true; 4]).await {
            Ok(done) => break done,
            Err(e) => {
                assert_eq!(e.code(), "STORE_UNWRITABLE", "{e}");
                assert!(Instant::now() < deadline, "finish never went through: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_eq!((done.served, done.dropped), (4, 0));
    let hit = svc
        .get_cache_location("i", &LocationQuery::prefix(keys(0..4)))
        .await
        .expect("read");
    assert_eq!(hit.matched, 4);
}
