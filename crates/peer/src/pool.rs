//! The reading side a daemon keeps for all its peers: [`PeerPool`] holds
//! authenticated connections per peer, bounds them, reuses the idle ones
//! and closes those idle too long in the background, skips a peer that
//! keeps failing or sends blocks that fail verification ([`PeerHealth`])
//! and counts what every peer answered ([`PeerStats`])
//! (docs/peer-protocol.md §10).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use kvtier_core::BlockSums;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;
use tokio::time::{Instant, MissedTickBehavior, timeout_at};

use crate::client::{Identity, PeerClient, ReadStats, Want};
use crate::error::PeerError;
use crate::frame::{LayerRange, MAX_KEYS};
use crate::health::{HealthPolicy, PeerHealth};

/// Upper bounds (µs) of the latency histogram's buckets; a last, unbounded
/// bucket follows. Prometheus-style `le` bounds for `/metrics`.
pub const LATENCY_BOUNDS_US: [u64; 12] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

/// A peer as the pool knows it: the node name it must prove, and where it
/// listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerAddr {
    /// The peer's node name; a server that proves another name is refused.
    pub node: String,
    /// The peer's data-plane address.
    pub addr: SocketAddr,
}

/// How a [`PeerPool`] behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Connections open to one peer at most (in use and idle together);
    /// a reader beyond them waits for one within its deadline. Default: 4.
    pub max_connections_per_peer: usize,
    /// An idle connection older than this is closed, not reused; a pool
    /// made inside a tokio runtime also closes it in the background within
    /// half this time more. Default: 60 s.
    pub idle_timeout: Duration,
    /// When a failing peer is skipped.
    pub health: HealthPolicy,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            max_connections_per_peer: 4,
            idle_timeout: Duration::from_secs(60),
            health: HealthPolicy::default(),
        }
    }
}

/// What one pooled read found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadOutcome {
    /// One entry per want: the block's sums when its target holds its
    /// verified bytes, `None` for a miss (as [`PeerClient::read_into`]).
    pub sums: Vec<Option<BlockSums>>,
    /// Found, missing and corrupt blocks of this read.
    pub counts: ReadStats,
}

/// One peer's counters since the pool first read from it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerStats {
    /// Reads asked of the peer (skipped ones included).
    pub reads: u64,
    /// Blocks returned verified.
    pub found: u64,
    /// Blocks the peer did not hold.
    pub missing: u64,
    /// Blocks that failed verification (misses). A read with any is a
    /// failure in the peer's health, though not counted in `failures`.
    pub corrupt: u64,
    /// Verified bytes received.
    pub bytes: u64,
    /// Reads that failed (connect, handshake, i/o, protocol, timeout).
    pub failures: u64,
    /// Of the failures, those that ran out of their deadline.
    pub timeouts: u64,
    /// Reads refused at once because the peer was being skipped.
    pub skipped: u64,
    /// Reads that found every connection busy until their deadline.
    pub busy: u64,
    /// Connections opened (handshakes completed).
    pub connections_opened: u64,
    /// Connections open now, in use or idle.
    pub connections_open: u64,
    /// Latency of completed reads (the wait for a connection and its
    /// connect included), per bucket of
    /// [`LATENCY_BOUNDS_US`] plus one unbounded bucket; not cumulative.
    pub latency_buckets: [u64; LATENCY_BOUNDS_US.len() + 1],
    /// Sum of those latencies, µs.
    pub latency_sum_us: u64,
}

/// A connection resting in the pool, and since when.
#[derive(Debug)]
struct Idle {
    client: PeerClient,
    since: Instant,
}

/// One peer's connections, health and counters.
#[derive(Debug)]
struct Peer {
    /// One permit per connection that may be in use.
    permits: Arc<Semaphore>,
    /// What the peer's permits and connections protect; std mutex, never
    /// held across an await.
    state: Mutex<PeerState>,
}

#[derive(Debug)]
struct PeerState {
    idle: Vec<Idle>,
    health: PeerHealth,
    stats: PeerStats,
}

