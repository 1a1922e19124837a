//! [`ObjectBlocks`]: one block object at a path someone else chose, under a
//! key given per call. The cluster's shared G4 (docs/cluster.md) writes
//! blocks where the metadata service's write sessions say, under a key
//! every node of the cluster derives alike, so it cannot use
//! [`RemoteTier`](crate::RemoteTier)'s own naming. The object's bytes and
//! their verification are exactly the tier's (docs/remote-format.md); a
//! read never deletes anything: a shared object is the metadata service's
//! to delete, and one that fails verification is only a miss.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kvtier_core::{BlockHash, BlockSums, Geometry, layer_checksums};
use kvtier_tier::BlockPut;
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};

use crate::format::{Header, HeaderError};
use crate::{RemoteConfig, RemoteError, RemoteRead};

/// Block objects of one geometry in one store, at paths given per call.
#[derive(Debug, Clone)]
pub struct ObjectBlocks {
    store: Arc<dyn ObjectStore>,
    /// The store's URL (`s3://bucket/prefix`, `file:///dir`), without a
    /// trailing `/`.
    display: String,
    /// Key prefix inside `store`, without leading or trailing `/`.
    prefix: String,
    geometry: Geometry,
    timeout: Duration,
}

/// Why a store call gave no value.
pub(crate) enum Fail {
    NotFound,
    Error(RemoteError),
}

/// Why a read produced no verified bytes.
pub(crate) enum Bad {
    Miss,
    Corrupt(&'static str),
    Failed(RemoteError),
}

impl From<HeaderError> for Bad {
    fn from(e: HeaderError) -> Self {
        Bad::Corrupt(match e {
            HeaderError::Truncated => "header truncated",
            HeaderError::BadMagic => "bad magic",
            HeaderError::Unsupported => "unsupported version",
            HeaderError::BadLength => "bad header length",
            HeaderError::BadChecksum => "header checksum mismatch",
            HeaderError::Inconsistent => "inconsistent header",
            HeaderError::WrongKey => "object holds another block",
            HeaderError::WrongShape => "object shape differs from the geometry",
            HeaderError::InconsistentSums => "layer sums do not combine to the block sum",
        })
    }
}

/// One store call on `display` under `timeout`.
pub(crate) async fn bounded<T>(
    display: &str,
    timeout: Duration,
    op: &'static str,
    f: impl Future<Output = object_store::Result<T>>,
) -> Result<T, Fail> {
    match tokio::time::timeout(timeout, f).await {
        Err(_) => Err(Fail::Error(timed_out(display, timeout, op))),
        Ok(Ok(v)) => Ok(v),
        Ok(Err(object_store::Error::NotFound { .. })) => Err(Fail::NotFound),
        Ok(Err(e)) => Err(Fail::Error(RemoteError::from_store(op, e))),
    }
}

/// The error of a call `op` on `display` that ran out of `timeout`.
pub(crate) fn timed_out(display: &str, timeout: Duration, op: &str) -> RemoteError {
    RemoteError::Unavailable(format!("{op} on {display}: no answer within {timeout:?}"))
}

/// The object of `p` (header, then the bytes), after checking the bytes
/// against the sums they come with: nothing that would not read back
/// verified is ever written.
pub(crate) fn encode_checked(g: &Geometry, p: &BlockPut<'_>) -> Result<PutPayload, RemoteError> {
    if p.data.len() as u64 != g.block_bytes() {
        return Err(RemoteError::WrongLength {
            key: p.key,
            what: "bytes",
            found: p.data.len() as u64,
            expected: g.block_bytes(),
        });
    }
    if p.sums.layers.len() != g.layers as usize {
        return Err(RemoteError::WrongLength {
            key: p.key,
            what: "layer checksums",
            found: p.sums.layers.len() as u64,
            expected: g.layers as u64,
        });
    }
    let layer_bytes = usize::try_from(g.layer_bytes())
        .map_err(|_| RemoteError::Config("layer larger than the address space".into()))?;
    if !p.sums.is_consistent(p.key) || layer_checksums(p.key, layer_bytes, p.data) != p.sums.layers
    {
        tracing::warn!(key = %p.key, "refusing to write a block that does not match its checksums");
        return Err(RemoteError::Corrupt);
    }
    let header = Header::new(p.key, g, p.sums.clone()).encode();
    Ok([Bytes::from(header), Bytes::copy_from_slice(p.data)]
        .into_iter()
        .collect())
}

/// The verified data of a whole `object` of block `key`: header
/// self-check, key, shape, layer sums against the block sum, data against
/// the layer sums.
pub(crate) fn decode_verified(
    object: &Bytes,
    key: BlockHash,
    g: &Geometry,
) -> Result<(Bytes, BlockSums), Bad> {
    let header = Header::decode(object)?;
    header.check(key, g)?;
    let start = header.len();
    if object.len() as u64 != start as u64 + header.block_bytes {
        return Err(Bad::Corrupt("object length differs from the header's"));
    }
    let data = object.slice(start..);
    let layer_bytes = usize::try_from(header.layer_bytes)
        .map_err(|_| Bad::Corrupt("layer larger than the address space"))?;
    if layer_checksums(key, layer_bytes, &data) != header.sums.layers {
        return Err(Bad::Corrupt("data does not match its layer sums"));
    }
    Ok((data, header.sums))
}

impl ObjectBlocks {
    /// Block objects of `geometry` in the store `cfg` names. No request is
    /// made; a `file://` directory must exist and take files (a shared
    /// one that is missing is an unmounted file system, never created
    /// here: [`RemoteConfig::check_existing`]).
    pub fn open(cfg: &RemoteConfig, geometry: Geometry) -> Result<Self, RemoteError> {
        geometry
            .validate()
            .map_err(|e| RemoteError::Config(e.to_string()))?;
        let c = cfg.connect(false)?;
        Ok(Self {
            store: c.store,
            display: c.display.trim_end_matches('/').to_owned(),
            prefix: c.prefix.trim_matches('/').to_owned(),
            geometry,
            timeout: cfg.timeout(),
        })
    }

