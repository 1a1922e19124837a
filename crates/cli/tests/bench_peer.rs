//! `kvtier bench peer --preset tiny` as a CI smoke test: the real binary
//! starts a node, serves its blocks to a reader in the same process over
//! loopback, and its JSON has every figure. Only presence and sanity are
//! checked, never timings.

use std::process::Command;

use serde_json::Value;

fn run_tiny() -> Value {
    run_tiny_with(&[])
}

fn run_tiny_with(extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args(["bench", "peer", "--preset", "tiny", "--blocks", "8"])
        .args(["--rounds", "2", "--json"])
        .args(extra)
        .output()
        .unwrap_or_else(|e| panic!("running kvtier: {e}"));
    assert!(
        out.status.success(),
        "kvtier bench peer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// A spread at `v` that is positive and ordered.
fn positive_spread(v: &Value, what: &str) {
    let get = |k: &str| {
        v[k].as_f64()
            .unwrap_or_else(|| panic!("{what}/{k} is not a number: {v:#}"))
    };
    let (median, min, max) = (get("median"), get("min"), get("max"));
    assert!(min > 0.0, "{what}: min {min}");
    assert!(min <= median && median <= max, "{what}: unordered {v:#}");
}

#[test]
fn bench_peer_tiny_reports_both_rows_against_raw_tcp() {
    let v = run_tiny();
    assert_eq!(v["preset"], "tiny");
    assert_eq!(v["one_process"], true);
    let rows = v["rows"].as_array().expect("rows");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(names, ["whole_block", "single_layer"]);
    let block = v["block_bytes"].as_u64().expect("block_bytes");
    let layer = v["layer_bytes"].as_u64().expect("layer_bytes");
    for (row, bytes) in rows.iter().zip([block, layer]) {
        assert_eq!(row["request_bytes"].as_u64(), Some(bytes));
        assert_eq!(row["requests"].as_u64(), Some(8));
        positive_spread(&row["ratio"], "ratio");
        for side in ["raw_tcp", "peer"] {
            let s = &row[side];
            positive_spread(&s["mb_s"], "mb_s");
            positive_spread(&s["process_cpu_us_per_block"], "process cpu");
            let (p50, p99) = (s["p50_us"].as_f64(), s["p99_us"].as_f64());
            assert!(p50.is_some_and(|p| p > 0.0) && p50 <= p99, "{s:#}");
        }
    }
}

/// `--load`: a node's `Load` of the other's blocks in each mode asked,
/// whole and streamed, each read back exact by the bench (it fails
/// otherwise); the first layer is never later than the last.
#[test]
fn bench_peer_load_reports_whole_and_streamed_loads() {
    let v = run_tiny_with(&["--load", "--layer-groups", "0,2"]);
    let modes = v.as_array().expect("modes");
    let groups: Vec<u64> = modes
        .iter()
        .filter_map(|m| m["layer_groups"].as_u64())
        .collect();
    assert_eq!(groups, [0, 2]);
    for m in modes {
        for k in [
            "load_ok_ms",
            "first_layer_ms",
            "last_layer_ms",
            "process_cpu_us_per_block",
        ] {
            positive_spread(&m[k], k);
        }
        let median = |k: &str| m[k]["median"].as_f64().unwrap();
        assert!(median("first_layer_ms") <= median("last_layer_ms"), "{m:#}");
    }
}
