//! The driver thread: the only code that touches the ring's submission and
//! completion queues. See the [engine docs](super) for the model.

use std::any::Any;
use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::panic::AssertUnwindSafe;

use io_uring::{opcode, squeue, types};

use super::register::Control;
use super::slab::Slab;
use super::{Pending, Prep, Shared, Target};
use crate::files::bad_file;
use crate::{BatchDone, Completer, IoKind, IoOp, OpResult};

/// `user_data` of the wake-up read on the eventfd. Operation slots are below
/// the queue depth, so this can never collide with one.
const WAKE: u64 = u64::MAX;

/// A batch whose operations are queued or in flight.
struct Flight {
    ops: Vec<IoOp>,
    preps: Vec<Option<Prep>>,
    results: Vec<Option<OpResult>>,
    /// Operations without a result yet.
    remaining: usize,
    owners: Vec<Box<dyn Any + Send>>,
    completer: Completer,
}

/// Operation `index` of batch `batch` (a key in `Driver::batches`).
#[derive(Debug, Clone, Copy)]
struct OpRef {
    batch: u32,
    index: u32,
}

/// The driver's state; owned by its thread, so no locks.
struct Driver<'a> {
    shared: &'a Shared,
    /// Batches with work queued or in flight.
    batches: Slab<Flight>,
    /// Operations in the kernel; the key is the entry's `user_data`. Never
    /// more than `queue_depth` occupied.
    slots: Slab<OpRef>,
    /// Operations waiting for a free slot, in submission order.
    backlog: VecDeque<OpRef>,
    /// Batches taken from the inbox, kept to reuse its allocation.
    incoming: Vec<Pending>,
    /// Registrations taken from the inbox, likewise.
    controls: Vec<Control>,
    /// Batches finished during one reap, completed after it.
    finished: Vec<Flight>,
    /// The eventfd read is in the kernel. The driver never exits while it is:
    /// the kernel would write into `wake_buf` after it was freed.
    wake_armed: bool,
    /// Target of the eventfd read; boxed so its address is stable.
    wake_buf: Box<u64>,
    /// The engine is dropping.
    shutdown: bool,
}

/// Aborts the process if the driver unwinds: with requests in the kernel,
/// unwinding would free their buffers under it. Owner drops (arbitrary user
/// code) are isolated with `catch_unwind`, so only a bug here can trigger it.
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kvtier-io: io_uring driver panicked with I/O in flight; aborting");
            std::process::abort();
        }
    }
}

/// The driver thread's body: runs until the engine drops and every request
/// it made has completed.
pub(crate) fn run(shared: &Shared) {
    let _guard = AbortOnUnwind;
    let depth = shared.queue_depth as usize;
    let mut driver = Driver {
        shared,
        batches: Slab::with_capacity(depth),
        slots: Slab::with_capacity(depth),
        backlog: VecDeque::new(),
        incoming: Vec::new(),
        controls: Vec::new(),
        finished: Vec::new(),
        wake_armed: false,
        wake_buf: Box::new(0),
        shutdown: false,
    };
    loop {
        driver.take_inbox();
        driver.fill();
        if !driver.wake_armed && !driver.shutdown {
            driver.arm_wake();
        }
        if driver.may_exit() {
            break;
        }
        driver.enter();
        driver.reap();
    }
}

