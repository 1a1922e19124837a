//! The metadata model: control-plane objects (storages, instance groups,
//! instances, accounts) and data-plane records (block keys, cache
//! locations, block metadata).
//!
//! Control-plane objects are rare, small and edited by people, so they are
//! plain serde structs stored as JSON. Block records are many (hundreds of
//! millions per cluster), so they get a compact hand-written encoding in
//! the crate's private `codec` module (see [`RedbIndex`](crate::RedbIndex)).

mod account;
mod block;
mod group;
mod instance;
mod storage;

pub use account::{ALL_GROUPS, Account, Role, group_allowed};
pub use block::{BlockKey, BlockMeta, CacheLocation, LocationId, LocationSpec, LocationStatus};
pub use group::{EvictionPolicy, InstanceGroup};
pub use instance::{Instance, LocationSpecInfo, SpecGroup};
pub use storage::{Storage, StorageHealth, StorageKind, write_refusal};
