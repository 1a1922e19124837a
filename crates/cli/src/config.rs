//! The configuration file: [`Config`], every section together, and loading
//! it at the binary's edge.
//!
//! Each section's type lives in the crate that uses it: `[geometry]` in
//! `kvtier-core`, `[memory]` in `kvtier-mem`, `[disk]` in `kvtier-disk`,
//! `[serve]` and `[manager]` in `kvtier-node` (with [`NodeConfig`], the
//! sections a node opens with), `[meta]` here ([`meta`]), since the binary
//! builds the metadata service; `[peer]` in `kvtier-node`, which serves
//! it. The format, the `KVTIER_<SECTION>__<KEY>`
//! overrides and the checks are in docs/configuration.md.

mod meta;

use anyhow::{Context, Result};
use kvtier_core::GeometryConfig;
use kvtier_disk::DiskConfig;
use kvtier_mem::MemoryConfig;
use kvtier_node::{
    ManagerSectionConfig, NodeConfig, PeerSectionConfig, ServeConfig, SharedG4SectionConfig,
};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub use meta::{AccountRole, MetaAccountConfig, MetaSectionConfig};

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[geometry]`; `None`: the shape the data directory keeps, else the
    /// first engine's (docs/configuration.md).
    pub geometry: Option<GeometryConfig>,
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
    /// `[peer]`.
    pub peer: PeerSectionConfig,
    /// `[shared_g4]`.
    pub shared_g4: SharedG4SectionConfig,
}

/// Tair KVCM's environment variables (`server_config.cc`) that kvtier reads,
/// with the kvtier variable each stands for. A kvtier variable that is set
/// wins over its upstream name.
pub const UPSTREAM_ENV: &[(&str, &str)] = &[
    ("kvcm.distributed_lock.uri", "KVTIER_META__LEADER_LOCK"),
    ("kvcm.leader_elector.node_id", "KVTIER_META__NODE_ID"),
    (
        "kvcm.leader_elector.lease_ms",
        "KVTIER_META__LEADER_LEASE_MS",
    ),
    (
        "kvcm.leader_elector.loop_interval_ms",
        "KVTIER_META__LEADER_LOOP_INTERVAL_MS",
    ),
    ("kvcm.service.rpc_port", "KVTIER_META__RPC_PORT"),
    ("kvcm.service.http_port", "KVTIER_META__HTTP_PORT"),
    ("kvcm.service.admin_rpc_port", "KVTIER_META__ADMIN_RPC_PORT"),
    (
        "kvcm.service.admin_http_port",
        "KVTIER_META__ADMIN_HTTP_PORT",
    ),
];

impl Config {
    /// Parses `text` (TOML), then applies overrides from `env`
    /// (`(name, value)` pairs; pass `std::env::vars()`), then checks it.
    /// Tair KVCM's own variable names ([`UPSTREAM_ENV`]) are read too, below
    /// kvtier's: a deployment written for upstream keeps its settings.
    pub fn from_toml_with_env<I>(text: &str, env: I) -> kvtier_core::Result<Self>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        let env: Vec<(String, String)> = env.into_iter().collect();
        let aliased = UPSTREAM_ENV.iter().filter_map(|&(upstream, ours)| {
            let ours_set = env.iter().any(|(k, _)| k == ours);
            let value = env.iter().find(|(k, _)| k == upstream).map(|(_, v)| v);
            value
                .filter(|_| !ours_set)
                .map(|v| (ours.to_owned(), v.clone()))
        });
        let env: Vec<(String, String)> = aliased.chain(env.iter().cloned()).collect();
        let cfg: Config = kvtier_core::config::from_toml_with_env(text, env)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The configuration as TOML text.
    pub fn to_toml(&self) -> String {
        kvtier_core::config::to_toml(self)
    }

    /// Checks values that parse but make no sense, section by section (in
    /// this order, so the first problem reported is always the same one).
    pub fn validate(&self) -> kvtier_core::Result<()> {
        if let Some(g) = &self.geometry {
            g.resolve()?;
        }
        self.memory.validate()?;
        self.disk.validate()?;
        self.meta.validate()?;
        self.manager.validate()?;
        self.peer.validate()?;
        let meta = self.meta.enabled && self.meta.publish_node_blocks;
        (self.shared_g4).validate(meta, &self.peer, &self.manager.g4_url)
    }

    /// The sections the node opens with.
    pub fn node(&self) -> NodeConfig {
        NodeConfig {
            geometry: self.geometry.clone(),
            memory: self.memory.clone(),
            disk: self.disk.clone(),
            serve: self.serve.clone(),
            manager: self.manager.clone(),
        }
    }

    /// The node socket, defaulting to `<data_dir>/node.sock`.
    pub fn node_socket(&self) -> PathBuf {
        self.node().node_socket()
    }

    /// The default file pool's directory, `<data_dir>/pool` (used when
    /// `meta.default_storage` is empty).
    pub fn pool_dir(&self) -> PathBuf {
        self.serve.data_dir.join("pool")
    }

    /// Where admin-added `file://` storages may live
    /// (`meta.storage_roots`), defaulting to [`Config::pool_dir`]; and the
    /// shared G4's directory when `shared_g4.url` names one (the operator
    /// named it there: its storage is created at start).
    pub fn storage_roots(&self) -> Vec<PathBuf> {
        let mut roots = if self.meta.storage_roots.is_empty() {
            vec![self.pool_dir()]
        } else {
            self.meta.storage_roots.clone()
        };
        let shared = kvtier_remote::RemoteConfig {
            url: self.shared_g4.url.clone(),
            ..Default::default()
        };
        if let Ok(Some(dir)) = shared.dir() {
            roots.push(dir);
        }
        roots
    }
}

