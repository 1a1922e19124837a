//! [`HostLanding`]: an arena slot a block arrives in layer by layer, so a
//! reader on the node can consume layer `l` while later layers are still
//! being read from the disk or the remote tier.
//!
//! The slot is reserved when the onboarding is planned (its offset is known
//! before the first byte moves), each layer transfer reads its layer
//! straight into the slot's sub-range (the disk) or copies the verified
//! bytes of a ranged read there (G4), and the layer that completes the
//! block publishes it in the arena with the checksums the disk verified the
//! layers against. A block with a failed layer is never published; its
//! slot is freed when the last transfer naming it lets go of the landing,
//! so no read still in flight can land in a reused slot.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use kvtier_arena::MemError;
use kvtier_core::{BlockHash, BlockSums};
use kvtier_io::DmaTarget;
use kvtier_mem::{PutOutcome, SlotReservation};
use parking_lot::Mutex;

/// A reserved arena slot filled layer by layer; see the module docs.
pub struct HostLanding {
    key: BlockHash,
    slot: usize,
    base: *mut u8,
    layer_bytes: usize,
    layers: u32,
    /// Taken by the commit; dropped with the landing otherwise.
    reservation: Mutex<Option<SlotReservation>>,
    /// Layers verified in place so far. A failed layer is never counted,
    /// so a block with one never reaches `layers` and is never published.
    landed: AtomicU32,
    /// The block's layer checksums, as authenticated by the disk, from
    /// the first layer that landed.
    layer_sums: OnceLock<Vec<u64>>,
}

// SAFETY: `base` points into the shared arena mapping, which the
// reservation keeps alive and in place for the landing's whole life; the
// landing hands out disjoint layer ranges of it, one per layer transfer.
unsafe impl Send for HostLanding {}
// SAFETY: as above; all shared state is atomics or behind the mutex.
unsafe impl Sync for HostLanding {}

impl std::fmt::Debug for HostLanding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostLanding")
            .field("key", &self.key)
            .field("slot", &self.slot)
            .field("landed", &self.landed.load(Ordering::Relaxed))
            .finish()
    }
}

impl HostLanding {
    /// A landing in `reservation`, a block of `layers` layers.
    pub fn new(reservation: SlotReservation, layers: u32) -> Arc<Self> {
        let layer_bytes = reservation.len() / layers.max(1) as usize;
        Arc::new(Self {
            key: reservation.key(),
            slot: reservation.slot(),
            base: reservation.as_mut_ptr(),
            layer_bytes,
            layers: layers.max(1),
            reservation: Mutex::new(Some(reservation)),
            landed: AtomicU32::new(0),
            layer_sums: OnceLock::new(),
        })
    }

    /// The block arriving.
    pub fn key(&self) -> BlockHash {
        self.key
    }

    /// The arena slot it arrives in.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The checksum of layer `layer`, once a layer of the block landed
    /// (the disk authenticated all of them then). A reader verifies the
    /// layer's bytes in the slot against it.
    pub fn layer_sum(&self, layer: u32) -> Option<u64> {
        self.layer_sums.get()?.get(layer as usize).copied()
    }

    /// The slot's bytes of layer `layer`, as a direct-I/O target that keeps
    /// the landing (and so the slot) alive until the read is done with it.
    /// `None` for a layer the block does not have.
    pub fn layer_target(self: &Arc<Self>, layer: u32) -> Option<LayerTarget> {
        (layer < self.layers).then(|| LayerTarget {
            landing: self.clone(),
            layer,
        })
    }

    /// Records that layer `target.layer` landed and was verified against
    /// `sums` (the block's authenticated checksums). The layer that
    /// completes the block publishes it in the arena: `Some` with the
    /// outcome then, `None` while layers are missing.
    pub fn landed(
        &self,
        target: LayerTarget,
        sums: &BlockSums,
    ) -> Option<Result<PutOutcome, MemError>> {
        // The target goes first: once every layer is counted no read
        // into the slot is outstanding.
        drop(target);
        let _ = self.layer_sums.set(sums.layers.clone());
        let landed = self.landed.fetch_add(1, Ordering::AcqRel) + 1;
        if landed < self.layers {
            return None;
        }
        let reservation = self.reservation.lock().take()?;
        Some(reservation.commit_verified(sums))
    }
}

/// One layer of a [`HostLanding`]'s slot, as a read target.
pub struct LayerTarget {
    landing: Arc<HostLanding>,
    layer: u32,
}

impl LayerTarget {
    /// Copies `bytes` (exactly one layer, already verified by the tier
    /// that read them) into the layer's range of the slot; false, and
    /// nothing copied, for another length.
    pub fn fill(&mut self, bytes: &[u8]) -> bool {
        if bytes.len() != self.len() {
            return false;
        }
        let dst = self.as_mut_ptr();
        // SAFETY: `dst` is valid for `len()` bytes of the reserved slot
        // (see the `DmaTarget` impl) that no one else touches (one target
        // per layer); `bytes` is caller memory, not inside the slot.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
        true
    }
}

// SAFETY: the range is inside the reserved slot (`layer < layers`,
// `layers * layer_bytes <= block bytes`), which stays mapped and reserved
// while the landing lives, and this target holds the landing. Each layer of
// a block is read by one transfer, so no two targets alias.
unsafe impl DmaTarget for LayerTarget {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        // SAFETY: in bounds, see above.
        unsafe {
            self.landing
                .base
                .add(self.layer as usize * self.landing.layer_bytes)
        }
    }
    fn len(&self) -> usize {
        self.landing.layer_bytes
    }
}
