//! The same methods over gRPC (tonic client): every call completes with
//! transport status OK and reports its outcome in `header.status`, and the
//! answers equal the HTTP ones (one handler behind both). Also the admin
//! service over both transports.

#[path = "support/lib.rs"]
mod support;

use kvtier_meta::proto::admin as apb;
use kvtier_meta::proto::admin::admin_service_client::AdminServiceClient;
use kvtier_meta::proto::meta as mpb;
use kvtier_meta::proto::meta::meta_service_client::MetaServiceClient;
use serde_json::json;
use support::*;

fn code_of(h: &Option<mpb::CommonResponseHeader>) -> mpb::ErrorCode {
    let c = h
        .as_ref()
        .and_then(|h| h.status.as_ref())
        .map_or(0, |s| s.code);
    mpb::ErrorCode::try_from(c).unwrap_or(mpb::ErrorCode::Unspecified)
}

fn admin_code(h: &Option<apb::CommonResponseHeader>) -> apb::ErrorCode {
    let c = h
        .as_ref()
        .and_then(|h| h.status.as_ref())
        .map_or(0, |s| s.code);
    apb::ErrorCode::try_from(c).unwrap_or(apb::ErrorCode::Unspecified)
}

#[tokio::test]
async fn every_meta_method_round_trips_over_grpc() {
    let ts = start().await;
    let mut c = MetaServiceClient::connect(format!("http://{}", ts.server.meta_grpc_addr()))
        .await
        .expect("grpc connect");

    let reg = mpb::RegisterInstanceRequest {
        trace_id: "t".into(),
        instance_group: "g".into(),
        instance_id: "llama".into(),
        block_size: 2,
        location_spec_infos: vec![mpb::LocationSpecInfo {
            name: "tp0".into(),
            size: 64,
        }],
        model_deployment: Some(mpb::ModelDeployment {
            model_name: "llama".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let r = c.register_instance(reg.clone()).await.unwrap().into_inner();
    assert_eq!(code_of(&r.header), mpb::ErrorCode::Ok);
    assert_eq!(r.header.as_ref().unwrap().request_id, "t");
    let mut bad = reg.clone();
    bad.location_spec_infos[0].size = -1;
    let r = c
        .register_instance(bad)
        .await
        .expect("transport OK")
        .into_inner();
    assert_eq!(code_of(&r.header), mpb::ErrorCode::InvalidArgument);

    let r = c
        .get_instance_info(mpb::GetInstanceInfoRequest {
            instance_id: "llama".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.instance_info.unwrap().block_size, 2);

    let keys = vec![i64::MIN, -1, 0, i64::MAX];
    let w = c
        .start_write_cache(mpb::StartWriteCacheRequest {
            instance_id: "llama".into(),
            block_keys: keys.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code_of(&w.header), mpb::ErrorCode::Ok);
    assert_eq!(w.locations.len(), 4);
    let r = c
        .finish_write_cache(mpb::FinishWriteCacheRequest {
            instance_id: "llama".into(),
            write_session_id: w.write_session_id.clone(),
            success_blocks: Some(mpb::BlockMask {
                info: Some(mpb::block_mask::Info::Offset(4)),
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code_of(&r.header), mpb::ErrorCode::Ok);

    let q = mpb::GetCacheLocationRequest {
        instance_id: "llama".into(),
        query_type: mpb::QueryType::QtPrefixMatch as i32,
        block_keys: keys.clone(),
        ..Default::default()
    };
    let r = c.get_cache_location(q.clone()).await.unwrap().into_inner();
    assert_eq!(r.locations.len(), 4);
    // The HTTP answer to the same query is the same message.
    let (_, http) = post(
        ts.server.meta_http_addr(),
        "/api/getCacheLocation",
        &serde_json::to_value(&q).unwrap(),
        None,
    )
    .await;
    let from_http: mpb::GetCacheLocationResponse = serde_json::from_value(http).unwrap();
    assert_eq!(from_http.locations, r.locations);

    let r = c
        .get_cache_location_len(mpb::GetCacheLocationLenRequest {
            instance_id: "llama".into(),
            query_type: mpb::QueryType::QtBatchGet as i32,
            block_keys: vec![-1, 5],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.cache_location_len, 1);

    let r = c
        .get_cache_meta(mpb::GetCacheMetaRequest {
            instance_id: "llama".into(),
            block_keys: vec![i64::MIN],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.metas[0].contains("serving"), "{:?}", r.metas);

    let r = c
        .remove_cache(mpb::RemoveCacheRequest {
            instance_id: "llama".into(),
            block_keys: vec![i64::MIN],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code_of(&r.header), mpb::ErrorCode::Ok);
    let r = c.get_cache_location(q.clone()).await.unwrap().into_inner();
    assert!(r.locations.is_empty(), "prefix broken at block 0");

    let r = c
        .trim_cache(mpb::TrimCacheRequest {
            instance_id: "llama".into(),
            strategy: mpb::TrimStrategy::TsRemoveAllCache as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code_of(&r.header), mpb::ErrorCode::Ok);
    let r = c
        .get_cluster_info(mpb::GetClusterInfoRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.leader_endpoint.unwrap().meta_rpc_port,
        i32::from(ts.server.meta_grpc_addr().port())
    );
    let r = c
        .get_cache_location(mpb::GetCacheLocationRequest {
            instance_id: "ghost".into(),
            ..q
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code_of(&r.header), mpb::ErrorCode::InstanceNotExist);
    ts.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn admin_service_over_grpc_and_http() {
    let ts = start().await;
    let mut c = AdminServiceClient::connect(format!("http://{}", ts.server.admin_grpc_addr()))
        .await
        .unwrap();
    let storage = apb::StorageConfig {
        global_unique_name: "pool".into(),
        storage_spec: Some(apb::storage_config::StorageSpec::Nfs(apb::NfsStorageSpec {
            root_path: "/mnt/pool".into(),
            key_count_per_file: 0,
        })),
        check_storage_available_when_open: false,
    };
    let add = apb::AddStorageRequest {
        trace_id: "a".into(),
        storage: Some(storage.clone()),
    };
    let r = c.add_storage(add.clone()).await.unwrap().into_inner();
    assert_eq!(admin_code(&r.header), apb::ErrorCode::Ok);
    let r = c.add_storage(add).await.unwrap().into_inner();
    assert_eq!(admin_code(&r.header), apb::ErrorCode::DuplicateEntity);
    let r = c
        .list_storage(apb::ListStorageRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(r.storage.contains(&storage), "{:?}", r.storage);

    let group = apb::InstanceGroup {
        name: "pg".into(),
        storage_candidates: vec!["pool".into()],
        quota: Some(apb::InstanceGroupQuota {
            capacity: 1 << 30,
            quota_config: vec![],
        }),
        max_instance_count: 4,
        ..Default::default()
    };
    let r = c
        .create_instance_group(apb::CreateInstanceGroupRequest {
            trace_id: String::new(),
            instance_group: Some(group.clone()),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(admin_code(&r.header), apb::ErrorCode::Ok);
    let r = c
        .get_instance_group(apb::GetInstanceGroupRequest {
            trace_id: String::new(),
            name: "pg".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let got = r.instance_group.unwrap();
    assert_eq!(
        (got.quota.unwrap().capacity, got.max_instance_count),
        (1 << 30, 4)
    );

    // The admin HTTP listener sees the same catalog.
    let a = ts.server.admin_http_addr();
    let (st, r) = post(a, "/api/listInstanceGroup", &json!({}), None).await;
    assert_eq!(st, 200);
    let names: Vec<&str> = r["instance_group"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"pg"), "{r}");
    assert!(
        r["instance_group"][0]["quota"]["capacity"].is_string(),
        "int64 as string: {r}"
    );

    let (_, r) = post(
        a,
        "/api/registerInstance",
        &json!({"instance_group": "pg", "instance_id": "i1", "block_size": 4,
                "location_spec_infos": [{"name": "tp0", "size": 10}]}),
        None,
    )
    .await;
    assert_eq!(code(&r), "OK", "{r}");
    let (_, r) = post(
        a,
        "/api/listInstanceInfo",
        &json!({"instance_group_name": "pg"}),
        None,
    )
    .await;
    assert_eq!(r["instance_info"][0]["instance_id"], "i1");
    let (_, r) = post(a, "/api/removeInstanceGroup", &json!({"name": "pg"}), None).await;
    assert_eq!(code(&r), "INVALID_ARGUMENT", "in use: {r}");
    let (_, r) = post(
        a,
        "/api/removeInstance",
        &json!({"instance_id": "i1"}),
        None,
    )
    .await;
    assert_eq!(code(&r), "OK");
    let (_, r) = post(a, "/api/removeInstanceGroup", &json!({"name": "pg"}), None).await;
    assert_eq!(code(&r), "OK");

    let (_, r) = post(
        a,
        "/api/addAccount",
        &json!({"user_name": "ops", "password": "0123456789abcdef-ops", "role": "ROLE_ADMIN"}),
        None,
    )
    .await;
    assert_eq!(code(&r), "OK", "{r}");
    let (_, r) = post(a, "/api/listAccount", &json!({}), None).await;
    assert_eq!(
        r["accounts"],
        json!([{"user_name": "ops", "role": "ROLE_ADMIN", "allowed_groups": []}])
    );

    let snap = c
        .gen_config_snapshot(apb::GenConfigSnapshotRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(admin_code(&snap.header), apb::ErrorCode::Ok);
    assert!(snap.config_snapshot.contains("\"pool\""));
    let r = c
        .load_config_snapshot(apb::LoadConfigSnapshotRequest {
            trace_id: String::new(),
            config_snapshot: "{broken".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(admin_code(&r.header), apb::ErrorCode::InvalidArgument);
    let r = c
        .load_config_snapshot(apb::LoadConfigSnapshotRequest {
            trace_id: String::new(),
            config_snapshot: snap.config_snapshot,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(admin_code(&r.header), apb::ErrorCode::Ok);

    let h = c
        .check_health(apb::CheckHealthRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(h.is_health && h.is_leader);
    let m = c
        .get_metrics(apb::GetMetricsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let add_ok = m.metrics.iter().find(|d| {
        d.metric_name == "kvtier_meta_requests_total"
            && d.metric_tags
                .iter()
                .any(|t| t.tag_value == "admin.AddStorage")
            && d.metric_tags.iter().any(|t| t.tag_value == "OK")
    });
    assert_eq!(
        add_ok
            .and_then(|d| d.metric_value.clone())
            .and_then(|v| v.value),
        Some(apb::metric_value::Value::IntValue(1))
    );
    single_node_election(&mut c).await;
    ts.server.shutdown().await.unwrap();
}

/// Upstream's single-node election cases (`test_get_manager_cluster_info`,
/// `test_update_leader_elector_config`, `test_leader_demote`): a lone
/// server leads at once; a demotion with a campaign delay takes effect
/// before the answer and keeps it out; a follower refuses `LeaderDemote`.
async fn single_node_election(c: &mut AdminServiceClient<tonic::transport::Channel>) {
    let info = c
        .get_manager_cluster_info(apb::GetManagerClusterInfoRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        status_message(&info.header),
        "Manager cluster info retrieved"
    );
    assert_eq!(info.leader_node_id, info.self_node_id);
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    assert!(info.self_leader_expiration_time > now_us, "{info:?}");
    let cfg = c
        .get_leader_elector_config(apb::GetLeaderElectorConfigRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cfg.campaign_delay_time_ms, 0);
    assert_eq!(
        status_message(&cfg.header),
        "Leader elector config retrieved"
    );
    let r = c
        .update_leader_elector_config(apb::UpdateLeaderElectorConfigRequest {
            trace_id: "t".into(),
            campaign_delay_time_ms: 100_000,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status_message(&r.header), "Leader elector config updated");
    let cfg = c
        .get_leader_elector_config(apb::GetLeaderElectorConfigRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cfg.campaign_delay_time_ms, 100_000);

    let r = c
        .leader_demote(apb::LeaderDemoteRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(admin_code(&r.header), apb::ErrorCode::Ok);
    assert_eq!(status_message(&r.header), "Leader demote request accepted");
    let h = c
        .check_health(apb::CheckHealthRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(h.is_health && !h.is_leader, "{h:?}");
    assert!(h.elector_last_loop_time_ms > 0, "{h:?}");
    let info = c
        .get_manager_cluster_info(apb::GetManagerClusterInfoRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.self_leader_expiration_time, -1);
    assert!(info.leader_endpoint.is_none());
    let r = c
        .leader_demote(apb::LeaderDemoteRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(admin_code(&r.header), apb::ErrorCode::ServerNotLeader);
    assert_eq!(status_message(&r.header), "Server is not leader");
}

fn status_message(h: &Option<apb::CommonResponseHeader>) -> String {
    h.as_ref()
        .and_then(|h| h.status.as_ref())
        .map(|s| s.message.clone())
        .unwrap_or_default()
}
