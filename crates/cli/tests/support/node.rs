//! `kvtier serve` the way engines use it: the daemon on a tiny store (its
//! log drained in the background so it never blocks on a full pipe),
//! clients of `kvtier-client`, block contents derived from the key alone
//! (so any process can check any block it reads), the daemon's counters by
//! name, bounded polling, and client processes.
//!
//! Client processes are the test binary itself started again: a test file
//! that needs them has an ignored test named [`WORKER_TEST`] whose body
//! reads its role from [`ROLE`] and returns at once when there is none.
//! [`Worker::spawn`] runs only that test (`--ignored --exact`), with the
//! role and its parameters in the environment; the worker reports to the
//! parent through lines on stdout that start with [`REPORT`].

use std::collections::HashMap;
use std::fmt::Display;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::str::FromStr;
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvtier_client::{
    BlockHash, Client, ClientConfig, ClientError, Lookup, Namespace, WireGeometry,
};
use kvtier_core::{Geometry, ModelPreset};

use super::Proc;

/// Tokens per block: tiny blocks of 16 KiB (2 layers of 8 KiB).
pub const TOKENS_PER_BLOCK: u32 = 16;
/// How long any state a test waits for may take before the test calls the
/// daemon or a worker stuck. Generous: it bounds a failure, it is not a
/// latency target, and CI machines are slow.
pub const PATIENCE: Duration = Duration::from_secs(30);
/// Pause between two looks at a state being polled.
const POLL: Duration = Duration::from_millis(5);

/// The environment variable that makes this test binary a client process.
pub const ROLE: &str = "KVTIER_TEST_ROLE";
/// The name of the ignored test that is the body of client processes.
pub const WORKER_TEST: &str = "client_process";
/// What starts a worker's report lines on its stdout (the test harness
/// prints its own lines there too).
pub const REPORT: &str = "kvt-report ";

/// The blocks' geometry.
pub fn geometry() -> Geometry {
    ModelPreset::Tiny.geometry(TOKENS_PER_BLOCK)
}

/// Bytes per block.
pub fn block_bytes() -> usize {
    geometry().block_bytes() as usize
}

/// The namespace every client of these tests uses.
pub fn namespace() -> Namespace {
    Namespace {
        model: "tiny".into(),
        dtype: "f32".into(),
        layout_version: 1,
        block_size_tokens: TOKENS_PER_BLOCK,
        tp_rank: 0,
        tp_size: 1,
        tenant_salt: None,
    }
}

/// The contents of block `key`: a splitmix64 stream seeded by the key, so
/// two keys never share a prefix of bytes and any process can check any
/// block.
pub fn block(key: u128) -> Vec<u8> {
    let mut state = (key as u64) ^ ((key >> 64) as u64).rotate_left(17) ^ 0x6b76_7469_6572;
    let mut out = Vec::with_capacity(block_bytes() + 8);
    while out.len() < block_bytes() {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(block_bytes());
    out
}

/// A unique shared-memory name for this process and `tag`.
pub fn shm_name(tag: &str) -> String {
    format!("kvtier-{tag}-{}", std::process::id())
}

/// Loads `ks` through `client` and checks each block it answers against
/// the bytes stored (the client verified them against `LoadOk`'s sums);
/// how many came.
pub fn load_all(client: &mut Client, ks: &[u128]) -> usize {
    let keys: Vec<BlockHash> = ks.iter().map(|k| BlockHash(*k)).collect();
    let mut bufs: Vec<Vec<u8>> = ks.iter().map(|_| vec![0u8; block_bytes()]).collect();
    let mut dsts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    let n = client.load_into(&keys, &mut dsts).expect("load");
    for (k, got) in ks.iter().zip(&bufs).take(n) {
        assert!(got[..] == block(*k)[..], "block {k:#x} differs");
    }
    n
}

/// Calls `probe` until it gives a value, pausing [`POLL`] between calls;
/// panics naming `what` after [`PATIENCE`].
pub fn wait_until<T>(what: impl Display, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "gave up after {PATIENCE:?} waiting for {what}"
        );
        std::thread::sleep(POLL);
    }
}

