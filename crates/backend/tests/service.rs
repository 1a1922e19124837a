//! The service with data storage backends attached: file-pool extents in
//! grants, space freed on removal, failed finish and session timeout,
//! storages skipped when their backend refuses, restore after a restart,
//! and health checks that stop and resume writes and reads.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvtier_backend::{FilePool, FilePoolOptions};
use kvtier_meta::test_support::world::{keys, service, uris};
use kvtier_meta::*;

const SPEC: u64 = 5000;

fn pool_opts(file_size: u64) -> FilePoolOptions {
    FilePoolOptions {
        file_size,
        files: 2,
        preallocate: false,
        probe_timeout: Duration::from_secs(5),
    }
}

async fn objects(pool: &FilePool) -> u64 {
    pool.usage().await.unwrap().objects
}

struct Setup {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    pool: Arc<FilePool>,
    svc: Arc<MetaService>,
}

async fn setup(storages: &[&str], file_size: u64, config: MetaConfig) -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pool");
    let svc = service(Arc::new(MemoryIndex::new()), &dir, storages, config, SPEC).await;
    let pool = Arc::new(FilePool::open(dir.clone(), &pool_opts(file_size)).unwrap());
    svc.attach_backend("pool", pool.clone()).unwrap();
    Setup {
        _tmp: tmp,
        dir,
        pool,
        svc,
    }
}

#[tokio::test]
async fn grants_file_extents_and_frees_them_on_failed_finish_and_remove() {
    let s = setup(&["pool"], 1 << 20, MetaConfig::default()).await;
    let grant = s.svc.start_write_cache("i", &keys(0..4)).await.unwrap();
    assert_eq!(grant.blocks.len(), 4);
    let all = uris(&grant);
    let prefix = format!("file://{}/pool-", s.dir.display());
    for u in &all {
        assert!(
            u.starts_with(&prefix) && u.contains("offset=") && u.contains("size=8192"),
            "{u}"
        );
    }
    assert_eq!(s.pool.exist(&all).await.unwrap(), vec![true; 8]);
    assert_eq!(objects(&s.pool).await, 8);

    // Block 2 failed: its two extents are freed.
    s.svc
        .finish_write_cache("i", grant.session, &[true, true, false, true])
        .await
        .unwrap();
    s.svc.wait_released().await;
    assert_eq!(objects(&s.pool).await, 6);
    assert_eq!(s.pool.exist(&all[4..6]).await.unwrap(), vec![false, false]);

    let hit = s
        .svc
        .get_cache_location("i", &LocationQuery::prefix(keys(0..2)))
        .await
        .unwrap();
    assert_eq!(hit.matched, 2);
    assert_eq!(hit.locations[0].as_ref().unwrap().specs[0].uri, all[0]);

    // Removing blocks frees their extents after the index change.
    assert_eq!(s.svc.remove_cache("i", &keys(0..2)).await.unwrap(), 2);
    s.svc.wait_released().await;
    assert_eq!(objects(&s.pool).await, 2);
    assert_eq!(s.pool.exist(&all[..4]).await.unwrap(), vec![false; 4]);
    assert_eq!(s.pool.exist(&all[6..]).await.unwrap(), vec![true; 2]);
    // Trimming the rest frees the last ones.
    s.svc.trim_cache("i", TrimPolicy::All).await.unwrap();
    s.svc.wait_released().await;
    assert_eq!(objects(&s.pool).await, 0);
    let st = s.svc.backend_stats();
    assert_eq!((st.deleted, st.delete_failures), (8, 0));
}

