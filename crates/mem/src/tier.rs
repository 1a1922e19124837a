//! [`MemoryTier`]: the owner's side of the arena.
//!
//! One process creates the tier and is the only writer of its shared
//! memory. Its private [`Book`] (behind one mutex) records which
//! slot holds what; the shared slot table mirrors every visibility change
//! so other processes ([`ArenaReader`](kvtier_arena::ArenaReader)) can find blocks.
//! Block bytes are copied outside the lock: a slot being filled belongs to
//! its filler alone, and a resident slot cannot be reused while a reference
//! (a [`BlockRef`], or a `get` in progress) holds it.
//!
//! The tier never evicts: a full arena answers full, and only its owner
//! (the node's G2 pool, or a tool's own order) removes blocks.

mod adopt;
mod block_ref;
mod book;
mod reservation;
mod stats;
mod store;

use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;

use kvtier_core::{BlockHash, BlockSums, Lookup};
use parking_lot::Mutex;

use kvtier_arena::header;
use kvtier_arena::layout::{ArenaLayout, HUGE_PAGE_BYTES, PAGE_BYTES};
use kvtier_arena::shm::Mapping;
use kvtier_arena::table::SlotTable;
use kvtier_arena::verify;
use kvtier_arena::{MemError, Result};

use crate::config::MemoryTierConfig;
use crate::mac::EntryMac;
use crate::shm::{self, OwnedShm, PendingShm};
use book::{Acquired, Book, Claim};
use stats::Counters;

pub use adopt::ArenaAdoption;
pub use block_ref::BlockRef;
pub use reservation::SlotReservation;
pub use stats::MemoryStats;

/// What [`MemoryTier::put`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PutOutcome {
    /// The block is stored and visible.
    Stored,
    /// The tier already held the block; nothing was copied.
    AlreadyPresent,
    /// No slot is free; nothing changed.
    Full,
}

/// What [`MemoryTier::reserve`] did.
#[derive(Debug)]
pub enum Reserve {
    /// A slot is reserved; fill it and [`commit`](SlotReservation::commit).
    Reserved(SlotReservation),
    /// The tier already holds the block.
    AlreadyPresent,
    /// No slot is free.
    Full,
}

/// The memory tier (G2): a fixed arena of block slots in `/dev/shm`.
///
/// Cheap to clone (all clones share one arena). The shared-memory file is
/// removed when the last clone, [`BlockRef`] and [`SlotReservation`] are
/// gone.
#[derive(Clone)]
pub struct MemoryTier {
    inner: Arc<Inner>,
}

/// The state every handle shares.
pub(crate) struct Inner {
    /// The shared-memory name (`/dev/shm/<name>`).
    name: String,
    layout: ArenaLayout,
    /// The shared slot table (inside `map`).
    table: SlotTable,
    /// Start of the slot data area (inside `map`).
    data: NonNull<u8>,
    /// The private bookkeeping. One lock: every operation on it is O(1),
    /// and no copy happens while holding it.
    book: Mutex<Book>,
    counters: Counters,
    /// Computes the MAC of each entry published (`None`: no table key, the
    /// MAC words stay 0).
    mac: Option<EntryMac>,
    /// What adopting a crashed owner's arena kept, if this tier did.
    adoption: Option<ArenaAdoption>,
    /// Declared after `table` and `data`, which point into it.
    _map: Mapping,
    /// Unlinks the file on drop; declared last so it goes after the mapping.
    shm: OwnedShm,
}

// SAFETY: `data` points into `map`, which lives as long as `Inner`. Slot
// bytes are only written by the holder of a `Filling` slot (exactly one
// `SlotReservation`) and only read while a reference or the fill keeps the
// slot from being reused; the `Book` behind the mutex enforces both.
unsafe impl Send for Inner {}
// SAFETY: as above; every other field is Sync.
unsafe impl Sync for Inner {}

impl Inner {
    /// Start of slot `slot`'s bytes.
    pub(crate) fn slot_ptr(&self, slot: usize) -> *mut u8 {
        debug_assert!(slot < self.layout.slot_count);
        // SAFETY: `slot < slot_count`, so the offset lies inside the data
        // area of the mapping.
        unsafe { self.data.as_ptr().add(self.layout.slot_offset(slot)) }
    }

