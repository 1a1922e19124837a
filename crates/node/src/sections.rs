//! The node's configuration sections: [`ServeConfig`] (`[serve]`),
//! [`ManagerSectionConfig`] (`[manager]`), and [`NodeConfig`], every
//! section a node is opened with (docs/configuration.md).

use std::path::PathBuf;

use kvtier_core::{CoreError, GeometryConfig};
use kvtier_disk::DiskConfig;
use kvtier_mem::MemoryConfig;
use kvtier_remote::RemoteConfig;
use serde::{Deserialize, Serialize};

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
    /// The Unix socket engines connect to (mode 0600, or 0660 with
    /// `access_group`). Empty means `<serve.data_dir>/node.sock`.
    pub socket: PathBuf,
    /// The daemon's secret (32 random bytes, mode 0600), made at first
    /// start: it keys every namespace's stored keys, so no client can name
    /// another namespace's blocks. Nodes sharing a G4 share it. Empty means
    /// `<serve.data_dir>/node.secret`.
    pub secret_file: PathBuf,
    /// The group of engine processes that run as another user than the
    /// daemon: a group name or a numeric gid. Set, the socket and the arena
    /// are mode 0660 with this group and the data directory 0710 with it;
    /// empty (the default), they are 0600 and 0700, the daemon's user's
    /// only. An unknown name stops the start.
    pub access_group: String,
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
    /// Largest batch of keys one request may name. Also bounds the frames
    /// a session accepts after `Hello`: none larger than a `Commit` of this
    /// many blocks.
    pub max_batch: usize,
    /// Milliseconds one write to a client may take (a client that stops
    /// reading its replies blocks it); past this the connection is closed
    /// and everything it holds is dropped. Below `lease_secs`, so a client
    /// that never reads holds nothing much longer than its lease.
    pub write_timeout_ms: u64,
    /// Seconds from connect within which `Hello` must have arrived.
    pub handshake_timeout_secs: u64,
    /// Seconds a frame may take from its first byte to its last (a client
    /// that trickles a frame is closed).
    pub frame_timeout_secs: u64,
    /// Seconds without a request after which a connection that holds no
    /// reservation or pin is closed; 0 keeps quiet connections forever.
    pub idle_timeout_secs: u64,
    /// Connections served at once; one more gets `Error { code: BUSY }` and
    /// is closed.
    pub max_connections: usize,
    /// Pins one session may hold; a `Load` that could pass it gets
    /// `BAD_REQUEST`. At least `max_batch`.
    pub max_pins_per_session: usize,
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
            secret_file: PathBuf::new(),
            access_group: String::new(),
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
            write_timeout_ms: 5000,
            handshake_timeout_secs: 10,
            frame_timeout_secs: 10,
            idle_timeout_secs: 3600,
            max_connections: 1024,
            max_pins_per_session: 65536,
            events_nats_url: String::new(),
            events_zmq_endpoint: String::new(),
            metrics_addr: String::new(),
        }
    }
}

