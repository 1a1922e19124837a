//! Placement planning: watermarks, the cascade, inclusive and exclusive
//! modes, admission to disk, and onboarding dedup.

use kvtier_core::BlockHash;
use kvtier_manager::admission::{AdmissionConfig, AdmissionFilter, UseSketch};
use kvtier_manager::placement::{
    CascadeMode, HierarchyConfig, OnboardStep, OnboardStop, PlacementConfig, Planner,
};
use kvtier_manager::pool::{BlockPool, PoolConfig, Presence};
use kvtier_manager::registry::Registry;
use kvtier_manager::{Tier, TransferPath};

fn h(i: u128) -> BlockHash {
    BlockHash(i)
}

fn tier_config(capacity: usize, high: f64, low: f64) -> PoolConfig {
    PoolConfig {
        high_watermark: high,
        low_watermark: low,
        ..PoolConfig::new(capacity, 1)
    }
}

/// A node's tiers: G2 on top, G3 and G4 when given.
fn hierarchy(g2: usize, g3: Option<usize>, g4: Option<usize>) -> Registry {
    HierarchyConfig::none()
        .with(Tier::G2, Some(tier_config(g2, 0.8, 0.5)))
        .with(Tier::G3, g3.map(|c| tier_config(c, 0.8, 0.5)))
        .with(Tier::G4, g4.map(|c| tier_config(c, 1.0, 1.0)))
        .with_placement(PlacementConfig::default())
        .build_registry()
        .unwrap()
}

fn planner(mode: CascadeMode, min_reuses: u32) -> Planner {
    Planner::new(PlacementConfig {
        mode,
        admission: AdmissionConfig {
            min_reuses,
            ..AdmissionConfig::default()
        },
    })
}

/// Registers `id` (after `parent`) in `tier`, unreferenced.
fn put(registry: &Registry, tier: Tier, id: u128, parent: Option<u128>) {
    let mut b = registry.pool(tier).unwrap().allocate().unwrap();
    b.complete_external(h(id), parent.map(h)).unwrap();
    drop(b.register().unwrap());
}

#[test]
fn offload_brings_a_tier_from_high_to_low_watermark() {
    let r = hierarchy(10, Some(20), None);
    let p = planner(CascadeMode::Exclusive, 0);
    for i in 0..8 {
        put(&r, Tier::G2, i, None);
    }
    assert!(p.plan_offload(&r).is_empty(), "8 of 10 is not above 0.8");
    put(&r, Tier::G2, 8, None);
    let plan = p.plan_offload(&r);
    assert_eq!(plan.moves.len(), 9 - 5, "down to the low watermark");
    let moved: Vec<u128> = plan.moves.iter().map(|m| m.hash.0).collect();
    assert_eq!(moved, [0, 1, 2, 3], "least recently used first");
    for m in &plan.moves {
        assert_eq!(
            (m.from, m.to, m.path),
            (
                Tier::G2,
                Tier::G3,
                TransferPath {
                    from: Tier::G2,
                    to: Tier::G3
                }
            )
        );
        assert!(m.removes_source());
        assert!(
            r.pool(Tier::G2).unwrap().is_readable(m.hash),
            "readable until moved"
        );
        assert_eq!(
            r.pool(Tier::G3).unwrap().presence(m.hash),
            Some(Presence::Filling)
        );
    }
    assert!(
        p.plan_offload(&r).moves.is_empty(),
        "blocks being moved are not planned twice"
    );
    for m in plan.moves {
        drop(m.complete());
    }
    assert_eq!(r.pool(Tier::G2).unwrap().used(), 5);
    for i in 0..4 {
        assert_eq!(r.residency(h(i)).iter().collect::<Vec<_>>(), [Tier::G3]);
    }
    for pool in r.pools() {
        pool.check_invariants().unwrap();
    }
}