    /// Bytes of one block.
    pub(crate) fn block_bytes(&self) -> usize {
        self.layout.block_bytes
    }

    /// Bytes of one layer.
    pub(crate) fn layer_bytes(&self) -> usize {
        self.layout.layer_bytes
    }

    /// Drops a reference taken by `Book::acquire`/`add_ref`.
    pub(crate) fn release(&self, slot: usize) {
        self.book.lock().release(slot);
    }

    /// Takes one more reference on an already referenced slot.
    pub(crate) fn add_ref(&self, slot: usize) {
        self.book.lock().add_ref(slot);
    }

    /// Claims a slot for `key` and marks it as being written in the shared
    /// table.
    fn claim(self: &Arc<Self>, key: BlockHash) -> Reserve {
        let mut book = self.book.lock();
        self.claim_locked(&mut book, key)
    }

    /// [`claim`](Self::claim) of each of `keys`, under one lock.
    fn claim_many(self: &Arc<Self>, keys: impl IntoIterator<Item = BlockHash>) -> Vec<Reserve> {
        let mut book = self.book.lock();
        keys.into_iter()
            .map(|key| self.claim_locked(&mut book, key))
            .collect()
    }

    fn claim_locked(self: &Arc<Self>, book: &mut Book, key: BlockHash) -> Reserve {
        match book.claim(key) {
            Claim::Slot(slot) => {
                self.table.begin_fill(slot);
                Reserve::Reserved(SlotReservation::new(Arc::clone(self), slot, key))
            }
            Claim::AlreadyPresent => Reserve::AlreadyPresent,
            Claim::Full => Reserve::Full,
        }
    }

    /// Publishes a filled slot (no verification). Returns what happened.
    pub(crate) fn publish(&self, slot: usize, key: BlockHash, sums: Arc<BlockSums>) -> PutOutcome {
        let mac = self.mac_of(slot, key, &sums);
        let outcome = self.publish_locked(&mut self.book.lock(), slot, key, sums, mac);
        if outcome == PutOutcome::Stored {
            self.count_puts(1);
        }
        outcome
    }

    /// Counts `n` blocks published: one add per counter for a batch, as
    /// the counters are shared by every thread that publishes.
    pub(crate) fn count_puts(&self, n: u64) {
        Counters::add(&self.counters.puts, n);
        Counters::add(&self.counters.bytes_in, n * self.layout.block_bytes as u64);
    }

    /// The slot table's MAC of a block published in `slot` (zero without
    /// a table key). Computed before taking the lock: it depends on
    /// nothing the lock guards.
    pub(crate) fn mac_of(&self, slot: usize, key: BlockHash, sums: &BlockSums) -> [u64; 2] {
        let len = self.layout.block_bytes as u64;
        self.mac
            .as_ref()
            .map_or([0, 0], |m| m.compute(slot, key, len, sums))
    }

    /// [`publish`](Self::publish) with the book locked and the MAC given;
    /// the caller counts what it stored ([`count_puts`](Self::count_puts)).
    pub(crate) fn publish_locked(
        &self,
        book: &mut Book,
        slot: usize,
        key: BlockHash,
        sums: Arc<BlockSums>,
        mac: [u64; 2],
    ) -> PutOutcome {
        let len = self.layout.block_bytes;
        if book.publish(slot, key, Arc::clone(&sums)) {
            self.table.publish(slot, key, len, &sums, mac);
            PutOutcome::Stored
        } else {
            self.table.abandon_fill(slot);
            PutOutcome::AlreadyPresent
        }
    }

    /// Gives back a slot claimed but never published.
    pub(crate) fn abandon(&self, slot: usize) {
        let mut book = self.book.lock();
        book.abandon(slot);
        self.table.abandon_fill(slot);
    }

    /// Counts a block that failed verification on commit.
    pub(crate) fn count_corrupt(&self) {
        Counters::add(&self.counters.corrupt, 1);
    }

