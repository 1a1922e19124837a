//! Two-phase writes over the wire: many concurrent HTTP clients on
//! overlapping keys, session-timeout reclaim, and quota refusal.

#[path = "support/lib.rs"]
mod support;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvtier_meta::{MemoryIndex, MetaConfig};
use kvtier_server::ServerConfig;
use serde_json::{Value, json};
use support::*;

/// Indices marked by a wire mask over `n` positions.
fn marked(mask: &Value, n: usize) -> Vec<bool> {
    if let Some(o) = mask.get("offset") {
        let o = o.as_u64().unwrap() as usize;
        return (0..n).map(|i| i < o).collect();
    }
    mask["bool_masks"]["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_bool().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_never_share_a_grant_and_lose_nothing() {
    let ts = start().await;
    let a = ts.server.meta_http_addr();
    let (_, r) = post(
        a,
        "/api/registerInstance",
        &register_body("llama", "g"),
        None,
    )
    .await;
    assert_eq!(code(&r), "OK");

    const KEYS: i64 = 128;
    let grants: Arc<Mutex<HashMap<i64, usize>>> = Arc::default();
    let touched: Arc<Mutex<BTreeSet<i64>>> = Arc::default();
    let mut tasks = Vec::new();
    for t in 0..16i64 {
        let grants = grants.clone();
        let touched = touched.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..8i64 {
                // Overlapping batches: every key is wanted by several tasks.
                let batch: Vec<i64> = (0..16)
                    .map(|j| (t * 7 + round * 13 + j) % KEYS - KEYS / 2)
                    .collect();
                touched.lock().unwrap().extend(batch.iter().copied());
                let (_, w) = post(
                    a,
                    "/api/startWriteCache",
                    &json!({"instance_id": "llama", "block_keys": batch}),
                    None,
                )
                .await;
                assert_eq!(code(&w), "OK", "{w}");
                let skip = marked(&w["block_mask"], batch.len());
                let mine: Vec<i64> = batch
                    .iter()
                    .zip(&skip)
                    .filter(|(_, s)| !**s)
                    .map(|(k, _)| *k)
                    .collect();
                assert_eq!(mine.len(), w["locations"].as_array().unwrap().len());
                {
                    let mut g = grants.lock().unwrap();
                    for k in &mine {
                        let n = g.entry(*k).or_default();
                        *n += 1;
                        assert_eq!(*n, 1, "key {k} granted twice");
                    }
                }
                if !mine.is_empty() {
                    // Granted but unfinished: nobody is served these.
                    let (_, r) = post(
                        a,
                        "/api/getCacheLocationLen",
                        &json!({"instance_id": "llama", "query_type": "QT_BATCH_GET", "block_keys": mine}),
                        None,
                    )
                    .await;
                    assert_eq!(r["cache_location_len"], "0", "served before finish");
                }
                let (_, f) = post(
                    a,
                    "/api/finishWriteCache",
                    &json!({"instance_id": "llama", "write_session_id": w["write_session_id"],
                            "success_blocks": {"offset": mine.len()}}),
                    None,
                )
                .await;
                assert_eq!(code(&f), "OK", "{f}");
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer task");
    }
    let touched: Vec<i64> = touched.lock().unwrap().iter().copied().collect();
    let granted: BTreeSet<i64> = grants.lock().unwrap().keys().copied().collect();
    assert_eq!(
        granted,
        touched.iter().copied().collect(),
        "every wanted key written once"
    );
    let (_, r) = post(
        a,
        "/api/getCacheLocationLen",
        &json!({"instance_id": "llama", "query_type": "QT_BATCH_GET", "block_keys": touched}),
        None,
    )
    .await;
    assert_eq!(
        r["cache_location_len"],
        touched.len().to_string(),
        "none lost"
    );
    assert_eq!(ts.svc.open_sessions().unwrap(), 0);
    ts.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn unfinished_writes_are_reclaimed_after_the_session_timeout() {
    let cfg = MetaConfig {
        session_timeout: Duration::from_millis(200),
        reap_interval: Duration::from_millis(20),
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
    let (_, w) = post(
        a,
        "/api/startWriteCache",
        &json!({"instance_id": "llama", "block_keys": [1, 2]}),
        None,
    )
    .await;
    assert_eq!(w["locations"].as_array().unwrap().len(), 2);
    assert_eq!(ts.svc.group_usage("g").unwrap().total, 128);

    // Poll (with a deadline) until the reaper released the reservation.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, r) = post(
            a,
            "/api/getCacheMeta",
            &json!({"instance_id": "llama", "block_keys": [1, 2]}),
            None,
        )
        .await;
        if r["metas"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m.as_str().unwrap().contains("not_found"))
        {
            break;
        }
        assert!(Instant::now() < deadline, "session never reclaimed: {r}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ts.svc.group_usage("g").unwrap().total, 0, "quota released");
    let (_, r) = post(
        a,
        "/api/finishWriteCache",
        &json!({"instance_id": "llama", "write_session_id": w["write_session_id"], "success_blocks": {"offset": 2}}),
        None,
    )
    .await;
    assert_eq!(code(&r), "INVALID_ARGUMENT", "expired session: {r}");
    let (_, w2) = post(
        a,
        "/api/startWriteCache",
        &json!({"instance_id": "llama", "block_keys": [1, 2]}),
        None,
    )
    .await;
    assert_eq!(
        w2["block_mask"],
        json!({"offset": 0}),
        "both writable again"
    );
    ts.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn writes_past_the_quota_are_refused_and_change_nothing() {
    let svc = service(
        Arc::new(MemoryIndex::new()),
        MetaConfig::default(),
        Some(100),
    );
    let ts = start_with(svc, ServerConfig::localhost_ephemeral()).await;
    let a = ts.server.meta_http_addr();
    post(
        a,
        "/api/registerInstance",
        &register_body("llama", "g"),
        None,
    )
    .await;
    let (_, w) = post(
        a,
        "/api/startWriteCache",
        &json!({"instance_id": "llama", "block_keys": [1]}),
        None,
    )
    .await;
    assert_eq!(code(&w), "OK");
    let (_, r) = post(
        a,
        "/api/startWriteCache",
        &json!({"instance_id": "llama", "block_keys": [2, 3]}),
        None,
    )
    .await;
    assert_eq!(code(&r), "REACH_MAX_ENTITY_CAPACITY", "{r}");
    assert!(
        r["header"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("quota")
    );
    assert_eq!(r["locations"], json!([]));
    assert_eq!(ts.svc.group_usage("g").unwrap().total, 64);
    assert_eq!(ts.svc.open_sessions().unwrap(), 1);
    let (_, m) = post(
        a,
        "/api/getCacheMeta",
        &json!({"instance_id": "llama", "block_keys": [2, 3]}),
        None,
    )
    .await;
    assert!(
        m["metas"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m.as_str().unwrap().contains("not_found"))
    );
    ts.server.shutdown().await.unwrap();
}
