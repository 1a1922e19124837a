//! The assembled [`BlockManager`] end to end over real tiers, as the node
//! runs it: a shared-memory arena in /dev/shm as G2 (the top tier) and a
//! disk tier in a temporary directory as G3, its reads gated where the test
//! decides when layers land.

use std::sync::Arc;
use std::time::Duration;

use kvtier_arena::{ArenaClient, ArenaReader};
use kvtier_core::{BlockHash, BlockSums, Lookup};
use kvtier_disk::DiskTier;
use kvtier_io::{IoEngine, PsyncEngine};
use kvtier_manager::TierList;
use kvtier_manager::admission::AdmissionConfig;
use kvtier_manager::events::{ChannelSink, EventBatch, EventSink, KvEvent, PublisherConfig};
use kvtier_manager::manager::{BlockManager, HostCommit, HostReserve, ManagerConfig, ManagerError};
use kvtier_manager::placement::{CascadeMode, HierarchyConfig, PlacementConfig};
use kvtier_manager::pool::{PoolConfig, Presence};
use kvtier_manager::test_support::block_content;
use kvtier_manager::{Tier, TransferPath};
use kvtier_mem::{MemoryTier, PutOutcome};
use kvtier_tier::{BlockPut, TierStore};
use tokio::sync::mpsc;

use kvtier_io::{GatedEngine, Held};

#[path = "support/tiers.rs"]
// Shared with other tests; this one needs node arenas and disks.
#[allow(dead_code)]
mod tiers;
use tiers::{disk, geometry, memory};

#[path = "support/node.rs"]
mod node;
use node::{assert_in_arena, chain, store_chain, with_bytes};

fn pool(blocks: usize) -> PoolConfig {
    PoolConfig {
        capacity_blocks: blocks,
        tokens_per_block: 16,
        // No watermark offload: the cascade here is made on demand.
        high_watermark: 1.0,
        low_watermark: 1.0,
        ..PoolConfig::default()
    }
}

fn config(mode: CascadeMode) -> ManagerConfig {
    config_with_g3(mode, 16)
}

/// [`config`] with a G3 pool of `g3` blocks.
fn config_with_g3(mode: CascadeMode, g3: usize) -> ManagerConfig {
    ManagerConfig {
        hierarchy: HierarchyConfig::none()
            .with(Tier::G2, Some(pool(4)))
            .with(Tier::G3, Some(pool(g3)))
            .with_placement(PlacementConfig {
                mode,
                admission: AdmissionConfig {
                    min_reuses: 0,
                    ..AdmissionConfig::default()
                },
            }),
        events: PublisherConfig {
            max_batch_events: 1,
            ..PublisherConfig::default()
        },
        ..ManagerConfig::default()
    }
}

struct Rig {
    manager: BlockManager,
    memory: MemoryTier,
    gate: Arc<GatedEngine>,
    batches: mpsc::Receiver<Arc<EventBatch>>,
    _dir: tempfile::TempDir,
}

/// A node's manager (G2 on a node arena of 4 slots, G3 of 16 on a disk
/// whose reads the test may hold) publishing its events to a channel.
fn rig(cfg: ManagerConfig) -> Rig {
    let gate = Arc::new(GatedEngine::new(psync()));
    let (dir, disk) = disk("kvtier-mgr-e2e", 8 << 20, gate.clone());
    let memory = memory("node", 4);
    let (sink, batches) = ChannelSink::new(1024);
    let manager = BlockManager::new(
        cfg,
        TierList::new(
            geometry(),
            Some(memory.clone()),
            vec![disk as Arc<dyn TierStore>],
        )
        .expect("tiers"),
        vec![Arc::new(sink) as Arc<dyn EventSink>],
    )
    .expect("manager");
    Rig {
        manager,
        memory,
        gate,
        batches,
        _dir: dir,
    }
}

