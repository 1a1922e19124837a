//! [`open_backend`]: the backend of a [`Storage`], by its kind and URI.

use std::sync::Arc;

use kvtier_meta::{
    BackendError, BackendOpener, MetaError, MetaService, Storage, StorageBackend, StorageKind,
};

use crate::file_pool::{FilePool, FilePoolOptions};
use crate::node_store::{NodeStoreBackend, spec_peer};
use crate::objects::{ObjectBackend, S3Options};
use crate::uri::{Uri, bad};

/// What [`open_backend`] needs beyond the storage record.
#[derive(Clone, Default)]
pub struct BackendOptions {
    /// Settings of file pools.
    pub file_pool: FilePoolOptions,
    /// Settings and credentials of S3 storages; their `timeout` and
    /// `usage_list_limit` bound shared directories' calls too.
    pub s3: S3Options,
    /// This node's name and block store, if it has one: a `kvtier://`
    /// storage on this node is served from it (once its block shape is
    /// known); another node's is probed through its peer server.
    pub local_node: Option<(String, Arc<kvtier_node::NodeHost>)>,
    /// This node's cluster identity, when it has a peer server: another
    /// node's storage is healthy while its peer server (the address in the
    /// storage's `spec`) answers a handshake made with it.
    pub peer_identity: Option<kvtier_peer::Identity>,
}

impl std::fmt::Debug for BackendOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendOptions")
            .field("file_pool", &self.file_pool)
            .field("s3", &self.s3)
            .field("local_node", &self.local_node.as_ref().map(|(n, _)| n))
            .field("cluster", &self.peer_identity.as_ref().map(|i| &i.cluster))
            .finish()
    }
}

/// Opens the backend of `storage`. The URI scheme must match the kind:
/// `file:///abs/dir` ([`StorageKind::FilePool`],
/// [`StorageKind::FileObjects`]), `kvtier://node`
/// ([`StorageKind::KvtierNode`]), `s3://bucket/prefix` ([`StorageKind::S3`]).
/// A file pool opened here starts with every extent free; to restore its
/// allocation map first, open it with [`open_file_pool`] and call
/// [`FilePool::restore`] before attaching it.
pub fn open_backend(
    storage: &Storage,
    opts: &BackendOptions,
) -> Result<Arc<dyn StorageBackend>, BackendError> {
    let uri = storage.uri.as_str();
    let want = match storage.kind {
        StorageKind::FilePool | StorageKind::FileObjects => "file",
        StorageKind::KvtierNode => "kvtier",
        StorageKind::S3 => "s3",
        // The service never asks (`StorageKind::has_backend`); a direct
        // caller learns why.
        StorageKind::Mooncake | StorageKind::TairMemPool => return Err(no_backend(storage)),
    };
    let u = Uri::parse(uri)?;
    if u.scheme != want {
        return Err(bad(
            uri,
            format!(
                "storage {:?} of kind {:?} needs a {want}:// URI",
                storage.name, storage.kind
            ),
        ));
    }
    Ok(match storage.kind {
        StorageKind::FilePool => Arc::new(open_file_pool(storage, opts)?),
        StorageKind::S3 => Arc::new(ObjectBackend::s3(uri, &opts.s3)?),
        StorageKind::FileObjects => Arc::new(ObjectBackend::dir(uri, &opts.s3)?),
        StorageKind::KvtierNode => {
            if u.authority.is_empty() {
                return Err(bad(uri, "no node name"));
            }
            if !u.path.trim_matches('/').is_empty() || !u.query.is_empty() {
                return Err(bad(uri, "expected kvtier://<node>"));
            }
            match &opts.local_node {
                Some((name, store)) if name == u.authority => {
                    Arc::new(NodeStoreBackend::local_host(name.clone(), store.clone()))
                }
                _ => {
                    let addr = spec_peer(storage.spec.as_ref());
                    let peer = addr.zip(opts.peer_identity.clone());
                    Arc::new(NodeStoreBackend::remote(u.authority, peer))
                }
            }
        }
        StorageKind::Mooncake | StorageKind::TairMemPool => return Err(no_backend(storage)),
    })
}

/// The refusal of a storage kind kvtier keeps but cannot open.
fn no_backend(storage: &Storage) -> BackendError {
    BackendError::Unavailable(format!(
        "storage {:?}: kvtier has no {} backend",
        storage.name,
        storage.kind.as_str()
    ))
}

/// Opens the file pool of a [`StorageKind::FilePool`] storage.
pub fn open_file_pool(storage: &Storage, opts: &BackendOptions) -> Result<FilePool, BackendError> {
    if storage.kind != StorageKind::FilePool {
        return Err(bad(&storage.uri, "not a file pool storage"));
    }
    FilePool::open_uri(&storage.uri, &opts.file_pool)
}

/// Why [`attach_backend`] failed.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The backend could not be opened.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The service could not list the storage's live locations or does not
    /// know the storage.
    #[error(transparent)]
    Meta(#[from] MetaError),
}

/// Opens the backend of `storage` and rebuilds its allocation state from
/// the locations `svc` still lists on it (file pools: see
/// [`FilePool::restore`]), without attaching it.
fn open_restored(
    svc: &MetaService,
    storage: &Storage,
    opts: &BackendOptions,
) -> Result<Arc<dyn StorageBackend>, AttachError> {
    if storage.kind != StorageKind::FilePool {
        return Ok(open_backend(storage, opts)?);
    }
    let pool = open_file_pool(storage, opts)?;
    let live = svc.live_uris(&storage.name)?;
    let summary = pool.restore(&live);
    if !summary.rejected.is_empty() {
        tracing::warn!(
            storage = storage.name,
            rejected = summary.rejected.len(),
            "file pool: some listed extents were not restored"
        );
    }
    tracing::info!(
        storage = storage.name,
        restored = summary.restored,
        "file pool restored"
    );
    Ok(Arc::new(pool))
}

/// Opens the backend of `storage`, rebuilds its allocation state from the
/// locations `svc` still lists on it (file pools: see
/// [`FilePool::restore`]) and attaches it to the service. The startup path
/// of a service without a [`BackendOpener`]: call it for every storage
/// before the service takes writes, so no live extent is handed out twice
/// after a restart.
pub fn attach_backend(
    svc: &MetaService,
    storage: &Storage,
    opts: &BackendOptions,
) -> Result<Arc<dyn StorageBackend>, AttachError> {
    let backend = open_restored(svc, storage, opts)?;
    svc.attach_backend(&storage.name, backend.clone())?;
    Ok(backend)
}

/// The service opens backends of storages added, changed or loaded at
/// runtime, and of every storage at start, exactly as [`attach_backend`]
/// does: install `Arc::new(options)` as `MetaConfig::backend_opener`.
impl BackendOpener for BackendOptions {
    fn open(
        &self,
        svc: &MetaService,
        storage: &Storage,
    ) -> Result<Arc<dyn StorageBackend>, BackendError> {
        open_restored(svc, storage, self).map_err(|e| match e {
            AttachError::Backend(e) => e,
            AttachError::Meta(e) => BackendError::Unavailable(format!(
                "listing the live locations of {:?}: {e}",
                storage.name
            )),
        })
    }
}
