//! The data storage seam: [`StorageBackend`].
//!
//! The metadata service never moves block bytes, but it does manage the
//! space they live in: a write grant asks the storage's backend where each
//! part of a block goes ([`StorageBackend::create`]: a file pool hands out
//! an offset in one of a few large files, an object store an object key);
//! removing a location frees that space ([`StorageBackend::delete`]);
//! periodic probes ([`StorageBackend::health`]) decide whether a storage
//! takes new writes. Implementations live in `kvtier-backend` (file pool,
//! kvtier node store, S3); a storage with no backend attached gets URIs
//! built under its base URI and no space management.
//!
//! Calls are async and must not hang: implementations bound every remote
//! call with a timeout and report it as [`BackendError::Unavailable`].

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::model::{BlockKey, LocationId, Storage};
use crate::service::MetaService;

/// A boxed future returned by [`StorageBackend`] methods (the trait is used
/// as `dyn`, so methods cannot be `async fn`).
pub type BackendFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Errors of a data storage backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The backend has no room for the requested bytes.
    #[error("storage full: need {requested} bytes, {free} free")]
    Full {
        /// Bytes asked for.
        requested: u64,
        /// Bytes still free.
        free: u64,
    },
    /// The URI does not belong to this backend or is malformed.
    #[error("bad uri {uri:?}: {reason}")]
    BadUri {
        /// The URI.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The backend cannot be reached or answered with an error (including
    /// timeouts).
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// Local I/O failed.
    #[error("storage i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// One part (spec) of one block to place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateRequest {
    /// Instance the block belongs to.
    pub instance: String,
    /// The block.
    pub key: BlockKey,
    /// The location being created (unique; may be part of the name).
    pub location: LocationId,
    /// Spec name (`tp0`, ...).
    pub spec: String,
    /// Bytes to reserve.
    pub size: u64,
}

/// Space used and available on a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BackendUsage {
    /// Bytes allocated to live objects.
    pub used_bytes: u64,
    /// Total capacity; `None` when unbounded or unknown (object stores).
    pub capacity_bytes: Option<u64>,
    /// Objects (block parts) allocated.
    pub objects: u64,
}

/// A data storage backend: allocates, frees, checks and probes the space
/// block parts live in.
pub trait StorageBackend: Send + Sync + Debug {
    /// Allocates space for each request, in order, and returns its URI.
    /// All or nothing: on error nothing stays allocated.
    fn create<'a>(
        &'a self,
        requests: &'a [CreateRequest],
    ) -> BackendFuture<'a, Result<Vec<String>, BackendError>>;

    /// Frees the space of each URI, in order. Deleting a URI that does not
    /// exist is `Ok` (deletes are retried and idempotent).
    fn delete<'a>(&'a self, uris: &'a [String])
    -> BackendFuture<'a, Vec<Result<(), BackendError>>>;

    /// Whether each URI names live data (allocated and not deleted).
    fn exist<'a>(
        &'a self,
        uris: &'a [String],
    ) -> BackendFuture<'a, Result<Vec<bool>, BackendError>>;

    /// Space used and available.
    fn usage(&self) -> BackendFuture<'_, Result<BackendUsage, BackendError>>;

    /// One probe: `Ok` when the backend can take writes and serve reads now.
    fn health(&self) -> BackendFuture<'_, Result<(), BackendError>>;
}

/// Opens the backend of a storage: how the service gets a backend for a
/// storage added, changed or loaded at runtime (admin API, snapshot load,
/// catalog refresh) and for every storage at start
/// ([`MetaService::attach_configured_backends`]), so both paths give a
/// storage the same backend. `kvtier-backend` implements it for its
/// `BackendOptions`; install it with `MetaConfig::backend_opener`.
pub trait BackendOpener: Send + Sync + Debug {
    /// Opens `storage`'s backend with its allocation state restored from
    /// what `svc` still lists on it (file pools), ready to attach. Must
    /// not attach it: the service does, in step with its catalog.
    fn open(
        &self,
        svc: &MetaService,
        storage: &Storage,
    ) -> Result<Arc<dyn StorageBackend>, BackendError>;
}
