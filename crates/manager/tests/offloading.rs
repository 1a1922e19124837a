//! The vLLM-shaped [`OffloadingManager`] against a model of vLLM's
//! semantics, under random sequences of calls: protected blocks are never
//! evicted, stores are loadable only after `complete_store`, failed stores
//! leave nothing, and the events replay to exactly what is stored.

use std::collections::{BTreeSet, HashMap, HashSet};

use kvtier_core::BlockHash;
use kvtier_manager::Tier;
use kvtier_manager::offloading::{OffloadError, OffloadingManager};
use kvtier_manager::pool::{BlockPool, PoolConfig};
use proptest::prelude::*;

const CAPACITY: usize = 6;
const UNIVERSE: u128 = 10;

fn manager() -> OffloadingManager {
    let pool = BlockPool::new(
        Tier::G2,
        PoolConfig {
            capacity_blocks: CAPACITY,
            tokens_per_block: 16,
            record_events: true,
            ..PoolConfig::default()
        },
    )
    .expect("pool");
    OffloadingManager::new(vec![pool]).expect("manager")
}

fn h(i: u8) -> BlockHash {
    BlockHash(u128::from(i) + 1)
}

#[derive(Debug, Clone)]
enum Op {
    Store(Vec<u8>),
    CompleteStore(Vec<u8>, bool),
    Load(Vec<u8>),
    CompleteLoad(Vec<u8>),
    Touch(Vec<u8>),
    Lookup(Vec<u8>),
}

fn hashes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(0..UNIVERSE as u8, 1..5)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => hashes().prop_map(Op::Store),
        3 => (hashes(), prop::bool::weighted(0.8)).prop_map(|(v, ok)| Op::CompleteStore(v, ok)),
        2 => hashes().prop_map(Op::Load),
        2 => hashes().prop_map(Op::CompleteLoad),
        1 => hashes().prop_map(Op::Touch),
        1 => hashes().prop_map(Op::Lookup),
    ]
}

/// What vLLM's manager promises, as sets.
#[derive(Default)]
struct Model {
    /// Stored and loadable.
    ready: BTreeSet<BlockHash>,
    /// Prepared for store, not completed.
    storing: BTreeSet<BlockHash>,
    /// Outstanding loads per block.
    loads: HashMap<BlockHash, u32>,
}

impl Model {
    fn lookup(&self, keys: &[BlockHash]) -> usize {
        keys.iter().take_while(|k| self.ready.contains(k)).count()
    }

    fn protected(&self, k: BlockHash) -> bool {
        self.loads.get(&k).copied().unwrap_or(0) > 0
    }
}

