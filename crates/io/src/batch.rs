//! Batches of operations, their owners and their completions.

use std::any::Any;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::vectored::IoVecs;
use crate::{AlignedBuf, DioAlignment, FileId, IoError, Result};

/// What an operation does: move bytes, or make a file durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoKind {
    /// Read from the file into memory.
    Read,
    /// Write memory to the file.
    Write,
    /// Read from the file into a list of memory segments, in order
    /// (`preadv`). Added only by [`IoBatch::push_vectored`] and
    /// [`IoBatch::readv_owned`]: see [`IoOp`] for how such an op names its
    /// memory.
    ReadV,
    /// Write a list of memory segments, in order, to the file (`pwritev`).
    /// Added only by [`IoBatch::push_vectored`] and
    /// [`IoBatch::writev_owned`].
    WriteV,
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
            IoKind::ReadV => "readv",
            IoKind::WriteV => "writev",
            IoKind::Fdatasync => "fdatasync",
            IoKind::Fsync => "fsync",
        }
    }

    /// Whether the operation is a sync ([`Fdatasync`](Self::Fdatasync) or
    /// [`Fsync`](Self::Fsync)), which transfers no bytes.
    pub const fn is_sync(self) -> bool {
        matches!(self, IoKind::Fdatasync | IoKind::Fsync)
    }

    /// Whether the operation is vectored ([`ReadV`](Self::ReadV) or
    /// [`WriteV`](Self::WriteV)): its memory is a list of segments.
    pub const fn is_vectored(self) -> bool {
        matches!(self, IoKind::ReadV | IoKind::WriteV)
    }

    /// Whether the operation reads the file into memory
    /// ([`Read`](Self::Read) or [`ReadV`](Self::ReadV)).
    pub const fn is_read(self) -> bool {
        matches!(self, IoKind::Read | IoKind::ReadV)
    }

    /// Whether the operation writes memory to the file
    /// ([`Write`](Self::Write) or [`WriteV`](Self::WriteV)).
    pub const fn is_write(self) -> bool {
        matches!(self, IoKind::Write | IoKind::WriteV)
    }
}

