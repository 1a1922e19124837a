//! [`MetaServer::start`] binds the four listeners and serves them until
//! [`RunningServer::shutdown`] (graceful: in-flight requests finish) or
//! until the [`RunningServer`] is dropped.

use std::net::SocketAddr;
use std::sync::Arc;

use kvtier_meta::leader::{Elector, ElectorConfig, MemoryLease};
use kvtier_meta::proto::{admin as apb, meta as mpb};
use kvtier_meta::{MetaService, ReaperHandle};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{Api, NodeInfo};
use crate::config::{AuthMode, ServerConfig};
use crate::error::{Result, ServerError};
use crate::grpc::{AdminGrpc, MetaGrpc};
use crate::http::{HttpOptions, Services, router};
use crate::metrics::Metrics;
use crate::openapi;

/// Entry point of the network server.
#[derive(Debug)]
pub struct MetaServer;

/// A started server. Dropping it stops the listeners (requests in flight
/// still finish in the background); [`RunningServer::shutdown`] also waits
/// for them.
#[derive(Debug)]
pub struct RunningServer {
    meta_http: SocketAddr,
    meta_grpc: SocketAddr,
    admin_http: SocketAddr,
    admin_grpc: SocketAddr,
    stop: watch::Sender<bool>,
    tasks: Vec<(&'static str, JoinHandle<Result<(), String>>)>,
    api: Arc<Api>,
    /// Held so the reaper runs exactly as long as the server.
    _reaper: Option<ReaperHandle>,
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { what, addr, source })
}

fn local(what: &'static str, l: &TcpListener, asked: SocketAddr) -> Result<SocketAddr> {
    l.local_addr().map_err(|source| ServerError::Bind {
        what,
        addr: asked,
        source,
    })
}

/// Resolves when `stop` turns true (or its sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

impl MetaServer {
    /// Binds the meta and admin listeners of `cfg` (port 0 picks a free
    /// port; read the result from [`RunningServer`]) and serves `svc` on
    /// them. Must run inside a tokio runtime.
    pub async fn start(svc: Arc<MetaService>, cfg: ServerConfig) -> Result<RunningServer> {
        // The admin service may share the meta listener of its transport
        // (Tair KVCM does so when no admin port is set); any other repeat
        // of a fixed port is a mistake.
        let shared_http = cfg.admin_http == cfg.meta_http && cfg.meta_http.port() != 0;
        let shared_grpc = cfg.admin_grpc == cfg.meta_grpc && cfg.meta_grpc.port() != 0;
        let mut distinct = vec![cfg.meta_http, cfg.meta_grpc];
        if !shared_http {
            distinct.push(cfg.admin_http);
        }
        if !shared_grpc {
            distinct.push(cfg.admin_grpc);
        }
        for (i, a) in distinct.iter().enumerate() {
            if a.port() != 0 && distinct[i + 1..].contains(a) {
                return Err(ServerError::Config(format!(
                    "{a} is configured for two listeners of different services or transports; give each its own port"
                )));
            }
        }
        if cfg.max_body_bytes == 0 {
            return Err(ServerError::Config("max_body_bytes is 0".into()));
        }
        cfg.check_exposure()?;
        if cfg.auth == AuthMode::Disabled {
            for (what, addr) in cfg.remote_listeners() {
                tracing::warn!(
                    listener = what,
                    %addr,
                    "authentication is off on a listener other hosts can reach \
                     (allow_unauthenticated_remote): anyone who reaches it is an administrator"
                );
            }
        }
        let meta_http_l = bind("meta http", cfg.meta_http).await?;
        let meta_grpc_l = bind("meta grpc", cfg.meta_grpc).await?;
        let admin_http_l = match shared_http {
            true => None,
            false => Some(bind("admin http", cfg.admin_http).await?),
        };
        let admin_grpc_l = match shared_grpc {
            true => None,
            false => Some(bind("admin grpc", cfg.admin_grpc).await?),
        };
        let meta_http = local("meta http", &meta_http_l, cfg.meta_http)?;
        let meta_grpc = local("meta grpc", &meta_grpc_l, cfg.meta_grpc)?;
        let admin_http = match &admin_http_l {
            Some(l) => local("admin http", l, cfg.admin_http)?,
            None => meta_http,
        };
        let admin_grpc = match &admin_grpc_l {
            Some(l) => local("admin grpc", l, cfg.admin_grpc)?,
            None => meta_grpc,
        };

        let host = if cfg.advertise_host.is_empty() {
            meta_grpc.ip().to_string()
        } else {
            cfg.advertise_host.clone()
        };
        let elector = match cfg.elector.clone() {
            Some(e) => e,
            None => Arc::new(
                Elector::start_after_first_pass(
                    Arc::new(MemoryLease::new()),
                    ElectorConfig::new(cfg.node_id.clone()),
                )
                .await,
            ),
        };
        let api = Arc::new(Api {
            svc: svc.clone(),
            metrics: Arc::new(Metrics::with_extra(cfg.extra_metrics.clone())),
            node: NodeInfo {
                node_id: elector.node_id().to_owned(),
                host,
                meta_grpc_port: meta_grpc.port(),
                meta_http_port: meta_http.port(),
                admin_grpc_port: admin_grpc.port(),
                admin_http_port: admin_http.port(),
            },
            started: std::time::SystemTime::now(),
            elector,
            follower_requests: cfg.follower_requests,
        });
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = Vec::new();

        let mut http_listeners = vec![(
            "meta http",
            meta_http_l,
            if shared_http {
                Services::Both
            } else {
                Services::Meta
            },
        )];
        if let Some(l) = admin_http_l {
            http_listeners.push(("admin http", l, Services::Admin));
        }
        for (what, listener, services) in http_listeners {
            let doc = match services {
                Services::Meta => openapi::meta_document(),
                Services::Admin => openapi::admin_document(),
                Services::Both => openapi::combined_document(),
            };
            let app = router(
                api.clone(),
                HttpOptions {
                    services,
                    auth: cfg.auth,
                    max_body: cfg.max_body_bytes,
                    timeout: cfg.request_timeout,
                    openapi: Arc::new(openapi::render(&doc)),
                },
            );
            let signal = stopped(stop_rx.clone());
            tasks.push((
                what,
                tokio::spawn(async move {
                    axum::serve(listener, app)
                        .with_graceful_shutdown(signal)
                        .await
                        .map_err(|e| e.to_string())
                }),
            ));
        }

        let meta =
            mpb::meta_service_server::MetaServiceServer::new(MetaGrpc::new(api.clone(), cfg.auth))
                .max_decoding_message_size(cfg.max_body_bytes);
        let admin = apb::admin_service_server::AdminServiceServer::new(AdminGrpc::new(
            api.clone(),
            cfg.auth,
        ))
        .max_decoding_message_size(cfg.max_body_bytes);
        let timeout = cfg.request_timeout;
        let mut grpc_listeners = Vec::new();
        match admin_grpc_l {
            Some(l) => {
                let mut meta_only = grpc_builder(timeout);
                grpc_listeners.push(("meta grpc", meta_only.add_service(meta), meta_grpc_l));
                let mut admin_only = grpc_builder(timeout);
                grpc_listeners.push(("admin grpc", admin_only.add_service(admin), l));
            }
            None => {
                let mut both = grpc_builder(timeout);
                let routes = both.add_service(meta).add_service(admin);
                grpc_listeners.push(("meta grpc", routes, meta_grpc_l));
            }
        }
        for (what, routes, listener) in grpc_listeners {
            let signal = stopped(stop_rx.clone());
            tasks.push((
                what,
                tokio::spawn(async move {
                    routes
                        .serve_with_incoming_shutdown(
                            tonic::transport::server::TcpIncoming::from(listener)
                                .with_nodelay(Some(true)),
                            signal,
                        )
                        .await
                        .map_err(|e| e.to_string())
                }),
            ));
        }
        tracing::info!(%meta_http, %meta_grpc, %admin_http, %admin_grpc, auth = ?cfg.auth, "metadata server listening");
        Ok(RunningServer {
            meta_http,
            meta_grpc,
            admin_http,
            admin_grpc,
            stop,
            tasks,
            api,
            // A shared ledger's sessions are reaped by the leader
            // (`MetaService::spawn_leader_work`), not by every frontend.
            _reaper: (cfg.run_reaper && !svc.shares_ledger()).then(|| svc.spawn_reaper(None)),
        })
    }
}

