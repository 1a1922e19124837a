//! Administration: storage / group / instance / account CRUD with every
//! refusal leaving the state unchanged, runtime quota changes, instance
//! removal, authentication, configuration snapshots and persistence.

use std::collections::BTreeMap;
use std::sync::Arc;

use kvtier_meta::*;
use proptest::prelude::*;

const BLOCK: u64 = 1000;
const KEY_A: &str = "admin-key-0123456789abcdef";
const KEY_U: &str = "user-key-0123456789abcdef";

fn storage(name: &str, kind: StorageKind) -> Storage {
    Storage {
        name: name.into(),
        kind,
        uri: format!("file:///kv/{name}"),
        enabled: true,
        health: StorageHealth::Healthy,
        spec: None,
    }
}

fn group(name: &str, quota_blocks: u64, storages: &[&str]) -> InstanceGroup {
    InstanceGroup {
        name: name.into(),
        quota_bytes: quota_blocks * BLOCK,
        kind_quota_bytes: BTreeMap::new(),
        watermark: 0.9,
        eviction: EvictionPolicy::Lru,
        storages: storages.iter().map(|s| s.to_string()).collect(),
        max_instances: 4,
        ..Default::default()
    }
}

fn instance(id: &str, group: &str) -> Instance {
    Instance {
        id: id.into(),
        group: group.into(),
        model: "m".into(),
        block_size: 16,
        location_specs: vec![LocationSpecInfo {
            name: "tp0".into(),
            size: BLOCK,
        }],
        spec_groups: vec![],
    }
}

fn keys(r: std::ops::Range<u64>) -> Vec<BlockKey> {
    r.map(BlockKey).collect()
}

fn memory_service() -> MetaService {
    MetaService::new(Arc::new(MemoryIndex::new()), MetaConfig::default()).unwrap()
}

/// Storage "a", group "g" (quota `quota_blocks`) on it, instance "i".
async fn setup(quota_blocks: u64) -> MetaService {
    let svc = memory_service();
    svc.add_storage(storage("a", StorageKind::FilePool))
        .unwrap();
    svc.create_group(group("g", quota_blocks, &["a"])).unwrap();
    svc.register_instance(instance("i", "g")).await.unwrap();
    svc
}

/// Writes `keys` to `inst` and finishes them all successfully.
async fn write(svc: &MetaService, inst: &str, keys: &[BlockKey]) -> Result<usize> {
    let grant = svc.start_write_cache(inst, keys).await?;
    let ok = vec![true; grant.blocks.len()];
    if !grant.blocks.is_empty() {
        svc.finish_write_cache(inst, grant.session, &ok).await?;
    }
    Ok(grant.blocks.len())
}

#[test]
fn storage_crud_and_refusals() {
    let svc = memory_service();
    svc.add_storage(storage("b", StorageKind::S3)).unwrap();
    svc.add_storage(storage("a", StorageKind::FilePool))
        .unwrap();
    let names: Vec<String> = svc.list_storages().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["a", "b"]);
    let before = svc.list_storages();

    let mut dup = storage("a", StorageKind::S3);
    dup.uri = "s3://other".into();
    assert!(matches!(
        svc.add_storage(dup),
        Err(MetaError::AlreadyExists(_))
    ));
    assert!(matches!(
        svc.add_storage(storage("", StorageKind::S3)),
        Err(MetaError::InvalidArgument(_))
    ));
    let mut no_uri = storage("c", StorageKind::S3);
    no_uri.uri.clear();
    assert!(matches!(
        svc.add_storage(no_uri),
        Err(MetaError::InvalidArgument(_))
    ));
    assert!(matches!(
        svc.update_storage(storage("zz", StorageKind::S3)),
        Err(MetaError::StorageNotFound(_))
    ));
    assert!(matches!(
        svc.enable_storage("zz"),
        Err(MetaError::StorageNotFound(_))
    ));
    assert!(matches!(
        svc.remove_storage("zz"),
        Err(MetaError::StorageNotFound(_))
    ));
    assert_eq!(svc.list_storages(), before, "refusals changed nothing");

    let mut moved = storage("a", StorageKind::FilePool);
    moved.uri = "file:///elsewhere".into();
    svc.update_storage(moved.clone()).unwrap();
    assert_eq!(svc.list_storages()[0], moved);
    svc.disable_storage("a").unwrap();
    assert!(!svc.list_storages()[0].enabled);
    // An update keeps the switch and the health; it changes the uri.
    let mut again = storage("a", StorageKind::FilePool);
    again.uri = "file:///third".into();
    again.health = StorageHealth::Unhealthy;
    svc.update_storage(again.clone()).unwrap();
    let got = &svc.list_storages()[0];
    assert_eq!(got.uri, again.uri);
    assert!(!got.enabled);
    assert_eq!(got.health, StorageHealth::Healthy);
    svc.enable_storage("a").unwrap();
    assert!(svc.list_storages()[0].enabled);

    svc.create_group(group("g", 10, &["a"])).unwrap();
    assert!(matches!(svc.remove_storage("a"), Err(MetaError::InUse(_))));
    assert_eq!(svc.list_storages().len(), 2);
    svc.remove_storage("b").unwrap();
    svc.remove_group("g").unwrap();
    svc.remove_storage("a").unwrap();
    assert!(svc.list_storages().is_empty());
}

#[tokio::test]
async fn disabled_storage_takes_no_writes_but_serves() {
    let svc = setup(100).await;
    write(&svc, "i", &keys(0..2)).await.unwrap();
    svc.disable_storage("a").unwrap();
    assert!(matches!(
        svc.start_write_cache("i", &keys(2..3)).await,
        Err(MetaError::NoAvailableStorage { .. })
    ));
    let hit = svc
        .get_cache_location("i", &LocationQuery::prefix(keys(0..2)))
        .await
        .unwrap();
    assert_eq!(hit.matched, 2);
    svc.enable_storage("a").unwrap();
    assert_eq!(write(&svc, "i", &keys(2..3)).await.unwrap(), 1);
}

