//! Test helpers (cargo feature `test-support`): [`MotoServer`], a real
//! S3-compatible server for tests.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `moto_server` (PyPI `moto[server]`) on 127.0.0.1 with a free port,
/// killed on drop. Credentials are not checked; use any (`"testing"`).
#[derive(Debug)]
pub struct MotoServer {
    child: Child,
    port: u16,
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nothing listens on right now (bound, read, released).
///
/// # Panics
///
/// If no local port can be bound.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free local port: {e}"))
}

/// One raw HTTP/1.1 request without a body to `127.0.0.1:port`; returns the
/// status line.
pub fn http(port: u16, method: &str, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out.lines().next().unwrap_or_default().to_owned())
}

impl MotoServer {
    /// Starts `moto_server` (or `python3 -m moto.server`) and waits (up to
    /// 60 s) until it answers.
    ///
    /// # Panics
    ///
    /// If moto is not installed (with how to install it), exits early, or
    /// does not answer in time: tests that need it fail clearly.
    pub fn start() -> MotoServer {
        let port = free_port();
        let spawn = |prog: &str, args: &[&str]| {
            Command::new(prog)
                .args(args)
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
        };
        let child = spawn("moto_server", &[])
            .or_else(|_| spawn("python3", &["-m", "moto.server"]))
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start moto_server ({e}); install it with `pip install 'moto[server]'`"
                )
            });
        let mut moto = MotoServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = moto.child.try_wait() {
                panic!("moto_server exited with {status}; is `moto[server]` installed?");
            }
            if http(port, "GET", "/").is_ok_and(|s| s.contains(" 200")) {
                return moto;
            }
            assert!(
                Instant::now() < deadline,
                "moto_server not ready on port {port} after 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its endpoint URL, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates bucket `name`.
    ///
    /// # Panics
    ///
    /// If moto does not answer 200.
    pub fn create_bucket(&self, name: &str) {
        let status = http(self.port, "PUT", &format!("/{name}"))
            .unwrap_or_else(|e| panic!("create bucket {name}: {e}"));
        assert!(status.contains(" 200"), "create bucket {name}: {status}");
    }

    /// A [`RemoteConfig`](crate::RemoteConfig) for `s3://<bucket>/<prefix>`
    /// on this server, with test credentials and a 5 s timeout.
    pub fn config(&self, bucket: &str, prefix: &str) -> crate::RemoteConfig {
        crate::RemoteConfig {
            url: format!("s3://{bucket}/{prefix}"),
            endpoint: Some(self.endpoint()),
            access_key_id: Some("testing".into()),
            secret_access_key: Some("testing".into()),
            allow_http: true,
            timeout_ms: 5_000,
            ..crate::RemoteConfig::default()
        }
    }

    /// A raw store client for `bucket` on this server (to plant or inspect
    /// objects behind a tier's back).
    ///
    /// # Panics
    ///
    /// If the client cannot be built.
    pub fn store(&self, bucket: &str) -> std::sync::Arc<dyn object_store::ObjectStore> {
        let s = object_store::aws::AmazonS3Builder::new()
            .with_endpoint(self.endpoint())
            .with_allow_http(true)
            .with_region("us-east-1")
            .with_bucket_name(bucket)
            .with_access_key_id("testing")
            .with_secret_access_key("testing")
            .build()
            .unwrap_or_else(|e| panic!("s3 client: {e}"));
        std::sync::Arc::new(s)
    }
}

/// A [`RemoteConfig`](crate::RemoteConfig) for objects under the local
/// directory `root` (`file://`), with a 5 s timeout and 4 requests at once.
pub fn file_config(root: &std::path::Path) -> crate::RemoteConfig {
    crate::RemoteConfig {
        url: format!("file://{}", root.display()),
        timeout_ms: 5_000,
        max_concurrency: 4,
        ..crate::RemoteConfig::default()
    }
}

/// Where a test of the cluster's shared G4 keeps it: a bucket on a moto
/// server, or a directory standing for one every node mounts. One
/// scenario runs on either.
#[derive(Debug)]
pub enum SharedStore {
    /// `s3://<bucket>/<prefix>` on a moto server of its own.
    S3 {
        /// The server, stopped on drop.
        moto: MotoServer,
        /// The bucket, created.
        bucket: String,
    },
    /// `file://<dir>/<prefix>`, the directory created and removed on drop.
    Dir(tempfile::TempDir),
}

/// The key prefix (S3) or subdirectory (directory) of the shared G4.
const SHARED_PREFIX: &str = "shared";

/// Files the stores' own checks make and remove (the metadata service's
/// health probe, a shared directory's start check): not block objects.
fn is_check_file(path: &object_store::path::Path) -> bool {
    path.filename().is_some_and(|f| f.starts_with(".kvtier-"))
}

impl SharedStore {
    /// A moto server with `bucket` created.
    pub fn s3(bucket: &str) -> Self {
        let moto = MotoServer::start();
        moto.create_bucket(bucket);
        Self::S3 {
            moto,
            bucket: bucket.to_owned(),
        }
    }

