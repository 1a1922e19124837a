//! The control round trips' baseline: a raw Unix-socket round trip
//! between a worker process and this one, with no protocol and no runtime
//! (blocking reads and writes of one small frame), timed beside the
//! daemon's round trips so both see the same machine.

use anyhow::{Context, Result};
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Bytes of one echoed frame (about a small request).
const FRAME: usize = 64;

/// Echoes every frame a connection sends until it closes, a thread per
/// connection. Lives as long as the bench; its socket is in its own
/// temporary directory.
pub struct EchoServer {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl EchoServer {
    /// Listens and starts accepting.
    pub fn start() -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("kvtier-bench-echo")
            .tempdir()
            .context("creating the echo socket's directory")?;
        let path = dir.path().join("echo.sock");
        let listener = UnixListener::bind(&path).context("listening on the echo socket")?;
        // Accepts until the process ends; each connection ends with its
        // worker.
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                std::thread::spawn(move || echo(stream));
            }
        });
        Ok(Self { path, _dir: dir })
    }

    /// The socket workers connect to.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn echo(mut s: UnixStream) {
    let mut frame = [0u8; FRAME];
    while s.read_exact(&mut frame).is_ok() {
        if s.write_all(&frame).is_err() {
            return;
        }
    }
}

/// A worker's end.
pub struct EchoClient(UnixStream);

impl EchoClient {
    /// Connects to the parent's echo server.
    pub fn connect(path: &Path) -> Result<Self> {
        Ok(Self(
            UnixStream::connect(path).context("connecting to the echo socket")?,
        ))
    }

    /// One frame there and back.
    pub fn round_trip(&mut self) -> Result<()> {
        let mut frame = [7u8; FRAME];
        self.0.write_all(&frame).context("echo write")?;
        self.0.read_exact(&mut frame).context("echo read")?;
        Ok(())
    }
}