#[tokio::test]
async fn group_crud_and_refusals() {
    let svc = memory_service();
    svc.add_storage(storage("a", StorageKind::FilePool))
        .unwrap();
    svc.add_storage(storage("b", StorageKind::S3)).unwrap();
    svc.create_group(group("g", 10, &["a"])).unwrap();
    let before = svc.list_groups();

    let bad: Vec<(InstanceGroup, &str)> = vec![
        (group("g", 10, &["a"]), "duplicate"),
        (group("h", 10, &[]), "no storages"),
        (group("h", 10, &["a", "a"]), "storage twice"),
        (group("", 10, &["a"]), "empty name"),
        (
            InstanceGroup {
                watermark: f64::INFINITY,
                ..group("h", 10, &["a"])
            },
            "infinite watermark",
        ),
        (
            InstanceGroup {
                watermark: -0.1,
                ..group("h", 10, &["a"])
            },
            "negative watermark",
        ),
        (
            InstanceGroup {
                watermark: f64::NAN,
                ..group("h", 10, &["a"])
            },
            "NaN watermark",
        ),
        (
            InstanceGroup {
                max_instances: 0,
                ..group("h", 10, &["a"])
            },
            "no instances allowed",
        ),
        (
            InstanceGroup {
                eviction: EvictionPolicy::Ttl { ttl_secs: 0 },
                ..group("h", 10, &["a"])
            },
            "ttl 0",
        ),
    ];
    for (g, why) in &bad {
        assert!(
            svc.create_group(g.clone()).is_err(),
            "create accepted {why}"
        );
        let mut as_update = g.clone();
        as_update.name = "g".into();
        if why != &"duplicate" && why != &"empty name" {
            assert!(
                svc.update_group(as_update).is_err(),
                "update accepted {why}"
            );
        }
    }
    assert!(matches!(
        svc.create_group(group("g", 10, &["a"])),
        Err(MetaError::AlreadyExists(_))
    ));
    assert!(matches!(
        svc.update_group(group("zz", 10, &["a"])),
        Err(MetaError::GroupNotFound(_))
    ));
    assert!(matches!(
        svc.remove_group("zz"),
        Err(MetaError::GroupNotFound(_))
    ));
    assert_eq!(svc.list_groups(), before, "refusals changed nothing");

    // Upstream's conventions: a watermark above 1 never triggers (its
    // reclaim tests send 3.2), and a kind quota may exceed the group's.
    let lenient = InstanceGroup {
        watermark: 3.2,
        kind_quota_bytes: BTreeMap::from([(StorageKind::S3, 11 * BLOCK)]),
        ..group("h", 10, &["a"])
    };
    svc.create_group(lenient.clone()).unwrap();
    assert!(svc.list_groups().contains(&lenient));
    svc.remove_group("h").unwrap();

    // Updates change storages and limits.
    let mut g2 = group("g", 20, &["b", "a"]);
    g2.eviction = EvictionPolicy::Lfu;
    svc.update_group(g2.clone()).unwrap();
    let (got, usage) = svc.get_group("g").unwrap();
    assert_eq!(got, g2);
    assert_eq!(usage, GroupUsage::default());

    // In use by an instance, then by an account.
    svc.register_instance(instance("i", "g")).await.unwrap();
    svc.register_instance(instance("j", "g")).await.unwrap();
    let mut small = g2.clone();
    small.max_instances = 1;
    assert!(matches!(
        svc.update_group(small),
        Err(MetaError::InvalidArgument(_))
    ));
    assert!(matches!(svc.remove_group("g"), Err(MetaError::InUse(_))));
    svc.remove_instance("i").await.unwrap();
    svc.remove_instance("j").await.unwrap();
    svc.add_account("u", Role::User, KEY_U, vec!["g".into()])
        .unwrap();
    assert!(matches!(svc.remove_group("g"), Err(MetaError::InUse(_))));
    assert_eq!(svc.list_groups(), vec![g2]);
    svc.delete_account("u").unwrap();
    svc.remove_group("g").unwrap();
    assert!(svc.list_groups().is_empty());
    assert!(matches!(
        svc.get_group("g"),
        Err(MetaError::GroupNotFound(_))
    ));
}

#[tokio::test]
async fn quota_changes_apply_to_the_next_write() {
    let svc = setup(4).await;
    assert_eq!(write(&svc, "i", &keys(0..3)).await.unwrap(), 3);
    assert_eq!(svc.get_group("g").unwrap().1.total, 3 * BLOCK);

    // Shrink below usage + 1 block: the next write is refused, nothing changes.
    svc.update_group(group("g", 3, &["a"])).unwrap();
    assert!(matches!(
        svc.start_write_cache("i", &keys(3..4)).await,
        Err(MetaError::QuotaExceeded { limit, .. }) if limit == 3 * BLOCK
    ));
    assert_eq!(svc.get_group("g").unwrap().1.total, 3 * BLOCK);
    assert_eq!(svc.open_sessions().unwrap(), 0);

    // Grow: accepted.
    svc.update_group(group("g", 10, &["a"])).unwrap();
    assert_eq!(write(&svc, "i", &keys(3..8)).await.unwrap(), 5);
    assert_eq!(svc.get_group("g").unwrap().1.total, 8 * BLOCK);

    // A kind quota added at run time applies too.
    let mut by_kind = group("g", 10, &["a"]);
    by_kind
        .kind_quota_bytes
        .insert(StorageKind::FilePool, 8 * BLOCK);
    svc.update_group(by_kind).unwrap();
    assert!(matches!(
        svc.start_write_cache("i", &keys(8..9)).await,
        Err(MetaError::QuotaExceeded { .. })
    ));
}

