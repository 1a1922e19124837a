//! Server-side Lua: shard-lock acquire/release and access statistics.
//! Each script runs atomically on the server, in one round trip.

use ::redis::Script;

use crate::model::BlockMeta;

/// Takes every lock in KEYS for token ARGV[1] with a lease of ARGV[2] ms,
/// all or none; returns 1 when taken, 0 when one was held.
const ACQUIRE: &str = r"
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then return 0 end
end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
return 1
";

/// Deletes the locks in KEYS that still hold token ARGV[1] (never another
/// holder's); returns how many.
const RELEASE: &str = r"
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    n = n + 1
  end
end
return n
";

/// KEYS[1]: the stats hash; KEYS[i], i >= 2: record keys; for each,
/// ARGV[3i-5]: the stats field of KEYS[i], ARGV[3i-4]: its latest read in
/// ms (decimal), ARGV[3i-3]: how many reads. For each record that exists,
/// the field becomes `max(last, read):reads + count`. Decimal strings
/// without leading zeros compare as numbers by (length, bytes), which
/// keeps `last` exact past 2^53 where Lua numbers are not.
const TOUCH: &str = r"
for i = 2, #KEYS do
  local field, at, n = ARGV[3*i-5], ARGV[3*i-4], tonumber(ARGV[3*i-3])
  if redis.call('EXISTS', KEYS[i]) == 1 then
    local last, reads = at, n
    local v = redis.call('HGET', KEYS[1], field)
    if v then
      local sep = string.find(v, ':', 1, true)
      if sep then
        local l = string.sub(v, 1, sep - 1)
        reads = (tonumber(string.sub(v, sep + 1)) or 0) + n
        if #l > #at or (#l == #at and l > at) then last = l end
      end
    end
    redis.call('HSET', KEYS[1], field, last .. ':' .. string.format('%d', reads))
  end
end
return 0
";

/// The three scripts, hashed once.
#[derive(Debug)]
pub(super) struct Scripts {
    pub(super) acquire: Script,
    pub(super) release: Script,
    pub(super) touch: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Scripts {
            acquire: Script::new(ACQUIRE),
            release: Script::new(RELEASE),
            touch: Script::new(TOUCH),
        }
    }
}

/// Access statistics recorded by [`TOUCH`] since the record was last
/// written: the latest read and how many reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stats {
    pub(super) last_access_ms: u64,
    pub(super) reads: u64,
}

impl Stats {
    /// Parses `last:reads`; `None` for anything else (a malformed hint is
    /// dropped rather than failing the read).
    pub(super) fn parse(bytes: &[u8]) -> Option<Stats> {
        let s = std::str::from_utf8(bytes).ok()?;
        let (last, reads) = s.split_once(':')?;
        Some(Stats {
            last_access_ms: last.parse().ok()?,
            reads: reads.parse().ok()?,
        })
    }

    /// Folds the statistics into `meta`, as if each read had been a
    /// [`crate::MetaIndex::touch`] of the record.
    pub(super) fn apply(self, meta: &mut BlockMeta) {
        meta.last_access_ms = meta.last_access_ms.max(self.last_access_ms);
        let reads = u32::try_from(self.reads).unwrap_or(u32::MAX);
        meta.access_count = meta.access_count.saturating_add(reads);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_parse() {
        assert_eq!(
            Stats::parse(b"18446744073709551615:3"),
            Some(Stats {
                last_access_ms: u64::MAX,
                reads: 3
            })
        );
        assert_eq!(Stats::parse(b"12"), None);
        assert_eq!(Stats::parse(b"a:1"), None);
    }
}
