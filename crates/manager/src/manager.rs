//! The assembled block manager: pools per tier, the planner, the transfer
//! engine with its in-flight hooks, the I/O scheduler and the event
//! publisher, behind one [`BlockManager`].
//!
//! A request's life through the manager:
//!
//! 1. [`begin_onboard`](BlockManager::begin_onboard) matches the request's
//!    prefix across the tiers, protects it (G2 blocks are acquired, lower
//!    copies pinned), makes room in G2 (cascading victims down, see below),
//!    and loads the blocks not in G2 layer by layer into reserved arena
//!    slots through the scheduler, deduplicated against blocks resident or
//!    already in flight.
//! 2. The engine computes layer by layer: [`Onboarding::wait_layer`], then
//!    [`BlockManager::record_layer_compute`].
//! 3. [`finish_onboard`](BlockManager::finish_onboard) hands back G2 handles
//!    to the prefix; a block in flight is neither readable nor evictable
//!    before then (the pools' incoming / outgoing guards, settled by
//!    [`MoveHooks`] when the last layer lands).
//! 4. The engine stores the new blocks into G2 itself:
//!    [`reserve_host`](BlockManager::reserve_host), fill the arena slots,
//!    [`commit_host`](BlockManager::commit_host) (copied down in inclusive
//!    mode).
//! 5. Between iterations, [`step`](BlockManager::step) offloads every tier
//!    above its high watermark down to its low one.
//!
//! Room on demand ([`ManagerConfig::offload_on_demand`]): a tier short of
//! free slots sends its policy's victims to the tier below (which makes
//! room the same way first); the last tier drops them; the admission filter
//! may keep a block out of G3 (then it is dropped). Pool stored / removed
//! events become [`KvEvent`](crate::events::KvEvent)s with tier, bytes,
//! location and parent, published through the configured sinks; a block
//! that leaves a tier's pool also leaves the tier's store.
//!
//! The tiers are one ordered [`TierList`] the manager shares with its
//! transfer engine ([`BlockManager::tiers`]); the manager reaches each
//! through kvtier-tier's `TierStore` trait, and the arena also as itself
//! for the host API.

mod adopt;
mod config;
mod events;
mod host;
mod onboard;
mod reclaim_sync;
mod room;
mod stats;

use std::sync::Arc;
use std::time::Duration;

use kvtier_core::{BlockHash, Geometry};
use parking_lot::Mutex;

pub use adopt::Adopted;
pub use config::{ManagerConfig, ManagerError};
pub use host::{HostCommit, HostReservation, HostReserve};
pub use onboard::{Onboarded, Onboarding};
pub use stats::{ManagerStats, TierStats};

use crate::events::{EventPublisher, EventSink};
use crate::placement::{MoveHooks, Planner};
use crate::pool::{BlockPool, Clock, wall_clock};
use crate::registry::{PrefixMatch, Registry};
use crate::scheduler::{IoScheduler, SystemClock};
use crate::transfer::TransferEngine;
use crate::{Tier, TierList};
use reclaim_sync::ReclaimSync;
use stats::Counters;

/// The node's block manager: see the [module docs](self).
pub struct BlockManager {
    geometry: Geometry,
    registry: Registry,
    planner: Planner,
    hooks: Arc<MoveHooks>,
    scheduler: IoScheduler,
    publisher: EventPublisher,
    config: ManagerConfig,
    counters: Mutex<Counters>,
    /// Woken whenever an onboarding settles, for requests waiting on a
    /// block another request is bringing in.
    arrivals: tokio::sync::Notify,
    /// The listeners of the pools of tiers that make room on their own
    /// (the disk log's region reclaim).
    reclaim_syncs: Vec<Arc<ReclaimSync>>,
    /// Background removals from tiers that answer later (a remote store's
    /// deletes), awaited by
    /// [`settle`](Self::settle).
    background: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Held while pool events are applied to the tiers' bytes, so that
    /// [`publish_events`](Self::publish_events) returns only once every
    /// event recorded before the call is applied, even one a concurrent
    /// caller drained first. A pool slot freed by an eviction is reusable
    /// at once, but its arena slot only once the event is applied. Holds
    /// the drain buffer, whose memory is kept from one call to the next.
    applying: Mutex<Vec<crate::pool::PoolEvent>>,
}

