//! The metadata service (`meta`, the global KV cache manager of Tair KVCM's
//! APIs) as the binary runs it: opening the metadata index the configuration
//! names, bootstrapping a fresh service (storage and group `default`, the
//! admin account), attaching storage backends, the background tasks
//! (reclaimer, health checks) and the four listeners. `kvtier serve` hosts
//! it next to the node daemon; `kvtier meta` runs it alone, typically as a
//! stateless frontend over a shared Redis/Valkey.

use anyhow::{Context, Result, bail};
use clap::Args;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kvtier_backend::{BackendOptions, FilePool, FilePoolOptions, PoolSpaceError};
use kvtier_meta::{
    ApiKey, DEFAULT_GROUP, LeaderWorkHandle, LeaderWorkIntervals, Ledger, LocalLedger, MemoryIndex,
    MetaConfig, MetaIndex, MetaService, RedbIndex, RedisIndex, RedisIndexConfig, Role, Storage,
    StorageHealth, StorageKind, leader::Elector,
};
use kvtier_node::NodeHost;
use kvtier_server::{AuthMode, MetaServer, RunningServer, ServerConfig};

use crate::config::{AccountRole, Config, MetaAccountConfig};

mod election;

/// A running metadata service: the service, its listeners and background
/// tasks. Dropping it stops the background tasks; call
/// [`RunningMeta::shutdown`] to finish in-flight requests first.
pub struct RunningMeta {
    /// The service.
    pub svc: Arc<MetaService>,
    /// This frontend's leader election.
    pub elector: Arc<Elector>,
    server: RunningServer,
    _tasks: BackgroundTasks,
}

/// Handles whose drop stops the service's background tasks.
struct BackgroundTasks {
    /// The reclaimer and health checks, on the leader only.
    _leader_work: LeaderWorkHandle,
    _catalog: Option<kvtier_meta::CatalogRefresherHandle>,
}

/// The node of this host, when the process runs one.
pub struct HostNode {
    /// Its name (`kvtier://<name>` storages are on it).
    pub name: String,
    /// The node (open once its block shape is known).
    pub host: Arc<NodeHost>,
    /// Its metrics, served on the admin `/metrics` beside the service's.
    pub metrics: kvtier_server::ExtraMetrics,
    /// Its cluster identity when it runs a peer server: other nodes'
    /// storages are probed through their peer servers with it.
    pub peer_identity: Option<kvtier_backend::PeerIdentity>,
}

impl RunningMeta {
    /// Opens the index, bootstraps, attaches backends and starts listening.
    /// `node` is this host's node when the process runs one (for
    /// `kvtier://<node>` storages and its metrics).
    pub async fn start(config: &Config, node: Option<HostNode>) -> Result<Self> {
        let m = &config.meta;
        let accounts = configured_accounts(config)?;
        let index = open_index(config)?;
        let extra_metrics = node.as_ref().map(|h| h.metrics.clone());
        let peer_identity = node.as_ref().and_then(|h| h.peer_identity.clone());
        let options = BackendOptions {
            local_node: node.map(|h| (h.name, h.host)),
            peer_identity,
            file_pool: pool_options(config),
            // As the node's G4 (and the shared G4's writer) reach theirs.
            s3: kvtier_backend::S3Options::from_env(),
        };
        let mut meta_config = MetaConfig {
            session_timeout: Duration::from_secs(m.session_timeout_secs),
            max_keys: m.max_keys,
            storage_roots: Some(storage_roots(config)?),
            // Storages added at runtime get their backends at once, the
            // same way as those present at start.
            backend_opener: Some(Arc::new(options)),
            min_api_key_len: m.min_api_key_len,
            strict_removals: m.strict_removals,
            ..MetaConfig::default()
        };
        if shared_index(config) {
            // Another frontend's removals are invisible to this cache: bound
            // how long a location it no longer serves can be handed out.
            match m.shared_cache_ttl_ms {
                0 => meta_config.search_cache_entries = 0,
                ms => meta_config.search_cache_ttl = Some(Duration::from_millis(ms)),
            }
            // Other frontends' writes in flight are not this start's to
            // remove: only those past twice the session timeout are orphans.
            meta_config.orphan_write_age = Some(Duration::from_secs(
                m.session_timeout_secs.saturating_mul(2),
            ));
        }
        let svc = Arc::new(
            index
                .service(meta_config)
                .context("opening the metadata service")?,
        );
        bootstrap(&svc, config, &accounts)?;
        // Restores each file pool's allocation map from the index before
        // the first write, so live extents are never handed out twice; a
        // storage that cannot be opened is marked unhealthy and logged, so
        // one bad storage does not stop the service.
        svc.attach_configured_backends();
        let elector = election::start(config).await?;
        let every = LeaderWorkIntervals {
            reclaim: Duration::from_secs(m.reclaim_interval_secs.max(1)),
            health: Duration::from_secs(m.health_interval_secs.max(1)),
        };
        let tasks = BackgroundTasks {
            _leader_work: svc.spawn_leader_work(&elector, every),
            // Only a shared index changes behind this process's back.
            _catalog: shared_index(config).then(|| {
                svc.spawn_catalog_refresher(Duration::from_secs(m.catalog_refresh_secs.max(1)))
            }),
        };
        let server_config = ServerConfig {
            extra_metrics,
            elector: Some(elector.clone()),
            ..server_config(config)?
        };
        let server = MetaServer::start(svc.clone(), server_config)
            .await
            .context("starting the meta and admin listeners")?;
        tracing::info!(
            meta_grpc = %server.meta_grpc_addr(),
            meta_http = %server.meta_http_addr(),
            admin_grpc = %server.admin_grpc_addr(),
            admin_http = %server.admin_http_addr(),
            index = %m.index,
            auth = m.auth,
            node_id = %elector.node_id(),
            leader = elector.is_leader(),
            "metadata service listening"
        );
        Ok(RunningMeta {
            svc,
            elector,
            server,
            _tasks: tasks,
        })
    }