    /// Checks that `sums` can describe a block of this tier as `key`.
    pub(crate) fn check_sums(&self, key: BlockHash, sums: &BlockSums) -> Result<()> {
        if sums.layers.len() != self.layout.layers {
            return Err(MemError::BadSums {
                key,
                reason: format!(
                    "{} layer checksums for a block of {} layers",
                    sums.layers.len(),
                    self.layout.layers
                ),
            });
        }
        if !sums.is_consistent(key) {
            return Err(MemError::BadSums {
                key,
                reason: "the layer checksums do not combine to the block checksum".into(),
            });
        }
        Ok(())
    }

    fn block_ref(self: &Arc<Self>, a: Acquired) -> BlockRef {
        BlockRef::new(Arc::clone(self), a.slot, a.key, a.sums)
    }
}

impl MemoryTier {
    /// Creates the arena `/dev/shm/<cfg.shm_name>` and maps it.
    ///
    /// The arena is built unnamed and only then linked under its name, so
    /// the name never shows a half-made arena. A file of that name whose
    /// owner is gone (its lock is free) is replaced, whether it is a whole
    /// arena or what a creator killed before writing the header left; one
    /// owned by a live process ([`MemError::InUse`]) or holding foreign
    /// content ([`MemError::NotAnArena`]) is left alone. The whole arena is reserved
    /// up front, so a `/dev/shm` too small fails here
    /// ([`MemError::ShmFull`]) rather than with a `SIGBUS` later.
    ///
    /// With a [`table_key`](MemoryTierConfig::table_key), an arena of
    /// exactly this layout whose owner is gone (a crash) is adopted
    /// instead of replaced: the blocks it published under that key whose
    /// bytes still verify stay resident, everything else is emptied
    /// ([`adoption`](Self::adoption) says what; docs/memory-arena.md,
    /// "Adoption after a crash").
    pub fn create(cfg: MemoryTierConfig) -> Result<Self> {
        let path = kvtier_arena::shm::shm_path(&cfg.shm_name)?;
        let page = page_bytes(cfg.hugepages);
        let layout =
            ArenaLayout::compute(cfg.block_bytes, cfg.layer_bytes, cfg.capacity_bytes, page)?;
        let mac = cfg.table_key.as_ref().map(|k| EntryMac::new(k, &layout));
        // Only an owner with a key can tell its own entries from forged
        // ones, so only it adopts; without one the old arena is replaced.
        let adoptable = match &mac {
            Some(_) => OwnedShm::adopt(&path, &layout, cfg.access_group)?,
            None => None,
        };
        let adopting = adoptable.is_some();
        let (shm, map) = match adoptable {
            Some(shm) => {
                let map = map_arena(shm.file(), &layout, &path)?;
                (shm, map)
            }
            None => create_arena(&path, &layout, cfg.access_group)?,
        };
        // SAFETY: the table lies inside the mapping at an offset that is a
        // multiple of 4096 (so 8-aligned), spans slot_count entries by
        // construction of the layout, lives as long as `Inner` (which owns the
        // mapping), and is only ever accessed atomically.
        let table = unsafe {
            SlotTable::new(
                map.ptr().add(layout.table_offset),
                layout.slot_count,
                layout.layers,
            )
        };
        // SAFETY: data_offset < file_bytes = the mapping's length.
        let data = unsafe { map.ptr().add(layout.data_offset) };
        let (book, adoption) = match &mac {
            Some(mac) if adopting => {
                // SAFETY: `data` is the slot data area of the live mapping
                // of `layout`, and `table` its table.
                let kept = unsafe { adopt::adopt_slots(&table, data, &layout, mac) };
                let book = Book::adopting(layout.slot_count, kept.resident, &kept.unfinished);
                (book, Some(kept.report))
            }
            _ => (Book::new(layout.slot_count), None),
        };
        log_opened(&path, &layout, adoption.as_ref());
        Ok(Self {
            inner: Arc::new(Inner {
                name: cfg.shm_name,
                layout,
                table,
                data,
                book: Mutex::new(book),
                counters: Counters::default(),
                mac,
                adoption,
                _map: map,
                shm,
            }),
        })
    }

    /// What adopting a crashed owner's arena kept and dropped, when this
    /// tier adopted one (it had a table key and found an arena of its
    /// layout whose owner was gone); `None` for a fresh arena.
    pub fn adoption(&self) -> Option<ArenaAdoption> {
        self.inner.adoption
    }

    /// The shared-memory file other processes open.
    pub fn shm_path(&self) -> &Path {
        self.inner.shm.path()
    }

