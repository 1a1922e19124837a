//! Minimal parsing of the URIs the backends hand out:
//! `scheme://authority/path?k=v&k=v`. Components are taken as they are
//! (no percent-decoding): every URI parsed here was built by this crate.

use kvtier_meta::BackendError;

/// A split URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Uri<'a> {
    pub scheme: &'a str,
    pub authority: &'a str,
    /// Starts with `/` unless empty.
    pub path: &'a str,
    pub query: Vec<(&'a str, &'a str)>,
}

pub(crate) fn bad(uri: &str, reason: impl Into<String>) -> BackendError {
    BackendError::BadUri {
        uri: uri.to_owned(),
        reason: reason.into(),
    }
}

impl<'a> Uri<'a> {
    pub(crate) fn parse(uri: &'a str) -> Result<Self, BackendError> {
        let (scheme, rest) = uri.split_once("://").ok_or_else(|| bad(uri, "no scheme"))?;
        if scheme.is_empty() {
            return Err(bad(uri, "empty scheme"));
        }
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, q),
            None => (rest, ""),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let mut pairs = Vec::new();
        for kv in query.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| bad(uri, format!("query item {kv:?} has no value")))?;
            pairs.push((k, v));
        }
        Ok(Uri {
            scheme,
            authority,
            path,
            query: pairs,
        })
    }

    /// The single value of query parameter `key`.
    pub(crate) fn param(&self, uri: &str, key: &str) -> Result<&'a str, BackendError> {
        let mut it = self.query.iter().filter(|(k, _)| *k == key);
        match (it.next(), it.next()) {
            (Some((_, v)), None) => Ok(v),
            (None, _) => Err(bad(uri, format!("missing {key:?}"))),
            (Some(_), Some(_)) => Err(bad(uri, format!("{key:?} given twice"))),
        }
    }

    /// Query parameter `key` as a decimal `u64`.
    pub(crate) fn param_u64(&self, uri: &str, key: &str) -> Result<u64, BackendError> {
        self.param(uri, key)?
            .parse()
            .map_err(|_| bad(uri, format!("{key:?} is not a decimal number")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_components() {
        let u = Uri::parse("file:///mnt/kv/pool-0001.kv?offset=4096&size=8192").unwrap();
        assert_eq!(u.scheme, "file");
        assert_eq!(u.authority, "");
        assert_eq!(u.path, "/mnt/kv/pool-0001.kv");
        assert_eq!(u.param_u64("", "offset").unwrap(), 4096);
        assert_eq!(u.param_u64("", "size").unwrap(), 8192);
        let u = Uri::parse("kvtier://node-1/inst/a-b/tp0").unwrap();
        assert_eq!((u.authority, u.path), ("node-1", "/inst/a-b/tp0"));
        assert!(u.query.is_empty());
        assert!(Uri::parse("no-scheme").is_err());
        assert!(Uri::parse("file:///x?offset").is_err());
        let dup = Uri::parse("file:///x?a=1&a=2").unwrap();
        assert!(dup.param("", "a").is_err());
        assert!(dup.param("", "b").is_err());
    }
}
