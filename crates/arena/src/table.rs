//! The slot table: one entry per slot, in shared memory, describing what the
//! slot holds so that other processes can find and verify blocks.
//!
//! ```text
//! word  off  field
//!    0    0  version: seqlock counter, odd while the owner changes the slot
//!    1    8  key, low 64 bits
//!    2   16  key, high 64 bits
//!    3   24  block checksum
//!    4   32  length of the block in bytes; 0 = the slot holds nothing visible
//!    5   40  number of layer checksums that follow (low 32 bits; high 32 zero)
//!    6   48  MAC, low 64 bits  (kvtier-mem's mac.rs; 0 when the owner has no key)
//!    7   56  MAC, high 64 bits
//!    8   64  layer checksum 0
//!  ...
//!  8+L-1     layer checksum L-1
//!            zero padding up to entry_bytes = round_up(64 + 8 L, 64)
//! ```
//!
//! Words are native-endian `u64`s accessed atomically (every supported target
//! is little-endian). Only the owner writes them, following
//! [`seqlock`]; readers map the file read-only. The MAC lets a later owner
//! tell the entries an owner published from entries someone else wrote
//! (clients can write the file): it is checked when an arena is adopted after
//! a crash, never by readers, who do not have the key.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use kvtier_core::{BlockHash, BlockSums};

use crate::layout::ENTRY_ALIGN;
use crate::seqlock;

#[cfg(target_endian = "big")]
compile_error!("the shared arena format is defined for little-endian targets");

const VERSION: usize = 0;
const KEY_LO: usize = 1;
const KEY_HI: usize = 2;
const BLOCK_SUM: usize = 3;
const LEN: usize = 4;
const LAYERS: usize = 5;
const MAC_LO: usize = 6;
const MAC_HI: usize = 7;
const LAYER_SUMS: usize = 8;

/// Bytes of one entry for blocks of `layers` layers.
pub const fn entry_bytes(layers: usize) -> usize {
    (8 * (LAYER_SUMS + layers)).div_ceil(ENTRY_ALIGN) * ENTRY_ALIGN
}

/// What one entry says, copied out of shared memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntrySnapshot {
    /// The block's key.
    pub key: BlockHash,
    /// Block length; 0 when the slot holds nothing visible.
    pub len: u64,
    /// The block's checksums.
    pub sums: BlockSums,
}

/// A view of the slot table in a mapping. It does not own the memory.
pub struct SlotTable {
    base: NonNull<u8>,
    entry_bytes: usize,
    slots: usize,
    layers: usize,
}

// SAFETY: the table only hands out atomic accesses to the shared words; the
// memory is owned by a mapping that the holder of the table keeps alive.
unsafe impl Send for SlotTable {}
// SAFETY: as above; every access is atomic.
unsafe impl Sync for SlotTable {}

impl SlotTable {
    /// A view of `slots` entries for `layers` layers starting at `base`.
    ///
    /// # Safety
    /// `base` must be 8-byte aligned and valid for reads of
    /// `slots * entry_bytes(layers)` bytes for as long as the table is used
    /// (and for writes too if any writer method is called), and nobody may
    /// access those bytes other than atomically.
    pub unsafe fn new(base: NonNull<u8>, slots: usize, layers: usize) -> Self {
        Self {
            base,
            entry_bytes: entry_bytes(layers),
            slots,
            layers,
        }
    }

    fn word(&self, slot: usize, word: usize) -> &AtomicU64 {
        assert!(slot < self.slots && word < LAYER_SUMS + self.layers);
        // SAFETY: in bounds by the assertion and the constructor's contract;
        // entries are 64-byte multiples from an 8-aligned base, so the word is
        // 8-byte aligned; the memory is only accessed atomically and outlives
        // `self`.
        unsafe {
            AtomicU64::from_ptr(
                self.base
                    .as_ptr()
                    .add(slot * self.entry_bytes + word * 8)
                    .cast::<u64>(),
            )
        }
    }

    /// Number of entries.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Slot `slot`'s version counter.
    pub fn version(&self, slot: usize) -> &AtomicU64 {
        self.word(slot, VERSION)
    }

    /// Reads the entry's fields (not the version). Without the seqlock
    /// around it, the result may mix two states of the entry.
    pub fn snapshot(&self, slot: usize) -> EntrySnapshot {
        let load = |w| self.word(slot, w).load(Ordering::Relaxed);
        let key = BlockHash((load(KEY_HI) as u128) << 64 | load(KEY_LO) as u128);
        let layers = (load(LAYERS) as usize).min(self.layers);
        EntrySnapshot {
            key,
            len: load(LEN),
            sums: BlockSums {
                block: load(BLOCK_SUM),
                layers: (0..layers).map(|l| load(LAYER_SUMS + l)).collect(),
            },
        }
    }

    /// The key, if the entry holds a visible block (no version check).
    pub fn key_if_used(&self, slot: usize) -> Option<BlockHash> {
        let load = |w| self.word(slot, w).load(Ordering::Relaxed);
        (load(LEN) != 0).then(|| BlockHash((load(KEY_HI) as u128) << 64 | load(KEY_LO) as u128))
    }

    /// Owner: the slot's bytes are about to change (version odd).
    pub fn begin_fill(&self, slot: usize) {
        seqlock::begin_write(self.version(slot));
    }

