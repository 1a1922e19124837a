//! Data storage backends attached to storages: where granted parts are
//! placed ([`StorageBackend::create`]), freeing the space of removed
//! locations ([`StorageBackend::delete`], in the background) and periodic
//! health probes that flip [`Storage::health`].
//!
//! A storage without a backend keeps the plain URI scheme and no space
//! management, so the service works with none attached.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::RwLock;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::MetaService;
use super::catalog::Change;
use crate::backend::{BackendError, CreateRequest, StorageBackend};
use crate::error::{MetaError, Result};
use crate::index::Fence;
use crate::model::{BlockKey, CacheLocation, LocationStatus, Storage, StorageHealth, StorageKind};

/// URIs per `delete` call.
const DELETE_BATCH: usize = 256;
/// Attempts per URI before a delete is given up (and counted).
const DELETE_ATTEMPTS: u32 = 4;
/// Wait before the first retry; doubles each time.
const DELETE_BACKOFF: Duration = Duration::from_millis(50);

/// Counters of backend work since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackendStats {
    /// `create` calls that failed (the storage was skipped for that write).
    pub create_failures: u64,
    /// Part URIs whose space was freed.
    pub deleted: u64,
    /// Delete attempts that failed and were retried.
    pub delete_retries: u64,
    /// Part URIs given up after every attempt failed (space leaked until an
    /// operator or a sweep frees it).
    pub delete_failures: u64,
    /// Health probes run.
    pub health_checks: u64,
    /// Health probes that failed or timed out.
    pub health_failures: u64,
    /// Serving locations not handed out because their storage is unhealthy
    /// (each reported as a miss).
    pub unhealthy_skips: u64,
}

#[derive(Debug, Default)]
struct Counters {
    create_failures: AtomicU64,
    deleted: AtomicU64,
    delete_retries: AtomicU64,
    delete_failures: AtomicU64,
    health_checks: AtomicU64,
    health_failures: AtomicU64,
    unhealthy_skips: AtomicU64,
}

/// State shared with background delete tasks.
#[derive(Debug, Default)]
struct Shared {
    counters: Counters,
    /// Release tasks still running.
    pending: AtomicUsize,
    /// Signalled whenever `pending` drops to 0.
    idle: Notify,
}

/// The attached backends, by storage name.
#[derive(Debug, Default)]
pub(crate) struct Backends {
    map: RwLock<HashMap<String, Arc<dyn StorageBackend>>>,
    /// Kind and URI each backend the configured opener attached was opened
    /// for, so a changed storage is reopened (see `storage_admin`).
    opened_for: parking_lot::Mutex<HashMap<String, (StorageKind, String)>>,
    shared: Arc<Shared>,
}

/// The backend map locked for a catalog change, so no write sees the
/// catalog and the backends out of step.
pub(super) struct LockedBackends<'a> {
    map: parking_lot::RwLockWriteGuard<'a, HashMap<String, Arc<dyn StorageBackend>>>,
    opened_for: parking_lot::MutexGuard<'a, HashMap<String, (StorageKind, String)>>,
}

impl LockedBackends<'_> {
    /// Attaches `backend`, opened for `storage`, replacing any other.
    pub(super) fn install(&mut self, storage: &Storage, backend: Arc<dyn StorageBackend>) {
        self.map.insert(storage.name.clone(), backend);
        self.opened_for
            .insert(storage.name.clone(), (storage.kind, storage.uri.clone()));
    }

    /// Detaches the backend of `name`, if any, and returns it.
    pub(super) fn detach(&mut self, name: &str) -> Option<Arc<dyn StorageBackend>> {
        self.opened_for.remove(name);
        self.map.remove(name)
    }

    /// Whether `storage` has a backend the opener opened for its current
    /// kind and URI.
    pub(super) fn is_current(&self, storage: &Storage) -> bool {
        self.map.contains_key(&storage.name)
            && self
                .opened_for
                .get(&storage.name)
                .is_some_and(|(k, u)| *k == storage.kind && *u == storage.uri)
    }

    /// Names of the storages with a backend the opener attached.
    pub(super) fn opened_names(&self) -> Vec<String> {
        self.opened_for.keys().cloned().collect()
    }
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Stops the health checker when dropped.
#[derive(Debug)]
pub struct HealthCheckerHandle(JoinHandle<()>);

