//! Transfer engine figures over real tiers on this machine: bandwidth of
//! every path (HostDevice = host memcpy standing in for G1, the /dev/shm
//! memory tier, the disk tier with O_DIRECT), and a layer-wise load through
//! the scheduler against a consumer that "computes" each layer (a sleep of
//! `--compute-us`), compared with loading everything first.
//!
//! ```text
//! cargo run --release -p kvtier-manager --example transfer_bench -- \
//!     [--blocks 64] [--dir /tmp] [--compute-us 500] [--engine auto|psync|io_uring] \
//!     [--batches-in-flight 1]
//! ```

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvtier_core::{BlockHash, IoEngineKind, ModelPreset, RegionEvictionKind};
use kvtier_disk::{DiskTier, DiskTierConfig};
use kvtier_manager::TransferPath;
use kvtier_manager::device::{
    Device, DeviceBlockId, HostDevice, HostDeviceOptions, HostSource, Span, Upload,
};
use kvtier_manager::scheduler::{IoScheduler, SchedulerConfig, SystemClock};
use kvtier_manager::transfer::{BlockMove, TransferEngine, TransferRequest};
use kvtier_mem::{MemoryTier, MemoryTierConfig};

struct Args {
    blocks: usize,
    dir: String,
    compute: Duration,
    engine: IoEngineKind,
    batches: usize,
}

