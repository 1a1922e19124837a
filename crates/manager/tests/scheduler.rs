//! Tutti's scheduler: reads overtake queued writes, the write budget holds
//! while reads are pending, writes wait for slack, `wait_layer` follows the
//! layers, bubble time is measured on a manual clock, and slack estimates
//! converge. Completions are held at a [`GatedDevice`] and released by the
//! test, so every ordering is decided by the test, never by sleeps.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kvtier_core::{BlockHash, BlockSums, Geometry};
use kvtier_manager::TransferPath;
use kvtier_manager::device::{
    CopyDirection, Device, DeviceBlockId, GatedDevice, HostDevice, HostDeviceOptions, HostSource,
    Span, Upload,
};
use kvtier_manager::scheduler::{
    Clock, IoClass, IoPolicy, IoScheduler, ManualClock, OpId, PolicyConfig, SchedulerConfig,
    SlackEstimator, SlackProfile, WriteBudget,
};
use kvtier_manager::transfer::{BlockMove, TransferEngine, TransferHandle, TransferRequest};
use kvtier_mem::{MemoryTier, MemoryTierConfig};
use proptest::prelude::*;

const MS: Duration = Duration::from_millis(1);

/// 4 layers of 4 KiB.
fn geometry() -> Geometry {
    Geometry::raw(4, 16 << 10).expect("geometry")
}

fn key(i: u64) -> BlockHash {
    BlockHash(0xabc0_0000_0000 + i as u128)
}

fn content(key: BlockHash, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (key.fold64() as usize).wrapping_mul(31).wrapping_add(i * 7) as u8)
        .collect()
}

/// A device, DRAM, an engine and a scheduler on a manual clock.
struct Rig {
    device: Arc<GatedDevice>,
    host: Arc<HostDevice>,
    mem: MemoryTier,
    sched: IoScheduler,
    clock: Arc<ManualClock>,
}

