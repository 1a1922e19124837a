//! The shared-memory file and its mapping: naming, creation with stale-file
//! recovery, sizing, huge-page advice, and removal.
//!
//! Ownership is an advisory lock: the creating process holds
//! `flock(LOCK_EX)` on its descriptor for the arena's whole life, so a file
//! left behind by a crashed owner is recognised by the lock being free (the
//! kernel drops it with the process), not by guessing from a pid.
//!
//! An arena is made unnamed ([`PendingShm`], `O_TMPFILE`) and only linked
//! under its name once its header is written, so the name never points at a
//! half-made arena, whenever the creator dies.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use kvtier_arena::header::{self, ENCODED_BYTES, MAGIC};
use kvtier_arena::layout::{ArenaLayout, HEADER_BYTES};
use kvtier_arena::shm::{SHM_DIR, io_err};
use kvtier_arena::{MemError, Result};
use rustix::fs::{AtFlags, FallocateFlags, FlockOperation, Mode, OFlags};

/// How many times [`PendingShm::publish`] clears a stale file off the name
/// and tries again before concluding that other creators keep taking it.
const PUBLISH_TRIES: usize = 4;

/// An arena being made: an anonymous file (`O_TMPFILE`) in the directory of
/// `path`, locked, sized and reserved, that no name points at yet. Until
/// [`publish`](Self::publish) no reader can open it, and a creator killed at
/// any moment before then leaves nothing behind: the kernel frees an
/// unnamed file with its last descriptor.
#[derive(Debug)]
pub(crate) struct PendingShm {
    path: PathBuf,
    file: File,
}

impl PendingShm {
    /// Makes the anonymous file for `path` with `len` bytes reserved (not
    /// sparse: `/dev/shm` running out shows up here as
    /// [`MemError::ShmFull`], not later as a `SIGBUS` on first touch).
    ///
    /// The file is mode 0600, or 0660 with group `access_group` when one is
    /// given (see [`create_anonymous`]).
    ///
    /// A stale file at `path` (see [`remove_stale`]) is removed first; a live
    /// owner ([`MemError::InUse`]) or foreign content
    /// ([`MemError::NotAnArena`]) is refused before any memory is reserved.
    pub(crate) fn create(path: &Path, len: u64, access_group: Option<u32>) -> Result<Self> {
        remove_stale(path)?;
        let dir = path.parent().unwrap_or(Path::new(SHM_DIR));
        let file =
            create_anonymous(dir, access_group).map_err(io_err(path, "create (O_TMPFILE)"))?;
        // Locked before it can have a name: a published arena's lock is held
        // from its first instant, so "lock free" always means "owner gone".
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(e) => return Err(io_err(path, "flock")(e.into())),
        }
        file.set_len(len).map_err(io_err(path, "ftruncate"))?;
        match rustix::fs::fallocate(&file, FallocateFlags::empty(), 0, len) {
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
        Ok(Self {
            path: path.to_owned(),
            file,
        })
    }

