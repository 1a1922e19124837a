//! Adopting the arena a crashed owner left: which of its slots stay.
//!
//! The arena file outlives a killed owner (only a clean drop unlinks it).
//! A new owner with the same table key and layout keeps the file and vets
//! every slot (docs/memory-arena.md, "Adoption after a crash"): a slot
//! stays resident only if its entry is stable (even version), publishes a
//! block (non-zero length), carries the MAC the owner computed under the
//! table key, describes a block of this arena, and its bytes match the
//! sums; at most one slot per key. Every other entry is emptied.

use std::collections::HashSet;
use std::ptr::NonNull;
use std::sync::Arc;

use kvtier_core::{BlockHash, BlockSums};

use kvtier_arena::layout::ArenaLayout;
use kvtier_arena::table::SlotTable;
use kvtier_arena::verify::{self, Verdict};

use crate::mac::EntryMac;

/// What adopting a crashed owner's arena kept and dropped, per slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArenaAdoption {
    /// Published blocks kept resident.
    pub kept: u64,
    /// Slots the dead owner was changing (odd version): a reservation or a
    /// fill never committed, or a removal half done. Dropped.
    pub unfinished: u64,
    /// Entries whose MAC does not verify under the table key: written by
    /// someone other than an owner (a client can write the file), or by an
    /// owner with another key. Dropped.
    pub unauthentic: u64,
    /// Authentic entries whose slot bytes fail their checksums (or whose
    /// fields cannot describe a block of this arena). Dropped.
    pub corrupt: u64,
    /// Authentic, intact entries of a key an earlier slot already holds.
    /// Dropped (one copy is kept).
    pub duplicates: u64,
}

/// What the scan decided for one slot.
#[derive(Debug)]
enum Found {
    /// Nothing there, nothing scribbled.
    Empty,
    /// A block to keep.
    Block(BlockHash, BlockSums),
    /// Odd version.
    Unfinished,
    /// The MAC does not verify.
    Unauthentic,
    /// Authentic, but not a block of this arena that its bytes match.
    Corrupt,
}

/// The outcome of [`adopt_slots`].
pub(crate) struct Adopted {
    /// The slots kept: slot, key and the sums the owner published.
    pub resident: Vec<(usize, BlockHash, Arc<BlockSums>)>,
    /// Slots that were being filled: to hand out last.
    pub unfinished: Vec<usize>,
    /// The counts.
    pub report: ArenaAdoption,
}

/// The arena's table and slot bytes, shared by the scanning threads.
struct Arena<'a> {
    table: &'a SlotTable,
    data: NonNull<u8>,
    layout: &'a ArenaLayout,
    mac: &'a EntryMac,
}

// SAFETY: the table is Sync; `data` is only read, through raw copies whose
// results are verified (other processes may write the bytes meanwhile),
// while the mapping outlives the scan.
unsafe impl Sync for Arena<'_> {}

/// Vets every slot of an arena just taken over (see the module docs),
/// empties the entries not kept, and returns what stays.
///
/// # Safety
/// `data` must be the start of the mapped slot data area of `layout`,
/// valid for reads for the whole call; `table` must be that arena's table.
pub(crate) unsafe fn adopt_slots(
    table: &SlotTable,
    data: NonNull<u8>,
    layout: &ArenaLayout,
    mac: &EntryMac,
) -> Adopted {
    let arena = Arena {
        table,
        data,
        layout,
        mac,
    };
    let found = arena.scan_all();
    let mut out = Adopted {
        resident: Vec::new(),
        unfinished: Vec::new(),
        report: ArenaAdoption::default(),
    };
    let mut keys = HashSet::new();
    for (slot, f) in found.into_iter().enumerate() {
        let r = &mut out.report;
        match f {
            Found::Empty => continue,
            Found::Block(key, sums) if keys.insert(key) => {
                r.kept += 1;
                out.resident.push((slot, key, Arc::new(sums)));
                continue;
            }
            Found::Block(..) => r.duplicates += 1,
            Found::Unfinished => {
                r.unfinished += 1;
                out.unfinished.push(slot);
            }
            Found::Unauthentic => r.unauthentic += 1,
            Found::Corrupt => r.corrupt += 1,
        }
        table.reset(slot);
    }
    out
}

