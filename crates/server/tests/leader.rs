//! Leader election as the server answers it (docs/server.md §9): two
//! frontends over one index and one lease, in this process. A follower
//! that refuses leader-only calls answers them as Tair KVCM does and
//! serves the cluster calls; a demotion hands over; the leader-only work
//! runs on the leader only. (Separate processes over a real Redis, with
//! SIGKILL and a stopped Redis: `crates/cli/tests/leader.rs`.)

#[path = "support/lib.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use kvtier_meta::leader::{Elector, ElectorConfig, LeaseStore, MemoryLease, Role};
use kvtier_meta::{LeaderWorkIntervals, MemoryIndex, MetaConfig, MetaIndex, MetaService};
use kvtier_server::{FollowerRequests, ServerConfig};
use serde_json::{Value, json};
use support::*;

const WITHIN: Duration = Duration::from_secs(10);

fn elector_config(node: &str) -> ElectorConfig {
    ElectorConfig {
        node_id: node.into(),
        lease: Duration::from_millis(1000),
        interval: Duration::from_millis(50),
    }
}

struct Frontend {
    ts: TestServer,
    elector: Arc<Elector>,
}

/// A frontend named `node` over `index` and `lease`, refusing leader-only
/// calls while it follows.
async fn frontend(
    node: &str,
    index: &Arc<dyn MetaIndex>,
    lease: &Arc<dyn LeaseStore>,
    svc: Option<Arc<MetaService>>,
) -> Frontend {
    let svc = svc.unwrap_or_else(|| {
        Arc::new(MetaService::new(index.clone(), MetaConfig::default()).expect("service"))
    });
    let elector =
        Arc::new(Elector::start_after_first_pass(lease.clone(), elector_config(node)).await);
    let cfg = ServerConfig {
        node_id: node.into(),
        elector: Some(elector.clone()),
        follower_requests: FollowerRequests::Refuse,
        ..ServerConfig::localhost_ephemeral()
    };
    Frontend {
        ts: start_with(svc, cfg).await,
        elector,
    }
}

async fn admin(f: &Frontend, method: &str, body: Value) -> Value {
    let (status, v) = post(
        f.ts.server.admin_http_addr(),
        &format!("/api/{method}"),
        &body,
        None,
    )
    .await;
    assert_eq!(status, 200, "{method}: {v}");
    v
}

