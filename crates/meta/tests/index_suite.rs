//! One expectation run against every `MetaIndex` backend, a reference-model
//! comparison of the durable backend against the in-memory one, and a
//! close-and-reopen test.

use std::sync::Arc;

use kvtier_meta::{BlockKey, LocationStatus, MemoryIndex, MetaIndex, RecordKind, RedbIndex};
use proptest::prelude::*;

#[path = "support/conformance.rs"]
mod conformance;
use conformance::{apply, block, concurrent_bumps, op, suite};

fn backends() -> Vec<(&'static str, Arc<dyn MetaIndex>, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let redb = RedbIndex::open(dir.path().join("meta.redb"), 8 << 20).expect("open redb");
    vec![
        ("memory", Arc::new(MemoryIndex::new()), None),
        ("redb", Arc::new(redb), Some(dir)),
    ]
}

#[test]
fn every_backend_passes_the_suite() {
    for (name, idx, _dir) in backends() {
        suite(name, idx.as_ref());
    }
}

#[test]
fn concurrent_modify_is_atomic_per_key() {
    for (name, idx, _dir) in backends() {
        concurrent_bumps(name, &[idx]);
    }
}

#[test]
fn redb_keeps_records_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.redb");
    {
        let idx = RedbIndex::open(&path, 1 << 20).unwrap();
        idx.put(
            "i",
            &[
                block(5, LocationStatus::Serving),
                block(6, LocationStatus::Writing),
            ],
        )
        .unwrap();
        idx.put_record(RecordKind::Storage, "s", b"{}").unwrap();
    }
    let idx = RedbIndex::open(&path, 1 << 20).unwrap();
    assert_eq!(
        idx.get("i", &[BlockKey(5), BlockKey(6)]).unwrap(),
        vec![
            Some(block(5, LocationStatus::Serving)),
            Some(block(6, LocationStatus::Writing))
        ]
    );
    assert_eq!(
        idx.get_record(RecordKind::Storage, "s").unwrap().as_deref(),
        Some(&b"{}"[..])
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// The durable backend behaves like the reference model.
    #[test]
    fn redb_matches_memory(ops in proptest::collection::vec(op(), 1..30)) {
        let dir = tempfile::tempdir().unwrap();
        let redb = RedbIndex::open(dir.path().join("m.redb"), 1 << 20).unwrap();
        let mem = MemoryIndex::new();
        for op in &ops {
            apply(&redb, op);
            apply(&mem, op);
        }
        prop_assert_eq!(redb.scan("p", None, 100).unwrap(), mem.scan("p", None, 100).unwrap());
        let all: Vec<BlockKey> = (0..40).map(BlockKey).collect();
        prop_assert_eq!(redb.get("p", &all).unwrap(), mem.get("p", &all).unwrap());
        prop_assert_eq!(redb.count("p").unwrap(), mem.count("p").unwrap());
    }
}
