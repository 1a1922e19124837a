//! `RedisIndex` against a real `redis-server` started by each test (binary
//! from `PATH`, or `$KVTIER_REDIS_SERVER`; the tests fail when it is
//! missing): the shared conformance suite, read-modify-write atomicity
//! across two frontends, touch never clobbering a concurrent modify, the
//! lease fence, a reference-model comparison against `MemoryIndex`,
//! reopening, namespaces, and a server crash.

use std::sync::Arc;
use std::time::Duration;

use kvtier_meta::test_support::RedisServer;
use kvtier_meta::{
    BlockKey, BlockMeta, CacheLocation, LocationId, LocationStatus, MemoryIndex, MetaError,
    MetaIndex, Modify, RecordKind, RedisIndex, RedisIndexConfig, RedisTimeouts, StorageKind,
};
use proptest::test_runner::{Config, TestCaseError, TestRunner};

#[path = "support/conformance.rs"]
mod conformance;
use conformance::{apply, block, concurrent_bumps, op, reads, suite};

fn server() -> RedisServer {
    RedisServer::start().unwrap_or_else(|e| panic!("cannot start redis-server: {e}"))
}

fn config(prefix: &str) -> RedisIndexConfig {
    RedisIndexConfig {
        prefix: prefix.into(),
        ..RedisIndexConfig::default()
    }
}

fn open(server: &RedisServer, config: RedisIndexConfig) -> RedisIndex {
    RedisIndex::open(&server.url(), config).unwrap_or_else(|e| panic!("open redis index: {e}"))
}

#[test]
fn redis_passes_the_suite() {
    let srv = server();
    suite("redis", &open(&srv, config("suite")));
}

#[test]
fn two_frontends_modify_atomically() {
    let srv = server();
    let frontends = |cfg: RedisIndexConfig| -> Vec<Arc<dyn MetaIndex>> {
        vec![Arc::new(open(&srv, cfg.clone())), Arc::new(open(&srv, cfg))]
    };
    concurrent_bumps("redis, default shards", &frontends(config("wide")));
    // Few shards, two per chunk: chunks of both frontends collide on
    // server-side locks all the time.
    concurrent_bumps(
        "redis, 4 shards",
        &frontends(RedisIndexConfig {
            lock_shards: 4,
            batch_shards: 2,
            pool_size: 2,
            ..config("narrow")
        }),
    );
}

fn location(id: u64) -> CacheLocation {
    CacheLocation {
        id: LocationId(id),
        storage: "s".into(),
        kind: StorageKind::FilePool,
        status: LocationStatus::Serving,
        specs: vec![],
    }
}

/// One frontend appends locations through `modify` while another touches
/// the same keys: every appended location must survive, and the access
/// count must include every touch.
#[test]
fn touch_never_overwrites_a_concurrent_modify() {
    let srv = server();
    let writer = open(&srv, config("touch"));
    let reader = open(&srv, config("touch"));
    let keys: Vec<BlockKey> = (0..8).map(BlockKey).collect();
    let empty: Vec<BlockMeta> = keys
        .iter()
        .map(|&key| BlockMeta {
            key,
            locations: vec![],
            last_access_ms: 0,
            access_count: 0,
            depth: 0,
        })
        .collect();
    writer.put("t", &empty).unwrap();
    const APPENDS: u64 = 60;
    const TOUCHES: u32 = 60;
    std::thread::scope(|s| {
        s.spawn(|| {
            for n in 0..APPENDS {
                writer
                    .modify("t", &keys, &mut |_, cur| match cur {
                        Some(mut m) => {
                            m.locations.push(location(n));
                            Modify::Put(m)
                        }
                        None => Modify::Keep,
                    })
                    .unwrap();
            }
        });
        s.spawn(|| {
            for n in 0..TOUCHES {
                reader
                    .touch("t", &reads(&keys, 1_000 + u64::from(n)))
                    .unwrap();
            }
        });
    });
    for m in writer.get("t", &keys).unwrap() {
        let m = m.expect("record");
        let ids: Vec<u64> = m.locations.iter().map(|l| l.id.0).collect();
        assert_eq!(ids, (0..APPENDS).collect::<Vec<_>>(), "{:?}", m.key);
        // A touch landing between a modify's read and its commit may be
        // dropped (hints), so only bounds hold.
        assert!(m.access_count <= TOUCHES, "{:?}", m.key);
    }
    // With no modify running, every touch counts.
    reader.touch("t", &reads(&keys, 5_000)).unwrap();
    reader.touch("t", &reads(&keys[..1], 4_000)).unwrap();
    let before = writer.get("t", &keys[..2]).unwrap();
    writer
        .modify("t", &keys[..2], &mut |_, cur| {
            cur.map_or(Modify::Keep, Modify::Put)
        })
        .unwrap();
    let after = writer.get("t", &keys[..2]).unwrap();
    assert_eq!(before, after, "a modify keeps the statistics it saw");
    let m0 = after[0].as_ref().expect("key 0");
    assert_eq!(m0.last_access_ms, 5_000, "touch keeps the latest access");
}

