//! `kvtier bench trace`: a request trace driven through the real block
//! manager on the node's path (G2 in shared memory on top, G3 on disk, G4
//! in an object store or directory) with real bytes; see
//! `kvtier_bench::trace` for what it does.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;

use kvtier_bench::trace::{self as trace_bench, TraceBenchConfig};
use kvtier_core::ModelPreset;
use kvtier_disk::RegionLayout;
use kvtier_manager::placement::CascadeMode;
use kvtier_manager::policy::PolicyKind;
use kvtier_remote::RemoteConfig;
use kvtier_sim::model::GpuKind;

/// Arguments of `kvtier bench trace`.
#[derive(Args)]
pub struct TraceBenchArgs {
    /// The trace (Mooncake, Bailian or kvtier JSONL).
    #[arg(
        long,
        default_value = "../shared/traces/mooncake_conversation_trace.jsonl"
    )]
    pub trace: PathBuf,
    /// Serve only the first N requests.
    #[arg(long)]
    pub requests: Option<usize>,
    /// Geometry preset: `tiny` (4 layers x 4 KiB) or `small` (8 layers x
    /// 16 KiB). `--layers` / `--layer-bytes` override it.
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    /// Layers per block.
    #[arg(long)]
    pub layers: Option<u32>,
    /// Bytes per layer of a block (a multiple of 4096).
    #[arg(long)]
    pub layer_bytes: Option<u64>,
    /// G2 (host DRAM) blocks, the top tier as on the node (requests are
    /// cut to this size).
    #[arg(long, default_value_t = 1024)]
    pub g2: usize,
    /// G3 (disk) blocks; 0 for none.
    #[arg(long, default_value_t = 4096)]
    pub g3: usize,
    /// Size of G3's disk log as a multiple of the G3 pool's bytes (a log
    /// that wraps reclaims regions, re-inserting every block the pool
    /// holds; too small a log for the pool is refused).
    #[arg(long, default_value_t = 4)]
    pub g3_log_factor: u32,
    /// Layout of G3's region lives: `block` (block-major) or `layer`
    /// (layer-major, one read op per layer of adjacent slots).
    #[arg(long, default_value = "block")]
    pub disk_layout: String,
    /// G4 (remote) blocks; 0 for none.
    #[arg(long, default_value_t = 0)]
    pub g4: usize,
    /// Where G4 keeps its objects: `s3://bucket/prefix` (credentials from
    /// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_REGION) or
    /// `file:///dir` (default: `<dir>/g4`).
    #[arg(long)]
    pub g4_url: Option<String>,
    /// S3 endpoint for `--g4-url s3://...` (e.g. http://127.0.0.1:9000 for
    /// MinIO or moto); plain http is allowed for it.
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    /// Directory for G3 (`g3/`, its disk tier is reset) and a file-based G4
    /// (`g4/`); default: a temporary directory, removed afterwards.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Eviction policy of every tier: lru, lfu, arc, s3-fifo, ttl, cost-aware, slru, hit-density.
    #[arg(long, default_value = "lru")]
    pub policy: String,
    /// Idle time, milliseconds of trace time, after which the ttl policy
    /// drops a block.
    #[arg(long, default_value_t = 600_000)]
    pub ttl_ms: u64,
    /// Inclusive cascade (lower tiers keep copies of what is above).
    #[arg(long, conflicts_with = "exclusive")]
    pub inclusive: bool,
    /// Exclusive cascade (the default: a block lives in one tier).
    #[arg(long)]
    pub exclusive: bool,
    /// Reuses a block needs before it is written to G3 (0 admits all).
    #[arg(long, default_value_t = 0)]
    pub admit_after: u32,
    /// Watermark pre-offload between requests as LOW,HIGH fractions (e.g.
    /// 0.75,0.9); off by default (room is made on demand).
    #[arg(long)]
    pub watermarks: Option<String>,
    /// Modelled model for prefill cost: llama3-8b, llama3-70b, qwen3-32b, ...
    #[arg(long, default_value = "llama3-8b")]
    pub model: String,
    /// Modelled GPU: h100, h200, a100, l40s, b200.
    #[arg(long, default_value = "h100")]
    pub gpu: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

