//! `kvtier serve` restarted on a full disk: its data directory (embedded
//! metadata index and the default file pool) on a real tmpfs filled to the
//! last byte, the G3 disk tier on the ordinary disk (it needs `O_DIRECT`,
//! which tmpfs lacks). The server starts, serves every block it stored as
//! a hit (a full pool is not a broken one), refuses writes, and `/health`
//! says why.

use std::io::{BufRead, BufReader, Lines};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ChildStderr};
use std::time::{Duration, Instant};

use kvtier_meta::test_support::Tmpfs;
use serde_json::{Value, json};

mod support;

/// How long the storage probe may take to run after start.
const PROBED_WITHIN: Duration = Duration::from_secs(30);

struct Serve {
    child: Child,
    lines: Lines<BufReader<ChildStderr>>,
    meta_http: SocketAddr,
}

fn start(data: &Path, disk: &Path, shm: &str) -> Serve {
    let mut child = support::serve(data, shm)
        .env("KVTIER_DISK__DIRS", format!("[\"{}\"]", disk.display()))
        .env("KVTIER_META__HEALTH_INTERVAL_SECS", "1")
        .spawn()
        .expect("start kvtier serve");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut meta_http = None;
    for line in lines.by_ref().map_while(Result::ok) {
        if let Some(addr) = field(&line, "meta_http=") {
            meta_http = addr.parse().ok();
        }
        if line.contains("kvtier serving") {
            break;
        }
    }
    let meta_http = meta_http.expect("serve logged its meta HTTP address and became ready");
    Serve {
        child,
        lines,
        meta_http,
    }
}

fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let at = line.find(name)? + name.len();
    line[at..].split_whitespace().next()
}

impl Serve {
    /// SIGTERM, and waits for a clean exit.
    fn stop(mut self) {
        // SAFETY: kill(2) on our own child's pid, which has not been reaped.
        let sent = unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        assert_eq!(sent, 0, "SIGTERM to kvtier serve");
        let rest: Vec<String> = self.lines.map_while(Result::ok).collect();
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "exit {status:?}; log: {rest:?}");
    }
}

/// One HTTP/1.1 request (`Connection: close`); the status and JSON body.
fn request(addr: SocketAddr, method: &str, path: &str, body: &Value) -> (u16, Value) {
    support::http(addr, method, path, None, body)
}

fn code(v: &Value) -> &str {
    v["header"]["status"]["code"].as_str().unwrap_or("<none>")
}

fn write(a: SocketAddr, keys: &[i64]) -> Value {
    let (_, w) = request(
        a,
        "POST",
        "/api/startWriteCache",
        &json!({"instance_id": "llama", "block_keys": keys}),
    );
    if code(&w) != "OK" {
        return w;
    }
    let (_, f) = request(
        a,
        "POST",
        "/api/finishWriteCache",
        &json!({"instance_id": "llama", "write_session_id": w["write_session_id"],
                "success_blocks": {"offset": keys.len()}}),
    );
    f
}

fn assert_hits(a: SocketAddr, keys: &[i64]) {
    let q = json!({"instance_id": "llama", "query_type": "QT_BATCH_GET", "block_keys": keys});
    let (_, r) = request(a, "POST", "/api/getCacheLocation", &q);
    assert_eq!(code(&r), "OK", "{r}");
    let locs = r["locations"].as_array().expect("locations");
    assert_eq!(locs.len(), keys.len(), "{r}");
    for (k, l) in keys.iter().zip(locs) {
        assert_eq!(l["spec_size"], 1, "stored block {k} is a miss: {r}");
    }
}

#[test]
fn serve_restarted_on_a_full_disk_serves_its_blocks_and_reports_it() {
    let fs = Tmpfs::mount(32 << 20).expect("a tmpfs to fill (this test needs root)");
    let data = fs.path().join("data");
    let disk = tempfile::tempdir().expect("disk dir");
    let shm = format!("kvtier-enospc-test-{}", std::process::id());
    let keys: Vec<i64> = (1..=8).collect();

    let s = start(&data, disk.path(), &shm);
    let register = json!({"instance_id": "llama", "instance_group": "default", "block_size": 16,
        "model_deployment": {"model_name": "m"},
        "location_spec_infos": [{"name": "tp0", "size": 4096}]});
    let (_, r) = request(s.meta_http, "POST", "/api/registerInstance", &register);
    assert_eq!(code(&r), "OK", "{r}");
    let w = write(s.meta_http, &keys);
    assert_eq!(code(&w), "OK", "{w}");
    assert_hits(s.meta_http, &keys);
    s.stop();

    fs.fill().expect("fill the file system");
    let s = start(&data, disk.path(), &shm);
    let a = s.meta_http;
    // Wait for the storage probe to have looked at the full pool.
    let deadline = Instant::now() + PROBED_WITHIN;
    let health = loop {
        let (status, h) = request(a, "GET", "/health", &Value::Null);
        if h["storages"][0]["health"] == "full" {
            assert_eq!(status, 503, "{h}");
            break h;
        }
        assert!(Instant::now() < deadline, "the pool never probed full: {h}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(health["healthy"], false, "{health}");
    let reason = health["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("metadata index read-only"), "{health}");
    assert_hits(a, &keys);
    // Refused: by the full pool (no writable storage) before the index is
    // even asked, or by the read-only index.
    let refused = write(a, &[100]);
    assert!(
        ["REACH_MAX_ENTITY_CAPACITY", "SERVICE_NOT_READY"].contains(&code(&refused)),
        "{refused}"
    );
    s.stop();
}