#[test]
fn offload_plans_leaves_before_parents() {
    let r = hierarchy(4, Some(8), None);
    let p = planner(CascadeMode::Exclusive, 0);
    // A chain registered root first; pure LRU would pick the root.
    put(&r, Tier::G2, 1, None);
    put(&r, Tier::G2, 2, Some(1));
    put(&r, Tier::G2, 3, Some(2));
    put(&r, Tier::G2, 4, Some(3));
    let plan = p.plan_offload(&r);
    let moved: Vec<u128> = plan.moves.iter().map(|m| m.hash.0).collect();
    // 4 used > 3 high; down to 2 low: the deepest two leave (4, then its
    // parent 3), and are written root first so the chain is co-located.
    assert_eq!(moved, [3, 4]);
}

/// The moves of a round come out as a depth-first preorder of the prefix
/// tree they form: a branch's blocks follow their parent, siblings in
/// planned order, though the pool gave them up leaves first.
#[test]
fn offload_moves_are_ordered_root_first_through_branches() {
    let r = hierarchy(10, Some(20), None);
    let p = planner(CascadeMode::Exclusive, 0);
    // 100 -> 101 -> {102, 103}, then five newer unrelated roots.
    put(&r, Tier::G2, 100, None);
    put(&r, Tier::G2, 101, Some(100));
    put(&r, Tier::G2, 102, Some(101));
    put(&r, Tier::G2, 103, Some(101));
    for i in 104..109 {
        put(&r, Tier::G2, i, None);
    }
    // 9 used > 8 high, down to 5: the four oldest leave, leaves first
    // (102, 103, 101, 100), written from the root down.
    let plan = p.plan_offload(&r);
    let moved: Vec<u128> = plan.moves.iter().map(|m| m.hash.0).collect();
    assert_eq!(moved, [100, 101, 102, 103]);
}

#[test]
fn a_failed_offload_keeps_the_block() {
    let r = hierarchy(10, Some(20), None);
    let p = planner(CascadeMode::Exclusive, 0);
    for i in 0..9 {
        put(&r, Tier::G2, i, None);
    }
    let plan = p.plan_offload(&r);
    drop(plan); // every transfer failed
    assert_eq!(r.pool(Tier::G2).unwrap().used(), 9);
    assert_eq!(
        r.pool(Tier::G3).unwrap().used(),
        0,
        "destination slots returned"
    );
    assert_eq!(
        p.plan_offload(&r).moves.len(),
        4,
        "the blocks can be planned again"
    );
    for pool in r.pools() {
        pool.check_invariants().unwrap();
    }
}

/// The lowest configured tier drops what it gives up; G4 takes it when
/// configured, from G3, or from G2 directly when there is no G3.
#[test]
fn cascade_reaches_g4_only_when_configured() {
    for (g3, from, path) in [
        (
            Some(10),
            Tier::G3,
            TransferPath {
                from: Tier::G3,
                to: Tier::G4,
            },
        ),
        (
            None,
            Tier::G2,
            TransferPath {
                from: Tier::G2,
                to: Tier::G4,
            },
        ),
    ] {
        for g4 in [None, Some(100)] {
            let r = hierarchy(10, g3, g4);
            let p = planner(CascadeMode::Exclusive, 0);
            for i in 0..9 {
                put(&r, from, i, None);
            }
            let plan = p.plan_offload(&r);
            if g4.is_some() {
                assert_eq!(plan.moves.len(), 4, "{from}");
                assert!(
                    plan.moves
                        .iter()
                        .all(|m| m.from == from && m.to == Tier::G4 && m.path == path),
                    "{from}"
                );
            } else {
                assert!(plan.moves.is_empty(), "{from}");
                assert_eq!(plan.dropped.len(), 4, "nothing below {from}: dropped");
                assert_eq!(r.pool(from).unwrap().used(), 5);
            }
        }
    }
}

#[test]
fn admission_keeps_one_hit_blocks_off_disk() {
    let r = hierarchy(10, Some(10), None);
    let p = planner(CascadeMode::Exclusive, 1);
    for i in 0..9 {
        put(&r, Tier::G2, i, None);
    }
    // Blocks 0 and 1 were reused (seen in two requests), the rest once.
    p.record_uses(&[h(0), h(1), h(2), h(3)]);
    p.record_uses(&[h(0), h(1)]);
    let plan = p.plan_offload(&r);
    let to_disk: Vec<u128> = plan.moves.iter().map(|m| m.hash.0).collect();
    assert_eq!(to_disk, [0, 1]);
    assert_eq!(plan.dropped, [(Tier::G2, h(2)), (Tier::G2, h(3))]);
    assert!(plan.moves.iter().all(|m| m.path
        == TransferPath {
            from: Tier::G2,
            to: Tier::G3
        }));
}

