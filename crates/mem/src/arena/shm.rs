//! The shared-memory file and its mapping: naming, creation with stale-file
//! recovery, sizing, huge-page advice, and removal.
//!
//! Ownership is an advisory lock: the creating process holds
//! `flock(LOCK_EX)` on its descriptor for the arena's whole life, so a file
//! left behind by a crashed owner is recognised by the lock being free (the
//! kernel drops it with the process), not by guessing from a pid.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use rustix::fs::{FallocateFlags, FlockOperation};
use rustix::mm::{Advice, MapFlags, ProtFlags};

use super::PAGE_BYTES;
use super::header::MAGIC;
use crate::error::{MemError, Result};

/// Where shared-memory files live.
pub(crate) const SHM_DIR: &str = "/dev/shm";

/// `/dev/shm/<name>`, after checking that `name` names a plain file there.
pub(crate) fn shm_path(name: &str) -> Result<PathBuf> {
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

fn io_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(io::Error) -> MemError + 'a {
    move |source| MemError::Io {
        path: path.to_owned(),
        op,
        source,
    }
}

/// The owner's shared-memory file: created by us, locked by us, unlinked by
/// us when dropped (if the name still refers to our file).
#[derive(Debug)]
pub(crate) struct OwnedShm {
    path: PathBuf,
    file: File,
    dev: u64,
    ino: u64,
}

impl OwnedShm {
    /// Creates `path` with `len` bytes reserved (not sparse: `/dev/shm`
    /// running out shows up here as [`MemError::ShmFull`], not later as a
    /// `SIGBUS` on first touch). A stale arena of a dead owner under the same
    /// name is removed first; a live one, or a file that is not an arena, is
    /// an error.
    pub(crate) fn create(path: &Path, len: u64) -> Result<Self> {
        let file = match create_new(path) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                remove_stale(path)?;
                create_new(path)
            }
            other => other,
        }
        .map_err(io_err(path, "create"))?;
        let meta = file.metadata().map_err(io_err(path, "fstat"))?;
        // From here on, dropping `shm` unlinks the file.
        let shm = Self {
            path: path.to_owned(),
            file,
            dev: meta.dev(),
            ino: meta.ino(),
        };
        match rustix::fs::flock(&shm.file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(MemError::InUse {
                    path: path.to_owned(),
                });
            }
            Err(e) => return Err(io_err(path, "flock")(e.into())),
        }
        if !shm.name_is_ours() {
            // Another creator raced us for the name and replaced our file.
            return Err(MemError::InUse {
                path: path.to_owned(),
            });
        }
        shm.file.set_len(len).map_err(io_err(path, "ftruncate"))?;
        match rustix::fs::fallocate(&shm.file, FallocateFlags::empty(), 0, len) {
            Ok(()) => {}
            Err(rustix::io::Errno::NOSPC) => {
                return Err(MemError::ShmFull {
                    path: path.to_owned(),
                    bytes: len,
                });
            }
            // A file system without fallocate: pages come on first touch.
            Err(rustix::io::Errno::OPNOTSUPP) => {}
            Err(e) => return Err(io_err(path, "fallocate")(e.into())),
        }
        Ok(shm)
    }

    /// The file.
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether `path` still names the file we created.
    fn name_is_ours(&self) -> bool {
        std::fs::metadata(&self.path).is_ok_and(|m| m.dev() == self.dev && m.ino() == self.ino)
    }
}

impl Drop for OwnedShm {
    fn drop(&mut self) {
        // Never unlink a newer arena that took over the name.
        if self.name_is_ours()
            && let Err(e) = std::fs::remove_file(&self.path)
        {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the shared-memory arena");
        }
    }
}

fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        // Owner reads and writes; the group (engine processes run under a
        // shared group) reads. Others get nothing: KV blocks reveal prompts.
        .mode(0o640)
        .open(path)
}

