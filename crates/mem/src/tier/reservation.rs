//! [`SlotReservation`]: a slot claimed for a block that is not visible yet.

use std::sync::Arc;

use kvtier_core::{BlockHash, BlockSums};

use super::{Inner, PutOutcome};
use kvtier_arena::verify;
use kvtier_arena::{MemError, Result};

/// A slot reserved for block [`key`](Self::key), to be filled in place and
/// then [`commit`](Self::commit)ted. Nothing else reads or writes the slot
/// until then, so its memory can be the target of direct I/O: the address
/// from [`as_mut_ptr`](Self::as_mut_ptr) is 4096-aligned and stays valid,
/// at the same place, for as long as the reservation lives (moving the
/// reservation does not move the memory). Dropping it uncommitted frees the
/// slot.
pub struct SlotReservation {
    inner: Arc<Inner>,
    slot: usize,
    key: BlockHash,
    /// Set once committed or abandoned, so drop does nothing more.
    done: bool,
}

impl SlotReservation {
    /// Wraps a slot the book marked `Filling` for `key`.
    pub(crate) fn new(inner: Arc<Inner>, slot: usize, key: BlockHash) -> Self {
        Self {
            inner,
            slot,
            key,
            done: false,
        }
    }

    /// The block this slot is reserved for.
    pub fn key(&self) -> BlockHash {
        self.key
    }

    /// The slot index in the arena.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Start of the slot: `len()` writable bytes, 4096-aligned, stable for
    /// the reservation's life.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.inner.slot_ptr(self.slot)
    }

    /// Bytes of the block (the tier's `block_bytes`).
    pub fn len(&self) -> usize {
        self.inner.block_bytes()
    }

    /// Always false: blocks have a positive size.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slot's bytes, to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the slot is `Filling` and this reservation is its only
        // holder, so nothing else reads or writes these block_bytes bytes
        // of the live mapping while the borrow of `self` lasts.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), self.len()) }
    }

    /// The slot's bytes as filled so far.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: as in `as_mut_slice`; `&self` excludes our own writes
        // through safe code for the borrow's duration.
        unsafe { std::slice::from_raw_parts(self.as_mut_ptr(), self.len()) }
    }

    /// Verifies the slot's bytes against `sums` and makes the block visible.
    ///
    /// Returns [`PutOutcome::Stored`], or [`PutOutcome::AlreadyPresent`] when
    /// the block became resident through another path meanwhile (this slot
    /// is then freed). Bytes that do not match `sums` give
    /// [`MemError::ChecksumMismatch`]: the slot is freed and the failure
    /// counted as corrupt. Unusable `sums` give [`MemError::BadSums`].
    pub fn commit(self, sums: &BlockSums) -> Result<PutOutcome> {
        self.check(sums, true)?;
        Ok(self.publish_unverified(sums))
    }

    /// Checks `sums` as [`commit`](Self::commit) does when `hash_bytes`,
    /// else as [`commit_verified`](Self::commit_verified) does.
    fn check(&self, sums: &BlockSums, hash_bytes: bool) -> Result<()> {
        self.inner.check_sums(self.key, sums)?;
        if !hash_bytes {
            return Ok(());
        }
        let verdict = verify::verify(
            self.as_slice(),
            self.key,
            self.inner.layer_bytes(),
            &sums.layers,
        );
        if let verify::Verdict::Corrupt(layer) = verdict {
            self.inner.count_corrupt();
            tracing::warn!(key = %self.key, layer, "reserved slot failed verification on commit");
            return Err(MemError::ChecksumMismatch { key: self.key });
        }
        Ok(())
    }

    /// Commits a batch: each reservation checked against its sums as
    /// [`commit`](Self::commit) (`hash_bytes`) or
    /// [`commit_verified`](Self::commit_verified) checks it, one by one,
    /// then every block that passed published under one lock of its tier's
    /// book. One result per reservation, in order.
    pub fn commit_all(blocks: Vec<(Self, BlockSums)>, hash_bytes: bool) -> Vec<Result<PutOutcome>> {
        let mut checked = Vec::with_capacity(blocks.len());
        for (r, sums) in blocks {
            let mac = r.inner.mac_of(r.slot, r.key, &sums);
            checked.push(
                r.check(&sums, hash_bytes)
                    .map(|()| (r, Arc::new(sums), mac)),
            );
        }
        let Some(inner) = checked
            .iter()
            .find_map(|c| c.as_ref().ok())
            .map(|(r, ..)| Arc::clone(&r.inner))
        else {
            return checked
                .into_iter()
                .map(|c| c.map(|_| PutOutcome::Stored))
                .collect();
        };
        let mut book = inner.book.lock();
        let mut stored = 0;
        let out = checked
            .into_iter()
            .map(|c| {
                let (mut r, sums, mac) = c?;
                r.done = true;
                if !Arc::ptr_eq(&r.inner, &inner) {
                    // Another tier's slot (no caller mixes them): its own lock.
                    return Ok(r.inner.publish(r.slot, r.key, sums));
                }
                let outcome = inner.publish_locked(&mut book, r.slot, r.key, sums, mac);
                stored += u64::from(outcome == PutOutcome::Stored);
                Ok(outcome)
            })
            .collect();
        drop(book);
        inner.count_puts(stored);
        out
    }

    /// Makes the block visible after checking that `sums` are consistent,
    /// without hashing the bytes again: for a caller that has itself just
    /// verified *these slot bytes* against `sums` (the store, after the disk
    /// tier read a block straight into this slot and verified it). Saves a
    /// pass over the block; anything else should use [`commit`](Self::commit).
    pub fn commit_verified(self, sums: &BlockSums) -> Result<PutOutcome> {
        self.inner.check_sums(self.key, sums)?;
        Ok(self.publish_unverified(sums))
    }

    /// Makes the block visible without hashing it (for `put`, whose caller
    /// vouches for the sums of bytes it just handed over).
    pub(crate) fn publish_unverified(mut self, sums: &BlockSums) -> PutOutcome {
        self.done = true;
        self.inner
            .publish(self.slot, self.key, Arc::new(sums.clone()))
    }
}

impl Drop for SlotReservation {
    fn drop(&mut self) {
        if !self.done {
            self.inner.abandon(self.slot);
        }
    }
}

impl std::fmt::Debug for SlotReservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotReservation")
            .field("key", &self.key)
            .field("slot", &self.slot)
            .field("len", &self.len())
            .finish()
    }
}

// SAFETY: a reservation owns its slot exclusively until committed or
// dropped, and the slot's address is fixed inside the shared-memory
// mapping, which the reservation keeps alive (it holds the tier): a
// direct-I/O read can land in it.
unsafe impl kvtier_io::DmaTarget for SlotReservation {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        SlotReservation::as_mut_ptr(self)
    }
    fn len(&self) -> usize {
        SlotReservation::len(self)
    }
}
