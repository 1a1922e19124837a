//! [`Node`]: the block manager over the node's arena, disk log and remote
//! tier, with its background step and its shutdown.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use kvtier_core::{BlockHash, Geometry, Tier, TierKind};
use kvtier_disk::{DiskTier, DiskTierConfig};
use kvtier_events::{NatsSink, NatsSinkConfig, ZmqSink, ZmqSinkConfig};
use kvtier_io::IoEngine;
use kvtier_manager::events::EventSink;
use kvtier_manager::manager::{Adopted, BlockManager, ManagerTiers};
use kvtier_manager::placement::CascadeMode;
use kvtier_mem::{MemoryTier, MemoryTierConfig, TableKey};
use kvtier_protocol::{KeyMap, Namespace, NamespaceKey, NodeSecret};
use kvtier_remote::{RemoteConfig, RemoteTier};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::observer::CommitObserver;
use crate::shape::Shape;
use crate::stats::Counters;
use crate::{NodeConfig, NodeError, NodeOptions, NodeStats};

/// The node: one block manager for every engine process of the host. See
/// the [crate docs](crate).
pub struct Node {
    /// Keys every namespace (and authenticates the arena's table entries).
    secret: NodeSecret,
    manager: BlockManager,
    memory: MemoryTier,
    options: NodeOptions,
    adopted: Adopted,
    shape: Shape,
    /// Shared with the [`NodeHost`](crate::NodeHost), which counts
    /// connections before the node exists.
    pub(crate) counters: Arc<Counters>,
    stop_step: watch::Sender<bool>,
    stepper: Mutex<Option<JoinHandle<()>>>,
    closed: AtomicBool,
    /// Told of every commit, once set (see [`Node::observe_commits`]).
    observer: OnceLock<Arc<dyn CommitObserver>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("shm", &self.memory.shm_name())
            .field("manager", &self.manager)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Builds the node from a whole configuration: first the data, disk
    /// and socket directories, checked and made private
    /// ([`access`](crate::access): one another user can write stops the
    /// start with nothing changed); then the block shape (the configured
    /// `[geometry]`, which must equal the one the data directory keeps, or
    /// the kept one: [`NodeError::NoShape`] without either; a daemon that
    /// learns it from the first engine starts through
    /// [`NodeHost`](crate::NodeHost)) and the secret; then the arena
    /// (`[memory]`, mode 0600 or 0660 with `manager.access_group`, evicted
    /// only by the manager; after a crash, the dead daemon's arena with
    /// what it had committed), the disk log (`[disk]`, recovered), the
    /// remote tier (`manager.g4_url`) and the manager over them
    /// (`[manager]`); then adopts what the arena, the disk log and the
    /// remote prefix hold and starts the background step. Events go to the configured
    /// sinks (`manager.events_nats_url`, `manager.events_zmq_endpoint`) and
    /// to `extra_sinks`. Must run inside a tokio runtime.
    pub async fn open(
        config: &NodeConfig,
        extra_sinks: Vec<Arc<dyn EventSink>>,
    ) -> Result<Arc<Self>, NodeError> {
        let options = NodeOptions::from_config(config)?;
        // Before anything is made in them: a directory another user can
        // write stops the start with nothing created or changed.
        crate::access::prepare_dirs(config, options.access_group)?;
        let shape = crate::shape::at_start(config)?.ok_or(NodeError::NoShape)?;
        Self::open_kept(config, options, shape, extra_sinks, Arc::default()).await
    }

    /// [`open_shaped`](Self::open_shaped), then keeps the shape in the
    /// data directory (a configured or learned one; a kept one is there):
    /// only a shape the tiers opened with is kept. A node whose shape
    /// cannot be kept is closed and not used.
    pub(crate) async fn open_kept(
        config: &NodeConfig,
        options: NodeOptions,
        shape: Shape,
        extra_sinks: Vec<Arc<dyn EventSink>>,
        counters: Arc<Counters>,
    ) -> Result<Arc<Self>, NodeError> {
        let node = Self::open_shaped(config, options, shape, extra_sinks, counters).await?;
        if let Err(e) = crate::shape::keep(node.shape()) {
            if let Err(closing) = node.close().await {
                tracing::warn!(error = %closing, "closing the unused node failed");
            }
            return Err(e);
        }
        Ok(node)
    }

