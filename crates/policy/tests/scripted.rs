//! Each eviction policy on a small scripted sequence over block hashes,
//! and the eligibility filter.

use kvtier_core::BlockHash;
use kvtier_policy::{
    Arc, CostAware, CostModel, EvictionPolicy, HitDensity, Lfu, Lru, PolicyConfig, PolicyKind,
    S3Fifo, Slru, Ttl, Use, Verdict,
};

fn h(i: u128) -> BlockHash {
    BlockHash(i)
}

fn at(now: u64) -> Use {
    Use::at(now)
}

fn expired(p: &dyn EvictionPolicy<BlockHash>, now: u64) -> Vec<BlockHash> {
    let mut out = Vec::new();
    p.expired(now, &mut |k| out.push(k));
    out
}

/// Victims in order until the policy is empty.
fn drain(p: &mut dyn EvictionPolicy<BlockHash>, now: u64) -> Vec<u128> {
    std::iter::from_fn(|| p.victim(now, &mut |_| true.into()).map(|k| k.0)).collect()
}

#[test]
fn lru_evicts_least_recent() {
    let mut p = Lru::<BlockHash>::default();
    for i in 1..=3 {
        p.insert(h(i), &at(0));
    }
    p.access(h(1), &at(1));
    assert_eq!(drain(&mut p, 2), [2, 3, 1]);
}

#[test]
fn slru_keeps_reused_keys_and_demotes_the_protected_overflow() {
    // A tier of 10: the protected segment starts at 3 (30%), and the
    // tuner decides nothing before 10 uses (its first window).
    let mut p = Slru::<BlockHash>::new(10);
    for i in 1..=5 {
        p.insert(h(i), &at(0));
    }
    // 1, 2, 3 and 4 are reused; 4 overfills protected, and 1, its least
    // recent key, drops back to the newest end of probation.
    for i in 1..=4 {
        p.access(h(i), &at(1));
    }
    assert_eq!(p.protected_cap(), 3);
    assert!(!p.is_protected(h(1)));
    assert!(p.is_protected(h(4)));
    // Probation (5, 1) goes first, then protected (2, 3, 4).
    assert_eq!(drain(&mut p, 2), [5, 1, 2, 3, 4]);
}

/// Uses `key`: an access if the tier holds it, else an insert after an
/// eviction when full; whether it was a hit.
fn touch(p: &mut dyn EvictionPolicy<BlockHash>, cap: usize, key: u128) -> bool {
    if p.contains(h(key)) {
        p.access(h(key), &at(0));
        return true;
    }
    if p.len() == cap {
        let _ = p.victim(0, &mut |_| true.into());
    }
    p.insert(h(key), &at(0));
    false
}

#[test]
fn slru_admits_a_remembered_key_to_protected() {
    // Fewer uses than the tuner's first window (the tier's 10): the
    // protected share stays at its start, 30%.
    let mut p = Slru::<BlockHash>::new(10);
    for k in 0..5 {
        p.insert(h(k), &at(0));
    }
    let evict = |p: &mut Slru<BlockHash>| p.victim(0, &mut |_| true.into()).map(|k| k.0);
    // 0 is evicted (the oldest of probation), then comes back: protected.
    assert_eq!(evict(&mut p), Some(0));
    assert!(!p.contains(h(0)));
    p.insert(h(0), &at(1));
    assert!(p.is_protected(h(0)));
    // A ghost is not resident: no access, no removal, no length; back, it
    // is protected too. (Forgetting after GHOST_FACTOR tiers of evictions
    // is checked against the reference model in reference.rs.)
    assert_eq!(evict(&mut p), Some(1));
    let len = p.len();
    p.access(h(1), &at(2));
    p.remove(h(1));
    assert_eq!(p.len(), len);
    assert!(!p.contains(h(1)));
    p.insert(h(1), &at(3));
    assert!(p.is_protected(h(1)));
    assert_eq!(p.protected_cap(), 3);
}

