//! Reads: location matching (keys, prefix, reverse sliding window) and raw
//! record inspection. Reads take no index locks and write nothing to the
//! index: answers come from the search cache where it has them, and access
//! statistics go to an in-memory buffer applied in batches.

use std::sync::Arc;

use super::access::AccessBuffer;
use super::{LocationMatch, LocationQuery, MetaService, now_ms};
use crate::error::{MetaError, Result};
use crate::index::{AccessHit, MetaIndex};
use crate::matching::{MatchMode, prefix_len, sliding_window_end};
use crate::model::{BlockKey, BlockMeta, CacheLocation, LocationStatus};

impl MetaService {
    /// Finds serving locations for a sequence of keys (see [`MatchMode`]).
    pub async fn get_cache_location(
        &self,
        instance: &str,
        query: &LocationQuery,
    ) -> Result<LocationMatch> {
        self.check_keys(&query.keys)?;
        query.mask.validate(query.keys.len())?;
        if let MatchMode::ReverseSlidingWindow { window: 0 } = query.mode {
            return Err(MetaError::InvalidArgument(
                "sliding window of 0 blocks".into(),
            ));
        }
        self.catalog
            .instance_or_load(self.index.as_ref(), instance)?;
        let n = query.keys.len();
        let wanted: Vec<usize> = (0..n).filter(|&i| !query.mask.is_masked(i)).collect();
        let now = now_ms();
        let mut found: Vec<Option<Arc<CacheLocation>>> = vec![None; n];
        self.find_serving(instance, &query.keys, &wanted, now, &mut found)?;
        // After the cache: health changes without a write, so the cache
        // keeps locations on unhealthy storages and this hides them.
        self.hide_unhealthy(&mut found);
        let available: Vec<bool> = (0..n)
            .map(|i| query.mask.is_masked(i) || found[i].is_some())
            .collect();
        let (matched, keep) = match query.mode {
            MatchMode::Keys => (found.iter().filter(|l| l.is_some()).count(), 0..n),
            MatchMode::Prefix => {
                let e = prefix_len(&available);
                (e, 0..e)
            }
            MatchMode::ReverseSlidingWindow { window } => {
                let e = sliding_window_end(&available, window);
                (e, e.saturating_sub(window)..e)
            }
        };
        for (i, slot) in found.iter_mut().enumerate() {
            if !keep.contains(&i) {
                *slot = None;
            }
        }
        if self.config.record_access {
            let hits: Vec<BlockKey> = found
                .iter()
                .zip(&query.keys)
                .filter(|(l, _)| l.is_some())
                .map(|(_, k)| *k)
                .collect();
            if self.access.record(instance, hits, now) {
                self.flush_access_soon();
            }
        }
        Ok(LocationMatch {
            matched,
            locations: found,
        })
    }

    /// Fills `found[i]` with the serving location of `keys[i]` for every
    /// `i` in `wanted`: from the search cache where it has the answer, else
    /// from one batched index read whose answers then fill the cache.
    fn find_serving(
        &self,
        instance: &str,
        keys: &[BlockKey],
        wanted: &[usize],
        now: u64,
        found: &mut [Option<Arc<CacheLocation>>],
    ) -> Result<()> {
        let cache = &self.search_cache;
        if !cache.enabled() {
            let wanted_keys: Vec<BlockKey> = wanted.iter().map(|&i| keys[i]).collect();
            let records = self.index.get(instance, &wanted_keys)?;
            for (&i, rec) in wanted.iter().zip(records) {
                found[i] = rec.and_then(into_serving).map(Arc::new);
            }
            return Ok(());
        }
        // Tag and epochs before the index read: see `search_cache`.
        let tag = cache.tag(instance);
        let epochs = cache.epochs();
        let misses = cache.lookup(tag, keys, wanted, now, found);
        if misses.is_empty() {
            return Ok(());
        }
        let miss_keys: Vec<BlockKey> = misses.iter().map(|&i| keys[i]).collect();
        let records = self.index.get(instance, &miss_keys)?;
        let mut fills = Vec::with_capacity(misses.len());
        for (&i, rec) in misses.iter().zip(records) {
            if let Some(loc) = rec.and_then(into_serving) {
                let loc = Arc::new(loc);
                fills.push((keys[i], loc.clone()));
                found[i] = Some(loc);
            }
        }
        cache.fill(tag, &epochs, now, fills);
        Ok(())
    }

    /// Applies the buffered access statistics to the index, aggregated per
    /// key (see `access`); returns how many keys it updated. Called by the
    /// reclaimer before every round and by paths that show statistics.
    pub fn flush_access(&self) -> Result<usize> {
        flush_access_into(self.index.as_ref(), &self.access)
    }

    /// The buffer passed its bound: flush it on a blocking thread so no
    /// read waits for a batch of index writes. One background flush at a
    /// time: reads arriving while it is scheduled add nothing but their
    /// hits. Without a runtime, or once the buffer has grown to four times
    /// its bound, this read pays for the batch, which bounds the memory held.
    fn flush_access_soon(&self) {
        let rt = tokio::runtime::Handle::try_current();
        let backlog = self.access.pending() >= 4 * self.access.flush_at();
        match rt {
            Ok(rt) if !backlog => {
                if self.access.try_schedule_flush() {
                    let (index, access) = (self.index.clone(), self.access.clone());
                    rt.spawn_blocking(move || {
                        let result = flush_access_into(index.as_ref(), &access);
                        access.flush_finished();
                        if let Err(e) = result {
                            tracing::warn!(error = %e, "flushing access statistics failed");
                        }
                    });
                }
            }
            _ => {
                if let Err(e) = self.flush_access() {
                    tracing::warn!(error = %e, "flushing access statistics failed");
                }
            }
        }
    }
}

/// Drains `access` into `index`: one [`MetaIndex::touch`] per instance,
/// which each backend applies its cheapest way (no fsync, no record locks
/// on Redis). Returns the keys handed over (some may be gone by now).
fn flush_access_into(index: &dyn MetaIndex, access: &AccessBuffer) -> Result<usize> {
    let _one_at_a_time = access.flushing.lock();
    let touches = access.drain();
    let mut applied = 0usize;
    let mut first_err = None;
    for (instance, per_key) in touches {
        let hits: Vec<AccessHit> = per_key
            .iter()
            .map(|(&key, t)| AccessHit {
                key,
                last_ms: t.last_ms,
                count: t.count,
            })
            .collect();
        // One failing instance does not keep the others' statistics.
        match index.touch(&instance, &hits) {
            Ok(()) => applied += hits.len(),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(applied),
    }
}

impl MetaService {
    /// Entries held by the search cache (for metrics).
    pub fn search_cache_len(&self) -> usize {
        self.search_cache.len()
    }

    /// Read hits buffered and not yet applied to the index (for metrics).
    pub fn pending_access(&self) -> usize {
        self.access.pending()
    }

    /// Raw records of `keys` (all statuses), for inspection.
    pub async fn get_cache_meta(
        &self,
        instance: &str,
        keys: &[BlockKey],
    ) -> Result<Vec<Option<BlockMeta>>> {
        self.check_keys(keys)?;
        self.catalog
            .instance_or_load(self.index.as_ref(), instance)?;
        // Show the statistics of reads made so far.
        self.flush_access()?;
        self.index.get(instance, keys)
    }
}

/// The location [`BlockMeta::serving`] would return, moved out of the
/// record the index handed over (no second deep clone).
fn into_serving(meta: BlockMeta) -> Option<CacheLocation> {
    meta.locations
        .into_iter()
        .find(|l| l.status == LocationStatus::Serving)
}
