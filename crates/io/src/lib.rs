//! # kvtier-io
//!
//! Batched block I/O on files opened with `O_DIRECT`, behind one trait,
//! [`IoEngine`], with one implementation per real mechanism:
//!
//! - [`UringEngine`]: io_uring, registered files and buffers, one
//!   `io_uring_enter` per batch, so control cost grows with batches, not
//!   operations;
//! - [`PsyncEngine`]: a thread pool issuing `pread`/`pwrite`, for hosts where
//!   `io_uring_setup` is refused (Docker's and Kubernetes' default seccomp
//!   profiles);
//! - [`FaultyEngine`]: wraps another engine and injects errors, short I/O
//!   and bit flips, for tests;
//! - [`GatedEngine`]: wraps another engine and holds batches of reads or
//!   writes until a test lets them go, for tests of what is visible while
//!   I/O is in flight.
//!
//! [`build_engine`] picks one from an [`IoEngineKind`](kvtier_core::IoEngineKind)
//! (`auto` probes io_uring and falls back; setting
//! [`KVTIER_DISABLE_IO_URING=1`](DISABLE_IO_URING_ENV) forces the fallback,
//! as a seccomp profile would; tests that need io_uring skip where it is
//! unavailable unless [`KVTIER_REQUIRE_IO_URING=1`](REQUIRE_IO_URING_ENV),
//! which CI sets, makes them fail). Syncs are operations of a batch like
//! reads and writes ([`IoBatch::sync`]), so they can fail and be injected
//! like them. Vectored ops ([`IoKind::ReadV`], [`IoKind::WriteV`], added with
//! [`IoBatch::push_vectored`] or [`IoBatch::readv_owned`]) move one file
//! range to or from a list of up to 1,024 memory segments in one operation
//! (`READV`/`WRITEV`, or `READV_FIXED`/`WRITEV_FIXED` on Linux 6.15+ when
//! every segment lies in one registered piece; `preadv`/`pwritev` in the
//! thread pool); the batch owns the segment list and checks it (count,
//! length, direct-I/O alignment) before anything is submitted.
//! [`AlignedBuf`] is an owned buffer
//! aligned for direct I/O; [`open_direct`] opens and preallocates files and
//! [`dio_alignment`] asks the file system what alignment it needs.
//!
//! ```no_run
//! use kvtier_io::{build_engine, open_direct, AlignedBuf, IoBatch};
//! # fn main() -> Result<(), kvtier_io::IoError> {
//! let engine = build_engine(kvtier_core::IoEngineKind::Auto, 32, 4)?;
//! let file = open_direct("/tmp/kvtier-example".as_ref(), 1 << 20)?;
//! let id = engine.register_file(file)?;
//! let mut buf = AlignedBuf::zeroed(4096, 4096);
//! buf.fill(7);
//! let mut batch = IoBatch::new();
//! batch.write_owned(id, 0, buf);
//! let done = engine.submit(batch).wait();
//! done.check()?;
//! # Ok(()) }
//! ```

/// The `IoEngine` methods a wrapper engine passes to its `inner` engine
/// unchanged (files and registered memory), for engines that wrap another
/// (`FaultyEngine`, `GatedEngine`).
macro_rules! forward_files_to_inner {
    () => {
        fn register_file(&self, file: std::fs::File) -> $crate::Result<$crate::FileId> {
            self.inner.register_file(file)
        }

        fn close_file(&self, id: $crate::FileId) -> $crate::Result<()> {
            self.inner.close_file(id)
        }

        unsafe fn register_memory(&self, ptr: *mut u8, len: usize) -> bool {
            // SAFETY: our caller's promise is passed on unchanged; the inner
            // engine lives at least as long as the wrapper does.
            unsafe { self.inner.register_memory(ptr, len) }
        }
    };
}

mod aligned;
mod batch;
mod engine;
mod error;
mod fault;
mod file;
mod files;
mod gate;
mod psync;
mod stats;
mod uring;
mod vectored;

pub use aligned::AlignedBuf;
pub use batch::{
    BatchDone, Completer, Completion, DmaSource, DmaTarget, IoBatch, IoKind, IoOp, OpResult,
};
pub use engine::{FileId, IoEngine, IoStats, build_engine};
pub use error::{IoError, Result};
pub use fault::{Fault, FaultyEngine};
pub use file::{
    DioAlignment, PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, create_private_dir_all, dio_alignment,
    open_direct, prefill, restrict_mode,
};
pub use gate::{GatedEngine, Held};
pub use psync::PsyncEngine;
pub use uring::{DISABLE_IO_URING_ENV, REQUIRE_IO_URING_ENV, UringEngine, uring_unavailable};
pub use vectored::VectoredError;
