//! [`QueuedSink`]: a bounded queue in front of a transport that may be slow
//! or down, drained by one Tokio task.
//!
//! The data path only ever pushes onto the queue (a mutex held for a
//! `VecDeque` push). When the queue is full, the [`Overflow`] policy picks the
//! batch to lose and the loss is counted; the data path never waits for the
//! network.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::{EventBatch, EventError, EventSink, SinkCounters, SinkCounts};

/// Sends one encoded batch somewhere; run only by a [`QueuedSink`]'s worker
/// task, one batch at a time, so it may take as long as it likes.
pub trait BatchTransport: Send + 'static {
    /// Sends one batch. An error loses that batch (counted in
    /// [`SinkCounts::errors`]); the worker goes on with the next one.
    fn send(&mut self, batch: &EventBatch) -> impl Future<Output = Result<(), EventError>> + Send;

    /// Called once after the last batch, before the worker exits: flush
    /// client buffers, close sockets.
    fn shutdown(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Which batch a full queue gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overflow {
    /// Discard the oldest queued batch to make room: consumers see the most
    /// recent state, which is what a router wants after an outage.
    #[default]
    DropOldest,
    /// Discard the batch being published: consumers see an unbroken prefix
    /// of the stream up to the outage.
    DropNewest,
}

/// Size and overflow policy of a [`QueuedSink`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// Batches the queue holds before it drops. Default: 1024. Values below
    /// 1 are treated as 1.
    pub capacity: usize,
    /// What a full queue drops. Default: [`Overflow::DropOldest`].
    pub overflow: Overflow,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            capacity: 1024,
            overflow: Overflow::DropOldest,
        }
    }
}

struct Queue {
    batches: VecDeque<Arc<EventBatch>>,
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    config: QueueConfig,
    /// Wakes the worker when a batch arrives or the sink closes. `Notify`
    /// keeps one permit, so a wake-up sent while the worker is busy is not
    /// lost.
    wake: Notify,
    counters: SinkCounters,
}

/// An [`EventSink`] that queues batches and sends them with a
/// [`BatchTransport`] from a background task.
pub struct QueuedSink {
    name: String,
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl QueuedSink {
    /// Starts the worker task for `transport` on the current Tokio runtime.
    pub fn spawn<T: BatchTransport>(
        name: impl Into<String>,
        transport: T,
        config: QueueConfig,
    ) -> Result<Self, EventError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| EventError::NoRuntime { what: "sink" })?;
        let config = QueueConfig {
            capacity: config.capacity.max(1),
            ..config
        };
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                batches: VecDeque::with_capacity(config.capacity.min(4096)),
                closed: false,
            }),
            config,
            wake: Notify::new(),
            counters: SinkCounters::default(),
        });
        let name = name.into();
        let worker = runtime.spawn(drain(name.clone(), Arc::clone(&shared), transport));
        Ok(Self {
            name,
            shared,
            worker: Mutex::new(Some(worker)),
        })
    }

    /// Batches waiting in the queue.
    pub fn queued(&self) -> usize {
        self.shared.queue.lock().batches.len()
    }

    /// Closes the sink and waits until the worker has sent what was queued
    /// and shut the transport down.
    pub async fn close_and_wait(&self) {
        self.close();
        let worker = self.worker.lock().take();
        if let Some(worker) = worker {
            // A worker that panicked has nothing left to deliver.
            let _ = worker.await;
        }
    }
}

impl EventSink for QueuedSink {
    fn name(&self) -> &str {
        &self.name
    }

    fn publish(&self, batch: Arc<EventBatch>) {
        {
            let mut queue = self.shared.queue.lock();
            if queue.closed {
                self.shared.counters.dropped();
                return;
            }
            if queue.batches.len() >= self.shared.config.capacity {
                self.shared.counters.dropped();
                match self.shared.config.overflow {
                    Overflow::DropNewest => return,
                    Overflow::DropOldest => {
                        queue.batches.pop_front();
                    }
                }
            }
            queue.batches.push_back(batch);
        }
        self.shared.wake.notify_one();
    }

    fn counts(&self) -> SinkCounts {
        self.shared.counters.snapshot()
    }

    fn close(&self) {
        self.shared.queue.lock().closed = true;
        self.shared.wake.notify_one();
    }
}

impl Drop for QueuedSink {
    fn drop(&mut self) {
        // The worker drains what is queued and exits on its own.
        self.close();
    }
}

/// The worker: send queued batches in order until the sink is closed and
/// the queue is empty.
async fn drain<T: BatchTransport>(name: String, shared: Arc<Shared>, mut transport: T) {
    loop {
        let next = {
            let mut queue = shared.queue.lock();
            match queue.batches.pop_front() {
                Some(batch) => Some(batch),
                None if queue.closed => break,
                None => None,
            }
        };
        match next {
            Some(batch) => match transport.send(&batch).await {
                Ok(()) => shared.counters.delivered(),
                Err(error) => {
                    shared.counters.error();
                    tracing::warn!(sink = %name, seq = batch.seq, %error, "event batch lost");
                }
            },
            None => shared.wake.notified().await,
        }
    }
    transport.shutdown().await;
}
