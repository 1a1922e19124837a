//! Every meta method over HTTP/JSON against a real server, asserting the
//! wire shape of docs/meta-api.md §1.1 (snake_case names, 64-bit integers
//! as strings, enums by name, `header.status.code`), plus the transport's
//! refusals (404, 400 `{}`, 413, 415), health, metrics and OpenAPI.

#[path = "support/lib.rs"]
mod support;

use std::sync::Arc;

use kvtier_meta::{MemoryIndex, MetaConfig, RedbIndex};
use kvtier_server::ServerConfig;
use serde_json::{Value, json};
use support::*;

/// The whole meta API in the order a client uses it; shared by the memory
/// and redb runs.
async fn every_meta_method(ts: &TestServer) {
    let a = ts.server.meta_http_addr();

    let (st, r) = post(
        a,
        "/api/registerInstance",
        &register_body("llama", "g"),
        None,
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(code(&r), "OK", "{r}");
    assert_eq!(r["header"]["request_id"], "t-reg");
    assert_eq!(r["header"]["status"]["message"], "");
    assert_eq!(r["header"]["tracer_result"], "");
    let configs: Value = serde_json::from_str(r["storage_configs"].as_str().unwrap()).unwrap();
    assert_eq!(configs[0]["global_unique_name"], "nfs", "{configs}");
    assert_eq!(r["extra_info"], "");

    // Idempotent; a different identity is a duplicate.
    let (_, r) = post(
        a,
        "/api/RegisterInstance",
        &register_body("llama", "g"),
        None,
    )
    .await;
    assert_eq!(code(&r), "OK", "UpperCamel alias");
    let mut other = register_body("llama", "g");
    other["model_deployment"]["dtype"] = json!("fp8");
    let (_, r) = post(a, "/api/registerInstance", &other, None).await;
    assert_eq!(code(&r), "DUPLICATE_ENTITY");

    let (_, r) = post(
        a,
        "/api/getInstanceInfo",
        &json!({"instanceId": "llama"}),
        None,
    )
    .await;
    assert_eq!(code(&r), "OK");
    assert_eq!(r["instance_group"], "g");
    let info = &r["instance_info"];
    assert_eq!(info["block_size"], 2);
    assert_eq!(
        info["location_spec_infos"][0]["size"], "64",
        "int64 as string"
    );
    assert_eq!(info["model_deployment"]["dtype"], "bf16");
    assert_eq!(info["default_query_type"], "QT_UNSPECIFIED", "enum by name");
    let (_, r) = post(
        a,
        "/api/getInstanceInfo",
        &json!({"instance_id": "nope"}),
        None,
    )
    .await;
    assert_eq!(code(&r), "INSTANCE_NOT_EXIST");

    // Keys from tokens: [1..=6] in blocks of 2 -> three keys, full range.
    let tokens = json!([1, 2, 3, 4, 5, 6]);
    let (_, r) = post(
        a,
        "/api/startWriteCache",
        &json!({"trace_id": "w1", "instance_id": "llama", "token_ids": tokens}),
        None,
    )
    .await;
    assert_eq!(code(&r), "OK", "{r}");
    assert_eq!(r["block_mask"], json!({"offset": 0}));
    let locs = r["locations"].as_array().unwrap();
    assert_eq!(locs.len(), 3);
    assert_eq!(locs[0]["type"], "ST_NFS");
    assert_eq!(locs[0]["spec_size"], 1);
    assert_eq!(locs[0]["location_specs"][0]["name"], "tp0");
    assert!(
        locs[0]["location_specs"][0]["uri"]
            .as_str()
            .unwrap()
            .starts_with("file:///mnt/nfs/")
    );
    let session = r["write_session_id"].as_str().unwrap().to_owned();

    // Not readable before FinishWriteCache.
    let q = json!({"instance_id": "llama", "query_type": "QT_BATCH_GET", "token_ids": tokens});
    let (_, r) = post(a, "/api/getCacheLocation", &q, None).await;
    assert_eq!(code(&r), "OK");
    assert!(
        r["locations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["spec_size"] == 0)
    );

    // The first two succeed, the third fails.
    let (_, r) = post(
        a,
        "/api/finishWriteCache",
        &json!({"instance_id": "llama", "write_session_id": session, "success_blocks": {"offset": 2}}),
        None,
    )
    .await;
    assert_eq!(code(&r), "OK", "{r}");

    let (_, r) = post(a, "/api/getCacheLocation", &q, None).await;
    let locs = r["locations"].as_array().unwrap();
    assert_eq!(locs.len(), 3);
    assert_eq!(locs[0]["spec_size"], 1);
    assert_eq!(locs[1]["spec_size"], 1);
    assert_eq!(locs[2]["spec_size"], 0, "failed block is a miss");

    let mut prefix = q.clone();
    prefix["query_type"] = json!("QT_PREFIX_MATCH");
    let (_, r) = post(a, "/api/getCacheLocation", &prefix, None).await;
    assert_eq!(r["locations"].as_array().unwrap().len(), 2);
    prefix["block_mask"] = json!({"offset": 1});
    let (_, r) = post(a, "/api/getCacheLocation", &prefix, None).await;
    assert_eq!(r["locations"].as_array().unwrap().len(), 1, "{r}");
    let mut sw = q.clone();
    sw["query_type"] = json!("QT_REVERSE_ROLL_SW_MATCH");
    sw["sw_size"] = json!(2);
    let (_, r) = post(a, "/api/getCacheLocation", &sw, None).await;
    let hits: Vec<bool> = r["locations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["spec_size"] == 1)
        .collect();
    assert_eq!(hits, [true, true, false]);
    sw["sw_size"] = json!(9);
    let (_, r) = post(a, "/api/getCacheLocation", &sw, None).await;
    assert_eq!(code(&r), "INVALID_ARGUMENT");
    let mut mamba = q.clone();
    mamba["query_type"] = json!("QT_PREFIX_MATCH_WITH_MAMBA");
    let (_, r) = post(a, "/api/getCacheLocation", &mamba, None).await;
    assert_eq!(code(&r), "UNSUPPORTED");

    let mut len = q.clone();
    len["query_type"] = json!("QT_PREFIX_MATCH");
    let (_, r) = post(a, "/api/getCacheLocationLen", &len, None).await;
    assert_eq!(code(&r), "OK");
    assert_eq!(r["cache_location_len"], "2", "int64 as string");

    // Keys as strings and numbers, full signed range.
    let key = -8366447769517741626_i64;
    let (_, r) = post(
        a,
        "/api/getCacheMeta",
        &json!({"instance_id": "llama", "block_keys": [key.to_string(), 7], "detail_level": 1}),
        None,
    )
    .await;
    assert_eq!(code(&r), "OK", "{r}");
    let m0: Value = serde_json::from_str(r["metas"][0].as_str().unwrap()).unwrap();
    assert_eq!(m0["id"], key.to_string());
    assert_eq!(m0["status"], "serving");
    let m1: Value = serde_json::from_str(r["metas"][1].as_str().unwrap()).unwrap();
    assert_eq!(m1["status"], "not_found");

    // StartWriteCache again: the two stored blocks are marked.
    let (_, r) = post(
        a,
        "/api/startWriteCache",
        &json!({"instance_id": "llama", "token_ids": tokens}),
        None,
    )
    .await;
    assert_eq!(r["block_mask"], json!({"offset": 2}), "{r}");
    assert_eq!(r["locations"].as_array().unwrap().len(), 1);
    let s2 = r["write_session_id"].as_str().unwrap().to_owned();
    let (_, r) = post(
        a,
        "/api/finishWriteCache",
        &json!({"instance_id": "llama", "write_session_id": s2, "success_blocks": {"bool_masks": {"values": [true]}}}),
        None,
    )
    .await;
    assert_eq!(code(&r), "OK");
    let (_, r) = post(
        a,
        "/api/finishWriteCache",
        &json!({"instance_id": "llama", "write_session_id": s2}),
        None,
    )
    .await;
    assert_eq!(code(&r), "INVALID_ARGUMENT", "finished twice");
    // A session id that was never issued is refused, also for zero blocks,
    // and the message shows it in hex as sent.
    for never in ["00000000deadbeef-0", "00000000deadbeef-1"] {
        let (_, r) = post(
            a,
            "/api/finishWriteCache",
            &json!({"instance_id": "llama", "write_session_id": never, "success_blocks": {"offset": 0}}),
            None,
        )
        .await;
        assert_eq!(code(&r), "INVALID_ARGUMENT", "{never}: {r}");
        assert!(r.to_string().contains("deadbeef"), "{r}");
    }
    // A grant of nothing (every key stored) finishes once.
    let (_, r) = post(
        a,
        "/api/startWriteCache",
        &json!({"instance_id": "llama", "token_ids": [1, 2, 3, 4]}),
        None,
    )
    .await;
    assert_eq!(r["locations"].as_array().map(Vec::len), Some(0), "{r}");
    let empty = json!({"instance_id": "llama", "write_session_id": r["write_session_id"], "success_blocks": {"offset": 0}});
    let (_, r) = post(a, "/api/finishWriteCache", &empty, None).await;
    assert_eq!(code(&r), "OK", "{r}");
    let (_, r) = post(a, "/api/finishWriteCache", &empty, None).await;
    assert_eq!(code(&r), "INVALID_ARGUMENT", "empty session finished twice");

    // RemoveCache keeps the marked block 0.
    let (_, r) = post(
        a,
        "/api/removeCache",
        &json!({"instance_id": "llama", "token_ids": tokens, "block_mask": {"bool_masks": {"values": [true, false, false]}}}),
        None,
    )
    .await;
    assert_eq!(code(&r), "OK");
    let (_, r) = post(a, "/api/getCacheLocation", &q, None).await;
    let hits: Vec<bool> = r["locations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["spec_size"] == 1)
        .collect();
    assert_eq!(hits, [true, false, false]);

    let (_, r) = post(
        a,
        "/api/trimCache",
        &json!({"instance_id": "llama", "strategy": "TS_REMOVE_ALL_CACHE"}),
        None,
    )
    .await;
    assert_eq!(code(&r), "OK");
    let (_, r) = post(a, "/api/getCacheLocationLen", &len, None).await;
    assert_eq!(r["cache_location_len"], "0");
    let (_, r) = post(a, "/api/trimCache", &json!({"instance_id": "llama"}), None).await;
    assert_eq!(code(&r), "INVALID_ARGUMENT", "TS_UNSPECIFIED");

    let (_, r) = post(a, "/api/getClusterInfo", &json!({}), None).await;
    assert_eq!(code(&r), "OK");
    assert_eq!(r["self_node_id"], r["leader_node_id"]);
    assert_eq!(
        r["leader_endpoint"]["meta_http_port"],
        ts.server.meta_http_addr().port()
    );
}

#[tokio::test]
async fn every_meta_method_round_trips_over_http() {
    let ts = start().await;
    every_meta_method(&ts).await;
    ts.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn every_meta_method_round_trips_over_http_on_redb() {
    let dir = tempfile::tempdir().unwrap();
    let index = RedbIndex::open(dir.path().join("meta.redb"), 8 << 20).unwrap();
    let svc = service(Arc::new(index), MetaConfig::default(), None);
    let ts = start_with(svc, ServerConfig::localhost_ephemeral()).await;
    every_meta_method(&ts).await;
    ts.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn malformed_wrong_and_oversized_requests_are_refused_and_change_nothing() {
    let svc = service(Arc::new(MemoryIndex::new()), MetaConfig::default(), None);
    let cfg = ServerConfig {
        max_body_bytes: 4096,
        ..ServerConfig::localhost_ephemeral()
    };
    let ts = start_with(svc, cfg).await;
    let a = ts.server.meta_http_addr();
    let reg = |body: &Value| body.to_string().into_bytes();
    let json_ct = [("content-type", "application/json")];

    // Not JSON, wrong JSON types, empty body: 400 with `{}`.
    for body in [
        b"{not json".to_vec(),
        br#"{"instance_id": 5}"#.to_vec(),
        br#"{"block_size": "x"}"#.to_vec(),
        Vec::new(),
    ] {
        let (st, _, b) = http(a, "POST", "/api/registerInstance", &json_ct, body).await;
        assert_eq!(st, 400);
        assert_eq!(b, b"{}");
    }
    // Unknown method and path: 404.
    let (st, _, _) = http(a, "POST", "/api/reportEvent", &json_ct, b"{}".to_vec()).await;
    assert_eq!(st, 404);
    let (st, _, _) = http(a, "GET", "/nothing/here", &[], Vec::new()).await;
    assert_eq!(st, 404);
    // Not JSON by content type: 415.
    let (st, _, b) = http(
        a,
        "POST",
        "/api/registerInstance",
        &[("content-type", "application/grpc")],
        reg(&register_body("x", "g")),
    )
    .await;
    assert_eq!(st, 415);
    assert!(String::from_utf8_lossy(&b).contains("JSON"));
    // Oversized: 413 with a message, by declared length and by streaming.
    let mut big = register_body("big", "g");
    big["model_deployment"]["extra"] = json!("x".repeat(8192));
    let (st, _, b) = http(a, "POST", "/api/registerInstance", &json_ct, reg(&big)).await;
    assert_eq!(st, 413);
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert!(
        v["header"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("4096"),
        "{v}"
    );
    // Unknown fields are ignored; lowerCamel accepted.
    let mut extra = register_body("ok", "g");
    extra["some_future_field"] = json!({"x": 1});
    let mut extra = extra.as_object().unwrap().clone();
    extra.remove("block_size");
    extra.insert("blockSize".into(), json!(2));
    let extra = Value::Object(extra);
    let (st, r) = post(a, "/api/registerInstance", &extra, None).await;
    assert_eq!((st, code(&r)), (200, "OK"), "{r}");
    // A curl-style form content type is read as JSON.
    let (st, _, _) = http(
        a,
        "POST",
        "/api/getInstanceInfo",
        &[("content-type", "application/x-www-form-urlencoded")],
        br#"{"instance_id":"ok"}"#.to_vec(),
    )
    .await;
    assert_eq!(st, 200);

    // Only the accepted registration happened.
    let ids: Vec<String> = ts
        .svc
        .list_instances(None)
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(ids, ["ok"]);
    ts.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn health_metrics_and_openapi_are_served() {
    let ts = start().await;
    let (m, ad) = (ts.server.meta_http_addr(), ts.server.admin_http_addr());
    for a in [m, ad] {
        let (st, _, b) = http(a, "GET", "/health", &[], Vec::new()).await;
        assert_eq!(st, 200);
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["healthy"], true);
    }
    let (_, _, b) = http(m, "GET", "/openapi.json", &[], Vec::new()).await;
    let doc: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["paths"]["/api/getCacheLocation"]["post"].is_object());
    let (_, _, b) = http(ad, "GET", "/openapi.json", &[], Vec::new()).await;
    let doc: Value = serde_json::from_slice(&b).unwrap();
    assert!(doc["paths"]["/api/addStorage"]["post"].is_object());

    post(
        m,
        "/api/registerInstance",
        &register_body("llama", "g"),
        None,
    )
    .await;
    post(
        m,
        "/api/getInstanceInfo",
        &json!({"instance_id": "missing"}),
        None,
    )
    .await;
    let (st, _, b) = http(ad, "GET", "/metrics", &[], Vec::new()).await;
    assert_eq!(st, 200);
    let text = String::from_utf8(b).unwrap();
    assert!(
        text.contains(r#"kvtier_meta_requests_total{method="RegisterInstance",code="OK"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"method="GetInstanceInfo",code="INSTANCE_NOT_EXIST"} 1"#));
    assert!(text.contains("kvtier_meta_request_duration_seconds_bucket"));
    assert!(text.contains("kvtier_meta_in_flight_requests"));
    assert!(
        text.contains(r#"kvtier_meta_group_instances{group="g"} 1"#),
        "{text}"
    );
    // The meta listener has no /metrics.
    let (st, _, _) = http(m, "GET", "/metrics", &[], Vec::new()).await;
    assert_eq!(st, 404);
    ts.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn requests_over_the_key_limit_are_refused() {
    let cfg = MetaConfig {
        max_keys: 4,
        ..MetaConfig::default()
    };
    let svc = service(Arc::new(MemoryIndex::new()), cfg, None);
    let ts = start_with(svc, ServerConfig::localhost_ephemeral()).await;
    let a = ts.server.meta_http_addr();
    post(
        a,
        "/api/registerInstance",
        &register_body("llama", "g"),
        None,
    )
    .await;
    let (st, r) = post(
        a,
        "/api/startWriteCache",
        &json!({"instance_id": "llama", "block_keys": [1, 2, 3, 4, 5]}),
        None,
    )
    .await;
    assert_eq!((st, code(&r)), (200, "INVALID_ARGUMENT"));
    assert!(
        r["header"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 4"),
        "{r}"
    );
    assert_eq!(ts.svc.open_sessions().unwrap(), 0);
    ts.server.shutdown().await.unwrap();
}