/// Stores blocks `ks` ([`block`] of each) through `client`; each must be
/// stored.
pub fn store_blocks(client: &mut Client, ks: &[u128]) {
    let blocks: Vec<Vec<u8>> = ks.iter().map(|k| block(*k)).collect();
    let pairs: Vec<(BlockHash, &[u8])> = ks
        .iter()
        .zip(&blocks)
        .map(|(k, b)| (BlockHash(*k), b.as_slice()))
        .collect();
    assert_eq!(
        client.store(&pairs).expect("store"),
        vec![kvtier_client::StoreOutcome::Stored; ks.len()]
    );
}

/// Writes cluster secret `secret`, private to this user (mode 0600), into
/// `dir`; its path.
pub fn secret_in(dir: &Path, secret: &[u8; 32]) -> String {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("cluster.secret");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .expect("create the secret");
    f.write_all(secret).expect("write the secret");
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// A daemon named `node` of cluster `cluster` over the metadata index at
/// `redis` (its blocks published there, a peer server on a free loopback
/// port, the cluster secret at `secret`), with `env` after.
pub fn cluster_member(
    data: &Path,
    node: &str,
    cluster: &str,
    redis: &str,
    secret: &str,
    env: &[(&str, &str)],
) -> Daemon {
    let mut all = vec![
        ("KVTIER_META__ENABLED", "true"),
        ("KVTIER_META__INDEX", redis),
        ("KVTIER_NODE", node),
        ("KVTIER_PEER__LISTEN", "127.0.0.1:0"),
        ("KVTIER_PEER__CLUSTER", cluster),
        ("KVTIER_PEER__SECRET_FILE", secret),
    ];
    all.extend_from_slice(env);
    Daemon::start(data, &shm_name(node), &all)
}

/// `kvtier serve` in a data directory, restartable with the same settings.
/// Stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Daemon {
    data: PathBuf,
    shm: String,
    env: Vec<(String, String)>,
    proc: Option<Proc>,
    /// Every log line of the current life of the process.
    log: Arc<Mutex<Vec<String>>>,
    log_reader: Option<JoinHandle<()>>,
    ready: String,
    /// Started without `[geometry]`: the first engine's `Hello` sets it.
    unshaped: bool,
}

impl Daemon {
    /// Starts `kvtier serve` on `data` with arena `shm`: tiny blocks, 4 MiB
    /// of arena, 16 MiB of disk in 1 MiB regions, pread/pwrite without
    /// fsync (these tests kill processes, not the machine), no metadata
    /// service; then `env` (`KVTIER_...` overrides). Waits until it is
    /// ready.
    pub fn start(data: &Path, shm: &str, env: &[(&str, &str)]) -> Self {
        let tokens = TOKENS_PER_BLOCK.to_string();
        let shape = [("KVTIER_GEOMETRY__TOKENS_PER_BLOCK", tokens.as_str())];
        Self::launched(data, shm, &shape, env)
    }

    /// [`start`](Self::start) without any `[geometry]`: the daemon takes
    /// the shape of the first engine's `Hello`, or the one its data
    /// directory keeps.
    pub fn start_unshaped(data: &Path, shm: &str, env: &[(&str, &str)]) -> Self {
        Self::launched(data, shm, &[], env)
    }

    /// A daemon started with `shape` (none: unshaped), the test defaults,
    /// then `env`.
    fn launched(data: &Path, shm: &str, shape: &[(&str, &str)], env: &[(&str, &str)]) -> Self {
        let mut all = shape.to_vec();
        all.extend_from_slice(&[
            ("KVTIER_META__ENABLED", "false"),
            ("KVTIER_DISK__IO_ENGINE", "psync"),
            ("KVTIER_DISK__SYNC", "false"),
        ]);
        all.extend_from_slice(env);
        let mut daemon = Self {
            data: data.to_owned(),
            shm: shm.to_owned(),
            env: all
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            proc: None,
            log: Arc::default(),
            log_reader: None,
            ready: String::new(),
            unshaped: shape.is_empty(),
        };
        daemon.launch();
        daemon
    }

