//! Reads: location matching (keys, prefix, reverse sliding window) and raw
//! record inspection. Reads take no locks; only access statistics write.

use super::{LocationMatch, LocationQuery, MetaService, now_ms};
use crate::error::{MetaError, Result};
use crate::matching::{MatchMode, prefix_len, sliding_window_end};
use crate::model::{BlockKey, BlockMeta, CacheLocation};

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
        self.catalog.instance(instance)?;
        let n = query.keys.len();
        let wanted: Vec<usize> = (0..n).filter(|&i| !query.mask.is_masked(i)).collect();
        let wanted_keys: Vec<BlockKey> = wanted.iter().map(|&i| query.keys[i]).collect();
        let records = self.index.get(instance, &wanted_keys)?;
        let mut found: Vec<Option<CacheLocation>> = vec![None; n];
        for (&i, rec) in wanted.iter().zip(records) {
            found[i] = rec.and_then(|m| m.serving().cloned());
        }
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
            self.touch(instance, &hits)?;
        }
        Ok(LocationMatch {
            matched,
            locations: found,
        })
    }

    fn touch(&self, instance: &str, keys: &[BlockKey]) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        self.index.touch(instance, keys, now_ms())
    }

    /// Raw records of `keys` (all statuses), for inspection.
    pub async fn get_cache_meta(
        &self,
        instance: &str,
        keys: &[BlockKey],
    ) -> Result<Vec<Option<BlockMeta>>> {
        self.check_keys(keys)?;
        self.catalog.instance(instance)?;
        self.index.get(instance, keys)
    }
}
