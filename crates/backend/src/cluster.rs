//! [`MetaClusterLookup`]: the node's [`ClusterLookup`] over the metadata
//! service. A session's keys past the node's own prefix are looked up as
//! the node view publishes them (the session's instance, spec
//! `tp<rank>`); each location found is taken only if it is another
//! node's, authenticated ([`crate::location`]) for exactly this session's
//! namespace and the key asked. Answers are cached briefly; each call is
//! bounded by a deadline, and while the service errs or is slow the node
//! answers from its own tiers only, with one warning per outage. With the
//! cluster's shared G4 ([`SharedLookup`]), the keys past the located peer
//! prefix are looked up, within the same deadline, in the shared instance
//! by their shared keys, and the prefix continues there.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kvtier_core::BlockHash;
use kvtier_meta::{BlockKey, CacheLocation, LocationQuery, MetaService};
use kvtier_node::{
    ClusterBlock, ClusterLookup, CommittedKey, PeerLocation, SessionNamespace, SharedKeys,
    SharedLocation,
};
use kvtier_tier::BoxFuture;
use parking_lot::Mutex;

use crate::location::{Located, LocationKey, verify_mac};
use crate::node_store::PublishedBlock;
use crate::node_view::{node_storage, source_of};
use crate::shared_g4::{SHARED_SPEC, shared_block_key};

/// Keys asked of the service per lookup at most (below its default
/// `max_keys`); a longer prefix is found by the next lookup.
const MAX_KEYS: usize = 512;

/// How a [`MetaClusterLookup`] asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterLookupConfig {
    /// This node's name: its own locations are never answered.
    pub node_name: String,
    /// The longest a lookup waits for the service (`peer.lookup_timeout_ms`).
    pub timeout: Duration,
    /// How long an answer is reused.
    pub cache_ttl: Duration,
    /// Answers cached at most; past it the cache starts over.
    pub cache_max: usize,
    /// The cluster's shared G4, when it has one: where the prefix goes on
    /// past the peers' blocks.
    pub shared: Option<SharedLookup>,
}

/// Where a cluster lookup finds the shared G4's blocks (docs/meta-api.md
/// §10.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedLookup {
    /// The cluster's shared keys.
    pub keys: SharedKeys,
    /// The instance the shared blocks are recorded under
    /// (`shared_g4.instance`).
    pub instance: String,
}

impl ClusterLookupConfig {
    /// Node `node_name`: a 50 ms deadline, answers cached for a second,
    /// at most 65,536 of them.
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            timeout: Duration::from_millis(50),
            cache_ttl: Duration::from_secs(1),
            cache_max: 1 << 16,
            shared: None,
        }
    }
}

/// Counters of the cluster lookups, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClusterLookupStats {
    /// Calls to the metadata service.
    pub queries: u64,
    /// Lookups answered from the cache.
    pub cached: u64,
    /// Locations refused: a MAC that does not check out, no peer fields,
    /// or a URI that does not parse.
    pub rejected: u64,
    /// Calls that ran past the deadline.
    pub timeouts: u64,
    /// Calls the service refused.
    pub errors: u64,
    /// Locations a node answered it no longer holds, dropped from the
    /// service (docs/meta-api.md §10.4).
    pub reported: u64,
}

/// Counters `rows` (name, help, value) as OpenMetrics families named
/// `<prefix><name>`, for the admin `/metrics`.
pub(crate) fn counter_families(prefix: &str, rows: &[(&str, &str, u64)]) -> String {
    let mut out = String::new();
    for (name, help, value) in rows {
        let name = format!("{prefix}{name}");
        out.push_str(&format!(
            "# TYPE {name} counter\n# HELP {name} {help}\n{name}_total {value}\n"
        ));
    }
    out
}

/// Index queries one node runs at once. The service's index calls block
/// (a Redis round trip each), so they run on the blocking pool, where a
/// stalled index keeps each for up to its response timeout: this bounds
/// the threads a stall can hold. A lookup finding none free answers from
/// the node's own tiers, as on a timeout.
const MAX_QUERIES_IN_FLIGHT: usize = 16;

/// A cached answer for one (namespace, client key): where it is, or not
/// found.
type Cached = (Instant, Option<ClusterBlock>);

