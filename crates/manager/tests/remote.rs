//! G4 end to end on the node's path: blocks stored into G2 cascade G2 -> G3
//! -> G4 (or G2 -> G4 with no G3) into a real remote tier — a directory
//! through `object_store`'s local file system, and a real S3-compatible
//! server (moto) — and are onboarded back into G2 landings layer by layer,
//! byte for byte; a corrupted object is a miss, never delivered.

use std::sync::Arc;
use std::time::Duration;

use kvtier_core::TierKind;
use kvtier_core::{BlockHash, BlockSums};
use kvtier_io::PsyncEngine;
use kvtier_manager::TierList;
use kvtier_manager::events::{BlockLocation, ChannelSink, EventBatch, EventSink, KvEvent};
use kvtier_manager::manager::{BlockManager, ManagerConfig, ManagerError};
use kvtier_manager::placement::{CascadeMode, HierarchyConfig, PlacementConfig};
use kvtier_manager::pool::PoolConfig;
use kvtier_manager::transfer::{BlockFailure, BlockMove, Span, TransferEngine, TransferRequest};
use kvtier_manager::{Tier, TransferPath};
use kvtier_mem::MemoryTier;
use kvtier_remote::test_support::MotoServer;
use kvtier_remote::{RemoteConfig, RemoteRead, RemoteTier};
use kvtier_tier::TierStore;
use tokio::sync::mpsc;

#[path = "support/tiers.rs"]
mod tiers;
use tiers::{disk, geometry, memory};

#[path = "support/node.rs"]
mod node;
use node::{assert_in_arena, chain, store_chain, with_bytes};

fn pool(blocks: usize) -> PoolConfig {
    PoolConfig {
        capacity_blocks: blocks,
        tokens_per_block: 16,
        high_watermark: 1.0,
        low_watermark: 1.0,
        ..PoolConfig::default()
    }
}

fn config(g3: bool) -> ManagerConfig {
    let mut placement = PlacementConfig {
        mode: CascadeMode::Exclusive,
        ..PlacementConfig::default()
    };
    placement.admission.min_reuses = 0;
    ManagerConfig {
        // The remote store takes the position after the last tier above
        // it: G4 below a disk, G3 right below the arena.
        hierarchy: HierarchyConfig::none()
            .with(Tier::G2, pool(4))
            .with(Tier::G3, g3.then(|| pool(4)))
            .with(remote_position(g3), pool(64))
            .with_placement(placement),
        ..ManagerConfig::default()
    }
}

/// Where the remote tier registers: below the disk when there is one.
fn remote_position(with_g3: bool) -> Tier {
    if with_g3 { Tier::G4 } else { Tier::G3 }
}

/// A remote tier in a fresh directory.
fn file_remote() -> (tempfile::TempDir, Arc<RemoteTier>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = RemoteConfig {
        url: format!("file://{}", dir.path().display()),
        ..RemoteConfig::default()
    };
    let remote = RemoteTier::open(&cfg, geometry()).expect("file remote");
    (dir, Arc::new(remote))
}

/// A remote tier in a fresh bucket of a moto server.
fn s3_remote(moto: &MotoServer, bucket: &str) -> Arc<RemoteTier> {
    moto.create_bucket(bucket);
    let cfg = moto.config(bucket, "node-a");
    Arc::new(RemoteTier::open(&cfg, geometry()).expect("s3 remote"))
}

struct Rig {
    manager: BlockManager,
    memory: MemoryTier,
    remote: Arc<RemoteTier>,
    events: mpsc::Receiver<Arc<EventBatch>>,
    _dir: Option<tempfile::TempDir>,
}

fn rig(remote: Arc<RemoteTier>, with_g3: bool) -> Rig {
    let memory = memory("g4", 4);
    let (dir, disk) = if with_g3 {
        let (d, t) = disk(
            "kvtier-mgr-g4",
            8 << 20,
            Arc::new(PsyncEngine::new(2, 64).expect("psync engine")),
        );
        (Some(d), Some(t))
    } else {
        (None, None)
    };
    let (sink, events) = ChannelSink::new(1024);
    let manager = BlockManager::new(
        config(with_g3),
        TierList::new(
            geometry(),
            Some(memory.clone()),
            disk.into_iter()
                .map(|d| d as Arc<dyn TierStore>)
                .chain([remote.clone() as Arc<dyn TierStore>])
                .collect::<Vec<_>>(),
        )
        .expect("tiers"),
        vec![Arc::new(sink) as Arc<dyn EventSink>],
    )
    .expect("manager");
    Rig {
        manager,
        memory,
        remote,
        events,
        _dir: dir,
    }
}

fn residency(m: &BlockManager, h: BlockHash) -> Vec<Tier> {
    m.registry().residency(h).iter().collect()
}

async fn listed(remote: &RemoteTier) -> Vec<BlockHash> {
    let mut keys = remote.list().await.expect("list");
    keys.sort();
    keys
}

/// Stores `chains` one after the other (each pushes the earlier ones down).
async fn store_all(m: &BlockManager, chains: &[&Vec<BlockHash>]) {
    for keys in chains {
        store_chain(m, keys).await;
    }
}

