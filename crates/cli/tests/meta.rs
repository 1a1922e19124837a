//! The metadata service as the binary runs it: `kvtier serve` hosts it with
//! a `default` group on a local file pool and no admin step, keeps its
//! metadata across a restart, and `kvtier meta --index redis://...` runs
//! stateless frontends that share one Redis index. `kvtier manager`, its
//! old name, still runs it for one release, hidden from `--help`.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use kvtier_meta::test_support::RedisServer;
use serde_json::{Value, json};
use support::{Proc, addr_in, serve};

mod support;

/// Starts `cmd` and returns it with the meta HTTP address from its
/// "listening" log line (read as it comes; no sleeping).
fn start(cmd: &mut Command) -> (Proc, SocketAddr) {
    let (proc, line) = start_listening(cmd);
    (proc, addr_in(&line, "meta_http="))
}

/// Starts `cmd` and returns it with its "listening" log line.
fn start_listening(cmd: &mut Command) -> (Proc, String) {
    let (proc, mut lines) = support::start_logged(cmd);
    let line = lines.pop().expect("the listening line");
    (proc, line)
}

/// One HTTP/1.1 POST with a JSON body; returns the parsed JSON answer,
/// which must be OK.
fn post(addr: SocketAddr, method: &str, body: Value) -> Value {
    let v = post_any(addr, method, body);
    assert_eq!(v["header"]["status"]["code"], "OK", "{method}: {v}");
    v
}

/// One HTTP/1.1 POST with a JSON body; returns the parsed JSON answer.
fn post_any(addr: SocketAddr, method: &str, body: Value) -> Value {
    let (status, v) = support::http(addr, "POST", &format!("/api/{method}"), None, &body);
    assert_eq!(status, 200, "{method}: {v}");
    assert!(!v.is_null(), "{method}: no JSON body");
    v
}

fn register(addr: SocketAddr, instance: &str) {
    post(
        addr,
        "registerInstance",
        json!({
            "instance_id": instance,
            "instance_group": "default",
            "block_size": 16,
            "model_deployment": {"model_name": "tiny"},
            "location_spec_infos": [{"name": "tp0", "size": 4096}],
        }),
    );
}

/// Writes `keys` in one session; returns their URIs.
fn write(addr: SocketAddr, instance: &str, keys: &[i64]) -> Vec<String> {
    let grant = post(
        addr,
        "startWriteCache",
        json!({"instance_id": instance, "block_keys": keys}),
    );
    let uris: Vec<String> = grant["locations"]
        .as_array()
        .expect("locations")
        .iter()
        .map(|l| {
            l["location_specs"][0]["uri"]
                .as_str()
                .expect("uri")
                .to_owned()
        })
        .collect();
    assert_eq!(uris.len(), keys.len(), "{grant}");
    // Not served before FinishWriteCache.
    assert_eq!(matched(addr, instance, keys), 0);
    post(
        addr,
        "finishWriteCache",
        json!({
            "instance_id": instance,
            "write_session_id": grant["write_session_id"],
            "success_blocks": {"bool_masks": {"values": vec![true; keys.len()]}},
        }),
    );
    uris
}

/// Length of the served prefix of `keys`.
fn matched(addr: SocketAddr, instance: &str, keys: &[i64]) -> usize {
    let v = post(
        addr,
        "getCacheLocation",
        json!({"instance_id": instance, "query_type": "QT_PREFIX_MATCH", "block_keys": keys}),
    );
    v["locations"].as_array().map_or(0, Vec::len)
}

/// `serve` wires the storage roots (default `<data_dir>/pool`) and the
/// backend opener: an admin-added storage under the root gets its file
/// pool at once (its files exist before any restart), one outside is
/// refused and nothing is created there.
#[test]
fn admin_storages_are_confined_to_the_pool_root_and_open_at_once() {
    let data = tempfile::tempdir().unwrap();
    let shm = format!("kvt-roots-{}", std::process::id());
    let (proc, line) = start_listening(&mut serve(data.path(), &shm));
    let admin = addr_in(&line, "admin_http=");
    let add = |name: &str, dir: &Path| {
        post_any(
            admin,
            "addStorage",
            json!({"storage": {"global_unique_name": name,
                "nfs": {"root_path": dir.display().to_string()}}}),
        )
    };
    let outside = data.path().join("outside");
    let r = add("evil", &outside);
    assert_eq!(r["header"]["status"]["code"], "INVALID_ARGUMENT", "{r}");
    assert!(
        !outside.exists(),
        "a refused storage created {}",
        outside.display()
    );
    let inside = std::path::absolute(data.path().join("pool").join("extra")).unwrap();
    let r = add("extra", &inside);
    assert_eq!(r["header"]["status"]["code"], "OK", "{r}");
    assert!(
        inside.join("pool-0000.kv").is_file(),
        "a storage added at runtime has no file pool"
    );
    assert!(proc.terminate().success());
}

