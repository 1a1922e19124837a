//! Client names in paths and object keys.
//!
//! Instance ids and location spec names come from clients, yet they end up
//! inside part URIs (`<base>/<instance>/<key>-<location>/<spec>`) that
//! clients turn into file paths or object keys. Each name therefore goes
//! into a URI only as one *escaped component* ([`escape_component`]):
//! every byte outside `A-Z a-z 0-9 - _ .` is written `%XX`, and so is a
//! leading `.`. The result is one path component that can never be `.` or
//! `..`, never holds `/`, `\`, NUL or a control character, and decodes back
//! to exactly the original name ([`unescape_component`]), so the mapping is
//! injective: two names never share a path.
//!
//! [`part_path`] builds the relative part path from escaped components and
//! checks each one again ([`check_component`]) at the point where the path
//! is formed, so a future caller that forgets to escape fails instead of
//! leaving its root. [`check_absolute_dir`] and [`confine_to_roots`] do the
//! same for directories named by the admin API (file pool storages).

use std::path::{Component, Path, PathBuf};

use crate::model::{BlockKey, LocationId};

/// Longest path component most file systems accept (`NAME_MAX`); an
/// escaped name longer than this is refused.
pub const MAX_COMPONENT_BYTES: usize = 255;

/// A path component or directory that would not stay where it belongs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsafe path component {component:?}: {reason}")]
pub struct UnsafePath {
    /// The component or path, as given.
    pub component: String,
    /// What is wrong with it.
    pub reason: String,
}

fn unsafe_path(component: impl Into<String>, reason: impl Into<String>) -> UnsafePath {
    UnsafePath {
        component: component.into(),
        reason: reason.into(),
    }
}

/// Bytes written as themselves (anywhere but at the start, for `.`).
fn is_safe_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')
}

