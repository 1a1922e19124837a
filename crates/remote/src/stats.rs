//! [`RemoteStats`]: the tier's counters, and the atomics behind them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A snapshot of the tier's counters (monotonic since the tier was built).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// Blocks acknowledged by `put_batch`.
    pub puts: u64,
    /// Bytes of block data acknowledged by `put_batch` (headers excluded).
    pub bytes_written: u64,
    /// Reads (whole blocks or layer ranges) that returned verified bytes.
    pub gets: u64,
    /// Bytes of verified block data returned (headers excluded).
    pub bytes_read: u64,
    /// Reads of absent blocks.
    pub misses: u64,
    /// Reads whose object failed verification (the object was dropped), and
    /// puts refused because the data did not match its checksums.
    pub corrupt: u64,
    /// Calls that failed: the store was unavailable or refused, or the
    /// request was invalid (wrong length, bad layer range).
    pub errors: u64,
    /// Blocks removed by `remove_batch` (absent ones included).
    pub removes: u64,
}

/// The live counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub puts: AtomicU64,
    pub bytes_written: AtomicU64,
    pub gets: AtomicU64,
    pub bytes_read: AtomicU64,
    pub misses: AtomicU64,
    pub corrupt: AtomicU64,
    pub errors: AtomicU64,
    pub removes: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> RemoteStats {
        RemoteStats {
            puts: self.puts.load(Relaxed),
            bytes_written: self.bytes_written.load(Relaxed),
            gets: self.gets.load(Relaxed),
            bytes_read: self.bytes_read.load(Relaxed),
            misses: self.misses.load(Relaxed),
            corrupt: self.corrupt.load(Relaxed),
            errors: self.errors.load(Relaxed),
            removes: self.removes.load(Relaxed),
        }
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }
}
