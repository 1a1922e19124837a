//! One pool of block slots per tier (Dynamo KVBM's `BlockPool`).
//!
//! A [`BlockPool`] owns `capacity_blocks` slots. A slot is free, held by a
//! [`MutableBlock`] (Reset / Partial / Complete, exclusive), being filled by
//! a transfer ([`IncomingBlock`]), or holds a registered block. Registered
//! blocks form two sub-pools: *active* ones have live [`ImmutableBlock`]
//! handles; *inactive* ones have none, stay matchable and are what
//! [`allocate`](BlockPool::allocate) evicts, in the order of the tier's
//! [eviction policy](crate::policy), leaves before their parents, when no
//! slot is free. A referenced, pinned, in-flight or leaving block is never
//! evicted.
//!
//! The pool deduplicates by hash: registering a hash already present returns
//! the existing block and frees the duplicate's slot.
//!
//! For the transfer engine, [`begin_incoming`](BlockPool::begin_incoming)
//! reserves a destination slot that is not readable until the
//! [`IncomingBlock`] is finished (dropping it unfinished returns the slot),
//! and [`begin_outgoing`](BlockPool::begin_outgoing) marks a source that may
//! not be evicted while the [`OutgoingBlock`] lives.
//!
//! All bookkeeping sits in one [`PoolState`] behind one lock ([`PoolLock`]),
//! never held across a call out of the pool but one: a pool that is its
//! tier's only book ([`attach_bytes`](BlockPool::attach_bytes), G2 over
//! the arena) tells the tier's [`TierBytes`] of each block that leaves,
//! under the lock, so the bytes go in the same step as the booking. Handles
//! lock it only in their constructors and `Drop`.
//!
//! ```
//! use kvtier_manager::Tier;
//! use kvtier_manager::pool::{BlockPool, PoolConfig};
//!
//! let pool = BlockPool::new(Tier::G1, PoolConfig::new(8, 4))?;
//! let mut block = pool.allocate()?; // Reset
//! block.init_sequence(0xabc, None)?; // Partial
//! block.add_tokens(&[1, 2, 3, 4])?;
//! let hash = block.commit()?; // Complete
//! let shared = block.register().map_err(|r| r.error)?; // Registered
//! assert_eq!(shared.hash(), hash);
//! drop(shared); // inactive: still matchable, now evictable
//! assert!(pool.acquire(hash).is_some());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod config;
pub mod handle;
pub mod in_flight;
pub mod lock;
pub mod state;

use std::sync::Arc;
use std::time::Instant;

use kvtier_core::BlockHash;
use serde::{Deserialize, Serialize};

pub use config::{PoolConfig, PoolConfigError};
pub use handle::{ImmutableBlock, MutableBlock, Rejected};
pub use in_flight::{IncomingBlock, OutgoingBlock};
pub use lock::{DefaultLock, PoolLock};
pub use state::{PoolState, Presence, SlotId};

use crate::Tier;

/// An error of a pool operation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PoolError {
    /// Not enough free or evictable slots.
    #[error("tier {tier}: {wanted} blocks wanted, {available} free or evictable")]
    Exhausted {
        /// The tier.
        tier: Tier,
        /// Slots asked for.
        wanted: usize,
        /// Slots that could be had.
        available: usize,
    },
    /// The block is not registered in this tier.
    #[error("block {0} is not resident")]
    NotResident(BlockHash),
    /// The block is already registered in this tier.
    #[error("block {0} is already resident")]
    AlreadyResident(BlockHash),
    /// The block is being transferred into this tier.
    #[error("block {0} is in flight into this tier")]
    InFlight(BlockHash),
    /// The pool configuration is invalid.
    #[error(transparent)]
    Config(#[from] PoolConfigError),
}

/// A change of what a tier holds, for the event plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PoolEvent {
    /// A block became registered (matchable) in the tier.
    Stored {
        /// The tier.
        tier: Tier,
        /// The block.
        hash: BlockHash,
    },
    /// A registered block left the tier.
    Removed {
        /// The tier.
        tier: Tier,
        /// The block.
        hash: BlockHash,
    },
}

impl PoolEvent {
    /// The block the event is about.
    pub fn hash(&self) -> BlockHash {
        match self {
            Self::Stored { hash, .. } | Self::Removed { hash, .. } => *hash,
        }
    }
}

/// Counts of a pool's slots and operations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStats {
    /// Slots in all.
    pub capacity: usize,
    /// Free slots.
    pub free: usize,
    /// Slots held by mutable handles.
    pub mutable: usize,
    /// Slots being filled by transfers.
    pub incoming: usize,
    /// Registered blocks with live handles.
    pub active: usize,
    /// Registered blocks without handles (evictable unless pinned or in flight).
    pub inactive: usize,
    /// Slots handed out since creation.
    pub allocations: u64,
    /// Blocks evicted by allocation.
    pub evictions: u64,
    /// Blocks that left after a successful outgoing transfer.
    pub offloaded: u64,
    /// Registrations answered with an existing block.
    pub dedup_hits: u64,
    /// Registered blocks acquired by hash.
    pub hits: u64,
}

