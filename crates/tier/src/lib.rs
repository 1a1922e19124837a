//! # kvtier-tier
//!
//! The one trait every storage tier implements, [`TierStore`]: the arena
//! (G2, kvtier-mem), the disk log (G3, kvtier-disk) and the remote store
//! (G4, kvtier-remote). A tier answers what it holds ([`contains`],
//! [`keys`], [`len`]), forgets blocks ([`remove`]), reads blocks or a range
//! of their layers into targets the caller gives ([`read_into`]) and writes
//! blocks with their checksums ([`put_batch`]). The manager holds the
//! configured tiers as `Arc<dyn TierStore>` in an ordered list, so a new
//! tier is one crate implementing this trait and one registration.
//!
//! ## The one move rule
//!
//! A block moves from tier `from` to tier `to` in two halves, and every
//! byte is verified against the block's stored sums before anyone serves
//! it:
//!
//! - **source bytes**: the block's bytes lent in place by `from` (its
//!   [`InPlaceTier::lend`], no copy; the writer of the destination then
//!   verifies or trusts the sums the source stored them with), or a
//!   verified [`read_into`] from `from` into the destination's in-place slot
//!   ([`InPlaceTier::reserve`]: the read lands where the block will live)
//!   or into a bounce buffer;
//! - **destination**: the verified slot committed with the sums the read
//!   returned ([`InPlaceTier::commit`]), or a [`put_batch`] of the bytes
//!   with their sums.
//!
//! Nothing is visible in the destination before its commit or its put
//! returned `Ok`, and a block that fails verification is a miss, never a
//! hit.
//!
//! [`contains`]: TierStore::contains
//! [`keys`]: TierStore::keys
//! [`len`]: TierStore::len
//! [`remove`]: TierStore::remove
//! [`read_into`]: TierStore::read_into
//! [`put_batch`]: TierStore::put_batch

#[cfg(feature = "test-support")]
pub mod conformance;

use std::any::Any;
use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;

use kvtier_core::{BlockHash, BlockSums, Lookup};
use kvtier_io::{DmaSource, DmaTarget};

/// A boxed future that can cross threads: what the trait's async methods
/// return, so the trait stays object-safe without an `async-trait` macro.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What kind of storage a tier is: kvtier-core's, shared with the wire.
pub use kvtier_core::TierKind;

/// Why a tier did not store (or commit) a block.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// The tier has no room for the block; nothing changed.
    #[error("the tier is full")]
    Full,
    /// The bytes do not match the sums given with them; nothing was stored.
    #[error("block {key} does not match its checksums")]
    Corrupt {
        /// The block.
        key: BlockHash,
    },
    /// A read target of another length than the bytes read.
    #[error("a target of {got} bytes for {expected} bytes read")]
    WrongLength {
        /// The bytes read.
        expected: usize,
        /// The target's length.
        got: usize,
    },
    /// A slot given back to [`InPlaceTier::commit`] was not one a tier of
    /// this kind reserved (a slot always commits into the tier that
    /// reserved it).
    #[error("the slot was not reserved by a tier of this kind")]
    ForeignSlot,
    /// The tier's storage failed (I/O, the object store, bad sums, a
    /// latched directory); the block was not stored.
    #[error("{kind} tier: {source}")]
    Storage {
        /// The tier that failed.
        kind: TierKind,
        /// The tier's own error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl TierError {
    /// Wraps a tier's own error as [`TierError::Storage`].
    pub fn storage(kind: TierKind, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        TierError::Storage {
            kind,
            source: Box::new(source),
        }
    }

    /// A tier's own per-block results, each error wrapped as
    /// [`TierError::Storage`] (what a `put_batch` adapter returns).
    pub fn storage_all<E: std::error::Error + Send + Sync + 'static>(
        kind: TierKind,
        results: Vec<Result<(), E>>,
    ) -> Vec<Result<(), TierError>> {
        results
            .into_iter()
            .map(|r| r.map_err(|e| TierError::storage(kind, e)))
            .collect()
    }
}

/// Memory a read lands in: any [`DmaTarget`] that can also be taken back
/// as its concrete type (the tier that lent a slot as a target recognises
/// it when the caller commits it).
pub trait ReadTarget: DmaTarget {
    /// The target as `Any`, to downcast to its concrete type.
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

impl<T: DmaTarget> ReadTarget for T {
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

/// A read target of any type, as the trait passes them.
pub type Target = Box<dyn ReadTarget>;

// SAFETY: a boxed target's memory is the boxed value's, which the box does
// not move; the box forwards to the value's own (DmaTarget) promise.
unsafe impl DmaTarget for Box<dyn ReadTarget> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        (**self).as_mut_ptr()
    }
    fn len(&self) -> usize {
        (**self).len()
    }
}

