//! Figures of `kvtier bench node`: per-round aggregates, their medians with
//! min and max, control latencies, and the table.

use serde::Serialize;
use std::time::Duration;

use super::wire::{ControlResult, ControlRow, PhaseResult};
use crate::bench::measure::{Latencies, median_min_max};

/// One data phase of one round, over every worker.
#[derive(Debug, Clone, Copy, Default)]
pub struct PhaseTotals {
    /// Blocks moved by all workers.
    pub blocks: u64,
    /// Bytes moved by all workers.
    pub bytes: u64,
    /// The slowest worker's wall time: the phase ends when it does.
    pub wall: Duration,
    /// Sum of the workers' CPU time.
    pub client_cpu: Duration,
    /// The in-process daemon's CPU time over the phase (`None` for an
    /// external daemon).
    pub daemon_cpu: Option<Duration>,
    /// Sum of the workers' minor page faults.
    pub minor_faults: u64,
}

impl PhaseTotals {
    /// Sums the workers' results; `daemon_cpu` is measured by the caller.
    pub fn new(results: &[PhaseResult], daemon_cpu: Option<Duration>) -> Self {
        let mut t = Self {
            daemon_cpu,
            ..Self::default()
        };
        for r in results {
            t.blocks += r.blocks;
            t.bytes += r.bytes;
            t.wall = t.wall.max(Duration::from_nanos(r.wall_ns));
            t.client_cpu += Duration::from_nanos(r.cpu_ns);
            t.minor_faults += r.minor_faults;
        }
        t
    }

    fn mb_s(&self) -> f64 {
        self.bytes as f64 / self.wall.as_secs_f64().max(1e-9) / 1e6
    }

    fn per_block_us(&self, d: Duration) -> f64 {
        d.as_secs_f64() * 1e6 / self.blocks.max(1) as f64
    }
}

/// The three data phases of one round.
#[derive(Debug, Clone, Copy)]
pub struct Round {
    /// The memcpy baseline.
    pub memcpy: PhaseTotals,
    /// Stores through the daemon.
    pub store: PhaseTotals,
    /// Verified loads through the daemon.
    pub load: PhaseTotals,
}

/// The median of a figure over rounds, with its extremes (the VM drifts).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Spread {
    /// Median over rounds.
    pub median: f64,
    /// Lowest round.
    pub min: f64,
    /// Highest round.
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (all zero when empty).
    pub fn of(values: Vec<f64>) -> Self {
        median_min_max(values).map_or_else(Self::default, |(median, min, max)| Self {
            median,
            min,
            max,
        })
    }

    fn over(rounds: &[Round], f: impl Fn(&Round) -> f64) -> Self {
        Self::of(rounds.iter().map(f).collect())
    }
}

/// One figure per data phase.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PerPhase {
    /// The memcpy baseline.
    pub memcpy: Spread,
    /// Store through the daemon.
    pub store: Spread,
    /// Verified load through the daemon.
    pub load: Spread,
}

impl PerPhase {
    fn over(rounds: &[Round], f: impl Fn(&PhaseTotals) -> f64) -> Self {
        Self {
            memcpy: Spread::over(rounds, |r| f(&r.memcpy)),
            store: Spread::over(rounds, |r| f(&r.store)),
            load: Spread::over(rounds, |r| f(&r.load)),
        }
    }
}

/// One control row of one round, over every worker.
#[derive(Debug, Clone)]
pub struct RowRun {
    /// The row.
    pub row: ControlRow,
    /// Every worker's samples.
    pub samples: ControlResult,
    /// Samples timed, all workers together.
    pub taken: usize,
    /// This process's CPU over the row: the in-process daemon's (and, for
    /// the raw row, the echo server's); `None` for an external daemon.
    pub daemon_cpu: Option<Duration>,
}

/// The rows of one control round.
#[derive(Debug, Clone, Default)]
pub struct ControlRound(Vec<RowRun>);

impl ControlRound {
    /// Adds a measured row.
    pub fn push(&mut self, run: RowRun) {
        self.0.push(run);
    }

