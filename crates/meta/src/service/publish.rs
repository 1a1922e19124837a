//! Published parts: block bytes an owner outside this service wrote and
//! manages itself (a kvtier node's G2/G3 blocks, docs/meta-api.md
//! "Node-published locations"), recorded so the cluster-wide view knows
//! where they are. No two-phase write: the bytes are readable before they
//! are published, and the owner unpublishes what it evicted.
//!
//! A published part joins the serving location of its block on the given
//! storage (one location per storage, one spec per part, as a
//! `start_write_cache` location holds every spec of the block); it is
//! charged to the instance's group like every location, so quotas and
//! the reclaimer see it, and a removal through this service deletes it
//! through the storage's backend. Unpublishing drops it without asking the
//! backend: the owner already did.

use std::collections::HashMap;

use super::{MetaService, now_ms};
use crate::error::{MetaError, Result};
use crate::index::Modify;
use crate::model::{
    BlockKey, BlockMeta, CacheLocation, LocationId, LocationSpec, LocationStatus, StorageKind,
};

/// One part to publish: block `key`'s bytes for one spec, at `uri`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedPart {
    /// The block.
    pub key: BlockKey,
    /// Where the owner serves it.
    pub uri: String,
    /// Bytes.
    pub size: u64,
}

impl MetaService {
    /// Records `parts` as spec `spec` of the serving location of each block
    /// on `storage`, for `instance`. A part already recorded with the same
    /// URI is left alone; one with another URI is replaced. Returns how
    /// many parts were added or replaced. Charged to the group without the
    /// hard-quota check: the bytes exist whether or not they are recorded,
    /// and the reclaimer brings the group back under its watermark.
    pub async fn publish_parts(
        &self,
        instance: &str,
        storage: &str,
        spec: &str,
        parts: &[PublishedPart],
    ) -> Result<usize> {
        let keys: Vec<BlockKey> = parts.iter().map(|p| p.key).collect();
        self.check_keys(&keys)?;
        let inst = self
            .catalog
            .instance_or_load(self.index.as_ref(), instance)?;
        let kind = self.catalog.storage(storage)?.kind;
        if !inst.location_specs.iter().any(|s| s.name == spec) {
            return Err(MetaError::InvalidArgument(format!(
                "instance {instance:?} has no location spec {spec:?}"
            )));
        }
        let by_key: HashMap<BlockKey, &PublishedPart> = parts.iter().map(|p| (p.key, p)).collect();
        let now = now_ms();
        let mut changed = 0usize;
        let (mut charged, mut released) = (0u64, 0u64);
        let result = self.index.modify(&inst.id, &keys, &mut |key, cur| {
            let Some(part) = by_key.get(&key) else {
                return Modify::Keep;
            };
            let mut m = cur.unwrap_or(BlockMeta {
                key,
                locations: Vec::new(),
                last_access_ms: now,
                access_count: 0,
                depth: 0,
            });
            let loc = match m
                .locations
                .iter()
                .position(|l| l.storage == storage && l.status == LocationStatus::Serving)
            {
                Some(i) => &mut m.locations[i],
                None => {
                    m.locations.push(CacheLocation {
                        id: LocationId(self.next_id()),
                        storage: storage.to_owned(),
                        kind,
                        status: LocationStatus::Serving,
                        specs: Vec::new(),
                    });
                    let last = m.locations.len() - 1;
                    &mut m.locations[last]
                }
            };
            if let Some(old) = loc.specs.iter().position(|s| s.name == spec) {
                if loc.specs[old].uri == part.uri && loc.specs[old].size == part.size {
                    return Modify::Keep;
                }
                released += loc.specs.remove(old).size;
            }
            loc.specs.push(LocationSpec {
                name: spec.to_owned(),
                uri: part.uri.clone(),
                size: part.size,
            });
            charged += part.size;
            changed += 1;
            m.last_access_ms = now;
            Modify::Put(m)
        });
        self.search_cache.invalidate(&inst.id, &keys);
        // On an index error a failed chunk is charged too: over-charging
        // until the next start rebuilds the ledger beats under-charging.
        self.charge_usage(&inst.group, kind, charged);
        self.release_usage(&inst.group, kind, released);
        result?;
        Ok(changed)
    }

    /// Drops spec `spec` of the location on `storage` of each of `keys`
    /// (the location once it has no spec left, the block once it has no
    /// location), without deleting anything through the backend: the owner
    /// has already dropped the bytes. Returns how many parts it dropped.
    pub async fn unpublish_parts(
        &self,
        instance: &str,
        storage: &str,
        spec: &str,
        keys: &[BlockKey],
    ) -> Result<usize> {
        self.check_keys(keys)?;
        let inst = self
            .catalog
            .instance_or_load(self.index.as_ref(), instance)?;
        let mut dropped = 0usize;
        let mut freed: HashMap<StorageKind, u64> = HashMap::new();
        let result = self.index.modify(&inst.id, keys, &mut |_, cur| {
            let Some(mut m) = cur else {
                return Modify::Keep;
            };
            let Some(i) = m
                .locations
                .iter()
                .position(|l| l.storage == storage && l.status == LocationStatus::Serving)
            else {
                return Modify::Keep;
            };
            let loc = &mut m.locations[i];
            let Some(s) = loc.specs.iter().position(|s| s.name == spec) else {
                return Modify::Keep;
            };
            *freed.entry(loc.kind).or_default() += loc.specs.remove(s).size;
            dropped += 1;
            if loc.specs.is_empty() {
                m.locations.remove(i);
            }
            if m.locations.is_empty() {
                Modify::Delete
            } else {
                Modify::Put(m)
            }
        });
        self.search_cache.invalidate(&inst.id, keys);
        for (kind, bytes) in freed {
            self.release_usage(&inst.group, kind, bytes);
        }
        result?;
        Ok(dropped)
    }
}
