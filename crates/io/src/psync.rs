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
use crate::vectored::advance;
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
/// Vectored ops use `preadv`/`pwritev`; a short transfer is resumed from the
/// byte where it stopped, inside a segment if need be, until the op is done
/// or the file ends.
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

/// Performs one operation: a sync, or a transfer (see [`copy`] and
/// [`copy_vectored`]).
fn transfer(fd: RawFd, op: &IoOp, stats: &Counters) -> OpResult {
    if op.kind.is_vectored() {
        return copy_vectored(fd, op, stats);
    }
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

/// Performs one vectored transfer with `preadv`/`pwritev`, continuing short
/// transfers (see [`resume_vectored`]) on a copy of the op's segment list,
/// which is moved past the bytes done.
fn copy_vectored(fd: RawFd, op: &IoOp, stats: &Counters) -> OpResult {
    // SAFETY: the op's batch owners, its segment list among them, stay in
    // `Finish` until the batch completes, which is after this returns.
    let Some(vecs) = (unsafe { op.vecs() }) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    let mut iov = vecs.iov().to_vec();
    let read = op.kind == IoKind::ReadV;
    resume_vectored(&mut iov, op.offset, |rest, offset| {
        stats.syscalls(1);
        // At most IoBatch::MAX_SEGMENTS segments, so the count fits.
        let count = rest.len() as libc::c_int;
        // SAFETY: every segment lies inside one the submitter promised valid
        // for this access until the batch completes (IoBatch::push_vectored);
        // `fd` stays open for the engine's life.
        let n = unsafe {
            if read {
                libc::preadv(fd, rest.as_ptr(), count, offset)
            } else {
                libc::pwritev(fd, rest.as_ptr(), count, offset)
            }
        };
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
    })
}

/// Moves the bytes of `iov` with `call(segments left, file offset)` (one
/// `preadv`/`pwritev`) until all moved or the file ends (a call moves 0),
/// retrying `EINTR`. After a short transfer `iov` is advanced past the bytes
/// moved, which may end inside a segment, and the call is made again at the
/// offset that follows. An error after some bytes moved reports those bytes
/// (a short transfer), as `readv(2)` itself does.
fn resume_vectored(
    iov: &mut [libc::iovec],
    offset: u64,
    mut call: impl FnMut(&[libc::iovec], libc::off_t) -> io::Result<usize>,
) -> OpResult {
    let (mut first, mut done) = (0usize, 0usize);
    while first < iov.len() {
        let Some(at) = offset
            .checked_add(done as u64)
            .and_then(|o| libc::off_t::try_from(o).ok())
        else {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        };
        match call(&iov[first..], at) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                first = advance(iov, first, n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if done > 0 => {
                tracing::debug!(error = %e, done, "psync: vectored transfer cut short");
                break;
            }
            Err(e) => return Err(e),
        }
    }
    // The list was checked to add up to at most MAX_VECTORED_LEN (< u32).
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A stand-in for `preadv` on a file holding `file`: moves at most the
    /// next of `caps` bytes (cycling), fails with `EINTR` where the cap is
    /// 0, and with `EIO` from call `fail_at` on.
    struct FakeFile<'a> {
        file: &'a [u8],
        caps: &'a [usize],
        calls: usize,
        fail_at: Option<usize>,
    }

    impl FakeFile<'_> {
        fn preadv(&mut self, iov: &[libc::iovec], at: libc::off_t) -> io::Result<usize> {
            let call = self.calls;
            self.calls += 1;
            if self.fail_at.is_some_and(|f| call >= f) {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            let cap = self.caps[call % self.caps.len()];
            if cap == 0 {
                return Err(io::Error::from_raw_os_error(libc::EINTR));
            }
            let mut src = self.file.get(at as usize..).unwrap_or_default();
            src = &src[..src.len().min(cap)];
            let mut moved = 0;
            for seg in iov {
                let n = seg.iov_len.min(src.len() - moved);
                // SAFETY: the segment is inside the test's buffer.
                let dst = unsafe { std::slice::from_raw_parts_mut(seg.iov_base.cast(), n) };
                dst.copy_from_slice(&src[moved..moved + n]);
                moved += n;
            }
            Ok(moved)
        }
    }

    proptest! {
        /// However the kernel cuts a vectored read short (any byte count,
        /// mid-segment included, EINTR, the file ending, an error after some
        /// progress), the bytes land where one full read would put them and
        /// the result counts exactly the bytes read.
        #[test]
        fn short_vectored_reads_resume_across_segments(
            lens in prop::collection::vec(0usize..700, 1..24),
            caps in prop::collection::vec(0usize..900, 1..8),
            file_len in 0usize..9000,
            offset in 0u64..600,
            fail_at in prop::option::of(1usize..12),
        ) {
            prop_assume!(caps.iter().any(|&c| c > 0));
            let file: Vec<u8> = (0..file_len).map(|i| (i * 7 + 3) as u8).collect();
            let total: usize = lens.iter().sum();
            let mut mem = vec![0u8; total];
            let base = mem.as_mut_ptr();
            let mut iov = Vec::new();
            let mut at = 0;
            for &len in &lens {
                // SAFETY: `at + len <= total`.
                iov.push(libc::iovec { iov_base: unsafe { base.add(at) }.cast(), iov_len: len });
                at += len;
            }
            let mut fake = FakeFile { file: &file, caps: &caps, calls: 0, fail_at };
            let res = resume_vectored(&mut iov, offset, |rest, at| fake.preadv(rest, at));
            let available = file_len.saturating_sub(offset as usize).min(total);
            match res {
                Ok(n) => {
                    let n = n as usize;
                    prop_assert!(n <= available);
                    if fail_at.is_none() {
                        prop_assert_eq!(n, available, "stopped early");
                    }
                    let want = &file.get(offset as usize..).unwrap_or_default()[..n];
                    prop_assert_eq!(&mem[..n], want);
                    prop_assert!(mem[n..].iter().all(|&b| b == 0), "wrote past the count");
                }
                // Only an error before any byte moved is reported as one.
                Err(e) => prop_assert_eq!(e.raw_os_error(), Some(libc::EIO)),
            }
        }
    }

    #[test]
    fn an_error_before_any_byte_is_an_error() {
        let mut buf = [0u8; 8];
        let mut iov = [libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: 8,
        }];
        let res = resume_vectored(&mut iov, 0, |_, _| {
            Err(io::Error::from_raw_os_error(libc::ENOSPC))
        });
        assert_eq!(res.err().and_then(|e| e.raw_os_error()), Some(libc::ENOSPC));
    }
}
