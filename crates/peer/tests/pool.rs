//! The reader's pool over real loopback TCP: reuse, the per-peer bound,
//! a dying and restarted peer, skipping and probing, corrupt blocks and a
//! wrong secret (docs/peer-protocol.md §10).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use kvtier_core::BlockHash;
use kvtier_peer::{
    BlockData, BlockSource, Expect, HealthPolicy, LayerRange, MemorySource, PeerAddr, PeerError,
    PeerPool, PeerStats, PoolConfig, ServerHandle, Want,
};
use kvtier_tier::BoxFuture;
use proptest::prelude::*;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;

/// Blocks 0..8, served from memory; while `gated`, each read says it was
/// asked and waits for a permit of `release` first. Counts reads in
/// progress and their peak.
struct Gate {
    blocks: MemorySource,
    gated: AtomicBool,
    asked: mpsc::UnboundedSender<()>,
    release: Semaphore,
    now: AtomicUsize,
    peak: AtomicUsize,
}

impl Gate {
    fn new(gated: bool) -> (Arc<Self>, mpsc::UnboundedReceiver<()>) {
        let (asked, rx) = mpsc::unbounded_channel();
        let blocks = MemorySource::new();
        for n in 0..8 {
            blocks.insert(BlockHash(n as u128), LAYER, block_bytes(n));
        }
        let gate = Self {
            blocks,
            gated: AtomicBool::new(gated),
            asked,
            release: Semaphore::new(0),
            now: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        };
        (Arc::new(gate), rx)
    }
}

impl BlockSource for Gate {
    fn read<'a>(
        &'a self,
        keys: &'a [BlockHash],
        layers: LayerRange,
    ) -> BoxFuture<'a, Vec<Option<BlockData>>> {
        Box::pin(async move {
            let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.peak.fetch_max(now, Ordering::SeqCst);
            if self.gated.load(Ordering::SeqCst) {
                let _ = self.asked.send(());
                if let Ok(permit) = self.release.acquire().await {
                    permit.forget();
                }
            }
            let got = self.blocks.read(keys, layers).await;
            self.now.fetch_sub(1, Ordering::SeqCst);
            got
        })
    }
}

fn want(n: u8) -> Want {
    Want {
        key: BlockHash(n as u128),
        expect: Expect::Checksum(sums(n).block),
    }
}

fn addr_of(server: &ServerHandle) -> PeerAddr {
    PeerAddr {
        node: "a".into(),
        addr: server.local_addr(),
    }
}

fn pool(max: usize) -> Arc<PeerPool> {
    let config = PoolConfig {
        max_connections_per_peer: max,
        ..PoolConfig::default()
    };
    Arc::new(PeerPool::new(client_id(), config))
}

fn stats_of(pool: &PeerPool, peer: &PeerAddr) -> PeerStats {
    let all = pool.stats();
    let found = all.into_iter().find(|(a, _)| a == peer);
    found.map(|(_, s)| s).unwrap_or_default()
}

/// Reads block `n` whole from `peer` by `deadline`; whether it came back
/// byte-exact.
async fn read_block(
    pool: &PeerPool,
    peer: &PeerAddr,
    n: u8,
    deadline: Instant,
) -> Result<bool, PeerError> {
    let mut buf = vec![0u8; block_bytes(n).len()];
    let got = pool
        .read_into(peer, &[want(n)], LayerRange::All, &mut [&mut buf], deadline)
        .await?;
    Ok(got.sums[0].is_some() && buf == block_bytes(n))
}

#[tokio::test]
async fn connections_are_reused() {
    let (gate, _asked) = Gate::new(false);
    let server = start(gate).await;
    let (pool, peer) = (pool(4), addr_of(&server));
    for n in 0..20 {
        assert!(read_block(&pool, &peer, n % 8, later()).await.unwrap());
    }
    assert_eq!(server.stats().snapshot().accepted, 1);
    let s = stats_of(&pool, &peer);
    assert_eq!((s.reads, s.found, s.connections_opened), (20, 20, 1));
    assert_eq!(s.connections_open, 1);
    assert_eq!(
        s.bytes,
        (0..20u8).map(|n| block_bytes(n % 8).len() as u64).sum()
    );
    assert_eq!(s.latency_buckets.iter().sum::<u64>(), 20);
}

