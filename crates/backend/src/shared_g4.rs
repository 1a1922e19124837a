//! [`SharedG4Writer`]: the node's side of the cluster's shared G4
//! (docs/cluster.md, "A shared G4"; docs/meta-api.md §10.3). Every block
//! an engine commits on the node is queued under its *shared key* (the
//! cluster's key map of the session's namespace, [`SharedKeys`]); a worker
//! writes the queue in batches through the metadata service's two-phase
//! write: `startWriteCache` marks the blocks some node wrote already
//! (skipped: written once per cluster), the others are read back verified
//! from the node's tiers, written as block objects under their shared key
//! at the locations the session names, and only then confirmed by
//! `finishWriteCache`. The node never deletes a shared object: they are in
//! no pool of its manager, and only the service's reclaimer removes them,
//! under the group's quota.
//!
//! Why commits and not blocks reaching G3: a commit is when the block is
//! readable and its namespace known; a block that waits for G3 may be gone
//! before it gets there (an exclusive G2 evicts to G3 only under
//! pressure), and the cluster wants it as soon as another node could ask.
//!
//! Nothing here blocks a session: the observer only enqueues (a full queue
//! drops the block, counted), and a batch the service or the store refuses
//! is dropped, counted as failed (a later commit of the block queues it
//! again).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use kvtier_core::{BlockHash, BlockSums};
use kvtier_meta::{
    BlockKey, EvictionPolicy, Instance, InstanceGroup, LocationSpecInfo, MetaError, MetaService,
    Storage, StorageHealth, StorageKind, WriteTarget,
};
use kvtier_node::{
    CommitObserver, CommittedKey, HeldBlocks, HeldRead, Node, SessionNamespace,
    SharedG4SectionConfig, SharedKeys,
};
use kvtier_peer::LayerRange;
use kvtier_remote::{ObjectBlocks, RemoteConfig, RemoteError, format};
use kvtier_tier::BlockPut;
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::cluster::counter_families;

/// The one spec of the shared instance: a block is one object.
pub const SHARED_SPEC: &str = "block";

/// Objects written at once within a batch.
const PUT_CONCURRENCY: usize = 8;

/// Why the writer did not start.
#[derive(Debug, thiserror::Error)]
pub enum SharedG4Error {
    /// A storage of the configured name has another URI or kind.
    #[error(
        "storage {name:?} is {uri:?} ({kind}), not the shared G4 {url:?}: choose another shared_g4.storage"
    )]
    ForeignStorage {
        /// The storage.
        name: String,
        /// Its URI.
        uri: String,
        /// Its kind.
        kind: &'static str,
        /// The configured store.
        url: String,
    },
    /// The store cannot be used.
    #[error(transparent)]
    Store(#[from] RemoteError),
    /// The metadata service refused.
    #[error(transparent)]
    Meta(#[from] MetaError),
}

/// Counters of the writer, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SharedG4Stats {
    /// Blocks queued.
    pub queued: u64,
    /// Blocks written and confirmed.
    pub written: u64,
    /// Blocks some node had written already.
    pub present: u64,
    /// Blocks not written: the service or the store refused, or the node
    /// no longer held them verified.
    pub failed: u64,
    /// Blocks not queued: the queue was full.
    pub dropped: u64,
    /// Bytes of the blocks written.
    pub bytes: u64,
}

#[derive(Default)]
struct Counters {
    queued: AtomicU64,
    written: AtomicU64,
    present: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
    bytes: AtomicU64,
}

impl Counters {
    fn add(c: &AtomicU64, n: usize) {
        c.fetch_add(n as u64, Ordering::Relaxed);
    }

    fn snapshot(&self) -> SharedG4Stats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SharedG4Stats {
            queued: get(&self.queued),
            written: get(&self.written),
            present: get(&self.present),
            failed: get(&self.failed),
            dropped: get(&self.dropped),
            bytes: get(&self.bytes),
        }
    }
}

/// A committed block to write: the key the node holds it under and its
/// shared key.
#[derive(Debug, Clone, Copy)]
struct Queued {
    stored: BlockHash,
    shared: BlockHash,
}

