//! Leader election among meta frontends that share one index (issue 14;
//! docs/server.md §9). One [`Elector`] per frontend campaigns for a lease
//! kept in a [`LeaseStore`]: a Redis/Valkey key with a TTL
//! ([`RedisLease`]), a `flock`ed file beside the embedded index
//! ([`FileLease`]), or memory ([`MemoryLease`]).
//!
//! The loop runs every `interval`: a follower reads the holder and takes the
//! lease when it is free (unless a campaign delay set by a demotion is
//! running); the leader renews it. A leader that cannot renew steps down
//! one interval before its lease ends, and [`Elector::is_leader`] already
//! says no from that point even if the loop is stuck in a slow call, so
//! two frontends never both act as leader (while clocks run at the same
//! rate). Each acquisition gets a larger epoch than any before it, the
//! fencing token leader-only writes can carry.

mod file;
mod redis;
mod store;

pub use file::{FileLease, lock_path};
pub use redis::RedisLease;
pub use store::{Holder, LeaseError, LeaseResult, LeaseStore, MemoryLease};

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use tokio::sync::{Notify, watch};

use crate::index::Fence;

/// How an [`Elector`] campaigns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectorConfig {
    /// This frontend's id, the lease's value while it leads.
    pub node_id: String,
    /// How long a lease lasts without renewal (upstream's default: 10 s).
    pub lease: Duration,
    /// How often the loop campaigns or renews (upstream's default: 100 ms).
    /// Keep it well under `lease`.
    pub interval: Duration,
}

impl ElectorConfig {
    /// Upstream's lease (`kvcm.leader_elector.lease_ms`).
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);
    /// Upstream's loop interval (`kvcm.leader_elector.loop_interval_ms`).
    pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(100);

    /// `node_id` with upstream's lease and interval.
    pub fn new(node_id: impl Into<String>) -> Self {
        ElectorConfig {
            node_id: node_id.into(),
            lease: Self::DEFAULT_LEASE,
            interval: Self::DEFAULT_INTERVAL,
        }
    }
}

/// What this frontend is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Serves, runs no leader-only work.
    Follower,
    /// Holds the lease under `epoch`.
    Leader {
        /// The lease's epoch: the fencing token.
        epoch: u64,
    },
}

/// Shared by the handle and its loop.
#[derive(Debug)]
struct State {
    store: Arc<dyn LeaseStore>,
    cfg: ElectorConfig,
    role: watch::Sender<Role>,
    /// Until when this frontend may act as leader (lease end less one
    /// interval); `None` when not leading.
    act_until: Mutex<Option<Instant>>,
    /// Lease end, µs since the Unix epoch; -1 when not leading.
    lease_end_unix_us: AtomicI64,
    /// Start of the last loop pass, ms since the Unix epoch; -1 before one.
    last_loop_unix_ms: AtomicI64,
    loops: AtomicU64,
    /// The holder seen last ("" when none).
    leader_node: Mutex<String>,
    /// Applied when leadership is lost or given up; <= 0: none.
    campaign_delay_ms: AtomicI64,
    no_campaign_until: Mutex<Option<Instant>>,
    /// Serializes loop passes and demotions.
    step: tokio::sync::Mutex<()>,
    wake: Notify,
}

/// A running election for one frontend. Dropping it stops the loop without
/// giving the lease up (as a crash would: the others wait for it to lapse);
/// [`Elector::shutdown`] gives it up.
#[derive(Debug)]
pub struct Elector {
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

fn unix_ms() -> i64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Runs a store call on a blocking thread (stores do network or file I/O).
async fn blocking<T: Send + 'static>(
    state: &Arc<State>,
    f: impl FnOnce(&dyn LeaseStore, &str) -> LeaseResult<T> + Send + 'static,
) -> LeaseResult<T> {
    let s = state.clone();
    let joined = tokio::task::spawn_blocking(move || f(s.store.as_ref(), &s.cfg.node_id)).await;
    joined.unwrap_or_else(|e| Err(LeaseError::Interrupted(e.to_string())))
}

impl Elector {
    /// Starts campaigning on the current tokio runtime.
    pub fn start(store: Arc<dyn LeaseStore>, cfg: ElectorConfig) -> Self {
        let state = new_state(store, cfg);
        let task = spawn_loop(state.clone());
        Elector { state, task }
    }