#[tokio::test]
async fn reads_beyond_the_bound_wait_or_fail_busy() {
    let (gate, mut asked) = Gate::new(true);
    let server = start(gate.clone()).await;
    let (pool, peer) = (pool(2), addr_of(&server));
    let spawn_read = |n| {
        let (pool, peer) = (pool.clone(), peer.clone());
        tokio::spawn(async move { read_block(&pool, &peer, n, later()).await })
    };
    let (a, b) = (spawn_read(0), spawn_read(1));
    asked.recv().await.unwrap();
    asked.recv().await.unwrap();
    // Both connections are inside the server now: a third reader with a
    // deadline that has passed gets none.
    let err = read_block(&pool, &peer, 2, Instant::now())
        .await
        .unwrap_err();
    assert!(matches!(err, PeerError::Busy { .. }), "{err}");
    let c = spawn_read(2);
    gate.release.add_permits(3);
    for r in [a, b, c] {
        assert!(r.await.unwrap().unwrap());
    }
    assert_eq!(server.stats().snapshot().accepted, 2);
    assert_eq!(gate.peak.load(Ordering::SeqCst), 2);
    let s = stats_of(&pool, &peer);
    assert_eq!((s.busy, s.failures, s.connections_open), (1, 0, 2));
}

#[tokio::test]
async fn a_stalled_peer_times_out_and_a_killed_one_is_reconnected_after_restart() {
    let (gate, mut asked) = Gate::new(true);
    let server = start(gate.clone()).await;
    let (pool, peer) = (pool(2), addr_of(&server));
    let deadline = Instant::now() + Duration::from_millis(200);
    let err = read_block(&pool, &peer, 0, deadline).await.unwrap_err();
    assert!(matches!(err, PeerError::Timeout), "{err}");
    asked.recv().await.unwrap();

    let reader = {
        let (pool, peer) = (pool.clone(), peer.clone());
        tokio::spawn(async move { read_block(&pool, &peer, 1, later()).await })
    };
    asked.recv().await.unwrap();
    server.shutdown().await;
    let err = reader.await.unwrap().unwrap_err();
    assert!(matches!(err, PeerError::Closed | PeerError::Io(_)), "{err}");

    let (fresh, _asked) = Gate::new(false);
    let restarted = restart_on(peer.addr, fresh).await;
    assert!(read_block(&pool, &peer, 2, later()).await.unwrap());
    assert_eq!(restarted.stats().snapshot().accepted, 1);
    let s = stats_of(&pool, &peer);
    assert_eq!((s.failures, s.timeouts, s.connections_opened), (2, 1, 3));
    assert_eq!(s.connections_open, 1);
}

/// A server over `source` on `addr`, where another one listened before.
async fn restart_on(addr: std::net::SocketAddr, source: Arc<dyn BlockSource>) -> ServerHandle {
    let listener = TcpListener::bind(addr).await.unwrap();
    let config = kvtier_peer::ServerConfig::new(server_id());
    kvtier_peer::PeerServer::start(listener, config, source).unwrap()
}

