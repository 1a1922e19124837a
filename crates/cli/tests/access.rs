//! Who can reach the binary's listeners: `kvtier serve` binds loopback by
//! default; a non-loopback bind with authentication off is refused before
//! any state exists unless `meta.allow_unauthenticated_remote` accepts it
//! (then it starts, with a warning); `[[meta.accounts]]` provisions
//! accounts scoped to groups, with keys from the environment or as hashes.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use support::Proc;

mod support;

const ADMIN_KEY: &str = "admin-key-for-access-tests-0123";
const ENGINE_KEY: &str = "engine-key-for-access-tests-4567";
const READER_KEY: &str = "reader-key-for-access-tests-89ab";

/// `kvtier <args>`, the bind address left to the configuration under
/// test.
fn kvtier(args: &[&str], data: &Path) -> Command {
    let mut c = support::kvtier(args, data);
    c.env_remove("KVTIER_META__BIND");
    c
}

/// `kvtier serve` with a tiny store in `data` and arena `shm`, the bind
/// address left to the configuration under test.
fn serve(data: &Path, shm: &str) -> Command {
    let mut c = support::serve(data, shm);
    c.env_remove("KVTIER_META__BIND");
    c
}

/// `kvtier meta` over a memory index.
fn meta_frontend(data: &Path) -> Command {
    kvtier(&["meta", "--index", "memory"], data)
}

/// Starts `cmd`; returns it, the log lines up to its "listening" line, and
/// the four listener addresses that line names (read as the lines come).
fn start(cmd: &mut Command) -> (Proc, Vec<String>, Vec<(String, SocketAddr)>) {
    let (proc, lines) = support::start_logged(cmd);
    let last = lines.last().cloned().unwrap_or_default();
    let addrs = ["meta_grpc", "meta_http", "admin_grpc", "admin_http"]
        .iter()
        .map(|name| {
            let addr = last
                .split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("listening line names {name}: {last}"));
            (name.to_string(), addr.parse().expect("an address"))
        })
        .collect();
    (proc, lines, addrs)
}

fn addr_of(addrs: &[(String, SocketAddr)], name: &str) -> SocketAddr {
    let found = addrs.iter().find(|(n, _)| n == name);
    found.map(|(_, a)| *a).expect("listener")
}

/// `POST /api/<method>` with a JSON body and an optional bearer key;
/// returns the status code and the JSON answer (`Null` if none).
fn post(addr: SocketAddr, method: &str, key: Option<&str>, body: Value) -> (u16, Value) {
    support::http(addr, "POST", &format!("/api/{method}"), key, &body)
}

fn status(v: &Value) -> (&str, &str) {
    let s = &v["header"]["status"];
    (
        s["code"].as_str().unwrap_or("<none>"),
        s["message"].as_str().unwrap_or(""),
    )
}

fn register(instance: &str, group: &str) -> Value {
    json!({
        "instance_id": instance,
        "instance_group": group,
        "block_size": 16,
        "model_deployment": {"model_name": "tiny"},
        "location_spec_infos": [{"name": "tp0", "size": 4096}],
    })
}

/// The stored form of `key` that `key_hash` takes.
fn key_hash(key: &str) -> String {
    let salt = [7u8; 16];
    let mut h = Sha256::new();
    h.update(salt);
    h.update(key.as_bytes());
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!("sha256${}${}", hex(&salt), hex(&h.finalize()))
}

#[test]
fn the_effective_default_bind_is_loopback() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .arg("config")
        .env_remove("KVTIER_META__BIND")
        .env_remove("KVTIER_CONFIG")
        .current_dir(tempfile::tempdir().unwrap().path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("bind = \"127.0.0.1\""), "{text}");
    assert!(
        text.contains("allow_unauthenticated_remote = false"),
        "{text}"
    );
}

#[test]
fn serve_listens_on_loopback_by_default() {
    let data = tempfile::tempdir().unwrap();
    let shm = format!("kvt-access-{}", std::process::id());
    let (_proc, _, addrs) = start(&mut serve(data.path(), &shm));
    for (name, addr) in &addrs {
        assert_eq!(
            addr.ip().to_string(),
            "127.0.0.1",
            "{name} listens on {addr}"
        );
    }
}

#[test]
fn an_open_remote_bind_is_refused_before_any_state_exists() {
    let data = tempfile::tempdir().unwrap();
    let shm = format!("kvt-access-open-{}", std::process::id());
    let out = serve(data.path(), &shm)
        .env("KVTIER_META__BIND", "0.0.0.0")
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "kvtier serve started open on 0.0.0.0"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("meta.bind") && err.contains("meta.allow_unauthenticated_remote = true"),
        "{err}"
    );
    assert!(
        !Path::new("/dev/shm").join(&shm).exists(),
        "an arena was created"
    );
    assert!(
        !data.path().join("disk").exists(),
        "a disk tier was created"
    );
}

