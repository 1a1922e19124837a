//! Expectations every `MetaIndex` backend must meet, shared by the test
//! files of each backend (`#[path]`-included: not a test target itself).

use std::sync::Arc;

use kvtier_meta::{
    BlockKey, BlockMeta, CacheLocation, LocationId, LocationSpec, LocationStatus, MetaIndex,
    Modify, RecordKind, StorageKind,
};
use proptest::prelude::*;

/// A one-location block record for `key`.
/// One read of each of `keys` at `at_ms`, for `MetaIndex::touch`.
pub fn reads(keys: &[BlockKey], at_ms: u64) -> Vec<kvtier_meta::AccessHit> {
    keys.iter()
        .map(|&key| kvtier_meta::AccessHit {
            key,
            last_ms: at_ms,
            count: 1,
        })
        .collect()
}

pub fn block(key: u64, status: LocationStatus) -> BlockMeta {
    BlockMeta {
        key: BlockKey(key),
        locations: vec![CacheLocation {
            id: LocationId(key * 10),
            storage: "s".into(),
            kind: StorageKind::FilePool,
            status,
            specs: vec![LocationSpec {
                name: "tp0".into(),
                uri: format!("file:///kv/{key}"),
                size: 100,
            }],
        }],
        last_access_ms: key,
        access_count: 1,
        depth: 0,
    }
}

/// The conformance suite: put/get, delete, modify, touch, scan, sample,
/// records, drop. Uses instances `i`, `other` and `none` and record names
/// `g1`, `g2`.
pub fn suite(name: &str, idx: &dyn MetaIndex) {
    let keys: Vec<BlockKey> = (1..=100).map(BlockKey).collect();
    // put / get
    let blocks: Vec<BlockMeta> = (1..=100)
        .map(|k| block(k, LocationStatus::Serving))
        .collect();
    idx.put("i", &blocks).unwrap();
    let got = idx.get("i", &keys).unwrap();
    assert!(
        got.iter().zip(&blocks).all(|(g, b)| g.as_ref() == Some(b)),
        "{name}: get after put"
    );
    assert_eq!(
        idx.get("other", &keys[..3]).unwrap(),
        vec![None, None, None],
        "{name}: other instance"
    );
    assert_eq!(idx.count("i").unwrap(), 100, "{name}");
    // delete
    assert_eq!(
        idx.delete("i", &[BlockKey(1), BlockKey(2), BlockKey(1000)])
            .unwrap(),
        2,
        "{name}"
    );
    assert_eq!(idx.get("i", &[BlockKey(1)]).unwrap(), vec![None], "{name}");
    // modify: visits each distinct key once, with its current value
    let mut seen = Vec::new();
    idx.modify(
        "i",
        &[BlockKey(3), BlockKey(1), BlockKey(3), BlockKey(4)],
        &mut |k, cur| {
            seen.push((k, cur.is_some()));
            match k.0 {
                1 => Modify::Put(block(1, LocationStatus::Writing)),
                3 => Modify::Delete,
                _ => Modify::Keep,
            }
        },
    )
    .unwrap();
    seen.sort();
    assert_eq!(
        seen,
        vec![
            (BlockKey(1), false),
            (BlockKey(3), true),
            (BlockKey(4), true)
        ],
        "{name}"
    );
    let got = idx
        .get("i", &[BlockKey(1), BlockKey(3), BlockKey(4)])
        .unwrap();
    assert_eq!(
        got[0].as_ref().map(|m| m.locations[0].status),
        Some(LocationStatus::Writing),
        "{name}"
    );
    assert_eq!(got[1], None, "{name}");
    assert_eq!(got[2], Some(block(4, LocationStatus::Serving)), "{name}");
    // touch: counts reads of present keys, ignores absent ones
    idx.touch("i", &reads(&[BlockKey(4), BlockKey(3)], 1_000_000))
        .unwrap();
    let t = idx.get("i", &[BlockKey(4), BlockKey(3)]).unwrap();
    let m4 = t[0].as_ref().expect("key 4");
    assert_eq!(
        (m4.access_count, m4.last_access_ms),
        (2, 1_000_000),
        "{name}: touch"
    );
    assert_eq!(t[1], None, "{name}: touch created a record");
    // batched hits: counts add up, a key listed twice counts twice, and an
    // older read does not move last access back
    let hit = |last_ms, count| kvtier_meta::AccessHit {
        key: BlockKey(4),
        last_ms,
        count,
    };
    idx.touch("i", &[hit(900_000, 5), hit(2_000_000, 2)])
        .unwrap();
    let m4 = idx
        .get("i", &[BlockKey(4)])
        .unwrap()
        .remove(0)
        .expect("key 4");
    assert_eq!(
        (m4.access_count, m4.last_access_ms),
        (9, 2_000_000),
        "{name}: batched touch"
    );
    idx.put("i", &[block(4, LocationStatus::Serving)]).unwrap();
    // scan pages in order
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let page = idx.scan("i", after, 7).unwrap();
        let Some(&last) = page.last() else { break };
        after = Some(last);
        all.extend(page);
    }
    let expect: Vec<BlockKey> = (1..=100)
        .filter(|&k| k != 2 && k != 3)
        .map(BlockKey)
        .collect();
    assert_eq!(all, expect, "{name}: scan");
    assert!(
        idx.scan("i", Some(BlockKey(u64::MAX)), 10)
            .unwrap()
            .is_empty(),
        "{name}"
    );
    // sample: distinct, existing
    let s = idx.sample("i", 10).unwrap();
    assert!(
        !s.is_empty() && s.len() <= 10,
        "{name}: sample size {}",
        s.len()
    );
    let mut sk: Vec<BlockKey> = s.iter().map(|m| m.key).collect();
    sk.dedup();
    assert_eq!(sk.len(), s.len(), "{name}: sample distinct");
    assert!(
        sk.iter().all(|k| expect.contains(k)),
        "{name}: sample exists"
    );
    assert!(idx.sample("none", 5).unwrap().is_empty(), "{name}");
    // records
    idx.put_record(RecordKind::Group, "g1", b"one").unwrap();
    idx.put_record(RecordKind::Group, "g2", b"two").unwrap();
    idx.put_record(RecordKind::Instance, "g1", b"inst").unwrap();
    assert_eq!(
        idx.get_record(RecordKind::Group, "g1").unwrap().as_deref(),
        Some(&b"one"[..]),
        "{name}"
    );
    assert_eq!(
        idx.list_records(RecordKind::Group).unwrap(),
        vec![
            ("g1".to_string(), b"one".to_vec()),
            ("g2".to_string(), b"two".to_vec())
        ],
        "{name}"
    );
    assert!(
        idx.delete_record(RecordKind::Group, "g1").unwrap(),
        "{name}"
    );
    assert!(
        !idx.delete_record(RecordKind::Group, "g1").unwrap(),
        "{name}"
    );
    assert_eq!(
        idx.list_records(RecordKind::Instance).unwrap().len(),
        1,
        "{name}"
    );
    // drop instance
    assert_eq!(idx.drop_instance("i").unwrap(), 98, "{name}");
    assert_eq!(idx.count("i").unwrap(), 0, "{name}");
}

