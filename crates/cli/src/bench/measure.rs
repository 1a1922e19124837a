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

/// Whether kvtier runs first in round `r`: odd rounds turn the order
/// around, so drift between the sides falls on both. `bench store`: this
/// VM's disk slows down under sustained load and recovers when idle, so a
/// side that always followed fio's seconds of I/O would always meet the
/// slower disk (measured: with fio always right before kvtier, 2 MiB reads
/// came out at 0.55 of the baseline; without fio, 0.97, in the same hour).
/// `bench node`: an idle vCPU halts, and the first round trip after a
/// pause pays its wake-up.
pub fn kvtier_first(r: u64) -> bool {
    r % 2 == 1
}

/// Latency samples in nanoseconds.
#[derive(Default, Clone)]
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
#[derive(Default, Clone)]
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
            cpu_us_per_io: per_op_us(cpu, ops),
        }
    }
}

/// One round of a case: the baseline and kvtier back to back (in either
/// order), so a disk whose speed drifts over seconds moves both sides of
/// the round's ratio.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    /// Baseline bandwidth in this round, MB/s.
    pub baseline_mb_s: f64,
    /// kvtier bandwidth in this round, MB/s.
    pub store_mb_s: f64,
    /// store / baseline in this round.
    pub ratio: f64,
    /// Baseline process CPU per operation, microseconds.
    pub baseline_cpu_us_per_io: f64,
    /// kvtier process CPU per operation, microseconds.
    pub store_cpu_us_per_io: f64,
    /// fio's bandwidth in this round, when fio ran.
    pub fio_mb_s: Option<f64>,
    /// store / fio in this round, when fio ran.
    pub fio_ratio: Option<f64>,
}

/// The rounds of one case as they are measured, and their totals.
#[derive(Default)]
pub struct Rounds {
    baseline: Run,
    store: Run,
    rounds: Vec<Round>,
    fio: Vec<super::baseline::FioResult>,
}

impl Rounds {
    /// Records one round: the baseline's run, kvtier's run, and fio's
    /// figures when fio ran in the same round.
    pub fn add(&mut self, baseline: Run, store: Run, fio: Option<super::baseline::FioResult>) {
        let mb_s = |r: &Run| r.bytes as f64 / r.wall.as_secs_f64().max(1e-9) / 1e6;
        let cpu = |r: &Run| per_op_us(r.cpu, r.ops);
        let (b, s) = (mb_s(&baseline), mb_s(&store));
        self.rounds.push(Round {
            baseline_mb_s: b,
            store_mb_s: s,
            ratio: ratio(s, b),
            baseline_cpu_us_per_io: cpu(&baseline),
            store_cpu_us_per_io: cpu(&store),
            fio_mb_s: fio.map(|f| f.mb_s),
            fio_ratio: fio.map(|f| ratio(s, f.mb_s)),
        });
        self.fio.extend(fio);
        self.baseline.add(baseline);
        self.store.add(store);
    }

    /// The case these rounds measured; `baseline` and `store` say what ran.
    pub fn case(
        self,
        name: &str,
        object_bytes: u64,
        queue_depth: u32,
        baseline: impl Into<String>,
        store: impl Into<String>,
    ) -> Case {
        let median_of = |f: &dyn Fn(&Round) -> Option<f64>| {
            median_min_max(self.rounds.iter().filter_map(f).collect())
        };
        let (ratio, ratio_min, ratio_max) = median_of(&|r| Some(r.ratio)).unwrap_or_default();
        let cpu = median_of(&|r| Some(r.store_cpu_us_per_io)).map_or(0.0, |m| m.0);
        let base_cpu = median_of(&|r| Some(r.baseline_cpu_us_per_io)).map_or(0.0, |m| m.0);
        let fio_ratio = median_of(&|r| r.fio_ratio);
        let fio_mb_s = median_of(&|r| r.fio_mb_s).map(|m| m.0);
        let fio_cpu = median_min_max(self.fio.iter().map(|f| f.cpu_us_per_io).collect());
        let baseline = self.baseline.side(baseline);
        let store = self.store.side(store);
        Case {
            name: name.into(),
            object_bytes,
            queue_depth,
            baseline_mb_s: baseline.mb_s,
            store_mb_s: store.mb_s,
            ratio,
            ratio_min,
            ratio_max,
            cpu_us_per_io: cpu,
            baseline_cpu_us_per_io: base_cpu,
            fio_mb_s,
            fio_cpu_us_per_io: fio_cpu.map(|m| m.0),
            fio_ratio: fio_ratio.map(|m| m.0),
            fio_ratio_min: fio_ratio.map(|m| m.1),
            fio_ratio_max: fio_ratio.map(|m| m.2),
            baseline,
            store,
            rounds: self.rounds,
        }
    }
}