impl Driver<'_> {
    /// Applies queued registrations, then moves new batches from the inbox
    /// into `batches` and `backlog`. Registrations go first: a batch queued
    /// after registering its file must find the file in the table.
    fn take_inbox(&mut self) {
        {
            let mut inbox = self.shared.inbox.lock();
            inbox.sleeping = false;
            self.shutdown |= inbox.shutdown;
            std::mem::swap(&mut inbox.batches, &mut self.incoming);
            std::mem::swap(&mut inbox.controls, &mut self.controls);
        }
        // Outside the lock: each is a system call, and submitters need the
        // inbox meanwhile.
        self.shared.apply_controls(&mut self.controls);
        let mut incoming = std::mem::take(&mut self.incoming);
        for pending in incoming.drain(..) {
            self.admit(pending);
        }
        self.incoming = incoming;
        self.complete_finished();
    }

    /// Registers one batch: operations on unknown files fail at once, the
    /// rest join the backlog.
    fn admit(&mut self, p: Pending) {
        let n = p.ops.len();
        let mut flight = Flight {
            results: (0..n).map(|_| None).collect(),
            remaining: n,
            ops: p.ops,
            preps: p.preps,
            owners: p.owners,
            completer: p.completer,
        };
        for (i, op) in flight.ops.iter().enumerate() {
            if flight.preps[i].is_none() {
                let res = Err(bad_file());
                self.shared.stats.op(op.kind, op.len, &res);
                flight.results[i] = Some(res);
                flight.remaining -= 1;
            }
        }
        if flight.remaining == 0 {
            self.finished.push(flight);
            return;
        }
        let preps: Vec<bool> = flight.preps.iter().map(Option::is_some).collect();
        let batch = self.batches.insert(flight);
        for (index, ok) in preps.into_iter().enumerate() {
            if ok {
                self.backlog.push_back(OpRef {
                    batch,
                    index: index as u32,
                });
            }
        }
    }

    /// Pushes backlog operations into free slots of the submission queue.
    fn fill(&mut self) {
        let depth = self.shared.queue_depth as usize;
        if self.backlog.is_empty() || self.slots.len() >= depth {
            return;
        }
        let (mut fixed, mut fixed_vectored) = (0u64, 0u64);
        // SAFETY: only the driver thread touches the submission queue.
        let mut sq = unsafe { self.shared.ring.submission_shared() };
        while self.slots.len() < depth {
            let Some(r) = self.backlog.pop_front() else {
                break;
            };
            let Some(flight) = self.batches.get_mut(r.batch) else {
                unreachable!("a backlog entry outlived its batch");
            };
            let op = flight.ops[r.index as usize];
            let Some(prep) = flight.preps[r.index as usize] else {
                unreachable!("operations without a file never enter the backlog");
            };
            let slot = self.slots.insert(r);
            // SAFETY: the op's batch is in `batches` until it completes.
            let entry = unsafe { entry(&op, prep) }.user_data(u64::from(slot));
            // SAFETY: the entry's buffer (or segment list, and its segments)
            // is valid for the access until the operation completes
            // (IoBatch::push's and push_vectored's contracts), and the
            // batch's owners stay in `batches` until then; the file is open
            // for the engine's life.
            if unsafe { sq.push(&entry) }.is_err() {
                // Only if the kernel left entries unconsumed; retry later.
                self.slots.remove(slot);
                self.backlog.push_front(r);
                break;
            }
            if prep.buf_index.is_some() {
                fixed += 1;
                fixed_vectored += u64::from(op.kind.is_vectored());
            }
        }
        drop(sq);
        if fixed > 0 {
            self.shared.stats.fixed(fixed);
            self.shared.stats.fixed_vectored(fixed_vectored);
        }
    }

    /// Queues the eventfd read that wakes the driver when submitters write.
    fn arm_wake(&mut self) {
        let buf = (&raw mut *self.wake_buf).cast::<u8>();
        let entry = opcode::Read::new(types::Fd(self.shared.wake_fd.as_raw_fd()), buf, 8)
            .build()
            .user_data(WAKE);
        // SAFETY: only the driver touches the submission queue; `wake_buf`
        // lives as long as the driver, which never exits while the read is
        // armed.
        let pushed = unsafe { self.shared.ring.submission_shared().push(&entry) }.is_ok();
        self.wake_armed = pushed;
    }

    /// Whether the driver may stop: the engine is dropping, nothing is queued
    /// or in flight, and the wake-up read has completed.
    fn may_exit(&self) -> bool {
        self.shutdown
            && !self.wake_armed
            && self.slots.is_empty()
            && self.backlog.is_empty()
            && self.batches.is_empty()
            && {
                let inbox = self.shared.inbox.lock();
                inbox.batches.is_empty() && inbox.controls.is_empty()
            }
    }

    /// Submits what is queued and, when there is nothing else to do, waits
    /// for a completion (an I/O or the wake-up read) in the same system call.
    fn enter(&mut self) {
        // SAFETY: only the driver thread touches either queue.
        let (to_submit, cq_ready) = unsafe {
            (
                self.shared.ring.submission_shared().len(),
                !self.shared.ring.completion_shared().is_empty(),
            )
        };
        let something_to_wait_for = self.wake_armed || !self.slots.is_empty();
        let mut want = 0;
        if !cq_ready && something_to_wait_for {
            let mut inbox = self.shared.inbox.lock();
            if inbox.batches.is_empty() && inbox.controls.is_empty() {
                inbox.sleeping = true;
                want = 1;
            }
        }
        if to_submit == 0 && want == 0 {
            return;
        }
        match self.shared.ring.submitter().submit_and_wait(want) {
            Ok(_) => {
                if to_submit > 0 {
                    self.shared.stats.syscalls(1);
                }
            }
            Err(e) => match e.raw_os_error() {
                // Interrupted, or the kernel is short of resources or
                // completion space: reap and try again.
                Some(libc::EINTR | libc::EAGAIN | libc::EBUSY) => {}
                _ => {
                    tracing::error!(error = %e, "io_uring_enter failed; retrying");
                    // Do not spin on a persistent failure.
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            },
        }
    }

    /// Takes every available completion and completes finished batches.
    fn reap(&mut self) {
        // SAFETY: only the driver thread touches the completion queue.
        let cq = unsafe { self.shared.ring.completion_shared() };
        for cqe in cq {
            let user_data = cqe.user_data();
            if user_data == WAKE {
                // Whatever the result (a count, or e.g. ECANCELED), the read
                // is no longer in the kernel; re-armed next round.
                self.wake_armed = false;
                continue;
            }
            let res = cqe.result();
            let Some(r) = u32::try_from(user_data)
                .ok()
                .and_then(|slot| self.slots.remove(slot))
            else {
                tracing::error!(user_data, "io_uring: completion for an unknown slot");
                continue;
            };
            let Some(flight) = self.batches.get_mut(r.batch) else {
                unreachable!("an in-flight operation outlived its batch");
            };
            let op = &flight.ops[r.index as usize];
            let result = if res < 0 {
                Err(io::Error::from_raw_os_error(-res))
            } else {
                // A short transfer is reported as such; BatchDone::check
                // turns it into IoError::Short.
                Ok(res as u32)
            };
            self.shared.stats.op(op.kind, op.len, &result);
            flight.results[r.index as usize] = Some(result);
            flight.remaining -= 1;
            if flight.remaining == 0
                && let Some(done) = self.batches.remove(r.batch)
            {
                self.finished.push(done);
            }
        }
        self.complete_finished();
    }

    /// Resolves the completions of finished batches.
    fn complete_finished(&mut self) {
        for f in self.finished.drain(..) {
            let results = f
                .results
                .into_iter()
                .map(|r| r.unwrap_or_else(|| Err(io::Error::other("operation lost"))))
                .collect();
            let done = BatchDone {
                ops: f.ops,
                results,
                owners: f.owners,
            };
            let completer = f.completer;
            // If the Completion was dropped, this drops the owners here: user
            // code that must not take the driver down with it.
            if std::panic::catch_unwind(AssertUnwindSafe(|| completer.complete(done))).is_err() {
                tracing::error!("io_uring: a batch owner panicked while being dropped");
            }
        }
    }
}

