//! The transport-independent core: [`Api`] holds the service and the
//! server's shared state, and [`Api::run`] wraps every call of either
//! transport (metrics, response header), so HTTP and gRPC cannot drift.
//! The methods themselves live in [`meta`] and [`admin`].

pub mod admin;
pub mod meta;

use std::sync::Arc;
use std::time::Instant;

use kvtier_meta::MetaService;
use kvtier_meta::leader::Elector;
use kvtier_meta::proto::{admin as apb, meta as mpb};

use crate::auth::Caller;
use crate::config::FollowerRequests;
use crate::convert::Fail;
use crate::metrics::Metrics;

/// Where this node listens, for the cluster-info calls.
#[derive(Debug, Clone, Default)]
pub struct NodeInfo {
    /// Node id.
    pub node_id: String,
    /// Host advertised to clients.
    pub host: String,
    /// Meta gRPC port.
    pub meta_grpc_port: u16,
    /// Meta HTTP port.
    pub meta_http_port: u16,
    /// Admin gRPC port.
    pub admin_grpc_port: u16,
    /// Admin HTTP port.
    pub admin_http_port: u16,
}

/// Shared state of every handler.
#[derive(Debug)]
pub struct Api {
    /// The service.
    pub svc: Arc<MetaService>,
    /// Request and service figures.
    pub metrics: Arc<Metrics>,
    /// This node's endpoints.
    pub node: NodeInfo,
    /// When the server started (cluster-info timestamps).
    pub started: std::time::SystemTime,
    /// This frontend's leader election.
    pub elector: Arc<Elector>,
    /// What a follower does with [`leader_only`] calls.
    pub follower_requests: FollowerRequests,
}

/// The calls any frontend answers, leader or not (Tair KVCM's
/// `API_CALL_GUARD(name, false)` list, plus kvtier's meta `GetClusterInfo`).
const ANY_FRONTEND: &[&str] = &[
    "GetMetrics",
    "CheckHealth",
    "GetManagerClusterInfo",
    "LeaderDemote",
    "GetLeaderElectorConfig",
    "UpdateLeaderElectorConfig",
    "UpdateLogger",
    "GetClusterInfo",
];

/// The message of a call a follower refuses, as Tair KVCM words it.
pub const NOT_LEADER_MESSAGE: &str = "Server is not leader";

/// Whether Tair KVCM reserves `method` (an RPC name, admin ones prefixed
/// `admin.`) for the leader: every meta call and every admin call but the
/// cluster, health, metrics and logger ones.
pub fn leader_only(method: &str) -> bool {
    let rpc = method.strip_prefix("admin.").unwrap_or(method);
    !ANY_FRONTEND.contains(&rpc)
}

/// A request message: everything that carries a `trace_id`.
pub trait WireRequest: prost::Message + Default + Send + 'static {
    /// The caller's correlation id.
    fn trace_id(&self) -> &str;
}

/// A response message: everything with a `header.status`.
pub trait WireReply: prost::Message + Default + Send + 'static {
    /// Sets the header to `code` / `message`, echoing `request_id`.
    fn set_status(&mut self, code: mpb::ErrorCode, message: String, request_id: &str);
    /// The header's code (`UNSPECIFIED` when absent).
    fn code(&self) -> i32;
    /// The header's message (empty when absent): a handler may leave a
    /// note on a successful reply (`CheckHealth` says why it is unhealthy).
    fn message(&self) -> String;
}

macro_rules! wire_requests {
    ($($t:ty),* $(,)?) => {$(
        impl WireRequest for $t {
            fn trace_id(&self) -> &str { &self.trace_id }
        }
    )*};
}

macro_rules! meta_replies {
    ($($t:ty),* $(,)?) => {$(
        impl WireReply for $t {
            fn set_status(&mut self, code: mpb::ErrorCode, message: String, request_id: &str) {
                self.header = Some(mpb::CommonResponseHeader {
                    status: Some(mpb::Status { code: code as i32, message }),
                    request_id: request_id.to_owned(),
                    tracer_result: String::new(),
                });
            }
            fn code(&self) -> i32 {
                self.header.as_ref().and_then(|h| h.status.as_ref()).map_or(0, |s| s.code)
            }
            fn message(&self) -> String {
                self.header.as_ref().and_then(|h| h.status.as_ref()).map_or_else(String::new, |s| s.message.clone())
            }
        }
    )*};
}

macro_rules! admin_replies {
    ($($t:ty),* $(,)?) => {$(
        impl WireReply for $t {
            fn set_status(&mut self, code: mpb::ErrorCode, message: String, request_id: &str) {
                // The admin enum repeats the meta numbers it has; the
                // meta-only codes (10-14) are never produced by admin calls.
                self.header = Some(apb::CommonResponseHeader {
                    status: Some(apb::Status { code: code as i32, message }),
                    request_id: request_id.to_owned(),
                });
            }
            fn code(&self) -> i32 {
                self.header.as_ref().and_then(|h| h.status.as_ref()).map_or(0, |s| s.code)
            }
            fn message(&self) -> String {
                self.header.as_ref().and_then(|h| h.status.as_ref()).map_or_else(String::new, |s| s.message.clone())
            }
        }
    )*};
}

