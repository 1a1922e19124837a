//! Each eviction policy on a small scripted sequence, the eligibility
//! filter, and leaves-before-parents in a pool under every policy.

use kvtier_core::BlockHash;
use kvtier_manager::Tier;
use kvtier_manager::policy::arc::Arc;
use kvtier_manager::policy::cost::CostAware;
use kvtier_manager::policy::lfu::Lfu;
use kvtier_manager::policy::lru::Lru;
use kvtier_manager::policy::s3fifo::S3Fifo;
use kvtier_manager::policy::ttl::Ttl;
use kvtier_manager::policy::{CostModel, EvictionPolicy, InsertInfo, PolicyConfig, PolicyKind};
use kvtier_manager::pool::{BlockPool, PoolConfig};

fn h(i: u128) -> BlockHash {
    BlockHash(i)
}

fn at(now: u64) -> InsertInfo {
    InsertInfo { now, depth: 0 }
}

/// Victims in order until the policy is empty.
fn drain(p: &mut dyn EvictionPolicy, now: u64) -> Vec<u128> {
    std::iter::from_fn(|| p.victim(now, &mut |_| true).map(|k| k.0)).collect()
}

#[test]
fn lru_evicts_least_recent() {
    let mut p = Lru::default();
    for i in 1..=3 {
        p.insert(h(i), at(0));
    }
    p.access(h(1), 1);
    assert_eq!(drain(&mut p, 2), [2, 3, 1]);
}

#[test]
fn lfu_evicts_least_used_then_least_recent() {
    let mut p = Lfu::default();
    for i in 1..=4 {
        p.insert(h(i), at(0));
    }
    p.access(h(1), 1);
    p.access(h(1), 2);
    p.access(h(3), 3);
    assert_eq!(p.uses(h(1)), Some(3));
    assert_eq!(drain(&mut p, 4), [2, 4, 3, 1]);
}

#[test]
fn arc_adapts_to_a_ghost_hit() {
    let mut p = Arc::new(2);
    p.insert(h(1), at(0));
    p.insert(h(2), at(0));
    p.access(h(1), 1); // 1 moves to the frequency list
    assert_eq!(
        p.victim(2, &mut |_| true),
        Some(h(2)),
        "recency list goes first"
    );
    assert_eq!(p.target_recent(), 0);
    p.insert(h(2), at(3)); // a ghost of the recency list comes back
    assert_eq!(p.target_recent(), 1, "recency was undervalued");
    assert_eq!(p.len(), 2);
    // Both now sit in the frequency list; 1 is its oldest.
    assert_eq!(drain(&mut p, 4), [1, 2]);
}

#[test]
fn s3fifo_filters_one_hit_blocks_and_remembers_ghosts() {
    let mut p = S3Fifo::new(10); // small queue target: 1
    for i in 1..=3 {
        p.insert(h(i), at(0));
    }
    p.access(h(2), 1);
    assert_eq!(
        p.victim(2, &mut |_| true),
        Some(h(1)),
        "unused small block goes"
    );
    assert_eq!(
        p.victim(2, &mut |_| true),
        Some(h(3)),
        "used block 2 is promoted to main instead"
    );
    assert!(p.in_main(h(2)));
    p.insert(h(1), at(3));
    assert!(p.in_main(h(1)), "a ghost comes back into main");
    p.access(h(1), 4);
    assert_eq!(
        drain(&mut p, 5),
        [2, 1],
        "main gives a used block another round"
    );
}

#[test]
fn ttl_reports_idle_blocks_and_evicts_lru() {
    let mut p = Ttl::new(100);
    p.insert(h(1), at(0));
    p.insert(h(2), at(50));
    assert_eq!(p.expired(120), [h(1)]);
    p.access(h(1), 130);
    assert_eq!(p.expired(160), [h(2)]);
    assert!(p.expired(40).is_empty());
    assert_eq!(drain(&mut p, 200), [2, 1]);
}

#[test]
fn cost_aware_keeps_used_and_expensive_blocks() {
    let mut p = CostAware::new(CostModel::default());
    p.insert(h(1), at(0));
    p.insert(h(2), at(0));
    p.access(h(1), 5);
    assert_eq!(
        p.victim(10, &mut |_| true),
        Some(h(2)),
        "fewer uses, less value"
    );

    // Without a cheaper restore path, a deeper block costs more to recompute.
    let model = CostModel {
        restore_us: f64::INFINITY,
        ..CostModel::default()
    };
    assert!(model.miss_cost_us(100) > model.miss_cost_us(0));
    let mut p = CostAware::new(model);
    p.insert(h(3), InsertInfo { now: 0, depth: 100 });
    p.insert(h(4), InsertInfo { now: 0, depth: 0 });
    assert_eq!(drain(&mut p, 1), [4, 3]);

    // Idle time wears value down: a block used twice long ago loses to one
    // used once just now.
    let mut p = CostAware::new(CostModel::default());
    p.insert(h(5), at(0));
    p.access(h(5), 0);
    p.insert(h(6), at(1_000_000));
    assert_eq!(p.victim(1_000_000, &mut |_| true), Some(h(5)));
}

#[test]
fn every_policy_skips_ineligible_blocks() {
    for kind in PolicyKind::ALL {
        let mut p = PolicyConfig::of(kind).build(8);
        for i in 1..=4 {
            p.insert(h(i), at(i as u64));
        }
        let v = p.victim(10, &mut |k| k.0 == 3);
        assert_eq!(v, Some(h(3)), "{kind}");
        assert_eq!(p.victim(10, &mut |k| k.0 == 3), None, "{kind}: 3 is gone");
        assert_eq!(p.len(), 3, "{kind}");
        p.remove(h(1));
        assert_eq!(p.len(), 2, "{kind}");
        let mut rest = drain(p.as_mut(), 10);
        rest.sort();
        assert_eq!(rest, [2, 4], "{kind}");
    }
}

#[test]
fn every_policy_evicts_leaves_before_parents() {
    for kind in PolicyKind::ALL {
        let mut cfg = PoolConfig::new(4, 1);
        cfg.policy = PolicyConfig::of(kind);
        let pool = BlockPool::new(Tier::G1, cfg).unwrap();
        // 1 <- 2 <- 3 and 1 <- 4, root registered first (LRU's and FIFO's
        // natural victim), and the root used most (LFU's last pick anyway).
        for (id, parent) in [(1, None), (2, Some(1)), (3, Some(2)), (4, Some(1))] {
            let mut b = pool.allocate().unwrap();
            b.complete_external(h(id), parent.map(h)).unwrap();
            drop(b.register().unwrap());
        }
        let mut evicted = Vec::new();
        let mut keep = Vec::new();
        for _ in 0..4 {
            keep.push(pool.allocate().unwrap());
            let gone: Vec<u128> = (1..=4)
                .filter(|i| !pool.is_readable(h(*i)) && !evicted.contains(i))
                .collect();
            assert_eq!(gone.len(), 1, "{kind}: one eviction per allocation");
            evicted.push(gone[0]);
        }
        let pos = |i: u128| evicted.iter().position(|e| *e == i).unwrap();
        assert!(pos(3) < pos(2), "{kind}: {evicted:?}");
        assert!(pos(2) < pos(1) && pos(4) < pos(1), "{kind}: {evicted:?}");
        pool.check_invariants().unwrap();
    }
}
