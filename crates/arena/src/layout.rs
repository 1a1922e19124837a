//! The shared arena: where everything lives in `/dev/shm/<name>`.
//!
//! ```text
//! offset 0              header (HEADER_BYTES = 4096; fields in header.rs)
//! offset table_offset   slot table: slot_count entries of entry_bytes (table.rs)
//! offset data_offset    slot data: slot_count slots of slot_bytes, page aligned
//! ```
//!
//! [`ArenaLayout`] computes those numbers once, from the block size and the
//! capacity; the owner writes them into the header and readers take them back
//! from it. `docs/memory-arena.md` is the byte-level description.

use crate::error::{MemError, Result};
use crate::table;

/// Bytes reserved for the header at the start of the file.
pub const HEADER_BYTES: usize = 4096;
/// Base page size: slots are at least this aligned (O_DIRECT targets).
pub const PAGE_BYTES: usize = 4096;
/// Huge page size: slot alignment when huge pages back the arena.
pub const HUGE_PAGE_BYTES: usize = 2 << 20;
/// Slot table entries are padded to a multiple of a cache line so that two
/// slots' version counters never share a line.
pub const ENTRY_ALIGN: usize = 64;

/// Sizes and offsets of one arena. Every field is in bytes unless named
/// otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaLayout {
    /// Alignment of slots and of the data area: [`PAGE_BYTES`] or [`HUGE_PAGE_BYTES`].
    pub page_bytes: usize,
    /// Bytes of one slot: `block_bytes` rounded up to `page_bytes`.
    pub slot_bytes: usize,
    /// Number of slots.
    pub slot_count: usize,
    /// Bytes of one block.
    pub block_bytes: usize,
    /// Bytes of one layer (the last may be shorter).
    pub layer_bytes: usize,
    /// Layers per block: `ceil(block_bytes / layer_bytes)`.
    pub layers: usize,
    /// Bytes of one slot table entry.
    pub entry_bytes: usize,
    /// Where the slot table starts.
    pub table_offset: usize,
    /// Where the slot data starts (a multiple of `page_bytes`).
    pub data_offset: usize,
    /// Length of the whole file.
    pub file_bytes: usize,
}

const fn align_up(n: usize, align: usize) -> Option<usize> {
    match n.checked_add(align - 1) {
        Some(m) => Some(m / align * align),
        None => None,
    }
}

impl ArenaLayout {
    /// The layout of an arena of `capacity_bytes` worth of slots for blocks
    /// of `block_bytes` with per-layer checksums every `layer_bytes`.
    pub fn compute(
        block_bytes: usize,
        layer_bytes: usize,
        capacity_bytes: u64,
        page_bytes: usize,
    ) -> Result<Self> {
        if block_bytes == 0 {
            return Err(MemError::InvalidConfig(
                "block_bytes must be positive".into(),
            ));
        }
        if layer_bytes == 0 || layer_bytes > block_bytes {
            return Err(MemError::InvalidConfig(format!(
                "layer_bytes must be in 1..=block_bytes ({block_bytes}), got {layer_bytes}"
            )));
        }
        let layers = block_bytes.div_ceil(layer_bytes);
        if layers > u32::MAX as usize {
            return Err(MemError::InvalidConfig(format!(
                "{layers} layers is too many"
            )));
        }
        let overflow = || MemError::InvalidConfig("arena size overflows".into());
        let slot_bytes = align_up(block_bytes, page_bytes).ok_or_else(overflow)?;
        let slot_count = usize::try_from(capacity_bytes / slot_bytes as u64).unwrap_or(usize::MAX);
        if slot_count == 0 {
            return Err(MemError::CapacityTooSmall {
                capacity: capacity_bytes,
                slot_bytes: slot_bytes as u64,
            });
        }
        if slot_count > u32::MAX as usize {
            return Err(MemError::InvalidConfig(format!(
                "{slot_count} slots is more than the 2^32 - 1 an arena indexes"
            )));
        }
        let entry_bytes = table::entry_bytes(layers);
        let table_offset = HEADER_BYTES;
        let table_bytes = slot_count.checked_mul(entry_bytes).ok_or_else(overflow)?;
        let data_offset = table_offset
            .checked_add(table_bytes)
            .and_then(|end| align_up(end, page_bytes))
            .ok_or_else(overflow)?;
        let file_bytes = slot_count
            .checked_mul(slot_bytes)
            .and_then(|d| d.checked_add(data_offset))
            .ok_or_else(overflow)?;
        Ok(Self {
            page_bytes,
            slot_bytes,
            slot_count,
            block_bytes,
            layer_bytes,
            layers,
            entry_bytes,
            table_offset,
            data_offset,
            file_bytes,
        })
    }

