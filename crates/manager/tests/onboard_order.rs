//! An onboarding's blocks arrive in the top tier in one order, whatever
//! order its loads finish in: fastest source first, each source's blocks
//! in request order (`MoveHooks::stage_ordered`). The top tier's policy
//! sees that order on every run (ARC adapts its target on each block that
//! comes back from its ghost lists, so the order changes what it evicts
//! next), and the optimizer's replay models the same one.

use kvtier_core::BlockHash;
use kvtier_manager::placement::{CascadeMode, MoveHooks, OnboardStep, PlacementConfig, Planner};
use kvtier_manager::pool::{BlockPool, PoolConfig, PoolEvent, Presence};
use kvtier_manager::registry::Registry;
use kvtier_manager::transfer::Span;
use kvtier_manager::transfer::{BlockFailure, InFlightHooks, TransferTicket};
use kvtier_manager::{Tier, TransferPath};

fn h(i: u128) -> BlockHash {
    BlockHash(i)
}

/// G2 on top (the node's layout), G3 and G4 below.
fn node_tiers() -> Registry {
    let config = PoolConfig {
        record_events: true,
        ..PoolConfig::new(8, 1)
    };
    let pool = |tier| BlockPool::new(tier, config.clone()).expect("pool");
    Registry::new()
        .with_pool(pool(Tier::G2))
        .with_pool(pool(Tier::G3))
        .with_pool(pool(Tier::G4))
}

/// Registers the chain `ids` in `tier`, unreferenced.
fn put_chain(registry: &Registry, tier: Tier, ids: &[u128], parent: Option<u128>) {
    let pool = registry.pool(tier).expect("tier");
    let mut parent = parent;
    for &id in ids {
        let mut b = pool.allocate().expect("slot");
        b.complete_external(h(id), parent.map(h)).expect("complete");
        drop(b.register().expect("register"));
        parent = Some(id);
    }
}

/// Plans the onboarding of `prefix` to G2 and stages its moves as the
/// manager does: fastest source first, in request order.
fn stage_onboarding(registry: &Registry, hooks: &MoveHooks, prefix: &[BlockHash]) {
    let planner = Planner::new(PlacementConfig {
        mode: CascadeMode::Exclusive,
        ..PlacementConfig::default()
    });
    let plan = planner.plan_onboard(registry, prefix);
    assert_eq!(plan.stopped, None);
    let mut moves: Vec<_> = plan
        .steps
        .into_iter()
        .map(|s| match s {
            OnboardStep::Transfer(mv) => mv,
            _ => panic!("every block is below G2"),
        })
        .collect();
    moves.sort_by_key(|mv| mv.from.index());
    hooks.stage_ordered(moves);
}

/// Runs one whole-block transfer of `keys` on `path` with `results`.
fn transfer(
    hooks: &MoveHooks,
    id: u64,
    path: TransferPath,
    keys: &[BlockHash],
    results: &[Result<(), BlockFailure>],
) {
    hooks.begin_transfer(&TransferTicket {
        id,
        path,
        span: Span::Block,
        keys,
    });
    for (k, r) in keys.iter().zip(results) {
        hooks.finish_transfer(id, path, *k, r);
    }
}

fn stored(pool: &BlockPool) -> Vec<u128> {
    pool.drain_events()
        .into_iter()
        .filter_map(|e| match e {
            PoolEvent::Stored { hash, .. } => Some(hash.0),
            _ => None,
        })
        .collect()
}

#[test]
fn blocks_arrive_fastest_source_first_whichever_load_finishes_first() {
    let r = node_tiers();
    // The request's chain 1-2-3-4: 1 and 2 on the disk, 3 and 4 in G4.
    put_chain(&r, Tier::G3, &[1, 2], None);
    put_chain(&r, Tier::G4, &[3, 4], Some(2));
    let g2 = r.pool(Tier::G2).expect("G2");
    drop(stored(g2));
    let hooks: MoveHooks = MoveHooks::new();
    let prefix = [h(1), h(2), h(3), h(4)];
    stage_onboarding(&r, &hooks, &prefix);

    // G4's load lands first: its blocks wait for the disk's.
    transfer(
        &hooks,
        1,
        TransferPath {
            from: Tier::G4,
            to: Tier::G2,
        },
        &prefix[2..],
        &[Ok(()), Ok(())],
    );
    assert_eq!(g2.presence(h(3)), Some(Presence::Filling), "waits for 1, 2");
    assert_eq!(
        r.pool(Tier::G4).expect("G4").presence(h(3)),
        Some(Presence::Ready)
    );
    assert_eq!(hooks.counts(), (2, 2));
    assert!(stored(g2).is_empty());

    transfer(
        &hooks,
        2,
        TransferPath {
            from: Tier::G3,
            to: Tier::G2,
        },
        &prefix[..2],
        &[Ok(()), Ok(())],
    );
    assert_eq!(
        stored(g2),
        [1, 2, 3, 4],
        "the disk's first, in request order"
    );
    assert_eq!(hooks.counts(), (0, 0));
    for k in prefix {
        assert_eq!(
            r.residency(k).iter().collect::<Vec<_>>(),
            [Tier::G2],
            "moved"
        );
    }
    for t in [Tier::G2, Tier::G3, Tier::G4] {
        r.pool(t)
            .expect("tier")
            .check_invariants()
            .expect("invariants");
    }
}

#[test]
fn a_failed_block_releases_the_blocks_after_it() {
    let r = node_tiers();
    put_chain(&r, Tier::G3, &[1, 2], None);
    put_chain(&r, Tier::G4, &[3], Some(2));
    let g2 = r.pool(Tier::G2).expect("G2");
    drop(stored(g2));
    let hooks: MoveHooks = MoveHooks::new();
    let prefix = [h(1), h(2), h(3)];
    stage_onboarding(&r, &hooks, &prefix);

    transfer(
        &hooks,
        1,
        TransferPath {
            from: Tier::G4,
            to: Tier::G2,
        },
        &prefix[2..],
        &[Ok(())],
    );
    // Within one load too: block 2 finished before block 1.
    hooks.begin_transfer(&TransferTicket {
        id: 2,
        path: TransferPath {
            from: Tier::G3,
            to: Tier::G2,
        },
        span: Span::Block,
        keys: &prefix[..2],
    });
    hooks.finish_transfer(
        2,
        TransferPath {
            from: Tier::G3,
            to: Tier::G2,
        },
        h(2),
        &Ok(()),
    );
    assert!(stored(g2).is_empty(), "2 and 3 wait for 1");
    hooks.finish_transfer(
        2,
        TransferPath {
            from: Tier::G3,
            to: Tier::G2,
        },
        h(1),
        &Err(BlockFailure::Miss),
    );
    assert_eq!(stored(g2), [2, 3]);
    assert_eq!(g2.presence(h(1)), None, "failed: destination freed");
    assert_eq!(
        r.residency(h(1)).iter().collect::<Vec<_>>(),
        [Tier::G3],
        "failed: source stays"
    );
    assert_eq!(hooks.counts(), (0, 0));
    for t in [Tier::G2, Tier::G3, Tier::G4] {
        r.pool(t)
            .expect("tier")
            .check_invariants()
            .expect("invariants");
    }
}
