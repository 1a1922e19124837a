//! [`GatedDevice`]: a [`Device`] decorator that holds completions until
//! released, so tests and tools decide exactly when a copy "finishes".

use std::collections::VecDeque;
use std::sync::Arc;

use kvtier_core::Geometry;
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::{
    CopyCompletion, Device, DeviceBlockId, DeviceError, Download, HostSink, HostSource, Span,
    Upload,
};

/// Which way a copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CopyDirection {
    /// Host to device.
    Upload,
    /// Device to host.
    Download,
}

/// One batch as the device saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyEvent {
    /// Which way.
    pub direction: CopyDirection,
    /// Which bytes of each block.
    pub span: Span,
    /// The device blocks, in batch order.
    pub blocks: Vec<DeviceBlockId>,
}

type Release = Box<dyn FnOnce() + Send>;

struct Held {
    event: CopyEvent,
    release: Release,
}

#[derive(Default)]
struct Gate {
    hold_uploads: bool,
    hold_downloads: bool,
    held: VecDeque<Held>,
    log: Vec<CopyEvent>,
}

/// Wraps a device; copies run on the inner device at once, but while a
/// direction is held their completions wait until
/// [`release_next`](Self::release_next) or [`release_all`](Self::release_all).
/// Every batch is logged in submission order. Releasing needs a tokio
/// runtime (the inner completion is awaited on a task).
pub struct GatedDevice {
    inner: Arc<dyn Device>,
    gate: Mutex<Gate>,
    /// Wakes `release_next` callers when a batch is held.
    arrived: Notify,
}

impl GatedDevice {
    /// A gate around `inner`, holding nothing.
    pub fn new(inner: Arc<dyn Device>) -> Self {
        Self {
            inner,
            gate: Mutex::new(Gate::default()),
            arrived: Notify::new(),
        }
    }

    /// Starts (`true`) or stops holding completions of `direction`.
    /// Stopping does not release batches already held.
    pub fn hold(&self, direction: CopyDirection, on: bool) {
        let mut g = self.gate.lock();
        match direction {
            CopyDirection::Upload => g.hold_uploads = on,
            CopyDirection::Download => g.hold_downloads = on,
        }
    }

    /// Batches held now.
    pub fn held(&self) -> usize {
        self.gate.lock().held.len()
    }

    /// Every batch submitted so far, in order.
    pub fn log(&self) -> Vec<CopyEvent> {
        self.gate.lock().log.clone()
    }

    /// Waits until a batch of `direction` is held, then completes the
    /// oldest such batch; returns it.
    pub async fn release_next(&self, direction: CopyDirection) -> CopyEvent {
        loop {
            // Created before the check: notify_waiters reaches it even if
            // the batch arrives between the check and the await.
            let arrived = self.arrived.notified();
            let found = {
                let mut g = self.gate.lock();
                let i = g.held.iter().position(|h| h.event.direction == direction);
                i.and_then(|i| g.held.remove(i))
            };
            if let Some(h) = found {
                (h.release)();
                return h.event;
            }
            arrived.await;
        }
    }

    /// Waits until at least `n` batches are held at once.
    pub async fn wait_held(&self, n: usize) {
        loop {
            let arrived = self.arrived.notified();
            if self.held() >= n {
                return;
            }
            arrived.await;
        }
    }

    /// Completes every held batch.
    pub fn release_all(&self) {
        let held: Vec<Held> = self.gate.lock().held.drain(..).collect();
        for h in held {
            (h.release)();
        }
    }

    /// Logs a batch; returns whether its completion is to be held.
    fn admit(&self, event: CopyEvent) -> Option<CopyEvent> {
        let mut g = self.gate.lock();
        g.log.push(event.clone());
        let hold = match event.direction {
            CopyDirection::Upload => g.hold_uploads,
            CopyDirection::Download => g.hold_downloads,
        };
        hold.then_some(event)
    }

    fn park(&self, event: CopyEvent, release: Release) {
        self.gate.lock().held.push_back(Held { event, release });
        self.arrived.notify_waiters();
    }

    fn gate_completion<S: Send + 'static>(
        &self,
        event: CopyEvent,
        inner: CopyCompletion<S>,
    ) -> CopyCompletion<S> {
        let Some(event) = self.admit(event) else {
            return inner;
        };
        let (completer, outer) = CopyCompletion::pair();
        self.park(
            event,
            Box::new(move || {
                tokio::spawn(async move {
                    // An inner failure drops the completer: the outer
                    // completion then reports Abandoned.
                    if let Ok(results) = inner.await {
                        completer.complete(results);
                    }
                });
            }),
        );
        outer
    }
}

impl Device for GatedDevice {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn geometry(&self) -> &Geometry {
        self.inner.geometry()
    }
    fn capacity_blocks(&self) -> usize {
        self.inner.capacity_blocks()
    }
    fn free_blocks(&self) -> usize {
        self.inner.free_blocks()
    }
    fn allocate(&self, n: usize) -> Result<Vec<DeviceBlockId>, DeviceError> {
        self.inner.allocate(n)
    }
    fn release(&self, blocks: &[DeviceBlockId]) {
        self.inner.release(blocks)
    }

    fn upload(
        &self,
        span: Span,
        copies: Vec<Upload<Box<dyn HostSource>>>,
    ) -> CopyCompletion<Box<dyn HostSource>> {
        let event = CopyEvent {
            direction: CopyDirection::Upload,
            span,
            blocks: copies.iter().map(|c| c.dst).collect(),
        };
        let inner = self.inner.upload(span, copies);
        self.gate_completion(event, inner)
    }

    fn download(
        &self,
        span: Span,
        copies: Vec<Download<Box<dyn HostSink>>>,
    ) -> CopyCompletion<Box<dyn HostSink>> {
        let event = CopyEvent {
            direction: CopyDirection::Download,
            span,
            blocks: copies.iter().map(|c| c.src).collect(),
        };
        let inner = self.inner.download(span, copies);
        self.gate_completion(event, inner)
    }
}
