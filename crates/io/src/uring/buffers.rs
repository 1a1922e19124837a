//! [`BufferTable`]: memory registered with the ring as fixed buffers, and the
//! lookup that tells whether an operation's buffer lies inside one.
//!
//! Registered buffers save the kernel pinning and unpinning the pages of every
//! operation (fio spends 100-180 us per 2 MiB I/O on that here). The ring gets
//! a sparse table at start-up; each [`register`](BufferTable::register) fills
//! the next free slots, one per piece of at most 1 GiB (the kernel's limit
//! per registered buffer).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

use io_uring::IoUring;
use parking_lot::{Mutex, RwLock};

use super::register::Registration;

/// The kernel refuses registered buffers larger than this.
const MAX_PIECE: usize = 1 << 30;

/// Slots in the sparse buffer table (the kernel allows up to 16,384). 1,024
/// pieces of 1 GiB cover a terabyte of registered memory.
pub(crate) const TABLE_SLOTS: u32 = 1024;

/// One registered piece: `[start, end)` is buffer `index`.
#[derive(Debug, Clone, Copy)]
struct Piece {
    start: usize,
    end: usize,
    index: u16,
}

/// Registered memory, sorted by address.
#[derive(Debug)]
pub(crate) struct BufferTable {
    /// Slots of the sparse table; 0 when the kernel refused to create it.
    slots: u32,
    /// Read on every submission, written on (rare) registration.
    pieces: RwLock<Vec<Piece>>,
    /// Next free slot.
    next: Mutex<u32>,
    /// Registration failures are logged once, not per call.
    warned: AtomicBool,
}

impl BufferTable {
    /// Creates the ring's sparse buffer table. Never fails: without it, every
    /// registration just reports `false`.
    pub(crate) fn new(ring: &IoUring) -> Self {
        let slots = match ring.submitter().register_buffers_sparse(TABLE_SLOTS) {
            Ok(()) => TABLE_SLOTS,
            Err(e) => {
                tracing::info!(error = %e, "io_uring: no sparse buffer table; registered buffers disabled");
                0
            }
        };
        Self {
            slots,
            pieces: RwLock::new(Vec::new()),
            next: Mutex::new(0),
            warned: AtomicBool::new(false),
        }
    }

    /// Registers `[ptr, ptr + len)` through `apply`, which hands the update
    /// to the driver (see `register`). Returns `false` (logging the first
    /// failure) when the table is full or the kernel refuses, typically for
    /// want of locked-memory allowance (`RLIMIT_MEMLOCK` without
    /// `CAP_IPC_LOCK`).
    ///
    /// # Safety
    /// The range must stay valid and mapped for the ring's lifetime.
    pub(crate) unsafe fn register(
        &self,
        apply: impl FnOnce(Registration) -> io::Result<()>,
        ptr: *mut u8,
        len: usize,
    ) -> bool {
        if len == 0 || ptr.is_null() {
            return false;
        }
        let iovecs: Vec<libc::iovec> = (0..len)
            .step_by(MAX_PIECE)
            .map(|off| libc::iovec {
                // SAFETY: off < len, so the pointer stays inside the caller's range.
                iov_base: unsafe { ptr.add(off) }.cast(),
                iov_len: (len - off).min(MAX_PIECE),
            })
            .collect();
        // Slots are taken under the lock but registered without it: the
        // driver applies the update, and a batch owner dropped on the driver
        // may itself register memory, so nothing may wait for the driver
        // with this lock held.
        let first = {
            let mut next = self.next.lock();
            let Some(end) = u32::try_from(iovecs.len())
                .ok()
                .and_then(|n| next.checked_add(n))
                .filter(|&end| end <= self.slots)
            else {
                drop(next);
                self.warn_once(&io::Error::other(format!(
                    "registered-buffer table full ({} slots)",
                    self.slots
                )));
                return false;
            };
            std::mem::replace(&mut *next, end)
        };
        // SAFETY: the caller promises the range stays valid for the ring's
        // life, which is what the kernel needs of registered buffers.
        let registration = unsafe { Registration::buffers(first, iovecs.clone()) };
        if let Err(e) = apply(registration) {
            let mut next = self.next.lock();
            // Give the slots back unless a later registration took slots
            // after them (then they stay unused: the table has plenty).
            if *next == first + iovecs.len() as u32 {
                *next = first;
            }
            drop(next);
            self.warn_once(&e);
            return false;
        }
        let mut pieces = self.pieces.write();
        for (i, iov) in iovecs.iter().enumerate() {
            let start = iov.iov_base as usize;
            pieces.push(Piece {
                start,
                end: start + iov.iov_len,
                // Slots are < TABLE_SLOTS <= u16::MAX + 1.
                index: (first as usize + i) as u16,
            });
        }
        pieces.sort_unstable_by_key(|p| p.start);
        true
    }

    fn warn_once(&self, e: &io::Error) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                error = %e,
                "io_uring: cannot register buffers (raise RLIMIT_MEMLOCK or grant CAP_IPC_LOCK); using plain I/O"
            );
        }
    }

    /// Runs `f` with a lookup function, taking the lock once for many ops.
    pub(crate) fn with_lookup<R>(
        &self,
        f: impl FnOnce(&dyn Fn(*mut u8, usize) -> Option<u16>) -> R,
    ) -> R {
        let pieces = self.pieces.read();
        if pieces.is_empty() {
            return f(&|_, _| None);
        }
        f(&|buf, len| find(&pieces, buf as usize, len))
    }
}

/// The index of the piece holding all of `[start, start + len)`.
fn find(pieces: &[Piece], start: usize, len: usize) -> Option<u16> {
    let end = start.checked_add(len)?;
    // The last piece starting at or before `start` is the only candidate:
    // pieces never overlap (registered memory ranges are distinct mappings).
    let i = pieces
        .partition_point(|p| p.start <= start)
        .checked_sub(1)?;
    let p = pieces[i];
    (end <= p.end).then_some(p.index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_inside_only() {
        let pieces = [
            Piece {
                start: 1000,
                end: 2000,
                index: 0,
            },
            Piece {
                start: 2000,
                end: 3000,
                index: 1,
            },
            Piece {
                start: 5000,
                end: 6000,
                index: 2,
            },
        ];
        assert_eq!(find(&pieces, 1000, 1000), Some(0));
        assert_eq!(find(&pieces, 1500, 100), Some(0));
        assert_eq!(find(&pieces, 1500, 1000), None, "straddles two pieces");
        assert_eq!(find(&pieces, 2000, 10), Some(1));
        assert_eq!(find(&pieces, 999, 1), None);
        assert_eq!(find(&pieces, 3000, 1), None);
        assert_eq!(find(&pieces, 5999, 1), Some(2));
        assert_eq!(find(&pieces, 5999, 2), None);
        assert_eq!(find(&[], 5, 1), None);
    }
}
