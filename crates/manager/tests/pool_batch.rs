//! The pool's batch calls (one lock for many keys, on the node's control
//! path) against the same calls made one key at a time: two pools fed the
//! same operations, one through each, must agree on every block's
//! presence, the counts, the events and the policy's order (the victims
//! that later allocations evict), under every node policy.

use std::sync::Arc;

use kvtier_core::BlockHash;
use kvtier_manager::Tier;
use kvtier_manager::pool::{BlockPool, Clock, ImmutableBlock, IncomingBlock, PoolConfig};
use kvtier_policy::{PolicyConfig, PolicyKind};
use proptest::prelude::*;

/// Keys the operations draw from.
const IDS: u128 = 10;

#[derive(Debug, Clone)]
enum Op {
    /// Registers a fresh block (both pools, one at a time).
    Register(u128),
    /// Handles for the leading run of these registered.
    AcquirePrefix(Vec<u128>),
    /// Handles for each of these registered.
    AcquirePresent(Vec<u128>),
    /// Drops the last `n` handles.
    Release(usize),
    /// Incoming guards for these.
    BeginIncoming(Vec<u128>),
    /// Finishes the last `n` incoming guards (their handles dropped).
    Finish(usize),
    /// Removes these if inactive.
    RemoveInactive(Vec<u128>),
}

fn ids() -> impl Strategy<Value = Vec<u128>> {
    proptest::collection::vec(0..IDS, 0..6)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..IDS).prop_map(Op::Register),
        2 => ids().prop_map(Op::AcquirePrefix),
        2 => ids().prop_map(Op::AcquirePresent),
        2 => (0usize..6).prop_map(Op::Release),
        2 => ids().prop_map(Op::BeginIncoming),
        2 => (0usize..6).prop_map(Op::Finish),
        1 => ids().prop_map(Op::RemoveInactive),
    ]
}

/// One pool and what the test holds of it.
struct Side {
    pool: BlockPool,
    held: Vec<ImmutableBlock>,
    incoming: Vec<IncomingBlock>,
}

impl Side {
    fn new(kind: PolicyKind) -> Self {
        let mut cfg = PoolConfig::new(6, 1);
        cfg.policy = PolicyConfig::of(kind);
        cfg.record_events = true;
        cfg.evict_on_allocate = true;
        // A clock that stands still: both pools see the same times, so
        // time-aware policies (TTL, cost-aware) decide alike.
        let clock: Clock = Arc::new(|| 1_000);
        Self {
            pool: BlockPool::with_lock(Tier::G2, cfg, clock).expect("a valid pool"),
            held: Vec::new(),
            incoming: Vec::new(),
        }
    }

    fn register(&mut self, id: u128) {
        if let Ok(mut b) = self.pool.allocate() {
            b.complete_external(BlockHash(id), None)
                .expect("an external block completes");
            drop(b.register());
        }
    }

    /// The last `n` of `v`, taken out.
    fn tail<T>(v: &mut Vec<T>, n: usize) -> Vec<T> {
        v.split_off(v.len().saturating_sub(n))
    }

    fn one_at_a_time(&mut self, op: &Op) {
        let p = self.pool.clone();
        match op {
            Op::Register(id) => self.register(*id),
            Op::AcquirePrefix(ids) => {
                for id in ids {
                    match p.acquire(BlockHash(*id)) {
                        Some(b) => self.held.push(b),
                        None => break,
                    }
                }
            }
            Op::AcquirePresent(ids) => {
                self.held
                    .extend(ids.iter().filter_map(|id| p.acquire(BlockHash(*id))));
            }
            Op::Release(n) => drop(Self::tail(&mut self.held, *n)),
            Op::BeginIncoming(ids) => self.incoming.extend(
                ids.iter()
                    .filter_map(|id| p.begin_incoming(BlockHash(*id), None).ok()),
            ),
            Op::Finish(n) => {
                for g in Self::tail(&mut self.incoming, *n) {
                    drop(g.finish());
                }
            }
            Op::RemoveInactive(ids) => {
                for id in ids {
                    p.remove_inactive(BlockHash(*id));
                }
            }
        }
    }

    fn batched(&mut self, op: &Op) {
        let p = self.pool.clone();
        let keys = |ids: &[u128]| ids.iter().map(|i| BlockHash(*i)).collect::<Vec<_>>();
        match op {
            Op::Register(id) => self.register(*id),
            Op::AcquirePrefix(ids) => self.held.extend(p.acquire_prefix(&keys(ids))),
            Op::AcquirePresent(ids) => self.held.extend(p.acquire_present(&keys(ids))),
            Op::Release(n) => p.release_all(Self::tail(&mut self.held, *n)),
            Op::BeginIncoming(ids) => self.incoming.extend(
                p.begin_incoming_many(keys(ids).into_iter().map(|k| (k, None)))
                    .into_iter()
                    .flatten(),
            ),
            Op::Finish(n) => p.finish_all(Self::tail(&mut self.incoming, *n)),
            Op::RemoveInactive(ids) => {
                p.remove_inactive_many(&keys(ids));
            }
        }
    }
}

fn policy() -> impl Strategy<Value = PolicyKind> {
    proptest::sample::select(PolicyKind::NODE.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn batch_calls_do_what_single_calls_do(
        kind in policy(),
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let (mut single, mut batch) = (Side::new(kind), Side::new(kind));
        for op in &ops {
            single.one_at_a_time(op);
            batch.batched(op);
            for side in [&single, &batch] {
                side.pool.check_invariants().map_err(TestCaseError::fail)?;
            }
            prop_assert_eq!(single.pool.stats(), batch.pool.stats(), "{:?} after {:?}", kind, op);
            let all: Vec<BlockHash> = (0..IDS).map(BlockHash).collect();
            prop_assert_eq!(single.pool.presence_many(&all), batch.pool.presence_many(&all));
            prop_assert_eq!(single.pool.drain_events(), batch.pool.drain_events());
        }
        // Everything let go, the policies must agree on the order: the
        // victims of filling every slot with new blocks.
        for side in [&mut single, &mut batch] {
            side.held.clear();
            side.incoming.clear();
            for id in IDS..IDS + 6 {
                side.register(id);
            }
        }
        prop_assert_eq!(single.pool.drain_events(), batch.pool.drain_events());
    }
}
