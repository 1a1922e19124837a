//! Accounts for the admin and metadata APIs. The service keeps them with the
//! other control-plane records and authenticates API keys against them
//! (`MetaService::authenticate`); the transport decides which calls need
//! which role.

use serde::{Deserialize, Serialize};

/// What an account may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Everything, including storages, groups and accounts.
    Admin,
    /// Metadata calls on instances of the allowed groups.
    User,
}

/// The entry of [`Account::allowed_groups`] that grants a [`Role::User`]
/// every instance group, present and future. A group cannot be named so.
pub const ALL_GROUPS: &str = "*";

/// An API account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    /// Unique name.
    pub name: String,
    /// Role.
    pub role: Role,
    /// Salted hash of the API key (never the key itself):
    /// `sha256$<salt hex>$<SHA-256(salt || key) hex>`. Empty in listings.
    pub api_key_hash: String,
    /// Groups a [`Role::User`] may use. Empty means none (fail closed: an
    /// account added without groups reaches nothing until it is granted
    /// some); [`ALL_GROUPS`] means every group. Ignored for admins.
    pub allowed_groups: Vec<String>,
}

/// The one rule of group scoping: admins use every group; a user the groups
/// it lists, or every group when it lists [`ALL_GROUPS`]; nothing else.
pub fn group_allowed(role: Role, allowed: &[String], group: &str) -> bool {
    role == Role::Admin || allowed.iter().any(|g| g == group || g == ALL_GROUPS)
}
