//! ObjectBackend::s3 against a real S3-compatible server: moto (`moto_server`, from
//! PyPI `moto[server]`), started by `kvtier_remote::test_support::MotoServer`
//! on 127.0.0.1 with a free port and stopped on drop. The test fails when
//! moto is not installed.

#[allow(dead_code)] // not every helper is used here
mod common;

use std::net::TcpListener;
use std::time::Duration;

use kvtier_backend::{ObjectBackend, S3Options};
use kvtier_meta::{BackendError, BlockKey, CreateRequest, LocationId, StorageBackend};
use kvtier_remote::test_support::MotoServer;
use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;

fn opts(port: u16) -> S3Options {
    S3Options {
        endpoint: Some(format!("http://127.0.0.1:{port}")),
        region: "us-east-1".into(),
        access_key_id: Some("testing".into()),
        secret_access_key: Some("testing".into()),
        session_token: None,
        allow_http: true,
        timeout: Duration::from_secs(2),
        usage_list_limit: 1000,
    }
}

fn req(key: u64, loc: u64, spec: &str) -> CreateRequest {
    CreateRequest {
        instance: "llama".into(),
        key: BlockKey(key),
        location: LocationId(loc),
        spec: spec.into(),
        size: 3,
    }
}

/// A client writing the object a grant named, as an engine would.
async fn client_put(port: u16, bucket: &str, uri: &str, bytes: &[u8]) {
    let key = uri.strip_prefix(&format!("s3://{bucket}/")).unwrap();
    client_store(port, bucket)
        .put(&Path::from(key), bytes.to_vec().into())
        .await
        .unwrap();
}

/// A client of `bucket` on the moto server at `port`.
fn client_store(port: u16, bucket: &str) -> object_store::aws::AmazonS3 {
    AmazonS3Builder::new()
        .with_endpoint(format!("http://127.0.0.1:{port}"))
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_bucket_name(bucket)
        .with_access_key_id("testing")
        .with_secret_access_key("testing")
        .build()
        .unwrap()
}

/// Hostile instance ids and spec names become one escaped key segment
/// each: every object a client writes at a granted URI (the URI's path
/// taken as the key, as written) lies under the storage's prefix, three
/// segments below it, none `.` or `..`; `exist` and `delete` find it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_names_stay_under_the_prefix() {
    let moto = MotoServer::start();
    moto.create_bucket("kvbucket");
    let b = ObjectBackend::s3("s3://kvbucket/cache/v1", &opts(moto.port())).unwrap();
    let client = client_store(moto.port(), "kvbucket");
    let names = [
        ("../../y", "../../../spec"),
        ("/abs", "/etc/passwd"),
        ("%2e%2e", ".."),
        ("nul\0", "ctl\u{1b}"),
        ("a?b#c", "x/y"),
    ];
    let mut uris = Vec::new();
    for (n, (inst, spec)) in names.iter().enumerate() {
        let mut r = req(n as u64, 1, spec);
        r.instance = inst.to_string();
        let uri = b.create(&[r]).await.unwrap().remove(0);
        let key = uri.strip_prefix("s3://kvbucket/").expect("bucket");
        client
            .put(
                &Path::parse(key).expect("a valid key"),
                b"v".to_vec().into(),
            )
            .await
            .unwrap();
        uris.push(uri);
    }
    assert_eq!(b.exist(&uris).await.unwrap(), vec![true; names.len()]);
    let listed: Vec<object_store::ObjectMeta> =
        futures::TryStreamExt::try_collect(client.list(None))
            .await
            .unwrap();
    assert_eq!(listed.len(), names.len());
    for o in &listed {
        let key = o.location.as_ref();
        let rest = key
            .strip_prefix("cache/v1/")
            .unwrap_or_else(|| panic!("{key} outside the prefix"));
        common::assert_part_path(rest, key);
    }
    for r in b.delete(&uris).await {
        r.unwrap();
    }
    assert_eq!(b.exist(&uris).await.unwrap(), vec![false; names.len()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_checks_lists_deletes_and_probes_objects() {
    let moto = MotoServer::start();
    moto.create_bucket("kvbucket");
    let b = ObjectBackend::s3("s3://kvbucket/cache/v1", &opts(moto.port())).unwrap();
    b.health().await.unwrap();

    let uris = b
        .create(&[
            req(0xab, 0x10, "tp0"),
            req(0xab, 0x10, "tp1"),
            req(0xcd, 0x11, "tp0"),
        ])
        .await
        .unwrap();
    assert_eq!(
        uris[0],
        "s3://kvbucket/cache/v1/llama/00000000000000ab-10/tp0"
    );
    // Naming allocates nothing.
    assert_eq!(b.exist(&uris).await.unwrap(), vec![false; 3]);
    client_put(moto.port(), "kvbucket", &uris[0], b"abc").await;
    client_put(moto.port(), "kvbucket", &uris[2], b"defg").await;
    assert_eq!(b.exist(&uris).await.unwrap(), vec![true, false, true]);
    let u = b.usage().await.unwrap();
    assert_eq!((u.objects, u.used_bytes, u.capacity_bytes), (2, 7, None));

    // Batch delete; a missing object deletes fine.
    for r in b.delete(&uris).await {
        r.unwrap();
    }
    assert_eq!(b.exist(&uris).await.unwrap(), vec![false; 3]);
    assert_eq!(b.usage().await.unwrap().objects, 0);

    // URIs outside this storage are bad, not deleted.
    for bad in [
        "s3://otherbucket/cache/v1/llama/01-1/tp0",
        "s3://kvbucket/elsewhere/llama/01-1/tp0",
        "s3://kvbucket/cache/v1x/llama/01-1/tp0",
        "file:///cache/v1/x",
    ] {
        let r = b.delete(&[bad.to_owned()]).await.pop().unwrap();
        assert!(
            matches!(r, Err(BackendError::BadUri { .. })),
            "{bad}: {r:?}"
        );
    }

    // A stopped server: every call answers Unavailable (never hangs).
    drop(moto);
    let guard = Duration::from_secs(60);
    let r = tokio::time::timeout(guard, b.health())
        .await
        .expect("health hung");
    assert!(matches!(r, Err(BackendError::Unavailable(_))), "{r:?}");
    let r = tokio::time::timeout(guard, b.exist(&uris))
        .await
        .expect("exist hung");
    assert!(matches!(r, Err(BackendError::Unavailable(_))), "{r:?}");
    let r = tokio::time::timeout(guard, b.delete(&uris))
        .await
        .expect("delete hung");
    assert!(
        r.iter()
            .all(|r| matches!(r, Err(BackendError::Unavailable(_)))),
        "{r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_times_out() {
    // Accepts connections and reads, but never answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().flatten() {
            held.push(s);
        }
    });
    let mut o = opts(port);
    o.timeout = Duration::from_millis(500);
    let b = ObjectBackend::s3("s3://kvbucket/p", &o).unwrap();
    let guard = Duration::from_secs(60);
    let r = tokio::time::timeout(guard, b.health())
        .await
        .expect("health hung");
    match r {
        Err(BackendError::Unavailable(_)) => {}
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let r = tokio::time::timeout(guard, b.usage())
        .await
        .expect("usage hung");
    assert!(matches!(r, Err(BackendError::Unavailable(_))), "{r:?}");
}
