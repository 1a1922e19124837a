//! The [`EventSink`] seam and the counters every sink keeps.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::EventBatch;

/// A destination for event batches.
///
/// # Contract
///
/// * [`publish`](EventSink::publish) never blocks and never waits on I/O: it
///   hands the batch over (a bounded queue, a channel) and returns. A sink
///   that is slow or down drops batches and counts them in
///   [`SinkCounts::dropped`] rather than holding up the caller, which is on
///   the data path (block registration, eviction).
/// * Batches are delivered in the order `publish` was called, minus the
///   dropped ones; each keeps its [`seq`](EventBatch::seq), so consumers see
///   the gaps.
/// * [`close`](EventSink::close) is non-blocking too: it asks the sink to
///   deliver what it has queued and stop. Batches published after `close`
///   are dropped and counted.
pub trait EventSink: Send + Sync {
    /// A short name for logs and metrics (`channel`, `nats`, `zmq`).
    fn name(&self) -> &str;

    /// Hands one batch to the sink without blocking.
    fn publish(&self, batch: Arc<EventBatch>);

    /// Delivered, dropped and failed batches so far.
    fn counts(&self) -> SinkCounts;

    /// Asks the sink to drain its queue and stop; returns at once.
    fn close(&self);
}

/// A snapshot of a sink's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SinkCounts {
    /// Batches handed to the transport successfully.
    pub delivered: u64,
    /// Batches discarded because the sink's buffer was full or the sink was
    /// closed.
    pub dropped: u64,
    /// Batches the transport failed to send (the batch is lost; the client
    /// library owns reconnecting).
    pub errors: u64,
}

/// The live counters behind [`SinkCounts`], shared between a sink and its
/// worker task.
#[derive(Debug, Default)]
pub struct SinkCounters {
    delivered: AtomicU64,
    dropped: AtomicU64,
    errors: AtomicU64,
}

impl SinkCounters {
    /// Counts one delivered batch.
    pub fn delivered(&self) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one dropped batch.
    pub fn dropped(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one batch lost to a transport error.
    pub fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    /// The current values.
    pub fn snapshot(&self) -> SinkCounts {
        SinkCounts {
            delivered: self.delivered.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
        }
    }
}