#[tokio::test]
async fn remove_instance_drops_blocks_releases_quota_and_cancels_sessions() {
    let svc = setup(100).await;
    svc.register_instance(instance("other", "g")).await.unwrap();
    write(&svc, "i", &keys(0..10)).await.unwrap();
    write(&svc, "other", &keys(0..4)).await.unwrap();
    let open = svc.start_write_cache("i", &keys(10..13)).await.unwrap();
    assert_eq!(open.blocks.len(), 3);
    assert_eq!(svc.get_group("g").unwrap().1.total, 17 * BLOCK);
    assert_eq!(svc.stats().blocks_per_instance["i"], 13);

    let dropped = svc.remove_instance("i").await.unwrap();
    assert_eq!(dropped, 13);
    assert_eq!(svc.get_group("g").unwrap().1.total, 4 * BLOCK);
    assert_eq!(svc.open_sessions().unwrap(), 0);
    assert!(matches!(
        svc.finish_write_cache("i", open.session, &[true; 3]).await,
        Err(MetaError::SessionNotFound(_))
    ));
    assert_eq!(svc.get_group("g").unwrap().1.total, 4 * BLOCK);
    assert!(matches!(
        svc.get_instance_info("i").await,
        Err(MetaError::InstanceNotFound(_))
    ));
    assert!(matches!(
        svc.remove_instance("i").await,
        Err(MetaError::InstanceNotFound(_))
    ));
    let ids: Vec<String> = svc.list_instances(None).into_iter().map(|i| i.id).collect();
    assert_eq!(ids, ["other"]);

    // Same id again: nothing of the old instance is found.
    svc.register_instance(instance("i", "g")).await.unwrap();
    let hit = svc
        .get_cache_location("i", &LocationQuery::prefix(keys(0..10)))
        .await
        .unwrap();
    assert_eq!(hit.matched, 0);
    let other = svc
        .get_cache_location("other", &LocationQuery::prefix(keys(0..4)))
        .await
        .unwrap();
    assert_eq!(other.matched, 4, "other instances keep their blocks");

    let stats = svc.stats();
    assert_eq!(stats.counters.instances_removed, 1);
    assert_eq!(stats.counters.blocks_dropped, 13);
    assert_eq!(stats.blocks_per_instance["i"], 0);
    assert_eq!(stats.groups["g"].usage.total, 4 * BLOCK);
    assert_eq!(stats.groups["g"].instances, 2);
}

#[tokio::test]
async fn list_instances_by_group() {
    let svc = setup(100).await;
    svc.create_group(group("h", 10, &["a"])).unwrap();
    svc.register_instance(instance("x", "h")).await.unwrap();
    svc.register_instance(instance("b", "g")).await.unwrap();
    let ids = |g: Option<&str>| -> Vec<String> {
        svc.list_instances(g).into_iter().map(|i| i.id).collect()
    };
    assert_eq!(ids(None), ["b", "i", "x"]);
    assert_eq!(ids(Some("g")), ["b", "i"]);
    assert_eq!(ids(Some("h")), ["x"]);
    assert!(ids(Some("none")).is_empty());
}

#[tokio::test]
async fn accounts_and_authentication() {
    let svc = setup(10).await;
    svc.create_group(group("h", 10, &["a"])).unwrap();
    svc.add_account("root", Role::Admin, KEY_A, vec![]).unwrap();
    svc.add_account("u", Role::User, KEY_U, vec!["g".into()])
        .unwrap();
    let before = svc.list_accounts();

    assert!(matches!(
        svc.add_account("u", Role::User, "another-key-0123456789", vec![]),
        Err(MetaError::AlreadyExists(_))
    ));
    assert!(matches!(
        svc.add_account("v", Role::User, "short", vec![]),
        Err(MetaError::InvalidArgument(_))
    ));
    assert!(matches!(
        svc.add_account(
            "v",
            Role::User,
            "another-key-0123456789",
            vec!["nope".into()]
        ),
        Err(MetaError::GroupNotFound(_))
    ));
    assert!(matches!(
        svc.add_account("", Role::User, "another-key-0123456789", vec![]),
        Err(MetaError::InvalidArgument(_))
    ));
    assert!(matches!(
        svc.delete_account("v"),
        Err(MetaError::AccountNotFound(_))
    ));
    assert_eq!(svc.list_accounts(), before, "refusals changed nothing");

    // Twice each: the second goes through the digest cache.
    for _ in 0..2 {
        let admin = svc.authenticate(KEY_A).unwrap();
        assert_eq!(admin.account, "root");
        assert!(admin.is_admin());
        assert!(admin.may_use_group("g") && admin.may_use_group("anything"));
        let user = svc.authenticate(KEY_U).unwrap();
        assert_eq!(user.account, "u");
        assert!(!user.is_admin());
        assert!(user.may_use_group("g"));
        assert!(!user.may_use_group("h"));
    }
    assert!(matches!(
        svc.authenticate("wrong-key-0123456789abcdef"),
        Err(MetaError::Unauthenticated)
    ));
    assert!(matches!(
        svc.authenticate(""),
        Err(MetaError::Unauthenticated)
    ));

    // No key material in listings; hashes only in snapshots.
    for a in svc.list_accounts() {
        assert!(a.api_key_hash.is_empty());
    }
    let json = svc.gen_config_snapshot().to_json().unwrap();
    assert!(!json.contains(KEY_A) && !json.contains(KEY_U));
    let snap = svc.gen_config_snapshot();
    assert_eq!(snap.accounts.len(), 2);
    assert!(
        snap.accounts
            .iter()
            .all(|a| a.api_key_hash.starts_with("sha256$"))
    );

    // A user with no groups may use none (fail closed); "*" means every
    // group; a group cannot be named "*".
    svc.add_account("any", Role::User, "any-key-0123456789abcdef", vec![])
        .unwrap();
    let none = svc.authenticate("any-key-0123456789abcdef").unwrap();
    assert!(!none.may_use_group("g") && !none.may_use_group("h"));
    svc.set_account_groups("any", vec![ALL_GROUPS.into()])
        .unwrap();
    let all = svc.authenticate("any-key-0123456789abcdef").unwrap();
    assert!(all.may_use_group("g") && all.may_use_group("h"));
    assert!(matches!(
        svc.set_account_groups("any", vec!["nope".into()]),
        Err(MetaError::GroupNotFound(_))
    ));
    assert!(matches!(
        svc.set_account_groups("nobody", vec![]),
        Err(MetaError::AccountNotFound(_))
    ));
    assert!(
        svc.authenticate("any-key-0123456789abcdef")
            .unwrap()
            .may_use_group("h"),
        "refused changes kept the groups"
    );
    let mut star = svc.get_group("g").unwrap().0;
    star.name = ALL_GROUPS.into();
    assert!(matches!(
        svc.create_group(star),
        Err(MetaError::InvalidArgument(_))
    ));

    // Deleted: the (cached) key stops working at once.
    svc.delete_account("u").unwrap();
    assert!(matches!(
        svc.authenticate(KEY_U),
        Err(MetaError::Unauthenticated)
    ));
    let names: Vec<String> = svc.list_accounts().into_iter().map(|a| a.name).collect();
    assert_eq!(names, ["any", "root"]);
    let c = svc.stats().counters;
    assert_eq!((c.auth_ok, c.auth_failed), (7, 3));
}

