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

/// Backends opened ahead of a catalog change, installed once it applied.
pub(super) type Opened = Vec<(Storage, Arc<dyn StorageBackend>)>;

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

    /// Opens `s`'s backend with the configured opener; `None` without one.
    fn open_configured(&self, s: &Storage) -> Result<Option<Arc<dyn StorageBackend>>> {
        let Some(opener) = &self.config.backend_opener else {
            return Ok(None);
        };
        opener.open(self, s).map(Some).map_err(|e| {
            MetaError::InvalidArgument(format!(
                "storage {:?} ({}): its backend cannot be opened: {e}",
                s.name, s.uri
            ))
        })
    }

    /// Opens the backends of those `storages` that are new or whose kind or
    /// URI differ from `current`'s. The first failure refuses them all.
    pub(super) fn open_changed(&self, current: &Maps, storages: &[Storage]) -> Result<Opened> {
        let mut opened = Vec::new();
        for s in storages {
            let same = current
                .storages
                .get(&s.name)
                .is_some_and(|c| c.kind == s.kind && c.uri == s.uri);
            if same {
                continue;
            }
            if let Some(b) = self.open_configured(s)? {
                opened.push((s.clone(), b));
            }
        }
        Ok(opened)
    }

    /// Applies a catalog change with the backend map locked, then installs
    /// `opened` and, when an opener manages backends, detaches the
    /// backends of storages the catalog no longer has. Writers never see a
    /// new storage without its backend.
    pub(super) fn apply_with_backends<R>(
        &self,
        opened: Opened,
        plan: impl FnOnce(&Maps) -> Result<(Vec<Change>, R)>,
    ) -> Result<R> {
        let mut locked = self.backends.lock();
        let out = self.catalog.apply(self.index.as_ref(), plan)?;
        for (s, b) in opened {
            locked.install(&s, b);
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
