//! The per-directory meta file `kvtier-disk.meta` and atomic small-file
//! writes.
//!
//! ```text
//! meta file (128 bytes, little-endian)
//!   0  magic            [u8; 8]  "KVTDMETA"
//!   8  version          u32      FORMAT_VERSION
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
use std::io::Write;
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::xxh3_64;

use crate::format::{FORMAT_VERSION, Layout, get_u32, get_u64, get_u128, put};
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

/// Takes the directory's exclusive lock; the returned file holds it until
/// dropped (or the process dies).
pub fn lock_dir(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| DiskError::io(&path, e))?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(f),
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
    /// The meta a directory should have for `layout`.
    pub fn expected(dir: u32, layout: &Layout, geometry_fp: u64, creation_id: u128) -> Self {
        Meta {
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
        put(&mut b, 8, &FORMAT_VERSION.to_le_bytes());
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

    /// Decodes a meta file; the error says what is wrong. A version other
    /// than ours is reported as [`DiskError::FormatMismatch`].
    pub fn decode(b: &[u8], path: &Path, dir_path: &Path) -> Result<Self> {
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
        if version != FORMAT_VERSION {
            return Err(DiskError::FormatMismatch {
                dir: dir_path.to_path_buf(),
                field: "format version",
                found: version.to_string(),
                expected: FORMAT_VERSION.to_string(),
            });
        }
        let f = || bad("truncated");
        Ok(Meta {
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

/// Writes `bytes` to `path` atomically: a temporary file beside it, fsync,
/// rename over `path`, fsync of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = tmp_path(path);
    let mut f = File::create(&tmp).map_err(|e| DiskError::io(&tmp, e))?;
    f.write_all(bytes).map_err(|e| DiskError::io(&tmp, e))?;
    f.sync_all().map_err(|e| DiskError::io(&tmp, e))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| DiskError::io(path, e))?;
    if let Some(dir) = path.parent() {
        let d = File::open(dir).map_err(|e| DiskError::io(dir, e))?;
        d.sync_all().map_err(|e| DiskError::io(dir, e))?;
    }
    Ok(())
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Reads a whole file; `Ok(None)` if it does not exist.
pub fn read_optional(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(DiskError::io(path, e)),
    }
}

/// Removes a file if it exists.
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
    fn atomic_write_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert!(!dir.path().join("f.tmp").exists());
    }
}
