//! Storages changed at runtime: the storage roots that confine the
//! `file://` storages of the admin API, and keeping the attached backends
//! in step with the catalog when a configured [`BackendOpener`] manages
//! them (add, update, remove, snapshot load, catalog refresh, start).
//!
//! [`BackendOpener`]: crate::backend::BackendOpener

use std::sync::Arc;

use super::MetaService;
use super::backends::LockedBackends;
use super::catalog::{Change, Maps};
use crate::backend::StorageBackend;
use crate::error::{MetaError, Result};
use crate::model::{Storage, StorageHealth, StorageKind};
use crate::path_safe::{UnsafePath, check_absolute_dir, confine_to_roots, file_uri_dir};

/// Backends opened ahead of a catalog change, installed once it applied,
/// and the storages whose backend could not be opened: those are
/// registered all the same (as Tair KVCM registers a storage it cannot
/// reach), unhealthy, so no write goes there until a retry opens the
/// backend and its probe passes ([`MetaService::check_backends`]).
#[derive(Default)]
pub(super) struct Opened {
    attached: Vec<(Storage, Arc<dyn StorageBackend>)>,
    failed: Vec<String>,
}

impl Opened {
    /// Whether the backend of the storage `name` could not be opened.
    pub(super) fn unopened(&self, name: &str) -> bool {
        self.failed.iter().any(|n| n == name)
    }

    /// `s` as it is to be registered: unhealthy when its backend could not
    /// be opened, as it was otherwise.
    pub(super) fn registered(&self, mut s: Storage) -> Storage {
        if self.unopened(&s.name) {
            s.health = StorageHealth::Unhealthy;
        }
        s
    }
}

impl MetaService {
    /// Refuses a storage whose `file://` directory is not absolute and
    /// normal, or (with `MetaConfig::storage_roots`) lies outside every
    /// root once symlinks are resolved. Creates nothing.
    pub(super) fn check_storage_dir(&self, s: &Storage) -> Result<()> {
        let refuse = |e: UnsafePath| {
            MetaError::InvalidArgument(format!("storage {:?} ({}): {e}", s.name, s.uri))
        };
        let dir = match file_uri_dir(&s.uri) {
            Some(dir) => dir,
            None if s.kind == StorageKind::FilePool && self.config.storage_roots.is_some() => {
                return Err(MetaError::InvalidArgument(format!(
                    "storage {:?}: a file pool needs a file:///absolute/dir URI, not {:?}",
                    s.name, s.uri
                )));
            }
            None => return Ok(()),
        };
        check_absolute_dir(&dir).map_err(refuse)?;
        if let Some(roots) = &self.config.storage_roots {
            confine_to_roots(&dir, roots).map_err(refuse)?;
        }
        Ok(())
    }

    /// Whether a [`crate::backend::BackendOpener`] manages the backends.
    pub(super) fn opens_backends(&self) -> bool {
        self.config.backend_opener.is_some()
    }

    /// Opens `s`'s backend with the configured opener; `None` without one,
    /// and for the kinds kvtier has no backend for.
    fn open_configured(&self, s: &Storage) -> Result<Option<Arc<dyn StorageBackend>>> {
        let Some(opener) = &self.config.backend_opener else {
            return Ok(None);
        };
        if !s.kind.has_backend() {
            return Ok(None);
        }
        opener.open(self, s).map(Some).map_err(|e| {
            MetaError::InvalidArgument(format!(
                "storage {:?} ({}): its backend cannot be opened: {e}",
                s.name, s.uri
            ))
        })
    }

