//! The daemon takes the engine's shape: `kvtier serve` without `[geometry]`
//! learns it from the first engine's `Hello`, keeps it in
//! `<data-dir>/shape.toml` for its next start (where blocks stored before
//! still load), refuses an engine of another shape naming both, refuses a
//! shape file it cannot trust, lets exactly one of two concurrent first
//! shapes win, and says "no shape yet" on its HTTP endpoint meanwhile.
//! Then `kvtier shape`: the geometry of a Hugging Face config.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Barrier};

use kvtier_client::{BlockHash, Client, ClientConfig, ClientError, StoreOutcome, WireGeometry};
use kvtier_core::{Attention, Dtype, Geometry, GeometryDocument, ModelPreset};
use kvtier_protocol::ErrorCode;
use support::node::{Daemon, block, check_held_block, geometry, namespace, shm_name};

mod support;

/// An engine of another shape than [`geometry`]: twice the layers, each
/// half as large (the same block bytes), and 32 tokens per block.
fn other_config(socket: &Path) -> ClientConfig {
    let mut ns = namespace();
    ns.block_size_tokens = 32;
    ns.model = "other".into();
    let g = geometry();
    let wire = WireGeometry {
        layers: g.layers * 2,
        layer_bytes: g.layer_bytes() / 2,
        block_bytes: g.block_bytes(),
    };
    ClientConfig::new(socket, ns, wire)
}

/// The refusal `config` gets, which must be a geometry mismatch.
fn refusal(config: ClientConfig) -> String {
    match Client::connect(config) {
        Err(ClientError::Refused { code, message }) if code == ErrorCode::GEOMETRY_MISMATCH => {
            message
        }
        Err(e) => panic!("refused otherwise: {e}"),
        Ok(_) => panic!("another shape was accepted"),
    }
}

/// Stores blocks `keys` through `client`, each new.
fn store(client: &mut Client, keys: &[u128]) {
    let blocks: Vec<Vec<u8>> = keys.iter().map(|&k| block(k)).collect();
    let batch: Vec<(BlockHash, &[u8])> = keys
        .iter()
        .zip(&blocks)
        .map(|(&k, b)| (BlockHash(k), b.as_slice()))
        .collect();
    let stored = client.store(&batch).expect("store");
    assert_eq!(stored, vec![StoreOutcome::Stored; keys.len()]);
}

/// What [`geometry`]'s engines teach a daemon: each layer one part of
/// `layer bytes / (tokens x 4)` f32 elements per token.
fn learned() -> Geometry {
    let g = geometry();
    Geometry {
        layers: g.layers,
        attention: Attention::Mla {
            latent_dim: (g.layer_bytes() / (g.tokens_per_block as u64 * 4)) as u32,
        },
        dtype: Dtype::F32,
        tokens_per_block: g.tokens_per_block,
        tp_size: 1,
        tp_rank: 0,
    }
}

#[test]
fn the_first_engine_sets_the_shape_which_is_kept_and_another_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let shape_file = dir.path().join("shape.toml");
    let mut daemon = Daemon::start_unshaped(dir.path(), &shm_name("shape-learn"), &[]);
    assert!(
        daemon.ready_line().contains("none yet"),
        "{}",
        daemon.ready_line()
    );
    assert!(!shape_file.exists(), "no shape before the first Hello");

    let mut client = daemon.client();
    store(&mut client, &[1, 2, 3, 4]);
    let meta = std::fs::metadata(&shape_file).expect("the shape is kept");
    assert_eq!(meta.mode() & 0o777, 0o600);
    let text = std::fs::read_to_string(&shape_file).unwrap();
    assert_eq!(GeometryDocument::parse_geometry(&text).unwrap(), learned());
    assert_eq!(learned().block_bytes(), geometry().block_bytes());

    let why = refusal(other_config(&daemon.socket()));
    assert!(why.contains("this engine's blocks are 4 layers"), "{why}");
    assert!(why.contains("32 tokens per block"), "{why}");
    assert!(why.contains("this node holds blocks of 2 layers"), "{why}");
    assert!(
        why.contains("16 tokens per block") && why.contains("learned"),
        "{why}"
    );
    drop(client);

    // Killed: the next start takes the kept shape without any Hello.
    daemon.kill();
    daemon.restart();
    let ready = daemon.ready_line().to_owned();
    assert!(
        ready.contains("kept in") && ready.contains("2 layers"),
        "{ready}"
    );
    let mut client = daemon.client();
    for key in 1..=4 {
        assert!(
            check_held_block(&mut client, key),
            "block {key} after the restart"
        );
    }
    let why = refusal(other_config(&daemon.socket()));
    assert!(why.contains("kept in"), "{why}");
}

