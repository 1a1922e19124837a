//! The block state machine (`TokenBlock`) and its RAII handles.
//!
//! A property test drives random operation sequences against a small model
//! of the lifecycle: valid transitions change the block as the model says,
//! invalid ones are rejected with an error and change nothing.

use kvtier_core::BlockHash;
use kvtier_manager::Tier;
use kvtier_manager::block::{BlockError, BlockState, TokenBlock};
use kvtier_manager::pool::{BlockPool, PoolConfig};
use proptest::prelude::*;

const SIZE: usize = 4;

#[derive(Debug, Clone)]
enum Op {
    Init { salt: u128, parent: Option<u128> },
    Add(Vec<u32>),
    Commit,
    External { hash: u128, parent: Option<u128> },
    CheckRegister(Option<u128>),
    Reset,
}

fn op() -> impl Strategy<Value = Op> {
    let parent = proptest::option::of(0u128..3);
    prop_oneof![
        (0u128..2, parent.clone()).prop_map(|(salt, parent)| Op::Init { salt, parent }),
        proptest::collection::vec(0u32..100, 0..6).prop_map(Op::Add),
        Just(Op::Commit),
        (100u128..103, parent.clone()).prop_map(|(hash, parent)| Op::External { hash, parent }),
        parent.prop_map(Op::CheckRegister),
        Just(Op::Reset),
    ]
}

/// What the lifecycle allows, written as plainly as possible.
#[derive(Debug, Clone, PartialEq)]
struct Model {
    state: BlockState,
    salt: u128,
    parent: Option<BlockHash>,
    tokens: Vec<u32>,
    hash: Option<BlockHash>,
}

impl Model {
    fn new() -> Self {
        Model {
            state: BlockState::Reset,
            salt: 0,
            parent: None,
            tokens: vec![],
            hash: None,
        }
    }

    /// Applies `op`; `Ok(())` if it is valid.
    fn apply(&mut self, op: &Op) -> Result<(), ()> {
        match op {
            Op::Init { salt, parent } if self.state == BlockState::Reset => {
                self.state = BlockState::Partial;
                self.salt = *salt;
                self.parent = parent.map(BlockHash);
            }
            Op::Add(t)
                if self.state == BlockState::Partial && self.tokens.len() + t.len() <= SIZE =>
            {
                self.tokens.extend(t);
            }
            Op::Commit if self.state == BlockState::Partial && self.tokens.len() == SIZE => {
                self.hash = Some(BlockHash::chained(self.parent, self.salt, &self.tokens));
                self.state = BlockState::Complete;
            }
            Op::External { hash, parent } if self.state == BlockState::Reset => {
                self.hash = Some(BlockHash(*hash));
                self.parent = parent.map(BlockHash);
                self.state = BlockState::Complete;
            }
            Op::CheckRegister(p)
                if self.state == BlockState::Complete && p.map(BlockHash) == self.parent => {}
            Op::Reset => *self = Model::new(),
            _ => return Err(()),
        }
        Ok(())
    }
}

fn apply(block: &mut TokenBlock, op: &Op) -> Result<(), BlockError> {
    match op {
        Op::Init { salt, parent } => block.init_sequence(*salt, parent.map(BlockHash)),
        Op::Add(t) => block.add_tokens(t),
        Op::Commit => block.commit().map(|_| ()),
        Op::External { hash, parent } => {
            block.complete_external(BlockHash(*hash), parent.map(BlockHash))
        }
        Op::CheckRegister(p) => block.check_register(p.map(BlockHash)).map(|_| ()),
        Op::Reset => {
            block.reset();
            Ok(())
        }
    }
}

proptest! {
    #[test]
    fn state_machine_matches_model(ops in proptest::collection::vec(op(), 1..40)) {
        let mut block = TokenBlock::new(SIZE);
        let mut model = Model::new();
        for op in &ops {
            let before = block.clone();
            let got = apply(&mut block, op);
            let want = model.apply(op);
            prop_assert_eq!(got.is_ok(), want.is_ok(), "op {:?} on {:?}: {:?}", op, before, got);
            if got.is_err() {
                prop_assert_eq!(&block, &before, "rejected {:?} changed the block", op);
            }
            prop_assert_eq!(block.state(), model.state);
            prop_assert_eq!(block.tokens(), &model.tokens[..]);
            prop_assert_eq!(block.hash(), model.hash);
            prop_assert_eq!(block.parent(), model.parent);
        }
    }
}

