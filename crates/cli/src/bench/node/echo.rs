//! The control round trips' baseline: a raw Unix-socket round trip
//! between a worker process and this one, with no protocol and no runtime
//! (blocking reads and writes of one frame each way), timed beside the
//! daemon's round trips so both see the same machine. A request is an
//! 8-byte header (its own length and the reply's, little-endian `u32`s)
//! and its bytes; the reply is that many bytes.

use anyhow::{Context, Result};
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

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
    let mut header = [0u8; 8];
    let mut buf = Vec::new();
    while s.read_exact(&mut header).is_ok() {
        let (req, reply) = lengths(&header);
        buf.resize(req.max(reply), 0);
        if s.read_exact(&mut buf[..req]).is_err() || s.write_all(&buf[..reply]).is_err() {
            return;
        }
    }
}

fn lengths(header: &[u8; 8]) -> (usize, usize) {
    let [a, b, c, d, e, f, g, h] = *header;
    (
        u32::from_le_bytes([a, b, c, d]) as usize,
        u32::from_le_bytes([e, f, g, h]) as usize,
    )
}

/// A worker's end.
pub struct EchoClient {
    stream: UnixStream,
    /// The request (header first), reused; also where the reply is read.
    buf: Vec<u8>,
}

impl EchoClient {
    /// Connects to the parent's echo server.
    pub fn connect(path: &Path) -> Result<Self> {
        let stream = UnixStream::connect(path).context("connecting to the echo socket")?;
        Ok(Self {
            stream,
            buf: Vec::new(),
        })
    }

    /// One request of `req` bytes there and a reply of `reply` bytes back.
    pub fn round_trip(&mut self, req: usize, reply: usize) -> Result<()> {
        let len = |n: usize| u32::try_from(n).context("an echo frame over 4 GiB");
        self.buf.clear();
        self.buf.extend_from_slice(&len(req)?.to_le_bytes());
        self.buf.extend_from_slice(&len(reply)?.to_le_bytes());
        self.buf.resize(8 + req.max(reply), 7);
        self.stream
            .write_all(&self.buf[..8 + req])
            .context("echo write")?;
        self.stream
            .read_exact(&mut self.buf[..reply])
            .context("echo read")?;
        Ok(())
    }
}
