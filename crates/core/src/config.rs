//! Configuration: one TOML file, every key overridable from the environment.
//!
//! ```toml
//! [geometry]
//! preset = "llama3-8b"     # or layers / kv_heads / head_dim / latent_dim / dtype
//! tokens_per_block = 16
//!
//! [memory]
//! capacity = "1GiB"
//! shm_name = "kvtier"
//!
//! [disk]
//! dirs = ["/nvme0/kvtier", "/nvme1/kvtier"]
//! capacity_per_dir = "64GiB"
//! region_size = "64MiB"
//! io_engine = "auto"       # auto | io_uring | psync
//! ```
//!
//! An environment variable `KVTIER_<SECTION>__<KEY>` (double underscore
//! between section and key) replaces `<key>` in `[<section>]`, e.g.
//! `KVTIER_DISK__IO_ENGINE=psync` or `KVTIER_MEMORY__CAPACITY=8GiB`. The value
//! is read as a TOML value when it parses as one (`32`, `true`,
//! `["/a", "/b"]`), else as a string. Variables without `__` (such as
//! `KVTIER_CONFIG` or `KVTIER_LOG`) are not overrides. Unknown sections and
//! keys are errors, in the file and in the environment alike, so a typo never
//! passes silently. Sizes are integers (bytes) or strings with a unit
//! (`"64MiB"`, `"4G"`, `"512k"`).

use serde::{Deserialize, Deserializer, Serialize};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::{Attention, CoreError, Dtype, Geometry, ModelPreset, Result};

/// Prefix of environment overrides.
pub const ENV_PREFIX: &str = "KVTIER_";

/// A size in bytes, written as an integer or a string with a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for ByteSize {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num.parse().map_err(|_| {
            CoreError::InvalidConfig(format!("size {s:?} does not start with a number"))
        })?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            "t" | "tb" | "tib" => 1 << 40,
            other => {
                return Err(CoreError::InvalidConfig(format!(
                    "unknown size unit {other:?} in {s:?}"
                )));
            }
        };
        n.checked_mul(mult)
            .map(ByteSize)
            .ok_or_else(|| CoreError::InvalidConfig(format!("size {s:?} overflows")))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = [
            (1u64 << 40, "TiB"),
            (1 << 30, "GiB"),
            (1 << 20, "MiB"),
            (1 << 10, "KiB"),
        ];
        for (m, u) in units {
            if self.0 >= m && self.0.is_multiple_of(m) {
                return write!(f, "{}{u}", self.0 / m);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Which I/O engine the disk tier uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IoEngineKind {
    /// io_uring where `io_uring_setup` works, else the pread/pwrite pool.
    #[default]
    Auto,
    /// io_uring only; fail if unavailable.
    IoUring,
    /// The pread/pwrite thread pool only.
    Psync,
}

/// Eviction policy of the memory tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvictionPolicyKind {
    /// Least recently used.
    #[default]
    Lru,
}

/// Which region the disk tier reclaims first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegionEvictionKind {
    /// The oldest written region.
    #[default]
    Fifo,
    /// The region read least recently.
    Lru,
}

/// `[geometry]`: a preset, optionally with fields overridden, or every field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GeometryConfig {
    /// A [`ModelPreset`] name; `None` means every field below must be set.
    pub preset: Option<String>,
    /// Tokens per block.
    pub tokens_per_block: u32,
    /// Layers (overrides the preset).
    pub layers: Option<u32>,
    /// KV heads before TP sharding (MHA; overrides the preset).
    pub kv_heads: Option<u32>,
    /// Elements per head (MHA; overrides the preset).
    pub head_dim: Option<u32>,
    /// Latent elements per token (MLA; overrides the preset).
    pub latent_dim: Option<u32>,
    /// Element type name (overrides the preset).
    pub dtype: Option<String>,
    /// Tensor-parallel size.
    pub tp_size: u32,
    /// Tensor-parallel rank.
    pub tp_rank: u32,
}

impl Default for GeometryConfig {
    fn default() -> Self {
        Self {
            preset: Some(ModelPreset::Llama3_8B.name().into()),
            tokens_per_block: 16,
            layers: None,
            kv_heads: None,
            head_dim: None,
            latent_dim: None,
            dtype: None,
            tp_size: 1,
            tp_rank: 0,
        }
    }
}

