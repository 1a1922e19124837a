//! The G1 seam: a [`Device`] owns a pool of block-sized buffers in device
//! memory and copies whole blocks, or one layer of many blocks, between
//! host memory and that pool.
//!
//! The trait is what the transfer engine sees of a GPU. [`HostDevice`] is
//! the host-memory implementation tests and CI run on (its copies are real
//! `memcpy`s); a CUDA implementation (pinned host memory, copies on
//! dedicated streams, completion by event) plugs in behind a cargo feature
//! later without changing the engine.
//!
//! Copies are submitted in batches — one call per batch, not per block, so
//! a layer-wise load costs one call per layer (Tutti: control cost grows
//! with layers, not blocks) — and complete through a [`CopyCompletion`]
//! future that hands every host buffer back with its own result.
//! [`GatedDevice`] wraps any device and holds completions until released,
//! for tests of in-flight protection and scheduling.

mod gated;
mod host;

use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll};

use kvtier_core::Geometry;
use tokio::sync::oneshot;

pub use gated::{CopyDirection, CopyEvent, GatedDevice};
pub use host::{HostDevice, HostDeviceOptions};

/// A block-sized buffer in a device's pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceBlockId(pub u32);

/// Which bytes of each block a copy moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Span {
    /// The whole block (`geometry.block_bytes()`).
    Block,
    /// One layer (`geometry.layer_bytes()`, at `geometry.layer_range(l)`).
    Layer(u32),
}

impl Span {
    /// The byte range of this span inside a block of `geometry`, or `None`
    /// when the layer is out of range.
    pub fn range(self, geometry: &Geometry) -> Option<Range<u64>> {
        match self {
            Span::Block => Some(0..geometry.block_bytes()),
            Span::Layer(l) if l < geometry.layers => Some(geometry.layer_range(l)),
            Span::Layer(_) => None,
        }
    }

    /// Bytes of this span for blocks of `geometry` (0 for a bad layer).
    pub fn bytes(self, geometry: &Geometry) -> u64 {
        self.range(geometry).map_or(0, |r| r.end - r.start)
    }
}

/// Why a device call or one copy failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DeviceError {
    /// The pool has fewer free blocks than asked for.
    #[error("device pool exhausted: {wanted} blocks wanted, {free} free")]
    OutOfMemory {
        /// Blocks asked for.
        wanted: usize,
        /// Blocks free.
        free: usize,
    },
    /// The block id is not allocated in this pool.
    #[error("device block {0:?} is not allocated")]
    NotAllocated(DeviceBlockId),
    /// The span does not fit the geometry (layer out of range).
    #[error("span {0:?} does not fit the geometry")]
    BadSpan(Span),
    /// The host buffer's length differs from the span's.
    #[error("host buffer of {got} bytes for a span of {want} bytes")]
    LengthMismatch {
        /// Bytes the span needs.
        want: u64,
        /// Bytes the host buffer has.
        got: usize,
    },
    /// The device dropped the copy without completing it (shut down).
    #[error("device shut down before the copy completed")]
    Abandoned,
    /// The driver reported an error.
    #[error("device error: {0}")]
    Driver(String),
}

/// Host memory a host-to-device copy reads from, owned by the copy until it
/// completes (the address must not change or be freed meanwhile).
pub trait HostSource: Send + 'static {
    /// The bytes to copy.
    fn host_bytes(&self) -> &[u8];
}

/// Host memory a device-to-host copy writes into, owned by the copy until
/// it completes. `Any` lets the caller take its own buffer type back.
pub trait HostSink: std::any::Any + Send {
    /// The bytes to fill.
    fn host_bytes_mut(&mut self) -> &mut [u8];
}

impl HostSource for Vec<u8> {
    fn host_bytes(&self) -> &[u8] {
        self
    }
}

impl HostSink for Vec<u8> {
    fn host_bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl HostSource for bytes::Bytes {
    fn host_bytes(&self) -> &[u8] {
        self
    }
}

impl HostSource for kvtier_io::AlignedBuf {
    fn host_bytes(&self) -> &[u8] {
        self
    }
}

impl HostSink for kvtier_io::AlignedBuf {
    fn host_bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl HostSource for kvtier_mem::BlockRef {
    fn host_bytes(&self) -> &[u8] {
        self
    }
}

impl HostSink for kvtier_mem::SlotReservation {
    fn host_bytes_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

/// A sub-range of another host source (one layer of a DRAM block).
pub struct HostSlice<S> {
    inner: S,
    range: Range<usize>,
}

impl<S: HostSource> HostSlice<S> {
    /// `range` of `inner`, or `None` when it does not fit.
    pub fn new(inner: S, range: Range<usize>) -> Option<Self> {
        (range.start <= range.end && range.end <= inner.host_bytes().len())
            .then_some(Self { inner, range })
    }

