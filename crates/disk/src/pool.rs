//! Region write buffers: [`RegionBuf`] and the per-directory [`BufPool`].
//!
//! A region is assembled in a region-sized, 4096-aligned buffer that mirrors
//! its on-disk image, and each newly appended extent is written from there.
//! Writers own disjoint byte ranges of the buffer (the slots they reserved),
//! so several of them fill one buffer at once. A buffer is shared through an
//! `Arc`: the open region holds one reference and every write in flight
//! holds one (as the owner the engine keeps alive), so a buffer whose only
//! holder is the pool is idle and may start a new region.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kvtier_io::{AlignedBuf, IoEngine};
use parking_lot::Mutex;
use tokio::sync::Notify;

/// A region-sized write buffer.
pub(crate) struct RegionBuf {
    ptr: *mut u8,
    len: usize,
    /// Owns the memory `ptr` points into; never touched through this field
    /// after construction.
    _mem: AlignedBuf,
    /// Whether the engine accepted it for registered-buffer I/O.
    registered: bool,
}

// SAFETY: the raw pointer refers to `buf`, which RegionBuf owns; access to
// the bytes is coordinated by slot reservations (see `range_mut`).
unsafe impl Send for RegionBuf {}
// SAFETY: as above; shared references only hand out raw pointers and, through
// the unsafe `range_mut`, ranges their callers own exclusively.
unsafe impl Sync for RegionBuf {}

impl RegionBuf {
    fn new(len: usize) -> Self {
        let mut buf = AlignedBuf::zeroed(len, 4096);
        RegionBuf {
            ptr: buf.as_mut_ptr(),
            len,
            _mem: buf,
            registered: false,
        }
    }

    /// The address of byte `off`.
    pub fn ptr_at(&self, off: usize) -> *mut u8 {
        debug_assert!(off <= self.len);
        // SAFETY: off is within the allocation (or one past its end).
        unsafe { self.ptr.add(off) }
    }

    /// A mutable view of `[off, off + len)`.
    ///
    /// # Safety
    /// The caller must own the range exclusively: it reserved the slots (or
    /// the region header) under the directory's writer lock, and no write of
    /// the range is in flight (a buffer is only reused once every write from
    /// it has finished).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn range_mut(&self, off: usize, len: usize) -> &mut [u8] {
        assert!(off.checked_add(len).is_some_and(|end| end <= self.len));
        // SAFETY: in bounds (checked above); exclusivity is the caller's
        // obligation stated in this function's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), len) }
    }
}

/// The `count` region buffers of one directory.
///
/// They are allocated, touched and registered when the tier opens, not on
/// first use: first-touch page faults on tens of MiB cost milliseconds, which
/// would otherwise land on the first writes after start.
pub(crate) struct BufPool {
    bufs: Mutex<Vec<Arc<RegionBuf>>>,
    size: usize,
    any_registered: AtomicBool,
    idle: Notify,
}

impl BufPool {
    /// A pool of `count` (at least one) buffers of `size` bytes, offered to
    /// `engine` for registered-buffer I/O when `register` is set.
    pub fn new(count: usize, size: usize, register: bool, engine: &Arc<dyn IoEngine>) -> Self {
        let mut any_registered = false;
        let bufs = (0..count.max(1))
            .map(|_| {
                // Zeroing touches every page now.
                let mut b = RegionBuf::new(size);
                if register {
                    // SAFETY: the buffer lives in this pool until the pool is
                    // dropped, and `Shared::drop` leaks registered buffers
                    // when the engine outlives the tier, so the range stays
                    // valid for the engine's lifetime.
                    b.registered = unsafe { engine.register_memory(b.ptr, b.len) };
                    any_registered |= b.registered;
                }
                Arc::new(b)
            })
            .collect();
        BufPool {
            bufs: Mutex::new(bufs),
            size,
            any_registered: AtomicBool::new(any_registered),
            idle: Notify::new(),
        }
    }

    /// An idle buffer, waiting until one goes idle if all are in use.
    pub async fn acquire(&self) -> Arc<RegionBuf> {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let bufs = self.bufs.lock();
                // Only the pool clones buffers out (here, under the lock), so a
                // count of one cannot rise while we hold it.
                if let Some(b) = bufs.iter().find(|b| Arc::strong_count(b) == 1) {
                    return b.clone();
                }
            }
            notified.await;
        }
    }

    /// Wakes writers waiting for an idle buffer (after a write finished).
    pub fn wake(&self) {
        self.idle.notify_waiters();
    }

    /// Bytes of buffers allocated.
    pub fn bytes(&self) -> usize {
        self.bufs.lock().len() * self.size
    }

    /// Leaks every registered buffer: the engine may use registered memory
    /// for as long as it lives, which can be longer than the tier.
    pub fn leak_registered(&self) {
        if !self.any_registered.load(Ordering::Relaxed) {
            return;
        }
        for b in self.bufs.lock().drain(..) {
            if b.registered {
                std::mem::forget(b);
            }
        }
    }
}

impl std::fmt::Debug for BufPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufPool")
            .field("count", &self.bufs.lock().len())
            .field("size", &self.size)
            .finish()
    }
}
