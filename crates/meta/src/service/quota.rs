//! Hard quota accounting per instance group and storage kind.
//!
//! Bytes are charged when a write is granted (a writing location holds its
//! space) and released when the location is removed or its write fails.
//! The ledger is in memory and rebuilt from the index at startup.

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;

use crate::error::{MetaError, Result};
use crate::model::{InstanceGroup, Storage, StorageKind, write_refusal};

/// Bytes in use by one group (writing + serving locations).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupUsage {
    /// All kinds together.
    pub total: u64,
    /// Per storage kind.
    pub by_kind: BTreeMap<StorageKind, u64>,
}

/// Why none of the group's storages takes writes, one clause per storage:
/// an operator must tell a disabled storage from a failing one, and both
/// from one that was never added (`candidates` are those that exist).
fn unwritable_reasons(group: &InstanceGroup, candidates: &[Storage]) -> String {
    let missing = group
        .storages
        .iter()
        .filter(|n| !candidates.iter().any(|s| &s.name == *n))
        .map(|n| format!("storage {n:?} is not added"));
    let refused = candidates.iter().filter_map(|s| {
        let refusal = write_refusal(s.enabled, s.health)?;
        Some(if s.enabled {
            format!("storage {:?} is {refusal} (see its health probe)", s.name)
        } else {
            format!("storage {:?} is {refusal}", s.name)
        })
    });
    let why: Vec<String> = missing.chain(refused).collect();
    why.join("; ")
}

/// The ledger. One mutex: reservations are a few arithmetic operations.
#[derive(Debug, Default)]
pub(crate) struct Quotas {
    usage: Mutex<HashMap<String, GroupUsage>>,
}

impl Quotas {
    /// Picks the first writable candidate whose kind quota fits `bytes` and
    /// charges it, or refuses without charging anything.
    pub(crate) fn reserve<'s>(
        &self,
        group: &InstanceGroup,
        candidates: &'s [Storage],
        bytes: u64,
    ) -> Result<&'s Storage> {
        let mut usage = self.usage.lock();
        let u = usage.entry(group.name.clone()).or_default();
        if u.total.saturating_add(bytes) > group.quota_bytes {
            return Err(MetaError::QuotaExceeded {
                group: group.name.clone(),
                requested: bytes,
                used: u.total,
                limit: group.quota_bytes,
            });
        }
        let mut refused_by_kind = None;
        for s in candidates.iter().filter(|s| s.writable()) {
            let used = u.by_kind.get(&s.kind).copied().unwrap_or(0);
            let limit = group
                .kind_quota_bytes
                .get(&s.kind)
                .copied()
                .unwrap_or(u64::MAX);
            if used.saturating_add(bytes) > limit {
                refused_by_kind = Some((used, limit));
                continue;
            }
            u.total += bytes;
            *u.by_kind.entry(s.kind).or_default() += bytes;
            return Ok(s);
        }
        Err(match refused_by_kind {
            Some((used, limit)) => MetaError::QuotaExceeded {
                group: group.name.clone(),
                requested: bytes,
                used,
                limit,
            },
            None => MetaError::NoAvailableStorage {
                group: group.name.clone(),
                why: unwritable_reasons(group, candidates),
            },
        })
    }

    /// Charges bytes unconditionally (startup rebuild).
    pub(crate) fn charge(&self, group: &str, kind: StorageKind, bytes: u64) {
        let mut usage = self.usage.lock();
        let u = usage.entry(group.to_owned()).or_default();
        u.total += bytes;
        *u.by_kind.entry(kind).or_default() += bytes;
    }

    /// Returns bytes to the group.
    pub(crate) fn release(&self, group: &str, kind: StorageKind, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let mut usage = self.usage.lock();
        let u = usage.entry(group.to_owned()).or_default();
        u.total = u.total.saturating_sub(bytes);
        let k = u.by_kind.entry(kind).or_default();
        *k = k.saturating_sub(bytes);
    }

    /// Current usage of `group`.
    pub(crate) fn usage(&self, group: &str) -> GroupUsage {
        self.usage.lock().get(group).cloned().unwrap_or_default()
    }
}
