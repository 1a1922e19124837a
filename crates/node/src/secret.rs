//! The daemon's secret file: made once, at first start, and read at every
//! start after (docs/node-protocol.md §11.1).
//!
//! The secret derives every namespace key (so the keys a client can name)
//! and the key that authenticates the daemon's slot-table entries; whoever
//! reads it can name any block. So the file is the daemon user's alone
//! (mode 0600), and one that others can read or that is not a regular file
//! of ours is refused rather than used.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use kvtier_protocol::{KEY_BYTES, NodeSecret};

use crate::NodeError;

/// Loads the secret at `path`, or makes one there if there is none.
pub(crate) fn load_or_create(path: &Path) -> Result<NodeSecret, NodeError> {
    match load(path) {
        Err(NodeError::Secret { source, .. }) if is_not_found(&source) => create(path),
        other => other,
    }
}

fn is_not_found(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound
}

fn secret_err(op: &'static str, path: &Path, source: std::io::Error) -> NodeError {
    NodeError::Secret {
        op,
        path: path.to_owned(),
        source,
    }
}

/// Reads an existing secret, refusing one others could read or replace.
fn load(path: &Path) -> Result<NodeSecret, NodeError> {
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| secret_err("opening", path, e))?;
    let meta = file
        .metadata()
        .map_err(|e| secret_err("inspecting", path, e))?;
    check_private(path, &meta)?;
    let mut bytes = [0u8; KEY_BYTES];
    let mut extra = [0u8; 1];
    file.read_exact(&mut bytes)
        .map_err(|e| secret_err("reading", path, e))?;
    let more = file
        .read(&mut extra)
        .map_err(|e| secret_err("reading", path, e))?;
    if more != 0 {
        return Err(NodeError::BadSecret {
            path: path.to_owned(),
            why: format!("longer than {KEY_BYTES} bytes"),
        });
    }
    Ok(NodeSecret::from_bytes(bytes))
}

/// A secret file must be a regular file of this user that nobody else can
/// read or write.
fn check_private(path: &Path, meta: &std::fs::Metadata) -> Result<(), NodeError> {
    let bad = |why: String| {
        Err(NodeError::BadSecret {
            path: path.to_owned(),
            why,
        })
    };
    if !meta.file_type().is_file() {
        return bad("not a regular file".into());
    }
    let uid = crate::access::euid();
    if meta.uid() != uid {
        return bad(format!(
            "owned by uid {}, not this daemon's {uid}",
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        return bad(format!(
            "mode {:04o}: others may read it (chmod 600 it, or delete it to make a new one, which orphans every stored block)",
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Makes a new secret: written to a private temporary file, synced, then
/// linked to `path`, which never replaces a file there. A daemon killed on
/// the way leaves at most the temporary file, which the next start
/// removes; if another start linked first, its secret wins.
fn create(path: &Path) -> Result<NodeSecret, NodeError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    kvtier_io::create_private_dir_all(&dir)
        .map_err(|e| secret_err("creating the directory of", path, e))?;
    let bytes = random_bytes().map_err(|e| secret_err("drawing random bytes for", path, e))?;
    let tmp = temporary_name(path);
    remove_if_present(&tmp)?;
    write_private(&tmp, &bytes)?;
    let linked = std::fs::hard_link(&tmp, path);
    remove_if_present(&tmp)?;
    match linked {
        Ok(()) => {
            sync_dir(&dir).map_err(|e| secret_err("syncing the directory of", path, e))?;
            tracing::info!(path = %path.display(), "made a new node secret");
            Ok(NodeSecret::from_bytes(bytes))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => load(path),
        Err(e) => Err(secret_err("linking", path, e)),
    }
}

fn temporary_name(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

fn remove_if_present(path: &Path) -> Result<(), NodeError> {
    match std::fs::remove_file(path) {
        Err(e) if !is_not_found(&e) => Err(secret_err("removing", path, e)),
        _ => Ok(()),
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), NodeError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(kvtier_io::PRIVATE_FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| secret_err("creating", path, e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| secret_err("writing", path, e))
}

fn random_bytes() -> std::io::Result<[u8; KEY_BYTES]> {
    let mut bytes = [0u8; KEY_BYTES];
    File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_secret_is_made_once_private_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/node.secret");
        let made = load_or_create(&path).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(meta.len(), KEY_BYTES as u64);
        assert_eq!(
            load_or_create(&path).unwrap(),
            made,
            "read back, not remade"
        );
        assert!(!temporary_name(&path).exists());
        let other = tempfile::tempdir().unwrap();
        let again = load_or_create(&other.path().join("node.secret")).unwrap();
        assert_ne!(again, made, "each daemon draws its own");
    }

    #[test]
    fn a_secret_others_can_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.secret");
        load_or_create(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = load_or_create(&path).unwrap_err();
        assert!(matches!(err, NodeError::BadSecret { .. }), "{err}");
        assert!(err.to_string().contains("0640"), "{err}");
    }

    #[test]
    fn a_short_or_long_secret_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0, KEY_BYTES - 1, KEY_BYTES + 1] {
            let path = dir.path().join(format!("secret-{len}"));
            write_private(&path, &vec![7u8; len]).unwrap();
            assert!(load_or_create(&path).is_err(), "{len} bytes");
        }
    }

    #[test]
    fn a_symlink_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        load_or_create(&real).unwrap();
        let link = dir.path().join("node.secret");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(load_or_create(&link).is_err());
    }
}