    fn row(&self, row: ControlRow) -> Option<&RowRun> {
        self.0.iter().find(|r| r.row == row)
    }
}

/// One control series (a row, or a part of one) over every round.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct OpLatency {
    /// Each round's median (all workers' samples), then their median,
    /// min and max over rounds; microseconds.
    pub p50_us: Spread,
    /// 99th percentile of every round's samples together, microseconds.
    pub p99_us: f64,
    /// Round trips timed, all rounds and workers.
    pub samples: usize,
    /// The daemon's CPU per sample of the row (its requests: see
    /// [`ControlRow::requests`]), per round; microseconds (for the raw row:
    /// the echo server's). `None` for an external daemon and for a part of
    /// a row.
    pub daemon_cpu_us_per_sample: Option<Spread>,
    /// The same per key moved (rows of keys only).
    pub daemon_cpu_us_per_key: Option<Spread>,
    /// Per key, less the same round's floor (its CPU per empty `Lookup`)
    /// for each request of the sample: the work the keys cost beyond the
    /// round trips themselves.
    pub daemon_cpu_us_per_key_over_floor: Option<Spread>,
    /// Against the row's raw-socket baseline of the same rounds (daemon
    /// rows of keys only).
    pub over_raw: Option<OverRaw>,
}

/// A daemon row against its raw-socket row ([`ControlRow::baseline`]):
/// per round, from the two rows' medians of that round.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct OverRaw {
    /// The row's p50 less the raw row's, microseconds.
    pub p50_us: Spread,
    /// The row's p50 over the raw row's.
    pub p50_ratio: Spread,
}

/// The samples of a raw row.
fn raw_pick(row: ControlRow) -> fn(&ControlResult) -> &Vec<u64> {
    match row {
        ControlRow::RawLookup => |c| &c.raw_lookup,
        ControlRow::RawReserveCommit => |c| &c.raw_reserve_commit,
        ControlRow::RawLoad => |c| &c.raw_load,
        _ => |c| &c.raw,
    }
}

/// The p50 of a row's series in one round, microseconds.
fn round_p50(run: &RowRun, pick: fn(&ControlResult) -> &Vec<u64>) -> f64 {
    Latencies(pick(&run.samples).clone()).percentile_us(50.0)
}

impl OverRaw {
    /// `row` (its series `pick`) against its baseline over `rounds`.
    fn of(rounds: &[ControlRound], (row, pick): Series) -> Option<Self> {
        let raw = row.baseline()?;
        let pairs: Vec<(f64, f64)> = rounds
            .iter()
            .filter_map(|r| {
                let own = round_p50(r.row(row)?, pick);
                Some((own, round_p50(r.row(raw)?, raw_pick(raw))))
            })
            .collect();
        (!pairs.is_empty()).then(|| Self {
            p50_us: Spread::of(pairs.iter().map(|(a, b)| a - b).collect()),
            p50_ratio: Spread::of(pairs.iter().map(|(a, b)| a / b.max(1e-9)).collect()),
        })
    }
}

/// A series of the control table: its row and where its samples are.
type Series = (ControlRow, fn(&ControlResult) -> &Vec<u64>);

impl OpLatency {
    /// The series over `rounds`; `whole` when it is its row's own (the
    /// row's CPU is its, not shared with another series).
    fn of(rounds: &[ControlRound], (row, pick): Series, whole: bool) -> Self {
        let runs: Vec<(&RowRun, Option<&RowRun>)> = rounds
            .iter()
            .filter_map(|r| Some((r.row(row)?, r.row(ControlRow::Floor))))
            .collect();
        let p50 = runs.iter().map(|(r, _)| round_p50(r, pick)).collect();
        let mut all = Latencies(
            runs.iter()
                .flat_map(|(r, _)| pick(&r.samples))
                .copied()
                .collect(),
        );
        // Microseconds of CPU per sample, less `floor` requests' worth.
        let cpu = |less_floor: bool, per_key: bool| {
            let values: Option<Vec<f64>> = runs
                .iter()
                .map(|(r, floor)| {
                    let mut us = r.daemon_cpu?.as_secs_f64() * 1e6 / r.taken.max(1) as f64;
                    if less_floor {
                        let f = (*floor)?;
                        let f_us = f.daemon_cpu?.as_secs_f64() * 1e6 / f.taken.max(1) as f64;
                        us -= f_us * row.requests() as f64;
                    }
                    Some(if per_key { us / row.keys() as f64 } else { us })
                })
                .collect();
            values
                .filter(|_| whole && (!per_key || row.keys() > 0))
                .map(Spread::of)
        };
        Self {
            p50_us: Spread::of(p50),
            p99_us: all.percentile_us(99.0),
            samples: all.0.len(),
            daemon_cpu_us_per_sample: cpu(false, false),
            daemon_cpu_us_per_key: cpu(false, true),
            daemon_cpu_us_per_key_over_floor: cpu(true, true),
            over_raw: OverRaw::of(rounds, (row, pick)).filter(|_| whole),
        }
    }
}