    /// The store's URL (`s3://bucket/prefix`, `file:///dir`).
    pub fn url(&self) -> &str {
        &self.display
    }

    /// The shape of every block.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// The object path of `uri`, if it names an object strictly under this
    /// store's URL (no query, no empty, `.` or `..` segment): a location
    /// handed out for another store, or one escaping the prefix, is `None`.
    pub fn path_of(&self, uri: &str) -> Option<Path> {
        let rel = uri.strip_prefix(self.display.as_str())?.strip_prefix('/')?;
        if rel.is_empty()
            || rel.contains(['?', '#', '\\'])
            || rel
                .split('/')
                .any(|s| s.is_empty() || s == "." || s == "..")
        {
            return None;
        }
        let full = if self.prefix.is_empty() {
            rel.to_owned()
        } else {
            format!("{}/{rel}", self.prefix)
        };
        Path::parse(full).ok()
    }

    /// Writes block `p` as one object at `path` (header with `p.key` and
    /// its sums, then the bytes), acknowledged only once the store
    /// acknowledged the whole object. Bytes that do not match their sums
    /// are [`RemoteError::Corrupt`] and nothing is written.
    pub async fn put(&self, path: &Path, p: &BlockPut<'_>) -> Result<(), RemoteError> {
        let payload = encode_checked(&self.geometry, p)?;
        let put = self.store.put(path, payload);
        match bounded(&self.display, self.timeout, "put", put).await {
            Ok(_) => Ok(()),
            Err(Fail::Error(e)) => Err(e),
            Err(Fail::NotFound) => Err(RemoteError::Unavailable(format!(
                "put of {path}: the store answered not found"
            ))),
        }
    }

    /// Reads the object at `path` as block `key`, every byte verified as
    /// [`RemoteTier`](crate::RemoteTier)'s reads are. An object that fails
    /// is [`RemoteRead::Corrupt`] and stays where it is.
    pub async fn get(&self, path: &Path, key: BlockHash) -> RemoteRead {
        let get = async { self.store.get(path).await?.bytes().await };
        let read = match bounded(&self.display, self.timeout, "get", get).await {
            Ok(object) => decode_verified(&object, key, &self.geometry),
            Err(Fail::NotFound) => Err(Bad::Miss),
            Err(Fail::Error(e)) => Err(Bad::Failed(e)),
        };
        match read {
            Ok((bytes, sums)) => RemoteRead::Hit { bytes, sums },
            Err(Bad::Miss) => RemoteRead::Miss,
            Err(Bad::Failed(e)) => RemoteRead::Failed(e),
            Err(Bad::Corrupt(reason)) => {
                tracing::warn!(%key, %path, reason, "corrupt shared block object: a miss");
                RemoteRead::Corrupt
            }
        }
    }
}