/// Every event published so far, in order.
fn events(rx: &mut mpsc::Receiver<Arc<EventBatch>>) -> Vec<KvEvent> {
    let mut out = Vec::new();
    while let Ok(b) = rx.try_recv() {
        out.extend(b.events.iter().cloned());
    }
    out
}

/// `(tier, stored?, hash)` of each event.
fn digest(events: &[KvEvent]) -> Vec<(Tier, bool, BlockHash)> {
    events
        .iter()
        .flat_map(|e| match e {
            KvEvent::Stored(s) => s.block_hashes.iter().map(|h| (s.tier, true, *h)).collect(),
            KvEvent::Removed(r) => r.block_hashes.iter().map(|h| (r.tier, false, *h)).collect(),
            KvEvent::AllCleared { .. } => Vec::new(),
        })
        .collect()
}

fn residency(m: &BlockManager, h: BlockHash) -> Vec<Tier> {
    m.registry().residency(h).iter().collect()
}

/// When the tier below cannot take every victim (what it holds is pinned
/// by the request being onboarded), the prefixes go down and the tails
/// are dropped, as the last tier drops its victims: the tier above still
/// gets the room the request asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn victims_the_tier_below_cannot_take_are_dropped_tails_first() {
    let rig = rig(config_with_g3(CascadeMode::Exclusive, 3));
    let m = &rig.manager;
    let x = chain(3, 2);
    let a = chain(1, 4);
    // X goes down to G3 to make room for A: G2 = A, G3 = X and one slot.
    store_chain(m, &x).await;
    store_chain(m, &a).await;
    for h in &x {
        assert_eq!(residency(m, *h), vec![Tier::G3]);
    }
    let dropped = m.stats().dropped;
    // A request for X and two new blocks needs all of G2; G3 can take one
    // of A's blocks (X is pinned while room is made): A's root.
    let request: Vec<BlockHash> = x.iter().copied().chain(chain(4, 2)).collect();
    let onboarding = m.begin_onboard(&request).await.expect("begin onboard");
    assert_eq!(onboarding.loading(), 2);
    for layer in 0..geometry().layers {
        onboarding.wait_layer(layer).await;
    }
    let onboarded = m.finish_onboard(onboarding).await.expect("finish onboard");
    assert!(onboarded.failed.is_empty());
    assert_eq!(onboarded.blocks.len(), 2);
    drop(onboarded);
    for h in &x {
        assert_eq!(residency(m, *h), vec![Tier::G2]);
    }
    assert_eq!(residency(m, a[0]), vec![Tier::G3]);
    for h in &a[1..] {
        assert_eq!(residency(m, *h), vec![], "{h}");
    }
    assert_eq!(m.stats().dropped - dropped, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_cascade_down_and_onboard_back_layer_by_layer() {
    let mut rig = rig(config(CascadeMode::Exclusive));
    let m = &rig.manager;
    let a = chain(1, 4);
    let b = chain(2, 4);
    // A fills G2; B pushes A down to G3.
    store_chain(m, &a).await;
    store_chain(m, &b).await;
    for h in &a {
        assert_eq!(residency(m, *h), vec![Tier::G3]);
        assert!(!rig.memory.contains(*h), "{h} left G2 but not its arena");
    }
    for h in &b {
        assert_eq!(residency(m, *h), vec![Tier::G2]);
    }

    // Onboard A back from G3, layer by layer into arena landings; B goes
    // down to make room.
    let onboarding = m.begin_onboard(&a).await.expect("begin onboard");
    assert_eq!(onboarding.matched().count_in(Tier::G3), 4);
    assert_eq!(onboarding.loading(), 4);
    assert!(onboarding.has_landings());
    for layer in 0..geometry().layers {
        let results = onboarding.wait_layer(layer).await;
        assert_eq!(results.len(), 4);
        assert!(
            results.iter().all(|(_, r)| r.is_ok()),
            "layer {layer}: {results:?}"
        );
        m.record_layer_compute(layer, Duration::from_micros(50));
    }
    let onboarded = m.finish_onboard(onboarding).await.expect("finish onboard");
    assert!(onboarded.failed.is_empty());
    assert_eq!(
        onboarded
            .blocks
            .iter()
            .map(|b| b.hash())
            .collect::<Vec<_>>(),
        a
    );
    assert_in_arena(&rig.memory, &a);
    for h in &a {
        // Exclusive: the block moved, it is in G2 only.
        assert_eq!(residency(m, *h), vec![Tier::G2]);
    }
    for h in &b {
        assert_eq!(residency(m, *h), vec![Tier::G3]);
    }
    drop(onboarded);
    let stats = m.stats();
    assert_eq!(stats.tier(Tier::G3).expect("g3").hits, 4);
    assert!(stats.scheduler.layer_waits >= u64::from(geometry().layers));
    assert!(stats.paths.iter().any(|p| p.path
        == TransferPath {
            from: Tier::G3,
            to: Tier::G2
        }
        && p.bytes > 0));

    // Events, in order per tier: each tier's stored / removed history is
    // what the blocks went through.
    m.flush_events();
    let all = events(&mut rig.batches);
    assert!(!all.is_empty());
    let log = digest(&all);
    let per_tier = |t: Tier| -> Vec<(bool, BlockHash)> {
        log.iter()
            .filter(|(tier, _, _)| *tier == t)
            .map(|(_, s, h)| (*s, *h))
            .collect()
    };
    let g2 = per_tier(Tier::G2);
    let stored = |keys: &[BlockHash]| keys.iter().map(|h| (true, *h)).collect::<Vec<_>>();
    // G2: A stored, then A removed (4 victims) before B is stored...
    assert_eq!(&g2[..4], &stored(&a)[..]);
    assert!(g2[4..8].iter().all(|(s, h)| !s && a.contains(h)));
    assert_eq!(&g2[8..12], &stored(&b)[..]);
    // ...and at the end A is stored again (onboarded).
    assert!(g2[g2.len() - 4..].iter().all(|(s, h)| *s && a.contains(h)));
    // G3 stored A (pushed down by B), then B (pushed down to make room
    // for A), then removed A when it moved up. Victims go leaves first,
    // but the moves are written root first (co-location on disk), so a
    // chain arrives below in chain order.
    let g3 = per_tier(Tier::G3);
    assert_eq!(g3.len(), 12, "{g3:?}");
    assert_eq!(&g3[..4], &stored(&a)[..]);
    assert_eq!(&g3[4..8], &stored(&b)[..]);
    let mut removed = g3[8..].to_vec();
    removed.sort_by_key(|(_, h)| *h);
    assert_eq!(removed, a.iter().map(|h| (false, *h)).collect::<Vec<_>>());
    // A stored event of every block names its tier's bytes and parent.
    for e in &all {
        if let KvEvent::Stored(s) = e {
            assert_eq!(s.bytes, geometry().block_bytes());
            let h = s.block_hashes[0];
            let expected_parent = [&a, &b]
                .iter()
                .find_map(|k| {
                    k.iter()
                        .position(|x| *x == h)
                        .map(|i| i.checked_sub(1).map(|j| k[j]))
                })
                .flatten();
            assert_eq!(s.parent_hash, expected_parent, "parent of {h}");
            if s.tier == Tier::G2 {
                assert!(s.location.is_some(), "G2 events carry the arena slot");
            }
        }
    }
    // Every block is somewhere: nothing was dropped.
    assert_eq!(m.stats().dropped, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_in_flight_is_neither_readable_nor_evictable() {
    let rig = rig(config(CascadeMode::Exclusive));
    let m = &rig.manager;
    let a = chain(7, 4);
    let b = chain(8, 4);
    store_chain(m, &a).await;
    store_chain(m, &b).await;
    // A is in G3 now; B in G2. Hold the disk's reads: onboarding A starts,
    // but its layers do not land.
    let g2 = m.pool(Tier::G2).expect("g2");
    let g3 = m.pool(Tier::G3).expect("g3");
    rig.gate.hold(Held::Reads);
    let onboarding = m.begin_onboard(&a[..2]).await.expect("begin");
    let mut buf = vec![0u8; geometry().block_bytes() as usize];
    for h in &a[..2] {
        // Not readable in G2 (filling), not matchable there, not in the
        // arena.
        assert_eq!(g2.presence(*h), Some(Presence::Filling));
        assert!(g2.acquire(*h).is_none());
        assert_eq!(rig.memory.get(*h, &mut buf), Lookup::Miss);
        assert_eq!(m.lookup(&[*h]).blocks[0].tier, Tier::G3);
    }
    // The landings' slots in G2 cannot be evicted: making room for A[..2]
    // sent two of B to G3, and only the other two of B may go.
    assert_eq!(g2.available(), 2);
    let leaving = g2.plan_leaving(4);
    assert_eq!(leaving.len(), 2);
    assert!(leaving.iter().all(|l| b.contains(&l.hash())));
    drop(leaving);
    // Nor can the sources in G3: everything else there may go.
    let leaving = g3.plan_leaving(16);
    assert_eq!(leaving.len(), 4, "A[2..] and two of B");
    assert!(leaving.iter().all(|l| !a[..2].contains(&l.hash())));
    drop(leaving);
    // Layer 0 lands; the next layer is held. The block is still not
    // readable: a layer-wise move settles on its last layer only.
    rig.gate.release_next().await;
    let layer0 = onboarding.wait_layer(0).await;
    assert!(layer0.iter().all(|(_, r)| r.is_ok()), "{layer0:?}");
    for h in &a[..2] {
        assert_eq!(g2.presence(*h), Some(Presence::Filling));
        assert_eq!(rig.memory.get(*h, &mut buf), Lookup::Miss);
    }
    // Let every layer land.
    rig.gate.open();
    let onboarded = m.finish_onboard(onboarding).await.expect("finish");
    assert_eq!(onboarded.blocks.len(), 2);
    for h in &a[..2] {
        assert_eq!(g2.presence(*h), Some(Presence::Ready));
        assert!(g3.presence(*h).is_none(), "exclusive: moved out of G3");
    }
    assert_in_arena(&rig.memory, &a[..2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inclusive_mode_keeps_copies_below() {
    let rig = rig(config(CascadeMode::Inclusive));
    let m = &rig.manager;
    let a = chain(11, 3);
    store_chain(m, &a).await;
    for h in &a {
        assert_eq!(
            residency(m, *h),
            vec![Tier::G2, Tier::G3],
            "write-through copy of {h}"
        );
    }
    let stats = m.stats();
    let h2disk = stats
        .paths
        .iter()
        .find(|p| {
            p.path
                == TransferPath {
                    from: Tier::G2,
                    to: Tier::G3,
                }
        })
        .expect("h2disk used");
    assert_eq!(h2disk.bytes, 3 * geometry().block_bytes());
    // The copy below is whole: with G2's copies gone, the blocks come
    // back from G3 with their bytes.
    assert_eq!(m.pool(Tier::G2).expect("g2").remove_inactive_many(&a), 3);
    m.flush_events();
    let onboarded = m
        .finish_onboard(m.begin_onboard(&a).await.expect("begin"))
        .await
        .expect("finish");
    assert_eq!(onboarded.blocks.len(), 3, "failed: {:?}", onboarded.failed);
    assert_in_arena(&rig.memory, &a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_offloads_down_to_the_low_watermark() {
    let mut cfg = config(CascadeMode::Exclusive);
    if let Some(g2) = cfg.hierarchy.tier_mut(Tier::G2) {
        g2.high_watermark = 0.5;
        g2.low_watermark = 0.25;
    }
    cfg.step_waits = true;
    let rig = rig(cfg);
    let m = &rig.manager;
    let a = chain(21, 3);
    store_chain(m, &a).await;
    // 3 of 4 used is above the high watermark (2): down to the low one (1),
    // leaves first, so the chain's root stays in G2.
    assert_eq!(m.step().await, 2);
    assert_eq!(residency(m, a[0]), vec![Tier::G2]);
    assert_eq!(residency(m, a[1]), vec![Tier::G3]);
    assert_eq!(residency(m, a[2]), vec![Tier::G3]);
    // Below the high watermark now: nothing more to do.
    assert_eq!(m.step().await, 0);
    let stats = m.stats();
    assert_eq!(stats.tier(Tier::G2).expect("g2").offloaded, 2);
    // The offloaded bytes arrived intact: onboard them back.
    let onboarding = m.begin_onboard(&a).await.expect("begin");
    assert_eq!(onboarding.loading(), 2);
    let onboarded = m.finish_onboard(onboarding).await.expect("finish");
    assert_eq!(onboarded.blocks.len(), 3);
    assert!(onboarded.failed.is_empty());
    assert_in_arena(&rig.memory, &a);
}

/// G2 is the top tier and must be there, with its arena; what the tiers
/// are given must agree with what is configured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiers_must_match_the_configuration() {
    let build = |g2: bool, g3: bool, memory_tier: bool| {
        let config = ManagerConfig {
            hierarchy: HierarchyConfig::none()
                .with(Tier::G2, g2.then(|| pool(4)))
                .with(Tier::G3, g3.then(|| pool(4)))
                .with_placement(PlacementConfig::default()),
            ..ManagerConfig::default()
        };
        let tiers = TierList::new(geometry(), memory_tier.then(|| memory("node", 4)), vec![])
            .expect("tiers");
        BlockManager::new(config, tiers, Vec::new())
    };
    let refused = |r: Result<BlockManager, ManagerError>, why: &str| match r {
        Err(e) => assert!(e.to_string().contains(why), "{e}"),
        Ok(_) => panic!("accepted; expected {why:?}"),
    };
    refused(build(false, false, true), "G2 must be configured");
    refused(build(false, true, true), "G2 must be configured");
    refused(
        build(true, false, false),
        "G2 is configured without a memory tier",
    );
    refused(build(true, true, true), "G3 is configured without a tier");

    let m = build(true, false, true).expect("a manager with G2 alone");
    assert_eq!(m.top().expect("top").tier(), Tier::G2);
    // Blocks stored into G2 from this process are found and onboarded to G2.
    let len = geometry().block_bytes() as usize;
    let keys = chain(7, 2);
    for k in &keys {
        let stored = m.put_host(*k, &block_content(*k, len)).await.expect("put");
        assert!(matches!(stored, Some(HostCommit::Stored)));
    }
    let found = m.lookup(&keys);
    assert_eq!(found.count_in(Tier::G2), 2);
    let onboarded = m
        .finish_onboard(m.begin_onboard(&keys).await.expect("begin"))
        .await
        .expect("finish");
    assert_eq!(onboarded.blocks.len(), 2);
    assert!(onboarded.blocks.iter().all(|b| b.pool().tier() == Tier::G2));
}

/// A node's manager: G2 on a node arena of 4 slots, G3 on disk.
fn host_rig(mode: CascadeMode) -> (BlockManager, tempfile::TempDir) {
    host_rig_on(
        mode,
        Arc::new(PsyncEngine::new(2, 64).expect("psync engine")),
    )
}

/// [`host_rig`] with the disk on `engine`.
fn host_rig_on(mode: CascadeMode, engine: Arc<dyn IoEngine>) -> (BlockManager, tempfile::TempDir) {
    let cfg = config(mode);
    let (dir, disk) = disk("kvtier-mgr-host", 8 << 20, engine);
    let tiers = TierList::new(
        geometry(),
        Some(memory("node", 4)),
        vec![disk as Arc<dyn TierStore>],
    )
    .expect("tiers");
    let manager = BlockManager::new(cfg, tiers, Vec::new()).expect("manager");
    (manager, dir)
}

/// Regression: a G2 pool slot is free as soon as an eviction takes the
/// block out of the pool, but its arena slot only once the eviction's
/// event is applied (`publish_events`). A request that took such a slot in
/// between (another request's `make_room` still running) asked the arena
/// for room it did not have yet: `reserve_host` answered `NoSpace` and an
/// onboarding missed a block G3 held. Found by kvtier-cli's node_crash
/// test as loads that missed stored blocks under concurrent clients. Here
/// the eviction is a block taken out of the pool directly, which records
/// its event and applies nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_slot_freed_before_its_arena_slot_can_be_used_at_once() {
    let (m, _dir) = host_rig(CascadeMode::Exclusive);
    let g2 = m.pool(Tier::G2).expect("g2");
    let a = chain(21, 5);
    for (key, bytes) in with_bytes(&a) {
        let stored = m.put_host(key, &bytes).await.expect("put");
        assert!(
            matches!(stored, Some(HostCommit::Stored)),
            "{key}: {stored:?}"
        );
    }
    // Four slots: the fifth block pushed the first down to G3.
    assert_eq!(g2.used(), 4);
    assert_eq!(m.lookup(&a[..1]).blocks[0].tier, Tier::G3);

    assert!(g2.remove_inactive(a[1]));
    let granted = m.reserve_host(&[BlockHash(99)]).await.expect("reserve");
    assert!(
        matches!(granted[..], [HostReserve::Reserved(_)]),
        "{granted:?}"
    );

    // The reservation still holds its slot: G2 is full again, but for
    // one slot freed in the pool only.
    assert!(g2.remove_inactive(a[2]));
    let onboarding = m.begin_onboard(&a[..1]).await.expect("begin");
    let onboarded = m.finish_onboard(onboarding).await.expect("finish");
    assert_eq!(onboarded.blocks.len(), 1, "failed: {:?}", onboarded.failed);
    drop(granted);
}

/// After a crash the arena keeps what its dead owner published (kvtier-mem
/// adopts it; here the blocks are simply in the arena when the manager
/// starts). The manager registers them in G2 as it registers the disk
/// log's in G3, up to the pool's room; the rest leave the arena, whose
/// slots only the pool hands out. Adopted blocks are ordinary: exclusive
/// mode moves them down to G3 when G2 needs room, and they come back exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arena_blocks_are_adopted_into_g2_and_move_down_like_any_other() {
    let memory = memory("node", 6);
    let layer_bytes = geometry().layer_bytes() as usize;
    let a = chain(41, 6);
    for (key, bytes) in with_bytes(&a) {
        let sums = BlockSums::compute(key, layer_bytes, &bytes);
        let put = memory.put(key, &bytes, &sums).expect("put");
        assert_eq!(put, PutOutcome::Stored);
    }
    let (_dir, disk) = disk("kvtier-mgr-adopt", 8 << 20, psync());
    let m = restarted_host(&memory, disk, CascadeMode::Exclusive);
    let adopted = m.adopt().await.expect("adopt");
    assert_eq!(
        (
            adopted.in_tier(Tier::G2),
            adopted.in_tier(Tier::G3),
            adopted.skipped
        ),
        (4, 0, 2)
    );
    // What the pool took is what the arena keeps.
    let kept: Vec<BlockHash> = a.iter().copied().filter(|k| memory.contains(*k)).collect();
    assert_eq!(kept.len(), 4);
    for k in &a {
        assert_eq!(
            m.lookup(&[*k]).count_in(Tier::G2),
            usize::from(memory.contains(*k))
        );
    }

    push_down_and_read_back(&m, &memory, &kept, 42).await;
}

/// A crash in the middle of a move down leaves the block whole in the
/// arena and torn in the disk log, whose recovery accepts it (only a read
/// finds it torn: docs/disk-format.md §12, case 2). Adoption keeps the
/// arena's copy, verified when the arena was adopted, and forgets the
/// log's: G2 making room then moves the good copy down again instead of
/// dropping it as "already below".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_in_the_arena_and_the_disk_log_keeps_the_arenas_copy() {
    let memory = memory("node", 4);
    let (_dir, disk) = disk("kvtier-mgr-adopt-torn", 8 << 20, psync());
    let g = geometry();
    let (len, layer_bytes) = (g.block_bytes() as usize, g.layer_bytes() as usize);
    let a = chain(43, 4);
    for (key, bytes) in with_bytes(&a) {
        let sums = BlockSums::compute(key, layer_bytes, &bytes);
        assert_eq!(
            memory.put(key, &bytes, &sums).expect("put"),
            PutOutcome::Stored
        );
    }
    // The torn copy: the block's own sums over bytes the write never put.
    let sums = BlockSums::compute(a[0], layer_bytes, &block_content(a[0], len));
    let torn = vec![0u8; len];
    let put = BlockPut {
        key: a[0],
        data: &torn,
        sums: &sums,
        pinned: None,
    };
    assert!(disk.put_batch(&[put]).await[0].is_ok());
    let m = restarted_host(&memory, disk.clone(), CascadeMode::Exclusive);
    let adopted = m.adopt().await.expect("adopt");
    assert_eq!(
        (adopted.in_tier(Tier::G2), adopted.in_tier(Tier::G3)),
        (4, 0)
    );
    assert!(!disk.contains(a[0]), "the log's copy is still indexed");
    push_down_and_read_back(&m, &memory, &a, 44).await;
}

/// In inclusive mode the copies below are what the mode promises, and a
/// committed block's was written through before its commit was answered:
/// adoption keeps both copies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inclusive_mode_adopts_both_copies() {
    let memory = memory("node", 4);
    let (_dir, disk) = disk("kvtier-mgr-adopt-incl", 8 << 20, psync());
    let g = geometry();
    let (key, bytes) = with_bytes(&chain(45, 1)).remove(0);
    let sums = BlockSums::compute(key, g.layer_bytes() as usize, &bytes);
    assert_eq!(
        memory.put(key, &bytes, &sums).expect("put"),
        PutOutcome::Stored
    );
    let put = BlockPut {
        key,
        data: &bytes,
        sums: &sums,
        pinned: None,
    };
    assert!(disk.put_batch(&[put]).await[0].is_ok());
    let m = restarted_host(&memory, disk.clone(), CascadeMode::Inclusive);
    let adopted = m.adopt().await.expect("adopt");
    assert_eq!(
        (adopted.in_tier(Tier::G2), adopted.in_tier(Tier::G3)),
        (1, 1)
    );
    assert!(disk.contains(key));
}

fn psync() -> Arc<dyn IoEngine> {
    Arc::new(PsyncEngine::new(2, 64).expect("psync engine"))
}

/// A node's manager (G2 of 4 blocks) started over
/// an arena and a disk log that already hold blocks, as after a restart.
fn restarted_host(memory: &MemoryTier, disk: Arc<DiskTier>, mode: CascadeMode) -> BlockManager {
    let cfg = config(mode);
    let tiers = TierList::new(
        geometry(),
        Some(memory.clone()),
        vec![disk as Arc<dyn TierStore>],
    )
    .expect("tiers");
    BlockManager::new(cfg, tiers, Vec::new()).expect("manager")
}

/// Stores four new blocks (chain `seed`), which moves `keys` from G2 down
/// to G3, then loads each of `keys` back and checks its bytes.
async fn push_down_and_read_back(
    m: &BlockManager,
    memory: &MemoryTier,
    keys: &[BlockHash],
    seed: u128,
) {
    for (key, bytes) in with_bytes(&chain(seed, 4)) {
        let stored = m.put_host(key, &bytes).await.expect("put");
        assert!(
            matches!(stored, Some(HostCommit::Stored)),
            "{key}: {stored:?}"
        );
    }
    let len = geometry().block_bytes() as usize;
    let mut out = vec![0u8; len];
    for k in keys {
        assert_eq!(
            m.lookup(&[*k]).count_in(Tier::G3),
            1,
            "{k} did not move down"
        );
        assert!(!memory.contains(*k));
        let onboarded = m
            .finish_onboard(m.begin_onboard(&[*k]).await.expect("begin"))
            .await
            .expect("finish");
        assert_eq!(
            onboarded.blocks.len(),
            1,
            "{k} failed: {:?}",
            onboarded.failed
        );
        drop(onboarded);
        assert_eq!(memory.get(*k, &mut out), Lookup::Hit);
        assert!(out == block_content(*k, len), "{k} came back other bytes");
    }
}

/// On a node, a block onboarded from the disk arrives in an
/// arena slot reserved before any byte moves, one layer at a time: layer 0
/// can be read (verified against the checksum the disk authenticated)
/// while the later layers are still on the disk, and the block is
/// published, readable whole, only once every layer landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_onboarded_from_disk_to_host_land_layer_by_layer() {
    let gate = Arc::new(GatedEngine::new(Arc::new(
        PsyncEngine::new(2, 64).expect("psync engine"),
    )));
    let (m, _dir) = host_rig_on(CascadeMode::Exclusive, gate.clone());
    let a = chain(31, 5);
    for (key, bytes) in with_bytes(&a) {
        let stored = m.put_host(key, &bytes).await.expect("put");
        assert!(
            matches!(stored, Some(HostCommit::Stored)),
            "{key}: {stored:?}"
        );
    }
    assert_eq!(m.lookup(&a[..1]).blocks[0].tier, Tier::G3);
    let g = geometry();
    let (block_bytes, layer_bytes) = (g.block_bytes() as usize, g.layer_bytes() as usize);
    let expected = block_content(a[0], block_bytes);
    let memory = m.tiers().arena().cloned().expect("memory tier");
    let arena = ArenaClient::open(memory.shm_name()).expect("map the arena");
    let table = ArenaReader::open(memory.shm_name()).expect("map the arena read-only");

    gate.hold(Held::Reads);
    let onboarding = m.begin_onboard(&a[..1]).await.expect("begin");
    let slot = onboarding
        .landing_slot(a[0])
        .expect("the landing slot is known before any byte moves");
    gate.release_next().await;
    let layer0 = onboarding.wait_layer(0).await;
    assert!(layer0.iter().all(|(_, r)| r.is_ok()), "{layer0:?}");
    let sum = onboarding
        .landing_layer_sum(a[0], 0)
        .expect("layer 0's checksum");
    let mut dst = vec![0u8; layer_bytes];
    let got = arena
        .read_layer(slot, a[0], 0, sum, &mut dst)
        .expect("read layer 0");
    assert_eq!(got, Lookup::Hit);
    assert!(dst == expected[..layer_bytes], "layer 0 bytes differ");
    // The later layers are still held: the block is neither published in
    // the arena nor readable in the G2 pool.
    let mut whole = vec![0u8; block_bytes];
    assert_eq!(table.get(a[0], &mut whole), Lookup::Miss);
    let g2 = m.pool(Tier::G2).expect("g2");
    assert_eq!(g2.presence(a[0]), Some(Presence::Filling));

    gate.open();
    let onboarded = m.finish_onboard(onboarding).await.expect("finish");
    assert_eq!(onboarded.blocks.len(), 1, "failed: {:?}", onboarded.failed);
    assert_eq!(table.get(a[0], &mut whole), Lookup::Hit);
    assert!(whole == expected, "the published block differs");
}
