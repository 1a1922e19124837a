//! Bytes per block record, on disk and in memory, for each backend.
//! Ignored (slow); run one at a time, in release, so RSS deltas are clean:
//!
//! ```text
//! cargo test --release -p kvtier-meta --test footprint -- --ignored --nocapture memory
//! cargo test --release -p kvtier-meta --test footprint -- --ignored --nocapture redb
//! ```
//!
//! And the latency of a 1,024-key prefix match through the service, cold
//! and warm search cache, on both backends (`prefix_match_*`):
//!
//! ```text
//! cargo test --release -p kvtier-meta --test footprint -- --ignored --nocapture --test-threads 1 prefix_match
//! ```

use std::sync::Arc;
use std::time::Duration;

use kvtier_meta::{
    BlockKey, BlockMeta, CacheLocation, EvictionPolicy, Instance, InstanceGroup, LocationId,
    LocationQuery, LocationSpec, LocationSpecInfo, LocationStatus, MemoryIndex, MetaConfig,
    MetaIndex, MetaService, RedbIndex, Storage, StorageHealth, StorageKind,
};

const N: u64 = 1_000_000;
const BATCH: u64 = 10_000;

/// A record shaped like the service makes them: one serving location with
/// one spec on a kvtier node.
fn record(k: u64) -> BlockMeta {
    let key = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    BlockMeta {
        key: BlockKey(key),
        locations: vec![CacheLocation {
            id: LocationId(k + (1 << 40)),
            storage: "node-3".into(),
            kind: StorageKind::KvtierNode,
            status: LocationStatus::Serving,
            specs: vec![LocationSpec {
                name: "tp0".into(),
                uri: format!(
                    "kvtier://node-3/pool/llama/{key:016x}-{:x}/tp0",
                    k + (1 << 40)
                ),
                size: 2 << 20,
            }],
        }],
        last_access_ms: 1_760_000_000_000 + k,
        access_count: 1,
        depth: 0,
    }
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Mean time of one batch get of 1,024 present keys (a 64K-token prefix at
/// 64 tokens per block), over 200 batches.
fn get_1024(idx: &dyn MetaIndex) -> std::time::Duration {
    let mut total = std::time::Duration::ZERO;
    for b in 0..200u64 {
        let keys: Vec<BlockKey> = (0..1024u64)
            .map(|i| record((b * 4099 + i * 977) % N).key)
            .collect();
        let start = std::time::Instant::now();
        let got = idx.get("llama", &keys).unwrap();
        total += start.elapsed();
        assert!(got.iter().all(Option::is_some));
    }
    total / 200
}

fn fill(idx: &dyn MetaIndex) -> std::time::Duration {
    let start = std::time::Instant::now();
    for b in 0..N / BATCH {
        let batch: Vec<BlockMeta> = (b * BATCH..(b + 1) * BATCH).map(record).collect();
        idx.put("llama", &batch).unwrap();
    }
    start.elapsed()
}

#[test]
#[ignore]
fn footprint_memory() {
    let before = rss_bytes();
    let idx = MemoryIndex::new();
    let t = fill(&idx);
    let after = rss_bytes();
    assert_eq!(idx.count("llama").unwrap(), N);
    println!(
        "memory: {} B/block RSS, fill {:?}, get of 1024 keys {:?}",
        (after - before) / N,
        t,
        get_1024(&idx)
    );
}

#[test]
#[ignore]
fn footprint_redb() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.redb");
    let before = rss_bytes();
    let idx = RedbIndex::open(&path, 64 << 20).unwrap();
    let t = fill(&idx);
    let after = rss_bytes();
    assert_eq!(idx.count("llama").unwrap(), N);
    let disk = std::fs::metadata(&path).unwrap().len();
    println!(
        "redb: {} B/block on disk ({} MiB file), {} B/block RSS (64 MiB cache), fill {:?}, \
         get of 1024 keys {:?}",
        disk / N,
        disk >> 20,
        (after - before) / N,
        t,
        get_1024(&idx)
    );
}

/// A service over `idx` whose instance "llama" owns the records [`fill`]
/// makes (registered before the fill, so startup recovery has nothing to
/// scan).
fn service(idx: Arc<dyn MetaIndex>) -> MetaService {
    let svc = MetaService::new(idx, MetaConfig::default()).unwrap();
    svc.put_storage(Storage {
        name: "node-3".into(),
        kind: StorageKind::KvtierNode,
        uri: "kvtier://node-3/pool".into(),
        enabled: true,
        health: StorageHealth::Healthy,
        spec: None,
    })
    .unwrap();
    svc.put_group(InstanceGroup {
        name: "g".into(),
        quota_bytes: u64::MAX,
        kind_quota_bytes: Default::default(),
        watermark: 0.9,
        eviction: EvictionPolicy::Lru,
        storages: vec!["node-3".into()],
        max_instances: 1,
        ..Default::default()
    })
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(svc.register_instance(Instance {
        id: "llama".into(),
        group: "g".into(),
        model: "llama".into(),
        block_size: 64,
        location_specs: vec![LocationSpecInfo {
            name: "tp0".into(),
            size: 2 << 20,
        }],
        spec_groups: vec![],
    }))
    .unwrap();
    svc
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Prints p50 / p99 of 1,024-key prefix matches (all present, a 64K-token
/// prefix at 64 tokens per block), each batch first cold (not in the search
/// cache) then warm (repeated 4 times). Access statistics are buffered by
/// the reads and flushed between batches, outside the timed region, as the
/// background reclaimer does; the flush is timed separately.
fn prefix_match(name: &str, idx: Arc<dyn MetaIndex>) {
    let svc = service(idx.clone());
    fill(idx.as_ref());
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let (mut cold, mut warm, mut flush) = (Vec::new(), Vec::new(), Vec::new());
    for b in 0..300u64 {
        let keys: Vec<BlockKey> = (0..1024u64)
            .map(|i| record((b * 4099 + i * 977) % N).key)
            .collect();
        let q = LocationQuery::prefix(keys);
        for round in 0..5 {
            let start = std::time::Instant::now();
            let hit = rt.block_on(svc.get_cache_location("llama", &q)).unwrap();
            let t = start.elapsed();
            assert_eq!(hit.matched, 1024);
            if round == 0 {
                cold.push(t)
            } else {
                warm.push(t)
            }
        }
        let start = std::time::Instant::now();
        svc.flush_access().unwrap();
        flush.push(start.elapsed());
    }
    for v in [&mut cold, &mut warm, &mut flush] {
        v.sort();
    }
    println!(
        "{name}: prefix match of 1024 keys: cold p50 {:?} p99 {:?}; warm min {:?} p50 {:?} \
         p99 {:?}; access flush of 5x1024 hits p50 {:?} (off the read path); cache entries {}",
        percentile(&cold, 0.5),
        percentile(&cold, 0.99),
        percentile(&warm, 0.0),
        percentile(&warm, 0.5),
        percentile(&warm, 0.99),
        percentile(&flush, 0.5),
        svc.search_cache_len(),
    );
}

#[test]
#[ignore]
fn prefix_match_memory() {
    prefix_match("memory", Arc::new(MemoryIndex::new()));
}

#[test]
#[ignore]
fn prefix_match_redb() {
    let dir = tempfile::tempdir().unwrap();
    let idx = RedbIndex::open(dir.path().join("meta.redb"), 64 << 20).unwrap();
    prefix_match("redb", Arc::new(idx));
}

/// `used_memory` of the server, from `INFO memory`.
fn redis_used_memory(url: &str) -> u64 {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_connection().unwrap();
    let info: String = redis::cmd("INFO").arg("memory").query(&mut conn).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no used_memory in INFO memory: {info}"))
}

/// Bytes per block in Redis (`used_memory` delta over `N` records: record
/// string, sorted-set member, key names), with a server started by the test
/// (`redis-server` on `PATH`):
///
/// ```text
/// cargo test --release -p kvtier-meta --test footprint -- --ignored --nocapture footprint_redis
/// ```
#[test]
#[ignore]
fn footprint_redis() {
    let server = kvtier_meta::test_support::RedisServer::start()
        .unwrap_or_else(|e| panic!("cannot start redis-server: {e}"));
    let idx = kvtier_meta::RedisIndex::open(&server.url(), Default::default()).unwrap();
    let before = redis_used_memory(&server.url());
    let t = fill(&idx);
    let after = redis_used_memory(&server.url());
    assert_eq!(idx.count("llama").unwrap(), N);
    println!(
        "redis: {} B/block used_memory ({} MiB for {N} blocks), fill {:?}, get of 1024 keys {:?}",
        (after - before) / N,
        (after - before) >> 20,
        t,
        get_1024(&idx)
    );
}

/// [`prefix_match`] through the service on a `RedisIndex` (server started
/// by the test):
///
/// ```text
/// cargo test --release -p kvtier-meta --test footprint -- --ignored --nocapture prefix_match_redis
/// ```
#[test]
#[ignore]
fn prefix_match_redis() {
    let server = kvtier_meta::test_support::RedisServer::start()
        .unwrap_or_else(|e| panic!("cannot start redis-server: {e}"));
    let idx = kvtier_meta::RedisIndex::open(&server.url(), Default::default()).unwrap();
    prefix_match("redis", Arc::new(idx));
}