    /// Starts the process again (after [`kill`](Self::kill) or
    /// [`terminate`](Self::terminate)) with the same settings and data.
    pub fn restart(&mut self) {
        assert!(self.proc.is_none(), "the daemon is still running");
        self.launch();
    }

    fn launch(&mut self) {
        let mut cmd = match self.unshaped {
            true => super::serve_unshaped(&self.data, &self.shm),
            false => super::serve(&self.data, &self.shm),
        };
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd.spawn().expect("start kvtier serve");
        let stderr = child.stderr.take().expect("stderr piped");
        self.proc = Some(Proc(child));
        self.log = Arc::default();
        let (ready_tx, ready_rx) = mpsc::channel();
        let log = Arc::clone(&self.log);
        // For debugging a failure: the daemon's log as it happens.
        let echo = std::env::var_os("KVTIER_TEST_ECHO_LOG").is_some();
        self.log_reader = Some(std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if echo {
                    eprintln!("daemon: {line}");
                }
                if line.contains("kvtier serving") {
                    let _ = ready_tx.send(line.clone());
                }
                log.lock().expect("log lock").push(line);
            }
        }));
        match ready_rx.recv_timeout(PATIENCE) {
            Ok(line) => self.ready = line,
            Err(e) => panic!(
                "kvtier serve not ready ({e}); its log:\n{}",
                self.log().join("\n")
            ),
        }
    }

    /// The process id of the current life.
    pub fn pid(&self) -> u32 {
        self.proc.as_ref().expect("a running daemon").0.id()
    }

    /// The node socket.
    pub fn socket(&self) -> PathBuf {
        self.data.join("node.sock")
    }

    /// The arena's shared-memory name.
    pub fn shm(&self) -> &str {
        &self.shm
    }

    /// The ready line of the current life.
    pub fn ready_line(&self) -> &str {
        &self.ready
    }

    /// Blocks of the disk log the current life adopted at its start, as
    /// its ready line says.
    pub fn adopted_g3(&self) -> u64 {
        self.adopted("g3")
    }

    /// Blocks the current life adopted into `tier` (`g2`: from the arena a
    /// killed daemon left; `g3`, `g4`) at its start, as its ready line says.
    pub fn adopted(&self, tier: &str) -> u64 {
        let field = format!("adopted_{tier}=");
        self.ready
            .split_whitespace()
            .find_map(|w| w.strip_prefix(field.as_str()))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {field} in the ready line: {}", self.ready))
    }

    /// The log lines of the current life so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().expect("log lock").clone()
    }

    /// The address the daemon logged as `<field>=<addr>`.
    pub fn logged_addr(&self, field: &str) -> std::net::SocketAddr {
        let log = self.log();
        let name = format!("{field}=");
        log.iter()
            .find_map(|l| {
                let at = l.find(&name)? + name.len();
                l[at..].split_whitespace().next()?.parse().ok()
            })
            .unwrap_or_else(|| panic!("no {field} in the log: {log:?}"))
    }

    /// What a client needs to connect.
    pub fn client_config(&self) -> ClientConfig {
        ClientConfig::new(self.socket(), namespace(), WireGeometry::from(&geometry()))
    }

    /// A connected client.
    pub fn client(&self) -> Client {
        Client::connect(self.client_config()).expect("connect to kvtier serve")
    }

    /// SIGKILL, and waits until the process is gone.
    pub fn kill(&mut self) {
        self.proc.take().expect("a running daemon").kill_now();
        self.join_log();
    }

    /// SIGTERM; its exit status and its whole log.
    pub fn terminate(&mut self) -> (ExitStatus, Vec<String>) {
        let status = self.proc.take().expect("a running daemon").terminate();
        self.join_log();
        (status, self.log())
    }

    /// Waits for the log reader, which ends with the process's stderr.
    fn join_log(&mut self) {
        if let Some(reader) = self.log_reader.take() {
            reader.join().expect("the log reader");
        }
    }
}

