//! The gRPC transport: the generated tonic service traits, each method
//! authenticating from metadata and delegating to [`Api::run`].

use std::sync::Arc;

use kvtier_meta::proto::{admin as apb, meta as mpb};
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use crate::api::Api;
use crate::auth::{self, AuthError, Caller};
use crate::config::AuthMode;

/// `kv_cache_manager.proto.meta.MetaService` over [`Api`].
#[derive(Debug, Clone)]
pub struct MetaGrpc {
    api: Arc<Api>,
    auth: AuthMode,
}

/// `kv_cache_manager.proto.admin.AdminService` over [`Api`].
#[derive(Debug, Clone)]
pub struct AdminGrpc {
    api: Arc<Api>,
    auth: AuthMode,
}

fn caller(api: &Api, mode: AuthMode, md: &MetadataMap, admin_only: bool) -> Result<Caller, Status> {
    let get = |k: &str| md.get(k).and_then(|v| v.to_str().ok());
    let key = auth::key_from_headers(get("authorization"), get("x-api-key"));
    auth::authenticate(&api.svc, mode, key, admin_only).map_err(|e| match e {
        AuthError::Missing | AuthError::Invalid => Status::unauthenticated(e.to_string()),
        AuthError::NotAdmin(_) => Status::permission_denied(e.to_string()),
    })
}

impl MetaGrpc {
    /// The meta service over `api`.
    pub fn new(api: Arc<Api>, auth: AuthMode) -> Self {
        MetaGrpc { api, auth }
    }
}

impl AdminGrpc {
    /// The admin service over `api`.
    pub fn new(api: Arc<Api>, auth: AuthMode) -> Self {
        AdminGrpc { api, auth }
    }
}

macro_rules! grpc_meta_impl {
    ($($rpc:ident, $trait_fn:ident, $api_fn:ident, $req:ident, $resp:ident;)*) => {
        #[tonic::async_trait]
        impl mpb::meta_service_server::MetaService for MetaGrpc {
            $(
                async fn $trait_fn(
                    &self,
                    request: Request<mpb::$req>,
                ) -> Result<Response<mpb::$resp>, Status> {
                    let _in_flight = self.api.metrics.enter();
                    let who = caller(&self.api, self.auth, request.metadata(), false)?;
                    let api = &self.api;
                    let req = request.into_inner();
                    let resp = api
                        .run(stringify!($rpc), req, |req| async move { api.$api_fn(&who, req).await })
                        .await;
                    Ok(Response::new(resp))
                }
            )*
        }
    };
}

macro_rules! grpc_admin_impl {
    ($($rpc:ident, $trait_fn:ident, $api_fn:ident, $req:ident, $resp:ident;)*) => {
        #[tonic::async_trait]
        impl apb::admin_service_server::AdminService for AdminGrpc {
            $(
                async fn $trait_fn(
                    &self,
                    request: Request<apb::$req>,
                ) -> Result<Response<apb::$resp>, Status> {
                    let _in_flight = self.api.metrics.enter();
                    caller(&self.api, self.auth, request.metadata(), true)?;
                    let api = &self.api;
                    let req = request.into_inner();
                    let resp = api
                        .run(concat!("admin.", stringify!($rpc)), req, |req| async move { api.$api_fn(req).await })
                        .await;
                    Ok(Response::new(resp))
                }
            )*
        }
    };
}

for_meta_methods!(grpc_meta_impl);
for_admin_methods!(grpc_admin_impl);
