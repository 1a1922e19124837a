//! FilePool: extents, all-or-nothing batches, full, bad URIs, restore after
//! a restart, concurrent use and the health probe.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use kvtier_backend::{EXTENT_ALIGN, FilePool, FilePoolOptions};
use kvtier_meta::{BackendError, BlockKey, CreateRequest, LocationId, StorageBackend};

fn opts(file_size: u64, files: u32) -> FilePoolOptions {
    FilePoolOptions {
        file_size,
        files,
        preallocate: false,
        probe_timeout: Duration::from_secs(5),
    }
}

fn req(loc: u64, size: u64) -> CreateRequest {
    CreateRequest {
        instance: "inst".into(),
        key: BlockKey(loc * 7),
        location: LocationId(loc),
        spec: "tp0".into(),
        size,
    }
}

/// (file, offset, size) of a pool URI, parsed independently of the crate.
fn extent(uri: &str) -> (String, u64, u64) {
    let (path, query) = uri.split_once('?').expect("query");
    let path = path.strip_prefix("file://").expect("file URI");
    let get = |k: &str| -> u64 {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .expect("param")
            .parse()
            .expect("number")
    };
    (path.to_owned(), get("offset"), get("size"))
}

fn assert_disjoint(uris: &[String]) {
    let mut ex: Vec<(String, u64, u64)> = uris.iter().map(|u| extent(u)).collect();
    ex.sort();
    for w in ex.windows(2) {
        if w[0].0 == w[1].0 {
            assert!(w[0].1 + w[0].2 <= w[1].1, "{:?} overlaps {:?}", w[0], w[1]);
        }
    }
}

#[tokio::test]
async fn hands_out_aligned_disjoint_extents_and_reuses_freed_space() {
    let dir = tempfile::tempdir().unwrap();
    let pool = FilePool::open(dir.path().join("pool"), &opts(64 * 1024, 2)).unwrap();
    let reqs: Vec<CreateRequest> = (1..=6).map(|i| req(i, 5000 + i)).collect();
    let uris = pool.create(&reqs).await.unwrap();
    assert_eq!(uris.len(), 6);
    for u in &uris {
        assert!(
            u.starts_with(&format!(
                "file://{}/pool-",
                dir.path().join("pool").display()
            )),
            "{u}"
        );
        let (path, off, size) = extent(u);
        assert!(std::path::Path::new(&path).exists());
        assert_eq!(off % EXTENT_ALIGN, 0);
        assert_eq!(size, 8192, "5000+ bytes round up to two pages");
    }
    assert_disjoint(&uris);
    assert_eq!(pool.exist(&uris).await.unwrap(), vec![true; 6]);
    let u = pool.usage().await.unwrap();
    assert_eq!(
        (u.used_bytes, u.objects, u.capacity_bytes),
        (6 * 8192, 6, Some(128 * 1024))
    );

    // Free two; their space is handed out again.
    for r in pool.delete(&uris[1..3]).await {
        r.unwrap();
    }
    assert_eq!(
        pool.exist(&uris[..3]).await.unwrap(),
        vec![true, false, false]
    );
    // Deleting again is fine (idempotent) and changes nothing.
    for r in pool.delete(&uris[1..3]).await {
        r.unwrap();
    }
    assert_eq!(pool.usage().await.unwrap().used_bytes, 4 * 8192);
    let again = pool.create(&[req(50, 16384)]).await.unwrap();
    let (_, off, _) = extent(&again[0]);
    let freed: HashSet<u64> = uris[1..3].iter().map(|u| extent(u).1).collect();
    assert!(
        freed.contains(&off),
        "16 KiB reuses the merged hole of the two freed extents"
    );
    // A stale URI of a freed extent, now reused by another location, frees
    // nothing and is not "live".
    assert_eq!(pool.exist(&uris[1..2]).await.unwrap(), vec![false]);
    pool.delete(&uris[1..2]).await.pop().unwrap().unwrap();
    assert_eq!(pool.exist(&again).await.unwrap(), vec![true]);
}

#[tokio::test]
async fn full_is_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let pool = FilePool::open(dir.path().to_path_buf(), &opts(4 * EXTENT_ALIGN, 1)).unwrap();
    let first = pool.create(&[req(1, 4096), req(2, 4096)]).await.unwrap();
    let err = pool
        .create(&[req(3, 4096), req(4, 4096), req(5, 1)])
        .await
        .unwrap_err();
    match err {
        BackendError::Full { requested, free } => {
            assert_eq!((requested, free), (3 * 4096, 2 * 4096))
        }
        e => panic!("expected Full, got {e}"),
    }
    // Nothing of the refused batch stayed allocated.
    assert_eq!(pool.usage().await.unwrap().used_bytes, 2 * 4096);
    assert_eq!(pool.create(&[req(6, 8192)]).await.unwrap().len(), 1);
    assert!(matches!(
        pool.create(&[req(7, u64::MAX)]).await,
        Err(BackendError::Full { .. })
    ));
    assert_eq!(pool.exist(&first).await.unwrap(), vec![true, true]);
}

