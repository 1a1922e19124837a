//! [`ObjectBackend`]: block parts as objects, one per part, in an
//! S3-compatible store (`s3://<bucket>/<prefix>/<rel>`,
//! [`StorageKind::S3`](kvtier_meta::StorageKind::S3)) or as files in a
//! shared directory (`file:///<dir>/<rel>`,
//! [`StorageKind::FileObjects`](kvtier_meta::StorageKind::FileObjects),
//! through kvtier-remote's [`PrivateDir`]: files `0600` in directories
//! `0700`). `<rel>` is `<instance>/<key hex>-<location hex>/<spec>`, the
//! instance id and spec name escaped (`kvtier_meta::path_safe`); the
//! object key is the URI's path below the store's root as written, `%XX`
//! included.
//!
//! An object store allocates on write, so `create` only names objects;
//! `delete` removes them (in bulk requests on S3; a directory's emptied
//! subdirectories go with its last file), `exist` HEADs them, `usage`
//! lists the prefix (at most [`S3Options::usage_list_limit`] objects) and
//! `health` puts, reads back and deletes a probe object. Every call is
//! bounded by [`S3Options::timeout`] (client timeouts, and an outer
//! deadline around the whole call) and reported as
//! [`BackendError::Unavailable`] when it runs out: a dead endpoint, or a
//! hung NFS mount, never hangs the metadata service.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kvtier_meta::path_safe::part_path;
use kvtier_meta::{BackendError, BackendFuture, BackendUsage, CreateRequest, StorageBackend};
use kvtier_remote::PrivateDir;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStore, PutPayload, RetryConfig};

use crate::uri::{Uri, bad};

/// Connection settings of an [`ObjectBackend`] on S3; its `timeout` and
/// `usage_list_limit` bound a shared directory's calls too.
#[derive(Debug, Clone)]
pub struct S3Options {
    /// Endpoint URL (`http://127.0.0.1:9000`); `None` for AWS itself.
    pub endpoint: Option<String>,
    /// Region. Default `us-east-1`.
    pub region: String,
    /// Access key id; `None` for unsigned requests.
    pub access_key_id: Option<String>,
    /// Secret access key.
    pub secret_access_key: Option<String>,
    /// Session token, if the credentials are temporary.
    pub session_token: Option<String>,
    /// Allow plain `http://` endpoints (loopback test servers). Default false.
    pub allow_http: bool,
    /// Limit of every backend call, retries included. Default 5 s.
    pub timeout: Duration,
    /// Most objects `usage` lists before it stops counting. Default 100,000.
    pub usage_list_limit: usize,
}

impl Default for S3Options {
    fn default() -> Self {
        S3Options {
            endpoint: None,
            region: "us-east-1".into(),
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
            allow_http: false,
            timeout: Duration::from_secs(5),
            usage_list_limit: 100_000,
        }
    }
}

impl S3Options {
    /// The defaults with the endpoint, region and credentials of the
    /// environment, as the node's G4 takes them (`AWS_ENDPOINT_URL`,
    /// `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_SESSION_TOKEN`); a plain `http://` endpoint is allowed.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let endpoint = var("AWS_ENDPOINT_URL");
        S3Options {
            allow_http: endpoint
                .as_deref()
                .is_some_and(|e| e.starts_with("http://")),
            endpoint,
            region: var("AWS_REGION").unwrap_or_else(|| "us-east-1".into()),
            access_key_id: var("AWS_ACCESS_KEY_ID"),
            secret_access_key: var("AWS_SECRET_ACCESS_KEY"),
            session_token: var("AWS_SESSION_TOKEN"),
            ..S3Options::default()
        }
    }
}

/// A storage of one object per block part: in one bucket under one key
/// prefix, or in one directory.
#[derive(Debug)]
pub struct ObjectBackend {
    /// What the store is, for messages: `s3` or `directory`.
    what: &'static str,
    /// The URI of the store's root, without a trailing `/`
    /// (`s3://bucket`, `file:///dir`): a part's URI is this, `/`, and its
    /// object key.
    root: String,
    /// Key prefix without leading or trailing `/`; may be empty.
    prefix: String,
    store: Arc<dyn ObjectStore>,
    timeout: Duration,
    usage_list_limit: usize,
}