    /// The file, to map and initialise before publishing.
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// Gives the finished arena its name, atomically and without replacing
    /// anything: `link(2)` fails if the name exists. A stale file that
    /// appeared there meanwhile is removed and the link tried again; a live
    /// owner or foreign content is refused as in [`create`](Self::create).
    pub(crate) fn publish(self) -> Result<OwnedShm> {
        let path = self.path;
        for _ in 0..PUBLISH_TRIES {
            match link_anonymous(&self.file, &path) {
                Ok(()) => {
                    let meta = self.file.metadata().map_err(io_err(&path, "fstat"))?;
                    return Ok(OwnedShm {
                        path,
                        _file: self.file,
                        dev: meta.dev(),
                        ino: meta.ino(),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => remove_stale(&path)?,
                Err(e) => return Err(io_err(&path, "link")(e)),
            }
        }
        // Other creators keep publishing under this name between our tries.
        Err(MemError::InUse { path })
    }
}

/// The owner's published shared-memory file: made by us, locked by us,
/// unlinked by us when dropped (if the name still refers to our file).
#[derive(Debug)]
pub(crate) struct OwnedShm {
    path: PathBuf,
    /// Holds the ownership lock for the arena's life.
    _file: File,
    dev: u64,
    ino: u64,
}

impl OwnedShm {
    /// Takes over the arena a dead owner left at `path`, if this owner may
    /// keep it: a regular file of this user that others cannot open, whose
    /// lock is free (the owner is gone) and whose header is complete, of
    /// this format version and of exactly `layout`. Returns it locked by
    /// us, name and contents untouched (the caller vets the slot table).
    ///
    /// `Ok(None)`: nothing there, or a file not to keep (another layout or
    /// version, a damaged or unfinished header, someone else's file);
    /// creation then judges it as before (replaces it or refuses it). A
    /// live owner is [`MemError::InUse`]. A kept file gets the mode and
    /// group a new arena would get (`access_group`), whatever its old ones.
    pub(crate) fn adopt(
        path: &Path,
        layout: &ArenaLayout,
        access_group: Option<u32>,
    ) -> Result<Option<Self>> {
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            // A link planted at the name is not our arena.
            .custom_flags(OFlags::NOFOLLOW.bits() as i32)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                tracing::info!(path = %path.display(), error = %e, "cannot open the file at the arena's name to adopt it");
                return Ok(None);
            }
        };
        // Replaced since we opened it: creation judges the new one.
        let Some(meta) = lock_if_current(&file, path)? else {
            return Ok(None);
        };
        if let Some(why) = not_ours_to_keep(&meta) {
            tracing::warn!(path = %path.display(), reason = why, "not adopting the arena left at the name");
            return Ok(None);
        }
        let mut head = [0u8; ENCODED_BYTES];
        let n = file
            .read_at(&mut head, 0)
            .map_err(io_err(path, "read header"))?;
        let why = match header::decode(&head[..n], meta.len(), path) {
            Ok(d) if d.layout == *layout && meta.len() == layout.file_bytes as u64 => {
                set_access(&file, access_group).map_err(io_err(path, "set the mode of"))?;
                return Ok(Some(Self {
                    path: path.to_owned(),
                    _file: file,
                    dev: meta.dev(),
                    ino: meta.ino(),
                }));
            }
            Ok(d) => format!(
                "its layout differs ({} slots of {} bytes for blocks of {} in layers of {}, pages of {}; now {} of {} for {} in {}, pages of {})",
                d.layout.slot_count,
                d.layout.slot_bytes,
                d.layout.block_bytes,
                d.layout.layer_bytes,
                d.layout.page_bytes,
                layout.slot_count,
                layout.slot_bytes,
                layout.block_bytes,
                layout.layer_bytes,
                layout.page_bytes,
            ),
            Err(e) => e.to_string(),
        };
        tracing::warn!(path = %path.display(), reason = %why, "the arena a dead owner left cannot be adopted; replacing it");
        Ok(None)
    }

    /// The file (to map it).
    pub(crate) fn file(&self) -> &File {
        &self._file
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

impl OwnedShm {
    /// Removes the file's name if it still names our file (never a newer
    /// arena that took the name over); mappings of it stay valid. A second
    /// call finds the name gone and does nothing.
    pub(crate) fn unlink(&self) {
        if self.name_is_ours()
            && let Err(e) = std::fs::remove_file(&self.path)
        {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the shared-memory arena");
        }
    }
}

impl Drop for OwnedShm {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// Why a file at the arena's name must not be adopted even if it holds an
/// arena: someone else's file (its owner could read or change it at any
/// time), or one others may open. Such a file is left to creation, which
/// replaces it (or fails to remove it, and says so).
fn not_ours_to_keep(meta: &std::fs::Metadata) -> Option<&'static str> {
    if !meta.file_type().is_file() {
        return Some("not a regular file");
    }
    if meta.uid() != rustix::process::geteuid().as_raw() {
        return Some("owned by another user");
    }
    if meta.mode() & 0o007 != 0 {
        return Some("others may open it");
    }
    None
}

/// An unnamed file in `dir` (`O_TMPFILE`): mode 0600, or 0660 owned by
/// group `access_group` when one is given.
fn create_anonymous(dir: &Path, access_group: Option<u32>) -> io::Result<File> {
    // KV blocks reveal prompts: only the owner's user reads them, unless
    // the operator names a group of engine processes that run as other
    // users and fill the slots the daemon reserves for them in place
    // (`ArenaClient`). Others never get anything.
    let mode = Mode::from_raw_mode(if access_group.is_some() { 0o660 } else { 0o600 });
    let fd = rustix::fs::open(dir, OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC, mode)?;
    let file = File::from(fd);
    // Before the file has a name: no process of the group can open it
    // before its group and mode are final.
    set_access(&file, access_group)?;
    Ok(file)
}

/// Gives the arena file its mode and group: 0600, or 0660 owned by group
/// `access_group`. Explicit, because the mode given to `open` is filtered
/// by the umask (022 typically takes the group's write away) and an
/// adopted file keeps whatever an earlier configuration gave it.
fn set_access(file: &File, access_group: Option<u32>) -> io::Result<()> {
    // Private first, so a change of group never opens the file to the
    // new group under the old mode's bits for a moment.
    rustix::fs::fchmod(file, Mode::from_raw_mode(0o600))?;
    if let Some(gid) = access_group {
        rustix::fs::fchown(file, None, Some(rustix::fs::Gid::from_raw(gid)))?;
        rustix::fs::fchmod(file, Mode::from_raw_mode(0o660))?;
    }
    Ok(())
}

/// Links the unnamed `file` at `path`; fails with `AlreadyExists` if the
/// name is taken (link never replaces).
fn link_anonymous(file: &File, path: &Path) -> io::Result<()> {
    let cwd = rustix::fs::CWD;
    // Through /proc needs no privilege; linking the descriptor itself
    // (AT_EMPTY_PATH) needs CAP_DAC_READ_SEARCH, so it is only the fallback
    // for a system without /proc.
    let proc_fd = format!("/proc/self/fd/{}", file.as_raw_fd());
    match rustix::fs::linkat(cwd, proc_fd.as_str(), cwd, path, AtFlags::SYMLINK_FOLLOW) {
        Err(rustix::io::Errno::NOENT) if !Path::new("/proc/self/fd").exists() => {
            rustix::fs::linkat(file, "", cwd, path, AtFlags::EMPTY_PATH)
        }
        other => other,
    }
    .map_err(Into::into)
}

/// Takes the lock of `file`, opened at `path`, without waiting; its
/// metadata, or `None` when `path` names another file by now (replaced
/// since it was opened).
///
/// # Errors
/// [`MemError::InUse`] when a live owner holds the lock.
fn lock_if_current(file: &File, path: &Path) -> Result<Option<std::fs::Metadata>> {
    match rustix::fs::flock(file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            return Err(MemError::InUse {
                path: path.to_owned(),
            });
        }
        Err(e) => return Err(io_err(path, "flock")(e.into())),
    }
    let meta = file.metadata().map_err(io_err(path, "fstat"))?;
    let current =
        std::fs::metadata(path).is_ok_and(|m| m.dev() == meta.dev() && m.ino() == meta.ino());
    Ok(current.then_some(meta))
}

/// Removes the file at `path` if its owner is gone (its lock is free) and
/// its content is a kvtier arena or what a creator killed before finishing
/// the header leaves (see [`is_arena_or_unfinished`]). Nothing there is
/// fine; a held lock is [`MemError::InUse`]; anything else is foreign,
/// [`MemError::NotAnArena`], and left alone.
fn remove_stale(path: &Path) -> Result<()> {
    let file = match File::open(path) {
        Ok(f) => f,
        // Gone in the meantime: nothing to remove.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(path, "open existing")(e)),
    };
    // Another process removed it and published its own since we opened it:
    // that one is not ours to judge (the caller's next link attempt will).
    let Some(meta) = lock_if_current(&file, path)? else {
        return Ok(());
    };
    let mut head = vec![0u8; HEADER_BYTES.min(usize::try_from(meta.len()).unwrap_or(HEADER_BYTES))];
    file.read_exact_at(&mut head, 0)
        .map_err(io_err(path, "read"))?;
    if !is_arena_or_unfinished(&head) {
        return Err(MemError::NotAnArena {
            path: path.to_owned(),
        });
    }
    tracing::warn!(path = %path.display(), bytes = meta.len(), "removing a stale memory arena left by a process that is gone");
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(path, "unlink stale")(e)),
        _ => Ok(()),
    }
}