#[test]
fn put_account_creates_or_replaces_whole() {
    let svc = memory_service();
    svc.ensure_default_group(storage("local", StorageKind::FilePool))
        .unwrap();
    let old_key = "provisioned-key-0123456789";
    svc.put_account(
        "p",
        Role::User,
        ApiKey::Clear(old_key),
        vec![DEFAULT_GROUP.into()],
    )
    .unwrap();
    assert!(
        svc.authenticate(old_key)
            .unwrap()
            .may_use_group(DEFAULT_GROUP)
    );
    // Replaced with a hashed key (taken from another account's snapshot
    // record) and no groups: the old key stops working at once.
    svc.add_account("donor", Role::User, KEY_U, vec![]).unwrap();
    let snap = svc.gen_config_snapshot();
    let hash = &snap
        .accounts
        .iter()
        .find(|a| a.name == "donor")
        .unwrap()
        .api_key_hash;
    svc.put_account("p", Role::Admin, ApiKey::Hashed(hash), vec![])
        .unwrap();
    assert!(matches!(
        svc.authenticate(old_key),
        Err(MetaError::Unauthenticated)
    ));
    let names: Vec<String> = svc.list_accounts().into_iter().map(|a| a.name).collect();
    assert_eq!(names, ["donor", "p"]);
    // Refusals change nothing.
    let before = svc.list_accounts();
    for bad in [
        svc.put_account("p", Role::User, ApiKey::Hashed("sha256$zz$00"), vec![]),
        svc.put_account("p", Role::User, ApiKey::Clear("short"), vec![]),
        svc.put_account("p", Role::User, ApiKey::Clear(old_key), vec!["nope".into()]),
        svc.put_account("", Role::User, ApiKey::Clear(old_key), vec![]),
    ] {
        assert!(bad.is_err());
    }
    assert_eq!(svc.list_accounts(), before);
}

#[tokio::test]
async fn health_and_default_group() {
    let svc = memory_service();
    let h = svc.check_health().await;
    assert!(h.healthy && h.index_error.is_none() && h.storages.is_empty());

    let s = storage("local", StorageKind::FilePool);
    svc.ensure_default_group(s.clone()).unwrap();
    let (g, _) = svc.get_group(DEFAULT_GROUP).unwrap();
    assert_eq!(g.storages, ["local"]);
    assert_eq!(svc.list_storages(), vec![s.clone()]);

    // Idempotent, and never overwrites an existing group or storage.
    let mut tuned = g.clone();
    tuned.quota_bytes = 5 * BLOCK;
    svc.update_group(tuned.clone()).unwrap();
    let mut other_uri = s.clone();
    other_uri.uri = "file:///other".into();
    svc.ensure_default_group(other_uri).unwrap();
    assert_eq!(svc.get_group(DEFAULT_GROUP).unwrap().0, tuned);
    assert_eq!(svc.list_storages(), vec![s]);
    assert_eq!(svc.list_groups().len(), 1);

    svc.register_instance(instance("i", DEFAULT_GROUP))
        .await
        .unwrap();
    assert_eq!(write(&svc, "i", &keys(0..2)).await.unwrap(), 2);

    svc.disable_storage("local").unwrap();
    let h = svc.check_health().await;
    assert!(!h.healthy, "no writable storage");
    assert_eq!(h.storages.len(), 1);
    assert!(!h.storages[0].enabled);
}

#[tokio::test]
async fn bad_snapshots_change_nothing() {
    let svc = setup(10).await;
    svc.add_account("root", Role::Admin, KEY_A, vec!["g".into()])
        .unwrap();
    write(&svc, "i", &keys(0..2)).await.unwrap();
    let good = svc.gen_config_snapshot();
    let before_json = good.to_json().unwrap();

    let mut bad: Vec<(ConfigSnapshot, &str)> = Vec::new();
    let mut s = good.clone();
    s.groups.clear();
    bad.push((s, "instance names a missing group"));
    let mut s = good.clone();
    s.storages.push(s.storages[0].clone());
    bad.push((s, "duplicate storage"));
    let mut s = good.clone();
    s.groups[0].watermark = -2.0;
    bad.push((s, "bad watermark"));
    let mut s = good.clone();
    s.groups[0].max_instances = 0;
    bad.push((s, "max instances 0"));
    let mut s = good.clone();
    s.accounts[0].api_key_hash = "plaintext".into();
    bad.push((s, "malformed hash"));
    let mut s = good.clone();
    s.accounts[0].allowed_groups = vec!["nope".into()];
    bad.push((s, "account names a missing group"));
    let mut s = good.clone();
    s.instances[0].block_size = 7;
    bad.push((s, "instance layout changed"));
    let mut s = good.clone();
    s.instances[0].location_specs.clear();
    bad.push((s, "instance without specs"));
    let mut s = good.clone();
    s.format = 99;
    bad.push((s, "unknown format"));
    let mut s = good.clone();
    s.groups[0].max_instances = 1;
    s.instances.push(instance("extra", "g"));
    bad.push((s, "group over max_instances"));

    for (snap, why) in bad {
        assert!(svc.load_config_snapshot(snap).is_err(), "accepted: {why}");
        assert_eq!(
            svc.gen_config_snapshot().to_json().unwrap(),
            before_json,
            "changed by: {why}"
        );
    }
    assert!(matches!(
        ConfigSnapshot::from_json("{not json"),
        Err(MetaError::InvalidArgument(_))
    ));
    // The blocks and their charge are untouched too.
    assert_eq!(svc.get_group("g").unwrap().1.total, 2 * BLOCK);
    assert!(svc.authenticate(KEY_A).is_ok());
}

