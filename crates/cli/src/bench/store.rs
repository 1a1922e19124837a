//! `kvtier bench store`: the store's tiers against their baselines.
//!
//! For each object size (128 KiB objects, 2 MiB Llama-3-8B blocks, and
//! per-layer reads of those blocks) it measures, in one run on one
//! directory: the raw io_uring baseline (sequential write, then random read)
//! and fio when installed, then the disk tier's batched writes and verified
//! reads, then memcpy and the DRAM tier's put and verified get. It prints
//! bandwidth, IOPS, p50/p99 latency, CPU per I/O and store/baseline ratios.

use anyhow::{Context, Result, bail};
use clap::Args;
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvtier_core::{BlockHash, BlockSums, Geometry, IoEngineKind, ModelPreset, RegionEvictionKind};
use kvtier_disk::{DiskTier, DiskTierConfig, RegionLayout, WriteOpBytes};
use kvtier_io::{AlignedBuf, DioAlignment, DmaSource, FileId, IoBatch, IoEngine, IoKind, IoOp};
use kvtier_mem::{MemoryTier, MemoryTierConfig};
use kvtier_tier::BlockPut;

use super::baseline::{self, CopyPattern, Pattern};
use super::measure::{Case, Latencies, Rounds, Run, kvtier_first, process_cpu_time};

mod runs;

/// Arguments of `kvtier bench store`.
#[derive(Args)]
pub struct StoreBenchArgs {
    /// Directory to benchmark (put it on the device you care about).
    /// Default: a fresh directory under the system temp dir.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Bytes moved per case and direction, e.g. 1GiB.
    #[arg(long, default_value = "1GiB")]
    size: String,
    /// Operations in flight.
    #[arg(long, default_value_t = 32)]
    queue_depth: u32,
    /// I/O engine of the store: auto, io_uring or psync.
    #[arg(long, default_value = "auto")]
    io_engine: String,
    /// Tiny sizes for a smoke run (CI).
    #[arg(long)]
    quick: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Skip fio even if it is installed.
    #[arg(long)]
    no_fio: bool,
    /// Rounds per case: each runs the baseline (raw io_uring, fio, memcpy)
    /// and kvtier on its share of the bytes, kvtier last in even rounds and
    /// first in odd ones (disk cases). Ratios are the median of the rounds'
    /// ratios, with min and max, so a disk whose speed drifts falls on both
    /// sides.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u64).range(1..=1000))]
    rounds: u64,
    /// Run only these groups of cases (comma-separated): engine, disk_128k,
    /// disk_2m, dram_128k, dram_2m. Default: all.
    #[arg(long, value_delimiter = ',', value_parser = ["engine", "disk_128k", "disk_2m", "dram_128k", "dram_2m"])]
    only: Vec<String>,
    /// Blocks per run in the run-layer case of 2 MiB blocks: each read asks
    /// for one layer of this many blocks on adjacent slots, as a prefix hit
    /// loads blocks that were offloaded together.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1024))]
    run_blocks: u64,
    /// Back the I/O buffers of the raw loop and of kvtier (read targets,
    /// write sources) with transparent huge pages: one device segment per
    /// 2 MiB instead of per 4 KiB page. fio keeps its own buffers.
    #[arg(long)]
    huge_pages: bool,
    /// Largest write op of the disk tier (`[disk] write_op_bytes`): a
    /// size, or auto (1MiB with `--huge-pages`, else 128KiB, as the node
    /// chooses by its arena's pages).
    #[arg(long, default_value = "auto")]
    write_op_size: String,
    /// Region layout of the disk tier's lives: block (each block
    /// contiguous) or layer (each layer of a region's blocks contiguous).
    #[arg(long, default_value = "block", value_parser = ["block", "layer"])]
    disk_layout: String,
}

struct Plan {
    dir: PathBuf,
    bytes: u64,
    qd: u32,
    region_size: u64,
    use_fio: bool,
    dram_pool: usize,
    rounds: u64,
    run_blocks: usize,
    layout: RegionLayout,
    write_op_bytes: u64,
    pages: baseline::Pages,
}

/// `--write-op-size` for buffers of huge pages or not.
fn write_op_bytes(arg: &str, huge_pages: bool) -> Result<u64> {
    let setting = match arg {
        "auto" => WriteOpBytes::Auto,
        size => WriteOpBytes::Set(size.parse().context("--write-op-size")?),
    };
    let page_bytes = if huge_pages { 2 << 20 } else { 4096 };
    Ok(setting.resolve(page_bytes))
}

