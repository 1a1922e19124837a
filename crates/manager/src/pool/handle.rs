//! RAII handles to blocks: [`MutableBlock`] (exclusive, before
//! registration) and [`ImmutableBlock`] (shared, registered).

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use kvtier_core::BlockHash;

use super::state::{Registration, SlotId};
use super::{BlockPool, PoolLock};
use crate::block::{BlockError, TokenBlock};

/// Exclusive handle to a slot whose block is Reset, Partial or Complete.
///
/// Derefs to its [`TokenBlock`] for the lifecycle transitions. Dropping it
/// returns the slot to the pool; [`register`](Self::register) turns it into
/// an [`ImmutableBlock`].
pub struct MutableBlock<L: PoolLock = super::DefaultLock> {
    pool: BlockPool<L>,
    slot: SlotId,
    block: TokenBlock,
    /// False once the slot was handed over at registration, so `Drop` does
    /// not free it.
    owns_slot: bool,
}

impl<L: PoolLock> MutableBlock<L> {
    pub(crate) fn new(pool: BlockPool<L>, slot: SlotId) -> Self {
        let size = pool.tokens_per_block();
        Self {
            pool,
            slot,
            block: TokenBlock::new(size),
            owns_slot: true,
        }
    }

    /// The slot in the tier's memory this block occupies.
    pub fn slot(&self) -> SlotId {
        self.slot
    }

    /// The pool the block belongs to.
    pub fn pool(&self) -> &BlockPool<L> {
        &self.pool
    }

    /// Registers the Complete block after the parent it was started with.
    /// If the pool already holds the hash, returns that block and frees this
    /// slot. On error the block comes back unchanged inside [`Rejected`].
    pub fn register(self) -> Result<ImmutableBlock<L>, Box<Rejected<L>>> {
        let parent = self.block.parent();
        self.register_checked(parent)
    }

    /// Like [`register`](Self::register), and checks that `parent` (the
    /// block this one follows, `None` for a first block) is the parent the
    /// block was started with.
    pub fn register_after(
        self,
        parent: Option<&ImmutableBlock<L>>,
    ) -> Result<ImmutableBlock<L>, Box<Rejected<L>>> {
        self.register_checked(parent.map(|p| p.hash()))
    }

    fn register_checked(
        mut self,
        parent: Option<BlockHash>,
    ) -> Result<ImmutableBlock<L>, Box<Rejected<L>>> {
        let hash = match self.block.check_register(parent) {
            Ok(h) => h,
            Err(error) => return Err(Box::new(Rejected { block: self, error })),
        };
        let now = self.pool.now();
        let slot = self.slot;
        let outcome = self
            .pool
            .with_state(|s| s.register(slot, hash, parent, now));
        match outcome {
            Ok(Registration::New(slot) | Registration::Existing(slot)) => {
                // The state machine owns the slot now (registered, or freed
                // as a duplicate).
                self.owns_slot = false;
                Ok(ImmutableBlock::new(self.pool.clone(), slot, hash))
            }
            Err(error) => Err(Box::new(Rejected { block: self, error })),
        }
    }
}

impl<L: PoolLock> Deref for MutableBlock<L> {
    type Target = TokenBlock;

    fn deref(&self) -> &TokenBlock {
        &self.block
    }
}

impl<L: PoolLock> DerefMut for MutableBlock<L> {
    fn deref_mut(&mut self) -> &mut TokenBlock {
        &mut self.block
    }
}

impl<L: PoolLock> Drop for MutableBlock<L> {
    fn drop(&mut self) {
        if self.owns_slot {
            let slot = self.slot;
            self.pool.with_state(|s| s.free_mutable(slot));
        }
    }
}

impl<L: PoolLock> fmt::Debug for MutableBlock<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MutableBlock")
            .field("tier", &self.pool.tier())
            .field("slot", &self.slot)
            .field("block", &self.block)
            .finish()
    }
}

/// A registration that was refused; the block comes back unchanged.
pub struct Rejected<L: PoolLock = super::DefaultLock> {
    /// The block, as it was before the attempt.
    pub block: MutableBlock<L>,
    /// Why it was refused.
    pub error: BlockError,
}

impl<L: PoolLock> fmt::Debug for Rejected<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejected")
            .field("block", &self.block)
            .field("error", &self.error)
            .finish()
    }
}

impl<L: PoolLock> fmt::Display for Rejected<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "registration refused: {}", self.error)
    }
}

impl<L: PoolLock> std::error::Error for Rejected<L> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// One reference held in the pool; dropping it releases the reference
/// (unless [`BlockPool::release_all`] took the release over).
struct Reference<L: PoolLock> {
    pool: BlockPool<L>,
    slot: SlotId,
    hash: BlockHash,
    /// Set when the caller releases the reference itself, in a batch.
    released: bool,
}

impl<L: PoolLock> Drop for Reference<L> {
    fn drop(&mut self) {
        if !self.released {
            let slot = self.slot;
            self.pool.with_state(|s| s.release(slot));
        }
    }
}

/// Shared handle to a registered block. Cloning adds a holder of the same
/// reference; when the last clone drops, the block moves to the inactive
/// sub-pool, where it stays matchable until evicted.
pub struct ImmutableBlock<L: PoolLock = super::DefaultLock> {
    reference: Arc<Reference<L>>,
}

impl<L: PoolLock> Clone for ImmutableBlock<L> {
    fn clone(&self) -> Self {
        Self {
            reference: Arc::clone(&self.reference),
        }
    }
}

impl<L: PoolLock> ImmutableBlock<L> {
    /// Wraps a reference the pool already counted.
    pub(crate) fn new(pool: BlockPool<L>, slot: SlotId, hash: BlockHash) -> Self {
        Self {
            reference: Arc::new(Reference {
                pool,
                slot,
                hash,
                released: false,
            }),
        }
    }

    /// Drops this handle; when it held the last clone of a reference of
    /// `pool`, returns its slot for the caller to release (the drop then
    /// does not).
    pub(crate) fn into_last_reference(self, pool: &BlockPool<L>) -> Option<SlotId> {
        let mut r = Arc::into_inner(self.reference)?;
        if !r.pool.same_pool(pool) {
            return None;
        }
        r.released = true;
        Some(r.slot)
    }

    /// The block's hash.
    pub fn hash(&self) -> BlockHash {
        self.reference.hash
    }

    /// The slot in the tier's memory the block occupies.
    pub fn slot(&self) -> SlotId {
        self.reference.slot
    }

    /// The pool the block belongs to.
    pub fn pool(&self) -> &BlockPool<L> {
        &self.reference.pool
    }
}

impl<L: PoolLock> fmt::Debug for ImmutableBlock<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImmutableBlock")
            .field("tier", &self.reference.pool.tier())
            .field("slot", &self.reference.slot)
            .field("hash", &self.reference.hash)
            .finish()
    }
}
