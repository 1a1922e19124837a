//! API-key authentication and group isolation over both transports: a key
//! of one group can neither read, write, evict nor trim another group's
//! blocks, nor register into it; the admin listeners refuse user keys;
//! requests without a key get 401 / UNAUTHENTICATED. Refusals change
//! nothing.

#[path = "support/lib.rs"]
mod support;

use std::sync::Arc;

use kvtier_meta::proto::meta as mpb;
use kvtier_meta::proto::meta::meta_service_client::MetaServiceClient;
use kvtier_meta::{MemoryIndex, MetaConfig, Role};
use kvtier_server::{AuthMode, ServerConfig};
use serde_json::json;
use support::*;

const KEY_G: &str = "user-key-of-group-g-0123";
const KEY_H: &str = "user-key-of-group-h-4567";
const KEY_ADMIN: &str = "admin-key-0123456789abcdef";

async fn secured() -> TestServer {
    let svc = service(Arc::new(MemoryIndex::new()), MetaConfig::default(), None);
    svc.add_account("alice", Role::User, KEY_G, vec!["g".into()])
        .unwrap();
    svc.add_account("bob", Role::User, KEY_H, vec!["h".into()])
        .unwrap();
    svc.add_account("root", Role::Admin, KEY_ADMIN, vec![])
        .unwrap();
    let cfg = ServerConfig {
        auth: AuthMode::ApiKeys,
        ..ServerConfig::localhost_ephemeral()
    };
    start_with(svc, cfg).await
}