impl Drop for Daemon {
    /// A test that fails while the daemon is down (killed, not restarted)
    /// would leave its arena in /dev/shm; the running one stops itself
    /// (the `Proc` drop) and removes it.
    fn drop(&mut self) {
        if self.proc.is_none() {
            let _ = std::fs::remove_file(Path::new("/dev/shm").join(&self.shm));
        }
    }
}

/// The daemon's counters, by name.
#[derive(Debug, Clone)]
pub struct Stats(HashMap<String, u64>);

impl Stats {
    /// Asks the daemon.
    pub fn of(client: &mut Client) -> Self {
        let counters = client.stats().expect("stats");
        Self(counters.into_iter().map(|c| (c.name, c.value)).collect())
    }

    /// Counter `name`; panics if the daemon has no such counter, so a
    /// renamed counter fails loudly instead of reading as zero.
    pub fn get(&self, name: &str) -> u64 {
        match self.0.get(name) {
            Some(v) => *v,
            None => panic!("the daemon has no counter {name:?}: {:?}", self.0),
        }
    }
}

/// Loads block `key` alone and copies it out verified: `Some(bytes)` on a
/// hit, `None` on a miss. Panics on `Corrupt`: a pinned slot whose bytes do
/// not match the sums the daemon published means the daemon published
/// something it should not have (the reader refusing it is the last line
/// of defence, not the expected path).
pub fn read_block(client: &mut Client, key: u128) -> Option<Vec<u8>> {
    try_read_block(client, key).expect("load a block")
}

/// [`read_block`], handing back the errors of the connection.
pub fn try_read_block(client: &mut Client, key: u128) -> Result<Option<Vec<u8>>, ClientError> {
    let load = client.load(&[BlockHash(key)])?;
    let mut buf = vec![0u8; block_bytes()];
    let got = if load.prefix_len() == 1 {
        client.wait_layer(&load, geometry().layers - 1)?;
        match load.read(0, &mut buf)? {
            Lookup::Hit => Some(buf),
            Lookup::Miss => None,
            Lookup::Corrupt => panic!("block {key}: a pinned slot failed verification"),
        }
    } else {
        None
    };
    client.release_load(load)?;
    Ok(got)
}

/// Reads of a held block tried before it counts as unreadable.
const HELD_READ_TRIES: usize = 16;

/// [`try_read_block`] for a block that must not be lost: a load may miss
/// while concurrent transfers hold the arena's free slots (a miss is a
/// legitimate answer), so a miss of a block the node still holds (its
/// `Lookup` finds it) is retried. `None` only when the node no longer
/// holds it, or it stays unreadable over [`HELD_READ_TRIES`] loads.
pub fn try_read_held_block(client: &mut Client, key: u128) -> Result<Option<Vec<u8>>, ClientError> {
    for _ in 0..HELD_READ_TRIES {
        if let Some(bytes) = try_read_block(client, key)? {
            return Ok(Some(bytes));
        }
        if client.lookup(&[BlockHash(key)])?.is_empty() {
            return Ok(None);
        }
    }
    Ok(None)
}

/// Whether block `key`, which must not be lost, is readable (see
/// [`try_read_held_block`]); panics if it reads back other bytes than
/// [`block`]`(key)`.
pub fn check_held_block(client: &mut Client, key: u128) -> bool {
    match try_read_held_block(client, key).expect("load a block") {
        Some(bytes) => {
            assert!(bytes == block(key), "block {key} read back wrong bytes");
            true
        }
        None => false,
    }
}

/// Whether block `key` is readable; panics if it reads back other bytes
/// than [`block`]`(key)`.
pub fn check_block(client: &mut Client, key: u128) -> bool {
    match read_block(client, key) {
        Some(bytes) => {
            assert!(bytes == block(key), "block {key} read back wrong bytes");
            true
        }
        None => false,
    }
}

