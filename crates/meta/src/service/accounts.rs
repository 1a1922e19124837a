//! Accounts and API-key authentication.
//!
//! A key is stored only as `sha256$<salt>$<digest>`: a random 16-byte
//! per-account salt and SHA-256(salt || key), both hex. SHA-256 rather than
//! a password KDF (argon2, scrypt) because these keys are bearer tokens
//! meant to be random (at least 16 characters; `kvtier` generates 256-bit
//! ones), not passwords a person chose: a slow hash protects guessable
//! secrets and buys nothing against a random 128+-bit one, while
//! [`MetaService::authenticate`] runs on every request and must cost
//! microseconds. The salt still keeps equal keys from having equal stored
//! hashes and defeats precomputed tables.
//!
//! Lookup: a memory-only map from the unsalted digest of a key that
//! authenticated before to its account (see `Catalog::key_cache`); a hit is
//! confirmed against the stored salted hash with a constant-time compare.
//! A miss tries each account's salted hash (one SHA-256 each; accounts are
//! few) and caches the digest on success.

use sha2::{Digest, Sha256};

use super::MetaService;
use super::catalog::{Change, KeyDigest};
use crate::error::{MetaError, Result};
use crate::model::{ALL_GROUPS, Account, Role, group_allowed};

/// Shortest API key accepted.
pub const MIN_API_KEY_LEN: usize = 16;

const SCHEME: &str = "sha256";

/// Who a request runs as, from [`MetaService::authenticate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Account name.
    pub account: String,
    /// Role of the account.
    pub role: Role,
    /// Groups a [`Role::User`] may use ([`Account::allowed_groups`]:
    /// empty means none, [`ALL_GROUPS`] every group).
    pub groups: Vec<String>,
}

