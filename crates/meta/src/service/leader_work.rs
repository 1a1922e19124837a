//! Background work that one frontend runs for all of them: the watermark
//! reclaimer and the storage health checker (docs/server.md §9). Frontends
//! that share one index elect a leader ([`crate::leader::Elector`]); the
//! supervisor here follows the elector's role changes, starting the work
//! when this frontend becomes leader and stopping it when it no longer is.
//!
//! Work that stays on every frontend: the write-session reaper (sessions
//! live in the memory of the frontend that opened them) and the catalog
//! refresher (each frontend keeps its own copy).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{HealthCheckerHandle, MetaService, ReclaimerHandle};
use crate::leader::Role;

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

/// The running leader-only tasks; dropping it stops them.
struct Running {
    _reclaimer: ReclaimerHandle,
    _health: HealthCheckerHandle,
}

impl MetaService {
    /// Runs the leader-only work while `roles` says this frontend leads.
    /// It stops when the handle is dropped, the elector goes away, or the
    /// service is dropped.
    pub fn spawn_leader_work(
        self: &Arc<Self>,
        mut roles: watch::Receiver<Role>,
        every: LeaderWorkIntervals,
    ) -> LeaderWorkHandle {
        let svc = Arc::downgrade(self);
        let (active, active_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut running: Option<Running> = None;
            loop {
                // Copied out: the read guard must not live across an await.
                let role = *roles.borrow_and_update();
                match (role, running.is_some()) {
                    (Role::Leader { epoch }, false) => {
                        let Some(svc) = svc.upgrade() else { return };
                        running = Some(Running {
                            _reclaimer: svc.spawn_reclaimer(every.reclaim),
                            _health: svc.spawn_health_checker(every.health),
                        });
                        tracing::info!(epoch, "leader: reclaimer and health checks started");
                    }
                    (Role::Follower, true) => {
                        running = None;
                        tracing::info!("no longer leader: reclaimer and health checks stopped");
                    }
                    _ => {}
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