/// A frontend stalled past its lock lease must not commit over the writer
/// that took the lock after the lease ran out.
#[test]
fn an_expired_lease_is_fenced() {
    let srv = server();
    let short = RedisIndexConfig {
        timeouts: RedisTimeouts {
            lock_lease: Duration::from_millis(200),
            ..RedisTimeouts::default()
        },
        ..config("fence")
    };
    let stalled = open(&srv, short.clone());
    let other = open(&srv, short);
    stalled
        .put("f", &[block(1, LocationStatus::Serving)])
        .unwrap();
    let mut other_wrote = false;
    let result = stalled.modify("f", &[BlockKey(1)], &mut |_, _| {
        // Blocks on the lock `stalled` holds until its lease expires.
        other
            .put("f", &[block(1, LocationStatus::Writing)])
            .unwrap();
        other_wrote = true;
        Modify::Delete
    });
    assert!(other_wrote);
    assert!(
        matches!(result, Err(MetaError::Backend(_))),
        "stale commit went through: {result:?}"
    );
    assert_eq!(
        other.get("f", &[BlockKey(1)]).unwrap(),
        vec![Some(block(1, LocationStatus::Writing))]
    );
    // The fenced frontend works on.
    stalled.delete("f", &[BlockKey(1)]).unwrap();
    assert_eq!(other.count("f").unwrap(), 0);
}

