//! The crate's error type. Each variant maps to one wire error code
//! ([`MetaError::code`]) when the transport lands.

use crate::model::BlockKey;

/// Errors of the metadata service and its index backends.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// The request is malformed (empty keys, mask length mismatch, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No such instance.
    #[error("instance {0:?} not found")]
    InstanceNotFound(String),
    /// No such instance group.
    #[error("instance group {0:?} not found")]
    GroupNotFound(String),
    /// No such account.
    #[error("account {0:?} not found")]
    AccountNotFound(String),
    /// No such storage.
    #[error("storage {0:?} not found")]
    StorageNotFound(String),
    /// An instance was re-registered with a different configuration.
    #[error("instance {0:?} already exists with a different configuration")]
    InstanceConflict(String),
    /// The group already holds `max_instances` instances.
    #[error("instance group {0:?} is full")]
    GroupFull(String),
    /// A write would exceed the group's hard quota (total, or every candidate
    /// storage kind's). Nothing was changed.
    #[error("quota exceeded in group {group:?}: need {requested} bytes, {used} of {limit} used")]
    QuotaExceeded {
        /// Group name.
        group: String,
        /// Bytes the write needed.
        requested: u64,
        /// Bytes in use (writing + serving).
        used: u64,
        /// The limit that refused it.
        limit: u64,
    },
    /// No candidate storage of the group could take the write.
    #[error("no writable storage for group {group:?}: {why}")]
    NoAvailableStorage {
        /// Group name.
        group: String,
        /// Why each candidate was passed over (disabled, unhealthy, or what
        /// its backend answered, e.g. that its pool is full).
        why: String,
    },
    /// A write would take an instance past its group's `max_key_count`
    /// block records. Nothing was changed.
    #[error(
        "instance {instance:?} holds {count} keys: {adding} more would pass its group's max_key_count {limit}"
    )]
    KeyCountExceeded {
        /// Instance id.
        instance: String,
        /// Records it holds (writing and serving).
        count: u64,
        /// New records the write needed.
        adding: u64,
        /// The group's limit.
        limit: u64,
    },
    /// A compare-and-set update of a group named a version other than the
    /// stored one, or brought a version not above it (Tair KVCM's rule).
    /// Nothing was changed.
    #[error(
        "instance group {group:?} version not match: current version in request {expected}, \
         request version {requested}, current version {stored}"
    )]
    VersionMismatch {
        /// Group name.
        group: String,
        /// The version the caller believed stored (`current_version`).
        expected: i64,
        /// The version the update brings.
        requested: i64,
        /// The version stored.
        stored: i64,
    },
    /// The write session is unknown: finished already, timed out, or never
    /// existed. Shown in hex, as clients send it.
    #[error("write session {0:016x} not found")]
    SessionNotFound(u64),
    /// A stored record could not be decoded.
    #[error("corrupt record for block {key:?}: {reason}")]
    Corrupt {
        /// Block whose record is bad (0 for control-plane records).
        key: BlockKey,
        /// What was wrong.
        reason: String,
    },
    /// Creating something whose name is taken (storage, group, account).
    #[error("{0} already exists")]
    AlreadyExists(String),
    /// Removing something that is still referenced (a storage listed by a
    /// group, a group with instances or accounts). Nothing was changed.
    #[error("{0} is in use")]
    InUse(String),
    /// No credentials, or an API key that matches no account.
    #[error("unauthenticated")]
    Unauthenticated,
    /// The caller is authenticated but its account may not do this.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The metadata store cannot write now (its disk is full, or a write
    /// failed and the store has not recovered yet). Nothing was changed;
    /// reads are still served, and writes are taken again once the cause
    /// is gone (the embedded store reopens itself).
    #[error("metadata store cannot write: {0}")]
    StoreUnwritable(String),
    /// A leader-only write from a frontend that no longer leads under the
    /// epoch it carried (docs/server.md §9). Nothing of it was applied.
    #[error("not the leader: the lease of epoch {0} is no longer held")]
    NotLeader(u64),
    /// The metadata backend failed.
    #[error("metadata backend: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl MetaError {
    /// Stable code name for the wire protocols.
    pub fn code(&self) -> &'static str {
        match self {
            MetaError::InvalidArgument(_) => "INVALID_ARGUMENT",
            MetaError::InstanceNotFound(_) => "INSTANCE_NOT_FOUND",
            MetaError::GroupNotFound(_) => "GROUP_NOT_FOUND",
            MetaError::StorageNotFound(_) => "STORAGE_NOT_FOUND",
            MetaError::AccountNotFound(_) => "ACCOUNT_NOT_FOUND",
            MetaError::InstanceConflict(_) => "INSTANCE_CONFLICT",
            MetaError::GroupFull(_) => "GROUP_FULL",
            MetaError::QuotaExceeded { .. } => "QUOTA_EXCEEDED",
            MetaError::NoAvailableStorage { .. } => "NO_AVAILABLE_STORAGE",
            MetaError::KeyCountExceeded { .. } => "KEY_COUNT_EXCEEDED",
            MetaError::VersionMismatch { .. } => "VERSION_MISMATCH",
            MetaError::SessionNotFound(_) => "SESSION_NOT_FOUND",
            MetaError::Corrupt { .. } => "CORRUPT",
            MetaError::AlreadyExists(_) => "ALREADY_EXISTS",
            MetaError::InUse(_) => "IN_USE",
            MetaError::Unauthenticated => "UNAUTHENTICATED",
            MetaError::PermissionDenied(_) => "PERMISSION_DENIED",
            MetaError::StoreUnwritable(_) => "STORE_UNWRITABLE",
            MetaError::NotLeader(_) => "NOT_LEADER",
            MetaError::Backend(_) => "BACKEND",
        }
    }

    pub(crate) fn backend(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        MetaError::Backend(Box::new(e))
    }
}

/// Result alias.
pub type Result<T, E = MetaError> = std::result::Result<T, E>;
