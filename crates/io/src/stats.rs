//! [`Counters`]: the lock-free counters behind [`IoStats`], shared by the
//! engines.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::{IoKind, IoStats, OpResult};

/// Monotonic counters, bumped from any thread with relaxed atomics: they are
/// statistics, never used to synchronise anything.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    batches: AtomicU64,
    ops: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    errors: AtomicU64,
    syscalls: AtomicU64,
    fixed_buffer_ops: AtomicU64,
    vectored_ops: AtomicU64,
    fixed_vectored_ops: AtomicU64,
    syncs: AtomicU64,
}

impl Counters {
    /// One batch submitted.
    pub(crate) fn batch(&self) {
        self.batches.fetch_add(1, Relaxed);
    }

    /// `n` submission system calls made.
    pub(crate) fn syscalls(&self, n: u64) {
        self.syscalls.fetch_add(n, Relaxed);
    }

    /// `n` operations issued with a registered buffer.
    pub(crate) fn fixed(&self, n: u64) {
        self.fixed_buffer_ops.fetch_add(n, Relaxed);
    }

    /// `n` vectored operations issued with a registered buffer (on top of
    /// [`fixed`](Self::fixed), which counts them too).
    pub(crate) fn fixed_vectored(&self, n: u64) {
        self.fixed_vectored_ops.fetch_add(n, Relaxed);
    }

    /// One operation of `kind` asking for `len` bytes finished with `res`.
    pub(crate) fn op(&self, kind: IoKind, len: u32, res: &OpResult) {
        self.ops.fetch_add(1, Relaxed);
        let done = match res {
            Ok(n) => {
                if *n != len {
                    self.errors.fetch_add(1, Relaxed);
                }
                u64::from(*n)
            }
            Err(_) => {
                self.errors.fetch_add(1, Relaxed);
                0
            }
        };
        if kind.is_vectored() {
            self.vectored_ops.fetch_add(1, Relaxed);
        }
        match kind {
            IoKind::Read | IoKind::ReadV => {
                self.reads.fetch_add(1, Relaxed);
                self.bytes_read.fetch_add(done, Relaxed);
            }
            IoKind::Write | IoKind::WriteV => {
                self.writes.fetch_add(1, Relaxed);
                self.bytes_written.fetch_add(done, Relaxed);
            }
            IoKind::Fdatasync | IoKind::Fsync => {
                self.syncs.fetch_add(1, Relaxed);
            }
        }
    }

    /// A snapshot (each counter read on its own; not one atomic cut).
    pub(crate) fn snapshot(&self) -> IoStats {
        IoStats {
            batches: self.batches.load(Relaxed),
            ops: self.ops.load(Relaxed),
            reads: self.reads.load(Relaxed),
            writes: self.writes.load(Relaxed),
            bytes_read: self.bytes_read.load(Relaxed),
            bytes_written: self.bytes_written.load(Relaxed),
            errors: self.errors.load(Relaxed),
            syscalls: self.syscalls.load(Relaxed),
            fixed_buffer_ops: self.fixed_buffer_ops.load(Relaxed),
            vectored_ops: self.vectored_ops.load(Relaxed),
            fixed_vectored_ops: self.fixed_vectored_ops.load(Relaxed),
            syncs: self.syncs.load(Relaxed),
        }
    }
}
