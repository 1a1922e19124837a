//! [`TransferEngine`]: a queue and a worker per path; batching; completion
//! fan-out; metrics.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use kvtier_core::{BlockHash, Geometry};
use tokio::sync::mpsc;

use super::completion::{Completer, CompletionCell};
use super::executor::execute;
use super::hooks::{InFlightHooks, NoHooks, TransferTicket};
use super::metrics::{PathStats, TransferMetrics};
use super::request::Span;
use super::request::{BlockMove, TransferHandle, TransferRequest};
use crate::tier::{TierList, TransferPath};

/// Why an engine could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// A tier's block shape differs from the engine's geometry.
    #[error("{tier} geometry mismatch: {detail}")]
    GeometryMismatch {
        /// Which tier.
        tier: &'static str,
        /// What differs.
        detail: String,
    },
    /// The engine's workers need a tokio runtime and none is running.
    #[error("the transfer engine must be built inside a tokio runtime")]
    NoRuntime,
    /// A setting is out of range.
    #[error("invalid transfer engine setting: {0}")]
    InvalidConfig(String),
}

/// Builds a [`TransferEngine`].
pub struct TransferEngineBuilder {
    tiers: TierList,
    hooks: Arc<dyn InFlightHooks>,
    max_batch_blocks: usize,
    batches_in_flight: usize,
}

impl TransferEngineBuilder {
    /// In-flight protection callbacks. Default: [`NoHooks`].
    pub fn with_hooks(mut self, hooks: Arc<dyn InFlightHooks>) -> Self {
        self.hooks = hooks;
        self
    }

    /// The most blocks one batch takes from a path's queue (a single
    /// request larger than this still runs as one batch). Default: 256.
    pub fn with_max_batch_blocks(mut self, n: usize) -> Self {
        self.max_batch_blocks = n;
        self
    }

    /// Batches one path may run at once. With 1, a path completes its
    /// batches in submission order (layer-ordered loads arrive in layer
    /// order); more keep a deep device queue busy (the disk tier gets
    /// several submissions in flight) at the price of completions in any
    /// order. Default: 1.
    pub fn with_batches_in_flight(mut self, n: usize) -> Self {
        self.batches_in_flight = n;
        self
    }

    /// Starts one worker per path between the tiers on the current tokio
    /// runtime.
    pub fn build(self) -> Result<TransferEngine, TransferError> {
        if self.batches_in_flight == 0 {
            return Err(TransferError::InvalidConfig(
                "batches_in_flight must be positive".into(),
            ));
        }
        if self.max_batch_blocks == 0 {
            return Err(TransferError::InvalidConfig(
                "max_batch_blocks must be positive".into(),
            ));
        }
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| TransferError::NoRuntime)?;
        let paths = self.tiers.paths();
        let shared = Arc::new(Shared {
            tiers: self.tiers,
            hooks: self.hooks,
            metrics: TransferMetrics::new(&paths),
            max_batch_blocks: self.max_batch_blocks,
            batches_in_flight: self.batches_in_flight,
        });
        let mut queues = HashMap::new();
        for (index, path) in paths.into_iter().enumerate() {
            let (tx, rx) = mpsc::unbounded_channel();
            queues.insert(path, tx);
            runtime.spawn(worker(shared.clone(), path, index, rx));
        }
        Ok(TransferEngine {
            inner: Arc::new(EngineInner {
                shared,
                queues,
                next_id: AtomicU64::new(1),
            }),
        })
    }
}

/// What the workers share.
struct Shared {
    tiers: TierList,
    hooks: Arc<dyn InFlightHooks>,
    metrics: TransferMetrics,
    max_batch_blocks: usize,
    batches_in_flight: usize,
}

struct EngineInner {
    shared: Arc<Shared>,
    /// Dropping the senders (with the last engine clone) stops the workers
    /// once their queues drain.
    queues: HashMap<TransferPath, mpsc::UnboundedSender<Job>>,
    next_id: AtomicU64,
}

/// One submitted transfer waiting in (or taken from) a path's queue.
struct Job {
    id: u64,
    span: Span,
    blocks: Vec<BlockMove>,
    completer: Completer,
    submitted: Instant,
}

/// Moves blocks between tiers: one FIFO queue and one worker per
/// [`TransferPath`], so paths run concurrently and each path executes its
/// batches in submission order (layer-ordered reads complete in layer
/// order; see [`TransferEngineBuilder::with_batches_in_flight`] for
/// running several at once). A worker takes every queued request with the same span, up to
/// `max_batch_blocks` blocks, and runs them as one batch: one disk or
/// remote submission.
///
/// Cheap to clone. Workers stop when the last clone is dropped and their
/// queues are drained; a transfer whose worker dies fails as
/// [`Abandoned`](super::BlockFailure::Abandoned).
#[derive(Clone)]
pub struct TransferEngine {
    inner: Arc<EngineInner>,
}

impl std::fmt::Debug for TransferEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferEngine")
            .field("tiers", &self.inner.shared.tiers)
            .finish()
    }
}

impl TransferEngine {
    /// A builder moving blocks between `tiers` (and the geometry they
    /// store).
    pub fn builder(tiers: TierList) -> TransferEngineBuilder {
        TransferEngineBuilder {
            tiers,
            hooks: Arc::new(NoHooks),
            max_batch_blocks: 256,
            batches_in_flight: 1,
        }
    }

    /// The block geometry.
    pub fn geometry(&self) -> &Geometry {
        self.inner.shared.tiers.geometry()
    }

