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
//!   ([`LocalFileSystem`](object_store::local::LocalFileSystem), its files
//!   and directories private: [`PrivateDir`]); the node's own G4 creates
//!   the directory if missing, a shared G4 requires it.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kvtier_io::create_private_dir_all;
use object_store::aws::AmazonS3Builder;
use object_store::{ClientOptions, ObjectStore, RetryConfig};
use serde::Deserialize;

use crate::RemoteError;
use crate::dir::{PrivateDir, check_writable_dir};

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

/// Where a URL points.
enum Target<'a> {
    /// A bucket and a key prefix (no leading or trailing `/`; may be empty).
    S3 { bucket: &'a str, prefix: &'a str },
    /// An absolute directory, without a trailing `/`.
    Dir(&'a str),
}

impl Target<'_> {
    /// The URL as object URIs show it.
    fn display(&self) -> String {
        match self {
            Target::S3 { bucket, prefix: "" } => format!("s3://{bucket}"),
            Target::S3 { bucket, prefix } => format!("s3://{bucket}/{prefix}"),
            Target::Dir(dir) => format!("file://{dir}"),
        }
    }
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

    /// Where the URL points, checked without touching anything.
    fn target(&self) -> Result<Target<'_>, RemoteError> {
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
            Ok(Target::S3 { bucket, prefix })
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
            Ok(Target::Dir(dir))
        } else {
            Err(bad(url, "expected s3://bucket/prefix or file:///dir"))
        }
    }

    /// The URL as object URIs show it (`s3://bucket/prefix`,
    /// `file:///dir`: no trailing `/`, no `localhost`), so two spellings
    /// of one store compare equal. Nothing is touched.
    pub fn canonical_url(&self) -> Result<String, RemoteError> {
        Ok(self.target()?.display())
    }

    /// The directory of a `file://` URL; `None` for an `s3://` one.
    pub fn dir(&self) -> Result<Option<std::path::PathBuf>, RemoteError> {
        Ok(match self.target()? {
            Target::Dir(dir) => Some(dir.into()),
            Target::S3 { .. } => None,
        })
    }

    /// Checks that a `file://` URL names an existing directory this
    /// process can write in (a probe file is made and removed); an `s3://` URL
    /// is only parsed. For stores that others made and share, where
    /// creating a missing directory would hide an unmounted file system.
    pub fn check_existing(&self) -> Result<(), RemoteError> {
        match self.target()? {
            Target::Dir(dir) => check_writable_dir(&self.url, Path::new(dir)),
            Target::S3 { .. } => Ok(()),
        }
    }

    /// Builds the store client (no request is made). A `file://`
    /// directory is created (`0700`) if missing when `create_dir`, else
    /// it must exist and be writable ([`RemoteConfig::check_existing`]).
    pub(crate) fn connect(&self, create_dir: bool) -> Result<Connected, RemoteError> {
        self.validate()?;
        let target = self.target()?;
        let display = target.display();
        match target {
            Target::S3 { bucket, prefix } => Ok(Connected {
                store: self.s3(bucket)?,
                display,
                prefix: prefix.to_owned(),
            }),
            Target::Dir(dir) => {
                let url = self.url.as_str();
                if create_dir {
                    create_private_dir_all(Path::new(dir))
                        .map_err(|e| bad(url, format!("create {dir}: {e}")))?;
                } else {
                    check_writable_dir(url, Path::new(dir))?;
                }
                Ok(Connected {
                    store: Arc::new(PrivateDir::new(url, Path::new(dir))?),
                    display,
                    prefix: String::new(),
                })
            }
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
        let c = cfg("s3://kv/cache/v1/").connect(false).unwrap();
        assert_eq!(
            (c.display.as_str(), c.prefix.as_str()),
            ("s3://kv/cache/v1", "cache/v1")
        );
        let c = cfg("s3://kv").connect(false).unwrap();
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
                matches!(cfg(url).connect(true), Err(RemoteError::BadUrl { .. })),
                "{url}"
            );
        }
        let mut c = cfg("s3://kv");
        c.max_concurrency = 0;
        assert!(matches!(c.connect(true), Err(RemoteError::Config(_))));
        let mut c = cfg("s3://kv");
        c.secret_access_key = None;
        assert!(matches!(c.connect(true), Err(RemoteError::Config(_))));
    }

    #[test]
    fn a_shared_directory_must_exist_and_is_never_made() {
        let root = tempfile::tempdir().unwrap();
        let missing = root.path().join("nfs");
        let c = cfg(&format!("file://{}", missing.display()));
        let e = c.connect(false).unwrap_err().to_string();
        assert!(e.contains("does not exist") && e.contains("nfs"), "{e}");
        assert!(c.check_existing().is_err());
        assert!(!missing.exists());
        let made = c.connect(true).unwrap();
        assert_eq!(made.display, format!("file://{}", missing.display()));
        c.check_existing().unwrap();
        c.connect(false).unwrap();
        cfg("s3://kv/p").check_existing().unwrap();
    }

    proptest::proptest! {
        /// Every spelling of one store has one canonical URL, itself its
        /// own; the directory is the URL's path.
        #[test]
        fn spellings_of_a_store_share_one_canonical_url(
            segs in proptest::collection::vec("[a-z0-9_.-]{1,8}", 1..4),
            localhost: bool,
            slashes in 0usize..3,
        ) {
            proptest::prop_assume!(segs.iter().all(|s| s != "." && s != ".."));
            let dir = format!("/{}", segs.join("/"));
            let host = if localhost { "localhost" } else { "" };
            let url = format!("file://{host}{dir}{}", "/".repeat(slashes));
            let canonical = cfg(&url).canonical_url().unwrap();
            proptest::prop_assert_eq!(&canonical, &format!("file://{dir}"));
            proptest::prop_assert_eq!(&cfg(&canonical).canonical_url().unwrap(), &canonical);
            proptest::prop_assert_eq!(cfg(&url).dir().unwrap(), Some(dir.clone().into()));
            let s3 = format!("s3://b{dir}{}", "/".repeat(slashes));
            proptest::prop_assert_eq!(cfg(&s3).canonical_url().unwrap(), format!("s3://b{dir}"));
            proptest::prop_assert_eq!(cfg(&s3).dir().unwrap(), None);
        }
    }

    #[test]
    fn unknown_fields_are_refused() {
        let r: Result<RemoteConfig, _> = toml::from_str("url = \"s3://kv\"\ntimeout = 5\n");
        assert!(r.is_err());
        let c: RemoteConfig = toml::from_str("url = \"s3://kv\"\n").unwrap();
        assert_eq!(c.max_concurrency, 32);
    }
}
