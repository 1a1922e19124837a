//! # kvtier-meta
//!
//! The global KV cache metadata manager (Tair KVCM semantics). It knows
//! where every block of every instance lives and hands out locations;
//! clients move the bytes themselves.
//!
//! - [`model`]: [`Storage`]s, [`InstanceGroup`]s (quotas, watermark,
//!   eviction policy), [`Instance`]s, [`Account`]s, and per block a
//!   [`BlockMeta`] with its [`CacheLocation`]s (`Writing -> Serving ->
//!   Deleting`).
//! - [`MetaIndex`]: the storage seam for all metadata, with sharded-lock
//!   read-modify-write. [`MemoryIndex`] is the reference model,
//!   [`RedbIndex`] the embedded durable store, [`RedisIndex`] the store
//!   shared by several stateless frontends on one Redis/Valkey. redb
//!   rather than fjall: this service is read-mostly (every request is a
//!   batch point lookup, writes are one per new block) and redb's B-tree
//!   serves point reads faster, in
//!   one file, with no background compaction threads and no dependencies of
//!   its own; fjall would win on write-heavy loads and fits the same trait.
//! - [`MetaService`]: the in-process service over an `Arc<dyn MetaIndex>`:
//!   instance registration, [`MetaService::get_cache_location`] (batch,
//!   prefix, reverse sliding window, masks), two-phase writes
//!   ([`MetaService::start_write_cache`] / [`MetaService::finish_write_cache`])
//!   with session timeouts, removal, trimming and hard quotas; a sampling
//!   reclaimer that keeps groups under their soft watermarks
//!   ([`MetaService::reclaim_once`], [`MetaService::spawn_reclaimer`]); an
//!   LRU (CLOCK) search cache in front of the index for reads, and access
//!   statistics buffered in memory and applied in batches.
//! - Administration on [`MetaService`]: storage / group / instance CRUD
//!   with every refusal changing nothing ([`MetaError::AlreadyExists`],
//!   [`MetaError::InUse`], ...), accounts with salted API-key hashes and
//!   [`MetaService::authenticate`] giving a [`Principal`], whole-catalog
//!   [`ConfigSnapshot`]s, [`MetaService::check_health`] and
//!   [`MetaService::stats`].
//!
//! ```
//! # async fn demo() -> Result<(), kvtier_meta::MetaError> {
//! use std::sync::Arc;
//! use kvtier_meta::*;
//! let svc = MetaService::new(Arc::new(MemoryIndex::new()), MetaConfig::default())?;
//! svc.put_storage(Storage { name: "s3".into(), kind: StorageKind::S3,
//!     uri: "s3://kv/cache".into(), enabled: true, health: StorageHealth::Healthy,
//!     spec: None })?;
//! svc.put_group(InstanceGroup { name: "g".into(), quota_bytes: 1 << 40,
//!     kind_quota_bytes: Default::default(), watermark: 0.9,
//!     eviction: EvictionPolicy::Lru, storages: vec!["s3".into()], max_instances: 8,
//!     ..Default::default() })?;
//! svc.register_instance(Instance { id: "llama".into(), group: "g".into(),
//!     model: "llama-3-8b".into(), block_size: 64, spec_groups: vec![],
//!     location_specs: vec![LocationSpecInfo { name: "tp0".into(), size: 1 << 20 }] }).await?;
//! let keys = [BlockKey(1), BlockKey(2)];
//! let grant = svc.start_write_cache("llama", &keys).await?;
//! // ... the client writes the bytes to grant.blocks[i].location ...
//! svc.finish_write_cache("llama", grant.session, &[true, true]).await?;
//! let hit = svc.get_cache_location("llama", &LocationQuery::prefix(keys.to_vec())).await?;
//! assert_eq!(hit.matched, 2);
//! # Ok(()) }
//! ```

pub mod backend;
mod codec;
mod error;
pub mod index;
pub mod leader;
pub mod ledger;
pub mod matching;
pub mod model;
pub mod path_safe;
pub mod proto;
pub mod service;
#[cfg(feature = "test-support")]
pub mod test_support;

pub use backend::{
    BackendError, BackendFuture, BackendOpener, BackendUsage, CreateRequest, StorageBackend,
};
pub use error::{MetaError, Result};
pub use index::{
    AccessHit, Fence, MemoryIndex, MetaIndex, Modify, RecordKind, RedbIndex, RedisIndex,
    RedisIndexConfig, RedisIndexError, RedisLedger, RedisTimeouts,
};
pub use ledger::{Ledger, LocalLedger, SessionRecord, SessionTarget};
pub use matching::{BlockMask, MatchMode};
pub use model::*;
pub use service::{
    AdminCounters, ApiKey, ConfigSnapshot, DEFAULT_GROUP, GroupStats, HealthReport, MAX_NAME_BYTES,
    MIN_API_KEY_LEN, MetaStats, Principal, StorageStatus,
};
pub use service::{BackendStats, HealthCheckerHandle, LeaderWorkHandle, LeaderWorkIntervals};
pub use service::{
    CatalogRefresherHandle, FinishSummary, GroupReclaim, GroupUsage, LocationMatch, LocationQuery,
    MetaConfig, MetaService, PublishedPart, ReaperHandle, ReclaimReport, ReclaimStats,
    ReclaimerHandle, SessionId, TrimPolicy, WriteGrant, WriteTarget, stored_accounts,
};
