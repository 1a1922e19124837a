//! Leader election among `kvtier meta` frontends over one real
//! redis-server (issue 14; docs/server.md §9): three frontends elect one
//! leader, which alone runs the reclaimer and the session reaper; a
//! SIGKILLed leader is replaced within its lease, and its write sessions,
//! in the shared ledger, are finished by a follower or reaped by the new
//! leader; a demoted
//! leader stops at once and stays out; a Redis that stops answering (a
//! partition) leaves nobody acting as leader, and one is elected when it
//! is back. The same hand-overs over a lock file (`leader_lock =
//! file:///dir`), where a killed leader's lock goes with its process. At
//! every observation at most one frontend leads.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use kvtier_meta::test_support::RedisServer;
use serde_json::{Value, json};
use support::{Proc, addr_in};

mod support;

/// The lease the frontends run with (upstream's HA tests use 2 s).
const LEASE_MS: u64 = 2000;
/// How long any hand-over may take in these tests: the lease plus slack
/// for a loaded CI machine (upstream's tests allow 10 s).
const WITHIN: Duration = Duration::from_secs(15);
/// Write sessions time out after this: longer than a hand-over may take
/// between a grant and its finish, short enough to see the reaper.
const SESSION_TIMEOUT: Duration = Duration::from_secs(20);

struct Frontend {
    proc: Option<Proc>,
    meta: SocketAddr,
    admin: SocketAddr,
}

fn start(url: &str, data: &Path, pool: &Path) -> Frontend {
    let mut c = support::kvtier(&["meta", "--index", url], data);
    c.env(
        "KVTIER_META__DEFAULT_STORAGE",
        format!("file://{}", pool.display()),
    )
    .env("KVTIER_META__LEADER_LEASE_MS", LEASE_MS.to_string())
    .env("KVTIER_META__RECLAIM_INTERVAL_SECS", "1")
    .env(
        "KVTIER_META__SESSION_TIMEOUT_SECS",
        SESSION_TIMEOUT.as_secs().to_string(),
    );
    listening(&mut c)
}

/// Starts `c` and reads its listening addresses from its log.
fn listening(c: &mut std::process::Command) -> Frontend {
    let (proc, mut lines) = support::start_logged(c);
    let line = lines.pop().expect("the listening line");
    Frontend {
        proc: Some(proc),
        meta: addr_in(&line, "meta_http="),
        admin: addr_in(&line, "admin_http="),
    }
}

fn post(addr: SocketAddr, method: &str, body: Value) -> Value {
    let (status, v) = support::http(addr, "POST", &format!("/api/{method}"), None, &body);
    assert_eq!(status, 200, "{method}: {v}");
    assert_eq!(v["header"]["status"]["code"], "OK", "{method}: {v}");
    v
}

fn is_leader(f: &Frontend) -> bool {
    let h = post(f.admin, "checkHealth", json!({"trace_id": "t"}));
    h["is_leader"].as_bool().unwrap_or(false)
}

fn metric(f: &Frontend, name: &str) -> i64 {
    let (_, text) = support::http_text(f.admin, "GET", "/metrics", None, "");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in /metrics"))
}

/// The live frontends' leaders, checking that there is at most one.
fn leaders(fs: &[Frontend]) -> Vec<usize> {
    let on: Vec<usize> = (0..fs.len())
        .filter(|&i| fs[i].proc.is_some() && is_leader(&fs[i]))
        .collect();
    assert!(on.len() <= 1, "two frontends act as leader at once: {on:?}");
    on
}