fn args() -> Result<Args, Box<dyn Error>> {
    let mut a = Args {
        blocks: 64,
        dir: "/tmp".into(),
        compute: Duration::from_micros(500),
        engine: IoEngineKind::Auto,
        batches: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--blocks" => a.blocks = value.parse()?,
            "--batches-in-flight" => a.batches = value.parse()?,
            "--dir" => a.dir = value,
            "--compute-us" => a.compute = Duration::from_micros(value.parse()?),
            "--engine" => {
                a.engine = match value.as_str() {
                    "auto" => IoEngineKind::Auto,
                    "psync" => IoEngineKind::Psync,
                    "io_uring" => IoEngineKind::IoUring,
                    other => return Err(format!("unknown engine {other}").into()),
                }
            }
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    Ok(a)
}

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn Error>> {
    let a = args()?;
    let g = ModelPreset::Llama3_8B.geometry(16);
    let n = a.blocks;
    let bytes = n as u64 * g.block_bytes();
    println!(
        "geometry: {g}; {n} blocks = {} MiB; {} batches in flight per path",
        bytes >> 20,
        a.batches
    );

    let device = Arc::new(HostDevice::new(g, 4 * n, HostDeviceOptions::default()));
    let mem = MemoryTier::create(MemoryTierConfig {
        shm_name: format!("kvtier-transfer-bench-{}", std::process::id()),
        capacity_bytes: (n as u64 + 4) * g.block_bytes(),
        block_bytes: g.block_bytes() as usize,
        layer_bytes: g.layer_bytes() as usize,
        hugepages: false,
        table_key: None,
        access_group: None,
    })?;
    let tmp = tempfile::Builder::new()
        .prefix("kvtier-transfer-bench")
        .tempdir_in(&a.dir)?;
    let disk = Arc::new(DiskTier::open(
        DiskTierConfig {
            dirs: vec![tmp.path().join("d0")],
            capacity_per_dir: (bytes * 2).max(64 << 20),
            region_size: 32 << 20,
            geometry: g,
            eviction: RegionEvictionKind::Fifo,
            reinsert_hot: false,
            checkpoint_interval: Duration::ZERO,
            sync: false,
            register_buffers: true,
            reset: false,
            buffers_per_dir: 4,
            layer_sums_cache: 16384,
            write_op_bytes: kvtier_disk::DEFAULT_WRITE_OP_BYTES,
            layout: kvtier_disk::RegionLayout::Block,
            prefill: true,
        },
        kvtier_io::build_engine(a.engine, 64, 4)?,
    )?);
    let engine = TransferEngine::builder(g)
        .with_device(device.clone())
        .with_memory(mem.clone())
        .with_disk(disk.clone())
        .with_batches_in_flight(a.batches)
        .build()?;

    let keys: Vec<BlockHash> = (0..n as u128).map(|i| BlockHash(0xbe7c_0000 + i)).collect();
    let src = device.allocate(n)?;
    let copies = src
        .iter()
        .enumerate()
        .map(|(i, id)| Upload {
            dst: *id,
            src: Box::new(vec![(i % 251) as u8 + 1; g.block_bytes() as usize])
                as Box<dyn HostSource>,
        })
        .collect();
    device.upload(Span::Block, copies).await?;
    let with_dev = |ids: &[DeviceBlockId]| -> Vec<BlockMove> {
        keys.iter()
            .zip(ids)
            .map(|(k, id)| BlockMove::with_device(*k, *id))
            .collect()
    };
    let plain: Vec<BlockMove> = keys.iter().map(|k| BlockMove::key(*k)).collect();

    let run = |path: TransferPath, span: Span, blocks: Vec<BlockMove>| {
        let engine = engine.clone();
        async move {
            let t = Instant::now();
            let out = engine
                .submit(TransferRequest { path, span, blocks })
                .wait()
                .await;
            (t.elapsed(), out.delivered())
        }
    };
    println!(
        "{:<28} {:>10} {:>9} {:>10}",
        "path", "time ms", "GB/s", "delivered"
    );
    let report = |name: &str, (d, ok): (Duration, usize), b: u64| {
        println!(
            "{name:<28} {:>10.2} {:>9.2} {ok:>10}",
            d.as_secs_f64() * 1e3,
            gbps(b, d)
        );
    };
    report(
        "d2h (hash on entry)",
        run(TransferPath::DeviceToHost, Span::Block, with_dev(&src)).await,
        bytes,
    );
    report(
        "h2disk",
        run(TransferPath::HostToDisk, Span::Block, plain.clone()).await,
        bytes,
    );
    for k in &keys {
        mem.remove(*k);
    }
    report(
        "disk2h (verified)",
        run(TransferPath::DiskToHost, Span::Block, plain.clone()).await,
        bytes,
    );
    let dst = device.allocate(n)?;
    report(
        "h2d (verified)",
        run(TransferPath::HostToDevice, Span::Block, with_dev(&dst)).await,
        bytes,
    );
    report(
        "disk2d whole (verified)",
        run(TransferPath::DiskToDevice, Span::Block, with_dev(&dst)).await,
        bytes,
    );
    let t = Instant::now();
    let mut handles = Vec::new();
    for l in 0..g.layers {
        handles.push(engine.submit(TransferRequest {
            path: TransferPath::DiskToDevice,
            span: Span::Layer(l),
            blocks: with_dev(&dst),
        }));
    }
    let mut ok = 0;
    for h in handles {
        ok += h.wait().await.delivered();
    }
    report(
        "disk2d per layer (32 batches)",
        (t.elapsed(), ok / g.layers as usize),
        bytes,
    );

    // Layer-wise pipeline vs load-then-compute, from DRAM and from disk.
    for (name, path) in [
        ("dram", TransferPath::HostToDevice),
        ("disk", TransferPath::DiskToDevice),
    ] {
        let sched = IoScheduler::new(
            engine.clone(),
            SchedulerConfig::default(),
            Arc::new(SystemClock::new()),
        )?;
        let t = Instant::now();
        let load = sched.load(path, with_dev(&dst));
        load.wait_all().await;
        let load_all = t.elapsed();
        for _ in 0..g.layers {
            std::thread::sleep(a.compute);
        }
        let serial = t.elapsed();
        drop(load);

        let sched = IoScheduler::new(
            engine.clone(),
            SchedulerConfig::default(),
            Arc::new(SystemClock::new()),
        )?;
        let t = Instant::now();
        let load = sched.load(path, with_dev(&dst));
        for l in 0..g.layers {
            load.wait_layer(l).await;
            let c = Instant::now();
            std::thread::sleep(a.compute);
            sched.record_layer_compute(l, c.elapsed());
        }
        let layered = t.elapsed();
        let s = sched.stats();
        println!(
            "{name}: load-then-compute {:.2} ms (load {:.2} ms); layer-wise {:.2} ms, bubble {:.2} ms over {} waits ({} blocked); compute {} x {} us",
            serial.as_secs_f64() * 1e3,
            load_all.as_secs_f64() * 1e3,
            layered.as_secs_f64() * 1e3,
            s.bubble.as_secs_f64() * 1e3,
            s.layer_waits,
            s.blocked_layer_waits,
            g.layers,
            a.compute.as_micros(),
        );
    }
    for s in engine.stats_all().iter().filter(|s| s.transfers > 0) {
        println!(
            "stats {}: transfers {} blocks {} failed {} bytes {} batches {} max queue {} p50 {} us p99 {} us",
            s.path.name(),
            s.transfers,
            s.blocks,
            s.failed_blocks,
            s.bytes,
            s.batches,
            s.max_queue_depth,
            s.latency.p50_us,
            s.latency.p99_us
        );
    }
    disk.close().await?;
    Ok(())
}
