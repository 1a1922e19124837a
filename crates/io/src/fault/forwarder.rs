//! [`Forwarder`]: a thread that waits for inner batches and completes the
//! caller's completions with the faults applied.
//!
//! `Completion` is a concrete future, not something we can attach a callback
//! to, so one thread polls every outstanding inner completion with a waker
//! that unparks it. Each wake polls all of them: O(batches in flight) per
//! wake, which is fine for a test engine.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{JoinHandle, Thread};

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use super::Translation;
use crate::{Completer, Completion};

/// One batch to relay.
struct Job {
    inner: Completion,
    translation: Translation,
    completer: Completer,
}

/// The relay thread and the channel feeding it.
pub(crate) struct Forwarder {
    /// `None` only while dropping: closing it tells the thread to finish the
    /// jobs it has and exit.
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

/// Wakes the relay thread when an inner completion resolves.
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

impl Forwarder {
    /// Starts the relay thread. If it cannot be spawned, relays happen
    /// synchronously inside `submit` instead (logged; a test engine should
    /// not make its constructor fallible for that).
    pub(crate) fn start() -> Self {
        let (tx, rx) = crossbeam_channel::unbounded();
        match std::thread::Builder::new()
            .name("kvtier-faulty".into())
            .spawn(move || run(&rx))
        {
            Ok(thread) => Self {
                jobs: Some(tx),
                thread: Some(thread),
            },
            Err(e) => {
                tracing::warn!(error = %e, "faulty engine: no relay thread; completing synchronously");
                Self {
                    jobs: None,
                    thread: None,
                }
            }
        }
    }

    /// A completion that resolves with `translation` applied once `inner`
    /// resolves.
    pub(crate) fn relay(&self, inner: Completion, translation: Translation) -> Completion {
        let (completer, completion) = Completion::pair();
        let job = Job {
            inner,
            translation,
            completer,
        };
        let unsent = match &self.jobs {
            Some(tx) => tx.send(job).err().map(|e| e.into_inner()),
            None => Some(job),
        };
        match unsent {
            None => {
                if let Some(t) = &self.thread {
                    t.thread().unpark();
                }
            }
            // No relay thread (it could not be spawned): finish here rather
            // than leave the caller waiting forever.
            Some(job) => {
                let done = job.inner.wait();
                finish(job.translation, job.completer, done);
            }
        }
        completion
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            // Dropped on the relay thread itself (an owner held the last
            // reference to the engine): it exits on its own once drained.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// The relay loop: runs until the channel closes and every job is finished.
fn run(rx: &Receiver<Job>) {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut jobs: Vec<Job> = Vec::new();
    let mut closed = false;
    loop {
        loop {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
        }
        let mut i = 0;
        while i < jobs.len() {
            match Pin::new(&mut jobs[i].inner).poll(&mut cx) {
                Poll::Ready(done) => {
                    let job = jobs.swap_remove(i);
                    finish(job.translation, job.completer, done);
                }
                Poll::Pending => i += 1,
            }
        }
        if closed && jobs.is_empty() {
            return;
        }
        // A wake (or a new job) between the polls above and here leaves a
        // token, so this returns at once: no wake-up is lost.
        std::thread::park();
    }
}

/// Applies the faults and completes the caller's batch.
fn finish(translation: Translation, completer: Completer, mut inner: crate::BatchDone) {
    // The caller's owners were the inner batch's only owner.
    let owners = inner
        .take_owner::<Vec<Box<dyn Any + Send>>>(0)
        .unwrap_or_default();
    let done = translation.apply(inner, owners);
    // Dropping owners of an abandoned completion runs user code; do not let
    // a panic there strand every other batch.
    if std::panic::catch_unwind(AssertUnwindSafe(|| completer.complete(done))).is_err() {
        tracing::error!("faulty engine: a batch owner panicked while being dropped");
    }
}
