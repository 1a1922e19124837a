//! NodeStoreBackend over a real node (arena, disk log, manager), and the
//! registry.

#[allow(dead_code)] // not every helper is used here
mod common;

use std::sync::Arc;

use kvtier_backend::{BackendOptions, NodeStoreBackend, node_block_hash, open_backend};
use kvtier_meta::{
    BackendError, BlockKey, CreateRequest, LocationId, Storage, StorageBackend, StorageHealth,
    StorageKind,
};
use kvtier_node::Node;

/// A real node (arena, disk log, manager) under a fresh directory.
async fn store() -> (tempfile::TempDir, Arc<Node>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = kvtier_node::test_support::small_config(dir.path(), 16);
    let node = Node::open(&config, Vec::new()).await.expect("node");
    (dir, node)
}

fn req(instance: &str, key: u64, loc: u64, spec: &str) -> CreateRequest {
    CreateRequest {
        instance: instance.into(),
        key: BlockKey(key),
        location: LocationId(loc),
        spec: spec.into(),
        size: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_node_names_checks_and_deletes_blocks() {
    let (_dir, s) = store().await;
    let block = vec![7u8; s.geometry().block_bytes() as usize];
    let b = NodeStoreBackend::local("node-1", s.clone());
    b.health().await.unwrap();
    let reqs = [
        req("llama/v1", 0xab, 0x10, "tp0"),
        req("llama/v1", 0xab, 0x10, "tp1"),
    ];
    let uris = b.create(&reqs).await.unwrap();
    assert_eq!(
        uris,
        [
            "kvtier://node-1/llama%2Fv1/00000000000000ab-10/tp0",
            "kvtier://node-1/llama%2Fv1/00000000000000ab-10/tp1"
        ]
    );
    assert_eq!(b.exist(&uris).await.unwrap(), vec![false, false]);
    // The client writes part tp0 into the node's store under its hash.
    s.manager()
        .put_host(node_block_hash("llama/v1", "tp0", BlockKey(0xab)), &block)
        .await
        .unwrap();
    assert_eq!(b.exist(&uris).await.unwrap(), vec![true, false]);
    // URIs written before names were escaped name the same blocks.
    let unescaped = ["kvtier://node-1/llama/v1/00000000000000ab-10/tp0".to_owned()];
    assert_eq!(b.exist(&unescaped).await.unwrap(), vec![true]);
    let used = b.usage().await.unwrap();
    assert_eq!((used.objects, used.used_bytes), (1, block.len() as u64));
    for r in b.delete(&uris).await {
        r.unwrap();
    }
    assert_eq!(b.exist(&uris).await.unwrap(), vec![false, false]);
    assert!(!s.contains(node_block_hash("llama/v1", "tp0", BlockKey(0xab))));
    // Other nodes' URIs and junk are bad URIs here.
    for bad in [
        "kvtier://node-2/llama/00000000000000ab-10/tp0",
        "kvtier://node-1/00000000000000ab-10/tp0",
        "kvtier://node-1/llama/zz-10/tp0",
        "kvtier://node-1/llama/ab/tp0",
        "file:///x",
    ] {
        assert!(
            matches!(
                b.delete(&[bad.to_owned()]).await.pop().unwrap(),
                Err(BackendError::BadUri { .. })
            ),
            "{bad}"
        );
    }
    assert!(b.create(&[req("i", 1, 1, "")]).await.is_err());
    // A closed store is unhealthy and takes no new parts.
    s.close().await.unwrap();
    assert!(matches!(
        b.health().await,
        Err(BackendError::Unavailable(_))
    ));
    assert!(matches!(
        b.create(&reqs).await,
        Err(BackendError::Unavailable(_))
    ));
}

/// Hostile instance ids and spec names become one escaped component each:
/// the URI has exactly `<instance>/<key>-<location>/<spec>` below the node,
/// and `exist` / `delete` decode it back to the block the client stored
/// under the raw names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_names_are_escaped_and_decode_back() {
    let (_dir, s) = store().await;
    let block = vec![3u8; s.geometry().block_bytes() as usize];
    let b = NodeStoreBackend::local("node-1", s.clone());
    let names = [
        ("../../y", "../../../spec"),
        ("/abs", "/etc/passwd"),
        ("%2e%2e", "%2E%2E"),
        ("nul\0", "ctl\u{1b}"),
        ("a?b&c=d#e", "x/y"),
        ("..", "."),
    ];
    for (n, (inst, spec)) in names.iter().enumerate() {
        let key = 0x100 + n as u64;
        let uri = b
            .create(&[req(inst, key, 1, spec)])
            .await
            .unwrap()
            .remove(0);
        let path = uri.strip_prefix("kvtier://node-1/").expect("node prefix");
        assert!(!path.contains(['?', '#', '\\', '\0']), "{uri}");
        common::assert_part_path(path, &uri);
        let hash = node_block_hash(inst, spec, BlockKey(key));
        s.manager().put_host(hash, &block).await.unwrap();
        assert_eq!(
            b.exist(std::slice::from_ref(&uri)).await.unwrap(),
            vec![true],
            "{uri}"
        );
        b.delete(std::slice::from_ref(&uri))
            .await
            .pop()
            .unwrap()
            .unwrap();
        assert!(!s.contains(hash), "{uri} did not delete its block");
    }
}

#[tokio::test]
async fn remote_node_is_unavailable() {
    let b = NodeStoreBackend::remote("node-9", None);
    for r in [
        b.health().await,
        b.create(&[req("i", 1, 1, "tp0")]).await.map(drop),
        b.exist(&["kvtier://node-9/i/01-1/tp0".into()])
            .await
            .map(drop),
        b.usage().await.map(drop),
    ] {
        match r {
            Err(BackendError::Unavailable(m)) => assert!(m.contains("node-9"), "{m}"),
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }
}

fn storage(kind: StorageKind, uri: &str) -> Storage {
    Storage {
        name: "s".into(),
        kind,
        uri: uri.into(),
        enabled: true,
        health: StorageHealth::Healthy,
        spec: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_opens_by_kind_and_rejects_bad_uris() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = BackendOptions::default();
    opts.file_pool.file_size = 1 << 16;
    opts.file_pool.files = 1;
    let (_dir, s) = store().await;
    opts.local_node = Some(("node-1".into(), kvtier_node::NodeHost::of(s.clone())));
    let pool = open_backend(
        &storage(
            StorageKind::FilePool,
            &format!("file://{}", dir.path().display()),
        ),
        &opts,
    )
    .unwrap();
    pool.health().await.unwrap();
    let local = open_backend(&storage(StorageKind::KvtierNode, "kvtier://node-1"), &opts).unwrap();
    local.health().await.unwrap();
    let remote = open_backend(&storage(StorageKind::KvtierNode, "kvtier://node-2"), &opts).unwrap();
    assert!(remote.health().await.is_err());
    open_backend(&storage(StorageKind::S3, "s3://bucket/prefix"), &opts).unwrap();
    for (kind, uri) in [
        (StorageKind::FilePool, "s3://bucket/x"),
        (StorageKind::FilePool, "file://relative"),
        (StorageKind::S3, "file:///tmp/x"),
        (StorageKind::S3, "s3:///nobucket"),
        (StorageKind::S3, "s3://b/a/../c"),
        (StorageKind::KvtierNode, "kvtier:///pool"),
        (StorageKind::KvtierNode, "kvtier://node-1/pool"),
        (StorageKind::KvtierNode, "node-1"),
    ] {
        let r = open_backend(&storage(kind, uri), &opts);
        assert!(
            matches!(r, Err(BackendError::BadUri { .. })),
            "{kind:?} {uri}: {r:?}"
        );
    }
}
