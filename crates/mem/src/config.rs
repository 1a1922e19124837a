//! [`MemoryConfig`], the `[memory]` section, and [`MemoryTierConfig`]:
//! everything [`MemoryTier::create`](crate::MemoryTier::create) needs.

use kvtier_core::{ByteSize, CoreError, Geometry};
use serde::{Deserialize, Serialize};

use crate::mac::TableKey;

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
    /// Deprecated and ignored: the arena never evicts (G2's eviction
    /// policy is `[manager] policy`). Still accepted, with a warning from
    /// [`validate`](Self::validate), so older files keep loading.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            capacity: ByteSize(1 << 30),
            shm_name: "kvtier".into(),
            hugepages: false,
            policy: None,
        }
    }
}

impl MemoryConfig {
    /// Checks values that parse but make no sense, and warns of the
    /// deprecated `policy`.
    pub fn validate(&self) -> kvtier_core::Result<()> {
        if self.shm_name.is_empty() || self.shm_name.contains('/') {
            return Err(CoreError::InvalidConfig(
                "memory.shm_name must be a non-empty name without '/'".into(),
            ));
        }
        if let Some(policy) = &self.policy {
            tracing::warn!(
                policy = %policy,
                "memory.policy is deprecated and ignored: the arena never evicts; G2's eviction policy is manager.policy"
            );
        }
        Ok(())
    }
}

/// The resolved configuration of one memory tier.
///
/// Build it from the `[memory]` section and the model geometry with
/// [`MemoryTierConfig::new`], or fill the fields directly (tests, tools).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryTierConfig {
    /// Name of the shared-memory file, `/dev/shm/<shm_name>`. Other
    /// processes open the arena by this name.
    pub shm_name: String,
    /// Bytes of block slots (the header and slot table come on top). The
    /// arena holds `capacity_bytes / slot_bytes` blocks.
    pub capacity_bytes: u64,
    /// Bytes of one block.
    pub block_bytes: usize,
    /// Bytes of one layer of a block: the unit of the per-layer checksums.
    /// The last layer may be shorter when `block_bytes` is not a multiple.
    pub layer_bytes: usize,
    /// Back the arena with transparent huge pages (2 MiB slots) when the
    /// kernel allows it for shared memory; falls back to 4 KiB pages with a
    /// log line otherwise.
    pub hugepages: bool,
    /// The key that authenticates the owner's slot table entries (a MAC
    /// per entry, docs/memory-arena.md). With a key, an arena of the same
    /// geometry that a crashed owner left at the name is adopted: its
    /// entries that verify under this key, with bytes that verify against
    /// their sums, stay resident. Without one, entries carry no MAC and any
    /// arena left at the name is replaced.
    pub table_key: Option<TableKey>,
    /// The group whose processes may open the arena besides its owner's
    /// user: `None` makes it mode 0600 (the owner's user only), `Some(gid)`
    /// mode 0660 with that group, for engines that run as another user.
    /// Set explicitly (`fchmod`, `fchown`), whatever the umask.
    pub access_group: Option<u32>,
}

impl MemoryTierConfig {
    /// The tier described by `[memory]` for blocks of `geometry`, private
    /// to the owner's user (the node sets
    /// [`access_group`](Self::access_group) from `[manager]`).
    pub fn new(cfg: &MemoryConfig, geometry: &Geometry) -> Self {
        Self {
            shm_name: cfg.shm_name.clone(),
            capacity_bytes: cfg.capacity.bytes(),
            block_bytes: usize::try_from(geometry.block_bytes()).unwrap_or(usize::MAX),
            layer_bytes: usize::try_from(geometry.layer_bytes()).unwrap_or(usize::MAX),
            hugepages: cfg.hugepages,
            table_key: None,
            access_group: None,
        }
    }

    /// The same configuration with entries authenticated under `key` (and
    /// a crashed owner's arena adopted); see [`table_key`](Self::table_key).
    pub fn with_table_key(mut self, key: TableKey) -> Self {
        self.table_key = Some(key);
        self
    }

    /// Layers per block: `ceil(block_bytes / layer_bytes)`.
    pub fn layers(&self) -> usize {
        self.block_bytes.div_ceil(self.layer_bytes.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_core::ModelPreset;

    #[test]
    fn from_core_config() {
        let g = ModelPreset::Llama3_8B.geometry(16);
        let c = MemoryTierConfig::new(&MemoryConfig::default(), &g);
        assert_eq!(c.block_bytes, 2 << 20);
        assert_eq!(c.layers(), g.layers as usize);
        assert_eq!(c.shm_name, "kvtier");
    }

    /// `policy` no longer does anything but still loads, so a file written
    /// for an older kvtier keeps working.
    #[test]
    fn the_deprecated_policy_still_loads() {
        let c: MemoryConfig = toml::from_str("policy = \"lru\"").unwrap();
        assert_eq!(c.policy.as_deref(), Some("lru"));
        assert!(c.validate().is_ok());
    }
}