impl ManagerSectionConfig {
    /// Checks values that parse but make no sense.
    pub fn validate(&self) -> kvtier_core::Result<()> {
        let bad = |m: &str| Err(CoreError::InvalidConfig(m.into()));
        let (low, high) = (self.low_watermark, self.high_watermark);
        if !(0.0..=1.0).contains(&low) || !(0.0..=1.0).contains(&high) || low > high {
            return bad("manager.low_watermark <= manager.high_watermark, both in 0..=1");
        }
        if self.mode != "exclusive" && self.mode != "inclusive" {
            return bad("manager.mode must be exclusive or inclusive");
        }
        if self.access_group.trim() != self.access_group || self.access_group.contains('\0') {
            return bad("manager.access_group must be a group name or gid without spaces or NUL");
        }
        if self.step_interval_ms == 0 || self.lease_secs == 0 || self.max_batch == 0 {
            return bad("manager.step_interval_ms, lease_secs and max_batch must be positive");
        }
        self.validate_bounds()?;
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

impl ManagerSectionConfig {
    /// Checks the per-connection bounds (docs/node-protocol.md §7).
    fn validate_bounds(&self) -> kvtier_core::Result<()> {
        let bad = |m: &str| Err(CoreError::InvalidConfig(m.into()));
        let lease_ms = self.lease_secs.saturating_mul(1000);
        if self.write_timeout_ms == 0 || self.write_timeout_ms >= lease_ms {
            return bad("manager.write_timeout_ms must be positive and below manager.lease_secs");
        }
        if self.handshake_timeout_secs == 0 || self.frame_timeout_secs == 0 {
            return bad("manager.handshake_timeout_secs and frame_timeout_secs must be positive");
        }
        if self.max_connections == 0 {
            return bad("manager.max_connections must be positive");
        }
        if self.max_pins_per_session < self.max_batch {
            return bad("manager.max_pins_per_session must be at least manager.max_batch");
        }
        Ok(())
    }
}

/// `[peer]`: the node-to-node data plane (docs/peer-protocol.md). With
/// `listen` set, `kvtier serve` answers other daemons of its cluster that
/// read blocks from its tiers over TCP, after both sides proved the
/// cluster secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PeerSectionConfig {
    /// Address the peer server listens on (`10.0.0.5:7470`; port 0: one
    /// the OS picks); empty (the default) for no peer server.
    pub listen: String,
    /// The cluster's name: a peer of another cluster is refused. Required
    /// with `listen`.
    pub cluster: String,
    /// The cluster secret every node of the cluster holds: exactly 32
    /// bytes, a regular file of the daemon's user, mode 0600 or stricter,
    /// not a symbolic link. Required with `listen`.
    pub secret_file: PathBuf,
    /// This node's name as it proves itself to peers; empty (the default):
    /// the node's name (`$KVTIER_NODE`, else the host name), the one its
    /// `kvtier://<node>/...` locations carry. Another name is for a
    /// process that hosts several nodes (tests); `kvtier serve` refuses a
    /// name other than its node's, as peers would then refuse every read
    /// of its locations.
    pub node_name: String,
    /// Peer connections served at once; more are refused `Busy`.
    pub max_connections: usize,
    /// Milliseconds a peer has to finish the handshake.
    pub handshake_timeout_ms: u64,
    /// Milliseconds one reply frame may take to write; a peer that stops
    /// reading is dropped.
    pub write_timeout_ms: u64,
    /// The address other nodes reach this node's peer server at, published
    /// in its locations; empty: the address the server listens on (port 0
    /// resolved), unless `listen` is a wildcard address (then publishing
    /// the node's blocks is an error).
    pub advertise: String,
    /// Milliseconds a cluster lookup waits for the metadata service before
    /// the node answers from its own tiers only.
    pub lookup_timeout_ms: u64,
    /// Milliseconds a `Load` waits for the peers it reads located blocks
    /// from; past it the blocks not yet in are misses.
    pub load_timeout_ms: u64,
}

impl Default for PeerSectionConfig {
    fn default() -> Self {
        use kvtier_peer::ServerConfig as S;
        Self {
            listen: String::new(),
            cluster: String::new(),
            secret_file: PathBuf::new(),
            node_name: String::new(),
            max_connections: S::DEFAULT_MAX_CONNECTIONS,
            handshake_timeout_ms: S::DEFAULT_HANDSHAKE_TIMEOUT.as_millis() as u64,
            write_timeout_ms: S::DEFAULT_WRITE_TIMEOUT.as_millis() as u64,
            advertise: String::new(),
            lookup_timeout_ms: 50,
            load_timeout_ms: 2000,
        }
    }
}

impl PeerSectionConfig {
    /// Whether a peer server is configured (`listen` set).
    pub fn enabled(&self) -> bool {
        !self.listen.is_empty()
    }

