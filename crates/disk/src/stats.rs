//! [`DiskStats`]: the tier's counters, and the atomics behind them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A snapshot of the tier's counters (monotonic since open unless noted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Blocks acknowledged by `put_batch` (written now).
    pub puts: u64,
    /// Bytes of block data acknowledged.
    pub put_bytes: u64,
    /// `put_batch` blocks that were already present (acknowledged without a write).
    pub put_dups: u64,
    /// `put_batch` blocks refused (write failed, dir failed, wrong length, closed).
    pub put_errors: u64,
    /// Lookups that returned verified bytes.
    pub hits: u64,
    /// Lookups of absent blocks.
    pub misses: u64,
    /// Lookups whose bytes failed verification or whose read failed; the
    /// entries were dropped.
    pub corrupt: u64,
    /// Read operations issued: block and layer reads, slot-header reads,
    /// re-insertion reads and the header reads of recovery at open.
    pub read_ios: u64,
    /// Of `read_ios`, the layer-major reads of one layer of several
    /// adjacent slots at once (runs).
    pub read_runs: u64,
    /// Layer pieces read from layer-major lives (alone or in runs).
    pub layer_pieces: u64,
    /// Slots read again alone because a run read they shared failed.
    pub run_retries: u64,
    /// Write operations issued.
    pub write_ios: u64,
    /// Blocks written straight from their pinned bytes, without a copy
    /// into a region buffer (see `BlockPut::pinned`).
    pub direct_writes: u64,
    /// I/O errors seen (failed or short operations, failed syncs).
    pub io_errors: u64,
    /// Regions reclaimed.
    pub regions_reclaimed: u64,
    /// Blocks dropped by reclaim: exactly the blocks reported to the
    /// reclaim listener's `evicted` (counted whether or not a listener is
    /// installed): blocks nobody wanted kept. Re-inserted blocks are not
    /// counted, nor are `blocks_lost`.
    pub blocks_evicted: u64,
    /// Blocks the reclaim listener wanted kept that reclaim could not
    /// re-insert (reading back failed, the copy failed verification, or the
    /// write re-inserting it failed): what its `lost` reports.
    pub blocks_lost: u64,
    /// Blocks re-inserted by reclaim (acknowledged in their new slot), for
    /// any reason.
    pub reinserted: u64,
    /// Of `reinserted`, the blocks re-inserted because the reclaim
    /// listener's `retain` wanted them.
    pub reclaim_retained: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Directories latched as failed (current).
    pub failed_dirs: u64,
    /// Blocks indexed (current).
    pub blocks: u64,
    /// Bytes of block data indexed (current): `blocks * block_bytes`.
    pub bytes_used: u64,
    /// Bytes of regions holding data (current): regions not free x region size.
    pub region_bytes_used: u64,
    /// Blocks the tier can hold.
    pub capacity_blocks: u64,
    /// Recovery at open: blocks taken from checkpoints.
    pub recovered_from_checkpoint: u64,
    /// Recovery at open: blocks found by scanning slot headers.
    pub recovered_from_scan: u64,
    /// Recovery at open: slot headers read while scanning.
    pub recovery_slots_scanned: u64,
    /// Recovery at open: regions found holding data.
    pub recovery_regions: u64,
    /// Recovery at open: wall time in microseconds.
    pub recovery_micros: u64,
}

/// The live counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub puts: AtomicU64,
    pub put_bytes: AtomicU64,
    pub put_dups: AtomicU64,
    pub put_errors: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub corrupt: AtomicU64,
    pub read_ios: AtomicU64,
    pub read_runs: AtomicU64,
    pub layer_pieces: AtomicU64,
    pub run_retries: AtomicU64,
    pub write_ios: AtomicU64,
    pub direct_writes: AtomicU64,
    pub io_errors: AtomicU64,
    pub regions_reclaimed: AtomicU64,
    pub blocks_evicted: AtomicU64,
    pub blocks_lost: AtomicU64,
    pub reinserted: AtomicU64,
    pub reclaim_retained: AtomicU64,
    pub checkpoints: AtomicU64,
    pub recovered_from_checkpoint: AtomicU64,
    pub recovered_from_scan: AtomicU64,
    pub recovery_slots_scanned: AtomicU64,
    pub recovery_regions: AtomicU64,
    pub recovery_micros: AtomicU64,
}

/// Adds `n` to a counter.
pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Relaxed);
}

impl Counters {
    /// The monotonic part of a snapshot; the caller fills the current gauges.
    pub(crate) fn snapshot(&self) -> DiskStats {
        let g = |c: &AtomicU64| c.load(Relaxed);
        DiskStats {
            puts: g(&self.puts),
            put_bytes: g(&self.put_bytes),
            put_dups: g(&self.put_dups),
            put_errors: g(&self.put_errors),
            hits: g(&self.hits),
            misses: g(&self.misses),
            corrupt: g(&self.corrupt),
            read_ios: g(&self.read_ios),
            read_runs: g(&self.read_runs),
            layer_pieces: g(&self.layer_pieces),
            run_retries: g(&self.run_retries),
            write_ios: g(&self.write_ios),
            direct_writes: g(&self.direct_writes),
            io_errors: g(&self.io_errors),
            regions_reclaimed: g(&self.regions_reclaimed),
            blocks_evicted: g(&self.blocks_evicted),
            blocks_lost: g(&self.blocks_lost),
            reinserted: g(&self.reinserted),
            reclaim_retained: g(&self.reclaim_retained),
            checkpoints: g(&self.checkpoints),
            recovered_from_checkpoint: g(&self.recovered_from_checkpoint),
            recovered_from_scan: g(&self.recovered_from_scan),
            recovery_slots_scanned: g(&self.recovery_slots_scanned),
            recovery_regions: g(&self.recovery_regions),
            recovery_micros: g(&self.recovery_micros),
            ..DiskStats::default()
        }
    }
}
