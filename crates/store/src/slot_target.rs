//! A reserved DRAM slot as the target of a direct-I/O read (promotion).

use kvtier_io::DmaTarget;
use kvtier_mem::SlotReservation;

/// Wraps a [`SlotReservation`] so the disk tier can read into it directly.
pub(crate) struct SlotTarget(pub SlotReservation);

// SAFETY: a reservation owns its slot exclusively until committed or dropped,
// and the slot's address is fixed inside the shared-memory mapping, which the
// reservation keeps alive (it holds the tier).
unsafe impl DmaTarget for SlotTarget {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}
