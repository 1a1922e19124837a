//! [`IoScheduler`]: the policy wired to the transfer engine.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kvtier_core::BlockHash;
use parking_lot::Mutex;
use serde::Serialize;

use super::clock::Clock;
use super::load::LoadHandle;
use super::policy::{IoClass, IoPolicy, OpId, PolicyConfig, PolicyCounters};
use super::slack::{ProfileError, SlackEstimator, SlackProfile};
use crate::tier::TransferPath;
use crate::transfer::Span;
use crate::transfer::completion::{Completer, CompletionCell};
use crate::transfer::{
    BlockMove, TransferEngine, TransferHandle, TransferOutcome, TransferRequest,
};

/// Settings of an [`IoScheduler`].
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// Queue limits and the write budget.
    pub policy: PolicyConfig,
    /// EWMA weight of a new compute or bandwidth sample. Default: 0.2.
    pub ewma_alpha: f64,
    /// Starting estimates (e.g. [`SlackProfile::load`]). Default: none.
    pub profile: Option<SlackProfile>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            policy: PolicyConfig::default(),
            ewma_alpha: 0.2,
            profile: None,
        }
    }
}

/// Why a scheduler could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// Completions are forwarded by tasks on a tokio runtime.
    #[error("the I/O scheduler must be built inside a tokio runtime")]
    NoRuntime,
    /// The profile is unusable.
    #[error(transparent)]
    Profile(#[from] ProfileError),
}

/// A snapshot of the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SchedulerStats {
    /// The policy's decision counters.
    pub policy: PolicyCounters,
    /// Reads queued, not dispatched.
    pub reads_queued: usize,
    /// Writes queued, not dispatched.
    pub writes_queued: usize,
    /// Reads in flight.
    pub reads_in_flight: usize,
    /// Writes in flight.
    pub writes_in_flight: usize,
    /// `wait_layer` calls resolved.
    pub layer_waits: u64,
    /// Of those, the ones that waited a measurable time (bubble > 0 on
    /// the scheduler's clock).
    pub blocked_layer_waits: u64,
    /// Total time consumers waited in `wait_layer`: the GPU bubble.
    pub bubble: Duration,
    /// Learned read bandwidth, bytes per second.
    pub read_bandwidth: Option<f64>,
    /// Learned write bandwidth, bytes per second.
    pub write_bandwidth: Option<f64>,
}

/// One operation the policy knows about.
struct Pending {
    /// Taken when dispatched.
    request: Option<TransferRequest>,
    /// Where its results go (the caller's handle, or a layer of a load).
    sink: Completer,
    dispatched_at: Duration,
}

struct State {
    policy: IoPolicy,
    slack: SlackEstimator,
    ops: HashMap<OpId, Pending>,
    next_op: u64,
}

pub(crate) struct SchedInner {
    engine: TransferEngine,
    pub(crate) clock: Arc<dyn Clock>,
    runtime: tokio::runtime::Handle,
    state: Mutex<State>,
    bubble_ns: AtomicU64,
    layer_waits: AtomicU64,
    blocked_waits: AtomicU64,
}

/// Tutti's slack-aware scheduler in front of a [`TransferEngine`]: reads
/// before writes, bounded read/write contention, writes deferred into
/// compute slack, layer-wise loading ([`load`](Self::load)), slack learned
/// online from [`record_layer_compute`](Self::record_layer_compute), and
/// bubble accounting. One scheduler per device whose bandwidth it guards.
///
/// The decisions are [`IoPolicy`]'s; see its module for the rules.
#[derive(Clone)]
pub struct IoScheduler {
    inner: Arc<SchedInner>,
}

impl std::fmt::Debug for IoScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoScheduler")
            .field("stats", &self.stats())
            .finish()
    }
}

impl IoScheduler {
    /// A scheduler over `engine`, timing with `clock`.
    pub fn new(
        engine: TransferEngine,
        config: SchedulerConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, SchedulerError> {
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| SchedulerError::NoRuntime)?;
        let slack = match &config.profile {
            Some(p) => {
                p.validate()?;
                SlackEstimator::from_profile(config.ewma_alpha, p)
            }
            None => SlackEstimator::new(config.ewma_alpha),
        };
        Ok(Self {
            inner: Arc::new(SchedInner {
                engine,
                clock,
                runtime,
                state: Mutex::new(State {
                    policy: IoPolicy::new(config.policy),
                    slack,
                    ops: HashMap::new(),
                    next_op: 1,
                }),
                bubble_ns: AtomicU64::new(0),
                layer_waits: AtomicU64::new(0),
                blocked_waits: AtomicU64::new(0),
            }),
        })
    }

    /// The engine underneath.
    pub fn engine(&self) -> &TransferEngine {
        &self.inner.engine
    }

    /// Loads `blocks` along `path` layer by layer (a read into the arena,
    /// `g3_to_g2` or `g4_to_g2`, each block naming its landing slot):
    /// one read batch per layer for all blocks, queued in layer order ahead
    /// of every write.
    pub fn load(&self, path: TransferPath, blocks: Vec<BlockMove>) -> LoadHandle {
        let g = *self.inner.engine.geometry();
        let keys: Arc<[BlockHash]> = blocks.iter().map(|b| b.key).collect();
        let bytes = g.layer_bytes() * blocks.len() as u64;
        let mut cells = Vec::with_capacity(g.layers as usize);
        {
            let mut st = self.inner.state.lock();
            st.policy.begin_forward();
            for l in 0..g.layers {
                let cell = Arc::new(CompletionCell::new(blocks.len()));
                cells.push(cell.clone());
                if blocks.is_empty() {
                    continue;
                }
                let request = TransferRequest {
                    path,
                    span: Span::Layer(l),
                    blocks: blocks.clone(),
                };
                st.enqueue(IoClass::Read, bytes, request, Completer::new(cell));
            }
        }
        let handle = LoadHandle {
            keys,
            layers: cells,
            sched: self.inner.clone(),
        };
        self.inner.pump();
        handle
    }