    /// [`open`](Self::open) once the directories are prepared and the
    /// shape is known.
    async fn open_shaped(
        config: &NodeConfig,
        options: NodeOptions,
        shape: Shape,
        extra_sinks: Vec<Arc<dyn EventSink>>,
        counters: Arc<Counters>,
    ) -> Result<Arc<Self>, NodeError> {
        let secret = crate::secret::load_or_create(&config.secret_file())?;
        let mut sinks = configured_sinks(&options).await?;
        sinks.extend(extra_sinks);
        let geometry = shape.geometry;
        // With the table key, an arena a crashed daemon left is adopted:
        // what it had committed stays (docs/memory-arena.md).
        let arena = MemoryTierConfig {
            access_group: options.access_group,
            ..MemoryTierConfig::new(&config.memory, &geometry)
        }
        .with_table_key(TableKey::from_bytes(secret.table_key()));
        let memory = MemoryTier::create(arena)?;
        let disk = open_disk(config, geometry, &memory).await?;
        let remote = match &options.g4_url {
            Some(url) => Some(Arc::new(open_remote(url, geometry)?)),
            None => None,
        };
        let manager_config = options.manager_config(
            geometry.tokens_per_block as usize,
            memory.capacity_blocks(),
            // What the log can keep while re-inserting every block the G3
            // pool holds (docs/disk-format.md, I24).
            Some(disk.live_capacity_blocks()),
            remote.as_ref().map(|_| options.g4_capacity_blocks),
        );
        let disk = Arc::new(disk);
        let tiers = ManagerTiers {
            geometry,
            memory: Some(memory.clone()),
            disk: Some(disk.clone()),
            remote,
        };
        let manager = BlockManager::new(manager_config, tiers, sinks)?;
        let adopted = manager.adopt().await?;
        tracing::info!(
            g2 = adopted.g2,
            g3 = adopted.g3,
            g4 = adopted.g4,
            skipped = adopted.skipped,
            "adopted the blocks the arena (after a crash) and the lower tiers still hold"
        );
        let (stop_step, stop_rx) = watch::channel(false);
        let node = Arc::new(Self {
            secret,
            manager,
            memory,
            options,
            adopted,
            shape,
            counters,
            stop_step,
            stepper: Mutex::new(None),
            closed: AtomicBool::new(false),
            observer: OnceLock::new(),
        });
        let stepper = tokio::spawn(step_loop(Arc::downgrade(&node), stop_rx));
        *node.stepper.lock() = Some(stepper);
        Ok(node)
    }

    /// The key map of `namespace`: what its clients' keys are stored
    /// under (docs/node-protocol.md §11.1).
    pub fn key_map(&self, namespace: &Namespace) -> KeyMap {
        KeyMap::new(NamespaceKey::derive(&self.secret, namespace))
    }

    /// The block manager.
    pub fn manager(&self) -> &BlockManager {
        &self.manager
    }

    /// The arena (G2).
    pub fn memory(&self) -> &MemoryTier {
        &self.memory
    }

    /// The node's tiers, fastest first, with their kinds: the arena at G2,
    /// then the disk log and the remote store where configured, at the
    /// positions that follow. What `HelloOk` announces to clients.
    pub fn tier_list(&self) -> Vec<(Tier, TierKind)> {
        let tiers = self.manager.tiers();
        let kinds = [
            Some(TierKind::Memory),
            tiers.disk.as_ref().map(|_| TierKind::Disk),
            tiers.remote.as_ref().map(|_| TierKind::Remote),
        ];
        Tier::all()
            .skip(1)
            .zip(kinds.into_iter().flatten())
            .collect()
    }

    /// The block geometry.
    pub fn geometry(&self) -> &Geometry {
        self.manager.geometry()
    }

    /// The block shape and where it came from.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The settings.
    pub fn options(&self) -> &NodeOptions {
        &self.options
    }

    /// What the start adopted from the arena and the lower tiers.
    pub fn adopted(&self) -> Adopted {
        self.adopted
    }

    /// A snapshot of the node's counters and pool occupancy.
    pub fn stats(&self) -> NodeStats {
        let mut s = self.counters.snapshot(&self.manager.stats());
        s.adopted_g2 = self.adopted.g2 as u64;
        s.adopted_g3 = self.adopted.g3 as u64;
        s.adopted_g4 = self.adopted.g4 as u64;
        s
    }

    /// Stops the background step, moves every G2 block nobody holds down
    /// to the disk log, publishes the last events and checkpoints the disk
    /// index, so a restart adopts what G2 held. Call after the server has
    /// stopped (its sessions hold pins).
    pub async fn close(&self) -> Result<(), NodeError> {
        self.closed.store(true, Ordering::Release);
        let _ = self.stop_step.send(true);
        let stepper = self.stepper.lock().take();
        if let Some(task) = stepper {
            task.await.map_err(|_| NodeError::TaskLost)?;
        }
        let left = self.manager.drain_host().await;
        if left > 0 {
            tracing::warn!(
                blocks = left,
                "G2 blocks still held at shutdown stay in memory only"
            );
        }
        self.manager.settle().await;
        self.manager.flush_events();
        if let Some(disk) = &self.manager.tiers().disk {
            disk.close().await?;
        }
        Ok(())
    }

