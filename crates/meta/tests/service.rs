//! Service behaviour: two-phase writes, concurrency, timeouts, quotas,
//! matching, removal, trimming, restart and malformed input.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use kvtier_meta::*;
use parking_lot::Mutex;
use proptest::prelude::*;

const BLOCK: u64 = 1000;

fn storage(name: &str, kind: StorageKind) -> Storage {
    Storage {
        name: name.into(),
        kind,
        uri: format!("file:///kv/{name}"),
        enabled: true,
        health: StorageHealth::Healthy,
        spec: None,
    }
}

fn group(quota_blocks: u64, storages: &[&str]) -> InstanceGroup {
    InstanceGroup {
        name: "g".into(),
        quota_bytes: quota_blocks * BLOCK,
        kind_quota_bytes: BTreeMap::new(),
        watermark: 0.9,
        eviction: EvictionPolicy::Lru,
        storages: storages.iter().map(|s| s.to_string()).collect(),
        max_instances: 4,
        ..Default::default()
    }
}

fn instance(id: &str) -> Instance {
    Instance {
        id: id.into(),
        group: "g".into(),
        model: "m".into(),
        block_size: 16,
        location_specs: vec![
            LocationSpecInfo {
                name: "tp0".into(),
                size: BLOCK / 2,
            },
            LocationSpecInfo {
                name: "tp1".into(),
                size: BLOCK / 2,
            },
        ],
        spec_groups: vec![],
    }
}

async fn setup_on(
    index: Arc<dyn MetaIndex>,
    quota_blocks: u64,
    config: MetaConfig,
) -> Arc<MetaService> {
    let svc = MetaService::new(index, config).unwrap();
    svc.put_storage(storage("a", StorageKind::FilePool))
        .unwrap();
    svc.put_storage(storage("b", StorageKind::S3)).unwrap();
    svc.put_group(group(quota_blocks, &["a", "b"])).unwrap();
    svc.register_instance(instance("i")).await.unwrap();
    Arc::new(svc)
}

async fn setup(quota_blocks: u64) -> Arc<MetaService> {
    setup_on(
        Arc::new(MemoryIndex::new()),
        quota_blocks,
        MetaConfig::default(),
    )
    .await
}

fn keys(r: std::ops::Range<u64>) -> Vec<BlockKey> {
    r.map(BlockKey).collect()
}

async fn served(svc: &MetaService, ks: &[BlockKey]) -> Vec<bool> {
    let q = LocationQuery {
        keys: ks.to_vec(),
        mode: MatchMode::Keys,
        mask: BlockMask::None,
    };
    svc.get_cache_location("i", &q)
        .await
        .unwrap()
        .locations
        .iter()
        .map(Option::is_some)
        .collect()
}

#[tokio::test]
async fn two_phase_write_serves_only_after_finish() {
    let svc = setup(100).await;
    let ks = keys(0..4);
    let grant = svc.start_write_cache("i", &ks).await.unwrap();
    assert_eq!(grant.blocks.len(), 4);
    let loc = &grant.blocks[0].location;
    assert_eq!(loc.status, LocationStatus::Writing);
    assert_eq!(loc.storage, "a");
    assert_eq!(loc.specs.len(), 2);
    assert!(loc.specs[0].uri.starts_with("file:///kv/a/i/"));
    assert_eq!(served(&svc, &ks).await, vec![false; 4]);
    // Not granted twice while being written.
    let again = svc.start_write_cache("i", &ks).await.unwrap();
    assert!(again.blocks.is_empty());
    assert_eq!(again.skipped, ks);
    assert_eq!(svc.group_usage("g").unwrap().total, 4 * BLOCK);

    let sum = svc
        .finish_write_cache("i", grant.session, &[true, false, true, true])
        .await
        .unwrap();
    assert_eq!(
        sum,
        FinishSummary {
            served: 3,
            dropped: 1
        }
    );
    assert_eq!(served(&svc, &ks).await, vec![true, false, true, true]);
    assert_eq!(svc.group_usage("g").unwrap().total, 3 * BLOCK);
    let hit = svc
        .get_cache_location("i", &LocationQuery::prefix(ks.clone()))
        .await
        .unwrap();
    assert_eq!(hit.matched, 1);
    // Finished sessions are gone.
    assert!(matches!(
        svc.finish_write_cache("i", grant.session, &[true; 4]).await,
        Err(MetaError::SessionNotFound(_))
    ));
    // The failed key is writable again, the others are not.
    let g2 = svc.start_write_cache("i", &ks).await.unwrap();
    assert_eq!(
        g2.blocks.iter().map(|b| b.key).collect::<Vec<_>>(),
        vec![BlockKey(1)]
    );
    let meta = svc.get_cache_meta("i", &[BlockKey(0)]).await.unwrap();
    assert!(meta[0].as_ref().is_some_and(|m| m.access_count >= 2));
}