fn rig(policy: PolicyConfig) -> Rig {
    static N: AtomicU64 = AtomicU64::new(0);
    let g = geometry();
    let host = Arc::new(HostDevice::new(g, 64, HostDeviceOptions::default()));
    let device = Arc::new(GatedDevice::new(host.clone()));
    let mem = MemoryTier::create(MemoryTierConfig {
        shm_name: format!(
            "kvtier-mgr-sched-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ),
        capacity_bytes: 64 * g.block_bytes(),
        block_bytes: g.block_bytes() as usize,
        layer_bytes: g.layer_bytes() as usize,
        hugepages: false,
        table_key: None,
        access_group: None,
    })
    .expect("memory tier");
    let engine = TransferEngine::builder(g)
        .with_device(device.clone())
        .with_memory(mem.clone())
        .build()
        .expect("engine");
    let clock = Arc::new(ManualClock::new());
    let sched = IoScheduler::new(
        engine,
        SchedulerConfig {
            policy,
            ..SchedulerConfig::default()
        },
        clock.clone(),
    )
    .expect("scheduler");
    Rig {
        device,
        host,
        mem,
        sched,
        clock,
    }
}

impl Rig {
    /// Blocks in DRAM, to load.
    fn in_dram(&self, keys: &[BlockHash]) {
        let g = geometry();
        for k in keys {
            let data = content(*k, g.block_bytes() as usize);
            let sums = BlockSums::compute(*k, g.layer_bytes() as usize, &data);
            self.mem.put(*k, &data, &sums).expect("put");
        }
    }

    /// Blocks on the device (bypassing the gate's log), to offload.
    async fn on_device(&self, keys: &[BlockHash]) -> Vec<DeviceBlockId> {
        let len = geometry().block_bytes() as usize;
        let ids = self.host.allocate(keys.len()).expect("device blocks");
        let copies = keys
            .iter()
            .zip(&ids)
            .map(|(k, id)| Upload {
                dst: *id,
                src: Box::new(content(*k, len)) as Box<dyn HostSource>,
            })
            .collect();
        for (_, r) in self.host.upload(Span::Block, copies).await.expect("upload") {
            r.expect("copy");
        }
        ids
    }

    fn offload(&self, k: BlockHash, id: DeviceBlockId) -> TransferHandle {
        self.sched.submit(TransferRequest::blocks(
            TransferPath::DeviceToHost,
            vec![BlockMove::with_device(k, id)],
        ))
    }

    fn load_targets(&self, keys: &[BlockHash]) -> Vec<BlockMove> {
        let ids = self.host.allocate(keys.len()).expect("device blocks");
        keys.iter()
            .zip(ids)
            .map(|(k, id)| BlockMove::with_device(*k, id))
            .collect()
    }
}

/// Writes are queued behind one that is stuck at the device; a load
/// submitted after them runs all its layers before any of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_overtake_queued_writes() {
    let rig = rig(PolicyConfig {
        max_writes_in_flight: 1,
        ..PolicyConfig::default()
    });
    let w: Vec<BlockHash> = (0..3).map(|i| key(100 + i)).collect();
    let w_ids = rig.on_device(&w).await;
    let r: Vec<BlockHash> = (0..2).map(key).collect();
    rig.in_dram(&r);

    rig.device.hold(CopyDirection::Download, true);
    let writes: Vec<TransferHandle> = w
        .iter()
        .zip(&w_ids)
        .map(|(k, id)| rig.offload(*k, *id))
        .collect();
    let s = rig.sched.stats();
    assert_eq!((s.policy.writes_dispatched, s.writes_queued), (1, 2));
    // Dispatched is not yet at the device: wait until the write is held
    // there, so the device's log orders it before the load's layers.
    rig.device.wait_held(1).await;

    let targets = rig.load_targets(&r);
    let load = rig.sched.load(TransferPath::HostToDevice, targets.clone());
    for layer in load.wait_all().await {
        assert!(layer.all_delivered(), "{layer:?}");
    }
    // Every read ran while two writes were still queued.
    let s = rig.sched.stats();
    assert_eq!(s.policy.reads_dispatched, 4);
    assert_eq!((s.policy.writes_dispatched, s.writes_queued), (1, 2));
    drop(load);

    for _ in 0..3 {
        rig.device.release_next(CopyDirection::Download).await;
    }
    for h in &writes {
        assert!(h.wait().await.all_delivered());
    }
    let order: Vec<(CopyDirection, Span)> = rig
        .device
        .log()
        .iter()
        .map(|e| (e.direction, e.span))
        .collect();
    let d = (CopyDirection::Download, Span::Block);
    let u = |l| (CopyDirection::Upload, Span::Layer(l));
    assert_eq!(order, vec![d, u(0), u(1), u(2), u(3), d, d]);
}

/// While reads are pending (held at the device), at most `max_ops` writes
/// are in flight; with a zero budget none starts until the reads are done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_budget_holds_while_reads_pending() {
    let rig = rig(PolicyConfig {
        max_reads_in_flight: 4,
        max_writes_in_flight: 4,
        write_budget_while_reading: WriteBudget {
            max_ops: 1,
            max_bytes: u64::MAX,
        },
    });
    let r: Vec<BlockHash> = (0..2).map(key).collect();
    rig.in_dram(&r);
    let w: Vec<BlockHash> = (0..4).map(|i| key(200 + i)).collect();
    let w_ids = rig.on_device(&w).await;

    rig.device.hold(CopyDirection::Upload, true);
    let load = rig
        .sched
        .load(TransferPath::HostToDevice, rig.load_targets(&r));
    let writes: Vec<TransferHandle> = w
        .iter()
        .zip(&w_ids)
        .map(|(k, id)| rig.offload(*k, *id))
        .collect();
    for h in &writes {
        assert!(h.wait().await.all_delivered());
    }
    let s = rig.sched.stats();
    assert!(!load.is_layer_ready(0), "the reads were held all along");
    assert_eq!(s.policy.writes_dispatched_while_reading, 4);
    assert_eq!(s.policy.max_write_ops_while_reading, 1);

    for _ in 0..4 {
        rig.device.release_next(CopyDirection::Upload).await;
    }
    assert!(load.wait_all().await.iter().all(|l| l.all_delivered()));
    drop(load);

    // Zero budget: a write waits for every read.
    let rig = rig0();
    rig.in_dram(&r);
    let w_ids = rig.on_device(&w[..1]).await;
    rig.device.hold(CopyDirection::Upload, true);
    let load = rig
        .sched
        .load(TransferPath::HostToDevice, rig.load_targets(&r));
    let write = rig.offload(w[0], w_ids[0]);
    let s = rig.sched.stats();
    assert_eq!((s.policy.writes_dispatched, s.writes_queued), (0, 1));
    for _ in 0..4 {
        rig.device.release_next(CopyDirection::Upload).await;
    }
    assert!(load.wait_all().await.iter().all(|l| l.all_delivered()));
    // Reads are done but the forward pass is on, with no compute window:
    // still deferred. Ending the pass frees the device for writing.
    assert_eq!(rig.sched.stats().policy.writes_dispatched, 0);
    drop(load);
    assert!(write.wait().await.all_delivered());
    assert_eq!(rig.sched.stats().policy.max_write_ops_while_reading, 0);
}

