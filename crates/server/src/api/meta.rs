//! The meta (data-path) service methods, one function each, shared by the
//! HTTP and gRPC transports (docs/meta-api.md §4).

use kvtier_meta::proto::meta as pb;
use kvtier_meta::{BlockKey, BlockMask, Instance, LocationQuery, MatchMode};

use super::Api;
use crate::auth::Caller;
use crate::convert::{self, Fail};

/// The parts of a location query shared by `GetCacheLocation` and
/// `GetCacheLocationLen`.
struct Query<'a> {
    instance_id: &'a str,
    query_type: i32,
    block_keys: &'a [i64],
    token_ids: &'a [i64],
    mask: Option<&'a pb::BlockMask>,
    sw_size: i32,
    only_specs: &'a [String],
}

/// Keys, mask flags and the instance of a keyed request.
struct Keyed {
    inst: Instance,
    keys: Vec<BlockKey>,
}

impl Api {
    /// The instance `id`, if `who` may use its group.
    async fn instance(&self, who: &Caller, id: &str) -> Result<Instance, Fail> {
        let inst = self.svc.get_instance_info(id).await?;
        self.check_group(who, &inst.group)?;
        Ok(inst)
    }

    async fn keyed(
        &self,
        who: &Caller,
        id: &str,
        block_keys: &[i64],
        token_ids: &[i64],
    ) -> Result<Keyed, Fail> {
        let inst = self.instance(who, id).await?;
        let keys = convert::request_keys(block_keys, token_ids, inst.block_size)?;
        Ok(Keyed { inst, keys })
    }

    /// `RegisterInstance`.
    pub async fn register_instance(
        &self,
        who: &Caller,
        req: pb::RegisterInstanceRequest,
    ) -> Result<pb::RegisterInstanceResponse, Fail> {
        self.check_group(who, &req.instance_group)?;
        let inst = convert::instance_from_wire(
            &req.instance_group,
            &req.instance_id,
            req.block_size,
            &req.location_spec_infos,
            req.model_deployment.as_ref(),
            &req.location_spec_groups,
            req.default_query_type,
        )?;
        let inst = self.svc.register_instance(inst).await?;
        Ok(pb::RegisterInstanceResponse {
            header: None,
            storage_configs: self.storage_configs(&inst.group),
            extra_info: String::new(),
        })
    }

    /// `GetInstanceInfo`.
    pub async fn get_instance_info(
        &self,
        who: &Caller,
        req: pb::GetInstanceInfoRequest,
    ) -> Result<pb::GetInstanceInfoResponse, Fail> {
        let inst = self.instance(who, &req.instance_id).await?;
        Ok(pb::GetInstanceInfoResponse {
            header: None,
            instance_group: inst.group.clone(),
            instance_info: Some(convert::instance_info(&inst)),
        })
    }

    /// The located blocks of a query, in wire form (see docs/meta-api.md
    /// §4.3 for the shape of each query type).
    async fn locate(&self, who: &Caller, q: Query<'_>) -> Result<Vec<pb::CacheLocation>, Fail> {
        let Query {
            instance_id,
            query_type,
            block_keys,
            token_ids,
            mask,
            sw_size,
            only_specs,
        } = q;
        let Keyed { inst, keys } = self.keyed(who, instance_id, block_keys, token_ids).await?;
        let mut qt = pb::QueryType::try_from(query_type)
            .map_err(|_| Fail::invalid(format!("unknown query_type {query_type}")))?;
        if qt == pb::QueryType::QtUnspecified {
            let (_, default) = convert::instance_identity(&inst);
            qt = pb::QueryType::try_from(default).unwrap_or(pb::QueryType::QtUnspecified);
        }
        let mode = convert::match_mode(qt, sw_size, keys.len())?;
        // The sliding-window search takes no mask (docs/meta-api.md §4.3).
        let mask = match mode {
            MatchMode::ReverseSlidingWindow { .. } => BlockMask::None,
            _ => convert::mask_from_wire(mask)?,
        };
        let flags = convert::mask_flags(&mask, keys.len())?;
        let n = keys.len();
        let found = if flags.iter().all(|&m| m) {
            // Everything masked: nothing to look up (the service refuses an
            // empty lookup).
            vec![None; n]
        } else {
            self.svc
                .get_cache_location(&inst.id, &LocationQuery { keys, mode, mask })
                .await?
                .locations
        };
        let wire = |l: &Option<std::sync::Arc<kvtier_meta::CacheLocation>>| {
            l.as_deref().map_or_else(convert::empty_location, |l| {
                convert::location_to_wire(l, only_specs)
            })
        };
        Ok(match mode {
            MatchMode::Keys => (0..n)
                .filter(|&i| !flags[i])
                .map(|i| wire(&found[i]))
                .collect(),
            MatchMode::Prefix => (0..n)
                .filter(|&i| !flags[i])
                .map_while(|i| found[i].as_ref().map(|_| wire(&found[i])))
                .collect(),
            MatchMode::ReverseSlidingWindow { .. } => found.iter().map(wire).collect(),
        })
    }