    /// The tiers, in order (the list the manager uses too).
    pub fn tiers(&self) -> &TierList {
        &self.inner.shared.tiers
    }

    /// Queues a transfer. The in-flight hooks' `begin_transfer` runs before
    /// this returns; the handle completes per block.
    pub fn submit(&self, request: TransferRequest) -> TransferHandle {
        let TransferRequest { path, span, blocks } = request;
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let keys: Arc<[BlockHash]> = blocks.iter().map(|b| b.key).collect();
        let cell = Arc::new(CompletionCell::new(blocks.len()));
        let handle = TransferHandle::new(path, keys.clone(), cell.clone());
        let shared = &self.inner.shared;
        shared.hooks.begin_transfer(&TransferTicket {
            id,
            path,
            span,
            keys: &keys,
        });
        let n = blocks.len() as u64;
        let Some(metrics) = shared.metrics.path(path) else {
            finish_unserved(shared, path, id, &blocks, Completer::new(cell));
            return handle;
        };
        metrics.queued(n);
        let job = Job {
            id,
            span,
            blocks,
            completer: Completer::new(cell),
            submitted: Instant::now(),
        };
        let sent = self
            .inner
            .queues
            .get(&path)
            .map(|q| q.send(job).map_err(|e| e.0));
        if let Some(Err(job)) = sent {
            // The worker is gone (runtime shut down): the job fails as
            // abandoned, but its hooks must still be released.
            metrics.dequeued(n);
            finish_abandoned(shared, path, job);
        }
        handle
    }

    /// Counters of `path`.
    pub fn stats(&self, path: TransferPath) -> PathStats {
        self.inner.shared.metrics.snapshot(path)
    }

    /// Counters of every path.
    pub fn stats_all(&self) -> Vec<PathStats> {
        self.inner.shared.metrics.snapshot_all()
    }
}

fn finish_abandoned(shared: &Shared, path: TransferPath, job: Job) {
    let failure = Err(super::BlockFailure::Abandoned);
    for (i, b) in job.blocks.iter().enumerate() {
        shared.hooks.finish_transfer(job.id, path, b.key, &failure);
        if let Some(m) = shared.metrics.path(path) {
            m.block_done(false, 0);
        }
        job.completer.complete(i, failure.clone());
    }
}

/// Fails a transfer along a path between tiers the engine does not have,
/// releasing its hooks.
fn finish_unserved(
    shared: &Shared,
    path: TransferPath,
    id: u64,
    blocks: &[BlockMove],
    completer: Completer,
) {
    let failure = Err(super::BlockFailure::Unsupported(path));
    for (i, b) in blocks.iter().enumerate() {
        shared.hooks.finish_transfer(id, path, b.key, &failure);
        completer.complete(i, failure.clone());
    }
}

/// The worker of `path`, the `index`th path of the engine's metrics.
async fn worker(
    shared: Arc<Shared>,
    path: TransferPath,
    index: usize,
    mut rx: mpsc::UnboundedReceiver<Job>,
) {
    let mut carry: Option<Job> = None;
    // Bounds the batches of this path running at once.
    let slots = Arc::new(tokio::sync::Semaphore::new(shared.batches_in_flight));
    loop {
        let first = match carry.take() {
            Some(j) => j,
            None => match rx.recv().await {
                Some(j) => j,
                None => return,
            },
        };
        let span = first.span;
        let mut blocks = first.blocks.len();
        let mut batch = vec![first];
        while blocks < shared.max_batch_blocks {
            match rx.try_recv() {
                Ok(j) if j.span == span => {
                    blocks += j.blocks.len();
                    batch.push(j);
                }
                Ok(j) => {
                    // A different span (the next layer) starts the next batch,
                    // which keeps layer order.
                    carry = Some(j);
                    break;
                }
                Err(_) => break,
            }
        }
        if shared.batches_in_flight == 1 {
            run_batch(&shared, (path, index), span, batch, blocks).await;
            continue;
        }
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            run_batch(&shared, (path, index), span, batch, blocks).await;
            drop(slot);
        });
    }
}

async fn run_batch(
    shared: &Shared,
    (path, index): (TransferPath, usize),
    span: Span,
    batch: Vec<Job>,
    blocks: usize,
) {
    let metrics = shared.metrics.at(index);
    metrics.dequeued(blocks as u64);
    metrics.batch();
    let all: Vec<BlockMove> = batch
        .iter()
        .flat_map(|j| j.blocks.iter().cloned())
        .collect();
    let results = execute(&shared.tiers, path, span, &all).await;
    let bytes = span.bytes(shared.tiers.geometry());
    let mut results = results.into_iter();
    for job in batch {
        let done: Vec<_> = job
            .blocks
            .iter()
            .map(|b| {
                let r = results.next().unwrap_or(Err(super::BlockFailure::Abandoned));
                if let Err(e) = &r {
                    tracing::debug!(path = %path, key = %b.key, error = %e, "block transfer failed");
                }
                shared.hooks.finish_transfer(job.id, path, b.key, &r);
                metrics.block_done(r.is_ok(), bytes);
                r
            })
            .collect();
        // Counters and hooks first, waiters last: a waiter that sees the
        // transfer done also sees it counted and its blocks released.
        metrics.transfer_done(job.submitted.elapsed());
        for (i, r) in done.into_iter().enumerate() {
            job.completer.complete(i, r);
        }
    }
}
