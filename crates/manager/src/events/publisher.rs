//! [`EventPublisher`]: collects events into batches and fans each batch out
//! to every sink.
//!
//! A batch is cut when it holds [`PublisherConfig::max_batch_events`]
//! events, when its first event is [`PublisherConfig::max_batch_delay`] old,
//! on [`EventPublisher::flush`], and on close or drop. Cutting and fan-out
//! happen under one lock, so every sink sees batches in `seq` order; that is
//! cheap because [`EventSink::publish`] never blocks.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{EventBatch, EventError, EventSink, KvEvent};

/// When the publisher cuts a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublisherConfig {
    /// Events per batch before it is cut at once. Default: 128. Values below
    /// 1 are treated as 1.
    pub max_batch_events: usize,
    /// Longest an event waits for its batch to fill. Default: 20 ms, well
    /// under a router's decision loop, long enough to batch a prefill's
    /// registrations.
    pub max_batch_delay: Duration,
}

impl Default for PublisherConfig {
    fn default() -> Self {
        Self {
            max_batch_events: 128,
            max_batch_delay: Duration::from_millis(20),
        }
    }
}

struct Pending {
    events: Vec<KvEvent>,
    /// When the first event of the open batch arrived.
    opened_at: Option<Instant>,
    next_seq: u64,
    closed: bool,
    /// Events emitted after close.
    dropped: u64,
}

struct Shared {
    pending: Mutex<Pending>,
    sinks: Vec<Arc<dyn EventSink>>,
    config: PublisherConfig,
    /// Wakes the timer task when a batch opens or the publisher closes.
    wake: Notify,
}

impl Shared {
    /// Cuts the open batch (if any) and hands it to every sink. Called with
    /// the lock held so batches reach sinks in `seq` order.
    fn cut(&self, pending: &mut Pending) {
        if pending.events.is_empty() {
            return;
        }
        let batch = Arc::new(EventBatch {
            seq: pending.next_seq,
            ts: unix_seconds(),
            events: std::mem::take(&mut pending.events),
        });
        pending.next_seq += 1;
        pending.opened_at = None;
        for sink in &self.sinks {
            sink.publish(Arc::clone(&batch));
        }
    }
}

/// Batches [`KvEvent`]s and fans them out to [`EventSink`]s.
///
/// Emitting is synchronous and never blocks on a sink. The time-based cut
/// runs on a Tokio task, so the publisher must be created inside a runtime.
/// Dropping the publisher closes it.
pub struct EventPublisher {
    shared: Arc<Shared>,
}

impl EventPublisher {
    /// A publisher that cuts batches per `config` and sends them to `sinks`.
    pub fn new(
        config: PublisherConfig,
        sinks: Vec<Arc<dyn EventSink>>,
    ) -> Result<Self, EventError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| EventError::NoRuntime { what: "publisher" })?;
        let config = PublisherConfig {
            max_batch_events: config.max_batch_events.max(1),
            ..config
        };
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending {
                events: Vec::with_capacity(config.max_batch_events.min(4096)),
                opened_at: None,
                next_seq: 0,
                closed: false,
                dropped: 0,
            }),
            sinks,
            config,
            wake: Notify::new(),
        });
        runtime.spawn(cut_on_time(Arc::clone(&shared)));
        Ok(Self { shared })
    }

    /// [`emit`](Self::emit) of each of `events`, in order, under one lock.
    pub fn emit_all(&self, events: impl IntoIterator<Item = KvEvent>) {
        let mut pending = self.shared.pending.lock();
        let mut wake = false;
        for event in events {
            if pending.closed {
                pending.dropped += 1;
                continue;
            }
            pending.events.push(event);
            if pending.events.len() >= self.shared.config.max_batch_events {
                self.shared.cut(&mut pending);
            } else if pending.opened_at.is_none() {
                pending.opened_at = Some(Instant::now());
                wake = true;
            }
        }
        drop(pending);
        if wake {
            self.shared.wake.notify_one();
        }
    }

    /// Adds one event to the open batch; cuts the batch when it is full.
    /// After [`close`](Self::close) the event is dropped and counted.
    pub fn emit(&self, event: KvEvent) {
        self.emit_all(std::iter::once(event));
    }

    /// Cuts the open batch now, if it holds any event.
    pub fn flush(&self) {
        let mut pending = self.shared.pending.lock();
        self.shared.cut(&mut pending);
    }

    /// Flushes, stops the timer task and closes every sink (which then
    /// drain their queues). Idempotent.
    pub fn close(&self) {
        {
            let mut pending = self.shared.pending.lock();
            if pending.closed {
                return;
            }
            self.shared.cut(&mut pending);
            pending.closed = true;
        }
        self.shared.wake.notify_one();
        for sink in &self.shared.sinks {
            sink.close();
        }
    }

    /// Events waiting in the open batch.
    pub fn pending_events(&self) -> usize {
        self.shared.pending.lock().events.len()
    }

    /// The `seq` the next batch will carry (= batches cut so far).
    pub fn next_seq(&self) -> u64 {
        self.shared.pending.lock().next_seq
    }

    /// Events emitted after close and therefore dropped.
    pub fn dropped_after_close(&self) -> u64 {
        self.shared.pending.lock().dropped
    }

    /// The sinks batches go to.
    pub fn sinks(&self) -> &[Arc<dyn EventSink>] {
        &self.shared.sinks
    }
}

impl Drop for EventPublisher {
    fn drop(&mut self) {
        self.close();
    }
}

/// The timer task: cuts a batch once its first event is
/// `max_batch_delay` old; exits when the publisher closes.
async fn cut_on_time(shared: Arc<Shared>) {
    loop {
        let deadline = {
            let pending = shared.pending.lock();
            if pending.closed {
                return;
            }
            pending
                .opened_at
                .map(|opened| opened + shared.config.max_batch_delay)
        };
        match deadline {
            None => shared.wake.notified().await,
            Some(deadline) => {
                tokio::select! {
                    () = tokio::time::sleep_until(deadline) => {
                        let mut pending = shared.pending.lock();
                        // The batch may have been cut (full, flushed) and a
                        // younger one opened meanwhile: cut only when due.
                        let due = pending
                            .opened_at
                            .is_some_and(|opened| opened + shared.config.max_batch_delay <= Instant::now());
                        if due {
                            shared.cut(&mut pending);
                        }
                    }
                    () = shared.wake.notified() => {}
                }
            }
        }
    }
}

/// Wall-clock seconds since the Unix epoch; 0 for a clock set before 1970.
fn unix_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