    /// `GetCacheLocation`.
    pub async fn get_cache_location(
        &self,
        who: &Caller,
        req: pb::GetCacheLocationRequest,
    ) -> Result<pb::GetCacheLocationResponse, Fail> {
        let locations = self
            .locate(
                who,
                Query {
                    instance_id: &req.instance_id,
                    query_type: req.query_type,
                    block_keys: &req.block_keys,
                    token_ids: &req.token_ids,
                    mask: req.block_mask.as_ref(),
                    sw_size: req.sw_size,
                    only_specs: &req.location_spec_names,
                },
            )
            .await?;
        Ok(pb::GetCacheLocationResponse {
            header: None,
            locations,
        })
    }

    /// `GetCacheLocationLen`: the number of non-empty locations
    /// `GetCacheLocation` would return.
    pub async fn get_cache_location_len(
        &self,
        who: &Caller,
        req: pb::GetCacheLocationLenRequest,
    ) -> Result<pb::GetCacheLocationLenResponse, Fail> {
        let locations = self
            .locate(
                who,
                Query {
                    instance_id: &req.instance_id,
                    query_type: req.query_type,
                    block_keys: &req.block_keys,
                    token_ids: &req.token_ids,
                    mask: None,
                    sw_size: req.sw_size,
                    only_specs: &[],
                },
            )
            .await?;
        Ok(pb::GetCacheLocationLenResponse {
            header: None,
            cache_location_len: locations
                .iter()
                .filter(|l| !l.location_specs.is_empty())
                .count() as i64,
        })
    }

    /// `GetCacheMeta`: raw state of each unmasked key.
    pub async fn get_cache_meta(
        &self,
        who: &Caller,
        req: pb::GetCacheMetaRequest,
    ) -> Result<pb::GetCacheMetaResponse, Fail> {
        let Keyed { inst, keys } = self
            .keyed(who, &req.instance_id, &req.block_keys, &req.token_ids)
            .await?;
        let wanted = convert::unmasked_keys(&keys, req.block_mask.as_ref())?;
        let metas = if wanted.is_empty() {
            Vec::new()
        } else {
            self.svc.get_cache_meta(&inst.id, &wanted).await?
        };
        Ok(pb::GetCacheMetaResponse {
            header: None,
            locations: metas
                .iter()
                .map(|m| convert::meta_location(m.as_ref()))
                .collect(),
            metas: wanted
                .iter()
                .zip(&metas)
                .map(|(k, m)| convert::meta_json(*k, m.as_ref(), req.detail_level))
                .collect(),
        })
    }

    /// `StartWriteCache`: phase one of a write.
    pub async fn start_write_cache(
        &self,
        who: &Caller,
        req: pb::StartWriteCacheRequest,
    ) -> Result<pb::StartWriteCacheResponse, Fail> {
        let Keyed { inst, keys } = self
            .keyed(who, &req.instance_id, &req.block_keys, &req.token_ids)
            .await?;
        let groups = &req.location_spec_group_names;
        if !groups.is_empty() {
            if groups.len() != keys.len() {
                return Err(Fail::invalid(format!(
                    "{} location_spec_group_names for {} blocks",
                    groups.len(),
                    keys.len()
                )));
            }
            if let Some(bad) = groups
                .iter()
                .find(|g| !inst.spec_groups.iter().any(|s| &s.name == *g))
            {
                return Err(Fail::invalid(format!(
                    "unknown location spec group {bad:?}"
                )));
            }
        }
        let grant = self.svc.start_write_cache(&inst.id, &keys).await?;
        // Mark every position not granted: already stored, being written by
        // another session, or a repeat of an earlier key of this request.
        let mut granted = grant.blocks.iter().map(|b| b.key).peekable();
        let marked: Vec<bool> = keys
            .iter()
            .map(|k| {
                if granted.peek() == Some(k) {
                    granted.next();
                    false
                } else {
                    true
                }
            })
            .collect();
        Ok(pb::StartWriteCacheResponse {
            header: None,
            write_session_id: convert::session_to_wire(grant.session, grant.blocks.len()),
            block_mask: Some(convert::mask_to_wire(&marked)),
            locations: grant
                .blocks
                .iter()
                .map(|b| convert::location_to_wire(&b.location, &[]))
                .collect(),
        })
    }

