//! The one list of RPCs. Each transport expands it with its own macro, so
//! a method cannot be served by one transport and forgotten by the other.
//!
//! Entry: `RpcName, trait_fn, api_fn, Request, Response;` where `trait_fn`
//! is the tonic trait method and `api_fn` the [`crate::api::Api`] method.

/// Calls `$cb!` with every meta RPC; the `api_fn`s take `(&Caller, req)`.
macro_rules! for_meta_methods {
    ($cb:ident) => {
        $cb! {
            RegisterInstance, register_instance, register_instance, RegisterInstanceRequest, RegisterInstanceResponse;
            GetInstanceInfo, get_instance_info, get_instance_info, GetInstanceInfoRequest, GetInstanceInfoResponse;
            GetCacheMeta, get_cache_meta, get_cache_meta, GetCacheMetaRequest, GetCacheMetaResponse;
            GetCacheLocation, get_cache_location, get_cache_location, GetCacheLocationRequest, GetCacheLocationResponse;
            GetCacheLocationLen, get_cache_location_len, get_cache_location_len, GetCacheLocationLenRequest, GetCacheLocationLenResponse;
            StartWriteCache, start_write_cache, start_write_cache, StartWriteCacheRequest, StartWriteCacheResponse;
            FinishWriteCache, finish_write_cache, finish_write_cache, FinishWriteCacheRequest, CommonResponse;
            RemoveCache, remove_cache, remove_cache, RemoveCacheRequest, CommonResponse;
            TrimCache, trim_cache, trim_cache, TrimCacheRequest, CommonResponse;
            GetClusterInfo, get_cluster_info, get_cluster_info, GetClusterInfoRequest, GetClusterInfoResponse;
        }
    };
}

/// Calls `$cb!` with every admin RPC; the `api_fn`s take `(req)` (the
/// listener admitted administrators only).
macro_rules! for_admin_methods {
    ($cb:ident) => {
        $cb! {
            AddStorage, add_storage, add_storage, AddStorageRequest, CommonResponse;
            EnableStorage, enable_storage, enable_storage, EnableStorageRequest, CommonResponse;
            DisableStorage, disable_storage, disable_storage, DisableStorageRequest, CommonResponse;
            RemoveStorage, remove_storage, remove_storage, RemoveStorageRequest, CommonResponse;
            UpdateStorage, update_storage, update_storage, UpdateStorageRequest, CommonResponse;
            ListStorage, list_storage, list_storage, ListStorageRequest, ListStorageResponse;
            CreateInstanceGroup, create_instance_group, create_instance_group, CreateInstanceGroupRequest, CommonResponse;
            UpdateInstanceGroup, update_instance_group, update_instance_group, UpdateInstanceGroupRequest, CommonResponse;
            RemoveInstanceGroup, remove_instance_group, remove_instance_group, RemoveInstanceGroupRequest, CommonResponse;
            GetInstanceGroup, get_instance_group, get_instance_group, GetInstanceGroupRequest, GetInstanceGroupResponse;
            ListInstanceGroup, list_instance_group, list_instance_group, ListInstanceGroupRequest, ListInstanceGroupResponse;
            GetCacheMeta, get_cache_meta, admin_get_cache_meta, GetCacheMetaRequest, GetCacheMetaResponse;
            RemoveCache, remove_cache, admin_remove_cache, RemoveCacheRequest, CommonResponse;
            RegisterInstance, register_instance, admin_register_instance, RegisterInstanceRequest, CommonResponse;
            RemoveInstance, remove_instance, remove_instance, RemoveInstanceRequest, CommonResponse;
            GetInstanceInfo, get_instance_info, admin_get_instance_info, GetInstanceInfoRequest, GetInstanceInfoResponse;
            ListInstanceInfo, list_instance_info, list_instance_info, ListInstanceInfoRequest, ListInstanceInfoResponse;
            AddAccount, add_account, add_account, AddAccountRequest, CommonResponse;
            DeleteAccount, delete_account, delete_account, DeleteAccountRequest, CommonResponse;
            ListAccount, list_account, list_account, ListAccountRequest, ListAccountResponse;
            SetAccountGroups, set_account_groups, set_account_groups, SetAccountGroupsRequest, CommonResponse;
            GenConfigSnapshot, gen_config_snapshot, gen_config_snapshot, GenConfigSnapshotRequest, ConfigSnapShotResponse;
            LoadConfigSnapshot, load_config_snapshot, load_config_snapshot, LoadConfigSnapshotRequest, CommonResponse;
            GetMetrics, get_metrics, get_metrics, GetMetricsRequest, GetMetricsResponse;
            CheckHealth, check_health, check_health, CheckHealthRequest, CheckHealthResponse;
            GetManagerClusterInfo, get_manager_cluster_info, get_manager_cluster_info, GetManagerClusterInfoRequest, GetManagerClusterInfoResponse;
            LeaderDemote, leader_demote, leader_demote, LeaderDemoteRequest, CommonResponse;
            GetLeaderElectorConfig, get_leader_elector_config, get_leader_elector_config, GetLeaderElectorConfigRequest, GetLeaderElectorConfigResponse;
            UpdateLeaderElectorConfig, update_leader_elector_config, update_leader_elector_config, UpdateLeaderElectorConfigRequest, CommonResponse;
            UpdateLogger, update_logger, update_logger, UpdateLoggerRequest, CommonResponse;
        }
    };
}

/// The RPC names of one list, in its order.
macro_rules! rpc_names {
    ($($rpc:ident, $trait_fn:ident, $api_fn:ident, $req:ident, $resp:ident;)*) => {
        &[$(stringify!($rpc)),*]
    };
}

/// Every meta RPC by name (UpperCamel), from the table the transports
/// serve, so tests can insist that each one is covered.
pub const META_RPCS: &[&str] = for_meta_methods!(rpc_names);

/// Every admin RPC by name (UpperCamel), from the table the transports
/// serve.
pub const ADMIN_RPCS: &[&str] = for_admin_methods!(rpc_names);

/// The RPC name in lowerCamelCase, as HTTP paths spell it.
pub fn lower_camel(rpc: &str) -> String {
    let mut c = rpc.chars();
    match c.next() {
        Some(f) => f.to_ascii_lowercase().to_string() + c.as_str(),
        None => String::new(),
    }
}
