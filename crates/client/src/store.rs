//! The transport-free steps of `store`: checking the batch, filling the
//! slots the daemon granted, and merging the `Reserve` and `Commit` answers
//! into one outcome per block.

use std::any::Any;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};

use kvtier_arena::{ArenaClient, MemError};
use kvtier_core::{BlockHash, BlockSums};
use kvtier_protocol::{CommitEntry, CommitResult, KeyMap, ReserveResult};

use crate::error::{ClientError, Result};

/// What `store` did with one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreOutcome {
    /// Copied into the arena and committed: the daemon holds it now.
    Stored,
    /// The daemon already held the block (at reserve, or another copy won
    /// at commit); nothing of this copy was kept.
    AlreadyStored,
    /// Another client is storing the block now; it is stored once.
    InFlightElsewhere,
    /// No slot was free; not stored.
    NoSpace,
    /// The daemon no longer held the reservation at commit (its lease
    /// ended); not stored.
    NotReserved,
    /// The daemon found the slot's bytes do not match the checksums
    /// committed; not stored.
    BadChecksum,
}

impl StoreOutcome {
    /// Whether the daemon holds the block after the store (this copy or
    /// an earlier one).
    pub fn is_stored(self) -> bool {
        matches!(self, Self::Stored | Self::AlreadyStored)
    }
}

/// The blocks a store copies into the arena, read layer by layer: an
/// engine keeps a block's layers apart (one tensor per layer), so a block
/// need not be contiguous in its memory.
pub trait BlockSource {
    /// How many blocks.
    fn len(&self) -> usize;
    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The client key of block `i`.
    fn key(&self, i: usize) -> BlockHash;
    /// Layer `layer` of block `i`, which lies at `within` in a whole
    /// block (so its length is `within.len()`; another length fails the
    /// store before anything is committed).
    fn layer(&self, i: usize, layer: usize, within: Range<usize>) -> &[u8];
}

/// Whole blocks, each contiguous and exactly the block size.
impl BlockSource for [(BlockHash, &[u8])] {
    fn len(&self) -> usize {
        <[_]>::len(self)
    }
    fn key(&self, i: usize) -> BlockHash {
        self[i].0
    }
    fn layer(&self, i: usize, _layer: usize, within: Range<usize>) -> &[u8] {
        // `check_blocks` made every block the block size, so `within` fits.
        &self[i].1[within]
    }
}

/// Refuses a batch whose blocks are not all exactly the arena's block size,
/// before anything is reserved.
pub(crate) fn check_blocks(arena: &ArenaClient, blocks: &[(BlockHash, &[u8])]) -> Result<()> {
    match blocks.iter().find(|(_, b)| b.len() != arena.block_bytes()) {
        None => Ok(()),
        Some((_, b)) => Err(MemError::WrongLength {
            expected: arena.block_bytes(),
            got: b.len(),
        }
        .into()),
    }
}

/// Refuses buffers that do not match the keys one to one, each of the
/// block size, before anything is loaded.
pub(crate) fn check_buffers(
    arena: &ArenaClient,
    keys: &[BlockHash],
    dsts: &[&mut [u8]],
) -> Result<()> {
    if dsts.len() != keys.len() {
        return Err(ClientError::BufferCount {
            expected: keys.len(),
            got: dsts.len(),
        });
    }
    match dsts.iter().find(|d| d.len() != arena.block_bytes()) {
        None => Ok(()),
        Some(d) => Err(MemError::WrongLength {
            expected: arena.block_bytes(),
            got: d.len(),
        }
        .into()),
    }
}

/// The keys of a source, in order: what to reserve.
pub(crate) fn keys(src: &(impl BlockSource + ?Sized)) -> Vec<BlockHash> {
    (0..src.len()).map(|i| src.key(i)).collect()
}

/// The keys granted a slot: what to abort when filling fails.
pub(crate) fn granted(
    src: &(impl BlockSource + ?Sized),
    results: &[ReserveResult],
) -> Vec<BlockHash> {
    results
        .iter()
        .enumerate()
        .filter(|(_, r)| matches!(r, ReserveResult::Slot(_)))
        .map(|(i, _)| src.key(i))
        .collect()
}

/// The granted blocks, filled: what to commit.
#[derive(Debug, Default)]
pub(crate) struct Filled {
    /// One per granted block, with the checksums computed while copying.
    pub(crate) entries: Vec<CommitEntry>,
    /// The position in the batch of each entry.
    pub(crate) indices: Vec<usize>,
}

/// Why filling stopped.
pub(crate) enum FillFailure {
    /// An error (a slot outside the arena).
    Error(ClientError),
    /// A panic, caught so that the reservations can be aborted first.
    Panic(Box<dyn Any + Send>),
}

impl FillFailure {
    /// Hands the failure on: the error, or the panic resumed.
    pub(crate) fn into_error(self) -> ClientError {
        match self {
            Self::Error(e) => e,
            Self::Panic(p) => std::panic::resume_unwind(p),
        }
    }
}

