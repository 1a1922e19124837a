//! `ObjectBackend::dir`, the backend of a `file_objects` storage: block
//! parts as files in a shared directory, opened through `open_backend` as
//! the metadata service opens it. Hostile instance ids and spec names stay
//! three escaped components below the directory; `exist`, `delete` (which
//! takes the emptied directories with it, and is idempotent), `usage` and
//! the health probe work on real files; a URI of another store is
//! refused, and so is a directory that does not exist.

#[allow(dead_code)] // not every helper is used here
mod common;

use std::os::unix::fs::MetadataExt;

use kvtier_backend::{BackendOptions, open_backend};
use kvtier_meta::{
    BackendError, BlockKey, CreateRequest, LocationId, Storage, StorageHealth, StorageKind,
};

fn storage(uri: &str) -> Storage {
    Storage {
        name: "shared".into(),
        kind: StorageKind::FileObjects,
        uri: uri.into(),
        enabled: true,
        health: StorageHealth::Healthy,
        spec: None,
    }
}

fn req(key: u64, instance: &str, spec: &str) -> CreateRequest {
    CreateRequest {
        instance: instance.into(),
        key: BlockKey(key),
        location: LocationId(7),
        spec: spec.into(),
        size: 3,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_files_stay_below_the_directory_and_are_deleted_with_their_directories() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("shared");
    std::fs::create_dir(&dir).unwrap();
    let mode = |d: &std::path::Path| std::fs::metadata(d).unwrap().mode() & 0o7777;
    let operators = mode(&dir);
    let url = format!("file://{}", dir.display());
    let b = open_backend(&storage(&format!("{url}/")), &BackendOptions::default()).unwrap();
    b.health().await.unwrap();
    let names = [
        ("../../y", "../../../spec"),
        ("/abs", "x/y"),
        ("a?b#c", ".."),
        ("m", "block"),
    ];
    let requests: Vec<CreateRequest> = (names.iter().enumerate())
        .map(|(n, (inst, spec))| req(n as u64, inst, spec))
        .collect();
    let uris = b.create(&requests).await.unwrap();
    assert_eq!(b.exist(&uris).await.unwrap(), vec![false; names.len()]);
    for uri in &uris {
        // A node writes the file the grant named, as the shared G4 does.
        let rel = uri
            .strip_prefix(&format!("{url}/"))
            .expect("under the directory");
        common::assert_part_path(rel, uri);
        let file = dir.join(rel);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, b"kv!").unwrap();
    }
    assert_eq!(b.exist(&uris).await.unwrap(), vec![true; names.len()]);
    let usage = b.usage().await.unwrap();
    assert_eq!(
        (usage.objects, usage.used_bytes),
        (names.len() as u64, 3 * names.len() as u64)
    );

    for r in b.delete(&uris).await {
        r.unwrap();
    }
    assert_eq!(b.exist(&uris).await.unwrap(), vec![false; names.len()]);
    // Every directory the files were in went with them; the operator's
    // directory stays, with its mode.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    assert_eq!(mode(&dir), operators);
    // Deleting what is gone already succeeds.
    for r in b.delete(&uris).await {
        r.unwrap();
    }

    // Another store's URIs are refused, one by one.
    let foreign = [
        "s3://bucket/shared/m/0-7/block".to_owned(),
        format!("file://{}/other/m/0-7/block", root.path().display()),
        format!("{url}/m/0-7/block?x=1"),
    ];
    for (r, uri) in b.delete(&foreign).await.into_iter().zip(&foreign) {
        assert!(
            matches!(r, Err(BackendError::BadUri { .. })),
            "{uri}: {r:?}"
        );
    }

    // Gone (unmounted), the directory fails the probe and is not made again.
    std::fs::remove_dir(&dir).unwrap();
    assert!(b.health().await.is_err());
    assert!(!dir.exists());
}

#[test]
fn a_directory_that_is_missing_relative_or_another_store_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let missing = format!("file://{}/not-mounted", root.path().display());
    for uri in [
        missing.as_str(),
        "file://relative/dir",
        "s3://bucket/x",
        "file:///",
    ] {
        let r = open_backend(&storage(uri), &BackendOptions::default());
        assert!(
            matches!(r, Err(BackendError::BadUri { .. })),
            "{uri}: {r:?}"
        );
    }
}
