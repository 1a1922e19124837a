//! Who is calling: API keys from HTTP headers or gRPC metadata, checked with
//! `MetaService::authenticate` (docs/server.md, "Authentication").

use kvtier_meta::{MetaService, Principal};

use crate::config::AuthMode;

/// The caller of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Authentication is off: every call is allowed, as an administrator.
    Open,
    /// An authenticated account, with its role and groups.
    Account(Principal),
}

impl Caller {
    /// Whether the caller may use the admin service.
    pub fn is_admin(&self) -> bool {
        match self {
            Caller::Open => true,
            Caller::Account(p) => p.is_admin(),
        }
    }

    /// Whether the caller may act on instances of `group`
    /// ([`Principal::may_use_group`]: a user without groups may use none).
    pub fn may_use_group(&self, group: &str) -> bool {
        match self {
            Caller::Open => true,
            Caller::Account(p) => p.may_use_group(group),
        }
    }

    /// Whether the caller is a user account that may use no group at all,
    /// so a refusal can say how to fix it.
    pub fn has_no_groups(&self) -> bool {
        matches!(self, Caller::Account(p) if !p.is_admin() && p.groups.is_empty())
    }

    /// Account name for messages (`-` when open).
    pub fn account(&self) -> &str {
        match self {
            Caller::Open => "-",
            Caller::Account(p) => &p.account,
        }
    }
}

/// Why a request was not let in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No key in the request.
    #[error("unauthenticated: no API key (send `Authorization: Bearer <key>`)")]
    Missing,
    /// The key matches no account.
    #[error("unauthenticated: API key not recognised")]
    Invalid,
    /// The account may not use this listener (a user key on the admin API).
    #[error("permission denied: account {0:?} is not an administrator")]
    NotAdmin(String),
}

/// The key carried by an `authorization` value (`Bearer <key>`, scheme
/// case-insensitive) or an `x-api-key` value (the key itself).
pub fn key_from_headers<'a>(
    authorization: Option<&'a str>,
    x_api_key: Option<&'a str>,
) -> Option<&'a str> {
    if let Some(v) = authorization {
        let v = v.trim();
        if let Some((scheme, key)) = v.split_once(' ')
            && scheme.eq_ignore_ascii_case("bearer")
            && !key.trim().is_empty()
        {
            return Some(key.trim());
        }
    }
    x_api_key.map(str::trim).filter(|k| !k.is_empty())
}

/// The caller presenting `key`, under `mode`; `admin_only` refuses
/// non-administrators (the admin listeners).
pub fn authenticate(
    svc: &MetaService,
    mode: AuthMode,
    key: Option<&str>,
    admin_only: bool,
) -> Result<Caller, AuthError> {
    let caller = match mode {
        AuthMode::Disabled => Caller::Open,
        AuthMode::ApiKeys => {
            let key = key.ok_or(AuthError::Missing)?;
            Caller::Account(svc.authenticate(key).map_err(|_| AuthError::Invalid)?)
        }
    };
    if admin_only && !caller.is_admin() {
        return Err(AuthError::NotAdmin(caller.account().to_owned()));
    }
    Ok(caller)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_meta::Role;

    #[test]
    fn keys_are_read_from_either_header() {
        assert_eq!(key_from_headers(Some("Bearer abc"), None), Some("abc"));
        assert_eq!(key_from_headers(Some("bearer  abc "), None), Some("abc"));
        assert_eq!(key_from_headers(Some("Basic abc"), Some("k")), Some("k"));
        assert_eq!(key_from_headers(None, Some(" k ")), Some("k"));
        assert_eq!(key_from_headers(Some("Bearer "), None), None);
        assert_eq!(key_from_headers(None, None), None);
    }

    fn caller(role: Role, groups: &[&str]) -> Caller {
        Caller::Account(Principal {
            account: "x".into(),
            role,
            groups: groups.iter().map(|g| g.to_string()).collect(),
        })
    }

    #[test]
    fn groups_limit_users_not_admins() {
        let user = caller(Role::User, &["a"]);
        assert!(user.may_use_group("a") && !user.may_use_group("b") && !user.is_admin());
        let admin = caller(Role::Admin, &["a"]);
        assert!(admin.may_use_group("b") && admin.is_admin());
        assert!(Caller::Open.may_use_group("b"));
    }

    #[test]
    fn users_without_groups_reach_none_and_star_reaches_all() {
        let none = caller(Role::User, &[]);
        assert!(!none.may_use_group("a") && !none.may_use_group("default"));
        assert!(none.has_no_groups());
        let all = caller(Role::User, &[kvtier_meta::ALL_GROUPS]);
        assert!(all.may_use_group("a") && all.may_use_group("default"));
        assert!(!all.has_no_groups() && !caller(Role::Admin, &[]).has_no_groups());
    }
}
