//! [`RedisIndex`]: the shared backend on Redis/Valkey, for several stateless
//! frontends (meta servers) serving one cluster from one server.
//!
//! # Key layout
//!
//! Every key starts with `<prefix>:` (the namespace, no `:` inside it), so
//! several clusters can share a server. Block keys are written as 8 bytes
//! big-endian, whose byte order is their numeric order.
//!
//! | key | type | holds |
//! | --- | --- | --- |
//! | `<p>:r:<instance>:<key8>` | string | the block record, [`crate::codec`] encoding |
//! | `<p>:z:<instance>` | sorted set, all scores 0 | the instance's block keys (`<key8>` members), ordered for `scan`, `sample`, `count` |
//! | `<p>:a:<instance>` | hash `<key8>` → `last_ms:reads` | access statistics recorded since the record was last written |
//! | `<p>:lock:<shard>` | string with a lease (`PX`) | the server-side lock of one shard, holding its holder's random token |
//! | `<p>:c:<kind>` | hash name → bytes | control-plane records of one [`RecordKind`] |
//!
//! The write ledger of the frontends ([`RedisLedger`]) keeps its keys under
//! the same prefix (`<p>:s:`, `<p>:sessions:`, `<p>:q:`, `<p>:ledger:`).
//!
//! One string per record (rather than one hash per instance) lets `WATCH`
//! fence exactly the keys a chunk read.
//!
//! # Read-modify-write across frontends
//!
//! A [`MetaIndex::modify`] chunk (at most `batch_shards` shards of
//! `lock_shards`, as in every backend) runs:
//!
//! 1. the in-process [`ShardLocks`], so this frontend's own threads queue
//!    in memory instead of on the server;
//! 2. the chunk's server-side shard locks, all or none, in one Lua call
//!    (retried with backoff up to `lock_wait`); a lock is a lease, so a
//!    frontend that dies holding it blocks its shards for at most
//!    `lock_lease`;
//! 3. one round trip: `WATCH` the lock and record keys, `MGET` the records,
//!    `HMGET` their statistics;
//! 4. the modifier, exactly once per key (locks, not optimistic retries,
//!    because modifiers have side effects such as counting freed bytes);
//! 5. one round trip: `MULTI`, the writes, `DEL` of the lock keys, `EXEC`.
//!
//! The `WATCH` is a fence: if a lease ran out during a stall and another
//! writer changed a key or took a lock, `EXEC` applies nothing and the
//! call fails with [`RedisIndexError::Conflict`] (earlier chunks stay
//! applied, as the trait allows); an update is never lost. `put` and
//! `delete` take the same locks and commit the same way. Reads (`get`,
//! `scan`, `sample`, `count`) take no lock; `get` reads records and
//! statistics in one `MULTI`/`EXEC`, a consistent snapshot.
//!
//! # Access statistics
//!
//! [`MetaIndex::touch`] never rewrites a record (it could overwrite a
//! concurrent `modify` with stale locations). A Lua script bumps the
//! record's entry in the statistics hash, for records that exist, in one
//! round trip and without locks; `get` folds the entry into the record.
//! Writing a record (`put`, or a `modify` that puts) folds the statistics
//! the writer saw into the record and clears the entry; a touch that lands
//! between a modify's read and its commit is lost, which the trait allows
//! for these hints.
//!
//! Not supported: Redis Cluster (multi-key transactions span hash slots),
//! `rediss://` (TLS would add a TLS stack to the build).

mod config;
mod error;
mod keys;
mod ledger;
mod pool;
mod scripts;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::redis::{Cmd, ErrorKind, ServerErrorKind, Value, cmd, pipe};
use rand::Rng;

pub use config::{RedisIndexConfig, RedisTimeouts};
pub use error::RedisIndexError;
use keys::{Keys, key_of_member, member};
pub use ledger::RedisLedger;
use pool::{Pool, Pooled};
use scripts::{Scripts, Stats};

use super::{AccessHit, Fence, MetaIndex, Modifier, Modify, RecordKind, ShardLocks};
use crate::codec::{decode_block, encode_block};
use crate::error::{MetaError, Result};
use crate::model::{BlockKey, BlockMeta};

/// Keys per `MGET`/script call outside lock chunks, and per page of
/// `drop_instance`: bounds one command's size and server time.
const PAGE: usize = 1024;

/// [`MetaIndex`] on a Redis/Valkey server shared by several frontends.
#[derive(Debug)]
pub struct RedisIndex {
    keys: Keys,
    pool: Arc<Pool>,
    locks: ShardLocks,
    scripts: Scripts,
    config: RedisIndexConfig,
}