fn ratio(store: f64, baseline: f64) -> f64 {
    if baseline > 0.0 {
        store / baseline
    } else {
        0.0
    }
}

fn per_op_us(cpu: Duration, ops: u64) -> f64 {
    if ops == 0 {
        0.0
    } else {
        cpu.as_secs_f64() * 1e6 / ops as f64
    }
}

/// Median (the mean of the middle two for an even count), min and max;
/// `None` when there are no values.
pub fn median_min_max(mut v: Vec<f64>) -> Option<(f64, f64, f64)> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some((median, v[0], v[n - 1]))
}

/// One benchmark case: the store against its baseline, in alternating
/// rounds of one run. Ratios and CPU figures are medians of the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct Case {
    /// Case name, e.g. `disk_read_2m`.
    pub name: String,
    /// Bytes per operation (object or block).
    pub object_bytes: u64,
    /// Operations in flight.
    pub queue_depth: u32,
    /// Baseline bandwidth over all rounds, MB/s.
    pub baseline_mb_s: f64,
    /// kvtier bandwidth over all rounds, MB/s.
    pub store_mb_s: f64,
    /// Median over the rounds of store / baseline.
    pub ratio: f64,
    /// Lowest round's store / baseline.
    pub ratio_min: f64,
    /// Highest round's store / baseline.
    pub ratio_max: f64,
    /// Median over the rounds of kvtier's process CPU per operation,
    /// microseconds.
    pub cpu_us_per_io: f64,
    /// Median over the rounds of the baseline's CPU per operation.
    pub baseline_cpu_us_per_io: f64,
    /// Median of fio's bandwidth over the rounds, when fio ran.
    pub fio_mb_s: Option<f64>,
    /// Median of fio's CPU per I/O, microseconds.
    pub fio_cpu_us_per_io: Option<f64>,
    /// Median over the rounds of store / fio.
    pub fio_ratio: Option<f64>,
    /// Lowest round's store / fio.
    pub fio_ratio_min: Option<f64>,
    /// Highest round's store / fio.
    pub fio_ratio_max: Option<f64>,
    /// Baseline figures over all rounds (latency percentiles included).
    pub baseline: Side,
    /// kvtier figures over all rounds.
    pub store: Side,
    /// Each round's figures, in the order they ran.
    pub rounds: Vec<Round>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(mb: u64, ms: u64, ops: u64, cpu_ms: u64) -> Run {
        Run {
            bytes: mb * 1_000_000,
            ops,
            wall: Duration::from_millis(ms),
            cpu: Duration::from_millis(cpu_ms),
            lat: Latencies::default(),
        }
    }

    #[test]
    fn median_min_max_odd_even_and_empty() {
        assert_eq!(median_min_max(vec![]), None);
        assert_eq!(median_min_max(vec![3.0, 1.0, 2.0]), Some((2.0, 1.0, 3.0)));
        assert_eq!(
            median_min_max(vec![4.0, 1.0, 3.0, 2.0]),
            Some((2.5, 1.0, 4.0))
        );
    }

    #[test]
    fn a_case_reports_the_median_round_not_the_totals() {
        let mut r = Rounds::default();
        // Round ratios 0.5, 1.0, 0.9; a slow baseline round dominates the totals.
        r.add(run(100, 1000, 10, 10), run(100, 2000, 10, 20), None);
        r.add(run(100, 100, 10, 10), run(100, 100, 10, 30), None);
        r.add(run(90, 100, 10, 10), run(81, 100, 10, 40), None);
        let c = r.case("c", 1, 1, "base", "store");
        assert_eq!(c.rounds.len(), 3);
        assert!((c.ratio - 0.9).abs() < 1e-9, "{}", c.ratio);
        assert!((c.ratio_min - 0.5).abs() < 1e-9);
        assert!((c.ratio_max - 1.0).abs() < 1e-9);
        assert!(
            (c.cpu_us_per_io - 3000.0).abs() < 1e-6,
            "{}",
            c.cpu_us_per_io
        );
        assert_eq!(c.fio_ratio, None);
    }
}
