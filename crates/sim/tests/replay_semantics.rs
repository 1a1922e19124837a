//! Replay semantics: the real conversation trace against an independent
//! LRU, multi-tier accounting, streaming equals in-memory, per-instance
//! caches, the leading-run rule and the statistics.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use kvtier_core::BlockHash;
use kvtier_sim::policy::PolicyKind;
use kvtier_sim::replay::{ReplayConfig, TierSpec, replay, replay_stream};
use kvtier_sim::trace::{self, Request, TraceError};

/// The project's shared traces sit beside the repository (`../shared`), in
/// development and in CI alike.
const CONVERSATION: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/traces/mooncake_conversation_trace.jsonl"
);

/// The first `n` requests of the conversation trace. A missing trace is a
/// failure, not a skip: the shared traces are part of the test setup.
fn conversation(n: usize) -> Vec<Request> {
    let path = Path::new(CONVERSATION);
    assert!(
        path.exists(),
        "{CONVERSATION} not found: ../shared must sit beside the repository"
    );
    trace::open(path, None)
        .unwrap()
        .take(n)
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
}

/// An LRU written independently: last-use tick per key plus a map ordered
/// by tick; per request, the leading run is counted first.
fn independent_lru_hits(reqs: &[Request], cap: usize) -> u64 {
    let mut tick_of: HashMap<(u32, u128), u64> = HashMap::new();
    let mut by_tick: BTreeMap<u64, (u32, u128)> = BTreeMap::new();
    let mut tick = 0u64;
    let mut hits = 0u64;
    for r in reqs {
        hits += r
            .keys
            .iter()
            .take_while(|k| tick_of.contains_key(&(r.instance, k.0)))
            .count() as u64;
        for k in &r.keys {
            let key = (r.instance, k.0);
            tick += 1;
            if let Some(old) = tick_of.insert(key, tick) {
                by_tick.remove(&old);
            }
            by_tick.insert(tick, key);
            while by_tick.len() > cap {
                let (_, victim) = by_tick.pop_first().unwrap();
                tick_of.remove(&victim);
            }
        }
    }
    hits
}

#[test]
fn conversation_trace_lru_matches_an_independent_lru() {
    let reqs = conversation(2000);
    for cap in [500u64, 4000] {
        // The plain policy: without the node's leaf-first filter, the
        // replay's LRU is the textbook one (requests are shorter than the
        // capacity, so making room first changes nothing).
        let cfg = ReplayConfig::single(PolicyKind::Lru, cap).with_leaf_first(false);
        let r = replay(&reqs, &cfg);
        let want = independent_lru_hits(&reqs, cap as usize);
        assert_eq!(r.hit_blocks, want, "capacity {cap}");
        let requested: u64 = reqs.iter().map(|r| r.keys.len() as u64).sum();
        assert_eq!(r.requested_blocks, requested);
        assert!((r.hit_rate - want as f64 / requested as f64).abs() < 1e-12);
        assert!(r.hit_blocks > 0);
    }
}

#[test]
fn streaming_equals_in_memory() {
    let reqs = conversation(1500);
    let cfg = ReplayConfig::single(PolicyKind::S3Fifo, 3000);
    let a = replay(&reqs, &cfg);
    let b = replay_stream(reqs.iter().cloned().map(Ok), &cfg).unwrap();
    assert_eq!(
        (a.hit_blocks, a.requested_blocks, a.accesses),
        (b.hit_blocks, b.requested_blocks, b.accesses)
    );
    assert_eq!(a.reuse_distance, b.reuse_distance);
    assert_eq!(a.access_frequency, b.access_frequency);
}

#[test]
fn belady_and_the_oracle_refuse_a_stream() {
    for policy in [
        PolicyKind::Belady,
        PolicyKind::OracleLru,
        PolicyKind::OracleHitDensity,
    ] {
        let cfg = ReplayConfig::single(policy, 10);
        assert!(matches!(
            replay_stream(std::iter::empty(), &cfg),
            Err(TraceError::Unsupported(_))
        ));
    }
}

