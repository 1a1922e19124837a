//! The two-phase write: grants (`start_write_cache`), completion
//! (`finish_write_cache`) and the reclaiming of timed-out sessions.

use std::collections::HashMap;
use std::sync::Arc;

use super::{FinishSummary, MetaService, ReaperHandle, WriteGrant, WriteTarget, now_ms, quota};
use crate::error::{MetaError, Result};
use crate::index::{Fence, Modify};
use crate::ledger::{SessionId, SessionRecord, SessionTarget};
use crate::model::{
    BlockKey, BlockMeta, CacheLocation, Instance, InstanceGroup, LocationId, LocationSpec,
    LocationStatus, Storage, StorageKind,
};
use crate::path_safe::part_path;

/// Expired sessions claimed per ledger call of the reaper.
const REAP_BATCH: usize = 1024;

/// The shortest claim on a session (see `MetaService::claim_lease`).
const MIN_CLAIM_LEASE: std::time::Duration = std::time::Duration::from_secs(10);

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
        let timeout = self.config.session_timeout;
        if candidates.is_empty() {
            // An empty session still exists until it is finished or times
            // out, so finishing an id that was never issued is an error.
            // It charges nothing, so its kind is never used.
            let mut empty = new_session(&inst, &group.name, 0, Vec::new());
            self.ledger.open(session, &mut empty, timeout, &mut |_| {
                Ok(StorageKind::FilePool)
            })?;
            return Ok(WriteGrant {
                session,
                blocks: Vec::new(),
                skipped: keys.to_vec(),
            });
        }
        self.check_key_capacity(&inst, &group, candidates.len())?;
        // Location ids first: the session records its targets when it
        // opens, before the index holds them, so a frontend that dies
        // past this point leaves a session for the reaper, not an orphan.
        let targets: Vec<SessionTarget> = candidates
            .iter()
            .map(|&key| SessionTarget {
                key,
                location: LocationId(self.next_id()),
            })
            .collect();
        let (mut record, mut planned) = self.open_placed(&inst, &group, session, targets).await?;
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
        for b in &blocks {
            planned.remove(&b.key);
        }
        // Give back the space placed for keys someone else took meanwhile.
        self.release_locations(planned.into_values().collect());
        // On an index error the session keeps every target: the reaper
        // removes what was made and releases the whole charge.
        result?;
        let granted_keys: std::collections::HashSet<BlockKey> =
            blocks.iter().map(|b| b.key).collect();
        let dropped = record.targets.len() - blocks.len();
        if dropped > 0 {
            // The session must list exactly the granted blocks: the finish
            // reports one flag for each. If the ledger cannot take that,
            // the grant fails and the reaper undoes it.
            record.targets.retain(|t| granted_keys.contains(&t.key));
            self.ledger.narrow(session, &record, dropped, timeout)?;
        }
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

    /// Opens session `id` for `targets` on the first of the group's
    /// storages that the quota admits and whose backend places the parts;
    /// returns the session and the planned location of each target. A
    /// storage whose backend refuses is skipped (its charge returned), and
    /// what it said is kept for the refusal if no storage is left.
    async fn open_placed(
        &self,
        inst: &Instance,
        group: &InstanceGroup,
        id: SessionId,
        targets: Vec<SessionTarget>,
    ) -> Result<(SessionRecord, HashMap<BlockKey, CacheLocation>)> {
        let mut storages = self.catalog.candidates(group);
        let bytes = inst.block_bytes().saturating_mul(targets.len() as u64);
        let mut refusals = Vec::new();
        loop {
            let mut record = new_session(inst, &group.name, inst.block_bytes(), targets.clone());
            let mut chosen = 0;
            self.ledger
                .open(id, &mut record, self.config.session_timeout, &mut |usage| {
                    chosen = quota::choose(group, &storages, bytes, usage)?;
                    Ok(storages[chosen].kind)
                })
                .map_err(|e| with_refusals(e, &refusals))?;
            let storage = storages[chosen].clone();
            let planned = targets
                .iter()
                .map(|t| Ok((t.key, self.new_location(inst, &storage, t.key, t.location)?)))
                .collect::<Result<HashMap<BlockKey, CacheLocation>>>();
            let refused = match planned {
                Ok(mut planned) => match self.place_parts(&storage, &inst.id, &mut planned).await {
                    Ok(()) => return Ok((record, planned)),
                    Err(e) => e,
                },
                Err(e) => {
                    self.abandon(id, &record);
                    return Err(e);
                }
            };
            tracing::warn!(storage = storage.name, error = %refused, "storage backend refused a write; skipping it");
            self.abandon(id, &record);
            storages.retain(|s| s.name != storage.name);
            refusals.push(format!(
                "storage {:?} refused the write: {refused}",
                storage.name
            ));
        }
    }

    /// Closes a session none of whose targets reached the index, releasing
    /// its whole charge. A ledger error leaves it to the reaper.
    fn abandon(&self, id: SessionId, record: &SessionRecord) {
        if let Err(e) = self.ledger.close(id, record, 0) {
            tracing::warn!(session = %id, error = %e, "quota ledger: abandoned session left to the reaper");
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
        id: LocationId,
    ) -> Result<CacheLocation> {
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
    /// [`MetaError::SessionNotFound`]. Any frontend sharing the ledger may
    /// finish a session another started.
    pub async fn finish_write_cache(
        &self,
        instance: &str,
        session: SessionId,
        success: &[bool],
    ) -> Result<FinishSummary> {
        let timeout = self.config.session_timeout;
        let s = self
            .ledger
            .claim(session, self.claim_lease())?
            .ok_or(MetaError::SessionNotFound(session.0))?;
        let checked = if s.instance != instance {
            Err(MetaError::SessionNotFound(session.0))
        } else if s.targets.len() != success.len() {
            Err(MetaError::InvalidArgument(format!(
                "{} flags for {} blocks",
                success.len(),
                s.targets.len()
            )))
        } else {
            Ok(())
        };
        if let Err(e) = checked {
            self.ledger.unclaim(session, None)?;
            return Err(e);
        }
        self.close_session(session, &s, success, None)
            .inspect_err(|_| {
                // Open again, with a fresh deadline, so the caller can
                // finish it once the index writes again (and the reaper
                // does not drop it meanwhile).
                if let Err(e) = self.ledger.unclaim(session, Some(timeout)) {
                    tracing::warn!(session = %session, error = %e, "quota ledger: session left to the reaper");
                }
            })
    }

    /// Applies a claimed session's outcome to the index, then closes it in
    /// the ledger, releasing the charge of every target that did not turn
    /// serving. On an index error nothing is released and the session
    /// stays claimed, for the caller to open again. Idempotent, so a
    /// session whose close failed half-way can be closed again later: a
    /// target an earlier try already made serving counts as served,
    /// whatever `success` says now.
    pub(super) fn close_session(
        &self,
        id: SessionId,
        s: &SessionRecord,
        success: &[bool],
        fence: Option<&Fence>,
    ) -> Result<FinishSummary> {
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
        let mut decide = |key, cur: Option<BlockMeta>| {
            let (Some(mut m), Some(&(id, ok))) = (cur, wanted.get(&key)) else {
                return Modify::Keep;
            };
            let Some(pos) = m.locations.iter().position(|l| l.id == id) else {
                return Modify::Keep;
            };
            match (m.locations[pos].status, ok) {
                (LocationStatus::Serving, _) => {
                    served += 1;
                    Modify::Keep
                }
                (LocationStatus::Writing, true) => {
                    m.locations[pos].status = LocationStatus::Serving;
                    m.last_access_ms = now;
                    m.access_count = m.access_count.saturating_add(1);
                    served += 1;
                    Modify::Put(m)
                }
                (LocationStatus::Writing, false) => {
                    removed.push(m.locations.remove(pos));
                    if m.locations.is_empty() {
                        Modify::Delete
                    } else {
                        Modify::Put(m)
                    }
                }
                (LocationStatus::Deleting, _) => Modify::Keep,
            }
        };
        let result = match fence {
            Some(f) if !keys.is_empty() => {
                self.index.modify_fenced(&s.instance, &keys, f, &mut decide)
            }
            _ if keys.is_empty() => Ok(()),
            _ => self.index.modify(&s.instance, &keys, &mut decide),
        };
        self.search_cache.invalidate(&s.instance, &keys);
        result?;
        self.release_locations(removed);
        if let Err(e) = self.ledger.close(id, s, served) {
            // The index is final; the claim runs out and the reaper closes
            // the session again (idempotent), releasing the charge then.
            tracing::warn!(session = %id, error = %e, "quota ledger: closing the session left to the reaper");
        }
        Ok(FinishSummary {
            served,
            dropped: s.targets.len() - served,
        })
    }

    /// Fails every session past its deadline; returns how many held
    /// locations. With `fence` (the leader's, over a shared ledger), its
    /// index writes are refused once this frontend no longer leads.
    pub async fn reap_expired(&self, fence: Option<&Fence>) -> Result<usize> {
        let mut held = 0;
        // Sessions whose close failed stay claimed until the round ends,
        // so a later batch does not take them again; then they are due
        // for the next round. A session seen twice (its claim ran out
        // during a long round) ends the round.
        let mut seen = std::collections::HashSet::new();
        let mut failed = Vec::new();
        'round: loop {
            let expired = self.ledger.claim_expired(self.claim_lease(), REAP_BATCH)?;
            let last_batch = expired.len() < REAP_BATCH;
            for (id, s) in expired {
                if !seen.insert(id) {
                    failed.push(id);
                    break 'round;
                }
                held += usize::from(!s.targets.is_empty());
                let fails = vec![false; s.targets.len()];
                if let Err(e) = self.close_session(id, &s, &fails, fence) {
                    tracing::warn!(session = %id, error = %e, "reclaiming expired write session failed; retried next round");
                    failed.push(id);
                }
            }
            if last_batch {
                break;
            }
        }
        for id in failed {
            // Due again at once: its deadline has passed.
            self.ledger.unclaim(id, None)?;
        }
        Ok(held)
    }

    /// Refuses a write that would take `inst` past its group's
    /// `max_key_count` block records (Tair KVCM's limit per instance,
    /// `meta/meta_indexer.cc`: `new + held > max` is refused), with
    /// [`MetaError::KeyCountExceeded`]. `new_keys` are the keys the write
    /// would add. Free when the group sets no limit (0); otherwise one
    /// [`crate::MetaIndex::count`] call. Checked before the write, not with
    /// it: concurrent writes of one instance may pass it together, as
    /// upstream's may across its lock shards.
    pub(crate) fn check_key_capacity(
        &self,
        inst: &Instance,
        group: &InstanceGroup,
        new_keys: usize,
    ) -> Result<()> {
        let limit = group.max_key_count;
        if limit == 0 || new_keys == 0 {
            return Ok(());
        }
        let count = self.index.count(&inst.id)?;
        let adding = u64::try_from(new_keys).unwrap_or(u64::MAX);
        if count.saturating_add(adding) <= limit {
            return Ok(());
        }
        Err(MetaError::KeyCountExceeded {
            instance: inst.id.clone(),
            count,
            adding,
            limit,
        })
    }

    /// How long a claim on a session holds: the session timeout, but at
    /// least [`MIN_CLAIM_LEASE`], so a claim outlasts the work it covers
    /// even with a zero timeout.
    pub(super) fn claim_lease(&self) -> std::time::Duration {
        self.config.session_timeout.max(MIN_CLAIM_LEASE)
    }

    /// Starts the background reaper (every `reap_interval`, fenced by
    /// `fence` when given); it stops when the handle is dropped.
    pub fn spawn_reaper(self: &Arc<Self>, fence: Option<Fence>) -> ReaperHandle {
        let svc = Arc::downgrade(self);
        let period = self.config.reap_interval;
        ReaperHandle(tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if fence.as_ref().is_some_and(|f| f.check().is_err()) {
                    return;
                }
                let Some(svc) = svc.upgrade() else { return };
                if let Err(e) = svc.reap_expired(fence.as_ref()).await {
                    tracing::warn!(error = %e, "write-session reaper round failed");
                }
            }
        }))
    }
}

/// A session of `inst` writing `targets`, each `block_bytes`; the ledger
/// sets its kind when it opens.
fn new_session(
    inst: &Instance,
    group: &str,
    block_bytes: u64,
    targets: Vec<SessionTarget>,
) -> SessionRecord {
    SessionRecord {
        instance: inst.id.clone(),
        group: group.to_owned(),
        kind: StorageKind::FilePool,
        block_bytes,
        targets,
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
