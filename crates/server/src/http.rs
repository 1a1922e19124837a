//! The HTTP/JSON transport (axum): `POST /api/<lowerCamelMethod>` (the
//! UpperCamel spelling is an alias), `GET /health`, `GET /openapi.json`,
//! and where the admin service is served `GET /metrics`. One listener may
//! serve both services (Tair KVCM's behaviour when the admin port equals
//! the meta port): then the meta spelling of a method both define wins.
//!
//! Admission order, each refusal leaving the service untouched: unknown
//! path (404), credentials (401 / 403), content type (415), body size
//! (413), JSON (400 `{}`); then the shared handler, under the request
//! timeout (504).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kvtier_meta::proto::{admin as apb, meta as mpb};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::{Api, WireReply, WireRequest, refused};
use crate::auth::{self, AuthError, Caller};
use crate::config::AuthMode;
use crate::convert::Fail;
use crate::methods::lower_camel;

type BoxFuture = Pin<Box<dyn Future<Output = Response> + Send>>;

/// One method: decodes the body, runs the shared handler, encodes.
type Handler = Arc<dyn Fn(Arc<Api>, Caller, Bytes) -> BoxFuture + Send + Sync>;

/// A method and whether it needs the admin role.
#[derive(Clone)]
struct Route {
    handler: Handler,
    admin_only: bool,
}

/// Everything a listener's routes need.
struct HttpState {
    api: Arc<Api>,
    routes: HashMap<String, Route>,
    auth: AuthMode,
    max_body: usize,
    timeout: Duration,
    openapi: Arc<String>,
}

fn json(status: StatusCode, body: Vec<u8>) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// An error answer with a response header carrying the reason, so clients
/// that read `header.status` see why.
fn refusal(status: StatusCode, code: mpb::ErrorCode, message: String) -> Response {
    let r: mpb::CommonResponse = refused(code, message, "");
    json(
        status,
        serde_json::to_vec(&r).unwrap_or_else(|_| b"{}".to_vec()),
    )
}

