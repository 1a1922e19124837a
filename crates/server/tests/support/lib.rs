//! Shared by the server tests: a real server on 127.0.0.1 with free ports
//! over an in-memory (or redb) index, and a minimal HTTP/1 client.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use kvtier_meta::{
    EvictionPolicy, InstanceGroup, MemoryIndex, MetaConfig, MetaIndex, MetaService, Storage,
    StorageHealth, StorageKind,
};
use kvtier_server::{MetaServer, RunningServer, ServerConfig};
use serde_json::{Value, json};

/// A started server and the service under it.
pub struct TestServer {
    pub svc: Arc<MetaService>,
    pub server: RunningServer,
}

/// The storage every test group writes to.
pub fn storage(name: &str) -> Storage {
    Storage {
        name: name.into(),
        kind: StorageKind::FilePool,
        uri: format!("file:///mnt/{name}"),
        enabled: true,
        health: StorageHealth::Healthy,
        spec: None,
    }
}

/// A group on storage `nfs` with `quota` bytes.
pub fn group(name: &str, quota: u64) -> InstanceGroup {
    InstanceGroup {
        name: name.into(),
        quota_bytes: quota,
        kind_quota_bytes: Default::default(),
        watermark: 0.9,
        eviction: EvictionPolicy::Lru,
        storages: vec!["nfs".into()],
        max_instances: 16,
        ..Default::default()
    }
}

/// A service over `index` with storage `nfs` and groups `g` and `h`
/// (unlimited quota unless `quota` is given for `g`).
pub fn service(index: Arc<dyn MetaIndex>, cfg: MetaConfig, quota: Option<u64>) -> Arc<MetaService> {
    let svc = MetaService::new(index, cfg).expect("service");
    svc.add_storage(storage("nfs")).expect("storage");
    svc.create_group(group("g", quota.unwrap_or(1 << 40)))
        .expect("group g");
    svc.create_group(group("h", 1 << 40)).expect("group h");
    Arc::new(svc)
}

/// Starts a server on free localhost ports.
pub async fn start_with(svc: Arc<MetaService>, cfg: ServerConfig) -> TestServer {
    let server = MetaServer::start(svc.clone(), cfg)
        .await
        .expect("server starts");
    TestServer { svc, server }
}

/// A default server over a memory index.
pub async fn start() -> TestServer {
    let svc = service(Arc::new(MemoryIndex::new()), MetaConfig::default(), None);
    start_with(svc, ServerConfig::localhost_ephemeral()).await
}

/// One HTTP/1.1 exchange on a fresh connection.
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (u16, http::HeaderMap, Vec<u8>) {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::from(body))).expect("request");
    let resp = send.send_request(req).await.expect("response");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, headers, body.to_vec())
}

/// POSTs `body` as JSON, optionally with a bearer key; returns the status
/// and the parsed answer (`Null` if it is not JSON).
pub async fn post(addr: SocketAddr, path: &str, body: &Value, key: Option<&str>) -> (u16, Value) {
    let auth = key.map(|k| format!("Bearer {k}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(a) = &auth {
        headers.push(("authorization", a.as_str()));
    }
    let (status, _, bytes) =
        http(addr, "POST", path, &headers, body.to_string().into_bytes()).await;
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// `header.status.code` of an answer.
pub fn code(v: &Value) -> &str {
    v["header"]["status"]["code"].as_str().unwrap_or("<none>")
}

/// A registration body for instance `id` in `group` with one 64-byte spec.
pub fn register_body(id: &str, group: &str) -> Value {
    json!({
        "trace_id": "t-reg",
        "instance_group": group,
        "instance_id": id,
        "block_size": 2,
        "location_spec_infos": [{"name": "tp0", "size": 64}],
        "model_deployment": {"model_name": "llama", "dtype": "bf16", "tp_size": 1},
    })
}