#[test]
fn serve_hosts_the_metadata_service_and_keeps_its_metadata_across_restarts() {
    let data = tempfile::tempdir().unwrap();
    let shm = format!("kvt-mgr-{}", std::process::id());
    let (proc, addr) = start(&mut serve(data.path(), &shm));
    // No admin step: the default group exists on a fresh server.
    register(addr, "llama");
    let first = write(addr, "llama", &[11, 12, 13]);
    assert!(first.iter().all(|u| u.starts_with("file://")), "{first:?}");
    assert_eq!(matched(addr, "llama", &[11, 12, 13, 14]), 3);
    assert!(proc.terminate().success());

    // Same data dir: the blocks are still served, and new writes get
    // extents no served block holds (the file pool was restored).
    let (proc, addr) = start(&mut serve(data.path(), &shm));
    assert_eq!(matched(addr, "llama", &[11, 12, 13]), 3);
    let second = write(addr, "llama", &[21, 22, 23]);
    let offset = |u: &str| {
        u.split("offset=")
            .nth(1)
            .map(|r| r.split('&').next().unwrap_or("").to_owned())
    };
    for u in &second {
        assert!(
            first.iter().all(|f| offset(f) != offset(u)),
            "{u} reuses a live extent of {first:?}"
        );
    }
    assert!(proc.terminate().success());
}

#[test]
fn meta_frontends_share_one_redis_index() {
    let redis = RedisServer::start().expect("start redis-server (.ci/run installs it)");
    let url = redis.url();
    let pool = tempfile::tempdir().unwrap();
    let frontend = |data: &Path| {
        let mut c = support::kvtier(&["meta", "--index", &url], data);
        // One shared pool directory, as on a shared file system.
        c.env(
            "KVTIER_META__DEFAULT_STORAGE",
            format!("file://{}", pool.path().display()),
        );
        c
    };
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, addr_a) = start(&mut frontend(d1.path()));
    let (b, addr_b) = start(&mut frontend(d2.path()));
    register(addr_a, "qwen");
    // B sees A's instance and A's blocks, and a key A is writing is not
    // granted again through B.
    let grant = post(
        addr_a,
        "startWriteCache",
        json!({"instance_id": "qwen", "block_keys": [1, 2]}),
    );
    let again = post(
        addr_b,
        "startWriteCache",
        json!({"instance_id": "qwen", "block_keys": [1, 2]}),
    );
    assert_eq!(
        again["locations"].as_array().map_or(0, Vec::len),
        0,
        "{again}"
    );
    post(
        addr_a,
        "finishWriteCache",
        json!({
            "instance_id": "qwen",
            "write_session_id": grant["write_session_id"],
            "success_blocks": {"bool_masks": {"values": [true, true]}},
        }),
    );
    assert_eq!(matched(addr_b, "qwen", &[1, 2, 3]), 2);
    // A frontend restarts with nothing of its own: B still serves.
    assert!(a.terminate().success());
    assert_eq!(matched(addr_b, "qwen", &[1, 2]), 2);
    assert!(b.terminate().success());
}

/// `kvtier manager`, the subcommand's name before it was `meta`, still runs
/// the metadata service for one release (with the old `--meta` flag too),
/// and says on stderr that it is deprecated; `kvtier meta` does not.
#[test]
fn the_old_manager_name_still_runs_meta_with_a_deprecation_note() {
    let deprecated = |lines: &[String]| {
        lines
            .iter()
            .any(|l| l.contains("`kvtier manager` is deprecated") && l.contains("`kvtier meta`"))
    };
    let data = tempfile::tempdir().unwrap();
    let (proc, lines) = support::start_logged(&mut support::kvtier(
        &["manager", "--meta", "memory"],
        data.path(),
    ));
    assert!(deprecated(&lines), "no deprecation note: {lines:#?}");
    let addr = addr_in(lines.last().expect("listening line"), "meta_http=");
    register(addr, "old-name");
    assert!(proc.terminate().success());

    let (proc, lines) = support::start_logged(&mut support::kvtier(
        &["meta", "--index", "memory"],
        data.path(),
    ));
    assert!(!deprecated(&lines), "`kvtier meta` warned: {lines:#?}");
    assert!(proc.terminate().success());
}

/// `kvtier --help` lists the subcommand as `meta` and never as `manager`
/// (the old name is a hidden alias).
#[test]
fn help_lists_meta_and_not_manager() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .arg("--help")
        .output()
        .expect("run kvtier --help");
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8(out.stdout).expect("UTF-8 help");
    // The subcommands: the first word of each line under "Commands:".
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(commands.contains(&"serve"), "{help}");
    assert!(commands.contains(&"meta"), "{help}");
    assert!(!commands.contains(&"manager"), "{help}");
    assert!(!help.contains("kvtier manager"), "{help}");
}