/// What a read did for one block: the caller's target back, the outcome
/// and, for a hit, the block's checksums (every layer, authenticated by the
/// tier), so the bytes can be published elsewhere without hashing them
/// again.
pub struct ReadDone {
    /// The target, as given; its bytes are meaningful only for a hit.
    pub target: Target,
    /// Hit (every byte read verified), miss, or corrupt (treat as a miss).
    pub lookup: Lookup,
    /// The block's checksums, for a hit.
    pub sums: Option<BlockSums>,
    /// Why the read could not be done (the store unavailable, a target of
    /// another length than the block's bytes), when it could not: then
    /// `lookup` is [`Lookup::Corrupt`] but nothing is known about the
    /// block, which the tier may still hold.
    pub error: Option<TierError>,
}

impl ReadDone {
    /// A verified hit: `target` holds the bytes, `sums` the block's sums.
    pub fn hit(target: Target, sums: BlockSums) -> Self {
        Self {
            target,
            lookup: Lookup::Hit,
            sums: Some(sums),
            error: None,
        }
    }

    /// A miss or a corrupt block (which the tier dropped).
    pub fn not_served(target: Target, lookup: Lookup) -> Self {
        Self {
            target,
            lookup,
            sums: None,
            error: None,
        }
    }

    /// A read that could not be done.
    pub fn failed(target: Target, error: TierError) -> Self {
        Self {
            target,
            lookup: Lookup::Corrupt,
            sums: None,
            error: Some(error),
        }
    }
}

impl std::fmt::Debug for ReadDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadDone")
            .field("len", &self.target.len())
            .field("lookup", &self.lookup)
            .finish_non_exhaustive()
    }
}

/// One block to write: its key, its whole bytes and the checksums they
/// carry from where they came from.
#[derive(Clone, Copy)]
pub struct BlockPut<'a> {
    /// The block.
    pub key: BlockHash,
    /// The block's bytes, layer 0 first.
    pub data: &'a [u8],
    /// The block's checksums.
    pub sums: &'a BlockSums,
    /// The same bytes kept in place for as long as a write needs them (a
    /// block lent by [`InPlaceTier::lend`]). When given, and its bytes are
    /// `data` and suit direct I/O, a tier that writes with direct I/O (the
    /// disk log) writes straight from them (from registered memory where
    /// the engine has it) instead of copying into its buffer, and holds a
    /// clone until the write has finished, even if the caller stops
    /// waiting. `None` (or bytes that are not `data`): copied. Other tiers
    /// ignore it.
    pub pinned: Option<&'a Arc<dyn DmaSource>>,
}

impl std::fmt::Debug for BlockPut<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockPut")
            .field("key", &self.key)
            .field("len", &self.data.len())
            .field("pinned", &self.pinned.is_some())
            .finish()
    }
}

/// A resident block lent in place: its bytes stay put and unwritten while
/// the value lives (a direct-I/O write can use them without a copy).
pub struct Lent {
    /// The bytes (shared, so a direct-I/O write can hold them until done).
    pub bytes: Arc<dyn DmaSource>,
    /// The checksums the block was stored with (not re-verified by lending;
    /// shared with the tier's record, not copied).
    pub sums: Arc<BlockSums>,
}

impl std::fmt::Debug for Lent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lent")
            .field("len", &self.bytes.bytes().len())
            .finish_non_exhaustive()
    }
}

/// What [`InPlaceTier::reserve`] gave for one key.
pub enum Reserved {
    /// A slot to read into; hand it back to [`InPlaceTier::commit`] (or drop
    /// it to free the slot).
    Slot(Target),
    /// The tier already holds the block.
    Present,
    /// No slot is free.
    Full,
}

impl std::fmt::Debug for Reserved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reserved::Slot(t) => write!(f, "Slot({} bytes)", t.len()),
            Reserved::Present => f.write_str("Present"),
            Reserved::Full => f.write_str("Full"),
        }
    }
}

/// The facet of a tier whose blocks live in addressable memory (the
/// arena): it lends resident bytes without a copy and gives reserved slots
/// as read targets, so another tier's read lands where the block will live.
pub trait InPlaceTier: Send + Sync {
    /// Each key's block, lent in place, or `None` when not resident.
    fn lend(&self, keys: &[BlockHash]) -> Vec<Option<Lent>>;
    /// A slot for each key, in order, invisible until committed.
    fn reserve(&self, keys: &[BlockHash]) -> Vec<Reserved>;
    /// Publishes a slot from [`reserve`](Self::reserve) whose bytes the
    /// caller verified against `sums` (a tier's verified read into it).
    fn commit(&self, slot: Target, sums: &BlockSums) -> Result<(), TierError>;
}