#[tokio::test]
async fn loading_a_snapshot_replaces_the_catalog() {
    let svc = setup(10).await;
    svc.register_instance(instance("gone", "g")).await.unwrap();
    write(&svc, "gone", &keys(0..3)).await.unwrap();
    write(&svc, "i", &keys(0..2)).await.unwrap();
    svc.add_account("old", Role::User, KEY_U, vec![]).unwrap();

    let other = memory_service();
    other
        .add_storage(storage("a", StorageKind::FilePool))
        .unwrap();
    other.add_storage(storage("s3", StorageKind::S3)).unwrap();
    other.create_group(group("g", 20, &["s3", "a"])).unwrap();
    other.register_instance(instance("i", "g")).await.unwrap();
    other
        .add_account("root", Role::Admin, KEY_A, vec![])
        .unwrap();
    let snap = other.gen_config_snapshot();

    svc.load_config_snapshot(snap.clone()).unwrap();
    assert_eq!(svc.gen_config_snapshot(), snap);
    // "gone" left with its blocks and charge; "i" kept its blocks.
    assert_eq!(svc.get_group("g").unwrap().1.total, 2 * BLOCK);
    assert_eq!(svc.stats().counters.blocks_dropped, 3);
    let hit = svc
        .get_cache_location("i", &LocationQuery::prefix(keys(0..2)))
        .await
        .unwrap();
    assert_eq!(hit.matched, 2);
    // Accounts follow the snapshot: the loaded key works, the old one not.
    assert_eq!(svc.authenticate(KEY_A).unwrap().account, "root");
    assert!(matches!(
        svc.authenticate(KEY_U),
        Err(MetaError::Unauthenticated)
    ));
    // Loading the same snapshot again is a no-op.
    svc.load_config_snapshot(snap.clone()).unwrap();
    assert_eq!(svc.gen_config_snapshot(), snap);
}

#[tokio::test]
async fn catalog_persists_across_reopen_with_redb() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.redb");
    let snap = {
        let index = Arc::new(RedbIndex::open(&path, 1 << 20).unwrap());
        let svc = MetaService::new(index, MetaConfig::default()).unwrap();
        svc.add_storage(storage("a", StorageKind::FilePool))
            .unwrap();
        svc.add_storage(storage("b", StorageKind::S3)).unwrap();
        svc.create_group(group("g", 10, &["a", "b"])).unwrap();
        svc.create_group(group("h", 10, &["b"])).unwrap();
        svc.register_instance(instance("i", "g")).await.unwrap();
        svc.register_instance(instance("j", "h")).await.unwrap();
        svc.add_account("root", Role::Admin, KEY_A, vec![]).unwrap();
        svc.add_account("u", Role::User, KEY_U, vec!["h".into()])
            .unwrap();
        svc.disable_storage("b").unwrap();
        write(&svc, "i", &keys(0..4)).await.unwrap();
        write(&svc, "j", &keys(0..1)).await.unwrap_err();
        svc.remove_instance("j").await.unwrap();
        svc.delete_account("root").unwrap();
        svc.gen_config_snapshot()
    };
    let index = Arc::new(RedbIndex::open(&path, 1 << 20).unwrap());
    let svc = MetaService::new(index, MetaConfig::default()).unwrap();
    assert_eq!(svc.gen_config_snapshot(), snap);
    assert_eq!(svc.list_instances(None).len(), 1);
    assert!(!svc.list_storages()[1].enabled);
    assert_eq!(svc.authenticate(KEY_U).unwrap().groups, ["h"]);
    assert!(matches!(
        svc.authenticate(KEY_A),
        Err(MetaError::Unauthenticated)
    ));
    assert_eq!(svc.get_group("g").unwrap().1.total, 4 * BLOCK);
}

/// A random but valid catalog, built through the admin API.
#[derive(Debug, Clone)]
struct Catalog {
    storages: Vec<(String, StorageKind, bool)>,
    /// (name, quota blocks, watermark percent, storage picks)
    groups: Vec<(String, u64, u8, Vec<usize>)>,
    /// (id, group pick, spec sizes)
    instances: Vec<(String, usize, Vec<u64>)>,
    /// (name, admin, group picks)
    accounts: Vec<(String, bool, Vec<usize>)>,
}

fn catalog_strategy() -> impl Strategy<Value = Catalog> {
    let kind = prop_oneof![
        Just(StorageKind::KvtierNode),
        Just(StorageKind::FilePool),
        Just(StorageKind::S3)
    ];
    (
        prop::collection::btree_map("[a-z]{1,6}", (kind, any::<bool>()), 1..4),
        prop::collection::btree_map(
            "[a-z]{1,6}",
            (
                1u64..1000,
                0u8..=100,
                prop::collection::vec(0usize..8, 1..3),
            ),
            1..4,
        ),
        prop::collection::btree_map(
            "[a-z0-9-]{1,8}",
            (0usize..8, prop::collection::vec(1u64..1 << 20, 1..3)),
            0..5,
        ),
        prop::collection::btree_map(
            "[a-z]{1,6}",
            (any::<bool>(), prop::collection::vec(0usize..8, 0..3)),
            0..4,
        ),
    )
        .prop_map(|(s, g, i, a)| Catalog {
            storages: s.into_iter().map(|(n, (k, e))| (n, k, e)).collect(),
            groups: g.into_iter().map(|(n, (q, w, p))| (n, q, w, p)).collect(),
            instances: i.into_iter().map(|(n, (g, s))| (n, g, s)).collect(),
            accounts: a.into_iter().map(|(n, (adm, g))| (n, adm, g)).collect(),
        })
}

async fn build(svc: &MetaService, c: &Catalog) {
    for (name, kind, enabled) in &c.storages {
        let mut s = storage(name, *kind);
        s.enabled = *enabled;
        svc.add_storage(s).unwrap();
    }
    for (name, quota, wm, picks) in &c.groups {
        let mut storages: Vec<String> = picks
            .iter()
            .map(|p| c.storages[p % c.storages.len()].0.clone())
            .collect();
        storages.sort();
        storages.dedup();
        svc.create_group(InstanceGroup {
            name: name.clone(),
            quota_bytes: quota * BLOCK,
            kind_quota_bytes: BTreeMap::from([(StorageKind::S3, quota * BLOCK / 2)]),
            watermark: f64::from(*wm) / 100.0,
            eviction: EvictionPolicy::Ttl { ttl_secs: *quota },
            storages,
            max_instances: 8,
            ..Default::default()
        })
        .unwrap();
    }
    for (id, pick, sizes) in &c.instances {
        let group = &c.groups[pick % c.groups.len()].0;
        svc.register_instance(Instance {
            id: id.clone(),
            group: group.clone(),
            model: format!("model-{id}"),
            block_size: 32,
            location_specs: sizes
                .iter()
                .enumerate()
                .map(|(n, size)| LocationSpecInfo {
                    name: format!("tp{n}"),
                    size: *size,
                })
                .collect(),
            spec_groups: vec![SpecGroup {
                name: "all".into(),
                specs: vec!["tp0".into()],
            }],
        })
        .await
        .unwrap();
    }
    for (name, admin, picks) in &c.accounts {
        let mut groups: Vec<String> = picks
            .iter()
            .map(|p| c.groups[p % c.groups.len()].0.clone())
            .collect();
        groups.sort();
        groups.dedup();
        let role = if *admin { Role::Admin } else { Role::User };
        svc.add_account(name, role, &format!("key-of-{name}-0123456789"), groups)
            .unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// gen -> JSON -> load on a fresh service gives equal listings, and
    /// every account's key still authenticates there.
    #[test]
    fn snapshot_round_trips(c in catalog_strategy()) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let a = memory_service();
            build(&a, &c).await;
            let json = a.gen_config_snapshot().to_json().unwrap();
            let b = memory_service();
            b.load_config_snapshot(ConfigSnapshot::from_json(&json).unwrap()).unwrap();
            prop_assert_eq!(b.list_storages(), a.list_storages());
            prop_assert_eq!(b.list_groups(), a.list_groups());
            prop_assert_eq!(b.list_instances(None), a.list_instances(None));
            prop_assert_eq!(b.list_accounts(), a.list_accounts());
            prop_assert_eq!(b.gen_config_snapshot(), a.gen_config_snapshot());
            for (name, admin, _) in &c.accounts {
                let p = b.authenticate(&format!("key-of-{name}-0123456789")).unwrap();
                prop_assert_eq!(&p.account, name);
                prop_assert_eq!(p.is_admin(), *admin);
            }
            Ok(())
        })?;
    }
}

