//! Sharded locks for read-modify-write, and the batching that goes with them.

use parking_lot::{Mutex, MutexGuard};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::model::BlockKey;

/// `N` mutexes (a power of two); a key locks the shard its hash picks.
#[derive(Debug)]
pub struct ShardLocks {
    shards: Vec<Mutex<()>>,
    batch_shards: usize,
}

impl ShardLocks {
    /// `shards` is rounded up to a power of two (at least 1); a chunk of a
    /// batch locks at most `batch_shards` of them at once (at least 1).
    pub fn new(shards: usize, batch_shards: usize) -> Self {
        let n = shards.max(1).next_power_of_two();
        ShardLocks {
            shards: (0..n).map(|_| Mutex::new(())).collect(),
            batch_shards: batch_shards.max(1),
        }
    }

    /// The shard of (instance, key).
    pub fn shard_of(&self, instance: &str, key: BlockKey) -> usize {
        let h = xxh3_64_with_seed(instance.as_bytes(), key.0);
        (h as usize) & (self.shards.len() - 1)
    }

    /// Splits the distinct keys of `keys` into chunks of at most
    /// `batch_shards` shards and runs `f` on each chunk's keys while holding
    /// its shard locks, taken in ascending shard order.
    pub fn for_each_chunk<E>(
        &self,
        instance: &str,
        keys: &[BlockKey],
        mut f: impl FnMut(&[BlockKey]) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut by_shard: Vec<(usize, BlockKey)> = keys
            .iter()
            .map(|&k| (self.shard_of(instance, k), k))
            .collect();
        by_shard.sort_unstable();
        by_shard.dedup();
        let mut start = 0;
        while start < by_shard.len() {
            let mut end = start;
            let mut guards: Vec<MutexGuard<'_, ()>> = Vec::new();
            let mut last = usize::MAX;
            while end < by_shard.len() {
                let shard = by_shard[end].0;
                if shard != last {
                    if guards.len() == self.batch_shards {
                        break;
                    }
                    guards.push(self.shards[shard].lock());
                    last = shard;
                }
                end += 1;
            }
            let chunk: Vec<BlockKey> = by_shard[start..end].iter().map(|&(_, k)| k).collect();
            f(&chunk)?;
            drop(guards);
            start = end;
        }
        Ok(())
    }
}

impl Default for ShardLocks {
    /// 64 shards, 16 per chunk.
    fn default() -> Self {
        ShardLocks::new(64, 16)
    }
}
