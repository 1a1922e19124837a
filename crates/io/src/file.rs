//! Opening files for direct I/O, asking the file system what alignment
//! direct I/O needs there, and keeping the files and directories made for
//! them private to their owner's user.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use rustix::fs::{AtFlags, CWD, FallocateFlags, StatxFlags};

use crate::{IoError, Result};

/// The alignment direct I/O needs on a file system: buffer addresses must be
/// multiples of `mem`, file offsets and lengths multiples of `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DioAlignment {
    /// Alignment of memory addresses, in bytes.
    pub mem: usize,
    /// Alignment of file offsets and transfer lengths, in bytes.
    pub offset: usize,
}

impl DioAlignment {
    /// What we assume when the kernel cannot tell: a page, which every Linux
    /// file system that supports `O_DIRECT` accepts.
    pub const FALLBACK: DioAlignment = DioAlignment {
        mem: 4096,
        offset: 4096,
    };

    /// The smallest alignment we ever report. Even where a file system would
    /// accept less (or, like tmpfs, anything), 512 keeps buffers portable to
    /// every block device.
    pub const MIN: usize = 512;

    /// The larger of the two alignments: a value that satisfies both.
    pub fn max(self) -> usize {
        self.mem.max(self.offset)
    }
}

/// Asks the kernel (`statx` with `STATX_DIOALIGN`, Linux 6.1+) what alignment
/// direct I/O needs for `path`, a file or the directory files will be created
/// in. When `path` does not exist yet, its nearest existing ancestor is asked.
/// Falls back to [`DioAlignment::FALLBACK`] when the kernel or file system
/// does not report it, and never reports less than [`DioAlignment::MIN`].
pub fn dio_alignment(path: &Path) -> DioAlignment {
    let mut probe = Some(path);
    while let Some(p) = probe {
        let target = if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        };
        match rustix::fs::statx(CWD, target, AtFlags::empty(), StatxFlags::DIOALIGN) {
            Ok(stx) => {
                let reported =
                    StatxFlags::from_bits_retain(stx.stx_mask).contains(StatxFlags::DIOALIGN);
                let mem = stx.stx_dio_mem_align as usize;
                let offset = stx.stx_dio_offset_align as usize;
                if !reported || mem == 0 || offset == 0 {
                    return DioAlignment::FALLBACK;
                }
                return DioAlignment {
                    mem: mem.max(DioAlignment::MIN),
                    offset: offset.max(DioAlignment::MIN),
                };
            }
            Err(rustix::io::Errno::NOENT) => probe = p.parent(),
            Err(_) => return DioAlignment::FALLBACK,
        }
    }
    DioAlignment::FALLBACK
}

/// Mode of the data files made here and by the disk tier: read and write
/// for the owner's user only. Stored KV blocks reveal prompts.
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// Mode of the directories made for them: the owner's user only.
pub const PRIVATE_DIR_MODE: u32 = 0o700;

/// Gives `file` exactly `mode` unless it already has it. A file made by an
/// older build (0644) or before a change of settings must not keep a wider
/// mode; the umask only ever filters the mode of a new file, so one just
/// created with `mode` needs no change, and none is made.
///
/// # Errors
/// The `fstat` or `fchmod` failure.
pub fn restrict_mode(file: &File, mode: u32) -> io::Result<()> {
    if file.metadata()?.mode() & 0o7777 != mode {
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Creates `dir` and its missing parents, each new one with mode
/// [`PRIVATE_DIR_MODE`] (narrower if the umask takes owner bits away,
/// never wider). Directories that exist are left as they are: who may
/// reach an existing directory is its owner's choice, checked where a
/// daemon starts.
///
/// # Errors
/// The `mkdir` failure.
pub fn create_private_dir_all(dir: &Path) -> io::Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR_MODE)
        .create(dir)
}

/// Opens (creating it and its parent directories if missing) `path` for
/// reading and writing with `O_DIRECT`, and makes sure it is at least `size`
/// bytes long with its blocks reserved (`fallocate`), so later writes cannot
/// fail for lack of space. An existing file longer than `size` is never
/// shrunk. Where the file system cannot `fallocate`, the file is grown with
/// `ftruncate` instead (sparse: space is then not reserved). The file is
/// mode [`PRIVATE_FILE_MODE`] (an existing one is narrowed to it) and new
/// parent directories [`PRIVATE_DIR_MODE`].
///
/// # Errors
/// [`IoError::NoSpace`] when the file system cannot hold `size` bytes,
/// [`IoError::File`] for every other failure.
pub fn open_direct(path: &Path, size: u64) -> Result<File> {
    let file_err = |source: io::Error| IoError::File {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        create_private_dir_all(dir).map_err(file_err)?;
    }
    // std already adds O_CLOEXEC; naming it keeps the intent visible.
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(PRIVATE_FILE_MODE)
        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
        .open(path)
        .map_err(file_err)?;
    restrict_mode(&file, PRIVATE_FILE_MODE).map_err(file_err)?;
    if size == 0 {
        return Ok(file);
    }
    // fallocate mode 0 reserves [0, size) and extends the file size when it is
    // shorter, but never shrinks it: exactly "grow to at least size".
    match rustix::fs::fallocate(&file, FallocateFlags::empty(), 0, size) {
        Ok(()) => Ok(file),
        Err(rustix::io::Errno::NOSPC) => Err(IoError::NoSpace {
            path: path.to_path_buf(),
            bytes: size,
        }),
        Err(rustix::io::Errno::OPNOTSUPP) => {
            let current = file.metadata().map_err(file_err)?.len();
            if current < size {
                rustix::fs::ftruncate(&file, size).map_err(|e| file_err(e.into()))?;
            }
            Ok(file)
        }
        Err(e) => Err(file_err(e.into())),
    }
}

