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
use kvtier_meta::{BlockKey, MemoryIndex, MetaConfig, Role};
use kvtier_server::{AuthMode, MetaServer, ServerConfig, ServerError};
use serde_json::{Value, json};
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
    assert_eq!(ts.svc.open_sessions().unwrap(), 0);

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

// ---------------------------------------------------------------------------
// Accounts scoped through the admin API, refused across groups on every
// meta method (the list comes from the server's method table).
// ---------------------------------------------------------------------------

const KEY_ALICE: &str = "alice-key-scoped-to-g-0123";
const KEY_BOB: &str = "bob-key-scoped-to-h-456789";

/// Which transport a scenario runs over.
#[derive(Debug, Clone, Copy)]
enum Transport {
    Http,
    Grpc,
}

/// A server with auth on, groups `g` and `h`, and only the admin account;
/// user accounts are created through the admin API by each test.
async fn admin_only() -> TestServer {
    let svc = service(Arc::new(MemoryIndex::new()), MetaConfig::default(), None);
    svc.add_account("root", Role::Admin, KEY_ADMIN, vec![])
        .unwrap();
    let cfg = ServerConfig {
        auth: AuthMode::ApiKeys,
        ..ServerConfig::localhost_ephemeral()
    };
    start_with(svc, cfg).await
}

/// `(code name, message)` of a reply header.
fn status_of(code: i32, message: String) -> (String, String) {
    let name = mpb::ErrorCode::try_from(code).map_or("?", |c| c.as_str_name());
    (name.to_owned(), message)
}

/// Calls admin `rpc` with a JSON request as the admin, over `t`.
async fn admin_call(ts: &TestServer, t: Transport, rpc: &str, body: Value) -> (String, String) {
    use kvtier_meta::proto::admin as apb;
    use kvtier_meta::proto::admin::admin_service_client::AdminServiceClient;
    match t {
        Transport::Http => {
            let path = format!("/api/{}", kvtier_server::lower_camel(rpc));
            let (st, r) = post(ts.server.admin_http_addr(), &path, &body, Some(KEY_ADMIN)).await;
            assert_eq!(st, 200, "{rpc}: {r}");
            let msg = r["header"]["status"]["message"].as_str().unwrap_or("");
            (code(&r).to_owned(), msg.to_owned())
        }
        Transport::Grpc => {
            let mut c =
                AdminServiceClient::connect(format!("http://{}", ts.server.admin_grpc_addr()))
                    .await
                    .unwrap();
            let r = match rpc {
                "AddAccount" => {
                    c.add_account(with(
                        KEY_ADMIN,
                        serde_json::from_value::<apb::AddAccountRequest>(body).unwrap(),
                    ))
                    .await
                }
                "SetAccountGroups" => {
                    c.set_account_groups(with(
                        KEY_ADMIN,
                        serde_json::from_value::<apb::SetAccountGroupsRequest>(body).unwrap(),
                    ))
                    .await
                }
                other => panic!("admin_call: no gRPC case for {other}"),
            };
            let st = r.unwrap().into_inner().header.unwrap().status.unwrap();
            status_of(st.code, st.message)
        }
    }
}

/// Calls meta `rpc` with a JSON request and `key`, over `t`; returns the
/// reply's code name and message.
async fn meta_call(
    ts: &TestServer,
    t: Transport,
    rpc: &str,
    key: &str,
    body: Value,
) -> (String, String) {
    match t {
        Transport::Http => {
            let path = format!("/api/{}", kvtier_server::lower_camel(rpc));
            let (st, r) = post(ts.server.meta_http_addr(), &path, &body, Some(key)).await;
            assert_eq!(st, 200, "{rpc}: {r}");
            let msg = r["header"]["status"]["message"].as_str().unwrap_or("");
            (code(&r).to_owned(), msg.to_owned())
        }
        Transport::Grpc => grpc_meta_call(ts, rpc, key, body).await,
    }
}