impl RedisIndex {
    /// Connects to `url` (`redis://[user:password@]host:port[/db]`) and
    /// checks that the server answers.
    pub fn open(url: &str, config: RedisIndexConfig) -> Result<Self> {
        if config.prefix.is_empty() || config.prefix.contains(':') {
            return Err(RedisIndexError::Config(format!(
                "prefix {:?} must be non-empty and contain no ':'",
                config.prefix
            ))
            .into());
        }
        let client = ::redis::Client::open(url).map_err(RedisIndexError::from)?;
        let idx = RedisIndex {
            keys: Keys::new(&config.prefix),
            pool: Arc::new(Pool::new(client, config.pool_size, config.timeouts)),
            locks: ShardLocks::new(config.lock_shards, config.batch_shards),
            scripts: Scripts::new(),
            config,
        };
        idx.ping()?;
        Ok(idx)
    }

    /// Round trip to the server (health check).
    pub fn ping(&self) -> Result<()> {
        let mut conn = self.pool.get()?;
        conn.run(|c| cmd("PING").query::<String>(c))?;
        Ok(())
    }

    /// The write ledger of the frontends sharing this index, on the same
    /// server and connection pool, under the same prefix.
    pub fn ledger(&self) -> RedisLedger {
        RedisLedger::new(self.pool.clone(), self.keys.clone())
    }

    /// The configuration this index was opened with.
    pub fn config(&self) -> &RedisIndexConfig {
        &self.config
    }

    /// The server-side lock keys of `chunk`'s shards, ascending.
    fn lock_keys(&self, instance: &str, chunk: &[BlockKey]) -> Vec<Vec<u8>> {
        let mut shards: Vec<usize> = chunk
            .iter()
            .map(|&k| self.locks.shard_of(instance, k))
            .collect();
        shards.sort_unstable();
        shards.dedup();
        shards.into_iter().map(|s| self.keys.lock(s)).collect()
    }

    /// Takes all of `locks` for a fresh token, retrying with backoff while
    /// another frontend holds one of them, up to `lock_wait`. `then` rides
    /// in the same round trip as each attempt; its replies are returned
    /// from the attempt that took the locks (a `WATCH` in it is undone
    /// before the next attempt).
    fn acquire(
        &self,
        conn: &mut Pooled<'_>,
        locks: &[Vec<u8>],
        then: &[Cmd],
    ) -> Result<(String, Vec<Value>), RedisIndexError> {
        let token = format!("{:032x}", rand::rng().random::<u128>());
        let lease_ms = self.config.timeouts.lock_lease.as_millis().max(1) as u64;
        let wait = self.config.timeouts.lock_wait;
        let deadline = Instant::now() + wait;
        let mut backoff = Duration::from_micros(100);
        let mut retry = false;
        loop {
            let mut p = pipe();
            if retry {
                p.cmd("UNWATCH").ignore();
            }
            retry = true;
            p.cmd("EVALSHA")
                .arg(self.scripts.acquire.get_hash())
                .arg(locks.len())
                .arg(locks)
                .arg(&token)
                .arg(lease_ms);
            for c in then {
                p.add_command(c.clone());
            }
            match conn.run(|c| p.query::<Vec<Value>>(c)) {
                Ok(replies) => {
                    let mut replies = replies.into_iter();
                    match replies.next() {
                        Some(Value::Int(1)) => return Ok((token, replies.collect())),
                        Some(Value::Int(0)) => {}
                        other => {
                            return Err(RedisIndexError::Unexpected(format!(
                                "lock script -> {other:?}"
                            )));
                        }
                    }
                }
                // First use on this server (or after a restart): load the
                // script and try again at once.
                Err(RedisIndexError::Redis(e))
                    if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
                {
                    conn.run(|c| self.scripts.acquire.load(c))?;
                    continue;
                }
                Err(e) => return Err(e),
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(RedisIndexError::LockTimeout(wait));
            }
            // Jitter so that frontends waiting on the same shard do not
            // retry in lockstep.
            let jitter = rand::rng().random_range(0..=backoff.as_micros() as u64);
            std::thread::sleep((backoff + Duration::from_micros(jitter)).min(deadline - now));
            backoff = (backoff * 2).min(Duration::from_millis(5));
        }
    }

