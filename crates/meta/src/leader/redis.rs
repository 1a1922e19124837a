//! [`RedisLease`]: the lease as one Redis/Valkey key with a TTL,
//! `<prefix>:leader` = `<epoch>|<node>`, its epochs from the counter
//! `<prefix>:leader:epoch`. Each change (acquire, renew, release) is one
//! Lua script, atomic on the server; reading the holder is one `GET`
//! (docs/meta-api.md §9).

use std::time::Duration;

use ::redis::{Client, Connection, Script};
use parking_lot::Mutex;

use super::store::{Holder, LeaseResult, LeaseStore, decode};

/// Takes the lease (KEYS[1] the lease, KEYS[2] the epoch counter; ARGV[1]
/// the node, ARGV[2] the TTL in ms): the holder's epoch if the node holds
/// it already (TTL extended), a new epoch if it was free, 0 otherwise.
const ACQUIRE: &str = r"
local v = redis.call('GET', KEYS[1])
if v then
  local sep = string.find(v, '|', 1, true)
  if sep and string.sub(v, sep + 1) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return tonumber(string.sub(v, 1, sep - 1))
  end
  return 0
end
local e = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], e .. '|' .. ARGV[1], 'PX', ARGV[2])
return e
";

/// Extends the lease if it still holds ARGV[1] (`<epoch>|<node>`) by
/// ARGV[2] ms; 1 if so, else 0.
const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
";

/// Deletes the lease if it still holds ARGV[1]; 1 if so, else 0.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
";

/// The leader lease on a Redis/Valkey server.
pub struct RedisLease {
    client: Client,
    lease_key: String,
    epoch_key: String,
    timeout: Duration,
    /// One connection, opened on first use and again after an error.
    conn: Mutex<Option<Connection>>,
    scripts: [Script; 3],
}

impl std::fmt::Debug for RedisLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLease")
            .field("server", &self.client.get_connection_info().addr())
            .field("key", &self.lease_key)
            .finish()
    }
}

impl RedisLease {
    /// The lease of namespace `prefix` (the index's) on `client`'s server;
    /// every call gives up after `timeout`.
    pub fn new(client: Client, prefix: &str, timeout: Duration) -> Self {
        RedisLease {
            client,
            lease_key: format!("{prefix}:leader"),
            epoch_key: Self::epoch_key(prefix),
            timeout,
            conn: Mutex::new(None),
            scripts: [ACQUIRE, RENEW, RELEASE].map(Script::new),
        }
    }

    /// The epoch counter's key in namespace `prefix`: it changes only when
    /// a frontend takes the lease, so leader-only writes of a
    /// [`crate::RedisIndex`] on the same server fence on it.
    pub fn epoch_key(prefix: &str) -> String {
        format!("{prefix}:leader:epoch")
    }

    /// Like [`RedisLease::new`], from the server's URL
    /// (`redis://host:port/db`, `rediss://` for TLS).
    pub fn open(url: &str, prefix: &str, timeout: Duration) -> LeaseResult<Self> {
        Ok(Self::new(Client::open(url)?, prefix, timeout))
    }

    /// Runs `f` on the connection, opening it if needed; drops it after an
    /// error so that the next call reconnects.
    fn with_conn<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> ::redis::RedisResult<T>,
    ) -> LeaseResult<T> {
        let mut slot = self.conn.lock();
        if slot.is_none() {
            let c = self.client.get_connection_with_timeout(self.timeout)?;
            c.set_read_timeout(Some(self.timeout))?;
            c.set_write_timeout(Some(self.timeout))?;
            *slot = Some(c);
        }
        let Some(conn) = slot.as_mut() else {
            unreachable!("the connection was just opened");
        };
        let out = f(conn);
        if out.is_err() {
            *slot = None;
        }
        Ok(out?)
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl LeaseStore for RedisLease {
    fn try_acquire(&self, node: &str, ttl: Duration) -> LeaseResult<Option<u64>> {
        let e: u64 = self.with_conn(|c| {
            self.scripts[0]
                .key(&self.lease_key)
                .key(&self.epoch_key)
                .arg(node)
                .arg(ms(ttl))
                .invoke(c)
        })?;
        Ok((e > 0).then_some(e))
    }

    fn renew(&self, node: &str, epoch: u64, ttl: Duration) -> LeaseResult<bool> {
        let value = super::store::encode(epoch, node);
        let n: u32 = self.with_conn(|c| {
            self.scripts[1]
                .key(&self.lease_key)
                .arg(&value)
                .arg(ms(ttl))
                .invoke(c)
        })?;
        Ok(n == 1)
    }

    fn release(&self, node: &str, epoch: u64) -> LeaseResult<()> {
        let value = super::store::encode(epoch, node);
        let _: u32 =
            self.with_conn(|c| self.scripts[2].key(&self.lease_key).arg(&value).invoke(c))?;
        Ok(())
    }

    fn holder(&self) -> LeaseResult<Option<Holder>> {
        let value: Option<String> =
            self.with_conn(|c| ::redis::cmd("GET").arg(&self.lease_key).query(c))?;
        value
            .map(|v| decode(&v).map(|(epoch, node)| Holder { node, epoch }))
            .transpose()
    }
}
