//! Issue 30, item 3: who may read and replace what `kvtier serve` keeps.
//! Before it, under umask 022 the data directory and `disk/` were 0755 and
//! the disk log 0644 (every local user could read every stored prompt's
//! KV), and under umask 000 the data directory was 0777 (any user could
//! put their own listener at `node.sock`). Now everything the daemon makes
//! is its user's alone whatever the umask, a named `manager.access_group`
//! opens exactly the socket and the arena to that group, a directory
//! another user can write stops the start with nothing changed, and a
//! socket of another user at the path is never trusted nor removed.
//!
//! CI runs as root, so what others may do is read from the mode bits
//! (`stat`), not tried; the tests that need a file of another user make
//! one with `chown`, which only root may, and fail elsewhere.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvtier_client::{BlockHash, Client, ClientConfig, StoreOutcome, WireGeometry};
use support::Proc;
use support::node::{TOKENS_PER_BLOCK, block, geometry, namespace, shm_name};

mod support;

/// The uid and gid of nobody/nogroup: another user and group than ours.
const OTHER: u32 = 65534;

/// `kvtier serve` on `data` with arena `shm` (tiny blocks, the metadata
/// service on with its file pool and embedded index), started with
/// `umask`.
fn serve(data: &Path, shm: &str, umask: libc::mode_t) -> Command {
    let mut cmd = support::serve(data, shm);
    cmd.env(
        "KVTIER_GEOMETRY__TOKENS_PER_BLOCK",
        TOKENS_PER_BLOCK.to_string(),
    )
    .env("KVTIER_DISK__IO_ENGINE", "psync")
    .env("KVTIER_DISK__SYNC", "false");
    // SAFETY: umask(2) is async-signal-safe and touches no memory; the
    // closure runs in the child between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::umask(umask);
            Ok(())
        });
    }
    cmd
}

/// A started daemon and its log so far.
struct Serving {
    proc: Option<Proc>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Serving {
    /// Starts `cmd` and waits for its ready line (read as it comes).
    fn start(cmd: &mut Command) -> Self {
        let mut child = cmd.spawn().expect("start kvtier serve");
        let stderr = child.stderr.take().expect("stderr piped");
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let (ready_tx, ready_rx) = mpsc::channel();
        let lines = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("kvtier serving") {
                    let _ = ready_tx.send(());
                }
                lines.lock().expect("log lock").push(line);
            }
        });
        let serving = Self {
            proc: Some(Proc(child)),
            log,
        };
        if ready_rx.recv_timeout(Duration::from_secs(60)).is_err() {
            panic!(
                "kvtier serve not ready; its log:\n{}",
                serving.log().join("\n")
            );
        }
        serving
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().expect("log lock").clone()
    }

    /// SIGTERM, and waits for a clean exit (G2 moved down, checkpoint
    /// written).
    fn stop(mut self) {
        let status = self.proc.take().expect("running").terminate();
        assert!(
            status.success(),
            "exit {status:?}; log:\n{}",
            self.log().join("\n")
        );
    }
}

/// Runs `cmd`, which must refuse to start; its log. A daemon that starts
/// instead fails the test at its ready line (and is stopped), so a missing
/// refusal cannot hang it.
fn refused(cmd: &mut Command) -> String {
    let mut child = cmd.spawn().expect("start kvtier serve");
    let stderr = child.stderr.take().expect("stderr piped");
    let proc = Proc(child);
    let mut log = String::new();
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        log.push_str(&line);
        log.push('\n');
        assert!(
            !line.contains("kvtier serving"),
            "kvtier serve started:\n{log}"
        );
    }
    let status = proc.terminate();
    assert!(!status.success(), "kvtier serve exited 0:\n{log}");
    log
}

