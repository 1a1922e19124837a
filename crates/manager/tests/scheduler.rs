//! Tutti's scheduler: reads overtake queued writes, the write budget holds
//! while reads are pending, writes wait for slack, `wait_layer` follows the
//! layers, bubble time is measured on a manual clock, and slack estimates
//! converge. The node's paths carry the I/O: loads are layer reads from the
//! disk into G2 landings, offloads G2 -> disk writes. Disk batches are held
//! at an [`GatedEngine`] and released by the test, so every ordering is decided
//! by the test, never by sleeps.

use std::sync::Arc;
use std::time::Duration;

use kvtier_arena::ArenaClient;
use kvtier_core::{BlockHash, BlockSums, Lookup};
use kvtier_disk::DiskTier;
use kvtier_io::PsyncEngine;
use kvtier_manager::scheduler::{
    Clock, IoClass, IoPolicy, IoScheduler, ManualClock, OpId, PolicyConfig, SchedulerConfig,
    SlackEstimator, SlackProfile, WriteBudget,
};
use kvtier_manager::transfer::{
    BlockMove, HostLanding, TransferEngine, TransferHandle, TransferRequest,
};
use kvtier_manager::{Tier, TransferPath};
use kvtier_mem::{MemoryTier, Reserve};
use kvtier_tier::TierStore;
use proptest::prelude::*;

use kvtier_io::{GatedEngine, Held};

#[path = "support/tiers.rs"]
// Shared with other tests; this one needs DRAM and a disk.
#[allow(dead_code)]
mod tiers;
use tiers::{disk, geometry, memory};

const MS: Duration = Duration::from_millis(1);

fn key(i: u64) -> BlockHash {
    BlockHash(0xabc0_0000_0000 + i as u128)
}

fn content(key: BlockHash, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (key.fold64() as usize).wrapping_mul(31).wrapping_add(i * 7) as u8)
        .collect()
}

/// DRAM, a disk behind a gate, an engine and a scheduler on a manual clock.
struct Rig {
    gate: Arc<GatedEngine>,
    mem: MemoryTier,
    disk: Arc<DiskTier>,
    sched: IoScheduler,
    clock: Arc<ManualClock>,
    _dir: tempfile::TempDir,
}

fn rig(policy: PolicyConfig) -> Rig {
    let gate = Arc::new(GatedEngine::new(Arc::new(
        PsyncEngine::new(2, 64).expect("psync engine"),
    )));
    let (dir, disk) = disk("kvtier-mgr-sched", 4 << 20, gate.clone());
    let mem = memory("sched", 64);
    let engine = TransferEngine::builder(tiers::list(
        Some(&mem),
        vec![disk.clone() as Arc<dyn TierStore>],
    ))
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
        gate,
        mem,
        disk,
        sched,
        clock,
        _dir: dir,
    }
}

impl Rig {
    /// Blocks in DRAM, to offload.
    fn in_dram(&self, keys: &[BlockHash]) {
        let g = geometry();
        for k in keys {
            let data = content(*k, g.block_bytes() as usize);
            let sums = BlockSums::compute(*k, g.layer_bytes() as usize, &data);
            self.mem.put(*k, &data, &sums).expect("put");
        }
    }

    /// Blocks on the disk only (written past the scheduler), to load.
    async fn on_disk(&self, keys: &[BlockHash]) {
        self.in_dram(keys);
        let moves = keys.iter().map(|k| BlockMove::key(*k)).collect();
        let out = self
            .sched
            .engine()
            .submit(TransferRequest::blocks(
                TransferPath {
                    from: Tier::G2,
                    to: Tier::G3,
                },
                moves,
            ))
            .wait()
            .await;
        assert!(out.all_delivered(), "{:?}", out.failures());
        for k in keys {
            assert!(self.mem.remove(*k));
        }
    }

    fn offload(&self, k: BlockHash) -> TransferHandle {
        self.sched.submit(TransferRequest::blocks(
            TransferPath {
                from: Tier::G2,
                to: Tier::G3,
            },
            vec![BlockMove::key(k)],
        ))
    }