/// Removes `path` if it is an arena whose owner is gone (its lock is free)
/// or an empty file (an owner that died before writing the header).
fn remove_stale(path: &Path) -> Result<()> {
    let file = match File::open(path) {
        Ok(f) => f,
        // Gone in the meantime: nothing to remove.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(path, "open existing")(e)),
    };
    match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            return Err(MemError::InUse {
                path: path.to_owned(),
            });
        }
        Err(e) => return Err(io_err(path, "flock")(e.into())),
    }
    let mut magic = [0u8; 8];
    let n = file.read_at(&mut magic, 0).map_err(io_err(path, "read"))?;
    let len = file.metadata().map_err(io_err(path, "fstat"))?.len();
    if len != 0 && (n < magic.len() || magic != MAGIC) {
        return Err(MemError::NotAnArena {
            path: path.to_owned(),
        });
    }
    tracing::warn!(path = %path.display(), "removing a stale memory arena left by a process that is gone");
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(path, "unlink stale")(e)),
        _ => Ok(()),
    }
}

/// Opens an existing arena file for reading; returns it with its length.
pub(crate) fn open_read_only(path: &Path) -> Result<(File, u64)> {
    let file = File::open(path).map_err(io_err(path, "open"))?;
    let len = file.metadata().map_err(io_err(path, "fstat"))?.len();
    Ok((file, len))
}

/// Why transparent huge pages cannot back the arena in `/dev/shm`, or
/// `None` when they can: `shmem_enabled` is `force`, or the mount has
/// `huge=always` or `huge=within_size` (and `shmem_enabled` is not `deny`).
pub(crate) fn hugepages_unavailable() -> Option<String> {
    let global = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
        .unwrap_or_default();
    let selected = |text: &str| {
        text.split_whitespace()
            .find(|w| w.starts_with('['))
            .map(|w| w.trim_matches(['[', ']']).to_owned())
    };
    match selected(&global).as_deref() {
        Some("force") => return None,
        Some("deny") => return Some("shmem_enabled is [deny]".into()),
        None => return Some("the kernel has no transparent huge pages for shmem".into()),
        _ => {}
    }
    // For a tmpfs mount its `huge=` option decides.
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let option = mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_dev, dir, _fs, opts) = (f.next()?, f.next()?, f.next()?, f.next()?);
            (dir == SHM_DIR).then(|| opts.to_owned())
        })
        .next_back();
    let huge = option
        .as_deref()
        .and_then(|o| o.split(',').find_map(|kv| kv.strip_prefix("huge=")))
        .unwrap_or("never");
    match huge {
        "always" | "within_size" => None,
        // The arena is reserved with fallocate, which allocates through no
        // mapping and so never sees MADV_HUGEPAGE: under `advise` it would
        // get small pages anyway.
        "advise" => Some(format!(
            "{SHM_DIR} is mounted with huge=advise; the arena needs huge=within_size or huge=always"
        )),
        other => Some(format!("{SHM_DIR} is mounted with huge={other}")),
    }
}

/// A shared mapping of a whole file. Unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
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
    pub(crate) fn map(
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
    pub(crate) fn advise_hugepages(&self, offset: usize, len: usize) -> io::Result<()> {
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

    /// Start of the mapping.
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Length of the mapping.
    pub(crate) fn len(&self) -> usize {
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

    #[test]
    fn aligned_mapping_is_aligned_and_usable() {
        let path = Path::new(SHM_DIR).join(format!("kvtier-mem-unit-map-{}", std::process::id()));
        let shm = OwnedShm::create(&path, 3 << 20).unwrap();
        let m = Mapping::map(shm.file(), 3 << 20, true, 2 << 20, false).unwrap();
        assert_eq!(m.ptr().as_ptr() as usize % (2 << 20), 0);
        // SAFETY: the mapping is ours, writable and 3 MiB long.
        unsafe { m.ptr().as_ptr().add((3 << 20) - 1).write(9) };
        drop(m);
        let p = shm.path().to_owned();
        drop(shm);
        assert!(!p.exists());
    }

    #[test]
    fn stale_and_foreign_files() {
        let path = Path::new(SHM_DIR).join(format!("kvtier-mem-unit-stale-{}", std::process::id()));
        // Foreign content: refused and left alone.
        std::fs::write(&path, b"not an arena at all").unwrap();
        assert!(matches!(
            OwnedShm::create(&path, 4096),
            Err(MemError::NotAnArena { .. })
        ));
        // An arena whose owner is gone (no lock held): replaced.
        std::fs::write(&path, MAGIC).unwrap();
        let shm = OwnedShm::create(&path, 4096).unwrap();
        // A live owner: refused.
        assert!(matches!(
            OwnedShm::create(&path, 4096),
            Err(MemError::InUse { .. })
        ));
        drop(shm);
        assert!(!path.exists());
    }
}