/// `name` as one path component: bytes outside `A-Z a-z 0-9 - _ .`, and a
/// leading `.`, become `%XX` (upper-case hex). Never contains `/` and is
/// never `.` or `..`; empty only for an empty name.
pub fn escape_component(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for (i, &b) in name.as_bytes().iter().enumerate() {
        if is_safe_byte(b) && !(i == 0 && b == b'.') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The name [`escape_component`] turned into `component`; `None` unless
/// `component` is exactly what it writes (so decoding is injective too).
pub fn unescape_component(component: &str) -> Option<String> {
    let bytes = component.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = component.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let name = String::from_utf8(out).ok()?;
    (escape_component(&name) == component).then_some(name)
}

/// Checks that `component` is one escaped path component: not empty, at
/// most [`MAX_COMPONENT_BYTES`], not `.` or `..`, and only the characters
/// [`escape_component`] writes (so no `/`, `\`, NUL, control characters,
/// `?` or `#`).
pub fn check_component(component: &str) -> Result<(), UnsafePath> {
    if component.is_empty() {
        return Err(unsafe_path(component, "empty"));
    }
    if component.len() > MAX_COMPONENT_BYTES {
        return Err(unsafe_path(
            component,
            format!("{} bytes, at most {MAX_COMPONENT_BYTES}", component.len()),
        ));
    }
    if component == "." || component == ".." {
        return Err(unsafe_path(component, "a relative component"));
    }
    if let Some(c) = component.chars().find(|&c| c != '%' && !is_safe_char(c)) {
        return Err(unsafe_path(
            component,
            format!("character {c:?} outside the escaped set"),
        ));
    }
    Ok(())
}

fn is_safe_char(c: char) -> bool {
    u8::try_from(c).is_ok_and(is_safe_byte)
}

/// Checks that `name` fits in one path component once escaped (instance
/// ids and spec names at registration); `what` names it in the error.
pub fn check_name(what: &str, name: &str) -> Result<(), UnsafePath> {
    check_component(&escape_component(name)).map_err(|e| UnsafePath {
        component: name.to_owned(),
        reason: format!("{what} as a path component: {}", e.reason),
    })
}

/// The path of one block part below a storage's base:
/// `<instance>/<key hex>-<location hex>/<spec>`, with the instance id and
/// spec name escaped and every component checked.
pub fn part_path(
    instance: &str,
    key: BlockKey,
    location: LocationId,
    spec: &str,
) -> Result<String, UnsafePath> {
    let parts = [
        escape_component(instance),
        format!("{:016x}-{:x}", key.0, location.0),
        escape_component(spec),
    ];
    for p in &parts {
        check_component(p)?;
    }
    Ok(parts.join("/"))
}

/// Checks that `dir` is absolute and lexically normal: no `.` or `..`
/// components, no NUL or control characters, and nothing that would end
/// or split a URI (`?`, `#`).
pub fn check_absolute_dir(dir: &Path) -> Result<(), UnsafePath> {
    let shown = || dir.display().to_string();
    if !dir.is_absolute() {
        return Err(unsafe_path(shown(), "not an absolute path"));
    }
    if let Some(c) = dir
        .components()
        .find(|c| !matches!(c, Component::RootDir | Component::Normal(_)))
    {
        return Err(unsafe_path(
            shown(),
            format!("has a {:?} component", c.as_os_str()),
        ));
    }
    // `components()` drops `.` in the middle of a path; look at the text.
    let text = dir.to_string_lossy();
    if text.split('/').any(|s| s == "." || s == "..") {
        return Err(unsafe_path(shown(), "has a relative component"));
    }
    if text.chars().any(|c| c.is_control() || c == '?' || c == '#') {
        return Err(unsafe_path(shown(), "has a control character, '?' or '#'"));
    }
    Ok(())
}

/// The directory of a `file://` URI (`file:///dir`, `file://localhost/dir`);
/// `None` for other schemes.
pub fn file_uri_dir(uri: &str) -> Option<PathBuf> {
    let rest = uri.strip_prefix("file://")?;
    Some(PathBuf::from(
        rest.strip_prefix("localhost").unwrap_or(rest),
    ))
}

/// `path` with symlinks resolved: its longest existing ancestor
/// canonicalised, the components that do not exist yet appended as they
/// are (they are plain names: [`check_absolute_dir`] passed).
fn resolve(path: &Path) -> std::io::Result<PathBuf> {
    let mut existing = path;
    let mut missing = Vec::new();
    loop {
        match std::fs::canonicalize(existing) {
            Ok(mut real) => {
                real.extend(missing.iter().rev());
                return Ok(real);
            }
            Err(e) => match (existing.parent(), existing.file_name()) {
                (Some(parent), Some(name)) => {
                    missing.push(name.to_owned());
                    existing = parent;
                }
                _ => return Err(e),
            },
        }
    }
}

/// Checks that the directory `dir` lies under one of `roots` once both are
/// resolved (symlinks followed); `dir` must pass [`check_absolute_dir`].
/// Returns the resolved directory. The error names every root.
pub fn confine_to_roots(dir: &Path, roots: &[PathBuf]) -> Result<PathBuf, UnsafePath> {
    check_absolute_dir(dir)?;
    let shown = || dir.display().to_string();
    let real = resolve(dir).map_err(|e| unsafe_path(shown(), format!("cannot resolve: {e}")))?;
    let inside = roots.iter().any(|root| {
        check_absolute_dir(root).is_ok() && resolve(root).is_ok_and(|r| real.starts_with(&r))
    });
    if inside {
        return Ok(real);
    }
    let listed: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    Err(unsafe_path(
        shown(),
        format!(
            "resolves to {}, outside the storage roots [{}] (meta.storage_roots)",
            real.display(),
            listed.join(", ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_could_leave_a_directory() {
        assert_eq!(escape_component("tp0"), "tp0");
        assert_eq!(escape_component("llama-3.1_8b"), "llama-3.1_8b");
        assert_eq!(escape_component(".."), "%2E.");
        assert_eq!(escape_component("../x"), "%2E.%2Fx");
        assert_eq!(escape_component("a\0b"), "a%00b");
        assert_eq!(escape_component("%2e"), "%252e");
        assert_eq!(unescape_component("%2E.%2Fx").as_deref(), Some("../x"));
        // Not what escape writes: refused rather than decoded two ways.
        assert_eq!(unescape_component("%2e"), None);
        assert_eq!(unescape_component("%41"), None);
        assert_eq!(unescape_component("%4"), None);
    }

    #[test]
    fn lexical_dir_checks() {
        assert!(check_absolute_dir(Path::new("/srv/kv/pool")).is_ok());
        for bad in [
            "srv/kv",
            "/srv/../etc",
            "/srv/./kv",
            "/srv/kv?x",
            "/srv/\u{1}",
        ] {
            assert!(check_absolute_dir(Path::new(bad)).is_err(), "{bad}");
        }
    }
}
