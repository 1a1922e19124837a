//! The optimizer predicts the node: for every policy the node runs and
//! every tier layout, the optimizer's replay (`kvtier-sim`) and the trace
//! bench (a real block manager on the node's own path, G2 on top, over
//! real tiers with real bytes and the node's default disk log) find hit
//! rates within half a point of each other, on both shared Mooncake traces
//! and on random traces.
//!
//! Both run the same policy implementations (`kvtier-policy`) with the same
//! leaf-first filter, on the trace's clock; what differs is everything
//! else: the manager's pools, onboarding, transfers, cascade and
//! bookkeeping against the replay's arrays. The test fails (does not skip)
//! when `../shared` is missing.

use std::path::{Path, PathBuf};

use kvtier_bench::trace::{self as trace_bench, TraceBenchConfig};
use kvtier_manager::Tier;
use kvtier_policy::PolicyKind;
use kvtier_sim::replay::{ReplayConfig, TierSpec, replay};

const TRACES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/traces");

/// Most allowed difference, in hit-rate points.
const TOLERANCE_POINTS: f64 = 0.5;

/// Idle time of the TTL policy, trace milliseconds: short enough that
/// blocks expire within the requests replayed.
const TTL_MS: u64 = 20_000;

/// The node's tiers, fastest first: the layouts below size them in order.
const NODE_TIERS: [Tier; 3] = [Tier::G2, Tier::G3, Tier::G4];

/// Tier layouts for the Mooncake traces, blocks of G2, G3 and G4: their
/// reuse is minutes apart, so tiers of thousands of blocks over 2,000
/// requests (about 50,000 blocks) give hit rates that differ by policy,
/// and every tier evicts. Requests are cut to G2's size on both sides.
const TRACE_LAYOUTS: [&[usize]; 4] = [
    &[1024],
    &[1024, 2048],
    &[1024, 2048, 4096],
    &[2048, 2048, 4096],
];

/// Tier layouts for the random traces, whose conversations come back
/// within a few hundred blocks.
const RANDOM_LAYOUTS: [&[usize]; 4] = [&[64], &[64, 192], &[64, 128, 256], &[128, 128, 256]];

/// The hit rates of one configuration on both sides.
#[derive(Debug)]
struct Rates {
    bench: f64,
    replay: f64,
    bench_per_tier: Vec<u64>,
    replay_per_tier: Vec<u64>,
    /// Blocks dropped from the last tier or expired, on each side.
    dropped: (u64, u64),
}

async fn compare(trace: &Path, requests: usize, policy: PolicyKind, caps: &[usize]) -> Rates {
    let config = TraceBenchConfig {
        trace: trace.to_path_buf(),
        requests: Some(requests),
        layers: 1,
        layer_bytes: 4096,
        g2_blocks: caps[0],
        g3_blocks: caps.get(1).copied().unwrap_or(0),
        g4_blocks: caps.get(2).copied().unwrap_or(0),
        // The node's default log: it wraps (checked below), and the G3
        // pool stays its one eviction authority, as the replay models it.
        policy,
        ttl_ms: TTL_MS,
        ..TraceBenchConfig::default()
    };
    let report = trace_bench::run(&config).await.expect("trace bench");
    assert_eq!(report.verify_failures, 0, "bytes served wrong");
    assert_eq!(
        report.stats.reclaimed_by_disk, 0,
        "{policy} {caps:?}: the disk log dropped blocks the G3 pool held"
    );
    assert_eq!(
        report.stats.lost_by_disk, 0,
        "{policy} {caps:?}: re-insertions failed"
    );
    assert_eq!(
        report.onboard_failures, 0,
        "{policy} {caps:?}: lookups said hit, then onboarding missed"
    );
    if let Some(d) = &report.disk {
        // The log wraps, several times over: every region reclaimed at
        // least twice. Not under TTL: expiry empties the pools above, so
        // far fewer blocks reach G3, and on the Mooncake traces the log
        // fills a fraction of once or not at all (on the random traces it
        // wraps under TTL too).
        if policy != PolicyKind::Ttl {
            assert!(
                d.regions_reclaimed >= 2 * d.regions,
                "{policy} {caps:?}: the log did not wrap: {d:?}"
            );
        }
    }
    let bench_hits: Vec<u64> = report.hits.iter().map(|(_, h)| *h).collect();

    // The replay sees what the bench serves: requests cut to G2's size.
    let mut reqs = kvtier_sim::trace::read_all(trace, None).expect("trace");
    reqs.truncate(requests);
    for r in &mut reqs {
        r.keys.truncate(caps[0]);
    }
    let tiers = caps
        .iter()
        .zip(NODE_TIERS)
        .map(|(c, t)| TierSpec::new(t.to_string(), *c as u64))
        .collect();
    let cfg = ReplayConfig::tiered(policy, tiers).with_ttl_ms(TTL_MS);
    let r = replay(&reqs, &cfg);
    assert_eq!(r.requested_blocks, report.blocks, "same blocks requested");
    Rates {
        bench: bench_hits.iter().sum::<u64>() as f64 / report.blocks as f64,
        replay: r.hit_rate,
        bench_per_tier: bench_hits,
        replay_per_tier: r.tier_hit_blocks,
        dropped: (report.stats.dropped, r.dropped_blocks),
    }
}

