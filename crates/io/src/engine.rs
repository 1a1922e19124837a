//! The [`IoEngine`] trait and engine selection.

use std::fs::File;
use std::sync::Arc;

use kvtier_core::IoEngineKind;

use crate::{Completion, IoBatch, Result};

/// A file registered with an engine. Operations name files by id so the
/// io_uring engine can use its registered-file table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId(pub u32);

/// Counters an engine keeps (monotonic since creation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoStats {
    /// Batches submitted.
    pub batches: u64,
    /// Operations completed (successfully or not).
    pub ops: u64,
    /// Read operations completed.
    pub reads: u64,
    /// Write operations completed.
    pub writes: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Operations that failed or transferred fewer bytes than asked.
    pub errors: u64,
    /// Submission system calls made (io_uring_enter, or one per op for psync).
    pub syscalls: u64,
    /// Operations that used a registered buffer (vectored ones included).
    pub fixed_buffer_ops: u64,
    /// Vectored operations ([`IoKind::ReadV`](crate::IoKind::ReadV),
    /// [`IoKind::WriteV`](crate::IoKind::WriteV)) completed; they are
    /// counted in `reads` or `writes` too.
    pub vectored_ops: u64,
    /// Vectored operations issued as `READV_FIXED`/`WRITEV_FIXED` (io_uring,
    /// when the kernel has them and every segment lies in one registered
    /// piece); counted in `fixed_buffer_ops` too.
    pub fixed_vectored_ops: u64,
    /// Sync operations ([`IoKind::Fdatasync`](crate::IoKind::Fdatasync),
    /// [`IoKind::Fsync`](crate::IoKind::Fsync)) completed.
    pub syncs: u64,
}

/// Batched asynchronous I/O on registered files.
///
/// # Contract
///
/// - [`submit`](IoEngine::submit) never blocks on the I/O itself (it may wait
///   for room when more than the engine's queue depth is in flight). It
///   returns a [`Completion`] that resolves once *every* operation of the
///   batch has finished, successful or not, with one [`OpResult`](crate::OpResult)
///   per operation in submission order.
/// - The batch's owner (see [`IoBatch`]) is kept alive by the engine until the
///   last operation finishes, even if the `Completion` is dropped, so buffers
///   are never freed under the kernel. The owner comes back in
///   [`BatchDone`](crate::BatchDone).
/// - Operations in one batch may run in any order and concurrently; a caller
///   that needs order submits separate batches and waits.
/// - An error of one operation does not fail the others.
/// - Every operation on a device goes through `submit`, syncs included
///   ([`IoBatch::sync`]): a sync completes only once the file's data is on
///   stable storage, and its failure is reported like any other, so a
///   wrapper such as [`FaultyEngine`](crate::FaultyEngine) can inject it.
/// - Engines are `Send + Sync`; any thread may submit.
pub trait IoEngine: Send + Sync + 'static {
    /// Short name for logs and benchmark output (`io_uring`, `psync`, ...).
    fn name(&self) -> &'static str;

    /// Takes ownership of `file` (opened by [`open_direct`](crate::open_direct))
    /// and returns its id. Files stay registered for the engine's lifetime.
    fn register_file(&self, file: File) -> Result<FileId>;

    /// Forgets a registered file and closes it; its id may be handed out
    /// again by a later [`register_file`](IoEngine::register_file). For
    /// short-lived files (a checkpoint's temporary file), so that
    /// registering one per use does not pile up descriptors.
    ///
    /// The caller must have waited for every operation it submitted on the
    /// file; operations submitted after the call fail with `EBADF` (until
    /// the id is reused). The default keeps the file open until the engine
    /// drops and says so with [`IoError::Unsupported`](crate::IoError::Unsupported);
    /// every engine of this crate implements it.
    fn close_file(&self, id: FileId) -> Result<()> {
        let _ = id;
        Err(crate::IoError::Unsupported {
            engine: self.name(),
            what: "close_file",
        })
    }

    /// Offers `[ptr, ptr + len)` for registered-buffer I/O. Returns `true` if
    /// operations whose buffer lies inside the range will use it (the io_uring
    /// engine with enough locked-memory allowance), `false` if the engine will
    /// use plain I/O for it. Registration is an optimisation only.
    ///
    /// # Safety
    /// The range must stay valid and mapped for the engine's lifetime.
    unsafe fn register_memory(&self, ptr: *mut u8, len: usize) -> bool;

    /// Submits a batch. See the trait's contract.
    fn submit(&self, batch: IoBatch) -> Completion;

    /// A snapshot of the engine's counters.
    fn stats(&self) -> IoStats;
}

/// Builds an engine of `kind` with `queue_depth` operations in flight at most
/// (io_uring) and `threads` workers (psync). `Auto` tries io_uring and falls
/// back to psync when `io_uring_setup` fails, logging why.
pub fn build_engine(
    kind: IoEngineKind,
    queue_depth: u32,
    threads: u32,
) -> Result<Arc<dyn IoEngine>> {
    match kind {
        IoEngineKind::IoUring => Ok(Arc::new(crate::UringEngine::new(queue_depth)?)),
        IoEngineKind::Psync => Ok(Arc::new(crate::PsyncEngine::new(
            threads as usize,
            queue_depth,
        )?)),
        IoEngineKind::Auto => match crate::UringEngine::new(queue_depth) {
            Ok(e) => Ok(Arc::new(e)),
            Err(e) => {
                tracing::warn!(error = %e, "io_uring unavailable; using the pread/pwrite thread pool");
                Ok(Arc::new(crate::PsyncEngine::new(
                    threads as usize,
                    queue_depth,
                )?))
            }
        },
    }
}
