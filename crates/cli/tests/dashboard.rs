//! The Grafana dashboard (`deploy/grafana/kvtier.json`) against a real
//! Prometheus (Debian's `prometheus` package; `.ci/setup` installs it):
//! two `kvtier serve` daemons of one cluster over a real Redis index, each
//! scraped on its admin `/metrics`; traffic that makes every family the
//! dashboard reads exist and move (blocks stored on node A, found by node
//! B's `Lookup` and loaded from A's peer server, local hits on both); then
//! every panel query, with the dashboard's variables filled in as Grafana
//! would, is evaluated through Prometheus's HTTP API and must succeed with
//! a non-empty result. A missing `prometheus` binary fails the test.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kvtier_client::BlockHash;
use kvtier_meta::test_support::RedisServer;
use serde_json::Value;
use support::Proc;
use support::node::{
    Daemon, PATIENCE, block, cluster_member, read_block, secret_in, store_blocks, wait_until,
};

mod support;

/// The dashboard, from the repository root.
const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/grafana/kvtier.json"
);
/// What the test puts for Grafana's `$__rate_interval`: wide enough to
/// hold every scrape of the test.
const RATE_INTERVAL: &str = "1m";
/// Prometheus's scrape interval here: short, so the test is.
const SCRAPE: &str = "250ms";
/// Blocks a daemon's G2 holds (`support::serve`'s 4 MiB arena of 16 KiB
/// blocks).
const G2_BLOCKS: u128 = 256;

#[test]
fn every_panel_query_of_the_dashboard_answers_over_two_scraped_daemons() {
    let queries = panel_queries(&load_dashboard());
    let redis = RedisServer::start().expect("start redis-server (.ci/setup installs it)");
    // The secret's directory, then each daemon's data directory.
    let dirs: Vec<_> = (0..3)
        .map(|_| tempfile::tempdir().expect("a dir"))
        .collect();
    let secret = secret_in(dirs[0].path(), &[0x33; 32]);
    // Long: a loaded machine must not turn a peer hit into a miss.
    let env = [("KVTIER_PEER__LOAD_TIMEOUT_MS", "30000")];
    let member = |i: usize, node| {
        cluster_member(
            dirs[i].path(),
            node,
            "dashboard",
            &redis.url(),
            &secret,
            &env,
        )
    };
    let (a, b) = (member(1, "dash-a"), member(2, "dash-b"));
    let targets = [a.logged_addr("admin_http"), b.logged_addr("admin_http")];
    let prom = Prometheus::start(&targets);

    prom.wait_scraped(&targets, 1);
    drive_traffic(&a, &b);
    // Every series the traffic made has two samples after it, so rates
    // over them exist: of the good scrapes after those counted now, the
    // first may have begun before the traffic's end (one at a time per
    // target), the next two began after it.
    let scraped = prom.scrapes(&targets);
    prom.wait_scraped(&targets, scraped + 3);

    node_variable_lists_both(&prom, &targets);
    let failed: Vec<String> = queries.iter().filter_map(|q| prom.check(q).err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} panel queries failed:\n{}",
        failed.len(),
        queries.len(),
        failed.join("\n")
    );
    drop((a, b));
}