#[tokio::test]
async fn keys_are_confined_to_their_groups_over_http() {
    let ts = secured().await;
    let a = ts.server.meta_http_addr();

    // Alice registers and writes in g.
    let (_, r) = post(
        a,
        "/api/registerInstance",
        &register_body("ia", "g"),
        Some(KEY_G),
    )
    .await;
    assert_eq!(code(&r), "OK", "{r}");
    let (_, w) = post(
        a,
        "/api/startWriteCache",
        &json!({"instance_id": "ia", "block_keys": [1, 2]}),
        Some(KEY_G),
    )
    .await;
    assert_eq!(code(&w), "OK");
    let (_, r) = post(
        a,
        "/api/finishWriteCache",
        &json!({"instance_id": "ia", "write_session_id": w["write_session_id"], "success_blocks": {"offset": 2}}),
        Some(KEY_G),
    )
    .await;
    assert_eq!(code(&r), "OK");

    // Bob may not register into g, nor touch ia.
    let (st, r) = post(
        a,
        "/api/registerInstance",
        &register_body("ib", "g"),
        Some(KEY_H),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(code(&r), "INVALID_ARGUMENT");
    assert!(
        r["header"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("permission denied")
    );
    let q = json!({"instance_id": "ia", "query_type": "QT_BATCH_GET", "block_keys": [1, 2]});
    for (path, body) in [
        ("/api/getCacheLocation", q.clone()),
        ("/api/getCacheLocationLen", q.clone()),
        (
            "/api/getCacheMeta",
            json!({"instance_id": "ia", "block_keys": [1, 2]}),
        ),
        ("/api/getInstanceInfo", json!({"instance_id": "ia"})),
        (
            "/api/startWriteCache",
            json!({"instance_id": "ia", "block_keys": [3]}),
        ),
        (
            "/api/removeCache",
            json!({"instance_id": "ia", "block_keys": [1, 2]}),
        ),
        (
            "/api/trimCache",
            json!({"instance_id": "ia", "strategy": "TS_REMOVE_ALL_CACHE"}),
        ),
        (
            "/api/finishWriteCache",
            json!({"instance_id": "ia", "write_session_id": w["write_session_id"], "success_blocks": {"offset": 2}}),
        ),
    ] {
        let (st, r) = post(a, path, &body, Some(KEY_H)).await;
        assert_eq!(st, 200, "{path}");
        assert_eq!(code(&r), "INVALID_ARGUMENT", "{path}: {r}");
        assert!(
            r["header"]["status"]["message"]
                .as_str()
                .unwrap()
                .contains("permission denied"),
            "{path}: {r}"
        );
    }
    // Nothing changed: both blocks still served, no instance ib, no session.
    let (_, r) = post(a, "/api/getCacheLocationLen", &q, Some(KEY_G)).await;
    assert_eq!(r["cache_location_len"], "2");
    assert!(ts.svc.get_instance_info("ib").await.is_err());
    assert_eq!(ts.svc.open_sessions(), 0);

    // No key / wrong key: 401 with a JSON header.
    let (st, r) = post(a, "/api/getCacheLocation", &q, None).await;
    assert_eq!(st, 401);
    assert!(
        r["header"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("unauthenticated")
    );
    let (st, _) = post(
        a,
        "/api/getCacheLocation",
        &q,
        Some("wrong-key-wrong-key-0000"),
    )
    .await;
    assert_eq!(st, 401);
    // `x-api-key` works too.
    let (st, _, _) = http(
        a,
        "POST",
        "/api/getCacheLocation",
        &[("x-api-key", KEY_G)],
        q.to_string().into_bytes(),
    )
    .await;
    assert_eq!(st, 200);
    // An admin key may use every group.
    let (_, r) = post(a, "/api/getCacheLocationLen", &q, Some(KEY_ADMIN)).await;
    assert_eq!(r["cache_location_len"], "2");

    // The admin listener: user key 403, no key 401, admin key OK.
    let ad = ts.server.admin_http_addr();
    let (st, _) = post(ad, "/api/listStorage", &json!({}), Some(KEY_G)).await;
    assert_eq!(st, 403);
    let (st, _) = post(
        ad,
        "/api/addStorage",
        &json!({"storage": {"global_unique_name": "x", "nfs": {"root_path": "/x"}}}),
        Some(KEY_G),
    )
    .await;
    assert_eq!(st, 403);
    assert_eq!(
        ts.svc.list_storages().len(),
        1,
        "refused add changed nothing"
    );
    let (st, _) = post(ad, "/api/listStorage", &json!({}), None).await;
    assert_eq!(st, 401);
    let (st, _, _) = http(ad, "GET", "/metrics", &[], Vec::new()).await;
    assert_eq!(st, 401);
    let (st, r) = post(ad, "/api/listStorage", &json!({}), Some(KEY_ADMIN)).await;
    assert_eq!((st, code(&r)), (200, "OK"));
    ts.server.shutdown().await.unwrap();
}

fn with<T>(key: &str, msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    r
}

#[tokio::test]
async fn keys_are_checked_over_grpc() {
    let ts = secured().await;
    let mut c = MetaServiceClient::connect(format!("http://{}", ts.server.meta_grpc_addr()))
        .await
        .unwrap();
    let info = mpb::GetClusterInfoRequest::default();
    let e = c.get_cluster_info(info.clone()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);

    let reg = mpb::RegisterInstanceRequest {
        instance_group: "g".into(),
        instance_id: "ia".into(),
        block_size: 1,
        location_spec_infos: vec![mpb::LocationSpecInfo {
            name: "tp0".into(),
            size: 8,
        }],
        ..Default::default()
    };
    let r = c
        .register_instance(with(KEY_H, reg.clone()))
        .await
        .unwrap()
        .into_inner();
    let status = r.header.unwrap().status.unwrap();
    assert_eq!(status.code, mpb::ErrorCode::InvalidArgument as i32);
    assert!(status.message.contains("permission denied"));
    let r = c
        .register_instance(with(KEY_G, reg))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.header.unwrap().status.unwrap().code,
        mpb::ErrorCode::Ok as i32
    );

    let mut admin = kvtier_meta::proto::admin::admin_service_client::AdminServiceClient::connect(
        format!("http://{}", ts.server.admin_grpc_addr()),
    )
    .await
    .unwrap();
    let req = kvtier_meta::proto::admin::ListStorageRequest::default();
    let e = admin
        .list_storage(with(KEY_G, req.clone()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    let e = admin.list_storage(req.clone()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    assert!(admin.list_storage(with(KEY_ADMIN, req)).await.is_ok());
    ts.server.shutdown().await.unwrap();
}