/// The metadata service's key of a shared block: the low 64 bits of its
/// shared key (the object's header carries all 128, checked on read).
pub fn shared_block_key(shared: BlockHash) -> BlockKey {
    BlockKey(shared.0 as u64)
}

struct Shared {
    node: Arc<Node>,
    svc: Arc<MetaService>,
    blocks: ObjectBlocks,
    config: SharedG4SectionConfig,
    counters: Counters,
    /// Blocks settled (written, present or failed), for `sync`.
    settled: watch::Sender<u64>,
}

/// Queues each committed block under its shared key.
struct Observer {
    keys: SharedKeys,
    queue: mpsc::Sender<Queued>,
    shared: Arc<Shared>,
}

impl CommitObserver for Observer {
    fn committed(&self, ns: &SessionNamespace, blocks: &[CommittedKey]) {
        let map = self.keys.key_map(&ns.namespace);
        let c = &self.shared.counters;
        for b in blocks {
            let q = Queued {
                stored: b.stored,
                shared: map.stored(b.client),
            };
            match self.queue.try_send(q) {
                Ok(()) => Counters::add(&c.queued, 1),
                Err(_) => Counters::add(&c.dropped, 1),
            }
        }
    }
}

/// The running writer; dropping it stops the worker.
pub struct SharedG4Writer {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for SharedG4Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedG4Writer")
            .field("url", &self.shared.config.url)
            .field("stats", &self.stats())
            .finish()
    }
}

impl SharedG4Writer {
    /// Ensures the storage, group and instance `config` names in `svc`,
    /// observes `node`'s commits and starts the worker. `store` is how the
    /// node reaches the store (its URL must be `config.url`); `keys` the
    /// cluster's.
    pub async fn start(
        node: Arc<Node>,
        svc: Arc<MetaService>,
        keys: SharedKeys,
        store: &RemoteConfig,
        config: SharedG4SectionConfig,
    ) -> Result<Self, SharedG4Error> {
        let blocks = ObjectBlocks::open(store, *node.geometry())?;
        ensure_storage(&svc, &config, blocks.url())?;
        ensure_group(&svc, &config)?;
        ensure_instance(&svc, &config, &node).await?;
        let (queue, rx) = mpsc::channel(config.queue_blocks.max(1));
        let shared = Arc::new(Shared {
            node: node.clone(),
            svc,
            blocks,
            config,
            counters: Counters::default(),
            settled: watch::Sender::new(0),
        });
        node.observe_commits(Arc::new(Observer {
            keys,
            queue,
            shared: shared.clone(),
        }));
        tracing::info!(
            url = %shared.config.url,
            instance = %shared.config.instance,
            "writing committed blocks to the cluster's shared G4"
        );
        let (stop, stop_rx) = watch::channel(false);
        let worker = tokio::spawn(work(shared.clone(), rx, stop_rx));
        Ok(Self {
            shared,
            stop,
            worker: Mutex::new(Some(worker)),
        })
    }

    /// Counters so far.
    pub fn stats(&self) -> SharedG4Stats {
        self.shared.counters.snapshot()
    }

    /// Returns once every block queued before the call is settled
    /// (written, found present, or failed).
    pub async fn sync(&self) {
        let queued = self.shared.counters.queued.load(Ordering::Relaxed);
        let mut rx = self.shared.settled.subscribe();
        // Err: the worker is gone, nothing more settles.
        let _ = rx.wait_for(|&settled| settled >= queued).await;
    }

    /// The counters as OpenMetrics text, for `/metrics`.
    pub fn metrics_text(&self) -> String {
        let s = self.stats();
        let rows = [
            (
                "queued",
                "Committed blocks queued for the shared G4",
                s.queued,
            ),
            (
                "written",
                "Blocks written to the shared G4 and confirmed",
                s.written,
            ),
            (
                "present",
                "Queued blocks the cluster had in the shared G4 already",
                s.present,
            ),
            (
                "failed",
                "Queued blocks not written (refused, or no longer held)",
                s.failed,
            ),
            (
                "dropped",
                "Committed blocks not queued: the queue was full",
                s.dropped,
            ),
            (
                "written_bytes",
                "Bytes of blocks written to the shared G4",
                s.bytes,
            ),
        ];
        counter_families("kvtier_node_shared_g4_", &rows)
    }

