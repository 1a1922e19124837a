//! Instances: one model deployment with one KV layout. Blocks are reused
//! only inside one instance, so every block record is keyed by
//! (instance, block key).

use serde::{Deserialize, Serialize};

/// One part of a block's bytes, e.g. the KV of one TP rank, or the linear
/// attention state of a hybrid model. Named by the user (Tair KVCM
/// `LocationSpecInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocationSpecInfo {
    /// Spec name, e.g. `tp0`.
    pub name: String,
    /// Bytes of this spec per block.
    pub size: u64,
}

/// A named subset of specs that are matched and written together (e.g. the
/// full-attention specs vs the linear-attention specs of a hybrid model).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecGroup {
    /// Group name.
    pub name: String,
    /// Names of [`LocationSpecInfo`]s in this group.
    pub specs: Vec<String>,
}

/// A KV cache instance. Its model and layout never change after
/// registration; re-registering with different values is a conflict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    /// Unique id.
    pub id: String,
    /// The group whose quota and storages this instance uses.
    pub group: String,
    /// Model deployment name (model + version + dtype), informational.
    pub model: String,
    /// Tokens per block.
    pub block_size: u32,
    /// The parts each block is stored as; at least one.
    pub location_specs: Vec<LocationSpecInfo>,
    /// Optional groupings of specs (empty: one implicit group of all).
    pub spec_groups: Vec<SpecGroup>,
}

impl Instance {
    /// Bytes of one full block: the sum of its specs.
    pub fn block_bytes(&self) -> u64 {
        self.location_specs.iter().map(|s| s.size).sum()
    }
}