impl Principal {
    /// Whether the principal may call the admin service.
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// Whether the principal may act on instances of `group`: admins always;
    /// users when their account lists the group or [`ALL_GROUPS`]. A user
    /// listing no group may use none (fail closed: the Tair KVCM
    /// `AddAccount` call carries no groups, and such an account must be
    /// granted some before it reaches anything).
    pub fn may_use_group(&self, group: &str) -> bool {
        group_allowed(self.role, &self.groups, group)
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn salted(salt: &[u8], key: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(salt);
    h.update(key.as_bytes());
    h.finalize().into()
}

fn digest(key: &str) -> KeyDigest {
    Sha256::digest(key.as_bytes()).into()
}

/// Equality whose running time does not depend on where the inputs differ.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Hashes `key` with a fresh random salt into the stored form.
pub(crate) fn hash_api_key(key: &str) -> String {
    let salt: [u8; 16] = rand::random();
    format!("{SCHEME}${}${}", hex(&salt), hex(&salted(&salt, key)))
}

/// The (salt, digest) of a stored hash, or `None` if malformed.
fn parse_hash(stored: &str) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut parts = stored.split('$');
    let (Some(SCHEME), Some(salt), Some(digest), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let (salt, digest) = (unhex(salt)?, unhex(digest)?);
    (!salt.is_empty() && digest.len() == 32).then_some((salt, digest))
}

/// Whether a stored hash is well formed (snapshot validation).
pub(crate) fn valid_hash(stored: &str) -> bool {
    parse_hash(stored).is_some()
}

fn key_matches(account: &Account, key: &str) -> bool {
    parse_hash(&account.api_key_hash)
        .is_some_and(|(salt, digest)| ct_eq(&salted(&salt, key), &digest))
}

/// An API key as given to [`MetaService::put_account`].
#[derive(Debug, Clone, Copy)]
pub enum ApiKey<'a> {
    /// The key itself; it is stored salted and hashed.
    Clear(&'a str),
    /// The stored form, `sha256$<salt hex>$<SHA-256(salt || key) hex>`, for
    /// operators who keep the key itself off the server.
    Hashed(&'a str),
}

impl ApiKey<'_> {
    /// Whether `account` already holds this key: the clear key matches its
    /// salted hash, or the hash is the one stored.
    fn is_stored_as(&self, account: &Account) -> bool {
        match self {
            ApiKey::Clear(key) => key_matches(account, key),
            ApiKey::Hashed(hash) => account.api_key_hash == *hash,
        }
    }

    /// The stored form, or [`MetaError::InvalidArgument`] for a key shorter
    /// than `min_len` characters or a malformed hash.
    fn stored(self, min_len: usize) -> Result<String> {
        match self {
            ApiKey::Clear(key) if key.chars().count() < min_len => Err(MetaError::InvalidArgument(
                format!("api key shorter than {min_len} characters (meta.min_api_key_len)"),
            )),
            ApiKey::Clear(key) => Ok(hash_api_key(key)),
            ApiKey::Hashed(h) if valid_hash(h) => Ok(h.to_owned()),
            ApiKey::Hashed(_) => Err(MetaError::InvalidArgument(
                "malformed key hash (expected sha256$<salt hex>$<64 hex digits>)".into(),
            )),
        }
    }
}

/// Checks an account's group list against the groups that exist: every
/// entry names one, or is [`ALL_GROUPS`]. [`MetaError::GroupNotFound`]
/// names the first that does not.
pub(crate) fn check_account_groups(groups: &[String], exists: impl Fn(&str) -> bool) -> Result<()> {
    match groups.iter().find(|g| *g != ALL_GROUPS && !exists(g)) {
        Some(g) => Err(MetaError::GroupNotFound(g.clone())),
        None => Ok(()),
    }
}

fn principal(a: &Account) -> Principal {
    Principal {
        account: a.name.clone(),
        role: a.role,
        groups: a.allowed_groups.clone(),
    }
}

/// A validated account record (name and key checked against
/// `min_key_len`, key hashed); its groups are checked against the catalog
/// by the caller.
fn new_account(
    name: &str,
    role: Role,
    key: ApiKey<'_>,
    groups: Vec<String>,
    min_key_len: usize,
) -> Result<Account> {
    super::admin::check_name("account name", name)?;
    Ok(Account {
        name: name.to_owned(),
        role,
        api_key_hash: key.stored(min_key_len)?,
        allowed_groups: groups,
    })
}

impl MetaService {
    /// Adds an account whose API key is `api_key` (stored salted and
    /// hashed, never in clear). `groups` are the instance groups a
    /// [`Role::User`] may use: existing groups, or [`ALL_GROUPS`]; empty
    /// means none.
    ///
    /// [`MetaError::InvalidArgument`] for an empty name or a key shorter
    /// than `MetaConfig::min_api_key_len`, [`MetaError::GroupNotFound`],
    /// [`MetaError::AlreadyExists`]; then nothing changes.
    pub fn add_account(
        &self,
        name: &str,
        role: Role,
        api_key: &str,
        groups: Vec<String>,
    ) -> Result<()> {
        let account = new_account(
            name,
            role,
            ApiKey::Clear(api_key),
            groups,
            self.config.min_api_key_len,
        )?;
        self.catalog.apply(self.index.as_ref(), |maps| {
            if maps.accounts.contains_key(name) {
                return Err(MetaError::AlreadyExists(format!("account {name:?}")));
            }
            check_account_groups(&account.allowed_groups, |g| maps.groups.contains_key(g))?;
            Ok((vec![Change::PutAccount(account)], ()))
        })?;
        self.admin.count_change();
        Ok(())
    }

    /// Creates account `name`, or replaces it whole (role, key, groups):
    /// how accounts listed in the configuration are provisioned at every
    /// start. An account that already has this role, key and groups is
    /// left as it is (nothing is written). The old key of a replaced account stops authenticating at
    /// once. Same checks as [`MetaService::add_account`]; a refusal changes
    /// nothing.
    pub fn put_account(
        &self,
        name: &str,
        role: Role,
        api_key: ApiKey<'_>,
        groups: Vec<String>,
    ) -> Result<()> {
        // Unchanged: no write, so a restart on a full disk still starts.
        if let Some(cur) = self.catalog.account(name)
            && cur.role == role
            && cur.allowed_groups == groups
            && api_key.is_stored_as(&cur)
        {
            return Ok(());
        }
        let account = new_account(name, role, api_key, groups, self.config.min_api_key_len)?;
        self.catalog.apply(self.index.as_ref(), |maps| {
            check_account_groups(&account.allowed_groups, |g| maps.groups.contains_key(g))?;
            Ok((vec![Change::PutAccount(account)], ()))
        })?;
        self.admin.count_change();
        Ok(())
    }

    /// Replaces the instance groups account `name` may use (a kvtier
    /// extension of the admin API: Tair KVCM accounts carry no groups).
    /// Takes effect on the account's next request.
    ///
    /// [`MetaError::AccountNotFound`], [`MetaError::GroupNotFound`]; then
    /// nothing changes.
    pub fn set_account_groups(&self, name: &str, groups: Vec<String>) -> Result<()> {
        self.catalog.apply(self.index.as_ref(), |maps| {
            let Some(current) = maps.accounts.get(name) else {
                return Err(MetaError::AccountNotFound(name.to_owned()));
            };
            check_account_groups(&groups, |g| maps.groups.contains_key(g))?;
            let account = Account {
                allowed_groups: groups,
                ..(**current).clone()
            };
            Ok((vec![Change::PutAccount(account)], ()))
        })?;
        self.admin.count_change();
        Ok(())
    }

    /// Deletes an account; its key stops authenticating at once.
    pub fn delete_account(&self, name: &str) -> Result<()> {
        self.catalog.apply(self.index.as_ref(), |maps| {
            if !maps.accounts.contains_key(name) {
                return Err(MetaError::AccountNotFound(name.to_owned()));
            }
            Ok((vec![Change::DeleteAccount(name.to_owned())], ()))
        })?;
        self.admin.count_change();
        Ok(())
    }

    /// Every account, by name, with its key hash blanked: listings never
    /// carry key material (not even hashes; snapshots do carry hashes).
    pub fn list_accounts(&self) -> Vec<Account> {
        let mut out: Vec<Account> = self
            .catalog
            .accounts()
            .iter()
            .map(|a| Account {
                api_key_hash: String::new(),
                ..(**a).clone()
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The account `api_key` belongs to, or [`MetaError::Unauthenticated`].
    pub fn authenticate(&self, api_key: &str) -> Result<Principal> {
        let d = digest(api_key);
        if let Some(name) = self.catalog.cached_key(&d) {
            match self.catalog.account(&name) {
                Some(a) if key_matches(&a, api_key) => {
                    self.admin.count_auth(true);
                    return Ok(principal(&a));
                }
                _ => self.catalog.forget_key(&d),
            }
        }
        let found = self
            .catalog
            .accounts()
            .into_iter()
            .find(|a| key_matches(a, api_key));
        self.admin.count_auth(found.is_some());
        let a = found.ok_or(MetaError::Unauthenticated)?;
        self.catalog.cache_key(d, &a.name);
        Ok(principal(&a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_salted_and_verify() {
        let a = hash_api_key("0123456789abcdef");
        let b = hash_api_key("0123456789abcdef");
        assert_ne!(a, b, "same key, different salts");
        assert!(valid_hash(&a));
        let acc = Account {
            name: "x".into(),
            role: Role::User,
            api_key_hash: a,
            allowed_groups: vec![],
        };
        assert!(key_matches(&acc, "0123456789abcdef"));
        assert!(!key_matches(&acc, "0123456789abcdeF"));
        assert!(!valid_hash("sha256$zz$00"));
        assert!(!valid_hash("md5$00$00"));
        assert!(!valid_hash(&format!("sha256$$${}", "0".repeat(64))));
    }

    #[test]
    fn constant_time_eq_is_eq() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
    }
}
