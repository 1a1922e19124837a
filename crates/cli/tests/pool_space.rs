//! `kvtier serve` reserves its file pool (`meta.pool_capacity` in
//! `<data_dir>/pool`) at start: a pool its file system cannot hold is
//! refused before the arena, the disk tier or any pool file is made, with
//! the sizes and the path in the error; one that fits is reserved block for
//! block. The data dir is a small tmpfs mounted for the test; the disk tier
//! (which needs O_DIRECT) stays on the normal disk.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{ChildStderr, Command};
use std::sync::mpsc;
use std::time::Duration;

use kvtier_meta::test_support::Tmpfs;
use support::Proc;

mod support;

/// `kvtier serve` with its data dir (index, pool) in `data` and its disk
/// tier in `disk`, a pool of `pool` bytes.
fn serve(data: &Path, disk: &Path, shm: &str, pool: &str) -> Command {
    let mut c = support::serve(data, shm);
    c.env(
        "KVTIER_DISK__DIRS",
        format!("[{:?}]", disk.display().to_string()),
    )
    .env("KVTIER_DISK__CAPACITY_PER_DIR", "8MiB")
    .env("KVTIER_META__POOL_CAPACITY", pool);
    c
}

/// An 8 MiB tmpfs for the data dir.
fn small_fs() -> Tmpfs {
    Tmpfs::mount(8 << 20).expect("a tmpfs for the data dir (this test needs root)")
}

/// What a start printed: its log up to readiness or exit.
struct Log {
    lines: Vec<String>,
    /// The ready line appeared (the process is still running then).
    ready: bool,
}

/// Reads `stderr` (on a thread, no sleeping) until the ready line or the
/// end of the log; panics after `deadline` without either.
fn read_log(stderr: ChildStderr, deadline: Duration) -> Log {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let ready = line.contains("kvtier serving");
            lines.push(line);
            if ready {
                let _ = tx.send(Log {
                    lines: lines.clone(),
                    ready: true,
                });
            }
        }
        let _ = tx.send(Log {
            lines,
            ready: false,
        });
    });
    rx.recv_timeout(deadline)
        .unwrap_or_else(|e| panic!("kvtier serve neither ready nor gone after {deadline:?}: {e}"))
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(dir) {
        Ok(e) => e.map_while(Result::ok).map(|e| e.path()).collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn an_oversized_pool_is_refused_before_anything_is_created() {
    let fs = small_fs();
    let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("disk dir");
    let disk_dir = disk.path().join("tier");
    let shm = format!("kvtier-pool-space-{}", std::process::id());
    let mut child = serve(fs.path(), &disk_dir, &shm, "64MiB")
        .spawn()
        .expect("start kvtier serve");
    let stderr = child.stderr.take().expect("stderr piped");
    let mut proc = Proc(child);
    let log = read_log(stderr, Duration::from_secs(60));
    assert!(
        !log.ready,
        "started with a 64 MiB pool on 8 MiB:\n{}",
        log.lines.join("\n")
    );
    let err = log.lines.join("\n");
    let status = proc.0.wait().expect("wait for kvtier serve");
    assert!(!status.success(), "exit {status:?}:\n{err}");
    let pool_dir = fs.path().join("pool");
    for part in [
        "cannot reserve 67108864 bytes".to_owned(),
        "bytes are free".to_owned(),
        pool_dir.display().to_string(),
    ] {
        assert!(err.contains(&part), "error does not name {part:?}:\n{err}");
    }
    assert_eq!(entries(&pool_dir), Vec::<PathBuf>::new(), "pool files left");
    assert!(!disk_dir.exists(), "the disk tier was created:\n{err}");
    assert!(
        !Path::new("/dev/shm").join(&shm).exists(),
        "the arena was created"
    );
}

#[test]
fn a_pool_that_fits_is_reserved_at_start() {
    let fs = small_fs();
    let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("disk dir");
    let shm = format!("kvtier-pool-fits-{}", std::process::id());
    let mut child = serve(fs.path(), &disk.path().join("tier"), &shm, "4MiB")
        .spawn()
        .expect("start kvtier serve");
    let stderr = child.stderr.take().expect("stderr piped");
    let proc = Proc(child);
    let log = read_log(stderr, Duration::from_secs(60));
    assert!(log.ready, "kvtier serve exited:\n{}", log.lines.join("\n"));
    let log = log.lines;
    let pool_dir = fs.path().join("pool");
    let files = entries(&pool_dir);
    assert_eq!(files.len(), 4, "{files:?}");
    for f in &files {
        let m = std::fs::metadata(f).unwrap();
        assert_eq!(m.len(), 1 << 20, "{}", f.display());
        assert!(m.blocks() * 512 >= 1 << 20, "{} is sparse", f.display());
    }
    // One line per reservation: what, where, how many bytes.
    for what in [
        "file pool: disk space reserved",
        "disk tier: disk space reserved",
    ] {
        let line = log
            .iter()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what:?} line:\n{}", log.join("\n")));
        assert!(line.contains("bytes="), "{line}");
    }
    assert!(proc.terminate().success());
}