fn gpu(name: &str) -> Result<GpuKind> {
    Ok(match name.to_ascii_lowercase().as_str() {
        "h100" | "h100-sxm" => GpuKind::H100Sxm,
        "h200" => GpuKind::H200,
        "a100" | "a100-80g" => GpuKind::A100_80G,
        "l40s" => GpuKind::L40S,
        "b200" => GpuKind::B200,
        other => bail!("unknown GPU {other:?} (h100, h200, a100, l40s, b200)"),
    })
}

fn watermarks(s: &str) -> Result<(f64, f64)> {
    let (low, high) = s
        .split_once(',')
        .with_context(|| format!("--watermarks {s:?}: expected LOW,HIGH"))?;
    Ok((
        low.trim().parse().context("low watermark")?,
        high.trim().parse().context("high watermark")?,
    ))
}

/// The G4 settings of `--g4-url`, with credentials from the environment.
fn remote_config(url: &str, args: &TraceBenchArgs) -> RemoteConfig {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    RemoteConfig {
        url: url.to_owned(),
        endpoint: args.s3_endpoint.clone(),
        allow_http: args
            .s3_endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://")),
        region: env("AWS_REGION").unwrap_or_else(|| RemoteConfig::default().region),
        access_key_id: env("AWS_ACCESS_KEY_ID"),
        secret_access_key: env("AWS_SECRET_ACCESS_KEY"),
        session_token: env("AWS_SESSION_TOKEN"),
        ..RemoteConfig::default()
    }
}

/// The library configuration of `args`.
fn config(args: &TraceBenchArgs) -> Result<TraceBenchConfig> {
    let (layers, layer_bytes) = match args.preset.as_str() {
        "tiny" => (4, 4096),
        "small" => (8, 16384),
        other => bail!("unknown preset {other:?} (tiny, small)"),
    };
    Ok(TraceBenchConfig {
        trace: args.trace.clone(),
        requests: args.requests,
        layers: args.layers.unwrap_or(layers),
        layer_bytes: args.layer_bytes.unwrap_or(layer_bytes),
        g2_blocks: args.g2,
        g3_blocks: args.g3,
        g3_log_factor: args.g3_log_factor,
        disk_layout: match args.disk_layout.as_str() {
            "block" => RegionLayout::Block,
            "layer" => RegionLayout::Layer,
            other => bail!("unknown --disk-layout {other:?} (block, layer)"),
        },
        g4_blocks: args.g4,
        remote: args.g4_url.as_ref().map(|url| remote_config(url, args)),
        dir: args.dir.clone(),
        policy: args
            .policy
            .parse::<PolicyKind>()
            .map_err(|e| anyhow::anyhow!("{e}"))?,
        ttl_ms: args.ttl_ms,
        mode: if args.inclusive && !args.exclusive {
            CascadeMode::Inclusive
        } else {
            CascadeMode::Exclusive
        },
        admit_after: args.admit_after,
        watermarks: args.watermarks.as_deref().map(watermarks).transpose()?,
        model: args
            .model
            .parse::<ModelPreset>()
            .map_err(|e| anyhow::anyhow!("--model: {e}"))?,
        gpu: gpu(&args.gpu)?,
    })
}

/// Runs `kvtier bench trace`.
pub fn run(args: TraceBenchArgs) -> Result<()> {
    let cfg = config(&args)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let report = rt
        .block_on(trace_bench::run(&cfg))
        .with_context(|| format!("trace bench over {}", cfg.trace.display()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", trace_bench::render_text(&report));
    }
    if report.verify_failures > 0 {
        bail!("{} blocks failed verification", report.verify_failures);
    }
    Ok(())
}
