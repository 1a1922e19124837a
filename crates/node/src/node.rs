//! [`Node`]: the block manager over the node's tiers, with its background
//! step and its shutdown. [`Node::open`] is where the tiers register: the
//! arena at the top, then each configured tier at the next position (the
//! disk log, then a remote store when one is configured).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use kvtier_core::{BlockHash, Geometry, Tier, TierKind};
use kvtier_disk::{DiskTier, DiskTierConfig};
use kvtier_events::{NatsSink, NatsSinkConfig, ZmqSink, ZmqSinkConfig};
use kvtier_io::IoEngine;
use kvtier_manager::TierList;
use kvtier_manager::events::EventSink;
use kvtier_manager::manager::{Adopted, BlockManager, ManagerError};
use kvtier_manager::placement::CascadeMode;
use kvtier_mem::{MemoryTier, MemoryTierConfig, TableKey};
use kvtier_protocol::{KeyMap, Namespace, NamespaceKey, NodeSecret};
use kvtier_remote::{RemoteConfig, RemoteTier};
use kvtier_tier::TierStore;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::observer::{ClusterLookup, CommitObserver, CommitObservers};
use crate::peer_load::PeerReader;
use crate::shape::Shape;
use crate::shared_load::SharedReader;
use crate::stats::Counters;
use crate::{NodeConfig, NodeError, NodeOptions, NodeStats};

/// The node: one block manager for every engine process of the host. See
/// the [crate docs](crate).
pub struct Node {
    /// Keys every namespace (and authenticates the arena's table entries).
    secret: NodeSecret,
    manager: BlockManager,
    memory: MemoryTier,
    /// The disk log, as opened: closed (its index checkpointed) last.
    disk: Arc<DiskTier>,
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
    observers: CommitObservers,
    /// Asked for the keys past the node's own prefix, once set (see
    /// [`Node::set_cluster_lookup`]).
    cluster: OnceLock<Arc<dyn ClusterLookup>>,
    /// Reads the blocks the cluster located from their nodes, once set
    /// (see [`Node::set_peer_reader`]).
    peer_reader: OnceLock<Arc<PeerReader>>,
    /// Reads the blocks the cluster lookup located in the shared G4 (see
    /// [`Node::set_shared_reader`]).
    shared_reader: OnceLock<Arc<SharedReader>>,
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
        let disk = Arc::new(open_disk(config, geometry, &memory).await?);
        // Registration: below the arena, each configured tier at the next
        // position, with its pool's capacity.
        let mut below: Vec<(Arc<dyn TierStore>, usize)> = Vec::new();
        // What the log can keep while re-inserting every block its pool
        // holds (docs/disk-format.md, I24).
        below.push((disk.clone(), disk.live_capacity_blocks()));
        if let Some(url) = &options.g4_url {
            let remote = Arc::new(open_remote(url, geometry)?);
            below.push((remote, options.g4_capacity_blocks));
        }
        let tiers = TierList::new(
            geometry,
            Some(memory.clone()),
            below.iter().map(|(store, _)| store.clone()),
        )
        .map_err(ManagerError::from)?;
        let pools: Vec<(Tier, usize)> = tiers
            .iter()
            .map(|(t, _)| t)
            .zip(std::iter::once(memory.capacity_blocks()).chain(below.iter().map(|b| b.1)))
            .collect();
        let manager_config = options.manager_config(geometry.tokens_per_block as usize, &pools);
        let manager = BlockManager::new(manager_config, tiers, sinks)?;
        let adopted = manager.adopt().await?;
        tracing::info!(
            adopted = ?adopted.by_tier,
            skipped = adopted.skipped,
            "adopted the blocks the arena (after a crash) and the lower tiers still hold"
        );
        let (stop_step, stop_rx) = watch::channel(false);
        let node = Arc::new(Self {
            secret,
            manager,
            memory,
            disk,
            options,
            adopted,
            shape,
            counters,
            stop_step,
            stepper: Mutex::new(None),
            closed: AtomicBool::new(false),
            observers: CommitObservers::default(),
            cluster: OnceLock::new(),
            peer_reader: OnceLock::new(),
            shared_reader: OnceLock::new(),
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

    /// The arena (the top tier).
    pub fn memory(&self) -> &MemoryTier {
        &self.memory
    }

    /// The node's tiers in order, fastest first: each one's position and
    /// kind (what the node announces to its clients).
    pub fn tier_list(&self) -> Vec<(Tier, TierKind)> {
        self.manager.tiers().kinds()
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
        s.adopted_g2 = self.adopted.in_tier(Tier::G2) as u64;
        s.adopted_g3 = self.adopted.in_tier(Tier::G3) as u64;
        s.adopted_g4 = self.adopted.in_tier(Tier::G4) as u64;
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
                "G2 blocks still held at shutdown stay in memory only: the arena file is kept for the next start to adopt"
            );
        }
        self.manager.settle().await;
        self.manager.flush_events();
        self.disk.close().await?;
        // Everything G2 held is on disk now: the arena's file goes with the
        // daemon, whatever still holds the node (the metadata service's
        // backends and the node view do until the process ends).
        if left == 0 {
            self.memory.unlink_name();
        }
        Ok(())
    }