    /// Runs one lock chunk: takes the server-side locks (sending `then`
    /// along, see [`RedisIndex::acquire`]) and runs `body` with `then`'s
    /// replies; `body` must end with [`RedisIndex::commit`], which releases
    /// the locks. On error the locks are released here, if still ours.
    fn locked<T>(
        &self,
        instance: &str,
        chunk: &[BlockKey],
        then: impl FnOnce(&[Vec<u8>]) -> Vec<Cmd>,
        body: impl FnOnce(&mut Pooled<'_>, &[Vec<u8>], Vec<Value>) -> Result<T>,
    ) -> Result<T> {
        let locks = self.lock_keys(instance, chunk);
        let mut conn = self.pool.get()?;
        let (token, replies) = self.acquire(&mut conn, &locks, &then(&locks))?;
        let result = body(&mut conn, &locks, replies);
        if let Err(e) = &result {
            tracing::warn!(instance, error = %e, "redis lock chunk failed; releasing its locks");
            // The connection may still hold a WATCH: retire it, and release
            // on a fresh one. Best effort: the lease expires anyway.
            conn.retire();
            drop(conn);
            if let Ok(mut conn) = self.pool.get() {
                let _ = conn.run(|c| {
                    self.scripts
                        .release
                        .key(&locks)
                        .arg(&token)
                        .invoke::<i64>(c)
                });
            }
        }
        result
    }

    /// One round trip: `[WATCH watch]`, `MULTI`, `cmds`, `DEL locks`, `EXEC`.
    /// Returns the replies of `cmds`, or [`RedisIndexError::Conflict`] when
    /// a watched key changed (nothing applied).
    fn commit(
        &self,
        conn: &mut Pooled<'_>,
        watch: Option<&[Vec<u8>]>,
        cmds: Vec<Cmd>,
        locks: &[Vec<u8>],
    ) -> Result<Vec<Value>, RedisIndexError> {
        let mut p = pipe();
        if let Some(watch) = watch {
            p.cmd("WATCH").arg(watch).ignore();
        }
        p.cmd("MULTI").ignore();
        for c in cmds {
            p.add_command(c).ignore();
        }
        p.cmd("DEL").arg(locks).ignore();
        p.cmd("EXEC");
        let (exec,): (Value,) = conn.run(|c| p.query(c))?;
        match exec {
            Value::Nil => Err(RedisIndexError::Conflict),
            Value::Array(mut replies) => {
                replies.pop(); // the DEL of the locks
                if let Some(Value::ServerError(e)) =
                    replies.iter().find(|v| matches!(v, Value::ServerError(_)))
                {
                    return Err(RedisIndexError::Unexpected(format!("{e:?}")));
                }
                Ok(replies)
            }
            other => Err(RedisIndexError::Unexpected(format!("EXEC -> {other:?}"))),
        }
    }

    /// [`MetaIndex::modify`], fenced by `fence` when given (see
    /// [`MetaIndex::modify_fenced`]).
    fn modify_chunks(
        &self,
        instance: &str,
        keys: &[BlockKey],
        fence: Option<&Fence>,
        f: &mut Modifier<'_>,
    ) -> Result<()> {
        let epoch_key = fence.and(self.config.leader_epoch_key.as_deref());
        self.locks.for_each_chunk(instance, keys, |chunk| {
            let records: Vec<Vec<u8>> = chunk
                .iter()
                .map(|&k| self.keys.record(instance, k))
                .collect();
            // Fence, then read: the WATCH precedes the reads, so any write
            // to these keys (or a new lease epoch) after the read aborts
            // the commit.
            let read = |locks: &[Vec<u8>]| {
                let mut watch = cmd("WATCH");
                watch.arg(locks).arg(&records).arg(epoch_key);
                let mut mget = cmd("MGET");
                mget.arg(&records);
                let mut hmget = cmd("HMGET");
                hmget.arg(self.keys.stats(instance));
                for &k in chunk {
                    hmget.arg(&member(k)[..]);
                }
                let mut cmds = vec![watch, mget, hmget];
                if let Some(key) = epoch_key {
                    let mut get = cmd("GET");
                    get.arg(key);
                    cmds.push(get);
                }
                cmds
            };
            self.locked(instance, chunk, read, |conn, locks, replies| {
                let mut replies = replies.into_iter();
                let (Some(_), Some(values), Some(stats)) =
                    (replies.next(), replies.next(), replies.next())
                else {
                    return Err(RedisIndexError::Unexpected(
                        "WATCH/MGET/HMGET: missing replies".into(),
                    )
                    .into());
                };
                if let Some(fence) = fence {
                    fence.check()?;
                    if epoch_key.is_some() {
                        let current: Option<u64> = parse(replies.next().unwrap_or(Value::Nil))?;
                        if current != Some(fence.epoch()) {
                            return Err(MetaError::NotLeader(fence.epoch()));
                        }
                    }
                }
                let values: Vec<Option<Vec<u8>>> = parse(values)?;
                let stats: Vec<Option<Vec<u8>>> = parse(stats)?;
                let mut puts = Vec::new();
                let mut deletes = Vec::new();
                for ((&k, v), s) in chunk.iter().zip(values).zip(stats) {
                    match f(k, Self::merge(k, v, s)?) {
                        Modify::Keep => {}
                        Modify::Put(m) => puts.push(BlockMeta { key: k, ..m }),
                        Modify::Delete => deletes.push(k),
                    }
                }
                let put_refs: Vec<&BlockMeta> = puts.iter().collect();
                let mut cmds = self.put_cmds(instance, &put_refs);
                cmds.extend(self.delete_cmds(instance, &deletes));
                self.commit(conn, None, cmds, locks)?;
                Ok(())
            })
        })
    }

    /// Decodes a record and folds its pending statistics in.
    fn merge(
        key: BlockKey,
        record: Option<Vec<u8>>,
        stats: Option<Vec<u8>>,
    ) -> Result<Option<BlockMeta>> {
        let Some(bytes) = record else {
            return Ok(None);
        };
        let mut meta = decode_block(key, &bytes)?;
        if let Some(s) = stats.as_deref().and_then(Stats::parse) {
            s.apply(&mut meta);
        }
        Ok(Some(meta))
    }

    /// Commands storing `metas` (keys already set) and clearing their
    /// statistics.
    fn put_cmds(&self, instance: &str, metas: &[&BlockMeta]) -> Vec<Cmd> {
        if metas.is_empty() {
            return Vec::new();
        }
        let mut mset = cmd("MSET");
        let mut zadd = cmd("ZADD");
        zadd.arg(self.keys.order(instance));
        let mut hdel = cmd("HDEL");
        hdel.arg(self.keys.stats(instance));
        for m in metas {
            mset.arg(self.keys.record(instance, m.key))
                .arg(encode_block(m));
            zadd.arg(0).arg(&member(m.key)[..]);
            hdel.arg(&member(m.key)[..]);
        }
        vec![mset, zadd, hdel]
    }

    /// Commands removing `keys`; the first one's reply is how many existed.
    fn delete_cmds(&self, instance: &str, keys: &[BlockKey]) -> Vec<Cmd> {
        if keys.is_empty() {
            return Vec::new();
        }
        let mut del = cmd("DEL");
        let mut zrem = cmd("ZREM");
        zrem.arg(self.keys.order(instance));
        let mut hdel = cmd("HDEL");
        hdel.arg(self.keys.stats(instance));
        for &k in keys {
            del.arg(self.keys.record(instance, k));
            zrem.arg(&member(k)[..]);
            hdel.arg(&member(k)[..]);
        }
        vec![del, zrem, hdel]
    }

    /// Block keys of `instance` from lexicographic bound `min`, at most
    /// `limit`.
    fn range(
        &self,
        conn: &mut Pooled<'_>,
        instance: &str,
        min: &[u8],
        limit: usize,
    ) -> Result<Vec<BlockKey>> {
        let members: Vec<Vec<u8>> = conn.run(|c| {
            cmd("ZRANGEBYLEX")
                .arg(self.keys.order(instance))
                .arg(min)
                .arg("+")
                .arg("LIMIT")
                .arg(0)
                .arg(limit.min(i64::MAX as usize))
                .query(c)
        })?;
        members.iter().map(|m| parse_member(m)).collect()
    }
}

fn parse_member(bytes: &[u8]) -> Result<BlockKey> {
    key_of_member(bytes)
        .ok_or_else(|| RedisIndexError::Unexpected(format!("sorted-set member {bytes:?}")).into())
}

fn parse<T: ::redis::FromRedisValue>(v: Value) -> Result<T> {
    ::redis::from_redis_value(v).map_err(|e| RedisIndexError::Unexpected(e.to_string()).into())
}

fn reply_int(v: Option<&Value>) -> Result<u64> {
    match v {
        Some(Value::Int(n)) => Ok((*n).max(0) as u64),
        other => {
            Err(RedisIndexError::Unexpected(format!("expected an integer, got {other:?}")).into())
        }
    }
}

impl MetaIndex for RedisIndex {
    fn get(&self, instance: &str, keys: &[BlockKey]) -> Result<Vec<Option<BlockMeta>>> {
        let mut out = Vec::with_capacity(keys.len());
        let mut conn = self.pool.get()?;
        for page in keys.chunks(PAGE) {
            let records: Vec<Vec<u8>> = page
                .iter()
                .map(|&k| self.keys.record(instance, k))
                .collect();
            let fields: Vec<[u8; 8]> = page.iter().map(|&k| member(k)).collect();
            let mut hmget = cmd("HMGET");
            hmget.arg(self.keys.stats(instance));
            for f in &fields {
                hmget.arg(&f[..]);
            }
            type Reply = (Vec<Option<Vec<u8>>>, Vec<Option<Vec<u8>>>);
            let (values, stats): Reply = conn.run(|c| {
                pipe()
                    .atomic()
                    .cmd("MGET")
                    .arg(&records)
                    .add_command(hmget)
                    .query(c)
            })?;
            for ((&k, v), s) in page.iter().zip(values).zip(stats) {
                out.push(Self::merge(k, v, s)?);
            }
        }
        Ok(out)
    }

