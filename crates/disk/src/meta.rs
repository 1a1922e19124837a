//! The per-directory meta file `kvtier-disk.meta` and atomic small-file
//! writes.
//!
//! ```text
//! meta file (128 bytes, little-endian)
//!   0  magic            [u8; 8]  "KVTDMETA"
//!   8  version          u32      1, or 2: may hold v2 (seeded, maybe layer-major) lives
//!  12  dir              u32      index of the directory in the configuration
//!  16  layers           u32
//!  20  reserved         u32      zero
//!  24  region_size      u64
//!  32  slot_size        u64
//!  40  block_bytes      u64
//!  48  file_bytes       u64      regions x region_size
//!  56  geometry_fp      u64      format::geometry_fingerprint
//!  64  creation_id      u128     random at creation; repeated in region headers and checkpoints
//!  80  slot_header_size u64
//!  88  reserved         [u8; 32] zero
//! 120  checksum         u64      xxh3_64 of bytes 0..120
//! ```

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use kvtier_io::{AlignedBuf, FileId, IoBatch, IoEngine, IoKind};
use xxhash_rust::xxh3::xxh3_64;

use crate::durability::SyncLatch;
use crate::format::{FORMAT_VERSION, FORMAT_VERSION_2, Layout, get_u32, get_u64, get_u128, put};
use crate::{DiskError, Result};

/// Name of the meta file in each directory.
pub const META_FILE: &str = "kvtier-disk.meta";
/// Name of the data file in each directory.
pub const DATA_FILE: &str = "kvtier-disk.regions";
/// Name of the checkpoint file in each directory.
pub const INDEX_FILE: &str = "kvtier-disk.index";
/// Name of the lock file in each directory (never removed; an exclusive
/// `flock` on it marks the directory as in use).
pub const LOCK_FILE: &str = "kvtier-disk.lock";

/// A directory's exclusive lock, taken by [`lock_dir`] and held until this
/// value is dropped (or the process dies).
#[derive(Debug)]
pub struct DirLock {
    file: File,
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Unlock explicitly instead of leaving it to close(2). A `flock`
        // belongs to the open file description, not to our descriptor, and a
        // child process forked by any thread of this process (a test
        // harness's sibling test, an embedding server's helper) holds a
        // copy of every descriptor until it execs: close-on-exec closes them
        // only then. Closing ours alone would keep the directory locked for
        // as long as such a child sits between fork and exec, and a re-open
        // right after the tier is dropped would fail with `Locked`.
        // `LOCK_UN` releases the lock for every copy of the description.
        // Nothing to do if it fails: closing the file below still releases
        // it once no copy is left.
        let _ = rustix::fs::flock(&self.file, rustix::fs::FlockOperation::Unlock);
    }
}

/// Takes the directory's exclusive lock; the returned [`DirLock`] holds it
/// until dropped (or the process dies), and releases it at that moment even
/// if a child process forked meanwhile still has a copy of the lock file's
/// descriptor. With std: the lock file is never written, only opened and
/// `flock`ed.
pub fn lock_dir(dir: &Path) -> Result<DirLock> {
    let path = dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(kvtier_io::PRIVATE_FILE_MODE)
        .open(&path)
        .map_err(|e| DiskError::io(&path, e))?;
    kvtier_io::restrict_mode(&file, kvtier_io::PRIVATE_FILE_MODE)
        .map_err(|e| DiskError::io(&path, e))?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(DirLock { file }),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(DiskError::Locked {
            dir: dir.to_path_buf(),
        }),
        Err(e) => Err(DiskError::io(&path, e.into())),
    }
}

const MAGIC: [u8; 8] = *b"KVTDMETA";
const META_BYTES: usize = 128;

