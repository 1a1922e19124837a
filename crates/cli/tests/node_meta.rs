//! `kvtier serve` with its metadata service: the blocks engines commit on
//! the node appear in the cluster-wide view as `kvtier://<node>/...`
//! locations of their instance, answered on the Tair KVCM HTTP API, and
//! leave it when the node drops them.

use std::net::SocketAddr;

use serde_json::{Value, json};
use support::node::{Daemon, block, shm_name, wait_until};

mod support;

const NODE: &str = "node-t";

/// The address the daemon logged as `<field>=<addr>`.
fn logged_addr(d: &Daemon, field: &str) -> SocketAddr {
    let log = d.log();
    let name = format!("{field}=");
    log.iter()
        .find_map(|l| {
            let at = l.find(&name)? + name.len();
            l[at..].split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no {field} in the log: {log:?}"))
}

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

#[test]
fn committed_blocks_are_in_the_metadata_service_while_the_node_holds_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        dir.path(),
        &shm_name("node-meta"),
        &[
            ("KVTIER_META__ENABLED", "true"),
            ("KVTIER_META__INDEX", "memory"),
            ("KVTIER_NODE", NODE),
        ],
    );
    let addr = logged_addr(&d, "meta_http");
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

    let (_, metrics) =
        support::http_text(logged_addr(&d, "admin_http"), "GET", "/metrics", None, "");
    assert!(
        metrics.contains("kvtier_node_meta_published_total 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kvtier_node_meta_unpublished_total 1"),
        "{metrics}"
    );
}
