//! [`NodeView`]: the node's own blocks in the metadata service, so the
//! cluster-wide view knows what the node holds (docs/meta-api.md,
//! "Node-published locations").
//!
//! Every block an engine commits on the node is published as spec
//! `tp<rank>` of a serving location on the node's storage
//! (`kvtier://<node>`, a [`PublishedBlock`] URI), for the instance the
//! engine named in its `Hello` or, if it named none, one derived from its
//! namespace. It is unpublished once the node holds it in no tier. The
//! view is level-triggered: commits and the manager's stored/removed
//! events only mark keys dirty; a worker then compares what the node holds
//! with what it published and fixes the difference, retrying what the
//! metadata service refused. After a restart it starts from what the
//! service lists on the node's storage, so blocks the restart lost are
//! unpublished and adopted ones stay.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kvtier_core::BlockHash;
use kvtier_manager::events::{EventBatch, EventSink, KvEvent, SinkCounters, SinkCounts};
use kvtier_meta::{
    BlockKey, EvictionPolicy, Instance, InstanceGroup, LocationSpecInfo, MetaError, MetaService,
    PublishedPart, Storage, StorageHealth, StorageKind,
};
use kvtier_node::{CommitObserver, CommittedKey, Node, SessionNamespace};
use kvtier_protocol::Namespace;
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::location::ClusterNode;
use crate::node_store::{PublishedBlock, peer_spec};

/// Keys per metadata-service call (below its default `max_keys`).
const CHUNK: usize = 512;

/// How the view publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeViewConfig {
    /// The node's name, the authority of its URIs.
    pub node_name: String,
    /// The storage the node's locations are on; created (kind
    /// `kvtier_node`, URI `kvtier://<node>`) if missing.
    pub storage: String,
    /// The group of the instances the view registers itself; created if
    /// missing, on the node's storage, with no quota of its own (the
    /// node's capacity bounds it) so the reclaimer never evicts the node's
    /// blocks for it.
    pub group: String,
    /// How long a refused publication waits before it is tried again.
    pub retry: Duration,
    /// The node's cluster identity: with it, every location carries the
    /// block's sum, the node's peer address and a location MAC, so other
    /// nodes may fetch the block (docs/meta-api.md §10.2); without it,
    /// locations name the block only.
    pub cluster: Option<ClusterNode>,
}

/// The storage (and group) a node's view publishes into by default:
/// `node-<node>`. Where another node's locations are, to drop one it
/// answered it no longer holds (docs/meta-api.md §10.4).
pub(crate) fn node_storage(node_name: &str) -> String {
    format!("node-{node_name}")
}

impl NodeViewConfig {
    /// Storage and group `node-<node>`, retried every second.
    pub fn new(node_name: impl Into<String>) -> Self {
        let node_name = node_name.into();
        Self {
            storage: node_storage(&node_name),
            group: node_storage(&node_name),
            node_name,
            retry: Duration::from_secs(1),
            cluster: None,
        }
    }
}

/// Why the view could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeViewError {
    /// The storage exists but is not this node's.
    #[error("storage {name:?} is {uri:?}, not kvtier://{node}")]
    ForeignStorage {
        /// The storage.
        name: String,
        /// Its URI.
        uri: String,
        /// This node.
        node: String,
    },
    /// The metadata service refused.
    #[error(transparent)]
    Meta(#[from] MetaError),
}

/// Counters of the view, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeViewStats {
    /// Blocks published.
    pub published: u64,
    /// Blocks unpublished.
    pub unpublished: u64,
    /// Metadata-service calls that failed (their blocks are retried).
    pub failures: u64,
    /// Blocks known to the view now.
    pub tracked: u64,
}

/// One (instance, spec) whose blocks the view publishes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Source {
    pub(crate) instance: String,
    pub(crate) spec: String,
}