/// The contents of a meta file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// Format version: 1, or 2 once the directory may hold v2 lives (every
    /// new life is v2 from then on).
    pub version: u32,
    /// Directory index.
    pub dir: u32,
    /// Layers per block.
    pub layers: u32,
    /// Bytes per region.
    pub region_size: u64,
    /// Bytes per slot.
    pub slot_size: u64,
    /// Bytes per block.
    pub block_bytes: u64,
    /// Bytes of the data file in use.
    pub file_bytes: u64,
    /// Geometry fingerprint.
    pub geometry_fp: u64,
    /// Random id of this directory's creation.
    pub creation_id: u128,
    /// Bytes per slot header.
    pub slot_header_size: u64,
}

impl Meta {
    /// The meta a directory should have for `layout` (version 1; see
    /// [`Meta::version`]).
    pub fn expected(dir: u32, layout: &Layout, geometry_fp: u64, creation_id: u128) -> Self {
        Meta {
            version: FORMAT_VERSION,
            dir,
            layers: layout.layers,
            region_size: layout.region_bytes,
            slot_size: layout.slot_bytes,
            block_bytes: layout.block_bytes,
            file_bytes: layout.file_bytes(),
            geometry_fp,
            creation_id,
            slot_header_size: layout.slot_header_bytes,
        }
    }

    /// Encodes the 128-byte file.
    pub fn encode(&self) -> [u8; META_BYTES] {
        let mut b = [0u8; META_BYTES];
        put(&mut b, 0, &MAGIC);
        put(&mut b, 8, &self.version.to_le_bytes());
        put(&mut b, 12, &self.dir.to_le_bytes());
        put(&mut b, 16, &self.layers.to_le_bytes());
        put(&mut b, 24, &self.region_size.to_le_bytes());
        put(&mut b, 32, &self.slot_size.to_le_bytes());
        put(&mut b, 40, &self.block_bytes.to_le_bytes());
        put(&mut b, 48, &self.file_bytes.to_le_bytes());
        put(&mut b, 56, &self.geometry_fp.to_le_bytes());
        put(&mut b, 64, &self.creation_id.to_le_bytes());
        put(&mut b, 80, &self.slot_header_size.to_le_bytes());
        let sum = xxh3_64(&b[..120]);
        put(&mut b, 120, &sum.to_le_bytes());
        b
    }

    /// Decodes a meta file; the error says what is wrong. A version this
    /// build cannot read (not 1 or 2) is reported as
    /// [`DiskError::FormatMismatch`].
    pub fn decode(b: &[u8], path: &Path, dir_path: &Path) -> Result<Self> {
        Self::decode_up_to(b, path, dir_path, FORMAT_VERSION_2)
    }

    /// [`Meta::decode`] of a build that reads versions up to `max`: with
    /// `max = 1` it is a v1 build's decoder, which must refuse meta v2 (it
    /// would write unseeded v1 headers over layer-major data).
    pub fn decode_up_to(b: &[u8], path: &Path, dir_path: &Path, max: u32) -> Result<Self> {
        let bad = |reason: &str| DiskError::BadFile {
            path: path.to_path_buf(),
            reason: reason.to_owned(),
        };
        if b.len() != META_BYTES || b[..8] != MAGIC {
            return Err(bad("not a kvtier disk meta file"));
        }
        let stored = get_u64(b, 120).ok_or_else(|| bad("truncated"))?;
        if stored != xxh3_64(&b[..120]) {
            return Err(bad("checksum mismatch"));
        }
        let version = get_u32(b, 8).ok_or_else(|| bad("truncated"))?;
        if !(FORMAT_VERSION..=max).contains(&version) {
            return Err(DiskError::FormatMismatch {
                dir: dir_path.to_path_buf(),
                field: "format version",
                found: version.to_string(),
                expected: format!("{FORMAT_VERSION}..={max}"),
            });
        }
        let f = || bad("truncated");
        Ok(Meta {
            version,
            dir: get_u32(b, 12).ok_or_else(f)?,
            layers: get_u32(b, 16).ok_or_else(f)?,
            region_size: get_u64(b, 24).ok_or_else(f)?,
            slot_size: get_u64(b, 32).ok_or_else(f)?,
            block_bytes: get_u64(b, 40).ok_or_else(f)?,
            file_bytes: get_u64(b, 48).ok_or_else(f)?,
            geometry_fp: get_u64(b, 56).ok_or_else(f)?,
            creation_id: get_u128(b, 64).ok_or_else(f)?,
            slot_header_size: get_u64(b, 80).ok_or_else(f)?,
        })
    }