    /// Checks values that parse but make no sense (only with `listen` set:
    /// the rest is unused otherwise).
    pub fn validate(&self) -> kvtier_core::Result<()> {
        let bad = |m: &str| Err(CoreError::InvalidConfig(m.into()));
        if !self.enabled() {
            return Ok(());
        }
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return bad("peer.listen must be an IP address and port, e.g. 10.0.0.5:7470");
        }
        if self.cluster.is_empty() || self.cluster.len() > 255 {
            return bad("peer.cluster must be set (1 to 255 bytes) when peer.listen is");
        }
        if self.secret_file.as_os_str().is_empty() {
            return bad("peer.secret_file must be set when peer.listen is");
        }
        if self.node_name.len() > 255 {
            return bad("peer.node_name must be at most 255 bytes");
        }
        if self.max_connections == 0
            || self.handshake_timeout_ms == 0
            || self.write_timeout_ms == 0
            || self.lookup_timeout_ms == 0
            || self.load_timeout_ms == 0
        {
            return bad(
                "peer.max_connections, handshake_timeout_ms, write_timeout_ms, lookup_timeout_ms and load_timeout_ms must be positive",
            );
        }
        if !self.advertise.is_empty() && self.advertise.parse::<std::net::SocketAddr>().is_err() {
            return bad("peer.advertise must be an IP address and port, e.g. 10.0.0.5:7470");
        }
        Ok(())
    }
}

/// `[shared_g4]`: a G4 the whole cluster shares, owned by the metadata
/// service (docs/cluster.md, "A shared G4"). Each block committed on any
/// node is written there once per cluster through the service's two-phase
/// write, published as a location every node loads from, and deleted only
/// by the service's reclaimer under `quota_bytes`: never by a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SharedG4SectionConfig {
    /// The store: `s3://bucket/prefix` (endpoint, region and credentials
    /// from the environment, as `manager.g4_url`'s), or
    /// `file:///absolute/dir`, a directory every node mounts at that path
    /// (NFS, 3FS), which must exist and take files; empty (the default)
    /// for none.
    pub url: String,
    /// The metadata-service storage of the store: created (kind `s3`, or
    /// `file_objects` for a directory) at start if missing; one of that
    /// name with another URI or kind stops the start.
    pub storage: String,
    /// The instance group the shared blocks are charged to, created if
    /// missing with `quota_bytes`.
    pub group: String,
    /// The instance the shared blocks are recorded under (one spec,
    /// `block`), registered in `group` if missing.
    pub instance: String,
    /// The group's quota: the reclaimer deletes the least recently used
    /// shared objects to keep below its watermark.
    pub quota_bytes: u64,
    /// Blocks waiting to be written at most; past it a committed block is
    /// not written (counted as dropped).
    pub queue_blocks: usize,
    /// Blocks per write session.
    pub batch: usize,
}

impl Default for SharedG4SectionConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            storage: "kvtier-shared-g4".into(),
            group: "kvtier-shared-g4".into(),
            instance: "kvtier-shared-g4".into(),
            quota_bytes: 64 << 30,
            queue_blocks: 4096,
            batch: 64,
        }
    }
}

impl SharedG4SectionConfig {
    /// Whether a shared G4 is configured (`url` set).
    pub fn enabled(&self) -> bool {
        !self.url.is_empty()
    }

