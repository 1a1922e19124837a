//! The two-phase write: grants (`start_write_cache`), completion
//! (`finish_write_cache`) and the reclaiming of timed-out sessions.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::Instant;

use super::session::{Session, Target};
use super::{FinishSummary, MetaService, ReaperHandle, SessionId, WriteGrant, WriteTarget, now_ms};
use crate::error::{MetaError, Result};
use crate::index::Modify;
use crate::model::{
    BlockKey, BlockMeta, CacheLocation, Instance, LocationId, LocationSpec, LocationStatus,
    Storage, StorageKind,
};
use crate::path_safe::part_path;

impl MetaService {
    /// Phase one of a write: grants the keys that are neither serving nor
    /// being written, each a new writing location on one storage chosen from
    /// the group's candidates, under a new session.
    ///
    /// Refused with [`MetaError::QuotaExceeded`] (or
    /// [`MetaError::NoAvailableStorage`]) if the writable keys do not fit;
    /// then nothing changes. An empty grant opens an empty session, so its
    /// finish is checked like any other; so does an empty key list (Tair
    /// KVCM's answer to token ids that make no full block).
    pub async fn start_write_cache(&self, instance: &str, keys: &[BlockKey]) -> Result<WriteGrant> {
        if !keys.is_empty() {
            self.check_keys(keys)?;
        }
        let inst = self
            .catalog
            .instance_or_load(self.index.as_ref(), instance)?;
        let group = self.catalog.group(&inst.group)?;
        let session = SessionId(self.next_id());

        let current = self.index.get(instance, keys)?;
        let mut seen = std::collections::HashSet::new();
        let candidates: Vec<BlockKey> = keys
            .iter()
            .zip(&current)
            .filter(|(k, cur)| !cur.as_ref().is_some_and(BlockMeta::is_live) && seen.insert(**k))
            .map(|(k, _)| *k)
            .collect();
        let block_bytes = inst.block_bytes();
        if candidates.is_empty() {
            // An empty session still exists until it is finished or times
            // out, so finishing an id that was never issued is an error.
            // It charges nothing, so its kind is never used.
            let empty = self.new_session(&inst, &group.name, StorageKind::FilePool, 0, Vec::new());
            self.sessions.insert(session, empty);
            return Ok(WriteGrant {
                session,
                blocks: Vec::new(),
                skipped: keys.to_vec(),
            });
        }
        self.check_key_capacity(&inst, &group, candidates.len())?;
        let mut storages = self.catalog.candidates(&group);
        let reserved = block_bytes.saturating_mul(candidates.len() as u64);
        // Place the parts before touching the index; a storage whose
        // backend cannot place them is skipped (its charge returned), and
        // what it said is kept for the refusal if no storage is left.
        let mut refusals = Vec::new();
        let (storage, mut planned) = loop {
            let storage = self
                .quotas
                .reserve(&group, &storages, reserved)
                .map_err(|e| with_refusals(e, &refusals))?
                .clone();
            let planned: Result<HashMap<BlockKey, CacheLocation>> = candidates
                .iter()
                .map(|&k| Ok((k, self.new_location(&inst, &storage, k)?)))
                .collect();
            let mut planned = planned.inspect_err(|_| {
                self.quotas.release(&group.name, storage.kind, reserved);
            })?;
            match self.place_parts(&storage, instance, &mut planned).await {
                Ok(()) => break (storage, planned),
                Err(e) => {
                    tracing::warn!(storage = storage.name, error = %e, "storage backend refused a write; skipping it");
                    self.quotas.release(&group.name, storage.kind, reserved);
                    storages.retain(|s| s.name != storage.name);
                    refusals.push(format!("storage {:?} refused the write: {e}", storage.name));
                }
            }
        };

        let now = now_ms();
        // A block's depth is its (first) position in this request: its
        // distance from the root of the prefix chain the request carries.
        let mut depths: HashMap<BlockKey, u32> = HashMap::with_capacity(keys.len());
        for (i, k) in keys.iter().enumerate() {
            depths
                .entry(*k)
                .or_insert(u32::try_from(i).unwrap_or(u32::MAX));
        }
        let mut granted: HashMap<BlockKey, CacheLocation> = HashMap::new();
        let result = self.index.modify(instance, &candidates, &mut |key, cur| {
            if cur.as_ref().is_some_and(BlockMeta::is_live) {
                return Modify::Keep;
            }
            let Some(loc) = planned.get(&key).cloned() else {
                return Modify::Keep;
            };
            let depth = depths.get(&key).copied().unwrap_or(0);
            let mut m = cur.unwrap_or(BlockMeta {
                key,
                locations: Vec::new(),
                last_access_ms: now,
                access_count: 0,
                depth,
            });
            m.locations.retain(|l| l.status != LocationStatus::Deleting);
            m.locations.push(loc.clone());
            m.last_access_ms = now;
            m.depth = depth;
            granted.insert(key, loc);
            Modify::Put(m)
        });
        // Before acknowledging (also on error: earlier chunks may be applied).
        self.search_cache.invalidate(instance, &candidates);
        let blocks: Vec<WriteTarget> = candidates
            .iter()
            .filter_map(|k| {
                granted
                    .remove(k)
                    .map(|location| WriteTarget { key: *k, location })
            })
            .collect();
        // Give back the charge (and placed space) of keys someone else took
        // meanwhile.
        let unused = reserved - block_bytes * blocks.len() as u64;
        self.quotas.release(&group.name, storage.kind, unused);
        for b in &blocks {
            planned.remove(&b.key);
        }
        self.release_locations(planned.into_values().collect());
        // Registered even on error so the reaper reclaims what was made.
        let targets = blocks
            .iter()
            .map(|b| Target {
                key: b.key,
                location: b.location.id,
            })
            .collect();
        let open = self.new_session(&inst, &group.name, storage.kind, block_bytes, targets);
        self.sessions.insert(session, open);
        result?;
        let granted_keys: std::collections::HashSet<BlockKey> =
            blocks.iter().map(|b| b.key).collect();
        let skipped = keys
            .iter()
            .filter(|k| !granted_keys.contains(k))
            .copied()
            .collect();
        tracing::debug!(instance, session = %session, granted = blocks.len(), "start_write_cache");
        Ok(WriteGrant {
            session,
            blocks,
            skipped,
        })
    }