    /// The first field where `self` (on disk) differs from `want`, as a
    /// [`DiskError::FormatMismatch`].
    pub fn check(&self, want: &Meta, dir_path: &Path) -> Result<()> {
        let fields: [(&'static str, u64, u64); 8] = [
            (
                "dir index (keep the order of dirs)",
                self.dir as u64,
                want.dir as u64,
            ),
            ("block bytes", self.block_bytes, want.block_bytes),
            ("layers", self.layers as u64, want.layers as u64),
            ("geometry fingerprint", self.geometry_fp, want.geometry_fp),
            ("region size", self.region_size, want.region_size),
            ("slot size", self.slot_size, want.slot_size),
            (
                "slot header size",
                self.slot_header_size,
                want.slot_header_size,
            ),
            (
                "capacity (data file bytes)",
                self.file_bytes,
                want.file_bytes,
            ),
        ];
        for (field, found, expected) in fields {
            if found != expected {
                return Err(DiskError::FormatMismatch {
                    dir: dir_path.to_path_buf(),
                    field,
                    found: found.to_string(),
                    expected: expected.to_string(),
                });
            }
        }
        Ok(())
    }
}

/// A creation id: unique enough to tell two creations of a directory apart.
pub fn new_creation_id(dir: &Path) -> u128 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&nanos.to_le_bytes());
    bytes.extend_from_slice(&std::process::id().to_le_bytes());
    bytes.extend_from_slice(dir.as_os_str().as_encoded_bytes());
    let stack = 0u8;
    bytes.extend_from_slice(&(&stack as *const u8 as usize).to_le_bytes());
    xxhash_rust::xxh3::xxh3_128(&bytes)
}

/// Largest write op of [`write_atomic`]; a checkpoint of a million blocks
/// (32 MB) goes out as 32 ops of one batch.
const SMALL_FILE_OP_BYTES: usize = 1 << 20;

/// Writes `bytes` to `path` atomically, every write and sync through
/// `engine` (so they fail, and can be made to fail, like the data file's):
/// a temporary file beside it, written and `fdatasync`ed, renamed over
/// `path`, then the directory `fsync`ed. A failed sync latches the tier.
///
/// The file is mode 0600 (`kvtier_io::PRIVATE_FILE_MODE`) whatever the
/// umask, and whatever mode a temporary file a crash left behind had.
///
/// The std calls left are not device I/O on data: `File::create` and
/// `File::open` only name and open files, and `rename` moves a directory
/// entry (the trait has no rename). Each returns its error before anything
/// is acknowledged; the rename's durability is the directory's `fsync`,
/// which goes through the engine. If the rename fails, `path` still holds
/// the previous complete file.
pub(crate) fn write_atomic(
    engine: &dyn IoEngine,
    latch: &SyncLatch,
    path: &Path,
    bytes: &[u8],
) -> Result<()> {
    latch.check()?;
    let tmp = tmp_path(path);
    // Buffered, not O_DIRECT: a small file of any length, written once.
    let f = create_private(&tmp).map_err(|e| DiskError::io(&tmp, e))?;
    let file = Registered::new(engine, f, &tmp)?;
    write_all(engine, file.id, bytes, &tmp)?;
    latch.sync(engine, file.id, IoKind::Fdatasync, &tmp)?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(|e| DiskError::io(path, e))?;
    if let Some(dir) = path.parent() {
        let d = File::open(dir).map_err(|e| DiskError::io(dir, e))?;
        let d = Registered::new(engine, d, dir)?;
        latch.sync(engine, d.id, IoKind::Fsync, dir)?;
    }
    Ok(())
}

/// A short-lived file registered with the engine, forgotten on drop (every
/// operation on it has been waited for by then).
struct Registered<'a> {
    engine: &'a dyn IoEngine,
    id: FileId,
}