/// Control round trips of [`super::wire::CONTROL_KEYS`] keys.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Control {
    /// One raw Unix-socket round trip of 64 bytes each way between the
    /// worker and the bench process (no protocol, no runtime): the
    /// machine's floor.
    pub raw: OpLatency,
    /// The raw baseline of `lookup`: one round trip of its sizes.
    pub raw_lookup: OpLatency,
    /// The raw baseline of `reserve_commit`: two round trips of the
    /// `Reserve`'s and the `Commit`'s sizes.
    pub raw_reserve_commit: OpLatency,
    /// The raw baseline of `load`: one round trip of its sizes.
    pub raw_load: OpLatency,
    /// `Lookup` of no keys: the protocol's round trip itself, the floor
    /// under every other row.
    pub floor: OpLatency,
    /// `Lookup` of resident keys.
    pub lookup: OpLatency,
    /// `Reserve` of new keys.
    pub reserve: OpLatency,
    /// `Commit` of them, filled (with `verify_commits` the daemon hashes
    /// every byte here).
    pub commit: OpLatency,
    /// `Reserve` + `Commit`, the fill between them excluded; its CPU is
    /// theirs alone (the keys are removed after, outside the row).
    pub reserve_commit: OpLatency,
    /// `Load` of resident keys, to the last `LayerReady`; its CPU is the
    /// `Load`'s alone (released after the row, outside it).
    pub load: OpLatency,
    /// `Release` of them, timed after the row (no CPU: an engine waits on
    /// nothing for it).
    pub release: OpLatency,
}

impl Control {
    /// Every series over the rounds.
    pub fn new(rounds: &[ControlRound]) -> Self {
        use ControlRow::{
            Floor, Load, Lookup, RawLoad, RawLookup, RawReserveCommit, ReserveCommit,
        };
        let of = |s: Series, whole| OpLatency::of(rounds, s, whole);
        let raw = |row| of((row, raw_pick(row)), true);
        Self {
            raw: raw(ControlRow::Raw),
            raw_lookup: raw(RawLookup),
            raw_reserve_commit: raw(RawReserveCommit),
            raw_load: raw(RawLoad),
            floor: of((Floor, |c| &c.floor), true),
            lookup: of((Lookup, |c| &c.lookup), true),
            reserve: of((ReserveCommit, |c| &c.reserve), false),
            commit: of((ReserveCommit, |c| &c.commit), false),
            reserve_commit: of((ReserveCommit, |c| &c.reserve_commit), true),
            load: of((Load, |c| &c.load), true),
            release: of((Load, |c| &c.release), false),
        }
    }

    fn rows(&self) -> [(&'static str, OpLatency); 11] {
        [
            ("raw socket (baseline)", self.raw),
            ("raw socket as lookup", self.raw_lookup),
            ("raw socket x2", self.raw_reserve_commit),
            ("raw socket as load", self.raw_load),
            ("round trip (0 keys)", self.floor),
            ("lookup", self.lookup),
            ("reserve", self.reserve),
            ("commit", self.commit),
            ("reserve+commit", self.reserve_commit),
            ("load", self.load),
            ("release (untimed row)", self.release),
        ]
    }
}

/// Daemon CPU per block of the store and load phases.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct DaemonCpu {
    /// Reserve + commit (+ verification when on), microseconds per block.
    pub store: Spread,
    /// Load + release, microseconds per block.
    pub load: Spread,
}