#[test]
fn the_oracle_evicts_blocks_never_used_again_first_and_sits_between_lru_and_belady() {
    // A tier of 2: 1 and 2 come in; room for 3 (never used again) is made
    // before it enters, so both evict 1. When 4 comes, LRU evicts 2 (and
    // hits nothing); the oracle evicts 3, keeps 2 and hits it.
    let reqs = vec![
        req(0, 0, &[1]),
        req(1, 0, &[2]),
        req(2, 0, &[3]),
        req(3, 0, &[4]),
        req(4, 0, &[1]),
        req(5, 0, &[2]),
    ];
    let hits = |policy: PolicyKind| {
        let mut cfg = ReplayConfig::single(policy, 2);
        cfg.keep_outcomes = true;
        let r = replay(&reqs, &cfg);
        r.outcomes.iter().map(|o| o.hit_blocks).sum::<u32>()
    };
    assert_eq!(hits(PolicyKind::Lru), 0);
    assert_eq!(hits(PolicyKind::OracleLru), 1);
    assert_eq!(hits(PolicyKind::OracleHitDensity), 1);
    let conv = conversation(300);
    let rate = |policy: PolicyKind| replay(&conv, &ReplayConfig::single(policy, 40)).hit_rate;
    let (lru, oracle, belady) = (
        rate(PolicyKind::Lru),
        rate(PolicyKind::OracleLru),
        rate(PolicyKind::Belady),
    );
    assert!(lru <= oracle && oracle <= belady, "{lru} {oracle} {belady}");
    let density = rate(PolicyKind::OracleHitDensity);
    assert!(
        rate(PolicyKind::HitDensity) <= density && density <= belady,
        "{density} {belady}"
    );
}

fn two_tiers(policy: PolicyKind, fast: u64, slow: u64) -> ReplayConfig {
    let mut cfg = ReplayConfig::single(policy, fast);
    cfg.tiers.push(TierSpec {
        name: "G2".to_owned(),
        capacity_blocks: slow,
    });
    cfg.keep_outcomes = true;
    cfg
}

#[test]
fn two_tiers_hit_at_least_the_first_tier_alone_and_add_up() {
    let reqs = conversation(2000);
    for policy in PolicyKind::ALL {
        let single = replay(&reqs, &ReplayConfig::single(policy, 1000));
        let tiered = replay(&reqs, &two_tiers(policy, 1000, 3000));
        assert_eq!(tiered.capacity, 4000);
        assert_eq!(
            tiered.tier_hit_blocks.iter().sum::<u64>(),
            tiered.hit_blocks,
            "{policy}"
        );
        let from_outcomes: u64 = tiered
            .outcomes
            .iter()
            .map(|o| u64::from(o.hit_blocks))
            .sum();
        assert_eq!(from_outcomes, tiered.hit_blocks);
        for o in &tiered.outcomes {
            assert_eq!(o.hit_blocks_per_tier.iter().sum::<u32>(), o.hit_blocks);
        }
        assert!(tiered.tier_hit_blocks[1] > 0, "{policy}: nothing hit in G2");
        if policy == PolicyKind::Lru {
            // Exclusive LRU tiers behave as one LRU of the total size.
            let big = replay(&reqs, &ReplayConfig::single(policy, 4000));
            assert_eq!(tiered.hit_blocks, big.hit_blocks);
        }
        // The inclusion property holds for LRU-like stacks; for the others
        // it holds on this trace, which is what the test pins.
        assert!(
            tiered.hit_blocks >= single.hit_blocks,
            "{policy}: {} < {}",
            tiered.hit_blocks,
            single.hit_blocks
        );
    }
}

fn req(t: u64, instance: u32, keys: &[u128]) -> Request {
    Request {
        timestamp_ms: t,
        instance,
        input_tokens: keys.len() as u32 * 16,
        output_tokens: 1,
        keys: keys.iter().copied().map(BlockHash).collect(),
        tokens_per_block: 16,
        last_block_tokens: 16,
    }
}