/// Stores one block through a client of the daemon at `data`.
fn store_a_block(data: &Path) {
    let config = ClientConfig::new(
        data.join("node.sock"),
        namespace(),
        WireGeometry::from(&geometry()),
    );
    let mut client = Client::connect(config).expect("connect to kvtier serve");
    let bytes = block(7);
    let out = client.store(&[(BlockHash(7), &bytes[..])]).expect("store");
    assert_eq!(out, vec![StoreOutcome::Stored]);
}

/// Permission bits of `path` (not following a link).
fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .mode()
        & 0o7777
}

/// Every entry under `root` (not `root` itself), by path, with its kind
/// and permission bits.
fn tree(root: &Path) -> BTreeMap<PathBuf, (&'static str, u32)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_owned()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("dir entry").path();
            let meta = std::fs::symlink_metadata(&path).expect("stat");
            let kind = if meta.is_dir() {
                todo.push(path.clone());
                "dir"
            } else if meta.file_type().is_socket() {
                "socket"
            } else if meta.is_file() {
                "file"
            } else {
                "other"
            };
            out.insert(path, (kind, meta.mode() & 0o7777));
        }
    }
    out
}

/// Checks that the data directory `data` is `data_mode` and everything in
/// it its user's alone: directories 0700, files 0600, the socket
/// `socket_mode`; and that the files the issue names are among them.
fn assert_private(data: &Path, data_mode: u32, socket_mode: u32, expect: &[&str]) {
    assert_eq!(mode(data), data_mode, "{}", data.display());
    let entries = tree(data);
    for (path, (kind, bits)) in &entries {
        let want = match *kind {
            "dir" => 0o700,
            "file" => 0o600,
            "socket" => socket_mode,
            _ => panic!("{}: unexpected kind of file", path.display()),
        };
        assert_eq!(
            *bits,
            want,
            "{} ({kind}) is {bits:04o}, not {want:04o}",
            path.display()
        );
    }
    for name in expect {
        assert!(
            entries.contains_key(&data.join(name)),
            "{name} missing; the data directory holds {:?}",
            entries.keys().collect::<Vec<_>>()
        );
    }
}

/// What a running default daemon keeps in its data directory.
const WHILE_RUNNING: &[&str] = &[
    "disk",
    "disk/kvtier-disk.regions",
    "disk/kvtier-disk.meta",
    "disk/kvtier-disk.lock",
    "meta.redb",
    "meta.leader.lock",
    "pool",
    "node.sock",
];

/// Starts a daemon under `umask` on a data directory it creates, stores a
/// block, stops it, and checks every mode at each step.
fn every_file_is_private_under(umask: libc::mode_t) {
    let base = tempfile::tempdir().unwrap();
    // Not made yet: the daemon makes it, under the umask.
    let data = base.path().join("data");
    let shm = shm_name(&format!("modes-{umask:o}"));
    let serving = Serving::start(&mut serve(&data, &shm, umask));
    assert_private(&data, 0o700, 0o600, WHILE_RUNNING);
    assert_eq!(mode(&Path::new("/dev/shm").join(&shm)), 0o600, "the arena");
    store_a_block(&data);
    serving.stop();
    // The checkpoint is written at the clean stop.
    assert_private(&data, 0o700, 0o600, &["disk/kvtier-disk.index"]);
}

#[test]
fn every_file_is_private_under_umask_000() {
    every_file_is_private_under(0o000);
}

#[test]
fn every_file_is_private_under_umask_022() {
    every_file_is_private_under(0o022);
}

