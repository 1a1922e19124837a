//! A full disk under a real server over the embedded index (redb on a real
//! tmpfs, filled to the last byte): writes are refused with
//! `SERVICE_NOT_READY` and a message naming the cause, acknowledged keys
//! stay readable, `/health` answers 503 with the reason, and once the
//! filler is deleted the same server writes again and reports healthy. A
//! server restarted on the full disk still serves every stored block.

#[path = "support/lib.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvtier_meta::proto::admin as apb;
use kvtier_meta::proto::admin::admin_service_client::AdminServiceClient;
use kvtier_meta::test_support::Tmpfs;
use kvtier_meta::{MetaConfig, MetaService, RedbIndex};
use kvtier_server::ServerConfig;
use serde_json::{Value, json};
use support::*;

/// How long the server may take to notice freed space (its index retries
/// at most every 5 s).
const RESUME_WITHIN: Duration = Duration::from_secs(30);

/// One two-phase write of `keys`; the first answer that is not OK, if any.
async fn write(a: SocketAddr, keys: &[i64]) -> Result<(), Value> {
    let (_, w) = post(
        a,
        "/api/startWriteCache",
        &json!({"instance_id": "llama", "block_keys": keys}),
        None,
    )
    .await;
    if code(&w) != "OK" {
        return Err(w);
    }
    let session = w["write_session_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let (_, f) = post(
        a,
        "/api/finishWriteCache",
        &json!({"instance_id": "llama", "write_session_id": session,
                "success_blocks": {"offset": keys.len()}}),
        None,
    )
    .await;
    if code(&f) != "OK" {
        return Err(f);
    }
    Ok(())
}

/// Every key of `keys` is a hit.
async fn assert_hits(a: SocketAddr, keys: &[i64]) {
    let q = json!({"instance_id": "llama", "query_type": "QT_BATCH_GET", "block_keys": keys});
    let (_, r) = post(a, "/api/getCacheLocation", &q, None).await;
    assert_eq!(code(&r), "OK", "{r}");
    let locs = r["locations"].as_array().expect("locations");
    assert_eq!(locs.len(), keys.len(), "{r}");
    for (k, l) in keys.iter().zip(locs) {
        assert_eq!(l["spec_size"], 1, "acknowledged block {k} is a miss: {r}");
    }
}

async fn health(a: SocketAddr) -> (u16, Value) {
    let (status, _, body) = http(a, "GET", "/health", &[], Vec::new()).await;
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// gRPC `CheckHealth`: `is_health` and the header's message.
async fn grpc_health(ts: &TestServer) -> (bool, String) {
    let mut c = AdminServiceClient::connect(format!("http://{}", ts.server.admin_grpc_addr()))
        .await
        .expect("grpc connect");
    let h = c
        .check_health(apb::CheckHealthRequest::default())
        .await
        .expect("CheckHealth answers")
        .into_inner();
    let message = h
        .header
        .and_then(|h| h.status)
        .map(|s| s.message)
        .unwrap_or_default();
    (h.is_health, message)
}

fn assert_refused(r: &Value) {
    assert_eq!(code(r), "SERVICE_NOT_READY", "{r}");
    let msg = r["header"]["status"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(msg.contains("metadata store cannot write"), "{r}");
    assert!(
        msg.to_lowercase().contains("no space left on device"),
        "{r}"
    );
}

async fn start_on(path: &std::path::Path, fresh: bool) -> TestServer {
    let index = Arc::new(RedbIndex::open(path, 1 << 20).expect("open the index"));
    let svc = if fresh {
        service(index, MetaConfig::default(), None)
    } else {
        Arc::new(MetaService::new(index, MetaConfig::default()).expect("service restarts"))
    };
    start_with(svc, ServerConfig::localhost_ephemeral()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_keeps_reads_reports_it_and_recovers() {
    let fs = Tmpfs::mount(8 << 20).expect("a tmpfs to fill (this test needs root)");
    let path = fs.path().join("meta.redb");
    let ts = start_on(&path, true).await;
    let a = ts.server.meta_http_addr();
    let (_, r) = post(
        a,
        "/api/registerInstance",
        &register_body("llama", "g"),
        None,
    )
    .await;
    assert_eq!(code(&r), "OK", "{r}");
    let mut acked: Vec<i64> = Vec::new();
    for k in 0..20 {
        write(a, &[k]).await.expect("write before the disk fills");
        acked.push(k);
    }
    assert_eq!(health(a).await.0, 200);

    fs.fill().expect("fill the file system");
    // redb may fit a few writes into pages it has; the disk runs out soon.
    let mut next = 1000i64;
    let refused = loop {
        assert!(next < 11_000, "no write was refused on a full disk");
        match write(a, &[next]).await {
            Ok(()) => acked.push(next),
            Err(r) => break r,
        }
        next += 1;
    };
    assert_refused(&refused);
    assert_hits(a, &acked).await;
    // Still full: still refused, the same way; removal too. (Key `next`
    // may be left writing by a refused finish: use fresh keys from here.)
    next += 1;
    let err = write(a, &[next]).await.expect_err("refused while full");
    assert_refused(&err);
    let rm = json!({"instance_id": "llama", "block_keys": [0]});
    let (_, r) = post(a, "/api/removeCache", &rm, None).await;
    assert_refused(&r);
    assert_hits(a, &acked).await;
    let (status, h) = health(a).await;
    assert_eq!(status, 503, "{h}");
    assert_eq!(h["healthy"], false, "{h}");
    let reason = h["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("metadata index read-only"), "{h}");
    assert!(
        reason.to_lowercase().contains("no space left on device"),
        "{h}"
    );
    let (is_health, why) = grpc_health(&ts).await;
    assert!(!is_health, "gRPC CheckHealth says healthy on a full disk");
    assert!(why.contains("metadata index read-only"), "{why}");
    // The background writers are refused the same way, and go on.
    assert_hits(a, &acked).await;
    let flush = ts
        .svc
        .flush_access()
        .expect_err("access statistics refused");
    assert_eq!(flush.code(), "STORE_UNWRITABLE", "{flush}");

    // Space comes back: the same server heals, with no restart.
    fs.free().expect("free the filler");
    let deadline = Instant::now() + RESUME_WITHIN;
    loop {
        let (status, h) = health(a).await;
        if status == 200 {
            assert_eq!(h["healthy"], true, "{h}");
            break;
        }
        assert!(Instant::now() < deadline, "health never recovered: {h}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    next += 1;
    assert_eq!(
        grpc_health(&ts).await,
        (true, "Health check completed".to_owned())
    );
    assert_hits(a, &acked).await;
    assert!(ts.svc.flush_access().expect("access statistics flushed") > 0);
    let pass = ts.svc.reclaim_once().await;
    assert!(pass.errors.is_empty(), "{:?}", pass.errors);
    write(a, &[next]).await.expect("writes resume");
    acked.push(next);
    let (_, r) = post(a, "/api/removeCache", &rm, None).await;
    assert_eq!(code(&r), "OK", "{r}");
    acked.retain(|&k| k != 0);
    assert_hits(a, &acked).await;

    // A restart on a full disk serves every stored block.
    ts.server.shutdown().await.expect("shutdown");
    drop(ts.svc);
    fs.fill().expect("fill the file system again");
    let ts = start_on(&path, false).await;
    let a = ts.server.meta_http_addr();
    assert_hits(a, &acked).await;
    let err = write(a, &[next + 1]).await.expect_err("refused while full");
    assert_refused(&err);
    assert_eq!(health(a).await.0, 503);
    ts.server.shutdown().await.expect("shutdown");
}