    /// Bytes of the data area.
    pub fn data_bytes(&self) -> usize {
        self.slot_count * self.slot_bytes
    }

    /// Offset of slot `slot`'s data from the start of the data area.
    pub fn slot_offset(&self, slot: usize) -> usize {
        slot * self.slot_bytes
    }

    /// Offset of slot `slot`'s data from the start of the file. Saturates
    /// instead of overflowing for an index far past the last slot, so the
    /// result is then past the end of the file.
    pub fn file_offset(&self, slot: usize) -> u64 {
        (slot as u64)
            .saturating_mul(self.slot_bytes as u64)
            .saturating_add(self.data_offset as u64)
    }

    /// The slot whose data is exactly the file range `[offset, offset +
    /// len)`: the inverse of [`file_offset`](Self::file_offset) with `len ==
    /// block_bytes`. Anything else is [`MemError::BadSlot`].
    pub fn slot_at(&self, offset: u64, len: u64) -> Result<usize> {
        let bad = |reason| MemError::BadSlot {
            offset,
            len,
            reason,
        };
        if len != self.block_bytes as u64 {
            return Err(bad("the length is not the block size"));
        }
        let rel = offset
            .checked_sub(self.data_offset as u64)
            .ok_or_else(|| bad("the offset is before the slot data area"))?;
        if !rel.is_multiple_of(self.slot_bytes as u64) {
            return Err(bad("the offset is not the start of a slot"));
        }
        match usize::try_from(rel / self.slot_bytes as u64) {
            Ok(slot) if slot < self.slot_count => Ok(slot),
            _ => Err(bad("the offset is past the last slot")),
        }
    }

    /// Where layer `layer` lies within a block, or `None` past the last.
    pub fn layer_range(&self, layer: usize) -> Option<std::ops::Range<usize>> {
        let start = layer.checked_mul(self.layer_bytes)?;
        (layer < self.layers).then(|| start..(start + self.layer_bytes).min(self.block_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_page_aligned_and_fit() {
        let l = ArenaLayout::compute(10_000, 3_000, 100_000, PAGE_BYTES).unwrap();
        assert_eq!(l.slot_bytes, 12_288);
        assert_eq!(l.slot_count, 8);
        assert_eq!(l.layers, 4);
        assert_eq!(l.data_offset % PAGE_BYTES, 0);
        assert!(l.table_offset + l.slot_count * l.entry_bytes <= l.data_offset);
        assert_eq!(l.file_bytes, l.data_offset + 8 * 12_288);
        let huge = ArenaLayout::compute(10_000, 3_000, 8 << 20, HUGE_PAGE_BYTES).unwrap();
        assert_eq!(huge.slot_bytes, HUGE_PAGE_BYTES);
        assert_eq!(huge.data_offset % HUGE_PAGE_BYTES, 0);
    }

    #[test]
    fn slot_offsets_round_trip_and_only_slots_are_accepted() {
        let l = ArenaLayout::compute(10_000, 3_000, 100_000, PAGE_BYTES).unwrap();
        let len = l.block_bytes as u64;
        for slot in 0..l.slot_count {
            assert_eq!(l.slot_at(l.file_offset(slot), len).unwrap(), slot);
        }
        let first = l.file_offset(0);
        let end = first + (l.slot_count * l.slot_bytes) as u64;
        for (offset, len) in [
            (first, len - 1),
            (first, l.slot_bytes as u64),
            (0, len),
            (first - 4096, len),
            (first + 1, len),
            (first + len, len),
            (end, len),
            (u64::MAX, len),
        ] {
            assert!(
                matches!(l.slot_at(offset, len), Err(MemError::BadSlot { .. })),
                "{offset} {len}"
            );
        }
        assert_eq!(l.layer_range(0), Some(0..3000));
        assert_eq!(l.layer_range(3), Some(9000..10_000));
        assert_eq!(l.layer_range(4), None);
        assert_eq!(l.layer_range(usize::MAX), None);
    }

    #[test]
    fn refuses_what_cannot_be_an_arena() {
        assert!(matches!(
            ArenaLayout::compute(8192, 4096, 4096, PAGE_BYTES),
            Err(MemError::CapacityTooSmall {
                slot_bytes: 8192,
                ..
            })
        ));
        assert!(ArenaLayout::compute(0, 1, 1 << 20, PAGE_BYTES).is_err());
        assert!(ArenaLayout::compute(10, 0, 1 << 20, PAGE_BYTES).is_err());
        assert!(ArenaLayout::compute(10, 11, 1 << 20, PAGE_BYTES).is_err());
        assert!(ArenaLayout::compute(usize::MAX - 5, 1 << 20, u64::MAX, PAGE_BYTES).is_err());
    }
}
