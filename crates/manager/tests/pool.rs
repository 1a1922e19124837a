//! `BlockPool`: allocation, eviction of inactive blocks only, and in-flight
//! protection.

use kvtier_core::BlockHash;
use kvtier_manager::Tier;
use kvtier_manager::block::BlockError;
use kvtier_manager::pool::{BlockPool, ImmutableBlock, PoolConfig, PoolError, PoolEvent, Presence};

fn pool(capacity: usize) -> BlockPool {
    let mut cfg = PoolConfig::new(capacity, 1);
    cfg.record_events = true;
    BlockPool::new(Tier::G2, cfg).unwrap()
}

/// Registers the external block `id` after `parent`.
fn put(pool: &BlockPool, id: u128, parent: Option<u128>) -> ImmutableBlock {
    let mut b = pool.allocate().unwrap();
    b.complete_external(BlockHash(id), parent.map(BlockHash))
        .unwrap();
    b.register().unwrap()
}

#[test]
fn invalid_configs_are_refused() {
    assert!(BlockPool::new(Tier::G1, PoolConfig::new(0, 1)).is_err());
    assert!(BlockPool::new(Tier::G1, PoolConfig::new(1, 0)).is_err());
    let mut cfg = PoolConfig::new(4, 1);
    cfg.low_watermark = 0.95;
    assert!(matches!(
        BlockPool::new(Tier::G1, cfg),
        Err(PoolError::Config(_))
    ));
}

#[test]
fn allocation_evicts_only_inactive_blocks_in_policy_order() {
    let p = pool(3);
    drop(put(&p, 1, None));
    let held = put(&p, 2, None);
    drop(put(&p, 3, None));
    // Free: none. Inactive: 1 (older), 3. Active: 2.
    let m = p.allocate().unwrap();
    assert!(
        !p.is_readable(BlockHash(1)),
        "LRU victim is the oldest inactive block"
    );
    assert!(p.is_readable(BlockHash(2)) && p.is_readable(BlockHash(3)));
    drop(m);
    let _m = p.allocate().unwrap(); // the free slot
    let _m2 = p.allocate().unwrap(); // evicts 3
    assert!(!p.is_readable(BlockHash(3)));
    assert!(matches!(p.allocate(), Err(PoolError::Exhausted { .. })));
    assert!(
        p.is_readable(held.hash()),
        "a referenced block is never evicted"
    );
    p.check_invariants().unwrap();
    let events = p.drain_events();
    assert!(events.contains(&PoolEvent::Removed {
        tier: Tier::G2,
        hash: BlockHash(1)
    }));
}

/// Without eviction by allocation (how the block manager runs its pools),
/// a full pool refuses slots, for allocations and incoming transfers
/// alike, and its inactive blocks stay.
#[test]
fn a_pool_that_does_not_evict_on_allocate_refuses_when_full() {
    let mut cfg = PoolConfig::new(2, 1);
    cfg.evict_on_allocate = false;
    let p = BlockPool::new(Tier::G3, cfg).unwrap();
    drop(put(&p, 1, None));
    drop(put(&p, 2, None));
    assert_eq!(
        p.available(),
        2,
        "evictable by the owner, not by allocation"
    );
    assert!(matches!(
        p.allocate(),
        Err(PoolError::Exhausted { available: 0, .. })
    ));
    assert!(matches!(
        p.begin_incoming(BlockHash(3), None),
        Err(PoolError::Exhausted { available: 0, .. })
    ));
    assert!(p.is_readable(BlockHash(1)) && p.is_readable(BlockHash(2)));
    assert_eq!(p.stats().evictions, 0);
    // Room made by the owner (here: a block leaving) is usable at once.
    for leaving in p.plan_leaving(1) {
        leaving.finish();
    }
    assert!(p.begin_incoming(BlockHash(3), None).is_ok());
    p.check_invariants().unwrap();
}

#[test]
fn allocate_many_is_all_or_nothing() {
    let p = pool(3);
    drop(put(&p, 1, None));
    let _held = put(&p, 2, None);
    let before = p.stats();
    assert!(matches!(
        p.allocate_many(3),
        Err(PoolError::Exhausted {
            wanted: 3,
            available: 2,
            ..
        })
    ));
    assert_eq!(p.stats(), before, "a failed allocation evicts nothing");
    assert!(p.is_readable(BlockHash(1)));
    assert_eq!(p.allocate_many(2).unwrap().len(), 2);
}

#[test]
fn pinned_blocks_are_not_evicted_until_unpinned() {
    let p = pool(1);
    drop(put(&p, 1, None));
    p.pin(BlockHash(1)).unwrap();
    assert!(p.allocate().is_err());
    p.unpin(BlockHash(1)).unwrap();
    assert!(p.allocate().is_ok());
    assert!(matches!(
        p.pin(BlockHash(1)),
        Err(PoolError::NotResident(_))
    ));
}

