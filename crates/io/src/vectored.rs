//! The segment lists of vectored operations ([`IoKind::ReadV`],
//! [`IoKind::WriteV`]): their checks, and the list arithmetic the engines
//! share (cutting a list short, finding a byte, resuming after a short
//! transfer).

use thiserror::Error;

use crate::{DioAlignment, IoBatch, IoKind, IoOp};

/// Why [`IoBatch::push_vectored`] refused an operation (inside
/// [`IoError::InvalidVectored`](crate::IoError::InvalidVectored)).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum VectoredError {
    /// The kind is not [`IoKind::ReadV`] or [`IoKind::WriteV`].
    #[error("not a vectored kind")]
    NotVectored,
    /// No segments, or segments of 0 bytes in all: nothing to transfer.
    #[error("no bytes to transfer")]
    Empty,
    /// More segments than [`IoBatch::MAX_SEGMENTS`] (`IOV_MAX`); counting
    /// stops at the first one too many.
    #[error("more than {max} segments")]
    TooManySegments {
        /// [`IoBatch::MAX_SEGMENTS`].
        max: usize,
    },
    /// The segments add up to more than [`IoBatch::MAX_VECTORED_LEN`].
    #[error("{total} bytes, more than the {max} one operation may move")]
    TooLong {
        /// The sum of the lengths (saturating).
        total: u64,
        /// [`IoBatch::MAX_VECTORED_LEN`].
        max: u32,
    },
    /// The file offset is not a multiple of the direct-I/O offset alignment.
    #[error("file offset not a multiple of {align} bytes (direct I/O)")]
    MisalignedOffset {
        /// [`DioAlignment::offset`].
        align: usize,
    },
    /// A segment's address is not a multiple of the direct-I/O memory
    /// alignment, or its length of the offset alignment.
    #[error(
        "segment {index} ({len} bytes at {addr:#x}) breaks direct-I/O alignment \
         (address to {mem}, length to {offset} bytes)"
    )]
    MisalignedSegment {
        /// Position of the segment in the list.
        index: usize,
        /// Its address.
        addr: usize,
        /// Its length.
        len: usize,
        /// [`DioAlignment::mem`].
        mem: usize,
        /// [`DioAlignment::offset`].
        offset: usize,
    },
}

/// The segments of one vectored op, as the kernel takes them. Owned by the
/// op's batch, boxed, and named by the op's `buf` (see [`IoOp`]).
#[derive(Debug)]
pub(crate) struct IoVecs {
    iov: Box<[libc::iovec]>,
    /// Sum of the lengths; fits `u32` by construction.
    total: u32,
}

// SAFETY: the list only describes memory; whoever reads or writes that
// memory does so under IoBatch::push_vectored's contract, on any thread.
unsafe impl Send for IoVecs {}
// SAFETY: as above; shared access never touches the described memory.
unsafe impl Sync for IoVecs {}

impl IoVecs {
    /// Builds and checks the list of a `kind` op at file `offset`.
    pub(crate) fn checked(
        kind: IoKind,
        offset: u64,
        segments: impl IntoIterator<Item = (*mut u8, usize)>,
        align: Option<DioAlignment>,
    ) -> Result<Self, VectoredError> {
        if !kind.is_vectored() {
            return Err(VectoredError::NotVectored);
        }
        if let Some(a) = align
            && !offset.is_multiple_of(a.offset as u64)
        {
            return Err(VectoredError::MisalignedOffset { align: a.offset });
        }
        let segments = segments.into_iter();
        // Sized up front: the list is boxed without a reallocation.
        let mut iov = Vec::with_capacity(segments.size_hint().0.min(IoBatch::MAX_SEGMENTS));
        let mut total = 0u64;
        for (index, (addr, len)) in segments.enumerate() {
            if index == IoBatch::MAX_SEGMENTS {
                return Err(VectoredError::TooManySegments {
                    max: IoBatch::MAX_SEGMENTS,
                });
            }
            check_segment(index, addr as usize, len, align)?;
            total = total.saturating_add(len as u64);
            iov.push(libc::iovec {
                iov_base: addr.cast(),
                iov_len: len,
            });
        }
        Self::with_total(iov, total)
    }

