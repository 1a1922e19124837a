//! [`RedisLedger`]: the [`Ledger`] of frontends that share one Redis/Valkey
//! index, kept on the same server under the same prefix (key layout in
//! [`super::keys::Keys`] and docs/meta-api.md §9.1).
//!
//! Every change is one atomic step on the server: a Lua script, or for
//! [`Ledger::open`] a `WATCH` of the group's usage hash, the choice in
//! Rust (the one quota policy, `service::quota`), and a script inside
//! `MULTI`/`EXEC` that charges and records the session; another frontend's
//! change to the usage in between aborts the `EXEC`, and the choice is
//! made again. Deadlines and claims are in the server's clock (`TIME`), so
//! frontends' clocks need not agree.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use ::redis::{Script, Value, cmd, pipe};

use super::error::RedisIndexError;
use super::keys::{Keys, kind_field};
use super::pool::Pool;
use crate::codec::{decode_session, encode_session};
use crate::error::Result;
use crate::ledger::{Chooser, GroupUsage, Ledger, SessionId, SessionRecord};
use crate::model::StorageKind;

/// How many times [`Ledger::open`] chooses again after other frontends
/// changed the group's usage, before giving up with
/// [`RedisIndexError::Conflict`].
const OPEN_TRIES: usize = 64;

/// The server's clock in ms, and usage subtraction floored at zero.
/// Amounts travel as decimal strings, never as Lua numbers, so they stay
/// exact.
const PRELUDE: &str = r"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function ms(x) return string.format('%d', x) end
local function sub(q, field, n)
  if redis.call('HINCRBY', q, field, '-' .. n) < 0 then redis.call('HSET', q, field, 0) end
end
";

/// KEYS: session, due, held, usage. ARGV: id, record, timeout ms, kind
/// field, charge, held (1/0). Records the session and charges it.
const OPEN: &str = r"
local due = ms(now_ms() + tonumber(ARGV[3]))
redis.call('HSET', KEYS[1], 'r', ARGV[2], 'd', due)
redis.call('ZADD', KEYS[2], due, ARGV[1])
if ARGV[6] == '1' then redis.call('SADD', KEYS[3], ARGV[1]) end
if ARGV[5] ~= '0' then
  redis.call('HINCRBY', KEYS[4], 'total', ARGV[5])
  redis.call('HINCRBY', KEYS[4], ARGV[4], ARGV[5])
end
return 1
";

/// KEYS: session, due, held, usage. ARGV: id, record, timeout ms, kind
/// field, bytes released, held (1/0). Only an open, unclaimed session.
const NARROW: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HEXISTS', KEYS[1], 'c') == 1 then
  return 0
end
local due = ms(now_ms() + tonumber(ARGV[3]))
redis.call('HSET', KEYS[1], 'r', ARGV[2], 'd', due)
redis.call('ZADD', KEYS[2], due, ARGV[1])
if ARGV[6] == '0' then redis.call('SREM', KEYS[3], ARGV[1]) end
if ARGV[5] ~= '0' then
  sub(KEYS[4], 'total', ARGV[5])
  sub(KEYS[4], ARGV[4], ARGV[5])
end
return 1
";

/// KEYS: session, due. ARGV: id, lease ms. The record, or nil when absent
/// or claimed by someone else.
const CLAIM: &str = r"
local now = now_ms()
local r = redis.call('HGET', KEYS[1], 'r')
if not r then return false end
local c = redis.call('HGET', KEYS[1], 'c')
if c and tonumber(c) > now then return false end
local till = ms(now + tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 'c', till)
redis.call('ZADD', KEYS[2], till, ARGV[1])
return r
";

/// KEYS: session, due. ARGV: id, extension ms ('' keeps the deadline).
const UNCLAIM: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[1], 'c')
local d = redis.call('HGET', KEYS[1], 'd')
if ARGV[2] ~= '' then
  d = ms(now_ms() + tonumber(ARGV[2]))
  redis.call('HSET', KEYS[1], 'd', d)
end
redis.call('ZADD', KEYS[2], d, ARGV[1])
return 1
";

