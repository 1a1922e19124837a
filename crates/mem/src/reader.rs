//! [`ArenaReader`]: another process's read-only view of an arena.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use kvtier_core::{BlockHash, Lookup};
use parking_lot::Mutex;

use crate::arena::shm::{self, Mapping};
use crate::arena::table::SlotTable;
use crate::arena::{ArenaLayout, header, seqlock};
use crate::error::{MemError, Result};
use crate::verify::{self, Verdict};

/// How many times a read retries when the owner is changing the slot.
const READ_TRIES: usize = 8;

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

/// A read-only mapping of an arena created by a [`MemoryTier`](crate::MemoryTier)
/// in another process (or this one), found by its shared-memory name.
///
/// Reads follow the seqlock protocol of the slot table and verify every
/// block against the checksums published with it, so a block being
/// replaced, removed or corrupted is a miss (or [`Lookup::Corrupt`]),
/// never wrong bytes. The reader keeps a map from key to slot, rebuilt by
/// scanning the slot table when a key is not found where the map says.
pub struct ArenaReader {
    path: PathBuf,
    layout: ArenaLayout,
    owner_pid: u32,
    table: SlotTable,
    data: NonNull<u8>,
    slots: Mutex<HashMap<BlockHash, usize>>,
    counters: Counters,
    /// Declared after `table` and `data`, which point into it.
    _map: Mapping,
    /// Keeps the mapped file open; `is_stale` compares it with the name.
    file: File,
}

// SAFETY: `data` points into the read-only mapping owned by the reader; it
// is only read through raw copies whose results are validated (seqlock and
// checksums). Every other field is Send + Sync.
unsafe impl Send for ArenaReader {}
// SAFETY: as above.
unsafe impl Sync for ArenaReader {}

/// The outcome of one attempt at reading a slot.
enum Attempt {
    Hit,
    Corrupt(usize),
    /// The slot holds another block (or nothing): the map is stale.
    Moved,
}

impl ArenaReader {
    /// Opens the arena `/dev/shm/<shm_name>` read-only and checks its header.
    pub fn open(shm_name: &str) -> Result<Self> {
        let path = shm::shm_path(shm_name)?;
        let (file, len) = shm::open_read_only(&path)?;
        // The header is read with pread, not through the mapping: it is
        // written once by the owner, possibly while we open; its checksum
        // tells a torn or missing header from a complete one.
        let mut head = [0u8; header::ENCODED_BYTES];
        let n = file.read_at(&mut head, 0).map_err(|source| MemError::Io {
            path: path.clone(),
            op: "read header",
            source,
        })?;
        let decoded = header::decode(&head[..n], len, &path)?;
        let layout = decoded.layout;
        let map = Mapping::map(&file, layout.file_bytes, false, layout.page_bytes, false).map_err(
            |source| MemError::Io {
                path: path.clone(),
                op: "mmap",
                source,
            },
        )?;
        // SAFETY: the table lies inside the mapping (the header was checked
        // against the file length) at a page-aligned offset; the mapping lives
        // as long as the reader; the words are only loaded atomically (plain
        // atomic loads are allowed on read-only memory) and the owner writes
        // them only atomically.
        let table = unsafe {
            SlotTable::new(
                map.ptr().add(layout.table_offset),
                layout.slot_count,
                layout.layers,
            )
        };
        // SAFETY: data_offset < file_bytes = the mapping's length.
        let data = unsafe { map.ptr().add(layout.data_offset) };
        let reader = Self {
            path,
            layout,
            owner_pid: decoded.owner_pid,
            table,
            data,
            slots: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            _map: map,
            file,
        };
        reader.refresh();
        Ok(reader)
    }

    /// The shared-memory file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        self.layout.block_bytes
    }

    /// Bytes of one slot.
    pub fn slot_bytes(&self) -> usize {
        self.layout.slot_bytes
    }

    /// Number of slots.
    pub fn capacity_blocks(&self) -> usize {
        self.layout.slot_count
    }

    /// The pid of the process that created the arena.
    pub fn owner_pid(&self) -> u32 {
        self.owner_pid
    }

    /// Whether the arena's name no longer refers to the file this reader
    /// mapped: its owner is gone (the file was unlinked) or was replaced by
    /// a new arena. The mapping stays readable and what it serves stays
    /// verified (blocks are immutable: a key always names the same bytes),
    /// but it no longer changes; reopen to follow the new owner.
    pub fn is_stale(&self) -> bool {
        let Ok(ours) = self.file.metadata() else {
            return true;
        };
        std::fs::metadata(&self.path).map_or(true, |now| {
            now.dev() != ours.dev() || now.ino() != ours.ino()
        })
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
        if dst.len() != self.layout.block_bytes {
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
                    tracing::warn!(path = %self.path.display(), %key, slot = s, layer, "shared block failed verification");
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
        let src = self.slot_ptr(slot);
        let mut tries = 0u64;
        let out = seqlock::read(self.table.version(slot), READ_TRIES, || {
            tries += 1;
            let entry = self.table.snapshot(slot);
            if entry.key != key || entry.len != self.layout.block_bytes as u64 {
                return Attempt::Moved;
            }
            // SAFETY: `src` is the start of a slot of slot_bytes >= dst.len()
            // bytes inside our mapping; `dst` is private memory. The owner may
            // be writing the slot concurrently (from another process); the
            // copy is then discarded by the version check, and what is hashed
            // is `dst`, so torn bytes are never reported intact.
            let verdict = unsafe {
                verify::copy_verified(src, dst, key, self.layout.layer_bytes, &entry.sums.layers)
            };
            match verdict {
                Verdict::Intact if entry.sums.is_consistent(key) => Attempt::Hit,
                Verdict::Intact => Attempt::Corrupt(0),
                Verdict::Corrupt(layer) => Attempt::Corrupt(layer),
            }
        });
        self.counters
            .retries
            .fetch_add(tries.saturating_sub(1), Ordering::Relaxed);
        out
    }

    fn slot_ptr(&self, slot: usize) -> *const u8 {
        // SAFETY: `slot < slot_count` (it came from the table scan), so the
        // offset is inside the data area of the mapping.
        unsafe { self.data.as_ptr().add(self.layout.slot_offset(slot)) }
    }

    fn refresh_and_find(&self, key: BlockHash) -> Option<usize> {
        self.refresh();
        self.slots.lock().get(&key).copied()
    }

    /// Rebuilds the key -> slot map from the slot table.
    fn refresh(&self) {
        let mut map = HashMap::with_capacity(self.table.slots());
        for slot in 0..self.table.slots() {
            if let Some(Some(key)) =
                seqlock::read(self.table.version(slot), 2, || self.table.key_if_used(slot))
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
            .field("path", &self.path)
            .field("slots", &self.layout.slot_count)
            .field("owner_pid", &self.owner_pid)
            .finish_non_exhaustive()
    }
}
