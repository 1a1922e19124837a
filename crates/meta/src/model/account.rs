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
    /// Groups a [`Role::User`] may use; empty means every group.
    pub allowed_groups: Vec<String>,
}