/// KEYS: due. ARGV: session key prefix, lease ms, limit. Claims sessions
/// due now; returns id, record, id, record, ... A due entry without a
/// session is dropped.
const CLAIM_EXPIRED: &str = r"
local now = now_ms()
local till = ms(now + tonumber(ARGV[2]))
local out = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, ARGV[3])) do
  local k = ARGV[1] .. id
  local r = redis.call('HGET', k, 'r')
  if r then
    redis.call('HSET', k, 'c', till)
    redis.call('ZADD', KEYS[1], till, id)
    out[#out + 1] = id
    out[#out + 1] = r
  else
    redis.call('ZREM', KEYS[1], id)
  end
end
return out
";

/// KEYS: session, due, held, usage. ARGV: id, kind field, bytes released.
/// Forgets the session and releases, only if it was still there.
const CLOSE: &str = r"
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('SREM', KEYS[3], ARGV[1])
if ARGV[3] ~= '0' then
  sub(KEYS[4], 'total', ARGV[3])
  sub(KEYS[4], ARGV[2], ARGV[3])
end
return 1
";

/// KEYS: usage. ARGV: kind field, bytes.
const RELEASE: &str = r"
sub(KEYS[1], 'total', ARGV[2])
sub(KEYS[1], ARGV[1], ARGV[2])
return 1
";

/// KEYS: built, then one usage hash per group. ARGV: per group, the number
/// of (field, bytes) pairs, then the pairs. Adds them unless built.
const INSTALL: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local a = 1
for i = 2, #KEYS do
  local n = tonumber(ARGV[a])
  a = a + 1
  for _ = 1, n do
    redis.call('HINCRBY', KEYS[i], ARGV[a], ARGV[a + 1])
    a = a + 2
  end
end
redis.call('SET', KEYS[1], '1')
return 1
";

/// The scripts, hashed once.
#[derive(Debug)]
struct Scripts {
    open: String,
    narrow: Script,
    claim: Script,
    unclaim: Script,
    claim_expired: Script,
    close: Script,
    release: Script,
    install: Script,
}

impl Scripts {
    fn new() -> Self {
        let with = |body: &str| format!("{PRELUDE}{body}");
        Scripts {
            // Sent with EVAL inside MULTI, where EVALSHA's retry on
            // NOSCRIPT cannot run.
            open: with(OPEN),
            narrow: Script::new(&with(NARROW)),
            claim: Script::new(&with(CLAIM)),
            unclaim: Script::new(&with(UNCLAIM)),
            claim_expired: Script::new(&with(CLAIM_EXPIRED)),
            close: Script::new(&with(CLOSE)),
            release: Script::new(&with(RELEASE)),
            install: Script::new(&with(INSTALL)),
        }
    }
}

/// The ledger on the index's Redis/Valkey server; get one with
/// [`super::RedisIndex::ledger`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RedisLedger {
    pool: Arc<Pool>,
    keys: Keys,
    scripts: Arc<Scripts>,
}

impl RedisLedger {
    pub(super) fn new(pool: Arc<Pool>, keys: Keys) -> Self {
        RedisLedger {
            pool,
            keys,
            scripts: Arc::new(Scripts::new()),
        }
    }

    /// The four keys a session's scripts touch: the session, the due set,
    /// the held set and its group's usage.
    fn session_keys(&self, id: SessionId, group: &str) -> [Vec<u8>; 4] {
        [
            self.keys.session(id),
            self.keys.sessions_due(),
            self.keys.sessions_held(),
            self.keys.usage(group),
        ]
    }

    /// One `WATCH`ed attempt of [`Ledger::open`]: `Ok(false)` when another
    /// frontend changed the usage first (nothing applied).
    fn try_open(
        &self,
        id: SessionId,
        session: &mut SessionRecord,
        timeout: Duration,
        choose: &mut Chooser<'_>,
    ) -> Result<bool> {
        let keys = self.session_keys(id, &session.group);
        let mut conn = self.pool.get()?;
        let fields: HashMap<String, String> = conn.run(|c| {
            cmd("WATCH").arg(&keys[3]).query::<()>(c)?;
            cmd("HGETALL").arg(&keys[3]).query(c)
        })?;
        let usage = parse_usage(&fields)?;
        session.kind = match choose(&usage) {
            Ok(kind) => kind,
            Err(e) => {
                conn.run(|c| cmd("UNWATCH").query::<()>(c))?;
                return Err(e);
            }
        };
        let mut p = pipe();
        p.atomic()
            .cmd("EVAL")
            .arg(&self.scripts.open)
            .arg(4)
            .arg(&keys[..])
            .arg(id.to_string())
            .arg(encode_session(session))
            .arg(timeout.as_millis().to_string())
            .arg(kind_field(session.kind))
            .arg(session.charge().to_string())
            .arg(held_flag(session));
        let exec: Value = conn.run(|c| p.query(c))?;
        match exec {
            Value::Nil => Ok(false),
            Value::Array(replies) if !replies.iter().any(is_error) => Ok(true),
            other => Err(RedisIndexError::Unexpected(format!("EXEC -> {other:?}")).into()),
        }
    }

    /// Decodes the `id, record, ...` pairs [`CLAIM_EXPIRED`] returns.
    fn parse_claimed(values: Vec<Vec<u8>>) -> Result<Vec<(SessionId, SessionRecord)>> {
        values
            .chunks(2)
            .map(|pair| {
                let [id, record] = pair else {
                    return Err(unexpected("odd reply of the reaper's claim"));
                };
                let id = parse_id(id)?;
                Ok((id, decode_session(id.0, record)?))
            })
            .collect()
    }
}

/// Whether an `EXEC` reply is an error.
fn is_error(v: &Value) -> bool {
    matches!(v, Value::ServerError(_))
}

fn unexpected(what: &str) -> crate::MetaError {
    RedisIndexError::Unexpected(what.to_owned()).into()
}

/// `1` when the session holds targets (it belongs in the held set).
fn held_flag(s: &SessionRecord) -> &'static str {
    if s.targets.is_empty() { "0" } else { "1" }
}

