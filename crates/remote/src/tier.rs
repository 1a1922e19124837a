//! [`RemoteTier`]: blocks as verified objects in an [`ObjectStore`].
//!
//! Every request is bounded by the tier's timeout (an outer
//! `tokio::time::timeout` around the store call, whose client also has its
//! own timeouts and retries inside that bound) and answered
//! [`RemoteError::Unavailable`] when it runs out: a dead endpoint never
//! hangs a caller. Batches run at most `max_concurrency` requests at once
//! and answer in request order.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use kvtier_core::{BlockHash, BlockSums, Geometry, Lookup, layer_checksum};
use object_store::ObjectStore;
use object_store::path::Path;
use tracing::Instrument;

use kvtier_tier::BlockPut;

use crate::format::{self, Header};
use crate::object::{Bad, Fail, bounded, decode_verified, encode_checked, timed_out};
use crate::stats::{Counters, RemoteStats};
use crate::{RemoteConfig, RemoteError};

/// What a read found for one block.
#[derive(Debug, Clone)]
pub enum RemoteRead {
    /// Verified bytes: the whole block (`get_batch`) or just the layers asked
    /// for, contiguous (`read_layers`). `sums` are always the whole block's
    /// checksums, authenticated by the object header.
    Hit {
        /// The bytes.
        bytes: Bytes,
        /// The block's checksums (every layer, and the combined value).
        sums: BlockSums,
    },
    /// No object for the block.
    Miss,
    /// The object failed verification (truncated, bad header, another key,
    /// inconsistent sums, data not matching its sums). The tier tried to
    /// delete it. Treat as a miss.
    Corrupt,
    /// The read could not be done (store unavailable or refusing, bad layer
    /// range). Nothing is known about the block.
    Failed(RemoteError),
}

impl RemoteRead {
    /// Whether the bytes may be used.
    pub fn is_hit(&self) -> bool {
        matches!(self, RemoteRead::Hit { .. })
    }

    /// The outcome as a [`Lookup`]; a failed read counts as `Corrupt`
    /// (a miss that is not the block's absence).
    pub fn lookup(&self) -> Lookup {
        match self {
            RemoteRead::Hit { .. } => Lookup::Hit,
            RemoteRead::Miss => Lookup::Miss,
            RemoteRead::Corrupt | RemoteRead::Failed(_) => Lookup::Corrupt,
        }
    }
}

/// The remote tier (G4): one object per block under one prefix of an
/// object store. Cheap to share behind an `Arc`; every method takes `&self`.
#[derive(Debug)]
pub struct RemoteTier {
    store: Arc<dyn ObjectStore>,
    /// Shown in object URIs, without a trailing `/`.
    display: String,
    /// Key prefix inside `store`, without leading or trailing `/`.
    prefix: String,
    geometry: Geometry,
    timeout: Duration,
    max_concurrency: usize,
    counters: Counters,
}

/// Layer reads starting at most this many bytes after the header fetch the
/// gap too, in one request, rather than making two requests.
const COALESCE_GAP: u64 = 1 << 20;

impl RemoteTier {
    /// Builds the tier described by `cfg` for blocks of `geometry`. No
    /// request is made (a `file://` directory is created if missing).
    pub fn open(cfg: &RemoteConfig, geometry: Geometry) -> Result<Self, RemoteError> {
        geometry
            .validate()
            .map_err(|e| RemoteError::Config(e.to_string()))?;
        let c = cfg.connect(true)?;
        Ok(Self::with_store(
            c.store,
            &c.display,
            &c.prefix,
            geometry,
            cfg.timeout(),
            cfg.max_concurrency,
        ))
    }