/// Runs the benchmark.
pub fn run(args: StoreBenchArgs) -> Result<()> {
    let bytes: u64 = if args.quick {
        16 << 20
    } else {
        args.size
            .parse::<kvtier_core::ByteSize>()
            .context("--size")?
            .bytes()
    };
    let engine_kind = match args.io_engine.as_str() {
        "auto" => IoEngineKind::Auto,
        "io_uring" | "uring" => IoEngineKind::IoUring,
        "psync" => IoEngineKind::Psync,
        other => bail!("unknown --io-engine {other:?}: use auto, io_uring or psync"),
    };
    let owned_tmp;
    let dir = match args.dir {
        Some(d) => d,
        None => {
            owned_tmp = std::env::temp_dir().join(format!("kvtier-bench-{}", std::process::id()));
            owned_tmp
        }
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let plan = Plan {
        dir: dir.clone(),
        bytes: bytes.max(8 << 20),
        qd: args.queue_depth.max(1),
        region_size: if args.quick { 4 << 20 } else { 64 << 20 },
        use_fio: !args.no_fio && !args.quick,
        dram_pool: if args.quick { 16 << 20 } else { 1 << 30 },
        rounds: args.rounds,
        // A quick run's few regions hold a few blocks each.
        run_blocks: if args.quick {
            2
        } else {
            args.run_blocks as usize
        },
        write_op_bytes: write_op_bytes(&args.write_op_size, args.huge_pages)?,
        layout: match args.disk_layout.as_str() {
            "layer" => RegionLayout::Layer,
            _ => RegionLayout::Block,
        },
        pages: baseline::Pages::from_flag(args.huge_pages),
    };
    let engine =
        kvtier_io::build_engine(engine_kind, plan.qd, 8).context("building the I/O engine")?;
    if !args.json {
        eprintln!(
            "kvtier bench store: dir {}, {} MiB per case in {} rounds, queue depth {}, engine {}, disk layout {}",
            dir.display(),
            plan.bytes >> 20,
            plan.rounds,
            plan.qd,
            engine.name(),
            args.disk_layout
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut cases = Vec::new();
    let wanted = |group: &str| args.only.is_empty() || args.only.iter().any(|g| g == group);
    if wanted("engine") {
        let shapes = [
            (4u64 << 10, OpShape::Plain),
            (128 << 10, OpShape::Plain),
            // The plain 1 MiB read is what the vectored ones are held to.
            (1 << 20, OpShape::Plain),
            (1 << 20, OpShape::Scattered { registered: true }),
            (1 << 20, OpShape::Scattered { registered: false }),
        ];
        for (object, shape) in shapes {
            let case = engine_case(&plan, engine.clone(), object, shape, !args.json);
            cases.push(rt.block_on(case)?);
        }
    }
    let obj128 = Geometry::raw(1, 128 << 10)?;
    let llama = ModelPreset::Llama3_8B.geometry(16);
    for (label, geometry) in [("128k", obj128), ("2m", llama)] {
        if wanted(&format!("disk_{label}")) {
            cases.extend(rt.block_on(disk_cases(
                &plan,
                engine.clone(),
                label,
                geometry,
                !args.json,
            ))?);
        }
        if wanted(&format!("dram_{label}")) {
            cases.extend(dram_cases(&plan, label, geometry, !args.json)?);
        }
    }
    let _ = std::fs::remove_dir_all(dir.join("bench-disk"));
    if args.json {
        let out = serde_json::json!({
            "dir": dir.display().to_string(),
            "engine": engine.name(),
            "queue_depth": plan.qd,
            "bytes_per_case": plan.bytes,
            "rounds": plan.rounds,
            "disk_layout": args.disk_layout,
            "huge_pages": args.huge_pages,
            "write_op_bytes": plan.write_op_bytes,
            "cases": cases,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_table(&cases);
    }
    Ok(())
}

fn progress(show: bool, what: &str) {
    if show {
        eprintln!("  running {what} ...");
    }
}

/// What the read cases of one geometry share: the tier, the raw loop's
/// file and the bytes written to it (the tier's own data file), and fio.
struct ReadBench<'a> {
    tier: &'a DiskTier,
    engine: &'a dyn IoEngine,
    raw: baseline::RawFile<'a>,
    fio: &'a dyn Fn(u64) -> Option<baseline::FioResult>,
    qd: u32,
    rounds: u64,
}

impl ReadBench<'_> {
    /// `rounds` rounds of `ops` random reads of what `pick` draws, each by
    /// the raw loop (objects of the same size), by fio and by the tier,
    /// kvtier first in odd rounds. With `per_target`, each round also runs
    /// the raw loop over single targets (`targets.len` bytes) for the same
    /// bytes: the second `Rounds`.
    async fn rounds(
        &self,
        pick: &Pick,
        targets: &mut ReadTargets,
        ops: u64,
        per_target: bool,
    ) -> Result<(Rounds, Rounds)> {
        let per_object = pick.blocks_per_object() as u64;
        let object = targets.len as u64 * per_object;
        let (mut out, mut small) = (Rounds::default(), Rounds::default());
        for r in 0..self.rounds {
            let first = match kvtier_first(r) {
                true => Some(read_side(self.tier, pick, targets, self.qd, ops, r).await?),
                false => None,
            };
            let base = baseline::uring(&self.raw, object, self.qd, ops, Pattern::RandRead, r)?;
            let pieces = match per_target {
                true => Some(baseline::uring(
                    &self.raw,
                    targets.len as u64,
                    self.qd,
                    ops * per_object,
                    Pattern::RandRead,
                    r,
                )?),
                false => None,
            };
            let fio_round = (self.fio)(object);
            let ours = match first {
                Some(ours) => ours,
                None => read_side(self.tier, pick, targets, self.qd, ops, r).await?,
            };
            if let Some(pieces) = pieces {
                small.add(pieces, ours.clone(), None);
            }
            out.add(base, ours, fio_round);
        }
        Ok((out, small))
    }
}

/// What each read batch asks the tier for.
#[derive(Clone)]
enum Pick {
    /// Whole blocks, drawn at random.
    Blocks(Arc<Vec<BlockHash>>),
    /// One random layer (of this many) of blocks drawn at random.
    Layers(Arc<Vec<BlockHash>>, u32),
    /// One random layer (of this many) of runs drawn at random, each run
    /// blocks on adjacent slots.
    RunLayers(Arc<Vec<Vec<BlockHash>>>, u32),
}

impl Pick {
    /// Blocks per object: what one operation of the raw loop stands for.
    fn blocks_per_object(&self) -> usize {
        match self {
            Pick::RunLayers(runs, _) => runs.first().map_or(1, Vec::len),
            Pick::Blocks(_) | Pick::Layers(..) => 1,
        }
    }

    /// `objects` random objects: their blocks' keys, and the layer to read
    /// (`None`: whole blocks).
    fn draw(&self, rng: &mut StdRng, objects: usize) -> (Vec<BlockHash>, Option<u32>) {
        match self {
            Pick::Blocks(keys) => {
                let keys = (0..objects)
                    .map(|_| keys[rng.random_range(0..keys.len())])
                    .collect();
                (keys, None)
            }
            Pick::Layers(keys, layers) => {
                let layer = rng.random_range(0..*layers);
                let keys = (0..objects)
                    .map(|_| keys[rng.random_range(0..keys.len())])
                    .collect();
                (keys, Some(layer))
            }
            Pick::RunLayers(runs, layers) => {
                let layer = rng.random_range(0..*layers);
                let keys = (0..objects)
                    .flat_map(|_| runs[rng.random_range(0..runs.len())].iter().copied())
                    .collect();
                (keys, Some(layer))
            }
        }
    }
}

/// Disk cases for one geometry: write, read, and (for layered blocks)
/// per-layer reads. Each is measured in `plan.rounds` rounds of baseline
/// (raw io_uring, then fio when installed) and kvtier, alternating, on the
/// same directory.
async fn disk_cases(
    plan: &Plan,
    engine: Arc<dyn IoEngine>,
    label: &str,
    geometry: Geometry,
    show: bool,
) -> Result<Vec<Case>> {
    let block = geometry.block_bytes();
    let rounds = plan.rounds;
    let nblocks = (plan.bytes / block).max(plan.qd as u64 * rounds);
    let data_bytes = nblocks * block;
    let qd = plan.qd;
    let per_round = nblocks / rounds;
    let layer = geometry.layer_bytes();
    let layered = geometry.layers > 1;

    // The baseline's plain file and the disk tier, side by side.
    let base_path = plan.dir.join(format!("baseline-{label}.dat"));
    let file = baseline::open_direct_file(&base_path, data_bytes)?;
    let tier_dir = plan.dir.join("bench-disk").join(label);
    let _ = std::fs::remove_dir_all(&tier_dir);
    std::fs::create_dir_all(&tier_dir)?;
    let region = plan.region_size.max(block * 4 + (64 << 10));
    let capacity = ((data_bytes * 5 / 4) / region + 4) * region;
    let cfg = DiskTierConfig {
        dirs: vec![tier_dir.clone()],
        capacity_per_dir: capacity,
        region_size: region,
        geometry,
        eviction: RegionEvictionKind::Fifo,
        reinsert_hot: false,
        checkpoint_interval: Duration::ZERO,
        sync: false,
        register_buffers: true,
        reset: true,
        buffers_per_dir: 2,
        layer_sums_cache: 16384,
        write_op_bytes: plan.write_op_bytes,
        layout: plan.layout,
        prefill: true,
    };
    let tier = DiskTier::open(cfg, engine.clone()).context("opening the disk tier")?;

    // Source blocks: a few distinct buffers cycled over many keys; sums are
    // computed up front (the store carries them; it does not hash on write).
    // Pieces of one registered pool, as the node writes demoted blocks from
    // its one registered arena.
    let sources: Vec<Arc<dyn DmaSource>> =
        Piece::pool(engine.as_ref(), block as usize, 8, plan.pages)
            .into_iter()
            .enumerate()
            .map(|(s, piece)| {
                // SAFETY: the piece is ours alone until it becomes a source.
                let bytes =
                    unsafe { std::slice::from_raw_parts_mut(piece.at as *mut u8, piece.len) };
                for (i, x) in bytes.iter_mut().enumerate() {
                    *x = (i as u8).wrapping_mul(31) ^ s as u8;
                }
                Arc::new(piece) as Arc<dyn DmaSource>
            })
            .collect();
    let keys: Vec<BlockHash> = (0..nblocks)
        .map(|i| BlockHash(0xb10c_0000_0000 + i as u128))
        .collect();
    let sums: Vec<BlockSums> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| BlockSums::compute(*k, layer as usize, sources[i % sources.len()].bytes()))
        .collect();
    let src = WriteSource {
        keys: Arc::new(keys),
        sources: Arc::new(sources),
        sums: Arc::new(sums),
    };

    // fio writes the baseline's file, in the same round as the others.
    let fio_write = |obj: u64| {
        plan.use_fio
            .then(|| {
                baseline::fio(
                    &base_path,
                    data_bytes,
                    obj,
                    qd,
                    Pattern::SeqWrite,
                    per_round * block,
                )
            })
            .flatten()
    };
    let fio_note = if plan.use_fio { ", fio" } else { "" };
    progress(
        show,
        &format!("sequential writes {label}: raw io_uring{fio_note} vs disk tier"),
    );
    let raw = baseline::RawFile {
        file: &file,
        size: data_bytes,
        pages: plan.pages,
    };
    // Against the raw loop's plain writes, and against the same loop with a
    // header write beside each block, as the tier writes block-major slots.
    let (mut writes, mut headered) = (Rounds::default(), Rounds::default());
    for r in 0..rounds {
        let range = (r * per_round) as usize..((r + 1) * per_round) as usize;
        let first = match kvtier_first(r) {
            true => Some(write_side(&tier, &src, range.clone(), qd).await?),
            false => None,
        };
        let first_op = r * per_round;
        let base = baseline::uring(&raw, block, qd, per_round, Pattern::SeqWrite, first_op)?;
        let with_headers = baseline::uring(
            &raw,
            block,
            qd,
            per_round,
            Pattern::SeqWriteHeadered,
            first_op,
        )?;
        let fio_round = fio_write(block);
        let ours = match first {
            Some(ours) => ours,
            None => write_side(&tier, &src, range, qd).await?,
        };
        headered.add(with_headers, ours.clone(), None);
        writes.add(base, ours, fio_round);
    }
    progress(
        show,
        &format!("random reads {label}: raw io_uring{fio_note} vs disk tier"),
    );
    let written = &src.keys[..(rounds * per_round) as usize];
    // Reads, raw and fio alike, go to the disk tier's own data file, over
    // the regions it wrote: the same bytes of the same file for every side.
    // (Separate files let the host's cache under this VM's virtio disk
    // favour whichever file fio had just read for seconds: 2 MiB reads came
    // out at 0.52 of a raw loop over the baseline's file.)
    let read_path = tier.data_file(0).context("the disk tier's data file")?;
    let read_bytes = tier.stats().region_bytes_used;
    let read_file = baseline::open_direct_read(&read_path)?;
    let fio_read = |obj: u64| {
        plan.use_fio
            .then(|| {
                baseline::fio(
                    &read_path,
                    read_bytes,
                    obj,
                    qd,
                    Pattern::RandRead,
                    per_round * block,
                )
            })
            .flatten()
    };
    let bench = ReadBench {
        tier: &tier,
        engine: engine.as_ref(),
        raw: baseline::RawFile {
            file: &read_file,
            size: read_bytes,
            pages: plan.pages,
        },
        fio: &fio_read,
        qd,
        rounds,
    };
    let written = Arc::new(written.to_vec());
    let mut block_targets =
        ReadTargets::new(engine.as_ref(), block as usize, batch_of(qd), plan.pages);
    let (reads, _) = bench
        .rounds(
            &Pick::Blocks(written.clone()),
            &mut block_targets,
            per_round,
            false,
        )
        .await?;
    let batches = format!("{WRITERS} concurrent batches of {}", batch_of(qd));
    let mut out = vec![
        writes.case(
            &format!("disk_write_{label}"),
            block,
            qd,
            baseline::uring_name(Pattern::SeqWrite),
            format!("disk tier put_batch ({batches})"),
        ),
        headered.case(
            &format!("disk_write_{label}_vs_headered"),
            block,
            qd,
            baseline::uring_name(Pattern::SeqWriteHeadered),
            format!("disk tier put_batch ({batches})"),
        ),
        reads.case(
            &format!("disk_read_{label}"),
            block,
            qd,
            baseline::uring_name(Pattern::RandRead),
            format!("disk tier get_batch, verified ({batches})"),
        ),
    ];
    if layered {
        progress(
            show,
            &format!(
                "random {layer}-byte layer reads {label}: raw io_uring{fio_note} vs disk tier"
            ),
        );
        // As many bytes as the other cases: every layer of every block, in
        // random order.
        let layer_ops = per_round * geometry.layers as u64;
        let mut layer_targets =
            ReadTargets::new(engine.as_ref(), layer as usize, batch_of(qd), plan.pages);
        let pick = Pick::Layers(written.clone(), geometry.layers);
        let (layer_reads, _) = bench
            .rounds(&pick, &mut layer_targets, layer_ops, false)
            .await?;
        out.push(layer_reads.case(
            &format!("disk_read_layer_{label}"),
            layer,
            qd,
            baseline::uring_name(Pattern::RandRead),
            format!("disk tier read_layers, verified ({batches})"),
        ));
        progress(
            show,
            &format!(
                "layer reads of runs of {} adjacent blocks {label}: raw io_uring{fio_note} vs disk tier",
                plan.run_blocks
            ),
        );
        out.extend(
            runs::run_layer_cases(
                &bench,
                &written,
                geometry,
                label,
                plan.run_blocks,
                layer_ops,
            )
            .await?,
        );
    }
    drop(file);
    let _ = std::fs::remove_file(&base_path);
    let _ = tier.close().await;
    Ok(out)
}

/// How each op of an engine case names its memory.
#[derive(Debug, Clone, Copy)]
enum OpShape {
    /// One buffer of the object's size (`engine_read_*`).
    Plain,
    /// One vectored read of the object into [`SEGMENTS`] 64 KiB segments
    /// scattered over the buffer pool, none adjacent (`engine_readv_*`): as
    /// a layer-major load fills separate arena slots. In registered memory
    /// (`READV_FIXED` on 6.15+) or, `_unreg`, not (`READV`, pages pinned
    /// per op).
    Scattered {
        /// Whether the pool is registered with the engine.
        registered: bool,
    },
}

/// Segments per op of [`OpShape::Scattered`].
const SEGMENTS: usize = 16;

impl OpShape {
    /// The case's name for `label` (`4k`, `1m`, ...).
    fn name(self, label: &str) -> String {
        match self {
            OpShape::Plain => format!("engine_read_{label}"),
            OpShape::Scattered { registered: true } => format!("engine_readv_{label}"),
            OpShape::Scattered { registered: false } => format!("engine_readv_{label}_unreg"),
        }
    }

    /// How kvtier's side of the case reads, for the JSON's `what`.
    fn what(self, engine: &str, qd: u32) -> String {
        let batches = format!(
            "kvtier {engine} engine, {WRITERS} concurrent batches of {}",
            batch_of(qd)
        );
        match self {
            OpShape::Plain => batches,
            OpShape::Scattered { registered } => format!(
                "{batches} readv ops, each into {SEGMENTS} scattered {} KiB {} targets",
                64,
                if registered {
                    "registered"
                } else {
                    "unregistered"
                }
            ),
        }
    }

    /// The buffer pool for `pieces` ops of `object` bytes: one piece per op,
    /// or [`SEGMENTS`] per op for vectored reads.
    fn pool(self, pieces: usize, object: usize) -> BufferPool {
        match self {
            OpShape::Plain => BufferPool::new(pieces, object),
            OpShape::Scattered { .. } => BufferPool::new(pieces * SEGMENTS, object / SEGMENTS),
        }
    }

    /// Adds a read of `object` bytes at `offset` into op slot `slot` of
    /// `pool`, whose `slots` op slots are shared out among the workers.
    fn push(
        self,
        b: &mut IoBatch,
        (id, offset, object): (FileId, u64, usize),
        pool: &BufferPool,
        (slot, slots): (usize, usize),
        align: DioAlignment,
    ) -> Result<()> {
        if let OpShape::Scattered { .. } = self {
            let seg = object / SEGMENTS;
            // Segment `s` of slot `slot` is piece `s * slots + slot`: one
            // op's segments lie `slots` pieces apart, never adjacent.
            let segs = (0..SEGMENTS).map(|s| (pool.slice(s * slots + slot, seg), seg));
            // SAFETY: the pieces are the worker's own (see `engine_case`),
            // reused only after this batch completes; the batch keeps the
            // pool alive.
            unsafe { b.push_vectored(IoKind::ReadV, id, offset, segs, Some(align)) }?;
            return Ok(());
        }
        let op = IoOp {
            kind: IoKind::Read,
            file: id,
            offset,
            buf: pool.slice(slot, object),
            len: object as u32,
        };
        // SAFETY: as above.
        unsafe { b.push(op) };
        Ok(())
    }
}

/// kvtier's I/O engine alone (submit + complete, no copy, no checksum)
/// against the raw io_uring loop: random reads of `object` bytes, in
/// alternating rounds, each op shaped as `shape` says (the raw loop always
/// reads `object` bytes into one registered buffer). This is the control
/// cost per I/O that the "<= 5 us CPU per I/O at queue depth >= 32" bar is
/// about; the disk cases add the tier's own work (copies, verification) on
/// top.
async fn engine_case(
    plan: &Plan,
    engine: Arc<dyn IoEngine>,
    object: u64,
    shape: OpShape,
    show: bool,
) -> Result<Case> {
    let label = if object >= 1 << 20 {
        format!("{}m", object >> 20)
    } else {
        format!("{}k", object >> 10)
    };
    progress(
        show,
        &format!("random {label} reads: raw io_uring vs kvtier's I/O engine ({shape:?})"),
    );
    let ops = (plan.bytes / object).clamp(plan.qd as u64 * plan.rounds, 200_000);
    let size = (ops * object).max(64 << 20);
    let path = plan.dir.join(format!("engine-{label}.dat"));
    let file = baseline::open_direct_file(&path, size)?;
    let raw = baseline::RawFile {
        file: &file,
        size,
        pages: plan.pages,
    };
    // Written once so reads hit real data, not unwritten extents.
    baseline::uring(&raw, 1 << 20, plan.qd, size >> 20, Pattern::SeqWrite, 0)?;
    let id = engine.register_file(file.try_clone()?)?;
    let align = kvtier_io::dio_alignment(&path);
    let per_round = ops / plan.rounds;
    let pool = Arc::new(shape.pool(WRITERS * batch_of(plan.qd), object as usize));
    // Registered with the engine like the baseline's buffers (unless the
    // case is about unregistered targets).
    if !matches!(shape, OpShape::Scattered { registered: false }) {
        // SAFETY: the pool is leaked below (never freed), so the range
        // outlives the engine.
        let registered = unsafe { engine.register_memory(pool.base(), pool.len()) };
        if !registered && engine.name() != "psync" {
            eprintln!("warning: kvtier's engine did not register the buffers; it used plain I/O");
        }
    }
    let mut rounds = Rounds::default();
    for r in 0..plan.rounds {
        let base = baseline::uring(&raw, object, plan.qd, per_round, Pattern::RandRead, r)?;
        let reads = EngineReads {
            id,
            object,
            slots: size / object,
            align,
            shape,
        };
        let ours = reads
            .run(&engine, &pool, per_round as usize, plan.qd, r)
            .await?;
        rounds.add(base, ours, None);
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    // The engine may use registered memory for its whole life.
    std::mem::forget(pool);
    Ok(rounds.case(
        &shape.name(&label),
        object,
        plan.qd,
        baseline::uring_name(Pattern::RandRead),
        shape.what(engine.name(), plan.qd),
    ))
}

/// kvtier's side of one round of an engine case: random reads of `object`
/// bytes of file `id` (`slots` objects long).
#[derive(Debug, Clone, Copy)]
struct EngineReads {
    id: FileId,
    object: u64,
    slots: u64,
    align: DioAlignment,
    shape: OpShape,
}

impl EngineReads {
    /// Runs `ops` reads from [`WRITERS`] tasks, each submitting batches of
    /// [`batch_of`]`(qd)` into its own op slots of `pool`, and times them.
    async fn run(
        self,
        engine: &Arc<dyn IoEngine>,
        pool: &Arc<BufferPool>,
        ops: usize,
        qd: u32,
        round: u64,
    ) -> Result<Run> {
        let per_worker = ops / WRITERS;
        let cpu0 = process_cpu_time();
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..WRITERS {
            let (engine, pool) = (engine.clone(), pool.clone());
            let seed = round * 100 + w as u64;
            tasks.push(tokio::spawn(async move {
                self.worker(&*engine, &pool, (w, per_worker), qd, seed)
                    .await
            }));
        }
        let mut lat = Latencies::default();
        for t in tasks {
            lat.0.extend(t.await??.0);
        }
        let n = (per_worker * WRITERS) as u64;
        Ok(Run {
            bytes: n * self.object,
            ops: n,
            wall: t0.elapsed(),
            cpu: process_cpu_time() - cpu0,
            lat,
        })
    }

    /// Worker `w`'s `n` reads, in batches into op slots
    /// `[w * batch, (w + 1) * batch)` of `pool`.
    async fn worker(
        self,
        engine: &dyn IoEngine,
        pool: &Arc<BufferPool>,
        (w, n): (usize, usize),
        qd: u32,
        seed: u64,
    ) -> Result<Latencies> {
        let batch = batch_of(qd);
        let slots = WRITERS * batch;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut lat = Latencies::default();
        let mut done = 0;
        while done < n {
            let k = batch.min(n - done);
            let mut b = IoBatch::with_capacity(k);
            for i in 0..k {
                let offset = rng.random_range(0..self.slots) * self.object;
                let at = (self.id, offset, self.object as usize);
                self.shape
                    .push(&mut b, at, pool, (w * batch + i, slots), self.align)?;
            }
            b.keep_alive(pool.clone());
            let t = Instant::now();
            let res = engine.submit(b).await;
            lat.push_n(t.elapsed(), k);
            res.check()?;
            done += k;
        }
        Ok(lat)
    }
}

/// One aligned allocation cut into equal pieces, shared by I/O batches.
struct BufferPool {
    base: usize,
    len: usize,
    _mem: AlignedBuf,
}

impl BufferPool {
    fn new(pieces: usize, piece: usize) -> Self {
        let mut mem = AlignedBuf::zeroed(pieces * piece, 4096);
        BufferPool {
            base: mem.as_mut_ptr() as usize,
            len: pieces * piece,
            _mem: mem,
        }
    }
    fn base(&self) -> *mut u8 {
        self.base as *mut u8
    }
    fn len(&self) -> usize {
        self.len
    }
    /// Start of piece `i` of `piece` bytes.
    fn slice(&self, i: usize, piece: usize) -> *mut u8 {
        assert!((i + 1) * piece <= self.len);
        (self.base + i * piece) as *mut u8
    }
}

/// Concurrent batches the kvtier side keeps in flight; each holds
/// [`batch_of`]`(qd)` blocks, so as many bytes are in flight as in the
/// baseline (`qd` objects).
const WRITERS: usize = 8;

fn batch_of(qd: u32) -> usize {
    (qd as usize / WRITERS).max(1)
}

/// What the write rounds draw from.
struct WriteSource {
    keys: Arc<Vec<BlockHash>>,
    /// Written straight from (pinned), as the node writes from its arena.
    sources: Arc<Vec<Arc<dyn DmaSource>>>,
    sums: Arc<Vec<BlockSums>>,
}

/// Writes blocks `range` of `src` through the disk tier with [`WRITERS`]
/// concurrent `put_batch` calls.
async fn write_side(
    tier: &DiskTier,
    src: &WriteSource,
    range: std::ops::Range<usize>,
    qd: u32,
) -> Result<Run> {
    let batch = batch_of(qd);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(range.start));
    let cpu0 = process_cpu_time();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let (tier, next, end) = (tier.clone(), next.clone(), range.end);
        let (keys, sources, sums) = (src.keys.clone(), src.sources.clone(), src.sums.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Latencies::default();
            loop {
                let first = next.fetch_add(batch, std::sync::atomic::Ordering::Relaxed);
                if first >= end {
                    return Ok::<_, anyhow::Error>(lat);
                }
                let last = (first + batch).min(end);
                let puts: Vec<BlockPut<'_>> = (first..last)
                    .map(|i| BlockPut {
                        key: keys[i],
                        data: sources[i % sources.len()].bytes(),
                        sums: &sums[i],
                        pinned: Some(&sources[i % sources.len()]),
                    })
                    .collect();
                let t = Instant::now();
                let res = tier.put_batch(&puts).await;
                lat.push_n(t.elapsed(), puts.len());
                if let Some(Err(e)) = res.into_iter().find(|r| r.is_err()) {
                    bail!("disk tier write failed: {e}");
                }
            }
        }));
    }
    let mut lat = Latencies::default();
    for t in tasks {
        lat.0.extend(t.await??.0);
    }
    let n = range.len() as u64;
    Ok(Run {
        bytes: n * tier.geometry().block_bytes(),
        ops: n,
        wall: t0.elapsed(),
        cpu: process_cpu_time() - cpu0,
        lat,
    })
}