impl GeometryConfig {
    /// Resolves the section into a validated [`Geometry`].
    pub fn resolve(&self) -> Result<Geometry> {
        let mut g = match &self.preset {
            Some(name) => name.parse::<ModelPreset>()?.geometry(self.tokens_per_block),
            None => {
                let layers = self.layers.ok_or_else(|| {
                    CoreError::InvalidConfig("[geometry] needs a preset or layers".into())
                })?;
                let attention = match (self.kv_heads, self.head_dim, self.latent_dim) {
                    (Some(kv_heads), Some(head_dim), None) => Attention::Mha { kv_heads, head_dim },
                    (None, None, Some(latent_dim)) => Attention::Mla { latent_dim },
                    _ => {
                        return Err(CoreError::InvalidConfig(
                            "[geometry] needs kv_heads and head_dim (MHA) or latent_dim (MLA)"
                                .into(),
                        ));
                    }
                };
                Geometry {
                    layers,
                    attention,
                    dtype: Dtype::Bf16,
                    tokens_per_block: self.tokens_per_block,
                    tp_size: 1,
                    tp_rank: 0,
                }
            }
        };
        if let Some(l) = self.layers {
            g.layers = l;
        }
        match (
            &mut g.attention,
            self.kv_heads,
            self.head_dim,
            self.latent_dim,
        ) {
            (Attention::Mha { kv_heads, head_dim }, k, h, None) => {
                *kv_heads = k.unwrap_or(*kv_heads);
                *head_dim = h.unwrap_or(*head_dim);
            }
            (Attention::Mla { latent_dim }, None, None, l) => {
                *latent_dim = l.unwrap_or(*latent_dim)
            }
            _ => {
                return Err(CoreError::InvalidConfig(
                    "[geometry] mixes MHA fields (kv_heads, head_dim) with MLA (latent_dim)".into(),
                ));
            }
        }
        if let Some(d) = &self.dtype {
            g.dtype = d.parse()?;
        }
        g.tp_size = self.tp_size;
        g.tp_rank = self.tp_rank;
        g.validate()?;
        Ok(g)
    }
}

/// `[memory]`: the shared-memory DRAM tier (G2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// Bytes of block slots in the arena.
    pub capacity: ByteSize,
    /// Name of the shared-memory file (`/dev/shm/<name>`) other processes
    /// map to read blocks.
    pub shm_name: String,
    /// Back the arena with huge pages (`MAP_HUGETLB`) when available.
    pub hugepages: bool,
    /// Eviction policy.
    pub policy: EvictionPolicyKind,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            capacity: ByteSize(1 << 30),
            shm_name: "kvtier".into(),
            hugepages: false,
            policy: EvictionPolicyKind::Lru,
        }
    }
}

/// `[disk]`: the log-structured region store on local disks (G3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiskConfig {
    /// Directories, one per device; regions are placed round-robin. Empty
    /// means `<serve.data_dir>/disk`.
    pub dirs: Vec<PathBuf>,
    /// Bytes reserved in each directory.
    pub capacity_per_dir: ByteSize,
    /// Bytes per region (the unit of sequential writes and of eviction).
    pub region_size: ByteSize,
    /// I/O engine.
    pub io_engine: IoEngineKind,
    /// Operations in flight per device.
    pub queue_depth: u32,
    /// Threads of the pread/pwrite engine.
    pub psync_threads: u32,
    /// Register region and arena buffers with io_uring (needs memlock).
    pub register_buffers: bool,
    /// Region reclaim order.
    pub eviction: RegionEvictionKind,
    /// Re-insert blocks read since they were written when their region is
    /// reclaimed (they get a second life in a new region).
    pub reinsert_hot: bool,
    /// Seconds between index checkpoints (0 disables periodic ones; clean
    /// shutdown always writes one).
    pub checkpoint_interval_secs: u64,
    /// fdatasync after each region is sealed and before a checkpoint, so
    /// data survives power loss, not just a process crash.
    pub sync: bool,
}

impl Default for DiskConfig {
    fn default() -> Self {
        Self {
            dirs: Vec::new(),
            capacity_per_dir: ByteSize(4 << 30),
            region_size: ByteSize(64 << 20),
            io_engine: IoEngineKind::Auto,
            queue_depth: 32,
            psync_threads: 8,
            register_buffers: true,
            eviction: RegionEvictionKind::Fifo,
            reinsert_hot: true,
            checkpoint_interval_secs: 30,
            sync: true,
        }
    }
}