/// A connection taken from the pool for one read, with its permit. It goes
/// back to the pool only through [`PeerPool::give_back`]; dropped
/// otherwise (a failed or cancelled read), it is closed and uncounted.
struct Lease {
    client: Option<PeerClient>,
    entry: Arc<Peer>,
    reused: bool,
    _permit: OwnedSemaphorePermit,
}

impl Lease {
    /// Closes the connection held, if any.
    fn close(&mut self) {
        if self.client.take().is_some() {
            self.entry.state().stats.connections_open -= 1;
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.close();
    }
}

/// Every peer's entry, by peer; std mutex, never held across an await.
type Peers = Mutex<HashMap<PeerAddr, Arc<Peer>>>;

/// Connections to every peer of the cluster, for reading blocks.
#[derive(Debug)]
pub struct PeerPool {
    me: Identity,
    config: PoolConfig,
    /// Shared with the reaper, which holds it weakly so that it never
    /// keeps the pool's connections alive.
    peers: Arc<Peers>,
    /// The task closing idle connections in the background, aborted when
    /// the pool is dropped; none for a pool made outside a runtime.
    reaper: Option<AbortHandle>,
}

impl PeerPool {
    /// A pool that connects as `me`. Made inside a tokio runtime, it starts
    /// a task on it that closes connections idle past
    /// [`PoolConfig::idle_timeout`] every half of that time, until the pool
    /// is dropped; made outside one, idle connections are closed only when
    /// their peer is next read and by [`close_idle`](Self::close_idle).
    pub fn new(me: Identity, config: PoolConfig) -> Self {
        let peers: Arc<Peers> = Arc::default();
        let reaper = tokio::runtime::Handle::try_current().ok().map(|rt| {
            rt.spawn(reap(Arc::downgrade(&peers), config.idle_timeout))
                .abort_handle()
        });
        Self {
            me,
            config,
            peers,
            reaper,
        }
    }

    /// Reads `wants` (each for `layers`) from `peer` by `deadline`, the
    /// bytes landing in `targets` as [`PeerClient::read_into`] lands them.
    /// Uses an idle connection or opens one (connect and handshake within
    /// the deadline); a peer being skipped fails at once with
    /// [`PeerError::Skipped`]. A reused connection found closed is replaced
    /// once: the read is idempotent.
    pub async fn read_into(
        &self,
        peer: &PeerAddr,
        wants: &[Want],
        layers: LayerRange,
        targets: &mut [&mut [u8]],
        deadline: Instant,
    ) -> Result<ReadOutcome, PeerError> {
        check_request(wants.len(), targets.len())?;
        let entry = self.peer(peer);
        let started = Instant::now();
        entry.begin(peer, started)?;
        let result = self
            .read_leased(peer, &entry, wants, layers, targets, deadline)
            .await;
        entry.finish(&result, targets, started);
        result
    }

    /// Every peer's counters now, by peer.
    pub fn stats(&self) -> Vec<(PeerAddr, PeerStats)> {
        let peers: Vec<_> = lock(&self.peers)
            .iter()
            .map(|(a, p)| (a.clone(), Arc::clone(p)))
            .collect();
        peers
            .into_iter()
            .map(|(a, p)| (a, p.state().stats.clone()))
            .collect()
    }

    /// Closes every connection idle longer than the idle timeout now (the
    /// pool's background task does this periodically). Returns how many
    /// were closed.
    pub fn close_idle(&self) -> usize {
        close_idle_in(&self.peers, self.config.idle_timeout)
    }

    /// The entry of `peer`, made on first use.
    fn peer(&self, peer: &PeerAddr) -> Arc<Peer> {
        let mut peers = lock(&self.peers);
        let entry = peers.entry(peer.clone()).or_insert_with(|| {
            Arc::new(Peer {
                // A bound of 0 would make every read wait out its deadline.
                permits: Arc::new(Semaphore::new(self.config.max_connections_per_peer.max(1))),
                state: Mutex::new(PeerState {
                    idle: Vec::new(),
                    health: PeerHealth::new(self.config.health),
                    stats: PeerStats::default(),
                }),
            })
        });
        Arc::clone(entry)
    }