#[test]
fn typed_errors_for_invalid_transitions() {
    let mut b = TokenBlock::new(2);
    assert_eq!(
        b.add_token(1),
        Err(BlockError::InvalidState {
            op: "add_tokens",
            state: BlockState::Reset
        })
    );
    b.init_sequence(0, None).unwrap();
    assert_eq!(
        b.add_tokens(&[1, 2, 3]),
        Err(BlockError::Overflow { room: 2, got: 3 })
    );
    b.add_token(1).unwrap();
    assert_eq!(b.commit(), Err(BlockError::NotFull { filled: 1, size: 2 }));
    assert!(matches!(
        b.check_register(None),
        Err(BlockError::InvalidState { op: "register", .. })
    ));
}

fn pool(capacity: usize) -> BlockPool {
    BlockPool::new(Tier::G1, PoolConfig::new(capacity, 2)).unwrap()
}

fn filled(
    pool: &BlockPool,
    parent: Option<BlockHash>,
    tokens: [u32; 2],
) -> kvtier_manager::pool::MutableBlock {
    let mut b = pool.allocate().unwrap();
    b.init_sequence(9, parent).unwrap();
    b.add_tokens(&tokens).unwrap();
    b.commit().unwrap();
    b
}

#[test]
fn dropping_a_mutable_handle_returns_its_slot() {
    let p = pool(2);
    let a = p.allocate().unwrap();
    let _b = p.allocate().unwrap();
    assert!(p.allocate().is_err(), "both slots are held");
    drop(a);
    assert_eq!(p.stats().free, 1);
    assert!(p.allocate().is_ok());
    p.check_invariants().unwrap();
}

#[test]
fn registering_an_incomplete_block_is_refused_and_the_block_comes_back() {
    let p = pool(2);
    let mut b = p.allocate().unwrap();
    b.init_sequence(1, None).unwrap();
    b.add_token(5).unwrap();
    let rejected = b.register().unwrap_err();
    assert!(matches!(
        rejected.error,
        BlockError::InvalidState {
            state: BlockState::Partial,
            ..
        }
    ));
    let mut b = rejected.block;
    assert_eq!(b.tokens(), &[5]);
    b.add_token(6).unwrap();
    b.commit().unwrap();
    let r = b.register().unwrap();
    assert_eq!(r.hash(), BlockHash::chained(None, 1, &[5, 6]));
    p.check_invariants().unwrap();
}

#[test]
fn parent_mismatch_is_refused() {
    let p = pool(3);
    let first = filled(&p, None, [1, 2]).register().unwrap();
    let other = filled(&p, None, [3, 4]).register().unwrap();
    let second = filled(&p, Some(first.hash()), [5, 6]);
    let rejected = second.register_after(Some(&other)).unwrap_err();
    assert_eq!(
        rejected.error,
        BlockError::ParentMismatch {
            expected: Some(first.hash()),
            actual: Some(other.hash())
        }
    );
    let ok = rejected.block.register_after(Some(&first)).unwrap();
    assert_eq!(
        ok.hash(),
        BlockHash::chained(Some(first.hash()), 9, &[5, 6])
    );
}

#[test]
fn last_immutable_handle_moves_the_block_to_the_inactive_pool() {
    let p = pool(2);
    let r = filled(&p, None, [1, 2]).register().unwrap();
    let hash = r.hash();
    let r2 = r.clone();
    let r3 = p.acquire(hash).unwrap();
    assert_eq!(p.stats().active, 1);
    drop(r);
    drop(r3);
    assert_eq!(p.stats().active, 1, "a clone still holds it");
    drop(r2);
    let s = p.stats();
    assert_eq!((s.active, s.inactive), (0, 1));
    assert!(p.is_readable(hash), "inactive blocks stay matchable");
    let again = p.acquire(hash).unwrap();
    assert_eq!(again.hash(), hash);
    p.check_invariants().unwrap();
}

#[test]
fn registering_a_duplicate_returns_the_existing_block_and_frees_the_slot() {
    let p = pool(3);
    let a = filled(&p, None, [1, 2]).register().unwrap();
    let b = filled(&p, None, [1, 2]).register().unwrap();
    assert_eq!(a.slot(), b.slot());
    let s = p.stats();
    assert_eq!((s.free, s.active, s.dedup_hits), (2, 1, 1));
    p.check_invariants().unwrap();
}

#[test]
fn external_ids_register_without_tokens() {
    let p = pool(2);
    let mut b = p.allocate().unwrap();
    b.complete_external(BlockHash(42), None).unwrap();
    let r = b.register().unwrap();
    assert_eq!(r.hash(), BlockHash(42));
}
