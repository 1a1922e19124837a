//! [`MemoryStats`]: the tier's counters.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of the memory tier's counters and occupancy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// `get`/`get_ref` calls that found a verified block.
    pub hits: u64,
    /// `get`/`get_ref` calls that found nothing.
    pub misses: u64,
    /// Blocks that failed verification (on `get`, or on a reservation's
    /// commit) and were dropped.
    pub corrupt: u64,
    /// Blocks stored (by `put` or a committed reservation).
    pub puts: u64,
    /// Bytes stored.
    pub bytes_in: u64,
    /// Bytes copied out by `get`.
    pub bytes_out: u64,
    /// Resident blocks.
    pub len: u64,
    /// Slots in the arena.
    pub capacity: u64,
}

/// The tier's event counters (relaxed atomics: they are statistics, not
/// synchronisation).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub corrupt: AtomicU64,
    pub puts: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
}

impl Counters {
    /// Adds `n` to `counter`.
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The event counters, with the occupancy fields left zero.
    pub(crate) fn snapshot(&self) -> MemoryStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MemoryStats {
            hits: get(&self.hits),
            misses: get(&self.misses),
            corrupt: get(&self.corrupt),
            puts: get(&self.puts),
            bytes_in: get(&self.bytes_in),
            bytes_out: get(&self.bytes_out),
            ..MemoryStats::default()
        }
    }
}