fn rig0() -> Rig {
    rig(PolicyConfig::default())
}

/// One read batch per layer holding every block; `wait_layer(l)` resolves
/// once layer `l` of every block is on the device and before layer `l + 1`
/// has arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_layer_follows_layer_order() {
    let rig = rig0();
    let g = geometry();
    let len = g.block_bytes() as usize;
    let r: Vec<BlockHash> = (0..3).map(|i| key(300 + i)).collect();
    rig.in_dram(&r);
    let targets = rig.load_targets(&r);
    let ids: Vec<DeviceBlockId> = targets.iter().filter_map(|t| t.device).collect();
    rig.device.hold(CopyDirection::Upload, true);
    let load = rig.sched.load(TransferPath::HostToDevice, targets);
    for l in 0..g.layers {
        assert!(!load.is_layer_ready(l), "layer {l} ready before its I/O");
        let batch = rig.device.release_next(CopyDirection::Upload).await;
        assert_eq!(batch.span, Span::Layer(l));
        assert_eq!(batch.blocks, ids, "one batch per layer, every block");
        let out = load.wait_layer(l).await;
        assert!(out.all_delivered(), "{out:?}");
        let range = g.layer_range(l);
        let range = range.start as usize..range.end as usize;
        for (k, id) in r.iter().zip(&ids) {
            let on_device = rig.host.read_block(*id).expect("block");
            assert!(
                on_device[range.clone()] == content(*k, len)[range.clone()],
                "layer {l} of {k}"
            );
        }
        if l + 1 < g.layers {
            assert!(!load.is_layer_ready(l + 1), "layer {} arrived early", l + 1);
        }
    }
    assert_eq!(rig.sched.stats().layer_waits, g.layers as u64);
}