    /// Checks the section against the others it depends on: the metadata
    /// service runs beside the node and sees its commits (`meta_enabled`:
    /// `meta.enabled` and `meta.publish_node_blocks`; it writes and
    /// reclaims), the node has a cluster identity (`peer`: the shared keys
    /// derive from the cluster secret), and the node's own G4 is another
    /// store (`g4_url`: its pool would evict shared objects).
    pub fn validate(
        &self,
        meta_enabled: bool,
        peer: &PeerSectionConfig,
        g4_url: &str,
    ) -> kvtier_core::Result<()> {
        let bad = |m: String| Err(CoreError::InvalidConfig(m));
        if !self.enabled() {
            return Ok(());
        }
        let store = RemoteConfig {
            url: self.url.clone(),
            ..RemoteConfig::default()
        };
        let shared = match store.canonical_url() {
            Ok(url) => url,
            Err(e) => {
                return bad(format!(
                    "shared_g4.url: {e} (expected s3://bucket/prefix, or file:///absolute/dir of a directory every node mounts at that path)"
                ));
            }
        };
        if !meta_enabled {
            return bad("shared_g4.url needs meta.enabled and meta.publish_node_blocks: the metadata service writes the shared G4 and reclaims it".into());
        }
        if !peer.enabled() {
            return bad("shared_g4.url needs a cluster identity ([peer] listen, cluster and secret_file): shared objects are keyed by the cluster secret".into());
        }
        if overlaps(g4_url, &shared) {
            return bad(format!(
                "manager.g4_url {g4_url:?} overlaps shared_g4.url {:?}: the node's own G4 pool would evict shared objects",
                self.url
            ));
        }
        if self.storage.is_empty() || self.group.is_empty() || self.instance.is_empty() {
            return bad("shared_g4.storage, group and instance must be set".into());
        }
        if self.quota_bytes == 0 || self.queue_blocks == 0 || self.batch == 0 {
            return bad("shared_g4.quota_bytes, queue_blocks and batch must be positive".into());
        }
        // Last, once nothing else is wrong: a shared directory that is
        // missing is a file system not mounted, never made here.
        store
            .check_existing()
            .or_else(|e| bad(format!("shared_g4.url: {e}")))
    }
}

/// Whether the node's own G4 at `own` (empty: none) and the shared G4 at
/// `shared` (canonical) are one store or one inside the other. URLs are
/// compared as object URIs spell them ([`RemoteConfig::canonical_url`]).
fn overlaps(own: &str, shared: &str) -> bool {
    if own.is_empty() {
        return false;
    }
    let canonical = RemoteConfig {
        url: own.to_owned(),
        ..RemoteConfig::default()
    }
    .canonical_url();
    let own = canonical.unwrap_or_else(|_| own.trim_end_matches('/').to_owned());
    own == shared
        || own.starts_with(&format!("{shared}/"))
        || shared.starts_with(&format!("{own}/"))
}

/// Every section a node is opened with: `[geometry]`, `[memory]`, `[disk]`,
/// `[serve]` and `[manager]` of the configuration file (the `kvtier` binary
/// reads the file, `[meta]` included, and hands the node these).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// `[geometry]`; `None` (no section, no `KVTIER_GEOMETRY__*`): the
    /// shape kept in the data directory, else the first engine's.
    pub geometry: Option<GeometryConfig>,
    /// `[memory]`.
    pub memory: MemoryConfig,
    /// `[disk]`.
    pub disk: DiskConfig,
    /// `[serve]`.
    pub serve: ServeConfig,
    /// `[manager]`.
    pub manager: ManagerSectionConfig,
}

