//! [`AlignedBuf`]: an owned, zero-initialised, aligned heap buffer.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// An owned heap buffer whose start is aligned to `align` bytes, as direct
/// I/O needs. Zero-initialised. Its address never changes, even when the
/// `AlignedBuf` value moves, so it can be the target of in-flight I/O.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    align: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8], like Box<[u8]>.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes aligned to `align` (a power of two).
    ///
    /// # Panics
    /// If `align` is not a power of two, or the allocation fails.
    pub fn zeroed(len: usize, align: usize) -> Self {
        assert!(align.is_power_of_two(), "alignment must be a power of two");
        if len == 0 {
            // A dangling but aligned pointer; never dereferenced for len 0.
            let ptr = NonNull::new(align as *mut u8).unwrap_or(NonNull::dangling());
            return Self { ptr, len, align };
        }
        let layout = Layout::from_size_align(len, align).expect("valid layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        Self { ptr, len, align }
    }

    /// Bytes of a transparent huge page on x86-64 and the alignment of
    /// [`zeroed_huge`](Self::zeroed_huge) buffers.
    pub const HUGE_PAGE: usize = 2 << 20;

    /// A zeroed buffer of `len` bytes rounded up to whole huge pages,
    /// aligned to [`HUGE_PAGE`](Self::HUGE_PAGE) and advised as huge-page
    /// memory (`MADV_HUGEPAGE`) before its first touch, so the kernel backs
    /// it with transparent huge pages when it has them (`enabled` is
    /// `always` or `madvise`).
    ///
    /// Why: direct I/O maps memory page by page, and a device transfer
    /// takes one segment per physically contiguous run. On 4 KiB pages a
    /// 1 MiB read is 256 segments, more than a virtio disk takes in one
    /// request (`max_segments`, 254 here), and its host pays per segment;
    /// huge-page memory is one segment per 2 MiB (see
    /// docs/benchmarks.md, "Huge pages").
    ///
    /// # Panics
    /// If the allocation fails.
    pub fn zeroed_huge(len: usize) -> Self {
        let len = len.max(1).div_ceil(Self::HUGE_PAGE) * Self::HUGE_PAGE;
        let layout = Layout::from_size_align(len, Self::HUGE_PAGE).expect("valid layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc::alloc(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        // Advice before the first touch: pages faulted in afterwards come
        // as huge pages. Refused advice (no THP in this kernel) only costs
        // the speed-up.
        // SAFETY: the range is this fresh allocation.
        unsafe { libc::madvise(raw.cast(), len, libc::MADV_HUGEPAGE) };
        // SAFETY: valid for `len` bytes; zeroing is the first touch.
        unsafe { std::ptr::write_bytes(raw, 0, len) };
        Self {
            ptr,
            len,
            align: Self::HUGE_PAGE,
        }
    }

    /// The buffer's alignment.
    pub fn align(&self) -> usize {
        self.align
    }

    /// Start address (stable for the buffer's life).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Start address for reading.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes (zeroed at creation).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and we hold &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: allocated in `zeroed` with this exact layout.
            unsafe {
                alloc::dealloc(
                    self.ptr.as_ptr(),
                    Layout::from_size_align_unchecked(self.len, self.align),
                )
            }
        }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("align", &self.align)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for align in [512, 4096, 1 << 21] {
            let b = AlignedBuf::zeroed(8192, align);
            assert_eq!(b.as_ptr() as usize % align, 0);
            assert!(b.iter().all(|&x| x == 0));
        }
        let e = AlignedBuf::zeroed(0, 4096);
        assert!(e.is_empty());
    }

    #[test]
    fn huge_buffers_are_whole_aligned_huge_pages_of_zeros() {
        for len in [1, 4096, AlignedBuf::HUGE_PAGE, AlignedBuf::HUGE_PAGE + 1] {
            let b = AlignedBuf::zeroed_huge(len);
            assert_eq!(b.as_ptr() as usize % AlignedBuf::HUGE_PAGE, 0);
            assert_eq!(b.len() % AlignedBuf::HUGE_PAGE, 0);
            assert!(b.len() >= len);
            assert!(b.iter().all(|&x| x == 0));
        }
    }
}
