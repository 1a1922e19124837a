//! Inputs Tair KVCache Manager accepts, with its meaning, that kvtier once
//! refused (docs/meta-api.md, "Upstream's input conventions"). Each case
//! goes over the admin HTTP API as upstream's own tooling sends it
//! (numeric enums included).

#[path = "support/lib.rs"]
mod support;

use std::collections::BTreeMap;

use kvtier_meta::proto::admin as apb;
use kvtier_meta::proto::admin::admin_service_client::AdminServiceClient;
use kvtier_meta::{EvictionPolicy, Role};
use serde_json::json;
use support::*;

/// A group body in upstream's shape: capacity, kind quotas, reclaim
/// strategy.
fn group_body(
    name: &str,
    candidates: &[&str],
    quota_config: serde_json::Value,
) -> serde_json::Value {
    json!({
        "trace_id": "t",
        "instance_group": {
            "name": name,
            "storage_candidates": candidates,
            "global_quota_group_name": name,
            "max_instance_count": 8,
            "quota": {"capacity": 1_000_000, "quota_config": quota_config},
            "cache_config": {
                "reclaim_strategy": {
                    "storage_unique_name": "nfs",
                    "reclaim_policy": 3,
                    "trigger_strategy": {"used_size": 0, "used_percentage": 3.2},
                    "trigger_period_seconds": 0,
                    "delay_before_delete_ms": 100
                },
                "data_storage_strategy": 2
            },
            "version": 1
        }
    })
}

#[tokio::test]
async fn group_settings_upstream_accepts_keep_its_meaning() {
    let ts = start().await;
    let a = ts.server.admin_http_addr();
    // A watermark of 3.2 (upstream's "never triggers"), TTL policy without
    // a period (LRU upstream), a candidate listed twice, kind quotas of an
    // unspecified type (0) and with a negative capacity (no limit), and one
    // above the group's capacity (both limits apply).
    let quota_config = json!([
        {"storage_type": 0, "capacity": 5},
        {"storage_type": 4, "capacity": -1},
        {"storage_type": 1, "capacity": 2_000_000}
    ]);
    let body = group_body("up", &["nfs", "nfs"], quota_config);
    let (st, r) = post(a, "/api/createInstanceGroup", &body, None).await;
    assert_eq!((st, code(&r)), (200, "OK"), "{r}");
    let g = ts
        .svc
        .list_groups()
        .into_iter()
        .find(|g| g.name == "up")
        .expect("group stored");
    assert_eq!(g.storages, vec!["nfs".to_string()]);
    assert_eq!(g.watermark, 3.2);
    assert_eq!(g.eviction, EvictionPolicy::Lru);
    assert_eq!(g.quota_bytes, 1_000_000);
    let kinds: Vec<u64> = g.kind_quota_bytes.values().copied().collect();
    assert_eq!(kinds, vec![2_000_000], "only the 3FS entry limits");

    // A positive period keeps the TTL meaning.
    let mut body = group_body("up", &["nfs"], json!([]));
    body["instance_group"]["cache_config"]["reclaim_strategy"]["trigger_period_seconds"] =
        json!(60);
    body["instance_group"]["version"] = json!(2);
    body["current_version"] = json!(1);
    let (_, r) = post(a, "/api/updateInstanceGroup", &body, None).await;
    assert_eq!(code(&r), "OK", "{r}");
    let g = ts.svc.get_group("up").expect("group").0;
    assert_eq!(g.eviction, EvictionPolicy::Ttl { ttl_secs: 60 });
    assert_eq!(g.kind_quota_bytes, BTreeMap::new());

    // What upstream refuses too stays refused, and changes nothing.
    let before = ts.svc.list_groups();
    let mut body = group_body("bad", &["nfs"], json!([]));
    body["instance_group"]["cache_config"]["reclaim_strategy"]["trigger_strategy"]["used_percentage"] =
        json!(-0.5);
    let (_, r) = post(a, "/api/createInstanceGroup", &body, None).await;
    assert_eq!(code(&r), "OK", "negative: the default watermark, {r}");
    assert_eq!(ts.svc.get_group("bad").expect("group").0.watermark, 0.9);
    let (_, r) = post(
        a,
        "/api/createInstanceGroup",
        &group_body("", &["nfs"], json!([])),
        None,
    )
    .await;
    assert_eq!(code(&r), "INVALID_ARGUMENT", "{r}");
    assert_eq!(ts.svc.list_groups().len(), before.len() + 1);
}

