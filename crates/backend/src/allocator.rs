//! [`ExtentAllocator`]: first-fit extent allocation inside one pool file.
//!
//! Free space is a map of disjoint, non-adjacent extents (adjacent ones are
//! merged on free), so a freed extent is reused as soon as it or a merged
//! neighbour fits. Every live extent carries an owner tag (the location id
//! of the block part it holds): a retried delete of an old URI cannot free
//! the same range after it was handed to someone else.

use std::collections::BTreeMap;

/// Why an extent could not be reserved at a given place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    /// Part of the range is outside the file or already allocated.
    #[error("extent {offset}+{len} overlaps allocated space or the end of the file")]
    Overlap {
        /// Start of the range.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// An empty extent was asked for.
    #[error("empty extent")]
    Empty,
}

/// One live extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Bytes.
    pub len: u64,
    /// Owner tag given at allocation.
    pub tag: u64,
}

/// Allocator of byte extents in `[0, capacity)`.
#[derive(Debug, Clone)]
pub struct ExtentAllocator {
    capacity: u64,
    /// Free extents: offset -> length. Disjoint and never adjacent.
    free: BTreeMap<u64, u64>,
    /// Live extents: offset -> extent.
    used: BTreeMap<u64, Extent>,
    used_bytes: u64,
}

impl ExtentAllocator {
    /// An allocator with all of `[0, capacity)` free.
    pub fn new(capacity: u64) -> Self {
        let mut free = BTreeMap::new();
        if capacity > 0 {
            free.insert(0, capacity);
        }
        ExtentAllocator {
            capacity,
            free,
            used: BTreeMap::new(),
            used_bytes: 0,
        }
    }

    /// Total bytes managed.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes in live extents.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Bytes not allocated (possibly fragmented).
    pub fn free_bytes(&self) -> u64 {
        self.capacity - self.used_bytes
    }

    /// Live extents.
    pub fn live(&self) -> usize {
        self.used.len()
    }

    /// Allocates `len` bytes at the lowest offset where they fit; `None`
    /// when no free extent is large enough (or `len` is 0).
    pub fn allocate(&mut self, len: u64, tag: u64) -> Option<u64> {
        if len == 0 {
            return None;
        }
        let (&offset, &free_len) = self.free.iter().find(|&(_, &l)| l >= len)?;
        self.free.remove(&offset);
        if free_len > len {
            self.free.insert(offset + len, free_len - len);
        }
        self.used.insert(offset, Extent { len, tag });
        self.used_bytes += len;
        Some(offset)
    }

    /// Marks `[offset, offset + len)` live with `tag` (rebuilding the map
    /// from known allocations). The range must be entirely free.
    pub fn reserve(&mut self, offset: u64, len: u64, tag: u64) -> Result<(), ReserveError> {
        if len == 0 {
            return Err(ReserveError::Empty);
        }
        let overlap = ReserveError::Overlap { offset, len };
        let end = offset.checked_add(len).ok_or(overlap)?;
        let (&free_start, &free_len) = self.free.range(..=offset).next_back().ok_or(overlap)?;
        let free_end = free_start + free_len;
        if end > free_end {
            return Err(overlap);
        }
        self.free.remove(&free_start);
        if offset > free_start {
            self.free.insert(free_start, offset - free_start);
        }
        if free_end > end {
            self.free.insert(end, free_end - end);
        }
        self.used.insert(offset, Extent { len, tag });
        self.used_bytes += len;
        Ok(())
    }

    /// The live extent starting at `offset`, if any.
    pub fn get(&self, offset: u64) -> Option<Extent> {
        self.used.get(&offset).copied()
    }

    /// Frees the live extent at `offset` if it has `len` bytes and `tag`;
    /// returns whether it did. Anything else (never allocated, already
    /// freed, reused by another owner) frees nothing.
    pub fn free(&mut self, offset: u64, len: u64, tag: u64) -> bool {
        if self.used.get(&offset) != Some(&Extent { len, tag }) {
            return false;
        }
        self.used.remove(&offset);
        self.used_bytes -= len;
        let mut start = offset;
        let mut total = len;
        // Merge with the free extent just before, if it ends here.
        if let Some((&prev, &prev_len)) = self.free.range(..offset).next_back()
            && prev + prev_len == offset
        {
            self.free.remove(&prev);
            start = prev;
            total += prev_len;
        }
        // And with the one just after, if it starts where we end.
        if let Some(next_len) = self.free.remove(&(offset + len)) {
            total += next_len;
        }
        self.free.insert(start, total);
        true
    }

    /// Live extents as `(offset, extent)`, by offset (tests, dumps).
    pub fn live_extents(&self) -> impl Iterator<Item = (u64, Extent)> + '_ {
        self.used.iter().map(|(&o, &e)| (o, e))
    }

    /// Free extents as `(offset, len)`, by offset.
    pub fn free_extents(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.free.iter().map(|(&o, &l)| (o, l))
    }
}