/// A data directory an older build left 0755 with 0644 files in it is
/// narrowed at the next start, and the change is logged.
#[test]
fn wider_modes_of_an_older_build_are_narrowed_at_start() {
    let base = tempfile::tempdir().unwrap();
    let data = base.path().join("data");
    let shm = shm_name("modes-older");
    Serving::start(&mut serve(&data, &shm, 0o022)).stop();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let secret = data.join("node.secret");
    for (path, (kind, _)) in tree(&data) {
        // The secret is new with the build that made the data directory
        // private: no older build left it wide. One found wide may have
        // been read, so the daemon refuses it (as the last step checks).
        if path == secret {
            continue;
        }
        let wide = if kind == "dir" { 0o755 } else { 0o644 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(wide)).unwrap();
    }
    let serving = Serving::start(&mut serve(&data, &shm, 0o022));
    assert_private(&data, 0o700, 0o600, WHILE_RUNNING);
    let log = serving.log();
    assert!(
        log.iter()
            .any(|l| l.contains("set the mode of a directory") && l.contains("from=0755")),
        "{log:#?}"
    );
    serving.stop();
    assert_private(&data, 0o700, 0o600, &["disk/kvtier-disk.index"]);
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let log = refused(&mut serve(&data, &shm, 0o022));
    assert!(log.contains("others may read it"), "{log}");
}

/// The group `manager.access_group` is given in these tests, by name:
/// another group than ours as root (which may give files to any group),
/// else our own (a member may).
fn a_group() -> (String, u32) {
    // SAFETY: getegid and geteuid have no preconditions.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let groups = std::fs::read_to_string("/etc/group").expect("read /etc/group");
    groups
        .lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let gid = f.nth(1)?.parse::<u32>().ok()?;
            Some((name.to_owned(), gid))
        })
        .find(|&(_, gid)| if euid == 0 { gid != egid } else { gid == egid })
        .expect("a usable group in /etc/group")
}

/// With `manager.access_group`, engines of that group reach the socket and
/// the arena (0660, that group) through the data directory (0710, that
/// group), and nothing else.
#[test]
fn an_access_group_opens_the_socket_and_the_arena_to_that_group_only() {
    let (name, gid) = a_group();
    let base = tempfile::tempdir().unwrap();
    let data = base.path().join("data");
    let shm = shm_name("modes-group");
    let serving =
        Serving::start(serve(&data, &shm, 0o022).env("KVTIER_MANAGER__ACCESS_GROUP", &name));
    assert_private(&data, 0o710, 0o660, WHILE_RUNNING);
    let group_of = |p: &Path| std::fs::metadata(p).expect("stat").gid();
    assert_eq!(group_of(&data), gid, "the data directory's group");
    assert_eq!(group_of(&data.join("node.sock")), gid, "the socket's group");
    let arena = Path::new("/dev/shm").join(&shm);
    assert_eq!((mode(&arena), group_of(&arena)), (0o660, gid), "the arena");
    store_a_block(&data);
    serving.stop();
    // Back to private: the group is not a setting that sticks.
    Serving::start(&mut serve(&data, &shm, 0o022)).stop();
    assert_eq!(mode(&data), 0o700);
}

#[test]
fn an_unknown_access_group_stops_the_start_with_nothing_made() {
    let base = tempfile::tempdir().unwrap();
    let data = base.path().join("data");
    let shm = shm_name("modes-nogroup");
    let err = refused(
        serve(&data, &shm, 0o022).env("KVTIER_MANAGER__ACCESS_GROUP", "no-such-group-kvtier"),
    );
    assert!(
        err.contains("manager.access_group") && err.contains("no-such-group-kvtier"),
        "{err}"
    );
    assert!(!data.exists(), "a refused start made the data directory");
    assert!(!Path::new("/dev/shm").join(&shm).exists());
}

/// Fails unless this process is root: making a file of another user needs
/// it. CI runs as root; elsewhere these tests fail rather than pass
/// without checking.
fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test must run as root to make files of another user"
    );
}

/// `data` with nothing in it and `mode`, as the refusal must leave it.
fn assert_untouched(data: &Path, mode_bits: u32) {
    assert_eq!(
        mode(data),
        mode_bits,
        "the refused directory's mode changed"
    );
    let left: Vec<_> = std::fs::read_dir(data).unwrap().collect();
    assert!(left.is_empty(), "a refused start made {left:?}");
}

