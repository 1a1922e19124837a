//! Test helpers (cargo feature `test-support`): a real `redis-server` on a
//! free 127.0.0.1 port, started by the test and stopped on drop, and a
//! small real tmpfs ([`Tmpfs`]) to run out of space on. For this crate's
//! tests and for other crates' tests (add `kvtier-meta = { workspace =
//! true, features = ["test-support"] }` to their dev-dependencies).
//!
//! The binary is `redis-server` from `PATH`, or `$KVTIER_REDIS_SERVER`
//! (e.g. `valkey-server`). A missing binary is an error that says how to
//! install it; tests should fail on it, not skip.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a fresh server may take to answer `PING`.
const READY_WITHIN: Duration = Duration::from_secs(15);

/// Why a test server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum RedisServerError {
    /// The binary is not installed.
    #[error(
        "{0:?} not found: install it (`apt-get install -y redis-server`) or set \
         KVTIER_REDIS_SERVER to a redis-server/valkey-server binary"
    )]
    Missing(String),
    /// Spawning, a scratch directory, or a socket failed.
    #[error("redis-server: {0}")]
    Io(#[from] std::io::Error),
    /// The server exited or did not answer `PING` in time.
    #[error("redis-server on port {port} did not become ready: {log}")]
    NotReady {
        /// The port it was started on.
        port: u16,
        /// The tail of its log.
        log: String,
    },
}