    /// Opens the backends of those `storages` that are new or whose kind or
    /// URI differ from `current`'s. One that cannot be opened now is
    /// logged and listed in [`Opened`], never refused: the directory rules
    /// ([`MetaService::check_storage_dir`]) are what refuses a storage.
    pub(super) fn open_changed(&self, current: &Maps, storages: &[Storage]) -> Opened {
        let mut opened = Opened::default();
        for s in storages {
            let same = current
                .storages
                .get(&s.name)
                .is_some_and(|c| c.kind == s.kind && c.uri == s.uri);
            if same {
                continue;
            }
            match self.open_configured(s) {
                Ok(Some(b)) => opened.attached.push((s.clone(), b)),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(
                        storage = s.name,
                        error = %e,
                        "storage backend cannot be opened now; registered unhealthy, retried by the health checker"
                    );
                    opened.failed.push(s.name.clone());
                }
            }
        }
        opened
    }

    /// Applies a catalog change with the backend map locked, then installs
    /// `opened`, detaches the backend a storage whose new one could not be
    /// opened had before (it was opened for another kind or URI, and its
    /// probe must not mark the storage healthy) and, when an opener
    /// manages backends, those of storages the catalog no longer has.
    /// Writers never see a new storage without its backend.
    pub(super) fn apply_with_backends<R>(
        &self,
        opened: Opened,
        plan: impl FnOnce(&Maps) -> Result<(Vec<Change>, R)>,
    ) -> Result<R> {
        let mut locked = self.backends.lock();
        let out = self.catalog.apply(self.index.as_ref(), plan)?;
        for (s, b) in opened.attached {
            locked.install(&s, b);
        }
        for name in &opened.failed {
            locked.detach(name);
        }
        if self.opens_backends() {
            self.detach_removed(&mut locked);
        }
        Ok(out)
    }

    fn detach_removed(&self, locked: &mut LockedBackends<'_>) {
        let maps = self.catalog.snapshot();
        for name in locked.opened_names() {
            if !maps.storages.contains_key(&name) {
                tracing::info!(storage = name, "storage removed; backend detached");
                locked.detach(&name);
            }
        }
    }

    /// Opens and attaches, with the configured opener, the backend of every
    /// storage that has none for its current kind and URI, and detaches
    /// those of removed storages. Returns the storages whose backend could
    /// not be opened, with why. Does nothing without an opener.
    pub fn sync_backends(&self) -> Vec<(String, String)> {
        if !self.opens_backends() {
            return Vec::new();
        }
        let mut failed = Vec::new();
        for s in self.list_storages() {
            if self.backends.lock().is_current(&s) {
                continue;
            }
            // Opened outside the lock: a file pool restore scans the index.
            match self.open_configured(&s) {
                Ok(Some(b)) => self.install_if_unchanged(&s, b),
                Ok(None) => {}
                Err(e) => failed.push((s.name.clone(), e.to_string())),
            }
        }
        self.detach_removed(&mut self.backends.lock());
        failed
    }

    /// Installs `backend` for `s` unless the storage changed or went away
    /// while it was being opened (the next sync opens the new one).
    fn install_if_unchanged(&self, s: &Storage, backend: Arc<dyn StorageBackend>) {
        let mut locked = self.backends.lock();
        let now = self.catalog.storage(&s.name);
        if now.is_ok_and(|n| n.kind == s.kind && n.uri == s.uri) {
            locked.install(s, backend);
        }
    }

    /// Retries, before a round of health probes, the backends that could
    /// not be opened (they were registered unhealthy): one that opens now
    /// is attached, and the round's probe decides its health. Those still
    /// failing are kept unhealthy, and returned.
    pub(super) fn retry_unopened_backends(&self) -> Vec<String> {
        let failed = self.sync_backends();
        for (name, why) in &failed {
            tracing::debug!(
                storage = name,
                error = why,
                "storage backend still cannot be opened"
            );
            self.set_storage_health(name, StorageHealth::Unhealthy);
        }
        failed.into_iter().map(|(name, _)| name).collect()
    }

    /// The start of a server: [`MetaService::sync_backends`], and every
    /// storage whose backend cannot be opened is marked unhealthy, so it
    /// takes no writes under plain URIs (an update or a restart retries).
    /// Returns those storages and why, for the log.
    pub fn attach_configured_backends(&self) -> Vec<(String, String)> {
        let failed = self.sync_backends();
        for (name, why) in &failed {
            tracing::warn!(
                storage = name,
                error = why,
                "storage backend unavailable; marked unhealthy"
            );
            self.set_storage_health(name, StorageHealth::Unhealthy);
        }
        failed
    }
}
