//! [`NodeServer`]: the Unix socket engines connect to, one session task
//! per connection.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::{Node, NodeError, access};

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
    /// `manager.access_group`, from its first instant under that name (see
    /// [`bind_private`]). Its directory is refused if another user can
    /// write it ([`NodeError::UnsafeDir`]) and made if missing. A socket
    /// file of this user nobody answers on (a daemon that is gone) is
    /// replaced; one a live daemon answers on ([`NodeError::SocketInUse`]),
    /// one owned by another user ([`NodeError::ForeignSocket`], never
    /// connected to) and anything that is not a socket
    /// ([`NodeError::NotASocket`]) are refused and left alone. Must run
    /// inside a tokio runtime.
    pub async fn bind(node: Arc<Node>, path: &Path) -> Result<Self, NodeError> {
        let group = node.options().access_group;
        let (mode, dir_mode) = match group {
            Some(_) => (access::SHARED_SOCKET_MODE, access::SHARED_DATA_DIR_MODE),
            None => (access::SOCKET_MODE, access::DATA_DIR_MODE),
        };
        let dir = access::socket_dir(path);
        access::prepare_socket_dir(dir, dir_mode, group)?;
        check_existing_socket(path).await?;
        let listener = bind_private(path, dir, mode, group)?;
        let (stop, stop_rx) = watch::channel(false);
        let acceptor = tokio::spawn(accept_loop(node, listener, stop_rx));
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

async fn accept_loop(node: Arc<Node>, listener: UnixListener, mut stop: watch::Receiver<bool>) {
    let mut sessions = JoinSet::new();
    let mut next_id = 1u64;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let id = next_id;
                    next_id += 1;
                    sessions.spawn(crate::session::serve(node.clone(), stream, id, stop.clone()));
                }
                Err(e) => {
                    // Out of descriptors and the like: the listener stays,
                    // the next accept may succeed.
                    tracing::warn!(error = %e, "accepting a node connection failed");
                    tokio::task::yield_now().await;
                }
            },
            Some(done) = sessions.join_next() => {
                if let Err(e) = done {
                    tracing::error!(error = %e, "a node session task failed");
                }
            }
            _ = stop.changed() => break,
        }
    }
    drop(listener);
    while let Some(done) = sessions.join_next().await {
        if let Err(e) = done {
            tracing::error!(error = %e, "a node session task failed");
        }
    }
}
