//! The small files a daemon keeps beside its data (the secret, the shape
//! file): read only when they are regular files of this user that nobody
//! else may change, and made whole or not at all (written to a private
//! temporary file, synced, then linked or renamed into place).

use std::fs::{File, Metadata, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A failed file system call: what was attempted, and the OS error.
pub(crate) type OpFailure = (&'static str, std::io::Error);

/// Opens `path` for reading without following a symbolic link there.
pub(crate) fn open(path: &Path) -> Result<(File, Metadata), OpFailure> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| ("opening", e))?;
    let meta = file.metadata().map_err(|e| ("inspecting", e))?;
    Ok((file, meta))
}

/// Why a file with `meta` cannot be trusted, if it cannot: it is not a
/// regular file, another user owns it, or it has one of the permission
/// bits `forbidden` (`hint` says what to do about those).
pub(crate) fn refusal(meta: &Metadata, forbidden: u32, hint: &str) -> Option<String> {
    if !meta.file_type().is_file() {
        return Some("not a regular file".into());
    }
    let uid = crate::access::euid();
    if meta.uid() != uid {
        return Some(format!(
            "owned by uid {}, not this daemon's {uid}",
            meta.uid()
        ));
    }
    (meta.mode() & forbidden != 0).then(|| format!("mode {:04o}: {hint}", meta.mode() & 0o7777))
}

/// Puts `bytes` at `path`, mode 0600, unless a file is there: written to
/// `<path>.tmp`, synced, then hard-linked to `path`, which never replaces
/// a file. Returns whether `path` now holds `bytes` (false: a file was
/// there, left as it was). A daemon killed on the way leaves at most the
/// temporary file, which the next call removes.
pub(crate) fn publish(path: &Path, bytes: &[u8]) -> Result<bool, OpFailure> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    kvtier_io::create_private_dir_all(&dir).map_err(|e| ("creating the directory of", e))?;
    let tmp = temporary_name(path);
    remove_if_present(&tmp)?;
    write_private(&tmp, bytes)?;
    let linked = std::fs::hard_link(&tmp, path);
    remove_if_present(&tmp)?;
    match linked {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
        other => other.map_err(|e| ("linking", e))?,
    }
    sync_dir(&dir).map_err(|e| ("syncing the directory of", e))?;
    Ok(true)
}

/// Where [`publish`] writes before it links or renames.
pub(crate) fn temporary_name(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

fn remove_if_present(path: &Path) -> Result<(), OpFailure> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(("removing", e)),
        _ => Ok(()),
    }
}

/// Writes `bytes` to a new file at `path` (mode 0600, never through a
/// link) and syncs it.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> Result<(), OpFailure> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(kvtier_io::PRIVATE_FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| ("creating", e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| ("writing", e))
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}
