//! [`ArenaReader`]: another process's read-only view of an arena.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use kvtier_core::{BlockHash, Lookup};
use parking_lot::Mutex;

use crate::error::Result;
use crate::seqlock;
use crate::view::{Access, ArenaView, Attempt, Part};

/// Counters of one [`ArenaReader`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReaderStats {
    /// Reads that returned verified bytes.
    pub hits: u64,
    /// Reads that found nothing (or kept meeting the owner mid-write).
    pub misses: u64,
    /// Reads whose bytes failed verification with the slot stable.
    pub corrupt: u64,
    /// Copies discarded because the owner changed the slot during them.
    pub retries: u64,
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    corrupt: AtomicU64,
    retries: AtomicU64,
}

/// A read-only mapping of an arena created by a `kvtier_mem::MemoryTier`
/// in another process (or this one), found by its shared-memory name.
///
/// Reads follow the seqlock protocol of the slot table and verify every
/// block against the checksums published with it, so a block being
/// replaced, removed or corrupted is a miss (or [`Lookup::Corrupt`]),
/// never wrong bytes. The reader keeps a map from key to slot, rebuilt by
/// scanning the slot table when a key is not found where the map says.
pub struct ArenaReader {
    view: ArenaView,
    slots: Mutex<HashMap<BlockHash, usize>>,
    counters: Counters,
}

impl ArenaReader {
    /// Opens the arena `/dev/shm/<shm_name>` read-only and checks its header.
    pub fn open(shm_name: &str) -> Result<Self> {
        let reader = Self {
            view: ArenaView::open(shm_name, Access::ReadOnly)?,
            slots: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        };
        reader.refresh();
        Ok(reader)
    }

    /// The shared-memory file.
    pub fn path(&self) -> &Path {
        self.view.path()
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        self.view.layout().block_bytes
    }

    /// Bytes of one slot.
    pub fn slot_bytes(&self) -> usize {
        self.view.layout().slot_bytes
    }

    /// Number of slots.
    pub fn capacity_blocks(&self) -> usize {
        self.view.layout().slot_count
    }

    /// The pid of the process that created the arena (an owner that adopted
    /// it after a crash keeps the creator's: the header never changes).
    pub fn owner_pid(&self) -> u32 {
        self.view.owner_pid()
    }

    /// Whether the arena's name no longer refers to the file this reader
    /// mapped: its owner is gone (the file was unlinked) or was replaced by
    /// a new arena. The mapping stays readable and what it serves stays
    /// verified (blocks are immutable: a key always names the same bytes),
    /// but it no longer changes; reopen to follow the new owner.
    pub fn is_stale(&self) -> bool {
        self.view.is_stale()
    }

    /// Keys of the blocks visible now (scans the slot table).
    pub fn keys(&self) -> Vec<BlockHash> {
        self.refresh();
        self.slots.lock().keys().copied().collect()
    }

    /// Copies block `key` into `dst` (exactly `block_bytes` long) and
    /// verifies it. [`Lookup::Hit`]: `dst` holds the block. [`Lookup::Miss`]:
    /// the arena does not hold it, or the owner kept changing its slot.
    /// [`Lookup::Corrupt`]: the bytes failed verification (counted; the
    /// owner drops the block when it next reads it).
    pub fn get(&self, key: BlockHash, dst: &mut [u8]) -> Lookup {
        if dst.len() != self.block_bytes() {
            self.count(&self.counters.misses);
            return Lookup::Miss;
        }
        let cached = self.slots.lock().get(&key).copied();
        let mut slot = match cached {
            Some(s) => Some(s),
            None => self.refresh_and_find(key),
        };
        let mut refreshed = cached.is_none();
        while let Some(s) = slot {
            match self.read_slot(s, key, dst) {
                Some(Attempt::Hit) => {
                    self.count(&self.counters.hits);
                    return Lookup::Hit;
                }
                Some(Attempt::Corrupt(layer)) => {
                    self.count(&self.counters.corrupt);
                    tracing::warn!(path = %self.path().display(), %key, slot = s, layer, "shared block failed verification");
                    return Lookup::Corrupt;
                }
                Some(Attempt::Moved) if !refreshed => {
                    refreshed = true;
                    slot = self.refresh_and_find(key);
                }
                Some(Attempt::Moved) | None => break,
            }
        }
        self.count(&self.counters.misses);
        Lookup::Miss
    }

    /// Counters of this reader.
    pub fn stats(&self) -> ReaderStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ReaderStats {
            hits: get(&self.counters.hits),
            misses: get(&self.counters.misses),
            corrupt: get(&self.counters.corrupt),
            retries: get(&self.counters.retries),
        }
    }

    fn count(&self, c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// One seqlock-protected read of `slot` as `key` into `dst`; `None` when
    /// every try met the owner writing.
    fn read_slot(&self, slot: usize, key: BlockHash, dst: &mut [u8]) -> Option<Attempt> {
        let mut tries = 0u64;
        // The slot came from the table scan and `dst` was checked, so the
        // read cannot be refused; were it, that is a miss.
        let out = self.view.read(slot, key, Part::Block, dst, &mut tries);
        self.counters
            .retries
            .fetch_add(tries.saturating_sub(1), Ordering::Relaxed);
        out.ok().flatten()
    }

    fn refresh_and_find(&self, key: BlockHash) -> Option<usize> {
        self.refresh();
        self.slots.lock().get(&key).copied()
    }

    /// Rebuilds the key -> slot map from the slot table.
    fn refresh(&self) {
        let table = self.view.table();
        let mut map = HashMap::with_capacity(table.slots());
        for slot in 0..table.slots() {
            if let Some(Some(key)) =
                seqlock::read(table.version(slot), 2, || table.key_if_used(slot))
            {
                map.insert(key, slot);
            }
        }
        *self.slots.lock() = map;
    }
}

impl std::fmt::Debug for ArenaReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArenaReader")
            .field("path", &self.path())
            .field("slots", &self.capacity_blocks())
            .field("owner_pid", &self.owner_pid())
            .finish_non_exhaustive()
    }
}