impl NodeConfig {
    /// Checks values that parse but make no sense, section by section.
    pub fn validate(&self) -> kvtier_core::Result<()> {
        if let Some(g) = &self.geometry {
            g.resolve()?;
        }
        self.memory.validate()?;
        self.disk.validate()?;
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

    /// The secret file, defaulting to `<data_dir>/node.secret`.
    pub fn secret_file(&self) -> PathBuf {
        if self.manager.secret_file.as_os_str().is_empty() {
            self.serve.data_dir.join("node.secret")
        } else {
            self.manager.secret_file.clone()
        }
    }

    /// The shape file: `<data_dir>/shape.toml`.
    pub fn shape_file(&self) -> PathBuf {
        self.serve.data_dir.join("shape.toml")
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

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> PeerSectionConfig {
        PeerSectionConfig {
            listen: "127.0.0.1:0".into(),
            cluster: "c".into(),
            secret_file: "/etc/kvtier/cluster.secret".into(),
            ..PeerSectionConfig::default()
        }
    }

    fn shared(url: &str) -> SharedG4SectionConfig {
        SharedG4SectionConfig {
            url: url.into(),
            ..SharedG4SectionConfig::default()
        }
    }

    fn refusal(s: &SharedG4SectionConfig, meta: bool, p: &PeerSectionConfig, g4: &str) -> String {
        s.validate(meta, p, g4).unwrap_err().to_string()
    }

    /// A shared G4 needs the metadata service, a cluster identity, an S3
    /// store or a shared directory, and a node G4 that is another store;
    /// off, nothing is checked.
    #[test]
    fn the_shared_g4_section_refuses_what_cannot_work() {
        let s = shared("s3://b/shared");
        s.validate(true, &peer(), "").unwrap();
        s.validate(true, &peer(), "s3://b/own").unwrap();
        shared("")
            .validate(false, &PeerSectionConfig::default(), "s3://b/shared")
            .unwrap();
        assert!(refusal(&s, false, &peer(), "").contains("meta.enabled"));
        let none = PeerSectionConfig::default();
        assert!(refusal(&s, true, &none, "").contains("cluster identity"));
        for own in [
            "s3://b/shared",
            "s3://b/shared/",
            "s3://b/shared/x",
            "s3://b",
        ] {
            assert!(
                refusal(&s, true, &peer(), own).contains("overlaps"),
                "{own}"
            );
        }
        assert!(refusal(&shared("gs://b/x"), true, &peer(), "").contains("file:///absolute/dir"));
        let zero = SharedG4SectionConfig {
            batch: 0,
            ..s.clone()
        };
        assert!(refusal(&zero, true, &peer(), "").contains("positive"));
    }

    /// A shared directory must be absolute, exist and take files; the
    /// errors name it. The node's own G4 in or around it is refused
    /// however either is spelled.
    #[test]
    fn a_shared_directory_is_checked_before_the_start() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().display().to_string();
        let s = shared(&format!("file://{dir}/"));
        s.validate(true, &peer(), "").unwrap();
        s.validate(true, &peer(), &format!("file://{dir}-own"))
            .unwrap();
        for own in [
            format!("file://{dir}"),
            format!("file://localhost{dir}/"),
            format!("file://{dir}/g4"),
        ] {
            assert!(
                refusal(&s, true, &peer(), &own).contains("overlaps"),
                "{own}"
            );
        }
        let relative = refusal(&shared("file://shared/dir"), true, &peer(), "");
        assert!(relative.contains("absolute directory"), "{relative}");
        let missing = format!("file://{dir}/not-mounted");
        let e = refusal(&shared(&missing), true, &peer(), "");
        assert!(
            e.contains("not-mounted") && e.contains("does not exist"),
            "{e}"
        );
        assert!(!root.path().join("not-mounted").exists());
        let e = refusal(&shared("file:///proc"), true, &peer(), "");
        assert!(e.contains("cannot write in directory /proc"), "{e}");
    }

    proptest::proptest! {
        /// The node's own G4 overlaps the shared one exactly when one
        /// directory is the other or inside it, whatever the spelling;
        /// a sibling whose name extends the other's never does.
        #[test]
        fn overlap_is_containment_of_directories(
            base in proptest::collection::vec("[a-z0-9]{1,6}", 1..3),
            below in proptest::collection::vec("[a-z0-9]{1,6}", 0..3),
            suffix in "[a-z0-9]{0,3}",
            localhost: bool,
            slash: bool,
        ) {
            let shared_dir = format!("/{}", base.join("/"));
            let own_dir = if below.is_empty() {
                format!("{shared_dir}{suffix}")
            } else {
                format!("{shared_dir}{suffix}/{}", below.join("/"))
            };
            let host = if localhost { "localhost" } else { "" };
            let own = format!("file://{host}{own_dir}{}", if slash { "/" } else { "" });
            let shared = format!("file://{shared_dir}");
            proptest::prop_assert_eq!(overlaps(&own, &shared), suffix.is_empty());
            proptest::prop_assert!(!overlaps("", &shared));
        }
    }
}