impl ObjectBackend {
    /// Connects (lazily: no request is made here) to the bucket and prefix
    /// of a storage URI `s3://bucket/prefix`.
    pub fn s3(uri: &str, opts: &S3Options) -> Result<Self, BackendError> {
        let u = Uri::parse(uri)?;
        if u.scheme != "s3" {
            return Err(bad(uri, "S3 URIs start with s3://"));
        }
        if u.authority.is_empty() {
            return Err(bad(uri, "no bucket"));
        }
        if !u.query.is_empty() {
            return Err(bad(uri, "unexpected query"));
        }
        let prefix = u.path.trim_matches('/').to_owned();
        if prefix.split('/').any(|s| s == "." || s == "..") || prefix.contains("//") {
            return Err(bad(uri, "prefix has empty or relative segments"));
        }
        let client = ClientOptions::new()
            .with_allow_http(opts.allow_http)
            .with_timeout(opts.timeout)
            .with_connect_timeout(opts.timeout);
        let retry = RetryConfig {
            max_retries: 2,
            retry_timeout: opts.timeout,
            ..RetryConfig::default()
        };
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(u.authority)
            .with_region(&opts.region)
            .with_allow_http(opts.allow_http)
            .with_client_options(client)
            .with_retry(retry);
        if let Some(e) = &opts.endpoint {
            b = b.with_endpoint(e);
        }
        match (&opts.access_key_id, &opts.secret_access_key) {
            (Some(id), Some(secret)) => {
                b = b.with_access_key_id(id).with_secret_access_key(secret);
                if let Some(t) = &opts.session_token {
                    b = b.with_token(t);
                }
            }
            _ => b = b.with_skip_signature(true),
        }
        let store = b.build().map_err(|e| bad(uri, e.to_string()))?;
        Ok(ObjectBackend {
            what: "s3",
            root: format!("s3://{}", u.authority),
            prefix,
            store: Arc::new(store),
            timeout: opts.timeout,
            usage_list_limit: opts.usage_list_limit,
        })
    }

    /// The files of a shared directory `file:///dir` (it must exist; its
    /// calls are bounded by `opts.timeout`, `usage` by
    /// `opts.usage_list_limit`).
    pub fn dir(uri: &str, opts: &S3Options) -> Result<Self, BackendError> {
        let (store, root) = PrivateDir::open(uri).map_err(|e| bad(uri, e.to_string()))?;
        Ok(ObjectBackend {
            what: "directory",
            root,
            prefix: String::new(),
            store: Arc::new(store),
            timeout: opts.timeout,
            usage_list_limit: opts.usage_list_limit,
        })
    }

    /// The URI of the store's root (`s3://bucket`, `file:///dir`).
    pub fn root(&self) -> &str {
        &self.root
    }

    /// `e` as this store's [`BackendError::Unavailable`].
    fn unavailable(&self, e: impl std::fmt::Display) -> BackendError {
        BackendError::Unavailable(format!("{}: {e}", self.what))
    }

    async fn bounded<T>(
        &self,
        what: &str,
        f: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        tokio::time::timeout(self.timeout, f)
            .await
            .unwrap_or_else(|_| {
                Err(BackendError::Unavailable(format!(
                    "{} {what}: no answer within {:?}",
                    self.what, self.timeout
                )))
            })
    }

    fn key(&self, rest: &str) -> String {
        if self.prefix.is_empty() {
            rest.to_owned()
        } else {
            format!("{}/{rest}", self.prefix)
        }
    }

    /// The object URI of a part: `<root>/<prefix>/<rel>`, `rel` from
    /// [`part_path`] (instance and spec escaped, so the key has exactly
    /// three components below the prefix, none `.` or `..`).
    fn uri(&self, r: &CreateRequest) -> Result<String, BackendError> {
        let rel = part_path(&r.instance, r.key, r.location, &r.spec)
            .map_err(|e| bad(&format!("{}/{}", self.root, self.key("")), e.to_string()))?;
        Ok(format!("{}/{}", self.root, self.key(&rel)))
    }

    /// The object path of a part URI of this storage.
    fn path(&self, uri: &str) -> Result<Path, BackendError> {
        let key = (uri.strip_prefix(self.root.as_str()))
            .and_then(|rest| rest.strip_prefix('/'))
            .filter(|key| !key.contains(['?', '#']))
            .ok_or_else(|| bad(uri, format!("not an object URI in {}", self.root)))?;
        let under_prefix = self.prefix.is_empty()
            || key
                .strip_prefix(self.prefix.as_str())
                .is_some_and(|r| r.starts_with('/'));
        if !under_prefix {
            return Err(bad(uri, format!("not under prefix {:?}", self.prefix)));
        }
        Path::parse(key).map_err(|e| bad(uri, e.to_string()))
    }

