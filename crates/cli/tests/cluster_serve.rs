//! Two real `kvtier serve` daemons of one cluster sharing one Redis index
//! (docs/meta-api.md §10.2): a block an engine stored through node A's
//! socket is answered by node B's `Lookup` as the peer tier, and B's
//! `/metrics` counts the cluster lookups; B's `Load` then streams it from A
//! (its slots answered at once, `Arriving`, each layer readable exact as
//! it lands) and holds it in its G2. With A SIGKILLed between B's
//! `Lookup` and `Load`, the `Load` answers misses. A daemon of a cluster
//! stopped cleanly leaves no arena behind. A stalled index (Redis stopped
//! with SIGSTOP) ends a `Lookup` at its deadline.

use std::path::Path;

use kvtier_client::{BlockHash, Client, LoadResult, Lookup};
use kvtier_core::{Tier, TierKind};
use kvtier_meta::test_support::RedisServer;
use support::node::{
    Daemon, Stats, block, cluster_member, geometry, load_all, secret_in, store_blocks, wait_until,
};

mod support;

/// A daemon named `node` of the cluster over the index at `redis`.
fn member(data: &Path, node: &str, redis: &str, secret: &str) -> Daemon {
    // Long: a loaded machine must not turn a hit into a miss.
    let env = [("KVTIER_PEER__LOAD_TIMEOUT_MS", "30000")];
    cluster_member(data, node, "cluster-serve", redis, secret, &env)
}

#[test]
fn a_block_stored_on_node_a_is_found_by_node_bs_lookup() {
    let redis = RedisServer::start().expect("start redis-server (.ci/run installs it)");
    let keep = tempfile::tempdir().expect("secret dir");
    let secret = secret_in(keep.path(), &[0x17; 32]);
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = member(da.path(), "cluster-a", &redis.url(), &secret);
    let b = member(db.path(), "cluster-b", &redis.url(), &secret);

    let ks: Vec<u128> = (1..=3).map(|k| k | (0x5eed << 64)).collect();
    store_blocks(&mut a.client(), &ks);

    // B lists the peer tier after its own, and answers A's blocks with it
    // once A's view published them.
    let mut on_b = b.client();
    let peer = *on_b.tiers().last().expect("tiers");
    assert_eq!(peer.kind, TierKind::Peer, "{:?}", on_b.tiers());
    let keys: Vec<BlockHash> = ks.iter().map(|k| BlockHash(*k)).collect();
    wait_until("node B to find node A's blocks", || {
        let tiers = on_b.lookup(&keys).unwrap();
        (tiers == [peer.tier; 3]).then_some(())
    });

    let admin = b.logged_addr("admin_http");
    let (_, metrics) = support::http_text(admin, "GET", "/metrics", None, "");
    let sample = |name: &str| sample(&metrics, name);
    // The last lookup found all three (earlier ones may have found fewer).
    assert!(sample("kvtier_node_cluster_hits_total") >= 3.0);
    assert!(sample("kvtier_node_cluster_lookup_queries_total") >= 1.0);

    // B's Load streams them from A, verified, into its G2; a second
    // finds them there.
    load_layer_by_layer(&mut on_b, &ks);
    assert_eq!(on_b.lookup(&keys).unwrap(), [Tier::G2; 3]);
    assert_eq!(load_all(&mut on_b, &ks), 3);
    let s = Stats::of(&mut on_b);
    assert_eq!((s.get("peer_hits"), s.get("peer_misses")), (3, 0));
    drop(on_b);
    // Stopped cleanly, neither leaves its arena behind, though the
    // metadata service's backends and the cluster lookup hold the node
    // until the process ends.
    for mut daemon in [a, b] {
        let arena = Path::new("/dev/shm").join(daemon.shm());
        let (status, log) = daemon.terminate();
        assert!(status.success(), "{status:?} {log:?}");
        assert!(!arena.exists(), "left {}", arena.display());
    }
}

