//! `kvtier bench meta`: the metadata service's read and write paths, in
//! process and over HTTP and gRPC on loopback, for each index backend.
//!
//! Per backend it writes `--sequences` chains of `--keys` blocks through
//! two-phase writes (StartWriteCache + FinishWriteCache, `--write-batch`
//! keys per session; one client, then `--writers` concurrent clients), then
//! runs `--rounds` prefix matches of a whole chain (GetCacheLocation,
//! QT_PREFIX_MATCH) in process, over HTTP and over gRPC. Baselines measured
//! in the same run: for in-process matching, the same lookups in a plain
//! `HashMap` (the data-structure floor); for the transports, the round trip
//! of a body of the same size to an endpoint that does no work (the
//! transport floor). Ratios are kvtier / floor.

use anyhow::{Context, Result, bail};
use clap::Args;
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvtier_meta::{
    BlockKey, CacheLocation, EvictionPolicy, Instance, InstanceGroup, LocationQuery,
    LocationSpecInfo, MemoryIndex, MetaConfig, MetaService, RedbIndex, Storage, StorageHealth,
    StorageKind,
};

use super::measure::{Latencies, process_cpu_time};
use super::meta_wire;
use crate::meta::OpenIndex;

/// Arguments of `kvtier bench meta`.
#[derive(Args)]
pub struct MetaBenchArgs {
    /// Index backends: memory, embedded (redb in a temp dir) and/or a
    /// redis:// URL, comma-separated.
    #[arg(long, default_value = "memory,embedded")]
    pub backends: String,
    /// Transports: inproc, http, grpc, comma-separated.
    #[arg(long, default_value = "inproc,http,grpc")]
    pub transports: String,
    /// Keys per prefix match (and per written chain).
    #[arg(long, default_value_t = 1024)]
    pub keys: usize,
    /// Chains written before matching.
    #[arg(long, default_value_t = 64)]
    pub sequences: usize,
    /// Prefix matches per backend and transport.
    #[arg(long, default_value_t = 2000)]
    pub rounds: usize,
    /// Keys per write session.
    #[arg(long, default_value_t = 64)]
    pub write_batch: usize,
    /// Concurrent writers in the write-throughput case.
    #[arg(long, default_value_t = 8)]
    pub writers: usize,
    /// Small sizes for a smoke run (CI).
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One measured case.
#[derive(Debug, Clone, Serialize)]
pub struct MetaCase {
    /// Index backend (`memory`, `embedded`, `redis`).
    pub backend: String,
    /// `inproc`, `http` or `grpc`.
    pub transport: String,
    /// `prefix_match`, `write` (start + finish), `write_concurrent`.
    pub op: String,
    /// Keys per operation.
    pub keys_per_op: usize,
    /// Operations measured.
    pub ops: usize,
    /// Median latency, microseconds.
    pub p50_us: f64,
    /// 99th percentile latency, microseconds.
    pub p99_us: f64,
    /// Operations per second.
    pub ops_per_s: f64,
    /// Keys per second.
    pub keys_per_s: f64,
    /// CPU time of the whole process per operation, microseconds (client
    /// and server together: both run in this process).
    pub cpu_us_per_op: f64,
    /// What the baseline is, when there is one.
    pub baseline: Option<String>,
    /// Baseline median latency, microseconds.
    pub baseline_p50_us: Option<f64>,
    /// Baseline CPU per operation, microseconds.
    pub baseline_cpu_us_per_op: Option<f64>,
    /// kvtier p50 / baseline p50.
    pub ratio_p50: Option<f64>,
    /// The DESIGN.md bar for this case, microseconds, and at which
    /// percentile it applies.
    pub bar: Option<Bar>,
}

/// A latency bar from DESIGN.md.
#[derive(Debug, Clone, Serialize)]
pub struct Bar {
    /// `p50` or `p99`.
    pub percentile: &'static str,
    /// Limit in microseconds.
    pub limit_us: f64,
    /// Whether this run met it.
    pub met: bool,
}

/// The whole report.
#[derive(Debug, Serialize)]
struct Report {
    keys: usize,
    sequences: usize,
    rounds: usize,
    write_batch: usize,
    writers: usize,
    cases: Vec<MetaCase>,
}

/// Timings of one measured loop.
pub struct Measured {
    pub lat: Latencies,
    pub elapsed: Duration,
    /// CPU time of the whole process during the loop: client, service
    /// and, over a transport, the in-process server.
    pub cpu: Duration,
}

/// When a measured loop started, by the clock and by the process's CPU
/// time.
pub struct Start {
    at: Instant,
    cpu: Duration,
}

impl Start {
    /// Now.
    pub fn now() -> Self {
        Start {
            cpu: process_cpu_time(),
            at: Instant::now(),
        }
    }

