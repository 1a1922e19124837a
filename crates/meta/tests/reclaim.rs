//! The reclaimer (watermarks, LRU / LFU / TTL, leaves before parents,
//! writing locations, run-time changes), buffered access statistics, and
//! the search cache never answering with a location the index no longer
//! serves.
//!
//! Every test's sample size is at least its block count, so victim choice
//! is exact and the expected survivors can be stated.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use kvtier_meta::*;
use proptest::prelude::*;

const BLOCK: u64 = 1000;

fn storage() -> Storage {
    Storage {
        name: "a".into(),
        kind: StorageKind::FilePool,
        uri: "file:///kv/a".into(),
        enabled: true,
        health: StorageHealth::Healthy,
        spec: None,
    }
}

fn group(quota_blocks: u64, watermark: f64, eviction: EvictionPolicy) -> InstanceGroup {
    InstanceGroup {
        name: "g".into(),
        quota_bytes: quota_blocks * BLOCK,
        kind_quota_bytes: BTreeMap::new(),
        watermark,
        eviction,
        storages: vec!["a".into()],
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
        location_specs: vec![LocationSpecInfo {
            name: "tp0".into(),
            size: BLOCK,
        }],
        spec_groups: vec![],
    }
}

/// Reclaim to 10 % under the watermark, exact victim choice.
fn config() -> MetaConfig {
    MetaConfig {
        reclaim_hysteresis: 0.1,
        reclaim_sample: 1024,
        ..MetaConfig::default()
    }
}

struct Fixture {
    index: Arc<MemoryIndex>,
    svc: Arc<MetaService>,
}

async fn setup(g: InstanceGroup, config: MetaConfig) -> Fixture {
    let index = Arc::new(MemoryIndex::new());
    let svc = MetaService::new(index.clone(), config).unwrap();
    svc.put_storage(storage()).unwrap();
    svc.put_group(g).unwrap();
    svc.register_instance(instance("i")).await.unwrap();
    Fixture {
        index,
        svc: Arc::new(svc),
    }
}

fn keys(r: std::ops::Range<u64>) -> Vec<BlockKey> {
    r.map(BlockKey).collect()
}

/// Writes `ks` in one request and serves them all.
async fn write(svc: &MetaService, ks: &[BlockKey]) {
    let grant = svc.start_write_cache("i", ks).await.unwrap();
    assert_eq!(grant.blocks.len(), ks.len(), "all keys granted");
    let ok = vec![true; grant.blocks.len()];
    svc.finish_write_cache("i", grant.session, &ok)
        .await
        .unwrap();
}

/// Sets the access statistics of `key` directly in the index.
fn set_stats(index: &MemoryIndex, key: BlockKey, last_access_ms: u64, access_count: u32) {
    index
        .modify("i", &[key], &mut |_, cur| match cur {
            Some(mut m) => {
                m.last_access_ms = last_access_ms;
                m.access_count = access_count;
                Modify::Put(m)
            }
            None => Modify::Keep,
        })
        .unwrap();
}

