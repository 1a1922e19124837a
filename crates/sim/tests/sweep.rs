//! Sweeps: grid shape and order, and the search's choice.

use kvtier_core::{BlockHash, ModelPreset};
use kvtier_sim::model::{GpuKind, ModelSpec, ServingModel};
use kvtier_sim::policy::PolicyKind;
use kvtier_sim::replay::{ReplayConfig, TierSpec};
use kvtier_sim::sweep::{self, Grid, Point, Target, select, tier_candidates};
use kvtier_sim::trace::Request;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `rounds` passes over `docs` documents of `blocks` blocks each, in
/// order: LRU hits every block of a pass but the first once the capacity
/// holds all `docs x blocks` blocks, and nothing below that.
fn cyclic_trace(docs: u64, blocks: u64, rounds: u64) -> Vec<Request> {
    let mut out = Vec::new();
    for r in 0..rounds {
        for d in 0..docs {
            out.push(Request {
                timestamp_ms: (r * docs + d) * 1000,
                instance: 0,
                input_tokens: (blocks * 16) as u32,
                output_tokens: 1,
                keys: (0..blocks)
                    .map(|b| BlockHash(u128::from(d * 1000 + b + 1)))
                    .collect(),
                tokens_per_block: 16,
                last_block_tokens: 16,
            });
        }
    }
    out
}

fn serving() -> ServingModel {
    ServingModel::new(
        ModelSpec::preset(ModelPreset::Llama3_8B),
        GpuKind::H100Sxm.spec(),
        &["G2"],
        16,
    )
}