/// `[serve]`: the `kvtier serve` process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServeConfig {
    /// Where persistent state lives (disk tier regions default to `disk/` here).
    pub data_dir: PathBuf,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("kvtier-data"),
        }
    }
}

/// `[manager]`: the node block manager that `kvtier serve` runs for the
/// engine processes of its host, and the local socket they reach it on.
/// G2's pool is the arena (`[memory]`), G3's the disk log (`[disk]`); their
/// sizes come from those sections, so a pool and its storage cannot
/// disagree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ManagerSectionConfig {
    /// The Unix socket engines connect to (created mode 0660). Empty means
    /// `<serve.data_dir>/node.sock`.
    pub socket: PathBuf,
    /// Eviction policy of every pool: `lru`, `lfu`, `arc`, `s3fifo`, `ttl`
    /// or `cost`.
    pub policy: String,
    /// `exclusive` (a block lives in one tier; G2 evictions move it down)
    /// or `inclusive` (new blocks are also written to the tier below at
    /// once, so they survive a crash).
    pub mode: String,
    /// Fraction of a pool above which the background step moves blocks
    /// down.
    pub high_watermark: f64,
    /// Fraction of a pool the background step moves blocks down to.
    pub low_watermark: f64,
    /// Reuses a block needs before it is written to disk (0: every block).
    pub admit_after: u32,
    /// Milliseconds between background steps (watermark offloads, expiry).
    pub step_interval_ms: u64,
    /// Seconds a client's reservation or pin lives without being committed
    /// or released while the client stays connected (a disconnect drops
    /// them at once).
    pub lease_secs: u64,
    /// Hash every client-filled slot against its sums before publishing it
    /// (a pass over each block in the daemon). Off, the sums' consistency is
    /// checked and every reader verifies the bytes; a client that finds a
    /// block corrupt removes it.
    pub verify_commits: bool,
    /// G4: an object store or shared directory URL (`s3://bucket/prefix`,
    /// `file:///dir`); empty for none.
    pub g4_url: String,
    /// Blocks the G4 pool may hold.
    pub g4_capacity_blocks: usize,
    /// Largest batch of keys one request may name.
    pub max_batch: usize,
    /// NATS server the node publishes its stored / removed events to
    /// (subject `kvtier.events.<node>`); empty for none.
    pub events_nats_url: String,
    /// ZMQ endpoint the node publishes events on in vLLM's KV-event
    /// format (e.g. `tcp://127.0.0.1:5557`); empty for none.
    pub events_zmq_endpoint: String,
    /// Address of the node's own HTTP endpoint (`GET /metrics` in
    /// OpenMetrics text, `GET /health`), e.g. `127.0.0.1:9400`; empty for
    /// none. With `[meta]` enabled the node's families are also on the
    /// admin service's `/metrics`.
    pub metrics_addr: String,
}

impl Default for ManagerSectionConfig {
    fn default() -> Self {
        Self {
            socket: PathBuf::new(),
            policy: "lru".into(),
            mode: "exclusive".into(),
            high_watermark: 0.95,
            low_watermark: 0.85,
            admit_after: 0,
            step_interval_ms: 100,
            lease_secs: 30,
            verify_commits: false,
            g4_url: String::new(),
            g4_capacity_blocks: 1 << 20,
            max_batch: 4096,
            events_nats_url: String::new(),
            events_zmq_endpoint: String::new(),
            metrics_addr: String::new(),
        }
    }
}

impl ManagerSectionConfig {
    fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(CoreError::InvalidConfig(m.into()));
        let (low, high) = (self.low_watermark, self.high_watermark);
        if !(0.0..=1.0).contains(&low) || !(0.0..=1.0).contains(&high) || low > high {
            return bad("manager.low_watermark <= manager.high_watermark, both in 0..=1");
        }
        if self.mode != "exclusive" && self.mode != "inclusive" {
            return bad("manager.mode must be exclusive or inclusive");
        }
        if self.step_interval_ms == 0 || self.lease_secs == 0 || self.max_batch == 0 {
            return bad("manager.step_interval_ms, lease_secs and max_batch must be positive");
        }
        if !self.g4_url.is_empty() && self.g4_capacity_blocks == 0 {
            return bad("manager.g4_capacity_blocks must be positive when g4_url is set");
        }
        if !self.metrics_addr.is_empty()
            && self.metrics_addr.parse::<std::net::SocketAddr>().is_err()
        {
            return bad("manager.metrics_addr must be an IP address and port, e.g. 127.0.0.1:9400");
        }
        Ok(())
    }
}