fn parse_id(bytes: &[u8]) -> Result<SessionId> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| u64::from_str_radix(s, 16).ok())
        .map(SessionId)
        .ok_or_else(|| unexpected("session id"))
}

/// A usage hash's fields as a [`GroupUsage`]; fields of kinds this build
/// does not know are left out.
fn parse_usage(fields: &HashMap<String, String>) -> Result<GroupUsage> {
    let mut usage = GroupUsage::default();
    for (field, value) in fields {
        // A negative value would be a bug elsewhere; it counts as zero.
        let bytes = value
            .parse::<i64>()
            .map_err(|_| unexpected("usage value"))?
            .max(0) as u64;
        if field == "total" {
            usage.total = bytes;
        } else if let Some(kind) = field
            .strip_prefix('k')
            .and_then(|t| t.parse().ok())
            .and_then(StorageKind::from_tag)
        {
            usage.by_kind.insert(kind, bytes);
        }
    }
    Ok(usage)
}

impl Ledger for RedisLedger {
    fn is_shared(&self) -> bool {
        true
    }

    fn usage(&self, group: &str) -> Result<GroupUsage> {
        let mut conn = self.pool.get()?;
        let fields: HashMap<String, String> =
            conn.run(|c| cmd("HGETALL").arg(self.keys.usage(group)).query(c))?;
        parse_usage(&fields)
    }

