//! Background work that one frontend runs for all of them: the watermark
//! reclaimer, the storage health checker and, with an index several
//! frontends share, the write-session reaper (the sessions are in the
//! shared ledger) and the sweep of orphaned writing locations
//! (docs/server.md §9). Frontends
//! that share one index elect a leader ([`Elector`]); the supervisor here
//! follows the elector's role changes, starting the work when this
//! frontend becomes leader and stopping it when it no longer is. The work
//! carries the leader's [`crate::index::Fence`]: its index writes are
//! refused once the lease it was started under is gone, even before the
//! supervisor has seen the change.
//!
//! Work that stays on every frontend: the catalog refresher (each frontend
//! keeps its own copy) and, with a ledger in this process's memory, the
//! reaper of this frontend's own sessions.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{HealthCheckerHandle, MetaService, ReaperHandle, ReclaimerHandle};
use crate::error::Result;
use crate::index::{Fence, Modify};
use crate::leader::{Elector, Role};
use crate::model::{BlockKey, BlockMeta, CacheLocation, LocationStatus};

/// How often the leader-only work runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderWorkIntervals {
    /// Between watermark reclaimer rounds.
    pub reclaim: Duration,
    /// Between storage health probes.
    pub health: Duration,
}

/// Stops the supervisor, and the work it runs, when dropped.
#[derive(Debug)]
pub struct LeaderWorkHandle {
    task: JoinHandle<()>,
    active: watch::Receiver<bool>,
}

impl LeaderWorkHandle {
    /// Whether the leader-only work runs now; changes once the supervisor
    /// has started or stopped it.
    pub fn active(&self) -> watch::Receiver<bool> {
        self.active.clone()
    }
}

impl Drop for LeaderWorkHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The running leader-only tasks of one lease epoch; dropping it stops
/// them.
struct Running {
    epoch: u64,
    _reclaimer: ReclaimerHandle,
    _health: HealthCheckerHandle,
    _reaper: Option<ReaperHandle>,
    _sweeper: Option<AbortOnDrop>,
}

/// A task aborted when this is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl MetaService {
    /// Removes the writing locations that [`super::MetaConfig::orphan_write_age`]
    /// calls orphaned (their record is that old, so the frontend that
    /// granted them is gone), releasing their space; the leader runs it
    /// every `orphan_write_age`, with its `fence`. Returns how many blocks
    /// had one. Does nothing without `orphan_write_age`. Scans every block
    /// record: blocking, run it off the async workers.
    pub fn sweep_orphaned_writes(&self, fence: Option<&Fence>) -> Result<usize> {
        if self.config.orphan_write_age.is_none() {
            return Ok(0);
        }
        let cutoff = self.orphan_cutoff_ms();
        let orphaned = |m: &BlockMeta| {
            m.last_access_ms <= cutoff
                && m.locations
                    .iter()
                    .any(|l| l.status == LocationStatus::Writing)
        };
        let mut swept = 0;
        self.for_each_page(|inst, keys| {
            // Read without locks first: most pages have none.
            let stale: Vec<BlockKey> = self
                .index
                .get(&inst.id, keys)?
                .into_iter()
                .flatten()
                .filter(|m| orphaned(m))
                .map(|m| m.key)
                .collect();
            if stale.is_empty() {
                return Ok(());
            }
            let mut gone: Vec<CacheLocation> = Vec::new();
            let mut decide = |_, cur: Option<BlockMeta>| {
                // Decided again under the lock: the record may have
                // changed since the read.
                let Some(mut m) = cur.filter(|m| orphaned(m)) else {
                    return Modify::Keep;
                };
                let (writing, rest): (Vec<_>, Vec<_>) = m
                    .locations
                    .into_iter()
                    .partition(|l| l.status == LocationStatus::Writing);
                gone.extend(writing);
                swept += 1;
                m.locations = rest;
                if m.locations.is_empty() {
                    Modify::Delete
                } else {
                    Modify::Put(m)
                }
            };
            match fence {
                Some(f) => self.index.modify_fenced(&inst.id, &stale, f, &mut decide)?,
                None => self.index.modify(&inst.id, &stale, &mut decide)?,
            }
            if !gone.is_empty() {
                tracing::info!(instance = %inst.id, locations = gone.len(), "removed orphaned writing locations");
            }
            self.release_locations(gone);
            Ok(())
        })?;
        Ok(swept)
    }
}