/// `[meta]`: the metadata service (Tair-KVCM-compatible metadata and admin
/// APIs, a global KV cache manager) that `kvtier serve` hosts and
/// `kvtier meta` runs alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetaSectionConfig {
    /// Whether `kvtier serve` hosts the metadata service (`kvtier meta`
    /// always does).
    pub enabled: bool,
    /// Where metadata lives: `embedded` (redb file `<data_dir>/meta.redb`),
    /// `memory` (lost on exit; tests and demos) or a Redis/Valkey URL
    /// (`redis://host:port/db`) shared by several stateless frontends.
    pub index: String,
    /// Key prefix in Redis/Valkey, so several clusters can share a server.
    pub redis_prefix: String,
    /// Address the four listeners bind to. Default `127.0.0.1`: only this
    /// host. Any other address (`0.0.0.0` included) with `auth` off is
    /// refused unless `allow_unauthenticated_remote` is set.
    pub bind: String,
    /// Meta service gRPC port (Tair KVCM `rpc_port`).
    pub rpc_port: u16,
    /// Meta service HTTP port (Tair KVCM `http_port`).
    pub http_port: u16,
    /// Admin service gRPC port.
    pub admin_rpc_port: u16,
    /// Admin service HTTP port (also serves `/metrics` and `/health`).
    pub admin_http_port: u16,
    /// Require an API key on every request.
    pub auth: bool,
    /// Key of the bootstrap `admin` account, created or updated at start
    /// (set it through `KVTIER_META__ADMIN_API_KEY`, not in a file).
    pub admin_api_key: Option<String>,
    /// Start with `auth` off although `bind` is not a loopback address, so
    /// that everyone who reaches the ports is an administrator (a warning
    /// is logged). For a network that is itself the access control.
    pub allow_unauthenticated_remote: bool,
    /// `[[meta.accounts]]`: accounts created or replaced at every start.
    pub accounts: Vec<MetaAccountConfig>,
    /// Seconds a write session may stay open before it fails and its
    /// locations are reclaimed.
    pub session_timeout_secs: u64,
    /// Seconds between watermark reclaimer rounds.
    pub reclaim_interval_secs: u64,
    /// Seconds between storage health probes.
    pub health_interval_secs: u64,
    /// Seconds between re-reads of groups, storages, instances and
    /// accounts when the index is shared with other frontends (Redis).
    pub catalog_refresh_secs: u64,
    /// With a shared index, how long (ms) a cached location may be served
    /// before it is read again: another frontend's removals are not seen
    /// by this one's cache. 0 turns the cache off for shared indexes.
    pub shared_cache_ttl_ms: u64,
    /// Largest request body accepted.
    pub max_body: ByteSize,
    /// Most block keys in one request.
    pub max_keys: usize,
    /// Quota of the `default` instance group a fresh manager creates;
    /// 0: no quota beyond what its storage holds.
    pub default_group_quota: ByteSize,
    /// Size of the default file pool (`<data_dir>/pool`), reserved at start
    /// in four files.
    pub pool_capacity: ByteSize,
    /// Storage of the `default` group: empty for a file pool in
    /// `<data_dir>/pool`, else a base URI (`file://`, `s3://`, `kvtier://`).
    pub default_storage: String,
    /// Directories under which storages added or changed through the admin
    /// API (and snapshot loads) may keep `file://` data; any other
    /// directory is refused before anything is created. Empty (the
    /// default): `<data_dir>/pool` only.
    pub storage_roots: Vec<PathBuf>,
    /// Whether `kvtier serve` publishes the blocks its engines commit as
    /// `kvtier://<node>/...` locations (storage and group `node-<node>`),
    /// so the cluster-wide view knows what the node holds
    /// (docs/meta-api.md, "Node-published locations").
    pub publish_node_blocks: bool,
}

