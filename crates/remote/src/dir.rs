//! [`PrivateDir`]: a directory as an object store whose files and
//! directories only their owner's user can reach.
//!
//! [`LocalFileSystem`] makes files `0666` and directories `0777` less the
//! umask (typically `0644` and `0755`): every local user could read every
//! stored prompt's KV. Here each object's missing parent directories are
//! made first, mode `0700` ([`kvtier_io::create_private_dir_all`]), so the
//! file is out of others' reach from the moment it exists, and the file
//! is then narrowed to `0600`. The directory itself is the operator's:
//! its mode is left as it is (a shared directory may be meant for a
//! group). Multipart uploads are refused: their files appear before this
//! store could narrow them, and nothing in kvtier uses them.

use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path as FsPath, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use futures::stream::BoxStream;
use kvtier_io::{PRIVATE_FILE_MODE, create_private_dir_all};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

use crate::{RemoteConfig, RemoteError};

/// Name under which this store reports its errors.
const STORE: &str = "PrivateDir";

/// A directory as an object store; see the module's documentation.
#[derive(Debug)]
pub struct PrivateDir {
    fs: LocalFileSystem,
    root: PathBuf,
}

/// `e` as the store's error.
fn generic(e: impl std::error::Error + Send + Sync + 'static) -> object_store::Error {
    object_store::Error::Generic {
        store: STORE,
        source: Box::new(e),
    }
}

/// Runs the file system call `f` off the async workers (an NFS call can
/// block for long).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> object_store::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(generic)?
        .map_err(generic)
}

impl PrivateDir {
    /// The store of the directory of `url` (`file:///dir`) and the URL as
    /// object URIs show it ([`RemoteConfig::canonical_url`]). Nothing is
    /// made here, and a directory that goes missing later fails every
    /// write (see also [`RemoteConfig::check_existing`]).
    ///
    /// # Errors
    /// [`RemoteError::BadUrl`] for any other URL or a missing directory.
    pub fn open(url: &str) -> Result<(Self, String), RemoteError> {
        let cfg = RemoteConfig {
            url: url.to_owned(),
            ..RemoteConfig::default()
        };
        let canonical = cfg.canonical_url()?;
        let dir = (cfg.dir()?).ok_or_else(|| RemoteError::BadUrl {
            url: url.to_owned(),
            reason: "not a file:///dir URL".into(),
        })?;
        Ok((Self::new(url, &dir)?, canonical))
    }

    /// The store of the directory `root`. Deleting an object removes the
    /// directories it leaves empty, up to `root`.
    pub(crate) fn new(url: &str, root: &FsPath) -> Result<Self, RemoteError> {
        let fs = LocalFileSystem::new_with_prefix(root)
            .map_err(|e| RemoteError::BadUrl {
                url: url.to_owned(),
                reason: e.to_string(),
            })?
            .with_automatic_cleanup(true);
        Ok(Self {
            fs,
            root: root.to_owned(),
        })
    }

    /// Makes the missing parent directories of `location` (mode `0700`)
    /// and returns its file.
    /// and returns its file. The directory itself is never made: gone,
    /// it is a file system no longer mounted, and nothing is written.
    async fn prepare(&self, location: &Path) -> object_store::Result<PathBuf> {
        let file = self.fs.path_to_filesystem(location)?;
        let root = self.root.clone();
        if let Some(parent) = file.parent().map(FsPath::to_owned) {
            blocking(move || {
                if !root.is_dir() {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("directory {} is gone", root.display()),
                    ));
                }
                create_private_dir_all(&parent)
            })
            .await?;
        }
        Ok(file)
    }

    /// Runs `op`, which makes the object at `to`, between making its
    /// parent directories and narrowing its file (`op` starts only when
    /// awaited here).
    async fn make(
        &self,
        to: &Path,
        op: impl std::future::Future<Output = object_store::Result<()>>,
    ) -> object_store::Result<()> {
        let file = self.prepare(to).await?;
        op.await?;
        Self::restrict(file).await
    }

    /// Narrows `file` to `0600`.
    async fn restrict(file: PathBuf) -> object_store::Result<()> {
        blocking(move || {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(PRIVATE_FILE_MODE))
        })
        .await
    }
}

impl fmt::Display for PrivateDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{STORE}({})", self.root.display())
    }
}

