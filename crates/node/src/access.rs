//! Who may reach the node's files: `manager.access_group` resolved to a
//! group id, and the directories the daemon keeps its data and its socket
//! in, checked and made private at start (docs/server.md, "Trust model of
//! the node daemon").
//!
//! A directory another user can write lets that user replace what the
//! daemon reads back (the disk log, the socket engines connect to), so one
//! is refused, never repaired: the daemon changes nothing in that case.
//! A directory of ours that is merely wider than configured (0755, made by
//! an older build or by hand) is narrowed, with an info line.

use std::ffi::CString;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::{NodeConfig, NodeError};

/// Mode of the data directory without an access group: the daemon's user
/// only.
pub const DATA_DIR_MODE: u32 = 0o700;
/// Mode of the data directory with an access group: its members may pass
/// through to the socket, not list it or open anything else in it (every
/// file there is 0600).
pub const SHARED_DATA_DIR_MODE: u32 = 0o710;
/// Mode of the node socket without an access group.
pub const SOCKET_MODE: u32 = 0o600;
/// Mode of the node socket (and the arena) with an access group.
pub const SHARED_SOCKET_MODE: u32 = 0o660;

/// The group `spec` (`manager.access_group`) names: `None` for an empty
/// string, the number itself for a numeric gid, else the gid of the group
/// of that name (`getgrnam_r`).
///
/// # Errors
/// [`NodeError::Config`] when no group has that name, the number is not a
/// valid gid, or the lookup itself fails.
pub fn resolve_group(spec: &str) -> Result<Option<u32>, NodeError> {
    let bad = |why: String| NodeError::Config(format!("manager.access_group {spec:?}: {why}"));
    if spec.is_empty() {
        return Ok(None);
    }
    if spec.bytes().all(|b| b.is_ascii_digit()) {
        // Like chown(1): digits are a gid, even where no group has a name
        // for it. u32::MAX is the "no change" value of chown(2), not a gid.
        return match spec.parse::<u32>() {
            Ok(gid) if gid != u32::MAX => Ok(Some(gid)),
            _ => Err(bad("not a valid numeric gid".into())),
        };
    }
    match group_by_name(spec) {
        Ok(Some(gid)) => Ok(Some(gid)),
        Ok(None) => Err(bad(
            "no such group (name a group of /etc/group or the group database, or a numeric gid)"
                .into(),
        )),
        Err(e) => Err(bad(format!("looking the group up failed: {e}"))),
    }
}

/// The gid of the group named `name`, `None` if there is none.
fn group_by_name(name: &str) -> io::Result<Option<u32>> {
    let cname = CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
    let mut buf: Vec<libc::c_char> = vec![0; 1024];
    loop {
        // SAFETY: `group` is plain old data that getgrnam_r overwrites; an
        // all-zero value (null pointers, zero ids) is a valid one.
        let mut grp: libc::group = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::group = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call: the name is a
        // NUL-terminated string, `grp` and `found` are ours, and `buf` is
        // `buf.len()` writable bytes that the strings of `grp` point into.
        let rc = unsafe {
            libc::getgrnam_r(
                cname.as_ptr(),
                &mut grp,
                buf.as_mut_ptr(),
                buf.len(),
                &mut found,
            )
        };
        // A group with many members needs a larger buffer; bounded, so a
        // broken group database cannot make this loop forever.
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        return Ok((!found.is_null()).then_some(grp.gr_gid));
    }
}

/// The effective uid of this process: the owner of everything it creates.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// One directory the daemon needs, and how it wants it.
#[derive(Debug)]
struct Wanted {
    path: PathBuf,
    mode: u32,
    group: Option<u32>,
    /// Whether an existing directory is set to `mode` and `group` (ours:
    /// the data and disk directories) or only checked (a socket directory
    /// the operator chose elsewhere).
    set_existing: bool,
    /// Whether a sticky directory others may write (`/tmp`) is accepted:
    /// only for a socket directory the operator chose elsewhere (see
    /// [`check_socket_dir`]).
    sticky_ok: bool,
}

/// What the directories of `config` must be: the data directory (0700, or
/// 0710 with `group`), each disk directory (0700) and the socket's
/// directory when it is elsewhere (made 0700 or 0710 if missing, else only
/// checked).
fn wanted(config: &NodeConfig, group: Option<u32>) -> Vec<Wanted> {
    let data_mode = if group.is_some() {
        SHARED_DATA_DIR_MODE
    } else {
        DATA_DIR_MODE
    };
    let mut dirs = vec![Wanted {
        path: config.serve.data_dir.clone(),
        mode: data_mode,
        group,
        set_existing: true,
        sticky_ok: false,
    }];
    for path in config.disk_dirs() {
        dirs.push(Wanted {
            path,
            mode: kvtier_io::PRIVATE_DIR_MODE,
            group: None,
            set_existing: true,
            sticky_ok: false,
        });
    }
    let socket = config.node_socket();
    dirs.push(Wanted {
        path: socket_dir(&socket).to_owned(),
        mode: data_mode,
        group,
        set_existing: false,
        sticky_ok: true,
    });
    // The first wish for a path wins (a disk directory configured as the
    // data directory itself stays the data directory).
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|w| seen.insert(w.path.clone()));
    dirs
}

