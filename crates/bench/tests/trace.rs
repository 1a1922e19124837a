//! `kvtier bench trace` on the real conversation trace, in a debug build:
//! the manager serves every request with real bytes, verifies every
//! onboarded block, never evicts by allocation (room is made ahead), and
//! finds the hits, per tier, and the drops the optimizer's replay predicts
//! for LRU (the replay itself is held to a plain model in `kvtier-sim`'s
//! tests; every policy and layout, in release: `tests/agreement.rs`).
//!
//! Configuration: exclusive cascade, LRU in every tier, admission off
//! (`admit_after` 0), no watermark pre-offload; the node's tiers, G2 on
//! top large enough for the longest request (256 blocks), G3 2048 blocks,
//! so both tiers evict and G3 drops (a second run adds G4, in a directory,
//! below G3). The test fails (does not skip) when `../shared` is missing.

use std::path::PathBuf;

use kvtier_bench::trace::{self as trace_bench, TraceBenchConfig};
use kvtier_manager::Tier;
use kvtier_manager::placement::CascadeMode;
use kvtier_manager::policy::PolicyKind;
use kvtier_sim::replay::{ReplayConfig, TierSpec, replay};

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/traces/mooncake_conversation_trace.jsonl"
);

/// The node's tiers, fastest first.
const NODE_TIERS: [Tier; 3] = [Tier::G2, Tier::G3, Tier::G4];

/// Runs the bench and the replay over the first `requests` requests with
/// tier capacities `caps` (G2, G3 and, when given, G4 in a directory)
/// and checks they agree block for block.
async fn bench_equals_replay(requests: usize, caps: &[usize]) {
    let trace = PathBuf::from(TRACE);
    assert!(
        trace.exists(),
        "the conversation trace is missing at {} (../shared must be checked out next to the repository)",
        trace.display()
    );
    let config = TraceBenchConfig {
        trace: trace.clone(),
        requests: Some(requests),
        layers: 2,
        layer_bytes: 4096,
        g2_blocks: caps[0],
        g3_blocks: caps[1],
        g4_blocks: caps.get(2).copied().unwrap_or(0),
        policy: PolicyKind::Lru,
        mode: CascadeMode::Exclusive,
        admit_after: 0,
        watermarks: None,
        ..TraceBenchConfig::default()
    };
    let report = trace_bench::run(&config).await.expect("trace bench");

    let mut reqs = kvtier_sim::trace::read_all(&trace, None).expect("trace");
    reqs.truncate(requests);
    let tiers: Vec<TierSpec> = caps
        .iter()
        .zip(NODE_TIERS)
        .map(|(c, t)| TierSpec::new(t.to_string(), *c as u64))
        .collect();
    let predicted = replay(&reqs, &ReplayConfig::tiered(PolicyKind::Lru, tiers));

    let tiers = &NODE_TIERS[..caps.len()];
    assert_eq!(report.requests, requests);
    assert_eq!(report.truncated_blocks, 0, "G2 holds every request");
    assert_eq!(report.blocks, predicted.requested_blocks);
    let hits: Vec<(Tier, u64)> = tiers
        .iter()
        .copied()
        .zip(predicted.tier_hit_blocks.clone())
        .collect();
    assert_eq!(report.hits, hits, "hits per tier: manager vs replay");
    assert_eq!(
        report.misses,
        predicted.requested_blocks - predicted.hit_blocks,
        "misses"
    );
    assert!(
        predicted.tier_hit_blocks.iter().all(|h| *h > 0) && predicted.dropped_blocks > 0,
        "the configuration exercises every tier: {:?}, dropped {}",
        predicted.tier_hit_blocks,
        predicted.dropped_blocks
    );
    assert_eq!(
        report.stats.dropped, predicted.dropped_blocks,
        "blocks dropped from the last tier"
    );
    for t in tiers.iter().copied() {
        let s = report.stats.tier(t).expect("tier configured");
        // Room is always made ahead, so allocation never had to evict.
        assert_eq!(s.pool.evictions, 0, "{t} evictions by allocation");
    }
    assert_eq!(report.verify_failures, 0);
    assert_eq!(report.onboard_failures, 0);
    assert!(report.verified_blocks > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_hit_rates_equal_the_replay() {
    bench_equals_replay(300, &[256, 2048]).await;
}

/// The same with a fourth tier: G3 cascades into G4 (objects in a
/// directory through the remote tier) and G4 drops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_hit_rates_with_g4_equal_the_replay() {
    bench_equals_replay(300, &[256, 2048, 2048]).await;
}