/// Whether `head`, the first bytes (up to [`HEADER_BYTES`]) of a file, is
/// the header area of a kvtier arena, complete or not: its first 8 bytes
/// are the magic, or each is either 0 or the magic's byte there (a header
/// being copied in, in any order), and nothing past the encoded header
/// fields is non-zero. Older builds named the file before writing its
/// header, so a creator killed early left zeros or part of a header; an
/// empty file is the limit case. Other content is not ours to remove.
fn is_arena_or_unfinished(head: &[u8]) -> bool {
    let magic_so_far = head.iter().zip(MAGIC).all(|(&b, m)| b == 0 || b == m);
    let rest_zero = head.iter().skip(ENCODED_BYTES).all(|&b| b == 0);
    magic_so_far && rest_zero
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

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_arena::layout::PAGE_BYTES;
    use kvtier_arena::shm::Mapping;

    /// A `/dev/shm` path unique to this test process and `what`.
    fn test_path(what: &str) -> PathBuf {
        Path::new(SHM_DIR).join(format!("kvtier-mem-unit-{what}-{}", std::process::id()))
    }

    fn create_published(path: &Path, len: u64) -> Result<OwnedShm> {
        PendingShm::create(path, len, None)?.publish()
    }

    #[test]
    fn aligned_mapping_is_aligned_and_usable() {
        let path = test_path("map");
        let shm = create_published(&path, 3 << 20).unwrap();
        let m = Mapping::map(&shm._file, 3 << 20, true, 2 << 20, false).unwrap();
        assert_eq!(m.ptr().as_ptr() as usize % (2 << 20), 0);
        // SAFETY: the mapping is ours, writable and 3 MiB long.
        unsafe { m.ptr().as_ptr().add((3 << 20) - 1).write(9) };
        drop(m);
        let p = shm.path().to_owned();
        drop(shm);
        assert!(!p.exists());
    }

    /// Leaves `content` at `path` as a dead process would: no lock held.
    fn leave_file(path: &Path, content: &[u8], len: u64) {
        std::fs::write(path, content).unwrap();
        File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(len)
            .unwrap();
    }

    /// Whether creating at `path` replaced the file there: our new arena
    /// holds the name and is locked.
    fn replaced_by_new_arena(path: &Path) {
        let before = std::fs::metadata(path).unwrap().ino();
        let shm = create_published(path, 8192).unwrap();
        let after = std::fs::metadata(path).unwrap();
        assert_ne!(after.ino(), before, "the old file is still at the name");
        assert_eq!(after.len(), 8192);
        drop(shm);
        assert!(!path.exists());
    }

    #[test]
    fn zeroed_header_of_a_dead_creator_is_replaced() {
        // What a creator killed between sizing the file and writing its
        // header left (older builds named the file first).
        let path = test_path("zeroed");
        leave_file(&path, &[], 1 << 20);
        replaced_by_new_arena(&path);
        // And an empty one (killed before sizing).
        leave_file(&path, &[], 0);
        replaced_by_new_arena(&path);
    }

    #[test]
    fn partial_header_of_a_dead_creator_is_replaced() {
        let path = test_path("partial");
        // The first bytes of the magic, the rest not written yet.
        leave_file(&path, &MAGIC[..3], 1 << 20);
        replaced_by_new_arena(&path);
        // A header copied in from the end: fields present, magic not yet.
        let layout = ArenaLayout::compute(8192, 4096, 1 << 20, PAGE_BYTES).unwrap();
        let mut torn = header::encode(&layout, 7);
        torn[..16].fill(0);
        leave_file(&path, &torn, layout.file_bytes as u64);
        replaced_by_new_arena(&path);
        // A whole arena of a dead owner.
        leave_file(&path, &header::encode(&layout, 7), 1 << 20);
        replaced_by_new_arena(&path);
    }

    #[test]
    fn an_unpublished_arena_has_no_name_and_leaves_nothing() {
        let path = test_path("pending");
        let pending = PendingShm::create(&path, 1 << 20, None).unwrap();
        pending.file().write_all_at(&MAGIC, 0).unwrap();
        // Sized, reserved, locked and being written: still invisible, so no
        // reader can open it and no restart can trip over it.
        assert!(!path.exists(), "a half-made arena has a name");
        // Its creator dies (the descriptor goes): nothing to sweep, and the
        // name is free for the next creator.
        drop(pending);
        assert!(!path.exists());
        let shm = create_published(&path, 4096).unwrap();
        assert!(path.exists());
        drop(shm);
    }

    #[test]
    fn live_owner_is_refused_and_untouched() {
        let path = test_path("live");
        let owner = create_published(&path, 4096).unwrap();
        let ino = std::fs::metadata(&path).unwrap().ino();
        assert!(matches!(
            PendingShm::create(&path, 4096, None),
            Err(MemError::InUse { .. })
        ));
        // A creator that got past the first check while the name was free
        // still cannot publish over the live owner.
        drop(owner);
        let late = PendingShm::create(&path, 4096, None).unwrap();
        let owner = create_published(&path, 4096).unwrap();
        let ino2 = std::fs::metadata(&path).unwrap().ino();
        assert_ne!(ino, ino2);
        assert!(matches!(late.publish(), Err(MemError::InUse { .. })));
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), ino2);
        drop(owner);
        assert!(!path.exists());
    }

    #[test]
    fn foreign_content_is_refused_and_untouched() {
        let path = test_path("foreign");
        let cases: [&[u8]; 3] = [
            b"not an arena at all",
            // Looks like the start of a magic, then a foreign byte in it.
            b"KVTIx",
            // A plausible start, but bytes where an arena has only zeros.
            &[[0u8; 200].as_slice(), b"payload"].concat(),
        ];
        for content in cases {
            std::fs::write(&path, content).unwrap();
            assert!(
                matches!(
                    PendingShm::create(&path, 4096, None),
                    Err(MemError::NotAnArena { .. })
                ),
                "{content:?}"
            );
            assert_eq!(std::fs::read(&path).unwrap(), content);
        }
        std::fs::remove_file(&path).unwrap();
    }
}