impl Drop for HealthCheckerHandle {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Backends {
    fn get(&self, storage: &str) -> Option<Arc<dyn StorageBackend>> {
        self.map.read().get(storage).cloned()
    }

    /// Locks the map for a change (map first, then `opened_for`).
    pub(super) fn lock(&self) -> LockedBackends<'_> {
        LockedBackends {
            map: self.map.write(),
            opened_for: self.opened_for.lock(),
        }
    }
}

/// Frees `uris` on `backend` in batches, retrying failures with backoff.
async fn delete_all(
    backend: Arc<dyn StorageBackend>,
    storage: String,
    uris: Vec<String>,
    shared: &Shared,
) {
    let c = &shared.counters;
    for batch in uris.chunks(DELETE_BATCH) {
        let mut left: Vec<String> = batch.to_vec();
        let mut backoff = DELETE_BACKOFF;
        for attempt in 1..=DELETE_ATTEMPTS {
            let results = backend.delete(&left).await;
            let mut failed = Vec::new();
            let mut last_err = None;
            for (uri, r) in left.into_iter().zip(results) {
                match r {
                    Ok(()) => add(&c.deleted, 1),
                    // A malformed URI will not get better by retrying.
                    Err(e @ BackendError::BadUri { .. }) => {
                        tracing::warn!(storage, uri, error = %e, "cannot free location");
                        add(&c.delete_failures, 1);
                    }
                    Err(e) => {
                        last_err = Some(e);
                        failed.push(uri);
                    }
                }
            }
            left = failed;
            if left.is_empty() {
                break;
            }
            if attempt == DELETE_ATTEMPTS {
                tracing::warn!(storage, uris = left.len(), error = ?last_err, "freeing locations failed; giving up");
                add(&c.delete_failures, left.len() as u64);
                break;
            }
            add(&c.delete_retries, left.len() as u64);
            tokio::time::sleep(backoff).await;
            backoff *= 2;
        }
    }
}

impl MetaService {
    /// Attaches `backend` to the storage `storage`: its new write grants get
    /// their URIs from the backend, removed locations are freed through it,
    /// and [`MetaService::check_backends`] probes it. Replaces a backend
    /// attached before. Restore a backend's allocation state (see
    /// [`MetaService::live_uris`]) before attaching it.
    pub fn attach_backend(&self, storage: &str, backend: Arc<dyn StorageBackend>) -> Result<()> {
        let record = self.catalog.storage(storage)?;
        self.backends.lock().install(&record, backend);
        Ok(())
    }

    /// Detaches the backend of `storage`; new grants there get plain URIs
    /// and removals there free nothing.
    pub fn detach_backend(&self, storage: &str) -> Option<Arc<dyn StorageBackend>> {
        self.backends.lock().detach(storage)
    }

    /// The backend attached to `storage`, if any.
    pub fn backend(&self, storage: &str) -> Option<Arc<dyn StorageBackend>> {
        self.backends.get(storage)
    }

