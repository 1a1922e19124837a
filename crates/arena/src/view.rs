//! [`ArenaView`]: a mapping of an arena that another process owns, as both
//! [`ArenaReader`](crate::ArenaReader) and [`ArenaClient`](crate::ArenaClient)
//! open it: the header checks, the mapping, and the seqlock-protected,
//! verified copy out of one slot.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::ptr::NonNull;

use kvtier_core::BlockHash;

use crate::error::{MemError, Result};
use crate::layout::ArenaLayout;
use crate::shm::{self, Mapping};
use crate::table::SlotTable;
use crate::verify::{self, Verdict};
use crate::{header, seqlock};

/// How many times a read retries when the owner is changing the slot.
const READ_TRIES: usize = 8;

/// What a view may do with the mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Everything read-only (`ArenaReader`).
    ReadOnly,
    /// The slot data area read-write, the header and slot table read-only
    /// (`ArenaClient`, which fills slots the owner reserved for it).
    SlotsWritable,
}

/// Which bytes of a block a read copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    /// The whole block.
    Block,
    /// One layer.
    Layer(usize),
}

/// The outcome of one seqlock-protected read of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The destination holds the verified bytes.
    Hit,
    /// The slot was stable and layer `0` failed verification.
    Corrupt(usize),
    /// The slot holds another block, or nothing.
    Moved,
}

/// A mapping of an arena owned elsewhere (see the module docs).
pub(crate) struct ArenaView {
    path: PathBuf,
    layout: ArenaLayout,
    owner_pid: u32,
    table: SlotTable,
    data: NonNull<u8>,
    /// Declared after `table` and `data`, which point into it.
    _map: Mapping,
    /// Keeps the mapped file open; `is_stale` compares it with the name.
    file: File,
}

// SAFETY: `data` points into the mapping the view owns. Through the view,
// slot bytes are only read by raw copies whose results are validated
// (seqlock and checksums), and written only by `ArenaClient::fill*`, whose
// callers promise exclusive use of the slot. Every other field is Send + Sync.
unsafe impl Send for ArenaView {}
// SAFETY: as above.
unsafe impl Sync for ArenaView {}

impl ArenaView {
    /// Opens `/dev/shm/<shm_name>`, checks its header and maps it.
    pub(crate) fn open(shm_name: &str, access: Access) -> Result<Self> {
        let path = shm::shm_path(shm_name)?;
        let writable = access == Access::SlotsWritable;
        let (file, len) = shm::open_existing(&path, writable)?;
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
        let io = |op| {
            let path = path.clone();
            move |source| MemError::Io { path, op, source }
        };
        let map = Mapping::map(&file, layout.file_bytes, writable, layout.page_bytes, false)
            .map_err(io("mmap"))?;
        if writable {
            // Only the owner writes the header and the slot table: a stray
            // write of ours there faults here instead of misleading readers.
            map.protect_prefix(layout.data_offset)
                .map_err(io("mprotect"))?;
        }
        // SAFETY: the table lies inside the mapping (the header was checked
        // against the file length) at a page-aligned offset; the mapping lives
        // as long as the view; the words are only loaded atomically (plain
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
        Ok(Self {
            path,
            layout,
            owner_pid: decoded.owner_pid,
            table,
            data,
            _map: map,
            file,
        })
    }

    /// The shared-memory file.
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The arena's layout, from its header.
    pub(crate) fn layout(&self) -> &ArenaLayout {
        &self.layout
    }

    /// The pid of the process that created the arena.
    pub(crate) fn owner_pid(&self) -> u32 {
        self.owner_pid
    }

    /// The shared slot table.
    pub(crate) fn table(&self) -> &SlotTable {
        &self.table
    }

    /// Whether the name no longer refers to the file this view mapped.
    pub(crate) fn is_stale(&self) -> bool {
        let Ok(ours) = self.file.metadata() else {
            return true;
        };
        std::fs::metadata(&self.path).map_or(true, |now| {
            now.dev() != ours.dev() || now.ino() != ours.ino()
        })
    }

