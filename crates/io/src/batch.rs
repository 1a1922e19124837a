//! Batches of operations, their owners and their completions.

use std::any::Any;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::{AlignedBuf, FileId, IoError, Result};

/// What an operation does: move bytes, or make a file durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoKind {
    /// Read from the file into memory.
    Read,
    /// Write memory to the file.
    Write,
    /// `fdatasync` the file: its data, and the metadata needed to read it
    /// back (its size), reach stable storage. No memory, offset or length.
    Fdatasync,
    /// `fsync` the file: as [`Fdatasync`](Self::Fdatasync) plus every other
    /// metadata. The one to use on a directory after a rename in it.
    Fsync,
}

impl IoKind {
    /// "read", "write", "fdatasync" or "fsync".
    pub const fn name(self) -> &'static str {
        match self {
            IoKind::Read => "read",
            IoKind::Write => "write",
            IoKind::Fdatasync => "fdatasync",
            IoKind::Fsync => "fsync",
        }
    }

    /// Whether the operation is a sync ([`Fdatasync`](Self::Fdatasync) or
    /// [`Fsync`](Self::Fsync)), which transfers no bytes.
    pub const fn is_sync(self) -> bool {
        matches!(self, IoKind::Fdatasync | IoKind::Fsync)
    }
}

/// One operation: `len` bytes between `buf` and `file` at `offset`, or, for
/// a sync kind, a sync of `file` (then `buf` is null and `offset` and `len`
/// are 0; a sync completes with `Ok(0)`).
/// For `O_DIRECT` files, `buf`, `offset` and `len` must be aligned as
/// [`dio_alignment`](crate::dio_alignment) reports.
#[derive(Debug, Clone, Copy)]
pub struct IoOp {
    /// Direction.
    pub kind: IoKind,
    /// Target file.
    pub file: FileId,
    /// Byte offset in the file.
    pub offset: u64,
    /// Memory address (see [`IoBatch::push`] for the validity contract).
    pub buf: *mut u8,
    /// Bytes to transfer.
    pub len: u32,
}

// SAFETY: an IoOp is a plain description; the memory it points to is kept
// valid by the batch owner for as long as the op is in flight (the contract of
// `IoBatch::push`), whichever thread performs it.
unsafe impl Send for IoOp {}
// SAFETY: as above; sharing a description does not touch the memory.
unsafe impl Sync for IoOp {}

/// The outcome of one operation: bytes transferred, or the OS error.
pub type OpResult = std::result::Result<u32, io::Error>;

/// A list of operations plus the *owner* of their memory: whatever must stay
/// alive until the last operation finishes (buffers, slot guards). The engine
/// holds the owner until completion and hands it back in [`BatchDone`].
pub struct IoBatch {
    pub(crate) ops: Vec<IoOp>,
    pub(crate) owners: Vec<Box<dyn Any + Send>>,
}

impl Default for IoBatch {
    fn default() -> Self {
        Self::new()
    }
}

impl IoBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self {
            ops: Vec::new(),
            owners: Vec::new(),
        }
    }

    /// An empty batch with room for `n` operations.
    pub fn with_capacity(n: usize) -> Self {
        Self {
            ops: Vec::with_capacity(n),
            owners: Vec::new(),
        }
    }

    /// Adds an operation on raw memory.
    ///
    /// # Safety
    /// `[op.buf, op.buf + op.len)` must be valid for the access (writable for
    /// reads) and must not be touched by anyone else until the batch
    /// completes: either it is owned by something passed to
    /// [`keep_alive`](Self::keep_alive), or the caller otherwise guarantees it
    /// outlives the batch's completion even if the [`Completion`] is dropped.
    pub unsafe fn push(&mut self, op: IoOp) {
        self.ops.push(op);
    }

    /// Keeps `owner` alive until every operation of the batch has finished.
    pub fn keep_alive(&mut self, owner: impl Any + Send) {
        self.owners.push(Box::new(owner));
    }

    /// Adds a read of `buf.len()` bytes at `offset` into `buf`, which the batch
    /// then owns (get it back from [`BatchDone::take_owner`]).
    pub fn read_owned(&mut self, file: FileId, offset: u64, mut buf: AlignedBuf) {
        let op = IoOp {
            kind: IoKind::Read,
            file,
            offset,
            buf: buf.as_mut_ptr(),
            len: buf.len() as u32,
        };
        // SAFETY: the heap allocation behind `buf` does not move when `buf`
        // itself moves into `owners`, and the batch keeps it until completion.
        unsafe { self.push(op) };
        self.keep_alive(buf);
    }

    /// Adds a write of all of `buf` at `offset`; the batch owns `buf`.
    pub fn write_owned(&mut self, file: FileId, offset: u64, mut buf: AlignedBuf) {
        let op = IoOp {
            kind: IoKind::Write,
            file,
            offset,
            buf: buf.as_mut_ptr(),
            len: buf.len() as u32,
        };
        // SAFETY: as in `read_owned`.
        unsafe { self.push(op) };
        self.keep_alive(buf);
    }

    /// Adds a sync of `file` (`kind` is [`IoKind::Fdatasync`] or
    /// [`IoKind::Fsync`]; any other kind is taken as `Fdatasync`). Operations
    /// of one batch may run in any order, so a sync covers only writes
    /// that completed before the batch was submitted: submit the writes,
    /// wait, then submit the sync.
    pub fn sync(&mut self, file: FileId, kind: IoKind) {
        let kind = if kind == IoKind::Fsync {
            IoKind::Fsync
        } else {
            IoKind::Fdatasync
        };
        let op = IoOp {
            kind,
            file,
            offset: 0,
            buf: std::ptr::null_mut(),
            len: 0,
        };
        // SAFETY: a sync touches no memory.
        unsafe { self.push(op) };
    }

    /// The operations, in submission order.
    pub fn ops(&self) -> &[IoOp] {
        &self.ops
    }

    /// Number of operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the batch has no operations.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Splits the batch into its parts (for engines).
    pub fn into_parts(self) -> (Vec<IoOp>, Vec<Box<dyn Any + Send>>) {
        (self.ops, self.owners)
    }
}

