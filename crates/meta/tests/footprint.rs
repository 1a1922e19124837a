//! Bytes per block record, on disk and in memory, for each backend.
//! Ignored (slow); run one at a time, in release, so RSS deltas are clean:
//!
//! ```text
//! cargo test --release -p kvtier-meta --test footprint -- --ignored --nocapture memory
//! cargo test --release -p kvtier-meta --test footprint -- --ignored --nocapture redb
//! ```

use kvtier_meta::{
    BlockKey, BlockMeta, CacheLocation, LocationId, LocationSpec, LocationStatus, MemoryIndex,
    MetaIndex, RedbIndex, StorageKind,
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
