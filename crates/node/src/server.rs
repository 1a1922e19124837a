//! [`NodeServer`]: the Unix socket engines connect to, one session task
//! per connection.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use kvtier_protocol::{Error, ErrorCode, Message};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::stats::Counters;
use crate::{Node, NodeError, NodeHost, access};

/// The listening socket and its sessions. [`shutdown`](Self::shutdown)
/// stops accepting, ends every session (dropping their reservations and
/// pins) and removes the socket file.
pub struct NodeServer {
    path: PathBuf,
    stop: watch::Sender<bool>,
    acceptor: JoinHandle<()>,
}

impl std::fmt::Debug for NodeServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeServer")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl NodeServer {
    /// Listens on `path` for `node`: mode 0600, or 0660 with the group of
    /// `manager.access_group`, from its first instant under that name (it
    /// is bound in a private staging directory, given its mode and group,
    /// then renamed into place). Its directory is refused if another user can
    /// write it ([`NodeError::UnsafeDir`]) and made if missing. A socket
    /// file of this user nobody answers on (a daemon that is gone) is
    /// replaced; one a live daemon answers on ([`NodeError::SocketInUse`]),
    /// one owned by another user ([`NodeError::ForeignSocket`], never
    /// connected to) and anything that is not a socket
    /// ([`NodeError::NotASocket`]) are refused and left alone. Must run
    /// inside a tokio runtime.
    pub async fn bind(node: Arc<Node>, path: &Path) -> Result<Self, NodeError> {
        Self::bind_host(NodeHost::of(node), path).await
    }

    /// [`bind`](Self::bind) for a host whose node may wait for its shape:
    /// connections are served before it is known, and the first `Hello`
    /// opens the node ([`NodeHost`]).
    pub async fn bind_host(host: Arc<NodeHost>, path: &Path) -> Result<Self, NodeError> {
        let group = host.options().access_group;
        let (mode, dir_mode) = match group {
            Some(_) => (access::SHARED_SOCKET_MODE, access::SHARED_DATA_DIR_MODE),
            None => (access::SOCKET_MODE, access::DATA_DIR_MODE),
        };
        let dir = access::socket_dir(path);
        access::prepare_socket_dir(dir, dir_mode, group)?;
        check_existing_socket(path).await?;
        let listener = bind_private(path, dir, mode, group)?;
        let (stop, stop_rx) = watch::channel(false);
        let acceptor = tokio::spawn(accept_loop(host, listener, stop_rx));
        tracing::info!(socket = %path.display(), mode = format_args!("{mode:04o}"), group = ?group, "node socket listening");
        Ok(Self {
            path: path.to_owned(),
            stop,
            acceptor,
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting, ends every session and waits for them, then removes
    /// the socket file.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.acceptor.await {
            tracing::warn!(error = %e, "the node socket's acceptor failed");
        }
        if let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(socket = %self.path.display(), error = %e, "could not remove the node socket");
        }
    }
}

fn socket_err(op: &'static str, path: &Path, source: std::io::Error) -> NodeError {
    NodeError::Socket {
        op,
        path: path.to_owned(),
        source,
    }
}

/// Whether the socket file at `path` may be replaced: nothing there, or a
/// socket of this user nobody answers on. Anything else is refused, and a
/// socket of another user is not even connected to: an impostor's
/// listener learns nothing from us.
async fn check_existing_socket(path: &Path) -> Result<(), NodeError> {
    if !access::existing_socket(path)? {
        return Ok(());
    }
    if UnixStream::connect(path).await.is_ok() {
        return Err(NodeError::SocketInUse {
            path: path.to_owned(),
        });
    }
    tracing::info!(socket = %path.display(), "replacing a stale node socket");
    Ok(())
}