    fn charge(&self, group: &str, kind: StorageKind, bytes: u64) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let key = self.keys.usage(group);
        let mut p = pipe();
        p.atomic()
            .cmd("HINCRBY")
            .arg(&key)
            .arg("total")
            .arg(bytes.to_string())
            .ignore()
            .cmd("HINCRBY")
            .arg(&key)
            .arg(kind_field(kind))
            .arg(bytes.to_string())
            .ignore();
        let mut conn = self.pool.get()?;
        conn.run(|c| p.query::<()>(c))?;
        Ok(())
    }

    fn release(&self, group: &str, kind: StorageKind, bytes: u64) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let mut call = self.scripts.release.key(self.keys.usage(group));
        call.arg(kind_field(kind)).arg(bytes.to_string());
        let mut conn = self.pool.get()?;
        conn.run(|c| call.invoke::<i64>(c))?;
        Ok(())
    }

    fn open(
        &self,
        id: SessionId,
        session: &mut SessionRecord,
        timeout: Duration,
        choose: &mut Chooser<'_>,
    ) -> Result<()> {
        for _ in 0..OPEN_TRIES {
            if self.try_open(id, session, timeout, choose)? {
                return Ok(());
            }
        }
        Err(RedisIndexError::Conflict.into())
    }

    fn narrow(
        &self,
        id: SessionId,
        session: &SessionRecord,
        dropped: usize,
        timeout: Duration,
    ) -> Result<()> {
        let released = session.block_bytes.saturating_mul(dropped as u64);
        let mut call = self
            .scripts
            .narrow
            .key(&self.session_keys(id, &session.group)[..]);
        call.arg(id.to_string())
            .arg(encode_session(session))
            .arg(timeout.as_millis().to_string())
            .arg(kind_field(session.kind))
            .arg(released.to_string())
            .arg(held_flag(session));
        let mut conn = self.pool.get()?;
        conn.run(|c| call.invoke::<i64>(c))?;
        Ok(())
    }

    fn claim(&self, id: SessionId, lease: Duration) -> Result<Option<SessionRecord>> {
        let mut call = self.scripts.claim.key(self.keys.session(id));
        call.key(self.keys.sessions_due())
            .arg(id.to_string())
            .arg(lease.as_millis().to_string());
        let mut conn = self.pool.get()?;
        let record: Option<Vec<u8>> = conn.run(|c| call.invoke(c))?;
        record.map(|r| decode_session(id.0, &r)).transpose()
    }

    fn unclaim(&self, id: SessionId, extend: Option<Duration>) -> Result<()> {
        let mut call = self.scripts.unclaim.key(self.keys.session(id));
        call.key(self.keys.sessions_due())
            .arg(id.to_string())
            .arg(extend.map_or(String::new(), |d| d.as_millis().to_string()));
        let mut conn = self.pool.get()?;
        conn.run(|c| call.invoke::<i64>(c))?;
        Ok(())
    }

    fn claim_expired(
        &self,
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<(SessionId, SessionRecord)>> {
        let mut call = self.scripts.claim_expired.key(self.keys.sessions_due());
        call.arg(self.keys.session_prefix())
            .arg(lease.as_millis().to_string())
            .arg(limit);
        let mut conn = self.pool.get()?;
        let values: Vec<Vec<u8>> = conn.run(|c| call.invoke(c))?;
        Self::parse_claimed(values)
    }

    fn claim_instance(
        &self,
        instance: &str,
        lease: Duration,
    ) -> Result<Vec<(SessionId, SessionRecord)>> {
        let ids: Vec<Vec<u8>> = {
            let mut conn = self.pool.get()?;
            conn.run(|c| {
                cmd("ZRANGE")
                    .arg(self.keys.sessions_due())
                    .arg(0)
                    .arg(-1)
                    .query(c)
            })?
        };
        let mut out = Vec::new();
        for id in ids {
            let id = parse_id(&id)?;
            // Peek without claiming, so other instances' sessions stay
            // untouched; then claim those of this instance.
            let record: Option<Vec<u8>> = {
                let mut conn = self.pool.get()?;
                conn.run(|c| cmd("HGET").arg(self.keys.session(id)).arg("r").query(c))?
            };
            let Some(record) = record else { continue };
            if decode_session(id.0, &record)?.instance != instance {
                continue;
            }
            if let Some(s) = self.claim(id, lease)? {
                out.push((id, s));
            }
        }
        Ok(out)
    }

    fn close(&self, id: SessionId, session: &SessionRecord, served: usize) -> Result<()> {
        let dropped = session.targets.len().saturating_sub(served) as u64;
        let released = session.block_bytes.saturating_mul(dropped);
        let mut call = self
            .scripts
            .close
            .key(&self.session_keys(id, &session.group)[..]);
        call.arg(id.to_string())
            .arg(kind_field(session.kind))
            .arg(released.to_string());
        let mut conn = self.pool.get()?;
        conn.run(|c| call.invoke::<i64>(c))?;
        Ok(())
    }

    fn held_sessions(&self) -> Result<usize> {
        let mut conn = self.pool.get()?;
        Ok(conn.run(|c| cmd("SCARD").arg(self.keys.sessions_held()).query(c))?)
    }

    fn is_built(&self) -> Result<bool> {
        let mut conn = self.pool.get()?;
        Ok(conn.run(|c| cmd("EXISTS").arg(self.keys.ledger_built()).query(c))?)
    }

    fn install(&self, usage: &BTreeMap<String, GroupUsage>) -> Result<bool> {
        let mut call = self.scripts.install.key(self.keys.ledger_built());
        for (group, u) in usage {
            call.key(self.keys.usage(group));
            call.arg(u.by_kind.len() + 1)
                .arg("total")
                .arg(u.total.to_string());
            for (&kind, &bytes) in &u.by_kind {
                call.arg(kind_field(kind)).arg(bytes.to_string());
            }
        }
        let mut conn = self.pool.get()?;
        Ok(conn.run(|c| call.invoke::<i64>(c))? == 1)
    }
}