    /// A fresh directory with the shared G4's subdirectory made, as an
    /// operator prepares a shared mount.
    ///
    /// # Panics
    ///
    /// If the directory cannot be made.
    pub fn dir() -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temporary directory: {e}"));
        std::fs::create_dir(dir.path().join(SHARED_PREFIX))
            .unwrap_or_else(|e| panic!("shared directory: {e}"));
        Self::Dir(dir)
    }

    /// The shared G4's directory, for a directory store.
    pub fn path(&self) -> Option<std::path::PathBuf> {
        match self {
            Self::S3 { .. } => None,
            Self::Dir(d) => Some(d.path().join(SHARED_PREFIX)),
        }
    }

    /// `[shared_g4] url`.
    pub fn url(&self) -> String {
        self.config().url
    }

    /// How a node reaches the shared G4 (a 5 s timeout).
    pub fn config(&self) -> crate::RemoteConfig {
        match self {
            Self::S3 { moto, bucket } => moto.config(bucket, SHARED_PREFIX),
            Self::Dir(d) => file_config(&d.path().join(SHARED_PREFIX)),
        }
    }

    /// The S3 endpoint, for a bucket store.
    pub fn endpoint(&self) -> Option<String> {
        match self {
            Self::S3 { moto, .. } => Some(moto.endpoint()),
            Self::Dir(_) => None,
        }
    }

    /// The environment a `kvtier serve` of the cluster needs for it:
    /// `KVTIER_SHARED_G4__URL`, and the endpoint and credentials of a
    /// bucket.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![("KVTIER_SHARED_G4__URL".to_owned(), self.url())];
        if let Some(endpoint) = self.endpoint() {
            for (k, v) in [
                ("AWS_ENDPOINT_URL", endpoint.as_str()),
                ("AWS_ACCESS_KEY_ID", "testing"),
                ("AWS_SECRET_ACCESS_KEY", "testing"),
                ("AWS_REGION", "us-east-1"),
            ] {
                env.push((k.to_owned(), v.to_owned()));
            }
        }
        env
    }

    /// A raw client of the shared G4's objects, keys relative to the
    /// bucket or to the shared directory (to plant or inspect objects
    /// behind the nodes' backs).
    ///
    /// # Panics
    ///
    /// If the client cannot be built.
    pub fn client(&self) -> std::sync::Arc<dyn object_store::ObjectStore> {
        match self {
            Self::S3 { moto, bucket } => moto.store(bucket),
            Self::Dir(d) => std::sync::Arc::new(
                object_store::local::LocalFileSystem::new_with_prefix(d.path().join(SHARED_PREFIX))
                    .unwrap_or_else(|e| panic!("directory client: {e}")),
            ),
        }
    }

    /// The block objects with their bytes (the stores' own check files
    /// left out: they come and go).
    ///
    /// # Panics
    ///
    /// If the store cannot be listed or read.
    pub async fn objects(&self) -> Vec<(object_store::path::Path, bytes::Bytes)> {
        use futures::TryStreamExt;
        let store = self.client();
        let listed: Vec<object_store::ObjectMeta> = (store.list(None).try_collect().await)
            .unwrap_or_else(|e| panic!("list the shared G4: {e}"));
        let mut out = Vec::new();
        for meta in listed.into_iter().filter(|m| !is_check_file(&m.location)) {
            let get = async { store.get(&meta.location).await?.bytes().await };
            // Deleted between the list and the get: not there.
            match get.await {
                Ok(bytes) => out.push((meta.location, bytes)),
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => panic!("read {}: {e}", meta.location),
            }
        }
        out
    }

    /// Writes `objects` (as [`SharedStore::objects`] lists them) back.
    ///
    /// # Panics
    ///
    /// If a write fails.
    pub async fn put_objects(&self, objects: &[(object_store::path::Path, bytes::Bytes)]) {
        let store = self.client();
        for (path, bytes) in objects {
            (store.put(path, bytes.clone().into()).await)
                .unwrap_or_else(|e| panic!("put {path}: {e}"));
        }
    }

    /// For a directory store: every file below it is mode `0600` and
    /// every directory below it `0700` (the shared directory itself is
    /// the operator's). Returns the files seen; a bucket has no modes
    /// (`None`).
    ///
    /// # Panics
    ///
    /// If one is wider, or the tree cannot be read.
    pub fn assert_private(&self) -> Option<usize> {
        fn walk(dir: &std::path::Path, files: &mut usize) {
            use std::os::unix::fs::MetadataExt;
            let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{dir:?}: {e}"));
            for entry in entries {
                let path = entry.unwrap_or_else(|e| panic!("{dir:?}: {e}")).path();
                let Ok(meta) = std::fs::symlink_metadata(&path) else {
                    continue; // removed meanwhile (a check file)
                };
                let mode = meta.mode() & 0o7777;
                if meta.is_dir() {
                    assert_eq!(mode, 0o700, "{path:?} is {mode:o}");
                    walk(&path, files);
                } else {
                    assert_eq!(mode, 0o600, "{path:?} is {mode:o}");
                    *files += 1;
                }
            }
        }
        let dir = self.path()?;
        let mut files = 0;
        walk(&dir, &mut files);
        Some(files)
    }
}