#[tokio::test]
async fn bad_uris_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let pool = FilePool::open(dir.path().to_path_buf(), &opts(64 * 1024, 2)).unwrap();
    let good = pool.create(&[req(1, 4096)]).await.unwrap().remove(0);
    let d = dir.path().display();
    let bad = [
        "not a uri".to_owned(),
        format!("s3://{d}/pool-0000.kv?offset=0&size=4096&loc=1"),
        "file:///elsewhere/pool-0000.kv?offset=0&size=4096&loc=1".to_owned(),
        format!("file://{d}/pool-0002.kv?offset=0&size=4096&loc=1"),
        format!("file://{d}/pool-1.kv?offset=0&size=4096&loc=1"),
        format!("file://{d}/other.kv?offset=0&size=4096&loc=1"),
        format!("file://{d}/pool-0000.kv?offset=100&size=4096&loc=1"),
        format!("file://{d}/pool-0000.kv?offset=0&size=0&loc=1"),
        format!("file://{d}/pool-0000.kv?offset=65536&size=4096&loc=1"),
        format!("file://{d}/pool-0000.kv?size=4096&loc=1"),
        format!("file://{d}/pool-0000.kv?offset=0&size=4096"),
        format!("file://{d}/pool-0000.kv?offset=0&size=4096&loc=zz"),
        format!("file://{d}/pool-0000.kv?offset=x&size=4096&loc=1"),
        format!("file://host{d}/pool-0000.kv?offset=0&size=4096&loc=1"),
    ];
    for b in &bad {
        let r = pool.delete(std::slice::from_ref(b)).await.pop().unwrap();
        assert!(matches!(r, Err(BackendError::BadUri { .. })), "{b}: {r:?}");
        assert!(pool.exist(&[good.clone(), b.clone()]).await.is_err(), "{b}");
    }
    // The good extent was untouched by all of that.
    assert_eq!(pool.exist(&[good]).await.unwrap(), vec![true]);
    assert!(FilePool::open_uri("file://relative/dir", &opts(4096, 1)).is_err());
    assert!(FilePool::open_uri("s3://bucket/x", &opts(4096, 1)).is_err());
    assert!(FilePool::open("relative", &opts(4096, 1)).is_err());
    assert!(FilePool::open(dir.path().join("z"), &opts(100, 1)).is_err());
}

#[tokio::test]
async fn restore_after_restart_protects_live_extents() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts(16 * EXTENT_ALIGN, 1);
    let live = {
        let pool = FilePool::open_uri(&format!("file://{}", dir.path().display()), &o).unwrap();
        let uris = pool
            .create(&(1..=8).map(|i| req(i, 4096)).collect::<Vec<_>>())
            .await
            .unwrap();
        // Half of them are freed before the "crash".
        for r in pool.delete(&uris[4..]).await {
            r.unwrap();
        }
        uris[..4].to_vec()
    };
    // A new process: the map comes back from the URIs the index lists.
    let pool = FilePool::open(dir.path().to_path_buf(), &o).unwrap();
    assert_eq!(pool.exist(&live).await.unwrap(), vec![false; 4]);
    let mut listed = live.clone();
    listed.push("file:///nowhere/pool-0000.kv?offset=0&size=4096&loc=9".into());
    listed.push(live[0].clone()); // listed twice: overlaps itself
    let summary = pool.restore(&listed);
    assert_eq!(summary.restored, 4);
    assert_eq!(summary.rejected.len(), 2);
    assert_eq!(pool.exist(&live).await.unwrap(), vec![true; 4]);
    // New extents avoid the restored ones until the pool is full.
    let fresh = pool
        .create(&(10..22).map(|i| req(i, 4096)).collect::<Vec<_>>())
        .await
        .unwrap();
    let mut all = live.clone();
    all.extend(fresh);
    assert_disjoint(&all);
    assert!(matches!(
        pool.create(&[req(30, 4096)]).await,
        Err(BackendError::Full { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_create_and_delete_never_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let pool =
        Arc::new(FilePool::open(dir.path().to_path_buf(), &opts(256 * EXTENT_ALIGN, 2)).unwrap());
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut held: Vec<String> = Vec::new();
            for i in 0..200u64 {
                let loc = t * 10_000 + i;
                match pool.create(&[req(loc, 4096 * (1 + i % 3))]).await {
                    Ok(mut u) => held.push(u.remove(0)),
                    Err(BackendError::Full { .. }) => {}
                    Err(e) => panic!("{e}"),
                }
                if i % 2 == 1 && !held.is_empty() {
                    let u = held.remove((i as usize * 7) % held.len());
                    pool.delete(&[u]).await.pop().unwrap().unwrap();
                }
            }
            held
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    assert_disjoint(&all);
    assert_eq!(pool.exist(&all).await.unwrap(), vec![true; all.len()]);
    let used: u64 = all.iter().map(|u| extent(u).2).sum();
    let usage = pool.usage().await.unwrap();
    assert_eq!((usage.used_bytes, usage.objects), (used, all.len() as u64));
}

#[tokio::test]
async fn health_probe_fails_when_the_directory_is_gone_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let o = opts(4 * EXTENT_ALIGN, 1);
    let pool = FilePool::open(path.clone(), &o).unwrap();
    pool.health().await.unwrap();
    std::fs::remove_dir_all(&path).unwrap();
    assert!(matches!(
        pool.health().await,
        Err(BackendError::Unavailable(_))
    ));
    // Recovery: the directory is back (an operator remounted it) with its files.
    drop(FilePool::open(path.clone(), &o).unwrap());
    pool.health().await.unwrap();
    // No probe files are left behind.
    let names: Vec<String> = std::fs::read_dir(&path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["pool-0000.kv".to_owned()]);
}