    /// The loop that started here, ending now, with samples `lat`.
    pub fn measured(self, lat: Latencies) -> Measured {
        Measured {
            lat,
            elapsed: self.at.elapsed(),
            cpu: process_cpu_time().saturating_sub(self.cpu),
        }
    }

    /// [`Start::measured`], counting the CPU of `settle` (work the loop
    /// left behind: the service's buffered access statistics) but not its
    /// time, so the next loop's CPU is its own.
    pub fn measured_settled(
        self,
        lat: Latencies,
        settle: impl FnOnce() -> Result<()>,
    ) -> Result<Measured> {
        let elapsed = self.at.elapsed();
        settle()?;
        Ok(Measured {
            lat,
            elapsed,
            cpu: process_cpu_time().saturating_sub(self.cpu),
        })
    }
}

impl Measured {
    /// Turns the samples into a case.
    pub fn case(
        mut self,
        backend: &str,
        transport: &str,
        op: &str,
        keys_per_op: usize,
    ) -> MetaCase {
        let ops = self.lat.0.len();
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let cpu_us_per_op = cpu_per_op(self.cpu, ops);
        MetaCase {
            backend: backend.into(),
            transport: transport.into(),
            op: op.into(),
            keys_per_op,
            ops,
            p50_us: self.lat.percentile_us(50.0),
            p99_us: self.lat.percentile_us(99.0),
            ops_per_s: ops as f64 / secs,
            keys_per_s: (ops * keys_per_op) as f64 / secs,
            cpu_us_per_op,
            baseline: None,
            baseline_p50_us: None,
            baseline_cpu_us_per_op: None,
            ratio_p50: None,
            bar: None,
        }
    }
}

impl MetaCase {
    /// Attaches a baseline measured in the same run.
    pub fn with_baseline(mut self, what: &str, mut base: Measured) -> Self {
        let p50 = base.lat.percentile_us(50.0);
        self.baseline = Some(what.into());
        self.baseline_p50_us = Some(p50);
        self.baseline_cpu_us_per_op = Some(cpu_per_op(base.cpu, base.lat.0.len()));
        self.ratio_p50 = (p50 > 0.0).then(|| self.p50_us / p50);
        self
    }

    /// Attaches a DESIGN.md bar.
    pub fn with_bar(mut self, percentile: &'static str, limit_us: f64) -> Self {
        let v = if percentile == "p99" {
            self.p99_us
        } else {
            self.p50_us
        };
        self.bar = Some(Bar {
            percentile,
            limit_us,
            met: v <= limit_us,
        });
        self
    }
}

/// `cpu` spread over `ops` operations, in microseconds.
fn cpu_per_op(cpu: Duration, ops: usize) -> f64 {
    cpu.as_secs_f64() * 1e6 / ops.max(1) as f64
}

/// The benchmark's instance: one group, one storage (no backend attached,
/// so the service only computes URIs), 1 MiB blocks in two TP parts.
pub const INSTANCE: &str = "bench";

fn catalog() -> (Storage, InstanceGroup, Instance) {
    let storage = Storage {
        name: "bench-s3".into(),
        kind: StorageKind::S3,
        uri: "s3://bench/kv".into(),
        enabled: true,
        health: StorageHealth::Healthy,
        spec: None,
    };
    let group = InstanceGroup {
        name: "bench".into(),
        quota_bytes: u64::MAX,
        kind_quota_bytes: Default::default(),
        watermark: 1.0,
        eviction: EvictionPolicy::Lru,
        storages: vec![storage.name.clone()],
        max_instances: 16,
        ..Default::default()
    };
    let instance = Instance {
        id: INSTANCE.into(),
        group: group.name.clone(),
        model: "llama3-8b".into(),
        block_size: 16,
        location_specs: vec![
            LocationSpecInfo {
                name: "tp0".into(),
                size: 1 << 19,
            },
            LocationSpecInfo {
                name: "tp1".into(),
                size: 1 << 19,
            },
        ],
        spec_groups: vec![],
    };
    (storage, group, instance)
}

/// Random distinct chains of `keys` block keys.
pub fn chains(sequences: usize, keys: usize, seed: u64) -> Vec<Vec<BlockKey>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..sequences)
        .map(|_| (0..keys).map(|_| BlockKey(rng.random())).collect())
        .collect()
}

