//! `kvtier bench trace`, the library half: a request trace driven through
//! a real [`BlockManager`] with real bytes.
//!
//! Each request of the trace (read by [`kvtier_sim::trace`]) is served in
//! order, one at a time, on the trace's clock (the pools' clock is the
//! request's timestamp):
//!
//! 0. [`BlockManager::step`] runs (TTL expiry, watermark pre-offload);
//! 1. its prefix is looked up and onboarded to G2, the node's top tier
//!    (G3 / G4 blocks read layer by layer into reserved arena slots
//!    through the scheduler, room made in G2 first), as the node daemon
//!    does for a client's `Load`;
//! 2. the engine "computes" layer by layer: the bench waits for each layer
//!    and reports the layer's modelled prefill time (the `kvtier_sim::model`
//!    prefill cost of the modelled GPU for the request's new tokens after
//!    its cached ones, split evenly over the layers) to the scheduler;
//! 3. every onboarded block's arena bytes are read back (verified against
//!    its checksums) and compared with the bytes it was stored with;
//! 4. the blocks after the prefix are stored as an engine stores them
//!    through the node: one reservation for the request's whole chain
//!    ([`BlockManager::reserve_host`]: the prefix the node holds is
//!    answered `AlreadyStored`, and each block's parent is the key before
//!    it), the granted slots filled, one commit
//!    ([`BlockManager::commit_host`]).
//!
//! This is the path the node daemon runs: G2 on top, no device. The
//! engine's own GPU prefix cache sits in front of the node and is not
//! modelled here (nor by the node); requests are cut to G2's size, so one
//! request's blocks fit the top tier.
//!
//! The geometry is small (`layers` x `layer_bytes`) so that a whole trace
//! fits this machine; hit rates do not depend on it, bytes do. The TTFTs
//! are modelled per request with [`kvtier_sim::model::request_ttft`] from
//! the hits the real manager found, per tier.

mod report;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kvtier_arena::MemError;
use kvtier_core::{BlockHash, CoreError, Geometry, Lookup, ModelPreset, RegionEvictionKind};
use kvtier_disk::{DiskError, DiskTier, DiskTierConfig, RegionLayout};
use kvtier_io::PsyncEngine;
use kvtier_mem::{MemoryTier, MemoryTierConfig};
use kvtier_remote::{RemoteConfig, RemoteError, RemoteTier};
use kvtier_sim::model::{GpuKind, ModelSpec, ServingModel, request_ttft};
use kvtier_sim::trace::{self, TraceError};
use serde::Serialize;

use kvtier_manager::admission::AdmissionConfig;
use kvtier_manager::manager::{
    BlockManager, HostCommit, HostReserve, ManagerConfig, ManagerError, ManagerStats,
};
use kvtier_manager::placement::{CascadeMode, HierarchyConfig, PlacementConfig};
use kvtier_manager::policy::{PolicyConfig, PolicyKind};
use kvtier_manager::pool::PoolConfig;
pub use kvtier_manager::test_support::block_content;
use kvtier_manager::{Tier, TierList};
use kvtier_tier::TierStore;

pub use report::render_text;