/// Checks that `dir` is a directory this process can make files in, by
/// making (`0600`) and removing a probe file: a shared file system that
/// is not mounted, or mounted read-only, is refused here rather than at
/// the first write. The error names the directory.
pub(crate) fn check_writable_dir(url: &str, dir: &FsPath) -> Result<(), RemoteError> {
    let bad = |reason: String| RemoteError::BadUrl {
        url: url.to_owned(),
        reason,
    };
    let shown = dir.display();
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(bad(format!("{shown} is not a directory"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(bad(format!(
                "directory {shown} does not exist (is the shared file system mounted?)"
            )));
        }
        Err(e) => return Err(bad(format!("directory {shown}: {e}"))),
    }
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let probe = dir.join(format!(".kvtier-check-{}-{nanos}", std::process::id()));
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(PRIVATE_FILE_MODE)
        .open(&probe)
        .map_err(|e| bad(format!("cannot write in directory {shown}: {e}")))?;
    std::fs::remove_file(&probe)
        .map_err(|e| bad(format!("cannot remove a file in directory {shown}: {e}")))
}

#[async_trait::async_trait]
impl ObjectStore for PrivateDir {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let file = self.prepare(location).await?;
        let put = self.fs.put_opts(location, payload, opts).await?;
        Self::restrict(file).await?;
        Ok(put)
    }

    async fn put_multipart_opts(
        &self,
        _location: &Path,
        _opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Err(object_store::Error::NotSupported {
            source: "multipart uploads into a private directory".into(),
        })
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.fs.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[std::ops::Range<u64>],
    ) -> object_store::Result<Vec<bytes::Bytes>> {
        self.fs.get_ranges(location, ranges).await
    }

    async fn head(&self, location: &Path) -> object_store::Result<ObjectMeta> {
        self.fs.head(location).await
    }

    /// A missing object's error names the object, as an object store's
    /// does (the file system's names the file), so callers that match a
    /// bulk delete's answers to their objects find it.
    async fn delete(&self, location: &Path) -> object_store::Result<()> {
        match self.fs.delete(location).await {
            Err(object_store::Error::NotFound { source, .. }) => {
                Err(object_store::Error::NotFound {
                    path: location.to_string(),
                    source,
                })
            }
            r => r,
        }
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.fs.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.fs.list_with_delimiter(prefix).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.make(to, self.fs.copy(from, to)).await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.make(to, self.fs.copy_if_not_exists(from, to)).await
    }

    async fn rename(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.make(to, self.fs.rename(from, to)).await
    }

    async fn rename_if_not_exists(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.make(to, self.fs.rename_if_not_exists(from, to)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn mode(p: &FsPath) -> u32 {
        std::fs::metadata(p).unwrap().mode() & 0o7777
    }

    /// Objects are 0600 and the directories made for them 0700 (not the
    /// umask's 0644 and 0755); the operator's directory keeps its mode; a
    /// deleted object's emptied directories go with it.
    #[tokio::test]
    async fn objects_and_their_directories_are_private() {
        let root = tempfile::tempdir().unwrap();
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let store = PrivateDir::new("file:///x", root.path()).unwrap();
        let at = Path::from("inst/a-b/block");
        store
            .put(&at, PutPayload::from_static(b"kv"))
            .await
            .unwrap();
        assert_eq!(mode(&root.path().join("inst/a-b/block")), 0o600);
        assert_eq!(mode(&root.path().join("inst/a-b")), 0o700);
        assert_eq!(mode(&root.path().join("inst")), 0o700);
        assert_eq!(mode(root.path()), 0o755);
        let copied = Path::from("inst/c-d/block");
        store.copy(&at, &copied).await.unwrap();
        assert_eq!(mode(&root.path().join("inst/c-d/block")), 0o600);
        store.delete(&at).await.unwrap();
        assert!(!root.path().join("inst/a-b").exists());
        match store.delete(&at).await {
            Err(object_store::Error::NotFound { path, .. }) => assert_eq!(path, at.to_string()),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            store.put_multipart(&at).await,
            Err(object_store::Error::NotSupported { .. })
        ));
        // The directory itself is never made again once gone.
        let gone = root.path().join("unmounted");
        let url = format!("file://localhost{}/", gone.display());
        let e = PrivateDir::open(&url).unwrap_err().to_string();
        assert!(e.contains("unmounted"), "{e}");
        std::fs::create_dir(&gone).unwrap();
        let (store, canonical) = PrivateDir::open(&url).unwrap();
        assert_eq!(canonical, format!("file://{}", gone.display()));
        std::fs::remove_dir(&gone).unwrap();
        assert!(
            store
                .put(&at, PutPayload::from_static(b"kv"))
                .await
                .is_err()
        );
        assert!(!gone.exists());
    }

    #[test]
    fn a_missing_or_odd_directory_is_refused_by_name() {
        let root = tempfile::tempdir().unwrap();
        check_writable_dir("file:///x", root.path()).unwrap();
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
        let missing = root.path().join("not-mounted");
        let e = check_writable_dir("file:///x", &missing).unwrap_err();
        assert!(e.to_string().contains("not-mounted"), "{e}");
        assert!(e.to_string().contains("does not exist"), "{e}");
        let file = root.path().join("plain");
        std::fs::write(&file, b"").unwrap();
        let e = check_writable_dir("file:///x", &file).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
        // Nobody, root included, makes files in /proc.
        let e = check_writable_dir("file:///proc", FsPath::new("/proc")).unwrap_err();
        assert!(
            e.to_string().contains("cannot write in directory /proc"),
            "{e}"
        );
    }
}