    async fn delete_paths(&self, paths: Vec<Path>) -> Result<HashMap<Path, bool>, BackendError> {
        let wanted = paths.clone();
        let input = futures::stream::iter(paths.into_iter().map(Ok)).boxed();
        let mut done: HashMap<Path, bool> = wanted.into_iter().map(|p| (p, false)).collect();
        let mut out = self.store.delete_stream(input);
        while let Some(r) = out.next().await {
            match r {
                Ok(p) => {
                    done.insert(p, true);
                }
                // Gone already: deletes are idempotent.
                Err(object_store::Error::NotFound { path, .. }) => {
                    if let Ok(p) = Path::parse(&path) {
                        done.insert(p, true);
                    }
                }
                Err(e) => {
                    tracing::warn!(store = self.what, error = %e, "a bulk delete item failed")
                }
            }
        }
        Ok(done)
    }
}

impl StorageBackend for ObjectBackend {
    fn create<'a>(
        &'a self,
        requests: &'a [CreateRequest],
    ) -> BackendFuture<'a, Result<Vec<String>, BackendError>> {
        Box::pin(async move { requests.iter().map(|r| self.uri(r)).collect() })
    }

    fn delete<'a>(
        &'a self,
        uris: &'a [String],
    ) -> BackendFuture<'a, Vec<Result<(), BackendError>>> {
        Box::pin(async move {
            let paths: Vec<Result<Path, BackendError>> =
                uris.iter().map(|u| self.path(u)).collect();
            let valid: Vec<Path> = paths
                .iter()
                .filter_map(|p| p.as_ref().ok().cloned())
                .collect();
            let done = if valid.is_empty() {
                Ok(HashMap::new())
            } else {
                self.bounded("delete", self.delete_paths(valid)).await
            };
            paths
                .into_iter()
                .map(|p| {
                    let p = p?;
                    match &done {
                        Ok(d) if d.get(&p) == Some(&true) => Ok(()),
                        Ok(_) => Err(self.unavailable(format!("delete of {p} not confirmed"))),
                        Err(e) => Err(BackendError::Unavailable(e.to_string())),
                    }
                })
                .collect()
        })
    }

    fn exist<'a>(
        &'a self,
        uris: &'a [String],
    ) -> BackendFuture<'a, Result<Vec<bool>, BackendError>> {
        Box::pin(async move {
            let paths = uris
                .iter()
                .map(|u| self.path(u))
                .collect::<Result<Vec<_>, _>>()?;
            self.bounded("head", async {
                futures::stream::iter(paths)
                    .map(|p| async move {
                        match self.store.head(&p).await {
                            Ok(_) => Ok(true),
                            Err(object_store::Error::NotFound { .. }) => Ok(false),
                            Err(e) => Err(self.unavailable(e)),
                        }
                    })
                    .buffered(16)
                    .try_collect()
                    .await
            })
            .await
        })
    }

    fn usage(&self) -> BackendFuture<'_, Result<BackendUsage, BackendError>> {
        Box::pin(async move {
            let prefix = (!self.prefix.is_empty()).then(|| Path::from(self.prefix.as_str()));
            self.bounded("list", async {
                let mut list = self.store.list(prefix.as_ref()).take(self.usage_list_limit);
                let mut usage = BackendUsage::default();
                while let Some(meta) = list.next().await {
                    let meta = meta.map_err(|e| self.unavailable(e))?;
                    usage.objects += 1;
                    usage.used_bytes += meta.size;
                }
                Ok(usage)
            })
            .await
        })
    }

    fn health(&self) -> BackendFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            let path =
                Path::from(self.key(&format!(".kvtier-probe-{:016x}", rand::random::<u64>())));
            let data: Vec<u8> = (0..64).map(|_| rand::random::<u8>()).collect();
            self.bounded("probe", async {
                self.store
                    .put(&path, PutPayload::from(data.clone()))
                    .await
                    .map_err(|e| self.unavailable(e))?;
                let back = self
                    .store
                    .get(&path)
                    .await
                    .map_err(|e| self.unavailable(e))?
                    .bytes()
                    .await
                    .map_err(|e| self.unavailable(e))?;
                self.store
                    .delete(&path)
                    .await
                    .map_err(|e| self.unavailable(e))?;
                if back.as_ref() != data.as_slice() {
                    return Err(self.unavailable("probe object read back different bytes"));
                }
                Ok(())
            })
            .await
        })
    }
}