/// Onboards `keys` from G4 into G2 layer by layer and checks every byte
/// G2 serves.
async fn onboard_and_check(rig: &Rig, keys: &[BlockHash]) {
    let m = &rig.manager;
    // The remote store is the last tier of the list.
    let (remote_at, _) = *m.tiers().kinds().last().expect("tiers");
    let onboarding = m.begin_onboard(keys).await.expect("begin onboard");
    assert_eq!(onboarding.matched().count_in(remote_at), keys.len());
    assert!(onboarding.has_landings());
    for layer in 0..geometry().layers {
        let results = onboarding.wait_layer(layer).await;
        assert!(
            results.iter().all(|(_, r)| r.is_ok()),
            "layer {layer}: {results:?}"
        );
        m.record_layer_compute(layer, Duration::from_micros(50));
    }
    let onboarded = m.finish_onboard(onboarding).await.expect("finish onboard");
    assert!(onboarded.failed.is_empty(), "{:?}", onboarded.failed);
    let got: Vec<BlockHash> = onboarded.blocks.iter().map(|b| b.hash()).collect();
    assert_eq!(got, keys);
    assert_in_arena(&rig.memory, keys);
    for b in &onboarded.blocks {
        assert_eq!(residency(m, b.hash()), vec![Tier::G2], "moved, not copied");
    }
}

