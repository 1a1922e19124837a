//! Accounts for the admin and metadata APIs. Authentication itself comes with
//! the transport step; the model is here so records share one store.

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
    /// Hash of the API key (never the key itself), hex.
    pub api_key_hash: String,
    /// Groups a [`Role::User`] may use.
    pub allowed_groups: Vec<String>,
}