    /// A reserved DRAM slot for each block, where its layers land.
    fn load_targets(&self, keys: &[BlockHash]) -> Vec<BlockMove> {
        keys.iter()
            .map(|k| match self.mem.reserve(*k).expect("reserve") {
                Reserve::Reserved(slot) => {
                    BlockMove::landing(HostLanding::new(slot, geometry().layers))
                }
                other => panic!("no landing for {k}: {other:?}"),
            })
            .collect()
    }

    /// Loads `targets` from the disk, layer by layer.
    fn load(&self, targets: Vec<BlockMove>) -> kvtier_manager::scheduler::LoadHandle {
        self.sched.load(
            TransferPath {
                from: Tier::G3,
                to: Tier::G2,
            },
            targets,
        )
    }
}

/// Writes are queued behind one that is stuck at the disk; a load
/// submitted after them runs all its layers before any of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_overtake_queued_writes() {
    let rig = rig(PolicyConfig {
        max_writes_in_flight: 1,
        ..PolicyConfig::default()
    });
    let w: Vec<BlockHash> = (0..3).map(|i| key(100 + i)).collect();
    rig.in_dram(&w);
    let r: Vec<BlockHash> = (0..2).map(key).collect();
    rig.on_disk(&r).await;
    let logged = rig.gate.log().len();

    rig.gate.hold(Held::Writes);
    let writes: Vec<TransferHandle> = w.iter().map(|k| rig.offload(*k)).collect();
    let s = rig.sched.stats();
    assert_eq!((s.policy.writes_dispatched, s.writes_queued), (1, 2));
    // Dispatched is not yet at the disk: wait until the write is held
    // there, so the gate's log orders it before the load's layers.
    rig.gate.wait_held(1).await;

    let load = rig.load(rig.load_targets(&r));
    for layer in load.wait_all().await {
        assert!(layer.all_delivered(), "{layer:?}");
    }
    // Every read ran while two writes were still queued.
    let s = rig.sched.stats();
    assert_eq!(s.policy.reads_dispatched, 4);
    assert_eq!((s.policy.writes_dispatched, s.writes_queued), (1, 2));
    drop(load);

    for _ in 0..3 {
        rig.gate.release_next().await;
    }
    for h in &writes {
        assert!(h.wait().await.all_delivered());
    }
    let (wr, rd) = (Held::Writes, Held::Reads);
    assert_eq!(rig.gate.log()[logged..], [wr, rd, rd, rd, rd, wr, wr]);
    assert!(w.iter().all(|k| rig.disk.contains(*k)));
}

/// While reads are pending (held at the disk), at most `max_ops` writes
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
    rig.on_disk(&r).await;
    let w: Vec<BlockHash> = (0..4).map(|i| key(200 + i)).collect();
    rig.in_dram(&w);

    rig.gate.hold(Held::Reads);
    let load = rig.load(rig.load_targets(&r));
    let writes: Vec<TransferHandle> = w.iter().map(|k| rig.offload(*k)).collect();
    for h in &writes {
        assert!(h.wait().await.all_delivered());
    }
    let s = rig.sched.stats();
    assert!(!load.is_layer_ready(0), "the reads were held all along");
    assert_eq!(s.policy.writes_dispatched_while_reading, 4);
    assert_eq!(s.policy.max_write_ops_while_reading, 1);

    for _ in 0..4 {
        rig.gate.release_next().await;
    }
    assert!(load.wait_all().await.iter().all(|l| l.all_delivered()));
    drop(load);

    // Zero budget: a write waits for every read.
    let rig = rig0();
    rig.on_disk(&r).await;
    rig.in_dram(&w[..1]);
    rig.gate.hold(Held::Reads);
    let load = rig.load(rig.load_targets(&r));
    let write = rig.offload(w[0]);
    let s = rig.sched.stats();
    assert_eq!((s.policy.writes_dispatched, s.writes_queued), (0, 1));
    for _ in 0..4 {
        rig.gate.release_next().await;
    }
    assert!(load.wait_all().await.iter().all(|l| l.all_delivered()));
    // Reads are done but the forward pass is on, with no compute window:
    // still deferred. Ending the pass frees the disk for writing.
    assert_eq!(rig.sched.stats().policy.writes_dispatched, 0);
    drop(load);
    assert!(write.wait().await.all_delivered());
    assert_eq!(rig.sched.stats().policy.max_write_ops_while_reading, 0);
}

