//! `[meta]`: the metadata service's section, owned by the binary, which
//! builds the service from it (`crate::meta`): listeners, index, auth and
//! accounts, the default pool and storage roots.

use std::path::PathBuf;

use kvtier_core::{ByteSize, CoreError, Result};
pub use kvtier_server::FollowerRequests;
use serde::{Deserialize, Serialize};

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
    /// This frontend's id in leader election and cluster info. Empty (the
    /// default): `<host name>:<admin_http_port>_<16 random characters>`,
    /// new at every start, as Tair KVCM makes it.
    pub node_id: String,
    /// Where frontends elect their leader (docs/server.md §9): empty (the
    /// default) for the index's own place: the Redis/Valkey server of a
    /// `redis://` index (key `<redis_prefix>:leader`), a lock file
    /// `<data_dir>/meta.leader.lock` for `embedded`, this process for
    /// `memory`. Or explicitly `redis://...`, `file:///dir` (lock file
    /// `dir/meta.leader.lock`) or `memory://`.
    pub leader_lock: String,
    /// How long a leader's lease lasts without renewal, ms (Tair KVCM's
    /// `kvcm.leader_elector.lease_ms`). A dead leader is replaced within
    /// this long.
    pub leader_lease_ms: u64,
    /// How often the election campaigns or renews, ms
    /// (`kvcm.leader_elector.loop_interval_ms`); well under the lease.
    pub leader_loop_interval_ms: u64,
    /// Shortest API key (account password) accepted, in characters. Tair
    /// KVCM takes any (its tests send `"pass123"`); lower it only for such
    /// tooling: these keys are what authentication rests on.
    pub min_api_key_len: usize,
    /// Refuse to remove a storage a group lists, or a group with
    /// instances (default). `false` removes them as Tair KVCM does: the
    /// group's writes skip the storage, the instances' writes fail, and
    /// their stored blocks are never freed (docs/meta-api.md §5.1).
    pub strict_removals: bool,
    /// What a frontend that is not the leader does with the calls Tair KVCM
    /// reserves for the leader: `serve` (the default; only background work
    /// is the leader's) or `refuse` (`SERVER_NOT_LEADER`, as upstream).
    pub follower_requests: FollowerRequests,
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
            node_id: String::new(),
            leader_lock: String::new(),
            leader_lease_ms: 10_000,
            leader_loop_interval_ms: 100,
            follower_requests: FollowerRequests::Serve,
            min_api_key_len: kvtier_meta::MIN_API_KEY_LEN,
            strict_removals: true,
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
    /// Checks values that parse but make no sense.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(CoreError::InvalidConfig(m.into()));
        let m = self;
        if m.bind.parse::<std::net::IpAddr>().is_err() {
            return bad("meta.bind must be an IP address");
        }
        // The admin service may share the meta listener of its transport
        // (Tair KVCM's own tests start workers with admin_rpc_port =
        // rpc_port); a gRPC and an HTTP listener cannot share a port.
        let grpc = [m.rpc_port, m.admin_rpc_port];
        let http = [m.http_port, m.admin_http_port];
        if grpc.iter().any(|p| *p != 0 && http.contains(p)) {
            return bad(
                "meta ports: a gRPC port (rpc_port, admin_rpc_port) must differ from the HTTP ports (http_port, admin_http_port)",
            );
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
        m.check_leader()?;
        m.check_accounts()
    }

    /// The election settings: a known lock kind, and a lease of at least
    /// two loop intervals (a leader stops acting one interval before its
    /// lease ends).
    fn check_leader(&self) -> Result<()> {
        let bad = |m: String| Err(CoreError::InvalidConfig(m));
        let lock = self.leader_lock.as_str();
        let known = lock.is_empty()
            || lock == "memory://"
            || lock.starts_with("redis://")
            || lock.starts_with("rediss://")
            || lock
                .strip_prefix("file://")
                .is_some_and(|d| d.starts_with('/'));
        if !known {
            return bad(format!(
                "meta.leader_lock = {lock:?}: give redis://..., file:///<absolute dir>, memory:// or leave it empty"
            ));
        }
        let interval = self.leader_loop_interval_ms;
        if interval == 0 || self.leader_lease_ms < interval.saturating_mul(2) {
            return bad(format!(
                "meta.leader_loop_interval_ms ({interval}) must be positive and meta.leader_lease_ms ({}) at least twice it",
                self.leader_lease_ms
            ));
        }
        if self.node_id.contains('|') || self.node_id.len() > 200 {
            return bad("meta.node_id must not contain '|' and must be at most 200 bytes".into());
        }
        Ok(())
    }

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