/// Over gRPC: an enum number the schema does not name reaches the service
/// there (pbjson's JSON decoding refuses it before).
#[tokio::test]
async fn an_unknown_account_role_is_an_ordinary_user() {
    let ts = start().await;
    let mut c = AdminServiceClient::connect(format!("http://{}", ts.server.admin_grpc_addr()))
        .await
        .expect("connect");
    let r = c
        .add_account(apb::AddAccountRequest {
            user_name: "u7".into(),
            password: "0123456789abcdef-u7".into(),
            role: 7,
            ..Default::default()
        })
        .await
        .expect("transport")
        .into_inner();
    let status = r.header.and_then(|h| h.status).expect("status");
    assert_eq!(status.code, apb::ErrorCode::Ok as i32, "{}", status.message);
    let account = ts
        .svc
        .list_accounts()
        .into_iter()
        .find(|x| x.name == "u7")
        .expect("account stored");
    assert_eq!(account.role, Role::User, "never more than a user");
}

#[tokio::test]
async fn remove_instance_ignores_the_group_named_in_the_request() {
    let ts = start().await;
    let (m, a) = (ts.server.meta_http_addr(), ts.server.admin_http_addr());
    let (_, r) = post(m, "/api/registerInstance", &register_body("i1", "g"), None).await;
    assert_eq!(code(&r), "OK", "{r}");
    let (_, r) = post(
        a,
        "/api/removeInstance",
        &json!({"instance_id": "i1", "instance_group": "h"}),
        None,
    )
    .await;
    assert_eq!(code(&r), "OK", "{r}");
    assert!(ts.svc.list_instances(None).iter().all(|i| i.id != "i1"));
    let (_, r) = post(
        a,
        "/api/removeInstance",
        &json!({"instance_id": "i1", "instance_group": "g"}),
        None,
    )
    .await;
    assert_ne!(code(&r), "OK", "already gone: {r}");
}

/// Upstream's own group cases name candidates (`test_storage_01`) they
/// never add, and a negative capacity means "takes nothing": both are
/// accepted, and a negative capacity reads back as -1 (0 is unlimited).
#[tokio::test]
async fn groups_name_storages_added_later_and_a_negative_capacity_takes_nothing() {
    let ts = start().await;
    let a = ts.server.admin_http_addr();
    let body = group_body("later", &["test_storage_01", "nfs"], json!([]));
    let (st, r) = post(a, "/api/createInstanceGroup", &body, None).await;
    assert_eq!((st, code(&r)), (200, "OK"), "{r}");
    let mut body = group_body("closed", &["nfs"], json!([]));
    body["instance_group"]["quota"]["capacity"] = json!(-1);
    let (_, r) = post(a, "/api/createInstanceGroup", &body, None).await;
    assert_eq!(code(&r), "OK", "{r}");
    let (_, r) = post(
        a,
        "/api/getInstanceGroup",
        &json!({"trace_id": "t", "name": "closed"}),
        None,
    )
    .await;
    assert_eq!(r["instance_group"]["quota"]["capacity"], "-1", "{r}");

    let m = ts.server.meta_http_addr();
    for (instance, group, want) in [
        ("w", "later", "OK"),
        ("c", "closed", "REACH_MAX_ENTITY_CAPACITY"),
    ] {
        let (_, r) = post(
            m,
            "/api/registerInstance",
            &register_body(instance, group),
            None,
        )
        .await;
        assert_eq!(code(&r), "OK", "{r}");
        let (_, r) = post(
            m,
            "/api/startWriteCache",
            &json!({"trace_id": "t", "instance_id": instance, "block_keys": [1]}),
            None,
        )
        .await;
        assert_eq!(code(&r), want, "{group}: {r}");
    }
}