    /// A session of `inst` holding `targets`, open until the configured
    /// timeout.
    fn new_session(
        &self,
        inst: &Instance,
        group: &str,
        kind: StorageKind,
        block_bytes: u64,
        targets: Vec<Target>,
    ) -> Session {
        Session {
            instance: inst.id.clone(),
            group: group.to_owned(),
            kind,
            block_bytes,
            deadline: Instant::now() + self.config.session_timeout,
            targets,
        }
    }

    /// A writing location for `key` on `storage`, its parts named by the
    /// plain scheme `<base>/<instance>/<key>-<location>/<spec>` (instance
    /// and spec escaped, see [`crate::path_safe`]); a backend renames them.
    fn new_location(
        &self,
        inst: &Instance,
        storage: &Storage,
        key: BlockKey,
    ) -> Result<CacheLocation> {
        let id = LocationId(self.next_id());
        let base = storage.uri.trim_end_matches('/');
        let specs = inst
            .location_specs
            .iter()
            .map(|s| {
                let rel = part_path(&inst.id, key, id, &s.name).map_err(|e| {
                    MetaError::InvalidArgument(format!("instance {:?}: {e}", inst.id))
                })?;
                Ok(LocationSpec {
                    name: s.name.clone(),
                    uri: format!("{base}/{rel}"),
                    size: s.size,
                })
            })
            .collect::<Result<_>>()?;
        Ok(CacheLocation {
            id,
            storage: storage.name.clone(),
            kind: storage.kind,
            status: LocationStatus::Writing,
            specs,
        })
    }

    /// Phase two: `success[i]` reports the write of `grant.blocks[i]`.
    /// Successes become serving; failures are removed and their bytes
    /// released. An unknown or expired session is
    /// [`MetaError::SessionNotFound`].
    pub async fn finish_write_cache(
        &self,
        instance: &str,
        session: SessionId,
        success: &[bool],
    ) -> Result<FinishSummary> {
        let s = self.sessions.take_if(
            session,
            |s| {
                if s.instance != instance {
                    return Err(MetaError::SessionNotFound(session.0));
                }
                if s.targets.len() != success.len() {
                    return Err(MetaError::InvalidArgument(format!(
                        "{} flags for {} blocks",
                        success.len(),
                        s.targets.len()
                    )));
                }
                Ok(())
            },
            MetaError::SessionNotFound(session.0),
        )?;
        match self.close_session(&s, success) {
            // Kept, with a fresh deadline, so the caller can finish it once
            // the index writes again (and the reaper does not drop it).
            Err(e @ MetaError::StoreUnwritable(_)) => {
                let deadline = Instant::now() + self.config.session_timeout;
                self.sessions.insert(session, Session { deadline, ..s });
                Err(e)
            }
            other => other,
        }
    }