async fn register(f: &Frontend, id: &str) -> Value {
    let (status, v) = post(
        f.ts.server.meta_http_addr(),
        "/api/registerInstance",
        &register_body(id, "g"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    v
}

async fn until_leader(e: &Elector) {
    let mut roles = e.subscribe();
    tokio::time::timeout(WITHIN, roles.wait_for(|r| matches!(r, Role::Leader { .. })))
        .await
        .expect("elected within the bound")
        .expect("elector alive");
}

#[tokio::test]
async fn a_follower_refuses_leader_only_calls_and_a_demotion_hands_over() {
    let index: Arc<dyn MetaIndex> = Arc::new(MemoryIndex::new());
    let lease: Arc<dyn LeaseStore> = Arc::new(MemoryLease::new());
    let a = frontend(
        "a",
        &index,
        &lease,
        Some(service(index.clone(), MetaConfig::default(), None)),
    )
    .await;
    let b = frontend("b", &index, &lease, None).await;
    assert!(a.elector.is_leader() && !b.elector.is_leader());

    // The follower: leader-only calls of both services refused with
    // upstream's code and message; the cluster calls answered.
    let r = register(&b, "i1").await;
    assert_eq!(code(&r), "SERVER_NOT_LEADER", "{r}");
    assert_eq!(r["header"]["status"]["message"], "Server is not leader");
    assert_eq!(r["header"]["request_id"], "t-reg");
    let r = admin(&b, "listStorage", json!({"trace_id": "t"})).await;
    assert_eq!(code(&r), "SERVER_NOT_LEADER", "{r}");
    let info = admin(&b, "getManagerClusterInfo", json!({"trace_id": "t"})).await;
    assert_eq!(code(&info), "OK", "{info}");
    assert_eq!(
        (
            info["self_node_id"].as_str(),
            info["leader_node_id"].as_str()
        ),
        (Some("b"), Some("a"))
    );
    assert_eq!(info["self_leader_expiration_time"], "-1");
    let h = admin(&b, "checkHealth", json!({"trace_id": "t"})).await;
    assert_eq!(
        (h["is_leader"].as_bool(), h["is_health"].as_bool()),
        (Some(false), Some(true)),
        "{h}"
    );
    assert!(b.ts.server.metrics_text().contains("kvtier_meta_leader 0"));

    // The leader serves them.
    assert_eq!(code(&register(&a, "i1").await), "OK");
    let info = admin(&a, "getManagerClusterInfo", json!({"trace_id": "t"})).await;
    assert_eq!(info["leader_node_id"], "a");
    assert_eq!(
        info["leader_endpoint"]["admin_http_port"],
        a.ts.server.admin_http_addr().port()
    );
    assert!(a.ts.server.metrics_text().contains("kvtier_meta_leader 1"));

    // Demoted with a campaign delay: it stops leading before it answers,
    // the other takes over, and it stays out.
    let r = admin(
        &a,
        "updateLeaderElectorConfig",
        json!({"trace_id": "t", "campaign_delay_time_ms": 10000}),
    )
    .await;
    assert_eq!(code(&r), "OK", "{r}");
    let r = admin(&a, "leaderDemote", json!({"trace_id": "t"})).await;
    assert_eq!(
        r["header"]["status"]["message"], "Leader demote request accepted",
        "{r}"
    );
    let h = admin(&a, "checkHealth", json!({"trace_id": "t"})).await;
    assert_eq!(h["is_leader"], false, "{h}");
    assert_eq!(code(&register(&a, "i2").await), "SERVER_NOT_LEADER");
    until_leader(&b.elector).await;
    assert_eq!(code(&register(&b, "i2").await), "OK");
    let r = admin(&a, "leaderDemote", json!({"trace_id": "t"})).await;
    assert_eq!(code(&r), "SERVER_NOT_LEADER", "{r}");
    assert!(!a.elector.is_leader());
}

#[tokio::test]
async fn a_follower_that_serves_answers_everything() {
    let index: Arc<dyn MetaIndex> = Arc::new(MemoryIndex::new());
    let lease: Arc<dyn LeaseStore> = Arc::new(MemoryLease::new());
    let svc = service(index.clone(), MetaConfig::default(), None);
    let _leader = Elector::start_after_first_pass(lease.clone(), elector_config("a")).await;
    let elector = Arc::new(Elector::start_after_first_pass(lease, elector_config("b")).await);
    let cfg = ServerConfig {
        elector: Some(elector.clone()),
        follower_requests: FollowerRequests::Serve,
        ..ServerConfig::localhost_ephemeral()
    };
    let b = Frontend {
        ts: start_with(svc, cfg).await,
        elector,
    };
    assert!(!b.elector.is_leader());
    assert_eq!(code(&register(&b, "i1").await), "OK");
    let h = admin(&b, "checkHealth", json!({"trace_id": "t"})).await;
    assert_eq!(h["is_leader"], false, "{h}");
}

/// The reclaimer runs on the leader only and follows a hand-over. A
/// current-thread runtime: once the supervisor says the work stopped, no
/// pass of it can be running on another thread.
#[tokio::test]
async fn leader_only_work_follows_the_role() {
    let index: Arc<dyn MetaIndex> = Arc::new(MemoryIndex::new());
    let lease: Arc<dyn LeaseStore> = Arc::new(MemoryLease::new());
    let svc_a = service(index.clone(), MetaConfig::default(), None);
    let svc_b = Arc::new(MetaService::new(index, MetaConfig::default()).unwrap());
    let every = LeaderWorkIntervals {
        reclaim: Duration::from_millis(5),
        health: Duration::from_millis(5),
    };
    let a = Arc::new(Elector::start_after_first_pass(lease.clone(), elector_config("a")).await);
    let b = Arc::new(Elector::start_after_first_pass(lease, elector_config("b")).await);
    let work_a = svc_a.spawn_leader_work(&a, every);
    let work_b = svc_b.spawn_leader_work(&b, every);
    let passes = |svc: &MetaService| svc.reclaim_stats().passes;
    let until = |svc: Arc<MetaService>, n: u64| async move {
        tokio::time::timeout(WITHIN, async {
            while svc.reclaim_stats().passes < n {
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("passes ran");
    };
    until(svc_a.clone(), 3).await;
    assert!(*work_a.active().borrow() && !*work_b.active().borrow());
    assert_eq!(passes(&svc_b), 0, "the follower reclaims nothing");

    a.set_campaign_delay_ms(60_000);
    assert!(a.demote().await.unwrap());
    let mut stopped = work_a.active();
    tokio::time::timeout(WITHIN, stopped.wait_for(|on| !on))
        .await
        .expect("the work stops")
        .unwrap();
    let frozen = passes(&svc_a);
    until_leader(&b).await;
    until(svc_b.clone(), 3).await;
    assert!(*work_b.active().borrow());
    assert_eq!(
        passes(&svc_a),
        frozen,
        "the demoted frontend reclaims no more"
    );
}
