//! Paths from client input over the wire (issue 10, defects 3 and 6): the
//! admin API's `addStorage` / `updateStorage` refuse directories outside
//! the storage roots and create nothing there, and write grants for
//! instances with hostile ids and spec names name parts only under their
//! storage's directory.

#[path = "support/lib.rs"]
mod support;

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use kvtier_meta::{MemoryIndex, MetaConfig};
use kvtier_server::ServerConfig;
use serde_json::{Value, json};
use support::*;

/// A server whose admin-added `file://` storages must lie under `root`.
async fn start_confined(root: &Path) -> TestServer {
    let cfg = MetaConfig {
        storage_roots: Some(vec![root.to_path_buf()]),
        ..MetaConfig::default()
    };
    let svc = Arc::new(
        kvtier_meta::MetaService::new(Arc::new(MemoryIndex::new()), cfg).expect("service"),
    );
    start_with(svc, ServerConfig::localhost_ephemeral()).await
}

fn nfs(name: &str, root_path: &str) -> Value {
    json!({"storage": {"global_unique_name": name, "nfs": {"root_path": root_path}}})
}

#[tokio::test]
async fn admin_storages_outside_the_roots_are_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("root");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&root).expect("root");
    let ts = start_confined(&root).await;
    let ad = ts.server.admin_http_addr();
    for path in [
        outside.join("pool").display().to_string(),
        format!("{}/../outside/pool", root.display()),
        "/etc".to_string(),
        "relative/pool".to_string(),
    ] {
        let (_, r) = post(ad, "/api/addStorage", &nfs("evil", &path), None).await;
        assert_eq!(code(&r), "INVALID_ARGUMENT", "{path}: {r}");
        let msg = r["header"]["status"]["message"].as_str().unwrap_or("");
        if path.contains("outside") {
            assert!(msg.contains(&root.display().to_string()), "{msg}");
        }
    }
    assert!(
        ts.svc.list_storages().is_empty(),
        "a refused add changed the catalog"
    );
    assert!(
        !outside.exists(),
        "a refused add created {}",
        outside.display()
    );

    let inside = root.join("pool").display().to_string();
    let (_, r) = post(ad, "/api/addStorage", &nfs("pool", &inside), None).await;
    assert_eq!(code(&r), "OK", "{r}");
    let moved = json!({"storage": {"global_unique_name": "pool",
        "nfs": {"root_path": outside.join("pool").display().to_string()}}});
    let (_, r) = post(ad, "/api/updateStorage", &moved, None).await;
    assert_eq!(code(&r), "INVALID_ARGUMENT", "{r}");
    assert_eq!(ts.svc.list_storages()[0].uri, format!("file://{inside}"));
    assert!(!outside.exists());
}

/// `p` with `..` applied lexically.
fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[tokio::test]
async fn hostile_instance_ids_get_uris_under_the_storage() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&root).expect("root");
    let ts = start_confined(&root).await;
    let ad = ts.server.admin_http_addr();
    let dir = root.join("plain");
    let (_, r) = post(
        ad,
        "/api/addStorage",
        &nfs("plain", &dir.display().to_string()),
        None,
    )
    .await;
    assert_eq!(code(&r), "OK", "{r}");
    let mut g = group("g", 1 << 40);
    g.storages = vec!["plain".into()];
    ts.svc.create_group(g).expect("group");
    let a = ts.server.meta_http_addr();
    for (id, spec) in [
        ("../../y", "../../../spec"),
        ("/abs/olute", "/etc/passwd"),
        ("%2e%2e", "%2E%2E"),
        ("q?x=1#frag", "a/b"),
        ("é/..", "."),
    ] {
        let mut body = register_body(id, "g");
        body["location_spec_infos"][0]["name"] = json!(spec);
        let (_, r) = post(a, "/api/registerInstance", &body, None).await;
        assert_eq!(code(&r), "OK", "{id:?}: {r}");
        let (_, w) = post(
            a,
            "/api/startWriteCache",
            &json!({"instance_id": id, "block_keys": [1, 2]}),
            None,
        )
        .await;
        assert_eq!(code(&w), "OK", "{id:?}: {w}");
        for loc in w["locations"].as_array().expect("locations") {
            let uri = loc["location_specs"][0]["uri"].as_str().expect("uri");
            let path = Path::new(uri.strip_prefix("file://").expect("file uri"));
            assert!(
                path.components().all(|c| c != Component::ParentDir),
                "{uri} has a '..' component"
            );
            assert!(
                lexical(path).starts_with(&dir),
                "{uri} is outside {}",
                dir.display()
            );
            assert_eq!(
                path.strip_prefix(&dir).map(|r| r.components().count()),
                Ok(3),
                "{uri}"
            );
        }
    }
}