/// Many tasks write overlapping key ranges, some writes fail, until every
/// key is served. No key is ever granted to two writers at once, nothing is
/// served before its finish, nothing is lost, and quota usage ends exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_overlapping_writes() {
    const TASKS: u64 = 24;
    const KEYS: u64 = 200;
    let svc = setup(u64::MAX / BLOCK).await;
    let writing: Arc<Mutex<HashSet<BlockKey>>> = Arc::default();
    let mut handles = Vec::new();
    for t in 0..TASKS {
        let svc = svc.clone();
        let writing = writing.clone();
        handles.push(tokio::spawn(async move {
            let ks: Vec<BlockKey> = (0..40).map(|i| BlockKey((t * 7 + i * 3) % KEYS)).collect();
            let mut attempt = 0u64;
            loop {
                attempt += 1;
                let grant = svc.start_write_cache("i", &ks).await.unwrap();
                {
                    let mut w = writing.lock();
                    for b in &grant.blocks {
                        assert!(w.insert(b.key), "{:?} granted twice", b.key);
                    }
                }
                let granted: Vec<BlockKey> = grant.blocks.iter().map(|b| b.key).collect();
                if !granted.is_empty() {
                    assert!(
                        served(&svc, &granted).await.iter().all(|s| !s),
                        "served before finish"
                    );
                    let flags: Vec<bool> = granted
                        .iter()
                        .map(|k| !(k.0 + attempt + t).is_multiple_of(4))
                        .collect();
                    {
                        let mut w = writing.lock();
                        for k in &granted {
                            w.remove(k);
                        }
                    }
                    svc.finish_write_cache("i", grant.session, &flags)
                        .await
                        .unwrap();
                }
                if served(&svc, &ks).await.iter().all(|&s| s) {
                    return;
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let touched: HashSet<BlockKey> = (0..TASKS)
        .flat_map(|t| (0..40).map(move |i| BlockKey((t * 7 + i * 3) % KEYS)))
        .collect();
    let all: Vec<BlockKey> = touched.iter().copied().collect();
    let metas = svc.get_cache_meta("i", &all).await.unwrap();
    for m in &metas {
        let m = m.as_ref().expect("lost key");
        assert_eq!(m.locations.len(), 1, "one location per key: {m:?}");
        assert_eq!(m.locations[0].status, LocationStatus::Serving);
    }
    assert_eq!(
        svc.group_usage("g").unwrap().total,
        all.len() as u64 * BLOCK
    );
    assert_eq!(svc.open_sessions().unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn expired_sessions_are_reclaimed() {
    let config = MetaConfig {
        session_timeout: Duration::from_secs(10),
        ..MetaConfig::default()
    };
    let svc = setup_on(Arc::new(MemoryIndex::new()), 100, config).await;
    let ks = keys(0..3);
    let grant = svc.start_write_cache("i", &ks).await.unwrap();
    tokio::time::advance(Duration::from_secs(9)).await;
    assert_eq!(svc.reap_expired(None).await.unwrap(), 0);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(svc.reap_expired(None).await.unwrap(), 1);
    assert_eq!(svc.group_usage("g").unwrap().total, 0);
    assert_eq!(
        svc.get_cache_meta("i", &ks).await.unwrap(),
        vec![None, None, None]
    );
    assert!(matches!(
        svc.finish_write_cache("i", grant.session, &[true; 3]).await,
        Err(MetaError::SessionNotFound(_))
    ));
    assert_eq!(
        svc.start_write_cache("i", &ks).await.unwrap().blocks.len(),
        3
    );
}

#[tokio::test(start_paused = true)]
async fn background_reaper_reclaims() {
    let config = MetaConfig {
        session_timeout: Duration::from_secs(5),
        reap_interval: Duration::from_secs(1),
        ..MetaConfig::default()
    };
    let svc = setup_on(Arc::new(MemoryIndex::new()), 100, config).await;
    let _reaper = svc.spawn_reaper(None);
    svc.start_write_cache("i", &keys(0..2)).await.unwrap();
    tokio::time::advance(Duration::from_secs(4)).await;
    assert_eq!(svc.open_sessions().unwrap(), 1);
    tokio::time::advance(Duration::from_secs(2)).await;
    for _ in 0..100 {
        if svc.open_sessions().unwrap() == 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(svc.open_sessions().unwrap(), 0);
    assert_eq!(svc.group_usage("g").unwrap().total, 0);
}

#[tokio::test]
async fn quota_refusal_changes_nothing() {
    let svc = setup(3).await;
    let g = svc.start_write_cache("i", &keys(0..2)).await.unwrap();
    svc.finish_write_cache("i", g.session, &[true, true])
        .await
        .unwrap();
    let before = svc.group_usage("g").unwrap();
    let err = svc.start_write_cache("i", &keys(2..4)).await.unwrap_err();
    assert!(
        matches!(err, MetaError::QuotaExceeded { requested, .. } if requested == 2 * BLOCK),
        "{err:?}"
    );
    assert_eq!(err.code(), "QUOTA_EXCEEDED");
    assert_eq!(svc.group_usage("g").unwrap(), before);
    assert_eq!(
        svc.get_cache_meta("i", &keys(2..4)).await.unwrap(),
        vec![None, None]
    );
    assert_eq!(svc.open_sessions().unwrap(), 0);
    // Already-present keys do not count: this fits.
    assert_eq!(
        svc.start_write_cache("i", &keys(1..3))
            .await
            .unwrap()
            .blocks
            .len(),
        1
    );
}

#[tokio::test]
async fn kind_quota_moves_writes_to_next_storage() {
    let svc = setup(100).await;
    let mut g = group(100, &["a", "b"]);
    g.kind_quota_bytes.insert(StorageKind::FilePool, 2 * BLOCK);
    svc.put_group(g.clone()).unwrap();
    let first = svc.start_write_cache("i", &keys(0..2)).await.unwrap();
    assert_eq!(first.blocks[0].location.storage, "a");
    let second = svc.start_write_cache("i", &keys(2..3)).await.unwrap();
    assert_eq!(second.blocks[0].location.storage, "b");
    assert_eq!(
        svc.group_usage("g").unwrap().by_kind.get(&StorageKind::S3),
        Some(&BLOCK)
    );
    // With only the full kind as candidate, the write is refused.
    g.storages = vec!["a".into()];
    svc.put_group(g).unwrap();
    assert!(matches!(
        svc.start_write_cache("i", &keys(5..6)).await,
        Err(MetaError::QuotaExceeded { .. })
    ));
    // A disabled storage is no candidate.
    let mut a = storage("a", StorageKind::FilePool);
    a.enabled = false;
    svc.put_storage(a).unwrap();
    assert!(matches!(
        svc.start_write_cache("i", &keys(5..6)).await,
        Err(MetaError::NoAvailableStorage { .. })
    ));
}

#[tokio::test]
async fn remove_and_trim() {
    let svc = setup(100).await;
    let ks = keys(0..10);
    let g = svc.start_write_cache("i", &ks).await.unwrap();
    svc.finish_write_cache("i", g.session, &[true; 10])
        .await
        .unwrap();
    // Read 5..10 so they are more recent and more frequent.
    let q = LocationQuery {
        keys: keys(5..10),
        mode: MatchMode::Keys,
        mask: BlockMask::None,
    };
    svc.get_cache_location("i", &q).await.unwrap();
    assert_eq!(svc.remove_cache("i", &keys(0..2)).await.unwrap(), 2);
    assert_eq!(svc.group_usage("g").unwrap().total, 8 * BLOCK);
    assert_eq!(
        svc.trim_cache("i", TrimPolicy::Lfu { keep: 5 })
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        served(&svc, &ks).await,
        [vec![false; 5], vec![true; 5]].concat()
    );
    // A key being written survives removal and stays unwritable.
    let w = svc.start_write_cache("i", &keys(20..21)).await.unwrap();
    assert_eq!(svc.remove_cache("i", &keys(20..21)).await.unwrap(), 0);
    assert!(
        svc.start_write_cache("i", &keys(20..21))
            .await
            .unwrap()
            .blocks
            .is_empty()
    );
    svc.finish_write_cache("i", w.session, &[true])
        .await
        .unwrap();
    assert_eq!(svc.trim_cache("i", TrimPolicy::All).await.unwrap(), 6);
    assert_eq!(svc.group_usage("g").unwrap().total, 0);
}

#[tokio::test]
async fn restart_keeps_serving_drops_writing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.redb");
    {
        let idx: Arc<dyn MetaIndex> = Arc::new(RedbIndex::open(&path, 1 << 20).unwrap());
        let svc = setup_on(idx, 100, MetaConfig::default()).await;
        let g = svc.start_write_cache("i", &keys(0..3)).await.unwrap();
        svc.finish_write_cache("i", g.session, &[true; 3])
            .await
            .unwrap();
        svc.start_write_cache("i", &keys(3..5)).await.unwrap();
        assert_eq!(svc.group_usage("g").unwrap().total, 5 * BLOCK);
    }
    let idx: Arc<dyn MetaIndex> = Arc::new(RedbIndex::open(&path, 1 << 20).unwrap());
    let svc = MetaService::new(idx, MetaConfig::default()).unwrap();
    assert_eq!(svc.get_instance_info("i").await.unwrap(), instance("i"));
    assert_eq!(svc.group_usage("g").unwrap().total, 3 * BLOCK);
    assert_eq!(
        served(&svc, &keys(0..5)).await,
        vec![true, true, true, false, false]
    );
    assert_eq!(
        svc.start_write_cache("i", &keys(0..5))
            .await
            .unwrap()
            .blocks
            .len(),
        2
    );
}

#[tokio::test]
async fn malformed_input_gives_typed_errors() {
    let svc = setup(100).await;
    // No keys (token ids short of a block, upstream): an empty session,
    // finished once.
    let empty = svc.start_write_cache("i", &[]).await.unwrap();
    assert!(empty.blocks.is_empty());
    svc.finish_write_cache("i", empty.session, &[])
        .await
        .unwrap();
    assert!(matches!(
        svc.finish_write_cache("i", empty.session, &[]).await,
        Err(MetaError::SessionNotFound(_))
    ));
    assert!(matches!(
        svc.start_write_cache("nope", &keys(0..1)).await,
        Err(MetaError::InstanceNotFound(_))
    ));
    assert!(matches!(
        svc.get_cache_location("nope", &LocationQuery::prefix(keys(0..1)))
            .await,
        Err(MetaError::InstanceNotFound(_))
    ));
    assert!(matches!(
        svc.get_cache_location("i", &LocationQuery::prefix(vec![]))
            .await,
        Err(MetaError::InvalidArgument(_))
    ));
    let bad_mask = LocationQuery {
        keys: keys(0..3),
        mode: MatchMode::Prefix,
        mask: BlockMask::Bits(vec![true]),
    };
    assert!(matches!(
        svc.get_cache_location("i", &bad_mask).await,
        Err(MetaError::InvalidArgument(_))
    ));
    let bad_offset = LocationQuery {
        keys: keys(0..3),
        mode: MatchMode::Prefix,
        mask: BlockMask::Offset(4),
    };
    assert!(matches!(
        svc.get_cache_location("i", &bad_offset).await,
        Err(MetaError::InvalidArgument(_))
    ));
    let w0 = LocationQuery {
        keys: keys(0..3),
        mode: MatchMode::ReverseSlidingWindow { window: 0 },
        mask: BlockMask::None,
    };
    assert!(matches!(
        svc.get_cache_location("i", &w0).await,
        Err(MetaError::InvalidArgument(_))
    ));
    assert!(matches!(
        svc.remove_cache("i", &[]).await,
        Err(MetaError::InvalidArgument(_))
    ));
    assert!(matches!(
        svc.trim_cache("nope", TrimPolicy::All).await,
        Err(MetaError::InstanceNotFound(_))
    ));
    // Wrong flag count does not consume the session.
    let g = svc.start_write_cache("i", &keys(0..2)).await.unwrap();
    assert!(matches!(
        svc.finish_write_cache("i", g.session, &[true]).await,
        Err(MetaError::InvalidArgument(_))
    ));
    assert!(matches!(
        svc.finish_write_cache("j", g.session, &[true, true]).await,
        Err(MetaError::SessionNotFound(_))
    ));
    svc.finish_write_cache("i", g.session, &[true, true])
        .await
        .unwrap();
    assert!(matches!(
        svc.finish_write_cache("i", SessionId(42), &[]).await,
        Err(MetaError::SessionNotFound(_))
    ));
    // Registration checks.
    let mut bad = instance("x");
    bad.location_specs.clear();
    assert!(matches!(
        svc.register_instance(bad).await,
        Err(MetaError::InvalidArgument(_))
    ));
    let mut dup = instance("x");
    dup.location_specs[1].name = "tp0".into();
    assert!(matches!(
        svc.register_instance(dup).await,
        Err(MetaError::InvalidArgument(_))
    ));
    let mut other_group = instance("x");
    other_group.group = "missing".into();
    assert!(matches!(
        svc.register_instance(other_group).await,
        Err(MetaError::GroupNotFound(_))
    ));
    assert_eq!(
        svc.register_instance(instance("i")).await.unwrap(),
        instance("i")
    );
    let mut changed = instance("i");
    changed.block_size = 32;
    assert!(matches!(
        svc.register_instance(changed).await,
        Err(MetaError::InstanceConflict(_))
    ));
    for id in ["x1", "x2", "x3"] {
        svc.register_instance(instance(id)).await.unwrap();
    }
    assert!(matches!(
        svc.register_instance(instance("x4")).await,
        Err(MetaError::GroupFull(_))
    ));
}

fn ref_prefix(avail: &[bool]) -> usize {
    avail.iter().take_while(|&&a| a).count()
}

fn ref_window(avail: &[bool], w: usize) -> usize {
    (0..=avail.len())
        .rev()
        .find(|&e| (e.saturating_sub(w)..e).all(|i| avail[i]))
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Prefix and sliding-window matches through the service agree with a
    /// brute-force reference on random served sets and masks.
    #[test]
    fn matching_agrees_with_reference(
        present in proptest::collection::vec(prop::bool::weighted(0.75), 1..40),
        maskbits in proptest::collection::vec(prop::bool::weighted(0.2), 40),
        window in 1usize..6,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let svc = setup(1000).await;
            let n = present.len();
            let ks = keys(0..n as u64);
            let g = svc.start_write_cache("i", &ks).await.unwrap();
            svc.finish_write_cache("i", g.session, &present).await.unwrap();
            let mask: Vec<bool> = maskbits[..n].to_vec();
            let avail: Vec<bool> = (0..n).map(|i| mask[i] || present[i]).collect();

            let q = LocationQuery {
                keys: ks.clone(),
                mode: MatchMode::Prefix,
                mask: BlockMask::Bits(mask.clone()),
            };
            let r = svc.get_cache_location("i", &q).await.unwrap();
            let e = ref_prefix(&avail);
            assert_eq!(r.matched, e);
            for (i, (loc, &masked)) in r.locations.iter().zip(&mask).enumerate() {
                assert_eq!(loc.is_some(), i < e && !masked, "prefix pos {i}");
            }

            let q = LocationQuery {
                keys: ks.clone(),
                mode: MatchMode::ReverseSlidingWindow { window },
                mask: BlockMask::Bits(mask.clone()),
            };
            let r = svc.get_cache_location("i", &q).await.unwrap();
            let e = ref_window(&avail, window);
            assert_eq!(r.matched, e);
            for (i, (loc, &masked)) in r.locations.iter().zip(&mask).enumerate() {
                let expect = i < e && i + window >= e && !masked;
                assert_eq!(loc.is_some(), expect, "window pos {i}");
            }
        });
    }
}

/// Names that log or display as something else, and zero-sized specs, are
/// refused at registration and change nothing.
#[tokio::test]
async fn registration_refuses_hidden_characters_and_empty_specs() {
    let svc = setup(100).await;
    let hidden = [
        "a\0b",
        "tab\there",
        "line\nbreak",
        "del\u{7f}",
        "c1\u{85}",
        "rlo\u{202E}gpj.exe",
        "lri\u{2066}x",
        "alm\u{061C}x",
        "zw\u{200B}sp",
        "bom\u{FEFF}",
    ];
    for id in hidden {
        let err = svc.register_instance(instance(id)).await.unwrap_err();
        assert!(
            matches!(err, MetaError::InvalidArgument(_)),
            "{id:?}: {err}"
        );
        let mut spec = instance("ok");
        spec.location_specs[0].name = id.into();
        let err = svc.register_instance(spec).await.unwrap_err();
        assert!(
            matches!(err, MetaError::InvalidArgument(_)),
            "spec {id:?}: {err}"
        );
    }
    let long = "x".repeat(MAX_NAME_BYTES + 1);
    assert!(matches!(
        svc.register_instance(instance(&long)).await,
        Err(MetaError::InvalidArgument(_))
    ));
    let mut zero = instance("zero");
    zero.location_specs[0].size = 0;
    let err = svc.register_instance(zero).await.unwrap_err();
    assert!(err.to_string().contains("size 0"), "{err}");
    // Ordinary non-ASCII names are fine.
    svc.register_instance(instance("modèle-7b/テスト"))
        .await
        .unwrap();
    // Nothing refused was registered.
    assert!(svc.get_instance_info("zero").await.is_err());
    for id in hidden {
        assert!(svc.get_instance_info(id).await.is_err());
    }
    for bad in ["g\u{202E}", "g\0"] {
        let mut g = group(10, &["a"]);
        g.name = bad.into();
        assert!(svc.put_group(g).is_err(), "group {bad:?}");
        let err = svc.add_account(bad, Role::User, "0123456789abcdef", vec![]);
        assert!(err.is_err(), "account {bad:?}");
    }
}

/// Finishing a session that was never issued is refused, also with zero
/// flags; an empty grant's own session finishes once.
#[tokio::test]
async fn finish_checks_the_session_even_when_empty() {
    let svc = setup(100).await;
    let err = svc
        .finish_write_cache("i", SessionId(0xdead_beef), &[])
        .await
        .unwrap_err();
    assert!(matches!(err, MetaError::SessionNotFound(_)), "{err}");
    // Shown in hex, as the wire carries it.
    assert!(err.to_string().contains("00000000deadbeef"), "{err}");
    let g = svc.start_write_cache("i", &keys(0..2)).await.unwrap();
    svc.finish_write_cache("i", g.session, &[true, true])
        .await
        .unwrap();
    let empty = svc.start_write_cache("i", &keys(0..2)).await.unwrap();
    assert!(empty.blocks.is_empty());
    assert_ne!(empty.session, g.session);
    svc.finish_write_cache("i", empty.session, &[])
        .await
        .unwrap();
    assert!(matches!(
        svc.finish_write_cache("i", empty.session, &[]).await,
        Err(MetaError::SessionNotFound(_))
    ));
}

/// The refusal says why each candidate storage could not take the write:
/// disabled and unhealthy read differently.
#[tokio::test]
async fn no_writable_storage_names_each_reason() {
    let svc = setup(100).await;
    let mut a = storage("a", StorageKind::FilePool);
    a.enabled = false;
    svc.put_storage(a).unwrap();
    let mut b = storage("b", StorageKind::S3);
    b.health = StorageHealth::Unhealthy;
    svc.put_storage(b).unwrap();
    let err = svc.start_write_cache("i", &keys(0..1)).await.unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, MetaError::NoAvailableStorage { .. }),
        "{text}"
    );
    assert!(text.contains("\"a\" is disabled"), "{text}");
    assert!(text.contains("\"b\" is unhealthy"), "{text}");
}

/// Frontends sharing one index (issue 14): a frontend that starts while
/// another has a write in flight leaves that write alone, when writing
/// locations count as orphaned only past `orphan_write_age`; the sweep
/// removes exactly the orphaned ones.
#[tokio::test]
async fn a_starting_frontend_keeps_other_frontends_writes_in_flight() {
    let index: Arc<dyn MetaIndex> = Arc::new(MemoryIndex::new());
    let shared = MetaConfig {
        orphan_write_age: Some(Duration::from_secs(3600)),
        ..MetaConfig::default()
    };
    let a = setup_on(index.clone(), 100, shared.clone()).await;
    let grant = a.start_write_cache("i", &keys(0..3)).await.unwrap();
    // B starts (recovery) and sweeps: the write is younger than the age.
    let b = MetaService::new(index.clone(), shared.clone()).unwrap();
    assert_eq!(b.sweep_orphaned_writes(None).unwrap(), 0);
    let done = a
        .finish_write_cache("i", grant.session, &[true; 3])
        .await
        .unwrap();
    assert_eq!((done.served, done.dropped), (3, 0));
    assert_eq!(served(&b, &keys(0..3)).await, vec![true; 3]);

    // With age 0 every writing location is orphaned: the sweep removes the
    // one in flight (and only it), and its session then finds it gone.
    let grant = a.start_write_cache("i", &keys(3..5)).await.unwrap();
    let sweeper = MetaService::new(
        index.clone(),
        MetaConfig {
            orphan_write_age: Some(Duration::ZERO),
            ..MetaConfig::default()
        },
    )
    .unwrap();
    // Its own start-up recovery already removed them.
    assert_eq!(sweeper.sweep_orphaned_writes(None).unwrap(), 0);
    let again = a.start_write_cache("i", &keys(3..5)).await.unwrap();
    assert_eq!(again.blocks.len(), 2, "the keys are free again");
    assert_eq!(sweeper.sweep_orphaned_writes(None).unwrap(), 2);
    assert_eq!(
        served(&b, &keys(0..5)).await,
        vec![true, true, true, false, false]
    );
    let late = a
        .finish_write_cache("i", grant.session, &[true; 2])
        .await
        .unwrap();
    assert_eq!(late.served, 0, "a swept write is never served");
    // A single frontend (no age) sweeps nothing later.
    assert_eq!(a.sweep_orphaned_writes(None).unwrap(), 0);
}

/// A write session never lands on a kvtier node's block store (it takes no
/// writes; its probe, a peer handshake, may still pass): the next
/// candidate takes it, and with none left the refusal says why.
#[tokio::test]
async fn a_write_session_never_picks_a_node_store() {
    let index: Arc<dyn MetaIndex> = Arc::new(MemoryIndex::new());
    let svc = MetaService::new(index, MetaConfig::default()).unwrap();
    let mut node = storage("node-a", StorageKind::KvtierNode);
    node.uri = "kvtier://a".into();
    svc.put_storage(node).unwrap();
    svc.put_storage(storage("b", StorageKind::S3)).unwrap();
    svc.put_group(group(100, &["node-a", "b"])).unwrap();
    svc.register_instance(instance("i")).await.unwrap();
    let grant = svc.start_write_cache("i", &keys(0..2)).await.unwrap();
    for block in &grant.blocks {
        for part in &block.location.specs {
            assert!(part.uri.starts_with("file:///kv/b"), "{}", part.uri);
        }
    }
    let mut b = storage("b", StorageKind::S3);
    b.enabled = false;
    svc.put_storage(b).unwrap();
    let err = svc.start_write_cache("i", &keys(5..6)).await.unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, MetaError::NoAvailableStorage { .. }),
        "{text}"
    );
    assert!(
        text.contains("\"node-a\" is a kvtier node's block store"),
        "{text}"
    );
}
