//! [`ArenaClient`]: an engine process's read-write view of an arena that
//! the node daemon owns.
//!
//! The daemon decides which slot holds what and publishes that in the slot
//! table; the client moves the bytes itself, so a block is copied exactly
//! once each way: engine memory -> arena slot when storing (into a slot the
//! daemon reserved for it), arena slot -> engine memory when loading (from
//! a slot the daemon pinned for it). Every copy is hashed as it is made:
//! a fill returns the checksums the client then commits, a read verifies
//! against the checksums the daemon published.

use std::path::Path;

use kvtier_core::{BlockHash, BlockSums, Lookup, combine_layer_checksums};

use crate::error::{MemError, Result};
use crate::verify::{self, Verdict};
use crate::view::{Access, ArenaView, Part};

/// A read-write mapping of an arena owned by another process (the node
/// daemon's `kvtier_mem::MemoryTier`), opened by its
/// shared-memory name.
///
/// The slot data area is mapped writable; the header and slot table are
/// mapped read-only, so a well-behaved client never changes what the
/// daemon publishes (a hostile one with write access to the file could,
/// which is why reads never trust the table). Slot indices come from
/// [`slot_at`](Self::slot_at), which checks the `(offset, len)` ranges of
/// the daemon's replies.
///
/// Writing ([`fill`](Self::fill), [`fill_layer`](Self::fill_layer)) is
/// `unsafe`: it is sound only into a slot the daemon reserved for this
/// client. Reading ([`read`](Self::read), [`read_layer`](Self::read_layer))
/// is safe in every case: it verifies the copy against checksums the
/// caller got from the daemon, so it returns verified bytes or
/// [`Lookup::Corrupt`], never anything else.
#[derive(Debug)]
pub struct ArenaClient {
    view: ArenaView,
}

impl ArenaClient {
    /// Opens the arena `/dev/shm/<shm_name>` read-write and checks its
    /// header. The file is mode 0600, or 0660 with the group the daemon is
    /// configured with (`manager.access_group`), so the client must run as
    /// the daemon's user or in that group.
    pub fn open(shm_name: &str) -> Result<Self> {
        Ok(Self {
            view: ArenaView::open(shm_name, Access::SlotsWritable)?,
        })
    }

    /// The shared-memory file.
    pub fn path(&self) -> &Path {
        self.view.path()
    }

    /// Bytes of the whole arena file (what the daemon announces as its
    /// length).
    pub fn file_bytes(&self) -> u64 {
        self.view.layout().file_bytes as u64
    }

    /// Bytes of one slot (the block size rounded up to the page size).
    pub fn slot_bytes(&self) -> usize {
        self.view.layout().slot_bytes
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        self.view.layout().block_bytes
    }

    /// Bytes of one layer (the last layer of a block may be shorter).
    pub fn layer_bytes(&self) -> usize {
        self.view.layout().layer_bytes
    }

    /// Layers per block.
    pub fn layers(&self) -> usize {
        self.view.layout().layers
    }

    /// Bytes of layer `layer`, or `None` past the last layer.
    pub fn layer_len(&self, layer: usize) -> Option<usize> {
        self.view.layout().layer_range(layer).map(|r| r.len())
    }

    /// Number of slots.
    pub fn capacity_blocks(&self) -> usize {
        self.view.layout().slot_count
    }

    /// The pid of the process that created the arena.
    pub fn owner_pid(&self) -> u32 {
        self.view.owner_pid()
    }

    /// Whether the arena's name no longer refers to the file this client
    /// mapped (the daemon is gone or restarted): reconnect to follow it.
    pub fn is_stale(&self) -> bool {
        self.view.is_stale()
    }

    /// The slot whose data is exactly `[offset, offset + len)` of the arena
    /// file, as the daemon names slots in its replies. Anything else (an
    /// offset in the header or table, inside a slot, past the end, a length
    /// other than the block size) is [`MemError::BadSlot`].
    pub fn slot_at(&self, offset: u64, len: u64) -> Result<usize> {
        self.view.layout().slot_at(offset, len)
    }

    /// Copies block `key` from `src` (exactly `block_bytes` long) into
    /// `slot` and returns its checksums, computed in the same pass over the
    /// bytes (layer by layer: each layer is read once, stored to the slot
    /// and hashed from the same registers). They equal
    /// [`BlockSums::compute`]`(key, layer_bytes, src)`; commit them.
    ///
    /// # Safety
    /// The caller must hold the daemon's reservation of `slot` (a `Slot` of
    /// a `Reserve` reply, not yet committed or aborted, whose lease has not
    /// expired), and nothing else in this process may read or write that
    /// slot during the call. The daemon never reads or reuses a reserved
    /// slot until commit, abort or lease expiry, so the slot is then this
    /// caller's alone.
    pub unsafe fn fill(&self, slot: usize, key: BlockHash, src: &[u8]) -> Result<BlockSums> {
        let layout = self.view.layout();
        if src.len() != layout.block_bytes {
            return Err(MemError::WrongLength {
                expected: layout.block_bytes,
                got: src.len(),
            });
        }
        // `chunks` cuts `src` exactly as the layout cuts a block into layers.
        let layers = src
            .chunks(layout.layer_bytes)
            .enumerate()
            // SAFETY: the caller's contract, passed on layer by layer.
            .map(|(layer, chunk)| unsafe { self.fill_layer(slot, key, layer, chunk) })
            .collect::<Result<Vec<u64>>>()?;
        self.block_sums(key, layers)
    }