/// A backend that hands out `mem://` URIs and records what is freed.
#[derive(Debug, Default)]
struct RecordingBackend {
    live: parking_lot::Mutex<std::collections::BTreeSet<String>>,
    freed: parking_lot::Mutex<Vec<String>>,
}

impl StorageBackend for RecordingBackend {
    fn create<'a>(
        &'a self,
        requests: &'a [CreateRequest],
    ) -> BackendFuture<'a, Result<Vec<String>, BackendError>> {
        Box::pin(async move {
            let uris: Vec<String> = requests
                .iter()
                .map(|r| {
                    format!(
                        "mem://{}/{}/{}/{}",
                        r.instance, r.key.0, r.location.0, r.spec
                    )
                })
                .collect();
            self.live.lock().extend(uris.iter().cloned());
            Ok(uris)
        })
    }

    fn delete<'a>(
        &'a self,
        uris: &'a [String],
    ) -> BackendFuture<'a, Vec<Result<(), BackendError>>> {
        Box::pin(async move {
            let mut live = self.live.lock();
            for u in uris {
                live.remove(u);
            }
            self.freed.lock().extend(uris.iter().cloned());
            uris.iter().map(|_| Ok(())).collect()
        })
    }

    fn exist<'a>(
        &'a self,
        uris: &'a [String],
    ) -> BackendFuture<'a, Result<Vec<bool>, BackendError>> {
        Box::pin(async move {
            let live = self.live.lock();
            Ok(uris.iter().map(|u| live.contains(u)).collect())
        })
    }

    fn usage(&self) -> BackendFuture<'_, Result<BackendUsage, BackendError>> {
        Box::pin(async move {
            Ok(BackendUsage {
                objects: self.live.lock().len() as u64,
                ..BackendUsage::default()
            })
        })
    }

    fn health(&self) -> BackendFuture<'_, Result<(), BackendError>> {
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test]
async fn remove_instance_frees_backend_space_of_every_location() {
    let svc = setup(100).await;
    svc.register_instance(instance("other", "g")).await.unwrap();
    let backend = Arc::new(RecordingBackend::default());
    svc.attach_backend("a", backend.clone()).unwrap();
    write(&svc, "i", &keys(0..5)).await.unwrap();
    let open = svc.start_write_cache("i", &keys(5..7)).await.unwrap();
    write(&svc, "other", &keys(0..3)).await.unwrap();
    let mine: std::collections::BTreeSet<String> = backend
        .live
        .lock()
        .iter()
        .filter(|u| u.starts_with("mem://i/"))
        .cloned()
        .collect();
    assert_eq!(mine.len(), 7, "5 serving + 2 writing, one spec each");
    assert!(
        open.blocks
            .iter()
            .all(|b| mine.contains(&b.location.specs[0].uri))
    );

    assert_eq!(svc.remove_instance("i").await.unwrap(), 7);
    svc.wait_released().await;
    let freed: std::collections::BTreeSet<String> = backend.freed.lock().iter().cloned().collect();
    assert_eq!(freed, mine);
    assert_eq!(
        backend.live.lock().len(),
        3,
        "the other instance keeps its space"
    );
}

/// Prints what `authenticate` costs (no assertion: tests never assert
/// timings). Run with
/// `cargo test --release -p kvtier-meta --test admin -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a check"]
fn authenticate_cost_figure() {
    let svc = memory_service();
    let accounts = 100;
    for n in 0..accounts {
        svc.add_account(
            &format!("acc{n}"),
            Role::User,
            &format!("key-{n:04}-0123456789abcdef"),
            vec![],
        )
        .unwrap();
    }
    let key = format!("key-{:04}-0123456789abcdef", accounts - 1);
    svc.authenticate(&key).unwrap();
    let rounds = 200_000u32;
    let t = std::time::Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(svc.authenticate(std::hint::black_box(&key)).unwrap());
    }
    let hit = t.elapsed() / rounds;
    let rounds = 2_000u32;
    let t = std::time::Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(svc.authenticate("wrong-key-0123456789abcdef").unwrap_err());
    }
    let miss = t.elapsed() / rounds;
    println!(
        "authenticate, {accounts} accounts: known key {hit:?}/call, unknown key {miss:?}/call"
    );
}