    /// Removes the arena's name from /dev/shm now instead of when the last
    /// clone of the tier drops: for a clean shutdown that left nothing in
    /// memory only, so the file (as large as the arena) does not outlive
    /// the daemon even when something still holds a clone at exit.
    /// Processes that mapped the arena keep their mapping; none can open it
    /// by name any more.
    pub fn unlink_name(&self) {
        self.inner.shm.unlink();
    }

    /// The shared-memory name other processes pass to
    /// [`ArenaReader::open`](kvtier_arena::ArenaReader::open).
    pub fn shm_name(&self) -> &str {
        &self.inner.name
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        self.inner.layout.block_bytes
    }

    /// Bytes of one slot (block bytes rounded up to the page size).
    pub fn slot_bytes(&self) -> usize {
        self.inner.layout.slot_bytes
    }

    /// The page size the arena was laid out for: 2 MiB when it was created
    /// for huge pages (`hugepages` set and available), else 4 KiB.
    pub fn page_bytes(&self) -> usize {
        self.inner.layout.page_bytes
    }

    /// Bytes of the shared-memory file: header, slot table and slots (what
    /// a daemon announces to clients as the arena's length).
    pub fn file_bytes(&self) -> u64 {
        self.inner.layout.file_bytes as u64
    }

    /// Where slot `slot`'s data starts in the shared-memory file: the
    /// offset a daemon hands to clients, which map the file and turn it
    /// back into the slot with [`ArenaClient::slot_at`](kvtier_arena::ArenaClient::slot_at).
    /// Slot indices come from [`SlotReservation::slot`] and
    /// [`BlockRef::slot`]; an index past the last slot gives an offset past
    /// the end of the file, which `slot_at` refuses.
    pub fn slot_offset(&self, slot: usize) -> u64 {
        self.inner.layout.file_offset(slot)
    }

    /// Number of slots.
    pub fn capacity_blocks(&self) -> usize {
        self.inner.layout.slot_count
    }

    /// Number of resident (visible) blocks.
    pub fn len(&self) -> usize {
        self.inner.book.lock().len()
    }

    /// Whether no block is resident.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots that hold nothing (neither resident, nor being filled, nor
    /// removed-but-still-referenced).
    pub fn free_blocks(&self) -> usize {
        self.inner.book.lock().free_len()
    }

    /// Copies `data` (exactly `block_bytes` long) into a free slot with its
    /// checksums `sums` and makes it visible.
    ///
    /// When no slot is free, returns [`PutOutcome::Full`] and changes
    /// nothing (the tier never evicts). `data` is not hashed here:
    /// `sums` must be its checksums (every read verifies against them).
    pub fn put(&self, key: BlockHash, data: &[u8], sums: &BlockSums) -> Result<PutOutcome> {
        if data.len() != self.block_bytes() {
            return Err(MemError::WrongLength {
                expected: self.block_bytes(),
                got: data.len(),
            });
        }
        self.inner.check_sums(key, sums)?;
        match self.inner.claim(key) {
            Reserve::Reserved(mut slot) => {
                slot.as_mut_slice().copy_from_slice(data);
                Ok(slot.publish_unverified(sums))
            }
            Reserve::AlreadyPresent => Ok(PutOutcome::AlreadyPresent),
            Reserve::Full => Ok(PutOutcome::Full),
        }
    }

    /// Reserves a slot for `key`, to be filled in place (by direct I/O from
    /// the disk tier, typically) and then [`commit`](SlotReservation::commit)ted.
    /// The block is invisible until committed; dropping the reservation
    /// frees the slot. A full tier answers [`Reserve::Full`].
    pub fn reserve(&self, key: BlockHash) -> Result<Reserve> {
        Ok(self.inner.claim(key))
    }

    /// [`reserve`](Self::reserve) of each of `keys`, in order, under one
    /// lock (a batch of a client's `Reserve`).
    pub fn reserve_many(&self, keys: impl IntoIterator<Item = BlockHash>) -> Vec<Reserve> {
        self.inner.claim_many(keys)
    }