#[test]
fn leaves_are_evicted_before_their_parents() {
    let p = pool(3);
    // Chain 1 <- 2 <- 3, registered root first: LRU alone would evict 1.
    drop(put(&p, 1, None));
    drop(put(&p, 2, Some(1)));
    drop(put(&p, 3, Some(2)));
    let _a = p.allocate().unwrap();
    assert!(!p.is_readable(BlockHash(3)), "the leaf goes first");
    let _b = p.allocate().unwrap();
    assert!(!p.is_readable(BlockHash(2)), "then its parent, now a leaf");
    assert!(p.is_readable(BlockHash(1)));
    p.check_invariants().unwrap();
}

#[test]
fn a_parent_goes_when_only_parents_are_evictable() {
    let p = pool(2);
    drop(put(&p, 1, None));
    let _child = put(&p, 2, Some(1));
    let _a = p.allocate().unwrap();
    assert!(
        !p.is_readable(BlockHash(1)),
        "the only evictable block goes"
    );
    p.check_invariants().unwrap();
}

#[test]
fn incoming_blocks_are_unreadable_until_finished() {
    let p = pool(2);
    let incoming = p.begin_incoming(BlockHash(7), None).unwrap();
    assert_eq!(p.presence(BlockHash(7)), Some(Presence::Filling));
    assert!(p.acquire(BlockHash(7)).is_none());
    assert!(matches!(
        p.begin_incoming(BlockHash(7), None),
        Err(PoolError::InFlight(_))
    ));
    // A block computed meanwhile cannot register over the transfer.
    let mut b = p.allocate().unwrap();
    b.complete_external(BlockHash(7), None).unwrap();
    let rejected = b.register().unwrap_err();
    assert_eq!(rejected.error, BlockError::InFlight(BlockHash(7)));
    drop(rejected);
    let block = incoming.finish();
    assert!(p.is_readable(BlockHash(7)));
    assert_eq!(block.hash(), BlockHash(7));
    p.check_invariants().unwrap();
}

#[test]
fn a_failed_incoming_transfer_returns_the_slot() {
    let p = pool(1);
    let incoming = p.begin_incoming(BlockHash(7), None).unwrap();
    assert!(
        p.allocate().is_err(),
        "the slot is reserved and not evictable"
    );
    drop(incoming);
    assert_eq!(p.presence(BlockHash(7)), None);
    assert_eq!(p.stats().free, 1);
    p.check_invariants().unwrap();
}

#[test]
fn an_outgoing_block_is_not_evicted_and_a_move_removes_it() {
    let p = pool(1);
    drop(put(&p, 1, None));
    let copy = p.begin_outgoing(BlockHash(1), false).unwrap();
    assert!(p.allocate().is_err(), "source of a copy is not evictable");
    copy.finish();
    assert!(p.is_readable(BlockHash(1)), "a copy leaves the source");
    let mv = p.begin_outgoing(BlockHash(1), true).unwrap();
    assert!(p.is_readable(BlockHash(1)), "readable while being moved");
    mv.finish();
    assert!(
        !p.is_readable(BlockHash(1)),
        "a finished move removes the source"
    );
    p.check_invariants().unwrap();
}

#[test]
fn a_move_does_not_remove_a_block_someone_holds() {
    let p = pool(2);
    let held = put(&p, 1, None);
    p.begin_outgoing(BlockHash(1), true).unwrap().finish();
    assert!(p.is_readable(held.hash()));
    p.check_invariants().unwrap();
}

#[test]
fn planned_leaving_blocks_return_on_failure() {
    let p = pool(3);
    for i in 1..=3 {
        drop(put(&p, i, None));
    }
    let leaving = p.plan_leaving(2);
    assert_eq!(
        leaving.iter().map(|l| l.hash()).collect::<Vec<_>>(),
        [BlockHash(1), BlockHash(2)]
    );
    // Leaving blocks are readable but no second plan picks them.
    assert!(p.is_readable(BlockHash(1)));
    assert_eq!(
        p.plan_leaving(3)
            .iter()
            .map(|l| l.hash())
            .collect::<Vec<_>>(),
        [BlockHash(3)]
    );
    let mut it = leaving.into_iter();
    it.next().unwrap().finish();
    drop(it); // the second transfer failed
    assert!(!p.is_readable(BlockHash(1)));
    assert!(p.is_readable(BlockHash(2)));
    p.check_invariants().unwrap();
    assert_eq!(p.stats().inactive, 2);
}

mod under_pressure {
    //! Random operation sequences on a tiny pool under every policy: the
    //! pool's invariants hold after every step, and blocks that are
    //! referenced, pinned, in flight or leaving are never evicted.