/// The shared backend behaves like the reference model (fewer cases than
/// redb: each runs against the server).
#[test]
fn redis_matches_memory() {
    let srv = server();
    let case = std::sync::atomic::AtomicU32::new(0);
    let mut runner = TestRunner::new(Config::with_cases(32));
    let ops = proptest::collection::vec(op(), 1..30);
    let result = runner.run(&ops, |ops| {
        // A fresh namespace per case: cases share the server.
        let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let redis = open(&srv, config(&format!("prop{n}")));
        let mem = MemoryIndex::new();
        for op in &ops {
            apply(&redis, op);
            apply(&mem, op);
        }
        let check = |ok: bool, what: &str| {
            if ok {
                Ok(())
            } else {
                Err(TestCaseError::fail(what.to_owned()))
            }
        };
        check(
            redis.scan("p", None, 100).unwrap() == mem.scan("p", None, 100).unwrap(),
            "scan",
        )?;
        let all: Vec<BlockKey> = (0..40).map(BlockKey).collect();
        check(
            redis.get("p", &all).unwrap() == mem.get("p", &all).unwrap(),
            "get",
        )?;
        check(
            redis.count("p").unwrap() == mem.count("p").unwrap(),
            "count",
        )?;
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn records_survive_a_new_index() {
    let srv = server();
    {
        let idx = open(&srv, config("reopen"));
        idx.put(
            "i",
            &[
                block(5, LocationStatus::Serving),
                block(6, LocationStatus::Writing),
            ],
        )
        .unwrap();
        idx.touch("i", &reads(&[BlockKey(5)], 9_999)).unwrap();
        idx.put_record(RecordKind::Storage, "s", b"{}").unwrap();
    }
    let idx = open(&srv, config("reopen"));
    let mut touched = block(5, LocationStatus::Serving);
    touched.last_access_ms = 9_999;
    touched.access_count += 1;
    assert_eq!(
        idx.get("i", &[BlockKey(5), BlockKey(6)]).unwrap(),
        vec![Some(touched), Some(block(6, LocationStatus::Writing))]
    );
    assert_eq!(
        idx.scan("i", None, 10).unwrap(),
        vec![BlockKey(5), BlockKey(6)]
    );
    assert_eq!(
        idx.get_record(RecordKind::Storage, "s").unwrap().as_deref(),
        Some(&b"{}"[..])
    );
}

#[test]
fn prefixes_are_isolated() {
    let srv = server();
    let a = open(&srv, config("a"));
    let b = open(&srv, config("b"));
    a.put("i", &[block(1, LocationStatus::Serving)]).unwrap();
    a.put_record(RecordKind::Group, "g", b"a").unwrap();
    assert_eq!(b.get("i", &[BlockKey(1)]).unwrap(), vec![None]);
    assert_eq!(b.count("i").unwrap(), 0);
    assert!(b.scan("i", None, 10).unwrap().is_empty());
    assert!(b.list_records(RecordKind::Group).unwrap().is_empty());
    assert_eq!(b.drop_instance("i").unwrap(), 0);
    assert!(!b.delete_record(RecordKind::Group, "g").unwrap());
    assert_eq!(a.count("i").unwrap(), 1);
    assert_eq!(
        a.get_record(RecordKind::Group, "g").unwrap().as_deref(),
        Some(&b"a"[..])
    );
    for bad in ["", "a:b"] {
        assert!(
            RedisIndex::open(&srv.url(), config(bad)).is_err(),
            "prefix {bad:?} accepted"
        );
    }
}

/// Every call fails (rather than hangs) while the server is down, and the
/// same index works again once a server is back on the address.
#[test]
fn a_killed_server_is_an_error_until_it_is_back() {
    let mut srv = server();
    let idx = open(
        &srv,
        RedisIndexConfig {
            timeouts: RedisTimeouts {
                connect: Duration::from_millis(500),
                response: Duration::from_secs(1),
                lock_wait: Duration::from_secs(1),
                lock_lease: Duration::from_secs(5),
            },
            ..config("crash")
        },
    );
    idx.put("i", &[block(1, LocationStatus::Serving)]).unwrap();
    srv.kill();
    let is_backend = |r: Result<(), MetaError>, what: &str| {
        assert!(
            matches!(r, Err(MetaError::Backend(_))),
            "{what} with the server down: {r:?}"
        );
    };
    is_backend(idx.get("i", &[BlockKey(1)]).map(drop), "get");
    is_backend(idx.put("i", &[block(2, LocationStatus::Serving)]), "put");
    is_backend(
        idx.modify("i", &[BlockKey(1)], &mut |_, _| Modify::Delete),
        "modify",
    );
    is_backend(idx.touch("i", &reads(&[BlockKey(1)], 1)), "touch");
    is_backend(idx.count("i").map(drop), "count");
    is_backend(idx.scan("i", None, 1).map(drop), "scan");
    is_backend(idx.put_record(RecordKind::Group, "g", b"x"), "put_record");
    srv.restart()
        .unwrap_or_else(|e| panic!("restart redis-server: {e}"));
    // Persistence is off: the new server starts empty.
    assert_eq!(idx.count("i").unwrap(), 0);
    idx.put("i", &[block(3, LocationStatus::Serving)]).unwrap();
    assert_eq!(
        idx.get("i", &[BlockKey(3)]).unwrap(),
        vec![Some(block(3, LocationStatus::Serving))]
    );
}