    /// Every part URI of a writing or serving location on `storage`, over
    /// all instances: what a backend that keeps its allocation map in
    /// memory (the file pool) restores at startup. Scans every block.
    pub fn live_uris(&self, storage: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        self.for_each_page(|inst, keys| {
            for m in self.index.get(&inst.id, keys)?.into_iter().flatten() {
                for l in m.locations.iter().filter(|l| {
                    l.storage == storage
                        && matches!(l.status, LocationStatus::Writing | LocationStatus::Serving)
                }) {
                    out.extend(l.specs.iter().map(|s| s.uri.clone()));
                }
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// Counters of backend work.
    pub fn backend_stats(&self) -> BackendStats {
        let c = &self.backends.shared.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BackendStats {
            create_failures: g(&c.create_failures),
            deleted: g(&c.deleted),
            delete_retries: g(&c.delete_retries),
            delete_failures: g(&c.delete_failures),
            health_checks: g(&c.health_checks),
            health_failures: g(&c.health_failures),
            unhealthy_skips: g(&c.unhealthy_skips),
        }
    }

    /// Waits until every background release queued so far has finished
    /// (freed, or given up after its retries).
    pub async fn wait_released(&self) {
        let shared = &self.backends.shared;
        loop {
            let idle = shared.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if shared.pending.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Fills the URIs of `planned` (one location per key, all on `storage`)
    /// from the storage's backend, if one is attached. All or nothing: on
    /// error the backend holds nothing for them.
    pub(super) async fn place_parts(
        &self,
        storage: &Storage,
        instance: &str,
        planned: &mut HashMap<BlockKey, CacheLocation>,
    ) -> std::result::Result<(), BackendError> {
        let Some(backend) = self.backends.get(&storage.name) else {
            return Ok(());
        };
        let order: Vec<BlockKey> = planned.keys().copied().collect();
        let mut requests = Vec::new();
        for key in &order {
            let Some(loc) = planned.get(key) else {
                continue;
            };
            for s in &loc.specs {
                requests.push(CreateRequest {
                    instance: instance.to_owned(),
                    key: *key,
                    location: loc.id,
                    spec: s.name.clone(),
                    size: s.size,
                });
            }
        }
        let uris = backend.create(&requests).await.inspect_err(|_| {
            add(&self.backends.shared.counters.create_failures, 1);
        })?;
        if uris.len() != requests.len() {
            let got = uris.len();
            // A broken backend: give back what it did allocate.
            self.release_uris(&storage.name, uris);
            add(&self.backends.shared.counters.create_failures, 1);
            return Err(BackendError::Unavailable(format!(
                "backend of {:?} returned {got} URIs for {} parts",
                storage.name,
                requests.len()
            )));
        }
        let mut uris = uris.into_iter();
        for key in &order {
            let Some(loc) = planned.get_mut(key) else {
                continue;
            };
            for s in &mut loc.specs {
                if let Some(u) = uris.next() {
                    s.uri = u;
                }
            }
        }
        Ok(())
    }

    /// Frees the space of removed locations through their storages'
    /// backends, in the background, in batches, with retries. Call after
    /// the index no longer lists them. Locations on storages without a
    /// backend are ignored.
    pub(crate) fn release_locations(&self, locs: Vec<CacheLocation>) {
        let mut by_storage: HashMap<String, Vec<String>> = HashMap::new();
        for l in locs {
            by_storage
                .entry(l.storage)
                .or_default()
                .extend(l.specs.into_iter().map(|s| s.uri));
        }
        for (storage, uris) in by_storage {
            self.release_uris(&storage, uris);
        }
    }

    fn release_uris(&self, storage: &str, uris: Vec<String>) {
        if uris.is_empty() {
            return;
        }
        let Some(backend) = self.backends.get(storage) else {
            return;
        };
        let shared = self.backends.shared.clone();
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                storage,
                uris = uris.len(),
                "no runtime to free locations on"
            );
            add(&shared.counters.delete_failures, uris.len() as u64);
            return;
        };
        shared.pending.fetch_add(1, Ordering::AcqRel);
        let storage = storage.to_owned();
        rt.spawn(async move {
            delete_all(backend, storage, uris, &shared).await;
            if shared.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
                shared.idle.notify_waiters();
            }
        });
    }

    /// Drops (to misses) the found locations whose storage is unhealthy,
    /// and counts them. A full storage's locations are kept: its data is
    /// intact, it only takes no new writes.
    pub(super) fn hide_unhealthy<L: std::ops::Deref<Target = CacheLocation>>(
        &self,
        found: &mut [Option<L>],
    ) {
        let mut memo: Vec<(String, bool)> = Vec::new();
        let mut hidden = 0u64;
        for slot in found.iter_mut() {
            let Some(loc) = slot else { continue };
            let healthy = match memo.iter().find(|(n, _)| *n == loc.storage) {
                Some(&(_, h)) => h,
                None => {
                    // An unregistered storage keeps serving what it has.
                    let h = self
                        .catalog
                        .storage(&loc.storage)
                        .map_or(true, |s| s.health.serves_reads());
                    memo.push((loc.storage.clone(), h));
                    h
                }
            };
            if !healthy {
                *slot = None;
                hidden += 1;
            }
        }
        if hidden > 0 {
            add(&self.backends.shared.counters.unhealthy_skips, hidden);
        }
    }

    /// Probes every attached backend once (in parallel, each bounded by
    /// `timeout`) and sets each storage's health to the result. Returns
    /// the names of the storages found unhealthy. With a backend opener,
    /// first retries opening the backends that could not be opened: their
    /// storages stay unhealthy (and are returned) until one opens and its
    /// probe passes.
    pub async fn check_backends(&self, timeout: Duration) -> Vec<String> {
        let mut unhealthy = self.retry_unopened_backends();
        let backends: Vec<(String, Arc<dyn StorageBackend>)> = self
            .backends
            .map
            .read()
            .iter()
            .map(|(n, b)| (n.clone(), b.clone()))
            .collect();
        let mut probes = tokio::task::JoinSet::new();
        for (name, b) in backends {
            probes.spawn(async move {
                let r = match tokio::time::timeout(timeout, b.health()).await {
                    Ok(r) => r,
                    Err(_) => Err(BackendError::Unavailable(format!(
                        "health probe timed out after {timeout:?}"
                    ))),
                };
                (name, r)
            });
        }
        let c = &self.backends.shared.counters;
        while let Some(done) = probes.join_next().await {
            let Ok((name, r)) = done else { continue };
            add(&c.health_checks, 1);
            let health = probe_health(&name, r);
            if health == StorageHealth::Unhealthy {
                add(&c.health_failures, 1);
                unhealthy.push(name.clone());
            }
            self.set_storage_health(&name, health);
        }
        unhealthy.sort();
        unhealthy
    }

    /// Records a probe result: in the index when it takes writes, else in
    /// memory only (see [`super::catalog::Catalog::set_health_unpersisted`]).
    pub(super) fn set_storage_health(&self, name: &str, health: StorageHealth) {
        let result = self.catalog.apply(self.index.as_ref(), |maps| {
            let Some(s) = maps.storages.get(name) else {
                return Err(MetaError::StorageNotFound(name.to_owned()));
            };
            if s.health == health {
                return Ok((Vec::new(), ()));
            }
            tracing::info!(storage = name, ?health, "storage health changed");
            let mut s = s.clone();
            s.health = health;
            Ok((vec![Change::PutStorage(s)], ()))
        });
        match result {
            Ok(()) => {}
            Err(MetaError::StoreUnwritable(why)) => {
                tracing::debug!(
                    storage = name,
                    ?health,
                    why,
                    "storage health kept in memory only"
                );
                self.catalog.set_health_unpersisted(name, health);
            }
            Err(e) => {
                tracing::warn!(storage = name, error = %e, "recording storage health failed");
            }
        }
    }

    /// Starts probing every attached backend every `interval` (each probe
    /// bounded by `interval`); stops when the handle is dropped, or before
    /// a round once `fence` (the leader's) no longer holds, so a frontend
    /// that stopped leading records no more health.
    pub fn spawn_health_checker(
        self: &Arc<Self>,
        interval: Duration,
        fence: Option<Fence>,
    ) -> HealthCheckerHandle {
        let svc = Arc::downgrade(self);
        HealthCheckerHandle(tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if fence.as_ref().is_some_and(|f| f.check().is_err()) {
                    return;
                }
                let Some(svc) = svc.upgrade() else { return };
                svc.check_backends(interval).await;
            }
        }))
    }
}

/// The health a probe result means: `Full` when the backend has no room
/// for new data (its data is intact and still served), `Unhealthy` for
/// any other failure.
fn probe_health(name: &str, result: std::result::Result<(), BackendError>) -> StorageHealth {
    match result {
        Ok(()) => StorageHealth::Healthy,
        Err(e @ BackendError::Full { .. }) => {
            tracing::warn!(storage = name, error = %e, "storage full: no new writes placed there; its data is still served");
            StorageHealth::Full
        }
        Err(e) => {
            tracing::warn!(storage = name, error = %e, "storage health probe failed");
            StorageHealth::Unhealthy
        }
    }
}