#[test]
fn inclusive_mode_evicts_for_free_and_copies_down() {
    let r = hierarchy(10, Some(20), None);
    let p = planner(CascadeMode::Inclusive, 0);
    for i in 0..9 {
        put(&r, Tier::G2, i, None);
    }
    let copies = p.plan_copy_down(&r, Tier::G2, &[h(0), h(1), h(42)]);
    assert_eq!(copies.len(), 2, "absent blocks are skipped");
    assert!(copies.iter().all(|m| !m.removes_source()));
    for m in copies {
        drop(m.complete());
    }
    assert_eq!(
        r.residency(h(0)).iter().collect::<Vec<_>>(),
        [Tier::G2, Tier::G3]
    );
    let plan = p.plan_offload(&r);
    assert_eq!(plan.already_below, [(Tier::G2, h(0)), (Tier::G2, h(1))]);
    assert_eq!(plan.moves.len(), 2);
    assert!(
        !r.pool(Tier::G2).unwrap().is_readable(h(0)),
        "left G1 without a transfer"
    );
    assert!(
        planner(CascadeMode::Exclusive, 0)
            .plan_copy_down(&r, Tier::G2, &[h(5)])
            .is_empty()
    );
}

#[test]
fn onboarding_moves_or_copies_by_mode() {
    for mode in [CascadeMode::Exclusive, CascadeMode::Inclusive] {
        let r = hierarchy(10, Some(10), Some(10));
        let p = planner(mode, 0);
        put(&r, Tier::G3, 1, None);
        put(&r, Tier::G4, 2, Some(1));
        let plan = p.plan_onboard(&r, &[h(1), h(2)]);
        assert_eq!(plan.stopped, None);
        let paths: Vec<_> = plan.transfers().map(|m| (m.from, m.path)).collect();
        assert_eq!(
            paths,
            [
                (
                    Tier::G3,
                    TransferPath {
                        from: Tier::G3,
                        to: Tier::G2
                    }
                ),
                (
                    Tier::G4,
                    TransferPath {
                        from: Tier::G4,
                        to: Tier::G2
                    }
                )
            ]
        );
        for step in plan.steps {
            let OnboardStep::Transfer(m) = step else {
                panic!("expected transfers")
            };
            drop(m.complete());
        }
        assert!(r.pool(Tier::G2).unwrap().is_readable(h(2)));
        let below_kept = r.pool(Tier::G3).unwrap().is_readable(h(1));
        assert_eq!(below_kept, mode == CascadeMode::Inclusive, "{mode:?}");
        assert_eq!(r.pool(Tier::G2).unwrap().parent_of(h(2)), Some(Some(h(1))));
    }
}

#[test]
fn onboarding_is_deduplicated_against_resident_and_in_flight_blocks() {
    let r = hierarchy(10, Some(10), None);
    let p = planner(CascadeMode::Inclusive, 0);
    put(&r, Tier::G2, 1, None);
    put(&r, Tier::G3, 2, Some(1));
    put(&r, Tier::G3, 3, Some(2));
    let first = p.plan_onboard(&r, &[h(1), h(2), h(3), h(4)]);
    assert_eq!(first.stopped, Some(OnboardStop::Missing(h(4))));
    assert!(matches!(first.steps[0], OnboardStep::Resident(_)));
    assert_eq!(first.transfers().count(), 2);
    // A second request for the same prefix shares the transfers in flight.
    let second = p.plan_onboard(&r, &[h(1), h(2), h(3)]);
    let kinds: Vec<&str> = second
        .steps
        .iter()
        .map(|s| match s {
            OnboardStep::Resident(_) => "resident",
            OnboardStep::Pending(_) => "pending",
            OnboardStep::Transfer(_) => "transfer",
        })
        .collect();
    assert_eq!(kinds, ["resident", "pending", "pending"]);
    assert_eq!(
        r.pool(Tier::G2).unwrap().stats().incoming,
        2,
        "one transfer per block"
    );
    drop(second);
    // The first request's transfers fail: the blocks are planned afresh.
    drop(first);
    assert_eq!(r.pool(Tier::G2).unwrap().stats().incoming, 0);
    let third = p.plan_onboard(&r, &[h(1), h(2), h(3)]);
    assert_eq!(third.transfers().count(), 2);
}