/// A block the view knows.
#[derive(Debug, Clone, Copy)]
struct Entry {
    source: u32,
    /// The key the client stored the block under: its metadata-service
    /// key, which the node's (keyed) stored key does not reveal.
    client: u128,
    /// The committing session's full namespace digest and the block's
    /// combined checksum, which a cluster location's MAC covers (0 for a
    /// block taken over from before a restart: it is published already).
    namespace: u128,
    sum: u64,
    published: bool,
    /// Bumped by every commit, so a stale unpublish does not forget a
    /// block committed again meanwhile.
    generation: u64,
    /// Taken over from before a restart with a peer address that is no
    /// longer the node's: its MAC covers the namespace digest, which the
    /// node does not keep, so it cannot be signed anew yet; it is
    /// unpublished (peers would dial the old address) and kept until a
    /// session of its source commits: the namespace whose key map gives
    /// the entry's stored key is its own, and it is published again,
    /// signed for the new address ([`recognize`]).
    stale: bool,
}

/// What the view registers an instance with, learnt from a `Hello`.
#[derive(Debug, Clone)]
struct Registration {
    model: String,
    tp_size: u32,
}

#[derive(Debug, Default)]
struct State {
    sources: Vec<Source>,
    source_ids: HashMap<Source, u32>,
    /// Sources whose instance exists in the service.
    ready: HashSet<u32>,
    /// Sources the service refuses for good (their instance lacks their
    /// spec); their blocks are not tracked.
    refused: HashSet<u32>,
    registrations: HashMap<u32, Registration>,
    known: HashMap<BlockHash, Entry>,
    dirty: HashSet<BlockHash>,
    generation: u64,
    /// Namespaces sessions of a source committed in, not yet tried on the
    /// stale entries (each pair once).
    candidates: Vec<(u32, Namespace)>,
    tried: HashSet<(u32, u128)>,
}

impl State {
    fn intern(&mut self, source: Source) -> u32 {
        if let Some(&id) = self.source_ids.get(&source) {
            return id;
        }
        let id = self.sources.len() as u32;
        self.sources.push(source.clone());
        self.source_ids.insert(source, id);
        id
    }

    /// Marks dirty those of `keys` the view knows; whether any was new.
    fn touch(&mut self, keys: &[BlockHash]) -> bool {
        let mut any = false;
        for k in keys {
            if self.known.contains_key(k) {
                any |= self.dirty.insert(*k);
            }
        }
        any
    }

    fn mark(&mut self, key: BlockHash, m: Mark, source: u32, published: bool) {
        self.generation += 1;
        let generation = self.generation;
        let e = self.known.entry(key).or_insert(Entry {
            source,
            client: m.client,
            namespace: m.namespace,
            sum: m.sum,
            published,
            generation,
            stale: false,
        });
        // Another source's entry is replaced; the same source's keeps
        // whether it is published, unless its location is stale: a commit
        // (`published` false) then publishes it afresh.
        if e.source != source || (e.stale && !published) {
            e.source = source;
            e.published = published;
        }
        e.stale = false;
        e.client = m.client;
        e.namespace = m.namespace;
        e.sum = m.sum;
        e.generation = generation;
        self.dirty.insert(key);
    }
}

/// What the view learns of a block when it is marked.
#[derive(Debug, Clone, Copy)]
struct Mark {
    client: u128,
    namespace: u128,
    sum: u64,
}

/// What commits and events tell the view; shared with the worker.
#[derive(Default)]
struct Tracker {
    state: Mutex<State>,
    wake: Notify,
    sink: SinkCounters,
}

/// The event sink half of the view: hand it to [`Node::open`] among the
/// extra sinks, then start the view with [`NodeView::start`].
#[derive(Clone, Default)]
pub struct NodeViewSink {
    tracker: Arc<Tracker>,
}

impl NodeViewSink {
    /// A sink that tracks nothing until its view starts.
    pub fn new() -> Self {
        Self::default()
    }
}

impl EventSink for NodeViewSink {
    fn name(&self) -> &str {
        "meta-view"
    }

