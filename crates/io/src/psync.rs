//! [`PsyncEngine`]: a pool of threads issuing `pread`/`pwrite`, for hosts
//! where io_uring is unavailable (Docker's and Kubernetes' default seccomp
//! profiles refuse `io_uring_setup`).
//!
//! See [`PsyncEngine`] for the design; this module holds its implementation.

use std::any::Any;
use std::fs::File;
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

use crate::files::{FileTable, bad_file};
use crate::stats::Counters;
use crate::{
    BatchDone, Completer, Completion, FileId, IoBatch, IoEngine, IoError, IoKind, IoOp, IoStats,
    OpResult, Result,
};

/// The pread/pwrite thread-pool engine.
///
/// Every operation of a batch becomes one job on a shared channel; any idle
/// worker takes it, so one batch's operations run in parallel up to the pool
/// size. Each batch has a shared state counting the operations still
/// running; the worker that finishes the last one resolves the completion.
///
/// `register_memory` always returns `false`: plain system calls have no
/// registered buffers. Each `pread`/`pwrite` counts as one system call in
/// [`IoStats::syscalls`].
pub struct PsyncEngine {
    shared: Arc<Shared>,
    /// `None` only while dropping: closing the channel tells workers to exit
    /// once they have drained every queued job.
    jobs: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
}

/// What the engine and its workers share.
struct Shared {
    files: FileTable,
    stats: Counters,
}

/// One operation for a worker. The descriptor was looked up at submission;
/// it stays valid because files are never removed from the table, which the
/// workers keep alive through `Shared`.
struct Job {
    batch: Arc<BatchState>,
    index: usize,
    op: IoOp,
    fd: RawFd,
}

/// A batch in flight.
struct BatchState {
    /// Operations not finished yet; whoever takes it to zero completes.
    remaining: AtomicUsize,
    /// One slot per operation, filled as they finish. A mutex (not per-slot
    /// atomics) because it is taken once per operation, briefly, and an
    /// `io::Error` is not atomic-friendly.
    results: Mutex<Vec<Option<OpResult>>>,
    /// Taken by the last finisher.
    finish: Mutex<Option<Finish>>,
}

/// What the last finisher hands back.
struct Finish {
    completer: Completer,
    ops: Vec<IoOp>,
    owners: Vec<Box<dyn Any + Send>>,
}

impl BatchState {
    /// Records operation `index`'s result; completes the batch if it was the
    /// last one outstanding.
    fn finish_op(&self, index: usize, res: OpResult) {
        self.results.lock()[index] = Some(res);
        // AcqRel: the last finisher must see every other worker's result
        // (they are behind the `results` mutex too, so this is belt and
        // braces) and, more importantly, must be the only one to complete.
        if self.remaining.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let Some(finish) = self.finish.lock().take() else {
            return;
        };
        let results = std::mem::take(&mut *self.results.lock())
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(io::Error::other("operation lost"))))
            .collect();
        finish.completer.complete(BatchDone {
            ops: finish.ops,
            results,
            owners: finish.owners,
        });
    }
}

impl PsyncEngine {
    /// Starts `threads` workers (at least one). `queue_depth` is accepted for
    /// symmetry with [`UringEngine`](crate::UringEngine) and unused: the
    /// number of threads bounds the operations in flight, and `submit` never
    /// blocks (jobs beyond the pool size wait in the queue).
    ///
    /// # Errors
    /// [`IoError::EngineSetup`] if a thread cannot be spawned.
    pub fn new(threads: usize, queue_depth: u32) -> Result<Self> {
        let _ = queue_depth;
        let shared = Arc::new(Shared {
            files: FileTable::default(),
            stats: Counters::default(),
        });
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        let mut engine = PsyncEngine {
            shared,
            jobs: Some(tx),
            workers: Vec::new(),
        };
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            let shared = Arc::clone(&engine.shared);
            let handle = std::thread::Builder::new()
                .name(format!("kvtier-psync-{i}"))
                .spawn(move || worker(&rx, &shared))
                .map_err(|source| IoError::EngineSetup {
                    engine: "psync",
                    source,
                })?;
            // On an error above, dropping `engine` joins the workers started.
            engine.workers.push(handle);
        }
        Ok(engine)
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.workers.len()
    }
}

/// A worker: runs jobs until the channel is closed and drained.
fn worker(rx: &Receiver<Job>, shared: &Shared) {
    while let Ok(job) = rx.recv() {
        let res = transfer(job.fd, &job.op, &shared.stats);
        shared.stats.op(job.op.kind, job.op.len, &res);
        job.batch.finish_op(job.index, res);
    }
}