    /// Copies block `key` into `dst` (exactly `block_bytes` long), verifying
    /// every layer against the block's checksums as it copies.
    ///
    /// Returns [`Lookup::Hit`] when `dst` holds the verified block,
    /// [`Lookup::Miss`] when the tier does not hold it (or `dst` has the
    /// wrong length), and [`Lookup::Corrupt`] when the stored bytes failed
    /// verification: the block was then removed and counted, and `dst`
    /// holds garbage.
    pub fn get(&self, key: BlockHash, dst: &mut [u8]) -> Lookup {
        if dst.len() != self.block_bytes() {
            tracing::warn!(
                got = dst.len(),
                expected = self.block_bytes(),
                "get into a buffer of the wrong length"
            );
            Counters::add(&self.inner.counters.misses, 1);
            return Lookup::Miss;
        }
        let Some(r) = self.acquire(key) else {
            Counters::add(&self.inner.counters.misses, 1);
            return Lookup::Miss;
        };
        // SAFETY: the reference keeps the slot from being reused or written
        // while we copy; the slot holds block_bytes bytes and does not
        // overlap `dst`, which is private memory.
        let verdict = unsafe {
            verify::copy_verified(
                self.inner.slot_ptr(r.slot()),
                dst,
                key,
                self.inner.layer_bytes(),
                &r.shared_sums().layers,
            )
        };
        if let verify::Verdict::Corrupt(layer) = verdict {
            self.drop_corrupt(&r, layer);
            return Lookup::Corrupt;
        }
        Counters::add(&self.inner.counters.hits, 1);
        Counters::add(&self.inner.counters.bytes_out, dst.len() as u64);
        Lookup::Hit
    }

    /// Zero-copy access to block `key`: a reference that keeps its slot
    /// intact (never reused, even if the block is removed
    /// meanwhile) until dropped. The bytes are not verified here; call
    /// [`BlockRef::verify`] before serving them to another party.
    pub fn get_ref(&self, key: BlockHash) -> Option<BlockRef> {
        let r = self.acquire(key);
        let counter = match r {
            Some(_) => &self.inner.counters.hits,
            None => &self.inner.counters.misses,
        };
        Counters::add(counter, 1);
        r
    }

    /// [`get_ref`](Self::get_ref) of each of `keys`, in order, under one
    /// lock: the references up to the first key not resident.
    pub fn get_refs_prefix(&self, keys: impl IntoIterator<Item = BlockHash>) -> Vec<BlockRef> {
        let mut book = self.inner.book.lock();
        let refs: Vec<BlockRef> = keys
            .into_iter()
            .map_while(|k| book.acquire(k))
            .map(|a| self.inner.block_ref(a))
            .collect();
        drop(book);
        Counters::add(&self.inner.counters.hits, refs.len() as u64);
        refs
    }

    fn acquire(&self, key: BlockHash) -> Option<BlockRef> {
        let a = self.inner.book.lock().acquire(key)?;
        Some(self.inner.block_ref(a))
    }

    fn drop_corrupt(&self, r: &BlockRef, layer: usize) {
        let removed = {
            let mut book = self.inner.book.lock();
            let removed = book.remove_if_in(r.key(), r.slot());
            if removed {
                self.inner.table.clear(r.slot());
            }
            removed
        };
        self.inner.count_corrupt();
        tracing::warn!(key = %r.key(), slot = r.slot(), layer, removed, "memory tier block failed verification; dropped");
    }

    /// The slot of each of `keys` that is resident, in order (one lock for
    /// all; no reference taken).
    pub fn slots_of(&self, keys: &[BlockHash]) -> Vec<Option<usize>> {
        let book = self.inner.book.lock();
        keys.iter().map(|k| book.slot_of(*k)).collect()
    }

    /// Removes each of `keys` as [`remove`](Self::remove) does, under one
    /// lock; how many were resident.
    pub fn remove_many(&self, keys: &[BlockHash]) -> usize {
        let mut book = self.inner.book.lock();
        let mut removed = 0;
        for key in keys {
            if let Some(slot) = book.remove(*key) {
                self.inner.table.clear(slot);
                removed += 1;
            }
        }
        removed
    }

    /// Whether block `key` is resident.
    pub fn contains(&self, key: BlockHash) -> bool {
        self.inner.book.lock().contains(key)
    }

