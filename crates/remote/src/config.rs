//! [`RemoteConfig`]: where the remote tier lives and how to talk to it, and
//! the store client built from it.
//!
//! Two kinds of URL:
//!
//! - `s3://<bucket>[/<prefix>]`: an S3-compatible object store
//!   ([`AmazonS3`](object_store::aws::AmazonS3)). Credentials come from the
//!   configuration when given, otherwise from the usual AWS sources
//!   (environment, web identity, instance metadata); the endpoint from the
//!   configuration or `AWS_ENDPOINT_URL`.
//! - `file:///<absolute dir>`: a shared (or local) file system
//!   ([`LocalFileSystem`](object_store::local::LocalFileSystem)); the
//!   directory is created if missing.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::{ClientOptions, ObjectStore, RetryConfig};
use serde::Deserialize;

use crate::RemoteError;

/// Configuration of a [`RemoteTier`](crate::RemoteTier).
///
/// ```
/// let cfg: kvtier_remote::RemoteConfig = serde_json::from_str(
///     r#"{ "url": "s3://kv/cache", "endpoint": "http://127.0.0.1:9000", "allow_http": true }"#,
/// ).unwrap();
/// assert_eq!(cfg.region, "us-east-1");
/// assert_eq!(cfg.timeout_ms, 10_000);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {
    /// `s3://bucket/prefix` or `file:///abs/dir`. Required.
    pub url: String,
    /// S3 endpoint, e.g. `http://127.0.0.1:9000`. Default: `AWS_ENDPOINT_URL`
    /// if set, else AWS itself.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// S3 region. Default `us-east-1`.
    #[serde(default = "default_region")]
    pub region: String,
    /// S3 access key id. Default: the AWS credential chain.
    #[serde(default)]
    pub access_key_id: Option<String>,
    /// S3 secret access key (with `access_key_id`).
    #[serde(default)]
    pub secret_access_key: Option<String>,
    /// S3 session token, for temporary credentials.
    #[serde(default)]
    pub session_token: Option<String>,
    /// Allow plain `http://` endpoints. Default false.
    #[serde(default)]
    pub allow_http: bool,
    /// Bound of every request, retries included, in milliseconds. Default 10,000.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Requests in flight per batch. Default 32.
    #[serde(default = "default_max_concurrency")]
    pub max_concurrency: usize,
}

fn default_region() -> String {
    "us-east-1".into()
}

const fn default_timeout_ms() -> u64 {
    10_000
}

const fn default_max_concurrency() -> usize {
    32
}

impl Default for RemoteConfig {
    /// Every default, with an empty (so far invalid) `url`.
    fn default() -> Self {
        RemoteConfig {
            url: String::new(),
            endpoint: None,
            region: default_region(),
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
            allow_http: false,
            timeout_ms: default_timeout_ms(),
            max_concurrency: default_max_concurrency(),
        }
    }
}

/// A store client built from a configuration.
#[derive(Debug)]
pub(crate) struct Connected {
    pub store: Arc<dyn ObjectStore>,
    /// The URL shown in object URIs, without a trailing `/`.
    pub display: String,
    /// The key prefix inside `store`, without leading or trailing `/`.
    pub prefix: String,
}

fn bad(url: &str, reason: impl Into<String>) -> RemoteError {
    RemoteError::BadUrl {
        url: url.to_owned(),
        reason: reason.into(),
    }
}

fn clean_segments(url: &str, path: &str) -> Result<(), RemoteError> {
    if path.contains(['?', '#', '\\'])
        || path
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(bad(url, "path has empty, relative or odd segments"));
    }
    Ok(())
}

impl RemoteConfig {
    /// The per-request bound.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// Checks the configuration without connecting.
    pub fn validate(&self) -> Result<(), RemoteError> {
        if self.timeout_ms == 0 {
            return Err(RemoteError::Config("timeout_ms must be positive".into()));
        }
        if self.max_concurrency == 0 {
            return Err(RemoteError::Config(
                "max_concurrency must be positive".into(),
            ));
        }
        if self.access_key_id.is_some() != self.secret_access_key.is_some() {
            return Err(RemoteError::Config(
                "access_key_id and secret_access_key go together".into(),
            ));
        }
        Ok(())
    }

