//! The transport half of `kvtier bench meta`: prefix matches over HTTP and
//! gRPC against a real server on loopback, each next to its transport floor
//! (the same request and response bytes through a handler that does no
//! work), measured in the same run.

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use kvtier_meta::proto::meta as pb;
use kvtier_meta::{BlockKey, MetaService};
use kvtier_server::{MetaServer, ServerConfig};

use super::measure::Latencies;
use super::meta::{INSTANCE, Measured, Start};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn request(keys: &[BlockKey]) -> pb::GetCacheLocationRequest {
    pb::GetCacheLocationRequest {
        trace_id: String::new(),
        instance_id: INSTANCE.into(),
        query_type: pb::QueryType::QtPrefixMatch as i32,
        block_keys: keys.iter().map(|k| k.to_wire()).collect(),
        ..Default::default()
    }
}

async fn post(client: &HttpClient, url: &str, body: Bytes) -> Result<Bytes> {
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(body))
        .context("building the request")?;
    let resp = client.request(req).await.context("HTTP request")?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .context("reading the response")?
        .to_bytes();
    if !status.is_success() {
        bail!("HTTP {status}: {}", String::from_utf8_lossy(&body));
    }
    Ok(body)
}

/// A server that answers every POST with `reply` after reading the body:
/// the HTTP floor.
async fn start_noop_http(reply: Bytes) -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let app = axum::Router::new().route(
        "/api/getCacheLocation",
        axum::routing::post(move |body: Bytes| {
            let reply = reply.clone();
            async move {
                std::hint::black_box(body.len());
                ([(http::header::CONTENT_TYPE, "application/json")], reply)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding the no-op HTTP server")?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!("no-op HTTP server: {e}");
        }
    });
    Ok((addr, task))
}

async fn start_server(svc: &Arc<MetaService>) -> Result<kvtier_server::RunningServer> {
    let mut cfg = ServerConfig::localhost_ephemeral();
    cfg.run_reaper = false;
    MetaServer::start(svc.clone(), cfg)
        .await
        .context("starting the meta server on loopback")
}

/// Prefix matches over HTTP/JSON, and the floor.
pub async fn match_http(
    svc: &Arc<MetaService>,
    seqs: &[Vec<BlockKey>],
    order: &[usize],
) -> Result<(Measured, Measured)> {
    let server = start_server(svc).await?;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let url = format!("http://{}/api/getCacheLocation", server.meta_http_addr());
    let bodies: Vec<Bytes> = seqs
        .iter()
        .map(|s| serde_json::to_vec(&request(s)).map(Bytes::from))
        .collect::<Result<_, _>>()?;
    // Warm up and check that the server matches everything.
    let mut reply = Bytes::new();
    for b in &bodies {
        reply = post(&client, &url, b.clone()).await?;
        let r: pb::GetCacheLocationResponse =
            serde_json::from_slice(&reply).context("decoding the response")?;
        let code = r.header.and_then(|h| h.status).map(|s| s.code);
        if code != Some(pb::ErrorCode::Ok as i32) {
            bail!("server answered {code:?}");
        }
    }
    svc.flush_access()?;
    let settle = || Ok(svc.flush_access().map(drop)?);
    let lat = timed(order, settle, |i| post(&client, &url, bodies[i].clone())).await?;
    server.shutdown().await.context("stopping the server")?;

    let (addr, task) = start_noop_http(reply).await?;
    let floor_url = format!("http://{addr}/api/getCacheLocation");
    for b in bodies.iter().take(4) {
        post(&client, &floor_url, b.clone()).await?;
    }
    let floor = timed(order, no_settle, |i| {
        post(&client, &floor_url, bodies[i].clone())
    })
    .await?;
    task.abort();
    Ok((lat, floor))
}

/// Prefix matches over gRPC, and the floor.
pub async fn match_grpc(
    svc: &Arc<MetaService>,
    seqs: &[Vec<BlockKey>],
    order: &[usize],
) -> Result<(Measured, Measured)> {
    use pb::meta_service_client::MetaServiceClient;
    let server = start_server(svc).await?;
    let endpoint = format!("http://{}", server.meta_grpc_addr());
    let mut client =
        MetaServiceClient::new(grpc_channel(endpoint).await?).max_decoding_message_size(256 << 20);
    let reqs: Vec<pb::GetCacheLocationRequest> = seqs.iter().map(|s| request(s)).collect();
    let mut reply = pb::GetCacheLocationResponse::default();
    for r in &reqs {
        reply = client
            .get_cache_location(r.clone())
            .await
            .context("GetCacheLocation")?
            .into_inner();
    }
    svc.flush_access()?;
    let settle = || Ok(svc.flush_access().map(drop)?);
    let lat = timed(order, settle, |i| {
        let mut c = client.clone();
        let r = reqs[i].clone();
        async move { Ok(c.get_cache_location(r).await?.into_inner()) }
    })
    .await?;
    server.shutdown().await.context("stopping the server")?;

    let (addr, task) = noop_grpc::start(reply).await?;
    let mut floor_client = MetaServiceClient::new(grpc_channel(format!("http://{addr}")).await?)
        .max_decoding_message_size(256 << 20);
    floor_client.get_cache_location(reqs[0].clone()).await?;
    let floor = timed(order, no_settle, |i| {
        let mut c = floor_client.clone();
        let r = reqs[i].clone();
        async move { Ok(c.get_cache_location(r).await?.into_inner()) }
    })
    .await?;
    task.abort();
    Ok((lat, floor))
}