/// Fills every slot granted in `results` with its block of `src`,
/// computing the checksums in the same pass.
pub(crate) fn fill(
    arena: &ArenaClient,
    key_map: KeyMap,
    src: &(impl BlockSource + ?Sized),
    results: &[ReserveResult],
) -> Result<Filled, FillFailure> {
    // Nothing observable is left half-done by a panic here: the slots are
    // invisible until committed, and the caller aborts them.
    catch_unwind(AssertUnwindSafe(|| fill_all(arena, key_map, src, results)))
        .map_err(FillFailure::Panic)?
        .map_err(FillFailure::Error)
}

fn fill_all(
    arena: &ArenaClient,
    key_map: KeyMap,
    src: &(impl BlockSource + ?Sized),
    results: &[ReserveResult],
) -> Result<Filled> {
    let mut filled = Filled::default();
    for (i, result) in results.iter().enumerate() {
        let ReserveResult::Slot(s) = result else {
            continue;
        };
        let key = src.key(i);
        let slot = arena
            .slot_at(s.offset, s.len)
            .map_err(|e| ClientError::Unexpected {
                what: format!("ReserveOk names {s:?}: {e}"),
            })?;
        let sums = fill_block(arena, slot, key_map.stored(key), |layer, within| {
            src.layer(i, layer, within)
        })?;
        filled.entries.push(CommitEntry { key, sums });
        filled.indices.push(i);
    }
    Ok(filled)
}

/// Copies one block into `slot` layer by layer (`layer(l, within)` gives
/// layer `l`, which lies at `within` in the block) and returns its
/// checksums, computed in the same pass. Checksums are seeded by the
/// stored key, the one the arena and every reader see.
fn fill_block<'a>(
    arena: &ArenaClient,
    slot: usize,
    stored: BlockHash,
    layer: impl Fn(usize, Range<usize>) -> &'a [u8],
) -> Result<BlockSums> {
    let mut sums = Vec::with_capacity(arena.layers());
    let mut at = 0;
    for l in 0..arena.layers() {
        let len = arena.layer_len(l).unwrap_or(0);
        let bytes = layer(l, at..at + len);
        if bytes.len() != len {
            return Err(MemError::WrongLength {
                expected: len,
                got: bytes.len(),
            }
            .into());
        }
        // SAFETY: the daemon reserved this slot for this connection in the
        // ReserveOk just read and has seen no commit or abort for it, so it
        // neither reads nor reuses it; this client fills each granted slot
        // once, from this thread, and never reads a slot it reserved.
        sums.push(unsafe { arena.fill_layer(slot, stored, l, bytes) }?);
        at += len;
    }
    Ok(arena.block_sums(stored, sums)?)
}

/// One outcome per block, from the `Reserve` results and the `Commit`
/// results of the blocks filled (`indices[j]` is the block of `committed[j]`).
pub(crate) fn outcomes(
    results: &[ReserveResult],
    indices: &[usize],
    committed: &[CommitResult],
) -> Vec<StoreOutcome> {
    let mut out: Vec<StoreOutcome> = results
        .iter()
        .map(|r| match r {
            // Every granted block was committed; overwritten below.
            ReserveResult::Slot(_) => StoreOutcome::NotReserved,
            ReserveResult::AlreadyStored => StoreOutcome::AlreadyStored,
            ReserveResult::InFlightElsewhere => StoreOutcome::InFlightElsewhere,
            ReserveResult::NoSpace => StoreOutcome::NoSpace,
        })
        .collect();
    for (&i, c) in indices.iter().zip(committed) {
        out[i] = match c {
            CommitResult::Stored => StoreOutcome::Stored,
            CommitResult::AlreadyStored => StoreOutcome::AlreadyStored,
            CommitResult::NotReserved => StoreOutcome::NotReserved,
            CommitResult::BadChecksum => StoreOutcome::BadChecksum,
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_protocol::Slot;

    #[test]
    fn outcomes_merge_reserve_and_commit_answers() {
        let slot = ReserveResult::Slot(Slot { offset: 0, len: 1 });
        let results = [
            slot,
            ReserveResult::AlreadyStored,
            slot,
            ReserveResult::InFlightElsewhere,
            ReserveResult::NoSpace,
            slot,
        ];
        let committed = [
            CommitResult::Stored,
            CommitResult::BadChecksum,
            CommitResult::AlreadyStored,
        ];
        use StoreOutcome::*;
        assert_eq!(
            outcomes(&results, &[0, 2, 5], &committed),
            vec![
                Stored,
                AlreadyStored,
                BadChecksum,
                InFlightElsewhere,
                NoSpace,
                AlreadyStored
            ]
        );
        let blocks: Vec<(BlockHash, &[u8])> = (0..6).map(|k| (BlockHash(k), &[][..])).collect();
        assert_eq!(
            granted(&blocks[..], &results),
            vec![BlockHash(0), BlockHash(2), BlockHash(5)]
        );
    }
}