    /// Stops accepting requests and waits for in-flight ones, then gives
    /// the leader lease up (if held) so another frontend takes over at once.
    pub async fn shutdown(self) {
        if let Err(e) = self.server.shutdown().await {
            tracing::warn!("stopping the listeners: {e}");
        }
        drop(self._tasks);
        if let Err(e) = self.elector.shutdown().await {
            tracing::warn!("giving the leader lease up: {e}");
        }
        if let Err(e) = self.svc.flush_access() {
            tracing::warn!("flushing access statistics: {e}");
        }
    }
}

fn shared_index(config: &Config) -> bool {
    config.meta.index.starts_with("redis://") || config.meta.index.starts_with("rediss://")
}

/// A metadata index and the write ledger that goes with it.
pub struct OpenIndex {
    /// The index.
    pub index: Arc<dyn MetaIndex>,
    /// Its ledger: a Redis index's own, shared by every frontend on it;
    /// this process's memory for an index only this process opens.
    pub ledger: Arc<dyn Ledger>,
}

impl OpenIndex {
    /// `index` with a ledger in this process's memory.
    pub fn local(index: Arc<dyn MetaIndex>) -> Self {
        OpenIndex {
            index,
            ledger: Arc::new(LocalLedger::new()),
        }
    }

    /// A Redis/Valkey index at `url` under key prefix `prefix`, with its
    /// shared ledger; `fenced`: leader-only writes fence on the epoch of a
    /// lease kept on the same server under the same prefix
    /// (docs/server.md §9).
    pub fn redis(url: &str, prefix: &str, fenced: bool) -> Result<Self> {
        let cfg = RedisIndexConfig {
            prefix: prefix.to_owned(),
            leader_epoch_key: fenced.then(|| kvtier_meta::leader::RedisLease::epoch_key(prefix)),
            ..RedisIndexConfig::default()
        };
        let index = RedisIndex::open(url, cfg).with_context(|| format!("connecting to {url}"))?;
        Ok(OpenIndex {
            ledger: Arc::new(index.ledger()),
            index: Arc::new(index),
        })
    }

    /// The service over this index and ledger.
    pub fn service(self, config: MetaConfig) -> kvtier_meta::Result<MetaService> {
        MetaService::with_ledger(self.index, self.ledger, config)
    }
}

fn open_index(config: &Config) -> Result<OpenIndex> {
    let m = &config.meta;
    Ok(match m.index.as_str() {
        "memory" => OpenIndex::local(Arc::new(MemoryIndex::new())),
        "embedded" => {
            let dir = &config.serve.data_dir;
            // Made 0700 if missing; an existing one keeps the mode
            // `kvtier serve` gave it (0710 with manager.access_group).
            kvtier_io::create_private_dir_all(dir)
                .with_context(|| format!("creating {}", dir.display()))?;
            let path = dir.join("meta.redb");
            private_file(&path)?;
            OpenIndex::local(Arc::new(RedbIndex::open(&path, 256 << 20).with_context(
                || format!("opening the metadata index {}", path.display()),
            )?))
        }
        url => {
            // The lease lives beside the index (same server, same prefix):
            // the reclaimer's writes fence on its epoch there.
            let fenced = m.leader_lock.is_empty() || m.leader_lock == m.index;
            OpenIndex::redis(url, &m.redis_prefix, fenced)?
        }
    })
}

/// Makes `path` a file of this user's alone before a library opens it
/// with its own mode (redb creates files 0644 under umask 022): created
/// empty with mode 0600 if missing, narrowed to 0600 if wider (a file of an
/// older build).
fn private_file(path: &Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(kvtier_io::PRIVATE_FILE_MODE)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    kvtier_io::restrict_mode(&file, kvtier_io::PRIVATE_FILE_MODE)
        .with_context(|| format!("setting the mode of {}", path.display()))
}