/// Everything one pass (one daemon configuration) measured.
#[derive(Debug, Clone, Serialize)]
pub struct Pass {
    /// The in-process daemon's `manager.verify_commits`; `None` for an
    /// external daemon, whose setting this run does not know.
    pub verify_commits: Option<bool>,
    /// Unmeasured rounds run first (until stores stopped faulting in new
    /// arena pages).
    pub warmup_rounds: usize,
    /// Aggregate bandwidth of all clients (bytes / slowest client's wall).
    pub mb_s: PerPhase,
    /// Store bandwidth / memcpy bandwidth, per round.
    pub store_ratio: Spread,
    /// Load bandwidth / memcpy bandwidth, per round.
    pub load_ratio: Spread,
    /// Client CPU time per block (all clients' CPU / all blocks).
    pub client_cpu_us_per_block: PerPhase,
    /// The daemon's CPU time per block; `None` for an external daemon.
    pub daemon_cpu_us_per_block: Option<DaemonCpu>,
    /// Client minor page faults per block (first touches of arena pages).
    pub client_minor_faults_per_block: PerPhase,
    /// Control round trips.
    pub control: Control,
}

impl Pass {
    /// Reduces the rounds and the control samples of one pass.
    pub fn new(
        verify_commits: Option<bool>,
        warmup_rounds: usize,
        rounds: &[Round],
        control: &[ControlRound],
    ) -> Self {
        let ratio = |a: &PhaseTotals, b: &PhaseTotals| a.mb_s() / b.mb_s().max(1e-9);
        let daemon = |p: &PhaseTotals| p.daemon_cpu.map_or(0.0, |d| p.per_block_us(d));
        let has_daemon = rounds.iter().all(|r| r.store.daemon_cpu.is_some());
        Self {
            verify_commits,
            warmup_rounds,
            mb_s: PerPhase::over(rounds, PhaseTotals::mb_s),
            store_ratio: Spread::over(rounds, |r| ratio(&r.store, &r.memcpy)),
            load_ratio: Spread::over(rounds, |r| ratio(&r.load, &r.memcpy)),
            client_cpu_us_per_block: PerPhase::over(rounds, |p| p.per_block_us(p.client_cpu)),
            daemon_cpu_us_per_block: has_daemon.then(|| DaemonCpu {
                store: Spread::over(rounds, |r| daemon(&r.store)),
                load: Spread::over(rounds, |r| daemon(&r.load)),
            }),
            client_minor_faults_per_block: PerPhase::over(rounds, |p| {
                p.minor_faults as f64 / p.blocks.max(1) as f64
            }),
            control: Control::new(control),
        }
    }
}

/// The whole run, as `--json` prints it.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Client processes.
    pub clients: usize,
    /// `in-process` or the external daemon's socket.
    pub daemon: String,
    /// The model preset of the blocks.
    pub preset: String,
    /// Bytes per block.
    pub block_bytes: u64,
    /// Layers per block.
    pub layers: u32,
    /// Blocks each client moves per data phase.
    pub blocks_per_client: usize,
    /// Blocks per store / load call.
    pub batch: usize,
    /// Measured rounds (after the warm-up).
    pub rounds: usize,
    /// Keys per control round trip.
    pub control_keys: usize,
    /// Control round trips timed per operation and client.
    pub samples_per_client: usize,
    /// Control rounds the round trips were spread over.
    pub control_rounds: usize,
    /// One pass per daemon configuration.
    pub passes: Vec<Pass>,
    /// Daemon CPU per stored block with commit verification on, less with
    /// it off (medians): the daemon's checksum work. Needs both passes.
    pub daemon_checksum_us_per_block: Option<f64>,
}