#[tokio::test(start_paused = true)]
async fn session_timeout_frees_extents() {
    let config = MetaConfig {
        session_timeout: Duration::from_secs(10),
        ..MetaConfig::default()
    };
    let s = setup(&["pool"], 1 << 20, config).await;
    let grant = s.svc.start_write_cache("i", &keys(0..3)).await.unwrap();
    assert_eq!(objects(&s.pool).await, 6);
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(s.svc.reap_expired(None).await.unwrap(), 1);
    s.svc.wait_released().await;
    assert_eq!(objects(&s.pool).await, 0);
    assert_eq!(s.svc.group_usage("g").unwrap().total, 0);
    assert!(
        s.svc
            .finish_write_cache("i", grant.session, &[true; 3])
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_full_pool_is_skipped_and_nothing_stays_charged() {
    // Room for one block (two 8 KiB extents in each of two 8 KiB files).
    let s = setup(&["pool", "plain"], 8192, MetaConfig::default()).await;
    let one = s.svc.start_write_cache("i", &keys(0..1)).await.unwrap();
    assert!(uris(&one)[0].starts_with("file://"));
    // Two more blocks do not fit: the write goes to the next storage.
    let two = s.svc.start_write_cache("i", &keys(1..3)).await.unwrap();
    assert_eq!(two.blocks.len(), 2);
    assert!(two.blocks.iter().all(|b| b.location.storage == "plain"));
    assert!(uris(&two)[0].starts_with("s3://b/p/i/"), "{:?}", uris(&two));
    assert_eq!(objects(&s.pool).await, 2);
    assert_eq!(s.svc.group_usage("g").unwrap().total, 3 * 2 * SPEC);
    assert_eq!(s.svc.backend_stats().create_failures, 1);

    // With the pool as the only storage the write is refused and leaves
    // neither a charge nor an extent behind.
    let t = setup(&["pool"], 8192, MetaConfig::default()).await;
    t.svc.start_write_cache("i", &keys(0..1)).await.unwrap();
    let err = t.svc.start_write_cache("i", &keys(1..3)).await.unwrap_err();
    assert!(matches!(err, MetaError::NoAvailableStorage { .. }), "{err}");
    assert_eq!(t.svc.group_usage("g").unwrap().total, 2 * SPEC);
    assert_eq!(objects(&t.pool).await, 2);
    let meta = t.svc.get_cache_meta("i", &keys(1..3)).await.unwrap();
    assert!(meta.iter().all(Option::is_none));
}

#[tokio::test]
async fn restart_restores_the_pool_from_the_index() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pool");
    let index: Arc<dyn MetaIndex> = Arc::new(MemoryIndex::new());
    let (served, in_flight) = {
        let svc = service(index.clone(), &dir, &["pool"], MetaConfig::default(), SPEC).await;
        let pool = Arc::new(FilePool::open(dir.clone(), &pool_opts(1 << 20)).unwrap());
        svc.attach_backend("pool", pool).unwrap();
        let g = svc.start_write_cache("i", &keys(0..3)).await.unwrap();
        svc.finish_write_cache("i", g.session, &[true; 3])
            .await
            .unwrap();
        let w = svc.start_write_cache("i", &keys(3..4)).await.unwrap();
        (uris(&g), uris(&w))
    };
    // A new process over the same index: writes in flight are dropped, and
    // the pool is rebuilt from what the index still lists.
    let svc = MetaService::new(index, MetaConfig::default()).unwrap();
    assert_eq!(svc.live_uris("pool").unwrap().len(), 6);
    let record = svc
        .list_storages()
        .into_iter()
        .find(|s| s.name == "pool")
        .unwrap();
    let opts = kvtier_backend::BackendOptions {
        file_pool: pool_opts(1 << 20),
        ..Default::default()
    };
    let pool = kvtier_backend::attach_backend(&svc, &record, &opts).unwrap();
    assert_eq!(pool.exist(&served).await.unwrap(), vec![true; 6]);
    assert_eq!(pool.exist(&in_flight).await.unwrap(), vec![false; 2]);
    // New grants never overlap a restored extent.
    let g = svc.start_write_cache("i", &keys(10..20)).await.unwrap();
    let fresh = uris(&g);
    for f in &fresh {
        let (ff, fo, fs) = extent(f);
        for s in &served {
            let (sf, so, ss) = extent(s);
            assert!(
                ff != sf || fo + fs <= so || so + ss <= fo,
                "{f} overlaps {s}"
            );
        }
    }
    assert_eq!(pool.usage().await.unwrap().objects, 6 + 20);
}

/// (file, offset, size) of a pool URI.
fn extent(uri: &str) -> (String, u64, u64) {
    let (path, query) = uri.split_once('?').unwrap();
    let get = |k: &str| -> u64 {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .unwrap()
            .parse()
            .unwrap()
    };
    (path.to_owned(), get("offset"), get("size"))
}

fn health_of(svc: &MetaService, name: &str) -> StorageHealth {
    svc.list_storages()
        .into_iter()
        .find(|s| s.name == name)
        .map(|s| s.health)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unhealthy_storage_gets_no_writes_or_reads_until_it_recovers() {
    let s = setup(&["pool"], 1 << 20, MetaConfig::default()).await;
    let g = s.svc.start_write_cache("i", &keys(0..2)).await.unwrap();
    s.svc
        .finish_write_cache("i", g.session, &[true; 2])
        .await
        .unwrap();
    let probe = Duration::from_secs(5);
    assert!(s.svc.check_backends(probe).await.is_empty());

    // The pool's directory disappears (a lost mount).
    std::fs::remove_dir_all(&s.dir).unwrap();
    assert_eq!(s.svc.check_backends(probe).await, vec!["pool".to_owned()]);
    assert_eq!(health_of(&s.svc, "pool"), StorageHealth::Unhealthy);
    let err = s.svc.start_write_cache("i", &keys(5..6)).await.unwrap_err();
    assert!(matches!(err, MetaError::NoAvailableStorage { .. }), "{err}");
    let hit = s
        .svc
        .get_cache_location("i", &LocationQuery::prefix(keys(0..2)))
        .await
        .unwrap();
    assert_eq!(hit.matched, 0);
    assert!(hit.locations.iter().all(Option::is_none));
    // Both serving locations were hidden (counted), not just the first.
    assert_eq!(s.svc.backend_stats().unhealthy_skips, 2);

    // The mount comes back; the background checker notices.
    drop(FilePool::open(s.dir.clone(), &pool_opts(1 << 20)).unwrap());
    let _checker = s.svc.spawn_health_checker(Duration::from_millis(20), None);
    let deadline = Instant::now() + Duration::from_secs(30);
    while health_of(&s.svc, "pool") != StorageHealth::Healthy {
        assert!(Instant::now() < deadline, "storage never turned healthy");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let hit = s
        .svc
        .get_cache_location("i", &LocationQuery::prefix(keys(0..2)))
        .await
        .unwrap();
    assert_eq!(hit.matched, 2);
    assert_eq!(
        s.svc
            .start_write_cache("i", &keys(5..6))
            .await
            .unwrap()
            .blocks
            .len(),
        1
    );
    let st = s.svc.backend_stats();
    assert!(st.health_failures >= 1 && st.health_checks >= 3, "{st:?}");
}