    /// Marks dirty the known blocks the batch is about; never blocks
    /// beyond one short lock.
    fn publish(&self, batch: Arc<EventBatch>) {
        let t = &self.tracker;
        let mut s = t.state.lock();
        let mut any = false;
        for event in &batch.events {
            any |= match event {
                KvEvent::Stored(e) => s.touch(&e.block_hashes),
                KvEvent::Removed(e) => s.touch(&e.block_hashes),
                KvEvent::AllCleared { .. } => {
                    let all: Vec<BlockHash> = s.known.keys().copied().collect();
                    s.touch(&all)
                }
            };
        }
        drop(s);
        t.sink.delivered();
        if any {
            t.wake.notify_one();
        }
    }

    fn counts(&self) -> SinkCounts {
        self.tracker.sink.snapshot()
    }

    fn close(&self) {}
}

/// Learns each committed block's source from the node.
struct Observer {
    tracker: Arc<Tracker>,
}

impl CommitObserver for Observer {
    fn committed(&self, ns: &SessionNamespace, blocks: &[CommittedKey]) {
        let source = source_of(ns);
        let mut s = self.tracker.state.lock();
        let id = s.intern(source);
        if s.refused.contains(&id) {
            return;
        }
        s.registrations.entry(id).or_insert_with(|| Registration {
            model: ns.namespace.model.clone(),
            tp_size: ns.namespace.tp_size,
        });
        let namespace = ns.namespace.digest();
        if s.tried.insert((id, namespace)) && s.known.values().any(|e| e.stale) {
            s.candidates.push((id, ns.namespace.clone()));
        }
        for b in blocks {
            let m = Mark {
                client: b.client.0,
                namespace,
                sum: b.sum,
            };
            s.mark(b.stored, m, id, false);
        }
        drop(s);
        self.tracker.wake.notify_one();
    }
}

/// The instance a session's blocks belong to: the one it named, else
/// `kvtier-<16 hex digits>` of its namespace with the rank left out (every
/// rank of one deployment shares it), and the spec of its rank.
pub(crate) fn source_of(ns: &SessionNamespace) -> Source {
    let instance = ns
        .instance
        .clone()
        .unwrap_or_else(|| derived_instance(&ns.namespace));
    Source {
        instance,
        spec: format!("tp{}", ns.namespace.tp_rank),
    }
}

/// `kvtier-<high 64 bits of the rank-0 namespace digest>`.
pub fn derived_instance(ns: &Namespace) -> String {
    let rank0 = Namespace {
        tp_rank: 0,
        ..ns.clone()
    };
    format!("kvtier-{:016x}", (rank0.digest() >> 64) as u64)
}

struct Shared {
    node: Arc<Node>,
    svc: Arc<MetaService>,
    config: NodeViewConfig,
    tracker: Arc<Tracker>,
    /// One reconciliation at a time.
    stepping: tokio::sync::Mutex<()>,
    published: AtomicU64,
    unpublished: AtomicU64,
    failures: AtomicU64,
}

/// The running view. Dropping it stops the worker; [`NodeView::sync`]
/// brings the service up to date now.
pub struct NodeView {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for NodeView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeView")
            .field("storage", &self.shared.config.storage)
            .field("stats", &self.stats())
            .finish()
    }
}

impl NodeView {
    /// Ensures the node's storage, takes over what the service lists on it
    /// (from before a restart), observes the node's commits and starts the
    /// worker. `sink` must be among the node's event sinks.
    pub async fn start(
        sink: &NodeViewSink,
        node: Arc<Node>,
        svc: Arc<MetaService>,
        config: NodeViewConfig,
    ) -> Result<Self, NodeViewError> {
        ensure_storage(&svc, &config)?;
        ensure_group(&svc, &config)?;
        let tracker = sink.tracker.clone();
        let listed = take_over_listed(&svc, &config, &tracker)?;
        let observer = Observer {
            tracker: tracker.clone(),
        };
        node.observe_commits(Arc::new(observer));
        tracing::info!(
            storage = %config.storage,
            listed,
            "publishing the node's blocks to the metadata service"
        );
        let shared = Arc::new(Shared {
            node,
            svc,
            config,
            tracker,
            stepping: tokio::sync::Mutex::new(()),
            published: AtomicU64::new(0),
            unpublished: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        });
        let (stop, stop_rx) = watch::channel(false);
        let worker = tokio::spawn(work(shared.clone(), stop_rx));
        Ok(Self {
            shared,
            stop,
            worker: Mutex::new(Some(worker)),
        })
    }