/// One operation: `len` bytes between `buf` and `file` at `offset`, or, for
/// a sync kind, a sync of `file` (then `buf` is null and `offset` and `len`
/// are 0; a sync completes with `Ok(0)`).
/// For `O_DIRECT` files, `buf`, `offset` and `len` must be aligned as
/// [`dio_alignment`](crate::dio_alignment) reports.
///
/// A vectored op ([`IoKind::ReadV`], [`IoKind::WriteV`]) moves `len` bytes,
/// the sum of its segments, between the file at `offset` and its segments
/// in order. Its `buf` is then not memory to transfer but the address of
/// the op's segment list, which its batch owns and keeps at that address
/// until the op completes (the list rides with the batch's owners; see
/// [`IoBatch::push_vectored`]). Everything that reads `len`, `offset` and
/// `kind` (results, [`BatchDone::check_op`], statistics) treats it like any
/// other op.
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
    /// Segment lists of the vectored ops, boxed so that the address each
    /// op's `buf` holds survives moves of the batch; they join `owners`, last,
    /// in [`into_parts`](Self::into_parts).
    #[allow(clippy::vec_box)] // the Box is the stable address, not a waste
    vecs: Vec<Box<IoVecs>>,
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
            vecs: Vec::new(),
        }
    }

    /// An empty batch with room for `n` operations.
    pub fn with_capacity(n: usize) -> Self {
        Self {
            ops: Vec::with_capacity(n),
            owners: Vec::new(),
            vecs: Vec::new(),
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
    ///
    /// A vectored op ([`IoKind::is_vectored`]) may only be pushed here as a
    /// copy of an op of another batch (from [`IoBatch::ops`] or
    /// [`into_parts`](Self::into_parts)) whose owners this batch keeps alive,
    /// as a forwarding engine does; new ones are added with
    /// [`push_vectored`](Self::push_vectored).
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

    /// Splits the batch into its parts (for engines). When the batch has
    /// vectored ops, their segment lists come last in the owners, as one
    /// extra owner (after everything given to
    /// [`keep_alive`](Self::keep_alive), so owner indices are unchanged).
    pub fn into_parts(mut self) -> (Vec<IoOp>, Vec<Box<dyn Any + Send>>) {
        if !self.vecs.is_empty() {
            self.owners.push(Box::new(std::mem::take(&mut self.vecs)));
        }
        (self.ops, self.owners)
    }
}

/// Vectored operations.
impl IoBatch {
    /// The most segments one vectored op may have: Linux's `IOV_MAX`.
    pub const MAX_SEGMENTS: usize = 1024;

    /// The most bytes one vectored op may move: Linux's `MAX_RW_COUNT`
    /// (`INT_MAX` rounded down to a page), past which the kernel silently
    /// transfers less.
    pub const MAX_VECTORED_LEN: u32 = 0x7fff_f000;

    /// Adds a vectored op of `kind` ([`IoKind::ReadV`] or
    /// [`IoKind::WriteV`]) between `file` at `offset` and `segments`
    /// (address, length), in order. The batch copies the segment list and
    /// keeps it alive and in place until the op completes, so the caller's
    /// list may be temporary.
    ///
    /// `align` is the direct-I/O alignment of `file` (`None` for a file
    /// without `O_DIRECT`): then `offset` and every segment's length must be
    /// multiples of `align.offset`, and every address of `align.mem`.
    ///
    /// # Errors
    /// [`IoError::InvalidVectored`], and the batch is left unchanged, when
    /// `kind` is not vectored, there are no segments or more than
    /// [`MAX_SEGMENTS`](Self::MAX_SEGMENTS), they add up to 0 bytes or to
    /// more than [`MAX_VECTORED_LEN`](Self::MAX_VECTORED_LEN), or one
    /// breaks `align`.
    ///
    /// # Safety
    /// As for [`push`](Self::push), for every segment: `[addr, addr + len)`
    /// valid for the access (writable for `ReadV`) and untouched by anyone
    /// else until the batch completes.
    pub unsafe fn push_vectored(
        &mut self,
        kind: IoKind,
        file: FileId,
        offset: u64,
        segments: impl IntoIterator<Item = (*mut u8, usize)>,
        align: Option<DioAlignment>,
    ) -> Result<()> {
        let vecs = IoVecs::checked(kind, offset, segments, align).map_err(|reason| {
            IoError::InvalidVectored {
                kind: kind.name(),
                offset,
                reason,
            }
        })?;
        self.push_vecs(kind, file, offset, vecs);
        Ok(())
    }

    /// Adds a vectored op whose list is already built and checked (by
    /// [`push_vectored`](Self::push_vectored), or cut from such a list).
    pub(crate) fn push_vecs(&mut self, kind: IoKind, file: FileId, offset: u64, vecs: IoVecs) {
        let vecs = Box::new(vecs);
        let op = IoOp {
            kind,
            file,
            offset,
            buf: (&raw const *vecs).cast_mut().cast::<u8>(),
            len: vecs.total(),
        };
        // The Box's heap address, which `op.buf` holds, does not change when
        // the Box moves into `vecs` (or later into the owners).
        self.vecs.push(vecs);
        self.ops.push(op);
    }

    /// Adds a vectored read at `offset` into `targets`, in order, which the
    /// batch then owns as one owner (get them back with
    /// [`BatchDone::take_owner`]`::<Vec<T>>`). Checked as
    /// [`push_vectored`](Self::push_vectored) checks; on an error the batch
    /// is unchanged and `targets` are dropped.
    pub fn readv_owned<T: DmaTarget>(
        &mut self,
        file: FileId,
        offset: u64,
        mut targets: Vec<T>,
        align: Option<DioAlignment>,
    ) -> Result<()> {
        let segments: Vec<_> = targets
            .iter_mut()
            .map(|t| (t.as_mut_ptr(), t.len()))
            .collect();
        // SAFETY: each target's memory stays valid and in place while the
        // target lives (DmaTarget's contract), and the batch owns the
        // targets until completion.
        unsafe { self.push_vectored(IoKind::ReadV, file, offset, segments, align)? };
        self.keep_alive(targets);
        Ok(())
    }

    /// Adds a vectored write of `sources`, in order, at `offset`; the batch
    /// owns them as one owner. Checked as
    /// [`push_vectored`](Self::push_vectored) checks; on an error the batch
    /// is unchanged and `sources` are dropped.
    pub fn writev_owned<T: DmaSource>(
        &mut self,
        file: FileId,
        offset: u64,
        sources: Vec<T>,
        align: Option<DioAlignment>,
    ) -> Result<()> {
        let segments: Vec<_> = sources
            .iter()
            .map(|s| (s.bytes().as_ptr().cast_mut(), s.bytes().len()))
            .collect();
        // SAFETY: DmaSource promises the same, unwritten memory while the
        // source lives; a write only reads it, and the batch owns the
        // sources until completion.
        unsafe { self.push_vectored(IoKind::WriteV, file, offset, segments, align)? };
        self.keep_alive(sources);
        Ok(())
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