/// An instance registered without a block size (upstream accepts 0 and
/// negatives) takes block keys, and only token ids are refused; token ids
/// short of one block find nothing and write nothing, as upstream.
#[tokio::test]
async fn no_block_size_and_token_ids_short_of_a_block() {
    let ts = start().await;
    let m = ts.server.meta_http_addr();
    let mut reg = register_body("nobs", "g");
    reg["block_size"] = json!(-1);
    let (_, r) = post(m, "/api/registerInstance", &reg, None).await;
    assert_eq!(code(&r), "OK", "{r}");
    let ask = |body: serde_json::Value| async move {
        post(m, "/api/getCacheLocation", &body, None).await.1
    };
    let r = ask(json!({"trace_id": "t", "instance_id": "nobs", "query_type": "QT_PREFIX_MATCH", "token_ids": [1, 2]})).await;
    assert_eq!(code(&r), "INVALID_ARGUMENT", "{r}");
    let r = ask(json!({"trace_id": "t", "instance_id": "nobs", "query_type": "QT_PREFIX_MATCH", "block_keys": [1]})).await;
    assert_eq!(code(&r), "OK", "{r}");

    // register_body's block size is 2: one token makes no block.
    let (_, r) = post(
        m,
        "/api/registerInstance",
        &register_body("short", "g"),
        None,
    )
    .await;
    assert_eq!(code(&r), "OK", "{r}");
    let r = ask(json!({"trace_id": "t", "instance_id": "short", "query_type": "QT_PREFIX_MATCH", "token_ids": [9]})).await;
    assert_eq!(code(&r), "OK", "{r}");
    assert_eq!(r["locations"].as_array().map_or(0, Vec::len), 0, "{r}");
    let (_, w) = post(
        m,
        "/api/startWriteCache",
        &json!({"trace_id": "t", "instance_id": "short", "token_ids": [9]}),
        None,
    )
    .await;
    assert_eq!(code(&w), "OK", "{w}");
    assert_eq!(w["locations"].as_array().map_or(0, Vec::len), 0, "{w}");
    let (_, f) = post(
        m,
        "/api/finishWriteCache",
        &json!({"trace_id": "t", "instance_id": "short", "write_session_id": w["write_session_id"],
                "success_blocks": {"bool_masks": {"values": []}}}),
        None,
    )
    .await;
    assert_eq!(code(&f), "OK", "{f}");
}

/// Upstream's memory stores, as its admin tooling sends them.
fn foreign_storages() -> [serde_json::Value; 2] {
    [
        json!({
            "global_unique_name": "mc",
            "mooncake": {
                "local_hostname": "10.0.0.1",
                "metadata_connstring": "etcd://10.0.0.2:2379",
                "protocol": "rdma",
                "rdma_device": "mlx5_0",
                "master_service_entry": "10.0.0.3:50051"
            },
            "check_storage_available_when_open": false
        }),
        json!({
            "global_unique_name": "pool",
            "tair_mem_pool": {"domain": "pool.example", "timeout": 300, "service_discovery_url": ""},
            "check_storage_available_when_open": false
        }),
    ]
}