    /// Whether [`close`](Self::close) has begun.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Tells `observer` of every block committed from now on, after the
    /// observers added before it (the node view that publishes the node's
    /// blocks, the shared G4's writer).
    pub fn observe_commits(&self, observer: Arc<dyn CommitObserver>) {
        self.observers.add(observer);
    }

    /// Every observer as one; `None` while there is none (the stored keys
    /// are then not collected).
    pub(crate) fn commit_observer(&self) -> Option<&dyn CommitObserver> {
        (!self.observers.is_empty()).then_some(&self.observers as &dyn CommitObserver)
    }

    /// Answers the keys past the node's own prefix from the cluster from
    /// now on; sessions that start afterwards list the peer tier in their
    /// `HelloOk`. One per node: a second call is refused (returns false).
    pub fn set_cluster_lookup(&self, lookup: Arc<dyn ClusterLookup>) -> bool {
        self.cluster.set(lookup).is_ok()
    }

    pub(crate) fn cluster_lookup(&self) -> Option<&Arc<dyn ClusterLookup>> {
        self.cluster.get()
    }

    /// Reads the blocks a session's lookups located on other nodes when it
    /// `Load`s them, from now on (without one, such keys are misses). One
    /// per node: a second call is refused (returns false).
    pub fn set_peer_reader(&self, reader: Arc<PeerReader>) -> bool {
        self.peer_reader.set(reader).is_ok()
    }

    /// Reads the blocks a session's lookups located in the cluster's shared
    /// G4 when it `Load`s them, from now on; sessions that start afterwards
    /// list the shared tier in their `HelloOk`. One per node: a second call
    /// is refused (returns false).
    pub fn set_shared_reader(&self, reader: Arc<SharedReader>) -> bool {
        self.shared_reader.set(reader).is_ok()
    }

    /// The reader installed by [`set_shared_reader`](Self::set_shared_reader).
    pub(crate) fn shared_reader(&self) -> Option<&Arc<SharedReader>> {
        self.shared_reader.get()
    }

    /// The tier a session is told the shared G4's blocks are in: just below
    /// the peer tier (a peer's DRAM or disk is faster than an object
    /// store), when the node has a cluster lookup and a shared reader.
    pub fn shared_tier(&self) -> Option<Tier> {
        self.shared_reader.get()?;
        self.peer_tier()?.below()
    }

    /// The reader installed by [`set_peer_reader`](Self::set_peer_reader).
    pub fn peer_reader(&self) -> Option<&Arc<PeerReader>> {
        self.peer_reader.get()
    }

    /// The position of the peer tier: right after the node's own tiers,
    /// when a cluster lookup is installed and a position is left.
    pub fn peer_tier(&self) -> Option<Tier> {
        self.cluster.get()?;
        let last = self.tier_list().last().map_or(Tier::G1, |(t, _)| *t);
        last.below()
    }

    /// Whether some tier holds `key` readable.
    pub fn contains(&self, key: BlockHash) -> bool {
        !self.manager.registry().residency(key).is_empty()
    }

    /// Blocks held and blocks the node can hold, over its own tiers (a
    /// remote store is shared storage, not the node's): their sum in
    /// exclusive mode, where a block lives in one tier; the largest tier's
    /// in inclusive mode, where a faster tier holds copies of what the
    /// tier below has.
    pub fn usage(&self) -> (u64, u64) {
        let own = self
            .manager
            .tiers()
            .iter()
            .filter(|(_, store)| store.kind() != TierKind::Remote)
            .filter_map(|(t, _)| self.manager.pool(t))
            .map(|p| (p.used() as u64, p.config().capacity_blocks as u64));
        match self.options.mode {
            CascadeMode::Exclusive => own.fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1)),
            CascadeMode::Inclusive => own.fold((0, 0), |a, b| (a.0.max(b.0), a.1.max(b.1))),
        }
    }

    /// The top tier's blocks registered now (for tests and tools).
    pub fn g2_blocks(&self) -> usize {
        self.manager.pool(TierList::TOP).map_or(0, |p| p.used())
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

/// The store at `url` (`manager.g4_url`, `shared_g4.url`): the endpoint,
/// region and credentials come from the environment (`AWS_ENDPOINT_URL`,
/// `AWS_REGION`, `AWS_ACCESS_KEY_ID`, ...).
pub fn remote_config(url: &str) -> RemoteConfig {
    let endpoint = std::env::var("AWS_ENDPOINT_URL").ok();
    RemoteConfig {
        url: url.to_owned(),
        allow_http: endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://")),
        endpoint,
        ..RemoteConfig::default()
    }
}

/// Opens G4 at `url` ([`remote_config`]).
fn open_remote(url: &str, geometry: Geometry) -> Result<RemoteTier, NodeError> {
    Ok(RemoteTier::open(&remote_config(url), geometry)?)
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
