//! # kvtier-server
//!
//! The network face of the metadata service ([`kvtier_meta::MetaService`]):
//! Tair KVCM's meta and admin APIs, each over HTTP/JSON and gRPC, on four
//! listeners (docs/meta-api.md is the wire contract, docs/server.md the
//! server's own behaviour).
//!
//! - [`MetaServer::start`] binds the listeners of a [`ServerConfig`] and
//!   returns a [`RunningServer`] (bound addresses, graceful
//!   [`RunningServer::shutdown`], stop on drop).
//! - [`api::Api`] is the one implementation of every method; the HTTP
//!   transport (axum) and the gRPC transport (tonic) only decode, admit
//!   ([`auth`]) and encode, from one method list, so they cannot drift.
//! - [`convert`] maps wire messages to the model and `MetaError` to wire
//!   codes; [`metrics::Metrics`] counts every call of both transports;
//!   [`openapi`] derives the HTTP documents from the proto descriptors.
//!
//! ```
//! use std::sync::Arc;
//! use kvtier_meta::{MemoryIndex, MetaConfig, MetaService};
//! use kvtier_server::{MetaServer, ServerConfig};
//!
//! let rt = tokio::runtime::Runtime::new().unwrap();
//! rt.block_on(async {
//!     let svc = Arc::new(MetaService::new(Arc::new(MemoryIndex::new()), MetaConfig::default()).unwrap());
//!     let server = MetaServer::start(svc, ServerConfig::localhost_ephemeral()).await.unwrap();
//!     assert_ne!(server.meta_http_addr().port(), 0);
//!     server.shutdown().await.unwrap();
//! });
//! ```

#[macro_use]
mod methods;

pub mod api;
pub mod auth;
pub mod config;
pub mod convert;
mod error;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod openapi;
mod server;

pub use config::{
    AuthMode, DEFAULT_ADMIN_GRPC_PORT, DEFAULT_ADMIN_HTTP_PORT, DEFAULT_META_GRPC_PORT,
    DEFAULT_META_HTTP_PORT, ExtraMetrics, FollowerRequests, ServerConfig,
};
pub use error::{Result, ServerError};
pub use methods::{ADMIN_RPCS, META_RPCS, lower_camel};
pub use server::{MetaServer, RunningServer};