/// Blocks stored on A, located by B and loaded from A's peer server, then
/// local hits on both and a miss; then more blocks on A than its G2 holds,
/// so that blocks move down to G3 and one comes back up (the transfer
/// paths' families have a sample once a path has moved a block); and a
/// request to B's metadata frontend (its request families likewise).
fn drive_traffic(a: &Daemon, b: &Daemon) {
    let ks: Vec<u128> = (1..=3).map(|k| k | (0xda5 << 64)).collect();
    let keys: Vec<BlockHash> = ks.iter().map(|k| BlockHash(*k)).collect();
    let (mut on_a, mut on_b) = (a.client(), b.client());
    store_blocks(&mut on_a, &ks);
    let peer = on_b.tiers().last().expect("tiers").tier;
    wait_until("node B to find node A's blocks", || {
        (on_b.lookup(&keys).unwrap() == [peer; 3]).then_some(())
    });
    for k in &ks {
        let got = read_block(&mut on_b, *k).expect("B loads A's block from A");
        assert!(got == block(*k), "block {k:#x} differs");
        assert!(read_block(&mut on_a, *k).is_some(), "A's own block");
    }
    let missing = BlockHash(0xda5 << 64);
    assert!(on_b.lookup(&[missing]).unwrap().is_empty());

    for batch in (0..G2_BLOCKS + 64).collect::<Vec<u128>>().chunks(32) {
        let filler: Vec<u128> = batch.iter().map(|k| k | (0xf111 << 64)).collect();
        store_blocks(&mut on_a, &filler);
    }
    let metrics = a.logged_addr("admin_http");
    wait_until("node A to move blocks down to G3", || {
        let (_, text) = support::http_text(metrics, "GET", "/metrics", None, "");
        text.contains("kvtier_path_blocks_total{path=\"g2_to_g3\"}")
            .then_some(())
    });
    assert!(
        read_block(&mut on_a, ks[0]).is_some(),
        "A's first block, from G3"
    );

    // A request to B's hosted metadata frontend (an instance it does not
    // know: any answer is counted by method and code).
    let body = serde_json::json!({
        "instance_id": "dashboard",
        "query_type": "QT_PREFIX_MATCH",
        "block_keys": [1, 2, 3],
    });
    let meta = b.logged_addr("meta_http");
    let (status, answer) = support::http(meta, "POST", "/api/getCacheLocation", None, &body);
    assert_eq!(status, 200, "{answer}");
}

