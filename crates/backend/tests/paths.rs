//! Paths built from client input stay under their storage root (issue 10,
//! defects 3 and 6): hostile instance ids and spec names through a file
//! pool added at runtime and through the plain URI scheme, names too long
//! for a path component, storages refused outside `storage_roots`, the
//! backend of a storage following its updates and removal, and the
//! escaping's properties.
//!
//! The tests act as the client: they write each granted part where its URI
//! points, read it back through the URIs a lookup returns, and walk the
//! temporary directory to see that nothing appeared outside the root.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kvtier_backend::{BackendOptions, FilePoolOptions};
use kvtier_meta::path_safe::{check_component, escape_component, unescape_component};
use kvtier_meta::*;
use proptest::prelude::*;

const SPEC: u64 = 3000;

/// Instance ids a hostile client might send.
fn hostile_instances() -> Vec<String> {
    [
        "../../y",
        "/abs/olute",
        "%2e%2e",
        "%2E%2E%2Fz",
        "nul\0byte",
        "ctl\u{1}\u{1b}[31m",
        "a/b/c",
        "..",
        ".",
        "é/..",
        "back\\slash",
        "q?x=1#frag",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(["x".repeat(200), "../".repeat(20)])
    .collect()
}

/// Spec names a hostile client might send.
const HOSTILE_SPECS: [&str; 7] = [
    "../../../spec",
    "/etc/passwd",
    "%2e%2e",
    "..",
    "s\0",
    "t/u",
    "\u{7f}",
];

fn storage(name: &str, uri: String) -> Storage {
    Storage {
        name: name.into(),
        kind: StorageKind::FilePool,
        uri,
        enabled: true,
        health: StorageHealth::Healthy,
        spec: None,
    }
}

fn group(storage: &str) -> InstanceGroup {
    InstanceGroup {
        name: "g".into(),
        quota_bytes: 1 << 40,
        kind_quota_bytes: BTreeMap::new(),
        watermark: 0.9,
        eviction: EvictionPolicy::Lru,
        storages: vec![storage.into()],
        max_instances: 64,
        ..Default::default()
    }
}

fn instance(id: &str, specs: &[&str]) -> Instance {
    Instance {
        id: id.into(),
        group: "g".into(),
        model: "m".into(),
        block_size: 16,
        location_specs: specs
            .iter()
            .map(|n| LocationSpecInfo {
                name: n.to_string(),
                size: SPEC,
            })
            .collect(),
        spec_groups: vec![],
    }
}

/// A service whose storages added at runtime get real file pools, with
/// `root` as the only storage root.
fn managed_service(root: &Path) -> MetaService {
    let options = BackendOptions {
        file_pool: FilePoolOptions {
            file_size: 1 << 20,
            files: 2,
            preallocate: false,
            probe_timeout: Duration::from_secs(5),
        },
        ..BackendOptions::default()
    };
    let config = MetaConfig {
        storage_roots: Some(vec![root.to_path_buf()]),
        backend_opener: Some(Arc::new(options)),
        ..MetaConfig::default()
    };
    MetaService::new(Arc::new(MemoryIndex::new()), config).expect("service")
}

/// The file and offset a part URI names, as a client reads it:
/// `file://<path>` (plain scheme) or `file://<path>?offset=N&...` (pool).
fn client_place(uri: &str) -> (PathBuf, u64) {
    let rest = uri
        .strip_prefix("file://")
        .unwrap_or_else(|| panic!("not a file URI: {uri}"));
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let offset = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("offset="))
        .map_or(0, |o| o.parse().expect("offset"));
    (PathBuf::from(path), offset)
}

/// `path` with `.` and `..` applied lexically (what the kernel does to a
/// path without symlinks).
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// Asserts `path` names a place under `root`, lexically and with no `..`.
fn assert_under(path: &Path, root: &Path) {
    assert!(
        path.components().all(|c| c != Component::ParentDir),
        "{} has a '..' component",
        path.display()
    );
    assert!(
        lexical(path).starts_with(root),
        "{} is outside {}",
        path.display(),
        root.display()
    );
}

/// Writes `data` where `uri` points, as a client would.
fn client_write(uri: &str, root: &Path, data: &[u8]) {
    let (path, offset) = client_place(uri);
    assert_under(&path, root);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("creating the part's directory");
    }
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    f.write_all_at(data, offset).expect("writing the part");
}

fn client_read(uri: &str, len: usize) -> Vec<u8> {
    let (path, offset) = client_place(uri);
    let f = std::fs::File::open(&path).expect("opening the part");
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset).expect("reading the part");
    buf
}

/// Every regular file under `dir`, recursively (symlinks are not files a
/// storage created).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let p = e.path();
            let kind = e.file_type().expect("file type");
            if kind.is_dir() {
                todo.push(p);
            } else if kind.is_file() {
                out.push(p);
            }
        }
    }
    out
}

/// Bytes unique to one part.
fn payload(instance: &str, spec: &str, key: u64) -> Vec<u8> {
    let tag = format!("{instance:?}/{spec:?}/{key}|");
    tag.bytes().cycle().take(SPEC as usize).collect()
}

