//! [`TierStore`] for [`RemoteTier`]: the object store as one tier among
//! others. A thin adapter over the tier's own methods. The remote tier
//! keeps no local record of what the store holds (its owner's pool is its
//! book): [`len`](TierStore::len) is 0 and
//! [`contains`](TierStore::contains) false; [`keys`](TierStore::keys)
//! lists the store.

use std::ops::Range;

use kvtier_core::BlockHash;
use kvtier_io::DmaTarget;
use kvtier_tier::{BlockPut, BoxFuture, ReadDone, Target, TierError, TierKind, TierStore};

use crate::{RemoteError, RemoteRead, RemoteTier};

/// Copies a verified read into the caller's target. A read that could
/// not be done, or bytes that do not fit the target exactly, fail with
/// their reason (nothing is known about the block then).
fn land(mut target: Target, read: RemoteRead) -> ReadDone {
    let (bytes, sums) = match read {
        RemoteRead::Hit { bytes, sums } => (bytes, sums),
        RemoteRead::Failed(e) => {
            return ReadDone::failed(target, TierError::storage(TierKind::Remote, e));
        }
        other => return ReadDone::not_served(target, other.lookup()),
    };
    if bytes.len() != target.len() {
        let got = target.len();
        return ReadDone::failed(
            target,
            TierError::WrongLength {
                expected: bytes.len(),
                got,
            },
        );
    }
    // SAFETY: the target's memory is valid for its length (DmaTarget) and
    // ours while we hold it; `bytes` is other memory of the same length.
    let dst = unsafe { std::slice::from_raw_parts_mut(target.as_mut_ptr(), bytes.len()) };
    dst.copy_from_slice(&bytes);
    ReadDone::hit(target, sums)
}

/// A failed write as a tier error: an object that failed its own check is
/// corrupt bytes, anything else the store's failure.
fn put_error(key: BlockHash, e: RemoteError) -> TierError {
    match e {
        RemoteError::Corrupt => TierError::Corrupt { key },
        e => TierError::storage(TierKind::Remote, e),
    }
}

impl TierStore for RemoteTier {
    fn kind(&self) -> TierKind {
        TierKind::Remote
    }

    fn block_bytes(&self) -> u64 {
        self.geometry().block_bytes()
    }

    /// The block's object, which other nodes sharing the store can read.
    fn uri(&self, key: BlockHash) -> Option<String> {
        Some(self.object_uri(key))
    }

    /// An object store has no block limit the tier knows of.
    fn capacity_blocks(&self) -> usize {
        usize::MAX
    }

    fn len(&self) -> usize {
        0
    }

    fn contains(&self, _key: BlockHash) -> bool {
        false
    }

    /// A failed delete leaves its object behind (logged; nothing to undo).
    fn remove<'a>(&'a self, keys: &'a [BlockHash]) -> BoxFuture<'a, usize> {
        Box::pin(async move {
            let results = self.remove_batch(keys).await;
            for (key, res) in keys.iter().zip(&results) {
                if let Err(e) = res {
                    tracing::warn!(%key, error = %e, "deleting a remote object failed");
                }
            }
            results.iter().filter(|r| r.is_ok()).count()
        })
    }

    fn keys(&self) -> BoxFuture<'_, Vec<BlockHash>> {
        Box::pin(async move {
            self.list().await.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "listing the remote tier failed; adopting nothing");
                Vec::new()
            })
        })
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        let s = RemoteTier::stats(self);
        vec![
            ("puts", s.puts),
            ("bytes_written", s.bytes_written),
            ("gets", s.gets),
            ("bytes_read", s.bytes_read),
            ("misses", s.misses),
            ("corrupt", s.corrupt),
            ("errors", s.errors),
            ("removes", s.removes),
        ]
    }

    fn read_into(
        &self,
        reqs: Vec<(BlockHash, Target)>,
        layers: Option<Range<u32>>,
    ) -> BoxFuture<'_, Vec<ReadDone>> {
        Box::pin(async move {
            let keys: Vec<BlockHash> = reqs.iter().map(|(k, _)| *k).collect();
            let reads = match layers {
                None => self.get_batch(&keys).await,
                Some(layers) => self.read_layers(&keys, layers).await,
            };
            reqs.into_iter()
                .zip(reads)
                .map(|((_, target), read)| land(target, read))
                .collect()
        })
    }

    fn put_batch<'a>(
        &'a self,
        puts: &'a [BlockPut<'a>],
    ) -> BoxFuture<'a, Vec<Result<(), TierError>>> {
        Box::pin(async move {
            RemoteTier::put_batch(self, puts)
                .await
                .into_iter()
                .zip(puts)
                .map(|(r, p)| r.map_err(|e| put_error(p.key, e)))
                .collect()
        })
    }
}