impl std::fmt::Debug for BlockManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockManager")
            .field("geometry", &self.geometry)
            .field("registry", &self.registry)
            .field("tiers", self.tiers())
            .finish_non_exhaustive()
    }
}

impl BlockManager {
    /// Builds the manager over `tiers`, publishing events to `sinks`. Must
    /// run inside a tokio runtime (the engine, scheduler and publisher
    /// spawn tasks).
    pub fn new(
        config: ManagerConfig,
        tiers: TierList,
        sinks: Vec<Arc<dyn EventSink>>,
    ) -> Result<Self, ManagerError> {
        Self::with_pool_clock(config, tiers, sinks, wall_clock())
    }

    /// [`new`](Self::new) with the pools' clock (policies' idle times and
    /// TTLs) given: the trace bench replays on the trace's time.
    pub fn with_pool_clock(
        config: ManagerConfig,
        tiers: TierList,
        sinks: Vec<Arc<dyn EventSink>>,
        clock: Clock,
    ) -> Result<Self, ManagerError> {
        let geometry = *tiers.geometry();
        let mut hierarchy = config.hierarchy.clone();
        check_tiers(&hierarchy, &tiers)?;
        // The manager drains every pool's events.
        for cfg in hierarchy.pools.values_mut() {
            cfg.record_events = true;
            // Room is made by `make_room` (cascading the victims); an
            // eviction by allocation would lose them silently.
            cfg.evict_on_allocate = !config.offload_on_demand;
        }
        let registry: Registry = hierarchy.build_registry_on(clock)?;
        // The top pool is the arena's only book: a block leaving it leaves
        // the arena in the same step.
        if let (Some(pool), Some(m)) = (registry.pool(TierList::TOP), tiers.arena()) {
            pool.attach_bytes(Arc::new(m.clone()));
        }
        let hooks = Arc::new(MoveHooks::with_layers(geometry.layers));
        let engine = TransferEngine::builder(tiers)
            .with_hooks(hooks.clone())
            .build()?;
        let scheduler = IoScheduler::new(
            engine,
            config.scheduler.clone(),
            Arc::new(SystemClock::new()),
        )?;
        let publisher = EventPublisher::new(config.events, sinks)?;
        // Last: a tier's listener goes in only once the manager is built.
        let reclaim_syncs = ReclaimSync::attach(&registry, scheduler.engine().tiers());
        let planner = Planner::new(hierarchy.placement.clone());
        Ok(Self {
            geometry,
            registry,
            planner,
            hooks,
            scheduler,
            publisher,
            config,
            counters: Mutex::new(Counters::default()),
            arrivals: tokio::sync::Notify::new(),
            reclaim_syncs,
            background: Mutex::new(Vec::new()),
            applying: Mutex::new(Vec::new()),
        })
    }

    /// The block geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// The pools.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The pool of `tier`, if configured.
    pub fn pool(&self, tier: Tier) -> Option<&BlockPool> {
        self.registry.pool(tier)
    }

    /// The planner (placement rules, admission filter).
    pub fn planner(&self) -> &Planner {
        &self.planner
    }

    /// The I/O scheduler.
    pub fn scheduler(&self) -> &IoScheduler {
        &self.scheduler
    }

    /// The event publisher.
    pub fn publisher(&self) -> &EventPublisher {
        &self.publisher
    }

    /// The tiers, in order: the list the transfer engine moves blocks
    /// between.
    pub fn tiers(&self) -> &TierList {
        self.scheduler.engine().tiers()
    }

    /// The configuration.
    pub fn config(&self) -> &ManagerConfig {
        &self.config
    }

    /// The longest prefix of `hashes` readable in some tier, with the
    /// fastest tier of each block. Counts nothing and moves nothing.
    pub fn lookup(&self, hashes: &[BlockHash]) -> PrefixMatch {
        self.registry.match_prefix(hashes)
    }

    /// Reports that the engine computed `layer` for `duration`, so the
    /// scheduler learns the slack it may fill with writes.
    pub fn record_layer_compute(&self, layer: u32, duration: Duration) {
        self.scheduler.record_layer_compute(layer, duration);
    }