    /// Wraps `iov` whose lengths add up to `total`, refusing an empty or
    /// oversized transfer.
    fn with_total(iov: Vec<libc::iovec>, total: u64) -> Result<Self, VectoredError> {
        let max = IoBatch::MAX_VECTORED_LEN;
        if total == 0 {
            return Err(VectoredError::Empty);
        }
        if total > u64::from(max) {
            return Err(VectoredError::TooLong { total, max });
        }
        Ok(Self {
            iov: iov.into_boxed_slice(),
            total: total as u32,
        })
    }

    /// The segments.
    pub(crate) fn iov(&self) -> &[libc::iovec] {
        &self.iov
    }

    /// Bytes in all.
    pub(crate) fn total(&self) -> u32 {
        self.total
    }

    /// The first `len` bytes of the list (`0 < len <= total`): whole
    /// segments, then a shortened one, the rest dropped. `None` for 0.
    pub(crate) fn prefix(&self, len: u32) -> Option<Self> {
        let mut left = len.min(self.total) as usize;
        let mut iov = Vec::new();
        for seg in self.iov.iter() {
            if left == 0 {
                break;
            }
            let take = seg.iov_len.min(left);
            iov.push(libc::iovec {
                iov_base: seg.iov_base,
                iov_len: take,
            });
            left -= take;
        }
        Self::with_total(iov, u64::from(len.min(self.total))).ok()
    }
}

/// Checks one segment against the direct-I/O alignment.
fn check_segment(
    index: usize,
    addr: usize,
    len: usize,
    align: Option<DioAlignment>,
) -> Result<(), VectoredError> {
    match align {
        Some(a) if !addr.is_multiple_of(a.mem) || !len.is_multiple_of(a.offset) => {
            Err(VectoredError::MisalignedSegment {
                index,
                addr,
                len,
                mem: a.mem,
                offset: a.offset,
            })
        }
        _ => Ok(()),
    }
}

impl IoOp {
    /// The segment list of a vectored op; `None` for any other kind.
    ///
    /// # Safety
    /// The op was built by [`IoBatch::push_vectored`] (or copied from one)
    /// and the owners of its batch, where the list lives, are still alive
    /// for as long as the returned reference is used.
    pub(crate) unsafe fn vecs<'a>(&self) -> Option<&'a IoVecs> {
        if !self.kind.is_vectored() || self.buf.is_null() {
            return None;
        }
        // SAFETY: the caller's promise: `buf` is the address of a boxed
        // IoVecs that outlives 'a.
        Some(unsafe { &*self.buf.cast_const().cast::<IoVecs>() })
    }
}

/// The address of byte `at` of the bytes a vectored op moves, counting
/// through its segments in order; `None` past the end.
pub(crate) fn byte_at(iov: &[libc::iovec], at: usize) -> Option<*mut u8> {
    let mut skip = at;
    for seg in iov {
        if skip < seg.iov_len {
            // SAFETY: `skip < iov_len`, so the address is inside the segment.
            return Some(unsafe { seg.iov_base.cast::<u8>().add(skip) });
        }
        skip -= seg.iov_len;
    }
    None
}

