//! Starting and stopping: bound addresses, graceful shutdown, stop on
//! drop, and refused configurations.

#[path = "support/lib.rs"]
mod support;

use std::time::{Duration, Instant};

use kvtier_server::{MetaServer, ServerConfig, ServerError};
use support::*;

/// Polls (with a deadline) until nothing accepts on `addr`.
async fn wait_closed(addr: std::net::SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "{addr} still accepting");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn shutdown_and_drop_close_every_listener() {
    let ts = start().await;
    let addrs = [
        ts.server.meta_http_addr(),
        ts.server.meta_grpc_addr(),
        ts.server.admin_http_addr(),
        ts.server.admin_grpc_addr(),
    ];
    for a in addrs {
        assert_ne!(a.port(), 0);
        tokio::net::TcpStream::connect(a).await.expect("listening");
    }
    ts.server.shutdown().await.expect("clean shutdown");
    for a in addrs {
        wait_closed(a).await;
    }

    let ts = start().await;
    let a = ts.server.meta_http_addr();
    let (st, _, _) = http(a, "GET", "/health", &[], Vec::new()).await;
    assert_eq!(st, 200);
    drop(ts.server);
    wait_closed(a).await;
}

#[tokio::test]
async fn bad_configurations_are_refused() {
    let ts = start().await;
    let svc = ts.svc.clone();
    // A port already taken.
    let cfg = ServerConfig {
        meta_http: ts.server.meta_http_addr(),
        ..ServerConfig::localhost_ephemeral()
    };
    match MetaServer::start(svc.clone(), cfg).await {
        Err(ServerError::Bind { what, .. }) => assert_eq!(what, "meta http"),
        other => panic!("expected a bind error, got {other:?}"),
    }
    // One port for HTTP and gRPC.
    let same = "127.0.0.1:16382".parse().unwrap();
    let cfg = ServerConfig {
        meta_http: same,
        meta_grpc: same,
        ..ServerConfig::localhost_ephemeral()
    };
    assert!(matches!(
        MetaServer::start(svc, cfg).await,
        Err(ServerError::Config(_))
    ));
    ts.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_waits_for_requests_in_flight() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ts = start().await;
    let a = ts.server.meta_http_addr();
    // A request whose body is still arriving when shutdown starts.
    let mut conn = tokio::net::TcpStream::connect(a).await.unwrap();
    conn.write_all(
        b"POST /api/getClusterInfo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{",
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ts
        .server
        .metrics_text()
        .contains("kvtier_meta_in_flight_requests 1")
    {
        assert!(
            Instant::now() < deadline,
            "request never reached the server"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let shutdown = tokio::spawn(ts.server.shutdown());
    wait_closed(a).await;
    assert!(
        !shutdown.is_finished(),
        "shutdown returned with a request in flight"
    );
    conn.write_all(b"}").await.unwrap();
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"self_node_id\""), "{answer}");
    shutdown.await.unwrap().expect("clean shutdown");
}

/// A port nothing listens on right now (bound and released), for the
/// configurations that must name a fixed port.
fn free_port() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

#[tokio::test]
async fn admin_may_share_the_meta_listeners() {
    use kvtier_meta::proto::admin::{ListStorageRequest, admin_service_client::AdminServiceClient};
    use kvtier_meta::{MemoryIndex, MetaConfig, Role};
    use kvtier_server::AuthMode;
    use serde_json::json;

    let svc = service(
        std::sync::Arc::new(MemoryIndex::new()),
        MetaConfig::default(),
        None,
    );
    svc.add_account("u", Role::User, "user-key-0123456789", vec!["g".into()])
        .unwrap();
    svc.add_account("a", Role::Admin, "admin-key-0123456789", vec![])
        .unwrap();
    let (http_addr, grpc_addr) = (free_port(), free_port());
    let cfg = ServerConfig {
        meta_http: http_addr,
        admin_http: http_addr,
        meta_grpc: grpc_addr,
        admin_grpc: grpc_addr,
        auth: AuthMode::ApiKeys,
        ..ServerConfig::localhost_ephemeral()
    };
    let ts = start_with(svc, cfg).await;
    assert_eq!(ts.server.admin_http_addr(), ts.server.meta_http_addr());
    assert_eq!(ts.server.admin_grpc_addr(), ts.server.meta_grpc_addr());
    let a = ts.server.meta_http_addr();
    // Meta methods for the user, admin-only methods for the admin only.
    let (_, r) = post(
        a,
        "/api/registerInstance",
        &register_body("i", "g"),
        Some("user-key-0123456789"),
    )
    .await;
    assert_eq!(code(&r), "OK", "{r}");
    let (st, _) = post(
        a,
        "/api/listStorage",
        &json!({}),
        Some("user-key-0123456789"),
    )
    .await;
    assert_eq!(st, 403);
    let (st, r) = post(
        a,
        "/api/listStorage",
        &json!({}),
        Some("admin-key-0123456789"),
    )
    .await;
    assert_eq!((st, code(&r)), (200, "OK"));
    let (st, _, _) = http(
        a,
        "GET",
        "/metrics",
        &[("x-api-key", "admin-key-0123456789")],
        Vec::new(),
    )
    .await;
    assert_eq!(st, 200);
    let (_, _, doc) = http(a, "GET", "/openapi.json", &[], Vec::new()).await;
    let doc: serde_json::Value = serde_json::from_slice(&doc).unwrap();
    assert!(doc["paths"]["/api/getCacheLocation"].is_object());
    assert!(doc["paths"]["/api/addStorage"].is_object());

    let mut admin = AdminServiceClient::connect(format!("http://{}", ts.server.meta_grpc_addr()))
        .await
        .unwrap();
    let mut req = tonic::Request::new(ListStorageRequest::default());
    req.metadata_mut().insert(
        "authorization",
        "Bearer admin-key-0123456789".parse().unwrap(),
    );
    let r = admin.list_storage(req).await.unwrap().into_inner();
    assert_eq!(r.storage.len(), 1);
    ts.server.shutdown().await.unwrap();
}