impl Report {
    /// The checksum work: the difference of the two passes' medians.
    pub fn checksum_cost(passes: &[Pass]) -> Option<f64> {
        let store = |v: bool| {
            passes
                .iter()
                .find(|p| p.verify_commits == Some(v))
                .and_then(|p| p.daemon_cpu_us_per_block)
                .map(|d| d.store.median)
        };
        Some(store(true)? - store(false)?)
    }

    /// Prints the report as a table on stdout.
    pub fn print_table(&self) {
        println!(
            "kvtier bench node: {} client(s), daemon {}, {} blocks of {} B ({} layers), {} blocks per client, batches of {}, {} rounds; median [min .. max]",
            self.clients,
            self.daemon,
            self.preset,
            self.block_bytes,
            self.layers,
            self.blocks_per_client,
            self.batch,
            self.rounds
        );
        for pass in &self.passes {
            print_pass(pass);
        }
        if let Some(c) = self.daemon_checksum_us_per_block {
            println!("\ndaemon checksum work (verify on - off, store): {c:.1} us/block");
        }
    }
}

fn print_pass(p: &Pass) {
    let verify = match p.verify_commits {
        Some(true) => "verify_commits on",
        Some(false) => "verify_commits off",
        None => "external daemon",
    };
    println!("\n== {verify} ({} warm-up rounds)", p.warmup_rounds);
    println!(
        "{:<8} {:>26} {:>24} {:>22} {:>22} {:>12}",
        "phase",
        "MB/s",
        "ratio to memcpy",
        "client CPU us/block",
        "daemon CPU us/block",
        "faults/block"
    );
    let daemon = p.daemon_cpu_us_per_block;
    let rows = [
        (
            "memcpy",
            p.mb_s.memcpy,
            None,
            p.client_cpu_us_per_block.memcpy,
            None,
        ),
        (
            "store",
            p.mb_s.store,
            Some(p.store_ratio),
            p.client_cpu_us_per_block.store,
            daemon.map(|d| d.store),
        ),
        (
            "load",
            p.mb_s.load,
            Some(p.load_ratio),
            p.client_cpu_us_per_block.load,
            daemon.map(|d| d.load),
        ),
    ];
    let faults = [
        p.client_minor_faults_per_block.memcpy,
        p.client_minor_faults_per_block.store,
        p.client_minor_faults_per_block.load,
    ];
    for ((name, mb, ratio, client, daemon), f) in rows.into_iter().zip(faults) {
        println!(
            "{:<8} {:>26} {:>24} {:>22} {:>22} {:>12.1}",
            name,
            spread(mb, 0),
            ratio.map_or("-".into(), |r| spread(r, 2)),
            spread(client, 1),
            daemon.map_or("-".into(), |d| spread(d, 1)),
            f.median
        );
    }
    println!(
        "control round trips of {} keys (p50: median [min .. max] of the rounds' medians):",
        super::wire::CONTROL_KEYS
    );
    println!(
        "  {:<22} {:>28} {:>10} {:>8} {:>26} {:>22} {:>22} {:>28} {:>24}",
        "op",
        "p50 us",
        "p99 us",
        "samples",
        "daemon CPU us/sample",
        "daemon CPU us/key",
        "us/key over floor",
        "p50 over raw us",
        "p50 / raw"
    );
    let cell = |s: Option<Spread>, d| s.map_or("-".into(), |s| spread(s, d));
    for (name, l) in p.control.rows() {
        println!(
            "  {:<22} {:>28} {:>10.1} {:>8} {:>26} {:>22} {:>22} {:>28} {:>24}",
            name,
            spread(l.p50_us, 1),
            l.p99_us,
            l.samples,
            cell(l.daemon_cpu_us_per_sample, 1),
            cell(l.daemon_cpu_us_per_key, 2),
            cell(l.daemon_cpu_us_per_key_over_floor, 2),
            cell(l.over_raw.map(|o| o.p50_us), 1),
            cell(l.over_raw.map(|o| o.p50_ratio), 2)
        );
    }
}

/// `median [min .. max]` with `digits` decimals.
pub fn spread(s: Spread, digits: usize) -> String {
    format!(
        "{:.d$} [{:.d$} .. {:.d$}]",
        s.median,
        s.min,
        s.max,
        d = digits
    )
}