/// The whole life of a block through G4 over `remote`.
async fn cascade_and_onboard(remote: Arc<RemoteTier>) {
    let mut rig = rig(remote, true);
    let m = &rig.manager;
    let (a, b, c) = (chain(1, 4), chain(2, 4), chain(3, 4));
    // A: G2; B pushes A to G3; C pushes A to G4.
    store_all(m, &[&a, &b, &c]).await;
    for h in &a {
        assert_eq!(residency(m, *h), vec![Tier::G4], "{h}");
    }
    let mut want = a.clone();
    want.sort();
    assert_eq!(listed(&rig.remote).await, want, "one object per G4 block");
    let stats = m.stats();
    let d2r = stats
        .paths
        .iter()
        .find(|p| {
            p.path
                == TransferPath {
                    from: Tier::G3,
                    to: Tier::G4,
                }
        })
        .expect("disk2remote used");
    assert_eq!(d2r.bytes, 4 * geometry().block_bytes());

    onboard_and_check(&rig, &a).await;
    let stats = m.stats();
    assert_eq!(stats.tier(Tier::G4).expect("g4").hits, 4);
    assert!(stats.paths.iter().any(|p| p.path
        == TransferPath {
            from: Tier::G4,
            to: Tier::G2
        }
        && p.bytes > 0));
    // Exclusive: the blocks left G4, and so did their objects; the blocks
    // pushed down to make room for them are there instead. The objects
    // are exactly G4's blocks.
    m.flush_events();
    m.settle().await;
    let mut in_g4: Vec<BlockHash> = [&a, &b, &c]
        .into_iter()
        .flatten()
        .copied()
        .filter(|h| residency(m, *h).contains(&Tier::G4))
        .collect();
    in_g4.sort();
    assert!(!in_g4.is_empty() && !in_g4.iter().any(|h| a.contains(h)));
    assert_eq!(listed(&rig.remote).await, in_g4);

    // G4's events name the objects.
    let mut g4_stored = Vec::new();
    while let Ok(batch) = rig.events.try_recv() {
        for e in batch.events.iter() {
            if let KvEvent::Stored(s) = e
                && s.tier == Tier::G4
            {
                g4_stored.push(s.clone());
            }
        }
    }
    let g4_stats = m.stats().tier(Tier::G4).expect("g4").stored_events;
    assert!(g4_stored.len() >= 8, "A, then B pushed down by A's onboard");
    assert_eq!(g4_stored.len() as u64, g4_stats);
    for s in g4_stored {
        let uri = rig.remote.object_uri(s.block_hashes[0]);
        assert_eq!(s.location, Some(BlockLocation::Uri { uri }));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_cascade_to_a_directory_and_come_back() {
    let (_dir, remote) = file_remote();
    cascade_and_onboard(remote).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_cascade_to_s3_and_come_back() {
    let moto = MotoServer::start();
    let remote = s3_remote(&moto, "kvtier-g4-cascade");
    cascade_and_onboard(remote).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_disk_host_memory_cascades_to_the_remote_tier_at_g3() {
    let (_dir, remote) = file_remote();
    let rig = rig(remote, false);
    let m = &rig.manager;
    // The list is the arena and the remote store, which registered right
    // below it.
    let kinds: Vec<_> = m.tiers().kinds();
    assert_eq!(
        kinds,
        [(Tier::G2, TierKind::Memory), (Tier::G3, TierKind::Remote)]
    );
    let (a, b) = (chain(5, 4), chain(6, 4));
    store_all(m, &[&a, &b]).await;
    for h in &a {
        assert_eq!(residency(m, *h), vec![Tier::G3], "{h}");
    }
    let moved = |from, to| {
        m.stats()
            .paths
            .iter()
            .any(|p| p.path == TransferPath { from, to } && p.bytes > 0)
    };
    assert!(moved(Tier::G2, Tier::G3));
    // Onboarded back from G3 into the arena, verified.
    onboard_and_check(&rig, &a).await;
    assert!(moved(Tier::G3, Tier::G2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_object_is_a_miss_never_delivered() {
    let (dir, remote) = file_remote();
    let rig = rig(remote, false);
    let m = &rig.manager;
    let (a, b) = (chain(8, 4), chain(9, 4));
    store_all(m, &[&a, &b]).await;
    // Flip one byte of A[2]'s data (its last byte) in the object file.
    let uri = rig.remote.object_uri(a[2]);
    let path = uri.strip_prefix("file://").expect("file uri");
    assert!(std::path::Path::new(path).starts_with(dir.path()), "{uri}");
    let mut bytes = std::fs::read(path).expect("object file");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(path, &bytes).expect("rewrite");

    let onboarding = m.begin_onboard(&a).await.expect("begin");
    for layer in 0..geometry().layers {
        onboarding.wait_layer(layer).await;
    }
    let onboarded = m.finish_onboard(onboarding).await.expect("finish");
    let got: Vec<BlockHash> = onboarded.blocks.iter().map(|b| b.hash()).collect();
    assert_eq!(got, a[..2], "the prefix ends before the corrupt block");
    assert!(
        onboarded
            .failed
            .iter()
            .any(|(h, e)| *h == a[2] && *e == BlockFailure::Corrupt),
        "{:?}",
        onboarded.failed
    );
    assert!(m.stats().verify_failures >= 1);
    // Forgotten by G4: the next lookup does not offer it again.
    assert!(residency(m, a[2]).is_empty());
    assert_eq!(m.lookup(&a).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g4_needs_its_remote_tier_and_g2() {
    let no_remote = BlockManager::new(
        config(false),
        TierList::new(geometry(), Some(memory("g4cfg", 4)), vec![]).expect("tiers"),
        Vec::new(),
    );
    assert!(matches!(no_remote, Err(ManagerError::Config(_))));
    let (_dir, remote) = file_remote();
    let mut cfg = config(false);
    cfg.hierarchy.pools.remove(&Tier::G2);
    let no_g2 = BlockManager::new(
        cfg,
        TierList::new(geometry(), None, vec![remote as Arc<dyn TierStore>]).expect("tiers"),
        Vec::new(),
    );
    assert!(matches!(no_g2, Err(ManagerError::Config(_))));
}

/// The remote-to-host path (promotion into DRAM) at the engine level:
/// the bytes land in a DRAM slot only once verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_moves_blocks_between_host_memory_and_the_remote_tier() {
    let (_dir, remote) = file_remote();
    let mem = memory("g4eng", 8);
    let engine = TransferEngine::builder(tiers::list(
        Some(&mem),
        vec![remote.clone() as Arc<dyn TierStore>],
    ))
    .build()
    .expect("engine");
    // The remote store registered right below the arena: one path each way.
    let path = |from, to| TransferPath { from, to };
    assert_eq!(
        engine.tiers().paths(),
        [path(Tier::G2, Tier::G3), path(Tier::G3, Tier::G2)]
    );
    let keys = chain(11, 3);
    let g = geometry();
    for (k, bytes) in with_bytes(&keys) {
        let sums = BlockSums::compute(k, g.layer_bytes() as usize, &bytes);
        mem.put(k, &bytes, &sums).expect("put in DRAM");
    }
    let blocks: Vec<BlockMove> = keys.iter().map(|k| BlockMove::key(*k)).collect();
    let up = engine
        .submit(TransferRequest::blocks(
            TransferPath {
                from: Tier::G2,
                to: Tier::G3,
            },
            blocks.clone(),
        ))
        .wait()
        .await;
    assert!(up.all_delivered(), "{up:?}");
    // Layer spans are for reads into the arena, not for an offload.
    let layered = engine
        .submit(TransferRequest {
            path: TransferPath {
                from: Tier::G2,
                to: Tier::G3,
            },
            span: Span::Layer(0),
            blocks: blocks.clone(),
        })
        .wait()
        .await;
    assert!(matches!(
        layered.blocks[0].1,
        Err(BlockFailure::InvalidRequest(_))
    ));
    for k in &keys {
        assert!(mem.remove(*k));
    }
    // A key never written is a miss; the others come back verified.
    let mut back = blocks.clone();
    back.push(BlockMove::key(BlockHash(0xdead)));
    let down = engine
        .submit(TransferRequest::blocks(
            TransferPath {
                from: Tier::G3,
                to: Tier::G2,
            },
            back,
        ))
        .wait()
        .await;
    assert_eq!(down.delivered(), 3);
    assert_eq!(
        down.failures(),
        vec![(BlockHash(0xdead), BlockFailure::Miss)]
    );
    for (k, bytes) in with_bytes(&keys) {
        let r = mem.get_ref(k).expect("in DRAM again");
        assert_eq!(&r[..], &bytes[..]);
    }
    // The remote copies are intact and readable directly too.
    for read in remote.get_batch(&keys).await {
        assert!(matches!(read, RemoteRead::Hit { .. }));
    }
}
