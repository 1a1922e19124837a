//! Leaves-before-parents in a pool under every policy.

use kvtier_core::BlockHash;
use kvtier_manager::Tier;
use kvtier_manager::policy::{PolicyConfig, PolicyKind};
use kvtier_manager::pool::{BlockPool, PoolConfig};

fn h(i: u128) -> BlockHash {
    BlockHash(i)
}

#[test]
fn every_policy_evicts_leaves_before_parents() {
    for kind in PolicyKind::NODE {
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

#[test]
fn optimizer_only_policies_are_refused() {
    for kind in [PolicyKind::RandomLru, PolicyKind::Belady] {
        let mut cfg = PoolConfig::new(4, 1);
        cfg.policy = PolicyConfig::of(kind);
        let err = BlockPool::new(Tier::G1, cfg).expect_err("refused");
        assert!(err.to_string().contains("only in the optimizer"), "{err}");
    }
}