/// The bytes of a tier whose pool is its only book (G2's arena): told of
/// each block the pool lets go (evicted, removed, or moved down), so its
/// bytes go in the same step and no reservation or load can find the
/// tier's storage holding a block its pool no longer books.
pub trait TierBytes: Send + Sync {
    /// Block `hash` left the pool; its bytes may go (a reader still holding
    /// them keeps them readable until it lets go). Runs under the pool's
    /// lock: it takes only the storage's own leaf lock and never calls back
    /// into a pool.
    fn forget(&self, hash: BlockHash);
}

impl TierBytes for kvtier_mem::MemoryTier {
    fn forget(&self, hash: BlockHash) {
        self.remove(hash);
    }
}

/// The pool's clock, in milliseconds; policies use it for idle times.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

pub(crate) struct PoolInner<L> {
    tier: Tier,
    tokens_per_block: usize,
    clock: Clock,
    lock: L,
}

/// The pool of one tier. Cloning shares the pool.
pub struct BlockPool<L: PoolLock = DefaultLock> {
    inner: Arc<PoolInner<L>>,
}

impl<L: PoolLock> Clone for BlockPool<L> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<L: PoolLock> std::fmt::Debug for BlockPool<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockPool")
            .field("tier", &self.inner.tier)
            .finish_non_exhaustive()
    }
}

impl BlockPool<DefaultLock> {
    /// A pool for `tier` with a wall clock (milliseconds since creation).
    pub fn new(tier: Tier, config: PoolConfig) -> Result<Self, PoolError> {
        Self::with_lock(tier, config, wall_clock())
    }
}

/// Milliseconds since the call.
pub fn wall_clock() -> Clock {
    let start = Instant::now();
    Arc::new(move || start.elapsed().as_millis() as u64)
}

impl<L: PoolLock> BlockPool<L> {
    /// A pool for `tier` with the lock type `L` and `clock`.
    pub fn with_lock(tier: Tier, config: PoolConfig, clock: Clock) -> Result<Self, PoolError> {
        config.validate()?;
        let policy = config
            .policy
            .build(config.capacity_blocks)
            .map_err(PoolConfigError::from)?;
        Ok(Self {
            inner: Arc::new(PoolInner {
                tier,
                tokens_per_block: config.tokens_per_block,
                clock,
                lock: L::new(PoolState::new(tier, config, policy)),
            }),
        })
    }

    /// The pool's tier.
    pub fn tier(&self) -> Tier {
        self.inner.tier
    }

    /// Tokens per block.
    pub fn tokens_per_block(&self) -> usize {
        self.inner.tokens_per_block
    }

    /// The pool's configuration.
    pub fn config(&self) -> PoolConfig {
        self.with_state(|s| s.config().clone())
    }

    pub(crate) fn now(&self) -> u64 {
        (self.inner.clock)()
    }

    pub(crate) fn with_state<R>(&self, f: impl FnOnce(&mut PoolState) -> R) -> R {
        self.inner.lock.with(f)
    }

    /// Makes the pool its tier's only book over `bytes`: from now on each
    /// block that leaves the pool is forgotten by `bytes` in the same call
    /// (see [`TierBytes`]). Set it before the pool holds blocks.
    pub fn attach_bytes(&self, bytes: Arc<dyn TierBytes>) {
        self.with_state(|s| s.attach_bytes(bytes));
    }

