//! [`FilePool`]: block parts packed into a few large preallocated files on
//! a local or shared file system (NFS, 3FS), for file systems whose
//! metadata cannot take one file per block part.
//!
//! Each pool file has its own [`ExtentAllocator`]; extents are multiples of
//! [`EXTENT_ALIGN`] at aligned offsets so clients can use `O_DIRECT`. A part
//! is named `file:///dir/pool-0003.kv?offset=8192&size=4096&loc=1f`:
//! `size` is the extent length (the part's bytes are its first
//! `LocationSpec::size` bytes) and `loc` the location id that owns it.
//!
//! The allocation map is not saved: the metadata index already records
//! every live URI, so at startup the service hands them to
//! [`FilePool::restore`] before attaching the pool. Extents of writes that
//! were in flight at a crash are not in the index any more and come back
//! free.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use kvtier_meta::{BackendError, BackendFuture, BackendUsage, CreateRequest, StorageBackend};
use parking_lot::Mutex;

use kvtier_meta::path_safe::check_absolute_dir;

use crate::allocator::ExtentAllocator;
use crate::uri::{Uri, bad};

/// Alignment and granularity of extents (bytes).
pub const EXTENT_ALIGN: u64 = 4096;

/// Mode of the pool files a pool creates: its owner's user only.
pub const POOL_FILE_MODE: u32 = 0o600;
/// Mode of the directories a pool creates.
pub const POOL_DIR_MODE: u32 = 0o700;

/// Settings of a [`FilePool`].
#[derive(Debug, Clone)]
pub struct FilePoolOptions {
    /// Bytes per pool file; rounded down to [`EXTENT_ALIGN`]. Default 1 GiB.
    pub file_size: u64,
    /// Pool files. Default 4.
    pub files: u32,
    /// Reserve the files' blocks on the file system at open (`fallocate`)
    /// instead of leaving them sparse. Default true.
    pub preallocate: bool,
    /// Limit of one health probe. Default 5 s.
    pub probe_timeout: Duration,
}

impl Default for FilePoolOptions {
    fn default() -> Self {
        FilePoolOptions {
            file_size: 1 << 30,
            files: 4,
            preallocate: true,
            probe_timeout: Duration::from_secs(5),
        }
    }
}

/// What [`FilePool::restore`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreSummary {
    /// Extents marked live.
    pub restored: usize,
    /// URIs not restored and why (not of this pool, or overlapping a live
    /// extent).
    pub rejected: Vec<(String, String)>,
}

/// A pool of large files carved into extents.
#[derive(Debug)]
pub struct FilePool {
    dir: PathBuf,
    file_size: u64,
    /// Number of pool files (fixed at open).
    nfiles: usize,
    probe_timeout: Duration,
    /// One allocator per pool file. One lock for all so a batch is placed
    /// all-or-nothing; allocation is in-memory map work only.
    files: Mutex<Vec<ExtentAllocator>>,
}

/// Where one URI points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Place {
    file: usize,
    offset: u64,
    len: u64,
    tag: u64,
}

fn round_up(size: u64) -> Option<u64> {
    Some(size.max(1).checked_add(EXTENT_ALIGN - 1)? / EXTENT_ALIGN * EXTENT_ALIGN)
}

fn file_name(i: usize) -> String {
    format!("pool-{i:04}.kv")
}