/// Loads the configuration: `explicit` path, else `$KVTIER_CONFIG`, else
/// `./kvtier.toml` if present, else defaults; then environment overrides.
pub fn load(explicit: Option<&Path>) -> Result<Config> {
    let path: Option<PathBuf> = explicit
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("KVTIER_CONFIG").map(PathBuf::from))
        .or_else(|| Some(PathBuf::from("kvtier.toml")).filter(|p| p.exists()));
    let text = match &path {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("reading config file {}", p.display()))?,
        None => String::new(),
    };
    let source = path
        .as_ref()
        .map_or("built-in defaults".to_string(), |p| p.display().to_string());
    Config::from_toml_with_env(&text, std::env::vars())
        .with_context(|| format!("configuration from {source}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_core::{ByteSize, IoEngineKind, ModelPreset};
    use std::path::PathBuf;

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
        assert_eq!(
            c.geometry, None,
            "no shape until one is configured or learned"
        );
        let c = Config::from_toml_with_env("", env(&[("KVTIER_GEOMETRY__TOKENS_PER_BLOCK", "16")]))
            .unwrap();
        let g = c.geometry.map(|g| g.resolve().unwrap());
        assert_eq!(g.map(|g| g.block_bytes()), Some(2 << 20), "llama3-8b");
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
        let mut c = Config::from_toml_with_env("[serve]\ndata_dir = \"/d\"", env(&[])).unwrap();
        c.shared_g4.url = "file:///mnt/shared/g4/".into();
        assert_eq!(
            c.storage_roots(),
            vec![PathBuf::from("/d/pool"), PathBuf::from("/mnt/shared/g4")]
        );
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
        assert!(c.meta.strict_removals && c.meta.min_api_key_len == 16);
        let relaxed = Config::from_toml_with_env(
            "[meta]\nstrict_removals = false",
            env(&[("KVTIER_META__MIN_API_KEY_LEN", "0")]),
        )
        .unwrap();
        assert!(!relaxed.meta.strict_removals && relaxed.meta.min_api_key_len == 0);
        // Upstream's tests start workers with the admin gRPC port equal to
        // the meta one: both services on one listener.
        let shared = Config::from_toml_with_env(
            "[meta]\nadmin_rpc_port = 6381\nadmin_http_port = 6382",
            env(&[]),
        );
        assert!(shared.is_ok(), "{shared:?}");
        assert_eq!(
            c.meta.admin_api_key.as_deref(),
            Some("0123456789abcdef0123")
        );
        for bad in [
            "[meta]\nbind = \"localhost:1\"",
            "[meta]\nhttp_port = 6381",
            "[meta]\nadmin_http_port = 6381",
            "[meta]\nadmin_rpc_port = 6382",
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
    fn upstream_variable_names_set_what_they_set_upstream_below_kvtiers() {
        let c = Config::from_toml_with_env(
            "",
            env(&[
                ("kvcm.leader_elector.lease_ms", "2000"),
                ("kvcm.leader_elector.node_id", "fe-a"),
                ("kvcm.distributed_lock.uri", "memory://"),
                ("kvcm.service.admin_http_port", "7492"),
                ("kvcm.service.http_port", "7382"),
                ("KVTIER_META__HTTP_PORT", "8382"),
            ]),
        )
        .unwrap();
        assert_eq!(c.meta.leader_lease_ms, 2000);
        assert_eq!(c.meta.node_id, "fe-a");
        assert_eq!(c.meta.leader_lock, "memory://");
        assert_eq!(c.meta.admin_http_port, 7492);
        assert_eq!(c.meta.http_port, 8382, "kvtier's own name wins");
        let bad = Config::from_toml_with_env("", env(&[("kvcm.leader_elector.lease_ms", "soon")]));
        assert!(bad.is_err());
    }

    #[test]
    fn leader_election_settings_default_to_upstream_and_are_checked() {
        use crate::config::meta::FollowerRequests;
        let c = Config::from_toml_with_env("", env(&[])).unwrap();
        assert_eq!(
            (c.meta.leader_lease_ms, c.meta.leader_loop_interval_ms),
            (10_000, 100)
        );
        assert_eq!(c.meta.follower_requests, FollowerRequests::Serve);
        assert!(c.meta.node_id.is_empty() && c.meta.leader_lock.is_empty());
        let c = Config::from_toml_with_env(
            "[meta]\nleader_lock = \"file:///var/lib/kvtier\"",
            env(&[
                ("KVTIER_META__FOLLOWER_REQUESTS", "refuse"),
                ("KVTIER_META__NODE_ID", "fe-1"),
            ]),
        )
        .unwrap();
        assert_eq!(c.meta.follower_requests, FollowerRequests::Refuse);
        assert_eq!(c.meta.node_id, "fe-1");
        for bad in [
            "[meta]\nleader_lock = \"zk://x\"",
            "[meta]\nleader_lock = \"file://relative\"",
            "[meta]\nleader_lease_ms = 150",
            "[meta]\nleader_loop_interval_ms = 0",
            "[meta]\nnode_id = \"a|b\"",
            "[meta]\nfollower_requests = \"forward\"",
        ] {
            let e = Config::from_toml_with_env(bad, env(&[])).expect_err(bad);
            assert!(e.to_string().contains("meta"), "{bad}: {e}");
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
    fn peer_section_is_off_by_default_and_checked_when_on() {
        let c = Config::from_toml_with_env("", env(&[])).unwrap();
        assert!(!c.peer.enabled());
        assert_eq!(c.peer.max_connections, 256, "the library's default");
        let text = "[peer]\nlisten = \"127.0.0.1:7470\"\ncluster = \"prod\"\nsecret_file = \"/etc/kvtier/cluster.secret\"";
        let c = Config::from_toml_with_env(
            text,
            env(&[
                ("KVTIER_PEER__LISTEN", "0.0.0.0:7471"),
                ("KVTIER_PEER__MAX_CONNECTIONS", "8"),
            ]),
        )
        .unwrap();
        assert_eq!(c.peer.listen, "0.0.0.0:7471");
        assert_eq!(c.peer.cluster, "prod");
        assert_eq!(c.peer.max_connections, 8);
        for (var, value, words) in [
            ("KVTIER_PEER__LISTEN", "7470", "peer.listen"),
            ("KVTIER_PEER__CLUSTER", "", "peer.cluster"),
            ("KVTIER_PEER__SECRET_FILE", "", "peer.secret_file"),
            ("KVTIER_PEER__WRITE_TIMEOUT_MS", "0", "write_timeout_ms"),
            ("KVTIER_PEER__LOOKUP_TIMEOUT_MS", "0", "lookup_timeout_ms"),
            ("KVTIER_PEER__LOAD_TIMEOUT_MS", "0", "load_timeout_ms"),
            ("KVTIER_PEER__ADVERTISE", "nowhere", "peer.advertise"),
        ] {
            let e = Config::from_toml_with_env(text, env(&[(var, value)])).unwrap_err();
            assert!(e.to_string().contains(words), "{var}={value:?}: {e}");
        }
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
        let g = c.geometry.unwrap().resolve().unwrap();
        assert_eq!(g.parts_per_layer(), 1);
        assert_eq!(g.object_bytes(), 64 * 576 * 2);
        let text = "[geometry]\nlayers = 2\nkv_heads = 2\nhead_dim = 32\ndtype = \"f32\"\ntokens_per_block = 32";
        let c =
            Config::from_toml_with_env(&format!("{text}\npreset = \"tiny\""), env(&[])).unwrap();
        assert_eq!(
            c.geometry.unwrap().resolve().unwrap(),
            ModelPreset::Tiny.geometry(32)
        );
        let bad = Config::from_toml_with_env(
            "[geometry]\npreset = \"llama3-8b\"\nlatent_dim = 5",
            env(&[]),
        );
        assert!(bad.is_err());
    }
}
