//! [`RedisIndexError`]: what can go wrong talking to Redis/Valkey. Every
//! variant reaches callers as [`crate::MetaError::Backend`].

use std::time::Duration;

/// Failures of the Redis/Valkey backend.
#[derive(Debug, thiserror::Error)]
pub enum RedisIndexError {
    /// The configuration is unusable.
    #[error("invalid redis index config: {0}")]
    Config(String),
    /// The client or server reported an error (connection refused, timeout,
    /// dropped connection, server error reply).
    #[error("redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    /// Every pooled connection stayed busy for the whole wait.
    #[error("no free redis connection within {0:?}")]
    PoolExhausted(Duration),
    /// Shard locks stayed held by other callers for the whole wait.
    #[error("shard locks still busy after {0:?}")]
    LockTimeout(Duration),
    /// A watched key changed between read and commit although the shard
    /// lock was held: the lock lease ran out (a stall longer than
    /// `lock_lease`) or frontends disagree on `lock_shards`. Nothing of the
    /// chunk was applied.
    #[error("concurrent writer changed a locked key; chunk not applied")]
    Conflict,
    /// The server replied with something this backend never writes.
    #[error("unexpected redis reply: {0}")]
    Unexpected(String),
}

impl From<RedisIndexError> for crate::MetaError {
    fn from(e: RedisIndexError) -> Self {
        crate::MetaError::backend(e)
    }
}