/// Polls until `pick` accepts the leaders seen, within [`WITHIN`].
fn until<T>(fs: &[Frontend], what: &str, mut pick: impl FnMut(&[usize]) -> Option<T>) -> T {
    let deadline = Instant::now() + WITHIN;
    loop {
        if let Some(t) = pick(&leaders(fs)) {
            return t;
        }
        assert!(Instant::now() < deadline, "{what} not within {WITHIN:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn one_leader(fs: &[Frontend], what: &str) -> usize {
    until(fs, what, |l| l.first().copied())
}

/// Waits until `restarted` reports `leader` as the leader, and checks it
/// does not lead itself.
fn follows(fs: &[Frontend], restarted: usize, leader: usize) {
    let leader_id = cluster_info(&fs[leader])["self_node_id"].clone();
    until(fs, "the restarted frontend to see the leader", |_| {
        (cluster_info(&fs[restarted])["leader_node_id"] == leader_id).then_some(())
    });
    assert!(!is_leader(&fs[restarted]));
}

/// Demotes `leader` with a 60 s campaign delay: upstream's answer, and it
/// no longer leads when the answer comes.
fn demote(fs: &[Frontend], leader: usize) {
    post(
        fs[leader].admin,
        "updateLeaderElectorConfig",
        json!({"trace_id": "t", "campaign_delay_time_ms": 60_000}),
    );
    let r = post(fs[leader].admin, "leaderDemote", json!({"trace_id": "t"}));
    assert_eq!(
        r["header"]["status"]["message"],
        "Leader demote request accepted"
    );
    assert!(!is_leader(&fs[leader]));
}

fn cluster_info(f: &Frontend) -> Value {
    post(f.admin, "getManagerClusterInfo", json!({"trace_id": "t"}))
}

fn used_bytes(f: &Frontend) -> i64 {
    metric(f, "kvtier_meta_group_used_bytes{group=\"default\"}")
}

#[test]
fn frontends_on_one_redis_elect_one_leader_through_kill_demote_and_partition() {
    let redis = RedisServer::start().expect("start redis-server (.ci/run installs it)");
    let url = redis.url();
    let pool = tempfile::tempdir().unwrap();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut fs: Vec<Frontend> = dirs
        .iter()
        .map(|d| start(&url, d.path(), pool.path()))
        .collect();

    // One leader, known to all; it alone reclaims.
    let first = one_leader(&fs, "a first leader");
    let leader_id = cluster_info(&fs[first])["self_node_id"].clone();
    for f in &fs {
        assert_eq!(cluster_info(f)["leader_node_id"], leader_id);
    }
    until(&fs, "the leader's first reclaim pass", |_| {
        (metric(&fs[first], "kvtier_meta_reclaim_passes") > 0).then_some(())
    });
    for (i, f) in fs.iter().enumerate().filter(|(i, _)| *i != first) {
        assert_eq!(metric(f, "kvtier_meta_reclaim_passes"), 0, "follower {i}");
    }

    // A follower and the leader open write sessions; the leader dies
    // (SIGKILL, lease not released); another frontend leads within the
    // lease. The sessions are in the shared ledger: the follower finishes
    // its own and the dead leader's, every charge is seen by every
    // frontend, and the dead leader's unfinished session is reaped by the
    // new leader once it times out.
    let follower = (first + 1) % 3;
    let f = &fs[follower];
    post(
        f.meta,
        "registerInstance",
        json!({"instance_id": "qwen", "instance_group": "default", "block_size": 16,
               "model_deployment": {"model_name": "tiny"},
               "location_spec_infos": [{"name": "tp0", "size": 4096}]}),
    );
    let before = used_bytes(f);
    let write = |f: &Frontend, keys: &[u64]| {
        post(
            f.meta,
            "startWriteCache",
            json!({"instance_id": "qwen", "block_keys": keys}),
        )
    };
    let grant = write(f, &[1, 2]);
    let orphaned = write(&fs[first], &[3, 4]);
    let abandoned = write(&fs[first], &[5]);
    let lost_at = Instant::now();
    for f in &fs {
        assert_eq!(used_bytes(f), before + 5 * 4096, "every grant charged once");
    }
    fs[first].proc.take().expect("running").kill_now();
    let second = one_leader(&fs, "a leader after SIGKILL");
    assert_ne!(second, first);
    let finish = |g: &Value, n: usize| {
        post(
            fs[follower].meta,
            "finishWriteCache",
            json!({"instance_id": "qwen", "write_session_id": g["write_session_id"],
                   "success_blocks": {"bool_masks": {"values": vec![true; n]}}}),
        )
    };
    finish(&grant, 2);
    finish(&orphaned, 2);
    assert_eq!(used_bytes(&fs[second]), before + 5 * 4096);
    let hit = post(
        fs[second].meta,
        "getCacheLocation",
        json!({"instance_id": "qwen", "query_type": "QT_PREFIX_MATCH", "block_keys": [1, 2, 3, 4]}),
    );
    assert_eq!(hit["locations"].as_array().map_or(0, Vec::len), 4, "{hit}");

    // The restarted frontend follows the new leader.
    fs[first] = start(&url, dirs[first].path(), pool.path());
    follows(&fs, first, second);

    // Demoted with a campaign delay: not leading when the answer comes,
    // replaced by another frontend, and out of the running meanwhile.
    demote(&fs, second);
    let third = until(&fs, "a leader after the demotion", |l| {
        l.first().copied().filter(|&i| i != second)
    });
    assert_ne!(third, second);

    // Redis stops answering: nobody acts as leader once the lease is over;
    // back, one frontend leads again.
    redis.pause().expect("SIGSTOP redis-server");
    until(&fs, "every frontend to stop leading", |l| {
        l.is_empty().then_some(())
    });
    redis.resume().expect("SIGCONT redis-server");
    let last = one_leader(&fs, "a leader after Redis is back");

    // The dead leader's abandoned session: reaped by the leader of the
    // day, its charge released, its key free to write again.
    let deadline = lost_at + SESSION_TIMEOUT + WITHIN;
    while used_bytes(&fs[last]) != before + 4 * 4096 {
        assert!(
            Instant::now() < deadline,
            "the abandoned session was not reaped"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(matches!(
        support::http(fs[last].meta, "POST", "/api/finishWriteCache", None, &json!({
            "instance_id": "qwen", "write_session_id": abandoned["write_session_id"],
            "success_blocks": {"bool_masks": {"values": [true]}}})).1["header"]["status"]["code"]
            .as_str(),
        Some(code) if code != "OK"
    ));
    let again = write(&fs[last], &[5]);
    assert_eq!(
        again["locations"].as_array().map_or(0, Vec::len),
        1,
        "{again}"
    );
    for f in fs.iter_mut() {
        if let Some(p) = f.proc.take() {
            assert!(p.terminate().success());
        }
    }
}

/// Upstream's `test_leader_election_with_file_lock` and
/// `test_leader_switch_when_worker_stops`, over `leader_lock = file:///dir`
/// (each frontend with its own memory index): one leader; a SIGKILLed
/// leader's lock goes with its process, so the other leads at once; the
/// restarted one follows; a demoted leader hands over and stays out.
#[test]
fn frontends_elect_over_a_lock_file_across_processes() {
    let lock = tempfile::tempdir().unwrap();
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let start_one = |data: &Path| {
        let mut c = support::kvtier(&["meta", "--index", "memory"], data);
        c.env(
            "KVTIER_META__LEADER_LOCK",
            format!("file://{}", lock.path().display()),
        );
        listening(&mut c)
    };
    let mut fs: Vec<Frontend> = dirs.iter().map(|d| start_one(d.path())).collect();
    let first = one_leader(&fs, "a leader over the lock file");
    let leader_id = cluster_info(&fs[first])["self_node_id"].clone();
    for f in &fs {
        assert_eq!(cluster_info(f)["leader_node_id"], leader_id);
    }
    let other = 1 - first;

    fs[first].proc.take().expect("running").kill_now();
    assert_eq!(one_leader(&fs, "a leader after SIGKILL"), other);
    fs[first] = start_one(dirs[first].path());
    follows(&fs, first, other);
    demote(&fs, other);
    assert_eq!(
        until(&fs, "the other to take the lock", |l| l.first().copied()),
        first
    );
    for f in fs.iter_mut() {
        if let Some(p) = f.proc.take() {
            assert!(p.terminate().success());
        }
    }
}