    /// Like [`Elector::start`], but returns after the first campaign, so a
    /// frontend that can lead at once does before it serves its first
    /// request (a free lease is taken; a held one is noted as the leader).
    pub async fn start_after_first_pass(store: Arc<dyn LeaseStore>, cfg: ElectorConfig) -> Self {
        let state = new_state(store, cfg);
        pass(&state).await;
        let task = spawn_loop(state.clone());
        Elector { state, task }
    }

    /// This frontend's id.
    pub fn node_id(&self) -> &str {
        &self.state.cfg.node_id
    }

    /// The role as last decided by the loop (see [`Elector::is_leader`] for
    /// whether to act on it).
    pub fn role(&self) -> Role {
        *self.state.role.borrow()
    }

    /// Role changes, for work that runs on the leader only.
    pub fn subscribe(&self) -> watch::Receiver<Role> {
        self.state.role.subscribe()
    }

    /// Whether this frontend may act as leader now: it holds the lease and
    /// at least one interval of it is left.
    pub fn is_leader(&self) -> bool {
        self.leader_epoch().is_some()
    }

    /// The epoch to fence leader-only writes with, while
    /// [`Elector::is_leader`].
    pub fn leader_epoch(&self) -> Option<u64> {
        acting_epoch(&self.state)
    }

    /// A [`Fence`] for leader-only writes under the current epoch, while
    /// [`Elector::is_leader`]; it stops holding once this frontend stops
    /// acting as leader under that epoch.
    pub fn fence(&self) -> Option<Fence> {
        let epoch = self.leader_epoch()?;
        let state = self.state.clone();
        Some(Fence::new(epoch, Arc::new(move || acting_epoch(&state))))
    }

    /// The holder seen last ("" when none was seen).
    pub fn leader_node_id(&self) -> String {
        self.state.leader_node.lock().clone()
    }

    /// End of this frontend's lease in µs since the Unix epoch; -1 when it
    /// does not lead.
    pub fn lease_expiration_unix_us(&self) -> i64 {
        self.state.lease_end_unix_us.load(Ordering::Relaxed)
    }

    /// Start of the loop's last pass in ms since the Unix epoch; -1 before
    /// the first.
    pub fn last_loop_unix_ms(&self) -> i64 {
        self.state.last_loop_unix_ms.load(Ordering::Relaxed)
    }

    /// Loop passes finished so far.
    pub fn loops(&self) -> u64 {
        self.state.loops.load(Ordering::Relaxed)
    }

    /// How long this frontend stays out of campaigns after it loses or
    /// gives up the lease, ms (<= 0: not at all).
    pub fn campaign_delay_ms(&self) -> i64 {
        self.state.campaign_delay_ms.load(Ordering::Relaxed)
    }

    /// Sets [`Elector::campaign_delay_ms`] (this frontend, in memory).
    pub fn set_campaign_delay_ms(&self, ms: i64) {
        self.state.campaign_delay_ms.store(ms, Ordering::Relaxed);
    }

    /// Gives the lease up if this frontend leads: it stops acting as leader
    /// before the call returns, and campaigns again only after the campaign
    /// delay. `Ok(false)` when it was not leading.
    pub async fn demote(&self) -> LeaseResult<bool> {
        let s = &self.state;
        let _step = s.step.lock().await;
        // Copied out first: the watch's read guard must be gone before
        // `lose` sends.
        let role = *s.role.borrow();
        let Role::Leader { epoch } = role else {
            return Ok(false);
        };
        lose(s);
        blocking(s, move |st, node| st.release(node, epoch)).await?;
        s.wake.notify_one();
        Ok(true)
    }

    /// Stops the loop and gives the lease up if held. The elector stays a
    /// follower afterwards (the loop does not run again).
    pub async fn shutdown(&self) -> LeaseResult<()> {
        self.task.abort();
        self.demote().await.map(|_| ())
    }
}

impl Drop for Elector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The epoch this frontend may act as leader under now: see
/// [`Elector::is_leader`].
fn acting_epoch(s: &State) -> Option<u64> {
    let Role::Leader { epoch } = *s.role.borrow() else {
        return None;
    };
    let until = *s.act_until.lock();
    until.filter(|t| Instant::now() < *t).map(|_| epoch)
}