/// Bytes written per call by [`prefill`]: large enough that the device
/// streams, small enough that progress is reported often.
const PREFILL_CHUNK: usize = 8 << 20;

/// Writes zeros over `[0, len)` of `file` (opened by [`open_direct`], so
/// `O_DIRECT`), calling `progress(done, len)` after each chunk.
///
/// Why: `fallocate` reserves blocks as *unwritten* extents. The first write
/// into one makes the file system convert it at completion (on ext4 a
/// journalled metadata change per write), and on this project's test VM
/// that made first-pass 2 MiB writes 0.55-0.75 of overwrites (fio, QD 32).
/// Writing the file once up front turns every later write into an
/// overwrite. The zeros carry no meaning: readers of a log region trust
/// only headers that verify.
///
/// # Errors
/// [`IoError::File`] for a failed or short write (`path` names the file).
pub fn prefill(
    file: &File,
    path: &Path,
    len: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let file_err = |source: io::Error| IoError::File {
        path: path.to_path_buf(),
        source,
    };
    let zeros = crate::AlignedBuf::zeroed(PREFILL_CHUNK, 4096);
    let mut done = 0u64;
    while done < len {
        // The last chunk may be short; the file's length is a multiple of
        // the direct-I/O alignment (region sizes are 4 KiB multiples).
        let n = (len - done).min(PREFILL_CHUNK as u64) as usize;
        file.write_all_at(&zeros[..n], done).map_err(file_err)?;
        done += n as u64;
        progress(done, len);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_of_tmp_is_sane() {
        let a = dio_alignment(&std::env::temp_dir());
        assert!(a.mem >= DioAlignment::MIN && a.mem.is_power_of_two());
        assert!(a.offset >= DioAlignment::MIN && a.offset.is_power_of_two());
    }

    #[test]
    fn alignment_of_missing_path_asks_an_ancestor() {
        let dir = tempfile::tempdir().expect("tempdir");
        let here = dio_alignment(dir.path());
        let missing = dio_alignment(&dir.path().join("a/b/c.dat"));
        assert_eq!(here, missing);
    }

    #[test]
    fn open_direct_grows_but_never_shrinks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/dir/file.dat");
        let f = open_direct(&path, 1 << 20).expect("open");
        assert_eq!(f.metadata().expect("meta").len(), 1 << 20);
        drop(f);
        let f = open_direct(&path, 4096).expect("reopen smaller");
        assert_eq!(f.metadata().expect("meta").len(), 1 << 20);
        drop(f);
        let f = open_direct(&path, 2 << 20).expect("reopen larger");
        assert_eq!(f.metadata().expect("meta").len(), 2 << 20);
    }

    #[test]
    fn open_direct_makes_private_files_and_narrows_older_ones() {
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").mode() & 0o7777;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("new/sub/file.dat");
        drop(open_direct(&path, 4096).expect("open"));
        assert_eq!(mode(&path), PRIVATE_FILE_MODE);
        assert_eq!(mode(&dir.path().join("new")), PRIVATE_DIR_MODE);
        assert_eq!(mode(&dir.path().join("new/sub")), PRIVATE_DIR_MODE);
        // A file an older build left readable by everyone.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        drop(open_direct(&path, 4096).expect("reopen"));
        assert_eq!(mode(&path), PRIVATE_FILE_MODE);
    }

    #[test]
    fn open_direct_reports_no_space() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("huge.dat");
        // More than any test machine's disk: fallocate must say ENOSPC (or
        // EFBIG, which is a File error; both are acceptable refusals).
        match open_direct(&path, 1 << 60) {
            Err(IoError::NoSpace { bytes, .. }) => assert_eq!(bytes, 1 << 60),
            Err(IoError::File { .. }) => {}
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn prefill_overwrites_everything_with_zeros_and_reports_progress() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("data.dat");
        // One full chunk and a short last one.
        let len = PREFILL_CHUNK as u64 + (12 << 10);
        let f = open_direct(&path, len).expect("open");
        let mut junk = crate::AlignedBuf::zeroed(len as usize, 4096);
        junk.fill(0xa5);
        f.write_all_at(&junk, 0).expect("write junk");
        let mut seen = Vec::new();
        prefill(&f, &path, len, &mut |done, total| seen.push((done, total))).expect("prefill");
        assert_eq!(seen, vec![(PREFILL_CHUNK as u64, len), (len, len)]);
        let mut back = crate::AlignedBuf::zeroed(len as usize, 4096);
        back.fill(1);
        f.read_exact_at(&mut back, 0).expect("read back");
        assert!(back.iter().all(|&b| b == 0), "a byte survived the prefill");
        assert_eq!(f.metadata().expect("meta").len(), len);
    }
}