    /// Publishes the node's pending events and reconciles now; returns
    /// once the service reflects every commit and removal made before the
    /// call (unless the service refused some: see
    /// [`NodeViewStats::failures`]).
    pub async fn sync(&self) {
        self.shared.node.manager().flush_events();
        reconcile(&self.shared).await;
    }

    /// Counters so far.
    pub fn stats(&self) -> NodeViewStats {
        let s = &self.shared;
        NodeViewStats {
            published: s.published.load(Ordering::Relaxed),
            unpublished: s.unpublished.load(Ordering::Relaxed),
            failures: s.failures.load(Ordering::Relaxed),
            tracked: s.tracker.state.lock().known.len() as u64,
        }
    }

    /// The counters as OpenMetrics text, for the admin `/metrics`.
    pub fn metrics_text(&self) -> String {
        let s = self.stats();
        let mut out = String::new();
        for (name, kind, help, value) in [
            (
                "kvtier_node_meta_published",
                "counter",
                "Node blocks published to the metadata service",
                s.published,
            ),
            (
                "kvtier_node_meta_unpublished",
                "counter",
                "Node blocks unpublished from the metadata service",
                s.unpublished,
            ),
            (
                "kvtier_node_meta_failures",
                "counter",
                "Metadata-service calls of the node view that failed (retried)",
                s.failures,
            ),
            (
                "kvtier_node_meta_tracked_blocks",
                "gauge",
                "Node blocks the view tracks",
                s.tracked,
            ),
        ] {
            let sample = if kind == "counter" {
                format!("{name}_total")
            } else {
                name.to_owned()
            };
            out.push_str(&format!(
                "# TYPE {name} {kind}\n# HELP {name} {help}\n{sample} {value}\n"
            ));
        }
        out
    }

    /// Reconciles once more and stops the worker.
    pub async fn stop(&self) {
        self.sync().await;
        let _ = self.stop.send(true);
        let worker = self.worker.lock().take();
        if let Some(w) = worker {
            let _ = w.await;
        }
    }
}