/// The submission entry for one operation.
///
/// # Safety
/// `op` belongs to a batch in `Driver::batches`, whose owners (where a
/// vectored op's segment list lives) stay there until it completes.
unsafe fn entry(op: &IoOp, prep: Prep) -> squeue::Entry {
    // SAFETY: the caller's promise; `None` for a non-vectored op.
    let (iov, iovcnt) = match unsafe { op.vecs() } {
        // At most IoBatch::MAX_SEGMENTS segments, so the count fits.
        Some(v) => (v.iov().as_ptr(), v.iov().len() as u32),
        None => (std::ptr::null(), 0),
    };
    // The opcode builders are generic over the file kind; the macro writes the
    // read/write x vectored/not x fixed/plain cases and the two syncs once for
    // each.
    macro_rules! rw {
        ($fd:expr) => {
            match (op.kind, prep.buf_index) {
                (IoKind::Fdatasync, _) => opcode::Fsync::new($fd)
                    .flags(types::FsyncFlags::DATASYNC)
                    .build(),
                (IoKind::Fsync, _) => opcode::Fsync::new($fd).build(),
                (IoKind::Read, Some(b)) => opcode::ReadFixed::new($fd, op.buf, op.len, b)
                    .offset(op.offset)
                    .build(),
                (IoKind::Read, None) => opcode::Read::new($fd, op.buf, op.len)
                    .offset(op.offset)
                    .build(),
                (IoKind::Write, Some(b)) => {
                    opcode::WriteFixed::new($fd, op.buf.cast_const(), op.len, b)
                        .offset(op.offset)
                        .build()
                }
                (IoKind::Write, None) => opcode::Write::new($fd, op.buf.cast_const(), op.len)
                    .offset(op.offset)
                    .build(),
                (IoKind::ReadV, Some(b)) => opcode::ReadvFixed::new($fd, iov, iovcnt, b)
                    .offset(op.offset)
                    .build(),
                (IoKind::ReadV, None) => opcode::Readv::new($fd, iov, iovcnt)
                    .offset(op.offset)
                    .build(),
                (IoKind::WriteV, Some(b)) => opcode::WritevFixed::new($fd, iov, iovcnt, b)
                    .offset(op.offset)
                    .build(),
                (IoKind::WriteV, None) => opcode::Writev::new($fd, iov, iovcnt)
                    .offset(op.offset)
                    .build(),
            }
        };
    }
    match prep.target {
        Target::Fixed(i) => rw!(types::Fixed(i)),
        Target::Fd(fd) => rw!(types::Fd(fd)),
    }
}