    /// Stops the worker (the batch in flight is finished first).
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        let worker = self.worker.lock().take();
        if let Some(w) = worker {
            let _ = w.await;
        }
    }
}

impl Drop for SharedG4Writer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Creates the store's storage unless it exists, under `url` (the
/// store's URL as object URIs show it): an `s3://` one of kind
/// [`StorageKind::S3`], a shared directory (`file://`) of kind
/// [`StorageKind::FileObjects`]; one of that name with another URI is
/// refused.
fn ensure_storage(
    svc: &MetaService,
    config: &SharedG4SectionConfig,
    url: &str,
) -> Result<(), SharedG4Error> {
    let kind = if url.starts_with("file://") {
        StorageKind::FileObjects
    } else {
        StorageKind::S3
    };
    match svc
        .list_storages()
        .into_iter()
        .find(|s| s.name == config.storage)
    {
        Some(s) if s.uri.trim_end_matches('/') == url && s.kind == kind => Ok(()),
        Some(s) => Err(SharedG4Error::ForeignStorage {
            name: s.name,
            uri: s.uri,
            kind: s.kind.as_str(),
            url: config.url.clone(),
        }),
        None => Ok(svc.add_storage(Storage {
            name: config.storage.clone(),
            kind,
            uri: url.to_owned(),
            enabled: true,
            health: StorageHealth::Healthy,
            spec: None,
        })?),
    }
}

/// Creates the group, on the store's storage with the configured quota,
/// unless it exists (then its settings are the operator's).
fn ensure_group(svc: &MetaService, config: &SharedG4SectionConfig) -> Result<(), SharedG4Error> {
    if svc.list_groups().iter().any(|g| g.name == config.group) {
        return Ok(());
    }
    let created = svc.create_group(InstanceGroup {
        name: config.group.clone(),
        quota_bytes: config.quota_bytes,
        kind_quota_bytes: Default::default(),
        watermark: 0.9,
        eviction: EvictionPolicy::Lru,
        storages: vec![config.storage.clone()],
        max_instances: 16,
        ..Default::default()
    });
    match created {
        // Another node created it meanwhile.
        Err(MetaError::AlreadyExists(_)) => Ok(()),
        r => Ok(r?),
    }
}

/// Registers the shared instance unless it exists: one spec of the
/// object's bytes (header and block). A node of another block shape is
/// refused by the registration (`DUPLICATE_ENTITY`).
async fn ensure_instance(
    svc: &MetaService,
    config: &SharedG4SectionConfig,
    node: &Node,
) -> Result<(), SharedG4Error> {
    let g = node.geometry();
    let instance = Instance {
        id: config.instance.clone(),
        group: config.group.clone(),
        model: "kvtier-shared-g4".into(),
        block_size: g.tokens_per_block,
        location_specs: vec![LocationSpecInfo {
            name: SHARED_SPEC.into(),
            size: format::header_len(g.layers) as u64 + g.block_bytes(),
        }],
        spec_groups: vec![],
    };
    svc.register_instance(instance).await?;
    Ok(())
}

/// Writes the queue batch by batch until stopped.
async fn work(
    shared: Arc<Shared>,
    mut rx: mpsc::Receiver<Queued>,
    mut stop: watch::Receiver<bool>,
) {
    let most = shared.config.batch.max(1);
    let mut batch = Vec::with_capacity(most);
    loop {
        batch.clear();
        tokio::select! {
            n = rx.recv_many(&mut batch, most) => if n == 0 { return },
            _ = stop.changed() => return,
        }
        let n = batch.len();
        write_batch(&shared, &batch).await;
        shared.settled.send_modify(|s| *s += n as u64);
    }
}

