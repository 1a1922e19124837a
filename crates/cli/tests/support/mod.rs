//! What the binary's integration tests share: a child process that never
//! outlives its test, and `kvtier serve` on a tiny store with its listeners
//! on OS-chosen loopback ports (so tests running side by side never
//! collide).

#![allow(dead_code)] // Each test file uses its own part of this module.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// A child process stopped on drop: SIGTERM first, so `kvtier serve`
/// removes its arena from /dev/shm, then SIGKILL if it has not stopped
/// within 20 s.
pub struct Proc(pub Child);

impl Proc {
    /// SIGTERM, and its exit status.
    pub fn terminate(mut self) -> ExitStatus {
        self.signal(libc::SIGTERM);
        self.0.wait().expect("wait for the child")
    }

    /// SIGKILL, and wait until it is gone (its locks with it).
    pub fn kill_now(mut self) {
        self.0.kill().expect("SIGKILL the child");
        self.0.wait().expect("reap the child");
    }

    fn signal(&self, sig: libc::c_int) {
        if let Ok(pid) = libc::pid_t::try_from(self.0.id()) {
            // SAFETY: kill(2) on our own child's pid has no memory effects.
            unsafe { libc::kill(pid, sig) };
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if !matches!(self.0.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `kvtier <args> --data-dir <data>` with the hosted metadata service on OS-chosen
/// loopback ports, a 1 MiB file pool, `info` logs on a piped stderr.
pub fn kvtier(args: &[&str], data: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvtier"));
    c.args(args)
        .arg("--data-dir")
        .arg(data)
        .env("KVTIER_META__BIND", "127.0.0.1")
        .env("KVTIER_META__RPC_PORT", "0")
        .env("KVTIER_META__HTTP_PORT", "0")
        .env("KVTIER_META__ADMIN_RPC_PORT", "0")
        .env("KVTIER_META__ADMIN_HTTP_PORT", "0")
        .env("KVTIER_META__POOL_CAPACITY", "1MiB")
        .env("KVTIER_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

/// `kvtier serve` on a tiny store: 4 MiB of DRAM in arena `shm`, 16 MiB of
/// disk in 1 MiB regions (each overridable with a later `.env`).
pub fn serve(data: &Path, shm: &str) -> Command {
    let mut c = kvtier(&["serve"], data);
    c.env("KVTIER_GEOMETRY__PRESET", "tiny")
        .env("KVTIER_GEOMETRY__TOKENS_PER_BLOCK", "32")
        .env("KVTIER_MEMORY__CAPACITY", "4MiB")
        .env("KVTIER_MEMORY__SHM_NAME", shm)
        .env("KVTIER_DISK__CAPACITY_PER_DIR", "16MiB")
        .env("KVTIER_DISK__REGION_SIZE", "1MiB");
    c
}

/// [`serve`] without `[geometry]`: the daemon takes the first engine's
/// shape, or the one its data directory keeps.
pub fn serve_unshaped(data: &Path, shm: &str) -> Command {
    let mut c = serve(data, shm);
    c.env_remove("KVTIER_GEOMETRY__PRESET")
        .env_remove("KVTIER_GEOMETRY__TOKENS_PER_BLOCK");
    c
}

/// One HTTP/1.1 request (`verb` `path`, a JSON `body` unless it is
/// `Null`, a bearer `key` if given) on a fresh connection; returns the
/// status code (0 if none) and the parsed JSON answer (`Null` if none).
pub fn http(
    addr: SocketAddr,
    verb: &str,
    path: &str,
    key: Option<&str>,
    body: &Value,
) -> (u16, Value) {
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let (status, answer) = http_text(addr, verb, path, key, &body);
    let json = serde_json::from_str(&answer).unwrap_or(Value::Null);
    (status, json)
}

/// Like [`http`], with the body as text both ways (e.g. `GET /metrics`).
pub fn http_text(
    addr: SocketAddr,
    verb: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> (u16, String) {
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "{verb} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("receive");
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let text = answer
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned());
    (status, text)
}

pub mod node;

/// The address after `key` in a "listening" log line.
pub fn addr_in(line: &str, key: &str) -> SocketAddr {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .unwrap_or_else(|| panic!("listening line names {key}: {line}"))
        .parse()
        .expect("an address")
}

/// Starts `cmd` and returns it with its stderr lines up to and including
/// the "listening" one (read as they come; no sleeping).
pub fn start_logged(cmd: &mut Command) -> (Proc, Vec<String>) {
    let mut child = cmd.spawn().expect("start kvtier");
    let stderr = child.stderr.take().expect("stderr piped");
    let proc = Proc(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("  | {line}");
            let _ = tx.send(line);
        }
    });
    let mut lines = Vec::new();
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("kvtier never printed its listening line: {lines:#?}"));
        let done = line.contains("metadata service listening");
        lines.push(line);
        if done {
            return (proc, lines);
        }
    }
}
