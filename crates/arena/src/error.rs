//! The error type of `kvtier-arena` (and of `kvtier-mem`, which creates arenas).
//!
//! Expected outcomes (a miss, a full tier, a block already present) are
//! return enums ([`Lookup`](kvtier_core::Lookup), `kvtier_mem::PutOutcome`,
//! `kvtier_mem::Reserve`); `MemError` is for caller mistakes and for the
//! operating system refusing us.

use std::io;
use std::path::PathBuf;

use kvtier_core::BlockHash;
use thiserror::Error;

/// Result alias of `kvtier-arena`.
pub type Result<T, E = MemError> = std::result::Result<T, E>;

/// What can go wrong in the memory tier.
#[derive(Debug, Error)]
pub enum MemError {
    /// The shared-memory name cannot name a file in `/dev/shm`.
    #[error("invalid shared-memory name {name:?}: {reason}")]
    InvalidName {
        /// The name asked for.
        name: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The configuration cannot describe an arena (zero block size, sizes
    /// that overflow).
    #[error("invalid memory tier configuration: {0}")]
    InvalidConfig(String),
    /// The capacity does not hold a single slot.
    #[error("capacity of {capacity} bytes is smaller than one slot of {slot_bytes} bytes")]
    CapacityTooSmall {
        /// Capacity asked for.
        capacity: u64,
        /// Bytes of one slot (block bytes rounded up to the page size).
        slot_bytes: u64,
    },
    /// `/dev/shm` has no room for the arena.
    #[error(
        "{path}: not enough shared memory to reserve {bytes} bytes (is /dev/shm full or too small?)"
    )]
    ShmFull {
        /// The shared-memory file.
        path: PathBuf,
        /// Bytes that could not be reserved.
        bytes: u64,
    },
    /// Another live process owns an arena of this name.
    #[error("{path} is owned by a live kvtier process; pick another memory.shm_name")]
    InUse {
        /// The shared-memory file.
        path: PathBuf,
    },
    /// A file of this name exists and is not a kvtier arena; we leave it alone.
    #[error("{path} exists and is not a kvtier arena; remove it or pick another memory.shm_name")]
    NotAnArena {
        /// The shared-memory file.
        path: PathBuf,
    },
    /// An arena's header is missing, damaged or of another format version.
    #[error("{path}: bad arena header: {reason}")]
    BadHeader {
        /// The shared-memory file.
        path: PathBuf,
        /// What did not check out.
        reason: String,
    },
    /// A system call on the shared-memory file failed.
    #[error("{path}: {op} failed: {source}")]
    Io {
        /// The shared-memory file.
        path: PathBuf,
        /// The operation (`open`, `ftruncate`, `mmap`, ...).
        op: &'static str,
        /// The cause.
        source: io::Error,
    },
    /// A block of the wrong size was handed in.
    #[error("block of {got} bytes; this tier holds blocks of {expected} bytes")]
    WrongLength {
        /// `block_bytes` of the tier.
        expected: usize,
        /// Length of the data handed in.
        got: usize,
    },
    /// A file range handed in (by the daemon, in a protocol reply) is not
    /// exactly one slot's data.
    #[error("arena range {offset}+{len} is not a slot: {reason}")]
    BadSlot {
        /// Offset from the start of the arena file.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A slot index past the arena's last slot.
    #[error("slot {slot} does not exist; the arena has {slots} slots")]
    NoSuchSlot {
        /// The index handed in.
        slot: usize,
        /// Slots in the arena.
        slots: usize,
    },
    /// A layer buffer of the wrong size was handed in.
    #[error("layer {layer} of {got} bytes; that layer has {expected} bytes")]
    WrongLayerLength {
        /// The layer.
        layer: usize,
        /// Bytes of that layer (the last may be shorter than the others).
        expected: usize,
        /// Length of the buffer handed in.
        got: usize,
    },
    /// A layer index past the block's last layer.
    #[error("layer {layer} does not exist; blocks have {layers} layers")]
    NoSuchLayer {
        /// The index handed in.
        layer: usize,
        /// Layers per block.
        layers: usize,
    },
    /// The checksums handed in do not fit the block (wrong layer count, or
    /// layer sums that do not combine to the block sum).
    #[error("checksums of block {key} are unusable: {reason}")]
    BadSums {
        /// The block.
        key: BlockHash,
        /// What is wrong with them.
        reason: String,
    },
    /// Bytes written into a reserved slot do not match their checksums; the
    /// slot was freed and the block is not stored.
    #[error("block {key} failed verification on commit; not stored")]
    ChecksumMismatch {
        /// The block.
        key: BlockHash,
    },
}