/// One write session over `batch`: the blocks the cluster lacks written
/// and confirmed, the rest counted.
async fn write_batch(shared: &Shared, batch: &[Queued]) {
    let c = &shared.counters;
    let mut by_key: HashMap<BlockKey, Queued> = HashMap::with_capacity(batch.len());
    let mut keys = Vec::with_capacity(batch.len());
    for q in batch {
        let k = shared_block_key(q.shared);
        if by_key.insert(k, *q).is_none() {
            keys.push(k);
        }
    }
    // A key twice in one batch is one block (or a 64-bit collision, which
    // the object header's 128-bit key turns into a miss): present.
    Counters::add(&c.present, batch.len() - keys.len());
    let instance = &shared.config.instance;
    let grant = match shared.svc.start_write_cache(instance, &keys).await {
        Ok(grant) => grant,
        Err(e) => {
            tracing::warn!(error = %e, blocks = keys.len(), "the shared G4 write was refused");
            Counters::add(&c.failed, keys.len());
            return;
        }
    };
    Counters::add(&c.present, keys.len() - grant.blocks.len());
    let targets: Vec<(Queued, Option<String>)> = (grant.blocks.iter())
        .filter_map(|t| by_key.get(&t.key).map(|q| (*q, uri_of(t))))
        .collect();
    let done = put_all(shared, targets).await;
    let written = done.iter().filter(|d| d.is_some()).count();
    let bytes: u64 = done.iter().flatten().sum();
    let mask: Vec<bool> = done.iter().map(Option::is_some).collect();
    match (shared.svc)
        .finish_write_cache(instance, grant.session, &mask)
        .await
    {
        Ok(_) => {
            Counters::add(&c.written, written);
            Counters::add(&c.bytes, bytes as usize);
            Counters::add(&c.failed, grant.blocks.len() - written);
        }
        Err(e) => {
            tracing::warn!(error = %e, "the shared G4 write could not be confirmed");
            Counters::add(&c.failed, grant.blocks.len());
        }
    }
}

/// The URI of the object a write target names.
fn uri_of(t: &WriteTarget) -> Option<String> {
    let part = t.location.specs.iter().find(|s| s.name == SHARED_SPEC)?;
    Some(part.uri.clone())
}

/// Reads each target's block from the node's tiers (verified) and writes
/// it at its location under its shared key: per target, the bytes written,
/// or `None`.
async fn put_all(shared: &Shared, targets: Vec<(Queued, Option<String>)>) -> Vec<Option<u64>> {
    let stored: Vec<BlockHash> = targets.iter().map(|(q, _)| q.stored).collect();
    let reads = HeldBlocks::take(&shared.node, &stored)
        .read(LayerRange::All)
        .await;
    futures::stream::iter(targets.into_iter().zip(reads))
        .map(|((q, uri), read)| put_one(shared, q, uri, read))
        .buffered(PUT_CONCURRENCY)
        .collect()
        .await
}

/// Writes one block read back from the node; `None` when it was not held
/// verified, its location is not in the store, or the store refused.
async fn put_one(shared: &Shared, q: Queued, uri: Option<String>, read: HeldRead) -> Option<u64> {
    let HeldRead::Served(_, block) = read else {
        return None;
    };
    let uri = uri?;
    let Some(path) = shared.blocks.path_of(&uri) else {
        tracing::warn!(%uri, url = %shared.blocks.url(), "a shared G4 location outside the store");
        return None;
    };
    let layer_bytes = shared.blocks.geometry().layer_bytes() as usize;
    // The bytes are this read's own buffer, verified against the node's
    // sums: summed again under the shared key, as every node will check.
    let sums = BlockSums::compute(q.shared, layer_bytes, &block.bytes);
    let put = BlockPut {
        key: q.shared,
        data: &block.bytes,
        sums: &sums,
        pinned: None,
    };
    match shared.blocks.put(&path, &put).await {
        Ok(()) => Some(block.bytes.len() as u64),
        Err(e) => {
            tracing::warn!(%uri, error = %e, "writing a shared G4 object failed");
            None
        }
    }
}