fn rig0() -> Rig {
    rig(PolicyConfig::default())
}

/// One read batch per layer holding every block; `wait_layer(l)` resolves
/// once layer `l` of every block is in its landing and before layer
/// `l + 1` has arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_layer_follows_layer_order() {
    let rig = rig0();
    let g = geometry();
    let len = g.block_bytes() as usize;
    let r: Vec<BlockHash> = (0..3).map(|i| key(300 + i)).collect();
    rig.on_disk(&r).await;
    let targets = rig.load_targets(&r);
    let landings: Vec<Arc<HostLanding>> =
        targets.iter().filter_map(|t| t.landing.clone()).collect();
    let arena = ArenaClient::open(rig.mem.shm_name()).expect("map the arena");
    rig.gate.hold(Held::Reads);
    let load = rig.load(targets);
    let mut dst = vec![0u8; g.layer_bytes() as usize];
    for l in 0..g.layers {
        assert!(!load.is_layer_ready(l), "layer {l} ready before its I/O");
        rig.gate.release_next().await;
        let out = load.wait_layer(l).await;
        assert!(out.all_delivered(), "{out:?}");
        let range = g.layer_range(l);
        let range = range.start as usize..range.end as usize;
        for (k, landing) in r.iter().zip(&landings) {
            let sum = landing.layer_sum(l).expect("layer sum");
            let got = arena
                .read_layer(landing.slot(), *k, l as usize, sum, &mut dst)
                .expect("read layer");
            assert_eq!(got, Lookup::Hit, "layer {l} of {k}");
            assert!(dst == content(*k, len)[range.clone()], "layer {l} of {k}");
        }
        if l + 1 < g.layers {
            assert!(!load.is_layer_ready(l + 1), "layer {} arrived early", l + 1);
            // Not whole yet: the last layer publishes the block.
            let mut whole = vec![0u8; len];
            assert!(
                r.iter()
                    .all(|k| rig.mem.get(*k, &mut whole) == Lookup::Miss)
            );
        }
    }
    assert_eq!(rig.gate.held(), 0, "one batch per layer");
    assert_eq!(rig.sched.stats().layer_waits, g.layers as u64);
    let mut whole = vec![0u8; len];
    for k in &r {
        assert_eq!(rig.mem.get(*k, &mut whole), Lookup::Hit);
        assert!(whole == content(*k, len), "{k}");
    }
}

/// Plays a load whose layers take `io` each to read (back to back) against
/// a consumer computing `compute` per layer, on the manual clock; returns
/// (measured bubble, the model's bubble, blocked waits).
async fn play(io: Duration, compute: Duration) -> (Duration, Duration, u64) {
    let rig = rig0();
    let g = geometry();
    let r: Vec<BlockHash> = (0..2).map(|i| key(400 + i)).collect();
    rig.on_disk(&r).await;
    rig.gate.hold(Held::Reads);
    let load = rig.load(rig.load_targets(&r));
    // The consumer reaches layer 0 when layer 0's I/O would be done.
    let mut consumer_at = io;
    let mut expected = Duration::ZERO;
    let mut blocked = 0;
    for l in 0..g.layers {
        let io_done = io * (l + 1);
        if io_done <= consumer_at {
            rig.clock.advance_to(io_done);
            rig.gate.release_next().await;
            rig.clock.advance_to(consumer_at);
            load.wait_layer(l).await;
        } else {
            rig.clock.advance_to(consumer_at);
            let wait = load.wait_layer(l);
            rig.clock.advance_to(io_done);
            rig.gate.release_next().await;
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
