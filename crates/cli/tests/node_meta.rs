//! `kvtier serve` with its metadata service: the blocks engines commit on
//! the node appear in the cluster-wide view as `kvtier://<node>/...`
//! locations of their instance, answered on the Tair KVCM HTTP API, and
//! leave it when the node drops them.

use std::net::SocketAddr;

use serde_json::{Value, json};
use support::node::{Daemon, block, shm_name, wait_until};

mod support;

const NODE: &str = "node-t";

/// The URI of each key's location, `None` for a miss.
fn locations(addr: SocketAddr, keys: &[u128]) -> Vec<Option<String>> {
    let wire: Vec<i64> = keys.iter().map(|k| *k as u64 as i64).collect();
    let q = json!({"instance_id": "llama", "query_type": "QT_BATCH_GET", "block_keys": wire});
    let (_, r) = support::http(addr, "POST", "/api/getCacheLocation", None, &q);
    if r["header"]["status"]["code"] == "INSTANCE_NOT_EXIST" {
        // The node registers its engines' instance with its first publish,
        // in the background: nothing is listed yet.
        return vec![None; keys.len()];
    }
    assert_eq!(r["header"]["status"]["code"], "OK", "{r}");
    let locs = r["locations"].as_array().expect("locations").clone();
    assert_eq!(locs.len(), keys.len(), "{r}");
    locs.iter().map(uri_of).collect()
}

fn uri_of(l: &Value) -> Option<String> {
    let spec = l["location_specs"].as_array()?.first()?;
    spec["uri"].as_str().map(str::to_owned)
}

/// The daemon's settings: the metadata service on, its index in memory.
const META: &[(&str, &str)] = &[
    ("KVTIER_META__ENABLED", "true"),
    ("KVTIER_META__INDEX", "memory"),
    ("KVTIER_NODE", NODE),
];

#[test]
fn committed_blocks_are_in_the_metadata_service_while_the_node_holds_them() {
    let dir = tempfile::tempdir().unwrap();
    published_while_held(&Daemon::start(dir.path(), &shm_name("node-meta"), META));
}

/// Without a shape the metadata service serves at once (its `/metrics`
/// says "no shape yet"), and the first engine's blocks are published as
/// with a configured shape: the view starts before that engine is
/// answered.
#[test]
fn a_daemon_without_a_shape_publishes_its_first_engines_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_unshaped(dir.path(), &shm_name("node-meta-unshaped"), META);
    let admin = d.logged_addr("admin_http");
    let (_, metrics) = support::http_text(admin, "GET", "/metrics", None, "");
    assert!(metrics.contains("kvtier_node_shape_known 0"), "{metrics}");
    published_while_held(&d);
    let (_, metrics) = support::http_text(admin, "GET", "/metrics", None, "");
    assert!(metrics.contains("kvtier_node_shape_known 1"), "{metrics}");
}

/// Blocks an engine commits on `d` are listed while the node holds them.
fn published_while_held(d: &Daemon) {
    let addr = d.logged_addr("meta_http");
    let mut client =
        kvtier_client::Client::connect(d.client_config().with_instance("llama")).expect("connect");
    let keys: Vec<u128> = (1..=3).map(|k| k | (7 << 64)).collect();
    let blocks: Vec<Vec<u8>> = keys.iter().map(|k| block(*k)).collect();
    let batch: Vec<(kvtier_client::BlockHash, &[u8])> = keys
        .iter()
        .zip(&blocks)
        .map(|(k, b)| (kvtier_client::BlockHash(*k), &b[..]))
        .collect();
    let stored = client.store(&batch).expect("store");
    assert!(stored.iter().all(|o| o.is_stored()), "{stored:?}");

    // Published by the node's view in the background: poll the service.
    let uris = wait_until("the blocks to be listed", || {
        let l = locations(addr, &keys);
        l.iter().all(Option::is_some).then_some(l)
    });
    for (k, uri) in keys.iter().zip(&uris) {
        let uri = uri.as_deref().unwrap_or_default();
        assert!(
            uri.starts_with(&format!("kvtier://{NODE}/llama/{k:032x}-")),
            "{uri}"
        );
        assert!(uri.ends_with("/tp0"), "{uri}");
    }

    client
        .remove(&[kvtier_client::BlockHash(keys[0])])
        .expect("remove");
    wait_until("the removed block to leave the listing", || {
        locations(addr, &keys)[0].is_none().then_some(())
    });
    assert!(locations(addr, &keys)[1..].iter().all(Option::is_some));

    let (_, metrics) = support::http_text(d.logged_addr("admin_http"), "GET", "/metrics", None, "");
    assert!(
        metrics.contains("kvtier_node_meta_published_total 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kvtier_node_meta_unpublished_total 1"),
        "{metrics}"
    );
}