    /// Start of slot `slot`'s bytes (`block_bytes` of them).
    pub(crate) fn slot_ptr(&self, slot: usize) -> Result<*mut u8> {
        if slot >= self.layout.slot_count {
            return Err(MemError::NoSuchSlot {
                slot,
                slots: self.layout.slot_count,
            });
        }
        // SAFETY: `slot < slot_count`, so the offset lies inside the data
        // area of the mapping.
        Ok(unsafe { self.data.as_ptr().add(self.layout.slot_offset(slot)) })
    }

    /// The bytes of a block that `part` covers, checked against a buffer
    /// of `len` bytes meant to hold them.
    pub(crate) fn range(&self, part: Part, len: usize) -> Result<Range<usize>> {
        let l = &self.layout;
        let range = match part {
            Part::Block => 0..l.block_bytes,
            Part::Layer(layer) => l.layer_range(layer).ok_or(MemError::NoSuchLayer {
                layer,
                layers: l.layers,
            })?,
        };
        match part {
            _ if range.len() == len => Ok(range),
            Part::Block => Err(MemError::WrongLength {
                expected: range.len(),
                got: len,
            }),
            Part::Layer(layer) => Err(MemError::WrongLayerLength {
                layer,
                expected: range.len(),
                got: len,
            }),
        }
    }

    /// Copies `part` of block `key` out of `slot` into `dst` under the
    /// slot's seqlock, verifying what was copied against the sums published
    /// in the slot table. `Ok(None)` when every try met the owner writing;
    /// `tries` counts the copies made. Errors are caller mistakes (a slot,
    /// layer or buffer length that does not exist in this arena).
    pub(crate) fn read(
        &self,
        slot: usize,
        key: BlockHash,
        part: Part,
        dst: &mut [u8],
        tries: &mut u64,
    ) -> Result<Option<Attempt>> {
        let range = self.range(part, dst.len())?;
        // SAFETY: `range` lies inside the block, so inside the slot.
        let src = unsafe { self.slot_ptr(slot)?.add(range.start) };
        Ok(seqlock::read(self.table.version(slot), READ_TRIES, || {
            *tries += 1;
            let entry = self.table.snapshot(slot);
            if entry.key != key || entry.len != self.layout.block_bytes as u64 {
                return Attempt::Moved;
            }
            // SAFETY: `src` is valid for `dst.len()` bytes of our mapping (the
            // range checked above); `dst` is private memory. The owner or
            // another client may write the slot concurrently (from another
            // process); the copy is then discarded by the version check or
            // fails verification, because what is hashed is `dst`.
            let verdict = unsafe { self.copy_verified(src, dst, key, part, &entry.sums.layers) };
            match verdict {
                Verdict::Intact if entry.sums.is_consistent(key) => Attempt::Hit,
                Verdict::Intact => Attempt::Corrupt(0),
                Verdict::Corrupt(layer) => Attempt::Corrupt(layer),
            }
        }))
    }

    /// # Safety
    /// `src` valid for reads of `dst.len()` bytes, not overlapping `dst`.
    unsafe fn copy_verified(
        &self,
        src: *const u8,
        dst: &mut [u8],
        key: BlockHash,
        part: Part,
        layer_sums: &[u64],
    ) -> Verdict {
        match part {
            // SAFETY: the caller's contract.
            Part::Block => unsafe {
                verify::copy_verified(src, dst, key, self.layout.layer_bytes, layer_sums)
            },
            Part::Layer(layer) => {
                // SAFETY: the caller's contract.
                let got = unsafe { kvtier_core::copy_layer_checksum(src, dst, key, layer as u32) };
                match layer_sums.get(layer) {
                    Some(&want) if want == got => Verdict::Intact,
                    _ => Verdict::Corrupt(layer),
                }
            }
        }
    }
}

impl std::fmt::Debug for ArenaView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArenaView")
            .field("path", &self.path)
            .field("slots", &self.layout.slot_count)
            .field("owner_pid", &self.owner_pid)
            .finish_non_exhaustive()
    }
}