#[test]
fn auth_without_any_admin_is_refused_before_any_state_exists() {
    let data = tempfile::tempdir().unwrap();
    let shm = format!("kvt-access-noadmin-{}", std::process::id());
    let out = serve(data.path(), &shm)
        .env("KVTIER_META__AUTH", "true")
        .env_remove("KVTIER_META__ADMIN_API_KEY")
        .env_remove("KVTIER_META__ACCOUNTS")
        .output()
        .unwrap();
    assert!(!out.status.success(), "kvtier serve started with no admin");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no admin account exists"), "{err}");
    assert!(
        !Path::new("/dev/shm").join(&shm).exists(),
        "an arena was created"
    );
    for made in ["disk", "pool", "meta.redb"] {
        assert!(!data.path().join(made).exists(), "{made} was created");
    }
}

#[test]
fn an_open_remote_bind_starts_when_explicitly_allowed_with_a_warning() {
    let data = tempfile::tempdir().unwrap();
    let (_proc, lines, addrs) = start(
        meta_frontend(data.path())
            .env("KVTIER_META__BIND", "0.0.0.0")
            .env("KVTIER_META__ALLOW_UNAUTHENTICATED_REMOTE", "true"),
    );
    for (name, addr) in &addrs {
        assert!(addr.ip().is_unspecified(), "{name} listens on {addr}");
    }
    let warned = lines
        .iter()
        .filter(|l| l.contains("WARN") && l.contains("authentication is off"))
        .count();
    assert_eq!(warned, 4, "one warning per listener: {lines:#?}");
}

#[test]
fn configured_accounts_are_scoped_to_their_groups() {
    let data = tempfile::tempdir().unwrap();
    let config = data.path().join("kvtier.toml");
    std::fs::write(
        &config,
        format!(
            "[meta]\nauth = true\n\n\
             [[meta.accounts]]\nname = \"engine\"\ngroups = [\"default\"]\nkey_env = \"KVTIER_TEST_ENGINE_KEY\"\n\n\
             [[meta.accounts]]\nname = \"reader\"\nkey_hash = \"{}\"\n",
            key_hash(READER_KEY)
        ),
    )
    .unwrap();
    let with_config = |cmd: &mut Command| {
        cmd.env("KVTIER_CONFIG", &config)
            .env("KVTIER_META__ADMIN_API_KEY", ADMIN_KEY);
    };

    // A key_env variable that is not set: a clear error, nothing started.
    let mut cmd = meta_frontend(data.path());
    with_config(&mut cmd);
    let out = cmd.output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("KVTIER_TEST_ENGINE_KEY") && err.contains("engine"),
        "{err}"
    );

    let mut cmd = meta_frontend(data.path());
    with_config(&mut cmd);
    cmd.env("KVTIER_TEST_ENGINE_KEY", ENGINE_KEY);
    let (_proc, _, addrs) = start(&mut cmd);
    let meta = addr_of(&addrs, "meta_http");

    // The engine works in its group, and nowhere else.
    let (st, r) = post(
        meta,
        "registerInstance",
        Some(ENGINE_KEY),
        register("llama", "default"),
    );
    assert_eq!((st, status(&r).0), (200, "OK"), "{r}");
    let (_, r) = post(
        meta,
        "registerInstance",
        Some(ENGINE_KEY),
        register("x", "other"),
    );
    let (code, message) = status(&r);
    assert_eq!(code, "INVALID_ARGUMENT", "{r}");
    assert!(
        message.contains("may not use instance group \"other\""),
        "{r}"
    );

    // The hashed key authenticates, and its account (no groups) reaches
    // nothing; a wrong key does not authenticate.
    let (st, r) = post(
        meta,
        "getInstanceInfo",
        Some(READER_KEY),
        json!({"instance_id": "llama"}),
    );
    assert_eq!(st, 200, "{r}");
    assert!(status(&r).1.contains("allowed no instance group"), "{r}");
    let (st, _) = post(
        meta,
        "getInstanceInfo",
        Some("not-a-key-of-anyone-0000"),
        json!({"instance_id": "llama"}),
    );
    assert_eq!(st, 401);

    // The admin sees both accounts with their groups.
    let admin = addr_of(&addrs, "admin_http");
    let (_, r) = post(admin, "listAccount", Some(ADMIN_KEY), json!({}));
    let accounts = r["accounts"].as_array().cloned().unwrap_or_default();
    let groups_of = |name: &str| {
        accounts
            .iter()
            .find(|a| a["user_name"] == name)
            .map(|a| a["allowed_groups"].clone())
    };
    assert_eq!(groups_of("engine"), Some(json!(["default"])), "{r}");
    assert_eq!(groups_of("reader"), Some(json!([])), "{r}");
}