    fn put(&self, instance: &str, metas: &[BlockMeta]) -> Result<()> {
        let keys: Vec<BlockKey> = metas.iter().map(|m| m.key).collect();
        let by_key: HashMap<BlockKey, &BlockMeta> = metas.iter().map(|m| (m.key, m)).collect();
        self.locks.for_each_chunk(instance, &keys, |chunk| {
            let batch: Vec<&BlockMeta> = chunk
                .iter()
                .filter_map(|k| by_key.get(k).copied())
                .collect();
            self.locked(
                instance,
                chunk,
                |_| Vec::new(),
                |conn, locks, _| {
                    self.commit(conn, Some(locks), self.put_cmds(instance, &batch), locks)?;
                    Ok(())
                },
            )
        })
    }

    fn delete(&self, instance: &str, keys: &[BlockKey]) -> Result<usize> {
        let mut n = 0u64;
        self.locks.for_each_chunk(instance, keys, |chunk| {
            self.locked(
                instance,
                chunk,
                |_| Vec::new(),
                |conn, locks, _| {
                    let replies =
                        self.commit(conn, Some(locks), self.delete_cmds(instance, chunk), locks)?;
                    n += reply_int(replies.first())?;
                    Ok(())
                },
            )
        })?;
        Ok(n as usize)
    }

