//! [`BlockRef`]: zero-copy access to a resident block.

use std::ops::Deref;
use std::sync::Arc;

use kvtier_core::{BlockHash, BlockSums};

use super::Inner;
use kvtier_arena::verify;

/// A reference to a block's bytes in the arena.
///
/// While any `BlockRef` to a slot is alive, the slot is neither reused nor
/// written: removing the block only makes it invisible, and the
/// slot is freed when the last reference drops. Cloning takes another
/// reference.
pub struct BlockRef {
    inner: Arc<Inner>,
    slot: usize,
    key: BlockHash,
    sums: Arc<BlockSums>,
    /// Set when [`release_all`](Self::release_all) released the reference
    /// with others under one lock, so the drop does not again.
    released: bool,
}

impl BlockRef {
    /// Wraps a reference already counted in the book.
    pub(crate) fn new(
        inner: Arc<Inner>,
        slot: usize,
        key: BlockHash,
        sums: Arc<BlockSums>,
    ) -> Self {
        Self {
            inner,
            slot,
            key,
            sums,
            released: false,
        }
    }

    /// Drops `refs` (references into one tier), releasing them under one
    /// lock of its book rather than one each.
    pub fn release_all(refs: Vec<BlockRef>) {
        let Some(inner) = refs.first().map(|r| Arc::clone(&r.inner)) else {
            return;
        };
        let mut book = inner.book.lock();
        for mut r in refs {
            if Arc::ptr_eq(&r.inner, &inner) {
                book.release(r.slot);
                r.released = true;
            } else {
                // Another tier's (no caller mixes them): after this lock.
                drop(book);
                drop(r);
                book = inner.book.lock();
            }
        }
    }

    /// The block's key.
    pub fn key(&self) -> BlockHash {
        self.key
    }

    /// The checksums the block was stored with.
    pub fn sums(&self) -> BlockSums {
        (*self.sums).clone()
    }

    /// The checksums, without copying them.
    pub fn shared_sums(&self) -> &BlockSums {
        &self.sums
    }

    /// The checksums as the arena's book holds them (a reference count,
    /// not a copy), for holders that outlive this reference.
    pub fn sums_handle(&self) -> Arc<BlockSums> {
        Arc::clone(&self.sums)
    }

    /// The slot index in the arena (offset `slot * slot_bytes` of
    /// [`MemoryTier::arena`](crate::MemoryTier::arena)).
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Whether the bytes still match their checksums (hashes the whole block
    /// in place).
    pub fn verify(&self) -> bool {
        verify::verify(self, self.key, self.inner.layer_bytes(), &self.sums.layers).is_intact()
    }
}

impl Deref for BlockRef {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: the slot holds block_bytes bytes inside the live mapping
        // (`inner` keeps it mapped); our reference keeps the owner from
        // reusing or writing the slot, so the bytes do not change while this
        // borrow lives. (A process that maps the file writable could still
        // scribble on it; `verify` catches that.)
        unsafe {
            std::slice::from_raw_parts(self.inner.slot_ptr(self.slot), self.inner.block_bytes())
        }
    }
}

impl AsRef<[u8]> for BlockRef {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Clone for BlockRef {
    fn clone(&self) -> Self {
        self.inner.add_ref(self.slot);
        Self {
            inner: Arc::clone(&self.inner),
            slot: self.slot,
            released: false,
            key: self.key,
            sums: Arc::clone(&self.sums),
        }
    }
}

impl Drop for BlockRef {
    fn drop(&mut self) {
        if !self.released {
            self.inner.release(self.slot);
        }
    }
}

impl std::fmt::Debug for BlockRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockRef")
            .field("key", &self.key)
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

// SAFETY: while a BlockRef lives its slot is neither reused nor written
// (see the type's doc), and the arena stays mapped while any reference to
// it does: the bytes stay where they are, unchanged, for a direct-I/O write.
unsafe impl kvtier_io::DmaSource for BlockRef {
    fn bytes(&self) -> &[u8] {
        self
    }
}
