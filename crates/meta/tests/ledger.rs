//! The write ledger (`kvtier_meta::ledger`): the in-memory ledger and the
//! one shared on a real redis-server keep the same contract; two frontends
//! on one Redis never exceed a quota together; and services over a shared
//! ledger finish, reap and account for each other's writes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kvtier_meta::ledger::{
    GroupUsage, Ledger, LocalLedger, SessionId, SessionRecord, SessionTarget,
};
use kvtier_meta::test_support::RedisServer;
use kvtier_meta::test_support::world::{keys, service_on};
use kvtier_meta::{
    BlockKey, LocationId, MetaConfig, MetaError, MetaService, RedisIndex, RedisIndexConfig,
    StorageKind,
};

const BLOCK: u64 = 1 << 20;
const LONG: Duration = Duration::from_secs(600);

fn redis() -> RedisServer {
    RedisServer::start().unwrap_or_else(|e| panic!("cannot start redis-server: {e}"))
}

fn redis_index(server: &RedisServer) -> RedisIndex {
    let cfg = RedisIndexConfig {
        prefix: "kvt".into(),
        ..RedisIndexConfig::default()
    };
    RedisIndex::open(&server.url(), cfg).unwrap()
}

fn record(instance: &str, n: u64) -> SessionRecord {
    SessionRecord {
        instance: instance.into(),
        group: "g".into(),
        kind: StorageKind::S3,
        block_bytes: BLOCK,
        targets: (0..n)
            .map(|i| SessionTarget {
                key: BlockKey(i),
                location: LocationId(100 + i),
            })
            .collect(),
    }
}

/// Opens `s` on `kind` without a limit.
fn open(l: &dyn Ledger, id: u64, s: &mut SessionRecord, timeout: Duration) {
    l.open(SessionId(id), s, timeout, &mut |_| {
        Ok(StorageKind::FilePool)
    })
    .unwrap();
}

fn total(l: &dyn Ledger) -> u64 {
    l.usage("g").unwrap().total
}

/// The contract of `Ledger`, on a fresh ledger.
fn contract(l: &dyn Ledger) {
    // A refusal changes nothing.
    let mut s = record("i", 4);
    let refused = l.open(SessionId(1), &mut s, LONG, &mut |u| {
        assert_eq!(u.total, 0);
        Err(MetaError::InvalidArgument("no".into()))
    });
    assert!(refused.is_err());
    assert_eq!(total(l), 0);
    assert_eq!(l.claim(SessionId(1), LONG).unwrap(), None);

    // Open charges on the chosen kind and records the session.
    open(l, 1, &mut s, LONG);
    assert_eq!(s.kind, StorageKind::FilePool);
    let u = l.usage("g").unwrap();
    assert_eq!(u.total, 4 * BLOCK);
    assert_eq!(u.by_kind.get(&StorageKind::FilePool), Some(&(4 * BLOCK)));
    assert_eq!(l.held_sessions().unwrap(), 1);

    // Narrow releases the dropped targets; the record follows.
    let mut narrowed = s.clone();
    narrowed.targets.truncate(3);
    l.narrow(SessionId(1), &narrowed, 1, LONG).unwrap();
    assert_eq!(total(l), 3 * BLOCK);

    // A claim is exclusive until given up.
    assert_eq!(l.claim(SessionId(1), LONG).unwrap(), Some(narrowed.clone()));
    assert_eq!(l.claim(SessionId(1), LONG).unwrap(), None);
    // A claimed session is neither narrowed nor reaped.
    l.narrow(SessionId(1), &record("i", 1), 2, LONG).unwrap();
    assert_eq!(total(l), 3 * BLOCK);
    assert!(l.claim_expired(LONG, 10).unwrap().is_empty());
    l.unclaim(SessionId(1), None).unwrap();
    assert_eq!(l.claim(SessionId(1), LONG).unwrap(), Some(narrowed.clone()));

    // Close releases all but the served targets, once.
    l.close(SessionId(1), &narrowed, 2).unwrap();
    assert_eq!(total(l), 2 * BLOCK, "two served blocks stay charged");
    l.close(SessionId(1), &narrowed, 0).unwrap();
    assert_eq!(total(l), 2 * BLOCK, "a second close releases nothing");
    assert_eq!(l.claim(SessionId(1), LONG).unwrap(), None);
    assert_eq!(l.held_sessions().unwrap(), 0);

    // Release never goes below zero; charge adds.
    l.release("g", StorageKind::FilePool, 10 * BLOCK).unwrap();
    assert_eq!(
        l.usage("g").unwrap(),
        GroupUsage {
            total: 0,
            by_kind: [(StorageKind::FilePool, 0)].into()
        }
    );
    l.charge("g", StorageKind::S3, BLOCK).unwrap();
    assert_eq!(total(l), BLOCK);

    // Expired sessions (timeout 0) are claimed by the reaper, once; a
    // claim whose lease ran out (lease 0) can be taken again.
    let mut gone = record("i", 2);
    open(l, 2, &mut gone, Duration::ZERO);
    let mut empty = record("i", 0);
    open(l, 3, &mut empty, LONG);
    assert_eq!(l.held_sessions().unwrap(), 1, "empty sessions are not held");
    let reaped = l.claim_expired(LONG, 10).unwrap();
    assert_eq!(reaped, vec![(SessionId(2), gone.clone())]);
    assert!(l.claim_expired(LONG, 10).unwrap().is_empty());
    l.unclaim(SessionId(2), Some(Duration::ZERO)).unwrap();
    assert_eq!(l.claim_expired(Duration::ZERO, 10).unwrap().len(), 1);
    assert_eq!(l.claim(SessionId(2), LONG).unwrap(), Some(gone.clone()));

    // An instance's sessions, but not one someone holds.
    let mut other = record("other", 1);
    open(l, 4, &mut other, LONG);
    let mut mine = record("i", 1);
    open(l, 5, &mut mine, LONG);
    let mut ids: Vec<u64> = l
        .claim_instance("i", LONG)
        .unwrap()
        .into_iter()
        .map(|(id, _)| id.0)
        .collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        vec![3, 5],
        "session 2 is claimed, 4 is another instance's"
    );

    // Installing rebuilt usage happens once.
    let rebuilt: BTreeMap<String, GroupUsage> = [(
        "h".to_owned(),
        GroupUsage {
            total: 5,
            by_kind: [(StorageKind::S3, 5)].into(),
        },
    )]
    .into();
    assert!(!l.is_built().unwrap());
    assert!(l.install(&rebuilt).unwrap());
    assert!(l.is_built().unwrap());
    assert!(!l.install(&rebuilt).unwrap());
    assert_eq!(l.usage("h").unwrap().total, 5);
}

