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