    /// Takes a connection, reads, and gives it back if still usable.
    async fn read_leased(
        &self,
        peer: &PeerAddr,
        entry: &Arc<Peer>,
        wants: &[Want],
        layers: LayerRange,
        targets: &mut [&mut [u8]],
        deadline: Instant,
    ) -> Result<ReadOutcome, PeerError> {
        let mut lease = self.lease(peer, entry, deadline).await?;
        let mut result = read_on(&mut lease, wants, layers, targets, deadline).await;
        if lease.reused && stale(&result) {
            // The peer closed this connection while it rested (a restart,
            // its idle limit): nothing was read, so ask on a fresh one.
            lease.close();
            lease.client = Some(self.open(peer, entry, deadline).await?);
            lease.reused = false;
            result = read_on(&mut lease, wants, layers, targets, deadline).await;
        }
        if result.is_ok() {
            Self::give_back(entry, lease);
        }
        result
    }

    /// A connection to `peer` and its permit: an idle one, or a new one.
    async fn lease(
        &self,
        peer: &PeerAddr,
        entry: &Arc<Peer>,
        deadline: Instant,
    ) -> Result<Lease, PeerError> {
        let permits = Arc::clone(&entry.permits);
        let Ok(Ok(permit)) = timeout_at(deadline, permits.acquire_owned()).await else {
            entry.state().stats.busy += 1;
            return Err(PeerError::Busy {
                node: peer.node.clone(),
            });
        };
        let idle = entry
            .state()
            .take_idle(Instant::now(), self.config.idle_timeout);
        let (client, reused) = match idle {
            Some(client) => (client, true),
            None => (self.open(peer, entry, deadline).await?, false),
        };
        Ok(Lease {
            client: Some(client),
            entry: Arc::clone(entry),
            reused,
            _permit: permit,
        })
    }

    /// Connects to `peer` and checks it is the node named.
    async fn open(
        &self,
        peer: &PeerAddr,
        entry: &Peer,
        deadline: Instant,
    ) -> Result<PeerClient, PeerError> {
        let within = deadline.saturating_duration_since(Instant::now());
        let client = PeerClient::connect(peer.addr, &self.me, within).await?;
        if client.peer_node() != peer.node {
            return Err(PeerError::WrongNode {
                expected: peer.node.clone(),
                got: client.peer_node().to_owned(),
            });
        }
        let mut state = entry.state();
        state.stats.connections_opened += 1;
        state.stats.connections_open += 1;
        Ok(client)
    }

    /// Returns `lease`'s connection to the pool, idle from now. The permit
    /// is released after, so a waiting reader finds the connection idle.
    fn give_back(entry: &Peer, mut lease: Lease) {
        if let Some(client) = lease.client.take() {
            let since = Instant::now();
            entry.state().idle.push(Idle { client, since });
        }
    }
}

impl Drop for PeerPool {
    fn drop(&mut self) {
        if let Some(reaper) = &self.reaper {
            reaper.abort();
        }
    }
}

/// The period of the background close of idle connections: half the idle
/// timeout, so a connection is closed at most 1.5 idle timeouts after it
/// rested (at least 1 ms: an interval cannot be zero).
fn reap_period(idle_timeout: Duration) -> Duration {
    (idle_timeout / 2).max(Duration::from_millis(1))
}

/// Closes the idle connections of `peers` every [`reap_period`] until the
/// pool is gone.
async fn reap(peers: Weak<Peers>, idle_timeout: Duration) {
    let mut tick = tokio::time::interval(reap_period(idle_timeout));
    // A runtime that stalled owes no burst of closes.
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // The first tick is at once; nothing can be idle yet.
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(peers) = peers.upgrade() else {
            return;
        };
        close_idle_in(&peers, idle_timeout);
    }
}

/// Closes the connections of `peers` idle longer than `idle_timeout`;
/// how many.
fn close_idle_in(peers: &Peers, idle_timeout: Duration) -> usize {
    let now = Instant::now();
    let entries: Vec<_> = lock(peers).values().cloned().collect();
    entries
        .iter()
        .map(|p| p.state().expire(now, idle_timeout))
        .sum()
}