#[test]
fn concurrent_first_hellos_of_two_shapes_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start_unshaped(dir.path(), &shm_name("shape-race"), &[]);
    let per_shape = 4;
    let barrier = Arc::new(Barrier::new(2 * per_shape));
    let threads: Vec<_> = (0..2 * per_shape)
        .map(|i| {
            let config = match i % 2 {
                0 => daemon.client_config(),
                _ => other_config(&daemon.socket()),
            };
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                (i % 2, Client::connect(config).map(drop))
            })
        })
        .collect();
    let mut accepted = [0, 0];
    for t in threads {
        match t.join().expect("a client thread") {
            (shape, Ok(())) => accepted[shape] += 1,
            (_, Err(ClientError::Refused { code, .. })) => {
                assert_eq!(code, ErrorCode::GEOMETRY_MISMATCH)
            }
            (_, Err(e)) => panic!("a connect failed otherwise: {e}"),
        }
    }
    let winner = match accepted {
        [n, 0] if n == per_shape => 0,
        [0, n] if n == per_shape => 1,
        other => panic!("one shape must win whole: accepted {other:?}"),
    };
    let kept = std::fs::read_to_string(dir.path().join("shape.toml")).unwrap();
    let kept = GeometryDocument::parse_geometry(&kept).unwrap();
    assert_eq!(kept.layers, [2, 4][winner], "the winner's shape is kept");
}

/// `kvtier serve` without `[geometry]` on `data`, run to its exit: its
/// status and stderr.
fn failed_start(data: &Path, env: &[(&str, &str)]) -> String {
    let out = support::serve_unshaped(data, &shm_name("shape-bad"))
        .env("KVTIER_META__ENABLED", "false")
        .envs(env.iter().copied())
        .output()
        .expect("run kvtier serve");
    assert!(!out.status.success(), "the start must fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_shape_file_that_cannot_be_trusted_or_disagrees_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::start_unshaped(dir.path(), &shm_name("shape-file"), &[]);
    drop(daemon.client());
    daemon.terminate();
    let file = dir.path().join("shape.toml");

    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
    let err = failed_start(dir.path(), &[]);
    assert!(err.contains("shape.toml") && err.contains("0666"), "{err}");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();

    let good = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, good.replace("layers = 2", "layers = \"two\"")).unwrap();
    let err = failed_start(dir.path(), &[]);
    assert!(err.contains("cannot be used"), "{err}");
    std::fs::write(&file, &good).unwrap();

    // A configured geometry must be the kept one: the stored blocks have it.
    let err = failed_start(
        dir.path(),
        &[
            ("KVTIER_GEOMETRY__PRESET", "tiny"),
            ("KVTIER_GEOMETRY__TOKENS_PER_BLOCK", "16"),
        ],
    );
    assert!(
        err.contains("is not the shape this data directory keeps"),
        "{err}"
    );
    assert!(
        err.contains("2 KV heads of 32") && err.contains("a latent of 128"),
        "{err}"
    );
    // The kept file, untouched, still starts the daemon.
    let mut again = Daemon::start_unshaped(dir.path(), &shm_name("shape-file2"), &[]);
    assert!(again.ready_line().contains("kept in"));
    again.terminate();
}

#[test]
fn a_configured_geometry_the_tiers_cannot_open_with_is_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    // Llama-3-8B blocks of 2 MiB do not fit a 1 MiB arena.
    let err = failed_start(
        dir.path(),
        &[
            ("KVTIER_GEOMETRY__PRESET", "llama3-8b"),
            ("KVTIER_MEMORY__CAPACITY", "1MiB"),
        ],
    );
    assert!(err.contains("smaller than one slot"), "{err}");
    assert!(!dir.path().join("shape.toml").exists(), "not kept");
    // So the next start may take another shape.
    let mut daemon = Daemon::start_unshaped(dir.path(), &shm_name("shape-unkept"), &[]);
    drop(daemon.client());
    daemon.terminate();
    let kept = std::fs::read_to_string(dir.path().join("shape.toml")).unwrap();
    assert_eq!(GeometryDocument::parse_geometry(&kept).unwrap(), learned());
}

#[test]
fn the_metrics_endpoint_says_no_shape_yet_until_an_engine_connects() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start_unshaped(
        dir.path(),
        &shm_name("shape-http"),
        &[("KVTIER_MANAGER__METRICS_ADDR", "127.0.0.1:0")],
    );
    let addr = daemon
        .ready_line()
        .split_whitespace()
        .find_map(|w| w.strip_prefix("metrics="))
        .and_then(|a| a.parse().ok())
        .expect("the metrics address in the ready line");
    let get = |path: &str| support::http_text(addr, "GET", path, None, "");
    let (status, health) = get("/health");
    assert_eq!(status, 200);
    assert!(health.contains("no shape yet"), "{health}");
    let (_, metrics) = get("/metrics");
    assert!(metrics.contains("kvtier_node_shape_known 0"), "{metrics}");
    assert!(!metrics.contains("kvtier_node_sessions_open"), "{metrics}");
    drop(daemon.client());
    let (_, metrics) = get("/metrics");
    assert!(metrics.contains("kvtier_node_shape_known 1"), "{metrics}");
    assert!(
        metrics.contains("kvtier_node_sessions_opened_total 1"),
        "{metrics}"
    );
    assert_eq!(get("/health").1, "ok\n");
}