/// A `redis-server` child process with persistence off and its own scratch
/// directory; killed (and the directory removed) on drop.
#[derive(Debug)]
pub struct RedisServer {
    binary: String,
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers `PING`.
    pub fn start() -> Result<Self, RedisServerError> {
        let binary =
            std::env::var("KVTIER_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned());
        let dir = std::env::temp_dir().join(format!(
            "kvtier-redis-{}-{:x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir)?;
        let mut server = RedisServer {
            binary,
            port: 0,
            dir,
            child: None,
        };
        // A port found free can be taken before the server binds it: retry
        // on a new one.
        let mut last = None;
        for _ in 0..3 {
            server.port = free_port()?;
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e @ RedisServerError::NotReady { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(RedisServerError::NotReady {
            port: server.port,
            log: String::new(),
        }))
    }

    /// `redis://127.0.0.1:<port>/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server (SIGKILL: no shutdown, like a crash). Its data is
    /// gone: persistence is off.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the server (SIGSTOP), as a network partition looks to its
    /// clients: connections stay open and nothing is answered.
    pub fn pause(&self) -> std::io::Result<()> {
        self.send(rustix::process::Signal::STOP)
    }

    /// Lets a paused server run again (SIGCONT); its data is intact.
    pub fn resume(&self) -> std::io::Result<()> {
        self.send(rustix::process::Signal::CONT)
    }

    fn send(&self, sig: rustix::process::Signal) -> std::io::Result<()> {
        let child = self
            .child
            .as_ref()
            .ok_or_else(|| std::io::Error::other("redis-server is not running"))?;
        let pid = i32::try_from(child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .ok_or_else(|| std::io::Error::other("redis-server has no valid pid"))?;
        rustix::process::kill_process(pid, sig).map_err(std::io::Error::from)
    }

    /// Starts it again on the same port (after [`RedisServer::kill`]).
    pub fn restart(&mut self) -> Result<(), RedisServerError> {
        self.kill();
        self.spawn()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    fn spawn(&mut self) -> Result<(), RedisServerError> {
        let log = std::fs::File::create(self.log_path())?;
        let child = Command::new(&self.binary)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => RedisServerError::Missing(self.binary.clone()),
                _ => RedisServerError::Io(e),
            })?;
        self.child = Some(child);
        self.wait_ready()
    }

    /// Polls `PING` until `+PONG`, the child exits, or the deadline.
    fn wait_ready(&mut self) -> Result<(), RedisServerError> {
        let deadline = Instant::now() + READY_WITHIN;
        while Instant::now() < deadline {
            let exited = match self.child.as_mut() {
                Some(child) => child.try_wait()?.is_some(),
                None => true,
            };
            if exited {
                break;
            }
            if ping(self.port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        Err(RedisServerError::NotReady {
            port: self.port,
            log: tail(&self.log_path()),
        })
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(
        &(Ipv4Addr::LOCALHOST, port).into(),
        Duration::from_millis(200),
    ) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

fn tail(path: &Path) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let start = log.len().saturating_sub(2000);
    log.get(start..).unwrap_or(&log).to_owned()
}

/// A real tmpfs of a fixed size mounted on a fresh directory under the
/// system temp dir, for tests that fill a file system (`ENOSPC`) and free
/// it again. Mounting needs root (`CAP_SYS_ADMIN`); a failure to mount is
/// an error that says so, for the test to fail on. Unmounted (lazily, if
/// something still holds a file there) and removed on drop, also when the
/// test panics.
#[derive(Debug)]
pub struct Tmpfs {
    dir: PathBuf,
}

/// Name of the file [`Tmpfs::fill`] writes.
const FILLER: &str = "filler";

impl Tmpfs {
    /// Mounts a tmpfs of `bytes` bytes, its root mode 0700.
    pub fn mount(bytes: u64) -> std::io::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "kvtier-tmpfs-{}-{:x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir)?;
        let out = Command::new("mount")
            // 0700 like a directory `kvtier serve` makes itself: it refuses
            // a data directory others may write (tmpfs defaults to 1777).
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={bytes},mode=0700"),
                "tmpfs",
            ])
            .arg(&dir)
            .output()?;
        if !out.status.success() {
            let _ = std::fs::remove_dir(&dir);
            return Err(std::io::Error::other(format!(
                "mounting a tmpfs on {} failed (tests that fill a disk need root): {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(Tmpfs { dir })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Writes a filler file until the file system answers `ENOSPC`, down to
    /// the last byte; returns the bytes written. Any other error is
    /// returned.
    pub fn fill(&self) -> std::io::Result<u64> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(FILLER))?;
        let mut written = 0u64;
        for chunk in [1usize << 20, 4096, 1] {
            let buf = vec![0x5au8; chunk];
            loop {
                match f.write(&buf) {
                    Ok(0) => break,
                    Ok(n) => written += n as u64,
                    Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(written)
    }

    /// Removes the filler file.
    pub fn free(&self) -> std::io::Result<()> {
        std::fs::remove_file(self.dir.join(FILLER))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let unmounted = Command::new("umount")
            .arg(&self.dir)
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A service world shared by the tests that attach storage backends: a
/// file pool `pool` at `dir`, an S3 storage `plain` (never reached), group
/// `g` over `storages`, and instance `i` (model `m`, 16 tokens per block,
/// location specs `tp0` and `tp1` of `spec_bytes` each).
pub mod world {
    use std::collections::BTreeMap;
    use std::path::Path;
    use std::sync::Arc;

    use crate::*;

    /// A healthy, enabled storage.
    pub fn storage(name: &str, kind: StorageKind, uri: String) -> Storage {
        Storage {
            name: name.into(),
            kind,
            uri,
            enabled: true,
            health: StorageHealth::Healthy,
            spec: None,
        }
    }

    /// The service described in the module docs.
    ///
    /// # Panics
    /// When the service refuses its setup (a test bug).
    pub async fn service(
        index: Arc<dyn MetaIndex>,
        dir: &Path,
        storages: &[&str],
        config: MetaConfig,
        spec_bytes: u64,
    ) -> Arc<MetaService> {
        let ledger = Arc::new(LocalLedger::new());
        service_on(index, ledger, dir, storages, config, spec_bytes).await
    }

    /// [`service`] over `ledger`: with the ledger of a shared index, one
    /// frontend of several (each sets up the same catalog).
    ///
    /// # Panics
    /// When the service refuses its setup (a test bug).
    pub async fn service_on(
        index: Arc<dyn MetaIndex>,
        ledger: Arc<dyn Ledger>,
        dir: &Path,
        storages: &[&str],
        config: MetaConfig,
        spec_bytes: u64,
    ) -> Arc<MetaService> {
        let svc = MetaService::with_ledger(index, ledger, config).expect("service");
        let pool_uri = format!("file://{}", dir.display());
        svc.put_storage(storage("pool", StorageKind::FilePool, pool_uri))
            .expect("pool storage");
        svc.put_storage(storage("plain", StorageKind::S3, "s3://b/p".into()))
            .expect("s3 storage");
        svc.put_group(InstanceGroup {
            name: "g".into(),
            quota_bytes: 1 << 40,
            kind_quota_bytes: BTreeMap::new(),
            watermark: 0.9,
            eviction: EvictionPolicy::Lru,
            storages: storages.iter().map(|s| s.to_string()).collect(),
            max_instances: 4,
            ..Default::default()
        })
        .expect("group");
        let specs = ["tp0", "tp1"].iter().map(|n| LocationSpecInfo {
            name: n.to_string(),
            size: spec_bytes,
        });
        svc.register_instance(Instance {
            id: "i".into(),
            group: "g".into(),
            model: "m".into(),
            block_size: 16,
            location_specs: specs.collect(),
            spec_groups: vec![],
        })
        .await
        .expect("instance");
        Arc::new(svc)
    }

    /// Block keys `r`.
    pub fn keys(r: std::ops::Range<u64>) -> Vec<BlockKey> {
        r.map(BlockKey).collect()
    }

    /// Every location URI of a write grant.
    pub fn uris(grant: &WriteGrant) -> Vec<String> {
        grant
            .blocks
            .iter()
            .flat_map(|b| b.location.specs.iter().map(|s| s.uri.clone()))
            .collect()
    }
}
