//! Hard quotas per instance group and storage kind: which storage a write
//! goes to, or why it is refused.
//!
//! Bytes are charged when a write is granted (a writing location holds its
//! space) and released when the location is removed or its write fails;
//! the charges live in the [`crate::ledger::Ledger`].

use crate::error::{MetaError, Result};
use crate::ledger::GroupUsage;
use crate::model::{InstanceGroup, Storage, StorageKind};

/// Why none of the group's storages takes writes, one clause per storage:
/// an operator must tell a disabled storage from a failing one, and both
/// from one that was never added (`candidates` are those that exist).
fn unwritable_reasons(group: &InstanceGroup, candidates: &[Storage]) -> String {
    let missing = group
        .storages
        .iter()
        .filter(|n| !candidates.iter().any(|s| &s.name == *n))
        .map(|n| format!("storage {n:?} is not added"));
    let refused = candidates.iter().filter_map(session_refusal);
    let why: Vec<String> = missing.chain(refused).collect();
    why.join("; ")
}

/// Why `s` takes no write session, as a clause that names it; `None` when
/// it takes them. A `kvtier_node` storage is a node's own block store:
/// blocks enter it only through its node's commits (docs/meta-api.md §10),
/// and a remote node's store refuses writes, so a session placed there
/// would fail even though its health probe (a peer handshake) passes.
fn session_refusal(s: &Storage) -> Option<String> {
    if s.kind == StorageKind::KvtierNode {
        return Some(format!(
            "storage {:?} is a kvtier node's block store (it takes no write sessions)",
            s.name
        ));
    }
    s.refusal_clause()
}

/// The quota policy: the first writable candidate whose kind quota, and
/// the group's quota, fit `bytes` more than `usage`, as an index into
/// `candidates`; or the refusal. The [`crate::ledger::Ledger`] applies it
/// and charges in one step.
pub(crate) fn choose(
    group: &InstanceGroup,
    candidates: &[Storage],
    bytes: u64,
    usage: &GroupUsage,
) -> Result<usize> {
    if usage.total.saturating_add(bytes) > group.quota_bytes {
        return Err(MetaError::QuotaExceeded {
            group: group.name.clone(),
            requested: bytes,
            used: usage.total,
            limit: group.quota_bytes,
        });
    }
    let mut refused_by_kind = None;
    let takes_session = |s: &Storage| s.writable() && session_refusal(s).is_none();
    for (i, s) in candidates
        .iter()
        .enumerate()
        .filter(|(_, s)| takes_session(s))
    {
        let used = usage.by_kind.get(&s.kind).copied().unwrap_or(0);
        let limit = group
            .kind_quota_bytes
            .get(&s.kind)
            .copied()
            .unwrap_or(u64::MAX);
        if used.saturating_add(bytes) > limit {
            refused_by_kind = Some((used, limit));
            continue;
        }
        return Ok(i);
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