/// Binds a listener at `path` (in directory `dir`) that never exists there
/// with a wider mode than `mode`: it is bound inside a fresh directory of
/// this user's (0700, so nobody else can connect meanwhile, whatever the
/// umask made the socket), given `mode` and `group`, then renamed onto
/// `path`, which atomically replaces a stale socket there. The staging
/// directory, `<dir>/.b<pid in base 36>/s`, is no longer than
/// `<dir>/node.sock`, so a path that fits a socket address still does.
fn bind_private(
    path: &Path,
    dir: &Path,
    mode: u32,
    group: Option<u32>,
) -> Result<UnixListener, NodeError> {
    // The staging name is per process: two servers of one process (tests)
    // binding in the same directory take turns with it.
    static STAGING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = STAGING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let staging = dir.join(format!(".b{}", base36(std::process::id())));
    // A staging directory of an earlier process with our pid that died
    // between its mkdir and its rename.
    clear_staging(&staging);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging)
        .map_err(|source| socket_err("creating", &staging, source))?;
    let staged = staging.join("s");
    let bound = bind_staged(&staged, mode, group).and_then(|listener| {
        std::fs::rename(&staged, path)
            .map_err(|source| socket_err("renaming the new socket onto", path, source))?;
        Ok(listener)
    });
    clear_staging(&staging);
    bound
}

/// Binds `staged` and gives it `mode` and `group`.
fn bind_staged(staged: &Path, mode: u32, group: Option<u32>) -> Result<UnixListener, NodeError> {
    let listener =
        UnixListener::bind(staged).map_err(|source| socket_err("binding", staged, source))?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(staged, None, Some(gid))
            .map_err(|source| socket_err("setting the group of", staged, source))?;
    }
    std::fs::set_permissions(staged, std::fs::Permissions::from_mode(mode))
        .map_err(|source| socket_err("setting the mode of", staged, source))?;
    Ok(listener)
}

/// Removes the staging directory and the socket in it, if any (after a
/// successful rename the socket is gone from it).
fn clear_staging(staging: &Path) {
    let _ = std::fs::remove_file(staging.join("s"));
    let _ = std::fs::remove_dir(staging);
}

/// `n` in base 36, lower case: the shortest portable spelling of a pid.
fn base36(mut n: u32) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

async fn accept_loop(host: Arc<NodeHost>, listener: UnixListener, mut stop: watch::Receiver<bool>) {
    let mut a = Acceptor::new(host, listener);
    loop {
        // Before any accept: a descriptor freed since goes to the spare
        // first, or the sessions would take every one and no refusal could
        // be answered.
        if a.spare.is_none() {
            a.spare = open_spare();
        }
        let paused = a.backoff.until;
        tokio::select! {
            accepted = a.listener.accept(), if paused.is_none() => match accepted {
                Ok((stream, _)) => a.admit(stream, &stop),
                Err(e) => a.failed(&e),
            },
            _ = tokio::time::sleep_until(paused.unwrap_or_else(Instant::now)), if paused.is_some() => {
                a.backoff.until = None;
            }
            Some(done) = a.sessions.join_next() => joined(done),
            _ = stop.changed() => break,
        }
    }
    drop(a.listener);
    while let Some(done) = a.sessions.join_next().await {
        joined(done);
    }
    while a.lingering.join_next().await.is_some() {}
}

fn joined(done: Result<(), tokio::task::JoinError>) {
    if let Err(e) = done {
        tracing::error!(error = %e, "a node session task failed");
    }
}

/// Time between two log lines about the same trouble of the acceptor.
const LOG_EVERY: Duration = Duration::from_secs(10);
/// First pause after a failed accept; each further failure doubles it.
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// Longest pause between accepts that fail.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How long a refused connection stays open for the client's first frame
/// (so its `Hello` write succeeds and it reads the refusal).
const REFUSAL_LINGER: Duration = Duration::from_secs(1);
/// Refused connections lingering at once; past this they close at once.
const MAX_LINGERING: usize = 64;

