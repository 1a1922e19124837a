//! Settings and the request / response types of [`super::MetaService`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::SessionId;
use crate::backend::BackendOpener;
use crate::matching::{BlockMask, MatchMode};
use crate::model::{BlockKey, CacheLocation};

/// Service settings.
#[derive(Debug, Clone)]
pub struct MetaConfig {
    /// How long a write session may stay open. Default: 30 s.
    pub session_timeout: Duration,
    /// How often the reaper looks for expired sessions. Default: 1 s.
    pub reap_interval: Duration,
    /// Most keys in one request. Default: 65,536.
    pub max_keys: usize,
    /// Whether reads update last access / access count. Reads buffer them
    /// in memory; they reach the index in batches (see
    /// `access_flush_keys`). Default: true.
    pub record_access: bool,
    /// Buffered read hits (keys) past which the read that crosses the
    /// bound starts a background flush of the access statistics (at four
    /// times the bound, with one still running, it flushes inline); the
    /// reclaimer also flushes before every round. A flush applies one
    /// update per distinct key, so a large bound folds repeated reads of
    /// hot prefixes together: at 1 Mi keys (8 MiB of buffered keys) the
    /// embedded index's flushes stop dominating the read path's tail
    /// (docs/benchmarks.md, `bench meta`). Default: 1,048,576.
    pub access_flush_keys: usize,
    /// Entries of the search cache (per instance and block key, the serving
    /// location a read returns); 0 disables it. Default: 1,048,576.
    /// With a shared index and several frontends another frontend's writes
    /// are not seen by this cache: set 0 there, or a short
    /// `search_cache_ttl`.
    pub search_cache_entries: usize,
    /// Longest time a search cache answer is used; `None`: until evicted
    /// or invalidated by this process's own writes (right for one frontend
    /// per index). Default: `None`.
    pub search_cache_ttl: Option<Duration>,
    /// The reclaimer stops a group at `watermark - reclaim_hysteresis` of
    /// its quota, so it does not run again at the next write. Default: 0.05.
    pub reclaim_hysteresis: f64,
    /// Records sampled per instance for each victim batch. More is closer
    /// to exact LRU/LFU and costs more per batch. Default: 512.
    pub reclaim_sample: usize,
    /// Most blocks removed per index call. Default: 256.
    pub reclaim_batch: usize,
    /// Most victim batches per group per round, so one round is bounded
    /// even when sampling keeps missing. Default: 1,024.
    pub reclaim_max_batches: usize,
    /// Directories under which storages added through the admin API
    /// (`add_storage`, `update_storage`, snapshot loads) may keep
    /// `file://` data; a directory outside every root is refused before
    /// anything is created. `None`: no limit (an embedder that trusts its
    /// callers); the binary always sets it (`meta.storage_roots`).
    /// Default: `None`.
    pub storage_roots: Option<Vec<PathBuf>>,
    /// Opens the backend of a storage added or changed at runtime, and of
    /// every storage at start ([`super::MetaService::attach_configured_backends`]).
    /// `None`: the service opens none; backends are attached by hand with
    /// [`super::MetaService::attach_backend`]. Default: `None`.
    pub backend_opener: Option<Arc<dyn BackendOpener>>,
    /// With an index several frontends share, how old a block record with
    /// a writing location must be before that location counts as orphaned
    /// (the frontend that granted it is gone): the start-up recovery
    /// removes only those, leaving other frontends' writes in flight alone,
    /// and, unless the ledger is shared (then every writing location
    /// belongs to a session the leader reaps), the leader sweeps them
    /// every `orphan_write_age`
    /// ([`super::MetaService::sweep_orphaned_writes`]). Keep it above
    /// every frontend's `session_timeout` plus a reaper round. `None` (one
    /// frontend per index): every writing location found at start is
    /// orphaned, and nothing sweeps later. Default: `None`.
    pub orphan_write_age: Option<Duration>,
    /// Shortest API key (account password) accepted, in characters.
    /// Tair KVCM takes any (its tests send `"pass123"`; it never checks
    /// them): set 0 for its tooling, knowing that such keys are what
    /// authentication then rests on. Default: [`super::MIN_API_KEY_LEN`].
    pub min_api_key_len: usize,
    /// Whether removing a storage that a group lists, or a group that has
    /// instances, is refused ([`crate::MetaError::InUse`]). Tair KVCM
    /// removes them: set false for its behaviour, where the group's writes
    /// then skip the storage, the instances' writes fail, and the blocks
    /// already stored are never freed. A group that accounts are scoped to
    /// is refused either way. Default: true.
    pub strict_removals: bool,
}

impl Default for MetaConfig {
    fn default() -> Self {
        MetaConfig {
            session_timeout: Duration::from_secs(30),
            reap_interval: Duration::from_secs(1),
            max_keys: 65_536,
            record_access: true,
            access_flush_keys: 1 << 20,
            search_cache_entries: 1 << 20,
            search_cache_ttl: None,
            reclaim_hysteresis: 0.05,
            reclaim_sample: 512,
            reclaim_batch: 256,
            reclaim_max_batches: 1024,
            storage_roots: None,
            backend_opener: None,
            orphan_write_age: None,
            min_api_key_len: super::MIN_API_KEY_LEN,
            strict_removals: true,
        }
    }
}

/// A `get_cache_location` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocationQuery {
    /// Block keys in sequence order.
    pub keys: Vec<BlockKey>,
    /// Matching mode.
    pub mode: MatchMode,
    /// Positions to skip.
    pub mask: BlockMask,
}

impl LocationQuery {
    /// A prefix query without mask.
    pub fn prefix(keys: Vec<BlockKey>) -> Self {
        LocationQuery {
            keys,
            mode: MatchMode::Prefix,
            mask: BlockMask::None,
        }
    }
}

/// A `get_cache_location` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocationMatch {
    /// Keys mode: blocks found. Prefix: length of the matched prefix
    /// (masked positions included). Sliding window: the resume point.
    pub matched: usize,
    /// One entry per query key: the serving location where returned.
    /// Shared with the search cache, so an answer costs no deep clone.
    pub locations: Vec<Option<Arc<CacheLocation>>>,
}

/// One block granted for writing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteTarget {
    /// The block.
    pub key: BlockKey,
    /// Where to write it (status `Writing`).
    pub location: CacheLocation,
}

/// A `start_write_cache` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteGrant {
    /// Pass to `finish_write_cache`.
    pub session: SessionId,
    /// Blocks to write, in request order; finish flags follow this order.
    pub blocks: Vec<WriteTarget>,
    /// Keys not granted: already serving or being written by someone else.
    pub skipped: Vec<BlockKey>,
}

/// A `finish_write_cache` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FinishSummary {
    /// Locations now serving.
    pub served: usize,
    /// Locations removed (reported failed, or removed meanwhile).
    pub dropped: usize,
}

/// What `trim_cache` drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrimPolicy {
    /// Every block of the instance.
    All,
    /// All but the `keep` most recently used.
    Lru {
        /// Blocks kept.
        keep: usize,
    },
    /// All but the `keep` most frequently used.
    Lfu {
        /// Blocks kept.
        keep: usize,
    },
    /// Blocks idle for at least this long.
    IdleFor(Duration),
}

/// Stops the background reaper when dropped.
#[derive(Debug)]
pub struct ReaperHandle(pub(super) JoinHandle<()>);

impl Drop for ReaperHandle {
    fn drop(&mut self) {
        self.0.abort();
    }
}
