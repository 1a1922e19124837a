//! The admin service methods (docs/meta-api.md §5), one function each,
//! shared by both transports. Callers reaching these are administrators
//! (the admin listeners refuse everyone else before dispatch).

use kvtier_meta::ConfigSnapshot;
use kvtier_meta::proto::{admin as pb, meta as mpb};

use super::Api;
use crate::auth::Caller;
use crate::convert::admin as conv;
use crate::convert::{self, Fail, recode};

fn unix_ms(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Api {
    /// JSON text of the storages an instance of `group` may use, as
    /// `RegisterInstanceResponse.storage_configs` carries it.
    pub fn storage_configs(&self, group: &str) -> String {
        let names = self
            .svc
            .get_group(group)
            .map(|(g, _)| g.storages)
            .unwrap_or_default();
        let configs: Vec<mpb::StorageConfig> = self
            .svc
            .list_storages()
            .iter()
            .filter(|s| names.contains(&s.name))
            .map(|s| recode(&conv::storage_to_wire(s)))
            .collect();
        serde_json::to_string(&configs).unwrap_or_else(|_| "[]".into())
    }

    /// `AddStorage`.
    pub async fn add_storage(
        &self,
        req: pb::AddStorageRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        let s = req
            .storage
            .as_ref()
            .ok_or_else(|| Fail::invalid("no storage"))?;
        self.svc.add_storage(conv::storage_from_wire(s)?)?;
        Ok(pb::CommonResponse::default())
    }

    /// `UpdateStorage`: replaces the configuration, keeping the enabled flag
    /// and health of the storage being replaced.
    pub async fn update_storage(
        &self,
        req: pb::UpdateStorageRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        let s = req
            .storage
            .as_ref()
            .ok_or_else(|| Fail::invalid("no storage"))?;
        let mut new = conv::storage_from_wire(s)?;
        if let Some(old) = self
            .svc
            .list_storages()
            .into_iter()
            .find(|o| o.name == new.name)
        {
            new.enabled = old.enabled;
            new.health = old.health;
        }
        self.svc.update_storage(new)?;
        Ok(pb::CommonResponse::default())
    }

    /// `EnableStorage`.
    pub async fn enable_storage(
        &self,
        req: pb::EnableStorageRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        self.svc.enable_storage(&req.storage_unique_name)?;
        Ok(pb::CommonResponse::default())
    }

    /// `DisableStorage`.
    pub async fn disable_storage(
        &self,
        req: pb::DisableStorageRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        self.svc.disable_storage(&req.storage_unique_name)?;
        Ok(pb::CommonResponse::default())
    }

    /// `RemoveStorage`.
    pub async fn remove_storage(
        &self,
        req: pb::RemoveStorageRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        self.svc.remove_storage(&req.storage_unique_name)?;
        Ok(pb::CommonResponse::default())
    }

    /// `ListStorage`.
    pub async fn list_storage(
        &self,
        _req: pb::ListStorageRequest,
    ) -> Result<pb::ListStorageResponse, Fail> {
        Ok(pb::ListStorageResponse {
            header: None,
            storage: self
                .svc
                .list_storages()
                .iter()
                .map(conv::storage_to_wire)
                .collect(),
        })
    }

    /// `CreateInstanceGroup`.
    pub async fn create_instance_group(
        &self,
        req: pb::CreateInstanceGroupRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        let g = req
            .instance_group
            .as_ref()
            .ok_or_else(|| Fail::invalid("no instance_group"))?;
        self.svc.create_group(conv::group_from_wire(g)?)?;
        Ok(pb::CommonResponse::default())
    }

    /// `UpdateInstanceGroup`: upstream's compare-and-set, `current_version`
    /// must be the stored version and the group's `version` above it.
    pub async fn update_instance_group(
        &self,
        req: pb::UpdateInstanceGroupRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        let g = req
            .instance_group
            .as_ref()
            .ok_or_else(|| Fail::invalid("no instance_group"))?;
        self.svc
            .update_group_versioned(conv::group_from_wire(g)?, req.current_version)?;
        Ok(pb::CommonResponse::default())
    }

    /// `RemoveInstanceGroup`.
    pub async fn remove_instance_group(
        &self,
        req: pb::RemoveInstanceGroupRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        self.svc.remove_group(&req.name)?;
        Ok(pb::CommonResponse::default())
    }

    /// `GetInstanceGroup`.
    pub async fn get_instance_group(
        &self,
        req: pb::GetInstanceGroupRequest,
    ) -> Result<pb::GetInstanceGroupResponse, Fail> {
        let (g, _) = self.svc.get_group(&req.name)?;
        Ok(pb::GetInstanceGroupResponse {
            header: None,
            instance_group: Some(conv::group_to_wire(&g)),
        })
    }

    /// `ListInstanceGroup`.
    pub async fn list_instance_group(
        &self,
        _req: pb::ListInstanceGroupRequest,
    ) -> Result<pb::ListInstanceGroupResponse, Fail> {
        Ok(pb::ListInstanceGroupResponse {
            header: None,
            instance_group: self
                .svc
                .list_groups()
                .iter()
                .map(conv::group_to_wire)
                .collect(),
        })
    }

    /// Admin `GetCacheMeta`: the meta method, as an administrator.
    pub async fn admin_get_cache_meta(
        &self,
        req: pb::GetCacheMetaRequest,
    ) -> Result<pb::GetCacheMetaResponse, Fail> {
        let resp = self.get_cache_meta(&Caller::Open, recode(&req)).await?;
        Ok(recode(&resp))
    }

    /// Admin `RemoveCache`: the meta method, as an administrator.
    pub async fn admin_remove_cache(
        &self,
        req: pb::RemoveCacheRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        self.remove_cache(&Caller::Open, recode(&req)).await?;
        Ok(pb::CommonResponse::default())
    }

    /// Admin `RegisterInstance`: the meta method, answering a header only.
    pub async fn admin_register_instance(
        &self,
        req: pb::RegisterInstanceRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        self.register_instance(&Caller::Open, recode(&req)).await?;
        Ok(pb::CommonResponse::default())
    }

    /// `RemoveInstance`: forgets the instance and drops its blocks.
    pub async fn remove_instance(
        &self,
        req: pb::RemoveInstanceRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        // `instance_group` is informational, as upstream: the instance id
        // alone names the instance, whatever group the request gives.
        let dropped = self.svc.remove_instance(&req.instance_id).await?;
        tracing::info!(instance = %req.instance_id, dropped, "instance removed");
        Ok(pb::CommonResponse::default())
    }

    /// Admin `GetInstanceInfo`.
    pub async fn admin_get_instance_info(
        &self,
        req: pb::GetInstanceInfoRequest,
    ) -> Result<pb::GetInstanceInfoResponse, Fail> {
        let inst = self.svc.get_instance_info(&req.instance_id).await?;
        Ok(pb::GetInstanceInfoResponse {
            header: None,
            instance_info: Some(recode(&convert::instance_info(&inst))),
        })
    }

    /// `ListInstanceInfo` (empty group name: all).
    pub async fn list_instance_info(
        &self,
        req: pb::ListInstanceInfoRequest,
    ) -> Result<pb::ListInstanceInfoResponse, Fail> {
        let group =
            (!req.instance_group_name.is_empty()).then_some(req.instance_group_name.as_str());
        Ok(pb::ListInstanceInfoResponse {
            header: None,
            instance_info: self
                .svc
                .list_instances(group)
                .iter()
                .map(|i| recode(&convert::instance_info(i)))
                .collect(),
        })
    }

    /// `AddAccount`: `password` is the account's API key; the kvtier
    /// extension `allowed_groups` scopes a user. Without it (Tair KVCM
    /// clients) a user may use no group until granted some
    /// (docs/server.md, "Trust model").
    pub async fn add_account(
        &self,
        req: pb::AddAccountRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        conv::require_name(&req.user_name, "user_name")?;
        let role = conv::role_from_wire(req.role);
        self.svc
            .add_account(&req.user_name, role, &req.password, req.allowed_groups)?;
        Ok(pb::CommonResponse::default())
    }

    /// `SetAccountGroups` (kvtier extension): replaces the groups an
    /// account may use.
    pub async fn set_account_groups(
        &self,
        req: pb::SetAccountGroupsRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        conv::require_name(&req.user_name, "user_name")?;
        self.svc
            .set_account_groups(&req.user_name, req.allowed_groups)?;
        Ok(pb::CommonResponse::default())
    }

    /// `DeleteAccount`.
    pub async fn delete_account(
        &self,
        req: pb::DeleteAccountRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        self.svc.delete_account(&req.user_name)?;
        Ok(pb::CommonResponse::default())
    }

    /// `ListAccount`: names, roles and groups; never keys.
    pub async fn list_account(
        &self,
        _req: pb::ListAccountRequest,
    ) -> Result<pb::ListAccountResponse, Fail> {
        Ok(pb::ListAccountResponse {
            header: None,
            accounts: self
                .svc
                .list_accounts()
                .iter()
                .map(conv::account_to_wire)
                .collect(),
        })
    }

    /// `GenConfigSnapshot`.
    pub async fn gen_config_snapshot(
        &self,
        _req: pb::GenConfigSnapshotRequest,
    ) -> Result<pb::ConfigSnapShotResponse, Fail> {
        Ok(pb::ConfigSnapShotResponse {
            header: None,
            config_snapshot: self.svc.gen_config_snapshot().to_json()?,
        })
    }

    /// `LoadConfigSnapshot`: validated whole before anything changes.
    pub async fn load_config_snapshot(
        &self,
        req: pb::LoadConfigSnapshotRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        let snap = ConfigSnapshot::from_json(&req.config_snapshot)?;
        self.svc.load_config_snapshot(snap)?;
        Ok(pb::CommonResponse::default())
    }

    /// `GetMetrics`: the figures of `GET /metrics`.
    pub async fn get_metrics(
        &self,
        _req: pb::GetMetricsRequest,
    ) -> Result<pb::GetMetricsResponse, Fail> {
        Ok(pb::GetMetricsResponse {
            header: None,
            timestamp: unix_ms(std::time::SystemTime::now()),
            metrics: self.metrics.to_wire(&self.svc, &self.elector),
            extra_data: String::new(),
        })
    }

    /// `CheckHealth`: whether this frontend leads, when its elector last
    /// ran, and `is_health`; when unhealthy, why in the header's message
    /// (the code stays `OK`: the call itself succeeded).
    pub async fn check_health(
        &self,
        _req: pb::CheckHealthRequest,
    ) -> Result<pb::CheckHealthResponse, Fail> {
        let report = self.svc.check_health().await;
        let message = report
            .reason
            .unwrap_or_else(|| "Health check completed".to_owned());
        Ok(pb::CheckHealthResponse {
            header: Some(note(message)),
            is_leader: self.elector.is_leader(),
            is_health: report.healthy,
            elector_last_loop_time_ms: self.elector.last_loop_unix_ms(),
        })
    }

    /// `GetManagerClusterInfo`: this frontend, the leader it last saw and,
    /// while it leads, its lease end (µs since the Unix epoch; -1
    /// otherwise) and its endpoints.
    pub async fn get_manager_cluster_info(
        &self,
        _req: pb::GetManagerClusterInfoRequest,
    ) -> Result<pb::GetManagerClusterInfoResponse, Fail> {
        let n = &self.node;
        let leads = self.elector.is_leader();
        Ok(pb::GetManagerClusterInfoResponse {
            header: Some(note("Manager cluster info retrieved".into())),
            info_updated_time: unix_ms(self.started),
            self_leader_expiration_time: if leads {
                self.elector.lease_expiration_unix_us()
            } else {
                -1
            },
            self_node_id: n.node_id.clone(),
            leader_node_id: self.elector.leader_node_id(),
            leader_endpoint: leads.then(|| pb::NodeEndpoint {
                node_id: n.node_id.clone(),
                host: n.host.clone(),
                meta_rpc_port: i32::from(n.meta_grpc_port),
                meta_http_port: i32::from(n.meta_http_port),
                admin_rpc_port: i32::from(n.admin_grpc_port),
                admin_http_port: i32::from(n.admin_http_port),
                custom_info: String::new(),
            }),
        })
    }

    /// `LeaderDemote`: the leader gives its lease up and stays out of
    /// campaigns for its campaign delay; a follower answers
    /// `SERVER_NOT_LEADER`.
    pub async fn leader_demote(
        &self,
        _req: pb::LeaderDemoteRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        match self.elector.demote().await {
            Ok(true) => {}
            Ok(false) => return Err(Fail::not_leader()),
            // It stopped leading before the release failed; the lease
            // lapses on its own.
            Err(e) => tracing::warn!(error = %e, "demoted, but releasing the lease failed"),
        }
        tracing::info!(node = %self.node.node_id, "demoted by LeaderDemote");
        Ok(pb::CommonResponse {
            header: Some(note("Leader demote request accepted".into())),
        })
    }

    /// `GetLeaderElectorConfig`: this frontend's campaign delay.
    pub async fn get_leader_elector_config(
        &self,
        _req: pb::GetLeaderElectorConfigRequest,
    ) -> Result<pb::GetLeaderElectorConfigResponse, Fail> {
        Ok(pb::GetLeaderElectorConfigResponse {
            header: Some(note("Leader elector config retrieved".into())),
            campaign_delay_time_ms: self.elector.campaign_delay_ms(),
        })
    }

    /// `UpdateLeaderElectorConfig`: sets this frontend's campaign delay (in
    /// memory, until restart; <= 0: none), as upstream.
    pub async fn update_leader_elector_config(
        &self,
        req: pb::UpdateLeaderElectorConfigRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        self.elector
            .set_campaign_delay_ms(req.campaign_delay_time_ms);
        Ok(pb::CommonResponse {
            header: Some(note("Leader elector config updated".into())),
        })
    }

    /// `UpdateLogger`: not supported yet (log levels come from `RUST_LOG`).
    pub async fn update_logger(
        &self,
        _req: pb::UpdateLoggerRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        Err(Fail::unsupported(
            "log levels are set with RUST_LOG at start",
        ))
    }
}

/// A header carrying only `message`: [`Api::run`] keeps it on success, with
/// the code set to `OK`.
fn note(message: String) -> pb::CommonResponseHeader {
    pb::CommonResponseHeader {
        status: Some(pb::Status {
            code: pb::ErrorCode::Ok as i32,
            message,
        }),
        request_id: String::new(),
    }
}