/// The accept loop's state: the sessions, the connection count, and what
/// it does when accepting fails.
struct Acceptor {
    host: Arc<NodeHost>,
    listener: UnixListener,
    sessions: JoinSet<()>,
    /// Refused connections waiting for their client's first frame.
    lingering: JoinSet<()>,
    next_id: u64,
    /// A descriptor held back so that, out of descriptors (`EMFILE`), the
    /// acceptor can still take a waiting connection to refuse it.
    spare: Option<std::fs::File>,
    backoff: Backoff,
    failure_log: Throttle,
    refusal_log: Throttle,
}

impl Acceptor {
    fn new(host: Arc<NodeHost>, listener: UnixListener) -> Self {
        Self {
            host,
            listener,
            sessions: JoinSet::new(),
            lingering: JoinSet::new(),
            next_id: 1,
            spare: open_spare(),
            backoff: Backoff::default(),
            failure_log: Throttle::default(),
            refusal_log: Throttle::default(),
        }
    }

    /// Starts a session for `stream`, or refuses it past
    /// `manager.max_connections`.
    fn admit(&mut self, stream: UnixStream, stop: &watch::Receiver<bool>) {
        self.backoff.reset();
        let max = self.host.options().max_connections;
        let open = self.host.counters.connections_open.load(Ordering::Relaxed);
        if open >= max as u64 {
            let why = format!(
                "the node serves at most {max} connections (manager.max_connections); connect again later"
            );
            self.refuse(stream, why, true);
            return;
        }
        // Counted here, not in the task, so a burst of accepts cannot pass
        // the cap before the sessions start.
        let open = OpenConnection::new(self.host.counters.clone());
        let id = self.next_id;
        self.next_id += 1;
        let session = crate::session::serve_host(self.host.clone(), stream, id, stop.clone());
        self.sessions.spawn(async move {
            session.await;
            drop(open);
        });
    }

    /// A failed accept: out of descriptors, refuses one waiting connection
    /// with the spare descriptor; otherwise pauses accepting (the
    /// connection stays queued, and accepting at once would fail again).
    fn failed(&mut self, e: &std::io::Error) {
        Counters::add(&self.host.counters.accept_failures, 1);
        if out_of_descriptors(e) && self.refuse_with_spare() {
            return;
        }
        let pause = self.backoff.pause();
        if let Some(failures) = self.failure_log.due(Instant::now()) {
            tracing::warn!(
                error = %e,
                failures,
                pause_ms = pause.as_millis() as u64,
                "accepting node connections fails; pausing accepts"
            );
        }
    }

    /// Frees the spare descriptor, takes a waiting connection with it and
    /// refuses it; whether one was refused. The refused connection lingers
    /// on the freed descriptor, so the spare is opened again only once it
    /// is closed (until then accepts pause as for any other failure).
    fn refuse_with_spare(&mut self) -> bool {
        let Some(spare) = self.spare.take() else {
            return false;
        };
        drop(spare);
        let refused = try_accept(&self.listener).map(|stream| {
            let why = "the node is out of file descriptors; connect again later".to_owned();
            self.refuse(stream, why, true);
        });
        self.spare = open_spare();
        if refused.is_some() {
            // A connection left the queue: the next failure starts short.
            self.backoff.reset();
        }
        refused.is_some()
    }

    /// Answers `Error { code: BUSY }` and closes `stream`, after the
    /// client's first frame when `linger` (and few others linger).
    fn refuse(&mut self, stream: UnixStream, why: String, linger: bool) {
        Counters::add(&self.host.counters.connections_refused, 1);
        if let Some(refused) = self.refusal_log.due(Instant::now()) {
            tracing::warn!(refused, reason = %why, "refusing node connections");
        }
        let reply = Message::Error(Error {
            request_id: 0,
            code: ErrorCode::BUSY,
            message: why,
        });
        // Written on the plain socket: tokio's `try_write` answers
        // `WouldBlock` until the reactor has seen a new socket writable,
        // which would drop the refusal at random. A new socket's send
        // buffer is empty, so the small frame fits whole.
        let Ok(stream) = stream.into_std() else {
            return;
        };
        if let Ok(frame) = reply.to_frame() {
            let _ = (&stream).write(&frame);
        }
        while self.lingering.try_join_next().is_some() {}
        if linger
            && self.lingering.len() < MAX_LINGERING
            && let Ok(stream) = UnixStream::from_std(stream)
        {
            self.lingering.spawn(linger_then_close(stream));
        }
    }
}