fn server_config(config: &Config) -> Result<ServerConfig> {
    let m = &config.meta;
    let ip: IpAddr = m.bind.parse().context("meta.bind")?;
    let at = |port| SocketAddr::new(ip, port);
    Ok(ServerConfig {
        meta_grpc: at(m.rpc_port),
        meta_http: at(m.http_port),
        admin_grpc: at(m.admin_rpc_port),
        admin_http: at(m.admin_http_port),
        auth: if m.auth {
            AuthMode::ApiKeys
        } else {
            AuthMode::Disabled
        },
        allow_unauthenticated_remote: m.allow_unauthenticated_remote,
        max_body_bytes: usize::try_from(m.max_body.0).unwrap_or(usize::MAX),
        follower_requests: m.follower_requests,
        ..ServerConfig::default()
    })
}

/// The settings of every file pool: `meta.pool_capacity` in four files.
fn pool_options(config: &Config) -> FilePoolOptions {
    FilePoolOptions {
        files: 4,
        file_size: (config.meta.pool_capacity.0 / 4).max(4096),
        ..FilePoolOptions::default()
    }
}

/// The directory of the default group's file pool, when it is one: the
/// configured `file:///dir`, or `<data_dir>/pool`.
fn default_pool_dir(config: &Config) -> Result<Option<PathBuf>> {
    let storage = &config.meta.default_storage;
    if storage.is_empty() {
        return absolute(&config.pool_dir()).map(Some);
    }
    Ok(kvtier_meta::path_safe::file_uri_dir(storage))
}

/// Refuses, creating nothing, a configuration whose default file pool does
/// not fit on its file system: `kvtier serve` asks this before it creates
/// the memory arena and the disk tier, so a pool that cannot be reserved
/// stops the start before anything else exists.
pub fn check_default_pool_space(config: &Config) -> Result<()> {
    if !config.meta.enabled {
        return Ok(());
    }
    let Some(dir) = default_pool_dir(config)? else {
        return Ok(());
    };
    FilePool::check_space(&dir, &pool_options(config))
        .map_err(pool_error)
        .context("the default file pool (meta.pool_capacity) does not fit")
}

/// Why a start with `meta.auth` on and no administrator is refused.
const NO_ADMIN: &str = "meta.auth is on but no admin account exists: set KVTIER_META__ADMIN_API_KEY to create one, or list an admin in [[meta.accounts]]";

/// Refuses `meta.auth` with no administrator to be had — no
/// `meta.admin_api_key`, no admin in `[[meta.accounts]]`, none stored in
/// the index — before `kvtier serve` creates the arena and the disk tier.
/// An embedded index that does not exist yet is not created to find out.
pub fn check_admin_exists(config: &Config) -> Result<()> {
    let m = &config.meta;
    let configured =
        m.admin_api_key.is_some() || m.accounts.iter().any(|a| a.role == AccountRole::Admin);
    if !m.enabled || !m.auth || configured {
        return Ok(());
    }
    let stored = match m.index.as_str() {
        "memory" => false,
        "embedded" if !config.serve.data_dir.join("meta.redb").exists() => false,
        _ => kvtier_meta::stored_accounts(open_index(config)?.index.as_ref())
            .context("reading the accounts of the metadata index")?
            .iter()
            .any(|a| a.role == Role::Admin),
    };
    if !stored {
        bail!("{NO_ADMIN}");
    }
    Ok(())
}

/// `e` for the log: a [`PoolSpaceError`] as itself (not under the I/O
/// error that carries it, which would print it twice).
fn pool_error(e: kvtier_meta::BackendError) -> anyhow::Error {
    match PoolSpaceError::find(&e) {
        Some(space) => anyhow::Error::new(space.clone()),
        None => anyhow::Error::new(e),
    }
}

/// The storage of the `default` group: the configured base URI, or a file
/// pool under the data directory.
fn default_storage(config: &Config) -> Result<Storage> {
    let m = &config.meta;
    let (kind, uri) = if m.default_storage.is_empty() {
        let dir = absolute(&config.pool_dir())?;
        // Engines that use it directly must run as the daemon's user: the
        // pool holds every tenant's blocks.
        kvtier_node::access::make_private_dir(&dir)?;
        (StorageKind::FilePool, format!("file://{}", dir.display()))
    } else {
        let uri = m.default_storage.clone();
        let kind = match uri.split_once("://").map(|(s, _)| s) {
            Some("file") => StorageKind::FilePool,
            Some("s3") => StorageKind::S3,
            Some("kvtier") => StorageKind::KvtierNode,
            _ => bail!("meta.default_storage {uri:?}: expected a file://, s3:// or kvtier:// URI"),
        };
        (kind, uri)
    };
    Ok(Storage {
        name: "local".into(),
        kind,
        uri,
        enabled: true,
        health: StorageHealth::Healthy,
        spec: None,
    })
}

