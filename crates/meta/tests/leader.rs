//! Leader election (`kvtier_meta::leader`): the three lease stores agree on
//! their contract, and electors over each elect exactly one leader, hand
//! over on demotion, crash and lost store, and keep epochs growing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvtier_meta::leader::{
    Elector, ElectorConfig, FileLease, LeaseStore, MemoryLease, RedisLease, Role,
};
use kvtier_meta::test_support::RedisServer;

const LEASE: Duration = Duration::from_millis(600);
const INTERVAL: Duration = Duration::from_millis(20);
/// Generous bound for anything that must happen within a lease or two.
const WITHIN: Duration = Duration::from_secs(10);

fn redis() -> RedisServer {
    RedisServer::start().unwrap_or_else(|e| panic!("cannot start redis-server: {e}"))
}

fn redis_lease(server: &RedisServer) -> Arc<dyn LeaseStore> {
    let client = ::redis::Client::open(server.url()).expect("redis url");
    Arc::new(RedisLease::new(client, "kvt", Duration::from_millis(500)))
}

fn elector(store: Arc<dyn LeaseStore>, node: &str) -> Elector {
    Elector::start(
        store,
        ElectorConfig {
            node_id: node.into(),
            lease: LEASE,
            interval: INTERVAL,
        },
    )
}

/// Waits (on role changes and loop passes, never a fixed sleep) until
/// `cond` holds; panics after [`WITHIN`].
async fn until(what: &str, cond: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < WITHIN, "timed out waiting for {what}");
        tokio::time::sleep(INTERVAL / 4).await;
    }
}

/// Waits until `e` has made `n` more loop passes.
async fn passes(e: &Elector, n: u64) {
    let start = e.loops();
    until("loop passes", || e.loops() >= start + n).await;
}

fn leaders(es: &[&Elector]) -> usize {
    es.iter().filter(|e| e.is_leader()).count()
}

/// The stores' contract, on one store seen by two nodes.
fn store_contract(st: &dyn LeaseStore) {
    let ttl = Duration::from_secs(30);
    assert_eq!(st.holder().unwrap(), None);
    let e1 = st.try_acquire("a", ttl).unwrap().expect("free lease taken");
    assert_eq!(st.try_acquire("b", ttl).unwrap(), None, "held by a");
    assert_eq!(st.try_acquire("a", ttl).unwrap(), Some(e1), "re-entrant");
    assert!(st.renew("a", e1, ttl).unwrap());
    assert!(!st.renew("b", e1, ttl).unwrap(), "not b's");
    assert!(!st.renew("a", e1 + 1, ttl).unwrap(), "not that epoch");
    let h = st.holder().unwrap().expect("held");
    assert_eq!((h.node.as_str(), h.epoch), ("a", e1));
    st.release("b", e1).unwrap();
    assert!(st.holder().unwrap().is_some(), "b cannot release a's lease");
    st.release("a", e1).unwrap();
    assert_eq!(st.holder().unwrap(), None);
    let e2 = st.try_acquire("b", ttl).unwrap().expect("free again");
    assert!(e2 > e1, "epochs grow: {e1} then {e2}");
    st.release("b", e2).unwrap();
}

#[test]
fn memory_store_keeps_the_contract() {
    store_contract(&MemoryLease::new());
}

#[test]
fn redis_store_keeps_the_contract() {
    let server = redis();
    store_contract(redis_lease(&server).as_ref());
}

#[test]
fn file_store_keeps_the_contract_between_two_handles() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leader.lock");
    // Two handles on one file conflict like two processes (flock locks
    // belong to the open file).
    let (a, b) = (FileLease::new(&path), FileLease::new(&path));
    let ttl = Duration::from_secs(30);
    let e1 = a.try_acquire("a", ttl).unwrap().expect("taken");
    assert_eq!(b.try_acquire("b", ttl).unwrap(), None);
    let seen = b.holder().unwrap().expect("b sees a");
    assert_eq!((seen.node.as_str(), seen.epoch), ("a", e1));
    drop(a); // the kernel drops the lock with the file
    let e2 = b
        .try_acquire("b", ttl)
        .unwrap()
        .expect("free after a closed");
    assert!(e2 > e1);
    b.release("b", e2).unwrap();
    // Another handle sees it free, and the epoch survives in the file.
    let c = FileLease::new(&path);
    assert_eq!(c.holder().unwrap(), None);
    assert!(c.try_acquire("c", ttl).unwrap().expect("taken") > e2);
}