impl Drop for NodeView {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Creates the node's storage, or checks the one there is; its `spec`
/// names the node's peer address when it has one (updated when it
/// changed), so the service's health probe reaches the node.
fn ensure_storage(svc: &MetaService, config: &NodeViewConfig) -> Result<(), NodeViewError> {
    let uri = format!("kvtier://{}", config.node_name);
    let spec = config.cluster.as_ref().map(|c| peer_spec(c.addr));
    match svc
        .list_storages()
        .into_iter()
        .find(|s| s.name == config.storage)
    {
        Some(s) if s.uri.trim_end_matches('/') == uri => {
            if s.spec != spec {
                svc.update_storage(Storage { spec, ..s })?;
            }
            Ok(())
        }
        Some(s) => Err(NodeViewError::ForeignStorage {
            name: s.name,
            uri: s.uri,
            node: config.node_name.clone(),
        }),
        None => Ok(svc.add_storage(Storage {
            name: config.storage.clone(),
            kind: StorageKind::KvtierNode,
            uri,
            enabled: true,
            health: StorageHealth::Healthy,
            spec,
        })?),
    }
}

/// Creates the group of derived instances unless it exists.
fn ensure_group(svc: &MetaService, config: &NodeViewConfig) -> Result<(), NodeViewError> {
    if svc.list_groups().iter().any(|g| g.name == config.group) {
        return Ok(());
    }
    Ok(svc.create_group(InstanceGroup {
        name: config.group.clone(),
        quota_bytes: u64::MAX / 2,
        kind_quota_bytes: Default::default(),
        watermark: 1.0,
        eviction: EvictionPolicy::Lru,
        storages: vec![config.storage.clone()],
        max_instances: 4096,
        ..Default::default()
    })?)
}

/// Tracks every block the service lists on the node's storage as
/// published and dirty, so the first reconciliation unpublishes the ones
/// the node no longer holds, and those whose location names another peer
/// address than the node's now (a restart on another port or
/// `peer.advertise`; [`Entry::stale`]). Returns how many it found.
fn take_over_listed(
    svc: &MetaService,
    config: &NodeViewConfig,
    tracker: &Tracker,
) -> Result<usize, NodeViewError> {
    let uris = svc.live_uris(&config.storage)?;
    let mut s = tracker.state.lock();
    let mut listed = 0;
    for uri in uris {
        let Some(b) = PublishedBlock::parse(&config.node_name, &uri) else {
            continue;
        };
        let id = s.intern(Source {
            instance: b.instance.clone(),
            spec: b.spec.clone(),
        });
        s.ready.insert(id);
        let m = Mark {
            client: b.client_key,
            namespace: 0,
            sum: b.peer.map_or(0, |p| p.sum),
        };
        s.mark(b.stored(), m, id, true);
        if let Some(e) = s.known.get_mut(&b.stored()) {
            e.stale = b.peer.map(|p| p.peer) != config.cluster.as_ref().map(|c| c.addr);
        }
        listed += 1;
    }
    Ok(listed)
}

/// Reconciles whenever woken, and every `retry` while something is dirty.
async fn work(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        reconcile(&shared).await;
        let pending = !shared.tracker.state.lock().dirty.is_empty();
        tokio::select! {
            _ = stop.changed() => return,
            _ = shared.tracker.wake.notified() => {}
            _ = tokio::time::sleep(shared.config.retry), if pending => {}
        }
    }
}

/// What one reconciliation does to one source's blocks.
#[derive(Default)]
struct Plan {
    publish: Vec<BlockHash>,
    unpublish: Vec<(BlockHash, u64)>,
}

async fn reconcile(shared: &Shared) {
    let _one = shared.stepping.lock().await;
    recognize(shared);
    let (plans, sources) = plan(shared);
    for (id, p) in plans {
        let source = &sources[id as usize];
        if !p.publish.is_empty() && ensure_instance(shared, id, source).await {
            publish(shared, id, source, p.publish).await;
        } else if !p.publish.is_empty() {
            requeue(shared, &p.publish);
        }
        if !p.unpublish.is_empty() {
            unpublish(shared, source, p.unpublish).await;
        }
    }
}

/// Gives each stale entry whose stored key a candidate namespace's key
/// map makes of its client key that namespace, so it is signed for the
/// node's address now and published again (the keyed hash matches only
/// for the namespace the block was committed in).
fn recognize(shared: &Shared) {
    let candidates = std::mem::take(&mut shared.tracker.state.lock().candidates);
    for (id, ns) in candidates {
        let stale: Vec<(BlockHash, u128)> = {
            let s = shared.tracker.state.lock();
            (s.known.iter())
                .filter(|(_, e)| e.stale && e.source == id)
                .map(|(k, e)| (*k, e.client))
                .collect()
        };
        let map = shared.node.key_map(&ns);
        let digest = ns.digest();
        let mut s = shared.tracker.state.lock();
        for (key, client) in stale {
            if map.stored(BlockHash(client)) != key {
                continue;
            }
            if let Some(e) = s.known.get_mut(&key).filter(|e| e.stale) {
                e.namespace = digest;
                e.stale = false;
                e.published = false;
                s.dirty.insert(key);
            }
        }
    }
}

