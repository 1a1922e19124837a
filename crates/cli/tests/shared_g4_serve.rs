//! Real `kvtier serve` daemons of one cluster, one Redis index and, as
//! their shared G4 (docs/cluster.md, "A shared G4"), one S3 bucket (moto)
//! or one directory they all see (a shared mount's stand-in), the same
//! scenario on each:
//! blocks stored through node A's socket are written to the store once,
//! counted on A's `/metrics` (in a directory, files `0600` in directories
//! `0700`); node C storing the same blocks finds them present and writes
//! nothing. With A stopped and its data directory
//! deleted, B's `Lookup` answers them with the shared G4's tier (kind
//! Remote) and B's `Load` brings them byte-exact; a corrupt object is a
//! miss, never served, and stays; another tenant finds nothing. A start
//! with `[shared_g4]` but without the metadata service or a cluster
//! identity, with the node's own G4 on the shared store, or with a
//! shared directory that is relative, missing or not a directory, stops
//! with a message saying why, before anything is made.

use std::path::Path;

use bytes::Bytes;
use kvtier_client::{BlockHash, Client};
use kvtier_core::{Tier, TierKind};
use kvtier_meta::test_support::RedisServer;
use kvtier_remote::test_support::SharedStore;
use object_store::path::Path as ObjectPath;
use support::node::{
    Daemon, Stats, cluster_member, load_all, secret_in, shm_name, store_blocks, wait_until,
};

mod support;

/// A daemon named `node` of the cluster, with the shared G4 on `shared`.
fn member(data: &Path, node: &str, redis: &str, secret: &str, shared: &SharedStore) -> Daemon {
    let env = shared.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    cluster_member(data, node, "shared-g4", redis, secret, &env)
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

/// The block objects in the shared G4 with their bytes.
fn objects_of(shared: &SharedStore) -> Vec<(ObjectPath, Bytes)> {
    block_on(shared.objects())
}

/// Objects in the shared G4.
fn objects(shared: &SharedStore) -> usize {
    objects_of(shared).len()
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn on_s3_blocks_are_written_once_and_load_byte_exact_after_their_node_is_gone() {
    written_once_loaded_after_the_node_is_gone(&SharedStore::s3("cluster-g4"));
}

#[test]
fn in_a_shared_directory_blocks_are_written_once_and_load_after_their_node_is_gone() {
    written_once_loaded_after_the_node_is_gone(&SharedStore::dir());
}

/// The scenario on `shared`: A writes, C finds them present, B loads
/// them once A is gone; corrupt objects are misses and stay; another
/// tenant finds nothing.
fn written_once_loaded_after_the_node_is_gone(shared: &SharedStore) {
    let redis = RedisServer::start().expect("start redis-server (.ci/run installs it)");
    let keep = tempfile::tempdir().expect("secret dir");
    let secret = secret_in(keep.path(), &[0x33; 32]);
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = member(da.path(), "g4-a", &redis.url(), &secret, shared);
    let b = member(db.path(), "g4-b", &redis.url(), &secret, shared);

    // A commits: each block written once.
    let ks: Vec<u128> = (1..=3).map(|k| k | (0x64 << 64)).collect();
    store_blocks(&mut a.client(), &ks);
    let written = "kvtier_node_shared_g4_written_total";
    wait_until("node A to write its blocks to the shared G4", || {
        (counter(&a, written) == 3).then_some(())
    });
    assert_eq!(objects(shared), 3);
    assert_eq!(counter(&a, "kvtier_node_shared_g4_failed_total"), 0);
    let private = shared.assert_private();
    assert!(private.is_none_or(|files| files == 3), "{private:?}");

    // C, a third node, stores them too: present, nothing written again.
    let dc = tempfile::tempdir().unwrap();
    let c = member(dc.path(), "g4-c", &redis.url(), &secret, shared);
    store_blocks(&mut c.client(), &ks);
    let present = "kvtier_node_shared_g4_present_total";
    wait_until("node C to find them in the shared G4", || {
        (counter(&c, present) == 3).then_some(())
    });
    assert_eq!(counter(&c, written), 0);
    assert_eq!(objects(shared), 3);
    drop(c);

    // A and C are gone, A's data with it: B finds the blocks in the shared
    // G4, listed after the peer tier, kind Remote.
    drop(a);
    drop(da);
    let mut on_b = b.client();
    let tiers = on_b.tiers().to_vec();
    let g4 = *tiers.last().expect("tiers");
    assert_eq!(g4.kind, TierKind::Remote, "{tiers:?}");
    assert_eq!(tiers[tiers.len() - 2].kind, TierKind::Peer, "{tiers:?}");
    let keys: Vec<BlockHash> = ks.iter().map(|k| BlockHash(*k)).collect();
    wait_until("node B to find the blocks in the shared G4", || {
        (on_b.lookup(&keys).unwrap() == [g4.tier; 3]).then_some(())
    });

    // A corrupt object is a miss, never served, and stays in the store.
    let good = objects_of(shared);
    let bad: Vec<(ObjectPath, Bytes)> = (good.iter())
        .map(|(p, b)| {
            let mut v = b.to_vec();
            let last = v.len() - 1;
            v[last] ^= 0x20;
            (p.clone(), Bytes::from(v))
        })
        .collect();
    block_on(shared.put_objects(&bad));
    assert_eq!(load_all(&mut on_b, &ks), 0);
    assert_eq!(Stats::of(&mut on_b).get("shared_g4_misses"), 3);
    assert_eq!(objects(shared), 3);

    // Mended, they load byte-exact into B's G2.
    block_on(shared.put_objects(&good));
    assert_eq!(load_all(&mut on_b, &ks), 3);
    assert_eq!(on_b.lookup(&keys).unwrap(), [Tier::G2; 3]);
    assert_eq!(Stats::of(&mut on_b).get("shared_g4_hits"), 3);

    // Another tenant finds nothing of them on B.
    let mut config = b.client_config();
    config.namespace.tenant_salt = Some(b"another tenant".to_vec());
    let mut tenant = Client::connect(config).expect("connect");
    assert_eq!(tenant.lookup(&keys).unwrap(), []);
    drop(b);
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
    refused(
        &[("KVTIER_SHARED_G4__URL", "gs://bucket/x")],
        "file:///absolute/dir",
    );
    let shared = SharedStore::dir();
    let dir = shared.path().expect("a directory");
    let url = shared.url();
    refused(
        &[
            ("KVTIER_SHARED_G4__URL", &url),
            ("KVTIER_MANAGER__G4_URL", &format!("{url}/own")),
        ],
        "overlaps shared_g4.url",
    );
    refused(
        &[("KVTIER_SHARED_G4__URL", "file://shared/g4")],
        "absolute directory",
    );
    let missing = dir.join("not-mounted");
    refused(
        &[(
            "KVTIER_SHARED_G4__URL",
            &format!("file://{}", missing.display()),
        )],
        &format!("directory {} does not exist", missing.display()),
    );
    assert!(
        !missing.exists(),
        "a refused start made the shared directory"
    );
    let plain = dir.join("plain");
    std::fs::write(&plain, b"").unwrap();
    refused(
        &[(
            "KVTIER_SHARED_G4__URL",
            &format!("file://{}", plain.display()),
        )],
        "is not a directory",
    );
}
