//! `kvtier replay` end to end: the real binary on small traces.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kvtier(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .arg("replay")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running kvtier: {e}"))
}

/// Three documents of four 512-token blocks, each asked for three times in
/// turn, in the Mooncake format.
fn small_trace(dir: &Path) -> PathBuf {
    let mut lines = String::new();
    for round in 0..3u32 {
        for doc in 0..3u32 {
            let ids: Vec<String> = (0..4).map(|b| (doc * 100 + b).to_string()).collect();
            lines.push_str(&format!(
                "{{\"timestamp\": {}, \"input_length\": 2000, \"output_length\": 10, \"hash_ids\": [{}]}}\n",
                (round * 3 + doc) * 1000,
                ids.join(", ")
            ));
        }
    }
    let path = dir.join("small.jsonl");
    std::fs::write(&path, lines).unwrap_or_else(|e| panic!("{e}"));
    path
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn json_has_a_result_per_policy_and_capacity_and_the_report_is_html() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let trace = small_trace(dir.path());
    let html = dir.path().join("out.html");
    let out = kvtier(&[
        "--trace",
        trace.to_str().unwrap_or_default(),
        "--policy",
        "lru,lfu,belady",
        "--capacity",
        "4,12",
        "--tiers",
        "G1=4,G2=8",
        "--json",
        "--report",
        html.to_str().unwrap_or_default(),
    ]);
    let v = json(&out);
    let results = v["results"].as_array().cloned().unwrap_or_default();
    assert_eq!(results.len(), 9);
    for r in &results {
        assert!(
            r["policy"].is_string() && r["capacity"].is_u64() && r["hit_rate"].is_f64(),
            "{r}"
        );
        assert!(r["ttft"]["with_cache"]["mean"].as_f64().unwrap_or(-1.0) > 0.0);
        assert!(r["cost"]["dollars_per_mtok_with_cache"].is_f64());
    }
    assert_eq!(results[0]["policy"], "lru");
    assert_eq!(results[1]["capacity"], 12);
    assert_eq!(results[2]["tiers"][1]["name"], "G2");
    assert_eq!(v["trace"]["requests"], 9);
    // LRU and Belady ran on every layout, but they meet on each of these
    // (a request fills 4 blocks; 12 hold everything): no gap to share.
    assert!(results.iter().all(|r| r["gap_closed"].is_null()), "{v}");
    let page = std::fs::read_to_string(&html).unwrap_or_else(|e| panic!("{e}"));
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert!(page.matches("<svg").count() >= 4);
    assert!(page.contains("belady"));
}