/// A data directory its group or others may write, or another user owns:
/// the start is refused naming it, its owner and mode and the fix, and
/// nothing is made in it (no arena either).
#[test]
fn a_data_directory_others_can_write_is_refused_with_nothing_made() {
    let base = tempfile::tempdir().unwrap();
    let data = base.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let shm = shm_name("modes-unsafe");
    for bits in [0o777, 0o770] {
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(bits)).unwrap();
        let err = refused(&mut serve(&data, &shm, 0o022));
        let named = format!("{}: its group or other users may write it", data.display());
        assert!(err.contains(&named), "{err}");
        assert!(err.contains(&format!("mode {bits:04o}")), "{err}");
        assert!(err.contains("chmod 0700"), "{err}");
        assert_untouched(&data, bits);
        assert!(
            !Path::new("/dev/shm").join(&shm).exists(),
            "an arena was made"
        );
    }
    // Private, but another user's.
    require_root();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&data, Some(OTHER), Some(OTHER)).unwrap();
    let err = refused(&mut serve(&data, &shm, 0o022));
    assert!(
        err.contains("owned by another user") && err.contains(&format!("owner uid {OTHER}")),
        "{err}"
    );
    assert_untouched(&data, 0o700);
}

/// A disk directory configured outside the data directory is held to the
/// same rule, and its refusal makes no data directory either.
#[test]
fn a_disk_directory_others_can_write_is_refused_with_nothing_made() {
    let base = tempfile::tempdir().unwrap();
    let (data, disk) = (base.path().join("data"), base.path().join("disk"));
    std::fs::create_dir(&disk).unwrap();
    std::fs::set_permissions(&disk, std::fs::Permissions::from_mode(0o777)).unwrap();
    let shm = shm_name("modes-unsafe-disk");
    let dirs = format!("[{:?}]", disk.display().to_string());
    let err = refused(serve(&data, &shm, 0o022).env("KVTIER_DISK__DIRS", dirs));
    assert!(err.contains(&disk.display().to_string()), "{err}");
    assert_untouched(&disk, 0o777);
    assert!(!data.exists(), "a refused start made the data directory");
}

/// A socket of another user at `node.sock`, live or dead, is refused
/// before anything is made, never connected to, and left where it is.
#[test]
fn an_impostor_socket_is_refused_and_left_in_place() {
    require_root();
    let base = tempfile::tempdir().unwrap();
    let data = base.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let socket = data.join("node.sock");
    let impostor = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    impostor.set_nonblocking(true).unwrap();
    std::os::unix::fs::lchown(&socket, Some(OTHER), Some(OTHER)).unwrap();
    let ino = std::fs::symlink_metadata(&socket).unwrap().ino();
    let shm = shm_name("modes-impostor");
    for live in [true, false] {
        let err = refused(&mut serve(&data, &shm, 0o022));
        assert!(
            err.contains(&socket.display().to_string()) && err.contains(&format!("uid {OTHER}")),
            "{err}"
        );
        assert_eq!(std::fs::symlink_metadata(&socket).unwrap().ino(), ino);
        if live {
            match impostor.accept() {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                other => panic!("the daemon connected to the impostor: {other:?}"),
            }
        }
        let names: Vec<_> = std::fs::read_dir(&data)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["node.sock"], "a refused start made files");
        assert!(
            !Path::new("/dev/shm").join(&shm).exists(),
            "an arena was made"
        );
    }
    drop(impostor);
}

/// A socket of ours nobody answers on (a daemon killed) is replaced by the
/// new daemon's, private from its first instant.
#[test]
fn a_dead_socket_of_ours_is_replaced() {
    let base = tempfile::tempdir().unwrap();
    let data = base.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).unwrap();
    let socket = data.join("node.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let ino = std::fs::symlink_metadata(&socket).unwrap().ino();
    let shm = shm_name("modes-dead");
    let serving = Serving::start(&mut serve(&data, &shm, 0o000));
    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert_ne!(meta.ino(), ino, "the dead socket is still there");
    assert_eq!(meta.mode() & 0o7777, 0o600);
    store_a_block(&data);
    serving.stop();
}
