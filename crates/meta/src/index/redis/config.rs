//! [`RedisIndexConfig`]: namespace, pool size, lock sharding and timeouts.

use std::time::Duration;

/// How a [`super::RedisIndex`] talks to its server.
///
/// Every frontend sharing one namespace must use the same `lock_shards`:
/// it decides which lock key guards a block. (A mismatch cannot lose an
/// update, the `WATCH` fence still holds, but it turns lock waits into
/// [`super::RedisIndexError::Conflict`] errors.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisIndexConfig {
    /// Namespace: every key starts with `<prefix>:`. Several clusters can
    /// share one server under different prefixes. Must be non-empty and
    /// must not contain `:` (so no namespace is a prefix of another).
    pub prefix: String,
    /// Most connections open at once; callers beyond it wait up to
    /// [`RedisTimeouts::lock_wait`] for one to come back.
    pub pool_size: usize,
    /// Number of lock shards (rounded up to a power of two), shared by the
    /// in-process [`crate::index::ShardLocks`] and the server-side lock keys.
    pub lock_shards: usize,
    /// A read-modify-write chunk locks at most this many shards.
    pub batch_shards: usize,
    /// Connect, response and lock timeouts.
    pub timeouts: RedisTimeouts,
    /// The leader lease's epoch counter, when the lease lives on this
    /// server ([`crate::leader::RedisLease::epoch_key`]): fenced writes
    /// ([`crate::MetaIndex::modify_fenced`]) then `WATCH` it and commit only
    /// while it still holds their epoch. `None`: fenced writes check the
    /// fence in this process only.
    pub leader_epoch_key: Option<String>,
}

impl Default for RedisIndexConfig {
    /// Prefix `kvtier`, 8 connections, 256 lock shards, 16 per chunk.
    fn default() -> Self {
        RedisIndexConfig {
            prefix: "kvtier".into(),
            pool_size: 8,
            lock_shards: 256,
            batch_shards: 16,
            timeouts: RedisTimeouts::default(),
            leader_epoch_key: None,
        }
    }
}

/// Time limits, so that an unreachable or stuck server is an error, never a
/// hang.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisTimeouts {
    /// Opening a TCP connection.
    pub connect: Duration,
    /// Reading a reply or writing a request.
    pub response: Duration,
    /// Waiting for busy shard locks (and for a free pooled connection).
    pub lock_wait: Duration,
    /// Lease of a server-side shard lock: a frontend that dies holding one
    /// blocks its shards for at most this long. Must exceed the longest
    /// chunk (a few round trips plus the modifier).
    pub lock_lease: Duration,
}

impl Default for RedisTimeouts {
    /// 2 s connect, 5 s response, 5 s lock wait, 10 s lease.
    fn default() -> Self {
        RedisTimeouts {
            connect: Duration::from_secs(2),
            response: Duration::from_secs(5),
            lock_wait: Duration::from_secs(5),
            lock_lease: Duration::from_secs(10),
        }
    }
}