/// Registers every hostile instance (each with a hostile spec and `tp0`),
/// writes two blocks of each where the grants point, finishes them and
/// reads every part back through the URIs a lookup returns.
async fn write_and_read_hostile(svc: &MetaService, root: &Path) {
    for (n, id) in hostile_instances().iter().enumerate() {
        let spec = HOSTILE_SPECS[n % HOSTILE_SPECS.len()];
        let registered = svc.register_instance(instance(id, &[spec, "tp0"])).await;
        if id.chars().chain(spec.chars()).any(char::is_control) {
            // Control characters never reach a path: registration refuses
            // them (and registers nothing).
            assert!(
                matches!(registered, Err(MetaError::InvalidArgument(_))),
                "{id:?}/{spec:?}: {registered:?}"
            );
            assert!(svc.get_instance_info(id).await.is_err());
            continue;
        }
        registered.unwrap_or_else(|e| panic!("registering {id:?}: {e}"));
        let keys = [BlockKey(1), BlockKey(u64::MAX)];
        let grant = svc.start_write_cache(id, &keys).await.expect("grant");
        assert_eq!(grant.blocks.len(), 2, "{id:?}");
        for b in &grant.blocks {
            for s in &b.location.specs {
                client_write(&s.uri, root, &payload(id, &s.name, b.key.0));
            }
        }
        svc.finish_write_cache(id, grant.session, &[true, true])
            .await
            .expect("finish");
        let hit = svc
            .get_cache_location(id, &LocationQuery::prefix(keys.to_vec()))
            .await
            .expect("lookup");
        assert_eq!(hit.matched, 2, "{id:?}");
        for (key, loc) in keys.iter().zip(&hit.locations) {
            let loc = loc.as_ref().expect("served");
            for s in &loc.specs {
                assert_eq!(
                    client_read(&s.uri, SPEC as usize),
                    payload(id, &s.name, key.0),
                    "{id:?} {:?} read back different bytes",
                    s.name
                );
            }
        }
    }
}

/// Asserts every file below `tmp` lies under `root`.
fn assert_nothing_outside(tmp: &Path, root: &Path) {
    let files = files_under(tmp);
    assert!(!files.is_empty(), "the test wrote nothing");
    for f in files {
        assert!(
            f.starts_with(root),
            "{} appeared outside {}",
            f.display(),
            root.display()
        );
    }
}

#[tokio::test]
async fn runtime_file_pool_confines_hostile_names_and_round_trips() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("root");
    std::fs::create_dir(&root).expect("root");
    let svc = managed_service(&root);
    let pool_dir = root.join("pool");
    svc.add_storage(storage("pool", format!("file://{}", pool_dir.display())))
        .expect("adding a storage under the root");
    // Works at once: a file pool, no restart.
    assert!(
        svc.backend("pool").is_some(),
        "runtime storage has no backend"
    );
    assert!(pool_dir.join("pool-0000.kv").is_file());
    svc.create_group(group("pool")).expect("group");
    write_and_read_hostile(&svc, &root).await;
    for inst in svc.list_instances(None) {
        let hit = svc
            .get_cache_location(&inst.id, &LocationQuery::prefix(vec![BlockKey(1)]))
            .await
            .expect("lookup");
        let loc = hit.locations[0].as_ref().expect("served");
        for s in &loc.specs {
            let (path, _) = client_place(&s.uri);
            assert_eq!(path.parent(), Some(pool_dir.as_path()), "{}", s.uri);
        }
    }
    assert_nothing_outside(tmp.path(), &root);
}

#[tokio::test]
async fn plain_scheme_confines_hostile_names() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("root").join("plain");
    // No backend: grants use the plain scheme under the storage's URI.
    let svc =
        MetaService::new(Arc::new(MemoryIndex::new()), MetaConfig::default()).expect("service");
    svc.add_storage(storage("plain", format!("file://{}", root.display())))
        .expect("storage");
    svc.create_group(group("plain")).expect("group");
    write_and_read_hostile(&svc, &root).await;
    assert_nothing_outside(tmp.path(), &root);
}

#[tokio::test]
async fn names_too_long_for_a_path_component_are_refused() {
    let svc =
        MetaService::new(Arc::new(MemoryIndex::new()), MetaConfig::default()).expect("service");
    svc.add_storage(storage("plain", "file:///kv".into()))
        .expect("storage");
    svc.create_group(group("plain")).expect("group");
    let long_id = "y".repeat(300);
    let slashes = "/".repeat(100);
    let long_spec = "s".repeat(256);
    for (id, spec) in [
        (long_id.as_str(), "tp0"),
        (slashes.as_str(), "tp0"),
        ("ok", long_spec.as_str()),
    ] {
        let r = svc.register_instance(instance(id, &[spec])).await;
        assert!(
            matches!(r, Err(MetaError::InvalidArgument(_))),
            "{}-byte id, {}-byte spec: {r:?}",
            id.len(),
            spec.len()
        );
    }
    assert!(svc.list_instances(None).is_empty());
}