/// The directory the socket at `path` lives in (`.` for a bare name).
pub(crate) fn socket_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Checks that no directory `config` names for the daemon's data or its
/// socket can be written by another user (see [`check_dir`]). Changes
/// nothing: `kvtier serve` runs it before anything else touches the data
/// directory.
///
/// # Errors
/// [`NodeError::Config`] for an unknown `manager.access_group`,
/// [`NodeError::UnsafeDir`] for the first directory refused, and what
/// [`NodeServer::bind`](crate::NodeServer::bind) refuses without
/// connecting: [`NodeError::NotASocket`] or [`NodeError::ForeignSocket`]
/// at the socket path.
pub fn check_dirs(config: &NodeConfig) -> Result<(), NodeError> {
    let group = resolve_group(&config.manager.access_group)?;
    for w in wanted(config, group) {
        w.check()?;
    }
    // Also before anything is made: what sits at the socket path. Whether
    // a socket of ours is live is asked when it is bound.
    existing_socket(&config.node_socket())?;
    Ok(())
}

/// Whether a socket of this user's is at `path` (`false`: nothing is).
///
/// # Errors
/// [`NodeError::NotASocket`] for anything else than a socket (a link
/// included: never followed), [`NodeError::ForeignSocket`] for a socket of
/// another user: neither is the daemon's to replace.
pub(crate) fn existing_socket(path: &Path) -> Result<bool, NodeError> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(source) => {
            return Err(NodeError::Socket {
                op: "inspecting",
                path: path.to_owned(),
                source,
            });
        }
    };
    if !meta.file_type().is_socket() {
        return Err(NodeError::NotASocket {
            path: path.to_owned(),
        });
    }
    let euid = euid();
    if meta.uid() != euid {
        return Err(NodeError::ForeignSocket {
            path: path.to_owned(),
            owner: meta.uid(),
            euid,
        });
    }
    Ok(true)
}

/// Makes the directories of `config` what they must be, after checking all
/// of them (so a refusal changes nothing): missing ones are created (0700,
/// the data directory 0700 or 0710 and given `group`); the data and disk
/// directories that exist are set to that mode and group, with an info
/// line when they change.
///
/// # Errors
/// [`NodeError::UnsafeDir`] as [`check_dirs`]; [`NodeError::Dir`] when a
/// directory cannot be created, or its mode or group set.
pub(crate) fn prepare_dirs(config: &NodeConfig, group: Option<u32>) -> Result<(), NodeError> {
    let dirs = wanted(config, group);
    let existing = dirs
        .iter()
        .map(Wanted::check)
        .collect::<Result<Vec<_>, _>>()?;
    for (w, exists) in dirs.iter().zip(existing) {
        match exists {
            None => create_dir(&w.path, w.mode, w.group)?,
            Some(meta) if w.set_existing => set_dir(&w.path, &meta, w.mode, w.group)?,
            Some(_) => {}
        }
    }
    Ok(())
}

/// Makes the socket's directory `dir` if missing (`mode`, `group`), after
/// checking it as [`check_socket_dir`] does.
pub(crate) fn prepare_socket_dir(
    dir: &Path,
    mode: u32,
    group: Option<u32>,
) -> Result<(), NodeError> {
    if check_socket_dir(dir)?.is_none() {
        create_dir(dir, mode, group)?;
    }
    Ok(())
}

/// Makes `path` a directory of this user's alone: created 0700 (with
/// missing parents) if missing, set to 0700 if it exists with another
/// mode, after checking it as [`check_dir`] does. For directories under the
/// data directory that only the daemon uses (the metadata service's
/// default file pool).
///
/// # Errors
/// As [`check_dir`]; [`NodeError::Dir`] when it cannot be made or set.
pub fn make_private_dir(path: &Path) -> Result<(), NodeError> {
    let mode = kvtier_io::PRIVATE_DIR_MODE;
    match check_dir(path)? {
        None => create_dir(path, mode, None),
        Some(meta) => set_dir(path, &meta, mode, None),
    }
}

/// The metadata of directory `path`, `None` if it does not exist.
///
/// # Errors
/// [`NodeError::UnsafeDir`] when it is owned by another user or its group
/// or others may write it (`mode & 0o022`): they could replace files the
/// daemon trusts, or the socket engines connect to. A path that exists but
/// is not a directory, or cannot be inspected, is [`NodeError::Dir`].
pub fn check_dir(path: &Path) -> Result<Option<std::fs::Metadata>, NodeError> {
    check_dir_as(path, false)
}