/// The read side's targets: `len`-byte pieces of one registered buffer
/// per worker, as arena slots are pieces of the node's one registered
/// shared-memory arena (reads land in arena slots there, and a vectored
/// read over several of them can use the registered-buffer opcode).
struct ReadTargets {
    len: usize,
    per_worker: Vec<Vec<Piece>>,
}

impl ReadTargets {
    /// `count` registered targets of `len` bytes for each of the
    /// [`WRITERS`] workers.
    fn new(engine: &dyn IoEngine, len: usize, count: usize, pages: baseline::Pages) -> Self {
        let per_worker = (0..WRITERS)
            .map(|_| Piece::pool(engine, len, count, pages))
            .collect();
        ReadTargets { len, per_worker }
    }
}

/// `len` bytes at `at` of a leaked pool, disjoint from every other piece:
/// a read target, or (once filled) a write source.
struct Piece {
    at: usize,
    len: usize,
}

impl Piece {
    /// `count` pieces of `len` bytes of one new pool of `pages`,
    /// registered with `engine`.
    fn pool(engine: &dyn IoEngine, len: usize, count: usize, pages: baseline::Pages) -> Vec<Piece> {
        let mut pool = pages.buf(len * count);
        let base = pool.as_mut_ptr();
        // SAFETY: the pool is leaked right here, so the range outlives the
        // engine, which may use registered memory for its whole life.
        unsafe { engine.register_memory(base, pool.len()) };
        std::mem::forget(pool);
        (0..count)
            .map(|i| Piece {
                at: base as usize + i * len,
                len,
            })
            .collect()
    }
}

