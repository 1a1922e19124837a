//! Changes to the ring's registered-file and registered-buffer tables, made
//! on the driver thread.
//!
//! The ring is set up with `IORING_SETUP_SINGLE_ISSUER` where the kernel has
//! it, and then `io_uring_register` is refused (`EEXIST`) on any thread but
//! the one that created the ring: the driver. Other threads queue a
//! [`Registration`] in the inbox and wait for the driver to apply it. The
//! same path is taken on rings without `SINGLE_ISSUER`, so there is one
//! order of table changes whatever the kernel.
//!
//! Callers hold no lock while they wait (the driver may be running a batch
//! owner's `Drop`, which may itself register or close a file), and the
//! driver applies registrations in the order they were queued. A caller on
//! the driver thread applies every queued registration itself, its own
//! last, so that order holds there too.

use std::io;
use std::os::fd::RawFd;
use std::sync::mpsc;

use io_uring::IoUring;

use super::Shared;

/// One change to a registered table.
pub(crate) struct Registration {
    kind: Kind,
}

enum Kind {
    /// `register_files_update(slot, fds)`; `-1` empties a slot.
    Files { slot: u32, fds: Vec<RawFd> },
    /// `register_buffers_update(slot, iovecs)`.
    Buffers { slot: u32, iovecs: Vec<libc::iovec> },
}

// SAFETY: the iovecs only describe memory (whose owner promised it stays
// valid for the ring's life, see `Registration::buffers`); moving that
// description to the driver thread reads or writes none of it.
unsafe impl Send for Kind {}

impl Registration {
    /// Puts `fds` (or `-1`, to empty a slot) into the file table from `slot` on.
    pub(crate) fn files(slot: u32, fds: Vec<RawFd>) -> Self {
        Self {
            kind: Kind::Files { slot, fds },
        }
    }

    /// Puts `iovecs` into the buffer table from `slot` on.
    ///
    /// # Safety
    /// Every range must stay valid and mapped for the ring's lifetime.
    pub(crate) unsafe fn buffers(slot: u32, iovecs: Vec<libc::iovec>) -> Self {
        Self {
            kind: Kind::Buffers { slot, iovecs },
        }
    }

    /// Makes the change; only the driver thread may call it on a
    /// `SINGLE_ISSUER` ring.
    fn apply(&self, ring: &IoUring) -> io::Result<()> {
        match &self.kind {
            Kind::Files { slot, fds } => {
                ring.submitter().register_files_update(*slot, fds).map(drop)
            }
            // SAFETY: `Registration::buffers`'s caller promised the ranges
            // outlive the ring.
            Kind::Buffers { slot, iovecs } => unsafe {
                ring.submitter()
                    .register_buffers_update(*slot, iovecs, None)
            },
        }
    }
}

/// A registration waiting in the inbox, and where its outcome goes.
pub(crate) struct Control {
    registration: Registration,
    reply: mpsc::SyncSender<io::Result<()>>,
}

/// A registration queued for the driver; [`Shared::finish`] waits for it.
#[must_use = "a queued registration must be finished"]
pub(crate) struct Queued {
    outcome: mpsc::Receiver<io::Result<()>>,
    /// The driver was asleep and must be woken.
    wake: bool,
}

impl Shared {
    /// Applies `registration` on the driver thread and returns its outcome.
    /// See [`queue_registration`](Self::queue_registration).
    pub(crate) fn register(&self, registration: Registration) -> io::Result<()> {
        let queued = self.queue_registration(registration);
        self.finish(queued)
    }

    /// Queues `registration` for the driver. Registrations are applied in
    /// the order they are queued, so a caller that must order one against a
    /// table of its own (the file ids) queues it under that table's lock,
    /// then releases the lock and calls [`finish`](Self::finish).
    pub(crate) fn queue_registration(&self, registration: Registration) -> Queued {
        let (reply, outcome) = mpsc::sync_channel(1);
        let mut inbox = self.inbox.lock();
        inbox.controls.push(Control {
            registration,
            reply,
        });
        Queued {
            outcome,
            wake: std::mem::replace(&mut inbox.sleeping, false),
        }
    }

    /// Waits until the driver has applied a queued registration and returns
    /// its outcome: a wake-up and one system call. The caller must hold no
    /// lock that the driver, or a batch owner's `Drop` running on it, could
    /// need.
    pub(crate) fn finish(&self, queued: Queued) -> io::Result<()> {
        if std::thread::current().id() == self.driver_thread {
            // A batch owner dropped on the driver: nobody else will run the
            // queue while we wait, so run it here (ours included, in order).
            let mut controls = std::mem::take(&mut self.inbox.lock().controls);
            self.apply_controls(&mut controls);
        } else if queued.wake {
            self.wake();
        }
        queued.outcome.recv().unwrap_or_else(|_| {
            // The driver drops a control unanswered only if it is gone,
            // which the engine's lifetime rules out; report rather than hang.
            Err(io::Error::other("the io_uring driver stopped"))
        })
    }

    /// Applies `controls` in order and answers each; on the driver thread.
    pub(crate) fn apply_controls(&self, controls: &mut Vec<Control>) {
        for c in controls.drain(..) {
            // The caller may have stopped waiting only by panicking; then
            // nobody needs the answer.
            let _ = c.reply.send(c.registration.apply(&self.ring));
        }
    }
}
