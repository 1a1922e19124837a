//! A disk engine for the manager's integration tests that, while told to,
//! holds batches of reads or of writes until the test releases them: the
//! test decides when a transfer's bytes move (a layer lands, a write
//! completes) and checks what is visible meanwhile. Other batches pass.

// Each test file uses the part it needs.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kvtier_io::{Completer, Completion, FileId, IoBatch, IoEngine, IoKind, IoStats};

/// Which batches an [`IoGate`] may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Batches of reads only (onboarding, whole or per layer).
    Reads,
    /// Batches with a write (offloads to the disk).
    Writes,
}

/// See the module docs.
pub struct IoGate {
    inner: Arc<dyn IoEngine>,
    reads: AtomicBool,
    writes: AtomicBool,
    held: parking_lot::Mutex<VecDeque<(IoBatch, Completer)>>,
    arrived: tokio::sync::Notify,
    /// The kind of every read or write batch, in the order they arrived.
    log: parking_lot::Mutex<Vec<Held>>,
}

impl IoGate {
    /// A gate over `inner`, holding nothing yet.
    pub fn new(inner: Arc<dyn IoEngine>) -> Self {
        Self {
            inner,
            reads: AtomicBool::new(false),
            writes: AtomicBool::new(false),
            held: parking_lot::Mutex::new(VecDeque::new()),
            arrived: tokio::sync::Notify::new(),
            log: parking_lot::Mutex::new(Vec::new()),
        }
    }

    /// Starts holding batches of `kind`.
    pub fn hold(&self, kind: Held) {
        self.flag(kind).store(true, Ordering::SeqCst);
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
        self.reads.store(false, Ordering::SeqCst);
        self.writes.store(false, Ordering::SeqCst);
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

    fn pass(&self, batch: IoBatch, completer: Completer) {
        let done = self.inner.submit(batch);
        tokio::spawn(async move { completer.complete(done.await) });
    }

    /// Which kind `batch` is, if the gate may hold it.
    fn kind(batch: &IoBatch) -> Option<Held> {
        let ops = batch.ops();
        if ops.is_empty() {
            None
        } else if ops
            .iter()
            .all(|o| matches!(o.kind, IoKind::Read | IoKind::ReadV))
        {
            Some(Held::Reads)
        } else if ops
            .iter()
            .any(|o| matches!(o.kind, IoKind::Write | IoKind::WriteV))
        {
            Some(Held::Writes)
        } else {
            None
        }
    }
}

impl IoEngine for IoGate {
    fn name(&self) -> &'static str {
        "gate"
    }
    fn register_file(&self, file: std::fs::File) -> kvtier_io::Result<FileId> {
        self.inner.register_file(file)
    }
    fn close_file(&self, id: FileId) -> kvtier_io::Result<()> {
        self.inner.close_file(id)
    }
    unsafe fn register_memory(&self, ptr: *mut u8, len: usize) -> bool {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.register_memory(ptr, len) }
    }
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
