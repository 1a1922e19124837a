//! [`NodeServer`]: the Unix socket engines connect to, one session task
//! per connection.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::{Node, NodeError};

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
    /// Listens on `path` (mode 0660) for `node`. A socket file left by a
    /// daemon that is gone is replaced; one a live daemon answers on
    /// ([`NodeError::SocketInUse`]) and anything that is not a socket
    /// ([`NodeError::NotASocket`]) are refused and left alone. Must run
    /// inside a tokio runtime.
    pub async fn bind(node: Arc<Node>, path: &Path) -> Result<Self, NodeError> {
        clear_stale_socket(path).await?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| socket_err("creating", dir, source))?;
        }
        let listener =
            UnixListener::bind(path).map_err(|source| socket_err("binding", path, source))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
            .map_err(|source| socket_err("setting the mode of", path, source))?;
        let (stop, stop_rx) = watch::channel(false);
        let acceptor = tokio::spawn(accept_loop(node, listener, stop_rx));
        tracing::info!(socket = %path.display(), "node socket listening");
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

/// Removes a socket file nobody answers on; refuses a live one or a
/// non-socket.
async fn clear_stale_socket(path: &Path) -> Result<(), NodeError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(socket_err("inspecting", path, source)),
    };
    if !meta.file_type().is_socket() {
        return Err(NodeError::NotASocket {
            path: path.to_owned(),
        });
    }
    if UnixStream::connect(path).await.is_ok() {
        return Err(NodeError::SocketInUse {
            path: path.to_owned(),
        });
    }
    tracing::info!(socket = %path.display(), "replacing a stale node socket");
    std::fs::remove_file(path).map_err(|source| socket_err("removing the stale", path, source))
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