    use super::*;
    use kvtier_manager::policy::{PolicyConfig, PolicyKind};
    use kvtier_manager::pool::{IncomingBlock, OutgoingBlock};
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Register {
            id: u128,
            parent: Option<u128>,
            keep: bool,
        },
        Acquire(u128),
        Release(usize),
        Pin(u128),
        Unpin(u128),
        BeginIncoming(u128),
        EndIncoming {
            index: usize,
            ok: bool,
        },
        BeginOutgoing {
            id: u128,
            moves: bool,
        },
        PlanLeaving(usize),
        EndOutgoing {
            index: usize,
            ok: bool,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        let id = 0u128..10;
        prop_oneof![
            4 => (id.clone(), proptest::option::of(0u128..10), any::<bool>())
                .prop_map(|(id, parent, keep)| Op::Register { id, parent, keep }),
            1 => id.clone().prop_map(Op::Acquire),
            2 => any::<usize>().prop_map(Op::Release),
            1 => id.clone().prop_map(Op::Pin),
            1 => id.clone().prop_map(Op::Unpin),
            1 => id.clone().prop_map(Op::BeginIncoming),
            1 => (any::<usize>(), any::<bool>()).prop_map(|(index, ok)| Op::EndIncoming { index, ok }),
            1 => (id, any::<bool>()).prop_map(|(id, moves)| Op::BeginOutgoing { id, moves }),
            1 => (0usize..3).prop_map(Op::PlanLeaving),
            1 => (any::<usize>(), any::<bool>()).prop_map(|(index, ok)| Op::EndOutgoing { index, ok }),
        ]
    }

    fn policy() -> impl Strategy<Value = PolicyKind> {
        proptest::sample::select(PolicyKind::NODE.to_vec())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn protected_blocks_survive_and_invariants_hold(
            kind in policy(),
            ops in proptest::collection::vec(op(), 1..80),
        ) {
            let mut cfg = PoolConfig::new(4, 1);
            cfg.policy = PolicyConfig::of(kind);
            let p = BlockPool::new(Tier::G1, cfg).unwrap();
            let mut held: Vec<ImmutableBlock> = Vec::new();
            let mut pins: Vec<u128> = Vec::new();
            let mut incoming: Vec<IncomingBlock> = Vec::new();
            let mut outgoing: Vec<OutgoingBlock> = Vec::new();
            for op in ops {
                match op {
                    Op::Register { id, parent, keep } => {
                        if let Ok(mut b) = p.allocate() {
                            b.complete_external(h(id), parent.map(h)).unwrap();
                            if let Ok(r) = b.register()
                                && keep
                            {
                                held.push(r);
                            }
                        }
                    }
                    Op::Acquire(id) => held.extend(p.acquire(h(id))),
                    Op::Release(i) => {
                        if !held.is_empty() {
                            held.swap_remove(i % held.len());
                        }
                    }
                    Op::Pin(id) => {
                        if p.pin(h(id)).is_ok() {
                            pins.push(id);
                        }
                    }
                    Op::Unpin(id) => {
                        if let Some(i) = pins.iter().position(|x| *x == id) {
                            pins.swap_remove(i);
                            p.unpin(h(id)).unwrap();
                        }
                    }
                    Op::BeginIncoming(id) => incoming.extend(p.begin_incoming(h(id), None).ok()),
                    Op::EndIncoming { index, ok } => {
                        if !incoming.is_empty() {
                            let g = incoming.swap_remove(index % incoming.len());
                            if ok {
                                drop(g.finish());
                            }
                        }
                    }
                    Op::BeginOutgoing { id, moves } => outgoing.extend(p.begin_outgoing(h(id), moves).ok()),
                    Op::PlanLeaving(n) => outgoing.extend(p.plan_leaving(n)),
                    Op::EndOutgoing { index, ok } => {
                        if !outgoing.is_empty() {
                            let g = outgoing.swap_remove(index % outgoing.len());
                            if ok {
                                g.finish();
                            }
                        }
                    }
                }
                p.check_invariants().map_err(TestCaseError::fail)?;
                for b in &held {
                    prop_assert!(p.is_readable(b.hash()), "{kind}: referenced {:?} evicted", b.hash());
                }
                for id in &pins {
                    prop_assert!(p.is_readable(h(*id)), "{kind}: pinned {id} evicted");
                }
                for g in &outgoing {
                    prop_assert!(p.is_readable(g.hash()), "{kind}: in-flight source {:?} evicted", g.hash());
                }
                for g in &incoming {
                    prop_assert_eq!(p.presence(g.hash()), Some(Presence::Filling));
                }
            }
            drop((held, incoming, outgoing));
            for id in pins {
                p.unpin(h(id)).unwrap();
            }
            let s = p.stats();
            prop_assert_eq!(s.free + s.inactive, 4, "everything released: {:?}", s);
            p.check_invariants().map_err(TestCaseError::fail)?;
        }
    }

    fn h(i: u128) -> BlockHash {
        BlockHash(i)
    }
}