#[test]
fn grid_is_policies_times_layouts_in_order() {
    let grid = Grid::capacities(
        &[PolicyKind::Lru, PolicyKind::Lfu, PolicyKind::Belady],
        &[10, 20, 40, 80],
        "G2",
    );
    assert_eq!(grid.len(), 12);
    let configs = grid.configs();
    assert_eq!(configs.len(), 12);
    assert_eq!(configs[0].policy, PolicyKind::Lru);
    assert_eq!(configs[5].policy, PolicyKind::Lfu);
    assert_eq!(configs[5].tiers[0].capacity_blocks, 20);

    let trace = cyclic_trace(4, 5, 3);
    let calls = AtomicUsize::new(0);
    let points = sweep::sweep(&trace, &grid, Some(&serving()), 2, &|done, total| {
        assert!(done <= total && total == 12);
        calls.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(calls.load(Ordering::Relaxed), 12);
    assert_eq!(points.len(), 12);
    for (p, c) in points.iter().zip(&configs) {
        assert_eq!(p.policy, c.policy.name());
        assert_eq!(p.capacity, c.tiers[0].capacity_blocks);
        assert!(p.ttft.is_some() && p.cost.is_some());
    }
}

#[test]
fn tier_candidates_are_the_cartesian_product() {
    let c = tier_candidates(&[("G2".into(), vec![0, 10, 20]), ("G3".into(), vec![0, 100])]);
    // (0,0) is dropped: a layout needs a tier.
    assert_eq!(c.len(), 5);
    assert_eq!(
        c[0],
        vec![TierSpec {
            name: "G3".into(),
            capacity_blocks: 100
        }]
    );
    assert_eq!(c[4].len(), 2);
}

fn point(capacity: u64, hit_rate: f64, dollars: Option<f64>) -> Point {
    Point {
        policy: "lru".into(),
        capacity,
        tiers: vec![TierSpec {
            name: "G2".into(),
            capacity_blocks: capacity,
        }],
        hit_rate,
        gap_closed: None,
        requests: 1,
        requested_blocks: 1,
        hit_blocks: 0,
        tier_hit_blocks: vec![0],
        ttft: None,
        cost: dollars.map(|d| kvtier_sim::model::CostSummary {
            dollars_per_mtok_with_cache: d,
            storage_gb: capacity as f64,
            ..Default::default()
        }),
        timeline: Vec::new(),
        reuse_distance: Default::default(),
        access_frequency: Default::default(),
        accesses: 0,
        replay_s: 0.0,
    }
}

#[test]
fn select_takes_the_cheapest_point_that_meets_the_target() {
    let pts = [
        point(10, 0.1, Some(1.0)),
        point(20, 0.6, Some(3.0)),
        point(40, 0.7, Some(2.0)),
        point(80, 0.9, Some(2.0)),
    ];
    assert_eq!(select(&pts, Target::HitRate(0.5)), Some(2));
    assert_eq!(select(&pts, Target::HitRate(0.05)), Some(0));
    assert_eq!(select(&pts, Target::HitRate(0.95)), None);
    // Without prices, the smallest capacity meeting the target wins.
    let bare = [point(40, 0.7, None), point(20, 0.6, None)];
    assert_eq!(select(&bare, Target::HitRate(0.5)), Some(1));
    // A TTFT target needs a priced point.
    assert_eq!(select(&bare, Target::MeanTtftS(10.0)), None);
    // Belady and the oracle are bounds, not configurations.
    for name in ["belady", "oracle-lru", "oracle-hit-density"] {
        let mut bound = point(10, 0.9, Some(0.5));
        bound.policy = name.into();
        assert_eq!(
            select(&[bound, point(20, 0.9, Some(1.0))], Target::HitRate(0.5)),
            Some(1),
            "{name}"
        );
    }
}

#[test]
fn search_picks_the_smallest_capacity_that_reaches_the_hit_rate() {
    // 4 documents x 5 blocks = 20 blocks in the working set; 5 passes.
    let trace = cyclic_trace(4, 5, 5);
    let candidates = tier_candidates(&[("G2".into(), vec![5, 10, 20, 40, 80])]);
    let result = sweep::search(
        &trace,
        PolicyKind::Lru,
        &candidates,
        Target::HitRate(0.5),
        &serving(),
        2,
        &|_, _| {},
    );
    assert_eq!(result.points.len(), 5);
    for w in result.points.windows(2) {
        assert!(w[0].hit_rate <= w[1].hit_rate);
    }
    assert!(
        (result.points[2].hit_rate - 0.8).abs() < 1e-9,
        "{}",
        result.points[2].hit_rate
    );
    assert_eq!(result.best_point().map(|p| p.capacity), Some(20));
    let ttft = result.points[2]
        .ttft
        .map(|t| t.with_cache.mean)
        .unwrap_or(f64::NAN);
    let nocache = result.points[0]
        .ttft
        .map(|t| t.with_cache.mean)
        .unwrap_or(f64::NAN);
    assert!(ttft < nocache);

    // The TTFT target is met by the same point (the smaller ones hit nothing).
    let r = sweep::search(
        &trace,
        PolicyKind::Lru,
        &candidates,
        Target::MeanTtftS(ttft * 1.001),
        &serving(),
        1,
        &|_, _| {},
    );
    assert_eq!(r.best, Some(2));
}

#[test]
fn run_keeps_the_order_of_configs_with_more_threads_than_points() {
    let trace = cyclic_trace(2, 2, 2);
    let configs = vec![
        ReplayConfig::single(PolicyKind::Lru, 1),
        ReplayConfig::single(PolicyKind::Lfu, 2),
    ];
    let points = sweep::run(&trace, &configs, None, 8, &|_, _| {});
    assert_eq!(
        points.iter().map(|p| p.capacity).collect::<Vec<_>>(),
        [1, 2]
    );
    assert!(points.iter().all(|p| p.ttft.is_none()));
}

/// Every point of a layout replayed with LRU and Belady gets its share of
/// the gap, computed from the hit rates; a layout where the two meet, and
/// a sweep without Belady, get none.
#[test]
fn sweeps_report_the_share_of_the_gap_closed() {
    // 4 passes over 4 documents of 5 blocks: LRU at 15 blocks thrashes
    // (hits nothing), Belady keeps most of the blocks between passes.
    let trace = cyclic_trace(4, 5, 4);
    let policies = [PolicyKind::Lru, PolicyKind::Arc, PolicyKind::Belady];
    let grid = Grid::capacities(&policies, &[15, 400], "G2");
    let points = sweep::sweep(&trace, &grid, None, 2, &|_, _| {});
    let rate = |policy: PolicyKind, cap: u64| {
        points
            .iter()
            .find(|p| p.policy == policy.name() && p.capacity == cap)
            .map_or(f64::NAN, |p| p.hit_rate)
    };
    let (lru, belady) = (rate(PolicyKind::Lru, 15), rate(PolicyKind::Belady, 15));
    assert!(belady > lru, "the trace must leave a gap: {lru} {belady}");
    for p in points.iter().filter(|p| p.capacity == 15) {
        let want = (p.hit_rate - lru) / (belady - lru);
        let got = p.gap_closed.unwrap_or(f64::NAN);
        assert!((got - want).abs() < 1e-12, "{}: {got} != {want}", p.policy);
    }
    // All 20 blocks fit in 400: LRU is optimal, there is no gap.
    assert_eq!(rate(PolicyKind::Lru, 400), rate(PolicyKind::Belady, 400));
    assert!(
        points
            .iter()
            .filter(|p| p.capacity == 400)
            .all(|p| p.gap_closed.is_none())
    );
    let grid = Grid::capacities(&[PolicyKind::Lru, PolicyKind::Arc], &[15], "G2");
    let points = sweep::sweep(&trace, &grid, None, 1, &|_, _| {});
    assert!(points.iter().all(|p| p.gap_closed.is_none()));
}

#[test]
fn gap_shares_are_filled_per_layout_where_both_ends_ran() {
    let at = |policy: &str, capacity: u64, hit_rate: f64| Point {
        policy: policy.into(),
        ..point(capacity, hit_rate, None)
    };
    let mut pts = vec![
        at("slru", 10, 0.3),
        at("lru", 10, 0.2),
        at("belady", 10, 0.6),
        // A second LRU point of the same layout is not an end.
        at("lru", 10, 0.5),
        // Another layout without Belady: no share.
        at("lru", 20, 0.4),
        at("slru", 20, 0.5),
    ];
    sweep::gap::fill(&mut pts);
    let shares: Vec<String> = pts.iter().map(|p| sweep::percent(p.gap_closed)).collect();
    assert_eq!(shares, ["25%", "0%", "100%", "75%", "-", "-"]);
}
