//! What the backend tests share: a metadata service with a default group,
//! clients of a node's socket, stored blocks, and the check of a part's
//! path.

use std::collections::BTreeMap;
use std::sync::Arc;

use kvtier_client::{AsyncClient, BlockHash, ClientConfig};
use kvtier_meta::{
    DEFAULT_GROUP, EvictionPolicy, InstanceGroup, MetaConfig, MetaIndex, MetaService,
};
use kvtier_node::{Node, NodeConfig};
use kvtier_protocol::{Namespace, WireGeometry};

/// A metadata service over `index` with a default group of 1 TiB.
pub fn service_on(index: Arc<dyn MetaIndex>) -> Arc<MetaService> {
    let svc = MetaService::new(index, MetaConfig::default()).unwrap();
    svc.put_group(InstanceGroup {
        name: DEFAULT_GROUP.into(),
        quota_bytes: 1 << 40,
        kind_quota_bytes: BTreeMap::new(),
        watermark: 0.9,
        eviction: EvictionPolicy::Lru,
        storages: vec![],
        max_instances: 16,
        ..Default::default()
    })
    .unwrap();
    Arc::new(svc)
}

/// A client of `node`'s socket (from `config`) for `ns`, naming `instance`.
pub async fn client(
    node: &Node,
    config: &NodeConfig,
    ns: Namespace,
    instance: Option<&str>,
) -> AsyncClient {
    let geometry = WireGeometry::from(node.geometry());
    let mut c = ClientConfig::new(config.node_socket(), ns, geometry);
    if let Some(i) = instance {
        c = c.with_instance(i);
    }
    AsyncClient::connect(c).await.unwrap()
}

/// Stores `keys` through `client`, each block `len` bytes of its key's low
/// byte; every one must be stored.
pub async fn store(client: &mut AsyncClient, keys: &[BlockHash], len: usize) {
    let bytes: Vec<Vec<u8>> = keys.iter().map(|k| vec![k.0 as u8; len]).collect();
    let blocks: Vec<(BlockHash, &[u8])> =
        keys.iter().zip(&bytes).map(|(k, b)| (*k, &b[..])).collect();
    let outcomes = client.store(&blocks).await.unwrap();
    assert!(outcomes.iter().all(|o| o.is_stored()), "{outcomes:?}");
}

/// 128-bit keys with these low bits.
pub fn keys(r: std::ops::Range<u128>) -> Vec<BlockHash> {
    r.map(|k| BlockHash(k | (0xabcd << 64))).collect()
}

/// Runs `f` on a runtime of its own, dropped after it: the node's tasks
/// end with it, so the next run can open the same disk log.
pub fn on_runtime<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Checks that `rel`, a part's path below its storage's base (`shown` in
/// messages), is exactly three components, none empty, `.` or `..`.
#[allow(dead_code)] // the tests of node blocks check no part paths
pub fn assert_part_path(rel: &str, shown: &str) {
    let parts: Vec<&str> = rel.split('/').collect();
    assert_eq!(parts.len(), 3, "{shown}");
    assert!(
        parts
            .iter()
            .all(|p| !p.is_empty() && *p != "." && *p != ".."),
        "{shown}"
    );
}