fn open_index(spec: &str, tmp: &tempfile::TempDir) -> Result<(String, OpenIndex)> {
    let local = OpenIndex::local;
    Ok(match spec {
        "memory" => ("memory".into(), local(Arc::new(MemoryIndex::new()))),
        "embedded" => (
            "embedded".into(),
            local(Arc::new(
                RedbIndex::open(tmp.path().join("meta.redb"), 256 << 20)
                    .context("opening the embedded index")?,
            )),
        ),
        other if other.starts_with("redis://") || other.starts_with("rediss://") => (
            "redis".into(),
            OpenIndex::redis(other, "kvtier-bench", false)?,
        ),
        other => bail!("unknown backend {other:?}: memory, embedded or a redis:// URL"),
    })
}

/// Runs `kvtier bench meta`.
pub fn run(mut args: MetaBenchArgs) -> Result<()> {
    if args.quick {
        args.keys = args.keys.min(256);
        args.sequences = args.sequences.min(8);
        args.rounds = args.rounds.min(100);
        args.writers = args.writers.min(2);
    }
    if args.keys == 0 || args.sequences == 0 || args.rounds == 0 || args.write_batch == 0 {
        bail!("--keys, --sequences, --rounds and --write-batch must be positive");
    }
    let transports: Vec<String> = args
        .transports
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    for t in &transports {
        if !["inproc", "http", "grpc"].contains(&t.as_str()) {
            bail!("unknown transport {t:?}: inproc, http or grpc");
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let mut cases = Vec::new();
    for spec in args
        .backends
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let tmp = tempfile::tempdir().context("creating a temp dir")?;
        let (backend, index) = open_index(spec, &tmp)?;
        eprintln!(
            "[{backend}] writing {} chains of {} keys",
            args.sequences, args.keys
        );
        let found = rt.block_on(bench_backend(&args, &backend, index, &transports))?;
        cases.extend(found);
    }
    let report = Report {
        keys: args.keys,
        sequences: args.sequences,
        rounds: args.rounds,
        write_batch: args.write_batch,
        writers: args.writers,
        cases,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report.cases);
    }
    Ok(())
}

async fn bench_backend(
    args: &MetaBenchArgs,
    backend: &str,
    index: OpenIndex,
    transports: &[String],
) -> Result<Vec<MetaCase>> {
    let svc = Arc::new(index.service(MetaConfig::default())?);
    let (storage, group, instance) = catalog();
    svc.put_storage(storage)?;
    svc.put_group(group)?;
    svc.register_instance(instance).await?;
    let seqs = chains(args.sequences, args.keys, 7);
    let mut cases = Vec::new();

    // Writes, one client: every chain except the last quarter.
    let split = (seqs.len() * 3 / 4).max(1);
    let mut lat = Latencies::default();
    let t0 = Start::now();
    for chain in &seqs[..split] {
        for batch in chain.chunks(args.write_batch) {
            let t = Instant::now();
            write_batch(&svc, batch).await?;
            lat.push(t.elapsed());
        }
    }
    cases.push(
        t0.measured(lat)
            .case(backend, "inproc", "write", args.write_batch),
    );

    // Writes, concurrent clients over the remaining chains.
    let rest: Vec<Vec<BlockKey>> = seqs[split..].to_vec();
    if !rest.is_empty() {
        let t0 = Start::now();
        let mut tasks = Vec::new();
        for w in 0..args.writers.max(1) {
            let svc = svc.clone();
            let mine: Vec<Vec<BlockKey>> = rest
                .iter()
                .skip(w)
                .step_by(args.writers.max(1))
                .cloned()
                .collect();
            let batch = args.write_batch;
            tasks.push(tokio::spawn(async move {
                let mut lat = Latencies::default();
                for chain in &mine {
                    for b in chain.chunks(batch) {
                        let t = Instant::now();
                        write_batch(&svc, b).await?;
                        lat.push(t.elapsed());
                    }
                }
                anyhow::Ok(lat)
            }));
        }
        let mut lat = Latencies::default();
        for t in tasks {
            lat.0.extend(t.await??.0);
        }
        cases.push(
            t0.measured(lat)
                .case(backend, "inproc", "write_concurrent", args.write_batch),
        );
    }

    // Prefix matches.
    let order: Vec<usize> = {
        let mut rng = StdRng::seed_from_u64(11);
        (0..args.rounds)
            .map(|_| rng.random_range(0..seqs.len()))
            .collect()
    };
    for transport in transports {
        eprintln!(
            "[{backend}] {} prefix matches of {} keys over {transport}",
            args.rounds, args.keys
        );
        let case = match transport.as_str() {
            "inproc" => {
                let m = match_inproc(&svc, &seqs, &order).await?;
                let floor = match_floor(&svc, &seqs, &order).await?;
                m.case(backend, "inproc", "prefix_match", args.keys)
                    .with_baseline("HashMap lookup of the same keys", floor)
                    .with_bar("p50", 50.0)
            }
            "http" => {
                let (m, floor) = meta_wire::match_http(&svc, &seqs, &order).await?;
                m.case(backend, "http", "prefix_match", args.keys)
                    .with_baseline("HTTP round trip of the same body to a no-op handler", floor)
                    .with_bar("p99", 2000.0)
            }
            "grpc" => {
                let (m, floor) = meta_wire::match_grpc(&svc, &seqs, &order).await?;
                m.case(backend, "grpc", "prefix_match", args.keys)
                    .with_baseline(
                        "gRPC round trip of the same message to a no-op service",
                        floor,
                    )
            }
            _ => unreachable!("transports were validated"),
        };
        cases.push(case);
    }
    Ok(cases)
}