#[test]
fn onboarding_stops_when_the_target_is_full() {
    let r = hierarchy(1, Some(10), None);
    let p = planner(CascadeMode::Exclusive, 0);
    put(&r, Tier::G3, 1, None);
    put(&r, Tier::G3, 2, Some(1));
    let plan = p.plan_onboard(&r, &[h(1), h(2)]);
    assert_eq!(plan.steps.len(), 1);
    assert!(matches!(plan.stopped, Some(OnboardStop::TargetFull(_))));
    drop(plan);
    assert!(
        r.pool(Tier::G3).unwrap().is_readable(h(1)),
        "failed move keeps the source"
    );
}

#[test]
fn the_sketch_counts_uses_and_halves() {
    let mut s = UseSketch::new(1024, 4, 1_000_000);
    for k in 0..50u128 {
        for _ in 0..(k % 5) {
            s.record(h(k));
        }
    }
    for k in 0..50u128 {
        assert!(s.estimate(h(k)) >= (k % 5) as u32, "never underestimates");
    }
    let before = s.estimate(h(4));
    s.halve();
    assert_eq!(s.estimate(h(4)), before / 2);

    // Periodic halving: after `reset_after` uses, old counts fade.
    let mut s = UseSketch::new(1024, 4, 10);
    for _ in 0..8 {
        s.record(h(1));
    }
    assert_eq!(s.estimate(h(1)), 8);
    s.record(h(2));
    s.record(h(2)); // the tenth use halves everything
    assert_eq!(s.estimate(h(1)), 4);
}

#[test]
fn admission_needs_n_reuses() {
    let mut a = AdmissionFilter::new(&AdmissionConfig {
        min_reuses: 2,
        ..AdmissionConfig::default()
    });
    for expect in [false, false, true] {
        a.record(h(9));
        assert_eq!(a.admits(h(9)), expect);
    }
    assert!(!a.admits(h(10)));
    let open = AdmissionFilter::new(&AdmissionConfig {
        min_reuses: 0,
        ..AdmissionConfig::default()
    });
    assert!(open.admits(h(10)), "N = 0 admits everything");
}

