//! Counters per transfer path and a latency histogram.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use crate::tier::TransferPath;

const BUCKETS: usize = 48;

/// A histogram of durations in power-of-two microsecond buckets: bucket
/// `i` counts durations in `[2^i, 2^(i+1))` us (bucket 0 also holds
/// anything under 1 us). Quantiles are reported as the upper bound of their
/// bucket, so they err high by at most 2x — enough to tell 100 us from
/// 10 ms without a lock on the hot path.
#[derive(Debug)]
pub struct LatencyHistogram {
    buckets: [AtomicU64; BUCKETS],
    count: AtomicU64,
    sum_us: AtomicU64,
    max_us: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
            max_us: AtomicU64::new(0),
        }
    }
}

/// Quantiles of a [`LatencyHistogram`], in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LatencySummary {
    /// Durations recorded.
    pub count: u64,
    /// Mean.
    pub mean_us: u64,
    /// Median (bucket upper bound).
    pub p50_us: u64,
    /// 99th percentile (bucket upper bound).
    pub p99_us: u64,
    /// Largest recorded.
    pub max_us: u64,
}

impl LatencyHistogram {
    /// Records one duration.
    pub fn record(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let bucket = (u64::BITS - us.leading_zeros()).saturating_sub(1) as usize;
        self.buckets[bucket.min(BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
    }

    /// The summary now.
    pub fn summary(&self) -> LatencySummary {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        let quantile = |q: f64| -> u64 {
            if total == 0 {
                return 0;
            }
            let rank = ((total as f64 * q).ceil() as u64).max(1);
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return 1u64 << (i + 1);
                }
            }
            1u64 << BUCKETS
        };
        let count = self.count.load(Ordering::Relaxed);
        let max_us = self.max_us.load(Ordering::Relaxed);
        LatencySummary {
            count,
            mean_us: self.sum_us.load(Ordering::Relaxed) / count.max(1),
            p50_us: quantile(0.50).min(max_us.max(1)),
            p99_us: quantile(0.99).min(max_us.max(1)),
            max_us,
        }
    }
}

/// The live counters of one path.
#[derive(Debug, Default)]
pub struct PathMetrics {
    transfers: AtomicU64,
    blocks: AtomicU64,
    failed_blocks: AtomicU64,
    bytes: AtomicU64,
    batches: AtomicU64,
    queued_blocks: AtomicU64,
    max_queued_blocks: AtomicU64,
    latency: LatencyHistogram,
}

impl PathMetrics {
    pub(crate) fn queued(&self, blocks: u64) {
        let now = self.queued_blocks.fetch_add(blocks, Ordering::Relaxed) + blocks;
        self.max_queued_blocks.fetch_max(now, Ordering::Relaxed);
    }

    pub(crate) fn dequeued(&self, blocks: u64) {
        self.queued_blocks.fetch_sub(blocks, Ordering::Relaxed);
    }

    pub(crate) fn batch(&self) {
        self.batches.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn block_done(&self, ok: bool, bytes: u64) {
        self.blocks.fetch_add(1, Ordering::Relaxed);
        if ok {
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
        } else {
            self.failed_blocks.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn transfer_done(&self, latency: Duration) {
        self.transfers.fetch_add(1, Ordering::Relaxed);
        self.latency.record(latency);
    }
}

/// A snapshot of one path's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PathStats {
    /// The path.
    pub path: TransferPath,
    /// Transfers completed (every block done).
    pub transfers: u64,
    /// Blocks completed, delivered or failed.
    pub blocks: u64,
    /// Blocks that failed (misses, corrupt, full, errors).
    pub failed_blocks: u64,
    /// Bytes delivered.
    pub bytes: u64,
    /// Batches executed (one executor call each).
    pub batches: u64,
    /// Blocks queued now, not yet in a batch.
    pub queue_depth: u64,
    /// The most blocks ever queued at once.
    pub max_queue_depth: u64,
    /// Transfer latency, submission to last block done.
    pub latency: LatencySummary,
}

/// Counters of every path an engine serves.
#[derive(Debug, Default)]
pub struct TransferMetrics {
    paths: Vec<(TransferPath, PathMetrics)>,
}

impl TransferMetrics {
    /// Counters for `paths`, all zero.
    pub fn new(paths: &[TransferPath]) -> Self {
        Self {
            paths: paths.iter().map(|p| (*p, PathMetrics::default())).collect(),
        }
    }

    /// The counters of `path`, if served.
    pub fn path(&self, path: TransferPath) -> Option<&PathMetrics> {
        self.paths.iter().find(|(p, _)| *p == path).map(|(_, m)| m)
    }

    /// The counters of the `index`th path (an engine's worker knows its
    /// index; one out of range is a bug).
    pub(crate) fn at(&self, index: usize) -> &PathMetrics {
        &self.paths[index].1
    }

    /// A snapshot of `path` (all zero for a path not served).
    pub fn snapshot(&self, path: TransferPath) -> PathStats {
        match self.path(path) {
            Some(m) => snapshot_of(path, m),
            None => snapshot_of(path, &PathMetrics::default()),
        }
    }

    /// Snapshots of every path served.
    pub fn snapshot_all(&self) -> Vec<PathStats> {
        self.paths.iter().map(|(p, m)| snapshot_of(*p, m)).collect()
    }
}

/// A snapshot of `m`, the counters of `path`.
fn snapshot_of(path: TransferPath, m: &PathMetrics) -> PathStats {
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    PathStats {
        path,
        transfers: get(&m.transfers),
        blocks: get(&m.blocks),
        failed_blocks: get(&m.failed_blocks),
        bytes: get(&m.bytes),
        batches: get(&m.batches),
        queue_depth: get(&m.queued_blocks),
        max_queue_depth: get(&m.max_queued_blocks),
        latency: m.latency.summary(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_land_in_the_right_bucket() {
        let h = LatencyHistogram::default();
        for _ in 0..98 {
            h.record(Duration::from_micros(100));
        }
        h.record(Duration::from_millis(10));
        h.record(Duration::from_millis(10));
        let s = h.summary();
        assert_eq!(s.count, 100);
        assert!((100..=256).contains(&s.p50_us), "{s:?}");
        assert!((10_000..=16_384).contains(&s.p99_us), "{s:?}");
        assert_eq!(s.max_us, 10_000);
    }
}