#[test]
fn slru_protects_a_hot_set_against_scans_and_falls_back_to_lru_without_reuse() {
    let cap = 100;
    // 25 hot keys used twice, then a scan of 100 new keys, each round:
    // LRU loses the hot set to every scan, a protected segment of 30
    // keeps it (15 keeps 15 of them).
    let mut p = Slru::<BlockHash>::new(cap);
    let mut fresh = 1000;
    for _ in 0..20 {
        for k in (0..25).chain(0..25) {
            touch(&mut p, cap, k);
        }
        for _ in 0..cap {
            fresh += 1;
            touch(&mut p, cap, fresh);
        }
    }
    assert_eq!(p.protected_cap(), 30);
    assert!((0..25).all(|k| p.is_protected(h(k))));
    // Nothing is ever used twice: every share misses alike, and a tie
    // goes to the smallest share, 0, which is LRU.
    let mut p = Slru::<BlockHash>::new(cap);
    for k in 0..1000 {
        touch(&mut p, cap, 10_000 + k);
    }
    assert_eq!(p.protected_cap(), 0);
}

/// Hits of `p`, a tier of 64, on 40 rounds of 16 hot keys then 80 keys
/// never seen again, in the last 20 rounds.
fn hot_set_hits(p: &mut dyn EvictionPolicy<BlockHash>) -> usize {
    let cap = 64;
    let mut fresh = 1000;
    let mut hits = 0;
    for round in 0..40 {
        for k in 0..16 {
            let hit = touch(p, cap, k);
            hits += usize::from(hit && round >= 20);
        }
        for _ in 0..80 {
            fresh += 1;
            touch(p, cap, fresh);
        }
    }
    hits
}

#[test]
fn hit_density_learns_that_reused_keys_come_back_and_one_offs_do_not() {
    // The hot keys come back after 80 insertions, beyond the tier: LRU
    // never hits them. Remembered as ghosts, their returns teach the
    // policy that a reused key comes back at ages 64-127 while a one-off
    // never does, so it keeps the hot keys and evicts the one-offs.
    assert_eq!(hot_set_hits(&mut Lru::default()), 0);
    let mut p = HitDensity::<BlockHash>::new(64);
    assert_eq!(hot_set_hits(&mut p), 20 * 16);
    assert!((0..16).all(|k| p.contains(h(k)) && p.class_of(h(k)) == Some(1)));
    // A one-off evicted is a ghost of the never-reused class.
    let ghost = (1001..5000).find(|k| p.is_ghost(h(*k))).map(h);
    assert_eq!(ghost.and_then(|g| p.class_of(g)), Some(0));
}

#[test]
fn hit_density_is_lru_until_it_has_evidence() {
    let mut p = HitDensity::<BlockHash>::new(100);
    for i in 1..=5 {
        p.insert(h(i), &at(0));
    }
    p.access(h(2), &at(1));
    // No reuse ended yet: every density is 0 and the oldest bucket goes
    // first, within it the least recent.
    assert_eq!(drain(&mut p, 2), [1, 3, 4, 5, 2]);
}

#[test]
fn lfu_evicts_least_used_then_least_recent() {
    let mut p = Lfu::<BlockHash>::default();
    for i in 1..=4 {
        p.insert(h(i), &at(0));
    }
    p.access(h(1), &at(1));
    p.access(h(1), &at(2));
    p.access(h(3), &at(3));
    assert_eq!(p.uses(h(1)), Some(3));
    assert_eq!(drain(&mut p, 4), [2, 4, 3, 1]);
}

#[test]
fn arc_adapts_to_a_ghost_hit() {
    let mut p = Arc::<BlockHash>::new(2);
    p.insert(h(1), &at(0));
    p.insert(h(2), &at(0));
    p.access(h(1), &at(1)); // 1 moves to the frequency list
    assert_eq!(
        p.victim(2, &mut |_| true.into()),
        Some(h(2)),
        "recency list goes first"
    );
    assert_eq!(p.target_recent(), 0);
    p.insert(h(2), &at(3)); // a ghost of the recency list comes back
    assert_eq!(p.target_recent(), 1, "recency was undervalued");
    assert_eq!(p.len(), 2);
    // Both now sit in the frequency list; 1 is its oldest.
    assert_eq!(drain(&mut p, 4), [1, 2]);
}