#[test]
fn a_load_from_a_node_killed_after_the_lookup_misses() {
    let redis = RedisServer::start().expect("start redis-server (.ci/run installs it)");
    let keep = tempfile::tempdir().expect("secret dir");
    let secret = secret_in(keep.path(), &[0x18; 32]);
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = member(da.path(), "gone-a", &redis.url(), &secret);
    let b = member(db.path(), "gone-b", &redis.url(), &secret);

    let ks: Vec<u128> = (1..=2).map(|k| k | (0x90e << 64)).collect();
    store_blocks(&mut a.client(), &ks);
    let mut on_b = b.client();
    let peer = on_b.tiers().last().expect("tiers").tier;
    let keys: Vec<BlockHash> = ks.iter().map(|k| BlockHash(*k)).collect();
    wait_until("node B to find node A's blocks", || {
        (on_b.lookup(&keys).unwrap() == [peer; 2]).then_some(())
    });

    a.kill();
    assert_eq!(load_all(&mut on_b, &ks), 0);
    let s = Stats::of(&mut on_b);
    assert_eq!((s.get("peer_hits"), s.get("peer_misses")), (0, 2));
    // The session goes on; B holds nothing of them (whether the cluster
    // still names A depends on when its health was probed).
    let tiers = on_b.lookup(&keys).unwrap();
    assert!(!tiers.contains(&Tier::G2), "{tiers:?}");
    drop((a, b));
}

/// Loads `ks`, each located on a peer: every slot answered at once as
/// arriving, each layer read exact once its `LayerReady` came, then the
/// whole blocks; released after.
fn load_layer_by_layer(client: &mut Client, ks: &[u128]) {
    let keys: Vec<BlockHash> = ks.iter().map(|k| BlockHash(*k)).collect();
    let load = client.load(&keys).expect("load");
    assert!(
        (load.results().iter()).all(|r| matches!(r, LoadResult::Arriving(_))),
        "{:?}",
        load.results()
    );
    let g = geometry();
    let lb = g.layer_bytes() as usize;
    for layer in 0..g.layers {
        client.wait_layer(&load, layer).expect("wait for a layer");
        for (i, k) in ks.iter().enumerate() {
            let mut dst = vec![0u8; lb];
            let got = load.read_layer(i, layer, &mut dst).expect("read a layer");
            assert_eq!(got, Lookup::Hit, "block {k:#x} layer {layer}");
            let at = layer as usize * lb;
            assert!(dst == block(*k)[at..at + lb], "block {k:#x} layer {layer}");
        }
    }
    client.release_load(load).expect("release");
}

/// The metrics sample `name` (without labels) of `metrics`.
fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name}:\n{metrics}"))
}

#[test]
fn a_stalled_index_ends_a_lookup_at_its_deadline() {
    let redis = RedisServer::start().expect("start redis-server (.ci/run installs it)");
    let keep = tempfile::tempdir().expect("secret dir");
    let secret = secret_in(keep.path(), &[0x17; 32]);
    let db = tempfile::tempdir().unwrap();
    let b = member(db.path(), "stalled-b", &redis.url(), &secret);
    let mut on_b = b.client();
    let keys = |r: std::ops::Range<u128>| -> Vec<BlockHash> {
        r.map(|k| BlockHash(k | (0x57a1 << 64))).collect()
    };
    // The index answers: keys nobody holds are asked of it, and missed.
    assert_eq!(on_b.lookup(&keys(1..4)).unwrap(), []);
    let admin = b.logged_addr("admin_http");
    let counts = || {
        let (_, metrics) = support::http_text(admin, "GET", "/metrics", None, "");
        let timeouts = sample(&metrics, "kvtier_node_cluster_lookup_timeouts_total");
        (
            timeouts,
            sample(&metrics, "kvtier_node_cluster_lookup_errors_total"),
        )
    };
    let before = counts();

    // A Redis that takes requests and never answers (stopped, not gone):
    // its calls block until their 5 s response timeout, which must not
    // hold the session past `peer.lookup_timeout_ms`. The lookup answers
    // the node's own prefix, counted as a timeout; before the index
    // queries left the async workers it waited for Redis and counted an
    // error.
    redis.pause().expect("SIGSTOP redis-server");
    let stalled = on_b.lookup(&keys(10..13));
    redis.resume().expect("SIGCONT redis-server");
    assert_eq!(stalled.unwrap(), []);
    let after = counts();
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (1.0, 0.0),
        "(timeouts, errors) of the stalled lookup"
    );
    // The index is back: the session goes on.
    assert_eq!(on_b.lookup(&keys(20..23)).unwrap(), []);
}