#[tokio::test]
async fn local_ledger_keeps_the_contract() {
    contract(&LocalLedger::new());
}

#[tokio::test]
async fn redis_ledger_keeps_the_contract() {
    let server = redis();
    let ledger = redis_index(&server).ledger();
    assert!(ledger.is_shared());
    contract(&ledger);
    // A second frontend sees the same sessions and charges.
    let other = redis_index(&server).ledger();
    assert_eq!(other.usage("h").unwrap().total, 5);
    assert!(other.is_built().unwrap());
}

/// Invariant 2: frontends opening sessions at once against one quota
/// never exceed it together, and every admitted session is charged.
#[test]
fn frontends_sharing_a_ledger_never_exceed_a_quota_together() {
    let server = redis();
    const QUOTA_BLOCKS: u64 = 40;
    let ledgers: Vec<Arc<dyn Ledger>> = (0..2)
        .map(|_| Arc::new(redis_index(&server).ledger()) as Arc<dyn Ledger>)
        .collect();
    let admitted = std::thread::scope(|scope| {
        let tasks: Vec<_> = (0..8u64)
            .map(|t| {
                let l = ledgers[(t % 2) as usize].clone();
                scope.spawn(move || {
                    let mut n = 0u64;
                    for i in 0..20u64 {
                        let mut s = record("i", 1);
                        let opened = l.open(SessionId(t * 1000 + i), &mut s, LONG, &mut |u| {
                            if u.total + BLOCK > QUOTA_BLOCKS * BLOCK {
                                Err(MetaError::InvalidArgument("full".into()))
                            } else {
                                Ok(StorageKind::S3)
                            }
                        });
                        n += u64::from(opened.is_ok());
                    }
                    n
                })
            })
            .collect();
        tasks.into_iter().map(|t| t.join().unwrap()).sum::<u64>()
    });
    assert_eq!(admitted, QUOTA_BLOCKS, "160 tries, room for 40");
    assert_eq!(total(ledgers[0].as_ref()), QUOTA_BLOCKS * BLOCK);
    assert_eq!(ledgers[1].held_sessions().unwrap(), QUOTA_BLOCKS as usize);
}

/// Bytes of one block of the test world (two specs).
const SPEC: u64 = 4096;

/// One frontend over the shared Redis index and its ledger, sessions
/// timing out after `timeout`.
async fn frontend(
    server: &RedisServer,
    dir: &std::path::Path,
    timeout: Duration,
) -> Arc<MetaService> {
    let index = redis_index(server);
    let ledger: Arc<dyn Ledger> = Arc::new(index.ledger());
    let config = MetaConfig {
        session_timeout: timeout,
        ..MetaConfig::default()
    };
    service_on(Arc::new(index), ledger, dir, &["pool"], config, SPEC).await
}