/// Tokens per block of the Mooncake traces.
pub const TRACE_TOKENS_PER_BLOCK: usize = 512;

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceBenchConfig {
    /// The trace file (format detected from its first line).
    pub trace: PathBuf,
    /// Serve only the first `n` requests. Default: all.
    pub requests: Option<usize>,
    /// Layers of the bench geometry. Default: 4.
    pub layers: u32,
    /// Bytes per layer of a block (a multiple of 4096 for the disk's direct
    /// I/O). Default: 4096.
    pub layer_bytes: u64,
    /// G2 blocks, the top tier (at least one; requests are cut to this
    /// size). Default: 1024.
    pub g2_blocks: usize,
    /// G3 blocks; 0 for no G3. Default: 4096.
    pub g3_blocks: usize,
    /// The disk log's size as a multiple of the G3 pool's bytes. The log
    /// reclaims whole regions when it wraps, re-inserting every block the
    /// pool holds; the larger the log, the fewer it rewrites. It must leave
    /// the slack `DiskTier::live_capacity_blocks` asks for (else the run is
    /// refused with `ManagerError::PoolTooLarge`). Default: 4.
    pub g3_log_factor: u32,
    /// How G3's region lives place their bytes. Default: block-major.
    pub disk_layout: RegionLayout,
    /// G4 blocks; 0 for no G4. Default: 0.
    pub g4_blocks: usize,
    /// Where G4 keeps its objects (`s3://bucket/prefix`, with the endpoint
    /// and credentials in `remote`, or `file:///dir`). Default: `None`, a
    /// `g4` directory beside G3's.
    pub remote: Option<RemoteConfig>,
    /// Directory holding G3's data (`g3/`) and a file-based G4's objects
    /// (`g4/`); a temporary directory when `None`.
    pub dir: Option<PathBuf>,
    /// Eviction policy of every tier. Default: LRU.
    pub policy: PolicyKind,
    /// Idle time after which the TTL policy drops a block, milliseconds of
    /// trace time. Default: 10 minutes.
    pub ttl_ms: u64,
    /// Inclusive or exclusive cascade. Default: exclusive.
    pub mode: CascadeMode,
    /// Reuses a block needs before it is written to G3; 0 admits all.
    /// Default: 0.
    pub admit_after: u32,
    /// `(low, high)` watermarks of every tier for the offload `step` runs
    /// between requests; `None` turns that pre-offload off (room is then
    /// made on demand only). Default: `None`.
    pub watermarks: Option<(f64, f64)>,
    /// The modelled model (prefill cost, KV bytes per token). Default:
    /// Llama-3-8B.
    pub model: ModelPreset,
    /// The modelled GPU. Default: H100 SXM.
    pub gpu: GpuKind,
}

impl Default for TraceBenchConfig {
    fn default() -> Self {
        Self {
            trace: PathBuf::new(),
            requests: None,
            layers: 4,
            layer_bytes: 4096,
            g2_blocks: 1024,
            g3_blocks: 4096,
            g3_log_factor: 4,
            disk_layout: RegionLayout::Block,
            g4_blocks: 0,
            remote: None,
            dir: None,
            policy: PolicyKind::Lru,
            ttl_ms: PolicyConfig::default().ttl_ms,
            mode: CascadeMode::Exclusive,
            admit_after: 0,
            watermarks: None,
            model: ModelPreset::Llama3_8B,
            gpu: GpuKind::H100Sxm,
        }
    }
}

