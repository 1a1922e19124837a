//! Write sessions of the two-phase write: which locations a
//! `start_write_cache` created, until finish or timeout.
//!
//! Sessions live in memory only: a restart loses them, and the startup
//! sweep removes every writing location instead.

use std::collections::HashMap;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::model::{BlockKey, LocationId, StorageKind};

/// Id of one write session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// One created writing location.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub key: BlockKey,
    pub location: LocationId,
}

/// What a session holds. Its quota charge is `targets.len() * block_bytes`
/// on `kind`, owned by the session until each target turns serving.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    pub instance: String,
    pub group: String,
    pub kind: StorageKind,
    pub block_bytes: u64,
    pub deadline: Instant,
    pub targets: Vec<Target>,
}

/// The registry.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    map: Mutex<HashMap<SessionId, Session>>,
}

impl Sessions {
    pub(crate) fn insert(&self, id: SessionId, s: Session) {
        self.map.lock().insert(id, s);
    }

    /// Removes the session if `check` accepts it.
    pub(crate) fn take_if<E>(
        &self,
        id: SessionId,
        check: impl FnOnce(&Session) -> Result<(), E>,
        missing: E,
    ) -> Result<Session, E> {
        match self.map.lock().entry(id) {
            std::collections::hash_map::Entry::Vacant(_) => Err(missing),
            std::collections::hash_map::Entry::Occupied(o) => {
                check(o.get())?;
                Ok(o.remove())
            }
        }
    }

    /// Removes and returns every session whose deadline is at or before `now`.
    pub(crate) fn take_expired(&self, now: Instant) -> Vec<(SessionId, Session)> {
        let mut map = self.map.lock();
        let ids: Vec<SessionId> = map
            .iter()
            .filter(|(_, s)| s.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        ids.into_iter()
            .filter_map(|id| map.remove(&id).map(|s| (id, s)))
            .collect()
    }

    /// Removes and returns every session of `instance` (the instance is
    /// being removed).
    pub(crate) fn take_instance(&self, instance: &str) -> Vec<(SessionId, Session)> {
        let mut map = self.map.lock();
        let ids: Vec<SessionId> = map
            .iter()
            .filter(|(_, s)| s.instance == instance)
            .map(|(id, _)| *id)
            .collect();
        ids.into_iter()
            .filter_map(|id| map.remove(&id).map(|s| (id, s)))
            .collect()
    }

    /// Open sessions that hold locations. Empty sessions (of grants that
    /// granted nothing, kept only so their finish can be checked) are not
    /// counted: clients often never finish them, and they hold nothing.
    pub(crate) fn len(&self) -> usize {
        self.map
            .lock()
            .values()
            .filter(|s| !s.targets.is_empty())
            .count()
    }
}