/// `meta.storage_roots` (default `<data_dir>/pool`) as absolute paths.
fn storage_roots(config: &Config) -> Result<Vec<PathBuf>> {
    config.storage_roots().iter().map(|r| absolute(r)).collect()
}

fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("resolving {}", p.display()))
}

/// A `[[meta.accounts]]` entry with its key read.
pub struct ConfiguredAccount<'a> {
    entry: &'a MetaAccountConfig,
    /// The key from `key_env`, or `None` when the entry gives `key_hash`.
    key: Option<String>,
}

/// The configured accounts with their keys read from the environment; an
/// unset or empty `key_env` variable is an error naming it. Called before
/// anything is created, so a missing key leaves no state behind.
pub fn configured_accounts(config: &Config) -> Result<Vec<ConfiguredAccount<'_>>> {
    config
        .meta
        .accounts
        .iter()
        .map(|entry| {
            let key = match &entry.key_env {
                Some(var) => Some(
                    std::env::var(var)
                        .ok()
                        .filter(|k| !k.is_empty())
                        .with_context(|| {
                            format!(
                                "meta.accounts {:?}: environment variable {var} (key_env) is not set",
                                entry.name
                            )
                        })?,
                ),
                None => None,
            };
            Ok(ConfiguredAccount { entry, key })
        })
        .collect()
}

/// Creates or replaces one configured account.
fn provision(svc: &MetaService, account: &ConfiguredAccount<'_>) -> Result<()> {
    let e = account.entry;
    let key = match (&account.key, &e.key_hash) {
        (Some(k), _) => ApiKey::Clear(k),
        (None, Some(h)) => ApiKey::Hashed(h),
        (None, None) => bail!("meta.accounts {:?}: no key", e.name),
    };
    let role = match e.role {
        AccountRole::User => Role::User,
        AccountRole::Admin => Role::Admin,
    };
    svc.put_account(&e.name, role, key, e.groups.clone())
        .with_context(|| format!("provisioning account {:?} from meta.accounts", e.name))
}

/// Storage and group `default` on a fresh service (never overwrites), the
/// bootstrap admin account when a key is configured, and the configured
/// accounts (created or replaced).
fn bootstrap(svc: &MetaService, config: &Config, accounts: &[ConfiguredAccount<'_>]) -> Result<()> {
    let fresh = svc.get_group(DEFAULT_GROUP).is_err();
    svc.ensure_default_group(default_storage(config)?)
        .context("creating the default group")?;
    if fresh && config.meta.default_group_quota.0 > 0 {
        let (mut group, _) = svc.get_group(DEFAULT_GROUP)?;
        group.quota_bytes = config.meta.default_group_quota.0;
        svc.update_group(group)
            .context("setting the default group's quota")?;
    }
    for account in accounts {
        provision(svc, account)?;
    }
    if let Some(key) = &config.meta.admin_api_key {
        svc.put_account("admin", Role::Admin, ApiKey::Clear(key), Vec::new())
            .context("creating the admin account")?;
    } else if config.meta.auth && svc.list_accounts().iter().all(|a| a.role != Role::Admin) {
        bail!("{NO_ADMIN}");
    }
    Ok(())
}

/// Arguments of `kvtier meta`.
#[derive(Args)]
pub struct MetaArgs {
    /// Metadata index: `embedded`, `memory` or a `redis://host:port/db`
    /// URL shared with other frontends (overrides `meta.index`; `--meta`,
    /// the old name, still works).
    #[arg(long, alias = "meta")]
    index: Option<String>,
    /// Data directory for the embedded index and the default file pool
    /// (overrides `serve.data_dir`).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Address to bind the listeners to (overrides `meta.bind`).
    #[arg(long)]
    bind: Option<String>,
}

/// Runs `kvtier meta` until SIGINT or SIGTERM.
pub fn run(config_path: Option<&Path>, args: MetaArgs) -> Result<()> {
    let mut config = crate::config::load(config_path)?;
    if let Some(index) = args.index {
        config.meta.index = index;
    }
    if let Some(d) = args.data_dir {
        config.serve.data_dir = d;
    }
    if let Some(b) = args.bind {
        config.meta.bind = b;
    }
    config.validate().context("invalid configuration")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let signals = crate::serve::Signals::install()?;
        let meta = RunningMeta::start(&config, None).await?;
        tracing::info!("kvtier meta ready; Ctrl-C or SIGTERM to stop");
        signals.wait_only().await;
        tracing::info!("shutting down");
        meta.shutdown().await;
        tracing::info!("stopped cleanly");
        Ok(())
    })
}