/// Two electors over `store`: exactly one leads, the other names it; a
/// demotion with a campaign delay hands over at once and keeps the demoted
/// one out; a leader that stops without releasing is replaced after its
/// lease, under a larger epoch.
async fn hand_over(store: Arc<dyn LeaseStore>) {
    let mut es = vec![
        elector(store.clone(), "node-a"),
        elector(store.clone(), "node-b"),
    ];
    until("a leader", || leaders(&[&es[0], &es[1]]) == 1).await;
    let l = usize::from(!es[0].is_leader());
    let (lead, other) = (&es[l], &es[1 - l]);
    until("the follower to see the leader", || {
        other.leader_node_id() == lead.node_id()
    })
    .await;
    assert_eq!(other.role(), Role::Follower);
    assert_eq!(other.lease_expiration_unix_us(), -1);
    assert!(lead.lease_expiration_unix_us() > 0);
    let Role::Leader { epoch: first } = lead.role() else {
        panic!("leader without an epoch");
    };

    lead.set_campaign_delay_ms(60_000);
    assert!(lead.demote().await.unwrap());
    assert!(!lead.is_leader(), "demotion takes effect before it returns");
    assert!(
        !lead.demote().await.unwrap(),
        "a follower has nothing to give up"
    );
    until("the other to take over", || other.is_leader()).await;
    let Role::Leader { epoch: second } = other.role() else {
        panic!("leader without an epoch");
    };
    assert!(second > first);
    passes(lead, 5).await;
    assert!(!lead.is_leader(), "the demoted one waits out its delay");
    assert_eq!(lead.leader_node_id(), other.node_id());

    // The new leader stops without giving the lease up (a crash); a third
    // elector takes over once it lapses, while the demoted one stays out.
    let crashed = es.remove(1 - l);
    drop(crashed);
    let demoted = es.pop().expect("the demoted elector");
    let c = elector(store, "node-c");
    until("a new leader after the crash", || c.is_leader()).await;
    let Role::Leader { epoch: third } = c.role() else {
        panic!("leader without an epoch");
    };
    assert!(third > second);
    assert!(!demoted.is_leader());
    c.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn electors_hand_over_on_memory() {
    hand_over(Arc::new(MemoryLease::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn electors_hand_over_on_redis() {
    let server = redis();
    hand_over(redis_lease(&server)).await;
}

/// File leases: one handle per elector, as one per process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn electors_hand_over_on_a_lock_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.leader.lock");
    let a = elector(Arc::new(FileLease::new(&path)), "node-a");
    let b = elector(Arc::new(FileLease::new(&path)), "node-b");
    until("a leader", || leaders(&[&a, &b]) == 1).await;
    let (lead, other) = if a.is_leader() { (a, b) } else { (b, a) };
    until("the follower to see the leader", || {
        other.leader_node_id() == lead.node_id()
    })
    .await;
    drop(lead); // its lease handle, and with it the lock, goes with it
    until("the other to take over", || other.is_leader()).await;
    other.shutdown().await.unwrap();
}

/// Redis goes away: the leader stops acting as leader before its lease
/// could have lapsed anywhere, nobody leads while the server is down, and
/// one leader is elected when it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_redis_steps_down_within_its_lease() {
    let mut server = redis();
    let store = redis_lease(&server);
    let a = elector(store.clone(), "node-a");
    let b = elector(store, "node-b");
    until("a leader", || leaders(&[&a, &b]) == 1).await;
    let lead = if a.is_leader() { &a } else { &b };
    server.kill();
    let cut = Instant::now();
    until("the leader to step down", || !lead.is_leader()).await;
    assert!(
        cut.elapsed() < LEASE,
        "stepped down after its lease: {:?}",
        cut.elapsed()
    );
    passes(&a, 3).await;
    passes(&b, 3).await;
    assert_eq!(leaders(&[&a, &b]), 0, "nobody leads without the store");
    server.restart().expect("redis restarts");
    until("a leader again", || leaders(&[&a, &b]) == 1).await;
}

/// A block record with one serving location, for the fencing tests.
fn record(key: u64) -> kvtier_meta::BlockMeta {
    use kvtier_meta::{
        BlockKey, BlockMeta, CacheLocation, LocationId, LocationStatus, StorageKind,
    };
    BlockMeta {
        key: BlockKey(key),
        locations: vec![CacheLocation {
            id: LocationId(key),
            storage: "s".into(),
            kind: StorageKind::FilePool,
            status: LocationStatus::Serving,
            specs: vec![],
        }],
        last_access_ms: 1,
        access_count: 0,
        depth: 0,
    }
}

/// A fence that believes it leads under `epoch` whatever happens: a
/// frontend stalled past its lease, as only the server can stop it.
fn stale_fence(epoch: u64) -> kvtier_meta::Fence {
    kvtier_meta::Fence::new(epoch, Arc::new(move || Some(epoch)))
}

/// Leader-only writes on a shared Redis index are fenced on the server:
/// refused once another frontend took the lease before the read, and not
/// applied when one takes it between the read and the commit; unfenced
/// writes are not affected, and the current leader's fenced write goes
/// through.
#[test]
fn fenced_writes_on_redis_stop_at_a_new_lease_epoch() {
    use kvtier_meta::{BlockKey, MetaIndex, Modify, RedisIndex, RedisIndexConfig};
    let server = redis();
    let index = RedisIndex::open(
        &server.url(),
        RedisIndexConfig {
            prefix: "kvt".into(),
            leader_epoch_key: Some(RedisLease::epoch_key("kvt")),
            ..RedisIndexConfig::default()
        },
    )
    .expect("index");
    let lease = redis_lease(&server);
    let a = lease
        .try_acquire("a", Duration::from_secs(30))
        .unwrap()
        .expect("a leads");
    index.put("i", &[record(1), record(2)]).unwrap();
    let delete = |_, _| Modify::Delete;

    // The leader's own fenced write applies.
    index
        .modify_fenced("i", &[BlockKey(1)], &stale_fence(a), &mut delete.clone())
        .expect("the leader's write");
    assert!(index.get("i", &[BlockKey(1)]).unwrap()[0].is_none());

    // Another frontend takes the lease (a's lapsed): a's write is refused.
    lease.release("a", a).unwrap();
    let b = lease
        .try_acquire("b", Duration::from_secs(30))
        .unwrap()
        .expect("b leads");
    assert!(b > a);
    let e = index
        .modify_fenced("i", &[BlockKey(2)], &stale_fence(a), &mut delete.clone())
        .expect_err("a stale leader's write");
    assert_eq!(e.code(), "NOT_LEADER", "{e}");
    assert!(index.get("i", &[BlockKey(2)]).unwrap()[0].is_some());

    // b's lease is taken over while b's write is between read and commit
    // (inside its modifier): nothing of it is applied.
    let mut raw = ::redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut taken_meanwhile = |_, _| {
        let _: u64 = ::redis::cmd("INCR")
            .arg(RedisLease::epoch_key("kvt"))
            .query(&mut raw)
            .expect("INCR");
        Modify::Delete
    };
    assert!(
        index
            .modify_fenced("i", &[BlockKey(2)], &stale_fence(b), &mut taken_meanwhile)
            .is_err()
    );
    assert!(index.get("i", &[BlockKey(2)]).unwrap()[0].is_some());

    // Writes outside the fence (the request path) go on.
    index
        .modify("i", &[BlockKey(2)], &mut delete.clone())
        .unwrap();
    assert!(index.get("i", &[BlockKey(2)]).unwrap()[0].is_none());
}

/// The elector's fence follows its role: it holds while leading, and a
/// demotion breaks it at once, so the default (in-process) fencing of the
/// memory and embedded indexes refuses the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_electors_fence_breaks_when_it_stops_leading() {
    use kvtier_meta::{BlockKey, MemoryIndex, MetaIndex, Modify};
    let e = elector(Arc::new(MemoryLease::new()), "a");
    until("a leads", || e.is_leader()).await;
    let fence = e.fence().expect("a fence while leading");
    let index = MemoryIndex::new();
    index.put("i", &[record(1), record(2)]).unwrap();
    index
        .modify_fenced("i", &[BlockKey(1)], &fence, &mut |_, _| Modify::Delete)
        .unwrap();
    assert!(e.demote().await.unwrap());
    let err = index
        .modify_fenced("i", &[BlockKey(2)], &fence, &mut |_, _| Modify::Delete)
        .expect_err("after the demotion");
    assert_eq!(err.code(), "NOT_LEADER");
    assert!(index.get("i", &[BlockKey(2)]).unwrap()[0].is_some());
    assert!(e.fence().is_none());
}