#[tokio::test]
async fn storages_outside_the_roots_are_refused_and_create_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("root");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&root).expect("root");
    std::fs::create_dir_all(&outside).expect("outside");
    std::os::unix::fs::symlink(&outside, root.join("link")).expect("symlink");
    let svc = managed_service(&root);
    let uris = [
        format!("file://{}/pool", outside.display()),
        format!("file://{}/../outside/pool", root.display()),
        format!("file://{}/link/pool", root.display()),
        format!("file://{}/./pool", root.display()),
        "file://relative/pool".to_string(),
        "file:///".to_string(),
        "s3://bucket/prefix".to_string(),
    ];
    for uri in &uris {
        let r = svc.add_storage(storage("evil", uri.clone()));
        let Err(MetaError::InvalidArgument(why)) = r else {
            panic!("{uri}: {r:?}");
        };
        if uri.contains("outside") || uri.contains("link") {
            assert!(why.contains(&root.display().to_string()), "{why}");
        }
    }
    assert!(svc.list_storages().is_empty());
    assert!(svc.backend("evil").is_none());
    assert!(
        files_under(&outside).is_empty(),
        "files created outside the roots"
    );
    assert!(
        files_under(&root).is_empty(),
        "files created for a refused storage"
    );

    // Updates and snapshot loads follow the same rule.
    let good = storage("pool", format!("file://{}/pool", root.display()));
    svc.add_storage(good.clone())
        .expect("storage under the root");
    let moved = storage("pool", format!("file://{}/pool", outside.display()));
    assert!(matches!(
        svc.update_storage(moved.clone()),
        Err(MetaError::InvalidArgument(_))
    ));
    assert_eq!(svc.list_storages(), vec![good.clone()]);
    let mut snap = svc.gen_config_snapshot();
    snap.storages.push(storage(
        "other",
        format!("file://{}/other", outside.display()),
    ));
    assert!(matches!(
        svc.load_config_snapshot(snap),
        Err(MetaError::InvalidArgument(_))
    ));
    assert_eq!(svc.list_storages(), vec![good]);
    assert!(
        files_under(&outside).is_empty(),
        "files created outside the roots"
    );
}

#[tokio::test]
async fn a_storage_backend_follows_updates_and_removal() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("root");
    std::fs::create_dir(&root).expect("root");
    let svc = managed_service(&root);
    let (a, b) = (root.join("a"), root.join("b"));
    svc.add_storage(storage("pool", format!("file://{}", a.display())))
        .expect("add");
    svc.create_group(group("pool")).expect("group");
    svc.register_instance(instance("i", &["tp0"]))
        .await
        .expect("register");
    let first = svc.backend("pool").expect("backend");
    // Same kind and URI: the backend (and its allocation map) is kept.
    svc.update_storage(storage("pool", format!("file://{}", a.display())))
        .expect("same update");
    assert!(Arc::ptr_eq(&first, &svc.backend("pool").expect("backend")));

    svc.update_storage(storage("pool", format!("file://{}", b.display())))
        .expect("move");
    let grant = svc
        .start_write_cache("i", &[BlockKey(7)])
        .await
        .expect("grant");
    let uri = &grant.blocks[0].location.specs[0].uri;
    assert_eq!(client_place(uri).0.parent(), Some(b.as_path()), "{uri}");
    svc.finish_write_cache("i", grant.session, &[true])
        .await
        .expect("finish");

    let mut g = group("pool");
    svc.add_storage(storage(
        "spare",
        format!("file://{}", root.join("c").display()),
    ))
    .expect("spare");
    g.storages = vec!["spare".into()];
    svc.update_group(g).expect("group off pool");
    svc.remove_storage("pool").expect("remove");
    assert!(
        svc.backend("pool").is_none(),
        "removed storage keeps its backend"
    );
    assert!(svc.backend("spare").is_some());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Escaping is injective (it decodes back), and its output is one
    /// component: no separator, never `.` or `..`, only the escaped set.
    #[test]
    fn escaping_is_injective_and_stays_one_component(a in any::<String>(), b in any::<String>()) {
        let (ea, eb) = (escape_component(&a), escape_component(&b));
        prop_assert_eq!(unescape_component(&ea), Some(a.clone()));
        prop_assert_eq!(a == b, ea == eb);
        prop_assert!(!ea.contains('/') && !ea.contains('\\') && !ea.contains('\0'));
        prop_assert!(ea != "." && ea != "..");
        prop_assert!(ea.chars().all(|c| c.is_ascii_alphanumeric() || "-_.%".contains(c)));
        if !a.is_empty() && ea.len() <= 255 {
            prop_assert!(check_component(&ea).is_ok());
        }
    }

    /// Names made of the characters traversal needs stay one component.
    #[test]
    fn traversal_alphabet_stays_one_component(a in "[./%\\\\\\x00a2eE]{1,24}") {
        let e = escape_component(&a);
        prop_assert!(check_component(&e).is_ok(), "{:?} -> {:?}", a, e);
        prop_assert_eq!(Path::new(&e).components().count(), 1);
        prop_assert!(matches!(Path::new(&e).components().next(), Some(Component::Normal(_))));
    }
}
