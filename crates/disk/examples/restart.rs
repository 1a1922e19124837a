//! Measures restart time and index memory with many blocks.
//!
//! ```text
//! cargo run --release -p kvtier-disk --example restart -- [DIR] [BLOCKS] [ENGINE] [LAYOUT]
//! cargo run --release -p kvtier-disk --example restart -- DIR scan [ENGINE] [LAYOUT] [ROUNDS]
//! ```
//!
//! Writes BLOCKS (default 1,000,000) blocks of 4 KiB (8 KiB slots, so 1M
//! blocks take about 8 GiB) into DIR (default a temporary directory under
//! /tmp), closes the tier (writing a checkpoint), then times `open` with the
//! checkpoint, and again after deleting it (a full slot-header scan). ENGINE
//! is `uring` (default) or `psync`; LAYOUT is `block` (default) or `layer`
//! (region lives stored layer by layer; with one 4 KiB layer per block the
//! headers are still 8 KiB apart, so a full scan reads the same runs).
//!
//! With `scan` in place of BLOCKS nothing is written: the tier in DIR (made
//! by an earlier run with the same LAYOUT) is opened ROUNDS times (default
//! 3) without its checkpoint, each a full scan, and each time printed, so
//! two builds can be timed in alternation on the same disk contents.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvtier_core::{BlockHash, BlockSums, Geometry, RegionEvictionKind};
use kvtier_disk::{DiskTier, DiskTierConfig, RegionLayout};
use kvtier_io::{IoEngine, PsyncEngine, UringEngine};
use kvtier_tier::BlockPut;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let tmp;
    let dir = match args.get(1) {
        Some(d) if d != "-" => std::path::PathBuf::from(d),
        _ => {
            tmp = tempfile::Builder::new()
                .prefix("kvtier-restart")
                .tempdir_in("/tmp")?;
            tmp.path().join("d0")
        }
    };
    let scan_only = args.get(2).map(String::as_str) == Some("scan");
    let blocks: u64 = args
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let engine_name = args.get(3).map(String::as_str).unwrap_or("uring");
    let layout = match args.get(4).map(String::as_str) {
        None | Some("block") => RegionLayout::Block,
        Some("layer") => RegionLayout::Layer,
        Some(other) => return Err(format!("unknown layout {other:?}: use block or layer").into()),
    };
    let engine = || -> Result<Arc<dyn IoEngine>, Box<dyn std::error::Error>> {
        Ok(match engine_name {
            "psync" => Arc::new(PsyncEngine::new(8, 64)?),
            _ => Arc::new(UringEngine::new(64)?),
        })
    };
    let geometry = Geometry::raw(1, 4096)?;
    let region: u64 = 64 << 20;
    let slots_per_region = (region - 4096) / 8192;
    let regions = blocks.div_ceil(slots_per_region) + 1;
    let cfg = DiskTierConfig {
        dirs: vec![dir.clone()],
        capacity_per_dir: regions * region,
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
        write_op_bytes: kvtier_disk::DEFAULT_WRITE_OP_BYTES,
        layout,
        prefill: false,
    };
    if scan_only {
        let rounds: u32 = args.get(5).and_then(|s| s.parse().ok()).unwrap_or(3);
        let mut reopen = cfg;
        reopen.reset = false;
        for _ in 0..rounds {
            full_scan(&dir, &reopen, engine()?)?;
        }
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let t = Instant::now();
    let tier = DiskTier::open(cfg.clone(), engine()?)?;
    println!(
        "created {} ({} blocks capacity) in {:?}",
        dir.display(),
        tier.capacity_blocks(),
        t.elapsed()
    );
    let t = Instant::now();
    rt.block_on(async {
        let batch = 512u64;
        let mut data = vec![vec![0u8; 4096]; batch as usize];
        let mut i = 0;
        while i < blocks {
            let n = batch.min(blocks - i);
            let keys: Vec<BlockHash> = (i..i + n)
                .map(|j| BlockHash(xxhash_rust::xxh3::xxh3_128(&j.to_le_bytes())))
                .collect();
            for (d, k) in data.iter_mut().zip(&keys) {
                d[..16].copy_from_slice(&k.to_le_bytes());
            }
            let sums: Vec<BlockSums> = keys
                .iter()
                .zip(&data)
                .map(|(k, d)| BlockSums::compute(*k, 4096, d))
                .collect();
            let puts: Vec<BlockPut<'_>> = keys
                .iter()
                .zip(&data)
                .zip(&sums)
                .map(|((k, d), s)| BlockPut {
                    key: *k,
                    data: d,
                    sums: s,
                    pinned: None,
                })
                .collect();
            for r in tier.put_batch(&puts).await {
                r.expect("put");
            }
            i += n;
        }
        tier.close().await.expect("close");
    });
    let el = t.elapsed();
    println!(
        "wrote {blocks} blocks in {el:?} ({:.0} MB/s of slots)",
        (blocks * 8192) as f64 / el.as_secs_f64() / 1e6
    );
    println!(
        "index memory: {} bytes for {} blocks = {:.1} bytes/block (capacity {})",
        tier.memory_bytes(),
        tier.len(),
        tier.memory_bytes() as f64 / tier.len() as f64,
        tier.capacity_blocks()
    );
    drop(tier);
    let mut reopen = cfg.clone();
    reopen.reset = false;
    for _ in 0..2 {
        let t = Instant::now();
        let tier = DiskTier::open(reopen.clone(), engine()?)?;
        let el = t.elapsed();
        let s = tier.stats();
        println!(
            "restart with checkpoint: {} blocks in {el:?} (from checkpoint {}, scanned {} slots)",
            tier.len(),
            s.recovered_from_checkpoint,
            s.recovery_slots_scanned
        );
    }
    full_scan(&dir, &reopen, engine()?)
}

/// Opens the tier in `dir` without its checkpoint (a full slot-header
/// scan), prints the time, and drops the tier without closing it, so no
/// new checkpoint is written.
fn full_scan(
    dir: &std::path::Path,
    cfg: &DiskTierConfig,
    engine: Arc<dyn IoEngine>,
) -> Result<(), Box<dyn std::error::Error>> {
    match std::fs::remove_file(dir.join("kvtier-disk.index")) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    let t = Instant::now();
    let tier = DiskTier::open(cfg.clone(), engine)?;
    let el = t.elapsed();
    let s = tier.stats();
    println!(
        "restart without checkpoint (full scan): {} blocks in {el:?} ({} slot headers in {} reads)",
        tier.len(),
        s.recovery_slots_scanned,
        s.read_ios
    );
    Ok(())
}
