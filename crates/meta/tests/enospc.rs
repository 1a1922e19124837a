//! A full disk under the metadata service, on a real tmpfs filled to the
//! last byte: the embedded index refuses writes with a typed error while
//! it cannot write, keeps serving reads, and takes writes again once space
//! is freed, without a reopen by the caller and without losing anything;
//! it opens on a full disk; and a file pool on a full file system keeps
//! serving what it holds while taking no new writes.

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

/// A serving block record for `key`, about 1 KiB encoded.
fn block(key: u64) -> BlockMeta {
    BlockMeta {
        key: BlockKey(key),
        locations: vec![CacheLocation {
            id: LocationId(key + 1),
            storage: "s".into(),
            kind: StorageKind::FilePool,
            status: LocationStatus::Serving,
            specs: vec![LocationSpec {
                name: "tp0".into(),
                uri: format!("file:///kv/{key}/{}", "x".repeat(1000)),
                size: 100,
            }],
        }],
        last_access_ms: key,
        access_count: 1,
        depth: 0,
    }
}

/// Every key in `acked` reads back exactly as written.
fn assert_all_readable(idx: &RedbIndex, acked: &[u64]) {
    let keys: Vec<BlockKey> = acked.iter().map(|&k| BlockKey(k)).collect();
    let got = idx.get("i", &keys).expect("reads are served");
    for (k, m) in acked.iter().zip(got) {
        assert_eq!(m, Some(block(*k)), "block {k}");
    }
    assert_eq!(idx.count("i").expect("count"), acked.len() as u64);
}

/// Writes fresh blocks from `next` on until the index refuses one; returns
/// that error. redb may fit a few writes into pages it already has, so the
/// refusal need not be the first write after the disk filled up.
fn write_until_refused(idx: &RedbIndex, next: &mut u64, acked: &mut Vec<u64>) -> MetaError {
    let limit = *next + 10_000;
    loop {
        assert!(
            *next < limit,
            "the index never refused a write on a full disk"
        );
        match idx.put("i", &[block(*next)]) {
            Ok(()) => acked.push(*next),
            Err(e) => return e,
        }
        *next += 1;
    }
}

fn assert_refused(e: &MetaError) {
    assert_eq!(e.code(), "STORE_UNWRITABLE", "{e}");
    let msg = e.to_string();
    assert!(msg.contains("metadata store cannot write"), "{msg}");
    assert!(
        msg.to_lowercase().contains("no space left on device"),
        "{msg}"
    );
}

/// Retries writing `key` until it is taken; every refusal on the way must
/// be the typed one.
fn write_once_resumed(idx: &RedbIndex, key: u64) {
    let deadline = Instant::now() + RESUME_WITHIN;
    while let Err(e) = idx.put("i", &[block(key)]) {
        assert_eq!(e.code(), "STORE_UNWRITABLE", "{e}");
        assert!(Instant::now() < deadline, "writes never resumed: {e}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn redb_refuses_writes_while_full_serves_reads_and_recovers_in_place() {
    let fs = mount();
    let path = fs.path().join("meta.redb");
    let idx = RedbIndex::open(&path, 1 << 20).expect("open");
    let mut acked: Vec<u64> = Vec::new();
    for k in 0..50 {
        idx.put("i", &[block(k)])
            .expect("write before the disk fills");
        acked.push(k);
    }
    idx.put_record(RecordKind::Group, "g1", b"group")
        .expect("record");

    fs.fill().expect("fill the file system");
    let mut next = 1000;
    let err = write_until_refused(&idx, &mut next, &mut acked);
    assert_refused(&err);

    // While the disk stays full every kind of write is refused the same
    // way and changes nothing; reads answer throughout.
    for _ in 0..3 {
        assert_refused(&idx.put("i", &[block(next)]).unwrap_err());
        assert_refused(&idx.delete("i", &[BlockKey(0)]).unwrap_err());
        assert_refused(&idx.put_record(RecordKind::Group, "g2", b"g").unwrap_err());
        assert_all_readable(&idx, &acked);
        assert_eq!(
            idx.get_record(RecordKind::Group, "g1")
                .expect("record read"),
            Some(b"group".to_vec())
        );
    }

    fs.free().expect("free the filler");
    write_once_resumed(&idx, next);
    acked.push(next);
    assert_eq!(idx.delete("i", &[BlockKey(0)]).expect("delete"), 1);
    acked.retain(|&k| k != 0);
    assert_all_readable(&idx, &acked);

    // Nothing acknowledged was lost: a fresh open sees it all.
    drop(idx);
    let idx = RedbIndex::open(&path, 1 << 20).expect("reopen");
    assert_all_readable(&idx, &acked);
}

#[test]
fn redb_opens_on_a_full_disk_serves_reads_and_writes_once_freed() {
    let fs = mount();
    let path = fs.path().join("meta.redb");
    let acked: Vec<u64> = (0..50).collect();
    {
        let idx = RedbIndex::open(&path, 1 << 20).expect("open");
        for &k in &acked {
            idx.put("i", &[block(k)]).expect("write");
        }
    }
    fs.fill().expect("fill the file system");

    let idx = RedbIndex::open(&path, 1 << 20).expect("an existing index opens on a full disk");
    assert_all_readable(&idx, &acked);
    assert_refused(&idx.put("i", &[block(500)]).unwrap_err());
    assert_all_readable(&idx, &acked);

    fs.free().expect("free the filler");
    write_once_resumed(&idx, 500);
    let mut all = acked.clone();
    all.push(500);
    assert_all_readable(&idx, &all);
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

/// Accounts provisioned at every start (`[[meta.accounts]]`, the bootstrap
/// admin key) are not rewritten when unchanged, so a restart on a full
/// disk still starts; a changed account is refused with the typed error.
#[test]
fn unchanged_accounts_are_provisioned_on_a_full_disk() {
    const KEY: &str = "provisioned-admin-key-0123456789";
    let fs = mount();
    let path = fs.path().join("meta.redb");
    let open = || {
        let idx = RedbIndex::open(&path, 1 << 20).expect("open");
        MetaService::new(Arc::new(idx), MetaConfig::default()).expect("service")
    };
    {
        let svc = open();
        svc.put_account("admin", Role::Admin, ApiKey::Clear(KEY), vec![])
            .expect("first provisioning");
    }
    fs.fill().expect("fill the file system");
    let svc = open();
    svc.put_account("admin", Role::Admin, ApiKey::Clear(KEY), vec![])
        .expect("an unchanged account needs no write");
    assert!(svc.authenticate(KEY).expect("the key works").is_admin());
    let changed = svc
        .put_account("admin", Role::User, ApiKey::Clear(KEY), vec![])
        .unwrap_err();
    assert_refused(&changed);
    assert!(svc.authenticate(KEY).expect("still an admin").is_admin());
}
