//! The extent allocator against a model: a byte-ownership map.

use std::collections::BTreeMap;

use kvtier_backend::ExtentAllocator;
use proptest::prelude::*;

const CAP: u64 = 64;

#[derive(Debug, Clone)]
enum Op {
    Alloc(u64),
    /// Free the n-th live extent (modulo the number live).
    Free(usize),
    /// Free something never allocated (must change nothing).
    FreeBogus(u64, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u64..=24).prop_map(Op::Alloc),
        2 => any::<usize>().prop_map(Op::Free),
        1 => (0u64..CAP, 1u64..8).prop_map(|(o, l)| Op::FreeBogus(o, l)),
    ]
}

/// Longest run of bytes no live extent covers.
fn largest_hole(live: &BTreeMap<u64, u64>) -> u64 {
    let mut best = 0;
    let mut cursor = 0;
    for (&o, &l) in live {
        best = best.max(o - cursor);
        cursor = o + l;
    }
    best.max(CAP - cursor)
}

proptest! {
    #[test]
    fn matches_model(ops in prop::collection::vec(op(), 1..200)) {
        let mut a = ExtentAllocator::new(CAP);
        // Model: live extents offset -> len (tag = offset + 1000).
        let mut live: BTreeMap<u64, u64> = BTreeMap::new();
        let mut next_tag = 1u64;
        let mut tags: BTreeMap<u64, u64> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Alloc(len) => {
                    let tag = next_tag;
                    next_tag += 1;
                    match a.allocate(len, tag) {
                        Some(o) => {
                            // No overlap with anything live, inside the file.
                            prop_assert!(o + len <= CAP);
                            for (&lo, &ll) in &live {
                                prop_assert!(o + len <= lo || lo + ll <= o,
                                    "{o}+{len} overlaps {lo}+{ll}");
                            }
                            live.insert(o, len);
                            tags.insert(o, tag);
                        }
                        // Refused only when no hole is large enough: freed
                        // space is reused (and merged) as soon as it fits.
                        None => prop_assert!(largest_hole(&live) < len,
                            "refused {len} with a hole of {}", largest_hole(&live)),
                    }
                }
                Op::Free(n) => {
                    if live.is_empty() { continue; }
                    let (&o, &l) = live.iter().nth(n % live.len()).unwrap();
                    let tag = tags[&o];
                    // A wrong owner frees nothing.
                    prop_assert!(!a.free(o, l, tag + 1_000_000));
                    prop_assert!(a.free(o, l, tag));
                    // A second free of the same extent is a no-op.
                    prop_assert!(!a.free(o, l, tag));
                    live.remove(&o);
                    tags.remove(&o);
                }
                Op::FreeBogus(o, l) => {
                    let is_live = live.get(&o) == Some(&l);
                    if !is_live {
                        prop_assert!(!a.free(o, l, 0));
                    }
                }
            }
            let used: u64 = live.values().sum();
            prop_assert_eq!(a.used_bytes(), used);
            prop_assert_eq!(a.live(), live.len());
            // Free extents are disjoint, not adjacent and cover the rest.
            let free: Vec<(u64, u64)> = a.free_extents().collect();
            prop_assert_eq!(free.iter().map(|f| f.1).sum::<u64>(), CAP - used);
            for w in free.windows(2) {
                prop_assert!(w[0].0 + w[0].1 < w[1].0, "free extents {:?} touch", w);
            }
            let model_live: Vec<(u64, u64)> = live.iter().map(|(&o, &l)| (o, l)).collect();
            let got_live: Vec<(u64, u64)> = a.live_extents().map(|(o, e)| (o, e.len)).collect();
            prop_assert_eq!(got_live, model_live);
        }
    }

    #[test]
    fn reserve_rebuilds_the_same_map(lens in prop::collection::vec(1u64..10, 1..20)) {
        let mut a = ExtentAllocator::new(CAP);
        let mut got = Vec::new();
        for (i, l) in lens.iter().enumerate() {
            if let Some(o) = a.allocate(*l, i as u64) {
                got.push((o, *l, i as u64));
            }
        }
        let mut b = ExtentAllocator::new(CAP);
        for &(o, l, t) in &got {
            prop_assert!(b.reserve(o, l, t).is_ok());
            // The same range cannot be reserved twice.
            prop_assert!(b.reserve(o, l, t).is_err());
        }
        prop_assert_eq!(a.free_extents().collect::<Vec<_>>(), b.free_extents().collect::<Vec<_>>());
        prop_assert_eq!(a.used_bytes(), b.used_bytes());
    }
}

#[test]
fn full_and_reuse() {
    let mut a = ExtentAllocator::new(16);
    assert_eq!(a.allocate(8, 1), Some(0));
    assert_eq!(a.allocate(8, 2), Some(8));
    assert_eq!(a.allocate(1, 3), None);
    assert!(a.free(0, 8, 1));
    assert_eq!(a.allocate(8, 4), Some(0));
    assert!(a.reserve(15, 2, 9).is_err());
    assert!(a.reserve(3, 0, 9).is_err());
}