#[test]
fn configs_deserialize_with_defaults() {
    let cfg: HierarchyConfig = serde_json::from_str(
        r#"{"pools": {"g2": {"capacity_blocks": 64, "policy": {"kind": "s3-fifo"}},
                      "G3": {"capacity_blocks": 4096}},
            "placement": {"mode": "inclusive", "admission": {"min_reuses": 3}}}"#,
    )
    .unwrap();
    let g2 = cfg.tier(Tier::G2).unwrap();
    assert_eq!(g2.capacity_blocks, 64);
    assert_eq!(g2.high_watermark, PoolConfig::default().high_watermark);
    assert_eq!(cfg.placement.mode, CascadeMode::Inclusive);
    assert_eq!(cfg.placement.admission.min_reuses, 3);
    assert_eq!(cfg.tier(Tier::G4), None);
    assert_eq!(
        cfg.pools().map(|(t, _)| t).collect::<Vec<_>>(),
        [Tier::G2, Tier::G3]
    );
    let r: Registry = cfg.build_registry().unwrap();
    assert_eq!(r.tiers().collect::<Vec<_>>(), [Tier::G2, Tier::G3]);
    // Positions are the tier list's, up to its last; the fixed fields are
    // gone.
    assert!(serde_json::from_str::<HierarchyConfig>(r#"{"g2": null}"#).is_err());
    assert!(serde_json::from_str::<HierarchyConfig>(r#"{"pools": {"g9": {}}}"#).is_err());
    let round = serde_json::to_string(&cfg).unwrap();
    assert_eq!(
        serde_json::from_str::<HierarchyConfig>(&round).unwrap(),
        cfg
    );
    let _: BlockPool = BlockPool::new(Tier::G2, g2.clone()).unwrap();
}

#[test]
fn expiry_drops_idle_unreferenced_blocks() {
    use kvtier_manager::policy::{PolicyConfig, PolicyKind};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    let now = Arc::new(AtomicU64::new(0));
    let clock = {
        let now = now.clone();
        Arc::new(move || now.load(Ordering::Relaxed))
    };
    let mut cfg = PoolConfig::new(4, 1);
    cfg.policy = PolicyConfig {
        ttl_ms: 100,
        ..PolicyConfig::of(PolicyKind::Ttl)
    };
    let pool: BlockPool = BlockPool::with_lock(Tier::G2, cfg, clock).unwrap();
    let r = Registry::new().with_pool(pool.clone());
    let p = planner(CascadeMode::Exclusive, 0);
    put(&r, Tier::G2, 1, None);
    now.store(60, Ordering::Relaxed);
    put(&r, Tier::G2, 2, None);
    let held = pool.acquire(h(1)).unwrap(); // a use at 60 renews 1
    now.store(150, Ordering::Relaxed);
    assert!(p.expire(&r).is_empty(), "both used within 100 ms");
    now.store(170, Ordering::Relaxed);
    assert_eq!(
        p.expire(&r),
        [(Tier::G2, h(2))],
        "both idle for 110 ms, but 1 is held"
    );
    assert!(pool.is_readable(h(1)));
    drop(held);
    assert_eq!(p.expire(&r), [(Tier::G2, h(1))]);
    pool.check_invariants().unwrap();
}

#[test]
fn engine_hooks_settle_moves_by_block_result() {
    use kvtier_manager::placement::MoveHooks;
    use kvtier_manager::transfer::Span;
    use kvtier_manager::transfer::{BlockFailure, InFlightHooks, TransferTicket};

    let r = hierarchy(10, Some(20), None);
    let p = planner(CascadeMode::Exclusive, 0);
    for i in 0..9 {
        put(&r, Tier::G2, i, None);
    }
    let hooks: MoveHooks = MoveHooks::new();
    let plan = p.plan_offload(&r);
    let keys: Vec<BlockHash> = plan.moves.iter().map(|m| m.hash).collect();
    for m in plan.moves {
        hooks.stage(m);
    }
    assert_eq!(hooks.counts(), (4, 0));
    hooks.begin_transfer(&TransferTicket {
        id: 7,
        path: TransferPath {
            from: Tier::G2,
            to: Tier::G3,
        },
        span: Span::Block,
        keys: &keys,
    });
    assert_eq!(hooks.counts(), (0, 4));
    hooks.finish_transfer(
        7,
        TransferPath {
            from: Tier::G2,
            to: Tier::G3,
        },
        keys[0],
        &Ok(()),
    );
    hooks.finish_transfer(
        7,
        TransferPath {
            from: Tier::G2,
            to: Tier::G3,
        },
        keys[1],
        &Err(BlockFailure::Corrupt),
    );
    let (g2, g3) = (r.pool(Tier::G2).unwrap(), r.pool(Tier::G3).unwrap());
    assert_eq!(
        r.residency(keys[0]).iter().collect::<Vec<_>>(),
        [Tier::G3],
        "moved"
    );
    assert_eq!(
        r.residency(keys[1]).iter().collect::<Vec<_>>(),
        [Tier::G2],
        "failed: stays"
    );
    assert_eq!(g3.presence(keys[1]), None, "failed destination freed");
    assert_eq!(g3.presence(keys[2]), Some(Presence::Filling));
    assert_eq!(hooks.counts(), (0, 2));
    g2.check_invariants().unwrap();
    g3.check_invariants().unwrap();
}