    /// Queues a whole-block transfer: a read (onboard) when
    /// [`path.is_read()`](TransferPath::is_read), otherwise a write (offload,
    /// deferred into slack).
    pub fn submit(&self, request: TransferRequest) -> TransferHandle {
        let class = if request.path.is_read() {
            IoClass::Read
        } else {
            IoClass::Write
        };
        let bytes = request.span.bytes(self.inner.engine.geometry()) * request.blocks.len() as u64;
        let keys: Arc<[BlockHash]> = request.blocks.iter().map(|b| b.key).collect();
        let cell = Arc::new(CompletionCell::new(request.blocks.len()));
        let handle = TransferHandle::new(request.path, keys, cell.clone());
        if !request.blocks.is_empty() {
            self.inner
                .state
                .lock()
                .enqueue(class, bytes, request, Completer::new(cell));
            self.inner.pump();
        }
        handle
    }

    /// Records that `layer` computed for `duration` (closes its compute
    /// window and teaches the slack estimator).
    pub fn record_layer_compute(&self, layer: u32, duration: Duration) {
        {
            let mut st = self.inner.state.lock();
            st.slack.record_layer_compute(layer, duration);
            st.policy.close_window();
        }
        self.inner.pump();
    }

    /// The slack estimator as learned so far.
    pub fn slack(&self) -> SlackEstimator {
        self.inner.state.lock().slack.clone()
    }

    /// Writes what was learned to a JSON profile.
    pub fn save_profile(&self, path: &std::path::Path) -> Result<(), ProfileError> {
        self.slack().profile().save(path)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> SchedulerStats {
        let st = self.inner.state.lock();
        let (reads_queued, writes_queued) = st.policy.queued();
        let (reads_in_flight, writes_in_flight) = st.policy.in_flight();
        SchedulerStats {
            policy: st.policy.counters(),
            reads_queued,
            writes_queued,
            reads_in_flight,
            writes_in_flight,
            layer_waits: self.inner.layer_waits.load(Ordering::Relaxed),
            blocked_layer_waits: self.inner.blocked_waits.load(Ordering::Relaxed),
            bubble: Duration::from_nanos(self.inner.bubble_ns.load(Ordering::Relaxed)),
            read_bandwidth: st.slack.read_bandwidth(),
            write_bandwidth: st.slack.write_bandwidth(),
        }
    }
}

impl State {
    fn enqueue(&mut self, class: IoClass, bytes: u64, request: TransferRequest, sink: Completer) {
        let id = OpId(self.next_op);
        self.next_op += 1;
        self.policy.push(id, class, bytes);
        self.ops.insert(
            id,
            Pending {
                request: Some(request),
                sink,
                dispatched_at: Duration::ZERO,
            },
        );
    }
}

impl SchedInner {
    /// Dispatches whatever the policy allows now.
    fn pump(self: &Arc<Self>) {
        let now = self.clock.now();
        let dispatch: Vec<(OpId, TransferRequest)> = {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            let slack = &st.slack;
            let ids = st.policy.next(now, |b| slack.write_time(b));
            ids.into_iter()
                .filter_map(|id| {
                    let p = st.ops.get_mut(&id)?;
                    p.dispatched_at = now;
                    p.request.take().map(|r| (id, r))
                })
                .collect()
        };
        for (id, request) in dispatch {
            let handle = self.engine.submit(request);
            let me = self.clone();
            self.runtime.spawn(async move {
                let outcome = handle.wait().await;
                me.finished(id, outcome);
            });
        }
    }

    /// An operation completed: update the policy and estimates, dispatch
    /// what that allows, then wake the operation's waiters (so a waiter
    /// sees the decisions its completion caused).
    fn finished(self: &Arc<Self>, id: OpId, outcome: TransferOutcome) {
        let now = self.clock.now();
        let pending = {
            let mut st = self.state.lock();
            let pending = st.ops.remove(&id);
            if let Some((class, bytes)) = st.policy.complete(id) {
                let took = now.saturating_sub(pending.as_ref().map_or(now, |p| p.dispatched_at));
                let delivered =
                    bytes * outcome.delivered() as u64 / outcome.blocks.len().max(1) as u64;
                match class {
                    IoClass::Read => st.slack.record_read(delivered, took),
                    IoClass::Write => st.slack.record_write(delivered, took),
                }
            }
            pending
        };
        self.pump();
        if let Some(p) = pending {
            for (i, (_, r)) in outcome.blocks.into_iter().enumerate() {
                p.sink.complete(i, r);
            }
        }
    }

    /// A `wait_layer` resolved after `bubble` of waiting: layer `layer`
    /// starts computing now.
    pub(crate) fn layer_consumed(self: &Arc<Self>, layer: u32, bubble: Duration) {
        self.layer_waits.fetch_add(1, Ordering::Relaxed);
        if !bubble.is_zero() {
            self.blocked_waits.fetch_add(1, Ordering::Relaxed);
        }
        let ns = u64::try_from(bubble.as_nanos()).unwrap_or(u64::MAX);
        self.bubble_ns.fetch_add(ns, Ordering::Relaxed);
        {
            let mut st = self.state.lock();
            let end = st.slack.layer_compute(layer).map(|c| self.clock.now() + c);
            st.policy.open_window(end);
        }
        self.pump();
    }

    /// A load handle went away: its forward pass is over.
    pub(crate) fn end_forward(self: &Arc<Self>) {
        self.state.lock().policy.end_forward();
        self.pump();
    }
}