    /// Builds the store client (no request is made).
    pub(crate) fn connect(&self) -> Result<Connected, RemoteError> {
        self.validate()?;
        let url = self.url.as_str();
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() || bucket.contains(['?', '#', '@', ':']) {
                return Err(bad(url, "no bucket, or an odd one"));
            }
            let prefix = prefix.trim_end_matches('/');
            if !prefix.is_empty() {
                clean_segments(url, prefix)?;
            }
            let store = self.s3(bucket)?;
            let display = if prefix.is_empty() {
                format!("s3://{bucket}")
            } else {
                format!("s3://{bucket}/{prefix}")
            };
            Ok(Connected {
                store,
                display,
                prefix: prefix.to_owned(),
            })
        } else if let Some(rest) = url.strip_prefix("file://") {
            let dir = rest.strip_prefix("localhost").unwrap_or(rest);
            if !dir.starts_with('/') {
                return Err(bad(
                    url,
                    "file URLs name an absolute directory: file:///dir",
                ));
            }
            let dir = dir.trim_end_matches('/');
            if dir.is_empty() {
                return Err(bad(url, "refusing the root directory"));
            }
            clean_segments(url, &dir[1..])?;
            std::fs::create_dir_all(dir).map_err(|e| bad(url, format!("create {dir}: {e}")))?;
            let store =
                LocalFileSystem::new_with_prefix(dir).map_err(|e| bad(url, e.to_string()))?;
            Ok(Connected {
                store: Arc::new(store),
                display: format!("file://{dir}"),
                prefix: String::new(),
            })
        } else {
            Err(bad(url, "expected s3://bucket/prefix or file:///dir"))
        }
    }

    fn s3(&self, bucket: &str) -> Result<Arc<dyn ObjectStore>, RemoteError> {
        let timeout = self.timeout();
        let client = ClientOptions::new()
            .with_allow_http(self.allow_http)
            .with_timeout(timeout)
            .with_connect_timeout(timeout);
        let retry = RetryConfig {
            max_retries: 2,
            retry_timeout: timeout,
            ..RetryConfig::default()
        };
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_region(&self.region)
            .with_allow_http(self.allow_http)
            .with_client_options(client)
            .with_retry(retry);
        if let Some(e) = &self.endpoint {
            b = b.with_endpoint(e);
        }
        if let (Some(id), Some(secret)) = (&self.access_key_id, &self.secret_access_key) {
            b = b.with_access_key_id(id).with_secret_access_key(secret);
            if let Some(t) = &self.session_token {
                b = b.with_token(t);
            }
        }
        let store = b
            .build()
            .map_err(|e| RemoteError::Config(format!("s3 client for {}: {e}", self.url)))?;
        Ok(Arc::new(store))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(url: &str) -> RemoteConfig {
        RemoteConfig {
            url: url.into(),
            endpoint: Some("http://127.0.0.1:1".into()),
            access_key_id: Some("k".into()),
            secret_access_key: Some("s".into()),
            allow_http: true,
            ..RemoteConfig::default()
        }
    }

    #[test]
    fn s3_urls_split_into_bucket_and_prefix() {
        let c = cfg("s3://kv/cache/v1/").connect().unwrap();
        assert_eq!(
            (c.display.as_str(), c.prefix.as_str()),
            ("s3://kv/cache/v1", "cache/v1")
        );
        let c = cfg("s3://kv").connect().unwrap();
        assert_eq!((c.display.as_str(), c.prefix.as_str()), ("s3://kv", ""));
    }

    #[test]
    fn bad_urls_and_settings_are_refused() {
        for url in [
            "",
            "http://x/y",
            "s3://",
            "s3:///prefix",
            "s3://kv/a//b",
            "s3://kv/../b",
            "file://relative/dir",
            "file:///",
            "file:///tmp/../etc",
        ] {
            assert!(
                matches!(cfg(url).connect(), Err(RemoteError::BadUrl { .. })),
                "{url}"
            );
        }
        let mut c = cfg("s3://kv");
        c.max_concurrency = 0;
        assert!(matches!(c.connect(), Err(RemoteError::Config(_))));
        let mut c = cfg("s3://kv");
        c.secret_access_key = None;
        assert!(matches!(c.connect(), Err(RemoteError::Config(_))));
    }

    #[test]
    fn unknown_fields_are_refused() {
        let r: Result<RemoteConfig, _> = toml::from_str("url = \"s3://kv\"\ntimeout = 5\n");
        assert!(r.is_err());
        let c: RemoteConfig = toml::from_str("url = \"s3://kv\"\n").unwrap();
        assert_eq!(c.max_concurrency, 32);
    }
}