async fn write_batch(svc: &MetaService, keys: &[BlockKey]) -> Result<()> {
    let grant = svc.start_write_cache(INSTANCE, keys).await?;
    if grant.blocks.is_empty() {
        return Ok(());
    }
    let ok = vec![true; grant.blocks.len()];
    svc.finish_write_cache(INSTANCE, grant.session, &ok).await?;
    Ok(())
}

async fn match_inproc(
    svc: &MetaService,
    seqs: &[Vec<BlockKey>],
    order: &[usize],
) -> Result<Measured> {
    // One warm-up pass so every backend is measured in steady state.
    for s in seqs {
        svc.get_cache_location(INSTANCE, &LocationQuery::prefix(s.clone()))
            .await?;
    }
    svc.flush_access()?;
    let mut lat = Latencies::default();
    let t0 = Start::now();
    for &i in order {
        let q = LocationQuery::prefix(seqs[i].clone());
        let t = Instant::now();
        let m = svc.get_cache_location(INSTANCE, &q).await?;
        lat.push(t.elapsed());
        if m.matched != q.keys.len() {
            bail!(
                "prefix match found {} of {} written keys",
                m.matched,
                q.keys.len()
            );
        }
    }
    t0.measured_settled(lat, || Ok(svc.flush_access().map(drop)?))
}

/// The floor: the same lookups in a `HashMap` holding the same locations.
async fn match_floor(
    svc: &MetaService,
    seqs: &[Vec<BlockKey>],
    order: &[usize],
) -> Result<Measured> {
    let mut map: HashMap<BlockKey, Arc<CacheLocation>> = HashMap::new();
    for s in seqs {
        let m = svc
            .get_cache_location(INSTANCE, &LocationQuery::prefix(s.clone()))
            .await?;
        for (k, loc) in s.iter().zip(m.locations) {
            if let Some(loc) = loc {
                map.insert(*k, loc);
            }
        }
    }
    let mut lat = Latencies::default();
    let t0 = Start::now();
    for &i in order {
        let keys = seqs[i].clone();
        let t = Instant::now();
        let found: Vec<Option<Arc<CacheLocation>>> =
            keys.iter().map(|k| map.get(k).cloned()).collect();
        let n = found.iter().take_while(|l| l.is_some()).count();
        lat.push(t.elapsed());
        std::hint::black_box(n);
    }
    Ok(t0.measured(lat))
}

fn print_table(cases: &[MetaCase]) {
    println!(
        "{:<9} {:<6} {:<17} {:>5} {:>7} {:>10} {:>10} {:>11} {:>8} {:>10} {:>7} {:>9}  bar",
        "backend",
        "via",
        "op",
        "keys",
        "ops",
        "p50 us",
        "p99 us",
        "ops/s",
        "cpu us",
        "floor p50",
        "ratio",
        "floor cpu"
    );
    for c in cases {
        let bar = c.bar.as_ref().map_or(String::new(), |b| {
            format!(
                "{} <= {} us: {}",
                b.percentile,
                b.limit_us,
                if b.met { "met" } else { "NOT met" }
            )
        });
        println!(
            "{:<9} {:<6} {:<17} {:>5} {:>7} {:>10.1} {:>10.1} {:>11.0} {:>8.1} {:>10} {:>7} {:>9}  {}",
            c.backend,
            c.transport,
            c.op,
            c.keys_per_op,
            c.ops,
            c.p50_us,
            c.p99_us,
            c.ops_per_s,
            c.cpu_us_per_op,
            c.baseline_p50_us.map_or("-".into(), |v| format!("{v:.1}")),
            c.ratio_p50.map_or("-".into(), |v| format!("{v:.2}")),
            c.baseline_cpu_us_per_op
                .map_or("-".into(), |v| format!("{v:.1}")),
            bar
        );
    }
}