/// Upstream's conventions (docs/meta-api.md §5.1): a group may name a
/// storage that is added later (writes name it until then, and use it
/// once it exists), also in a snapshot; a quota of 0 bytes (upstream's
/// negative capacity) refuses every write.
#[tokio::test]
async fn a_group_may_name_storages_added_later_and_a_zero_quota_takes_nothing() {
    let svc = memory_service();
    svc.create_group(group("g", 10, &["later"])).unwrap();
    svc.register_instance(instance("i", "g")).await.unwrap();
    let e = write(&svc, "i", &keys(0..1))
        .await
        .expect_err("no storage yet");
    assert!(
        matches!(&e, MetaError::NoAvailableStorage { why, .. } if why.contains("\"later\" is not added")),
        "{e}"
    );
    svc.add_storage(storage("later", StorageKind::FilePool))
        .unwrap();
    assert_eq!(write(&svc, "i", &keys(0..1)).await.unwrap(), 1);
    let snap = svc.gen_config_snapshot();
    let mut s = snap.clone();
    s.storages.clear();
    svc.load_config_snapshot(s)
        .expect("a snapshot naming a storage it lacks");

    svc.create_group(group("closed", 0, &["later"])).unwrap();
    svc.register_instance(instance("c", "closed"))
        .await
        .unwrap();
    assert!(matches!(
        write(&svc, "c", &keys(0..1)).await,
        Err(MetaError::QuotaExceeded { limit: 0, .. })
    ));
}

/// The two settings that keep kvtier's stricter rules (docs/meta-api.md
/// §5.1): off, a storage a group lists and a group with instances are
/// removed as upstream removes them, and a short key is taken; a group an
/// account is scoped to stays unremovable either way.
#[tokio::test]
async fn relaxed_settings_remove_what_is_in_use_and_take_short_keys() {
    let strict = setup(10).await;
    assert!(matches!(
        strict.remove_storage("a"),
        Err(MetaError::InUse(_))
    ));
    assert!(matches!(strict.remove_group("g"), Err(MetaError::InUse(_))));
    assert!(matches!(
        strict.add_account("u", Role::User, "pass123", vec![]),
        Err(MetaError::InvalidArgument(_))
    ));

    let svc = MetaService::new(
        Arc::new(MemoryIndex::new()),
        MetaConfig {
            strict_removals: false,
            min_api_key_len: 0,
            ..MetaConfig::default()
        },
    )
    .unwrap();
    svc.add_storage(storage("a", StorageKind::FilePool))
        .unwrap();
    svc.create_group(group("g", 10, &["a"])).unwrap();
    svc.create_group(group("scoped", 10, &["a"])).unwrap();
    svc.register_instance(instance("i", "g")).await.unwrap();
    assert_eq!(write(&svc, "i", &keys(0..1)).await.unwrap(), 1);
    svc.add_account("u", Role::User, "pass123", vec!["scoped".into()])
        .expect("a short key");

    svc.remove_storage("a")
        .expect("removed although g lists it");
    assert!(matches!(
        write(&svc, "i", &keys(1..2)).await,
        Err(MetaError::NoAvailableStorage { .. })
    ));
    svc.remove_group("g").expect("removed although i is in it");
    assert!(matches!(
        write(&svc, "i", &keys(1..2)).await,
        Err(MetaError::GroupNotFound(_))
    ));
    assert!(matches!(
        svc.remove_group("scoped"),
        Err(MetaError::InUse(_))
    ));
}

/// Opens [`RecordingBackend`]s, or fails while `down` is set (a directory
/// that cannot be created yet, a store not reachable yet).
#[derive(Debug, Default)]
struct FlakyOpener {
    down: std::sync::atomic::AtomicBool,
}

impl BackendOpener for FlakyOpener {
    fn open(
        &self,
        _svc: &MetaService,
        storage: &Storage,
    ) -> std::result::Result<Arc<dyn StorageBackend>, BackendError> {
        if self.down.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(BackendError::Unavailable(format!(
                "{} is down",
                storage.name
            )));
        }
        Ok(Arc::new(RecordingBackend::default()))
    }
}

/// D.2 row 19: a storage whose backend cannot be opened now is added (as
/// upstream adds it), unhealthy: it takes no writes until a health round
/// opens its backend and the probe passes. An update to a URI that cannot
/// be opened leaves it the same way, not on its old backend.
#[tokio::test]
async fn a_storage_whose_backend_cannot_be_opened_is_added_unhealthy() {
    let opener = Arc::new(FlakyOpener::default());
    opener
        .down
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let config = MetaConfig {
        backend_opener: Some(opener.clone()),
        ..MetaConfig::default()
    };
    let svc = MetaService::new(Arc::new(MemoryIndex::new()), config).unwrap();
    svc.add_storage(storage("a", StorageKind::FilePool))
        .unwrap();
    svc.create_group(group("g", 100, &["a"])).unwrap();
    svc.register_instance(instance("i", "g")).await.unwrap();
    let health = |svc: &MetaService| svc.list_storages()[0].health;
    assert_eq!(health(&svc), StorageHealth::Unhealthy);
    let err = write(&svc, "i", &keys(0..1)).await.unwrap_err();
    assert_eq!(err.code(), "NO_AVAILABLE_STORAGE", "{err}");

    // Still down: the round keeps it unhealthy and names it.
    let timeout = std::time::Duration::from_secs(1);
    assert_eq!(svc.check_backends(timeout).await, vec!["a".to_string()]);
    assert_eq!(health(&svc), StorageHealth::Unhealthy);

    opener
        .down
        .store(false, std::sync::atomic::Ordering::Relaxed);
    assert!(svc.check_backends(timeout).await.is_empty());
    assert_eq!(health(&svc), StorageHealth::Healthy);
    assert_eq!(write(&svc, "i", &keys(0..1)).await.unwrap(), 1);

    opener
        .down
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let moved = Storage {
        uri: "file:///kv/elsewhere".into(),
        ..storage("a", StorageKind::FilePool)
    };
    svc.update_storage(moved).unwrap();
    assert_eq!(health(&svc), StorageHealth::Unhealthy);
    // The old backend is detached: its passing probe changes nothing.
    svc.check_backends(timeout).await;
    assert_eq!(health(&svc), StorageHealth::Unhealthy);
    assert!(write(&svc, "i", &keys(1..2)).await.is_err());
}

/// A storage of a kind kvtier has no backend for (D.2 row 20).
fn foreign(name: &str, kind: StorageKind) -> Storage {
    Storage {
        name: name.into(),
        kind,
        uri: format!("{}://{name}", kind.as_str()),
        enabled: true,
        health: StorageHealth::Healthy,
        spec: Some(serde_json::json!({"domain": "d"})),
    }
}