/// Four threads bump 32 keys 25 times each through `modify`, spread over
/// `indexes` (several frontends on one store when more than one): every
/// key must end at exactly 100.
pub fn concurrent_bumps(name: &str, indexes: &[Arc<dyn MetaIndex>]) {
    let keys: Vec<BlockKey> = (0..32).map(BlockKey).collect();
    std::thread::scope(|s| {
        for t in 0..4 {
            let idx = indexes[t % indexes.len()].clone();
            let keys = keys.clone();
            s.spawn(move || {
                for _ in 0..25 {
                    idx.modify("c", &keys, &mut |k, cur| {
                        let mut m = cur.unwrap_or(BlockMeta {
                            key: k,
                            locations: vec![],
                            last_access_ms: 0,
                            access_count: 0,
                            depth: 0,
                        });
                        m.access_count += 1;
                        Modify::Put(m)
                    })
                    .unwrap();
                }
            });
        }
    });
    let got = indexes[0].get("c", &keys).unwrap();
    assert!(
        got.iter()
            .all(|m| m.as_ref().map(|m| m.access_count) == Some(100)),
        "{name}: lost update"
    );
}

/// A step of the reference-model comparison.
#[derive(Debug, Clone)]
pub enum Op {
    Put(Vec<u64>),
    Delete(Vec<u64>),
    Bump(Vec<u64>),
    Touch(Vec<u64>),
}

/// Any [`Op`] on keys 0..40.
pub fn op() -> impl Strategy<Value = Op> {
    let keys = proptest::collection::vec(0u64..40, 1..12);
    prop_oneof![
        keys.clone().prop_map(Op::Put),
        keys.clone().prop_map(Op::Delete),
        keys.clone().prop_map(Op::Bump),
        keys.prop_map(Op::Touch)
    ]
}

/// Applies `op` to instance `p` of `idx`.
pub fn apply(idx: &dyn MetaIndex, op: &Op) {
    let to_keys = |ks: &[u64]| ks.iter().map(|&k| BlockKey(k)).collect::<Vec<_>>();
    match op {
        Op::Put(ks) => {
            let blocks: Vec<BlockMeta> = ks
                .iter()
                .map(|&k| block(k, LocationStatus::Serving))
                .collect();
            idx.put("p", &blocks).unwrap();
        }
        Op::Delete(ks) => {
            idx.delete("p", &to_keys(ks)).unwrap();
        }
        Op::Bump(ks) => idx
            .modify("p", &to_keys(ks), &mut |_, cur| match cur {
                Some(mut m) => {
                    m.access_count += 1;
                    Modify::Put(m)
                }
                None => Modify::Keep,
            })
            .unwrap(),
        Op::Touch(ks) => idx.touch("p", &reads(&to_keys(ks), 77)).unwrap(),
    }
}