wire_requests!(
    mpb::RegisterInstanceRequest,
    mpb::GetInstanceInfoRequest,
    mpb::GetCacheMetaRequest,
    mpb::GetCacheLocationRequest,
    mpb::GetCacheLocationLenRequest,
    mpb::StartWriteCacheRequest,
    mpb::FinishWriteCacheRequest,
    mpb::RemoveCacheRequest,
    mpb::TrimCacheRequest,
    mpb::GetClusterInfoRequest,
    apb::AddStorageRequest,
    apb::EnableStorageRequest,
    apb::DisableStorageRequest,
    apb::RemoveStorageRequest,
    apb::UpdateStorageRequest,
    apb::ListStorageRequest,
    apb::CreateInstanceGroupRequest,
    apb::UpdateInstanceGroupRequest,
    apb::RemoveInstanceGroupRequest,
    apb::GetInstanceGroupRequest,
    apb::ListInstanceGroupRequest,
    apb::GetCacheMetaRequest,
    apb::RemoveCacheRequest,
    apb::RegisterInstanceRequest,
    apb::RemoveInstanceRequest,
    apb::GetInstanceInfoRequest,
    apb::ListInstanceInfoRequest,
    apb::AddAccountRequest,
    apb::DeleteAccountRequest,
    apb::ListAccountRequest,
    apb::SetAccountGroupsRequest,
    apb::GenConfigSnapshotRequest,
    apb::LoadConfigSnapshotRequest,
    apb::GetMetricsRequest,
    apb::CheckHealthRequest,
    apb::GetManagerClusterInfoRequest,
    apb::LeaderDemoteRequest,
    apb::GetLeaderElectorConfigRequest,
    apb::UpdateLeaderElectorConfigRequest,
    apb::UpdateLoggerRequest,
);

meta_replies!(
    mpb::CommonResponse,
    mpb::RegisterInstanceResponse,
    mpb::GetInstanceInfoResponse,
    mpb::GetCacheMetaResponse,
    mpb::GetCacheLocationResponse,
    mpb::GetCacheLocationLenResponse,
    mpb::StartWriteCacheResponse,
    mpb::GetClusterInfoResponse,
);

admin_replies!(
    apb::CommonResponse,
    apb::ListStorageResponse,
    apb::GetInstanceGroupResponse,
    apb::ListInstanceGroupResponse,
    apb::GetCacheMetaResponse,
    apb::GetInstanceInfoResponse,
    apb::ListInstanceInfoResponse,
    apb::ListAccountResponse,
    apb::ConfigSnapShotResponse,
    apb::GetMetricsResponse,
    apb::CheckHealthResponse,
    apb::GetManagerClusterInfoResponse,
    apb::GetLeaderElectorConfigResponse,
);

impl Api {
    /// Runs one call of `method`: times it, counts it by outcome, and writes
    /// the outcome into the response header (`OK` or the failure). Every
    /// method of both transports goes through here. (Each transport counts
    /// its requests in flight itself, from the moment it accepts one.)
    pub async fn run<Req, Resp, Fut>(
        &self,
        method: &'static str,
        req: Req,
        call: impl FnOnce(Req) -> Fut,
    ) -> Resp
    where
        Req: WireRequest,
        Resp: WireReply,
        Fut: Future<Output = Result<Resp, Fail>>,
    {
        let trace_id = req.trace_id().to_owned();
        let start = Instant::now();
        let resp = match self.refuse_on_follower(method) {
            Some(f) => Err(f),
            None => call(req).await,
        };
        let resp = match resp {
            Ok(mut r) => {
                let note = r.message();
                r.set_status(mpb::ErrorCode::Ok, note, &trace_id);
                r
            }
            Err(f) => {
                tracing::debug!(method, trace_id, code = ?f.code, message = %f.message, "request refused");
                let mut r = Resp::default();
                r.set_status(f.code, f.message, &trace_id);
                r
            }
        };
        self.metrics.observe(method, resp.code(), start.elapsed());
        resp
    }

    /// The refusal of a leader-only call on a follower that refuses them;
    /// `None` when the call may run here.
    fn refuse_on_follower(&self, method: &str) -> Option<Fail> {
        let refuse = self.follower_requests == FollowerRequests::Refuse
            && leader_only(method)
            && !self.elector.is_leader();
        refuse.then(Fail::not_leader)
    }

    /// Checks that `who` may act on instances of `group`; the refusal says
    /// why (an account with no groups is told how to get some).
    pub fn check_group(&self, who: &Caller, group: &str) -> Result<(), Fail> {
        if who.may_use_group(group) {
            return Ok(());
        }
        let why = if who.has_no_groups() {
            "it is allowed no instance group (an administrator grants groups with SetAccountGroups)"
        } else {
            "the group is not among its allowed groups"
        };
        Err(Fail::from(kvtier_meta::MetaError::PermissionDenied(
            format!(
                "account {:?} may not use instance group {group:?}: {why}",
                who.account()
            ),
        )))
    }
}

/// The name of a wire code, for metric labels.
pub fn code_name(code: i32) -> &'static str {
    mpb::ErrorCode::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// Builds a refused reply of type `Resp` without running anything (auth
/// failures, bodies that fail validation before dispatch).
pub fn refused<Resp: WireReply>(code: mpb::ErrorCode, message: String, trace_id: &str) -> Resp {
    let mut r = Resp::default();
    r.set_status(code, message, trace_id);
    r
}