    /// Between engine iterations: offloads every tier above its high
    /// watermark down to its low one, drops blocks the TTL policy reports
    /// expired, and publishes the events. With
    /// [`ManagerConfig::step_waits`] the offloads complete before it
    /// returns. Returns the blocks it started moving down.
    pub async fn step(&self) -> usize {
        let plan = self.planner.plan_offload(&self.registry);
        {
            let mut c = self.counters.lock();
            c.dropped += plan.dropped.len() as u64;
        }
        let moved = plan.moves.len();
        for mv in &plan.moves {
            self.counters.lock().offloaded[mv.from.index()] += 1;
        }
        let handles = self.submit_moves(plan.moves);
        if self.config.step_waits {
            for h in handles {
                h.wait().await;
            }
        }
        let expired = self.planner.expire(&self.registry);
        self.counters.lock().dropped += expired.len() as u64;
        self.publish_events();
        moved
    }

    /// A snapshot of every counter.
    pub fn stats(&self) -> ManagerStats {
        let c = *self.counters.lock();
        let lookups = c.lookups;
        let tiers = self
            .registry
            .pools()
            .map(|p| {
                let i = p.tier().index();
                TierStats {
                    tier: p.tier(),
                    hits: c.hits[i],
                    hit_rate: ratio(c.hits[i], lookups),
                    offloaded: c.offloaded[i],
                    stored_events: c.stored_events[i],
                    removed_events: c.removed_events[i],
                    pool: p.stats(),
                }
            })
            .collect();
        let scheduler = self.scheduler.stats();
        ManagerStats {
            tiers,
            lookups,
            misses: c.misses,
            admission_refusals: c.admission_refusals,
            dropped: c.dropped,
            reclaimed_by_disk: c.reclaimed_by_disk,
            lost_by_disk: c.lost_by_disk,
            onboard_failures: c.onboard_failures,
            verify_failures: c.verify_failures,
            paths: self
                .scheduler
                .engine()
                .stats_all()
                .into_iter()
                .filter(|p| p.blocks > 0)
                .collect(),
            bubble: scheduler.bubble,
            scheduler,
        }
    }

    /// Waits for the background work started so far (removals from tiers
    /// that answer later, such as a remote store's deletes) to finish.
    pub async fn settle(&self) {
        let pending = std::mem::take(&mut *self.background.lock());
        for task in pending {
            // A panicked delete leaves its object behind; nothing to undo.
            let _ = task.await;
        }
    }

    /// Publishes pending events now and closes nothing.
    pub fn flush_events(&self) {
        self.publish_events();
        self.publisher.flush();
    }

    /// The fastest configured tier and its pool: where blocks are
    /// onboarded to (the arena's, [`TierList::TOP`]).
    pub fn top(&self) -> Result<&BlockPool, ManagerError> {
        self.registry
            .pools()
            .next()
            .ok_or_else(|| ManagerError::Config("no tier is configured".into()))
    }
}

impl Drop for BlockManager {
    fn drop(&mut self) {
        self.publish_events();
        self.publisher.close();
    }
}

/// Checks that the top tier is configured with its arena, that every
/// configured pool has its tier, and that a pool of a tier that makes room
/// on its own fits what the tier keeps while it does.
fn check_tiers(
    hierarchy: &crate::placement::HierarchyConfig,
    tiers: &TierList,
) -> Result<(), ManagerError> {
    let refuse = |why: String| Err(ManagerError::Config(why));
    let top = TierList::TOP;
    if hierarchy.tier(top).is_none() {
        return refuse(format!("{} must be configured", top.label()));
    }
    if tiers.arena().is_none() {
        return refuse(format!(
            "{} is configured without a memory tier",
            top.label()
        ));
    }
    for (tier, pool) in hierarchy.pools() {
        let Some(store) = tiers.store(tier) else {
            return refuse(format!("{} is configured without a tier", tier.label()));
        };
        // Else a reclaim could find every slot the tier keeps wanted by the
        // pool and have to drop one (docs/disk-format.md, I24).
        if let Some(r) = store.reclaiming()
            && pool.capacity_blocks > r.live_capacity_blocks()
        {
            return Err(ManagerError::PoolTooLarge {
                tier,
                pool: pool.capacity_blocks,
                limit: r.live_capacity_blocks(),
            });
        }
    }
    Ok(())
}

fn ratio(n: u64, d: u64) -> f64 {
    if d == 0 { 0.0 } else { n as f64 / d as f64 }
}
