//! Store counters.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters kept by the [`Store`](crate::Store) itself (the tiers keep their own).
#[derive(Debug, Default)]
pub struct StoreCounters {
    /// Blocks put.
    pub puts: AtomicU64,
    /// Bytes put.
    pub put_bytes: AtomicU64,
    /// Gets served from DRAM.
    pub hits_memory: AtomicU64,
    /// Gets served from disk.
    pub hits_disk: AtomicU64,
    /// Gets that found the block nowhere (including verification failures).
    pub misses: AtomicU64,
    /// Blocks that failed verification in DRAM.
    pub corrupt_memory: AtomicU64,
    /// Blocks that failed verification (or could not be read) on disk.
    pub corrupt_disk: AtomicU64,
    /// Bytes returned by gets.
    pub get_bytes: AtomicU64,
    /// Blocks copied from disk into DRAM on a get.
    pub promotions: AtomicU64,
    /// Blocks written behind from DRAM to disk.
    pub demotions: AtomicU64,
    /// Write-behind failures (the block stayed in DRAM).
    pub demotion_errors: AtomicU64,
    /// Write-behind batches.
    pub demotion_batches: AtomicU64,
}

impl StoreCounters {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }
}

/// A snapshot of every counter of the store and its tiers.
#[derive(Debug, Clone)]
pub struct StoreStats {
    /// Blocks put.
    pub puts: u64,
    /// Bytes put.
    pub put_bytes: u64,
    /// Gets served from DRAM.
    pub hits_memory: u64,
    /// Gets served from disk.
    pub hits_disk: u64,
    /// Gets that missed.
    pub misses: u64,
    /// DRAM verification failures.
    pub corrupt_memory: u64,
    /// Disk verification or read failures.
    pub corrupt_disk: u64,
    /// Bytes returned by gets.
    pub get_bytes: u64,
    /// Disk -> DRAM promotions.
    pub promotions: u64,
    /// DRAM -> disk write-behinds.
    pub demotions: u64,
    /// Failed write-behinds.
    pub demotion_errors: u64,
    /// Write-behind batches.
    pub demotion_batches: u64,
    /// The memory tier's own counters.
    pub memory: kvtier_mem::MemoryStats,
    /// The disk tier's own counters, if there is a disk tier.
    pub disk: Option<kvtier_disk::DiskStats>,
    /// The I/O engine's counters, if there is a disk tier.
    pub io: Option<kvtier_io::IoStats>,
}

impl StoreCounters {
    pub(crate) fn snapshot(
        &self,
        memory: kvtier_mem::MemoryStats,
        disk: Option<kvtier_disk::DiskStats>,
        io: Option<kvtier_io::IoStats>,
    ) -> StoreStats {
        let g = |c: &AtomicU64| c.load(Relaxed);
        StoreStats {
            puts: g(&self.puts),
            put_bytes: g(&self.put_bytes),
            hits_memory: g(&self.hits_memory),
            hits_disk: g(&self.hits_disk),
            misses: g(&self.misses),
            corrupt_memory: g(&self.corrupt_memory),
            corrupt_disk: g(&self.corrupt_disk),
            get_bytes: g(&self.get_bytes),
            promotions: g(&self.promotions),
            demotions: g(&self.demotions),
            demotion_errors: g(&self.demotion_errors),
            demotion_batches: g(&self.demotion_batches),
            memory,
            disk,
            io,
        }
    }
}