impl<'a> Registered<'a> {
    fn new(engine: &'a dyn IoEngine, file: File, path: &Path) -> Result<Self> {
        let id = engine
            .register_file(file)
            .map_err(|source| DiskError::Engine {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Registered { engine, id })
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        // An engine that cannot forget files keeps this one open until it
        // drops: a descriptor per checkpoint, not a correctness problem.
        if let Err(e) = self.engine.close_file(self.id) {
            tracing::debug!(error = %e, "cannot close a short-lived file in the I/O engine");
        }
    }
}

/// Writes all of `bytes` at offset 0 of `file` in one batch and waits.
fn write_all(engine: &dyn IoEngine, file: FileId, bytes: &[u8], path: &Path) -> Result<()> {
    let mut batch = IoBatch::with_capacity(bytes.len().div_ceil(SMALL_FILE_OP_BYTES));
    for (i, chunk) in bytes.chunks(SMALL_FILE_OP_BYTES).enumerate() {
        let mut buf = AlignedBuf::zeroed(chunk.len(), 4096);
        buf.copy_from_slice(chunk);
        batch.write_owned(file, (i * SMALL_FILE_OP_BYTES) as u64, buf);
    }
    let done = engine.submit(batch).wait();
    let engine_err = |source| DiskError::Engine {
        path: path.to_path_buf(),
        source,
    };
    if done.results.len() != done.ops.len() || (done.ops.is_empty() && !bytes.is_empty()) {
        return Err(engine_err(kvtier_io::IoError::Closed));
    }
    done.check().map_err(engine_err)
}

/// Creates or truncates `path`, mode 0600. A truncated file keeps its old
/// mode through the open, so the mode is set again.
fn create_private(path: &Path) -> std::io::Result<File> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(kvtier_io::PRIVATE_FILE_MODE)
        .open(path)?;
    kvtier_io::restrict_mode(&f, kvtier_io::PRIVATE_FILE_MODE)?;
    Ok(f)
}

