//! Per-region state in memory: its [`Latch`], generation, last read tick and
//! the bookkeeping of its current life ([`Fill`]).

use std::sync::atomic::{AtomicU64, Ordering};

use kvtier_core::BlockHash;
use parking_lot::Mutex;

use crate::latch::{Latch, state};

/// One region of a directory's data file.
#[derive(Debug)]
pub(crate) struct Region {
    /// Reader count and state (see [`crate::latch`]).
    pub latch: Latch,
    /// Generation of the current life (0: never written).
    pub generation: AtomicU64,
    /// Tick of the last verified read (LRU reclaim order).
    pub last_read: AtomicU64,
    /// The current life's slots.
    pub fill: Mutex<Fill>,
}

/// Bookkeeping of a region's current life.
#[derive(Debug, Default)]
pub(crate) struct Fill {
    /// The key written (or being written) in each reserved slot, by slot
    /// index; its length is the number of reserved slots. Reclaim walks it
    /// to drop the region's index entries. 16 bytes per slot.
    pub keys: Vec<BlockHash>,
    /// First slot of every extent whose write has not been processed yet.
    pub inflight: Vec<u32>,
    /// No more slots will be reserved in this life.
    pub sealed: bool,
    /// Outcome of the write that carried this life's region header: `None`
    /// while pending. Extents after it are acknowledged only if it is `true`.
    pub header_ok: Option<bool>,
}

impl Fill {
    /// Slots below which every write has been processed (entered in the
    /// index if it succeeded): the checkpoint's `fill`.
    pub fn done_prefix(&self) -> u32 {
        self.inflight
            .iter()
            .copied()
            .min()
            .unwrap_or(self.keys.len() as u32)
    }
}

impl Region {
    /// A free region.
    pub fn new() -> Self {
        Region {
            latch: Latch::new(state::FREE),
            generation: AtomicU64::new(0),
            last_read: AtomicU64::new(0),
            fill: Mutex::new(Fill::default()),
        }
    }

    /// The generation of the current life.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Bytes of RAM held by the region's key list.
    pub fn memory_bytes(&self) -> usize {
        self.fill.lock().keys.capacity() * std::mem::size_of::<BlockHash>()
            + std::mem::size_of::<Self>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn done_prefix_is_the_lowest_inflight_start() {
        let mut f = Fill {
            keys: vec![BlockHash(1); 10],
            ..Fill::default()
        };
        assert_eq!(f.done_prefix(), 10);
        f.inflight = vec![6, 3];
        assert_eq!(f.done_prefix(), 3);
    }
}