// SAFETY: the memory is a piece of a leaked allocation (it never moves or
// goes away), no other `Piece` overlaps it, and only the holder of the
// `Piece` reads or writes it.
unsafe impl kvtier_io::DmaTarget for Piece {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.at as *mut u8
    }
    fn len(&self) -> usize {
        self.len
    }
}

// SAFETY: as above; a piece made a source is filled first and never
// written again.
unsafe impl DmaSource for Piece {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes at `at`, alive for ever (leaked).
        unsafe { std::slice::from_raw_parts(self.at as *const u8, self.len) }
    }
}

/// `ops` random verified reads of objects that `pick` draws through the
/// disk tier, [`WRITERS`] concurrent batches of [`batch_of`]`(qd)` objects.
async fn read_side(
    tier: &DiskTier,
    pick: &Pick,
    targets: &mut ReadTargets,
    qd: u32,
    ops: u64,
    seed: u64,
) -> Result<Run> {
    let per_batch = batch_of(qd);
    let per_worker = ops as usize / WRITERS;
    let per_object = pick.blocks_per_object();
    let len = targets.len;
    let cpu0 = process_cpu_time();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for (w, mut bufs) in targets.per_worker.drain(..).enumerate() {
        let (tier, pick) = (tier.clone(), pick.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed * 1000 + w as u64 + 1);
            let mut lat = Latencies::default();
            let (mut done, mut misses) = (0usize, 0usize);
            while done < per_worker {
                let n = per_batch.min(per_worker - done);
                let (keys, layer) = pick.draw(&mut rng, n);
                let reqs: Vec<(BlockHash, Piece)> =
                    keys.into_iter().zip(bufs.drain(..n * per_object)).collect();
                let t = Instant::now();
                let res = match layer {
                    Some(l) => tier.read_layers(reqs, l..l + 1).await,
                    None => tier.get_batch(reqs).await,
                };
                lat.push_n(t.elapsed(), n);
                for (b, lookup) in res {
                    misses += usize::from(!lookup.is_hit());
                    bufs.push(b);
                }
                done += n;
            }
            (lat, misses, bufs)
        }));
    }
    let mut lat = Latencies::default();
    let mut misses = 0;
    for t in tasks {
        let (l, m, bufs) = t.await?;
        lat.0.extend(l.0);
        misses += m;
        targets.per_worker.push(bufs);
    }
    if misses > 0 {
        bail!("{misses} reads missed or failed verification in the benchmark");
    }
    let n = (per_worker * WRITERS) as u64;
    Ok(Run {
        bytes: n * (per_object * len) as u64,
        ops: n,
        wall: t0.elapsed(),
        cpu: process_cpu_time() - cpu0,
        lat,
    })
}

