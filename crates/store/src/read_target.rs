//! Where a disk read of a [`Store`](crate::Store) get lands.

use kvtier_io::{AlignedBuf, DmaTarget};
use kvtier_mem::SlotReservation;

/// A reserved DRAM slot (promotion: the block is read straight into DRAM),
/// or a bounce buffer when DRAM has no slot to spare.
pub(crate) enum ReadTarget {
    /// Promotion into a reserved slot.
    Slot(SlotReservation),
    /// DRAM is full: read aside, serve, do not promote.
    Bounce(AlignedBuf),
}

// SAFETY: a reservation owns its slot exclusively until committed or dropped,
// and the slot's address is fixed inside the shared-memory mapping, which the
// reservation keeps alive (it holds the tier); an AlignedBuf's heap memory is
// stable across moves and exclusively owned.
unsafe impl DmaTarget for ReadTarget {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            ReadTarget::Slot(s) => s.as_mut_ptr(),
            ReadTarget::Bounce(b) => b.as_mut_ptr(),
        }
    }
    fn len(&self) -> usize {
        match self {
            ReadTarget::Slot(s) => s.len(),
            ReadTarget::Bounce(b) => <[u8]>::len(b),
        }
    }
}