/// The node's cluster lookup over a metadata service.
pub struct MetaClusterLookup {
    svc: Arc<MetaService>,
    key: LocationKey,
    config: ClusterLookupConfig,
    /// By (namespace digest, client key).
    cache: Mutex<HashMap<(u128, u128), Cached>>,
    /// Set while the service is away: warned once, cleared when it answers.
    away: AtomicBool,
    /// Index queries running on the blocking pool; a query past
    /// [`MAX_QUERIES_IN_FLIGHT`] is not started (a timeout).
    in_flight: Arc<tokio::sync::Semaphore>,
    queries: AtomicU64,
    cached: AtomicU64,
    rejected: AtomicU64,
    timeouts: AtomicU64,
    errors: AtomicU64,
    reported: AtomicU64,
}

impl std::fmt::Debug for MetaClusterLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaClusterLookup")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl MetaClusterLookup {
    /// Looks up over `svc`, taking locations authenticated with `key`.
    pub fn new(svc: Arc<MetaService>, key: LocationKey, config: ClusterLookupConfig) -> Self {
        Self {
            svc,
            key,
            config,
            cache: Mutex::new(HashMap::new()),
            away: AtomicBool::new(false),
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_QUERIES_IN_FLIGHT)),
            queries: AtomicU64::new(0),
            cached: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            reported: AtomicU64::new(0),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> ClusterLookupStats {
        ClusterLookupStats {
            queries: self.queries.load(Ordering::Relaxed),
            cached: self.cached.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            timeouts: self.timeouts.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            reported: self.reported.load(Ordering::Relaxed),
        }
    }

    /// Forgets every cached answer (a test, or an operator, wants the
    /// service's current view now).
    pub fn clear_cache(&self) {
        self.cache.lock().clear();
    }

    /// The counters as OpenMetrics text, for the admin `/metrics`.
    pub fn metrics_text(&self) -> String {
        let s = self.stats();
        let rows = [
            (
                "queries",
                "Cluster lookups sent to the metadata service",
                s.queries,
            ),
            (
                "cached",
                "Cluster lookups answered from the cache",
                s.cached,
            ),
            (
                "rejected",
                "Cluster locations refused (MAC, fields, URI)",
                s.rejected,
            ),
            (
                "timeouts",
                "Cluster lookups past their deadline",
                s.timeouts,
            ),
            (
                "errors",
                "Cluster lookups the metadata service refused",
                s.errors,
            ),
            (
                "reported",
                "Stale cluster locations dropped from the metadata service",
                s.reported,
            ),
        ];
        counter_families("kvtier_node_cluster_lookup_", &rows)
    }

    /// The prefix of `keys` the cache answers in full (ending at a cached
    /// miss or the last key), or `None` when some key of it is not cached.
    fn cached_prefix(&self, digest: u128, keys: &[CommittedKey]) -> Option<Vec<ClusterBlock>> {
        let now = Instant::now();
        let cache = self.cache.lock();
        let mut out = Vec::new();
        for k in keys {
            match cache.get(&(digest, k.client.0)) {
                Some((until, _)) if *until <= now => return None,
                Some((_, Some(loc))) => out.push(loc.clone()),
                Some((_, None)) => return Some(out),
                None => return None,
            }
        }
        Some(out)
    }

    /// Caches `found` for the leading keys of `keys` and a miss for the
    /// key after them, if any.
    fn remember(&self, digest: u128, keys: &[CommittedKey], found: &[ClusterBlock]) {
        let until = Instant::now() + self.config.cache_ttl;
        let mut cache = self.cache.lock();
        if cache.len() + found.len() + 1 > self.config.cache_max {
            cache.clear();
        }
        for (k, loc) in keys.iter().zip(found) {
            cache.insert((digest, k.client.0), (until, Some(loc.clone())));
        }
        if let Some(k) = keys.get(found.len()) {
            cache.insert((digest, k.client.0), (until, None));
        }
    }

    /// Asks the service for the peers' prefix, then the shared G4's
    /// continuation, within one deadline; `None` when it erred or was too
    /// slow for the first.
    async fn ask(&self, ns: &SessionNamespace, keys: &[CommittedKey]) -> Option<Vec<ClusterBlock>> {
        let deadline = tokio::time::Instant::now() + self.config.timeout;
        let peers = self.ask_peers(ns, keys, deadline).await?;
        let mut found: Vec<ClusterBlock> = peers.into_iter().map(ClusterBlock::Peer).collect();
        if let Some(shared) = &self.config.shared
            && found.len() < keys.len()
        {
            let rest = &keys[found.len()..];
            found.extend(self.ask_shared(shared, ns, rest, deadline).await);
        }
        Some(found)
    }

    /// The shared G4's prefix of `keys`, looked up by their shared keys;
    /// empty when the service errs or the deadline passes (counted).
    async fn ask_shared(
        &self,
        shared: &SharedLookup,
        ns: &SessionNamespace,
        keys: &[CommittedKey],
        deadline: tokio::time::Instant,
    ) -> Vec<ClusterBlock> {
        let map = shared.keys.key_map(&ns.namespace);
        let ids: Vec<BlockHash> = keys.iter().map(|k| map.stored(k.client)).collect();
        let asked = ids.iter().map(|&s| shared_block_key(s)).collect();
        let Some(found) = self.query(&shared.instance, asked, deadline).await else {
            return Vec::new();
        };
        (ids.into_iter().zip(found))
            .map_while(|(shared, loc)| {
                let part = loc?
                    .specs
                    .iter()
                    .find(|s| s.name == SHARED_SPEC)?
                    .uri
                    .clone();
                Some(ClusterBlock::Shared(SharedLocation { uri: part, shared }))
            })
            .collect()
    }

    /// Asks the service for the peers' locations, by `deadline`; `None`
    /// when it erred or was too slow.
    async fn ask_peers(
        &self,
        ns: &SessionNamespace,
        keys: &[CommittedKey],
        deadline: tokio::time::Instant,
    ) -> Option<Vec<PeerLocation>> {
        let source = source_of(ns);
        let asked = keys.iter().map(|k| BlockKey(k.client.0 as u64)).collect();
        let found = self.query(&source.instance, asked, deadline).await?;
        let digest = ns.namespace.digest();
        let mut out = Vec::new();
        for (k, loc) in keys.iter().zip(found) {
            let Some(loc) = loc.and_then(|l| self.accept(&l, &source.spec, digest, k)) else {
                break;
            };
            out.push(loc);
        }
        Some(out)
    }

    /// The service's locations of the prefix of `keys` in `instance`, by
    /// `deadline` (counted); none for an instance nobody wrote into;
    /// `None` when it erred or was too slow.
    async fn query(
        &self,
        instance: &str,
        keys: Vec<BlockKey>,
        deadline: tokio::time::Instant,
    ) -> Option<Vec<Option<Arc<CacheLocation>>>> {
        self.queries.fetch_add(1, Ordering::Relaxed);
        let instance = instance.to_owned();
        let running = self.off_workers(move |svc| async move {
            let query = LocationQuery::prefix(keys);
            svc.get_cache_location(&instance, &query).await
        });
        let Some(running) = running else {
            self.timeouts.fetch_add(1, Ordering::Relaxed);
            self.went_away("too many index queries in flight");
            return None;
        };
        let found = match tokio::time::timeout_at(deadline, running).await {
            Ok(Ok(Ok(found))) => found,
            Ok(Ok(Err(kvtier_meta::MetaError::InstanceNotFound(_)))) => return Some(Vec::new()),
            Ok(Ok(Err(e))) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                self.went_away(&e.to_string());
                return None;
            }
            Ok(Err(lost)) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                self.went_away(&format!("the index query was lost: {lost}"));
                return None;
            }
            // The query runs on; its answer is dropped.
            Err(_) => {
                self.timeouts.fetch_add(1, Ordering::Relaxed);
                self.went_away(&format!("no answer within {:?}", self.config.timeout));
                return None;
            }
        };
        if self.away.swap(false, Ordering::Relaxed) {
            tracing::info!("the metadata service answers cluster lookups again");
        }
        Some(found.locations)
    }

    /// Runs `call` over the service on the blocking pool, holding one of
    /// the in-flight permits until it returns; `None` when none is free.
    /// Why not on the caller's task: the service's index calls block, and
    /// a stalled index (a Redis that accepts and never answers) would hold
    /// the session's runtime worker past any deadline, stalling every
    /// session on it. The caller bounds its wait; a call it stops waiting
    /// for runs on, and its answer is dropped.
    fn off_workers<T, F, Fut>(&self, call: F) -> Option<tokio::task::JoinHandle<T>>
    where
        F: FnOnce(Arc<MetaService>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T>,
        T: Send + 'static,
    {
        let permit = self.in_flight.clone().try_acquire_owned().ok()?;
        let svc = self.svc.clone();
        let runtime = tokio::runtime::Handle::current();
        Some(tokio::task::spawn_blocking(move || {
            let _permit = permit;
            runtime.block_on(call(svc))
        }))
    }

    /// Warns once per outage.
    fn went_away(&self, why: &str) {
        if !self.away.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                reason = why,
                "the metadata service does not answer cluster lookups; answering from this node's tiers only"
            );
        }
    }

    /// The peer location of `loc`'s part of spec `spec` for key `k` of a
    /// session of namespace digest `digest`: `None` for this node's own,
    /// and for one not authenticated for exactly this namespace and key
    /// (counted).
    fn accept(
        &self,
        loc: &CacheLocation,
        spec: &str,
        digest: u128,
        k: &CommittedKey,
    ) -> Option<PeerLocation> {
        let part = loc.specs.iter().find(|s| s.name == spec)?;
        let parsed = PublishedBlock::parse_any(&part.uri);
        let (node, block, fields) = match parsed {
            Some((node, b)) => match b.peer {
                Some(f) => (node, b, f),
                None if node == self.config.node_name => return None,
                None => return self.reject(),
            },
            None => return self.reject(),
        };
        if node == self.config.node_name {
            return None;
        }
        let located = Located {
            namespace: digest,
            client: k.client.0,
            stored: block.stored,
            sum: fields.sum,
            node: &node,
            peer: fields.peer,
        };
        if !verify_mac(&self.key, &located, &fields.mac) {
            return self.reject();
        }
        Some(PeerLocation {
            node,
            addr: fields.peer,
            stored: block.stored(),
            sum: fields.sum,
        })
    }

    /// Drops `gone` (client keys of a session of `ns`, and the peer
    /// locations their nodes answered they do not hold) from the cache and
    /// each node's location from the service, within the lookup deadline:
    /// only the spec this session's lookups read, on that node's storage,
    /// so other copies (other nodes', the shared G4's) stay.
    async fn drop_stale(&self, ns: &SessionNamespace, gone: &[(BlockHash, PeerLocation)]) {
        let digest = ns.namespace.digest();
        {
            let mut cache = self.cache.lock();
            for (client, _) in gone {
                cache.remove(&(digest, client.0));
            }
        }
        let source = source_of(ns);
        let deadline = tokio::time::Instant::now() + self.config.timeout;
        let mut by_node: HashMap<&str, Vec<BlockKey>> = HashMap::new();
        for (client, at) in gone {
            (by_node.entry(at.node.as_str()).or_default()).push(BlockKey(client.0 as u64));
        }
        for (node, keys) in by_node {
            let (instance, spec) = (source.instance.clone(), source.spec.clone());
            let storage = node_storage(node);
            let drop = self.off_workers(move |svc| async move {
                svc.unpublish_parts(&instance, &storage, &spec, &keys).await
            });
            let Some(drop) = drop else {
                self.timeouts.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            match tokio::time::timeout_at(deadline, drop).await {
                Ok(Ok(Ok(n))) => {
                    self.reported.fetch_add(n as u64, Ordering::Relaxed);
                }
                Ok(Ok(Err(e))) => {
                    self.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(node, error = %e, "a stale location stays listed");
                }
                Ok(Err(lost)) => {
                    self.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(node, error = %lost, "a stale location stays listed");
                }
                Err(_) => {
                    self.timeouts.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    fn reject<T>(&self) -> Option<T> {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        None
    }
}

impl ClusterLookup for MetaClusterLookup {
    fn lookup<'a>(
        &'a self,
        ns: &'a SessionNamespace,
        keys: &'a [CommittedKey],
    ) -> BoxFuture<'a, Vec<ClusterBlock>> {
        Box::pin(async move {
            let keys = &keys[..keys.len().min(MAX_KEYS)];
            let digest = ns.namespace.digest();
            if let Some(found) = self.cached_prefix(digest, keys) {
                self.cached.fetch_add(1, Ordering::Relaxed);
                return found;
            }
            match self.ask(ns, keys).await {
                Some(found) => {
                    self.remember(digest, keys, &found);
                    found
                }
                None => Vec::new(),
            }
        })
    }

    fn missing<'a>(
        &'a self,
        ns: &'a SessionNamespace,
        gone: &'a [(BlockHash, PeerLocation)],
    ) -> BoxFuture<'a, ()> {
        Box::pin(self.drop_stale(ns, gone))
    }
}