    fn modify(&self, instance: &str, keys: &[BlockKey], f: &mut Modifier<'_>) -> Result<()> {
        self.modify_chunks(instance, keys, None, f)
    }

    /// Also fences on the server when the lease's epoch counter is here:
    /// each chunk `WATCH`es it with its records and reads it with them, so
    /// a chunk is refused if another frontend took the lease before the
    /// read and not applied if one took it before the commit.
    fn modify_fenced(
        &self,
        instance: &str,
        keys: &[BlockKey],
        fence: &Fence,
        f: &mut Modifier<'_>,
    ) -> Result<()> {
        fence.check()?;
        self.modify_chunks(instance, keys, Some(fence), f)
    }

    /// One Lua call per page of keys, without locks: bumps the statistics
    /// entry of each existing record (see the module doc).
    fn touch(&self, instance: &str, hits: &[AccessHit]) -> Result<()> {
        let merged: Vec<AccessHit> = AccessHit::merge(hits).into_values().collect();
        let mut conn = self.pool.get()?;
        let stats = self.keys.stats(instance);
        for page in merged.chunks(PAGE) {
            let mut call = self.scripts.touch.key(&stats);
            for h in page {
                call.key(self.keys.record(instance, h.key))
                    .arg(&member(h.key)[..])
                    .arg(h.last_ms.to_string())
                    .arg(h.count);
            }
            conn.run(|c| call.invoke::<i64>(c))?;
        }
        Ok(())
    }

    fn scan(&self, instance: &str, after: Option<BlockKey>, limit: usize) -> Result<Vec<BlockKey>> {
        let min = match after {
            _ if limit == 0 => return Ok(Vec::new()),
            Some(BlockKey(u64::MAX)) => return Ok(Vec::new()),
            Some(a) => [&b"("[..], &member(a)[..]].concat(),
            None => b"-".to_vec(),
        };
        let mut conn = self.pool.get()?;
        self.range(&mut conn, instance, &min, limit)
    }