    /// The entry's MAC words (no version check).
    pub fn mac(&self, slot: usize) -> [u64; 2] {
        let load = |w| self.word(slot, w).load(Ordering::Relaxed);
        [load(MAC_LO), load(MAC_HI)]
    }

    /// The entry's layer-count word as stored, unclamped (no version check):
    /// [`snapshot`](Self::snapshot) clamps it to the arena's layers, which
    /// an adopting owner must not take for a valid count.
    pub fn layer_count(&self, slot: usize) -> u64 {
        self.word(slot, LAYERS).load(Ordering::Relaxed)
    }

    /// Whether every word of the entry but the version is 0 (no version
    /// check): an empty slot nothing has scribbled on.
    pub fn is_blank(&self, slot: usize) -> bool {
        (KEY_LO..LAYER_SUMS + self.layers).all(|w| self.word(slot, w).load(Ordering::Relaxed) == 0)
    }

    /// Owner: a fill started with [`begin_fill`](Self::begin_fill) is
    /// published as block `key` of `len` bytes (version even), with `mac`
    /// over what the entry asserts (`kvtier-mem`'s `mac.rs`; zeros without a key).
    pub fn publish(
        &self,
        slot: usize,
        key: BlockHash,
        len: usize,
        sums: &BlockSums,
        mac: [u64; 2],
    ) {
        let store = |w, v| self.word(slot, w).store(v, Ordering::Relaxed);
        store(KEY_LO, key.0 as u64);
        store(KEY_HI, (key.0 >> 64) as u64);
        store(BLOCK_SUM, sums.block);
        store(LAYERS, sums.layers.len().min(self.layers) as u64);
        store(MAC_LO, mac[0]);
        store(MAC_HI, mac[1]);
        for (l, s) in sums.layers.iter().take(self.layers).enumerate() {
            store(LAYER_SUMS + l, *s);
        }
        store(LEN, len as u64);
        seqlock::end_write(self.version(slot));
    }

    /// Owner: a fill started with [`begin_fill`](Self::begin_fill) ends with
    /// nothing visible (version even, entry empty).
    pub fn abandon_fill(&self, slot: usize) {
        self.zero(slot);
        seqlock::end_write(self.version(slot));
    }

    /// Owner: the slot's block is no longer visible to readers.
    pub fn clear(&self, slot: usize) {
        seqlock::begin_write(self.version(slot));
        self.zero(slot);
        seqlock::end_write(self.version(slot));
    }

    /// Owner, adopting an arena: empties the entry whatever state the dead
    /// owner (or a scribbler) left its version in, moving the version
    /// through an odd value to the next even one, as every change must.
    pub fn reset(&self, slot: usize) {
        let version = self.version(slot);
        let odd = version.load(Ordering::Relaxed) | 1;
        version.store(odd, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        self.zero(slot);
        version.store(odd.wrapping_add(1), Ordering::Release);
    }

    fn zero(&self, slot: usize) {
        for w in KEY_LO..LAYER_SUMS + self.layers {
            self.word(slot, w).store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_clear() {
        let layers = 3;
        let mut mem = vec![0u64; entry_bytes(layers) / 8 * 4];
        let base = NonNull::new(mem.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: `mem` is 8-aligned, large enough for 4 entries, outlives the
        // table, and is only touched through it below.
        let t = unsafe { SlotTable::new(base, 4, layers) };
        let sums = BlockSums {
            block: 7,
            layers: vec![1, 2, 3],
        };
        let key = BlockHash(u128::MAX - 5);
        t.begin_fill(2);
        assert!(seqlock::is_writing(t.version(2)));
        t.publish(2, key, 100, &sums, [11, 12]);
        assert!(!seqlock::is_writing(t.version(2)));
        let s = t.snapshot(2);
        assert_eq!((s.key, s.len, &s.sums), (key, 100, &sums));
        assert_eq!((t.mac(2), t.layer_count(2)), ([11, 12], 3));
        assert_eq!(t.key_if_used(2), Some(key));
        assert_eq!(t.key_if_used(1), None);
        assert!(!t.is_blank(2) && t.is_blank(1));
        t.clear(2);
        assert_eq!(t.key_if_used(2), None);
        assert!(t.is_blank(2));
        assert_eq!(t.version(2).load(Ordering::Relaxed), 4);
        // A reset ends even from either parity.
        t.begin_fill(2);
        t.reset(2);
        assert_eq!(t.version(2).load(Ordering::Relaxed), 6);
        t.reset(2);
        assert_eq!(t.version(2).load(Ordering::Relaxed), 8);
        assert_eq!(entry_bytes(3), 128);
        assert_eq!(entry_bytes(0), 64);
        assert_eq!(entry_bytes(4), 128);
        assert_eq!(entry_bytes(8), 128);
        assert_eq!(entry_bytes(9), 192);
        // The documented word offsets (docs/memory-arena.md), read once the
        // table is no longer used.
        t.begin_fill(3);
        t.publish(3, key, 100, &sums, [11, 12]);
        let words = &mem[entry_bytes(layers) / 8 * 3..];
        let (lo, hi) = (key.0 as u64, (key.0 >> 64) as u64);
        assert_eq!(&words[..11], &[2, lo, hi, 7, 100, 3, 11, 12, 1, 2, 3]);
    }
}
