//! Published parts: a node's own blocks recorded without a two-phase
//! write, found by reads, charged to the group, dropped by unpublishing
//! without touching the backend, and kept apart from written locations.

use std::collections::BTreeMap;
use std::sync::Arc;

use kvtier_meta::*;

const PART: u64 = 500;

fn storage(name: &str, kind: StorageKind, uri: &str) -> Storage {
    Storage {
        name: name.into(),
        kind,
        uri: uri.into(),
        enabled: true,
        health: StorageHealth::Healthy,
        spec: None,
    }
}

async fn setup() -> Arc<MetaService> {
    let svc = MetaService::new(Arc::new(MemoryIndex::new()), MetaConfig::default()).unwrap();
    svc.put_storage(storage("pool", StorageKind::FilePool, "file:///kv/pool"))
        .unwrap();
    svc.put_storage(storage("node-a", StorageKind::KvtierNode, "kvtier://a"))
        .unwrap();
    svc.put_group(InstanceGroup {
        name: "g".into(),
        quota_bytes: 1 << 30,
        kind_quota_bytes: BTreeMap::new(),
        watermark: 0.9,
        eviction: EvictionPolicy::Lru,
        storages: vec!["pool".into()],
        max_instances: 4,
        ..Default::default()
    })
    .unwrap();
    svc.register_instance(Instance {
        id: "i".into(),
        group: "g".into(),
        model: "m".into(),
        block_size: 16,
        location_specs: ["tp0", "tp1"]
            .iter()
            .map(|n| LocationSpecInfo {
                name: (*n).into(),
                size: PART,
            })
            .collect(),
        spec_groups: vec![],
    })
    .await
    .unwrap();
    Arc::new(svc)
}

fn parts(keys: &[u64], rank: u32) -> Vec<PublishedPart> {
    keys.iter()
        .map(|&k| PublishedPart {
            key: BlockKey(k),
            uri: format!("kvtier://a/b/{k:032x}/tp{rank}"),
            size: PART,
        })
        .collect()
}

async fn node_location(svc: &MetaService, key: u64) -> Option<CacheLocation> {
    let m = svc
        .get_cache_meta("i", &[BlockKey(key)])
        .await
        .unwrap()
        .pop()
        .flatten()?;
    m.locations.into_iter().find(|l| l.storage == "node-a")
}

#[tokio::test]
async fn published_parts_are_served_charged_and_unpublished() {
    let svc = setup().await;
    let before = svc.group_usage("g").unwrap().total;
    assert_eq!(
        svc.publish_parts("i", "node-a", "tp0", &parts(&[1, 2, 3], 0))
            .await
            .unwrap(),
        3
    );
    // Both ranks' parts join one location per block.
    assert_eq!(
        svc.publish_parts("i", "node-a", "tp1", &parts(&[1, 2], 1))
            .await
            .unwrap(),
        2
    );
    assert_eq!(svc.group_usage("g").unwrap().total, before + 5 * PART);
    let hit = svc
        .get_cache_location("i", &LocationQuery::prefix(vec![BlockKey(1), BlockKey(2)]))
        .await
        .unwrap();
    assert_eq!(hit.matched, 2);
    let loc = hit.locations[0].as_ref().unwrap();
    assert_eq!(loc.storage, "node-a");
    assert_eq!(loc.status, LocationStatus::Serving);
    let mut uris: Vec<&str> = loc.specs.iter().map(|s| s.uri.as_str()).collect();
    uris.sort();
    assert_eq!(
        uris,
        [
            format!("kvtier://a/b/{:032x}/tp0", 1),
            format!("kvtier://a/b/{:032x}/tp1", 1)
        ]
    );

    // Publishing the same part again changes nothing, charges nothing.
    assert_eq!(
        svc.publish_parts("i", "node-a", "tp0", &parts(&[1], 0))
            .await
            .unwrap(),
        0
    );
    assert_eq!(svc.group_usage("g").unwrap().total, before + 5 * PART);

    // Unpublishing one rank keeps the other; the last part takes the
    // location and the block with it.
    assert_eq!(
        svc.unpublish_parts("i", "node-a", "tp0", &[BlockKey(1), BlockKey(3)])
            .await
            .unwrap(),
        2
    );
    assert_eq!(node_location(&svc, 1).await.unwrap().specs.len(), 1);
    assert!(svc.get_cache_meta("i", &[BlockKey(3)]).await.unwrap()[0].is_none());
    assert_eq!(svc.group_usage("g").unwrap().total, before + 3 * PART);
    // Unpublishing what is not published is a no-op.
    assert_eq!(
        svc.unpublish_parts("i", "node-a", "tp0", &[BlockKey(3), BlockKey(9)])
            .await
            .unwrap(),
        0
    );
    let hit = svc
        .get_cache_location("i", &LocationQuery::prefix(vec![BlockKey(3)]))
        .await
        .unwrap();
    assert_eq!(hit.matched, 0);
}

async fn record(svc: &MetaService, key: u64) -> BlockMeta {
    let mut found = svc.get_cache_meta("i", &[BlockKey(key)]).await.unwrap();
    found.pop().flatten().expect("a record")
}

#[tokio::test]
async fn a_published_part_sits_beside_a_written_location() {
    let svc = setup().await;
    let grant = svc.start_write_cache("i", &[BlockKey(7)]).await.unwrap();
    svc.finish_write_cache("i", grant.session, &[true])
        .await
        .unwrap();
    svc.publish_parts("i", "node-a", "tp0", &parts(&[7], 0))
        .await
        .unwrap();
    assert_eq!(record(&svc, 7).await.locations.len(), 2);
    svc.unpublish_parts("i", "node-a", "tp0", &[BlockKey(7)])
        .await
        .unwrap();
    let m = record(&svc, 7).await;
    assert_eq!(m.locations.len(), 1);
    assert_eq!(m.locations[0].storage, "pool");
}

#[tokio::test]
async fn bad_publications_change_nothing() {
    let svc = setup().await;
    let before = svc.group_usage("g").unwrap().total;
    let p = parts(&[1], 0);
    assert!(matches!(
        svc.publish_parts("nope", "node-a", "tp0", &p).await,
        Err(MetaError::InstanceNotFound(_))
    ));
    assert!(matches!(
        svc.publish_parts("i", "nowhere", "tp0", &p).await,
        Err(MetaError::StorageNotFound(_))
    ));
    assert!(matches!(
        svc.publish_parts("i", "node-a", "tp9", &p).await,
        Err(MetaError::InvalidArgument(_))
    ));
    assert!(svc.get_cache_meta("i", &[BlockKey(1)]).await.unwrap()[0].is_none());
    assert_eq!(svc.group_usage("g").unwrap().total, before);
}
