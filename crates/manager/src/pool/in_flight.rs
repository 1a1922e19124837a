//! Guards for blocks in flight between tiers: the destination of a copy
//! ([`IncomingBlock`], not readable until finished) and its source
//! ([`OutgoingBlock`], not evictable while the copy runs).

use std::fmt;

use kvtier_core::BlockHash;

use super::handle::ImmutableBlock;
use super::state::SlotId;
use super::{BlockPool, PoolLock};

/// A reserved destination slot a transfer is filling.
///
/// [`finish`](Self::finish) registers the block and makes it readable;
/// dropping the guard unfinished (the transfer failed) frees the slot and
/// forgets the hash.
pub struct IncomingBlock<L: PoolLock = super::DefaultLock> {
    pool: BlockPool<L>,
    slot: SlotId,
    hash: BlockHash,
    finished: bool,
}

impl<L: PoolLock> IncomingBlock<L> {
    pub(crate) fn new(pool: BlockPool<L>, slot: SlotId, hash: BlockHash) -> Self {
        Self {
            pool,
            slot,
            hash,
            finished: false,
        }
    }

    /// The block being received.
    pub fn hash(&self) -> BlockHash {
        self.hash
    }

    /// The destination slot.
    pub fn slot(&self) -> SlotId {
        self.slot
    }

    /// The destination pool.
    pub fn pool(&self) -> &BlockPool<L> {
        &self.pool
    }

    /// The bytes arrived: registers the block and returns a handle to it.
    pub fn finish(mut self) -> ImmutableBlock<L> {
        let now = self.pool.now();
        let slot = self.slot;
        self.pool.with_state(|s| s.finish_incoming(slot, now));
        self.finished = true;
        ImmutableBlock::new(self.pool.clone(), self.slot, self.hash)
    }
}

impl<L: PoolLock> IncomingBlock<L> {
    /// Hands the finish over to `pool`'s [`finish_all`](BlockPool::finish_all):
    /// the slot to finish, and the guard disarmed; the guard back when it
    /// belongs to another pool.
    pub(crate) fn into_finishing(mut self, pool: &BlockPool<L>) -> Result<SlotId, Self> {
        if !self.pool.same_pool(pool) {
            return Err(self);
        }
        self.finished = true;
        Ok(self.slot)
    }
}

impl<L: PoolLock> Drop for IncomingBlock<L> {
    fn drop(&mut self) {
        if !self.finished {
            let slot = self.slot;
            self.pool.with_state(|s| s.abort_incoming(slot));
        }
    }
}

impl<L: PoolLock> fmt::Debug for IncomingBlock<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IncomingBlock")
            .field("tier", &self.pool.tier())
            .field("slot", &self.slot)
            .field("hash", &self.hash)
            .finish()
    }
}

/// A registered block a transfer is reading; it is not evicted while the
/// guard lives.
///
/// [`finish`](Self::finish) reports success: a move (`removes_source`)
/// then removes the block from its tier unless someone still holds, pins
/// or reads it. Dropping the guard unfinished reports failure: the block
/// stays, and a block the planner chose to leave goes back to its policy.
pub struct OutgoingBlock<L: PoolLock = super::DefaultLock> {
    pool: BlockPool<L>,
    slot: SlotId,
    hash: BlockHash,
    removes_source: bool,
    finished: bool,
}

impl<L: PoolLock> OutgoingBlock<L> {
    pub(crate) fn new(
        pool: BlockPool<L>,
        slot: SlotId,
        hash: BlockHash,
        removes_source: bool,
    ) -> Self {
        Self {
            pool,
            slot,
            hash,
            removes_source,
            finished: false,
        }
    }

    /// The block being read.
    pub fn hash(&self) -> BlockHash {
        self.hash
    }

    /// The source slot.
    pub fn slot(&self) -> SlotId {
        self.slot
    }

    /// The source pool.
    pub fn pool(&self) -> &BlockPool<L> {
        &self.pool
    }

    /// Whether a successful transfer removes the source (a move).
    pub fn removes_source(&self) -> bool {
        self.removes_source
    }

    /// The copy completed.
    pub fn finish(mut self) {
        self.end(true);
    }

    fn end(&mut self, succeeded: bool) {
        if self.finished {
            return;
        }
        self.finished = true;
        let (slot, remove, now) = (self.slot, self.removes_source, self.pool.now());
        self.pool
            .with_state(|s| s.end_outgoing(slot, succeeded, remove, now));
    }
}

impl<L: PoolLock> Drop for OutgoingBlock<L> {
    fn drop(&mut self) {
        self.end(false);
    }
}

impl<L: PoolLock> fmt::Debug for OutgoingBlock<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutgoingBlock")
            .field("tier", &self.pool.tier())
            .field("slot", &self.slot)
            .field("hash", &self.hash)
            .field("removes_source", &self.removes_source)
            .finish()
    }
}
