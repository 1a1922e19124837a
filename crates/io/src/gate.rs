//! [`GatedEngine`]: wraps another engine and, while told to, holds batches
//! of reads or of writes until the test releases them, for tests that must
//! decide when bytes move (a layer lands, a write completes, a reader is
//! still in flight) and check what is visible meanwhile.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::{Completer, Completion, IoBatch, IoEngine, IoKind, IoStats};

/// Which batches a [`GatedEngine`] may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Batches of reads only (plain or vectored).
    Reads,
    /// Batches with a write (plain or vectored).
    Writes,
}

/// An engine that passes batches to `inner`, except that, while holding a
/// kind ([`hold`](Self::hold)), it keeps batches of that kind (in arrival
/// order) until [`release_next`](Self::release_next) or
/// [`open`](Self::open) lets them go. Other batches (syncs, a kind not
/// held) pass at once.
pub struct GatedEngine {
    inner: Arc<dyn IoEngine>,
    reads: AtomicBool,
    writes: AtomicBool,
    held: Mutex<VecDeque<(IoBatch, Completer)>>,
    arrived: tokio::sync::Notify,
    /// The kind of every read or write batch, in the order they arrived.
    log: Mutex<Vec<Held>>,
}

impl GatedEngine {
    /// A gate over `inner`, holding nothing yet.
    pub fn new(inner: Arc<dyn IoEngine>) -> Self {
        Self {
            inner,
            reads: AtomicBool::new(false),
            writes: AtomicBool::new(false),
            held: Mutex::new(VecDeque::new()),
            arrived: tokio::sync::Notify::new(),
            log: Mutex::new(Vec::new()),
        }
    }

    /// Starts holding batches of `kind`.
    pub fn hold(&self, kind: Held) {
        self.flag(kind).store(true, Ordering::SeqCst);
    }

    /// Stops holding new batches of `kind`; those held stay held.
    pub fn stop_holding(&self, kind: Held) {
        self.flag(kind).store(false, Ordering::SeqCst);
    }

    /// Batches held now.
    pub fn held(&self) -> usize {
        self.held.lock().len()
    }

    /// The kind of every read or write batch so far, in arrival order.
    pub fn log(&self) -> Vec<Held> {
        self.log.lock().clone()
    }

    /// Waits until at least `n` batches are held.
    pub async fn wait_held(&self, n: usize) {
        loop {
            let arrived = self.arrived.notified();
            if self.held() >= n {
                return;
            }
            arrived.await;
        }
    }

    /// Lets the oldest held batch go, waiting for one if none is held.
    pub async fn release_next(&self) {
        self.wait_held(1).await;
        let next = self.held.lock().pop_front();
        if let Some((batch, completer)) = next {
            self.pass(batch, completer);
        }
    }

    /// Stops holding anything and lets every held batch go.
    pub fn open(&self) {
        self.stop_holding(Held::Reads);
        self.stop_holding(Held::Writes);
        let held: Vec<_> = self.held.lock().drain(..).collect();
        for (batch, completer) in held {
            self.pass(batch, completer);
        }
    }

    fn flag(&self, kind: Held) -> &AtomicBool {
        match kind {
            Held::Reads => &self.reads,
            Held::Writes => &self.writes,
        }
    }

    /// Submits a released batch and completes its caller's completion when
    /// it is done, on a thread of its own (so the gate needs no runtime).
    fn pass(&self, batch: IoBatch, completer: Completer) {
        let done = self.inner.submit(batch);
        std::thread::spawn(move || completer.complete(done.wait()));
    }

    /// Which kind `batch` is, if the gate may hold it.
    fn kind(batch: &IoBatch) -> Option<Held> {
        let ops = batch.ops();
        let is_read = |k: IoKind| matches!(k, IoKind::Read | IoKind::ReadV);
        let is_write = |k: IoKind| matches!(k, IoKind::Write | IoKind::WriteV);
        if ops.is_empty() {
            None
        } else if ops.iter().all(|o| is_read(o.kind)) {
            Some(Held::Reads)
        } else if ops.iter().any(|o| is_write(o.kind)) {
            Some(Held::Writes)
        } else {
            None
        }
    }
}

impl IoEngine for GatedEngine {
    fn name(&self) -> &'static str {
        "gated"
    }

    forward_files_to_inner!();

    fn submit(&self, batch: IoBatch) -> Completion {
        let kind = Self::kind(&batch);
        if let Some(k) = kind {
            self.log.lock().push(k);
        }
        let holding = kind.is_some_and(|k| self.flag(k).load(Ordering::SeqCst));
        if !holding {
            return self.inner.submit(batch);
        }
        let (completer, completion) = Completion::pair();
        self.held.lock().push_back((batch, completer));
        self.arrived.notify_waiters();
        completion
    }

    fn stats(&self) -> IoStats {
        self.inner.stats()
    }
}