/// A connection counted in `connections_open` until dropped.
struct OpenConnection(Arc<Counters>);

impl OpenConnection {
    fn new(counters: Arc<Counters>) -> Self {
        Counters::add(&counters.connections_open, 1);
        Self(counters)
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        Counters::sub(&self.0.connections_open, 1);
    }
}

/// Whether a failed accept means the process or the system is out of
/// descriptors or buffers: the connection stays queued and accepting again
/// at once fails the same way.
fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// The spare descriptor (`/dev/null`), if one can be opened.
fn open_spare() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

/// A connection already waiting on `listener`, without waiting for one.
fn try_accept(listener: &UnixListener) -> Option<UnixStream> {
    let mut cx = Context::from_waker(Waker::noop());
    match listener.poll_accept(&mut cx) {
        Poll::Ready(Ok((stream, _))) => Some(stream),
        Poll::Ready(Err(_)) | Poll::Pending => None,
    }
}

/// Keeps a refused connection open until its client's first frame arrives
/// (or it leaves, or [`REFUSAL_LINGER`] passes): closing before the client
/// wrote its `Hello` would fail that write, and the client would never read
/// why it was refused.
async fn linger_then_close(stream: UnixStream) {
    if tokio::time::timeout(REFUSAL_LINGER, stream.readable())
        .await
        .is_ok()
    {
        // Unread bytes at the close would reset the client's connection.
        let mut sink = [0u8; 4096];
        let _ = stream.try_read(&mut sink);
    }
}

/// The pause between failing accepts: from [`FIRST_BACKOFF`], doubling up
/// to [`MAX_BACKOFF`], back to the first after an accept succeeds.
#[derive(Debug)]
struct Backoff {
    next: Duration,
    /// Accepting resumes at this time.
    until: Option<Instant>,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: FIRST_BACKOFF,
            until: None,
        }
    }
}

impl Backoff {
    /// Pauses accepting; how long for.
    fn pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = (pause * 2).min(MAX_BACKOFF);
        self.until = Some(Instant::now() + pause);
        pause
    }

    fn reset(&mut self) {
        self.next = FIRST_BACKOFF;
    }
}

/// Lets one log line through per [`LOG_EVERY`], counting the events in
/// between.
#[derive(Debug, Default)]
struct Throttle {
    last: Option<Instant>,
    count: u64,
}

impl Throttle {
    /// Counts an event; the events since the last line, when one is due.
    fn due(&mut self, now: Instant) -> Option<u64> {
        self.count += 1;
        if self.last.is_some_and(|last| now < last + LOG_EVERY) {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_a_second_and_resets() {
        let mut b = Backoff::default();
        let pauses: Vec<u64> = (0..9).map(|_| b.pause().as_millis() as u64).collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.reset();
        assert_eq!(b.pause(), FIRST_BACKOFF);
    }

    #[test]
    fn the_throttle_logs_once_per_interval_with_the_count() {
        let mut t = Throttle::default();
        let start = Instant::now();
        assert_eq!(t.due(start), Some(1));
        let logged: Vec<u64> = (1..=1000)
            .filter_map(|i| t.due(start + Duration::from_millis(i * 20)))
            .collect();
        // 1000 events over 20 s: a line at 10 s and one at 20 s.
        assert_eq!(logged, [500, 500]);
    }
}