/// Consumes `n` bytes from the front of `iov[first..]` after a transfer
/// moved them: whole segments are passed over, a partly moved one is
/// shortened from the front. Returns the index of the first segment with
/// bytes left (`iov.len()` when none are).
pub(crate) fn advance(iov: &mut [libc::iovec], mut first: usize, mut n: usize) -> usize {
    while let Some(seg) = iov.get_mut(first) {
        if n < seg.iov_len {
            // SAFETY: `n < iov_len`: the new start is inside the segment.
            seg.iov_base = unsafe { seg.iov_base.cast::<u8>().add(n) }.cast();
            seg.iov_len -= n;
            return first;
        }
        n -= seg.iov_len;
        first += 1;
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: DioAlignment = DioAlignment {
        mem: 4096,
        offset: 4096,
    };

    /// `lens` as segments laid end to end from address `base`.
    fn segments(base: usize, lens: &[usize]) -> Vec<(*mut u8, usize)> {
        let mut at = base;
        lens.iter()
            .map(|&len| {
                at += len;
                ((at - len) as *mut u8, len)
            })
            .collect()
    }

    #[test]
    fn checks_refuse_what_the_kernel_would() {
        let ok = |lens: &[usize], off| {
            IoVecs::checked(IoKind::ReadV, off, segments(1 << 20, lens), Some(A))
        };
        assert_eq!(ok(&[4096, 8192], 0).map(|v| v.total()), Ok(12288));
        assert_eq!(ok(&[], 0).err(), Some(VectoredError::Empty));
        assert_eq!(ok(&[0, 0], 0).err(), Some(VectoredError::Empty));
        assert_eq!(
            ok(&[4096], 512).err(),
            Some(VectoredError::MisalignedOffset { align: 4096 })
        );
        assert!(matches!(
            ok(&[4096, 512], 0),
            Err(VectoredError::MisalignedSegment {
                index: 1,
                len: 512,
                ..
            })
        ));
        let misplaced = IoVecs::checked(IoKind::WriteV, 0, [(0x1200 as *mut u8, 4096)], Some(A));
        assert!(matches!(
            misplaced,
            Err(VectoredError::MisalignedSegment {
                index: 0,
                addr: 0x1200,
                ..
            })
        ));
        // Without O_DIRECT anything goes.
        assert!(IoVecs::checked(IoKind::ReadV, 3, [(0x1201 as *mut u8, 7)], None).is_ok());
        let many = vec![4096; IoBatch::MAX_SEGMENTS + 1];
        assert_eq!(
            ok(&many, 0).err(),
            Some(VectoredError::TooManySegments { max: 1024 })
        );
        assert!(ok(&many[1..], 0).is_ok(), "exactly IOV_MAX is fine");
        let huge = [1 << 30, 1 << 30];
        assert!(
            matches!(ok(&huge, 0), Err(VectoredError::TooLong { total, .. }) if total == 1 << 31)
        );
        let not = IoVecs::checked(IoKind::Read, 0, segments(4096, &[4096]), Some(A));
        assert_eq!(not.err(), Some(VectoredError::NotVectored));
    }

    #[test]
    fn prefix_drops_and_cuts_the_tail() {
        let v = IoVecs::checked(IoKind::ReadV, 0, segments(4096, &[4096, 8192, 4096]), None)
            .expect("valid");
        let lens = |v: &IoVecs| v.iov().iter().map(|s| s.iov_len).collect::<Vec<_>>();
        let p = v.prefix(6144).expect("some");
        assert_eq!((lens(&p), p.total()), (vec![4096, 2048], 6144));
        assert_eq!(p.iov()[1].iov_base, v.iov()[1].iov_base);
        assert_eq!(lens(&v.prefix(4096).expect("some")), vec![4096]);
        assert_eq!(
            lens(&v.prefix(1 << 20).expect("all")),
            vec![4096, 8192, 4096]
        );
        assert!(v.prefix(0).is_none());
    }

    #[test]
    fn byte_at_and_advance_walk_segments_in_order() {
        let v =
            IoVecs::checked(IoKind::ReadV, 0, segments(4096, &[100, 0, 50]), None).expect("valid");
        assert_eq!(byte_at(v.iov(), 0), Some(4096 as *mut u8));
        assert_eq!(byte_at(v.iov(), 99), Some(4195 as *mut u8));
        assert_eq!(
            byte_at(v.iov(), 100),
            Some(4196 as *mut u8),
            "the empty one is skipped"
        );
        assert_eq!(byte_at(v.iov(), 150), None);
        let mut iov = v.iov().to_vec();
        assert_eq!(advance(&mut iov, 0, 30), 0);
        assert_eq!((iov[0].iov_base as usize, iov[0].iov_len), (4126, 70));
        assert_eq!(
            advance(&mut iov, 0, 80),
            2,
            "past the rest and the empty one"
        );
        assert_eq!((iov[2].iov_base as usize, iov[2].iov_len), (4206, 40));
        assert_eq!(advance(&mut iov, 2, 40), 3);
    }
}
