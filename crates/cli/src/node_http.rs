//! The node's own HTTP endpoint (`[manager] metrics_addr`): `GET /metrics`
//! (the node's OpenMetrics families) and `GET /health`, for a node that
//! runs without the metadata service's admin port.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::http::header;
use axum::routing::get;
use kvtier_node::NodeHost;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running endpoint; [`stop`](Self::stop) ends it.
pub(crate) struct NodeHttp {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl NodeHttp {
    /// Listens on `addr` (port 0: one the OS picks) and serves `host`'s
    /// node: before its shape is known, `/metrics` has only
    /// `kvtier_node_shape_known 0` and `/health` says "no shape yet".
    pub(crate) async fn start(host: Arc<NodeHost>, addr: &str) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding manager.metrics_addr {addr}"))?;
        let addr = listener.local_addr().context("reading the bound address")?;
        let health = host.clone();
        let app = axum::Router::new()
            .route(
                "/metrics",
                get(move || {
                    let text = format!("{}# EOF\n", host.metrics_text());
                    async move {
                        (
                            [(
                                header::CONTENT_TYPE,
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )],
                            text,
                        )
                    }
                }),
            )
            .route(
                "/health",
                get(move || {
                    let known = health.node().is_some();
                    async move {
                        if known {
                            "ok\n"
                        } else {
                            "ok: no shape yet (no engine has connected)\n"
                        }
                    }
                }),
            );
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = stopped.await;
            });
            if let Err(e) = serve.await {
                tracing::warn!(error = %e, "the node's metrics endpoint stopped");
            }
        });
        Ok(Self { addr, stop, task })
    }

    /// The address it listens on.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops listening and waits for open requests to end.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        // A panicked server task has nothing left to clean up.
        let _ = self.task.await;
    }
}