#[test]
fn hits_are_the_leading_run_and_instances_do_not_share() {
    let reqs = vec![
        req(0, 0, &[1, 2, 3]),
        // Block 1 is new: 2 and 3 are cached but follow a miss.
        req(1, 0, &[9, 2, 3]),
        req(2, 0, &[1, 2, 4]),
        // Same keys on another instance: a miss.
        req(3, 1, &[1, 2, 3]),
    ];
    let mut cfg = ReplayConfig::single(PolicyKind::Lru, 100);
    cfg.keep_outcomes = true;
    let r = replay(&reqs, &cfg);
    let hits: Vec<u32> = r.outcomes.iter().map(|o| o.hit_blocks).collect();
    assert_eq!(hits, vec![0, 0, 2, 0]);
    assert_eq!(r.outcomes[2].hit_tokens, 32);
    assert_eq!(r.requests, 4);
    assert_eq!(r.accesses, 12);
    assert_eq!(r.access_frequency.total, 8); // distinct (instance, key) pairs
}

#[test]
fn ttl_drops_idle_blocks_at_the_request_time() {
    let reqs = vec![
        req(0, 0, &[1, 2]),
        req(50, 0, &[1, 2]),
        req(200, 0, &[1, 2]),
    ];
    let mut cfg = ReplayConfig::single(PolicyKind::Ttl, 100);
    cfg.ttl_ms = Some(100);
    cfg.keep_outcomes = true;
    let hits: Vec<u32> = replay(&reqs, &cfg)
        .outcomes
        .iter()
        .map(|o| o.hit_blocks)
        .collect();
    assert_eq!(hits, vec![0, 2, 0]);
}

#[test]
fn timeline_covers_the_trace() {
    let reqs = conversation(3000);
    let cfg = ReplayConfig::single(PolicyKind::Lru, 5000);
    let r = replay(&reqs, &cfg);
    assert!(!r.timeline.is_empty() && r.timeline.len() <= cfg.timeline_points);
    let last = r.timeline.last().unwrap();
    assert_eq!(last.requests, r.requests);
    assert!((last.cumulative_hit_rate - r.hit_rate).abs() < 1e-12);
    assert!(
        r.timeline
            .windows(2)
            .all(|w| w[0].t_ms < w[1].t_ms && w[0].requests < w[1].requests)
    );
    let s = replay_stream(reqs.iter().cloned().map(Ok), &cfg).unwrap();
    assert!(!s.timeline.is_empty() && s.timeline.len() <= cfg.timeline_points);
    assert_eq!(s.timeline.last().unwrap().requests, r.requests);
    assert_eq!(
        r.reuse_distance.total + r.access_frequency.total,
        r.accesses
    );
    assert!(
        r.reuse_distance
            .buckets
            .windows(2)
            .all(|w| w[1].0 == 2 * w[0].0)
    );
}

#[test]
fn streaming_from_the_file_equals_reading_it_all() {
    let path = Path::new(CONVERSATION);
    assert!(path.exists(), "{CONVERSATION} not found");
    let cfg = ReplayConfig::single(PolicyKind::Arc, 20_000);
    let a = replay(&trace::read_all(path, None).unwrap(), &cfg);
    let b = replay_stream(trace::open(path, None).unwrap(), &cfg).unwrap();
    assert_eq!(a.requests, 12_031);
    assert_eq!(
        (a.hit_blocks, a.requested_blocks),
        (b.hit_blocks, b.requested_blocks)
    );
}

#[test]
fn a_stream_error_stops_the_replay() {
    let items = vec![
        Ok(req(0, 0, &[1])),
        Err(TraceError::Parse {
            line: 2,
            message: "bad".to_owned(),
        }),
    ];
    let err =
        replay_stream(items.into_iter(), &ReplayConfig::single(PolicyKind::Lru, 4)).unwrap_err();
    assert!(matches!(err, TraceError::Parse { line: 2, .. }));
}

#[test]
fn config_deserializes_with_defaults() {
    let cfg: ReplayConfig = serde_json::from_str(
        r#"{"policy": "random-lru", "tiers": [{"name": "G2", "capacity_blocks": 7}]}"#,
    )
    .unwrap();
    assert_eq!(
        cfg,
        ReplayConfig::tiered(PolicyKind::RandomLru, vec![TierSpec::new("G2", 7)])
    );
    assert_eq!(cfg.timeline_points, 50);
    assert_eq!(cfg.capacity(), 7);
}