impl RunningServer {
    /// Bound address of the meta HTTP listener.
    pub fn meta_http_addr(&self) -> SocketAddr {
        self.meta_http
    }

    /// Bound address of the meta gRPC listener.
    pub fn meta_grpc_addr(&self) -> SocketAddr {
        self.meta_grpc
    }

    /// Bound address of the admin HTTP listener.
    pub fn admin_http_addr(&self) -> SocketAddr {
        self.admin_http
    }

    /// Bound address of the admin gRPC listener.
    pub fn admin_grpc_addr(&self) -> SocketAddr {
        self.admin_grpc
    }

    /// The Prometheus text `GET /metrics` serves, for embedding callers.
    pub fn metrics_text(&self) -> String {
        self.api.metrics.render(&self.api.svc, &self.api.elector)
    }

    /// Stops accepting, lets requests in flight finish, and returns the
    /// first listener failure, if any.
    pub async fn shutdown(mut self) -> Result<()> {
        let _ = self.stop.send(true);
        let mut first = None;
        for (what, task) in self.tasks.drain(..) {
            let outcome = match task.await {
                Ok(r) => r,
                Err(e) => Err(e.to_string()),
            };
            if let Err(reason) = outcome {
                first.get_or_insert(ServerError::Serve { what, reason });
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Resolves when a listener stops on its own (an error); a server that
    /// runs until shut down never resolves. For `kvtier serve`, which
    /// selects on this and a signal.
    pub async fn stopped(&mut self) -> Result<()> {
        if self.tasks.is_empty() {
            return Ok(());
        }
        let (out, idx) = first_finished(&mut self.tasks).await;
        let what = self.tasks[idx].0;
        self.tasks.remove(idx);
        match out {
            Ok(Ok(())) => Ok(()),
            Ok(Err(reason)) => Err(ServerError::Serve { what, reason }),
            Err(e) => Err(ServerError::Serve {
                what,
                reason: e.to_string(),
            }),
        }
    }
}

/// The outcome and index of the first listener task to finish.
async fn first_finished<T>(
    tasks: &mut [(&'static str, JoinHandle<T>)],
) -> (std::result::Result<T, tokio::task::JoinError>, usize) {
    std::future::poll_fn(|cx| {
        for (i, (_, h)) in tasks.iter_mut().enumerate() {
            if let std::task::Poll::Ready(r) = std::pin::Pin::new(h).poll(cx) {
                return std::task::Poll::Ready((r, i));
            }
        }
        std::task::Poll::Pending
    })
    .await
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// A gRPC server builder with windows sized for KV-cache answers: a
/// 1,024-block location list is a few hundred KiB, which the default 64 KiB
/// HTTP/2 windows would split into many flow-control round trips.
fn grpc_builder(timeout: std::time::Duration) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .timeout(timeout)
        .initial_stream_window_size(Some(4 << 20))
        .initial_connection_window_size(Some(16 << 20))
}