impl Default for MetaSectionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            index: "embedded".into(),
            redis_prefix: "kvtier".into(),
            bind: "127.0.0.1".into(),
            rpc_port: 6381,
            http_port: 6382,
            admin_rpc_port: 6491,
            admin_http_port: 6492,
            auth: false,
            admin_api_key: None,
            allow_unauthenticated_remote: false,
            accounts: Vec::new(),
            session_timeout_secs: 30,
            reclaim_interval_secs: 5,
            health_interval_secs: 10,
            catalog_refresh_secs: 5,
            shared_cache_ttl_ms: 1000,
            max_body: ByteSize(64 << 20),
            max_keys: 65_536,
            default_group_quota: ByteSize(0),
            pool_capacity: ByteSize(4 << 30),
            default_storage: String::new(),
            storage_roots: Vec::new(),
            publish_node_blocks: true,
        }
    }
}

/// Role of a configured account.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccountRole {
    /// Meta calls on instances of the account's `groups`.
    #[default]
    User,
    /// Everything, on every listener.
    Admin,
}

/// One `[[meta.accounts]]` entry: an API account the manager creates, or
/// replaces whole, at every start. The key is never in the file: either the
/// name of an environment variable that holds it, or its salted hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetaAccountConfig {
    /// Account name.
    pub name: String,
    /// Role; default `user`.
    #[serde(default)]
    pub role: AccountRole,
    /// Instance groups a `user` may use: group names, or `"*"` for every
    /// group. Empty (the default): none.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Environment variable holding the API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_env: Option<String>,
    /// The key's stored form, `sha256$<salt hex>$<SHA-256(salt || key) hex>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_hash: Option<String>,
}

impl MetaSectionConfig {
    /// Refuses `auth` off on a non-loopback `bind` unless
    /// `allow_unauthenticated_remote` accepts it.
    fn check_exposure(&self) -> Result<()> {
        let loopback = self
            .bind
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
        if loopback || self.auth || self.allow_unauthenticated_remote {
            return Ok(());
        }
        Err(CoreError::InvalidConfig(format!(
            "meta.bind = {:?} exposes the meta and admin APIs to other hosts with meta.auth off, \
             so anyone who reaches them could administer this server; set meta.auth = true \
             (with an admin key and accounts), bind 127.0.0.1, or accept it explicitly with \
             meta.allow_unauthenticated_remote = true",
            self.bind
        )))
    }