/// A finished batch: one result per operation, in submission order, and the
/// owners given to [`IoBatch::keep_alive`].
pub struct BatchDone {
    /// The operations as submitted.
    pub ops: Vec<IoOp>,
    /// One result per operation.
    pub results: Vec<OpResult>,
    /// The owners, in the order they were added.
    pub owners: Vec<Box<dyn Any + Send>>,
}

impl BatchDone {
    /// `Ok` if every operation transferred all its bytes; else the first
    /// failure as an [`IoError`].
    pub fn check(&self) -> Result<()> {
        for i in 0..self.ops.len() {
            self.check_op(i)?;
        }
        Ok(())
    }

    /// `Ok` if operation `i` transferred all its bytes.
    pub fn check_op(&self, i: usize) -> Result<()> {
        let op = &self.ops[i];
        match &self.results[i] {
            Ok(n) if *n == op.len => Ok(()),
            Ok(n) => Err(IoError::Short {
                kind: op.kind.name(),
                offset: op.offset,
                len: op.len,
                done: *n,
            }),
            Err(e) => Err(IoError::Op {
                kind: op.kind.name(),
                offset: op.offset,
                len: op.len,
                source: io::Error::new(e.kind(), e.to_string()),
            }),
        }
    }

    /// Takes owner `i` back as a `T` (e.g. the [`AlignedBuf`] of
    /// [`IoBatch::read_owned`]); `None` if it is not a `T` or was taken.
    pub fn take_owner<T: Any>(&mut self, i: usize) -> Option<T> {
        let slot = self.owners.get_mut(i)?;
        if !slot.is::<T>() {
            return None;
        }
        let taken = std::mem::replace(slot, Box::new(()));
        taken.downcast::<T>().ok().map(|b| *b)
    }
}

/// Resolves when every operation of a batch has finished. Await it, or call
/// [`wait`](Self::wait) from synchronous code. Dropping it does not cancel
/// the I/O; the engine still keeps the batch's owners alive until it ends.
pub struct Completion {
    rx: tokio::sync::oneshot::Receiver<BatchDone>,
}

/// The sending half an engine completes a batch with.
pub struct Completer {
    tx: tokio::sync::oneshot::Sender<BatchDone>,
}

impl Completion {
    /// A completion and the completer an engine resolves it with.
    pub fn pair() -> (Completer, Completion) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (Completer { tx }, Completion { rx })
    }

    /// An already finished completion (for empty batches and engines that
    /// fail a whole batch up front).
    pub fn ready(done: BatchDone) -> Self {
        let (c, p) = Self::pair();
        c.complete(done);
        p
    }

    /// Blocks the calling thread until the batch finishes. Works with or
    /// without an async runtime (do not call it on a runtime worker thread
    /// for long batches).
    pub fn wait(self) -> BatchDone {
        futures_executor::block_on(self)
    }
}

impl Completer {
    /// Resolves the completion. If it was dropped, the result (and with it the
    /// owners) is dropped here, after the I/O is done.
    pub fn complete(self, done: BatchDone) {
        let _ = self.tx.send(done);
    }
}

impl Future for Completion {
    type Output = BatchDone;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<BatchDone> {
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Ready(Ok(done)) => Poll::Ready(done),
            // The engine dropped the completer without completing: it was
            // torn down mid-batch. Report every op as failed with no owners;
            // the engine's teardown is responsible for waiting out the kernel
            // before freeing owners.
            Poll::Ready(Err(_)) => Poll::Ready(BatchDone {
                ops: Vec::new(),
                results: Vec::new(),
                owners: Vec::new(),
            }),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Memory that can be the target of a direct-I/O read and travels with the
/// batch as its owner: an [`AlignedBuf`], a reserved memory-tier slot, ...
///
/// # Safety
/// Implementors promise that `as_mut_ptr()` stays valid for `len()` bytes,
/// at the same address, for as long as the value lives (moving the value
/// must not move the memory), and that nobody else reads or writes it while
/// the value is owned by a batch.
pub unsafe trait DmaTarget: Send + 'static {
    /// Start of the memory.
    fn as_mut_ptr(&mut self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the target is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Memory that can be the source of a direct-I/O write without a copy: a
/// batch keeps the value alive until its writes have finished, even if the
/// caller stops waiting. An arena slot held by a reference, an
/// [`AlignedBuf`] nobody writes any more, ...
///
/// # Safety
/// Implementors promise that [`bytes`](DmaSource::bytes) returns the same
/// memory (address and length) for as long as the value lives, and that
/// nobody writes that memory meanwhile.
pub unsafe trait DmaSource: Send + Sync + 'static {
    /// The bytes to write.
    fn bytes(&self) -> &[u8];
}

// SAFETY: shared access to an AlignedBuf cannot write it, and its heap
// memory does not move.
unsafe impl DmaSource for AlignedBuf {
    fn bytes(&self) -> &[u8] {
        self
    }
}

// SAFETY: AlignedBuf's heap memory is stable across moves and exclusively owned.
unsafe impl DmaTarget for AlignedBuf {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        AlignedBuf::as_mut_ptr(self)
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}