    /// Whether [`close`](Self::close) has begun.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Tells `observer` of every block committed from now on. One observer
    /// per node: a second call is refused (returns false).
    pub fn observe_commits(&self, observer: Arc<dyn CommitObserver>) -> bool {
        self.observer.set(observer).is_ok()
    }

    pub(crate) fn commit_observer(&self) -> Option<&Arc<dyn CommitObserver>> {
        self.observer.get()
    }

    /// Whether some tier holds `key` readable.
    pub fn contains(&self, key: BlockHash) -> bool {
        !self.manager.registry().residency(key).is_empty()
    }

    /// Blocks held and blocks the node can hold, over G2 and G3 (G4 is
    /// shared storage, not the node's): their sum in exclusive mode, where
    /// a block lives in one tier; G3's alone in inclusive mode, where G2
    /// holds copies of what G3 has.
    pub fn usage(&self) -> (u64, u64) {
        let pool = |t: Tier| {
            self.manager.pool(t).map_or((0, 0), |p| {
                (p.used() as u64, p.config().capacity_blocks as u64)
            })
        };
        let (g2, g3) = (pool(Tier::G2), pool(Tier::G3));
        match self.options.mode {
            CascadeMode::Exclusive => (g2.0 + g3.0, g2.1 + g3.1),
            CascadeMode::Inclusive => (g2.0.max(g3.0), g3.1.max(g2.1)),
        }
    }

    /// The G2 blocks registered now (for tests and tools).
    pub fn g2_blocks(&self) -> usize {
        self.manager.pool(Tier::G2).map_or(0, |p| p.used())
    }
}

/// The sinks `[manager]` names.
async fn configured_sinks(options: &NodeOptions) -> Result<Vec<Arc<dyn EventSink>>, NodeError> {
    let mut sinks: Vec<Arc<dyn EventSink>> = Vec::new();
    if let Some(url) = &options.events_nats_url {
        let config = NatsSinkConfig::for_node(url.clone(), &options.node_name);
        tracing::info!(url = %url, subject = %config.subject, "publishing node events to NATS");
        sinks.push(Arc::new(NatsSink::connect(config).await?));
    }
    if let Some(endpoint) = &options.events_zmq_endpoint {
        let config = ZmqSinkConfig {
            endpoint: endpoint.clone(),
            ..ZmqSinkConfig::default()
        };
        let sink = ZmqSink::bind(config).await?;
        tracing::info!(endpoint = %sink.endpoint(), "publishing node events over ZMQ (vLLM format)");
        sinks.push(Arc::new(sink));
    }
    Ok(sinks)
}

/// Opens the disk log (recovering it) on an engine with the arena
/// registered, so disk reads land straight in arena slots.
async fn open_disk(
    config: &NodeConfig,
    geometry: Geometry,
    memory: &MemoryTier,
) -> Result<DiskTier, NodeError> {
    // Made and checked by `prepare_dirs` at the start of `Node::open`.
    let dirs = config.disk_dirs();
    let engine: Arc<dyn IoEngine> = kvtier_io::build_engine(
        config.disk.io_engine,
        config.disk.queue_depth,
        config.disk.psync_threads,
    )?;
    if config.disk.register_buffers {
        let (ptr, len) = memory.arena();
        // SAFETY: the arena stays mapped while any clone of `memory` lives;
        // the manager and the node hold clones for as long as the engine
        // serves them. Registered pages stay pinned by the kernel until the
        // ring goes, so a late unmap cannot make the engine touch freed
        // memory.
        unsafe { engine.register_memory(ptr, len) };
    }
    let cfg = DiskTierConfig::new(&config.disk, dirs, geometry, memory.page_bytes());
    tokio::task::spawn_blocking(move || DiskTier::open(cfg, engine))
        .await
        .map_err(|_| NodeError::TaskLost)?
        .map_err(NodeError::from)
}

/// Opens G4 at `url`; the endpoint, region and credentials come from the
/// environment (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, ...).
fn open_remote(url: &str, geometry: Geometry) -> Result<RemoteTier, NodeError> {
    let endpoint = std::env::var("AWS_ENDPOINT_URL").ok();
    let cfg = RemoteConfig {
        url: url.to_owned(),
        allow_http: endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://")),
        endpoint,
        ..RemoteConfig::default()
    };
    Ok(RemoteTier::open(&cfg, geometry)?)
}

/// Steps the manager (watermark offloads, expiry, events) every
/// `step_interval` until told to stop or the node is gone.
async fn step_loop(node: std::sync::Weak<Node>, mut stop: watch::Receiver<bool>) {
    let interval = match node.upgrade() {
        Some(n) => n.options.step_interval,
        None => return,
    };
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let Some(node) = node.upgrade() else { return };
        node.manager.step().await;
    }
}