async fn grpc_meta_call(ts: &TestServer, rpc: &str, key: &str, body: Value) -> (String, String) {
    let mut c = MetaServiceClient::connect(format!("http://{}", ts.server.meta_grpc_addr()))
        .await
        .unwrap();
    macro_rules! call {
        ($method:ident, $req:ty) => {{
            let req: $req = serde_json::from_value(body).expect("request JSON");
            let r = c.$method(with(key, req)).await.expect("gRPC reply");
            let st = r.into_inner().header.unwrap().status.unwrap();
            status_of(st.code, st.message)
        }};
    }
    match rpc {
        "RegisterInstance" => call!(register_instance, mpb::RegisterInstanceRequest),
        "GetInstanceInfo" => call!(get_instance_info, mpb::GetInstanceInfoRequest),
        "GetCacheMeta" => call!(get_cache_meta, mpb::GetCacheMetaRequest),
        "GetCacheLocation" => call!(get_cache_location, mpb::GetCacheLocationRequest),
        "GetCacheLocationLen" => call!(get_cache_location_len, mpb::GetCacheLocationLenRequest),
        "StartWriteCache" => call!(start_write_cache, mpb::StartWriteCacheRequest),
        "FinishWriteCache" => call!(finish_write_cache, mpb::FinishWriteCacheRequest),
        "RemoveCache" => call!(remove_cache, mpb::RemoveCacheRequest),
        "TrimCache" => call!(trim_cache, mpb::TrimCacheRequest),
        "GetClusterInfo" => call!(get_cluster_info, mpb::GetClusterInfoRequest),
        other => panic!("no gRPC call for meta method {other}: add it here"),
    }
}

/// What a key scoped to `g` sends to reach group `h`'s instance `ib` and
/// its open session `bob_session`, for meta method `rpc`: every request it
/// has, each of which must be refused. `None`: the method touches no group.
fn cross_group_requests(rpc: &str, bob_session: &Value) -> Option<Vec<Value>> {
    let keys = json!({"instance_id": "ib", "block_keys": [1, 2]});
    let query = json!({"instance_id": "ib", "query_type": "QT_BATCH_GET", "block_keys": [1, 2]});
    Some(match rpc {
        "RegisterInstance" => vec![register_body("intruder", "h")],
        "GetInstanceInfo" => vec![json!({"instance_id": "ib"})],
        "GetCacheMeta" => vec![keys],
        "GetCacheLocation" | "GetCacheLocationLen" => vec![query],
        "StartWriteCache" => vec![json!({"instance_id": "ib", "block_keys": [7]})],
        "FinishWriteCache" => vec![json!({
            "instance_id": "ib",
            "write_session_id": bob_session,
            "success_blocks": {"offset": 1},
        })],
        "RemoveCache" => vec![keys],
        "TrimCache" => vec![json!({"instance_id": "ib", "strategy": "TS_REMOVE_ALL_CACHE"})],
        "GetClusterInfo" => return None,
        other => panic!("no cross-group case for meta method {other}: add one"),
    })
}

/// Everything of group `h` a refused call could have changed.
async fn state_of_h(ts: &TestServer) -> String {
    let keys: Vec<BlockKey> = (1..=3).map(BlockKey).collect();
    format!(
        "{:?} {:?} {:?} sessions={} instances={:?}",
        ts.svc.get_instance_info("ib").await,
        ts.svc.get_cache_meta("ib", &keys).await,
        ts.svc.group_usage("h").unwrap(),
        ts.svc.open_sessions().unwrap(),
        ts.svc.get_instance_info("intruder").await.is_ok(),
    )
}