    /// The whole source back.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: HostSource> HostSource for HostSlice<S> {
    fn host_bytes(&self) -> &[u8] {
        &self.inner.host_bytes()[self.range.clone()]
    }
}

/// One host-to-device copy of a batch.
pub struct Upload<S> {
    /// Destination block in the device pool.
    pub dst: DeviceBlockId,
    /// Host bytes, exactly the span's length.
    pub src: S,
}

/// One device-to-host copy of a batch.
pub struct Download<S> {
    /// Source block in the device pool.
    pub src: DeviceBlockId,
    /// Host bytes to fill, exactly the span's length.
    pub dst: S,
}

/// The host buffers of a batch, each with its copy's outcome, in
/// submission order.
pub type CopyResults<S> = Vec<(S, Result<(), DeviceError>)>;

/// Completion of one batch of copies: a future resolving to every host
/// buffer with its result. Dropping it does not cancel the copies.
pub struct CopyCompletion<S> {
    state: CompletionState<S>,
}

enum CompletionState<S> {
    Ready(Option<CopyResults<S>>),
    Pending(oneshot::Receiver<CopyResults<S>>),
}

/// The device side of a [`CopyCompletion`]: a device completes it when its
/// copies are done (from any thread).
pub struct CopyCompleter<S> {
    tx: oneshot::Sender<CopyResults<S>>,
}

impl<S> CopyCompletion<S> {
    /// A completion that is already done (synchronous copies).
    pub fn ready(results: CopyResults<S>) -> Self {
        Self {
            state: CompletionState::Ready(Some(results)),
        }
    }

    /// A pending completion and the completer that finishes it.
    pub fn pair() -> (CopyCompleter<S>, Self) {
        let (tx, rx) = oneshot::channel();
        (
            CopyCompleter { tx },
            Self {
                state: CompletionState::Pending(rx),
            },
        )
    }
}

impl<S> CopyCompleter<S> {
    /// Completes the batch.
    pub fn complete(self, results: CopyResults<S>) {
        // The waiter may have gone away; the copies are done regardless.
        let _ = self.tx.send(results);
    }
}

// The host buffers are never pinned in place by the future: they only pass
// through it by value.
impl<S> Unpin for CopyCompletion<S> {}

/// Resolves to `Err(DeviceError::Abandoned)` when the completer was dropped
/// (the host buffers are then lost with it).
impl<S> Future for CopyCompletion<S> {
    type Output = Result<CopyResults<S>, DeviceError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Neither variant is structurally pinned (the receiver is Unpin).
        let this = self.get_mut();
        match &mut this.state {
            CompletionState::Ready(r) => Poll::Ready(r.take().ok_or(DeviceError::Abandoned)),
            CompletionState::Pending(rx) => Pin::new(rx)
                .poll(cx)
                .map(|r| r.map_err(|_| DeviceError::Abandoned)),
        }
    }
}

/// G1 memory and copies. Implementations: [`HostDevice`] (host memory, for
/// tests and CI); CUDA behind a cargo feature.
///
/// Contract: a destination's bytes are valid only once the batch's
/// completion resolves with `Ok` for that copy; a block must not be
/// released while a copy to or from it is in flight.
pub trait Device: Send + Sync + 'static {
    /// A short name for logs and metrics (`host`, `cuda:0`).
    fn name(&self) -> &str;

    /// The geometry every block of the pool has.
    fn geometry(&self) -> &Geometry;

    /// Blocks in the pool.
    fn capacity_blocks(&self) -> usize;

    /// Blocks not allocated.
    fn free_blocks(&self) -> usize;

    /// Allocates `n` blocks, all or none.
    fn allocate(&self, n: usize) -> Result<Vec<DeviceBlockId>, DeviceError>;

    /// Returns blocks to the pool. Unknown or already-free ids are ignored.
    fn release(&self, blocks: &[DeviceBlockId]);

    /// Copies `span` of every upload's host bytes into its device block, as
    /// one batch.
    fn upload(
        &self,
        span: Span,
        copies: Vec<Upload<Box<dyn HostSource>>>,
    ) -> CopyCompletion<Box<dyn HostSource>>;

    /// Copies `span` of every download's device block into its host bytes,
    /// as one batch.
    fn download(
        &self,
        span: Span,
        copies: Vec<Download<Box<dyn HostSink>>>,
    ) -> CopyCompletion<Box<dyn HostSink>>;
}