/// D.2 row 20: `mooncake` and `tair_mem_pool` storages are added (kvtier
/// once answered UNSUPPORTED), listed back as given, and never written: a
/// group on one and a file pool writes to the file pool, a group on one
/// alone is refused. Over HTTP.
#[tokio::test]
async fn mooncake_and_tair_mem_pool_storages_are_kept_and_never_written() {
    let ts = start().await;
    let a = ts.server.admin_http_addr();
    for s in foreign_storages() {
        let (_, r) = post(
            a,
            "/api/addStorage",
            &json!({"trace_id": "t", "storage": s}),
            None,
        )
        .await;
        assert_eq!(code(&r), "OK", "{r}");
    }
    let (_, r) = post(a, "/api/listStorage", &json!({"trace_id": "t"}), None).await;
    let listed = r["storage"].as_array().expect("storages");
    for s in foreign_storages() {
        let name = &s["global_unique_name"];
        let back = listed
            .iter()
            .find(|l| l["global_unique_name"] == *name)
            .unwrap_or_else(|| panic!("{name} listed: {r}"));
        // Every field as given (the JSON writes 32-bit numbers as numbers).
        assert_eq!(*back, s);
    }

    // Upstream's required spec fields stay required.
    let bad = json!({"global_unique_name": "x", "tair_mem_pool": {"domain": ""}});
    let (_, r) = post(
        a,
        "/api/addStorage",
        &json!({"trace_id": "t", "storage": bad}),
        None,
    )
    .await;
    assert_eq!(code(&r), "INVALID_ARGUMENT", "{r}");
    assert!(
        r["header"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("{domain}"),
        "{r}"
    );

    let m = ts.server.meta_http_addr();
    for (group, candidates, want) in [
        ("mixed", vec!["mc", "nfs"], "OK"),
        ("memory", vec!["mc", "pool"], "REACH_MAX_ENTITY_CAPACITY"),
    ] {
        let (_, r) = post(
            a,
            "/api/createInstanceGroup",
            &group_body(group, &candidates, json!([])),
            None,
        )
        .await;
        assert_eq!(code(&r), "OK", "{r}");
        let inst = format!("i-{group}");
        let (_, r) = post(
            m,
            "/api/registerInstance",
            &register_body(&inst, group),
            None,
        )
        .await;
        assert_eq!(code(&r), "OK", "{r}");
        let (_, r) = post(
            m,
            "/api/startWriteCache",
            &json!({"trace_id": "t", "instance_id": inst, "block_keys": [1]}),
            None,
        )
        .await;
        assert_eq!(code(&r), want, "{group}: {r}");
        if want == "OK" {
            let uri = r["locations"][0]["location_specs"][0]["uri"]
                .as_str()
                .unwrap_or_default();
            assert!(
                uri.starts_with("file:///mnt/nfs"),
                "written to the file pool: {r}"
            );
        }
    }
}

/// The same storages over gRPC: added and listed back field for field.
#[tokio::test]
async fn foreign_storages_round_trip_over_grpc() {
    use apb::storage_config::StorageSpec as S;
    let ts = start().await;
    let mut c = AdminServiceClient::connect(format!("http://{}", ts.server.admin_grpc_addr()))
        .await
        .expect("connect");
    let given = [
        apb::StorageConfig {
            global_unique_name: "mc".into(),
            storage_spec: Some(S::Mooncake(apb::MooncakeStorageSpec {
                local_hostname: "h".into(),
                metadata_connstring: "etcd://m".into(),
                protocol: "tcp".into(),
                rdma_device: String::new(),
                master_service_entry: "master:50051".into(),
            })),
            check_storage_available_when_open: false,
        },
        apb::StorageConfig {
            global_unique_name: "pool".into(),
            storage_spec: Some(S::TairMemPool(apb::TairMemPoolStorageSpec {
                domain: "d".into(),
                timeout: 7,
                service_discovery_url: "http://sd".into(),
            })),
            check_storage_available_when_open: false,
        },
    ];
    for s in &given {
        let r = c
            .add_storage(apb::AddStorageRequest {
                trace_id: "t".into(),
                storage: Some(s.clone()),
            })
            .await
            .expect("transport")
            .into_inner();
        let status = r.header.and_then(|h| h.status).expect("status");
        assert_eq!(status.code, apb::ErrorCode::Ok as i32, "{}", status.message);
    }
    let listed = c
        .list_storage(apb::ListStorageRequest {
            trace_id: "t".into(),
        })
        .await
        .expect("transport")
        .into_inner()
        .storage;
    for s in &given {
        assert!(listed.contains(s), "{s:?} in {listed:?}");
    }
}

/// Upstream's `test_create_update_get_remove_instance_group` group, in
/// full and as kvtier's JSON writes it (64-bit numbers as strings): what
/// kvtier does not model comes back as given.
fn upstream_group(version: i64, user_data: &str) -> serde_json::Value {
    json!({
        "name": "test_instance_group",
        "storage_candidates": ["nfs"],
        "global_quota_group_name": "test_quota_group",
        "max_instance_count": "10",
        "quota": {"capacity": "1000", "quota_config": []},
        "cache_config": {
            "reclaim_strategy": {
                "storage_unique_name": "nfs",
                "reclaim_policy": "POLICY_LRU",
                "trigger_strategy": {"used_size": "1073741824", "used_percentage": 0.8},
                "trigger_period_seconds": 60,
                "reclaim_step_size": 536870912,
                "reclaim_step_percentage": 5,
                "delay_before_delete_ms": 100
            },
            "data_storage_strategy": "CPS_PREFER_3FS",
            "meta_indexer_config": {
                "max_key_count": "1000000",
                "mutex_shard_num": "16",
                "batch_key_size": "0",
                "meta_storage_backend_config": {"storage_type": "local", "storage_uri": "file:///tmp/meta_storage"},
                "meta_cache_policy_config": {"capacity": "1073741824", "type": "LRU", "cache_shard_bits": 0, "high_pri_pool_ratio": 0.0}
            }
        },
        "user_data": user_data,
        "version": version.to_string(),
        "extra_info": "{\"k\":1}"
    })
}

async fn get_group_http(a: std::net::SocketAddr, name: &str) -> serde_json::Value {
    let (_, r) = post(
        a,
        "/api/getInstanceGroup",
        &json!({"trace_id": "t", "name": name}),
        None,
    )
    .await;
    assert_eq!(code(&r), "OK", "{r}");
    r["instance_group"].clone()
}

/// D.3: a group's `version`, `user_data` and the settings kvtier does not
/// model are kept and given back, and UpdateInstanceGroup is upstream's
/// compare-and-set: `current_version` must be the stored version and the
/// new `version` above it (`registry_manager.cc`). Over HTTP.
#[tokio::test]
async fn group_versions_compare_and_set_and_the_group_reads_back_as_given() {
    let ts = start().await;
    let a = ts.server.admin_http_addr();
    let created = upstream_group(1, "test_data");
    let body = json!({"trace_id": "t", "instance_group": created});
    let (_, r) = post(a, "/api/createInstanceGroup", &body, None).await;
    assert_eq!(code(&r), "OK", "{r}");
    assert_eq!(get_group_http(a, "test_instance_group").await, created);
    assert_eq!(
        ts.svc
            .get_group("test_instance_group")
            .unwrap()
            .0
            .max_key_count,
        1_000_000
    );

    // Stale current_version, a version not above the stored one, no
    // version at all (what kvtier once accepted): refused, nothing changes.
    for (current, version) in [(0, 2), (1, 1), (1, 0), (2, 3)] {
        let body = json!({
            "trace_id": "t",
            "instance_group": upstream_group(version, "updated_data"),
            "current_version": current.to_string()
        });
        let (_, r) = post(a, "/api/updateInstanceGroup", &body, None).await;
        assert_eq!(code(&r), "INVALID_ARGUMENT", "{current} -> {version}: {r}");
        let msg = r["header"]["status"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(msg.contains("version not match"), "{msg}");
        assert_eq!(get_group_http(a, "test_instance_group").await, created);
    }

    let updated = upstream_group(2, "updated_data");
    let body = json!({"trace_id": "t", "instance_group": updated, "current_version": "1"});
    let (_, r) = post(a, "/api/updateInstanceGroup", &body, None).await;
    assert_eq!(code(&r), "OK", "{r}");
    let back = get_group_http(a, "test_instance_group").await;
    assert_eq!(back["user_data"], "updated_data");
    assert_eq!(back, updated);
}

/// The compare-and-set over gRPC, and the listing echoes the version.
#[tokio::test]
async fn group_versions_compare_and_set_over_grpc() {
    let ts = start().await;
    let mut c = AdminServiceClient::connect(format!("http://{}", ts.server.admin_grpc_addr()))
        .await
        .expect("connect");
    let group = |version: i64, user_data: &str| apb::InstanceGroup {
        name: "vg".into(),
        storage_candidates: vec!["nfs".into()],
        global_quota_group_name: "vg".into(),
        user_data: user_data.into(),
        version,
        ..Default::default()
    };
    let r = c
        .create_instance_group(apb::CreateInstanceGroupRequest {
            trace_id: "t".into(),
            instance_group: Some(group(1, "a")),
        })
        .await
        .expect("transport")
        .into_inner();
    let status = r.header.and_then(|h| h.status).expect("status");
    assert_eq!(status.code, apb::ErrorCode::Ok as i32, "{}", status.message);
    for (current, version, want) in [
        (0, 2, apb::ErrorCode::InvalidArgument),
        (1, 1, apb::ErrorCode::InvalidArgument),
        (1, 2, apb::ErrorCode::Ok),
        (1, 3, apb::ErrorCode::InvalidArgument),
    ] {
        let r = c
            .update_instance_group(apb::UpdateInstanceGroupRequest {
                trace_id: "t".into(),
                instance_group: Some(group(version, &format!("v{version}"))),
                current_version: current,
            })
            .await
            .expect("transport")
            .into_inner();
        let status = r.header.and_then(|h| h.status).expect("status");
        assert_eq!(
            status.code, want as i32,
            "{current} -> {version}: {}",
            status.message
        );
    }
    let listed = c
        .list_instance_group(apb::ListInstanceGroupRequest {
            trace_id: "t".into(),
        })
        .await
        .expect("transport")
        .into_inner()
        .instance_group;
    let vg = listed.iter().find(|g| g.name == "vg").expect("listed");
    assert_eq!((vg.version, vg.user_data.as_str()), (2, "v2"));
}