/// Runs every node policy on every layout over `requests` requests of
/// `trace`, and fails listing every configuration that disagrees.
async fn agree_on(trace: &Path, requests: usize, layouts: &[&[usize]]) {
    assert!(
        trace.exists(),
        "trace missing at {} (../shared must be checked out next to the repository)",
        trace.display()
    );
    let mut failures = Vec::new();
    for policy in PolicyKind::NODE {
        for &caps in layouts {
            let rates = compare(trace, requests, policy, caps).await;
            let gap = (rates.bench - rates.replay).abs() * 100.0;
            println!(
                "{policy:>10} {caps:?}: bench {:.4} {:?}, replay {:.4} {:?}, gap {gap:.3} points, dropped {:?}",
                rates.bench,
                rates.bench_per_tier,
                rates.replay,
                rates.replay_per_tier,
                rates.dropped
            );
            assert!(rates.bench > 0.0, "{policy} {caps:?}: nothing hit");
            if gap > TOLERANCE_POINTS {
                failures.push(format!("{policy} {caps:?}: {rates:?}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "disagreements:\n{}",
        failures.join("\n")
    );
}

// The trace bench moves real bytes through real tiers for every block of
// 24 runs per trace: a minute or two in a release build, many minutes in
// a debug one. `.ci/test` runs these in release (`cargo test --release -p
// kvtier-bench --test agreement`); a debug `cargo test` lists them as
// ignored, with the reason.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    debug_assertions,
    ignore = "needs a release build: .ci/test runs it with --release"
)]
async fn conversation_trace() {
    let trace = PathBuf::from(TRACES).join("mooncake_conversation_trace.jsonl");
    agree_on(&trace, 2000, &TRACE_LAYOUTS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    debug_assertions,
    ignore = "needs a release build: .ci/test runs it with --release"
)]
async fn synthetic_trace() {
    let trace = PathBuf::from(TRACES).join("mooncake_synthetic_trace.jsonl");
    agree_on(&trace, 2000, &TRACE_LAYOUTS).await;
}

/// The random trace `seed` (kvtier-sim's generator, as `kvtier trace
/// random` writes it) in a temporary file.
fn random_trace(seed: u64, requests: usize) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    kvtier_sim::trace::random::write_mooncake(&mut file, seed, requests).expect("write trace");
    file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    debug_assertions,
    ignore = "needs a release build: .ci/test runs it with --release"
)]
async fn random_traces() {
    for seed in [1, 2] {
        let trace = random_trace(seed, 1000);
        agree_on(trace.path(), 1000, &RANDOM_LAYOUTS).await;
    }
}