/// Plays a load whose layers take `io` each to read (back to back) against
/// a consumer computing `compute` per layer, on the manual clock; returns
/// (measured bubble, the model's bubble, blocked waits).
async fn play(io: Duration, compute: Duration) -> (Duration, Duration, u64) {
    let rig = rig0();
    let g = geometry();
    let r: Vec<BlockHash> = (0..2).map(|i| key(400 + i)).collect();
    rig.in_dram(&r);
    rig.device.hold(CopyDirection::Upload, true);
    let load = rig
        .sched
        .load(TransferPath::HostToDevice, rig.load_targets(&r));
    // The consumer reaches layer 0 when layer 0's I/O would be done.
    let mut consumer_at = io;
    let mut expected = Duration::ZERO;
    let mut blocked = 0;
    for l in 0..g.layers {
        let io_done = io * (l + 1);
        if io_done <= consumer_at {
            rig.clock.advance_to(io_done);
            rig.device.release_next(CopyDirection::Upload).await;
            rig.clock.advance_to(consumer_at);
            load.wait_layer(l).await;
        } else {
            rig.clock.advance_to(consumer_at);
            let wait = load.wait_layer(l);
            rig.clock.advance_to(io_done);
            rig.device.release_next(CopyDirection::Upload).await;
            wait.await;
            expected += io_done - consumer_at;
            blocked += 1;
        }
        rig.sched.record_layer_compute(l, compute);
        consumer_at = rig.clock.now() + compute;
    }
    let s = rig.sched.stats();
    assert_eq!(s.blocked_layer_waits, blocked);
    (s.bubble, expected, blocked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bubble_is_zero_when_io_is_faster_than_compute() {
    let (bubble, expected, blocked) = play(MS, 3 * MS).await;
    assert_eq!(expected, Duration::ZERO);
    assert_eq!(blocked, 0);
    assert_eq!(bubble, Duration::ZERO);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bubble_is_positive_when_io_is_slower_than_compute() {
    let (bubble, expected, blocked) = play(3 * MS, MS).await;
    // Layer l waits (l + 1) * 3 ms - (3 ms + l * 3 ms) ... = 2 ms per later layer.
    assert_eq!(blocked, 3);
    assert_eq!(expected, 6 * MS);
    assert_eq!(bubble, expected);
}

/// A deterministic noise source in [-1, 1).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }
}

/// Noisy per-layer compute times (+-20%): the EWMA settles within 8% of
/// each layer's mean, and follows a step change (the batch got heavier).
#[test]
fn slack_learning_converges() {
    let mut est = SlackEstimator::new(0.05);
    let mut noise = Lcg(7);
    let mean = |l: u32, scale: f64| 1e-3 * (l + 1) as f64 * scale;
    let run = |est: &mut SlackEstimator, noise: &mut Lcg, scale: f64, n: usize| {
        for _ in 0..n {
            for l in 0..4 {
                let d = mean(l, scale) * (1.0 + 0.2 * noise.next());
                est.record_layer_compute(l, Duration::from_secs_f64(d));
            }
        }
    };
    let close = |est: &SlackEstimator, scale: f64| {
        (0..4).all(|l| {
            let got = est.layer_compute(l).map_or(0.0, |d| d.as_secs_f64());
            (got - mean(l, scale)).abs() <= 0.08 * mean(l, scale)
        })
    };
    assert!(!close(&est, 1.0));
    run(&mut est, &mut noise, 1.0, 300);
    assert!(close(&est, 1.0), "{:?}", est.profile());
    assert_eq!(est.samples(2), 300);
    run(&mut est, &mut noise, 2.0, 150);
    assert!(
        close(&est, 2.0),
        "did not follow the step: {:?}",
        est.profile()
    );
    assert!(!close(&est, 1.0));

    // Bandwidth: 1 MiB reads at ~1 GB/s.
    for _ in 0..200 {
        let secs = (1 << 20) as f64 / 1e9 * (1.0 + 0.2 * noise.next());
        est.record_read(1 << 20, Duration::from_secs_f64(secs));
    }
    let bw = est.read_bandwidth().unwrap_or(0.0);
    assert!((bw - 1e9).abs() < 0.1e9, "{bw}");
    // Slack of layer 3 (4 ms) with 1 MiB of next-layer reads (~1 ms).
    let slack = est.slack(3, 1 << 20).unwrap_or_default().as_secs_f64();
    assert!((slack - (8e-3 - 1.05e-3)).abs() < 1e-3, "{slack}");
}

/// A profile file seeds the estimates; what was learned saves and loads
/// back; a bad profile is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profile_seeds_and_saves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("slack.json");
    std::fs::write(
        &path,
        r#"{"layer_compute_us": [1000.0, 2000.0, null, 4000.0], "write_bytes_per_sec": 2e9}"#,
    )
    .expect("write profile");
    let profile = SlackProfile::load(&path).expect("profile");
    let mut rig = rig0();
    let engine = rig.sched.engine().clone();
    rig.sched = IoScheduler::new(
        engine,
        SchedulerConfig {
            profile: Some(profile),
            ..SchedulerConfig::default()
        },
        rig.clock.clone(),
    )
    .expect("scheduler");
    let est = rig.sched.slack();
    assert_eq!(est.layer_compute(1), Some(2 * MS));
    assert_eq!(est.layer_compute(2), None);
    assert_eq!(est.write_bandwidth(), Some(2e9));
    rig.sched.record_layer_compute(2, 5 * MS);
    let out = dir.path().join("learned.json");
    rig.sched.save_profile(&out).expect("save");
    let back = SlackProfile::load(&out).expect("load");
    assert_eq!(back, rig.sched.slack().profile());
    assert_eq!(
        SlackEstimator::from_profile(0.2, &back).layer_compute(2),
        Some(5 * MS)
    );

    std::fs::write(&path, r#"{"layer_compute_us": [-1.0]}"#).expect("write");
    assert!(SlackProfile::load(&path).is_err());
    std::fs::write(&path, "not json").expect("write");
    assert!(SlackProfile::load(&path).is_err());
}

/// During a forward pass, writes go only into compute windows, and only as
/// many as the write bandwidth says finish before the window ends.
#[test]
fn writes_fill_compute_windows_only() {
    let mut p = IoPolicy::new(PolicyConfig::default());
    // 1 ms per MiB.
    let write_time = |b: u64| Some(Duration::from_secs_f64(b as f64 / (1u64 << 30) as f64));
    p.begin_forward();
    for i in 0..3 {
        p.push(OpId(i), IoClass::Write, 4 << 20);
    }
    assert!(
        p.next(Duration::ZERO, write_time).is_empty(),
        "no window: no write"
    );
    p.open_window(Some(10 * MS));
    assert!(
        p.next(Duration::ZERO, |_| None).is_empty(),
        "unknown bandwidth: no write"
    );
    // 4 + 4 ms fit in 10 ms; 12 ms do not.
    assert_eq!(p.next(Duration::ZERO, write_time), vec![OpId(0), OpId(1)]);
    assert!(p.complete(OpId(0)).is_some());
    assert!(p.complete(OpId(1)).is_some());
    assert!(p.next(9 * MS, write_time).is_empty(), "1 ms left: deferred");
    p.close_window();
    p.end_forward();
    assert_eq!(p.next(9 * MS, write_time), vec![OpId(2)]);
    assert!(p.counters().write_deferrals >= 3);
}

#[derive(Debug, Clone)]
enum Step {
    Push(IoClass, u64),
    Complete(usize),
    Next,
    Window(bool),
    Forward(bool),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (
            prop_oneof![Just(IoClass::Read), Just(IoClass::Write)],
            1u64..5_000_000
        )
            .prop_map(|(c, b)| Step::Push(c, b)),
        (0usize..64).prop_map(Step::Complete),
        Just(Step::Next),
        any::<bool>().prop_map(Step::Window),
        any::<bool>().prop_map(Step::Forward),
    ]
}

proptest! {
    /// Under any interleaving: a queued read never waits while a read slot
    /// is free (reads first); writes never exceed their limits, nor the
    /// budget while reads are pending.
    #[test]
    fn policy_invariants(steps in proptest::collection::vec(step(), 1..200), ops in 0usize..3, reads in 1usize..4) {
        let cfg = PolicyConfig {
            max_reads_in_flight: reads,
            max_writes_in_flight: 3,
            write_budget_while_reading: WriteBudget { max_ops: ops, max_bytes: 6_000_000 },
        };
        let mut p = IoPolicy::new(cfg);
        let mut next_id = 0u64;
        let mut in_flight: Vec<(OpId, IoClass, u64)> = Vec::new();
        let mut classes = std::collections::HashMap::new();
        let mut now = Duration::ZERO;
        let mut forward = false;
        for s in steps {
            match s {
                Step::Push(c, b) => {
                    p.push(OpId(next_id), c, b);
                    classes.insert(OpId(next_id), (c, b));
                    next_id += 1;
                }
                Step::Complete(i) if !in_flight.is_empty() => {
                    let (id, _, _) = in_flight.swap_remove(i % in_flight.len());
                    prop_assert!(p.complete(id).is_some());
                }
                Step::Complete(_) => {}
                Step::Window(true) => p.open_window(Some(now + 5 * MS)),
                Step::Window(false) => p.close_window(),
                Step::Forward(true) if !forward => { p.begin_forward(); forward = true; }
                Step::Forward(false) if forward => { p.end_forward(); forward = false; }
                Step::Forward(_) => {}
                Step::Next => {
                    for id in p.next(now, |b| Some(Duration::from_nanos(b))) {
                        let (c, b) = classes[&id];
                        in_flight.push((id, c, b));
                    }
                    let (rq, _) = p.queued();
                    let (rf, wf) = p.in_flight();
                    prop_assert!(rq == 0 || rf == reads, "a read waits with a free slot");
                    prop_assert!(wf <= 3);
                    prop_assert!(p.counters().max_write_ops_while_reading <= ops as u64);
                    prop_assert!(p.counters().max_write_bytes_while_reading <= 6_000_000);
                    if p.reads_pending() && ops == 0 {
                        prop_assert!(p.counters().writes_dispatched_while_reading == 0);
                    }
                }
            }
            now += Duration::from_micros(100);
        }
    }
}