/// Takes the dirty keys and compares each with what the node holds (the
/// node is asked without the tracker's lock, which its event sink takes).
fn plan(shared: &Shared) -> (HashMap<u32, Plan>, Vec<Source>) {
    let marked: Vec<(BlockHash, Entry)> = {
        let mut s = shared.tracker.state.lock();
        let dirty = std::mem::take(&mut s.dirty);
        dirty
            .into_iter()
            .filter_map(|k| Some((k, *s.known.get(&k)?)))
            .collect()
    };
    let held: Vec<bool> = marked
        .iter()
        .map(|(k, _)| shared.node.contains(*k))
        .collect();
    let mut plans: HashMap<u32, Plan> = HashMap::new();
    let mut s = shared.tracker.state.lock();
    for ((key, e), held) in marked.into_iter().zip(held) {
        let plan = plans.entry(e.source).or_default();
        match (held, e.published) {
            // A stale location names the old address: unpublished, and
            // not published again until its namespace is recognized.
            (true, true) if e.stale => plan.unpublish.push((key, e.generation)),
            (true, false) if e.stale => {}
            (true, false) => plan.publish.push(key),
            (false, true) => plan.unpublish.push((key, e.generation)),
            // Never published and gone: forget it, unless committed again
            // since it was looked at.
            (false, false) => {
                if s.known
                    .get(&key)
                    .is_some_and(|now| now.generation == e.generation)
                {
                    s.known.remove(&key);
                }
            }
            (true, true) => {}
        }
    }
    (plans, s.sources.clone())
}

fn requeue(shared: &Shared, keys: &[BlockHash]) {
    shared
        .tracker
        .state
        .lock()
        .dirty
        .extend(keys.iter().copied());
}

/// Counts a refused call and logs the first of every hundred.
fn failed(shared: &Shared, what: &str, source: &Source, e: &MetaError) {
    let n = shared.failures.fetch_add(1, Ordering::Relaxed);
    if n.is_multiple_of(100) {
        tracing::warn!(
            instance = %source.instance,
            error = %e,
            failures = n + 1,
            "the metadata service refused to {what} node blocks; retrying"
        );
    }
}

/// Stops tracking a source the service will never take (its instance
/// exists without the source's spec): logged once, its blocks dropped.
fn refuse(shared: &Shared, id: u32, source: &Source, e: &MetaError) {
    let mut s = shared.tracker.state.lock();
    if !s.refused.insert(id) {
        return;
    }
    s.known.retain(|_, entry| entry.source != id);
    drop(s);
    tracing::warn!(
        instance = %source.instance,
        spec = %source.spec,
        error = %e,
        "not publishing these node blocks: the instance does not take them"
    );
}

/// Registers the source's instance in the view's group unless it exists.
async fn ensure_instance(shared: &Shared, id: u32, source: &Source) -> bool {
    if shared.tracker.state.lock().ready.contains(&id) {
        return true;
    }
    let svc = &shared.svc;
    let exists = match svc.get_instance_info(&source.instance).await {
        Ok(_) => true,
        Err(MetaError::InstanceNotFound(_)) => false,
        Err(e) => {
            failed(shared, "look up the instance of", source, &e);
            return false;
        }
    };
    if !exists {
        let registration = shared.tracker.state.lock().registrations.get(&id).cloned();
        let Some(r) = registration else {
            return false;
        };
        let geometry = shared.node.geometry();
        let instance = Instance {
            id: source.instance.clone(),
            group: shared.config.group.clone(),
            model: r.model,
            block_size: geometry.tokens_per_block,
            // Every rank's spec, so the other ranks publish into it too.
            location_specs: (0..r.tp_size)
                .map(|rank| LocationSpecInfo {
                    name: format!("tp{rank}"),
                    size: geometry.block_bytes(),
                })
                .collect(),
            spec_groups: vec![],
        };
        if let Err(e) = svc.register_instance(instance).await {
            failed(shared, "register the instance of", source, &e);
            return false;
        }
    }
    shared.tracker.state.lock().ready.insert(id);
    true
}

