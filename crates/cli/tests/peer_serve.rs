//! `kvtier serve` as a peer server (docs/peer-protocol.md §8): blocks an
//! engine stored through the node socket are read by another node of the
//! cluster over loopback TCP, byte-exact and verified against the sums the
//! daemon holds: from G2, then from G3 after a restart adopted the disk
//! log; its `/metrics` counts them; a start with no usable cluster secret,
//! or with a peer name other than the node's, stops with a clear error and
//! nothing made.

use std::net::SocketAddr;
use std::time::Duration;

use kvtier_client::{BlockHash, Client};
use kvtier_peer::{BlockData, ClusterSecret, Expect, Identity, LayerRange, PeerClient, Want};
use support::node::{Daemon, PATIENCE, block, block_bytes, secret_in, shm_name, store_blocks};

mod support;

const SECRET: [u8; 32] = [0x42; 32];
const CLUSTER: &str = "serve-test";

/// The address after `key=` in the daemon's ready line.
fn ready_addr(daemon: &Daemon, key: &str) -> SocketAddr {
    support::addr_in(daemon.ready_line(), key)
}

/// Stores blocks `ks`; returns each one's stored key and the sums the
/// daemon holds for it (a `Load`'s answer).
fn store(client: &mut Client, ks: &[u128]) -> Vec<(BlockHash, Expect)> {
    store_blocks(client, ks);
    let keys: Vec<BlockHash> = ks.iter().map(|k| BlockHash(*k)).collect();
    let load = client.load(&keys).expect("load");
    let map = client.key_map();
    let held = keys
        .iter()
        .zip(load.results())
        .map(|(k, r)| {
            let sums = r.sums().expect("a resident block's sums");
            (map.stored(*k), Expect::Checksum(sums.block))
        })
        .collect();
    client.release_load(load).expect("release");
    held
}

/// Reads `held` from the peer server at `addr` as node "b" of the cluster.
fn peer_read(addr: SocketAddr, held: &[(BlockHash, Expect)]) -> Vec<Option<BlockData>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let me = Identity {
        cluster: CLUSTER.into(),
        node: "b".into(),
        secret: ClusterSecret::from_bytes(SECRET),
    };
    let wants: Vec<Want> = held
        .iter()
        .map(|&(key, expect)| Want { key, expect })
        .collect();
    rt.block_on(async {
        let mut c = PeerClient::connect(addr, &me, PATIENCE)
            .await
            .expect("connect to the peer server");
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let got = c.read(&wants, LayerRange::All, deadline).await;
        assert_eq!(c.stats().corrupt, 0, "the daemon sent a block that failed");
        got.expect("read")
    })
}

fn assert_exact(ks: &[u128], got: &[Option<BlockData>], from: &str) {
    assert_eq!(got.len(), ks.len());
    for (k, b) in ks.iter().zip(got) {
        let b = b
            .as_ref()
            .unwrap_or_else(|| panic!("block {k} missing from {from}"));
        assert!(
            b.bytes == block(*k),
            "block {k} from {from} is not byte-exact"
        );
        assert_eq!(b.bytes.len(), block_bytes());
    }
}

/// `/metrics` sample `name` (with its labels) of the daemon, polled until
/// it reads `want` (the server counts a block after writing it).
fn wait_sample(addr: SocketAddr, name: &str, want: f64) {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let (_, text) = support::http_text(addr, "GET", "/metrics", None, "");
        let got = text
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok());
        if got == Some(want) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} is {got:?}, not {want}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_peer_reads_a_daemons_blocks_from_g2_then_from_g3_after_a_restart() {
    let data = tempfile::tempdir().expect("data dir");
    let keep = tempfile::tempdir().expect("secret dir");
    let secret = secret_in(keep.path(), &SECRET);
    let env = [
        ("KVTIER_PEER__LISTEN", "127.0.0.1:0"),
        ("KVTIER_PEER__CLUSTER", CLUSTER),
        ("KVTIER_PEER__SECRET_FILE", secret.as_str()),
        ("KVTIER_MANAGER__METRICS_ADDR", "127.0.0.1:0"),
    ];
    let mut daemon = Daemon::start(data.path(), &shm_name("peer-serve"), &env);
    let ks = [1u128, 2, 3];
    let mut held = store(&mut daemon.client(), &ks);
    let got = peer_read(ready_addr(&daemon, "peer="), &held);
    assert_exact(&ks, &got, "G2");
    let metrics = ready_addr(&daemon, "metrics=");
    wait_sample(metrics, "kvtier_peer_served_blocks_total{tier=\"g2\"}", 3.0);
    wait_sample(metrics, "kvtier_peer_authenticated_total", 1.0);

    // SIGTERM moves G2 down to the disk log; the next life adopts it.
    let (status, _) = daemon.terminate();
    assert!(status.success(), "{status}");
    daemon.restart();
    assert!(daemon.adopted_g3() >= 3, "{}", daemon.ready_line());
    // A key the daemon never held is a miss, not an error.
    held.push((BlockHash(0xdead), Expect::Consistent));
    let got = peer_read(ready_addr(&daemon, "peer="), &held);
    assert!(got[3].is_none(), "a block never stored is a miss");
    assert_exact(&ks, &got[..3], "G3");
    let metrics = ready_addr(&daemon, "metrics=");
    wait_sample(metrics, "kvtier_peer_served_blocks_total{tier=\"g3\"}", 3.0);
    wait_sample(metrics, "kvtier_peer_blocks_missing_total", 1.0);
}

#[test]
fn a_start_without_a_usable_cluster_secret_is_a_clear_error() {
    let data = tempfile::tempdir().expect("data dir");
    let absent = data.path().join("no-such.secret");
    let out = support::serve(data.path(), &shm_name("peer-no-secret"))
        .env("KVTIER_META__ENABLED", "false")
        .env("KVTIER_PEER__LISTEN", "127.0.0.1:0")
        .env("KVTIER_PEER__CLUSTER", CLUSTER)
        .env("KVTIER_PEER__SECRET_FILE", &absent)
        .output()
        .expect("run kvtier serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such.secret"), "{err}");
    assert!(
        !data.path().join("disk").exists(),
        "a failed start made the disk tier"
    );
}

#[test]
fn a_peer_name_other_than_the_nodes_is_refused_at_start() {
    let data = tempfile::tempdir().expect("data dir");
    let secret = secret_in(data.path(), &SECRET);
    let out = support::serve(data.path(), &shm_name("peer-name"))
        .env("KVTIER_META__ENABLED", "false")
        .env("KVTIER_NODE", "node-a")
        .env("KVTIER_PEER__LISTEN", "127.0.0.1:0")
        .env("KVTIER_PEER__CLUSTER", CLUSTER)
        .env("KVTIER_PEER__SECRET_FILE", &secret)
        .env("KVTIER_PEER__NODE_NAME", "node-b")
        .output()
        .expect("run kvtier serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"node-b\"") && err.contains("\"node-a\""),
        "{err}"
    );
    assert!(
        !data.path().join("disk").exists(),
        "a failed start made the disk tier"
    );
}