    /// Copies layer `layer` of block `key` from `src` (exactly that layer's
    /// length, [`layer_len`](Self::layer_len)) into its place in `slot` and
    /// returns its checksum, computed in the same pass (equal to
    /// `kvtier_core::layer_checksum(key, layer, src)`). For stores that
    /// arrive layer by layer; [`block_sums`](Self::block_sums) combines the
    /// layer checksums for the commit.
    ///
    /// # Safety
    /// As for [`fill`](Self::fill): the caller holds the daemon's
    /// reservation of `slot`, and nothing else in this process reads or
    /// writes that layer of the slot during the call.
    pub unsafe fn fill_layer(
        &self,
        slot: usize,
        key: BlockHash,
        layer: usize,
        src: &[u8],
    ) -> Result<u64> {
        let range = self.view.range(Part::Layer(layer), src.len())?;
        // SAFETY: `range` lies inside the block, so inside the slot, which
        // lies in the writable data area of our mapping.
        let dst = unsafe { self.view.slot_ptr(slot)?.add(range.start) };
        // SAFETY: the caller holds the reservation, so these bytes of the
        // shared mapping are ours alone for the call (no other reference to
        // them exists in this process, and the daemon does not touch them);
        // they lie inside the mapping by the checks above.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst, range.len()) };
        // SAFETY: `src` is a live slice of `dst.len()` bytes; it cannot
        // overlap `dst`, which the caller holds exclusively.
        Ok(unsafe { kvtier_core::copy_layer_checksum(src.as_ptr(), dst, key, layer as u32) })
    }

    /// The checksums of block `key` from its layer checksums (as returned
    /// by [`fill_layer`](Self::fill_layer), in layer order): the layer sums
    /// and their combination. Fails unless there is one per layer.
    pub fn block_sums(&self, key: BlockHash, layer_sums: Vec<u64>) -> Result<BlockSums> {
        if layer_sums.len() != self.layers() {
            return Err(MemError::BadSums {
                key,
                reason: format!(
                    "{} layer checksums for a block of {} layers",
                    layer_sums.len(),
                    self.layers()
                ),
            });
        }
        Ok(BlockSums {
            block: combine_layer_checksums(key, &layer_sums),
            layers: layer_sums,
        })
    }

    /// Copies block `key` out of `slot` into `dst` (exactly `block_bytes`
    /// long), verifying the copy against `layer_sums`: the checksums the
    /// daemon sent over the socket for this block (`LoadOk`,
    /// `LayerReady`), never the slot table, which clients can write. The
    /// daemon keeps the slot for the caller until it releases it.
    ///
    /// [`Lookup::Hit`]: `dst` holds the verified block.
    /// [`Lookup::Corrupt`]: the bytes failed verification (someone wrote
    /// the slot, or it holds another block); `dst` holds garbage. Errors
    /// are caller mistakes: a slot that does not exist, a `dst` of the
    /// wrong length.
    pub fn read(
        &self,
        slot: usize,
        key: BlockHash,
        layer_sums: &[u64],
        dst: &mut [u8],
    ) -> Result<Lookup> {
        let range = self.view.range(Part::Block, dst.len())?;
        // SAFETY: `range` lies inside the block, so inside the slot.
        let src = unsafe { self.view.slot_ptr(slot)?.add(range.start) };
        let layer_bytes = self.view.layout().layer_bytes;
        // SAFETY: `src` is valid for `dst.len()` bytes of our mapping (the
        // range checked above) and `dst` is private memory. Whatever a
        // concurrent writer does, what is hashed is `dst`, so it can only
        // make the verification fail.
        let verdict = unsafe { verify::copy_verified(src, dst, key, layer_bytes, layer_sums) };
        Ok(match verdict {
            Verdict::Intact => Lookup::Hit,
            Verdict::Corrupt(layer) => {
                tracing::warn!(path = %self.path().display(), %key, slot, layer, "arena block failed verification");
                Lookup::Corrupt
            }
        })
    }

    /// Copies layer `layer` of block `key` out of `slot` into `dst`
    /// (exactly that layer's length), verifying the copy against
    /// `layer_sum`, the layer's checksum the daemon sent; outcomes as for
    /// [`read`](Self::read).
    pub fn read_layer(
        &self,
        slot: usize,
        key: BlockHash,
        layer: usize,
        layer_sum: u64,
        dst: &mut [u8],
    ) -> Result<Lookup> {
        let range = self.view.range(Part::Layer(layer), dst.len())?;
        // SAFETY: `range` lies inside the block, so inside the slot.
        let src = unsafe { self.view.slot_ptr(slot)?.add(range.start) };
        // SAFETY: as in `read`: `src` is valid for `dst.len()` bytes and
        // `dst` is private memory, which is what gets hashed.
        let got = unsafe { kvtier_core::copy_layer_checksum(src, dst, key, layer as u32) };
        Ok(if got == layer_sum {
            Lookup::Hit
        } else {
            tracing::warn!(path = %self.path().display(), %key, slot, layer, "arena layer failed verification");
            Lookup::Corrupt
        })
    }
}