/// Why a bench run failed.
#[derive(Debug, thiserror::Error)]
pub enum TraceBenchError {
    /// The settings cannot work.
    #[error("invalid trace bench settings: {0}")]
    Config(String),
    /// The trace could not be read.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The geometry is invalid.
    #[error(transparent)]
    Geometry(#[from] CoreError),
    /// The shared-memory tier could not be created.
    #[error(transparent)]
    Memory(#[from] MemError),
    /// The disk tier could not be opened.
    #[error(transparent)]
    Disk(#[from] DiskError),
    /// The remote tier could not be opened.
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// The manager refused.
    #[error(transparent)]
    Manager(#[from] ManagerError),
    /// A file system error (the temporary directory, the I/O engine).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Modelled time to first token, seconds, averaged over the requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TtftFigures {
    /// With the cache, loads overlapped with compute layer by layer.
    pub overlapped_s: f64,
    /// With the cache, loads before compute.
    pub serial_s: f64,
    /// Without any cache (the whole prompt prefilled).
    pub no_cache_s: f64,
    /// Modelled GPU bubble of the overlapped case.
    pub bubble_s: f64,
}

/// The outcome of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceBenchReport {
    /// The settings, as text.
    pub settings: String,
    /// Requests served.
    pub requests: usize,
    /// Blocks of those requests (after truncation to G2).
    pub blocks: u64,
    /// Blocks cut from requests longer than G2.
    pub truncated_blocks: u64,
    /// Per tier, the blocks of matched prefixes it served.
    pub hits: Vec<(Tier, u64)>,
    /// Blocks no tier held (after the prefix).
    pub misses: u64,
    /// Onboarded blocks whose arena bytes differed from what was stored,
    /// plus blocks the tiers reported corrupt. Must be 0.
    pub verify_failures: u64,
    /// Onboarded blocks that did not arrive (recomputed instead).
    pub onboard_failures: u64,
    /// Blocks compared byte for byte after onboarding.
    pub verified_blocks: u64,
    /// Wall-clock time of the run, seconds.
    pub elapsed_s: f64,
    /// Modelled TTFTs.
    pub ttft: TtftFigures,
    /// The manager's counters at the end (bytes per path, bubble, ...).
    pub stats: ManagerStats,
    /// G3's read counters at the end; `None` without G3.
    pub disk: Option<DiskReads>,
}

/// What G3's disk tier read over a run (design/layer-stripe.md step 5:
/// how many read ops a block-layer loaded from disk costs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DiskReads {
    /// The layout of G3's region lives.
    pub layout: RegionLayout,
    /// Every read op the tier issued: layer, block and header reads, and
    /// reclaim's re-insertion reads.
    pub read_ios: u64,
    /// Of `read_ios`, one layer of several adjacent slots at once.
    pub read_runs: u64,
    /// Layer pieces read from layer-major lives (alone or in runs).
    pub layer_pieces: u64,
    /// Block-layers moved from disk to G2 (`g3_to_g2`'s blocks: a
    /// layer-wise load counts each block once per layer).
    pub block_layers: u64,
    /// `read_ios / block_layers` (0 when nothing was loaded).
    pub ops_per_block_layer: f64,
    /// Regions the log reclaimed to get space (how often it wrapped, in
    /// regions).
    pub regions_reclaimed: u64,
    /// Regions of the log.
    pub regions: u64,
    /// Blocks the log re-inserted when it reclaimed their region.
    pub reinserted: u64,
}

impl TraceBenchReport {
    /// Hits of `tier` over all blocks.
    pub fn hit_rate(&self, tier: Tier) -> f64 {
        let hits = self
            .hits
            .iter()
            .find(|(t, _)| *t == tier)
            .map_or(0, |(_, h)| *h);
        if self.blocks == 0 {
            0.0
        } else {
            hits as f64 / self.blocks as f64
        }
    }
}

/// The manager configuration a bench run uses.
pub fn manager_config(config: &TraceBenchConfig) -> ManagerConfig {
    let pool = |blocks: usize| {
        let (low, high) = config.watermarks.unwrap_or((1.0, 1.0));
        PoolConfig {
            capacity_blocks: blocks,
            tokens_per_block: TRACE_TOKENS_PER_BLOCK,
            high_watermark: high,
            low_watermark: low,
            policy: PolicyConfig {
                ttl_ms: config.ttl_ms,
                ..PolicyConfig::of(config.policy)
            },
            ..PoolConfig::default()
        }
    };
    // The configured tiers take the list's positions in order, as
    // `build_tiers` registers them: the arena, the disk, the remote store.
    let sizes = [config.g2_blocks, config.g3_blocks, config.g4_blocks];
    let hierarchy = sizes
        .into_iter()
        .filter(|&blocks| blocks > 0)
        .zip(Tier::all().skip(TierList::TOP.index()))
        .fold(HierarchyConfig::none(), |h, (blocks, tier)| {
            h.with(tier, pool(blocks))
        });
    ManagerConfig {
        hierarchy: hierarchy.with_placement(PlacementConfig {
            mode: config.mode,
            admission: AdmissionConfig {
                min_reuses: config.admit_after,
                ..AdmissionConfig::default()
            },
        }),
        offload_on_demand: true,
        step_waits: true,
        ..ManagerConfig::default()
    }
}

/// The tiers of a run and what must outlive them.
struct BenchTiers {
    memory: MemoryTier,
    disk: Option<Arc<DiskTier>>,
    remote: Option<Arc<RemoteTier>>,
    _tempdir: Option<tempfile::TempDir>,
}

impl BenchTiers {
    /// The tiers in order, as the manager holds them: the arena, then the
    /// disk and the remote store when configured.
    fn list(&self, g: Geometry) -> Result<TierList, ManagerError> {
        let below = [
            self.disk.clone().map(|d| d as Arc<dyn TierStore>),
            self.remote.clone().map(|r| r as Arc<dyn TierStore>),
        ];
        Ok(TierList::new(
            g,
            Some(self.memory.clone()),
            below.into_iter().flatten(),
        )?)
    }
}

fn build_tiers(config: &TraceBenchConfig, g: Geometry) -> Result<BenchTiers, TraceBenchError> {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let block_bytes = g.block_bytes();
    let memory = {
        // The G2 pool is the arena's only eviction authority (the arena
        // never evicts by itself). The slack beyond the pool's capacity
        // covers blocks the pool has released whose arena slot a reader
        // (a transfer in flight) still references.
        let slots = config.g2_blocks + config.g2_blocks / 4 + 64;
        let arena = MemoryTierConfig {
            shm_name: format!(
                "kvtier-trace-{}-{}",
                std::process::id(),
                RUN.fetch_add(1, Ordering::Relaxed)
            ),
            capacity_bytes: slots as u64 * block_bytes,
            block_bytes: block_bytes as usize,
            layer_bytes: g.layer_bytes() as usize,
            hugepages: false,
            table_key: None,
            access_group: None,
        };
        MemoryTier::create(arena)?
    };
    let wants_dir = config.g3_blocks > 0 || (config.g4_blocks > 0 && config.remote.is_none());
    let (base, tempdir) = match (&config.dir, wants_dir) {
        (_, false) => (PathBuf::new(), None),
        (Some(d), true) => (d.clone(), None),
        (None, true) => {
            let t = tempfile::Builder::new()
                .prefix("kvtier-bench-trace")
                .tempdir()?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    let disk = if config.g3_blocks > 0 {
        let dir = base.join("g3");
        let region_size: u64 = 1 << 20;
        // The log is written in regions and reclaims whole regions,
        // re-inserting what the pool holds: a log several times the pool
        // rewrites little.
        let factor = u64::from(config.g3_log_factor.max(1));
        let want = factor * config.g3_blocks as u64 * block_bytes + 4 * region_size;
        let capacity = want.div_ceil(region_size) * region_size;
        let cfg = DiskTierConfig {
            dirs: vec![dir],
            capacity_per_dir: capacity,
            region_size,
            geometry: g,
            eviction: RegionEvictionKind::Fifo,
            // As on the node: blocks the G3 pool still wants get a second
            // life when the log reclaims their region, so the pool stays the
            // one eviction authority of G3.
            reinsert_hot: true,
            checkpoint_interval: Duration::ZERO,
            sync: false,
            register_buffers: false,
            reset: true,
            buffers_per_dir: 2,
            layer_sums_cache: 4096,
            write_op_bytes: kvtier_disk::DEFAULT_WRITE_OP_BYTES,
            layout: config.disk_layout,
            prefill: false,
        };
        let engine = Arc::new(
            PsyncEngine::new(4, 64)
                .map_err(|e| TraceBenchError::Config(format!("I/O engine: {e}")))?,
        );
        Some(Arc::new(DiskTier::open(cfg, engine)?))
    } else {
        None
    };
    let remote = if config.g4_blocks > 0 {
        let cfg = match &config.remote {
            Some(c) => c.clone(),
            None => {
                let dir = base.join("g4");
                std::fs::create_dir_all(&dir)?;
                RemoteConfig {
                    url: format!("file://{}", dir.display()),
                    ..RemoteConfig::default()
                }
            }
        };
        Some(Arc::new(RemoteTier::open(&cfg, g)?))
    } else {
        None
    };
    Ok(BenchTiers {
        memory,
        disk,
        remote,
        _tempdir: tempdir,
    })
}

/// Runs the bench. Must run inside a tokio runtime.
pub async fn run(config: &TraceBenchConfig) -> Result<TraceBenchReport, TraceBenchError> {
    if config.g2_blocks == 0 {
        return Err(TraceBenchError::Config(
            "G2 needs at least one block".into(),
        ));
    }
    if config.layer_bytes == 0 || !config.layer_bytes.is_multiple_of(4096) {
        return Err(TraceBenchError::Config(
            "layer bytes must be a positive multiple of 4096".into(),
        ));
    }
    let started = Instant::now();
    let g = Geometry::raw(config.layers, u64::from(config.layers) * config.layer_bytes)?;
    let block_bytes = g.block_bytes() as usize;
    let tiers = build_tiers(config, g)?;
    // The pools run on the trace's time, so idle times and TTLs are the
    // trace's and the optimizer's replay sees the same ones.
    let trace_now = Arc::new(AtomicU64::new(0));
    let clock_now = trace_now.clone();
    let manager = BlockManager::with_pool_clock(
        manager_config(config),
        tiers.list(g)?,
        Vec::new(),
        Arc::new(move || clock_now.load(Ordering::Relaxed)),
    )?;
    let serving = ServingModel::new(
        ModelSpec::preset(config.model),
        config.gpu.spec(),
        &["hbm", "dram", "nvme", "remote"],
        TRACE_TOKENS_PER_BLOCK as u32,
    );
    let mut requests = 0usize;
    let (mut blocks, mut truncated, mut verified, mut mismatches) = (0u64, 0u64, 0u64, 0u64);
    let mut ttft = TtftFigures::default();
    let limit = config.requests.unwrap_or(usize::MAX);
    for request in trace::open(&config.trace, None)?.take(limit) {
        let request = request?;
        let mut keys = request.keys.clone();
        if keys.len() > config.g2_blocks {
            truncated += (keys.len() - config.g2_blocks) as u64;
            keys.truncate(config.g2_blocks);
        }
        requests += 1;
        blocks += keys.len() as u64;
        // Between requests, at the new request's time: TTL expiry and the
        // watermark pre-offload.
        trace_now.fetch_max(request.timestamp_ms, Ordering::Relaxed);
        manager.step().await;
        let onboarding = manager.begin_onboard(&keys).await?;
        let matched = onboarding.matched().clone();
        // The modelled prefill of this request: new tokens after the
        // cached ones, spread over the bench's layers.
        let input = request.tokens_in_blocks(keys.len()) as u32;
        let hit_tokens = request.tokens_in_blocks(matched.len()) as u32;
        let compute = serving.compute_seconds(
            f64::from(input - hit_tokens).max(1.0),
            f64::from(hit_tokens),
        );
        let per_layer = Duration::from_secs_f64(compute / f64::from(config.layers));
        for layer in 0..config.layers {
            onboarding.wait_layer(layer).await;
            manager.record_layer_compute(layer, per_layer);
        }
        let onboarded = manager.finish_onboard(onboarding).await?;
        let mut read = vec![0u8; block_bytes];
        for b in &onboarded.blocks {
            verified += 1;
            let same = tiers.memory.get(b.hash(), &mut read) == Lookup::Hit
                && read == block_content(b.hash(), block_bytes);
            mismatches += u64::from(!same);
        }
        mismatches += store_fresh(&manager, &keys, g).await?;
        drop(onboarded);
        let per_tier: Vec<u32> = Tier::all().map(|t| matched.count_in(t) as u32).collect();
        let t = request_ttft(&serving, input, hit_tokens, &per_tier);
        ttft.overlapped_s += t.with_cache;
        ttft.serial_s += t.with_cache_serial;
        ttft.no_cache_s += t.without_cache;
        ttft.bubble_s += t.bubble;
    }
    manager.flush_events();
    let stats = manager.stats();
    if requests > 0 {
        let n = requests as f64;
        ttft.overlapped_s /= n;
        ttft.serial_s /= n;
        ttft.no_cache_s /= n;
        ttft.bubble_s /= n;
    }
    drop(manager);
    let disk = tiers.disk.as_ref().map(|d| {
        let s = d.stats();
        let block_layers = stats
            .paths
            .iter()
            .filter(|p| p.path.to == TierList::TOP && Some(p.path.from) == TierList::TOP.below())
            .map(|p| p.blocks)
            .sum::<u64>();
        DiskReads {
            layout: config.disk_layout,
            read_ios: s.read_ios,
            read_runs: s.read_runs,
            layer_pieces: s.layer_pieces,
            block_layers,
            ops_per_block_layer: if block_layers == 0 {
                0.0
            } else {
                s.read_ios as f64 / block_layers as f64
            },
            regions_reclaimed: s.regions_reclaimed,
            regions: s.capacity_blocks / u64::from(d.layout().slots_per_region.max(1)),
            reinserted: s.reinserted,
        }
    });
    if let Some(d) = &tiers.disk {
        d.close().await?;
    }
    Ok(TraceBenchReport {
        settings: settings_text(config),
        requests,
        blocks,
        truncated_blocks: truncated,
        hits: stats.tiers.iter().map(|t| (t.tier, t.hits)).collect(),
        misses: stats.misses,
        verify_failures: mismatches + stats.verify_failures,
        onboard_failures: stats.onboard_failures,
        verified_blocks: verified,
        elapsed_s: started.elapsed().as_secs_f64(),
        ttft,
        stats,
        disk,
    })
}

/// Stores a request's blocks as a client of the node does: one
/// reservation of G2 slots for the request's whole chain (the node answers
/// `AlreadyStored` for the prefix it holds, and learns each block's
/// parent), the slots granted filled, one commit. A block some tier holds
/// already, or that no slot is left for, is skipped. Returns the commits
/// refused for bad checksums (a verify failure: must be 0).
async fn store_fresh(
    manager: &BlockManager,
    keys: &[BlockHash],
    g: Geometry,
) -> Result<u64, TraceBenchError> {
    let block_bytes = g.block_bytes() as usize;
    let layer_bytes = g.layer_bytes() as usize;
    let mut filled = Vec::with_capacity(keys.len());
    for reserved in manager.reserve_host(keys).await? {
        match reserved {
            HostReserve::Reserved(mut r) => {
                let sums = r.fill(&block_content(r.key(), block_bytes), layer_bytes)?;
                filled.push((r, sums));
            }
            HostReserve::AlreadyStored | HostReserve::InFlight | HostReserve::NoSpace => {}
        }
    }
    let committed = manager.commit_host(filled).await;
    Ok(committed
        .iter()
        .filter(|c| **c == HostCommit::BadChecksum)
        .count() as u64)
}

fn settings_text(c: &TraceBenchConfig) -> String {
    format!(
        "trace={} requests={} geometry={}x{}B g2={} g3={} disk_layout={:?} g4={} policy={} ttl_ms={} mode={:?} admit_after={} watermarks={:?}",
        c.trace.display(),
        c.requests.map_or("all".to_owned(), |n| n.to_string()),
        c.layers,
        c.layer_bytes,
        c.g2_blocks,
        c.g3_blocks,
        c.disk_layout,
        c.g4_blocks,
        c.policy,
        c.ttl_ms,
        c.mode,
        c.admit_after,
        c.watermarks,
    )
}