/// `kvtier shape <args>`: its exit status, stdout and stderr.
fn shape(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .arg("shape")
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run kvtier shape");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// A model directory holding `config`.
fn model(dir: &Path, name: &str, config: &str) -> String {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("config.json"), config).unwrap();
    d.display().to_string()
}

const TINY_LLAMA: &str = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "torch_dtype": "float32"}"#;
const TINY_DEEPSEEK: &str = r#"{"architectures": ["DeepseekV2ForCausalLM"],
    "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4,
    "num_hidden_layers": 2, "kv_lora_rank": 512, "q_lora_rank": null,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32, "torch_dtype": "float32"}"#;

/// The geometry `kvtier shape` printed, from its TOML and from its
/// environment lines, which must agree.
fn printed(out: &str) -> Geometry {
    let (toml, env) = out
        .split_once("# or as environment variables:")
        .expect("both forms");
    let g = GeometryDocument::parse_geometry(toml).expect("the TOML resolves");
    let vars = env
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
    let doc: GeometryDocument = kvtier_core::config::from_toml_with_env("", vars).expect("env");
    assert_eq!(doc.geometry.resolve().unwrap(), g);
    g
}

#[test]
fn kvtier_shape_prints_the_geometry_of_a_model_config() {
    let dir = tempfile::tempdir().unwrap();
    let llama = model(dir.path(), "llama", TINY_LLAMA);
    let (ok, out, err) = shape(&[&llama, "--platform", "cpu", "--block-size", "32"]);
    assert!(ok, "{err}");
    assert_eq!(printed(&out), ModelPreset::Tiny.geometry(32));
    // TP 4 over 2 KV heads: each rank holds (a copy of) one.
    let (ok, out, _) = shape(&[&llama, "--tp", "4", "--dtype", "bf16"]);
    assert!(ok);
    let g = printed(&out);
    assert_eq!(
        (g.tp_size, g.tokens_per_block, g.dtype),
        (4, 16, Dtype::Bf16)
    );
    assert_eq!(g.layer_bytes(), 2 * 16 * 32 * 2);
    // The connector's head shards: one head per stored object at any TP.
    let (ok, out, _) = shape(&[&llama, "--tp", "2", "--shard-heads", "1"]);
    assert!(ok);
    assert_eq!(printed(&out).layer_bytes(), 2 * 16 * 32 * 4);

    let deepseek = model(dir.path(), "deepseek", TINY_DEEPSEEK);
    let (ok, out, err) = shape(&[
        &deepseek,
        "--platform",
        "cpu",
        "--block-size",
        "32",
        "--tp",
        "2",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("blocks of 16 tokens"),
        "the CPU MLA block size is said: {out}"
    );
    let g = printed(&out);
    assert_eq!(g.attention, Attention::Mla { latent_dim: 576 });
    assert_eq!((g.tokens_per_block, g.layer_bytes()), (16, 16 * 576 * 4));
    let (_, out, _) = shape(&[&deepseek, "--format", "env"]);
    assert!(
        out.starts_with("KVTIER_GEOMETRY__PRESET=deepseek-v3\n"),
        "{out}"
    );
}

#[test]
fn kvtier_shape_says_what_is_wrong_with_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            model(dir.path(), "missing", "{}").replace("missing", "absent"),
            "reading the model config",
        ),
        (model(dir.path(), "notjson", "{layers"), "is not JSON"),
        (
            model(dir.path(), "bert", r#"{"model_type": "bert"}"#),
            "num_hidden_layers",
        ),
        (
            model(
                dir.path(),
                "nodtype",
                r#"{"num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 8}"#,
            ),
            "pass --dtype",
        ),
        (
            model(
                dir.path(),
                "oddtp",
                &TINY_LLAMA.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3"),
            ),
            "do not split over tp_size",
        ),
    ];
    for (path, want) in cases {
        let tp = if path.ends_with("oddtp") { "2" } else { "1" };
        let (ok, _, err) = shape(&[&path, "--tp", tp]);
        assert!(!ok, "{path} must fail");
        assert!(err.contains(want), "{path}: {err}");
    }
    let llama = model(dir.path(), "llama", TINY_LLAMA);
    let (ok, _, err) = shape(&[&llama, "--dtype", "float13"]);
    assert!(!ok && err.contains("float13"), "{err}");
    let (ok, _, err) = shape(&[&llama, "--shard-heads", "3"]);
    assert!(!ok && err.contains("--shard-heads 3"), "{err}");
}
