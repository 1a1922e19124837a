//! [`ChannelSink`]: batches into a Tokio channel, for tests and for
//! embedding kvtier in a process that consumes events itself.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::{EventBatch, EventSink, SinkCounters, SinkCounts};

/// An [`EventSink`] backed by a bounded `tokio::sync::mpsc` channel.
///
/// A full channel drops the *newest* batch (mpsc cannot take back a queued
/// one) and counts it; a dropped receiver makes every later batch a drop.
/// [`close`](EventSink::close) drops the sender, so the receiver sees the
/// end of the stream after the last batch.
pub struct ChannelSink {
    sender: Mutex<Option<mpsc::Sender<Arc<EventBatch>>>>,
    counters: SinkCounters,
}

impl ChannelSink {
    /// A sink and the receiver of its batches; `capacity` (at least 1) is the
    /// number of batches the channel buffers.
    pub fn new(capacity: usize) -> (Self, mpsc::Receiver<Arc<EventBatch>>) {
        let (sender, receiver) = mpsc::channel(capacity.max(1));
        let sink = Self {
            sender: Mutex::new(Some(sender)),
            counters: SinkCounters::default(),
        };
        (sink, receiver)
    }
}

impl EventSink for ChannelSink {
    fn name(&self) -> &str {
        "channel"
    }

    fn publish(&self, batch: Arc<EventBatch>) {
        let sender = self.sender.lock();
        match sender.as_ref().map(|s| s.try_send(batch)) {
            Some(Ok(())) => self.counters.delivered(),
            // Full, receiver gone, or closed: never wait.
            Some(Err(_)) | None => self.counters.dropped(),
        }
    }

    fn counts(&self) -> SinkCounts {
        self.counters.snapshot()
    }

    fn close(&self) {
        self.sender.lock().take();
    }
}
