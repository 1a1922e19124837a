//! The lifecycle of one block's contents, as a pure state machine.
//!
//! A block goes `Reset -> Partial -> Complete -> Registered` (Dynamo KVBM's
//! `BlockState`). [`TokenBlock`] holds the states before registration: the
//! owner of a mutable handle fills it token by token, commits it (which
//! computes its chained [`BlockHash`]) and hands it to its pool to register.
//! Every transition checks its precondition and, when it fails, returns a
//! [`BlockError`] and leaves the block exactly as it was, so a caller can
//! correct itself and retry.
//!
//! | From     | To         | Trigger                                  | Validation              |
//! |----------|------------|------------------------------------------|-------------------------|
//! | Reset    | Partial    | [`TokenBlock::init_sequence`]            | block is in Reset       |
//! | Partial  | Partial    | [`TokenBlock::add_token`] / `add_tokens` | room for every token    |
//! | Partial  | Complete   | [`TokenBlock::commit`]                   | block is full           |
//! | Reset    | Complete   | [`TokenBlock::complete_external`]        | block is in Reset       |
//! | Complete | Registered | `MutableBlock::register` (pool)          | block is Complete       |
//! | Partial / Complete | Reset | [`TokenBlock::reset`] or drop      | none                    |
//! | Registered | Reset    | drop of the last handle + eviction       | automatic               |

use kvtier_core::BlockHash;
use serde::{Deserialize, Serialize};

/// Where a block is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BlockState {
    /// No sequence; the slot is free to (re)use.
    Reset,
    /// Being filled with the tokens of a sequence.
    Partial,
    /// Full and hashed, not yet visible to other requests.
    Complete,
    /// In the registry: shared, immutable, matchable.
    Registered,
}

/// A lifecycle transition that is not allowed from the block's state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    /// The operation needs another state.
    #[error("cannot {op} a block in state {state:?}")]
    InvalidState {
        /// What was attempted.
        op: &'static str,
        /// The state the block is in (unchanged).
        state: BlockState,
    },
    /// More tokens than the block has room for.
    #[error("block has room for {room} more tokens, got {got}")]
    Overflow {
        /// Tokens the block can still take.
        room: usize,
        /// Tokens offered.
        got: usize,
    },
    /// `commit` on a block that is not full.
    #[error("block holds {filled} of {size} tokens; only a full block can be committed")]
    NotFull {
        /// Tokens in the block.
        filled: usize,
        /// Tokens per block.
        size: usize,
    },
    /// Registering a block whose parent is not the block it follows.
    #[error("block was started after {expected:?} but is registered after {actual:?}")]
    ParentMismatch {
        /// The parent the block was started with.
        expected: Option<BlockHash>,
        /// The parent given at registration.
        actual: Option<BlockHash>,
    },
    /// A block of that hash is being transferred into the tier right now;
    /// it becomes matchable when the transfer completes.
    #[error("block {0} is in flight into this tier")]
    InFlight(BlockHash),
}

/// The contents of a block before registration: its state, the salt and
/// parent it was started with and the tokens added so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBlock {
    state: BlockState,
    block_size: usize,
    salt: u128,
    parent: Option<BlockHash>,
    tokens: Vec<u32>,
    hash: Option<BlockHash>,
}

impl TokenBlock {
    /// An empty block (state [`BlockState::Reset`]) of `block_size` tokens.
    pub fn new(block_size: usize) -> Self {
        Self {
            state: BlockState::Reset,
            block_size,
            salt: 0,
            parent: None,
            tokens: Vec::with_capacity(block_size),
            hash: None,
        }
    }

    /// The block's state.
    pub fn state(&self) -> BlockState {
        self.state
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The tokens added so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Tokens the block can still take.
    pub fn room(&self) -> usize {
        self.block_size - self.tokens.len()
    }

    /// The parent hash the block was started with (`None` for the first
    /// block of a sequence).
    pub fn parent(&self) -> Option<BlockHash> {
        self.parent
    }

    /// The block's hash once it is Complete.
    pub fn hash(&self) -> Option<BlockHash> {
        self.hash
    }

    fn expect(&self, op: &'static str, state: BlockState) -> Result<(), BlockError> {
        if self.state == state {
            Ok(())
        } else {
            Err(BlockError::InvalidState {
                op,
                state: self.state,
            })
        }
    }

    /// Starts the block as the successor of `parent` under `salt`:
    /// Reset -> Partial.
    pub fn init_sequence(
        &mut self,
        salt: u128,
        parent: Option<BlockHash>,
    ) -> Result<(), BlockError> {
        self.expect("init_sequence", BlockState::Reset)?;
        self.salt = salt;
        self.parent = parent;
        self.state = BlockState::Partial;
        Ok(())
    }

    /// Appends one token (Partial only).
    pub fn add_token(&mut self, token: u32) -> Result<(), BlockError> {
        self.add_tokens(&[token])
    }

    /// Appends tokens, all or none (Partial only).
    pub fn add_tokens(&mut self, tokens: &[u32]) -> Result<(), BlockError> {
        self.expect("add_tokens", BlockState::Partial)?;
        if tokens.len() > self.room() {
            return Err(BlockError::Overflow {
                room: self.room(),
                got: tokens.len(),
            });
        }
        self.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// Seals a full block and computes its chained hash: Partial -> Complete.
    pub fn commit(&mut self) -> Result<BlockHash, BlockError> {
        self.expect("commit", BlockState::Partial)?;
        if self.tokens.len() != self.block_size {
            return Err(BlockError::NotFull {
                filled: self.tokens.len(),
                size: self.block_size,
            });
        }
        let hash = BlockHash::chained(self.parent, self.salt, &self.tokens);
        self.hash = Some(hash);
        self.state = BlockState::Complete;
        Ok(hash)
    }

    /// Makes a Reset block Complete under an id the engine computed itself
    /// (vLLM, SGLang and trace `hash_ids`): Reset -> Complete.
    pub fn complete_external(
        &mut self,
        hash: BlockHash,
        parent: Option<BlockHash>,
    ) -> Result<(), BlockError> {
        self.expect("complete_external", BlockState::Reset)?;
        self.parent = parent;
        self.hash = Some(hash);
        self.state = BlockState::Complete;
        Ok(())
    }

    /// Checks that the block may be registered after `parent`; the pool
    /// performs the transition itself.
    pub fn check_register(&self, parent: Option<BlockHash>) -> Result<BlockHash, BlockError> {
        self.expect("register", BlockState::Complete)?;
        if parent != self.parent {
            return Err(BlockError::ParentMismatch {
                expected: self.parent,
                actual: parent,
            });
        }
        // A Complete block always carries its hash; the error keeps a broken
        // invariant from becoming a panic.
        self.hash.ok_or(BlockError::InvalidState {
            op: "register",
            state: self.state,
        })
    }

    /// Abandons the contents (Partial or Complete, or already Reset): -> Reset.
    pub fn reset(&mut self) {
        self.state = BlockState::Reset;
        self.salt = 0;
        self.parent = None;
        self.tokens.clear();
        self.hash = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn happy_path_computes_the_chained_hash() {
        let mut b = TokenBlock::new(2);
        b.init_sequence(7, None).unwrap();
        b.add_token(1).unwrap();
        b.add_tokens(&[2]).unwrap();
        let h = b.commit().unwrap();
        assert_eq!(h, BlockHash::chained(None, 7, &[1, 2]));
        assert_eq!(b.check_register(None), Ok(h));
        assert_eq!(
            b.check_register(Some(h)),
            Err(BlockError::ParentMismatch {
                expected: None,
                actual: Some(h)
            })
        );
    }
}
