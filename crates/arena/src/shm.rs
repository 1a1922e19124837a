//! The shared-memory file as every process finds and maps it: its name in
//! `/dev/shm`, opening an arena that exists, and the shared mapping.
//! Creating, owning and removing the file is the owner's (`kvtier-mem`).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use rustix::mm::{Advice, MapFlags, MprotectFlags, ProtFlags};

use crate::error::{MemError, Result};
use crate::layout::PAGE_BYTES;

/// Where shared-memory files live.
pub const SHM_DIR: &str = "/dev/shm";

/// `/dev/shm/<name>`, after checking that `name` names a plain file there.
pub fn shm_path(name: &str) -> Result<PathBuf> {
    let invalid = |reason| MemError::InvalidName {
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() {
        return Err(invalid("empty"));
    }
    if name.len() > 255 {
        return Err(invalid("longer than 255 bytes"));
    }
    if name.contains('/') || name.contains('\0') {
        return Err(invalid("contains '/' or NUL"));
    }
    if name == "." || name == ".." {
        return Err(invalid("is '.' or '..'"));
    }
    Ok(Path::new(SHM_DIR).join(name))
}

/// The [`MemError::Io`] of system call `op` on the file at `path`.
pub fn io_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(io::Error) -> MemError + 'a {
    move |source| MemError::Io {
        path: path.to_owned(),
        op,
        source,
    }
}

/// Opens an existing arena file, for reading and also writing if
/// `writable`; returns it with its length.
pub fn open_existing(path: &Path, writable: bool) -> Result<(File, u64)> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(writable)
        .open(path)
        .map_err(io_err(path, "open"))?;
    let len = file.metadata().map_err(io_err(path, "fstat"))?.len();
    Ok((file, len))
}

/// A shared mapping of a whole file. Unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Mapping is a plain address range; all access to it goes through
// raw pointers whose users synchronise (the seqlock, the tier's lock).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `file` shared, read-write if `writable`, at an
    /// address aligned to `align` (a power of two, at least the page size),
    /// with its page tables populated up front if `populate`.
    pub fn map(
        file: &File,
        len: usize,
        writable: bool,
        align: usize,
        populate: bool,
    ) -> io::Result<Self> {
        let prot = if writable {
            ProtFlags::READ | ProtFlags::WRITE
        } else {
            ProtFlags::READ
        };
        let mut flags = MapFlags::SHARED;
        if populate {
            flags |= MapFlags::POPULATE;
        }
        if align <= PAGE_BYTES {
            // SAFETY: a fresh mapping chosen by the kernel (null hint) aliases
            // no Rust object.
            let p = unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, prot, flags, file, 0)? };
            return Self::from_raw(p, len);
        }
        // Reserve `len + align` of address space, place the file mapping at
        // the aligned address inside it, and give back the rest.
        let span = len
            .checked_add(align)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: as above; PROT_NONE and never accessed.
        let reserve = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                span,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )?
        };
        let start = reserve as usize;
        let aligned = start.next_multiple_of(align);
        // SAFETY: [aligned, aligned + len) lies inside our reservation, which
        // nothing else uses; MAP_FIXED replaces exactly that range.
        let mapped = unsafe {
            rustix::mm::mmap(
                aligned as *mut _,
                len,
                prot,
                flags | MapFlags::FIXED,
                file,
                0,
            )
        };
        let head = aligned - start;
        let tail = span - head - len;
        // SAFETY: the head and tail ranges belong to our reservation and hold
        // no objects; on failure the whole reservation is ours to drop.
        unsafe {
            match mapped {
                Err(e) => {
                    let _ = rustix::mm::munmap(reserve, span);
                    return Err(e.into());
                }
                Ok(_) => {
                    if head > 0 {
                        let _ = rustix::mm::munmap(reserve, head);
                    }
                    if tail > 0 {
                        let _ = rustix::mm::munmap((aligned + len) as *mut _, tail);
                    }
                }
            }
        }
        Self::from_raw(aligned as *mut _, len)
    }

    fn from_raw(p: *mut std::ffi::c_void, len: usize) -> io::Result<Self> {
        let ptr =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { ptr, len })
    }

    /// Asks the kernel to back `[offset, offset + len)` with huge pages.
    pub fn advise_hugepages(&self, offset: usize, len: usize) -> io::Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        // SAFETY: the range lies inside our mapping; MADV_HUGEPAGE changes no
        // contents.
        unsafe {
            rustix::mm::madvise(
                self.ptr.as_ptr().add(offset).cast(),
                len,
                Advice::LinuxHugepage,
            )?
        };
        Ok(())
    }

    /// Makes `[0, len)` of the mapping read-only (`len` a multiple of the
    /// page size, at most the mapping's length).
    pub fn protect_prefix(&self, len: usize) -> io::Result<()> {
        if len > self.len || !len.is_multiple_of(PAGE_BYTES) {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        // SAFETY: the range is a page-aligned prefix of our own mapping;
        // nothing in this process writes it through a reference (only the
        // owner writes the header and table, from its own mapping).
        unsafe { rustix::mm::mprotect(self.ptr.as_ptr().cast(), len, MprotectFlags::READ)? };
        Ok(())
    }

    /// Start of the mapping.
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Length of the mapping.
    #[allow(clippy::len_without_is_empty)] // mmap maps no empty range
    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we mapped exactly this range and every user of it is gone
        // (its owners hold the Mapping for as long as they use the memory).
        unsafe {
            let _ = rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(shm_path("kvtier").is_ok());
        for bad in ["", "a/b", ".", "..", "x\0y"] {
            assert!(
                matches!(shm_path(bad), Err(MemError::InvalidName { .. })),
                "{bad:?}"
            );
        }
        assert!(shm_path(&"n".repeat(300)).is_err());
    }
}