/// DRAM cases: memcpy vs the memory tier's put (copy into a shared-memory
/// slot) and verified get (copy out while checking checksums).
fn dram_cases(plan: &Plan, label: &str, geometry: Geometry, show: bool) -> Result<Vec<Case>> {
    let block = geometry.block_bytes() as usize;
    // A pool well past the last-level cache (so both sides copy from DRAM),
    // unless the run is small.
    let pool = plan.dram_pool.min(plan.bytes as usize).max(block * 4);
    let nslots = pool / block;
    let ops = ((plan.bytes as usize / block).max(nslots * 2)) as u64;
    let rounds = plan.rounds;
    let per_round = ops.div_ceil(rounds);
    progress(show, &format!("memcpy baseline {label}"));
    let mut memcpy = baseline::Memcpy::new(block, pool);
    let name = format!("kvtier-bench-{}-{label}", std::process::id());
    let cfg = MemoryTierConfig {
        shm_name: name,
        capacity_bytes: (nslots * geometry.block_bytes() as usize) as u64,
        block_bytes: block,
        layer_bytes: geometry.layer_bytes() as usize,
        hugepages: false,
        table_key: None,
        access_group: None,
    };
    let mem = MemoryTier::create(cfg).context("creating the memory tier")?;
    let nslots = mem.capacity_blocks();
    let src: Vec<u8> = (0..block).map(|i| (i as u8).wrapping_mul(13)).collect();
    let keys: Vec<BlockHash> = (0..nslots as u128)
        .map(|i| BlockHash(0xd7a0_0000 + i))
        .collect();
    let sums: Vec<BlockSums> = keys
        .iter()
        .map(|k| BlockSums::compute(*k, geometry.layer_bytes() as usize, &src))
        .collect();
    // Warm the arena once (first touch of shared memory is not what we measure).
    for (k, s) in keys.iter().zip(&sums) {
        mem.put(*k, &src, s)?;
    }
    progress(show, &format!("memcpy vs memory tier put {label}"));
    let mut puts = Rounds::default();
    for r in 0..rounds {
        let base = memcpy.run(per_round, CopyPattern::Scatter, r * per_round);
        let ours = timed_run(r * per_round..(r + 1) * per_round, block as u64, |i| {
            let k = keys[i % nslots];
            mem.remove(k);
            let t = Instant::now();
            mem.put(k, &src, &sums[i % nslots])?;
            Ok(t.elapsed())
        })?;
        puts.add(base, ours, None);
    }
    progress(show, &format!("memcpy vs memory tier verified get {label}"));
    let mut dst = AlignedBuf::zeroed(block, 4096);
    let mut gets = Rounds::default();
    for r in 0..rounds {
        let base = memcpy.run(per_round, CopyPattern::Gather, r * per_round);
        let ours = timed_run(r * per_round..(r + 1) * per_round, block as u64, |i| {
            let t = Instant::now();
            let l = mem.get(keys[(i * 7919) % nslots], &mut dst);
            let took = t.elapsed();
            if !l.is_hit() {
                bail!("memory tier get missed in the benchmark");
            }
            Ok(took)
        })?;
        gets.add(base, ours, None);
    }
    Ok(vec![
        puts.case(
            &format!("dram_put_{label}"),
            block as u64,
            1,
            baseline::Memcpy::name(CopyPattern::Scatter),
            "memory tier put (copy into shared memory)",
        ),
        gets.case(
            &format!("dram_get_{label}"),
            block as u64,
            1,
            baseline::Memcpy::name(CopyPattern::Gather),
            "memory tier get (verified copy)",
        ),
    ])
}