    /// Whether two handles belong to the same pool.
    pub fn same_pool(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// One mutable block in state Reset, evicting an inactive block if no
    /// slot is free.
    pub fn allocate(&self) -> Result<MutableBlock<L>, PoolError> {
        self.allocate_many(1)?.pop().ok_or(PoolError::Exhausted {
            tier: self.tier(),
            wanted: 1,
            available: 0,
        })
    }

    /// `n` mutable blocks, all or none.
    pub fn allocate_many(&self, n: usize) -> Result<Vec<MutableBlock<L>>, PoolError> {
        let now = self.now();
        let slots = self.with_state(|s| s.allocate(n, now))?;
        Ok(slots
            .into_iter()
            .map(|slot| MutableBlock::new(self.clone(), slot))
            .collect())
    }

    /// A new handle to the registered, readable block `hash` (counts as a
    /// use for the policy); `None` if it is absent or still in flight.
    pub fn acquire(&self, hash: BlockHash) -> Option<ImmutableBlock<L>> {
        let now = self.now();
        let slot = self.with_state(|s| s.acquire(hash, now))?;
        Some(ImmutableBlock::new(self.clone(), slot, hash))
    }

    /// Handles for the longest prefix of `hashes` registered here (one
    /// lock for all; each a use, as [`acquire`](Self::acquire)).
    pub fn acquire_prefix(&self, hashes: &[BlockHash]) -> Vec<ImmutableBlock<L>> {
        self.acquire_many(hashes, true)
    }

    /// Handles for every one of `hashes` registered here, in order, the
    /// others skipped (one lock for all; each a use).
    pub fn acquire_present(&self, hashes: &[BlockHash]) -> Vec<ImmutableBlock<L>> {
        self.acquire_many(hashes, false)
    }

    /// Handles for `hashes` under one lock; a hash not registered ends the
    /// run when `prefix`, else is skipped.
    fn acquire_many(&self, hashes: &[BlockHash], prefix: bool) -> Vec<ImmutableBlock<L>> {
        let now = self.now();
        self.with_state(|s| {
            let mut out = Vec::with_capacity(hashes.len());
            for &h in hashes {
                match s.acquire(h, now) {
                    Some(slot) => out.push(ImmutableBlock::new(self.clone(), slot, h)),
                    None if prefix => break,
                    None => {}
                }
            }
            out
        })
    }

    /// Drops `blocks` (handles of this pool), releasing the references
    /// they were the last holders of under one lock rather than one each.
    pub fn release_all(&self, blocks: impl IntoIterator<Item = ImmutableBlock<L>>) {
        let mut last = Vec::new();
        for b in blocks {
            if let Some(slot) = b.into_last_reference(self) {
                last.push(slot);
            }
        }
        if !last.is_empty() {
            self.with_state(|s| last.iter().for_each(|slot| s.release(*slot)));
        }
    }

    /// How `hash` is present here, if at all.
    pub fn presence(&self, hash: BlockHash) -> Option<Presence> {
        self.with_state(|s| s.presence(hash))
    }

    /// Whether `hash` is registered and readable here.
    pub fn is_readable(&self, hash: BlockHash) -> bool {
        self.presence(hash) == Some(Presence::Ready)
    }

    /// For each of `hashes`, how it is present here (one lock for all).
    pub fn presence_many(&self, hashes: &[BlockHash]) -> Vec<Option<Presence>> {
        self.with_state(|s| hashes.iter().map(|h| s.presence(*h)).collect())
    }

    /// Sets `tiers[i]` to this pool's tier for every block `hashes[i]` that
    /// is registered and readable here and has no tier yet (one lock for
    /// all); how prefix matching visits the tiers fastest first.
    pub fn fill_ready(&self, hashes: &[BlockHash], tiers: &mut [Option<Tier>]) {
        let tier = self.tier();
        self.with_state(|s| {
            for (h, t) in hashes.iter().zip(tiers.iter_mut()) {
                if t.is_none() && s.presence(*h) == Some(Presence::Ready) {
                    *t = Some(tier);
                }
            }
        });
    }

    /// The slot holding `hash` (registered or being filled), if any; not a
    /// use of the block.
    pub fn slot_of(&self, hash: BlockHash) -> Option<SlotId> {
        self.with_state(|s| s.slot_of(hash))
    }

    /// The parent `hash` was registered after, if present here.
    pub fn parent_of(&self, hash: BlockHash) -> Option<Option<BlockHash>> {
        self.with_state(|s| s.parent_of(hash))
    }

    /// For each of `hashes`, the parent it was registered after and how it
    /// is present here now (one lock for all): what applying its events
    /// needs.
    pub fn parents_and_presence(
        &self,
        hashes: &[BlockHash],
    ) -> Vec<(Option<BlockHash>, Option<Presence>)> {
        self.with_state(|s| {
            hashes
                .iter()
                .map(|h| (s.parent_of(*h).flatten(), s.presence(*h)))
                .collect()
        })
    }

    /// Pins a registered block: it is not evicted until unpinned as often.
    pub fn pin(&self, hash: BlockHash) -> Result<(), PoolError> {
        self.with_state(|s| s.set_pinned(hash, true))
    }

    /// Undoes one [`pin`](Self::pin).
    pub fn unpin(&self, hash: BlockHash) -> Result<(), PoolError> {
        self.with_state(|s| s.set_pinned(hash, false))
    }

    /// Reserves a slot to receive `hash` (and its parent link) from another
    /// tier. The block is not readable until [`IncomingBlock::finish`];
    /// dropping the guard unfinished (a failed transfer) frees the slot.
    pub fn begin_incoming(
        &self,
        hash: BlockHash,
        parent: Option<BlockHash>,
    ) -> Result<IncomingBlock<L>, PoolError> {
        let now = self.now();
        let slot = self.with_state(|s| s.begin_incoming(hash, parent, now))?;
        Ok(IncomingBlock::new(self.clone(), slot, hash))
    }

    /// [`begin_incoming`](Self::begin_incoming) of each of `blocks` (a
    /// hash and its parent link), under one lock: one result per block, in
    /// order.
    pub fn begin_incoming_many(
        &self,
        blocks: impl IntoIterator<Item = (BlockHash, Option<BlockHash>)>,
    ) -> Vec<Result<IncomingBlock<L>, PoolError>> {
        let now = self.now();
        let blocks = blocks.into_iter();
        // Callers pass a filtered iterator (lower bound 0): size the answer
        // for its upper bound, one allocation rather than a doubling series.
        let (lower, upper) = blocks.size_hint();
        let mut taken = Vec::with_capacity(upper.unwrap_or(lower));
        self.with_state(|s| {
            for (h, parent) in blocks {
                let slot = s.begin_incoming(h, parent, now);
                taken.push(slot.map(|slot| IncomingBlock::new(self.clone(), slot, h)));
            }
        });
        taken
    }

    /// [`IncomingBlock::finish`] of each of `blocks` (guards of this
    /// pool) with the handle it returns dropped at once, under one lock.
    pub fn finish_all(&self, blocks: impl IntoIterator<Item = IncomingBlock<L>>) {
        let mut slots = Vec::new();
        for b in blocks {
            match b.into_finishing(self) {
                Ok(slot) => slots.push(slot),
                Err(other) => drop(other.finish()),
            }
        }
        if slots.is_empty() {
            return;
        }
        let now = self.now();
        self.with_state(|s| {
            for &slot in &slots {
                if s.finish_incoming(slot, now).is_some() {
                    s.release(slot);
                }
            }
        });
    }

    /// Marks the registered block `hash` as the source of a transfer: it is
    /// not evicted while the guard lives. `remove_source`: whether a
    /// successful transfer removes the block from this tier (a move) rather
    /// than leaving it (a copy).
    pub fn begin_outgoing(
        &self,
        hash: BlockHash,
        remove_source: bool,
    ) -> Result<OutgoingBlock<L>, PoolError> {
        let slot = self.with_state(|s| s.begin_outgoing(hash))?;
        Ok(OutgoingBlock::new(self.clone(), slot, hash, remove_source))
    }

    /// Chooses up to `n` inactive blocks to leave the tier, in policy order
    /// (leaves first), and marks them outgoing with removal on success.
    /// They stay readable until their transfer finishes.
    pub fn plan_leaving(&self, n: usize) -> Vec<OutgoingBlock<L>> {
        let now = self.now();
        let chosen = self.with_state(|s| s.plan_leaving(n, now));
        chosen
            .into_iter()
            .map(|(slot, hash)| OutgoingBlock::new(self.clone(), slot, hash, true))
            .collect()
    }

    /// Removes the inactive block `hash` (TTL expiry); whether it went.
    pub fn remove_inactive(&self, hash: BlockHash) -> bool {
        self.with_state(|s| s.remove_inactive(hash))
    }

    /// Removes each of `hashes` that is inactive (one lock for all); how
    /// many went.
    pub fn remove_inactive_many(&self, hashes: &[BlockHash]) -> usize {
        self.with_state(|s| hashes.iter().filter(|h| s.remove_inactive(**h)).count())
    }

    /// Blocks the policy reports expired now (TTL policy only).
    pub fn expired(&self) -> Vec<BlockHash> {
        let now = self.now();
        self.with_state(|s| s.expired(now))
    }

    /// Free slots plus evictable blocks: what an allocation could have
    /// now when the pool evicts on allocation, and what its owner can make
    /// room from otherwise ([`PoolConfig::evict_on_allocate`]).
    pub fn available(&self) -> usize {
        self.with_state(|s| s.available())
    }

    /// Slots in use (not free).
    pub fn used(&self) -> usize {
        self.with_state(|s| s.used())
    }

    /// Slots in use, less the blocks planned to leave
    /// ([`plan_leaving`](Self::plan_leaving)) whose transfer is still running.
    pub fn used_after_departures(&self) -> usize {
        self.with_state(|s| s.used_after_departures())
    }

    /// Counts of slots and operations.
    pub fn stats(&self) -> PoolStats {
        self.with_state(|s| s.stats())
    }

    /// Takes the stored / removed events recorded since the last call
    /// (recorded only with [`PoolConfig::record_events`]).
    pub fn drain_events(&self) -> Vec<PoolEvent> {
        self.with_state(|s| s.drain_events())
    }

    /// Moves the events recorded since the last drain to the end of `out`
    /// (whose memory the caller keeps from one drain to the next).
    pub fn drain_events_into(&self, out: &mut Vec<PoolEvent>) {
        self.with_state(|s| s.drain_events_into(out));
    }

    /// Checks the pool's internal invariants; a description of the first
    /// violation. For tests and debug assertions.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.with_state(|s| s.check_invariants())
    }
}