/// The owner of a tier's contents, for a tier that drops blocks on its own
/// to make room (see [`Reclaiming`]): asked which blocks must stay, told
/// which were dropped.
///
/// All methods are called by the tier while it makes room (for the disk
/// log: on the reclaiming writer's task with the directory's writer lock
/// held, or on its reaper thread), never with an index or region lock
/// held: they must be cheap, must not block, and must not call back into
/// the tier other than its read-only queries (`contains`; a write would
/// deadlock).
pub trait ReclaimListener: Send + Sync + 'static {
    /// Whether the owner still holds `key`. Wanted blocks are all kept
    /// (for the disk log: re-inserted). Asked once per block still held in
    /// what the tier considers dropping, before any of them is dropped.
    fn retain(&self, key: BlockHash) -> bool;

    /// Keys the tier dropped that [`retain`](Self::retain) did not want
    /// (for the disk log: once per reclaimed region, in the victim's slot
    /// order, possibly empty). Keys removed by the owner or written again
    /// meanwhile are never reported.
    fn evicted(&self, keys: &[BlockHash]);

    /// Keys `retain` wanted that the tier could not keep (reading one back
    /// failed, its copy failed verification, or writing it again failed).
    /// Their bytes are gone: the owner must forget them. Called only when
    /// there are some.
    fn lost(&self, keys: &[BlockHash]);
}

/// The facet of a tier that drops blocks on its own to make room (the
/// disk log reclaims whole regions): its owner installs a
/// [`ReclaimListener`] and becomes the tier's one eviction authority, and
/// must then hold at most [`live_capacity_blocks`](Self::live_capacity_blocks)
/// so that making room never drops a block it wants.
pub trait Reclaiming: Send + Sync {
    /// Installs (or replaces) the owner's listener.
    fn set_reclaim_listener(&self, listener: Arc<dyn ReclaimListener>);
    /// The most blocks an owner with a listener may hold in the tier.
    fn live_capacity_blocks(&self) -> usize;
}

/// One storage tier. Object-safe: the manager holds `Arc<dyn TierStore>`.
pub trait TierStore: Send + Sync + 'static {
    /// What kind of storage this is.
    fn kind(&self) -> TierKind;
    /// Bytes of one stored block (every layer); the manager checks it
    /// against its geometry when it registers the tier.
    fn block_bytes(&self) -> u64;
    /// Blocks the tier can hold.
    fn capacity_blocks(&self) -> usize;
    /// Blocks the tier holds now (for a remote store, what this process
    /// knows of; see the implementation).
    fn len(&self) -> usize;
    /// Whether the tier holds no block.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether the tier holds `key` (it may still turn out corrupt on read).
    fn contains(&self, key: BlockHash) -> bool;
    /// Forgets `keys`; how many the tier held. A reader already holding a
    /// block's bytes keeps them until it lets go.
    fn remove<'a>(&'a self, keys: &'a [BlockHash]) -> BoxFuture<'a, usize>;
    /// Keys the tier holds, in no particular order (adoption after a restart).
    fn keys(&self) -> BoxFuture<'_, Vec<BlockHash>>;
    /// Counters as name/value pairs.
    fn stats(&self) -> Vec<(&'static str, u64)>;
    /// Reads whole blocks (`layers` `None`; targets of a block's bytes) or
    /// layers `layers` of blocks (targets of that many layers' bytes) into
    /// the targets, every byte verified against the block's stored sums.
    /// One [`ReadDone`] per request, in order.
    fn read_into(
        &self,
        reqs: Vec<(BlockHash, Target)>,
        layers: Option<Range<u32>>,
    ) -> BoxFuture<'_, Vec<ReadDone>>;
    /// Writes blocks with their sums. One result per block, in order; a
    /// block is visible (readable) only once its result is `Ok`, and a key
    /// already held is `Ok` without a write.
    fn put_batch<'a>(
        &'a self,
        puts: &'a [BlockPut<'a>],
    ) -> BoxFuture<'a, Vec<Result<(), TierError>>>;
    /// The in-place facet, for a tier whose blocks live in memory.
    fn in_place(&self) -> Option<&dyn InPlaceTier> {
        None
    }
    /// The reclaim facet, for a tier that drops blocks on its own to make
    /// room (the disk log).
    fn reclaiming(&self) -> Option<&dyn Reclaiming> {
        None
    }
    /// Where `key`'s block can be found by others, as a URI, for the
    /// events announcing it (a remote store's object); `None` for a tier
    /// only this node reaches.
    fn uri(&self, _key: BlockHash) -> Option<String> {
        None
    }
}