    /// `FinishWriteCache`: phase two.
    pub async fn finish_write_cache(
        &self,
        who: &Caller,
        req: pb::FinishWriteCacheRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        let inst = self.instance(who, &req.instance_id).await?;
        let (session, n) = convert::session_from_wire(&req.write_session_id)?;
        let mask = convert::mask_from_wire(req.success_blocks.as_ref())?;
        let success = convert::mask_flags(&mask, n)?;
        // Also for an empty grant: an id that was never issued is refused.
        self.svc
            .finish_write_cache(&inst.id, session, &success)
            .await?;
        Ok(pb::CommonResponse::default())
    }

    /// `RemoveCache`: marked blocks are kept.
    pub async fn remove_cache(
        &self,
        who: &Caller,
        req: pb::RemoveCacheRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        let Keyed { inst, keys } = self
            .keyed(who, &req.instance_id, &req.block_keys, &req.token_ids)
            .await?;
        let victims = convert::unmasked_keys(&keys, req.block_mask.as_ref())?;
        if !victims.is_empty() {
            self.svc.remove_cache(&inst.id, &victims).await?;
        }
        Ok(pb::CommonResponse::default())
    }

    /// `TrimCache`.
    pub async fn trim_cache(
        &self,
        who: &Caller,
        req: pb::TrimCacheRequest,
    ) -> Result<pb::CommonResponse, Fail> {
        let inst = self.instance(who, &req.instance_id).await?;
        let policy = match pb::TrimStrategy::try_from(req.strategy) {
            Ok(pb::TrimStrategy::TsRemoveAllCache | pb::TrimStrategy::TsRemoveAllMeta) => {
                kvtier_meta::TrimPolicy::All
            }
            // Blocks record their last access, not their write time: a
            // window open at the start ("everything before end") maps to
            // "idle since end"; other windows are not supported yet.
            Ok(pb::TrimStrategy::TsTimestamp)
                if req.begin_timestamp <= 0 && req.end_timestamp > 0 =>
            {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let idle = now.saturating_sub(req.end_timestamp as u64);
                kvtier_meta::TrimPolicy::IdleFor(std::time::Duration::from_secs(idle))
            }
            Ok(pb::TrimStrategy::TsTimestamp) => {
                return Err(Fail::unsupported(
                    "TS_TIMESTAMP with a begin_timestamp is not supported; send begin_timestamp 0",
                ));
            }
            Ok(pb::TrimStrategy::TsUnspecified) | Err(_) => {
                return Err(Fail::invalid(format!(
                    "trim strategy {} not valid",
                    req.strategy
                )));
            }
        };
        self.svc.trim_cache(&inst.id, policy).await?;
        Ok(pb::CommonResponse::default())
    }

    /// `GetClusterInfo`: this frontend, the leader it last saw, and the
    /// leader's endpoint when that is this frontend.
    pub async fn get_cluster_info(
        &self,
        _who: &Caller,
        _req: pb::GetClusterInfoRequest,
    ) -> Result<pb::GetClusterInfoResponse, Fail> {
        let n = &self.node;
        Ok(pb::GetClusterInfoResponse {
            header: None,
            self_node_id: n.node_id.clone(),
            leader_node_id: self.elector.leader_node_id(),
            leader_endpoint: self.elector.is_leader().then(|| pb::MetaNodeEndpoint {
                node_id: n.node_id.clone(),
                host: n.host.clone(),
                meta_rpc_port: i32::from(n.meta_grpc_port),
                meta_http_port: i32::from(n.meta_http_port),
                custom_info: String::new(),
            }),
        })
    }
}
