//! Keeping the cached catalog current when several frontends share one
//! index (Redis/Valkey): another frontend's registrations are found on
//! first use ([`super::catalog::Catalog::instance_or_load`]); its other
//! changes (groups, storages, accounts, removals) arrive with a periodic
//! refresh.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::MetaService;
use crate::error::Result;

/// Stops the catalog refresher when dropped.
#[derive(Debug)]
pub struct CatalogRefresherHandle(JoinHandle<()>);

impl Drop for CatalogRefresherHandle {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl MetaService {
    /// Re-reads storages, groups, instances and accounts from the index;
    /// with a backend opener, storages another frontend added or changed
    /// get their backends and removed ones lose theirs
    /// ([`MetaService::sync_backends`]; failures are logged and retried at
    /// the next refresh).
    pub fn refresh_catalog(&self) -> Result<()> {
        self.catalog.refresh(self.index.as_ref())?;
        for (name, why) in self.sync_backends() {
            tracing::warn!(storage = name, error = why, "storage backend unavailable");
        }
        Ok(())
    }

    /// Refreshes the catalog every `interval` in the background (for
    /// frontends sharing an index); a failed refresh is logged and retried
    /// at the next tick.
    pub fn spawn_catalog_refresher(self: &Arc<Self>, interval: Duration) -> CatalogRefresherHandle {
        let svc = Arc::downgrade(self);
        let period = interval.max(Duration::from_millis(10));
        CatalogRefresherHandle(tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(svc) = svc.upgrade() else { return };
                // On the blocking pool: the index read blocks, and a stalled
                // index (a Redis that never answers) must not hold one of
                // the runtime's workers, which serve everything else.
                match tokio::task::spawn_blocking(move || svc.refresh_catalog()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!("catalog refresh failed: {e}"),
                    Err(e) => tracing::warn!("catalog refresh lost: {e}"),
                }
            }
        }))
    }
}