impl FilePool {
    /// Opens (creating if needed) a pool in `dir`, which must be absolute:
    /// creates the directory and any missing pool file at its full size.
    /// Starts with every extent free; see [`FilePool::restore`].
    ///
    /// With [`FilePoolOptions::preallocate`] the files' blocks are reserved
    /// (`fallocate`); when the file system cannot hold them the pool is
    /// refused with a [`PoolSpaceError`] (inside [`BackendError::Io`], kind
    /// `StorageFull`) naming the sizes, before any file is created where the
    /// free space already says so, and otherwise with the files this call
    /// created removed again.
    pub fn open(dir: impl Into<PathBuf>, opts: &FilePoolOptions) -> Result<Self, BackendError> {
        let dir = dir.into();
        // The one place a pool's paths are formed from (admin) input: the
        // directory must be absolute with no `.` or `..`, so every pool
        // file (`<dir>/pool-NNNN.kv`) lies under it.
        check_absolute_dir(&dir).map_err(|e| {
            bad(
                &dir.display().to_string(),
                format!("pool directory must be absolute and normal: {e}"),
            )
        })?;
        let file_size = opts.file_size / EXTENT_ALIGN * EXTENT_ALIGN;
        if file_size == 0 || opts.files == 0 {
            return Err(BackendError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "file pool needs at least one file of at least 4 KiB",
            )));
        }
        let paths = pool_paths(&dir, opts.files);
        if opts.preallocate {
            // Refuse before creating anything when the space is not there.
            check_space(&dir, &paths, file_size)?;
        }
        // New directories and files are the daemon's user's alone: the
        // pool holds every tenant's blocks (existing ones keep the mode
        // their owner gave them).
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(POOL_DIR_MODE)
            .create(&dir)?;
        let mut created = Vec::new();
        for path in &paths {
            if let Err(e) = open_pool_file(path, file_size, opts.preallocate, &mut created) {
                // No half-made pool: the files this call created go again.
                for p in &created {
                    let _ = std::fs::remove_file(p);
                }
                return Err(e);
            }
        }
        if opts.preallocate {
            tracing::info!(
                dir = %dir.display(),
                files = opts.files,
                bytes = file_size * u64::from(opts.files),
                "file pool: disk space reserved"
            );
        }
        Ok(FilePool {
            dir,
            file_size,
            nfiles: opts.files as usize,
            probe_timeout: opts.probe_timeout,
            files: Mutex::new(
                (0..opts.files)
                    .map(|_| ExtentAllocator::new(file_size))
                    .collect(),
            ),
        })
    }

    /// Checks, creating nothing, that the file system of `dir` can hold a
    /// pool of `opts` there (what is already reserved by existing pool files
    /// counts): the same refusal [`FilePool::open`] makes, for callers that
    /// want it before they create anything else.
    pub fn check_space(dir: &Path, opts: &FilePoolOptions) -> Result<(), BackendError> {
        let file_size = opts.file_size / EXTENT_ALIGN * EXTENT_ALIGN;
        check_space(dir, &pool_paths(dir, opts.files), file_size)
    }

    /// Opens the pool named by a storage URI `file:///abs/dir`.
    pub fn open_uri(uri: &str, opts: &FilePoolOptions) -> Result<Self, BackendError> {
        let u = Uri::parse(uri)?;
        if u.scheme != "file" {
            return Err(bad(uri, "file pool URIs start with file://"));
        }
        if !u.authority.is_empty() && u.authority != "localhost" {
            return Err(bad(uri, "file URIs name no host"));
        }
        if u.path.is_empty() || !u.query.is_empty() {
            return Err(bad(uri, "expected file:///absolute/directory"));
        }
        Self::open(u.path, opts)
    }

    /// The pool directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of pool file `i`.
    pub fn file_path(&self, i: usize) -> PathBuf {
        self.dir.join(file_name(i))
    }

    /// Marks the extents of `uris` live (the serving and writing locations
    /// the metadata index knows on this storage), so they are not handed
    /// out again after a restart. Call before the pool takes writes.
    pub fn restore(&self, uris: &[String]) -> RestoreSummary {
        let mut files = self.files.lock();
        let mut out = RestoreSummary::default();
        for uri in uris {
            let res = self.parse(uri).map_err(|e| e.to_string()).and_then(|p| {
                files[p.file]
                    .reserve(p.offset, p.len, p.tag)
                    .map_err(|e| e.to_string())
            });
            match res {
                Ok(()) => out.restored += 1,
                Err(reason) => {
                    tracing::warn!(uri, %reason, "file pool: extent not restored");
                    out.rejected.push((uri.clone(), reason));
                }
            }
        }
        out
    }

    fn uri(&self, p: Place) -> String {
        format!(
            "file://{}?offset={}&size={}&loc={:x}",
            self.file_path(p.file).display(),
            p.offset,
            p.len,
            p.tag
        )
    }

    fn parse(&self, uri: &str) -> Result<Place, BackendError> {
        let u = Uri::parse(uri)?;
        if u.scheme != "file" || !(u.authority.is_empty() || u.authority == "localhost") {
            return Err(bad(uri, "not a file:/// URI"));
        }
        let path = Path::new(u.path);
        if path.parent() != Some(self.dir.as_path()) {
            return Err(bad(uri, format!("not in pool {}", self.dir.display())));
        }
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| bad(uri, "no file name"))?;
        let file = name
            .strip_prefix("pool-")
            .and_then(|n| n.strip_suffix(".kv"))
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&i| file_name(i) == name)
            .ok_or_else(|| bad(uri, "not a pool file name"))?;
        if file >= self.nfiles {
            return Err(bad(uri, "pool file index out of range"));
        }
        let offset = u.param_u64(uri, "offset")?;
        let len = u.param_u64(uri, "size")?;
        let tag = u64::from_str_radix(u.param(uri, "loc")?, 16)
            .map_err(|_| bad(uri, "\"loc\" is not hexadecimal"))?;
        if offset % EXTENT_ALIGN != 0 || len % EXTENT_ALIGN != 0 || len == 0 {
            return Err(bad(uri, "extent not 4 KiB aligned"));
        }
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.file_size)
        {
            return Err(bad(uri, "extent past the end of the pool file"));
        }
        Ok(Place {
            file,
            offset,
            len,
            tag,
        })
    }

    fn create_sync(&self, requests: &[CreateRequest]) -> Result<Vec<String>, BackendError> {
        let mut files = self.files.lock();
        let mut placed: Vec<Place> = Vec::with_capacity(requests.len());
        let mut failed = None;
        for r in requests {
            let Some(len) = round_up(r.size) else {
                failed = Some(r.size);
                break;
            };
            let tag = r.location.0;
            let got = files
                .iter_mut()
                .enumerate()
                .find_map(|(i, a)| a.allocate(len, tag).map(|o| (i, o)));
            match got {
                Some((file, offset)) => placed.push(Place {
                    file,
                    offset,
                    len,
                    tag,
                }),
                None => {
                    failed = Some(len);
                    break;
                }
            }
        }
        if failed.is_some() {
            // All or nothing: give back what this batch took.
            for p in &placed {
                files[p.file].free(p.offset, p.len, p.tag);
            }
            let requested = requests
                .iter()
                .map(|r| round_up(r.size).unwrap_or(u64::MAX))
                .fold(0u64, u64::saturating_add);
            let free = files.iter().map(ExtentAllocator::free_bytes).sum();
            return Err(BackendError::Full { requested, free });
        }
        drop(files);
        Ok(placed.into_iter().map(|p| self.uri(p)).collect())
    }

    fn delete_sync(&self, uris: &[String]) -> Vec<Result<(), BackendError>> {
        let places: Vec<Result<Place, BackendError>> = uris.iter().map(|u| self.parse(u)).collect();
        let mut files = self.files.lock();
        places
            .into_iter()
            .map(|p| {
                let p = p?;
                // Not live (already freed, or reused under another owner):
                // nothing to do, deletes are idempotent.
                files[p.file].free(p.offset, p.len, p.tag);
                Ok(())
            })
            .collect()
    }

    fn exist_sync(&self, uris: &[String]) -> Result<Vec<bool>, BackendError> {
        let places = uris
            .iter()
            .map(|u| self.parse(u))
            .collect::<Result<Vec<_>, _>>()?;
        let files = self.files.lock();
        Ok(places
            .into_iter()
            .map(|p| {
                files[p.file]
                    .get(p.offset)
                    .is_some_and(|e| e.len == p.len && e.tag == p.tag)
            })
            .collect())
    }

    fn usage_sync(&self) -> BackendUsage {
        let files = self.files.lock();
        BackendUsage {
            used_bytes: files.iter().map(ExtentAllocator::used_bytes).sum(),
            capacity_bytes: Some(files.iter().map(ExtentAllocator::capacity).sum()),
            objects: files.iter().map(|a| a.live() as u64).sum(),
        }
    }

    /// Checks the pool files are still there at full size, then writes,
    /// syncs, reads back and removes a probe file. A probe file that cannot
    /// be written for lack of space (`ENOSPC`, `EDQUOT`) is a full file
    /// system, not a broken one: if the pool files still read, the answer
    /// is [`BackendError::Full`] (existing parts stay served, new writes go
    /// elsewhere), not [`BackendError::Unavailable`].
    fn probe(dir: &Path, files: Vec<PathBuf>, file_size: u64) -> Result<(), BackendError> {
        let broken = |e: std::io::Error| {
            BackendError::Unavailable(format!("file pool {}: {e}", dir.display()))
        };
        for f in &files {
            let len = std::fs::metadata(f).map_err(broken)?.len();
            if len < file_size {
                return Err(broken(std::io::Error::other(format!(
                    "{} shrank to {len} bytes",
                    f.display()
                ))));
            }
        }
        match Self::probe_file(dir) {
            Ok(()) => Ok(()),
            Err(e) if is_out_of_space(&e) => {
                Self::read_pool_heads(&files).map_err(broken)?;
                Err(BackendError::Full {
                    requested: EXTENT_ALIGN,
                    free: available_bytes(dir).unwrap_or(0),
                })
            }
            Err(e) => Err(broken(e)),
        }
    }

    /// Writes, syncs, reads back and removes a probe file of one extent.
    fn probe_file(dir: &Path) -> std::io::Result<()> {
        let path = dir.join(format!(
            ".kvtier-probe-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        let data: Vec<u8> = (0..EXTENT_ALIGN).map(|_| rand::random::<u8>()).collect();
        let result = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(POOL_FILE_MODE)
                .open(&path)?;
            f.write_all(&data)?;
            f.sync_all()?;
            let mut back = Vec::with_capacity(data.len());
            File::open(&path)?.read_to_end(&mut back)?;
            if back != data {
                return Err(std::io::Error::other("probe read back different bytes"));
            }
            Ok(())
        })();
        let _ = std::fs::remove_file(&path);
        result
    }

    /// Reads the first extent of every pool file: the data is reachable.
    fn read_pool_heads(files: &[PathBuf]) -> std::io::Result<()> {
        let mut head = vec![0u8; EXTENT_ALIGN as usize];
        for f in files {
            File::open(f)?.read_exact(&mut head)?;
        }
        Ok(())
    }
}