    /// The tier over an existing store: block objects live under `prefix`
    /// (a key prefix inside `store`, `""` for none), and object URIs are
    /// `url_for_display` followed by the name relative to the prefix.
    /// `max_concurrency` is raised to 1 if 0.
    pub fn with_store(
        store: Arc<dyn ObjectStore>,
        url_for_display: &str,
        prefix: &str,
        geometry: Geometry,
        timeout: Duration,
        max_concurrency: usize,
    ) -> Self {
        RemoteTier {
            store,
            display: url_for_display.trim_end_matches('/').to_owned(),
            prefix: prefix.trim_matches('/').to_owned(),
            geometry,
            timeout,
            max_concurrency: max_concurrency.max(1),
            counters: Counters::default(),
        }
    }

    /// The shape of every block.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// The tier's URL (`s3://bucket/prefix`, `file:///dir`).
    pub fn url(&self) -> &str {
        &self.display
    }

    /// The full URI of block `key`'s object, for events and locations.
    pub fn object_uri(&self, key: BlockHash) -> String {
        format!("{}/{}", self.display, format::relative_name(key))
    }

    /// The object path of block `key` inside the store.
    pub fn object_path(&self, key: BlockHash) -> Path {
        format::object_path(&self.prefix, key)
    }

    /// The counters.
    pub fn stats(&self) -> RemoteStats {
        self.counters.snapshot()
    }