/// D.2 row 20: mooncake and tair_mem_pool storages are kept with their
/// spec and never chosen for writes, whatever their switch and health;
/// a server with no other storage is not healthy.
#[tokio::test]
async fn storages_without_a_backend_are_kept_and_never_written() {
    let svc = memory_service();
    svc.add_storage(foreign("mc", StorageKind::Mooncake))
        .unwrap();
    svc.add_storage(foreign("tp", StorageKind::TairMemPool))
        .unwrap();
    assert_eq!(svc.list_storages()[0], foreign("mc", StorageKind::Mooncake));
    let h = svc.check_health().await;
    assert!(!h.healthy);
    assert!(h.reason.unwrap().contains("without a backend"));

    svc.create_group(group("mem", 100, &["mc", "tp"])).unwrap();
    svc.register_instance(instance("m", "mem")).await.unwrap();
    let err = write(&svc, "m", &keys(0..1)).await.unwrap_err();
    assert_eq!(err.code(), "NO_AVAILABLE_STORAGE", "{err}");

    svc.add_storage(storage("a", StorageKind::FilePool))
        .unwrap();
    svc.create_group(group("mixed", 100, &["mc", "a"])).unwrap();
    svc.register_instance(instance("x", "mixed")).await.unwrap();
    let grant = svc.start_write_cache("x", &keys(0..2)).await.unwrap();
    assert!(grant.blocks.iter().all(|b| b.location.storage == "a"));
    assert!(svc.check_health().await.healthy);
}

/// The refusal names the kind (D.2 row 20).
#[tokio::test]
async fn a_write_refused_for_want_of_a_backend_says_so() {
    let svc = memory_service();
    svc.add_storage(foreign("mc", StorageKind::Mooncake))
        .unwrap();
    svc.create_group(group("mem", 100, &["mc"])).unwrap();
    svc.register_instance(instance("m", "mem")).await.unwrap();
    let err = write(&svc, "m", &keys(0..1)).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("storage \"mc\" has no backend in kvtier (mooncake)"),
        "{err}"
    );
}

/// D.3: upstream's compare-and-set on a group's version, checked by
/// `update_group_versioned` (the admin API's update); `update_group`
/// (kvtier's own callers) replaces whatever the version.
#[tokio::test]
async fn group_updates_compare_and_set_the_version() {
    let svc = setup(100).await;
    let v = |version: i64, user_data: &str| InstanceGroup {
        version,
        user_data: user_data.into(),
        ..group("g", 100, &["a"])
    };
    let stored = |svc: &MetaService| svc.get_group("g").unwrap().0;
    for (current, version) in [(1, 1), (0, 0), (0, -1), (1, 2)] {
        let err = svc
            .update_group_versioned(v(version, "x"), current)
            .unwrap_err();
        assert_eq!(err.code(), "VERSION_MISMATCH", "{current} -> {version}");
        assert!(err.to_string().contains("current version 0"), "{err}");
        assert_eq!(stored(&svc), group("g", 100, &["a"]));
    }
    svc.update_group_versioned(v(1, "one"), 0).unwrap();
    assert_eq!(stored(&svc), v(1, "one"));
    svc.update_group_versioned(v(5, "five"), 1).unwrap();
    assert_eq!(stored(&svc).version, 5);
    let err = svc.update_group_versioned(v(6, "x"), 1).unwrap_err();
    assert_eq!(err.code(), "VERSION_MISMATCH");
    svc.update_group(v(0, "reset")).unwrap();
    assert_eq!(stored(&svc), v(0, "reset"));
}

/// Records and snapshots written before the fields kept for Tair KVCM
/// existed still load, with their defaults.
#[test]
fn records_without_the_new_fields_still_decode() {
    let old = r#"{
        "format": 1,
        "storages": [{"name": "a", "kind": "file_pool", "uri": "file:///kv/a",
                      "enabled": true, "health": "healthy"}],
        "groups": [{"name": "g", "quota_bytes": 100000, "kind_quota_bytes": {},
                    "watermark": 0.9, "eviction": "lru", "storages": ["a"],
                    "max_instances": 4}]
    }"#;
    let snap = ConfigSnapshot::from_json(old).unwrap();
    assert_eq!(snap.storages, vec![storage("a", StorageKind::FilePool)]);
    assert_eq!(snap.groups, vec![group("g", 100, &["a"])]);
    let g = &snap.groups[0];
    assert_eq!(
        (g.version, g.max_key_count, g.user_data.as_str()),
        (0, 0, "")
    );
    assert!(g.passthrough.is_none() && snap.storages[0].spec.is_none());

    // And what is written now round-trips, passthrough included.
    let svc = memory_service();
    svc.add_storage(foreign("mc", StorageKind::Mooncake))
        .unwrap();
    let kept = InstanceGroup {
        version: 3,
        user_data: "u".into(),
        max_key_count: 16,
        passthrough: Some(serde_json::json!({"extra_info": "{}"})),
        ..group("g", 100, &["mc"])
    };
    svc.create_group(kept.clone()).unwrap();
    let text = svc.gen_config_snapshot().to_json().unwrap();
    let back = ConfigSnapshot::from_json(&text).unwrap();
    assert_eq!(back.groups, vec![kept]);
    assert_eq!(back.storages, vec![foreign("mc", StorageKind::Mooncake)]);
}

/// D.3 `max_key_count`: an instance holds at most that many block records,
/// writing and serving (upstream's `REACH_MAX_ENTITY_CAPACITY`); keys it
/// already holds are not new, and 0 is unlimited.
#[tokio::test]
async fn writes_past_max_key_count_are_refused() {
    let svc = setup(100).await;
    let limited = InstanceGroup {
        max_key_count: 4,
        ..group("g", 100, &["a"])
    };
    svc.update_group(limited).unwrap();
    assert_eq!(write(&svc, "i", &keys(0..3)).await.unwrap(), 3);
    // One open write counts as much as a finished one.
    let open = svc.start_write_cache("i", &keys(3..4)).await.unwrap();
    assert_eq!(open.blocks.len(), 1);
    let err = write(&svc, "i", &keys(4..5)).await.unwrap_err();
    assert_eq!(err.code(), "KEY_COUNT_EXCEEDED", "{err}");
    assert!(err.to_string().contains("max_key_count 4"), "{err}");
    // Nothing new: the held keys are skipped, not refused.
    assert_eq!(write(&svc, "i", &keys(0..3)).await.unwrap(), 0);
    svc.update_group(group("g", 100, &["a"])).unwrap();
    assert_eq!(write(&svc, "i", &keys(4..6)).await.unwrap(), 2);
}