#[test]
fn a_capacity_sweep_runs_every_capacity_and_lru_alone_has_no_gap() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let trace = small_trace(dir.path());
    let path = trace.to_str().unwrap_or_default();
    let args = ["--trace", path, "--capacity", "2..16", "--json", "--policy"];
    let v = json(&kvtier(&[&args[..], &["lru,arc,belady"]].concat()));
    let results = v["results"].as_array().cloned().unwrap_or_default();
    let caps: Vec<u64> = results
        .iter()
        .filter_map(|r| r["capacity"].as_u64())
        .collect();
    assert_eq!(caps, [2, 4, 8, 16, 2, 4, 8, 16, 2, 4, 8, 16]);
    // At 8 blocks LRU thrashes on the 12-block cycle and Belady keeps some:
    // LRU closes 0 of the gap, Belady all of it; at 16 there is no gap.
    let gap = |policy: &str, cap: u64| {
        results
            .iter()
            .find(|r| r["policy"] == policy && r["capacity"] == cap)
            .map(|r| r["gap_closed"].clone())
    };
    assert_eq!(gap("lru", 8), Some(serde_json::json!(0.0)), "{v}");
    assert_eq!(gap("belady", 8), Some(serde_json::json!(1.0)));
    assert!(gap("arc", 8).is_some_and(|g| g.is_f64()));
    assert!(gap("arc", 16).is_some_and(|g| g.is_null()));
    let v = json(&kvtier(&[&args[..], &["lru,arc"]].concat()));
    let results = v["results"].as_array().cloned().unwrap_or_default();
    assert_eq!(results.len(), 8);
    assert!(results.iter().all(|r| r["gap_closed"].is_null()));
    let out = kvtier(&["--trace", path, "--capacity", "16..2", "--json"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--capacity"));
}

#[test]
fn csv_and_table_outputs() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let trace = small_trace(dir.path());
    let path = trace.to_str().unwrap_or_default();
    let out = kvtier(&["--trace", path, "--capacity", "4,8,12", "--csv"]);
    assert!(out.status.success());
    let csv = String::from_utf8_lossy(&out.stdout);
    assert_eq!(csv.lines().count(), 4);
    assert!(csv.starts_with("policy,capacity,"));

    let out = kvtier(&[
        "--trace",
        path,
        "--capacity",
        "4,12",
        "--target-hit-rate",
        "0.5",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("hit rate") && table.contains("cheapest meeting"),
        "{table}"
    );
}

#[test]
fn bad_input_is_reported_with_context() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let trace = small_trace(dir.path());
    let path = trace.to_str().unwrap_or_default();
    let err = |args: &[&str]| {
        let out = kvtier(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(err(&["--trace", path, "--capacity", "4", "--policy", "fifo9"]).contains("--policy"));
    assert!(err(&["--trace", path, "--capacity", "4", "--gpu", "tpu"]).contains("--gpu"));
    assert!(err(&["--trace", path, "--tiers", "G1:4"]).contains("--tiers"));
    assert!(err(&["--trace", path]).contains("--capacity"));
    let bad = dir.path().join("bad.jsonl");
    let good_line = std::fs::read_to_string(&trace).unwrap_or_default();
    let first = good_line.lines().next().unwrap_or_default();
    std::fs::write(&bad, format!("{first}\n{first}\nnot json\n")).unwrap_or_else(|e| panic!("{e}"));
    let msg = err(&[
        "--trace",
        bad.to_str().unwrap_or_default(),
        "--capacity",
        "4",
    ]);
    assert!(msg.contains("line 3") && msg.contains("bad.jsonl"), "{msg}");
    let missing = dir.path().join("missing.jsonl");
    assert!(
        err(&[
            "--trace",
            missing.to_str().unwrap_or_default(),
            "--capacity",
            "4"
        ])
        .contains("missing.jsonl")
    );
}

#[test]
fn the_public_conversation_trace_replays() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces/mooncake_conversation_trace.jsonl");
    // The shared traces sit beside the repository in development and CI; a
    // missing trace is a broken setup, not a reason to skip.
    assert!(path.exists(), "{} not found", path.display());
    let out = kvtier(&[
        "--trace",
        path.to_str().unwrap_or_default(),
        "--limit",
        "300",
        "--policy",
        "lru,belady",
        "--capacity",
        "100,1000",
        "--json",
    ]);
    let v = json(&out);
    let results = v["results"].as_array().cloned().unwrap_or_default();
    assert_eq!(results.len(), 4);
    assert_eq!(v["trace"]["requests"], 300);
    assert_eq!(v["trace"]["tokens_per_block"], 512);
    // Belady is the bound: never below LRU at equal capacity.
    for i in 0..2 {
        let lru = results[i]["hit_rate"].as_f64().unwrap_or(0.0);
        let opt = results[i + 2]["hit_rate"].as_f64().unwrap_or(0.0);
        assert!(
            opt + 1e-12 >= lru,
            "capacity {}: belady {opt} < lru {lru}",
            results[i]["capacity"]
        );
    }
}

#[test]
fn capacities_in_bytes_become_whole_blocks_of_the_model() {
    // Llama-3-8B: 128 KiB of KV per token; the trace has 512-token blocks,
    // so one block is 64 MiB and 200MiB holds 3 whole blocks.
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let trace = small_trace(dir.path());
    let out = kvtier(&[
        "--trace",
        trace.to_str().unwrap_or_default(),
        "--model",
        "llama3-8b",
        "--capacity",
        "200MiB,5",
        "--tiers",
        "G2=128MiB,G3=1GiB",
        "--json",
    ]);
    let v = json(&out);
    let results = v["results"].as_array().cloned().unwrap_or_default();
    assert_eq!(results[0]["capacity"], 3);
    assert_eq!(results[1]["capacity"], 5);
    assert_eq!(results[2]["tiers"][0]["capacity_blocks"], 2);
    assert_eq!(results[2]["tiers"][1]["capacity_blocks"], 16);
    // Less than one block is refused with the block size named.
    let out = kvtier(&[
        "--trace",
        trace.to_str().unwrap_or_default(),
        "--model",
        "llama3-8b",
        "--capacity",
        "1MiB",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("67108864 bytes"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_random_trace_written_by_kvtier_trace_replays_and_a_seed_names_one_trace() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("random.jsonl");
    let write = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_kvtier"))
            .args(["trace", "random"])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running kvtier: {e}"));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let to_stdout = write(&["--seed", "7", "--requests", "300"]);
    write(&[
        "--seed",
        "7",
        "--requests",
        "300",
        "--out",
        path.to_str().unwrap_or_default(),
    ]);
    let in_file = std::fs::read(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(to_stdout, in_file);
    assert_eq!(in_file.iter().filter(|b| **b == b'\n').count(), 300);
    assert_ne!(write(&["--seed", "8", "--requests", "300"]), in_file);
    let v = json(&kvtier(&[
        "--trace",
        path.to_str().unwrap_or_default(),
        "--policy",
        "lru,slru,belady",
        "--capacity",
        "200",
        "--json",
    ]));
    let text = v.to_string();
    assert!(text.contains("\"requests\":300"), "{text}");
}