    /// Applies a session's outcome and releases the charge of every target
    /// that did not turn serving. Idempotent, so a session whose close the
    /// index refused ([`MetaError::StoreUnwritable`]: nothing released, the
    /// caller keeps the session) can be closed again later: a target an
    /// earlier try already made serving counts as served.
    fn close_session(&self, s: &Session, success: &[bool]) -> Result<FinishSummary> {
        if s.targets.is_empty() {
            return Ok(FinishSummary::default());
        }
        let wanted: HashMap<BlockKey, (LocationId, bool)> = s
            .targets
            .iter()
            .zip(success)
            .map(|(t, &ok)| (t.key, (t.location, ok)))
            .collect();
        let keys: Vec<BlockKey> = s.targets.iter().map(|t| t.key).collect();
        let now = now_ms();
        let mut served = 0usize;
        let mut removed: Vec<CacheLocation> = Vec::new();
        let result = self.index.modify(&s.instance, &keys, &mut |key, cur| {
            let (Some(mut m), Some(&(id, ok))) = (cur, wanted.get(&key)) else {
                return Modify::Keep;
            };
            let Some(pos) = m.locations.iter().position(|l| l.id == id) else {
                return Modify::Keep;
            };
            match (m.locations[pos].status, ok) {
                (LocationStatus::Writing, _) => {}
                (LocationStatus::Serving, true) => {
                    served += 1;
                    return Modify::Keep;
                }
                _ => return Modify::Keep,
            }
            if ok {
                m.locations[pos].status = LocationStatus::Serving;
                m.last_access_ms = now;
                m.access_count = m.access_count.saturating_add(1);
                served += 1;
                Modify::Put(m)
            } else {
                removed.push(m.locations.remove(pos));
                if m.locations.is_empty() {
                    Modify::Delete
                } else {
                    Modify::Put(m)
                }
            }
        });
        self.search_cache.invalidate(&s.instance, &keys);
        if let Err(e @ MetaError::StoreUnwritable(_)) = result {
            // Nothing released: the session is closed again later.
            return Err(e);
        }
        if result.is_ok() {
            self.release_locations(removed);
        }
        let dropped = s.targets.len() - served;
        self.quotas
            .release(&s.group, s.kind, s.block_bytes * dropped as u64);
        result?;
        Ok(FinishSummary { served, dropped })
    }

    /// Fails every session past its deadline; returns how many held
    /// locations.
    pub async fn reap_expired(&self) -> usize {
        let expired = self.sessions.take_expired(Instant::now());
        let n = expired
            .iter()
            .filter(|(_, s)| !s.targets.is_empty())
            .count();
        for (id, s) in expired {
            let fails = vec![false; s.targets.len()];
            match self.close_session(&s, &fails) {
                Ok(_) => {}
                // Retried on a later round, once the index writes again.
                Err(MetaError::StoreUnwritable(_)) => self.sessions.insert(id, s),
                Err(e) => {
                    tracing::warn!(session = %id, error = %e, "reclaiming expired write session failed");
                }
            }
        }
        n
    }

    /// Starts the background reaper (every `reap_interval`); it stops when
    /// the handle is dropped.
    pub fn spawn_reaper(self: &Arc<Self>) -> ReaperHandle {
        let svc = Arc::downgrade(self);
        let period = self.config.reap_interval;
        ReaperHandle(tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(svc) = svc.upgrade() else { return };
                svc.reap_expired().await;
            }
        }))
    }
}

/// `e`, with the backends' refusals added when no storage was left.
fn with_refusals(e: MetaError, refusals: &[String]) -> MetaError {
    match e {
        MetaError::NoAvailableStorage { group, why } if !refusals.is_empty() => {
            MetaError::NoAvailableStorage {
                group,
                why: format!("{}; {why}", refusals.join("; ")),
            }
        }
        e => e,
    }
}