/// As [`check_dir`], but a sticky directory (`/tmp`, mode 1777) of root or
/// this user is accepted even though others may write it: the sticky bit
/// keeps them from removing or renaming the daemon's socket there, and a
/// file another user put at the socket's name first is refused
/// ([`NodeError::ForeignSocket`], [`NodeError::NotASocket`]). For the
/// directory of a socket the operator put outside the data directory.
///
/// # Errors
/// As [`check_dir`].
pub fn check_socket_dir(path: &Path) -> Result<Option<std::fs::Metadata>, NodeError> {
    check_dir_as(path, true)
}

impl Wanted {
    fn check(&self) -> Result<Option<std::fs::Metadata>, NodeError> {
        check_dir_as(&self.path, self.sticky_ok)
    }
}

fn check_dir_as(path: &Path, sticky_ok: bool) -> Result<Option<std::fs::Metadata>, NodeError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(dir_err("inspecting", path, source)),
    };
    if !meta.is_dir() {
        let source = io::Error::from(io::ErrorKind::NotADirectory);
        return Err(dir_err("using", path, source));
    }
    let (owner, mode, euid) = (meta.uid(), meta.mode() & 0o7777, euid());
    if sticky_ok && mode & 0o1000 != 0 && (owner == euid || owner == 0) {
        return Ok(Some(meta));
    }
    let why = if owner != euid {
        "it is owned by another user"
    } else if mode & 0o022 != 0 {
        "its group or other users may write it"
    } else {
        return Ok(Some(meta));
    };
    Err(NodeError::UnsafeDir {
        path: path.to_owned(),
        owner,
        mode,
        euid,
        why,
    })
}

/// Creates `path` (and missing parents, 0700) with exactly `mode` and
/// `group`.
fn create_dir(path: &Path, mode: u32, group: Option<u32>) -> Result<(), NodeError> {
    kvtier_io::create_private_dir_all(path).map_err(|e| dir_err("creating", path, e))?;
    // Created 0700 (the umask may only narrow it): set what is wanted.
    let meta = std::fs::metadata(path).map_err(|e| dir_err("inspecting", path, e))?;
    set_dir(path, &meta, mode, group)
}

/// Gives the existing directory `path` (`meta`) exactly `mode` and, if
/// given, `group`; logs what changed.
fn set_dir(
    path: &Path,
    meta: &std::fs::Metadata,
    mode: u32,
    group: Option<u32>,
) -> Result<(), NodeError> {
    if let Some(gid) = group.filter(|&g| g != meta.gid()) {
        // Group first: until the mode below is set, the directory lets its
        // group in no further than before.
        std::os::unix::fs::chown(path, None, Some(gid))
            .map_err(|e| dir_err("setting the group of", path, e))?;
        tracing::info!(dir = %path.display(), from = meta.gid(), to = gid, "set the group of a directory to manager.access_group");
    }
    let old = meta.mode() & 0o7777;
    if old != mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| dir_err("setting the mode of", path, e))?;
        tracing::info!(
            dir = %path.display(),
            from = format_args!("{old:04o}"),
            to = format_args!("{mode:04o}"),
            "set the mode of a directory of the node"
        );
    }
    Ok(())
}

fn dir_err(op: &'static str, path: &Path, source: io::Error) -> NodeError {
    NodeError::Dir {
        op,
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_resolve_by_number_and_name() {
        assert_eq!(resolve_group("").unwrap(), None);
        assert_eq!(resolve_group("0").unwrap(), Some(0));
        assert_eq!(resolve_group("65534").unwrap(), Some(65534));
        // Every Linux has a group named root, gid 0.
        assert_eq!(resolve_group("root").unwrap(), Some(0));
        for bad in ["no-such-group-kvtier", "4294967295", "99999999999", "a\0b"] {
            let e = resolve_group(bad).expect_err(bad).to_string();
            assert!(e.contains("manager.access_group"), "{bad}: {e}");
        }
    }

    /// `/tmp` (1777) may hold the socket, never the data: the sticky bit
    /// keeps other users from removing or renaming what is ours there.
    #[test]
    fn a_sticky_directory_may_hold_the_socket_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(check_socket_dir(dir.path()).unwrap().is_some());
        assert!(matches!(
            check_dir(dir.path()),
            Err(NodeError::UnsafeDir { .. })
        ));
        // Without the sticky bit, others could replace the socket.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            check_socket_dir(dir.path()),
            Err(NodeError::UnsafeDir { .. })
        ));
    }

    #[test]
    fn a_directory_others_may_write_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o777, 0o770, 0o702, 0o720] {
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).unwrap();
            let e = check_dir(dir.path()).expect_err("refused");
            assert!(matches!(e, NodeError::UnsafeDir { .. }), "{e}");
            let text = e.to_string();
            assert!(text.contains(&format!("{mode:04o}")), "{text}");
            let meta = std::fs::metadata(dir.path()).unwrap();
            assert_eq!(meta.mode() & 0o7777, mode);
        }
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(check_dir(dir.path()).unwrap().is_some());
        assert!(check_dir(&dir.path().join("missing")).unwrap().is_none());
    }
}
