//! `kvtier serve` killed with SIGKILL at any moment of its startup always
//! starts again: the next start reaches readiness and serves (meta HTTP
//! `/health`, the arena readable by another process), and a clean stop at
//! the end leaves nothing in `/dev/shm` for its shared-memory name.
//!
//! Kill moments alternate between a random delay over the whole startup
//! window (measured on a first clean start, from right after spawn to past
//! readiness) and the instant a new file appears under the arena's name,
//! which is when a build that names the arena before writing its header is
//! most exposed. Each round's restarted daemon is killed once ready, so a
//! random-delay round starts on the whole arena of a dead owner, which the
//! victim adopts (and may be killed while adopting); a new-file round
//! starts with no arena, as a new file only appears where there is none.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rand::Rng;
use support::Proc;

mod support;

/// Kill-and-restart cycles.
const ITERATIONS: usize = 40;
/// How long one start may take before the test calls it stuck.
const READY_DEADLINE: Duration = Duration::from_secs(60);

/// `kvtier serve` with an arena big enough that reserving and populating
/// it takes a noticeable part of the startup, small enough to stay quick.
fn serve(data: &Path, shm: &str) -> Command {
    let mut c = support::serve(data, shm);
    c.env("KVTIER_MEMORY__CAPACITY", "64MiB")
        .env("KVTIER_DISK__CAPACITY_PER_DIR", "8MiB");
    c
}

/// What the log reader reports.
enum Event {
    /// The meta HTTP address and that the ready line appeared.
    Ready(SocketAddr),
    /// The process closed its log without becoming ready; its log.
    Exited(Vec<String>),
}

/// Starts `kvtier serve` and waits (reading its log, no sleeping) until it
/// is ready; returns it with its meta HTTP address. Panics with the log if
/// it exits or does not become ready in time.
fn start_ready(cmd: &mut Command) -> Proc {
    start_ready_at(cmd).0
}

fn start_ready_at(cmd: &mut Command) -> (Proc, SocketAddr) {
    let mut child = cmd.spawn().expect("start kvtier serve");
    let stderr = child.stderr.take().expect("stderr piped");
    let proc = Proc(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut log = Vec::new();
        let mut addr = None;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("metadata service listening") {
                addr = line
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("meta_http="))
                    .and_then(|a| a.parse().ok());
            }
            if line.contains("kvtier serving")
                && let Some(a) = addr
            {
                let _ = tx.send(Event::Ready(a));
            }
            log.push(line);
        }
        let _ = tx.send(Event::Exited(log));
    });
    match rx.recv_timeout(READY_DEADLINE) {
        Ok(Event::Ready(addr)) => (proc, addr),
        Ok(Event::Exited(log)) => panic!(
            "kvtier serve exited without becoming ready:\n{}",
            log.join("\n")
        ),
        Err(e) => panic!("kvtier serve not ready after {READY_DEADLINE:?}: {e}"),
    }
}

/// GET /health on the meta HTTP listener; panics unless 200 and healthy.
fn assert_healthy(addr: SocketAddr) {
    let (status, health) = support::http(addr, "GET", "/health", None, &serde_json::Value::Null);
    assert_eq!(status, 200, "{health}");
    assert_eq!(health["healthy"], true, "{health}");
}

/// The inode now at `path`, if any.
fn inode(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// Waits (polling, with a deadline) until `path` names a file other than
/// `old`, or the child has exited.
fn wait_for_new_file(path: &Path, old: Option<u64>, child: &mut Proc) {
    let deadline = Instant::now() + READY_DEADLINE;
    while inode(path) == old || inode(path).is_none() {
        if child.0.try_wait().expect("poll child").is_some() {
            return;
        }
        assert!(Instant::now() < deadline, "no arena appeared at {path:?}");
        std::thread::yield_now();
    }
}

/// Whether a live process holds the lock of the file at `path`: a
/// non-blocking shared lock is refused. (Were it free, the shared lock
/// taken here goes with the descriptor at the end of the call.)
fn lock_is_held(path: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).expect("open the arena");
    // SAFETY: flock(2) on a descriptor we own has no memory effects.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK)
}

/// Files in `/dev/shm` whose name contains `shm`.
fn shm_files(shm: &str) -> Vec<PathBuf> {
    std::fs::read_dir("/dev/shm")
        .expect("list /dev/shm")
        .map_while(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains(shm))
        .map(|e| e.path())
        .collect()
}

#[test]
fn serve_restarts_after_sigkill_at_any_moment_of_startup() {
    let data = tempfile::tempdir().expect("data dir");
    let shm = format!("kvtier-kill-loop-{}", std::process::id());
    let arena = Path::new("/dev/shm").join(&shm);
    let mut rng = rand::rng();

    // A first clean start measures the startup window.
    let began = Instant::now();
    let first = start_ready(&mut serve(data.path(), &shm));
    let window = began.elapsed() + began.elapsed() / 4;
    first.kill_now();

    for i in 0..ITERATIONS {
        if i % 2 == 1 {
            // The last owner is dead (killed and reaped): no lock to respect.
            let _ = std::fs::remove_file(&arena);
        }
        let before = inode(&arena);
        let mut victim = Proc(serve(data.path(), &shm).spawn().expect("spawn"));
        if i % 2 == 0 {
            // Right after spawn on the first round, then anywhere.
            let delay = if i == 0 {
                Duration::ZERO
            } else {
                window.mul_f64(rng.random::<f64>())
            };
            std::thread::sleep(delay);
        } else {
            wait_for_new_file(&arena, before, &mut victim);
        }
        victim.kill_now();

        let (restarted, addr) = start_ready_at(&mut serve(data.path(), &shm));
        assert_healthy(addr);
        let reader = kvtier_arena::ArenaReader::open(&shm)
            .unwrap_or_else(|e| panic!("round {i}: the restarted arena is unreadable: {e}"));
        drop(reader);
        // The arena at the name is the restarted daemon's: its lock is
        // held (the header's owner pid names its creator, which an
        // adopting daemon is not).
        assert!(lock_is_held(&arena), "round {i}: nobody owns the arena");
        // Killed once ready as well: the next start finds a whole arena of
        // a dead owner.
        restarted.kill_now();
    }

    // A last start, stopped cleanly, leaves nothing behind.
    let last = start_ready(&mut serve(data.path(), &shm));
    // SAFETY: kill(2) on our own child's pid, which has not been reaped.
    assert_eq!(unsafe { libc::kill(last.0.id() as i32, libc::SIGTERM) }, 0);
    let mut last = last;
    let status = last.0.wait().expect("wait for kvtier serve");
    assert!(status.success(), "exit {status:?}");
    assert_eq!(
        shm_files(&shm),
        Vec::<PathBuf>::new(),
        "stray files in /dev/shm"
    );
}
