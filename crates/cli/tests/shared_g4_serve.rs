//! Two real `kvtier serve` daemons of one cluster, one Redis index and one
//! S3 bucket (moto) as their shared G4 (docs/cluster.md, "A shared G4"):
//! blocks stored through node A's socket are written to the bucket once,
//! counted on A's `/metrics`; node B storing the same blocks finds them
//! present and writes nothing. A start with `[shared_g4]` but without the
//! metadata service or a cluster identity, or with the node's own G4 on
//! the shared store, stops with a message saying why.

use std::path::Path;

use futures::TryStreamExt;
use kvtier_meta::test_support::RedisServer;
use kvtier_remote::test_support::MotoServer;
use object_store::ObjectStore;
use support::node::{Daemon, secret_in, shm_name, store_blocks, wait_until};

mod support;

const BUCKET: &str = "cluster-g4";

/// A daemon named `node` of the cluster, with the shared G4 on `moto`.
fn member(data: &Path, node: &str, redis: &str, secret: &str, moto: &MotoServer) -> Daemon {
    let endpoint = moto.endpoint();
    let url = format!("s3://{BUCKET}/shared");
    let env = [
        ("KVTIER_META__ENABLED", "true"),
        ("KVTIER_META__INDEX", redis),
        ("KVTIER_NODE", node),
        ("KVTIER_PEER__LISTEN", "127.0.0.1:0"),
        ("KVTIER_PEER__CLUSTER", "shared-g4"),
        ("KVTIER_PEER__SECRET_FILE", secret),
        ("KVTIER_SHARED_G4__URL", url.as_str()),
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_REGION", "us-east-1"),
    ];
    Daemon::start(data, &shm_name(node), &env)
}

/// The value of counter `name` on `daemon`'s admin `/metrics`.
fn counter(daemon: &Daemon, name: &str) -> u64 {
    let admin = daemon.logged_addr("admin_http");
    let (_, metrics) = support::http_text(admin, "GET", "/metrics", None, "");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no {name}:\n{metrics}"))
}

/// Objects in the bucket.
fn objects(moto: &MotoServer) -> usize {
    let store = moto.store(BUCKET);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let listed: Vec<_> = rt
        .block_on(store.list(None).try_collect())
        .expect("list the bucket");
    listed.len()
}

#[test]
fn blocks_stored_on_a_node_are_written_to_the_shared_g4_once() {
    let redis = RedisServer::start().expect("start redis-server (.ci/run installs it)");
    let moto = MotoServer::start();
    moto.create_bucket(BUCKET);
    let keep = tempfile::tempdir().expect("secret dir");
    let secret = secret_in(keep.path(), &[0x33; 32]);
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = member(da.path(), "g4-a", &redis.url(), &secret, &moto);
    let b = member(db.path(), "g4-b", &redis.url(), &secret, &moto);

    let ks: Vec<u128> = (1..=3).map(|k| k | (0x64 << 64)).collect();
    store_blocks(&mut a.client(), &ks);
    let written = "kvtier_node_shared_g4_written_total";
    wait_until("node A to write its blocks to the shared G4", || {
        (counter(&a, written) == 3).then_some(())
    });
    assert_eq!(objects(&moto), 3);
    assert_eq!(counter(&a, "kvtier_node_shared_g4_failed_total"), 0);

    store_blocks(&mut b.client(), &ks);
    let present = "kvtier_node_shared_g4_present_total";
    wait_until("node B to find them in the shared G4", || {
        (counter(&b, present) == 3).then_some(())
    });
    assert_eq!(counter(&b, written), 0);
    assert_eq!(objects(&moto), 3);
    drop((a, b));
}

/// `kvtier serve` with `[shared_g4]` and `extra` exits with an error that
/// contains `says`, having made no disk tier.
fn refused(extra: &[(&str, &str)], says: &str) {
    let data = tempfile::tempdir().unwrap();
    let keep = tempfile::tempdir().unwrap();
    let secret = secret_in(keep.path(), &[0x34; 32]);
    let mut cmd = support::serve(data.path(), &shm_name("g4-refused"));
    cmd.env("KVTIER_SHARED_G4__URL", "s3://bucket/shared")
        .env("KVTIER_META__ENABLED", "true")
        .env("KVTIER_PEER__LISTEN", "127.0.0.1:0")
        .env("KVTIER_PEER__CLUSTER", "shared-g4")
        .env("KVTIER_PEER__SECRET_FILE", &secret);
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run kvtier serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(says), "{err}");
    assert!(
        !data.path().join("disk").exists(),
        "a refused start made the disk tier"
    );
}

#[test]
fn a_shared_g4_that_cannot_work_stops_the_start() {
    refused(&[("KVTIER_META__ENABLED", "false")], "meta.enabled");
    refused(&[("KVTIER_PEER__LISTEN", "")], "cluster identity");
    refused(
        &[("KVTIER_MANAGER__G4_URL", "s3://bucket/shared")],
        "overlaps shared_g4.url",
    );
    refused(&[("KVTIER_SHARED_G4__URL", "file:///tmp/g4")], "s3://");
}