async fn publish(shared: &Shared, id: u32, source: &Source, keys: Vec<BlockHash>) {
    let size = shared.node.geometry().block_bytes();
    let keys = with_client_keys(shared, keys);
    for chunk in keys.chunks(CHUNK) {
        let parts: Result<Vec<PublishedPart>, _> = chunk
            .iter()
            .map(|&(k, e)| {
                let cluster = shared.config.cluster.as_ref();
                let b = PublishedBlock {
                    instance: source.instance.clone(),
                    spec: source.spec.clone(),
                    client_key: e.client,
                    stored: k.0,
                    peer: cluster.map(|c| c.sign(e.namespace, e.client, k.0, e.sum)),
                };
                Ok::<_, kvtier_meta::BackendError>(PublishedPart {
                    key: b.key(),
                    uri: b.uri(&shared.config.node_name)?,
                    size,
                })
            })
            .collect();
        let result = match parts {
            Ok(parts) => {
                let svc = &shared.svc;
                svc.publish_parts(
                    &source.instance,
                    &shared.config.storage,
                    &source.spec,
                    &parts,
                )
                .await
            }
            Err(e) => Err(MetaError::InvalidArgument(e.to_string())),
        };
        let chunk: Vec<BlockHash> = chunk.iter().map(|(k, _)| *k).collect();
        match result {
            Ok(_) => published(shared, id, &chunk),
            Err(e @ MetaError::InvalidArgument(_)) => return refuse(shared, id, source, &e),
            Err(e) => {
                failed(shared, "publish", source, &e);
                requeue(shared, &chunk);
            }
        }
    }
}

/// Pairs each stored key with what the view knows of it, leaving out keys
/// the view forgot meanwhile.
fn with_client_keys(shared: &Shared, keys: Vec<BlockHash>) -> Vec<(BlockHash, Entry)> {
    let s = shared.tracker.state.lock();
    keys.into_iter()
        .filter_map(|k| Some((k, *s.known.get(&k)?)))
        .collect()
}

async fn unpublish(shared: &Shared, source: &Source, keys: Vec<(BlockHash, u64)>) {
    for chunk in keys.chunks(CHUNK) {
        let meta_keys: Vec<BlockKey> = {
            let s = shared.tracker.state.lock();
            chunk
                .iter()
                .filter_map(|(k, _)| Some(BlockKey(s.known.get(k)?.client as u64)))
                .collect()
        };
        let svc = &shared.svc;
        match svc
            .unpublish_parts(
                &source.instance,
                &shared.config.storage,
                &source.spec,
                &meta_keys,
            )
            .await
        {
            Ok(_) => forget(shared, chunk),
            Err(e) => {
                failed(shared, "unpublish", source, &e);
                let keys: Vec<BlockHash> = chunk.iter().map(|(k, _)| *k).collect();
                requeue(shared, &keys);
            }
        }
    }
}

/// Marks the still-known entries of `keys` from source `id` published.
fn published(shared: &Shared, id: u32, keys: &[BlockHash]) {
    let mut s = shared.tracker.state.lock();
    for k in keys {
        if let Some(e) = s.known.get_mut(k).filter(|e| e.source == id) {
            e.published = true;
        }
    }
    drop(s);
    shared
        .published
        .fetch_add(keys.len() as u64, Ordering::Relaxed);
}

/// Forgets unpublished blocks, except those committed again meanwhile
/// (their newer entry is dirty and published afresh).
fn forget(shared: &Shared, keys: &[(BlockHash, u64)]) {
    let stale: Vec<BlockHash> = {
        let s = shared.tracker.state.lock();
        (keys.iter().map(|(k, _)| *k))
            .filter(|k| s.known.get(k).is_some_and(|e| e.stale))
            .collect()
    };
    // A stale entry of a block still held stays known, unpublished,
    // waiting for its namespace (`recognize`).
    let kept: HashSet<BlockHash> = (stale.into_iter())
        .filter(|k| shared.node.contains(*k))
        .collect();
    let mut s = shared.tracker.state.lock();
    for (k, generation) in keys {
        if kept.contains(k) {
            if let Some(e) = s.known.get_mut(k) {
                e.published = false;
            }
        } else if s.known.get(k).is_some_and(|e| e.generation == *generation) {
            s.known.remove(k);
        } else if let Some(e) = s.known.get_mut(k) {
            e.published = false;
        }
    }
    drop(s);
    shared
        .unpublished
        .fetch_add(keys.len() as u64, Ordering::Relaxed);
}