/// How many of `ks` are served.
async fn served(svc: &MetaService, ks: &[BlockKey]) -> usize {
    let mut n = 0;
    for &k in ks {
        let q = kvtier_meta::LocationQuery::prefix(vec![k]);
        n += svc.get_cache_location("i", &q).await.unwrap().matched;
    }
    n
}

#[tokio::test]
async fn a_write_started_on_one_frontend_finishes_on_another() {
    let server = redis();
    let dir = tempfile::tempdir().unwrap();
    let a = frontend(&server, dir.path(), LONG).await;
    let b = frontend(&server, dir.path(), LONG).await;
    let grant = a.start_write_cache("i", &keys(0..4)).await.unwrap();
    assert_eq!(grant.blocks.len(), 4);
    assert_eq!(b.open_sessions().unwrap(), 1);
    assert_eq!(b.group_usage("g").unwrap().total, 4 * 2 * SPEC);
    // A second start on the other frontend finds the keys being written.
    let again = b.start_write_cache("i", &keys(2..6)).await.unwrap();
    assert_eq!(again.blocks.len(), 2, "keys 2 and 3 are A's");
    assert_eq!(b.group_usage("g").unwrap().total, 6 * 2 * SPEC);

    let done = b
        .finish_write_cache("i", grant.session, &[true, true, true, false])
        .await
        .unwrap();
    assert_eq!((done.served, done.dropped), (3, 1));
    assert!(matches!(
        a.finish_write_cache("i", grant.session, &[true; 4]).await,
        Err(MetaError::SessionNotFound(_))
    ));
    a.finish_write_cache("i", again.session, &[true, true])
        .await
        .unwrap();
    assert_eq!(served(&a, &keys(0..6)).await, 5);
    assert_eq!(a.group_usage("g").unwrap().total, 5 * 2 * SPEC);
    assert_eq!(a.open_sessions().unwrap(), 0);
}

#[tokio::test]
async fn another_frontend_reaps_the_sessions_of_one_that_died() {
    let server = redis();
    let dir = tempfile::tempdir().unwrap();
    // Sessions of this frontend are due at once.
    let dying = frontend(&server, dir.path(), Duration::ZERO).await;
    let leader = frontend(&server, dir.path(), LONG).await;
    let grant = dying.start_write_cache("i", &keys(0..3)).await.unwrap();
    assert_eq!(grant.blocks.len(), 3);
    drop(dying);
    assert_eq!(leader.group_usage("g").unwrap().total, 3 * 2 * SPEC);

    assert_eq!(leader.reap_expired(None).await.unwrap(), 1);
    assert_eq!(leader.group_usage("g").unwrap().total, 0, "charge released");
    assert_eq!(leader.open_sessions().unwrap(), 0);
    // The writing locations are gone: the keys can be written afresh.
    let fresh = leader.start_write_cache("i", &keys(0..3)).await.unwrap();
    assert_eq!(fresh.blocks.len(), 3);
    assert!(matches!(
        leader
            .finish_write_cache("i", grant.session, &[true; 3])
            .await,
        Err(MetaError::SessionNotFound(_))
    ));
}

#[tokio::test]
async fn a_quota_holds_across_frontends_and_a_restart_keeps_the_charges() {
    let server = redis();
    let dir = tempfile::tempdir().unwrap();
    let a = frontend(&server, dir.path(), LONG).await;
    let b = frontend(&server, dir.path(), LONG).await;
    let block = 2 * SPEC;
    for svc in [&a, &b] {
        let (mut g, _) = svc.get_group("g").unwrap();
        g.quota_bytes = 4 * block;
        svc.update_group(g).unwrap();
    }
    let first = a.start_write_cache("i", &keys(0..3)).await.unwrap();
    assert!(matches!(
        b.start_write_cache("i", &keys(10..12)).await,
        Err(MetaError::QuotaExceeded { used, .. }) if used == 3 * block
    ));
    let open = b.start_write_cache("i", &keys(10..11)).await.unwrap();
    a.finish_write_cache("i", first.session, &[true; 3])
        .await
        .unwrap();

    // A new frontend finds the ledger built: same usage, same session.
    let c = frontend(&server, dir.path(), LONG).await;
    assert_eq!(c.group_usage("g").unwrap().total, 4 * block);
    assert_eq!(c.open_sessions().unwrap(), 1);
    c.finish_write_cache("i", open.session, &[true])
        .await
        .unwrap();
    assert_eq!(served(&c, &keys(0..11)).await, 4);
    assert_eq!(c.group_usage("g").unwrap().total, 4 * block);
}

