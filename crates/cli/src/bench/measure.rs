//! Measurement helpers: CPU time, latency percentiles, results.

use serde::Serialize;
use std::time::Duration;

/// The whole process's resource usage so far, all threads included.
fn process_usage() -> Option<libc::rusage> {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a full rusage into the pointer we pass.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: getrusage succeeded, so the struct is initialised.
    Some(unsafe { ru.assume_init() })
}

/// CPU time (user + system) consumed by the whole process so far, all
/// threads included (the I/O engine's reaper threads count too).
pub fn process_cpu_time() -> Duration {
    let Some(ru) = process_usage() else {
        return Duration::ZERO;
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Minor page faults the whole process has taken so far: first touches of
/// pages already in memory, such as shared-memory pages another process
/// mapped first.
pub fn process_minor_faults() -> u64 {
    process_usage().map_or(0, |ru| ru.ru_minflt as u64)
}

/// Latency samples in nanoseconds.
#[derive(Default)]
pub struct Latencies(pub Vec<u64>);

impl Latencies {
    /// Records one sample.
    pub fn push(&mut self, d: Duration) {
        self.0.push(d.as_nanos() as u64);
    }

    /// Records `n` samples of the same value (all ops of one batch).
    pub fn push_n(&mut self, d: Duration, n: usize) {
        self.0.extend(std::iter::repeat_n(d.as_nanos() as u64, n));
    }

    /// The `p`-th percentile in microseconds (0 when empty).
    pub fn percentile_us(&mut self, p: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.sort_unstable();
        let i = ((self.0.len() - 1) as f64 * p / 100.0).round() as usize;
        self.0[i] as f64 / 1000.0
    }
}

/// Totals of one or more timed runs of the same operation, so baseline
/// and kvtier can be measured in alternating rounds (the disk's speed drifts
/// over seconds; alternating keeps the drift out of the ratio).
#[derive(Default)]
pub struct Run {
    /// Bytes moved.
    pub bytes: u64,
    /// Operations completed.
    pub ops: u64,
    /// Wall time.
    pub wall: Duration,
    /// Process CPU time.
    pub cpu: Duration,
    /// Per-operation latencies.
    pub lat: Latencies,
}

impl Run {
    /// Adds another round's totals.
    pub fn add(&mut self, other: Run) {
        self.bytes += other.bytes;
        self.ops += other.ops;
        self.wall += other.wall;
        self.cpu += other.cpu;
        self.lat.0.extend(other.lat.0);
    }

    /// The figures of everything added so far.
    pub fn side(mut self, what: impl Into<String>) -> Side {
        Side::from_run(
            what,
            self.bytes,
            self.ops,
            self.wall,
            self.cpu,
            &mut self.lat,
        )
    }
}

/// One side (baseline or kvtier) of a case.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Side {
    /// What ran.
    pub what: String,
    /// Megabytes (10^6 B) per second.
    pub mb_s: f64,
    /// Operations per second.
    pub iops: f64,
    /// Median latency of one operation, microseconds.
    pub p50_us: f64,
    /// 99th percentile latency, microseconds.
    pub p99_us: f64,
    /// Process CPU time per operation, microseconds.
    pub cpu_us_per_io: f64,
}

impl Side {
    /// Builds a side from totals.
    pub fn from_run(
        what: impl Into<String>,
        bytes: u64,
        ops: u64,
        wall: Duration,
        cpu: Duration,
        lat: &mut Latencies,
    ) -> Self {
        let secs = wall.as_secs_f64().max(1e-9);
        Side {
            what: what.into(),
            mb_s: bytes as f64 / secs / 1e6,
            iops: ops as f64 / secs,
            p50_us: lat.percentile_us(50.0),
            p99_us: lat.percentile_us(99.0),
            cpu_us_per_io: if ops == 0 {
                0.0
            } else {
                cpu.as_secs_f64() * 1e6 / ops as f64
            },
        }
    }
}

/// One benchmark case: the store against its baseline, measured in one run.
#[derive(Debug, Clone, Serialize)]
pub struct Case {
    /// Case name, e.g. `disk_read_2m`.
    pub name: String,
    /// Bytes per operation (object or block).
    pub object_bytes: u64,
    /// Operations in flight.
    pub queue_depth: u32,
    /// Baseline bandwidth, MB/s.
    pub baseline_mb_s: f64,
    /// kvtier bandwidth, MB/s.
    pub store_mb_s: f64,
    /// store / baseline.
    pub ratio: f64,
    /// kvtier's process CPU per operation, microseconds.
    pub cpu_us_per_io: f64,
    /// fio's bandwidth for the same pattern, when fio is installed.
    pub fio_mb_s: Option<f64>,
    /// fio's CPU per I/O for the same pattern, microseconds.
    pub fio_cpu_us_per_io: Option<f64>,
    /// Full baseline figures.
    pub baseline: Side,
    /// Full kvtier figures.
    pub store: Side,
}

impl Case {
    /// Pairs a store side with its baseline.
    pub fn new(
        name: &str,
        object_bytes: u64,
        queue_depth: u32,
        baseline: Side,
        store: Side,
        fio: Option<super::baseline::FioResult>,
    ) -> Self {
        Case {
            name: name.into(),
            object_bytes,
            queue_depth,
            baseline_mb_s: baseline.mb_s,
            store_mb_s: store.mb_s,
            ratio: if baseline.mb_s > 0.0 {
                store.mb_s / baseline.mb_s
            } else {
                0.0
            },
            cpu_us_per_io: store.cpu_us_per_io,
            fio_mb_s: fio.map(|f| f.mb_s),
            fio_cpu_us_per_io: fio.map(|f| f.cpu_us_per_io),
            baseline,
            store,
        }
    }
}