/// Performs one operation: a sync, or a transfer (see [`copy`]).
fn transfer(fd: RawFd, op: &IoOp, stats: &Counters) -> OpResult {
    if !op.kind.is_sync() {
        return copy(fd, op, stats);
    }
    loop {
        // SAFETY: plain system calls on a descriptor that stays open while
        // the operation is in flight (see `FileTable`); no memory involved.
        let rc = unsafe {
            match op.kind {
                IoKind::Fsync => libc::fsync(fd),
                _ => libc::fdatasync(fd),
            }
        };
        stats.syscalls(1);
        if rc == 0 {
            return Ok(0);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Performs one transfer with `pread`/`pwrite`, retrying `EINTR` and
/// continuing short transfers until done or the file ends. An error after
/// some bytes moved reports those bytes (a short transfer), as `read(2)`
/// itself does.
fn copy(fd: RawFd, op: &IoOp, stats: &Counters) -> OpResult {
    let len = op.len as usize;
    let mut done = 0usize;
    while done < len {
        let Some(offset) = op
            .offset
            .checked_add(done as u64)
            .and_then(|o| libc::off_t::try_from(o).ok())
        else {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        };
        // SAFETY: the submitter promised (IoBatch::push) that
        // [buf, buf + len) is valid for this access and untouched by others
        // until the batch completes, and `done < len`; `fd` stays open for
        // the engine's life (the FileTable never removes files).
        let n = unsafe {
            let ptr = op.buf.add(done).cast::<libc::c_void>();
            match op.kind {
                IoKind::Read => libc::pread(fd, ptr, len - done, offset),
                // `Write`: syncs never get here (`transfer` sends them on).
                _ => libc::pwrite(fd, ptr, len - done, offset),
            }
        };
        stats.syscalls(1);
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return if done > 0 { Ok(done as u32) } else { Err(err) };
        }
        if n == 0 {
            break;
        }
        done += n as usize;
    }
    Ok(done as u32)
}

impl IoEngine for PsyncEngine {
    fn name(&self) -> &'static str {
        "psync"
    }

    fn register_file(&self, file: File) -> Result<FileId> {
        self.shared
            .files
            .add(file)
            .map_err(|source| IoError::EngineSetup {
                engine: "psync",
                source,
            })
    }

    fn close_file(&self, id: FileId) -> Result<()> {
        // Dropping the file closes it; the caller has waited for its ops.
        match self.shared.files.remove(id) {
            Some(_file) => Ok(()),
            None => Err(IoError::NotRegistered { id: id.0 }),
        }
    }

    unsafe fn register_memory(&self, _ptr: *mut u8, _len: usize) -> bool {
        false
    }

    fn submit(&self, batch: IoBatch) -> Completion {
        self.shared.stats.batch();
        let (ops, owners) = batch.into_parts();
        if ops.is_empty() {
            return Completion::ready(BatchDone {
                ops,
                results: Vec::new(),
                owners,
            });
        }
        let (completer, completion) = Completion::pair();
        // Look every descriptor up before anything runs, under one lock.
        let fds: Vec<Option<RawFd>> = self.shared.files.with(|files| {
            ops.iter()
                .map(|op| {
                    files
                        .get(op.file.0 as usize)
                        .and_then(Option::as_ref)
                        .map(std::os::fd::AsRawFd::as_raw_fd)
                })
                .collect()
        });
        let n = ops.len();
        let state = Arc::new(BatchState {
            remaining: AtomicUsize::new(n),
            results: Mutex::new((0..n).map(|_| None).collect()),
            finish: Mutex::new(Some(Finish {
                completer,
                ops: ops.clone(),
                owners,
            })),
        });
        for (index, (op, fd)) in ops.into_iter().zip(fds).enumerate() {
            let Some(fd) = fd else {
                self.shared.stats.op(op.kind, op.len, &Err(bad_file()));
                state.finish_op(index, Err(bad_file()));
                continue;
            };
            let job = Job {
                batch: Arc::clone(&state),
                index,
                op,
                fd,
            };
            let sent = match &self.jobs {
                Some(tx) => tx.send(job).map_err(|e| e.into_inner()),
                None => Err(job),
            };
            if let Err(job) = sent {
                // Every worker is gone (they panicked); fail rather than hang.
                let gone = || io::Error::other("psync workers have exited");
                self.shared.stats.op(op.kind, op.len, &Err(gone()));
                job.batch.finish_op(job.index, Err(gone()));
            }
        }
        completion
    }

    fn stats(&self) -> IoStats {
        self.shared.stats.snapshot()
    }
}

impl Drop for PsyncEngine {
    fn drop(&mut self) {
        // Closing the channel lets workers finish every queued job (so no
        // owner is freed under a running pread) and then exit.
        self.jobs = None;
        let me = std::thread::current().id();
        for handle in self.workers.drain(..) {
            // A batch owner holding the last reference to the engine can be
            // dropped on a worker; that worker cannot join itself. It exits
            // on its own once the channel is drained (it holds `Shared`).
            if handle.thread().id() != me {
                let _ = handle.join();
            }
        }
    }
}

impl std::fmt::Debug for PsyncEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PsyncEngine")
            .field("threads", &self.workers.len())
            .finish_non_exhaustive()
    }
}
