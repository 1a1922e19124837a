//! `GetMetrics` under Tair KVCM's names and tags (docs/server.md §7.1):
//! upstream's own check (`service.query_counter` and `service.query_rt_us`
//! tagged `api_name`) and the rest of the mapping, over HTTP and gRPC.

#[path = "support/lib.rs"]
mod support;

use kvtier_meta::proto::admin::admin_service_client::AdminServiceClient;
use kvtier_meta::proto::admin::{self as apb, ListStorageRequest};
use serde_json::{Value, json};
use support::*;

/// The entry named `name` whose tags are exactly `tags`.
fn entry<'a>(metrics: &'a [Value], name: &str, tags: &[(&str, &str)]) -> Option<&'a Value> {
    metrics.iter().find(|m| {
        let got: Vec<(&str, &str)> = m["metric_tags"]
            .as_array()
            .map(|ts| {
                ts.iter()
                    .map(|t| {
                        let k = t["tag_key"].as_str().unwrap_or("");
                        (k, t["tag_value"].as_str().unwrap_or(""))
                    })
                    .collect()
            })
            .unwrap_or_default();
        m["metric_name"] == name && got == tags
    })
}

fn int(v: Option<&Value>) -> i64 {
    let s = v.expect("entry present")["metric_value"]["int_value"].clone();
    s.as_str()
        .and_then(|s| s.parse().ok())
        .expect("int64 as a string")
}

fn float(v: Option<&Value>) -> f64 {
    v.expect("entry present")["metric_value"]["float_value"]
        .as_f64()
        .expect("a float value")
}

#[tokio::test]
async fn get_metrics_carries_upstreams_names_and_tags() {
    let ts = start().await;
    let (m, a) = (ts.server.meta_http_addr(), ts.server.admin_http_addr());
    // ListStorage over both transports: one series.
    let (_, r) = post(a, "/api/listStorage", &json!({}), None).await;
    assert_eq!(code(&r), "OK");
    let mut c = AdminServiceClient::connect(format!("http://{}", ts.server.admin_grpc_addr()))
        .await
        .expect("connect");
    c.list_storage(ListStorageRequest::default())
        .await
        .expect("grpc");
    // RegisterInstance on the meta and the admin service: one series.
    let (_, r) = post(m, "/api/registerInstance", &register_body("i1", "g"), None).await;
    assert_eq!(code(&r), "OK", "{r}");
    let (_, r) = post(a, "/api/registerInstance", &register_body("i2", "g"), None).await;
    assert_eq!(code(&r), "OK", "{r}");
    // A refusal: counted, and its code is the API's last.
    let (_, r) = post(
        a,
        "/api/removeStorage",
        &json!({"storage_unique_name": "nope"}),
        None,
    )
    .await;
    let refused = code(&r).to_owned();
    assert_ne!(refused, "OK");

    let (_, r) = post(a, "/api/getMetrics", &json!({"trace_id": "t"}), None).await;
    assert_eq!(code(&r), "OK", "{r}");
    let all = r["metrics"].as_array().expect("metrics").clone();

    let list = [("api_name", "ListStorage")];
    assert_eq!(int(entry(&all, "service.query_counter", &list)), 2);
    assert!(float(entry(&all, "service.query_rt_us", &list)) > 0.0);
    assert_eq!(int(entry(&all, "service.error_counter", &list)), 0);
    let reg = [("api_name", "RegisterInstance")];
    assert_eq!(int(entry(&all, "service.query_counter", &reg)), 2);
    let remove = [("api_name", "RemoveStorage")];
    assert_eq!(int(entry(&all, "service.error_counter", &remove)), 1);
    let want = apb::ErrorCode::from_str_name(&refused).expect("a wire code") as i32;
    assert_eq!(
        float(entry(&all, "service.error_code", &remove)),
        f64::from(want)
    );

    let i1 = [("instance_group", "g"), ("instance_id", "i1")];
    assert_eq!(
        float(entry(&all, "cache_manager_instance.key_count", &i1)),
        0.0
    );
    let nfs = [("type", "file"), ("unique_name", "nfs")];
    assert_eq!(float(entry(&all, "data_storage.healthy_status", &nfs)), 1.0);
    let g = [("instance_group", "g")];
    assert_eq!(
        float(entry(&all, "cache_manager_group.usage_ratio", &g)),
        0.0
    );
    assert!(entry(&all, "meta_indexer.total_key_count", &[]).is_some());
    assert!(entry(&all, "cache_manager.write_location_expire_size", &[]).is_some());

    // Upstream's order (name, then tags) for its entries, then kvtier's own.
    let names: Vec<&str> = all
        .iter()
        .map(|m| m["metric_name"].as_str().unwrap_or(""))
        .collect();
    let first_own = names
        .iter()
        .position(|n| n.starts_with("kvtier_meta_"))
        .expect("kvtier's entries too");
    assert!(
        names[first_own..]
            .iter()
            .all(|n| n.starts_with("kvtier_meta_"))
    );
    let mut sorted = names[..first_own].to_vec();
    sorted.sort_unstable();
    assert_eq!(sorted, names[..first_own], "sorted by name");
    ts.server.shutdown().await.expect("shutdown");
}