fn new_state(store: Arc<dyn LeaseStore>, cfg: ElectorConfig) -> Arc<State> {
    Arc::new(State {
        store,
        cfg,
        role: watch::Sender::new(Role::Follower),
        act_until: Mutex::new(None),
        lease_end_unix_us: AtomicI64::new(-1),
        last_loop_unix_ms: AtomicI64::new(-1),
        loops: AtomicU64::new(0),
        leader_node: Mutex::new(String::new()),
        campaign_delay_ms: AtomicI64::new(0),
        no_campaign_until: Mutex::new(None),
        step: tokio::sync::Mutex::new(()),
        wake: Notify::new(),
    })
}

/// The loop: a pass every interval, or at once when woken (a demotion).
fn spawn_loop(s: Arc<State>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(s.cfg.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = s.wake.notified() => {}
            }
            pass(&s).await;
        }
    })
}

/// One pass of the loop.
async fn pass(s: &Arc<State>) {
    let _step = s.step.lock().await;
    s.last_loop_unix_ms.store(unix_ms(), Ordering::Relaxed);
    let role = *s.role.borrow();
    match role {
        Role::Leader { epoch } => hold(s, epoch).await,
        Role::Follower => campaign(s).await,
    }
    s.loops.fetch_add(1, Ordering::Relaxed);
}

/// The leader's pass: renew, or step down when the lease is lost or about
/// to lapse.
async fn hold(s: &Arc<State>, epoch: u64) {
    let lease = s.cfg.lease;
    let t0 = Instant::now();
    match blocking(s, move |st, node| st.renew(node, epoch, lease)).await {
        Ok(true) => granted(s, t0),
        Ok(false) => {
            tracing::warn!(node = %s.cfg.node_id, epoch, "leader lease lost");
            lose(s);
        }
        Err(e) => {
            let until = *s.act_until.lock();
            if until.is_none_or(|t| Instant::now() >= t) {
                tracing::warn!(node = %s.cfg.node_id, epoch, error = %e, "leader lease not renewed in time; stepping down");
                lose(s);
            } else {
                tracing::warn!(node = %s.cfg.node_id, epoch, error = %e, "leader lease renewal failed; retrying");
            }
        }
    }
}

/// The follower's pass: note the holder; take the lease when it is free.
async fn campaign(s: &Arc<State>) {
    let holder = match blocking(s, |st, _| st.holder()).await {
        Ok(h) => h,
        Err(e) => {
            tracing::debug!(node = %s.cfg.node_id, error = %e, "leader lease unreadable");
            return;
        }
    };
    let mine = holder.as_ref().is_some_and(|h| h.node == s.cfg.node_id);
    *s.leader_node.lock() = holder.as_ref().map(|h| h.node.clone()).unwrap_or_default();
    let delayed = s
        .no_campaign_until
        .lock()
        .is_some_and(|t| Instant::now() < t);
    if (holder.is_some() && !mine) || delayed {
        return;
    }
    let lease = s.cfg.lease;
    let t0 = Instant::now();
    match blocking(s, move |st, node| st.try_acquire(node, lease)).await {
        Ok(Some(epoch)) => {
            granted(s, t0);
            *s.leader_node.lock() = s.cfg.node_id.clone();
            tracing::info!(node = %s.cfg.node_id, epoch, "became leader");
            s.role.send_replace(Role::Leader { epoch });
        }
        Ok(None) => {}
        Err(e) => tracing::debug!(node = %s.cfg.node_id, error = %e, "campaign failed"),
    }
}

/// Records a lease granted or renewed by a call that started at `t0`.
fn granted(s: &State, t0: Instant) {
    let (lease, interval) = (s.cfg.lease, s.cfg.interval);
    *s.act_until.lock() = Some(t0 + lease.saturating_sub(interval));
    let end_ms = unix_ms().saturating_add(i64::try_from(lease.as_millis()).unwrap_or(i64::MAX));
    s.lease_end_unix_us
        .store(end_ms.saturating_mul(1000), Ordering::Relaxed);
}

/// Stops leading: role, lease figures, and the campaign delay.
fn lose(s: &State) {
    *s.act_until.lock() = None;
    s.lease_end_unix_us.store(-1, Ordering::Relaxed);
    s.leader_node.lock().clear();
    let delay = s.campaign_delay_ms.load(Ordering::Relaxed);
    *s.no_campaign_until.lock() = u64::try_from(delay)
        .ok()
        .filter(|d| *d > 0)
        .map(|d| Instant::now() + Duration::from_millis(d));
    s.role.send_replace(Role::Follower);
}