async fn scoped_keys_are_refused_across_groups(t: Transport) {
    let ts = admin_only().await;
    // Accounts scoped through the admin API: alice at creation, bob after.
    let add = |name: &str, key: &str, groups: Value| json!({"user_name": name, "password": key, "role": "ROLE_USER", "allowed_groups": groups});
    let r = admin_call(&ts, t, "AddAccount", add("alice", KEY_ALICE, json!(["g"]))).await;
    assert_eq!(r.0, "OK", "{r:?}");
    let r = admin_call(&ts, t, "AddAccount", add("bob", KEY_BOB, json!([]))).await;
    assert_eq!(r.0, "OK", "{r:?}");
    let r = admin_call(
        &ts,
        t,
        "SetAccountGroups",
        json!({"user_name": "bob", "allowed_groups": ["h"]}),
    )
    .await;
    assert_eq!(r.0, "OK", "{r:?}");

    // Bob's instance in h: blocks 1 and 2 stored, block 3 being written.
    let ok = |r: (String, String)| assert_eq!(r.0, "OK", "{r:?}");
    ok(meta_call(
        &ts,
        t,
        "RegisterInstance",
        KEY_BOB,
        register_body("ib", "h"),
    )
    .await);
    let (_, w) = post(
        ts.server.meta_http_addr(),
        "/api/startWriteCache",
        &json!({"instance_id": "ib", "block_keys": [1, 2]}),
        Some(KEY_BOB),
    )
    .await;
    let finish = json!({"instance_id": "ib", "write_session_id": w["write_session_id"], "success_blocks": {"offset": 2}});
    ok(meta_call(&ts, t, "FinishWriteCache", KEY_BOB, finish).await);
    let (_, open) = post(
        ts.server.meta_http_addr(),
        "/api/startWriteCache",
        &json!({"instance_id": "ib", "block_keys": [3]}),
        Some(KEY_BOB),
    )
    .await;
    assert_eq!(code(&open), "OK", "{open}");
    let bob_session = open["write_session_id"].clone();
    // Alice's own instance in g.
    ok(meta_call(
        &ts,
        t,
        "RegisterInstance",
        KEY_ALICE,
        register_body("ia", "g"),
    )
    .await);

    let before = state_of_h(&ts).await;
    for rpc in kvtier_server::META_RPCS {
        let Some(requests) = cross_group_requests(rpc, &bob_session) else {
            // GetClusterInfo names no instance or group: any key may ask.
            ok(meta_call(&ts, t, rpc, KEY_ALICE, json!({})).await);
            continue;
        };
        for body in requests {
            let (code, message) = meta_call(&ts, t, rpc, KEY_ALICE, body.clone()).await;
            assert_eq!(code, "INVALID_ARGUMENT", "{t:?} {rpc} {body}: {message}");
            assert!(
                message.contains("permission denied")
                    && message.contains("may not use instance group \"h\""),
                "{t:?} {rpc}: {message}"
            );
        }
    }
    // Bob's session named through alice's own instance is not hers to end.
    let steal = json!({"instance_id": "ia", "write_session_id": bob_session, "success_blocks": {"offset": 1}});
    let r = meta_call(&ts, t, "FinishWriteCache", KEY_ALICE, steal).await;
    assert_ne!(r.0, "OK", "{t:?}: alice finished bob's session: {r:?}");
    assert_eq!(
        state_of_h(&ts).await,
        before,
        "{t:?}: a refused call changed group h"
    );

    // Bob still owns everything: his session finishes, his blocks serve.
    let finish = json!({"instance_id": "ib", "write_session_id": bob_session, "success_blocks": {"offset": 1}});
    ok(meta_call(&ts, t, "FinishWriteCache", KEY_BOB, finish).await);
    let len = json!({"instance_id": "ib", "query_type": "QT_BATCH_GET", "block_keys": [1, 2, 3]});
    let (_, r) = post(
        ts.server.meta_http_addr(),
        "/api/getCacheLocationLen",
        &len,
        Some(KEY_BOB),
    )
    .await;
    assert_eq!(r["cache_location_len"], "3", "{r}");
    ts.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn every_meta_method_refuses_a_key_of_another_group_over_http() {
    scoped_keys_are_refused_across_groups(Transport::Http).await;
}

#[tokio::test]
async fn every_meta_method_refuses_a_key_of_another_group_over_grpc() {
    scoped_keys_are_refused_across_groups(Transport::Grpc).await;
}

/// A user account given no groups (as Tair KVCM's `AddAccount` makes it)
/// reaches nothing; `"*"` grants every group; unknown groups are refused.
async fn unscoped_users_reach_no_group(t: Transport) {
    let ts = admin_only().await;
    let tair_style = json!({"user_name": "carol", "password": KEY_G, "role": "ROLE_USER"});
    let r = admin_call(&ts, t, "AddAccount", tair_style).await;
    assert_eq!(r.0, "OK", "{r:?}");
    let svc = &ts.svc;
    let r = meta_call(
        &ts,
        t,
        "RegisterInstance",
        KEY_ADMIN,
        register_body("ih", "h"),
    )
    .await;
    assert_eq!(r.0, "OK", "{r:?}");
    for (rpc, body) in [
        ("RegisterInstance", register_body("ic", "g")),
        ("RegisterInstance", register_body("ic", "default")),
        ("GetInstanceInfo", json!({"instance_id": "ih"})),
    ] {
        let (code, message) = meta_call(&ts, t, rpc, KEY_G, body).await;
        assert_eq!(code, "INVALID_ARGUMENT", "{t:?} {rpc}: {message}");
        assert!(
            message.contains("allowed no instance group") && message.contains("SetAccountGroups"),
            "{t:?} {rpc}: {message}"
        );
    }
    assert!(
        svc.get_instance_info("ic").await.is_err(),
        "refused register changed nothing"
    );

    // Unknown groups are refused and change nothing.
    let r = admin_call(
        &ts,
        t,
        "SetAccountGroups",
        json!({"user_name": "carol", "allowed_groups": ["nope"]}),
    )
    .await;
    assert_eq!(r.0, "INVALID_ARGUMENT", "{r:?}");
    let bad = json!({"user_name": "dave", "password": KEY_H, "role": "ROLE_USER", "allowed_groups": ["nope"]});
    assert_eq!(
        admin_call(&ts, t, "AddAccount", bad).await.0,
        "INVALID_ARGUMENT"
    );
    let r = admin_call(
        &ts,
        t,
        "SetAccountGroups",
        json!({"user_name": "nobody", "allowed_groups": ["g"]}),
    )
    .await;
    assert_ne!(r.0, "OK", "{r:?}");
    let accounts = svc.list_accounts();
    assert_eq!(
        accounts.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(),
        ["carol", "root"]
    );
    assert!(accounts[0].allowed_groups.is_empty());

    // "*": every group, present ones included.
    let r = admin_call(
        &ts,
        t,
        "SetAccountGroups",
        json!({"user_name": "carol", "allowed_groups": ["*"]}),
    )
    .await;
    assert_eq!(r.0, "OK", "{r:?}");
    for (rpc, body) in [
        ("RegisterInstance", register_body("ic", "g")),
        ("GetInstanceInfo", json!({"instance_id": "ih"})),
    ] {
        let r = meta_call(&ts, t, rpc, KEY_G, body).await;
        assert_eq!(r.0, "OK", "{t:?} {rpc}: {r:?}");
    }
    // Granted groups are listed; never keys.
    let (_, list) = post(
        ts.server.admin_http_addr(),
        "/api/listAccount",
        &json!({}),
        Some(KEY_ADMIN),
    )
    .await;
    assert_eq!(
        list["accounts"][0]["allowed_groups"],
        json!(["*"]),
        "{list}"
    );
    assert!(!list.to_string().contains(KEY_G));
    // Taken away again: refused at once.
    let r = admin_call(
        &ts,
        t,
        "SetAccountGroups",
        json!({"user_name": "carol", "allowed_groups": []}),
    )
    .await;
    assert_eq!(r.0, "OK", "{r:?}");
    let r = meta_call(
        &ts,
        t,
        "GetInstanceInfo",
        KEY_G,
        json!({"instance_id": "ih"}),
    )
    .await;
    assert_eq!(r.0, "INVALID_ARGUMENT", "{r:?}");
    ts.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn unscoped_users_reach_no_group_over_http() {
    unscoped_users_reach_no_group(Transport::Http).await;
}

#[tokio::test]
async fn unscoped_users_reach_no_group_over_grpc() {
    unscoped_users_reach_no_group(Transport::Grpc).await;
}

// ---------------------------------------------------------------------------
// Where the listeners bind.
// ---------------------------------------------------------------------------

#[test]
fn the_default_config_binds_loopback() {
    let cfg = ServerConfig::default();
    for a in [cfg.meta_http, cfg.meta_grpc, cfg.admin_http, cfg.admin_grpc] {
        assert!(a.ip().is_loopback(), "{a}");
    }
    assert_eq!(cfg.auth, AuthMode::Disabled);
    assert!(!cfg.allow_unauthenticated_remote);
}

#[tokio::test]
async fn open_remote_listeners_are_refused_unless_allowed() {
    let svc = service(Arc::new(MemoryIndex::new()), MetaConfig::default(), None);
    let any = std::net::SocketAddr::from(([0, 0, 0, 0], 0));
    let open = ServerConfig {
        meta_http: any,
        ..ServerConfig::localhost_ephemeral()
    };
    let Err(e) = MetaServer::start(svc.clone(), open.clone()).await else {
        panic!("an open server on 0.0.0.0 started");
    };
    assert!(
        matches!(
            e,
            ServerError::UnauthenticatedRemote {
                what: "meta http",
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("allow_unauthenticated_remote"),
        "{e}"
    );

    // With API keys, or with the explicit setting, it starts.
    for cfg in [
        ServerConfig {
            auth: AuthMode::ApiKeys,
            ..open.clone()
        },
        ServerConfig {
            allow_unauthenticated_remote: true,
            ..open.clone()
        },
    ] {
        let s = MetaServer::start(svc.clone(), cfg).await.expect("starts");
        assert!(s.meta_http_addr().ip().is_unspecified());
        s.shutdown().await.unwrap();
    }
}