    /// Each `[[meta.accounts]]` entry: a unique non-empty name (not the
    /// bootstrap `admin` when `admin_api_key` is set) and exactly one of
    /// `key_env`, `key_hash`.
    fn check_accounts(&self) -> Result<()> {
        let mut seen = std::collections::HashSet::new();
        for a in &self.accounts {
            let bad = |why: &str| {
                Err(CoreError::InvalidConfig(format!(
                    "meta.accounts entry {:?}: {why}",
                    a.name
                )))
            };
            if a.name.is_empty() {
                return bad("empty name");
            }
            if !seen.insert(a.name.as_str()) {
                return bad("name listed twice");
            }
            if a.name == "admin" && self.admin_api_key.is_some() {
                return bad("\"admin\" is the account meta.admin_api_key creates");
            }
            if a.key_env.is_some() == a.key_hash.is_some() {
                return bad("give exactly one of key_env and key_hash");
            }
        }
        Ok(())
    }
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[geometry]`.
    pub geometry: GeometryConfig,
    /// `[memory]`.
    pub memory: MemoryConfig,
    /// `[disk]`.
    pub disk: DiskConfig,
    /// `[serve]`.
    pub serve: ServeConfig,
    /// `[meta]`.
    pub meta: MetaSectionConfig,
    /// `[manager]`.
    pub manager: ManagerSectionConfig,
}

impl Config {
    /// Parses `text` (TOML), then applies overrides from `env`
    /// (`(name, value)` pairs; pass `std::env::vars()`).
    pub fn from_toml_with_env<I>(text: &str, env: I) -> Result<Self>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        let mut root: toml::Table =
            toml::from_str(text).map_err(|e| CoreError::InvalidConfig(e.to_string()))?;
        let mut overrides: Vec<(String, String)> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with(ENV_PREFIX) && k.contains("__"))
            .collect();
        // Apply in a fixed order so the result does not depend on the
        // environment's iteration order.
        overrides.sort();
        for (var, value) in overrides {
            apply_override(&mut root, &var, &value)?;
        }
        let cfg: Config = toml::Value::Table(root)
            .try_into()
            .map_err(|e: toml::de::Error| CoreError::InvalidConfig(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The configuration as TOML text.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_default()
    }

    /// Checks values that parse but make no sense.
    pub fn validate(&self) -> Result<()> {
        self.geometry.resolve()?;
        let bad = |m: &str| Err(CoreError::InvalidConfig(m.into()));
        if self.memory.shm_name.is_empty() || self.memory.shm_name.contains('/') {
            return bad("memory.shm_name must be a non-empty name without '/'");
        }
        if self.disk.region_size.0 < 1 << 20 {
            return bad("disk.region_size must be at least 1MiB");
        }
        if self.disk.capacity_per_dir.0 < self.disk.region_size.0 * 2 {
            return bad("disk.capacity_per_dir must hold at least two regions");
        }
        if self.disk.queue_depth == 0 || self.disk.queue_depth > 4096 {
            return bad("disk.queue_depth must be in 1..=4096");
        }
        if self.disk.psync_threads == 0 {
            return bad("disk.psync_threads must be positive");
        }
        let m = &self.meta;
        if m.bind.parse::<std::net::IpAddr>().is_err() {
            return bad("meta.bind must be an IP address");
        }
        let ports = [m.rpc_port, m.http_port, m.admin_rpc_port, m.admin_http_port];
        if ports
            .iter()
            .enumerate()
            .any(|(i, p)| ports[..i].contains(p) && *p != 0)
        {
            return bad("meta ports must differ from each other");
        }
        if m.index != "embedded"
            && m.index != "memory"
            && !m.index.starts_with("redis://")
            && !m.index.starts_with("rediss://")
        {
            return bad("meta.index must be embedded, memory or a redis:// URL");
        }
        if m.pool_capacity.0 < 4 * 4096 {
            return bad("meta.pool_capacity must be at least 16KiB");
        }
        if m.session_timeout_secs == 0 || m.max_keys == 0 || m.max_body.0 < 1024 {
            return bad(
                "meta.session_timeout_secs, meta.max_keys must be positive and meta.max_body at least 1KiB",
            );
        }
        if m.storage_roots.iter().any(|r| r.as_os_str().is_empty()) {
            return bad("meta.storage_roots must not list an empty path");
        }
        if m.auth && m.admin_api_key.as_ref().is_some_and(|k| k.len() < 16) {
            return bad("meta.admin_api_key must have at least 16 characters");
        }
        m.check_exposure()?;
        m.check_accounts()?;
        self.manager.validate()
    }

    /// The node socket, defaulting to `<data_dir>/node.sock`.
    pub fn node_socket(&self) -> PathBuf {
        if self.manager.socket.as_os_str().is_empty() {
            self.serve.data_dir.join("node.sock")
        } else {
            self.manager.socket.clone()
        }
    }

    /// The default file pool's directory, `<data_dir>/pool` (used when
    /// `meta.default_storage` is empty).
    pub fn pool_dir(&self) -> PathBuf {
        self.serve.data_dir.join("pool")
    }

    /// Where admin-added `file://` storages may live
    /// (`meta.storage_roots`), defaulting to [`Config::pool_dir`].
    pub fn storage_roots(&self) -> Vec<PathBuf> {
        if self.meta.storage_roots.is_empty() {
            vec![self.pool_dir()]
        } else {
            self.meta.storage_roots.clone()
        }
    }

    /// The disk directories, defaulting to `<data_dir>/disk`.
    pub fn disk_dirs(&self) -> Vec<PathBuf> {
        if self.disk.dirs.is_empty() {
            vec![self.serve.data_dir.join("disk")]
        } else {
            self.disk.dirs.clone()
        }
    }
}