    /// Picks in rounds of one pipelined round trip each: one
    /// `ZRANGEBYLEX [point + LIMIT 0 1` per missing pick (the first key at
    /// or after a random point, wrapping to the first key).
    fn sample(&self, instance: &str, count: usize) -> Result<Vec<BlockMeta>> {
        let mut conn = self.pool.get()?;
        let order = self.keys.order(instance);
        let len: u64 = conn.run(|c| cmd("ZCARD").arg(&order).query(c))?;
        let want = count.min(usize::try_from(len).unwrap_or(usize::MAX));
        let mut picked: BTreeMap<BlockKey, ()> = BTreeMap::new();
        let mut tries = 0;
        let mut rng = rand::rng();
        while picked.len() < want && tries < want * 4 + 8 {
            let round = (want - picked.len()).min(want * 4 + 8 - tries);
            tries += round;
            let mut p = pipe();
            p.cmd("ZRANGEBYLEX")
                .arg(&order)
                .arg("-")
                .arg("+")
                .arg("LIMIT")
                .arg(0)
                .arg(1);
            for _ in 0..round {
                let at = [&b"["[..], &member(BlockKey(rng.random()))[..]].concat();
                p.cmd("ZRANGEBYLEX")
                    .arg(&order)
                    .arg(at)
                    .arg("+")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(1);
            }
            let replies: Vec<Vec<Vec<u8>>> = conn.run(|c| p.query(c))?;
            let mut replies = replies.into_iter();
            let first = replies.next().unwrap_or_default();
            for hit in replies {
                if let Some(m) = hit.first().or(first.first()) {
                    picked.insert(parse_member(m)?, ());
                }
            }
        }
        drop(conn);
        let keys: Vec<BlockKey> = picked.into_keys().collect();
        // A record deleted since it was picked is skipped.
        Ok(self.get(instance, &keys)?.into_iter().flatten().collect())
    }

    fn count(&self, instance: &str) -> Result<u64> {
        let mut conn = self.pool.get()?;
        Ok(conn.run(|c| cmd("ZCARD").arg(self.keys.order(instance)).query(c))?)
    }

    /// Removes the records in pages of 1,024, each page one transaction;
    /// records put while it runs may survive (callers stop writers first).
    fn drop_instance(&self, instance: &str) -> Result<u64> {
        let mut conn = self.pool.get()?;
        let mut total = 0;
        loop {
            let page = self.range(&mut conn, instance, b"-", PAGE)?;
            if page.is_empty() {
                break;
            }
            let mut p = pipe();
            p.atomic();
            for c in self.delete_cmds(instance, &page) {
                p.add_command(c);
            }
            let replies: Vec<Value> = conn.run(|c| p.query(c))?;
            total += reply_int(replies.first())?;
        }
        conn.run(|c| cmd("DEL").arg(self.keys.stats(instance)).query::<i64>(c))?;
        Ok(total)
    }

    fn get_record(&self, kind: RecordKind, name: &str) -> Result<Option<Vec<u8>>> {
        let mut conn = self.pool.get()?;
        Ok(conn.run(|c| cmd("HGET").arg(self.keys.records(kind)).arg(name).query(c))?)
    }

    fn put_record(&self, kind: RecordKind, name: &str, value: &[u8]) -> Result<()> {
        let mut conn = self.pool.get()?;
        conn.run(|c| {
            cmd("HSET")
                .arg(self.keys.records(kind))
                .arg(name)
                .arg(value)
                .query::<i64>(c)
        })?;
        Ok(())
    }

    fn delete_record(&self, kind: RecordKind, name: &str) -> Result<bool> {
        let mut conn = self.pool.get()?;
        let n: i64 = conn.run(|c| cmd("HDEL").arg(self.keys.records(kind)).arg(name).query(c))?;
        Ok(n > 0)
    }

    fn list_records(&self, kind: RecordKind) -> Result<Vec<(String, Vec<u8>)>> {
        let mut conn = self.pool.get()?;
        let all: BTreeMap<Vec<u8>, Vec<u8>> =
            conn.run(|c| cmd("HGETALL").arg(self.keys.records(kind)).query(c))?;
        all.into_iter()
            .map(|(name, value)| {
                let name = String::from_utf8(name).map_err(|_| MetaError::Corrupt {
                    key: BlockKey(0),
                    reason: format!("{} record name is not UTF-8", kind.prefix()),
                })?;
                Ok((name, value))
            })
            .collect()
    }
}
