//! Removal and trimming. Only readable locations are removed; a location
//! being written belongs to its session until finish or timeout.

use std::collections::HashMap;

use super::{MetaService, TrimPolicy, now_ms};
use crate::error::Result;
use crate::index::{Fence, Modify};
use crate::model::{BlockKey, CacheLocation, Instance, LocationStatus, StorageKind};

impl MetaService {
    /// Removes the readable locations of `keys` (writing ones stay with
    /// their session) and releases their bytes; returns the number of keys
    /// that had any.
    pub async fn remove_cache(&self, instance: &str, keys: &[BlockKey]) -> Result<usize> {
        self.check_keys(keys)?;
        let inst = self
            .catalog
            .instance_or_load(self.index.as_ref(), instance)?;
        self.remove_keys(&inst, keys, None)
    }

    /// The removal itself, for `remove_cache`, trimming and the reclaimer
    /// (whose writes carry the leader's `fence`).
    pub(super) fn remove_keys(
        &self,
        inst: &Instance,
        keys: &[BlockKey],
        fence: Option<&Fence>,
    ) -> Result<usize> {
        let mut removed = 0usize;
        let mut freed: HashMap<StorageKind, u64> = HashMap::new();
        let mut gone: Vec<CacheLocation> = Vec::new();
        let mut decide = |_, cur: Option<crate::model::BlockMeta>| {
            let Some(mut m) = cur else {
                return Modify::Keep;
            };
            let before = m.locations.len();
            let (keep, drop): (Vec<_>, Vec<_>) = m
                .locations
                .into_iter()
                .partition(|l| l.status == LocationStatus::Writing);
            for l in &drop {
                *freed.entry(l.kind).or_default() += l.size();
            }
            gone.extend(drop);
            m.locations = keep;
            if m.locations.len() == before {
                return Modify::Keep;
            }
            removed += 1;
            if m.locations.is_empty() {
                Modify::Delete
            } else {
                Modify::Put(m)
            }
        };
        let result = match fence {
            Some(fence) => self.index.modify_fenced(&inst.id, keys, fence, &mut decide),
            None => self.index.modify(&inst.id, keys, &mut decide),
        };
        // Before acknowledging (also on error: earlier chunks may be applied).
        self.search_cache.invalidate(&inst.id, keys);
        // Free space only once the index no longer lists it: on error some
        // may still be listed, and leaking beats handing out live space.
        if result.is_ok() {
            self.release_locations(gone);
        }
        for (kind, bytes) in freed {
            self.release_usage(&inst.group, kind, bytes);
        }
        result?;
        Ok(removed)
    }

    /// Drops blocks of an instance by policy; returns how many.
    /// Scans the whole instance (the sampling reclaimer comes later).
    pub async fn trim_cache(&self, instance: &str, policy: TrimPolicy) -> Result<usize> {
        let inst = self
            .catalog
            .instance_or_load(self.index.as_ref(), instance)?;
        // LRU / LFU / idle decisions need the buffered read statistics.
        self.flush_access()?;
        let mut metas = Vec::new();
        let mut after = None;
        loop {
            let keys = self.index.scan(instance, after, 4096)?;
            let Some(&last) = keys.last() else { break };
            after = Some(last);
            metas.extend(self.index.get(instance, &keys)?.into_iter().flatten());
        }
        let victims: Vec<BlockKey> = match policy {
            TrimPolicy::All => metas.iter().map(|m| m.key).collect(),
            TrimPolicy::Lru { keep } => {
                metas.sort_by_key(|m| (m.last_access_ms, m.key));
                let n = metas.len().saturating_sub(keep);
                metas[..n].iter().map(|m| m.key).collect()
            }
            TrimPolicy::Lfu { keep } => {
                metas.sort_by_key(|m| (m.access_count, m.last_access_ms, m.key));
                let n = metas.len().saturating_sub(keep);
                metas[..n].iter().map(|m| m.key).collect()
            }
            TrimPolicy::IdleFor(d) => {
                let cutoff = now_ms().saturating_sub(d.as_millis() as u64);
                metas
                    .iter()
                    .filter(|m| m.last_access_ms <= cutoff)
                    .map(|m| m.key)
                    .collect()
            }
        };
        if victims.is_empty() {
            return Ok(0);
        }
        self.remove_keys(&inst, &victims, None)
    }
}
