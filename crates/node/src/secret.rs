//! The daemon's secret file: made once, at first start, and read at every
//! start after (docs/node-protocol.md §11.1).
//!
//! The secret derives every namespace key (so the keys a client can name)
//! and the key that authenticates the daemon's slot-table entries; whoever
//! reads it can name any block. So the file is the daemon user's alone
//! (mode 0600), and one that others can read or that is not a regular file
//! of ours is refused rather than used.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use kvtier_protocol::{KEY_BYTES, NodeSecret};

use crate::{NodeError, own_file};

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
    let (mut file, meta) = own_file::open(path).map_err(|(op, e)| secret_err(op, path, e))?;
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
    let hint = "others may read it (chmod 600 it, or delete it to make a new one, which orphans every stored block)";
    match own_file::refusal(meta, 0o077, hint) {
        Some(why) => Err(NodeError::BadSecret {
            path: path.to_owned(),
            why,
        }),
        None => Ok(()),
    }
}

/// Makes a new secret: written to a private temporary file, synced, then
/// linked to `path`, which never replaces a file there. A daemon killed on
/// the way leaves at most the temporary file, which the next start
/// removes; if another start linked first, its secret wins.
fn create(path: &Path) -> Result<NodeSecret, NodeError> {
    let bytes = random_bytes().map_err(|e| secret_err("drawing random bytes for", path, e))?;
    match own_file::publish(path, &bytes) {
        Ok(true) => {
            tracing::info!(path = %path.display(), "made a new node secret");
            Ok(NodeSecret::from_bytes(bytes))
        }
        Ok(false) => load(path),
        Err((op, e)) => Err(secret_err(op, path, e)),
    }
}

fn random_bytes() -> std::io::Result<[u8; KEY_BYTES]> {
    let mut bytes = [0u8; KEY_BYTES];
    File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;
    use crate::own_file::{temporary_name, write_private};

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