impl Peer {
    fn state(&self) -> MutexGuard<'_, PeerState> {
        lock(&self.state)
    }

    /// Counts a read begun at `now`; refuses it if the peer is skipped.
    fn begin(&self, peer: &PeerAddr, now: Instant) -> Result<(), PeerError> {
        let mut state = self.state();
        state.stats.reads += 1;
        if state.health.usable(now.into_std()) {
            return Ok(());
        }
        state.stats.skipped += 1;
        Err(PeerError::Skipped {
            node: peer.node.clone(),
        })
    }

    /// Records a read's result in the peer's health and counters.
    fn finish(
        &self,
        result: &Result<ReadOutcome, PeerError>,
        targets: &[&mut [u8]],
        started: Instant,
    ) {
        let now = Instant::now();
        let mut state = self.state();
        match result {
            Ok(outcome) => {
                // A peer that answers with blocks failing verification is
                // as unusable as one that does not answer: skipped alike.
                match outcome.counts.corrupt {
                    0 => state.health.succeeded(),
                    _ => state.health.failed(now.into_std()),
                }
                state.stats.record(outcome, targets, now - started);
            }
            // Waiting for our own connections says nothing of the peer.
            Err(PeerError::Busy { .. }) => {}
            Err(e) => {
                state.health.failed(now.into_std());
                state.stats.failures += 1;
                state.stats.timeouts += u64::from(matches!(e, PeerError::Timeout));
            }
        }
    }
}

impl PeerState {
    /// The most recently rested connection not past `idle_timeout` at
    /// `now`; older ones are closed.
    fn take_idle(&mut self, now: Instant, idle_timeout: Duration) -> Option<PeerClient> {
        self.expire(now, idle_timeout);
        self.idle.pop().map(|i| i.client)
    }

    /// Closes connections idle longer than `idle_timeout`; returns how many.
    fn expire(&mut self, now: Instant, idle_timeout: Duration) -> usize {
        let before = self.idle.len();
        self.idle
            .retain(|i| now.saturating_duration_since(i.since) < idle_timeout);
        let closed = before - self.idle.len();
        self.stats.connections_open -= closed as u64;
        closed
    }
}

impl PeerStats {
    /// Counts a completed read that took `took`.
    fn record(&mut self, outcome: &ReadOutcome, targets: &[&mut [u8]], took: Duration) {
        self.found += outcome.counts.found;
        self.missing += outcome.counts.missing;
        self.corrupt += outcome.counts.corrupt;
        let landed = outcome
            .sums
            .iter()
            .zip(targets)
            .filter(|(s, _)| s.is_some());
        self.bytes += landed.map(|(_, t)| t.len() as u64).sum::<u64>();
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let bucket = LATENCY_BOUNDS_US.partition_point(|&bound| bound < us);
        self.latency_buckets[bucket] += 1;
        self.latency_sum_us = self.latency_sum_us.saturating_add(us);
    }
}

/// Refuses a request the client would refuse, before any connection is
/// taken (it says nothing of the peer).
fn check_request(wants: usize, targets: usize) -> Result<(), PeerError> {
    if wants != targets {
        return Err(PeerError::Targets { wants, targets });
    }
    if wants > MAX_KEYS {
        return Err(PeerError::TooManyKeys { count: wants });
    }
    Ok(())
}

/// One read on `client`, with its found/missing/corrupt counts.
async fn read_on(
    lease: &mut Lease,
    wants: &[Want],
    layers: LayerRange,
    targets: &mut [&mut [u8]],
    deadline: Instant,
) -> Result<ReadOutcome, PeerError> {
    let Some(client) = lease.client.as_mut() else {
        return Err(PeerError::Broken);
    };
    let before = client.stats();
    let sums = client.read_into(wants, layers, targets, deadline).await?;
    let after = client.stats();
    let counts = ReadStats {
        found: after.found - before.found,
        missing: after.missing - before.missing,
        corrupt: after.corrupt - before.corrupt,
    };
    Ok(ReadOutcome { sums, counts })
}

/// Whether a read on a reused connection failed as one the peer had
/// already closed does.
fn stale(result: &Result<ReadOutcome, PeerError>) -> bool {
    matches!(result, Err(PeerError::Closed | PeerError::Io(_)))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change under these locks is a counter or one push/pop: a panic
    // cannot leave them half-changed.
    m.lock().unwrap_or_else(|e| e.into_inner())
}