/// The role of this process, when it is a worker.
pub fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// Worker parameter `name` (environment `KVTIER_TEST_<NAME>`).
pub fn param<T: FromStr>(name: &str) -> T {
    let var = format!("KVTIER_TEST_{}", name.to_uppercase());
    let raw = std::env::var(&var).unwrap_or_else(|_| panic!("worker parameter {var} missing"));
    raw.parse()
        .unwrap_or_else(|_| panic!("worker parameter {var}={raw:?} does not parse"))
}

/// The client configuration of a worker: the daemon's socket from its
/// `socket` parameter.
pub fn worker_config() -> ClientConfig {
    let socket: PathBuf = param("socket");
    ClientConfig::new(socket, namespace(), WireGeometry::from(&geometry()))
}

/// The seed of a randomized test: `KVTIER_TEST_SEED` to replay one, else
/// fresh. Printed, so a failure can be replayed.
pub fn seed() -> u64 {
    let seed = std::env::var("KVTIER_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("seed {seed} (KVTIER_TEST_SEED={seed} replays it)");
    seed
}

/// Sends one report line to the parent test.
pub fn report(line: impl Display) {
    println!("{REPORT}{line}");
}

/// A client process: this test binary running [`WORKER_TEST`] in a role.
/// Killed when dropped, so a failing test leaves no process behind.
pub struct Worker {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Worker {
    /// Starts a worker in `role` with `params` (each becomes
    /// `KVTIER_TEST_<NAME>`).
    pub fn spawn(role: &str, params: &[(&str, String)]) -> Self {
        let exe = std::env::current_exe().expect("this test binary");
        let mut cmd = std::process::Command::new(exe);
        cmd.args(["--ignored", "--exact", WORKER_TEST])
            .args(["--nocapture", "--test-threads", "1", "--quiet"])
            .env(ROLE, role)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (name, value) in params {
            cmd.env(format!("KVTIER_TEST_{}", name.to_uppercase()), value);
        }
        let mut child = cmd.spawn().expect("start a worker");
        let stdout = child.stdout.take().expect("stdout piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(report) = line.strip_prefix(REPORT) {
                    let _ = tx.send(report.to_owned());
                }
            }
        });
        Self { child, lines }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next report; `None` once the worker has exited and every report
    /// was read. Panics after [`PATIENCE`] without one.
    pub fn next(&self) -> Option<String> {
        match self.lines.recv_timeout(PATIENCE) {
            Ok(line) => Some(line),
            Err(mpsc::RecvTimeoutError::Disconnected) => None,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("worker {} silent for {PATIENCE:?}", self.pid())
            }
        }
    }

    /// Reads reports until one satisfies `want` and returns it, handing
    /// every report on the way (that one included) to `seen`. Panics if the
    /// worker exits first.
    pub fn wait_for(&mut self, mut seen: impl FnMut(&str), want: impl Fn(&str) -> bool) -> String {
        loop {
            let Some(line) = self.next() else {
                let status = self.child.wait().expect("reap the worker");
                panic!("worker {} exited ({status}) early", self.pid());
            };
            seen(&line);
            if want(&line) {
                return line;
            }
        }
    }

    /// SIGKILL, and waits until the process is gone; returns the reports
    /// it wrote that were not handed out yet (it may have gone on after
    /// the last one read).
    pub fn kill(mut self) -> Vec<String> {
        self.child.kill().expect("SIGKILL the worker");
        self.child.wait().expect("reap the worker");
        std::iter::from_fn(|| self.next()).collect()
    }

    /// Waits for the worker to exit, requires success, and returns the
    /// reports it had not handed out yet.
    pub fn finish(mut self) -> Vec<String> {
        let mut rest = Vec::new();
        while let Some(line) = self.next() {
            rest.push(line);
        }
        let status = self.child.wait().expect("reap the worker");
        assert!(status.success(), "worker {} failed: {status}", self.pid());
        rest
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