impl Arena<'_> {
    /// Every slot's verdict, in slot order; hashing spread over threads
    /// (a large arena is many GiB to check).
    fn scan_all(&self) -> Vec<Found> {
        let slots = self.layout.slot_count;
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(8)
            .min(slots.div_ceil(64))
            .max(1);
        let per = slots.div_ceil(threads);
        if threads == 1 {
            return self.scan(0..slots);
        }
        std::thread::scope(|s| {
            let parts: Vec<_> = (0..threads)
                .map(|t| {
                    let range = (t * per).min(slots)..((t + 1) * per).min(slots);
                    s.spawn(move || self.scan(range))
                })
                .collect();
            parts
                .into_iter()
                // A scanning thread only panics on a bug; re-raise it.
                .flat_map(|p| p.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        })
    }

    fn scan(&self, slots: std::ops::Range<usize>) -> Vec<Found> {
        let mut scratch = vec![0u8; self.layout.block_bytes];
        slots.map(|slot| self.vet(slot, &mut scratch)).collect()
    }

    /// The verdict on one slot; `scratch` holds `block_bytes`.
    fn vet(&self, slot: usize, scratch: &mut [u8]) -> Found {
        let t = self.table;
        if t.version(slot).load(std::sync::atomic::Ordering::Acquire) & 1 == 1 {
            return Found::Unfinished;
        }
        if t.is_blank(slot) {
            return Found::Empty;
        }
        let entry = t.snapshot(slot);
        if self.mac.compute(slot, entry.key, entry.len, &entry.sums) != t.mac(slot) {
            return Found::Unauthentic;
        }
        let l = self.layout;
        let describes_a_block = entry.len == l.block_bytes as u64
            && t.layer_count(slot) == l.layers as u64
            && entry.sums.layers.len() == l.layers
            && entry.sums.is_consistent(entry.key);
        if !describes_a_block {
            return Found::Corrupt;
        }
        // SAFETY: the slot lies inside the data area (slot < slot_count),
        // valid for block_bytes reads by the caller's contract; `scratch` is
        // private. What is hashed is the copy, so bytes changing under it
        // can only fail the check.
        let verdict = unsafe {
            verify::copy_verified(
                self.data.as_ptr().add(l.slot_offset(slot)),
                scratch,
                entry.key,
                l.layer_bytes,
                &entry.sums.layers,
            )
        };
        match verdict {
            Verdict::Intact => Found::Block(entry.key, entry.sums),
            Verdict::Corrupt(_) => Found::Corrupt,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mac::TableKey;
    use kvtier_arena::layout::PAGE_BYTES;
    use kvtier_arena::table::entry_bytes;
    use proptest::prelude::*;

    const BLOCK: usize = 8192;
    const LAYER: usize = 4096;
    const SLOTS: usize = 8;

    fn layout() -> ArenaLayout {
        ArenaLayout::compute(BLOCK, LAYER, (SLOTS * BLOCK) as u64, PAGE_BYTES).unwrap()
    }

    fn block(key: BlockHash) -> Vec<u8> {
        let seed = (key.0 as u64) | 1;
        (0..BLOCK as u64)
            .map(|i| (seed.wrapping_mul(i + 3) >> 29) as u8)
            .collect()
    }

    /// A crash image in private memory: the table's words and the slots'
    /// bytes, as a dead owner left them.
    struct Image {
        table: Vec<u64>,
        data: Vec<u8>,
    }

    impl Image {
        fn new() -> Self {
            Self {
                table: vec![0; SLOTS * entry_bytes(2) / 8],
                data: vec![0; SLOTS * BLOCK],
            }
        }

        /// A view of the table words.
        ///
        /// # Safety
        /// Nothing else may touch `self.table` while the view is used.
        unsafe fn view(&mut self) -> SlotTable {
            let base = NonNull::new(self.table.as_mut_ptr().cast::<u8>()).unwrap();
            // SAFETY: 8-aligned, SLOTS entries long, exclusive by the
            // caller's contract.
            unsafe { SlotTable::new(base, SLOTS, 2) }
        }

        /// What the owner publishing `key` in `slot` leaves (under `mac`).
        fn publish(&mut self, mac: &EntryMac, slot: usize, key: BlockHash) {
            let bytes = block(key);
            let sums = BlockSums::compute(key, LAYER, &bytes);
            self.data[slot * BLOCK..][..BLOCK].copy_from_slice(&bytes);
            // SAFETY: the view is dropped before anything else touches the table.
            let t = unsafe { self.view() };
            t.begin_fill(slot);
            t.publish(
                slot,
                key,
                BLOCK,
                &sums,
                mac.compute(slot, key, BLOCK as u64, &sums),
            );
        }

        /// What a reservation being filled leaves: odd version, bytes in.
        fn reserve(&mut self, slot: usize, key: BlockHash) {
            self.data[slot * BLOCK..][..BLOCK].copy_from_slice(&block(key));
            // SAFETY: as in `publish`.
            unsafe { self.view() }.begin_fill(slot);
        }

        fn adopt(&mut self, mac: &EntryMac) -> (Adopted, Vec<bool>) {
            let data = NonNull::new(self.data.as_mut_ptr()).unwrap();
            // SAFETY: as in `publish`.
            let t = unsafe { self.view() };
            // SAFETY: `data` is SLOTS blocks of private memory that outlive
            // the call; `t` is its table.
            let adopted = unsafe { adopt_slots(&t, data, &layout(), mac) };
            let blank = (0..SLOTS)
                .map(|s| {
                    t.is_blank(s)
                        && t.version(s).load(std::sync::atomic::Ordering::Relaxed) % 2 == 0
                })
                .collect();
            (adopted, blank)
        }
    }

    fn mac(key: u8) -> EntryMac {
        EntryMac::new(&TableKey::from_bytes([key; 32]), &layout())
    }

    #[test]
    fn published_blocks_stay_and_everything_else_goes() {
        let m = mac(1);
        let mut img = Image::new();
        for (slot, key) in [(0, 10), (1, 11), (2, 12), (3, 13), (4, 14), (5, 15)] {
            img.publish(&m, slot, BlockHash(key));
        }
        img.reserve(6, BlockHash(16));
        // A forged entry: key 11's entry rewritten to claim key 20, its
        // bytes and sums made to match, the MAC left.
        let forged = BlockHash(20);
        img.data[BLOCK..][..BLOCK].copy_from_slice(&block(forged));
        img.publish(&mac(9), 1, forged);
        // An entry moved to another slot (its MAC names slot 2).
        let e = entry_bytes(2) / 8;
        let two: Vec<u64> = img.table[2 * e..3 * e].to_vec();
        img.table[7 * e..8 * e].copy_from_slice(&two);
        img.data.copy_within(2 * BLOCK..3 * BLOCK, 7 * BLOCK);
        // Authentic entry, bytes changed.
        img.data[3 * BLOCK + 5000] ^= 1;
        // The same block published twice (a replayed entry).
        img.publish(&m, 5, BlockHash(14));
        let (adopted, blank) = img.adopt(&m);
        let kept: Vec<(usize, BlockHash)> =
            adopted.resident.iter().map(|(s, k, _)| (*s, *k)).collect();
        assert_eq!(
            kept,
            vec![(0, BlockHash(10)), (2, BlockHash(12)), (4, BlockHash(14))]
        );
        assert_eq!(
            adopted.report,
            ArenaAdoption {
                kept: 3,
                unfinished: 1,
                unauthentic: 2,
                corrupt: 1,
                duplicates: 1,
            }
        );
        assert_eq!(adopted.unfinished, vec![6]);
        assert_eq!(
            blank,
            vec![false, true, false, true, false, true, true, true]
        );
    }

    #[test]
    fn another_key_adopts_nothing() {
        let mut img = Image::new();
        for slot in 0..SLOTS {
            img.publish(&mac(1), slot, BlockHash(100 + slot as u128));
        }
        let (adopted, blank) = img.adopt(&mac(2));
        assert!(adopted.resident.is_empty());
        assert_eq!(adopted.report.unauthentic, SLOTS as u64);
        assert!(blank.iter().all(|b| *b));
    }

    proptest! {
        /// Garbage in random table words and slot bytes: whatever adoption
        /// keeps is a block the owner published there, with exactly its
        /// bytes; what nothing touched is kept.
        #[test]
        fn garbage_never_makes_a_wrong_block_adoptable(
            published in proptest::collection::btree_map(0..SLOTS, 1u128..1 << 100, 0..=SLOTS),
            words in proptest::collection::vec((0..SLOTS * entry_bytes(2) / 8, any::<u64>()), 0..6),
            bytes in proptest::collection::vec((0..SLOTS * BLOCK, 1u8..), 0..4),
        ) {
            let m = mac(3);
            let mut img = Image::new();
            for (&slot, &key) in &published {
                img.publish(&m, slot, BlockHash(key));
            }
            let mut touched = [false; SLOTS];
            for &(w, v) in &words {
                touched[w * 8 / entry_bytes(2)] |= img.table[w] != v;
                img.table[w] = v;
            }
            for &(b, x) in &bytes {
                touched[b / BLOCK] = true;
                img.data[b] ^= x;
            }
            let (adopted, blank) = img.adopt(&m);
            let mut kept = [false; SLOTS];
            for (slot, key, sums) in &adopted.resident {
                prop_assert_eq!(published.get(slot), Some(&key.0));
                let bytes = &img.data[slot * BLOCK..][..BLOCK];
                prop_assert!(bytes == block(*key).as_slice(), "slot {} kept other bytes", slot);
                prop_assert_eq!(&**sums, &BlockSums::compute(*key, LAYER, bytes));
                kept[*slot] = true;
            }
            let mut keys = HashSet::new();
            for (&slot, &key) in &published {
                if !touched[slot] && keys.insert(key) {
                    prop_assert!(kept[slot], "untouched slot {} dropped", slot);
                }
            }
            for slot in 0..SLOTS {
                prop_assert!(kept[slot] || blank[slot], "slot {} neither kept nor emptied", slot);
            }
        }
    }
}