/// Whether `e` says the file system (or the user's quota) has no room.
fn is_out_of_space(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::StorageFull || e.kind() == std::io::ErrorKind::QuotaExceeded
}

/// The paths of a pool's `files` files in `dir`.
fn pool_paths(dir: &Path, files: u32) -> Vec<PathBuf> {
    (0..files as usize)
        .map(|i| dir.join(file_name(i)))
        .collect()
}

/// A file pool whose space the file system cannot hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "file pool {dir}: cannot reserve {wanted} bytes ({missing} of them not reserved yet): only {available} bytes are free on its file system; lower meta.pool_capacity or free space"
)]
pub struct PoolSpaceError {
    /// The pool directory.
    pub dir: PathBuf,
    /// Bytes of the whole pool (every file at its full size).
    pub wanted: u64,
    /// Of those, bytes not yet reserved by existing pool files.
    pub missing: u64,
    /// Bytes free on the file system for an unprivileged writer.
    pub available: u64,
}

impl PoolSpaceError {
    /// The [`PoolSpaceError`] inside `e`, if `e` is one.
    pub fn find(e: &BackendError) -> Option<&PoolSpaceError> {
        match e {
            BackendError::Io(io) => io.get_ref()?.downcast_ref(),
            _ => None,
        }
    }

    fn into_backend(self) -> BackendError {
        BackendError::Io(std::io::Error::new(std::io::ErrorKind::StorageFull, self))
    }
}