fn check(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let m = manager();
    let mut model = Model::default();
    // The stored set as the events tell it.
    let mut replayed: BTreeSet<BlockHash> = BTreeSet::new();
    for op in ops {
        match op {
            Op::Store(v) => {
                let keys: Vec<BlockHash> = v.iter().map(|i| h(*i)).collect();
                let before: BTreeSet<BlockHash> = model.ready.clone();
                let mut wanted = Vec::new();
                let mut seen = HashSet::new();
                for k in &keys {
                    if seen.insert(*k) && !model.ready.contains(k) && !model.storing.contains(k) {
                        wanted.push(*k);
                    }
                }
                match m.prepare_store(&keys).expect("prepare_store") {
                    None => {
                        // Refused only when even evicting every unprotected
                        // block would not make room; then nothing changed.
                        let evictable =
                            model.ready.iter().filter(|k| !model.protected(**k)).count();
                        let free = CAPACITY - model.ready.len() - model.storing.len();
                        prop_assert!(free + evictable < wanted.len());
                        prop_assert_eq!(
                            m.lookup(&before.iter().copied().collect::<Vec<_>>()),
                            before.len()
                        );
                    }
                    Some(out) => {
                        prop_assert_eq!(&out.to_store, &wanted);
                        prop_assert_eq!(
                            out.store_spec
                                .blocks
                                .iter()
                                .map(|b| b.hash)
                                .collect::<Vec<_>>(),
                            wanted.clone()
                        );
                        for e in &out.evicted {
                            prop_assert!(model.ready.contains(e), "evicted {e} was not stored");
                            prop_assert!(!model.protected(*e), "evicted protected {e}");
                            model.ready.remove(e);
                        }
                        model.storing.extend(wanted.iter().copied());
                        prop_assert!(model.ready.len() + model.storing.len() <= CAPACITY);
                        // Not loadable before complete_store.
                        for k in &wanted {
                            prop_assert_eq!(m.lookup(&[*k]), 0);
                            prop_assert_eq!(
                                m.prepare_load(&[*k]),
                                Err(OffloadError::NotStored(*k))
                            );
                        }
                    }
                }
            }
            Op::CompleteStore(v, success) => {
                let keys: Vec<BlockHash> = v.iter().map(|i| h(*i)).collect();
                m.complete_store(&keys, success);
                for k in &keys {
                    if model.storing.remove(k) && success {
                        model.ready.insert(*k);
                    }
                }
                for k in &keys {
                    let expect = usize::from(model.ready.contains(k));
                    prop_assert_eq!(
                        m.lookup(&[*k]),
                        expect,
                        "block {} after complete_store({})",
                        k,
                        success
                    );
                }
            }
            Op::Load(v) => {
                let keys: Vec<BlockHash> = v.iter().map(|i| h(*i)).collect();
                let all_ready = keys.iter().all(|k| model.ready.contains(k));
                match m.prepare_load(&keys) {
                    Ok(spec) => {
                        prop_assert!(all_ready);
                        prop_assert_eq!(spec.blocks.len(), keys.len());
                        for (b, k) in spec.blocks.iter().zip(&keys) {
                            prop_assert_eq!(b.hash, *k);
                            prop_assert_eq!(b.tier, Tier::G2);
                            *model.loads.entry(*k).or_default() += 1;
                        }
                    }
                    Err(OffloadError::NotStored(k)) => {
                        prop_assert!(!all_ready);
                        prop_assert!(!model.ready.contains(&k));
                    }
                    Err(e) => prop_assert!(false, "unexpected {e}"),
                }
            }
            Op::CompleteLoad(v) => {
                let keys: Vec<BlockHash> = v.iter().map(|i| h(*i)).collect();
                let mut expect_ok = true;
                for k in &keys {
                    match model.loads.get_mut(k) {
                        Some(n) if *n > 0 => *n -= 1,
                        _ => expect_ok = false,
                    }
                }
                prop_assert_eq!(m.complete_load(&keys).is_ok(), expect_ok);
            }
            Op::Touch(v) => {
                let keys: Vec<BlockHash> = v.iter().map(|i| h(*i)).collect();
                m.touch(&keys);
            }
            Op::Lookup(v) => {
                let keys: Vec<BlockHash> = v.iter().map(|i| h(*i)).collect();
                prop_assert_eq!(m.lookup(&keys), model.lookup(&keys));
            }
        }
        for e in m.take_events() {
            prop_assert_eq!(e.medium.as_str(), "CPU");
            prop_assert_eq!(e.block_size, 16);
            for k in e.block_hashes {
                if e.removed {
                    prop_assert!(replayed.remove(&k), "removed {k} that was not stored");
                } else {
                    prop_assert!(replayed.insert(k), "stored {k} twice");
                }
            }
        }
        prop_assert_eq!(&replayed, &model.ready, "events replay to the stored set");
        // Protected blocks stay loadable.
        for (k, n) in &model.loads {
            if *n > 0 {
                prop_assert_eq!(m.lookup(&[*k]), 1, "protected {} lost", k);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn offloading_manager_keeps_vllm_semantics(ops in prop::collection::vec(op(), 1..60)) {
        check(ops)?;
    }
}

#[test]
fn a_failed_store_leaves_nothing_and_evictions_are_reported() {
    let m = manager();
    let keys: Vec<BlockHash> = (0..CAPACITY as u8).map(h).collect();
    let out = m.prepare_store(&keys).expect("prepare").expect("room");
    assert_eq!(out.to_store, keys);
    assert!(out.evicted.is_empty());
    m.complete_store(&keys, true);
    assert_eq!(m.lookup(&keys), CAPACITY);
    // Protect the first block; a store of two more evicts two others.
    m.prepare_load(&keys[..1]).expect("load");
    let more = [h(20), h(21)];
    let out = m.prepare_store(&more).expect("prepare").expect("room");
    assert_eq!(out.evicted.len(), 2);
    assert!(!out.evicted.contains(&keys[0]));
    m.complete_store(&more, false);
    assert_eq!(m.lookup(&more[..1]), 0);
    assert_eq!(m.lookup(&more[1..]), 0);
    // The failed store's slots are free again: storing them again evicts
    // nothing.
    let out = m.prepare_store(&more).expect("prepare").expect("room");
    assert!(out.evicted.is_empty());
    m.complete_load(&keys[..1]).expect("complete load");
    assert_eq!(
        m.complete_load(&keys[..1]),
        Err(OffloadError::NotLoading(keys[0]))
    );
    let events = m.take_events();
    let stored: usize = events
        .iter()
        .filter(|e| !e.removed)
        .map(|e| e.block_hashes.len())
        .sum();
    let removed: usize = events
        .iter()
        .filter(|e| e.removed)
        .map(|e| e.block_hashes.len())
        .sum();
    assert_eq!((stored, removed), (CAPACITY, 2));
}