/// A client channel with the same HTTP/2 windows as the server's.
async fn grpc_channel(endpoint: String) -> Result<tonic::transport::Channel> {
    tonic::transport::Endpoint::from_shared(endpoint)
        .context("gRPC endpoint")?
        .tcp_nodelay(true)
        .initial_stream_window_size(Some(4 << 20))
        .initial_connection_window_size(Some(16 << 20))
        .connect()
        .await
        .context("connecting over gRPC")
}

/// A loop that leaves no work behind.
fn no_settle() -> Result<()> {
    Ok(())
}

/// Calls `f` for each of `order`, timing each call; `settle` runs after
/// the loop, its CPU counted (see [`Start::measured_settled`]).
async fn timed<T, F, Fut>(
    order: &[usize],
    settle: impl FnOnce() -> Result<()>,
    mut f: F,
) -> Result<Measured>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut lat = Latencies::default();
    let t0 = Start::now();
    for &i in order {
        let t = Instant::now();
        std::hint::black_box(f(i).await?);
        lat.push(t.elapsed());
    }
    t0.measured_settled(lat, settle)
}

/// A gRPC `MetaService` whose `GetCacheLocation` returns a canned reply and
/// whose other methods are unimplemented: the gRPC floor.
mod noop_grpc {
    use super::pb;
    use anyhow::{Context, Result};
    use pb::meta_service_server::{MetaService as Rpc, MetaServiceServer};
    use std::net::SocketAddr;
    use tonic::{Request, Response, Status};

    pub struct Canned(pub pb::GetCacheLocationResponse);

    fn no<T>() -> Result<Response<T>, Status> {
        Err(Status::unimplemented("no-op server"))
    }

    #[tonic::async_trait]
    impl Rpc for Canned {
        async fn register_instance(
            &self,
            _: Request<pb::RegisterInstanceRequest>,
        ) -> Result<Response<pb::RegisterInstanceResponse>, Status> {
            no()
        }
        async fn get_instance_info(
            &self,
            _: Request<pb::GetInstanceInfoRequest>,
        ) -> Result<Response<pb::GetInstanceInfoResponse>, Status> {
            no()
        }
        async fn get_cache_meta(
            &self,
            _: Request<pb::GetCacheMetaRequest>,
        ) -> Result<Response<pb::GetCacheMetaResponse>, Status> {
            no()
        }
        async fn get_cache_location(
            &self,
            req: Request<pb::GetCacheLocationRequest>,
        ) -> Result<Response<pb::GetCacheLocationResponse>, Status> {
            std::hint::black_box(req.get_ref().block_keys.len());
            Ok(Response::new(self.0.clone()))
        }
        async fn get_cache_location_len(
            &self,
            _: Request<pb::GetCacheLocationLenRequest>,
        ) -> Result<Response<pb::GetCacheLocationLenResponse>, Status> {
            no()
        }
        async fn start_write_cache(
            &self,
            _: Request<pb::StartWriteCacheRequest>,
        ) -> Result<Response<pb::StartWriteCacheResponse>, Status> {
            no()
        }
        async fn finish_write_cache(
            &self,
            _: Request<pb::FinishWriteCacheRequest>,
        ) -> Result<Response<pb::CommonResponse>, Status> {
            no()
        }
        async fn remove_cache(
            &self,
            _: Request<pb::RemoveCacheRequest>,
        ) -> Result<Response<pb::CommonResponse>, Status> {
            no()
        }
        async fn trim_cache(
            &self,
            _: Request<pb::TrimCacheRequest>,
        ) -> Result<Response<pb::CommonResponse>, Status> {
            no()
        }
        async fn get_cluster_info(
            &self,
            _: Request<pb::GetClusterInfoRequest>,
        ) -> Result<Response<pb::GetClusterInfoResponse>, Status> {
            no()
        }
    }

    pub async fn start(
        reply: pb::GetCacheLocationResponse,
    ) -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the no-op gRPC server")?;
        let addr = listener.local_addr()?;
        // Without TCP_NODELAY small answers wait out delayed ACKs (~40 ms).
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let svc = MetaServiceServer::new(Canned(reply)).max_decoding_message_size(256 << 20);
        let task = tokio::spawn(async move {
            if let Err(e) = tonic::transport::Server::builder()
                .initial_stream_window_size(Some(4 << 20))
                .initial_connection_window_size(Some(16 << 20))
                .add_service(svc)
                .serve_with_incoming(incoming)
                .await
            {
                tracing::warn!("no-op gRPC server: {e}");
            }
        });
        Ok((addr, task))
    }
}