/// Bytes of `path` already backed by blocks, up to `len`; 0 if it does not
/// exist.
fn reserved_bytes(path: &Path, len: u64) -> std::io::Result<u64> {
    match std::fs::metadata(path) {
        Ok(m) => Ok((m.blocks() * 512).min(len)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// Bytes free for unprivileged writers on the file system holding `path`,
/// asking the nearest existing ancestor when `path` does not exist yet.
fn available_bytes(path: &Path) -> std::io::Result<u64> {
    let mut probe = Some(path);
    while let Some(p) = probe {
        match rustix::fs::statvfs(p) {
            Ok(st) => return Ok(st.f_bavail.saturating_mul(st.f_frsize)),
            Err(rustix::io::Errno::NOENT) => probe = p.parent(),
            Err(e) => return Err(e.into()),
        }
    }
    Err(std::io::ErrorKind::NotFound.into())
}

/// Refuses with a [`PoolSpaceError`] when the file system of `dir` has
/// fewer free bytes than `paths`, each `file_size` long, still need.
fn check_space(dir: &Path, paths: &[PathBuf], file_size: u64) -> Result<(), BackendError> {
    let mut missing = 0u64;
    for p in paths {
        missing = missing.saturating_add(file_size - reserved_bytes(p, file_size)?);
    }
    let available = available_bytes(dir)?;
    if missing > available {
        return Err(PoolSpaceError {
            dir: dir.to_owned(),
            wanted: file_size.saturating_mul(paths.len() as u64),
            missing,
            available,
        }
        .into_backend());
    }
    Ok(())
}

/// Gives `f`, a pool file of an earlier start, mode [`POOL_FILE_MODE`] if
/// it is this user's and wider (an older build made them 0644); another
/// user's file on a shared file system keeps the mode its owner chose.
fn narrow_if_ours(f: &File, path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = f.metadata()?;
    let ours = meta.uid() == rustix::process::geteuid().as_raw();
    if ours && meta.mode() & 0o7777 != POOL_FILE_MODE {
        f.set_permissions(std::fs::Permissions::from_mode(POOL_FILE_MODE))?;
        tracing::info!(file = %path.display(), "file pool: narrowed a pool file to mode 0600");
    }
    Ok(())
}

/// Opens or creates one pool file at `file_size` bytes, reserving its blocks
/// if `preallocate`; records it in `created` if this call created it.
fn open_pool_file(
    path: &Path,
    file_size: u64,
    preallocate: bool,
    created: &mut Vec<PathBuf>,
) -> Result<(), BackendError> {
    let opts = || {
        let mut o = OpenOptions::new();
        o.read(true).write(true);
        o
    };
    let f = match opts().create_new(true).mode(POOL_FILE_MODE).open(path) {
        Ok(f) => {
            created.push(path.to_owned());
            f
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let f = opts().open(path)?;
            narrow_if_ours(&f, path)?;
            f
        }
        Err(e) => return Err(e.into()),
    };
    if f.metadata()?.len() < file_size {
        f.set_len(file_size)?;
    }
    if !preallocate {
        return Ok(());
    }
    match rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, file_size) {
        Ok(()) => Ok(()),
        // Space went between the check and here (another writer).
        Err(rustix::io::Errno::NOSPC) => {
            let dir = path.parent().unwrap_or(path);
            Err(PoolSpaceError {
                dir: dir.to_owned(),
                wanted: file_size,
                missing: file_size - reserved_bytes(path, file_size)?,
                available: available_bytes(dir)?,
            }
            .into_backend())
        }
        // No fallocate here (some NFS versions): the free-space check above
        // is all the assurance there is; the file stays sparse.
        Err(rustix::io::Errno::OPNOTSUPP) => {
            tracing::warn!(path = %path.display(), "file pool: the file system cannot fallocate; space was checked but is not reserved");
            Ok(())
        }
        Err(e) => Err(std::io::Error::from(e).into()),
    }
}

impl StorageBackend for FilePool {
    fn create<'a>(
        &'a self,
        requests: &'a [CreateRequest],
    ) -> BackendFuture<'a, Result<Vec<String>, BackendError>> {
        Box::pin(async move { self.create_sync(requests) })
    }

    fn delete<'a>(
        &'a self,
        uris: &'a [String],
    ) -> BackendFuture<'a, Vec<Result<(), BackendError>>> {
        Box::pin(async move { self.delete_sync(uris) })
    }

    fn exist<'a>(
        &'a self,
        uris: &'a [String],
    ) -> BackendFuture<'a, Result<Vec<bool>, BackendError>> {
        Box::pin(async move { self.exist_sync(uris) })
    }

    fn usage(&self) -> BackendFuture<'_, Result<BackendUsage, BackendError>> {
        Box::pin(async move { Ok(self.usage_sync()) })
    }

    fn health(&self) -> BackendFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            let dir = self.dir.clone();
            let n = self.nfiles;
            let files: Vec<PathBuf> = (0..n).map(|i| self.file_path(i)).collect();
            let file_size = self.file_size;
            // Blocking file I/O off the runtime; a hung mount leaves the
            // thread behind but the probe still answers in time.
            let probe = tokio::task::spawn_blocking(move || Self::probe(&dir, files, file_size));
            match tokio::time::timeout(self.probe_timeout, probe).await {
                Ok(Ok(result)) => result,
                Ok(Err(e)) => Err(BackendError::Unavailable(format!("probe task: {e}"))),
                Err(_) => Err(BackendError::Unavailable(format!(
                    "file pool {}: probe timed out after {:?}",
                    self.dir.display(),
                    self.probe_timeout
                ))),
            }
        })
    }
}