#[tokio::test]
async fn an_idle_connection_the_peer_closed_is_replaced_without_a_failure() {
    let (gate, _asked) = Gate::new(false);
    let server = start(gate).await;
    let (pool, peer) = (pool(2), addr_of(&server));
    assert!(read_block(&pool, &peer, 0, later()).await.unwrap());
    server.shutdown().await;
    let (fresh, _asked) = Gate::new(false);
    let restarted = restart_on(peer.addr, fresh).await;
    assert!(read_block(&pool, &peer, 1, later()).await.unwrap());
    assert_eq!(restarted.stats().snapshot().accepted, 1);
    let s = stats_of(&pool, &peer);
    assert_eq!(
        (s.failures, s.connections_opened, s.connections_open),
        (0, 2, 1)
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_failing_peer_is_skipped_then_probed_after_the_backoff() {
    // The peer holds another secret: every handshake fails.
    let (gate, _asked) = Gate::new(false);
    let config = kvtier_peer::ServerConfig::new(identity("a", "c", 2));
    let wrong = start_with(config, gate).await;
    let peer = addr_of(&wrong);
    let health = HealthPolicy {
        failures_to_skip: 3,
        backoff: Duration::from_secs(10),
        max_backoff: Duration::from_secs(60),
    };
    let config = PoolConfig {
        health,
        ..PoolConfig::default()
    };
    let pool = PeerPool::new(client_id(), config);
    for _ in 0..3 {
        let err = read_block(&pool, &peer, 0, later()).await.unwrap_err();
        assert!(matches!(err, PeerError::AuthFailed { .. }), "{err}");
    }
    let err = read_block(&pool, &peer, 0, later()).await.unwrap_err();
    assert!(matches!(err, PeerError::Skipped { .. }), "{err}");
    assert_eq!(
        wrong.stats().snapshot().accepted,
        3,
        "a skipped read connects nowhere"
    );

    // The peer comes back with the cluster's secret; the pool asks again
    // only once the backoff has passed.
    wrong.shutdown().await;
    let (gate, _asked) = Gate::new(false);
    let right = restart_on(peer.addr, gate).await;
    skip_time(Duration::from_secs(9)).await;
    let err = read_block(&pool, &peer, 0, later()).await.unwrap_err();
    assert!(matches!(err, PeerError::Skipped { .. }), "{err}");
    skip_time(Duration::from_secs(1)).await;
    assert!(read_block(&pool, &peer, 0, later()).await.unwrap());
    assert!(read_block(&pool, &peer, 1, later()).await.unwrap());
    assert_eq!(right.stats().snapshot().accepted, 1);
    let s = stats_of(&pool, &peer);
    assert_eq!((s.reads, s.failures, s.skipped, s.found), (7, 3, 2, 2));
}

/// Moves tokio's clock `by` forward at once, then lets it run again (so
/// real socket i/o is not raced by auto-advanced timers).
async fn skip_time(by: Duration) {
    tokio::time::pause();
    tokio::time::advance(by).await;
    tokio::time::resume();
}

#[tokio::test]
async fn corrupt_blocks_are_misses_and_counted() {
    let source = Arc::new(MemorySource::new());
    source.insert(BlockHash(0), LAYER, block_bytes(0));
    // Block 1 stored with sums of other bytes: what a faulty copy looks like.
    source.insert_with_sums(BlockHash(1), LAYER, block_bytes(1), sums(2));
    let server = start(source).await;
    let (pool, peer) = (pool(2), addr_of(&server));
    let mut bufs = [
        vec![0u8; block_bytes(0).len()],
        vec![0u8; block_bytes(1).len()],
    ];
    let [b0, b1] = &mut bufs;
    let wants = [want(0), want(1), want(3)];
    let mut b3 = vec![0u8; block_bytes(3).len()];
    let got = pool
        .read_into(
            &peer,
            &wants,
            LayerRange::All,
            &mut [b0, b1, &mut b3],
            later(),
        )
        .await
        .unwrap();
    assert!(got.sums[0].is_some() && got.sums[1].is_none() && got.sums[2].is_none());
    assert_eq!(bufs[0], block_bytes(0));
    let s = stats_of(&pool, &peer);
    assert_eq!((s.found, s.corrupt, s.missing, s.failures), (1, 1, 1, 0));
    assert_eq!(s.bytes, block_bytes(0).len() as u64);
    assert_eq!(
        s.connections_open, 1,
        "a read with misses keeps its connection"
    );
}

#[tokio::test]
async fn a_peer_proving_another_name_is_refused() {
    let (gate, _asked) = Gate::new(false);
    let server = start(gate).await;
    let pool = pool(2);
    let peer = PeerAddr {
        node: "not-a".into(),
        addr: server.local_addr(),
    };
    let err = read_block(&pool, &peer, 0, later()).await.unwrap_err();
    assert!(matches!(err, PeerError::WrongNode { .. }), "{err}");
    let s = stats_of(&pool, &peer);
    assert_eq!((s.failures, s.connections_open), (1, 0));
}

/// Runs `reads` concurrently (each: max connections bound, whether it is
/// cancelled half-way) and checks the pool's accounting.
async fn concurrent_reads(max: usize, reads: Vec<bool>) {
    let (gate, _asked) = Gate::new(false);
    let server = start(gate.clone()).await;
    let (pool, peer) = (pool(max), addr_of(&server));
    let mut tasks = tokio::task::JoinSet::new();
    for (i, cancel) in reads.iter().copied().enumerate() {
        let (pool, peer) = (pool.clone(), peer.clone());
        tasks.spawn(async move {
            let read = read_block(&pool, &peer, (i % 8) as u8, later());
            if cancel {
                // Dropped at its first pending point: mid-connect, mid-wait
                // or mid-read.
                let _ = tokio::time::timeout(Duration::ZERO, read).await;
            } else {
                assert!(read.await.unwrap());
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let s = stats_of(&pool, &peer);
    assert!(gate.peak.load(Ordering::SeqCst) <= max);
    assert!(server.stats().snapshot().accepted <= s.connections_opened + reads.len() as u64);
    assert!(s.connections_opened <= server.stats().snapshot().authenticated);
    assert!(s.connections_open <= max as u64, "{s:?}");
    // Every connection still counted open is idle and usable: `max` reads
    // at once open no new one.
    let before = s.connections_opened;
    let open = s.connections_open;
    let mut all = tokio::task::JoinSet::new();
    for n in 0..open {
        let (pool, peer) = (pool.clone(), peer.clone());
        all.spawn(async move { read_block(&pool, &peer, n as u8, later()).await });
    }
    while let Some(done) = all.join_next().await {
        assert!(done.unwrap().unwrap());
    }
    assert!(stats_of(&pool, &peer).connections_opened <= before + open);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Under any mix of concurrent and cancelled reads, connections to a
    /// peer never exceed the bound, and the pool's count of open ones
    /// stays within it (none leaked by a cancelled read).
    #[test]
    fn connection_accounting_holds_under_concurrency(
        max in 1usize..4,
        reads in prop::collection::vec(any::<bool>(), 1..24),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(concurrent_reads(max, reads));
    }
}

/// A peer, and a pool holding one idle connection to it.
async fn one_idle_connection() -> (ServerHandle, Arc<PeerPool>, PeerAddr) {
    let (gate, _asked) = Gate::new(false);
    let server = start(gate).await;
    let (pool, peer) = (pool(2), addr_of(&server));
    assert!(read_block(&pool, &peer, 0, later()).await.unwrap());
    assert_eq!(stats_of(&pool, &peer).connections_open, 1);
    (server, pool, peer)
}

#[tokio::test(flavor = "current_thread")]
async fn idle_connections_are_closed_after_the_idle_timeout() {
    let (_server, pool, peer) = one_idle_connection().await;
    assert_eq!(pool.close_idle(), 0, "fresh connections stay");
    skip_time(PoolConfig::default().idle_timeout).await;
    assert_eq!(pool.close_idle(), 1);
    assert_eq!(stats_of(&pool, &peer).connections_open, 0);
    assert!(read_block(&pool, &peer, 1, later()).await.unwrap());
    assert_eq!(stats_of(&pool, &peer).connections_opened, 2);
}

#[tokio::test(flavor = "current_thread")]
async fn idle_connections_are_closed_in_the_background() {
    let (server, pool, peer) = one_idle_connection().await;
    // Nothing calls into the pool while tokio's clock runs past the idle
    // timeout and one period of the pool's timer (the timer's ticks come
    // before this sleep's end on this one-thread runtime).
    tokio::time::pause();
    tokio::time::sleep(PoolConfig::default().idle_timeout * 3 / 2).await;
    tokio::time::resume();
    assert_eq!(stats_of(&pool, &peer).connections_open, 0);
    // The socket is really closed: the server sees its peer leave.
    let closed = std::time::Instant::now() + Duration::from_secs(30);
    while server.stats().snapshot().open > 0 {
        assert!(
            std::time::Instant::now() < closed,
            "the server still holds it"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(read_block(&pool, &peer, 1, later()).await.unwrap());
    assert_eq!(stats_of(&pool, &peer).connections_opened, 2);
}

#[tokio::test(flavor = "current_thread")]
async fn a_dropped_pool_stops_its_timer() {
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let before = tasks();
    let pool = pool(2);
    assert_eq!(tasks(), before + 1, "the pool's timer runs");
    drop(pool);
    // The abort takes effect when the runtime next polls the task.
    let stopped = std::time::Instant::now() + Duration::from_secs(30);
    while tasks() > before {
        assert!(
            std::time::Instant::now() < stopped,
            "the timer outlived its pool"
        );
        tokio::task::yield_now().await;
    }
}

#[test]
fn a_pool_made_outside_a_runtime_has_no_timer_and_still_reads() {
    let pool = pool(2);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (gate, _asked) = Gate::new(false);
        let server = start(gate).await;
        let peer = addr_of(&server);
        assert!(read_block(&pool, &peer, 0, later()).await.unwrap());
        assert_eq!(pool.close_idle(), 0, "its connection is fresh");
    });
}

/// A source of blocks 0..8, of which those in `bad` are stored with the
/// sums of other bytes (a faulty copy: every read of one fails
/// verification) and block 7 is absent.
fn mixed_source(bad: &[u8]) -> Arc<MemorySource> {
    let source = Arc::new(MemorySource::new());
    for n in 0..7u8 {
        let sums = if bad.contains(&n) {
            sums(n + 1)
        } else {
            sums(n)
        };
        source.insert_with_sums(BlockHash(n as u128), LAYER, block_bytes(n), sums);
    }
    source
}

#[tokio::test(flavor = "current_thread")]
async fn a_peer_sending_corrupt_blocks_is_skipped_then_probed() {
    let server = start(mixed_source(&[1])).await;
    let peer = addr_of(&server);
    let config = PoolConfig {
        health: HealthPolicy {
            failures_to_skip: 3,
            backoff: Duration::from_secs(10),
            max_backoff: Duration::from_secs(60),
        },
        ..PoolConfig::default()
    };
    let pool = PeerPool::new(client_id(), config);
    for _ in 0..3 {
        assert!(!read_block(&pool, &peer, 1, later()).await.unwrap());
    }
    let err = read_block(&pool, &peer, 0, later()).await.unwrap_err();
    assert!(matches!(err, PeerError::Skipped { .. }), "{err}");
    let s = stats_of(&pool, &peer);
    assert_eq!((s.corrupt, s.failures, s.skipped), (3, 0, 1));
    assert_eq!(
        server.stats().snapshot().reads,
        3,
        "a skipped read sends nothing"
    );

    skip_time(Duration::from_secs(10)).await;
    assert!(
        read_block(&pool, &peer, 0, later()).await.unwrap(),
        "probed"
    );
    assert!(
        read_block(&pool, &peer, 1, later()).await.is_ok(),
        "restored"
    );
}

/// What a read of the property test below asks for.
#[derive(Debug, Clone, Copy)]
enum Ask {
    /// A block the peer holds intact.
    Good,
    /// A block the peer sends failing verification.
    Corrupt,
    /// A block the peer does not hold.
    Absent,
}

/// Reads `asks` in turn from a peer holding good, corrupt and absent
/// blocks, with a backoff no read outlives, and checks each outcome
/// against a model of the health: a read is skipped exactly when the last
/// `threshold` reads sent were each answered with a corrupt block.
async fn health_follows_verification(threshold: u32, asks: Vec<Ask>) {
    let server = start(mixed_source(&[3])).await;
    let peer = addr_of(&server);
    let health = HealthPolicy {
        failures_to_skip: threshold,
        backoff: Duration::from_secs(3600),
        max_backoff: Duration::from_secs(3600),
    };
    let pool = PeerPool::new(
        client_id(),
        PoolConfig {
            health,
            ..PoolConfig::default()
        },
    );
    let mut run = 0u32;
    for ask in asks {
        let n = match ask {
            Ask::Good => 0,
            Ask::Corrupt => 3,
            Ask::Absent => 7,
        };
        let got = read_block(&pool, &peer, n, later()).await;
        if run >= threshold {
            assert!(matches!(got, Err(PeerError::Skipped { .. })), "{got:?}");
            continue;
        }
        assert_eq!(got.unwrap(), matches!(ask, Ask::Good));
        run = if matches!(ask, Ask::Corrupt) {
            run + 1
        } else {
            0
        };
    }
    let s = stats_of(&pool, &peer);
    assert_eq!(s.failures, 0, "no read erred");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// A peer's health counts reads answered with corrupt blocks as
    /// failures and any other completed read as a success.
    #[test]
    fn corrupt_answers_feed_the_health(
        threshold in 1u32..4,
        asks in prop::collection::vec(
            prop_oneof![Just(Ask::Good), Just(Ask::Corrupt), Just(Ask::Absent)],
            1..16,
        ),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(health_follows_verification(threshold, asks));
    }
}