/// The dashboard's JSON.
fn load_dashboard() -> Value {
    let text = std::fs::read_to_string(DASHBOARD).expect("read deploy/grafana/kvtier.json");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// Every panel's queries (rows' nested panels included), with Grafana's
/// variables as the test fills them in; each panel other than a row has at
/// least one, and none can hide an empty answer.
fn panel_queries(dashboard: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack: Vec<&Value> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .collect();
    while let Some(panel) = stack.pop() {
        if let Some(nested) = panel["panels"].as_array() {
            stack.extend(nested);
        }
        if panel["type"] == "row" {
            continue;
        }
        let title = &panel["title"];
        let targets = panel["targets"].as_array().map_or(&[][..], |t| &t[..]);
        assert!(!targets.is_empty(), "panel {title} has no query");
        for t in targets {
            let expr = t["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("{title}: no expr"));
            assert!(
                !expr.contains("vector(") && !expr.contains(" or "),
                "{title}: {expr} could answer without the metrics it names"
            );
            out.push(fill_variables(expr));
        }
    }
    assert!(out.len() > 20, "only {} queries", out.len());
    out
}

/// `expr` with the dashboard's variables as Grafana fills them in: every
/// node, and a rate interval covering the test.
fn fill_variables(expr: &str) -> String {
    expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$node", ".*")
}

/// The `node` variable's query lists both daemons.
fn node_variable_lists_both(prom: &Prometheus, targets: &[SocketAddr]) {
    let dash = load_dashboard();
    let vars = dash["templating"]["list"].as_array().expect("variables");
    let node = vars
        .iter()
        .find(|v| v["name"] == "node")
        .expect("a node variable");
    let query = node["query"]["query"].as_str().expect("its query");
    let (metric, label) = query
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .and_then(|q| q.split_once(", "))
        .unwrap_or_else(|| panic!("not label_values(metric, label): {query}"));
    let path = format!("/api/v1/label/{label}/values?match[]={}", encode(metric));
    let values = prom.api(&path);
    for t in targets {
        let listed = values
            .as_array()
            .is_some_and(|v| v.iter().any(|v| *v == t.to_string()));
        assert!(listed, "{query} does not list {t}: {values}");
    }
}

/// A Prometheus server of its own: a free port, a scrape configuration of
/// the daemons, a data directory, all in a temporary directory; stopped on
/// drop.
struct Prometheus {
    _proc: Proc,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts `prometheus` scraping `targets`' `/metrics` every
    /// [`SCRAPE`], and waits until it is ready.
    fn start(targets: &[SocketAddr]) -> Self {
        let dir = tempfile::tempdir().expect("prometheus dir");
        let config = dir.path().join("prometheus.yml");
        let list: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: {SCRAPE}\n  scrape_timeout: {SCRAPE}\n\
                 scrape_configs:\n  - job_name: kvtier\n    static_configs:\n      - targets: [{}]\n",
                list.join(", ")
            ),
        )
        .expect("write prometheus.yml");
        let addr = free_port();
        let mut cmd = Command::new("prometheus");
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| {
            panic!("start prometheus ({e}): install Debian's `prometheus` package (.ci/setup)")
        });
        let stderr = child.stderr.take().expect("stderr piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("  prometheus| {line}");
            }
        });
        let prom = Self {
            _proc: Proc(child),
            addr,
            _dir: dir,
        };
        wait_until("prometheus to be ready", || {
            get(prom.addr, "/-/ready").filter(|(status, _)| *status == 200)
        });
        prom
    }

    /// The `data` of a successful answer to API call `path`.
    fn api(&self, path: &str) -> Value {
        let (status, body) = get(self.addr, path).unwrap_or_else(|| panic!("GET {path}"));
        let answer: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        assert!(
            status == 200 && answer["status"] == "success",
            "GET {path}: {status} {body}"
        );
        answer["data"].clone()
    }

    /// Successful scrapes of each target so far, the fewest of them.
    fn scrapes(&self, targets: &[SocketAddr]) -> u64 {
        let query = encode("sum_over_time(up[1h])");
        let data = self.api(&format!("/api/v1/query?query={query}"));
        let each = targets
            .iter()
            .map(|t| sample(&data, t).unwrap_or(0.0) as u64);
        each.min().unwrap_or(0)
    }

    /// Waits until each of `targets` was scraped successfully at least `n`
    /// times; after [`PATIENCE`], fails showing Prometheus's view of its
    /// targets (a failed scrape's error with them).
    fn wait_scraped(&self, targets: &[SocketAddr], n: u64) {
        let deadline = Instant::now() + PATIENCE;
        while self.scrapes(targets) < n {
            assert!(
                Instant::now() < deadline,
                "fewer than {n} good scrapes of {targets:?} after {PATIENCE:?}: {}",
                self.targets()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Prometheus's view of its targets, for a failure's message.
    fn targets(&self) -> Value {
        self.api("/api/v1/targets")
    }

    /// `Ok` if `query` succeeds with a non-empty result; else why not.
    fn check(&self, query: &str) -> Result<(), String> {
        let path = format!("/api/v1/query?query={}", encode(query));
        let (status, body) = get(self.addr, &path).ok_or(format!("{query}: no answer"))?;
        let answer: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        if status != 200 || answer["status"] != "success" {
            return Err(format!("{query}: {status} {body}"));
        }
        match answer["data"]["result"].as_array() {
            Some(r) if !r.is_empty() => Ok(()),
            _ => Err(format!("{query}: empty result")),
        }
    }
}

/// The value of `target`'s sample in instant-query `data`.
fn sample(data: &Value, target: &SocketAddr) -> Option<f64> {
    let result = data["result"].as_array()?;
    let found = result
        .iter()
        .find(|r| r["metric"]["instance"] == target.to_string())?;
    found["value"][1].as_str()?.parse().ok()
}

/// A loopback port free now (the OS's pick; Prometheus binds it next).
fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("its address")
}

/// `GET path` over HTTP/1.0 (so the answer is never chunked): its status
/// and body, or `None` when nothing listens yet.
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    let status = answer.split_whitespace().nth(1)?.parse().ok()?;
    let (_, body) = answer.split_once("\r\n\r\n")?;
    Some((status, body.to_owned()))
}

/// `text` percent-encoded for a query string.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