/// The memory index, refusing every read-modify-write while `refuse` is
/// set, as an index on a full disk does.
#[derive(Debug, Default)]
struct Refusing {
    inner: kvtier_meta::MemoryIndex,
    refuse: std::sync::atomic::AtomicBool,
}

impl Refusing {
    fn check(&self) -> kvtier_meta::Result<()> {
        if self.refuse.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(MetaError::StoreUnwritable("test: disk full".into()));
        }
        Ok(())
    }
}

impl kvtier_meta::MetaIndex for Refusing {
    fn get(
        &self,
        i: &str,
        k: &[BlockKey],
    ) -> kvtier_meta::Result<Vec<Option<kvtier_meta::BlockMeta>>> {
        self.inner.get(i, k)
    }
    fn put(&self, i: &str, b: &[kvtier_meta::BlockMeta]) -> kvtier_meta::Result<()> {
        self.check()?;
        self.inner.put(i, b)
    }
    fn delete(&self, i: &str, k: &[BlockKey]) -> kvtier_meta::Result<usize> {
        self.check()?;
        self.inner.delete(i, k)
    }
    fn modify(
        &self,
        i: &str,
        k: &[BlockKey],
        f: &mut kvtier_meta::index::Modifier<'_>,
    ) -> kvtier_meta::Result<()> {
        self.check()?;
        self.inner.modify(i, k, f)
    }
    fn scan(
        &self,
        i: &str,
        after: Option<BlockKey>,
        limit: usize,
    ) -> kvtier_meta::Result<Vec<BlockKey>> {
        self.inner.scan(i, after, limit)
    }
    fn sample(&self, i: &str, n: usize) -> kvtier_meta::Result<Vec<kvtier_meta::BlockMeta>> {
        self.inner.sample(i, n)
    }
    fn count(&self, i: &str) -> kvtier_meta::Result<u64> {
        self.inner.count(i)
    }
    fn drop_instance(&self, i: &str) -> kvtier_meta::Result<u64> {
        self.inner.drop_instance(i)
    }
    fn get_record(
        &self,
        k: kvtier_meta::RecordKind,
        n: &str,
    ) -> kvtier_meta::Result<Option<Vec<u8>>> {
        self.inner.get_record(k, n)
    }
    fn put_record(&self, k: kvtier_meta::RecordKind, n: &str, v: &[u8]) -> kvtier_meta::Result<()> {
        self.inner.put_record(k, n, v)
    }
    fn delete_record(&self, k: kvtier_meta::RecordKind, n: &str) -> kvtier_meta::Result<bool> {
        self.inner.delete_record(k, n)
    }
    fn list_records(
        &self,
        k: kvtier_meta::RecordKind,
    ) -> kvtier_meta::Result<Vec<(String, Vec<u8>)>> {
        self.inner.list_records(k)
    }
}

/// More expired sessions than the reaper claims at once, while the index
/// refuses writes: the round ends (each failed session is tried once),
/// nothing is released; once the index writes again, the next round
/// closes them all.
#[tokio::test]
async fn a_reaper_round_ends_while_the_index_refuses_writes() {
    const SESSIONS: u64 = 1100;
    let dir = tempfile::tempdir().unwrap();
    let index = Arc::new(Refusing::default());
    let config = MetaConfig {
        session_timeout: Duration::ZERO,
        ..MetaConfig::default()
    };
    let ledger: Arc<dyn Ledger> = Arc::new(LocalLedger::new());
    let svc = service_on(index.clone(), ledger, dir.path(), &["plain"], config, SPEC).await;
    for k in 0..SESSIONS {
        svc.start_write_cache("i", &keys(k..k + 1)).await.unwrap();
    }
    let charged = svc.group_usage("g").unwrap().total;
    assert_eq!(charged, SESSIONS * 2 * SPEC);

    index
        .refuse
        .store(true, std::sync::atomic::Ordering::SeqCst);
    // Before the round ended early, this call never returned.
    assert_eq!(svc.reap_expired(None).await.unwrap(), SESSIONS as usize);
    assert_eq!(svc.open_sessions().unwrap(), SESSIONS as usize);
    assert_eq!(svc.group_usage("g").unwrap().total, charged);

    index
        .refuse
        .store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(svc.reap_expired(None).await.unwrap(), SESSIONS as usize);
    assert_eq!(svc.open_sessions().unwrap(), 0);
    assert_eq!(svc.group_usage("g").unwrap().total, 0);
}