/// Keys of `candidates` with a serving location.
async fn serving(svc: &MetaService, candidates: &[BlockKey]) -> BTreeSet<u64> {
    let q = LocationQuery {
        keys: candidates.to_vec(),
        mode: MatchMode::Keys,
        mask: BlockMask::None,
    };
    let hit = svc.get_cache_location("i", &q).await.unwrap();
    candidates
        .iter()
        .zip(&hit.locations)
        .filter(|(_, l)| l.is_some())
        .map(|(k, _)| k.0)
        .collect()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[tokio::test]
async fn reclaim_brings_usage_under_the_watermark() {
    // high mark 50 blocks, low mark 40.
    let f = setup(group(100, 0.5, EvictionPolicy::Lru), config()).await;
    for c in 0..8u64 {
        write(&f.svc, &keys(c * 10..c * 10 + 10)).await;
    }
    assert_eq!(f.svc.group_usage("g").unwrap().total, 80 * BLOCK);
    let report = f.svc.reclaim_once().await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let usage = f.svc.group_usage("g").unwrap().total;
    assert!(usage <= 40 * BLOCK, "usage {usage} above the low mark");
    assert!(usage > 0, "reclaimed everything");
    let g = &report.groups["g"];
    assert_eq!(g.usage_before, 80 * BLOCK);
    assert_eq!(g.usage_after, usage);
    assert_eq!(g.blocks * BLOCK, 80 * BLOCK - usage);
    assert_eq!(g.bytes, g.blocks * BLOCK);
    assert!(g.batches >= 1 && g.sampled >= 80);
    assert_eq!(
        serving(&f.svc, &keys(0..80)).await.len() as u64,
        usage / BLOCK
    );
    // Below the high mark now: the next pass has nothing to do.
    let again = f.svc.reclaim_once().await;
    assert!(again.groups.is_empty(), "{again:?}");
    assert_eq!(f.svc.group_usage("g").unwrap().total, usage);
    let stats = f.svc.reclaim_stats();
    assert_eq!(stats.passes, 2);
    assert_eq!(stats.blocks, g.blocks);
    assert_eq!(stats.bytes, g.bytes);
}

/// Upstream's convention (its reclaim tests send 3.2): a watermark above 1
/// is never reached, since the quota refuses writes first.
#[tokio::test]
async fn a_watermark_above_one_never_reclaims_for_usage() {
    let f = setup(group(100, 3.2, EvictionPolicy::Lru), config()).await;
    for c in 0..10u64 {
        write(&f.svc, &keys(c * 10..c * 10 + 10)).await;
    }
    assert_eq!(
        f.svc.group_usage("g").unwrap().total,
        100 * BLOCK,
        "filled to quota"
    );
    let report = f.svc.reclaim_once().await;
    assert!(report.groups.is_empty(), "{report:?}");
    assert_eq!(serving(&f.svc, &keys(0..100)).await.len(), 100);
    // Lowered to an ordinary watermark, the same group is reclaimed.
    f.svc
        .put_group(group(100, 0.5, EvictionPolicy::Lru))
        .unwrap();
    f.svc.reclaim_once().await;
    assert!(f.svc.group_usage("g").unwrap().total <= 40 * BLOCK);
}

#[tokio::test]
async fn lru_reclaims_the_least_recently_used_and_spares_read_blocks() {
    let f = setup(group(100, 0.5, EvictionPolicy::Lru), config()).await;
    for k in 0..60u64 {
        write(&f.svc, &[BlockKey(k)]).await; // one per request: depth 0
    }
    // Key k was last used k seconds after an hour ago: 0 is the oldest.
    let base = now_ms() - 3_600_000;
    for k in 0..60u64 {
        set_stats(&f.index, BlockKey(k), base + k * 1000, 1);
    }
    // Reading 0..10 makes them the most recent.
    assert_eq!(serving(&f.svc, &keys(0..10)).await.len(), 10);
    f.svc.reclaim_once().await;
    // 60 -> 40 blocks: the 20 oldest unread ones, 10..30, go.
    let expected: BTreeSet<u64> = (0..10).chain(30..60).collect();
    assert_eq!(serving(&f.svc, &keys(0..60)).await, expected);
}

#[tokio::test]
async fn lfu_reclaims_the_least_frequently_used() {
    let f = setup(group(100, 0.5, EvictionPolicy::Lfu), config()).await;
    for k in 0..60u64 {
        write(&f.svc, &[BlockKey(k)]).await;
    }
    // Counts are a permutation of 0..60 unrelated to key order; recency
    // runs the other way (the most used is the oldest), so LRU would
    // choose differently.
    let base = now_ms() - 3_600_000;
    let count = |k: u64| (k * 7 % 60) as u32;
    for k in 0..60u64 {
        set_stats(&f.index, BlockKey(k), base + u64::from(count(k)), count(k));
    }
    f.svc.reclaim_once().await;
    let expected: BTreeSet<u64> = (0..60).filter(|&k| count(k) >= 20).collect();
    assert_eq!(serving(&f.svc, &keys(0..60)).await, expected);
}

#[tokio::test]
async fn ttl_reclaims_idle_blocks_below_the_watermark() {
    let ttl = EvictionPolicy::Ttl { ttl_secs: 60 };
    let f = setup(group(1000, 0.9, ttl), config()).await;
    write(&f.svc, &keys(0..30)).await;
    let now = now_ms();
    for k in 0..30u64 {
        // Every third block idle for two minutes; the rest recent.
        let last = if k % 3 == 0 { now - 120_000 } else { now };
        set_stats(&f.index, BlockKey(k), last, 1);
    }
    let report = f.svc.reclaim_once().await;
    assert_eq!(report.groups["g"].expired, 10);
    let expected: BTreeSet<u64> = (0..30).filter(|k| k % 3 != 0).collect();
    assert_eq!(serving(&f.svc, &keys(0..30)).await, expected);
    assert_eq!(f.svc.group_usage("g").unwrap().total, 20 * BLOCK);
}

#[tokio::test]
async fn leaves_go_before_parents() {
    // Small batches, so the order holds across batches too.
    let config = MetaConfig {
        reclaim_batch: 4,
        ..config()
    };
    // high mark 30 blocks, low mark 20.
    let f = setup(group(100, 0.3, EvictionPolicy::Lru), config).await;
    let chain: Vec<BlockKey> = (0..50u64).map(|i| BlockKey(1_000_003 * (50 - i))).collect();
    write(&f.svc, &chain).await;
    let depths: Vec<u32> = f
        .svc
        .get_cache_meta("i", &chain)
        .await
        .unwrap()
        .iter()
        .map(|m| m.as_ref().map_or(u32::MAX, |m| m.depth))
        .collect();
    assert_eq!(depths, (0..50).collect::<Vec<u32>>());
    let report = f.svc.reclaim_once().await;
    assert!(report.groups["g"].batches > 1);
    // Same recency everywhere: the 30 deepest go, the chain's first 20 stay.
    let left = serving(&f.svc, &chain).await;
    let expected: BTreeSet<u64> = chain[..20].iter().map(|k| k.0).collect();
    assert_eq!(left, expected);
    // A prefix query touches a parent with each child; the prefix read
    // first stays, and what goes still goes deepest first.
    let hit = f
        .svc
        .get_cache_location("i", &LocationQuery::prefix(chain[..5].to_vec()))
        .await
        .unwrap();
    assert_eq!(hit.matched, 5);
    f.svc
        .put_group(group(100, 0.15, EvictionPolicy::Lru))
        .unwrap();
    f.svc.reclaim_once().await;
    // 20 -> at most 5 blocks (low mark 0.05): the read prefix.
    let left = serving(&f.svc, &chain).await;
    let expected: BTreeSet<u64> = chain[..5].iter().map(|k| k.0).collect();
    assert_eq!(left, expected);
}

#[tokio::test]
async fn writing_locations_are_never_reclaimed() {
    // high mark 50 blocks, low mark 40: unreachable with 60 writing.
    let f = setup(group(100, 0.5, EvictionPolicy::Lru), config()).await;
    write(&f.svc, &keys(0..10)).await;
    let pending = f.svc.start_write_cache("i", &keys(100..160)).await.unwrap();
    assert_eq!(pending.blocks.len(), 60);
    assert_eq!(f.svc.group_usage("g").unwrap().total, 70 * BLOCK);
    let report = f.svc.reclaim_once().await;
    assert_eq!(report.groups["g"].blocks, 10);
    assert_eq!(f.svc.group_usage("g").unwrap().total, 60 * BLOCK);
    let metas = f.svc.get_cache_meta("i", &keys(100..160)).await.unwrap();
    assert!(metas.iter().all(|m| {
        m.as_ref().is_some_and(|m| {
            m.locations.len() == 1 && m.locations[0].status == LocationStatus::Writing
        })
    }));
    let done = f
        .svc
        .finish_write_cache("i", pending.session, &[true; 60])
        .await
        .unwrap();
    assert_eq!(done.served, 60);
    assert_eq!(serving(&f.svc, &keys(100..160)).await.len(), 60);
}

#[tokio::test]
async fn runtime_changes_apply_on_the_next_pass() {
    let f = setup(group(100, 0.9, EvictionPolicy::Lru), config()).await;
    for k in 0..60u64 {
        write(&f.svc, &[BlockKey(k)]).await;
    }
    let base = now_ms() - 3_600_000;
    // The most used blocks are the oldest: LRU and LFU disagree.
    for k in 0..60u64 {
        set_stats(&f.index, BlockKey(k), base + k * 1000, 100 - k as u32);
    }
    // 60 blocks under a 90-block high mark: nothing to do.
    assert!(f.svc.reclaim_once().await.groups.is_empty());
    assert_eq!(f.svc.group_usage("g").unwrap().total, 60 * BLOCK);
    // Lower watermark: 60 -> 40, the oldest (0..20) go.
    f.svc
        .put_group(group(100, 0.5, EvictionPolicy::Lru))
        .unwrap();
    f.svc.reclaim_once().await;
    let expected: BTreeSet<u64> = (20..60).collect();
    assert_eq!(serving(&f.svc, &keys(0..60)).await, expected);
    // Smaller quota and LFU: 40 -> 20 (0.5 - 0.1 of 50), the least used
    // (the newest, 40..60) go.
    f.svc
        .put_group(group(50, 0.5, EvictionPolicy::Lfu))
        .unwrap();
    f.svc.reclaim_once().await;
    let expected: BTreeSet<u64> = (20..40).collect();
    assert_eq!(serving(&f.svc, &keys(0..60)).await, expected);
    assert_eq!(f.svc.group_usage("g").unwrap().total, 20 * BLOCK);
}

#[tokio::test]
async fn background_reclaimer_runs_and_stops_with_its_handle() {
    let f = setup(group(100, 0.5, EvictionPolicy::Lru), config()).await;
    write(&f.svc, &keys(0..80)).await;
    let handle = f.svc.spawn_reclaimer(Duration::from_millis(5), None);
    // Poll with a deadline (the reclaimer runs on its own schedule).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while f.svc.group_usage("g").unwrap().total > 40 * BLOCK {
        assert!(
            std::time::Instant::now() < deadline,
            "reclaimer did not run"
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(handle);
    assert!(f.svc.reclaim_stats().passes >= 1);
}

#[tokio::test]
async fn reads_buffer_access_statistics_until_a_flush() {
    let f = setup(group(100, 0.9, EvictionPolicy::Lru), config()).await;
    write(&f.svc, &keys(0..4)).await;
    let before = f.index.get("i", &keys(0..4)).unwrap();
    for _ in 0..3 {
        assert_eq!(serving(&f.svc, &keys(0..2)).await.len(), 2);
    }
    // No index write per read.
    assert_eq!(f.index.get("i", &keys(0..4)).unwrap(), before);
    assert_eq!(f.svc.pending_access(), 6);
    assert_eq!(f.svc.flush_access().unwrap(), 2);
    assert_eq!(f.svc.pending_access(), 0);
    let after = f.index.get("i", &keys(0..4)).unwrap();
    for (k, (b, a)) in before.iter().zip(&after).enumerate() {
        let (b, a) = (b.as_ref().unwrap(), a.as_ref().unwrap());
        let reads = if k < 2 { 3 } else { 0 };
        assert_eq!(a.access_count, b.access_count + reads, "key {k}");
        assert!(a.last_access_ms >= b.last_access_ms);
    }
}

#[tokio::test]
async fn cached_reads_see_removal_trim_reclaim_and_timeout() {
    let config = MetaConfig {
        session_timeout: Duration::ZERO,
        ..config()
    };
    let f = setup(group(100, 0.9, EvictionPolicy::Lru), config).await;
    let ks = keys(0..10);
    write(&f.svc, &ks).await;
    assert_eq!(serving(&f.svc, &ks).await.len(), 10);
    assert!(f.svc.search_cache_len() >= 10, "reads fill the cache");
    f.svc.remove_cache("i", &ks[..2]).await.unwrap();
    assert_eq!(serving(&f.svc, &ks).await, (2..10).collect());
    f.svc
        .trim_cache("i", TrimPolicy::Lru { keep: 6 })
        .await
        .unwrap();
    assert_eq!(serving(&f.svc, &ks).await.len(), 6);
    f.svc
        .put_group(group(10, 0.3, EvictionPolicy::Lru))
        .unwrap();
    f.svc.reclaim_once().await;
    assert_eq!(serving(&f.svc, &ks).await.len(), 2);
    // A re-write of a removed key is seen, and its timeout too.
    let g = f.svc.start_write_cache("i", &ks[..1]).await.unwrap();
    assert_eq!(serving(&f.svc, &ks[..1]).await.len(), 0);
    assert_eq!(f.svc.reap_expired(None).await.unwrap(), 1);
    assert!(matches!(
        f.svc.finish_write_cache("i", g.session, &[true]).await,
        Err(MetaError::SessionNotFound(_))
    ));
    assert_eq!(serving(&f.svc, &ks[..1]).await.len(), 0);
}

#[derive(Debug, Clone)]
enum Op {
    /// Start and finish with these outcomes.
    Write(Vec<u8>, Vec<bool>),
    /// Start and leave open.
    Start(Vec<u8>),
    /// Finish the open session with this index, all succeeding or not.
    Finish(usize, bool),
    Remove(Vec<u8>),
    TrimAll,
    TrimLru(usize),
    /// Reclaim with this watermark (percent of a 12-block quota).
    Reclaim(u8),
    /// Expire every open session (the timeout is 0).
    Timeout,
    /// A prefix match, compared too.
    Prefix(Vec<u8>),
}

const KEYS: u8 = 12;

fn key_list() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(0..KEYS, 1..6)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (key_list(), proptest::collection::vec(any::<bool>(), 6))
            .prop_map(|(k, ok)| Op::Write(k, ok)),
        1 => key_list().prop_map(Op::Start),
        1 => (0usize..4, any::<bool>()).prop_map(|(i, ok)| Op::Finish(i, ok)),
        2 => key_list().prop_map(Op::Remove),
        1 => Just(Op::TrimAll),
        1 => (0usize..8).prop_map(Op::TrimLru),
        1 => (10u8..90).prop_map(Op::Reclaim),
        1 => Just(Op::Timeout),
        3 => key_list().prop_map(Op::Prefix),
    ]
}