#[test]
fn s3fifo_filters_one_hit_blocks_and_remembers_ghosts() {
    let mut p = S3Fifo::<BlockHash>::new(10); // small queue target: 1
    for i in 1..=3 {
        p.insert(h(i), &at(0));
    }
    p.access(h(2), &at(1));
    assert_eq!(
        p.victim(2, &mut |_| true.into()),
        Some(h(1)),
        "unused small block goes"
    );
    assert_eq!(
        p.victim(2, &mut |_| true.into()),
        Some(h(3)),
        "used block 2 is promoted to main instead"
    );
    assert!(p.in_main(h(2)));
    p.insert(h(1), &at(3));
    assert!(p.in_main(h(1)), "a ghost comes back into main");
    p.access(h(1), &at(4));
    assert_eq!(
        drain(&mut p, 5),
        [2, 1],
        "main gives a used block another round"
    );
}

#[test]
fn ttl_reports_idle_blocks_and_evicts_lru() {
    let mut p = Ttl::<BlockHash>::new(100);
    p.insert(h(1), &at(0));
    p.insert(h(2), &at(50));
    assert_eq!(expired(&p, 120), [h(1)]);
    p.access(h(1), &at(130));
    assert_eq!(expired(&p, 160), [h(2)]);
    assert!(expired(&p, 40).is_empty());
    assert_eq!(drain(&mut p, 200), [2, 1]);
}

#[test]
fn cost_aware_keeps_used_and_expensive_blocks() {
    let mut p = CostAware::<BlockHash>::new(CostModel::default());
    p.insert(h(1), &at(0));
    p.insert(h(2), &at(0));
    p.access(h(1), &at(5));
    assert_eq!(
        p.victim(10, &mut |_| true.into()),
        Some(h(2)),
        "fewer uses, less value"
    );

    // Without a cheaper restore path, a deeper block costs more to recompute.
    let model = CostModel {
        restore_us: f64::INFINITY,
        ..CostModel::default()
    };
    assert!(model.miss_cost_us(100) > model.miss_cost_us(0));
    let mut p = CostAware::<BlockHash>::new(model);
    p.insert(
        h(3),
        &Use {
            depth: 100,
            ..Use::at(0)
        },
    );
    p.insert(h(4), &Use::at(0));
    assert_eq!(drain(&mut p, 1), [4, 3]);

    // Idle time wears value down: a block used twice long ago loses to one
    // used once just now.
    let mut p = CostAware::<BlockHash>::new(CostModel::default());
    p.insert(h(5), &at(0));
    p.access(h(5), &at(0));
    p.insert(h(6), &at(1_000_000));
    assert_eq!(p.victim(1_000_000, &mut |_| true.into()), Some(h(5)));
}

#[test]
fn every_policy_skips_ineligible_blocks() {
    for kind in PolicyKind::NODE {
        let mut p = PolicyConfig::of(kind).build::<BlockHash>(8).unwrap();
        for i in 1..=4 {
            p.insert(h(i), &at(i as u64));
        }
        let v = p.victim(10, &mut |k| (k.0 == 3).into());
        assert_eq!(v, Some(h(3)), "{kind}");
        assert_eq!(
            p.victim(10, &mut |k| (k.0 == 3).into()),
            None,
            "{kind}: 3 is gone"
        );
        assert_eq!(p.len(), 3, "{kind}");
        p.remove(h(1));
        assert_eq!(p.len(), 2, "{kind}");
        let mut rest = drain(p.as_mut(), 10);
        rest.sort();
        assert_eq!(rest, [2, 4], "{kind}");
    }
}

#[test]
fn coldest_visits_in_victim_order_without_evicting() {
    for kind in [PolicyKind::Lru, PolicyKind::Ttl, PolicyKind::Lfu] {
        let mut p = PolicyConfig::of(kind).build::<BlockHash>(8).unwrap();
        for i in 1..=4 {
            p.insert(h(i), &at(i as u64));
        }
        p.access(h(2), &at(5));
        p.access(h(1), &at(6));
        let mut seen = Vec::new();
        p.coldest(&mut |k| {
            seen.push(k.0);
            if seen.len() == 3 {
                Verdict::Stop
            } else {
                Verdict::Skip
            }
        });
        assert_eq!(p.len(), 4, "{kind}: nothing evicted");
        let order = drain(p.as_mut(), 7);
        assert_eq!(seen, order[..3], "{kind}");
    }
}