/// Runs `op(i)` for every `i` in `range`, each moving `bytes_per_op`, and
/// returns the totals; `op` returns the latency of the part it times.
fn timed_run(
    range: std::ops::Range<u64>,
    bytes_per_op: u64,
    mut op: impl FnMut(usize) -> Result<Duration>,
) -> Result<Run> {
    let ops = range.end - range.start;
    let (cpu0, t0) = (process_cpu_time(), Instant::now());
    let mut lat = Latencies::default();
    for i in range {
        lat.push(op(i as usize)?);
    }
    Ok(Run {
        bytes: ops * bytes_per_op,
        ops,
        wall: t0.elapsed(),
        cpu: process_cpu_time() - cpu0,
        lat,
    })
}

fn print_table(cases: &[Case]) {
    println!(
        "{:<31} {:>8} {:>10} {:>11} {:>17} {:>9} {:>8} {:>8} {:>9} {:>9} {:>9} {:>17}",
        "case",
        "object",
        "base MB/s",
        "kvtier MB/s",
        "ratio [min-max]",
        "kv IOPS",
        "p50 us",
        "p99 us",
        "cpu us/io",
        "base cpu",
        "fio cpu",
        "vs fio [min-max]"
    );
    let spread = |m: f64, lo: f64, hi: f64| format!("{m:.2} [{lo:.2}-{hi:.2}]");
    for c in cases {
        println!(
            "{:<31} {:>8} {:>10.0} {:>11.0} {:>17} {:>9.0} {:>8.1} {:>8.1} {:>9.2} {:>9.2} {:>9} {:>17}",
            c.name,
            human(c.object_bytes),
            c.baseline_mb_s,
            c.store_mb_s,
            spread(c.ratio, c.ratio_min, c.ratio_max),
            c.store.iops,
            c.store.p50_us,
            c.store.p99_us,
            c.cpu_us_per_io,
            c.baseline_cpu_us_per_io,
            c.fio_cpu_us_per_io
                .map_or("-".to_string(), |f| format!("{f:.2}")),
            match (c.fio_ratio, c.fio_ratio_min, c.fio_ratio_max) {
                (Some(m), Some(lo), Some(hi)) => spread(m, lo, hi),
                _ => "-".to_string(),
            },
        );
    }
    println!(
        "\nratios and CPU figures: medians of {} rounds of baseline and kvtier (disk cases: kvtier first in odd rounds)",
        cases.first().map_or(0, |c| c.rounds.len())
    );
    println!(
        "baselines: {}",
        cases
            .iter()
            .map(|c| format!("{} = {}", c.name, c.baseline.what))
            .collect::<Vec<_>>()
            .join("; ")
    );
}

fn human(b: u64) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{}MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{}KiB", b >> 10)
    } else {
        format!("{b}B")
    }
}