    /// Resident keys, in no particular order.
    pub fn keys(&self) -> Vec<BlockHash> {
        self.inner.book.lock().keys()
    }

    /// Removes block `key`. Its slot is reused only after
    /// every [`BlockRef`] to it is dropped. Returns whether it was resident.
    pub fn remove(&self, key: BlockHash) -> bool {
        self.remove_many(&[key]) > 0
    }

    /// The slot data area: start and length, e.g. to register it with
    /// io_uring as a fixed buffer. Slot `i` starts at `i * slot_bytes`.
    /// Write only into slots you hold a [`SlotReservation`] for.
    pub fn arena(&self) -> (*mut u8, usize) {
        (self.inner.data.as_ptr(), self.inner.layout.data_bytes())
    }

    /// Counters and occupancy.
    pub fn stats(&self) -> MemoryStats {
        let mut s = self.inner.counters.snapshot();
        let book = self.inner.book.lock();
        s.len = book.len() as u64;
        s.capacity = self.inner.layout.slot_count as u64;
        s
    }
}

/// The page size to lay the arena out for: huge pages when asked for and
/// the kernel gives them to shared memory, else 4 KiB (with a log line).
fn page_bytes(hugepages: bool) -> usize {
    if !hugepages {
        return PAGE_BYTES;
    }
    match shm::hugepages_unavailable() {
        None => HUGE_PAGE_BYTES,
        Some(why) => {
            tracing::info!(reason = %why, "huge pages unavailable for the memory tier; using 4 KiB pages");
            PAGE_BYTES
        }
    }
}

/// Maps the whole arena file read-write, populated, advised for huge pages
/// when laid out for them.
fn map_arena(file: &std::fs::File, layout: &ArenaLayout, path: &Path) -> Result<Mapping> {
    let map =
        Mapping::map(file, layout.file_bytes, true, layout.page_bytes, true).map_err(|source| {
            MemError::Io {
                path: path.to_owned(),
                op: "mmap",
                source,
            }
        })?;
    if layout.page_bytes == HUGE_PAGE_BYTES
        && let Err(e) = map.advise_hugepages(0, map.len())
    {
        tracing::info!(error = %e, "madvise(MADV_HUGEPAGE) refused; the arena may use 4 KiB pages");
    }
    Ok(map)
}

/// Makes a fresh arena of `layout` and gives it the name `path`: built
/// unnamed, header written, then linked (replacing a stale file there).
fn create_arena(
    path: &Path,
    layout: &ArenaLayout,
    access_group: Option<u32>,
) -> Result<(OwnedShm, Mapping)> {
    let pending = PendingShm::create(path, layout.file_bytes as u64, access_group)?;
    let map = map_arena(pending.file(), layout, path)?;
    let encoded = header::encode(layout, std::process::id());
    // SAFETY: the mapping is ours, writable and at least HEADER_BYTES long;
    // the file has no name yet, so nothing else can see it.
    unsafe {
        std::ptr::copy_nonoverlapping(encoded.as_ptr(), map.ptr().as_ptr(), encoded.len());
    }
    // Only a complete arena gets the name readers and later owners look
    // for (invariant 12 of docs/memory-arena.md).
    let shm = pending.publish()?;
    Ok((shm, map))
}

fn log_opened(path: &Path, layout: &ArenaLayout, adoption: Option<&ArenaAdoption>) {
    let (path, bytes, slots) = (path.display(), layout.file_bytes, layout.slot_count);
    let (slot_bytes, page_bytes) = (layout.slot_bytes, layout.page_bytes);
    match adoption {
        None => tracing::info!(
            path = %path, bytes, slots, slot_bytes, page_bytes,
            "memory tier created"
        ),
        Some(a) => tracing::info!(
            path = %path, bytes, slots, slot_bytes, page_bytes,
            kept = a.kept,
            unfinished = a.unfinished,
            unauthentic = a.unauthentic,
            corrupt = a.corrupt,
            duplicates = a.duplicates,
            "memory tier adopted the arena its crashed owner left"
        ),
    }
}

impl std::fmt::Debug for MemoryTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryTier")
            .field("path", &self.shm_path())
            .field("slots", &self.capacity_blocks())
            .field("slot_bytes", &self.slot_bytes())
            .finish_non_exhaustive()
    }
}