fn bk(ks: &[u8]) -> Vec<BlockKey> {
    ks.iter().map(|&k| BlockKey(u64::from(k))).collect()
}

/// Every read through the cached service equals the same read through an
/// uncached service over the same index.
async fn compare(cached: &MetaService, plain: &MetaService, q: &LocationQuery) {
    let a = cached.get_cache_location("i", q).await.unwrap();
    let b = plain.get_cache_location("i", q).await.unwrap();
    assert_eq!(a, b, "cached vs uncached for {q:?}");
}

async fn run_ops(ops: Vec<Op>) {
    let config = MetaConfig {
        session_timeout: Duration::ZERO,
        ..config()
    };
    let f = setup(group(u64::from(KEYS), 0.9, EvictionPolicy::Lru), config).await;
    // A second frontend over the same index, without cache or statistics:
    // the reference answer. Made before any block exists, so its startup
    // recovery changes nothing.
    let plain = MetaService::new(
        f.index.clone(),
        MetaConfig {
            search_cache_entries: 0,
            record_access: false,
            ..MetaConfig::default()
        },
    )
    .unwrap();
    let all = LocationQuery {
        keys: bk(&(0..KEYS).collect::<Vec<_>>()),
        mode: MatchMode::Keys,
        mask: BlockMask::None,
    };
    let svc = &f.svc;
    let mut open: Vec<(SessionId, usize)> = Vec::new();
    for op in ops {
        match op {
            Op::Write(ks, ok) => {
                if let Ok(g) = svc.start_write_cache("i", &bk(&ks)).await {
                    let flags: Vec<bool> =
                        ok.iter().cycle().take(g.blocks.len()).copied().collect();
                    let _ = svc.finish_write_cache("i", g.session, &flags).await;
                }
            }
            Op::Start(ks) => {
                if let Ok(g) = svc.start_write_cache("i", &bk(&ks)).await {
                    open.push((g.session, g.blocks.len()));
                }
            }
            Op::Finish(i, ok) => {
                if !open.is_empty() {
                    let (session, len) = open.remove(i % open.len());
                    // Unknown if the session timed out meanwhile.
                    let _ = svc.finish_write_cache("i", session, &vec![ok; len]).await;
                }
            }
            Op::Remove(ks) => {
                svc.remove_cache("i", &bk(&ks)).await.unwrap();
            }
            Op::TrimAll => {
                svc.trim_cache("i", TrimPolicy::All).await.unwrap();
            }
            Op::TrimLru(keep) => {
                svc.trim_cache("i", TrimPolicy::Lru { keep }).await.unwrap();
            }
            Op::Reclaim(pct) => {
                svc.put_group(group(
                    u64::from(KEYS),
                    f64::from(pct) / 100.0,
                    EvictionPolicy::Lru,
                ))
                .unwrap();
                let r = svc.reclaim_once().await;
                assert!(r.errors.is_empty(), "{:?}", r.errors);
            }
            Op::Timeout => {
                svc.reap_expired(None).await.unwrap();
                open.clear();
            }
            Op::Prefix(ks) => {
                compare(svc, &plain, &LocationQuery::prefix(bk(&ks))).await;
            }
        }
        compare(svc, &plain, &all).await;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn search_cache_never_serves_what_the_index_does_not(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(run_ops(ops));
    }
}

/// Readers filling the cache race a writer that writes and removes the same
/// keys: once a removal is acknowledged, no read returns the removed
/// locations, whatever fills were in flight (the epoch check).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_fills_never_resurrect_a_removal() {
    let f = setup(group(1000, 0.9, EvictionPolicy::Lru), config()).await;
    let ks = keys(0..8);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let svc = f.svc.clone();
            let ks = ks.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    serving(&svc, &ks).await;
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for round in 0..300 {
        write(&f.svc, &ks).await;
        f.svc.remove_cache("i", &ks).await.unwrap();
        assert!(
            serving(&f.svc, &ks).await.is_empty(),
            "round {round}: a removed location was served"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        r.await.unwrap();
    }
}