/// Gives the file at `path`, if there is one, mode 0600.
pub(crate) fn narrow_if_present(path: &Path) -> Result<()> {
    match File::open(path) {
        Ok(f) => kvtier_io::restrict_mode(&f, kvtier_io::PRIVATE_FILE_MODE)
            .map_err(|e| DiskError::io(path, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(DiskError::io(path, e)),
    }
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Reads a whole file; `Ok(None)` if it does not exist.
///
/// With std, not the engine: it runs only at open, before anything is
/// acknowledged, on the meta file and the checkpoint. A failure fails the
/// open (meta) or makes recovery scan instead (checkpoint), and a damaged
/// file fails its checksum (I9); the reads recovery trusts blocks from
/// (region and slot headers) go through the engine.
pub fn read_optional(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(DiskError::io(path, e)),
    }
}

/// Removes a file if it exists.
///
/// With std: an unlink moves no data (the trait has no unlink). It runs only
/// while a directory is created afresh, before anything is acknowledged; a
/// crash after it finds no valid meta file and creates the directory again.
pub fn remove_optional(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(DiskError::io(path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Meta {
        Meta {
            version: FORMAT_VERSION,
            dir: 1,
            layers: 2,
            region_size: 1 << 20,
            slot_size: 8192,
            block_bytes: 4096,
            file_bytes: 4 << 20,
            geometry_fp: 7,
            creation_id: 99,
            slot_header_size: 4096,
        }
    }

    #[test]
    fn round_trips_and_names_the_differing_field() {
        let m = meta();
        let p = Path::new("/x/kvtier-disk.meta");
        let d = Meta::decode(&m.encode(), p, Path::new("/x")).unwrap();
        assert_eq!(d, m);
        let want = Meta {
            block_bytes: 8192,
            ..m
        };
        let e = m.check(&want, Path::new("/x")).unwrap_err().to_string();
        assert!(e.contains("/x") && e.contains("block bytes"), "{e}");
        let mut b = m.encode();
        b[50] ^= 1;
        assert!(matches!(
            Meta::decode(&b, p, Path::new("/x")),
            Err(DiskError::BadFile { .. })
        ));
    }

    #[test]
    fn v2_round_trips_and_a_v1_decoder_refuses_it() {
        let m = Meta {
            version: FORMAT_VERSION_2,
            ..meta()
        };
        let (p, d) = (Path::new("/x/kvtier-disk.meta"), Path::new("/x"));
        let b = m.encode();
        assert_eq!(Meta::decode(&b, p, d).unwrap(), m);
        // Versions differ in the version field only.
        let v1 = meta().encode();
        let differ: Vec<usize> = (0..120).filter(|&i| b[i] != v1[i]).collect();
        assert_eq!(differ, vec![8]);
        let e = Meta::decode_up_to(&b, p, d, FORMAT_VERSION).unwrap_err();
        assert!(
            matches!(
                e,
                DiskError::FormatMismatch {
                    field: "format version",
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(
            Meta::decode_up_to(&v1, p, d, FORMAT_VERSION).unwrap(),
            meta()
        );
        let v3 = Meta {
            version: 3,
            ..meta()
        }
        .encode();
        assert!(Meta::decode(&v3, p, d).is_err());
    }

    #[test]
    fn atomic_write_replaces_through_the_engine() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let engine = kvtier_io::PsyncEngine::new(1, 8).unwrap();
        let latch = SyncLatch::default();
        write_atomic(&engine, &latch, &p, b"one").unwrap();
        let long: Vec<u8> = (0..(SMALL_FILE_OP_BYTES * 2 + 77))
            .map(|i| i as u8)
            .collect();
        write_atomic(&engine, &latch, &p, &long).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), long);
        write_atomic(&engine, &latch, &p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert!(!dir.path().join("f.tmp").exists());
        let s = kvtier_io::IoEngine::stats(&engine);
        // Per file: its data sync and the directory's sync.
        assert_eq!(s.syncs, 6);
        assert_eq!(s.writes, 1 + 3 + 1);
    }

    #[test]
    fn atomic_writes_and_the_lock_file_are_private() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        // A temporary file a crash left behind, readable by everyone: the
        // truncating open keeps its mode unless it is set again.
        let tmp = dir.path().join("f.tmp");
        std::fs::write(&tmp, b"old").unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).unwrap();
        let engine = kvtier_io::PsyncEngine::new(1, 8).unwrap();
        write_atomic(&engine, &SyncLatch::default(), &p, b"one").unwrap();
        assert_eq!(mode(&p), 0o600);
        // A lock file an older build made 0644.
        let lock = dir.path().join(LOCK_FILE);
        std::fs::write(&lock, b"").unwrap();
        std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o644)).unwrap();
        let held = lock_dir(dir.path()).unwrap();
        assert_eq!(mode(&lock), 0o600);
        drop(held);
    }

    #[test]
    fn a_failed_sync_latches_and_keeps_the_old_file() {
        use kvtier_io::{Fault, FaultyEngine};
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let inner = std::sync::Arc::new(kvtier_io::PsyncEngine::new(1, 8).unwrap());
        let engine = FaultyEngine::new(inner, vec![]);
        let latch = SyncLatch::default();
        write_atomic(&engine, &latch, &p, b"one").unwrap();
        engine.set_faults(vec![Fault::FailOps {
            kind: Some(IoKind::Fdatasync),
            errno: libc::EIO,
            every: 1,
        }]);
        let e = write_atomic(&engine, &latch, &p, b"two").unwrap_err();
        assert!(matches!(e, DiskError::SyncFailed { .. }), "{e}");
        assert!(latch.reason().is_some());
        assert_eq!(std::fs::read(&p).unwrap(), b"one", "not renamed over");
        // Latched: refused even once syncs work again.
        engine.set_faults(vec![]);
        let e = write_atomic(&engine, &latch, &p, b"three").unwrap_err();
        assert!(matches!(e, DiskError::SyncFailed { .. }), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"one");
        assert_eq!(engine.inner().stats().syncs, 2, "no sync after the latch");
    }
}