    /// Writes each block as one object (header with the key and checksums,
    /// then the bytes). A block is acknowledged (`Ok`) only after the store
    /// acknowledged the whole object: an S3 PUT is atomic, and the local file
    /// system writes a temporary file and renames it. The data is verified
    /// against its sums first: a mismatch is [`RemoteError::Corrupt`] and
    /// nothing is written. Results are in `puts` order.
    pub async fn put_batch(&self, puts: &[BlockPut<'_>]) -> Vec<Result<(), RemoteError>> {
        let span = tracing::debug_span!("remote.put_batch", blocks = puts.len());
        // Indices, not references, flow through the stream: a closure over
        // borrowed items makes the future not `Send` for every lifetime,
        // and callers spawn it.
        futures::stream::iter(0..puts.len())
            .map(|i| self.put_one(&puts[i]))
            .buffered(self.max_concurrency)
            .collect()
            .instrument(span)
            .await
    }

    /// Reads whole blocks; every byte is verified (header self-check, key,
    /// shape, layer sums against the block sum, data against the layer sums).
    /// Results are in `keys` order.
    pub async fn get_batch(&self, keys: &[BlockHash]) -> Vec<RemoteRead> {
        let span = tracing::debug_span!("remote.get_batch", blocks = keys.len());
        futures::stream::iter(keys.iter().copied())
            .map(|k| async move {
                let r = self.get_one(k).await;
                self.finish(k, r).await
            })
            .buffered(self.max_concurrency)
            .collect()
            .instrument(span)
            .await
    }

    /// Reads only `layers` of each block with ranged GETs: one request for
    /// the header through the last layer when the layers start within 1 MiB
    /// of the header, else one for the header and one for the layers' bytes
    /// (in parallel). Each layer is
    /// verified against its sum from the authenticated header. A hit's
    /// `bytes` hold just those layers, contiguous. A range that is empty or
    /// past the geometry answers [`RemoteError::BadRange`] for every key.
    pub async fn read_layers(&self, keys: &[BlockHash], layers: Range<u32>) -> Vec<RemoteRead> {
        let span = tracing::debug_span!(
            "remote.read_layers",
            blocks = keys.len(),
            first = layers.start,
            end = layers.end
        );
        if layers.start >= layers.end || layers.end > self.geometry.layers {
            Counters::add(&self.counters.errors, keys.len() as u64);
            return keys
                .iter()
                .map(|_| {
                    RemoteRead::Failed(RemoteError::BadRange {
                        start: layers.start,
                        end: layers.end,
                        layers: self.geometry.layers,
                    })
                })
                .collect();
        }
        futures::stream::iter(keys.iter().copied())
            .map(|k| {
                let layers = layers.clone();
                async move {
                    let r = self.read_one(k, layers).await;
                    self.finish(k, r).await
                }
            })
            .buffered(self.max_concurrency)
            .collect()
            .instrument(span)
            .await
    }

    /// Deletes the blocks' objects; an absent object is `Ok`. Results are in
    /// `keys` order.
    pub async fn remove_batch(&self, keys: &[BlockHash]) -> Vec<Result<(), RemoteError>> {
        let span = tracing::debug_span!("remote.remove_batch", blocks = keys.len());
        futures::stream::iter(keys.iter().copied())
            .map(|k| async move {
                let path = self.object_path(k);
                match self.call("delete", self.store.delete(&path)).await {
                    Ok(()) | Err(Fail::NotFound) => {
                        Counters::add(&self.counters.removes, 1);
                        Ok(())
                    }
                    Err(Fail::Error(e)) => {
                        Counters::add(&self.counters.errors, 1);
                        Err(e)
                    }
                }
            })
            .buffered(self.max_concurrency)
            .collect()
            .instrument(span)
            .await
    }

    /// Every block key stored under the prefix, for rebuilding a pool after
    /// a restart. Objects that are not block objects of this prefix (foreign
    /// objects, the local file system's temporary files) are ignored; so is
    /// the content: a listed block may still read `Corrupt`. Each page of
    /// the listing is bounded by the timeout.
    pub async fn list(&self) -> Result<Vec<BlockHash>, RemoteError> {
        let dir = format::blocks_dir(&self.prefix);
        let mut stream = self.store.list(Some(&dir));
        let mut keys = Vec::new();
        loop {
            let next = tokio::time::timeout(self.timeout, stream.next()).await;
            match next {
                Err(_) => {
                    Counters::add(&self.counters.errors, 1);
                    return Err(self.timed_out("list"));
                }
                Ok(None) => break,
                Ok(Some(Ok(meta))) => {
                    if let Some(k) = format::parse_object_path(&self.prefix, &meta.location) {
                        keys.push(k);
                    }
                }
                // The prefix does not exist yet (local file system).
                Ok(Some(Err(object_store::Error::NotFound { .. }))) => break,
                Ok(Some(Err(e))) => {
                    Counters::add(&self.counters.errors, 1);
                    return Err(RemoteError::from_store("list", e));
                }
            }
        }
        keys.sort_unstable();
        keys.dedup();
        Ok(keys)
    }

    fn timed_out(&self, op: &str) -> RemoteError {
        timed_out(&self.display, self.timeout, op)
    }

    /// One store call under the timeout.
    async fn call<T>(
        &self,
        op: &'static str,
        f: impl Future<Output = object_store::Result<T>>,
    ) -> Result<T, Fail> {
        bounded(&self.display, self.timeout, op, f).await
    }

    async fn put_one(&self, p: &BlockPut<'_>) -> Result<(), RemoteError> {
        let r = self.put_checked(p).await;
        match &r {
            Ok(()) => {
                Counters::add(&self.counters.puts, 1);
                Counters::add(&self.counters.bytes_written, p.data.len() as u64);
            }
            Err(RemoteError::Corrupt) => Counters::add(&self.counters.corrupt, 1),
            Err(_) => Counters::add(&self.counters.errors, 1),
        }
        r
    }

    async fn put_checked(&self, p: &BlockPut<'_>) -> Result<(), RemoteError> {
        let payload = encode_checked(&self.geometry, p)?;
        let path = self.object_path(p.key);
        match self.call("put", self.store.put(&path, payload)).await {
            Ok(_) => Ok(()),
            Err(Fail::Error(e)) => Err(e),
            Err(Fail::NotFound) => Err(RemoteError::Unavailable(format!(
                "put of {path}: the store answered not found"
            ))),
        }
    }

    async fn get_one(&self, key: BlockHash) -> Result<(Bytes, BlockSums), Bad> {
        let path = self.object_path(key);
        let object = self
            .call("get", async { self.store.get(&path).await?.bytes().await })
            .await
            .map_err(|f| match f {
                Fail::NotFound => Bad::Miss,
                Fail::Error(e) => Bad::Failed(e),
            })?;
        decode_verified(&object, key, &self.geometry)
    }

    async fn read_one(
        &self,
        key: BlockHash,
        layers: Range<u32>,
    ) -> Result<(Bytes, BlockSums), Bad> {
        let g = &self.geometry;
        let hl = format::header_len(g.layers) as u64;
        let r = g.layers_range(layers.clone());
        let path = self.object_path(key);
        // One request when the layers start close to the header (as
        // object_store's own coalescing would), else two in parallel. Not
        // `ObjectStore::get_ranges`: its coalescing slices the merged
        // response without checking its length and panics on a truncated
        // object.
        let fetched = if r.start <= COALESCE_GAP {
            self.call("get_range", async {
                let all = self.store.get_range(&path, 0..hl + r.end).await?;
                let split = (hl as usize).min(all.len());
                let from = ((hl + r.start) as usize).min(all.len());
                Ok((all.slice(..split), all.slice(from..)))
            })
            .await
        } else {
            self.call("get_range", async {
                futures::try_join!(
                    self.store.get_range(&path, 0..hl),
                    self.store.get_range(&path, hl + r.start..hl + r.end)
                )
            })
            .await
        };
        let (head, data) = match fetched {
            Ok(got) => got,
            Err(Fail::NotFound) => return Err(Bad::Miss),
            Err(Fail::Error(e)) => return Err(self.classify_range_failure(&path, e).await),
        };
        if head.len() as u64 != hl || data.len() as u64 != r.end - r.start {
            return Err(Bad::Corrupt("object shorter than its geometry"));
        }
        let header = Header::decode(&head)?;
        header.check(key, g)?;
        let layer_bytes = usize::try_from(g.layer_bytes())
            .map_err(|_| Bad::Corrupt("layer larger than the address space"))?;
        for (l, chunk) in layers.clone().zip(data.chunks(layer_bytes.max(1))) {
            if layer_checksum(key, l, chunk) != header.sums.layers[l as usize] {
                return Err(Bad::Corrupt("layer does not match its sum"));
            }
        }
        Ok((data, header.sums))
    }

    /// A ranged read failed: if the object is there with the wrong size
    /// (truncated; a range past its end), it is corrupt; if it is gone, a
    /// miss; otherwise the failure stands.
    async fn classify_range_failure(&self, path: &Path, e: RemoteError) -> Bad {
        let expected =
            format::header_len(self.geometry.layers) as u64 + self.geometry.block_bytes();
        match self.call("head", self.store.head(path)).await {
            Ok(meta) if meta.size != expected => {
                Bad::Corrupt("object length differs from the geometry")
            }
            Err(Fail::NotFound) => Bad::Miss,
            _ => Bad::Failed(e),
        }
    }

    /// Counts a read's outcome, drops a corrupt object, and answers.
    async fn finish(&self, key: BlockHash, r: Result<(Bytes, BlockSums), Bad>) -> RemoteRead {
        match r {
            Ok((bytes, sums)) => {
                Counters::add(&self.counters.gets, 1);
                Counters::add(&self.counters.bytes_read, bytes.len() as u64);
                RemoteRead::Hit { bytes, sums }
            }
            Err(Bad::Miss) => {
                Counters::add(&self.counters.misses, 1);
                RemoteRead::Miss
            }
            Err(Bad::Failed(e)) => {
                Counters::add(&self.counters.errors, 1);
                RemoteRead::Failed(e)
            }
            Err(Bad::Corrupt(reason)) => {
                Counters::add(&self.counters.corrupt, 1);
                let uri = self.object_uri(key);
                tracing::warn!(%key, %uri, reason, "corrupt block object; deleting it");
                // Best effort: a failure leaves the object to fail again.
                let path = self.object_path(key);
                match self.call("delete", self.store.delete(&path)).await {
                    Ok(()) | Err(Fail::NotFound) => {}
                    Err(Fail::Error(e)) => {
                        tracing::warn!(%key, %uri, error = %e, "could not delete corrupt block object");
                    }
                }
                RemoteRead::Corrupt
            }
        }
    }
}