impl MetaService {
    /// Runs the leader-only work while `elector` says this frontend leads.
    /// It stops when the handle is dropped, the elector's loop ends, or the
    /// service is dropped.
    pub fn spawn_leader_work(
        self: &Arc<Self>,
        elector: &Arc<Elector>,
        every: LeaderWorkIntervals,
    ) -> LeaderWorkHandle {
        let svc = Arc::downgrade(self);
        let mut roles = elector.subscribe();
        let elector = Arc::downgrade(elector);
        let (active, active_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut running: Option<Running> = None;
            loop {
                // Copied out: the read guard must not live across an await.
                let want = match *roles.borrow_and_update() {
                    Role::Leader { epoch } => Some(epoch),
                    Role::Follower => None,
                };
                // A new epoch restarts the work (the watch may skip the
                // follower state between two leases).
                if running.as_ref().map(|r| r.epoch) != want {
                    if let Some(r) = running.take() {
                        tracing::info!(
                            epoch = r.epoch,
                            "no longer leader: reclaimer and health checks stopped"
                        );
                    }
                    let (Some(svc), Some(elector)) = (svc.upgrade(), elector.upgrade()) else {
                        return;
                    };
                    running = want.and_then(|epoch| start(&svc, &elector, epoch, every));
                }
                active.send_if_modified(|a| std::mem::replace(a, running.is_some()) != *a);
                if roles.changed().await.is_err() {
                    return;
                }
            }
        });
        LeaderWorkHandle {
            task,
            active: active_rx,
        }
    }
}

/// Starts the work of lease `epoch`, fenced by it; `None` if the lease ran
/// out already (the role turns follower next).
fn start(
    svc: &Arc<MetaService>,
    elector: &Elector,
    epoch: u64,
    every: LeaderWorkIntervals,
) -> Option<Running> {
    let fence = elector.fence().filter(|f| f.epoch() == epoch)?;
    tracing::info!(epoch, "leader: reclaimer and health checks started");
    Some(Running {
        epoch,
        _reclaimer: svc.spawn_reclaimer(every.reclaim, Some(fence.clone())),
        _health: svc.spawn_health_checker(every.health, Some(fence.clone())),
        _reaper: svc
            .shares_ledger()
            .then(|| svc.spawn_reaper(Some(fence.clone()))),
        // With a shared ledger every writing location belongs to a session
        // the reaper closes; sweeping by age could pull one from under a
        // finish that is still being retried.
        _sweeper: svc
            .config
            .orphan_write_age
            .filter(|_| !svc.shares_ledger())
            .map(|age| spawn_sweeper(svc, age, fence)),
    })
}

/// Sweeps orphaned writes every `age` (the first sweep after one `age`:
/// a new leader's start-up recovery has just swept).
fn spawn_sweeper(svc: &Arc<MetaService>, age: Duration, fence: Fence) -> AbortOnDrop {
    let svc = Arc::downgrade(svc);
    AbortOnDrop(tokio::spawn(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + age, age);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if fence.check().is_err() {
                return;
            }
            let Some(svc) = svc.upgrade() else { return };
            let f = fence.clone();
            match tokio::task::spawn_blocking(move || svc.sweep_orphaned_writes(Some(&f))).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "sweeping orphaned writes"),
                Err(e) => tracing::warn!(error = %e, "the orphaned-write sweep stopped"),
            }
        }
    }))
}
