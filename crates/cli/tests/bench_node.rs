//! `kvtier bench node --quick` as a CI smoke test: the real binary starts
//! its daemon and two client processes, and its JSON has every figure.
//! Only presence and sanity are checked, never timings.

use std::process::Command;

use serde_json::Value;

fn run_quick(extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args(["bench", "node", "--clients", "2", "--quick", "--json"])
        .args(extra)
        .output()
        .unwrap_or_else(|e| panic!("running kvtier: {e}"));
    assert!(
        out.status.success(),
        "kvtier bench node failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// The number at `path` (`/`-separated), which must exist.
fn num(v: &Value, path: &str) -> f64 {
    let mut at = v;
    for part in path.split('/') {
        at = match part.parse::<usize>() {
            Ok(i) => &at[i],
            Err(_) => &at[part],
        };
    }
    at.as_f64()
        .unwrap_or_else(|| panic!("{path} is not a number in {v:#}"))
}

/// A spread (median, min, max) that is positive and ordered.
fn positive_spread(v: &Value, path: &str) {
    let (median, min, max) = (
        num(v, &format!("{path}/median")),
        num(v, &format!("{path}/min")),
        num(v, &format!("{path}/max")),
    );
    assert!(min > 0.0, "{path}: min {min} in {v:#}");
    assert!(min <= median && median <= max, "{path}: unordered in {v:#}");
}

fn check_pass(v: &Value, pass: usize, samples: f64) {
    let p = format!("passes/{pass}");
    assert!(num(v, &format!("{p}/warmup_rounds")) >= 1.0);
    for phase in ["memcpy", "store", "load"] {
        positive_spread(v, &format!("{p}/mb_s/{phase}"));
        positive_spread(v, &format!("{p}/client_cpu_us_per_block/{phase}"));
        let faults = num(
            v,
            &format!("{p}/client_minor_faults_per_block/{phase}/median"),
        );
        assert!(faults >= 0.0);
    }
    positive_spread(v, &format!("{p}/store_ratio"));
    positive_spread(v, &format!("{p}/load_ratio"));
    for phase in ["store", "load"] {
        positive_spread(v, &format!("{p}/daemon_cpu_us_per_block/{phase}"));
    }
    for op in [
        "raw_lookup",
        "raw_reserve_commit",
        "raw_load",
        "lookup",
        "reserve",
        "commit",
        "reserve_commit",
        "load",
        "release",
    ] {
        let at = format!("{p}/control/{op}");
        positive_spread(v, &format!("{at}/p50_us"));
        let p99 = num(v, &format!("{at}/p99_us"));
        assert!(
            p99 >= num(v, &format!("{at}/p50_us/min")),
            "{at}: p99 {p99}"
        );
        assert_eq!(num(v, &format!("{at}/samples")), samples, "{at}");
    }
    // The daemon's CPU is measured per row (the rows a sample is one
    // request or more of), not per part of a row.
    for op in ["raw", "floor"] {
        let at = format!("{p}/control/{op}");
        assert!(num(v, &format!("{at}/daemon_cpu_us_per_sample/median")) >= 0.0);
    }
    for op in ["lookup", "reserve_commit", "load"] {
        let at = format!("{p}/control/{op}");
        positive_spread(v, &format!("{at}/daemon_cpu_us_per_sample"));
        positive_spread(v, &format!("{at}/daemon_cpu_us_per_key"));
        // A difference of two measurements: present, of any sign.
        num(v, &format!("{at}/daemon_cpu_us_per_key_over_floor/median"));
        // Against the raw row of as many round trips, same rounds.
        num(v, &format!("{at}/over_raw/p50_us/median"));
        positive_spread(v, &format!("{at}/over_raw/p50_ratio"));
    }
    for op in ["reserve", "commit", "release"] {
        let at = format!("{p}/control/{op}");
        for field in ["daemon_cpu_us_per_sample", "over_raw"] {
            assert!(
                v.pointer(&format!("/{at}/{field}"))
                    .is_some_and(Value::is_null),
                "{at}/{field}"
            );
        }
    }
    for op in [
        "raw",
        "raw_lookup",
        "raw_reserve_commit",
        "raw_load",
        "floor",
    ] {
        let at = format!("{p}/control/{op}");
        assert!(
            v.pointer(&format!("/{at}/over_raw"))
                .is_some_and(Value::is_null),
            "{at}"
        );
    }
}

#[test]
fn quick_run_with_two_clients_reports_every_figure() {
    let v = run_quick(&[]);
    assert_eq!(num(&v, "clients"), 2.0);
    assert_eq!(v["daemon"], "in-process");
    assert_eq!(num(&v, "control_keys"), 64.0);
    assert!(num(&v, "block_bytes") > 0.0);
    assert!(num(&v, "rounds") > 0.0);
    assert!(num(&v, "control_rounds") >= 2.0);
    let samples = 2.0 * num(&v, "samples_per_client");
    let passes = v["passes"].as_array().map_or(0, Vec::len);
    assert_eq!(passes, 2, "verify_commits on and off: {v:#}");
    assert_eq!(v["passes"][0]["verify_commits"], true);
    assert_eq!(v["passes"][1]["verify_commits"], false);
    for pass in 0..passes {
        check_pass(&v, pass, samples);
    }
    // The difference of two measurements: present, of any sign.
    num(&v, "daemon_checksum_us_per_block");
}

#[test]
fn one_verify_setting_runs_one_pass() {
    let v = run_quick(&["--verify-commits", "off"]);
    assert_eq!(v["passes"].as_array().map_or(0, Vec::len), 1);
    assert_eq!(v["passes"][0]["verify_commits"], false);
    assert!(v["daemon_checksum_us_per_block"].is_null());
}
