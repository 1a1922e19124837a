//! Per-region state in memory: its [`Latch`], generation, last read tick and
//! the bookkeeping of its current life ([`Fill`]).

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use kvtier_core::BlockHash;
use parking_lot::Mutex;

use crate::format::LifeFormat;
use crate::latch::{Latch, state};

/// One region of a directory's data file.
#[derive(Debug)]
pub(crate) struct Region {
    /// Reader count and state (see [`crate::latch`]).
    pub latch: Latch,
    /// Generation of the current life (0: never written).
    pub generation: AtomicU64,
    /// Header version and layout of the current life
    /// ([`LifeFormat::pack`]): set before the life's first reservation (at
    /// open, before `OPEN`; at recovery, from its region header) and left
    /// alone until the region is reclaimed (I13). Readers read it while
    /// counted in, so they see the life their entry points into.
    format: AtomicU8,
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
            format: AtomicU8::new(LifeFormat::V1.pack()),
            last_read: AtomicU64::new(0),
            fill: Mutex::new(Fill::default()),
        }
    }

    /// The generation of the current life.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The current life's header version and layout.
    pub fn format(&self) -> LifeFormat {
        LifeFormat::unpack(self.format.load(Ordering::Acquire))
    }

    /// Sets the life's format; only while no reader can be counted in
    /// (the region is not `OPEN` or `SEALED` yet).
    pub fn set_format(&self, f: LifeFormat) {
        self.format.store(f.pack(), Ordering::Release);
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