fn handler<Req, Resp, F, Fut>(method: &'static str, f: F) -> Handler
where
    Req: WireRequest + DeserializeOwned,
    Resp: WireReply + Serialize,
    F: Fn(Arc<Api>, Caller, Req) -> Fut + Send + Sync + Copy + 'static,
    Fut: Future<Output = Result<Resp, Fail>> + Send + 'static,
{
    Arc::new(
        move |api: Arc<Api>, who: Caller, body: Bytes| -> BoxFuture {
            Box::pin(async move {
                // The contract: a body that is not valid JSON for the request
                // type is answered 400 with `{}` (docs/meta-api.md §1.1).
                let Ok(req) = serde_json::from_slice::<Req>(&body) else {
                    return json(StatusCode::BAD_REQUEST, b"{}".to_vec());
                };
                let resp: Resp = api.run(method, req, |req| f(api.clone(), who, req)).await;
                match serde_json::to_vec(&resp) {
                    Ok(b) => json(StatusCode::OK, b),
                    Err(_) => json(StatusCode::INTERNAL_SERVER_ERROR, b"{}".to_vec()),
                }
            })
        },
    )
}

macro_rules! http_meta_routes {
    ($($rpc:ident, $trait_fn:ident, $api_fn:ident, $req:ident, $resp:ident;)*) => {
        fn meta_routes() -> Vec<(&'static str, Handler)> {
            vec![$(
                (
                    stringify!($rpc),
                    handler::<mpb::$req, mpb::$resp, _, _>(stringify!($rpc), |api, who, req| async move {
                        api.$api_fn(&who, req).await
                    }),
                ),
            )*]
        }
    };
}

macro_rules! http_admin_routes {
    ($($rpc:ident, $trait_fn:ident, $api_fn:ident, $req:ident, $resp:ident;)*) => {
        fn admin_routes() -> Vec<(&'static str, Handler)> {
            vec![$(
                (
                    stringify!($rpc),
                    handler::<apb::$req, apb::$resp, _, _>(
                        concat!("admin.", stringify!($rpc)),
                        |api, _who, req| async move { api.$api_fn(req).await },
                    ),
                ),
            )*]
        }
    };
}

for_meta_methods!(http_meta_routes);
for_admin_methods!(http_admin_routes);

/// Adds both spellings of every method of one service, keeping methods
/// already present.
fn add_routes(
    map: &mut HashMap<String, Route>,
    routes: Vec<(&'static str, Handler)>,
    admin_only: bool,
) {
    for (rpc, handler) in routes {
        for name in [lower_camel(rpc), rpc.to_owned()] {
            map.entry(name).or_insert_with(|| Route {
                handler: handler.clone(),
                admin_only,
            });
        }
    }
}

/// Which services one listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Services {
    /// The meta service.
    Meta,
    /// The admin service and `/metrics`.
    Admin,
    /// Both on one listener.
    Both,
}

/// Settings of one HTTP listener.
pub struct HttpOptions {
    /// What the listener serves.
    pub services: Services,
    /// Authentication mode.
    pub auth: AuthMode,
    /// Largest body accepted.
    pub max_body: usize,
    /// Per-request time limit.
    pub timeout: Duration,
    /// The OpenAPI document served at `/openapi.json`.
    pub openapi: Arc<String>,
}

/// The router of one listener.
pub fn router(api: Arc<Api>, opts: HttpOptions) -> Router {
    let mut routes = HashMap::new();
    if opts.services != Services::Admin {
        add_routes(&mut routes, meta_routes(), false);
    }
    if opts.services != Services::Meta {
        add_routes(&mut routes, admin_routes(), true);
    }
    let state = Arc::new(HttpState {
        api,
        routes,
        auth: opts.auth,
        max_body: opts.max_body,
        timeout: opts.timeout,
        openapi: opts.openapi,
    });
    let mut r = Router::new()
        .route("/api/{method}", post(dispatch))
        .route("/health", get(health))
        .route("/openapi.json", get(openapi));
    if opts.services != Services::Meta {
        r = r.route("/metrics", get(metrics));
    }
    r.fallback(not_found).with_state(state)
}

async fn not_found() -> Response {
    refusal(
        StatusCode::NOT_FOUND,
        mpb::ErrorCode::Unsupported,
        "no such path; methods are POST /api/<method>".into(),
    )
}

fn caller(st: &HttpState, headers: &HeaderMap, admin_only: bool) -> Result<Caller, Box<Response>> {
    let get = |k: header::HeaderName| headers.get(k).and_then(|v| v.to_str().ok());
    let key = auth::key_from_headers(
        get(header::AUTHORIZATION),
        get(header::HeaderName::from_static("x-api-key")),
    );
    auth::authenticate(&st.api.svc, st.auth, key, admin_only).map_err(|e| {
        let status = match e {
            AuthError::Missing | AuthError::Invalid => StatusCode::UNAUTHORIZED,
            AuthError::NotAdmin(_) => StatusCode::FORBIDDEN,
        };
        let mut r = refusal(status, mpb::ErrorCode::InvalidArgument, e.to_string());
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        Box::new(r)
    })
}

/// Content types taken as JSON. Tair KVCM's own examples post with curl's
/// default form type, so that is accepted too.
fn json_content_type(headers: &HeaderMap) -> bool {
    let Some(v) = headers.get(header::CONTENT_TYPE) else {
        return true;
    };
    let Ok(v) = v.to_str() else { return false };
    let mime = v
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    matches!(
        mime.as_str(),
        "" | "application/json" | "text/json" | "text/plain" | "application/x-www-form-urlencoded"
    ) || mime.ends_with("+json")
}

async fn dispatch(
    State(st): State<Arc<HttpState>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let _in_flight = st.api.metrics.enter();
    let Some(route) = st.routes.get(&method).cloned() else {
        return refusal(
            StatusCode::NOT_FOUND,
            mpb::ErrorCode::Unsupported,
            format!("unknown method {method:?}"),
        );
    };
    let who = match caller(&st, &headers, route.admin_only) {
        Ok(w) => w,
        Err(r) => return *r,
    };
    if !json_content_type(&headers) {
        return refusal(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            mpb::ErrorCode::InvalidArgument,
            "request bodies are JSON (Content-Type: application/json)".into(),
        );
    }
    let too_large = || {
        refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            mpb::ErrorCode::InvalidArgument,
            format!("request body larger than {} bytes", st.max_body),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > st.max_body as u64) {
        return too_large();
    }
    let bytes = match axum::body::to_bytes(body, st.max_body).await {
        Ok(b) => b,
        Err(e) => {
            // `to_bytes` reports the limit as an error whose source is
            // `LengthLimitError`; anything else is a broken connection.
            let over = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if over {
                return too_large();
            }
            return json(StatusCode::BAD_REQUEST, b"{}".to_vec());
        }
    };
    match tokio::time::timeout(st.timeout, (route.handler)(st.api.clone(), who, bytes)).await {
        Ok(r) => r,
        Err(_) => refusal(
            StatusCode::GATEWAY_TIMEOUT,
            mpb::ErrorCode::InternalError,
            format!("request took longer than {:?}", st.timeout),
        ),
    }
}

async fn health(State(st): State<Arc<HttpState>>) -> Response {
    let report = st.api.svc.check_health().await;
    let body = serde_json::json!({
        "healthy": report.healthy,
        "reason": report.reason,
        "index_error": report.index_error,
        "index_read_only": report.index_read_only,
        "storages": report.storages.iter().map(|s| serde_json::json!({
            "name": s.name,
            "enabled": s.enabled,
            "healthy": s.health == kvtier_meta::StorageHealth::Healthy,
            "health": s.health.as_str(),
        })).collect::<Vec<_>>(),
    });
    let status = if report.healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(status, body.to_string().into_bytes())
}

async fn openapi(State(st): State<Arc<HttpState>>) -> Response {
    json(StatusCode::OK, st.openapi.as_bytes().to_vec())
}

async fn metrics(State(st): State<Arc<HttpState>>, headers: HeaderMap) -> Response {
    if let Err(r) = caller(&st, &headers, true) {
        return *r;
    }
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        st.api.metrics.render(&st.api.svc, &st.api.elector),
    )
        .into_response()
}