fn apply_override(root: &mut toml::Table, var: &str, value: &str) -> Result<()> {
    let err = |reason: String| CoreError::InvalidEnvOverride {
        var: var.to_owned(),
        reason,
    };
    let path = &var[ENV_PREFIX.len()..];
    let (section, key) = path
        .split_once("__")
        .ok_or_else(|| err("expected KVTIER_<SECTION>__<KEY>".into()))?;
    if section.is_empty() || key.is_empty() || key.contains("__") {
        return Err(err("expected KVTIER_<SECTION>__<KEY>".into()));
    }
    let parsed = toml::from_str::<toml::Table>(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_owned()));
    let table = root
        .entry(section.to_ascii_lowercase())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    match table {
        toml::Value::Table(t) => {
            t.insert(key.to_ascii_lowercase(), parsed);
            Ok(())
        }
        _ => Err(err(format!("{section} is not a section"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = Config::from_toml_with_env("", env(&[])).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.geometry.resolve().unwrap().block_bytes(), 2 << 20);
    }

    #[test]
    fn file_and_env_combine_env_wins() {
        let text = r#"
            [disk]
            region_size = "16MiB"
            io_engine = "io_uring"
            [memory]
            capacity = 1048576
        "#;
        let c = Config::from_toml_with_env(
            text,
            env(&[
                ("KVTIER_DISK__IO_ENGINE", "psync"),
                ("KVTIER_DISK__DIRS", r#"["/a", "/b"]"#),
                ("KVTIER_MEMORY__SHM_NAME", "node7"),
                ("KVTIER_CONFIG", "ignored.toml"),
                ("OTHER__THING", "ignored"),
            ]),
        )
        .unwrap();
        assert_eq!(c.disk.region_size, ByteSize(16 << 20));
        assert_eq!(c.disk.io_engine, IoEngineKind::Psync);
        assert_eq!(c.disk.dirs, vec![PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(c.memory.capacity, ByteSize(1 << 20));
        assert_eq!(c.memory.shm_name, "node7");
    }

    #[test]
    fn storage_roots_default_to_the_pool_dir_and_take_env() {
        let c = Config::from_toml_with_env("[serve]\ndata_dir = \"/d\"", env(&[])).unwrap();
        assert!(c.meta.storage_roots.is_empty());
        assert_eq!(c.storage_roots(), vec![PathBuf::from("/d/pool")]);
        let c = Config::from_toml_with_env(
            "",
            env(&[("KVTIER_META__STORAGE_ROOTS", r#"["/nvme0/kv", "/mnt/nfs"]"#)]),
        )
        .unwrap();
        assert_eq!(
            c.storage_roots(),
            vec![PathBuf::from("/nvme0/kv"), PathBuf::from("/mnt/nfs")]
        );
        let empty = Config::from_toml_with_env("[meta]\nstorage_roots = [\"\"]", env(&[]));
        assert!(empty.is_err(), "an empty root must be refused");
    }

    #[test]
    fn meta_section_defaults_env_and_validation() {
        let c = Config::from_toml_with_env("", env(&[])).unwrap();
        assert_eq!((c.meta.rpc_port, c.meta.http_port), (6381, 6382));
        assert_eq!(
            (c.meta.admin_rpc_port, c.meta.admin_http_port),
            (6491, 6492)
        );
        let c = Config::from_toml_with_env(
            "[meta]\nindex = \"redis://127.0.0.1:6379/0\"",
            env(&[
                ("KVTIER_META__AUTH", "true"),
                ("KVTIER_META__ADMIN_API_KEY", "0123456789abcdef0123"),
                ("KVTIER_META__HTTP_PORT", "7000"),
            ]),
        )
        .unwrap();
        assert!(c.meta.auth && c.meta.http_port == 7000);
        assert_eq!(
            c.meta.admin_api_key.as_deref(),
            Some("0123456789abcdef0123")
        );
        for bad in [
            "[meta]\nbind = \"localhost:1\"",
            "[meta]\nhttp_port = 6381",
            "[meta]\nindex = \"postgres://x\"",
            "[meta]\nauth = true\nadmin_api_key = \"short\"",
            "[meta]\nmax_keys = 0",
            "[meta]\nbind = \"0.0.0.0\"",
            "[[meta.accounts]]\nname = \"a\"",
            "[[meta.accounts]]\nname = \"a\"\nkey_env = \"K\"\nkey_hash = \"h\"",
            "[[meta.accounts]]\nname = \"a\"\nkey_env = \"K\"\n[[meta.accounts]]\nname = \"a\"\nkey_env = \"L\"",
            "[[meta.accounts]]\nname = \"\"\nkey_env = \"K\"",
            "[[meta.accounts]]\nname = \"a\"\nkey_env = \"K\"\nscopes = []",
        ] {
            assert!(Config::from_toml_with_env(bad, env(&[])).is_err(), "{bad}");
        }
    }

    #[test]
    fn meta_binds_loopback_unless_told_and_remote_needs_auth_or_consent() {
        let c = Config::from_toml_with_env("", env(&[])).unwrap();
        assert_eq!(c.meta.bind, "127.0.0.1");
        assert!(!c.meta.auth && !c.meta.allow_unauthenticated_remote);
        let open = Config::from_toml_with_env("", env(&[("KVTIER_META__BIND", "0.0.0.0")]));
        let e = open.unwrap_err().to_string();
        assert!(
            e.contains("meta.bind") && e.contains("meta.allow_unauthenticated_remote"),
            "{e}"
        );
        for ok in [
            "[meta]\nbind = \"::1\"",
            "[meta]\nbind = \"0.0.0.0\"\nauth = true",
            "[meta]\nbind = \"0.0.0.0\"\nallow_unauthenticated_remote = true",
        ] {
            assert!(Config::from_toml_with_env(ok, env(&[])).is_ok(), "{ok}");
        }
    }

    #[test]
    fn accounts_parse_from_file_and_env() {
        let text = "[[meta.accounts]]\nname = \"engine-a\"\ngroups = [\"a\"]\nkey_env = \"KEY_A\"\n\
                    [[meta.accounts]]\nname = \"ops\"\nrole = \"admin\"\nkey_hash = \"sha256$00$11\"";
        let c = Config::from_toml_with_env(text, env(&[])).unwrap();
        let a = &c.meta.accounts;
        assert_eq!(
            (a[0].role, a[0].groups.as_slice()),
            (AccountRole::User, &["a".to_string()][..])
        );
        assert_eq!(a[0].key_env.as_deref(), Some("KEY_A"));
        assert_eq!(
            (a[1].role, a[1].key_hash.as_deref()),
            (AccountRole::Admin, Some("sha256$00$11"))
        );
        let from_env = Config::from_toml_with_env(
            "",
            env(&[(
                "KVTIER_META__ACCOUNTS",
                r#"[{name = "b", groups = ["*"], key_env = "KEY_B"}]"#,
            )]),
        )
        .unwrap();
        assert_eq!(from_env.meta.accounts[0].groups, ["*"]);
        // Printed and read back unchanged.
        assert_eq!(
            Config::from_toml_with_env(&c.to_toml(), env(&[])).unwrap(),
            c
        );
    }

    #[test]
    fn typos_are_errors() {
        assert!(Config::from_toml_with_env("[disk]\nregion_sise = 1", env(&[])).is_err());
        assert!(Config::from_toml_with_env("", env(&[("KVTIER_DISK__REGION_SISE", "1")])).is_err());
        assert!(Config::from_toml_with_env("", env(&[("KVTIER_DISKS__X", "1")])).is_err());
        let e = Config::from_toml_with_env("[disk]\nregion_size = \"12 parsecs\"", env(&[]));
        assert!(e.unwrap_err().to_string().contains("parsecs"));
    }

    #[test]
    fn explicit_geometry_and_mla() {
        let c = Config::from_toml_with_env(
            "[geometry]\npreset = \"deepseek-v3\"\ntokens_per_block = 64\ntp_size = 8\ntp_rank = 7",
            env(&[]),
        )
        .unwrap();
        let g = c.geometry.resolve().unwrap();
        assert_eq!(g.parts_per_layer(), 1);
        assert_eq!(g.object_bytes(), 64 * 576 * 2);
        let text = "[geometry]\nlayers = 2\nkv_heads = 2\nhead_dim = 32\ndtype = \"f32\"\ntokens_per_block = 32";
        let c =
            Config::from_toml_with_env(&format!("{text}\npreset = \"tiny\""), env(&[])).unwrap();
        assert_eq!(
            c.geometry.resolve().unwrap(),
            ModelPreset::Tiny.geometry(32)
        );
        let bad = Config::from_toml_with_env(
            "[geometry]\npreset = \"llama3-8b\"\nlatent_dim = 5",
            env(&[]),
        );
        assert!(bad.is_err());
    }

    #[test]
    fn byte_sizes_round_trip() {
        for s in ["0", "512", "4KiB", "64MiB", "3GiB", "1TiB"] {
            let b: ByteSize = s.parse().unwrap();
            let again: ByteSize = b.to_string().parse().unwrap();
            assert_eq!(b, again);
        }
        assert_eq!("4g".parse::<ByteSize>().unwrap(), ByteSize(4 << 30));
        assert!("99999999999999999999T".parse::<ByteSize>().is_err());
    }
}
